"""The reference turn: 10 pre hooks, a guardrail and 10 post hooks, 200 chunks, no delay.

Through `Pipeline.run` and through `Pipeline.stream` with a consumer that iterates every
event (what a chat UI does), against the same turn in plain Python whose consumer sees every
chunk (see `_reference`). Each operation is one whole turn; ratios are taken per repetition.
"""

import statistics

from ._harness import Row, measure, per_rep, spread
from ._reference import CHUNKS, reference

LOOPS = ("trio", "asyncio")
TARGETS = {"run": 4.0, "stream": 6.0}


async def run(quick: bool, loop: str) -> list[Row]:
    repeats, inner = (3, 5) if quick else (31, 100)
    ref = reference()
    pipe, turn = ref.pipe, ref.turn

    async def floor() -> None:
        await ref.plain()

    async def run_turn() -> None:
        await pipe.run(turn)

    async def stream_turn() -> None:
        async with pipe.stream(turn) as events:
            async for _ in events:
                pass

    samples = await measure(
        {"floor": floor, "run": run_turn, "stream": stream_turn}, repeats=repeats, inner=inner
    )
    rows = [
        Row(
            f"floor: plain turn, its consumer sees every chunk ({CHUNKS} chunks)",
            samples["floor"].median,
            samples["floor"].spread,
        )
    ]
    for name, label in (
        ("run", "Pipeline.run, whole turn"),
        ("stream", "Pipeline.stream with a consumer, whole turn"),
    ):
        ratios = per_rep(lambda r, f: r / f, samples[name], samples["floor"])
        ratio = statistics.median(ratios)
        overhead = per_rep(lambda r, f: r - f, samples[name], samples["floor"])
        rows.append(
            Row(
                label,
                samples[name].median,
                spread(ratios),
                samples["floor"].median,
                ratio,
                target=f"<= {TARGETS[name]:g}x",
                met=ratio <= TARGETS[name],
                note=f"framework overhead {statistics.median(overhead) * 1e6:,.0f} µs",
            )
        )
    return rows
