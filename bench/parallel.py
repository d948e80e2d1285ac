"""A parallel group of 10 members that sleep 20 ms.

Two floors, measured in the same run: the loop's own sleep of the slowest member (the ideal)
and a plain task group of the loop's own running the same ten sleeps. The pipeline's figure is
the group turn minus a turn with no hook, so the turn's fixed cost is not charged to the group.
"""

import statistics
import time

from pipeline import Pipeline, parallel
from pipeline.testing import FunctionModel
from turns import Text, Turn

from ._harness import Row, measure, per_rep, spread
from ._loops import gather, pause

LOOPS = ("trio", "asyncio")
MEMBERS = 10
SLEEP = 0.020
LIMIT = 0.001
"""The target: at most this much above the slowest member."""


async def run(quick: bool, loop: str) -> list[Row]:
    sleep = pause(loop)
    repeats, inner = (3, 1) if quick else (41, 5)
    members = []
    for index in range(MEMBERS):

        async def member(turn: Turn, index: int = index) -> list[Text]:
            await sleep(SLEEP)
            return [Text(f"doc {index}")]

        member.__qualname__ = f"search_{index}"
        members.append(member)
    model = FunctionModel(lambda request: "ok")
    grouped = Pipeline(model=model, pre=[parallel(*members)])
    empty = Pipeline(model=model)
    turn = Turn.start("hi", turn_ref="bench")

    async def slowest() -> None:
        await sleep(SLEEP)

    async def nursery() -> None:
        await gather(loop, lambda member: member(turn), members)

    async def group() -> None:
        await grouped.run(turn)

    async def no_hook() -> None:
        await empty.run(turn)

    samples = await measure(
        {"slowest": slowest, "nursery": nursery, "group": group, "empty": no_hook},
        repeats=repeats,
        inner=inner,
        warmup=1,
        clock=time.perf_counter,  # the members wait: wall time is what a group costs
    )
    group_cost = per_rep(lambda g, e: g - e, samples["group"], samples["empty"])
    above = per_rep(
        lambda g, e, s: g - e - s, samples["group"], samples["empty"], samples["slowest"]
    )
    nursery_above = per_rep(lambda n, s: n - s, samples["nursery"], samples["slowest"])
    over_nursery = per_rep(
        lambda g, e, n: g - e - n, samples["group"], samples["empty"], samples["nursery"]
    )
    return [
        Row(
            "floor: the loop's sleep(20 ms), the slowest member",
            samples["slowest"].median,
            samples["slowest"].spread,
        ),
        Row(
            "floor: plain task group of 10 sleeps",
            samples["nursery"].median,
            samples["nursery"].spread,
        ),
        Row(
            "parallel group of 10 (turn minus empty turn)",
            statistics.median(group_cost),
            spread(group_cost),
            samples["slowest"].median,
            statistics.median(group_cost) / samples["slowest"].median,
        ),
        Row(
            "group above slowest member",
            statistics.median(above),
            spread(above),
            target="<= 1 ms",
            met=statistics.median(above) <= LIMIT,
        ),
        Row(
            "plain task group above slowest member",
            statistics.median(nursery_above),
            spread(nursery_above),
            note="the loop's own cost: task spawns, timer wake-up",
        ),
        Row(
            "group above plain task group",
            statistics.median(over_nursery),
            spread(over_nursery),
            note="turnplug's own cost for 10 members",
        ),
    ]
