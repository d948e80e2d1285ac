"""Helpers the provider tests share."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
import trio
import trio.from_thread
import trio.lowlevel

from pipeline import Model, ModelEvent, ModelRequest, Pipeline, ProviderError
from pipeline.logs import MemoryLog
from turns import Message

from .server import ProtocolServer, Reply

E = TypeVar("E", bound=ProviderError)

KEY = "sk-test-5ecret-never-shown"
"""The API key every test provider uses: no error or repr may contain it."""


def hi() -> ModelRequest:
    """The smallest request: one user message."""
    return ModelRequest((Message.user("hi"),))


async def collect(model: Model, request: ModelRequest | None = None) -> list[ModelEvent]:
    """Every event of one model call."""
    async with model.stream(request or hi()) as events:
        return [event async for event in events]


async def fails_in_pipeline(model: Model, error: type[E]) -> E:
    """Run a turn in a session over a log, expect `error`, check nothing was committed.

    The conversation already holds one turn, so "nothing committed" is checked against a
    log that is not empty to begin with.
    """
    log = MemoryLog()
    earlier = (Message.user("earlier"), Message.assistant("answer"))
    await log.append("c", "earlier", earlier)
    pipe = Pipeline(model=model)
    with pytest.raises(error) as caught:
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send("hi")
    assert KEY not in str(caught.value)
    assert (await log.load("c")).messages == earlier
    assert [entry.turn_ref for entry in await log.entries("c")] == ["earlier"]
    return caught.value


@contextmanager
def serving_in_thread(*replies: Reply, repeat: Reply | None = None) -> Iterator[ProtocolServer]:
    """A keep-alive protocol server run by trio in a thread of its own.

    For tests that run the same body on each event loop (``anyio.run(body, backend=...)``):
    the server does not share the loop under test.
    """
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        server = ProtocolServer(replies, repeat=repeat, keep_alive=True)
        async with trio.open_nursery() as nursery:
            await server.start(nursery)
            box["server"] = server
            box["token"] = trio.lowlevel.current_trio_token()
            box["stop"] = nursery.cancel_scope.cancel
            ready.set()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    assert ready.wait(10), "the protocol server did not start"
    try:
        yield box["server"]
    finally:
        stop: Callable[[], None] = box["stop"]
        trio.from_thread.run_sync(stop, trio_token=box["token"])
        thread.join(10)
