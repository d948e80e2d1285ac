"""The reference turn: 10 pre hooks, a guardrail and 10 post hooks, 200 chunks, no delay.

The floor is one plain trio function making the same calls (see `_reference`). Both run the
whole turn once per operation; the ratio is taken per repetition.
"""

import statistics

from ._harness import Row, measure, per_rep, spread
from ._reference import CHUNKS, reference

TARGET = 5.0


async def run(quick: bool) -> list[Row]:
    repeats, inner = (3, 5) if quick else (31, 100)
    ref = reference()
    turn = ref.turn
    pipe, plain = ref.pipe, ref.floor

    async def floor() -> None:
        await plain(turn)

    async def pipeline() -> None:
        await pipe.run(turn)

    samples = await measure({"floor": floor, "run": pipeline}, repeats=repeats, inner=inner)
    ratios = per_rep(lambda r, f: r / f, samples["run"], samples["floor"])
    overhead = per_rep(lambda r, f: r - f, samples["run"], samples["floor"])
    ratio = statistics.median(ratios)
    return [
        Row(
            f"floor: plain trio function, whole turn ({CHUNKS} chunks)",
            samples["floor"].median,
            samples["floor"].spread,
        ),
        Row(
            "Pipeline.run, whole turn",
            samples["run"].median,
            samples["run"].spread,
            samples["floor"].median,
            ratio,
            target=f"<= {TARGET:g}x",
            met=ratio <= TARGET,
        ),
        Row(
            "framework overhead (run minus floor)",
            statistics.median(overhead),
            spread(overhead),
            note="the figure the issue compares with other frameworks",
        ),
    ]
