"""Messages: a role and a tuple of parts."""

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Self, TypeAlias, final

import attrs

from ._parts import EMPTY, Part, Text, ToolCall, ToolResult, meta_problem, part_problem

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))

_NO_META = EMPTY
_PART_TYPES = (Text, ToolCall, ToolResult)


def _check_role(_instance: object, _attribute: object, role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"message role must be one of {sorted(ROLES)}, got {role!r}")


def _check_meta(_instance: object, _attribute: object, meta: object) -> None:
    if meta is not _NO_META:
        problem = meta_problem("Message", meta)
        if problem is not None:
            raise TypeError(problem)


def _as_parts(content: str | Part | Iterable[Part]) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (Text(content),)
    if isinstance(content, _PART_TYPES):
        return (content,)
    if not isinstance(content, Iterable):
        raise TypeError(
            f"a message's content is text, a part or parts, got {type(content).__name__}"
            f" {content!r:.60} — pass a str, or Text, ToolCall and ToolResult parts"
        )
    return tuple(content)  # checked by the converter of `Message.parts`


def _parts(parts: Iterable[Part]) -> tuple[Part, ...]:
    given: object = parts  # callers without a type checker pass anything
    if isinstance(given, str):
        raise TypeError(
            f"Message parts must be parts, not a str ({given!r:.60}) — use"
            ' Message.user("..."), or Message(role, (Text("..."),))'
        )
    if not isinstance(parts, Iterable):
        raise TypeError(
            f"Message parts must be an iterable of parts, got {type(parts).__name__} {parts!r:.60}"
        )
    parts = tuple(parts)
    for part in parts:
        # A lone well-formed Text without meta, the commonest, costs three checks.
        if type(part) is not Text or type(part.text) is not str or part.meta is not EMPTY:
            problem = part_problem(part)
            if problem is not None:
                raise TypeError(problem)
    return parts


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
    meta: Mapping[str, Any] = attrs.field(default=_NO_META, validator=_check_meta)

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
        given: object = result  # callers without a type checker pass anything
        if type(given) is not ToolResult:
            raise TypeError(
                f"Message.tool takes one ToolResult, got {type(given).__name__} {given!r:.60}"
                " — build it as Message.tool(ToolResult(call_id, content)); text goes in"
                " Message.user or Message.assistant"
            )
        return cls("tool", (result,), meta)

    @property
    def text(self) -> str:
        """The text parts joined, without separators; other parts are left out."""
        return "".join([part.text for part in self.parts if type(part) is Text])
