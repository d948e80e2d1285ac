"""The cost of a live event consumer: the reference turn through `stream` against `run`.

`Pipeline.run` builds no event; `Pipeline.stream` builds every event and hands it to a
consumer (here one that only iterates). The floor is `run` on the same turn, measured in the
same repetitions; the per-event cost divides the difference by the events of one turn.
"""

import statistics

from ._harness import Row, measure, per_rep, spread
from ._reference import reference

LOOPS = ("trio", "asyncio")


async def run(quick: bool, loop: str) -> list[Row]:
    repeats, inner = (3, 5) if quick else (31, 100)
    ref = reference()
    pipe, turn = ref.pipe, ref.turn
    async with pipe.stream(turn) as events:
        count = sum([1 async for _ in events])

    async def without() -> None:
        await pipe.run(turn)

    async def consumed() -> None:
        async with pipe.stream(turn) as events:
            async for _ in events:
                pass

    async def plain() -> None:
        await ref.plain()

    samples = await measure(
        {"floor": plain, "run": without, "stream": consumed}, repeats=repeats, inner=inner
    )
    ratios = per_rep(lambda s, r: s / r, samples["stream"], samples["run"])
    per_event = per_rep(lambda s, r: (s - r) / count, samples["stream"], samples["run"])
    over_floor = per_rep(lambda s, f: s / f, samples["stream"], samples["floor"])
    return [
        Row("Pipeline.run, no listener", samples["run"].median, samples["run"].spread),
        Row(
            f"Pipeline.stream, live consumer ({count} events)",
            samples["stream"].median,
            samples["stream"].spread,
            samples["run"].median,
            statistics.median(ratios),
            note="floor column: run() on the same turn",
        ),
        Row(
            "cost of one event (stream minus run, per event)",
            statistics.median(per_event),
            spread(per_event),
            note="built, buffered and handed to the consumer",
        ),
        Row(
            "Pipeline.stream against the plain floor",
            samples["stream"].median,
            spread(over_floor),
            samples["floor"].median,
            statistics.median(over_floor),
            note="floor column: the plain turn of the turn benchmark",
        ),
    ]
