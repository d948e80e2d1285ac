"""Many reference turns at once: throughput and memory at 100, 1,000 and 3,000 concurrent turns.

Each turn is the reference turn (`_reference`) with the loop's own checkpoint before every
chunk, so that all the turns of a batch are in flight together and interleave chunk by chunk.
One operation starts a batch of N turns in the loop's own task group and waits for all of
them; turns per second is N over its time. The turns go through `Pipeline.stream` with a
consumer that iterates every event (what a chat server does), and through `Pipeline.run`; the
floor is the same batch of plain turns whose consumers see every chunk. Ratios are taken per
repetition. Growth is the cost per turn at 3,000 over at 100, for the pipeline and for the
floor: the pipeline's may grow no more than 1.3x the floor's.

The "handed over" rows have no target: the same plain turns, each played in a task of its
own that hands every chunk to its consumer's task with the loop's cheapest wake-up
(`_loops.hand_over`). They show what a task per streamed turn costs by itself, with no
turnplug code: the bound of any `stream()` that keeps the turn moving while its consumer is
busy.

Memory is measured in a fresh subprocess per batch (``python -m bench.concurrency --memory
KIND N LOOP``): the peak resident set of the process once the batch has run, and the peak of
Python allocations (`tracemalloc`) during a second batch, divided by N: the memory of one
turn in flight.
"""

import json
import resource
import statistics
import subprocess
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ._harness import Row, measure, spread
from ._loops import gather
from ._loops import run as run_on
from ._reference import Reference, reference

LOOPS = ("trio", "asyncio")
ROOT = Path(__file__).resolve().parent.parent
THROUGHPUT_TARGET = 0.5
GROWTH_TARGET = 1.3
MEMORY_TARGET = 2.0
HANDED_NOTE = "no turnplug code: what a task per streamed turn costs by itself"
KINDS = ("floor", "handed", "stream", "run")


def turn_of(kind: str, ref: Reference) -> Callable[[object], Awaitable[Any]]:
    """One whole turn of `kind`, as a function of a dummy argument (for `gather`)."""

    async def floor(_: object) -> None:
        await ref.plain()

    async def streamed(_: object) -> None:
        async with ref.pipe.stream(ref.turn) as events:
            async for _event in events:
                pass

    async def handed(_: object) -> None:
        await ref.handed()

    async def ran(_: object) -> None:
        await ref.pipe.run(ref.turn)

    return {"floor": floor, "handed": handed, "stream": streamed, "run": ran}[kind]


def _peak_rss() -> int:
    """This process's peak resident set, in bytes.

    Linux's VmHWM belongs to the process's own memory map; ru_maxrss (the fallback elsewhere)
    may carry the parent's peak over a fork and exec.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


async def _memory(kind: str, count: int, loop: str) -> dict[str, float]:
    fn = turn_of(kind, reference(loop=loop))
    await gather(loop, fn, [None] * 2)  # warm up: imports, caches
    await gather(loop, fn, [None] * count)
    rss = _peak_rss()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    await gather(loop, fn, [None] * count)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"peak_rss": rss, "heap_per_turn": (peak - base) / count}


def memory(kind: str, count: int, loop: str) -> dict[str, float]:
    """Memory per in-flight turn for a batch of `count`, measured in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.concurrency", "--memory", kind, str(count), loop],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


async def run(quick: bool, loop: str) -> list[Row]:
    sizes = (10, 30, 100) if quick else (100, 1000, 3000)
    ref = reference(loop=loop)
    operations = {}
    for size in sizes:
        for kind in KINDS:
            fn = turn_of(kind, ref)

            async def batch(fn: Callable[[object], Awaitable[Any]] = fn, size: int = size) -> None:
                await gather(loop, fn, [None] * size)

            operations[f"{kind} {size}"] = batch
    samples = await measure(operations, repeats=3 if quick else 5, inner=1, warmup=1)
    rows = []
    rate: dict[str, list[float]] = {}
    for size in sizes:
        for kind in KINDS:
            rate[f"{kind} {size}"] = [size / t for t in samples[f"{kind} {size}"].times]
        floor = rate[f"floor {size}"]
        rows.append(
            Row(
                f"floor: {size} concurrent plain turns",
                statistics.median(floor),
                spread(floor),
                unit="turns/s",
            )
        )
        for kind, label in (
            ("handed", "plain turns handed over to a consumer task"),
            ("stream", "Pipeline.stream with a consumer"),
            ("run", "Pipeline.run"),
        ):
            ours = rate[f"{kind} {size}"]
            shares = [p / f for p, f in zip(ours, floor, strict=True)]
            share = statistics.median(shares)
            targeted = (kind == "stream" and size == sizes[1]) or (
                kind == "run" and size != sizes[2]
            )
            rows.append(
                Row(
                    f"{label}: {size} concurrent turns",
                    statistics.median(ours),
                    spread(ours),
                    statistics.median(floor),
                    share,
                    unit="turns/s",
                    target=f">= {THROUGHPUT_TARGET:.0%} of the floor" if targeted else "",
                    met=share >= THROUGHPUT_TARGET if targeted else None,
                    note=HANDED_NOTE if kind == "handed" else "",
                )
            )
    small, large = sizes[0], sizes[-1]
    growth = {
        kind: [s / b for s, b in zip(rate[f"{kind} {small}"], rate[f"{kind} {large}"], strict=True)]
        for kind in KINDS
    }
    for kind in ("handed", "stream", "run"):
        over = [g / f for g, f in zip(growth[kind], growth["floor"], strict=True)]
        ratio = statistics.median(over)
        rows.append(
            Row(
                f"{'plain turns handed over' if kind == 'handed' else f'{kind}()'}: growth of"
                f" the cost per turn from {small} to {large} turns, over the floor's",
                statistics.median(growth[kind]),
                spread(over),
                statistics.median(growth["floor"]),
                ratio,
                unit="x",
                note="median and floor columns: each one's own growth (1x is flat)",
                target=f"<= {GROWTH_TARGET:g}x" if kind == "stream" else "",
                met=ratio <= GROWTH_TARGET if kind == "stream" else None,
            )
        )
    # Quick: one fresh process per kind, at the small size only (it checks the path runs).
    for size in sizes[:1] if quick else sizes:
        ours, theirs = memory("stream", size, loop), memory("floor", size, loop)
        rows.append(
            Row(
                f"peak RSS of a process running {size} streamed turns",
                ours["peak_rss"],
                0.0,
                theirs["peak_rss"],
                ours["peak_rss"] / theirs["peak_rss"],
                unit="bytes",
                note="one run in a fresh process; floor = plain turns",
            )
        )
        handed = memory("handed", size, loop)
        rows.append(
            Row(
                f"memory per in-flight plain turn handed over to a consumer task, {size} turns",
                handed["heap_per_turn"],
                0.0,
                theirs["heap_per_turn"],
                handed["heap_per_turn"] / theirs["heap_per_turn"],
                unit="bytes",
                note=HANDED_NOTE,
            )
        )
        ratio = ours["heap_per_turn"] / theirs["heap_per_turn"]
        rows.append(
            Row(
                f"memory per in-flight streamed turn, {size} turns",
                ours["heap_per_turn"],
                0.0,
                theirs["heap_per_turn"],
                ratio,
                unit="bytes",
                note="peak of Python allocations (tracemalloc) over the batch / N",
                target=f"<= {MEMORY_TARGET:g}x",
                met=ratio <= MEMORY_TARGET,
            )
        )
    return rows


def main(argv: list[str]) -> None:
    if len(argv) != 4 or argv[0] != "--memory" or argv[1] not in KINDS:
        raise SystemExit(
            "usage: python -m bench.concurrency --memory floor|handed|stream|run N LOOP"
        )
    kind, count, loop = argv[1], int(argv[2]), argv[3]
    print(json.dumps(run_on(_memory, kind, count, loop, loop=loop)))


if __name__ == "__main__":
    main(sys.argv[1:])
