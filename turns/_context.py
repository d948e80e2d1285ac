"""The conversation so far, ambient state, and per-turn request shaping."""

from collections.abc import Iterable, Mapping
from typing import Any, Self, final

import attrs

from ._message import Message
from ._parts import EMPTY

_NO_VALUES = EMPTY


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

    messages: tuple[Message, ...] = ()
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()

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

    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: str | None = None
    active_tools: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = _NO_VALUES


def narrow_tools(current: Iterable[str], wanted: Iterable[str]) -> tuple[str, ...]:
    """The names of `current` that are also in `wanted`, in `current`'s order."""
    keep = frozenset(wanted)
    return tuple(name for name in current if name in keep)
