"""The reference turn the turn, concurrency and events benchmarks share.

10 trivial pre hooks, one guardrail (a regex over the reply, placed first among the post
hooks, as guardrails should be), 10 trivial post hooks, and a `FunctionModel` streaming 200
chunks. The floor is one plain trio function making the same calls: the same hook functions
in the same order, the same chunks from a plain async generator, one `Reply` built from them.
With ``pause=True`` every chunk is preceded by ``await trio.sleep(0)``, in the pipeline's
model and in the floor alike, so that concurrent turns interleave.
"""

import re
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import trio

from pipeline import Cont, Pipeline, Regenerate, cont, regenerate
from pipeline.testing import FunctionModel
from turns import Message, Reply, Turn

PRE = 10
POST = 10
CHUNKS = 200
DENY = re.compile(r"(?i)internal use only")

Hook = Callable[[Turn], Awaitable[Cont[Turn]]]


def make_hooks(prefix: str, count: int) -> list[Hook]:
    """`count` distinct trivial hooks, each returning ``cont(turn)``."""
    hooks = []
    for index in range(count):

        async def trivial(turn: Turn) -> Cont[Turn]:
            return cont(turn)

        trivial.__qualname__ = f"{prefix}_{index}"
        hooks.append(trivial)
    return hooks


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
    """The reference turn as a pipeline and as its plain floor."""

    pipe: Pipeline
    floor: Callable[[Turn], Awaitable[Turn]]
    turn: Turn


def reference(*, pause: bool = False, chunks: int = CHUNKS) -> Reference:
    """The reference turn; with `pause`, a checkpoint before every chunk."""
    pre = make_hooks("pre", PRE)
    post = make_hooks("post", POST)
    text = make_chunks(chunks)

    async def paused() -> AsyncIterator[str]:
        for chunk in text:
            await trio.sleep(0)  # noqa: ASYNC115 - the workload as the issue states it
            yield chunk

    async def plain() -> AsyncIterator[str]:
        for chunk in text:
            yield chunk

    source = paused if pause else plain

    def reply(request: object) -> AsyncIterator[str] | list[str]:
        return paused() if pause else text

    pipe = Pipeline(model=FunctionModel(reply), pre=pre, post=[guardrail, *post])

    async def floor(turn: Turn) -> Turn:
        for fn in pre:
            turn = (await fn(turn)).value
        received = [chunk async for chunk in source()]
        message = Message.assistant("".join(received))
        turn = attrs.evolve(turn, reply=Reply(message, (message,)))
        signal = guardrail(turn)
        assert type(signal) is Cont
        turn = signal.value
        for fn in post:
            turn = (await fn(turn)).value
        return turn

    return Reference(pipe, floor, Turn.start("Can I get my money back?", turn_ref="bench"))
