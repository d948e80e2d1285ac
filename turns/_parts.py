"""Message parts: the pieces a message is made of."""

from collections.abc import Iterable, Iterator, Mapping
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


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def part_problem(part: object) -> str | None:
    """What makes `part` no message part (a part of another type, or a field of the wrong
    type, which would otherwise fail later, when the turn is rendered or committed), or
    None."""
    # The fields are read as plain objects: callers without a type checker pass anything.
    if isinstance(part, Text):
        text: object = part.text
        if not isinstance(text, str):
            return f"Text.text must be a str, got {_shown(text)}"
    elif isinstance(part, ToolCall):
        call_id: object = part.id
        name: object = part.name
        arguments: object = part.arguments
        if not isinstance(call_id, str) or not isinstance(name, str):
            return f"ToolCall.id and .name must be str, got {_shown(call_id)}, {_shown(name)}"
        if not isinstance(arguments, Mapping):
            return (
                "ToolCall.arguments must be a mapping (the decoded JSON object), got"
                f" {_shown(arguments)}"
            )
    elif isinstance(part, ToolResult):
        answers: object = part.call_id
        content: object = part.content
        if not isinstance(answers, str) or not isinstance(content, str):
            return (
                "ToolResult.call_id and .content must be str (encode a structured result as"
                f" JSON text), got {_shown(answers)}, {_shown(content)}"
            )
        is_error: object = part.is_error
        error_class: object = part.error_class
        # As a log reads them back: a bool (or 0 or 1), and a str or None. Anything else
        # would be committed, and the conversation could never be loaded again.
        if not isinstance(is_error, int) or is_error not in (0, 1):
            return f"ToolResult.is_error must be a bool, got {_shown(is_error)}"
        if error_class is not None and not isinstance(error_class, str):
            return f"ToolResult.error_class must be a str or None, got {_shown(error_class)}"
    else:
        return (
            f"a message part must be Text, ToolCall or ToolResult, got {_shown(part)} — wrap"
            " plain strings in Text(...)"
        )
    meta: object = part.meta
    if meta is not EMPTY:
        return meta_problem(type(part).__name__, meta)
    return None


def meta_problem(owner: str, meta: object) -> str | None:
    """What makes `meta`, the ``meta`` of an `owner` (``"Message"``, ``"Text"``, ...), no
    opaque mapping (no mapping, or a key that is no string at its top level), or None.

    A log stores meta as a JSON object: a key of another kind (a tuple) could never be
    committed or written, and would fail only then, far from the code that put it there.
    Keys deeper in it are checked where it is written, as a walk costs too much here.
    """
    if type(meta) is dict:
        # The common case, checked first: a dict whose keys are all plain strings.
        for key in meta:
            if type(key) is not str:
                break
        else:
            return None
    elif not isinstance(meta, Mapping):
        return f"{owner}.meta must be a mapping, got {_shown(meta)}"
    for key in meta:
        if not isinstance(key, str):
            return (
                f"{owner}.meta has the key {_shown(key)}: meta keys must be strings, as a log stores"
                " meta as a JSON object — use string keys"
            )
    return None


def exchange_problem(parts: Iterable[Part]) -> str | None:
    """What keeps the tool calls and results among one injection's `parts` from pairing up,
    or None.

    An injection's calls render as one assistant message followed by a tool message per
    result (see `render`), so every call needs exactly one result among the same parts and
    every result a call: a lone call or result is a request no provider accepts, and a
    durable one would be committed to the log and break every later turn.
    """
    # Dicts: ids in the order they came (for the messages), looked up in constant time.
    calls: dict[str, None] = {}
    answered: dict[str, None] = {}
    for part in parts:
        if type(part) is ToolCall:
            if part.id in calls:
                return f"two tool calls have the id {part.id!r}"
            calls[part.id] = None
        elif type(part) is ToolResult:
            if part.call_id in answered:
                return f"tool call {part.call_id!r} is answered twice"
            answered[part.call_id] = None
    if not calls and not answered:
        return None
    stray = [call_id for call_id in answered if call_id not in calls]
    if stray:
        return (
            f"tool results {stray} answer no tool call among the same parts — inject each"
            " ToolCall together with its ToolResult"
        )
    missing = [call_id for call_id in calls if call_id not in answered]
    if missing:
        return (
            f"tool calls {missing} have no result among the same parts — inject each"
            " ToolCall together with its ToolResult"
        )
    return None
