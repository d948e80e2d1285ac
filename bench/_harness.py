"""Timing helpers: interleaved repetitions after warm-up, medians and spreads.

The workloads of one benchmark are timed round-robin within each repetition (floor, then
each variant, then the floor again next repetition...), so that a slow patch of the machine
hits all of them alike; ratios are taken per repetition, then their median is reported.
"""

import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping

import attrs

Operation = Callable[[], Awaitable[object]]


@attrs.frozen
class Sample:
    """Per-operation timings (seconds) of one workload, one value per repetition."""

    name: str
    times: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return spread(self.times)


def spread(values: tuple[float, ...] | list[float]) -> float:
    """Interquartile range relative to the median (0 with too few values)."""
    if len(values) < 4:
        return 0.0
    q1, median, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / median if median else 0.0


async def measure(
    operations: Mapping[str, Operation],
    *,
    repeats: int,
    inner: int,
    warmup: int = 2,
    clock: Callable[[], float] = time.process_time,
) -> dict[str, Sample]:
    """Time each operation `inner` times per repetition, interleaved; per-operation seconds.

    The default clock is this process's CPU time: on a shared machine, the time the process
    spends preempted by others is not charged to whichever workload happened to be running.
    Workloads that wait (sleeps) pass ``clock=time.perf_counter``.
    """
    for _ in range(warmup):
        for operation in operations.values():
            for _ in range(inner):
                await operation()
    times: dict[str, list[float]] = {name: [] for name in operations}
    gc.collect()
    for _ in range(repeats):
        for name, operation in operations.items():
            start = clock()
            for _ in range(inner):
                await operation()
            times[name].append((clock() - start) / inner)
    return {name: Sample(name, tuple(values)) for name, values in times.items()}


def per_rep(fn: Callable[..., float], *samples: Sample) -> list[float]:
    """`fn` applied to the samples' values repetition by repetition."""
    return [fn(*values) for values in zip(*(sample.times for sample in samples), strict=True)]


@attrs.frozen
class Row:
    """One line of a benchmark's report (no median: the workload did not run; see the note)."""

    workload: str
    median: float | None
    spread: float | None
    floor: float | None = None
    ratio: float | None = None
    note: str = ""
    target: str = ""
    """The issue's target for this row, e.g. ``"<= 3x"``; empty when there is none."""
    met: bool | None = None
    """Whether the target was met in this run; None when there is no target."""
    unit: str = "s"
    """What `median` and `floor` count: seconds, ``"turns/s"``, ``"MB/s"`` or ``"bytes"``."""


def fmt_value(value: float, unit: str) -> str:
    """`value` in `unit` (seconds, ``"turns/s"``, ``"bytes"``), readable."""
    if unit == "s":
        return fmt_time(value)
    if unit == "bytes":
        if abs(value) >= 1024 * 1024:
            return f"{value / (1024 * 1024):.1f} MiB"
        if abs(value) >= 1024:
            return f"{value / 1024:.1f} KiB"
        return f"{value:.0f} B"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "MB/s":
        return f"{value:,.1f} MB/s"
    return f"{value:,.0f} {unit}"


def fmt_time(seconds: float) -> str:
    """A duration with a unit that keeps three significant figures readable."""
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    if abs(seconds) >= 1e-6:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e9:.0f} ns"
