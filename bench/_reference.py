"""The reference turn the turn, concurrency and events benchmarks share.

10 trivial pre hooks, one guardrail (a regex over the reply, placed first among the post
hooks, as guardrails should be), 10 trivial post hooks, and a `FunctionModel` streaming 200
chunks. The floor is the same turn in plain Python, with no turnplug object in it: the turn a
dict of plain messages, ten plain async functions before the model and ten after, the chunks
from a plain async generator, the guardrail the same regex over the joined reply, and a
consumer that sees every chunk (the plain turn is an async generator of them). With a loop
named, a checkpoint of that loop's own (``trio.sleep(0)``, ``asyncio.sleep(0)``) precedes
every chunk, in the pipeline's model and in the floor alike, so that concurrent turns
interleave.
"""

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs

from pipeline import Cont, Pipeline, Regenerate, cont, regenerate
from pipeline.testing import FunctionModel
from turns import Turn

from ._loops import hand_over
from ._loops import pause as loop_pause

PRE = 10
POST = 10
CHUNKS = 200
DENY = re.compile(r"(?i)internal use only")
QUESTION = "Can I get my money back?"

Hook = Callable[[Turn], Awaitable[Cont[Turn]]]
State = dict[str, Any]


def make_hooks(prefix: str, count: int) -> list[Hook]:
    """`count` distinct trivial hooks, each returning ``cont(turn)``."""
    hooks = []
    for index in range(count):

        async def trivial(turn: Turn) -> Cont[Turn]:
            return cont(turn)

        trivial.__qualname__ = f"{prefix}_{index}"
        hooks.append(trivial)
    return hooks


def plain_hooks(count: int) -> list[Callable[[State], Awaitable[State]]]:
    """`count` distinct trivial plain async functions, each returning the state it got."""
    functions = []
    for _ in range(count):

        async def trivial(state: State) -> State:
            return state

        functions.append(trivial)
    return functions


def guardrail(turn: Turn) -> Cont[Turn] | Regenerate:
    """An output validator: a denied phrase sends the model back."""
    assert turn.reply is not None
    if DENY.search(turn.reply.text):
        return regenerate("Do not reveal internal material.")
    return cont(turn)


def make_chunks(count: int = CHUNKS) -> list[str]:
    """`count` short chunks of prose, as a model streams them."""
    words = ["The ", "refund ", "is ", "issued ", "within ", "fourteen ", "days. "]
    return [words[index % len(words)] for index in range(count)]


@attrs.frozen
class Reference:
    """The reference turn as a pipeline, and as a plain turn with a consumer."""

    pipe: Pipeline
    turn: Turn
    plain: Callable[[], Awaitable[State]]
    """One whole plain turn, every chunk seen by its consumer; returns the final state."""
    handed: Callable[[], Awaitable[None]]
    """The plain turn in a task of its own, each chunk handed to its consumer's task (with a
    loop named; `_loops.hand_over`)."""


def reference(*, loop: str | None = None, chunks: int = CHUNKS) -> Reference:
    """The reference turn; with `loop`, that loop's checkpoint before every chunk."""
    pre = make_hooks("pre", PRE)
    post = make_hooks("post", POST)
    text = make_chunks(chunks)
    sleep = loop_pause(loop) if loop is not None else None

    async def paused() -> AsyncIterator[str]:
        assert sleep is not None
        for chunk in text:
            await sleep(0)
            yield chunk

    def reply(request: object) -> AsyncIterator[str] | list[str]:
        return paused() if sleep is not None else text

    pipe = Pipeline(model=FunctionModel(reply), pre=pre, post=[guardrail, *post])
    plain_pre, plain_post = plain_hooks(PRE), plain_hooks(POST)

    async def model() -> AsyncIterator[str]:
        for chunk in text:
            if sleep is not None:
                await sleep(0)
            yield chunk

    async def turn(state: State) -> AsyncIterator[str]:
        for fn in plain_pre:
            state = await fn(state)
        received = []
        async for chunk in model():
            received.append(chunk)
            yield chunk
        reply = "".join(received)
        if DENY.search(reply):
            raise RuntimeError("the reference reply is never denied")
        state["messages"].append({"role": "assistant", "content": reply})
        for fn in plain_post:
            state = await fn(state)
        state["done"] = True

    async def plain() -> State:
        state: State = {"messages": [{"role": "user", "content": QUESTION}]}
        async for _chunk in turn(state):
            pass  # the consumer: sees every chunk
        return state

    async def handed() -> None:
        if loop is None:
            raise RuntimeError("a turn handed over between tasks runs on a named loop")
        state: State = {"messages": [{"role": "user", "content": QUESTION}]}
        await hand_over(loop, lambda: turn(state))

    return Reference(pipe, Turn.start(QUESTION, turn_ref="bench"), plain, handed)
