"""Run the benchmarks: ``python -m bench [name ...] [--quick] [--check]``.

Each benchmark reports medians over interleaved repetitions after warm-up, the spread
(interquartile range / median), and ratios against a floor of plain code measured in the same
run, with the target of each row and whether this run met it. A benchmark runs on every
event loop it supports (``LOOPS`` in its module). A full run rewrites ``bench/RESULTS.md``
(machine, versions, date, one table per benchmark); running some benchmarks by name replaces
their tables there and keeps the others. ``--quick`` runs a few repetitions only: it checks
the suite runs, its figures mean nothing, and it leaves RESULTS.md alone. ``--check`` exits
with status 1 when a row misses its target.
"""

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

import attrs

from . import (
    concurrency,
    dispatch,
    events,
    inject,
    logs,
    otel,
    parallel,
    playback,
    pool,
    providers,
    redaction,
    sse,
    stream,
    tools,
    turn,
)
from ._harness import Row
from ._loops import run
from ._results import machine, merge, table

MODULES: dict[str, ModuleType] = {
    "dispatch": dispatch,
    "inject": inject,
    "logs": logs,
    "parallel": parallel,
    "stream": stream,
    "redaction": redaction,
    "playback": playback,
    "turn": turn,
    "concurrency": concurrency,
    "events": events,
    "tools": tools,
    "providers": providers,
    "pool": pool,
    "sse": sse,
    "otel": otel,
}
BENCHMARKS = list(MODULES)
# `python -m bench.serve` runs apart (it starts the gateway, an upstream and clients as
# processes); its section of RESULTS.md is kept, last, when the others are rewritten.
SECTIONS = [*BENCHMARKS, "serve"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def rows_of(name: str, quick: bool) -> list[Row]:
    """Every row of benchmark `name`, on each loop it runs on."""
    module = MODULES[name]
    loops: tuple[str, ...] = getattr(module, "LOOPS", ("trio",))
    rows: list[Row] = []
    for loop in loops:
        fn: Callable[..., Awaitable[list[Row]]] = module.run
        if hasattr(module, "LOOPS"):
            found = run(fn, quick, loop, loop=loop)
            rows += [attrs.evolve(row, workload=f"{loop}: {row.workload}") for row in found]
        else:
            rows += run(fn, quick, loop=loop)
    return rows


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
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 when any row misses its target",
    )
    args = parser.parse_args(argv)
    names = args.names or BENCHMARKS
    print(f"# turnplug benchmarks{' (quick: figures are not meaningful)' if args.quick else ''}")
    print()
    print(machine())
    tables: dict[str, str] = {}
    missed: list[str] = []
    for name in names:
        rows = rows_of(name, args.quick)
        missed += [f"{name}: {row.workload} ({row.target})" for row in rows if row.met is False]
        tables[name] = table(name, rows)
        print()
        print(tables[name], flush=True)
    if not args.quick:
        old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
        RESULTS.write_text(merge(old, tables, SECTIONS), encoding="utf-8")
        print(f"\n(written to {RESULTS.name})")
    if missed:
        print(f"\n{len(missed)} target(s) missed:")
        for line in missed:
            print(f"  {line}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
