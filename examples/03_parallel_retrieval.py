"""Retrieval that does not serialize latency: a parallel group of append-only members.

The three lookups take 30, 50 and 20 ms; the group takes about as long as the slowest, and
their results are injected in declaration order, whatever order they finish in.

Run it: ``python examples/03_parallel_retrieval.py``
"""

import anyio
import trio

from pipeline import ModelRequest, Pipeline, TurnResult, parallel
from pipeline.testing import FunctionModel
from turns import Text, Turn


# The lookups await AnyIO, not trio or asyncio, so they run on whichever loop runs the turn.
async def search_docs(turn: Turn) -> list[Text]:
    await anyio.sleep(0.030)
    return [Text("[docs] Refunds take 14 days.")]


async def search_tickets(turn: Turn) -> list[Text]:
    await anyio.sleep(0.050)
    return [Text("[tickets] Ada asked about a refund last week.")]


async def load_profile(turn: Turn) -> list[Text]:
    await anyio.sleep(0.020)
    return [Text("[profile] Ada, premium plan.")]


def answer(request: ModelRequest) -> str:
    """The offline model says how much context it was given."""
    user = request.messages[-1]
    return f"I was given {len(user.parts) - 1} pieces of context."


PIPE = Pipeline(
    model=FunctionModel(answer),
    pre=[parallel(search_docs, search_tickets, load_profile, name="retrieval")],
)


async def main() -> TurnResult:
    started = anyio.current_time()
    result = await PIPE.run(Turn.start("How long do refunds take?"))
    elapsed = anyio.current_time() - started
    for injection in result.turn.injections:
        text = " ".join(part.text for part in injection.parts if isinstance(part, Text))
        print(f"{injection.source:<15} {text}")
    assert result.reply is not None
    print(f"reply: {result.reply.text}")
    print(f"turn took {elapsed * 1e3:.0f} ms (slowest lookup: 50 ms, all three: 100 ms)")
    return result


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
