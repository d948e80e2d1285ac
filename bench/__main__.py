"""Run the benchmarks: ``python -m bench [name ...] [--quick]``.

Each benchmark reports medians over interleaved repetitions after warm-up, the spread
(interquartile range / median), and ratios against a floor measured in the same run.
``--quick`` runs a few repetitions only: it checks the suite runs, its figures mean nothing.
"""

import argparse
import platform
import sys
from collections.abc import Awaitable, Callable

import trio

from . import dispatch, logs, parallel, providers, stream
from ._harness import Row, fmt_time

BENCHMARKS: dict[str, Callable[[bool], Awaitable[list[Row]]]] = {
    "dispatch": dispatch.run,
    "logs": logs.run,
    "parallel": parallel.run,
    "providers": providers.run,
    "stream": stream.run,
}


def _table(name: str, rows: list[Row]) -> str:
    lines = [
        f"## {name}",
        "",
        "| workload | median | spread | floor | ratio | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        median = fmt_time(row.median) if row.median is not None else ""
        spread = f"{row.spread:.0%}" if row.spread is not None else ""
        floor = fmt_time(row.floor) if row.floor is not None else ""
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else ""
        lines.append(f"| {row.workload} | {median} | {spread} | {floor} | {ratio} | {row.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        choices=[[], *BENCHMARKS],
        metavar="name",
        help=f"benchmarks to run: {', '.join(BENCHMARKS)} (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few repetitions: checks the suite runs"
    )
    args = parser.parse_args(argv)
    names = args.names or list(BENCHMARKS)
    print(f"# turnplug benchmarks{' (quick: figures are not meaningful)' if args.quick else ''}")
    print()
    print(f"Python {platform.python_version()} on {platform.machine()}, trio {trio.__version__}")
    for name in names:
        rows = trio.run(BENCHMARKS[name], args.quick)
        print()
        print(_table(name, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
