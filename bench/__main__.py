"""Run the benchmarks: ``python -m bench [name ...] [--quick]``.

Each benchmark reports medians over interleaved repetitions after warm-up, the spread
(interquartile range / median), and ratios against a floor measured in the same run.
A full run rewrites ``bench/RESULTS.md`` (machine, versions, date, one table per benchmark);
running some benchmarks by name replaces their tables there and keeps the others.
``--quick`` runs a few repetitions only: it checks the suite runs, its figures mean nothing,
and it leaves RESULTS.md alone.
"""

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from . import (
    concurrency,
    dispatch,
    events,
    logs,
    otel,
    parallel,
    providers,
    sse,
    stream,
    tools,
    turn,
)
from ._harness import Row
from ._results import machine, merge, table

BENCHMARKS: dict[str, Callable[[bool], Awaitable[list[Row]]]] = {
    "dispatch": dispatch.run,
    "logs": logs.run,
    "parallel": parallel.run,
    "stream": stream.run,
    "turn": turn.run,
    "concurrency": concurrency.run,
    "events": events.run,
    "tools": tools.run,
    "providers": providers.run,
    "sse": sse.run,
    "otel": otel.run,
}

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


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
        "--quick",
        action="store_true",
        help="a few repetitions: checks the suite runs (RESULTS.md is left alone)",
    )
    args = parser.parse_args(argv)
    names = args.names or list(BENCHMARKS)
    print(f"# turnplug benchmarks{' (quick: figures are not meaningful)' if args.quick else ''}")
    print()
    print(machine())
    tables: dict[str, str] = {}
    for name in names:
        rows = trio.run(BENCHMARKS[name], args.quick)
        tables[name] = table(name, rows)
        print()
        print(tables[name])
    if not args.quick:
        old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
        RESULTS.write_text(merge(old, tables, list(BENCHMARKS)), encoding="utf-8")
        print(f"\n(written to {RESULTS.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
