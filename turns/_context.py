"""The conversation so far, ambient state, and per-turn request shaping."""

from collections.abc import Iterable, Mapping
from typing import Any, Self, final

import attrs

from ._message import Message
from ._parts import EMPTY, _shown

_NO_VALUES = EMPTY


def _records(field: str, kind: type, given: object, hint: str) -> tuple[Any, ...]:
    """`given` as a tuple of `kind` records, or a TypeError naming `field` and the culprit.

    Checked as the record is built: a string or a dict in a history would otherwise travel
    to the model call and fail there, reported as if the provider had failed.
    """
    if type(given) is tuple:
        items: tuple[Any, ...] = given
    elif isinstance(given, str | bytes | Mapping) or not isinstance(given, Iterable):
        raise TypeError(
            f"{field} must be an iterable of {kind.__name__} records, got {_shown(given)}{hint}"
        )
    else:
        items = tuple(given)
    # Counted in C (records are built on every evolve); the loop only names the culprit.
    if items and list(map(type, items)).count(kind) != len(items):
        for index, item in enumerate(items):
            if type(item) is not kind:
                raise TypeError(
                    f"{field}[{index}] must be a {kind.__name__}, got {_shown(item)}{hint}"
                )
    return items


_MESSAGE_HINT = " — build them with Message.user(...), Message.assistant(...), ..."


def _messages(messages: Iterable[Message]) -> tuple[Message, ...]:
    return _records("Context.messages", Message, messages, _MESSAGE_HINT)


def reply_messages(messages: Iterable[Message]) -> tuple[Message, ...]:
    """`Reply.messages` as a tuple of messages (the converter of that field)."""
    return _records("Reply.messages", Message, messages, _MESSAGE_HINT)


def _specs(specs: Iterable["ToolSpec"]) -> tuple["ToolSpec", ...]:
    return _records(
        "Context.tools", ToolSpec, specs, " — describe each tool as ToolSpec(name, ...)"
    )


def _check_system(_instance: Any, _attribute: Any, system: Any) -> None:
    if system is not None and not isinstance(system, str):
        raise TypeError(
            f"Context.system must be the system prompt's text or None, got {_shown(system)}"
        )


def _names(names: Iterable[str] | None) -> tuple[str, ...] | None:
    if names is None:
        return None
    given: object = names  # callers without a type checker pass anything
    if isinstance(given, str) or not isinstance(given, Iterable):
        raise TypeError(
            f"RequestOptions.active_tools must be a collection of tool names or None, got"
            f" {_shown(given)}"
        )
    kept = tuple(names)
    odd = [name for name in kept if not isinstance(name, str)]
    if odd:
        raise TypeError(f"RequestOptions.active_tools must be tool names (str), got {odd!r:.80}")
    return kept


def _check_mapping(instance: Any, attribute: Any, value: Any) -> None:
    if value is not EMPTY and not isinstance(value, Mapping):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a mapping, got {_shown(value)}"
        )


def _check_text(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str, got {_shown(value)}"
        )


def _no_description(value: str | None) -> str:
    # An absent description, as a tool dict of OpenAI or MCP gives it (`t.get("description")`),
    # is the empty one providers leave out; any other non-text is refused by `_check_text`.
    return "" if value is None else value


@final
@attrs.frozen
class ToolSpec:
    """What the model is told about a tool.

    Attributes:
        name: The tool's name, as the model calls it.
        description: What it does, for the model; None is taken as ``""`` (no description).
        parameters: A JSON Schema object describing its arguments.
    """

    name: str = attrs.field(validator=_check_text)
    description: str = attrs.field(default="", converter=_no_description, validator=_check_text)
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, validator=_check_mapping
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
    system: str | None = attrs.field(default=None, validator=_check_system)
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
    assigns: Mapping[str, Any] = attrs.field(default=_NO_VALUES, validator=_check_mapping)

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
        extra: Provider-specific options passed through as they are; a key the provider
            also writes (``model``, ``temperature``, ``tool_choice``, ...) wins over its
            value. The keys that make up the turn itself (``messages``, ``stream``,
            ``tools``, Anthropic's ``system``) are a ``RequestError`` naming what to use
            instead.
    """

    temperature: float | None = attrs.field(default=None, validator=_check_temperature)
    max_tokens: int | None = attrs.field(default=None, validator=_check_max_tokens)
    tool_choice: str | None = attrs.field(default=None, validator=_check_tool_choice)
    active_tools: tuple[str, ...] | None = attrs.field(default=None, converter=_names)
    extra: Mapping[str, Any] = attrs.field(default=_NO_VALUES, validator=_check_mapping)


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
