"""Message parts: the pieces a message is made of."""

from collections.abc import Iterator, Mapping
from typing import Any, Self, TypeAlias, final

import attrs


class _Empty(Mapping[str, Any]):
    """An empty mapping that cannot be filled: the shared default of every opaque mapping."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"


EMPTY: Mapping[str, Any] = _Empty()
"""The shared default of every opaque mapping: read-only, so no record can change it for all."""
_NO_META = EMPTY


@final
@attrs.frozen
class Text:
    """A run of text.

    Attributes:
        text: The text itself.
        meta: Opaque data carried along (provenance markers, provider data to echo back).
    """

    text: str
    meta: Mapping[str, Any] = _NO_META


@final
@attrs.frozen
class ToolCall:
    """A request, by the model or a hook, to run a tool.

    Attributes:
        id: The call id the matching `ToolResult.call_id` refers to.
        name: The tool's name.
        arguments: The decoded JSON arguments.
        meta: Opaque data carried along.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = _NO_META
    meta: Mapping[str, Any] = _NO_META

    def with_arguments(self, arguments: Mapping[str, Any]) -> Self:
        """Return a copy of this call with other arguments (a before-tool rewrite)."""
        return attrs.evolve(self, arguments=arguments)


@final
@attrs.frozen
class ToolResult:
    """The outcome of a tool call.

    Attributes:
        call_id: The `ToolCall.id` this answers.
        content: What the model reads.
        is_error: Whether the call failed.
        error_class: A short machine-readable cause when `is_error` (e.g. ``"tool_error"``).
        meta: Opaque data carried along.
    """

    call_id: str
    content: str
    is_error: bool = False
    error_class: str | None = None
    meta: Mapping[str, Any] = _NO_META

    def with_content(self, content: str) -> Self:
        """Return a copy of this result with other content (an after-tool rewrite)."""
        return attrs.evolve(self, content=content)


Part: TypeAlias = Text | ToolCall | ToolResult
