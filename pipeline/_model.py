"""The model seam: what the runtime sends a model and what it reads back."""

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeAlias, final, runtime_checkable

import attrs

from turns import Message, RequestOptions, ToolCall, ToolSpec, Usage


@final
@attrs.frozen
class ModelRequest:
    """One model call.

    Attributes:
        messages: The rendered messages (system first, then history, injections, user).
        tools: The specs of the tools active for this call.
        options: The turn's request shaping.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    options: RequestOptions = RequestOptions()


@final
@attrs.frozen
class ModelText:
    """A chunk of the model's text."""

    text: str


@final
@attrs.frozen
class ModelToolCall:
    """A complete tool call from the model (its arguments assembled and decoded)."""

    call: ToolCall


@final
@attrs.frozen
class ModelFinish:
    """The end of the model's response.

    Attributes:
        reason: ``"stop"``, ``"length"``, ``"tool_calls"``, ... as the provider said.
        usage: Token counts, where the provider reported them.
    """

    reason: str | None = None
    usage: Usage = Usage()


ModelEvent: TypeAlias = ModelText | ModelToolCall | ModelFinish


@runtime_checkable
class Model(Protocol):
    """Anything that can stream a response to a `ModelRequest`.

    ``model.stream(request)`` returns an async context manager yielding an async iterator of
    `ModelText`, `ModelToolCall` and a final `ModelFinish`. Leaving the context manager
    early (cancellation, a failure) must release the model's resources.
    """

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]: ...


def hold_model(model: object) -> AbstractAsyncContextManager[object]:
    """Keep `model`'s connections open for a block: its ``hold()`` when it has one (the
    providers' connection pool), else nothing. Pipelines and sessions hold their model, so
    their turns reuse connections and the block's end closes what it opened."""
    hold = getattr(model, "hold", None)
    if callable(hold):
        held: AbstractAsyncContextManager[object] = hold()
        return held
    return contextlib.nullcontext()
