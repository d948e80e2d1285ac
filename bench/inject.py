"""Pre hooks that each inject one `Text` (retrieval, memory), at 10, 40 and 160 hooks.

The pipeline's per-hook cost is its marginal cost: (turn with N injecting hooks - turn with no
hook) / N, so the fixed cost of a turn is not charged to the hooks. The floor is a plain loop
awaiting N plain async functions, each appending one part to a list and returning it. Two
targets: an injecting hook costs at most 3x the floor's per-hook cost, and the per-hook cost
is flat from 10 to 160 hooks (at 160 within 20% of at 10), so that a turn's cost is linear in
its hook count.
"""

import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline import Cont, Pipeline, cont
from pipeline.testing import FunctionModel
from turns import Text, Turn

from ._harness import Row, measure, spread

LOOPS = ("trio", "asyncio")
SIZES = (10, 40, 160)
TARGET = 3.0
FLAT = 1.2
PASSAGE = "Refunds are issued within 14 days of the return reaching our warehouse."


def injecting(count: int) -> list[Callable[[Turn], Awaitable[Cont[Turn]]]]:
    """`count` distinct pre hooks, each injecting one `Text`."""
    hooks = []
    for index in range(count):

        async def retrieve(turn: Turn) -> Cont[Turn]:
            return cont(turn.inject(Text(PASSAGE)))

        retrieve.__qualname__ = f"retrieve_{index}"
        hooks.append(retrieve)
    return hooks


def plain(count: int) -> list[Callable[[list[str]], Awaitable[list[str]]]]:
    """`count` distinct plain async functions, each appending one part."""
    functions = []
    for _ in range(count):

        async def append(parts: list[str]) -> list[str]:
            parts.append(PASSAGE)
            return parts

        functions.append(append)
    return functions


async def run(quick: bool, loop: str) -> list[Row]:
    sizes = SIZES[:2] if quick else SIZES
    repeats, inner = (3, 3) if quick else (15, 20)
    model = FunctionModel(lambda request: "ok")
    turn = Turn.start("Can I get my money back?", turn_ref="bench")
    operations: dict[str, Callable[[], Awaitable[Any]]] = {}
    empty = Pipeline(model=model, pre=[])

    async def run_empty() -> None:
        await empty.run(turn)

    operations["empty"] = run_empty
    for size in sizes:
        pipe = Pipeline(model=model, pre=injecting(size))
        functions = plain(size)

        async def floor(functions: list[Any] = functions) -> None:
            parts: list[str] = []
            for fn in functions:
                parts = await fn(parts)

        async def pipeline(pipe: Pipeline = pipe) -> None:
            await pipe.run(turn)

        operations[f"floor {size}"] = floor
        operations[f"run {size}"] = pipeline
    samples = await measure(operations, repeats=repeats, inner=inner)
    rows = []
    per_hook: dict[str, dict[int, list[float]]] = {"floor": {}, "run": {}}
    for size in sizes:
        floor_hook = [t / size for t in samples[f"floor {size}"].times]
        run_hook = [
            (t - e) / size
            for t, e in zip(samples[f"run {size}"].times, samples["empty"].times, strict=True)
        ]
        per_hook["floor"][size], per_hook["run"][size] = floor_hook, run_hook
        ratios = [r / f for r, f in zip(run_hook, floor_hook, strict=True)]
        ratio = statistics.median(ratios)
        rows.append(
            Row(
                f"floor: plain loop appending a part, per hook, {size} hooks",
                statistics.median(floor_hook),
                spread(floor_hook),
            )
        )
        rows.append(
            Row(
                f"run(), injecting pre hook, per hook, {size} hooks",
                statistics.median(run_hook),
                spread(run_hook),
                statistics.median(floor_hook),
                ratio,
                target=f"<= {TARGET:g}x",
                met=ratio <= TARGET,
            )
        )
    low, high = sizes[0], sizes[-1]
    for kind in ("run", "floor"):
        growth = [
            h / low_ for h, low_ in zip(per_hook[kind][high], per_hook[kind][low], strict=True)
        ]
        ratio = statistics.median(growth)
        rows.append(
            Row(
                f"{'run()' if kind == 'run' else 'floor'}: per-hook cost at {high} hooks over"
                f" at {low}",
                statistics.median(per_hook[kind][high]),
                spread(growth),
                statistics.median(per_hook[kind][low]),
                ratio,
                note="flat is 1x",
                target=f"<= {FLAT:g}x" if kind == "run" else "",
                met=ratio <= FLAT if kind == "run" else None,
            )
        )
    rows.append(
        Row(
            "run(), whole turn with no hook",
            samples["empty"].median,
            samples["empty"].spread,
            note="fixed cost, subtracted above",
        )
    )
    return rows
