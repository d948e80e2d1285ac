"""Many reference turns at once: throughput and memory at 100 and 1,000 concurrent turns.

Each turn is the reference turn (`_reference`) with ``await trio.sleep(0)`` before every
chunk, so that all the turns of a batch are in flight together and interleave chunk by chunk.
One operation starts a batch of N turns in one nursery and waits for all of them; turns per
second is N over its time. The floor is the same batch of plain trio functions. Ratios are
taken per repetition (pipeline throughput / floor throughput), and the scaling ratio is the
time of 1,000 turns over the time of 100 (linear is 10x).

Memory is measured in a fresh subprocess per batch (``python -m bench.concurrency --memory
KIND N``): the peak resident set of the process once the batch has run, and the peak of
Python allocations (`tracemalloc`) during a second batch, divided by N: the memory of one
turn in flight.
"""

import json
import resource
import statistics
import subprocess
import sys
import tracemalloc
from pathlib import Path

import trio

from ._harness import Row, measure, per_rep, spread
from ._reference import reference

ROOT = Path(__file__).resolve().parent.parent
THROUGHPUT_TARGET = 0.5
SCALING_TARGET = 11.0


async def batch(count: int, fn, turn) -> None:  # type: ignore[no-untyped-def]
    """Run `count` turns of `fn` concurrently."""
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(fn, turn)


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


async def _memory(kind: str, count: int) -> dict[str, float]:
    ref = reference(pause=True)
    fn = ref.pipe.run if kind == "pipeline" else ref.floor
    await batch(2, fn, ref.turn)  # warm up: imports, caches
    await batch(count, fn, ref.turn)
    rss = _peak_rss()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    await batch(count, fn, ref.turn)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"peak_rss": rss, "heap_per_turn": (peak - base) / count}


def memory(kind: str, count: int) -> dict[str, float]:
    """Memory per in-flight turn for a batch of `count`, measured in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.concurrency", "--memory", kind, str(count)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return json.loads(done.stdout)


async def run(quick: bool) -> list[Row]:
    sizes = (10, 100) if quick else (100, 1000)
    ref = reference(pause=True)
    pipe, plain, turn = ref.pipe, ref.floor, ref.turn
    operations = {}
    for size in sizes:

        async def floor(size: int = size) -> None:
            await batch(size, plain, turn)

        async def pipeline(size: int = size) -> None:
            await batch(size, pipe.run, turn)

        operations[f"floor {size}"] = floor
        operations[f"pipeline {size}"] = pipeline
    samples = await measure(
        operations, repeats=3 if quick else 9, inner=1, warmup=1 if quick else 2
    )
    rows = []
    for size in sizes:
        floor_rate = [size / t for t in samples[f"floor {size}"].times]
        pipe_rate = [size / t for t in samples[f"pipeline {size}"].times]
        shares = [p / f for p, f in zip(pipe_rate, floor_rate, strict=True)]
        share = statistics.median(shares)
        rows.append(
            Row(
                f"floor: {size} concurrent plain turns",
                statistics.median(floor_rate),
                spread(floor_rate),
                unit="turns/s",
            )
        )
        rows.append(
            Row(
                f"Pipeline.run: {size} concurrent turns",
                statistics.median(pipe_rate),
                spread(pipe_rate),
                statistics.median(floor_rate),
                share,
                unit="turns/s",
                target=f">= {THROUGHPUT_TARGET:.0%} of the floor",
                met=share >= THROUGHPUT_TARGET,
            )
        )
    small, large = sizes
    for kind in ("pipeline", "floor"):
        scaling = per_rep(
            lambda big, little: big / little,
            samples[f"{kind} {large}"],
            samples[f"{kind} {small}"],
        )
        ratio = statistics.median(scaling)
        name = "Pipeline.run" if kind == "pipeline" else "floor"
        rows.append(
            Row(
                f"{name}: time of {large} turns over {small}",
                samples[f"{kind} {large}"].median,
                spread(scaling),
                samples[f"{kind} {small}"].median,
                ratio,
                note="linear is 10x",
                target=f"<= {SCALING_TARGET:g}x" if kind == "pipeline" else "",
                met=ratio <= SCALING_TARGET if kind == "pipeline" else None,
            )
        )
    # Quick: one fresh process per kind, at the small size only (it checks the path runs).
    for size in sizes[:1] if quick else sizes:
        ours, theirs = memory("pipeline", size), memory("floor", size)
        rows.append(
            Row(
                f"peak RSS of a process running {size} turns",
                ours["peak_rss"],
                0.0,
                theirs["peak_rss"],
                ours["peak_rss"] / theirs["peak_rss"],
                unit="bytes",
                note="one run in a fresh process; floor = plain turns",
            )
        )
        rows.append(
            Row(
                f"memory per in-flight turn, {size} turns",
                ours["heap_per_turn"],
                0.0,
                theirs["heap_per_turn"],
                ours["heap_per_turn"] / theirs["heap_per_turn"],
                unit="bytes",
                note="peak of Python allocations (tracemalloc) over the batch / N",
            )
        )
    return rows


def main(argv: list[str]) -> None:
    kind, count = argv[1], int(argv[2])
    if argv[0] != "--memory" or kind not in ("pipeline", "floor"):
        raise SystemExit("usage: python -m bench.concurrency --memory pipeline|floor N")
    print(json.dumps(trio.run(_memory, kind, count)))


if __name__ == "__main__":
    main(sys.argv[1:])
