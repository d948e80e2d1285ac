"""Pre-stage dispatch: a turn through 20 trivial ordered hooks.

The floor is a plain trio loop awaiting the same 20 functions. The pipeline's per-hook cost is
its marginal cost, (turn with 20 hooks - turn with no hook) / 20, so the fixed cost of a turn
(rendering, the model call, the result) is not charged to the hooks; it is reported on its own.
"""

import statistics
from collections.abc import Awaitable, Callable

from pipeline import Cont, Pipeline, cont
from pipeline.testing import FunctionModel
from turns import Turn

from ._harness import Row, measure, per_rep, spread

LOOPS = ("trio", "asyncio")
HOOKS = 20


def make_hooks(count: int = HOOKS) -> list[Callable[[Turn], Awaitable[Cont[Turn]]]]:
    """`count` distinct trivial hooks, each returning ``cont(turn)``."""
    hooks = []
    for index in range(count):

        async def trivial(turn: Turn) -> Cont[Turn]:
            return cont(turn)

        trivial.__qualname__ = f"trivial_{index}"
        hooks.append(trivial)
    return hooks


async def run(quick: bool, loop: str) -> list[Row]:
    repeats, inner = (3, 10) if quick else (31, 300)
    hooks = make_hooks()
    model = FunctionModel(lambda request: "ok")
    full = Pipeline(model=model, pre=hooks)
    empty = Pipeline(model=model, pre=[])
    turn = Turn.start("hi", turn_ref="bench")

    async def floor() -> None:
        value = turn
        for fn in hooks:
            signal = await fn(value)
            value = signal.value

    async def consume(pipe: Pipeline) -> None:
        async with pipe.stream(turn) as events:
            async for _ in events:
                pass

    async def run_full() -> None:
        await full.run(turn)

    async def run_empty() -> None:
        await empty.run(turn)

    async def stream_full() -> None:
        await consume(full)

    async def stream_empty() -> None:
        await consume(empty)

    samples = await measure(
        {
            "floor": floor,
            "run_full": run_full,
            "run_empty": run_empty,
            "stream_full": stream_full,
            "stream_empty": stream_empty,
        },
        repeats=repeats,
        inner=inner,
    )
    floor_hook = [value / HOOKS for value in samples["floor"].times]
    rows = [
        Row(
            "floor: plain loop, per hook",
            statistics.median(floor_hook),
            spread(floor_hook),
        )
    ]
    for mode in ("run", "stream"):
        marginal = per_rep(
            lambda full, empty: (full - empty) / HOOKS,
            samples[f"{mode}_full"],
            samples[f"{mode}_empty"],
        )
        ratios = [m / f for m, f in zip(marginal, floor_hook, strict=True)]
        consumer = " (live consumer)" if mode == "stream" else ""
        target = 3.0 if mode == "run" else 6.0
        ratio = statistics.median(ratios)
        rows.append(
            Row(
                f"{mode}(){consumer}, per hook",
                statistics.median(marginal),
                spread(marginal),
                statistics.median(floor_hook),
                ratio,
                target=f"<= {target:g}x",
                met=ratio <= target,
            )
        )
        rows.append(
            Row(
                f"{mode}(){consumer}, whole turn with no hook",
                samples[f"{mode}_empty"].median,
                samples[f"{mode}_empty"].spread,
                note="fixed cost: render, model call, result",
            )
        )
    return rows
