"""Helpers the provider tests share."""

from typing import TypeVar

import pytest

from pipeline import Model, ModelEvent, ModelRequest, Pipeline, ProviderError
from pipeline.logs import MemoryLog
from turns import Message

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
