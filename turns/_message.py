"""Messages: a role and a tuple of parts."""

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Self, TypeAlias, final

import attrs

from ._parts import EMPTY, Part, Text, ToolCall, ToolResult

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))

_NO_META = EMPTY
_PART_TYPES = (Text, ToolCall, ToolResult)


def _check_role(_instance: object, _attribute: object, role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"message role must be one of {sorted(ROLES)}, got {role!r}")


def _as_parts(content: str | Part | Iterable[Part]) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (Text(content),)
    if isinstance(content, _PART_TYPES):
        return (content,)
    parts = tuple(content)
    for part in parts:
        if not isinstance(part, _PART_TYPES):
            raise TypeError(
                f"a message part must be Text, ToolCall or ToolResult, got {type(part).__name__}"
                " — wrap plain strings in Text(...)"
            )
    return parts


def _parts(parts: Iterable[Part]) -> tuple[Part, ...]:
    return tuple(parts)


@final
@attrs.frozen
class Message:
    """One message of a conversation.

    Build messages with the named constructors (`Message.user`, `Message.assistant`,
    `Message.system`, `Message.tool`); they accept a string where text is meant.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        parts: The content, in order.
        meta: Opaque data carried along (provenance, provider data to echo back).
    """

    role: Role = attrs.field(validator=_check_role)
    parts: tuple[Part, ...] = attrs.field(default=(), converter=_parts)
    meta: Mapping[str, Any] = _NO_META

    @classmethod
    def user(
        cls, content: str | Part | Iterable[Part], *, meta: Mapping[str, Any] = _NO_META
    ) -> Self:
        """A user message from text or parts."""
        return cls("user", _as_parts(content), meta)

    @classmethod
    def assistant(
        cls, content: str | Part | Iterable[Part], *, meta: Mapping[str, Any] = _NO_META
    ) -> Self:
        """An assistant message from text or parts (text and tool calls)."""
        return cls("assistant", _as_parts(content), meta)

    @classmethod
    def system(cls, text: str, *, meta: Mapping[str, Any] = _NO_META) -> Self:
        """A system message."""
        return cls("system", (Text(text),), meta)

    @classmethod
    def tool(cls, result: ToolResult, *, meta: Mapping[str, Any] = _NO_META) -> Self:
        """A tool message carrying one result."""
        return cls("tool", (result,), meta)

    @property
    def text(self) -> str:
        """The text parts joined, without separators; other parts are left out."""
        return "".join([part.text for part in self.parts if type(part) is Text])
