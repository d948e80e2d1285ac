"""The conversation so far, ambient state, and per-turn request shaping."""

from collections.abc import Iterable, Mapping
from typing import Any, Self, final

import attrs

from ._message import Message
from ._parts import EMPTY

_NO_VALUES = EMPTY


def _messages(messages: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(messages)


def _specs(specs: Iterable["ToolSpec"]) -> tuple["ToolSpec", ...]:
    return tuple(specs)


def _names(names: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if names is None else tuple(names)


@final
@attrs.frozen
class ToolSpec:
    """What the model is told about a tool.

    Attributes:
        name: The tool's name, as the model calls it.
        description: What it does, for the model.
        parameters: A JSON Schema object describing its arguments.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}
    )


@final
@attrs.frozen
class Context:
    """The conversation so far.

    Attributes:
        messages: The history, oldest first. It is sent untouched as the prompt's prefix.
        system: The system prompt, if any.
        tools: The tools the model may call.
    """

    messages: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    system: str | None = None
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_specs)

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The names of `tools`, in order."""
        return tuple(spec.name for spec in self.tools)


@final
@attrs.frozen
class Scope:
    """Ambient state for hooks and tools (who is asking, loaded resources).

    Attributes:
        current_user: Whoever the turn is for, in whatever shape the application uses.
        assigns: Named values hooks and tools read; change them with `assign`.
    """

    current_user: Any = None
    assigns: Mapping[str, Any] = _NO_VALUES

    def assign(self, **values: Any) -> Self:
        """Return a scope with `values` added to (or replacing) `assigns`."""
        return attrs.evolve(self, assigns={**self.assigns, **values})


def _check_temperature(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise TypeError(f"RequestOptions.temperature must be a number or None, got {value!r}")
    if value is not None and not 0 <= value <= 2:
        raise ValueError(f"RequestOptions.temperature must be between 0 and 2, got {value!r}")


def _check_max_tokens(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"RequestOptions.max_tokens must be a positive int or None, got {value!r}")


def _check_tool_choice(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(
            "RequestOptions.tool_choice must be 'auto', 'none', 'required' or a tool's name,"
            f" got {value!r}"
        )


@final
@attrs.frozen
class RequestOptions:
    """Per-turn request shaping.

    Attributes:
        temperature: Sampling temperature, or the provider's default.
        max_tokens: The output token limit, or the provider's default.
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or the name of one active tool.
        active_tools: The tool names the model may call this turn; ``None`` means all of the
            context's tools. It can only narrow (see `Turn.with_request`).
        extra: Provider-specific options passed through as they are.
    """

    temperature: float | None = attrs.field(default=None, validator=_check_temperature)
    max_tokens: int | None = attrs.field(default=None, validator=_check_max_tokens)
    tool_choice: str | None = attrs.field(default=None, validator=_check_tool_choice)
    active_tools: tuple[str, ...] | None = attrs.field(default=None, converter=_names)
    extra: Mapping[str, Any] = _NO_VALUES


def narrow_tools(current: Iterable[str], wanted: Iterable[str]) -> tuple[str, ...]:
    """The names of `current` that are also in `wanted`, in `current`'s order."""
    keep = frozenset(wanted)
    return tuple(name for name in current if name in keep)


def merge_extra(current: Mapping[str, Any], changes: object) -> Mapping[str, Any]:
    """`current` updated by `changes`, key by key; a key changed to ``None`` is removed.

    Raises:
        TypeError: `changes` is not a mapping.
    """
    if not isinstance(changes, Mapping):
        raise TypeError(
            f"extra must be a mapping of provider options, got {type(changes).__name__}"
            f" {changes!r} — e.g. turn.with_request(extra={{'seed': 7}}); set a key to None to"
            " remove it"
        )
    merged = {**current, **changes}
    return {key: value for key, value in merged.items() if value is not None}
