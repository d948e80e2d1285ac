"""Helpers the provider tests share."""

from typing import TypeVar

import pytest

from pipeline import Model, ModelEvent, ModelRequest, Pipeline, ProviderError
from turns import Message, Turn

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
    """Run a turn through a pipeline, expect `error`, and return it.

    The single place to assert that a failed turn committed nothing, once the durable log
    exists on this branch (run the turn in a session over a MemoryLog and check it is empty).
    """
    pipe = Pipeline(model=model)
    with pytest.raises(error) as caught:
        await pipe.run(Turn.start("hi"))
    assert KEY not in str(caught.value)
    return caught.value
