"""One tool step: the model asks for 4 calls of trivial async tools, then answers.

The pipeline checks each call's arguments against its tool's schema, runs the calls in a
bounded nursery, feeds the results back and calls the model again. The floor is a plain
function making the same two model calls (plain async generators) and running the same four
tool functions in the loop's own task group, results kept in call order. No target: informational.
"""

import statistics
from collections.abc import AsyncIterator

from pipeline import Pipeline
from pipeline.testing import FunctionModel
from turns import ToolCall, ToolResult, Turn

from ._harness import Row, measure, per_rep
from ._loops import gather

LOOPS = ("trio", "asyncio")
CALLS = 4


async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def run(quick: bool, loop: str) -> list[Row]:
    repeats, inner = (3, 5) if quick else (31, 200)
    calls = [ToolCall(f"call_{i}", "lookup", {"key": f"k{i}"}) for i in range(CALLS)]

    def reply(request) -> list[str | ToolCall]:  # type: ignore[no-untyped-def]
        # Two model calls per attempt: the tool step, then the answer once results are in.
        if request.messages[-1].role == "tool":
            return ["Here is what I found."]
        return list(calls)

    pipe = Pipeline(model=FunctionModel(reply), tools=[lookup])
    turn = Turn.start("look these up", turn_ref="bench")

    async def first() -> AsyncIterator[ToolCall]:
        for call in calls:
            yield call

    async def second() -> AsyncIterator[str]:
        yield "Here is what I found."

    async def floor() -> None:
        asked = [call async for call in first()]
        results: list[ToolResult | None] = [None] * len(asked)

        async def one(index: int, call: ToolCall) -> None:
            results[index] = ToolResult(call.id, await lookup(**call.arguments))

        await gather(loop, lambda pair: one(*pair), list(enumerate(asked)))
        _ = [chunk async for chunk in second()]

    async def pipeline() -> None:
        await pipe.run(turn)

    samples = await measure({"floor": floor, "run": pipeline}, repeats=repeats, inner=inner)
    ratios = per_rep(lambda r, f: r / f, samples["run"], samples["floor"])
    return [
        Row(
            f"floor: plain task group of {CALLS} tool calls, two model streams",
            samples["floor"].median,
            samples["floor"].spread,
        ),
        Row(
            f"Pipeline.run: one tool step of {CALLS} calls, then the answer",
            samples["run"].median,
            samples["run"].spread,
            samples["floor"].median,
            statistics.median(ratios),
            note="no target",
        ),
    ]
