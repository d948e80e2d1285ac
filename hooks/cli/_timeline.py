"""How the commands show messages, parts and outcomes in a line (the timeline of a turn's
events itself is `pipeline.events.timeline`)."""

from collections.abc import Mapping
from typing import Any

import attrs

from turns import Message, Text, ToolCall, ToolResult
from turns.serde import to_dict


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def rejected_by(count: int) -> str:
    """The start of "no acceptable reply: ... 'hook': feedback" after `count` rejections,
    which names the hook that rejected the last attempt."""
    if count > 1:
        return f"{count} attempts rejected, the last by"
    # Not "1 attempts": a turn with `max_regenerations=0` has one attempt.
    return "its one attempt was rejected by"


def part_text(part: object) -> str:
    if isinstance(part, ToolCall):
        return f"[tool call] {part.name}({dict(part.arguments)})"
    if isinstance(part, ToolResult):
        return f"[tool result] {part.content}"
    return part.text if isinstance(part, Text) else repr(part)


def message_lines(message: Message, indent: str = "  ") -> list[str]:
    lines = []
    for index, part in enumerate(message.parts):
        role = message.role if index == 0 else ""
        source = part.meta.get("injected_by") if hasattr(part, "meta") else None
        origin = f"  (from {source})" if source else ""
        lines.append(f"{indent}{role:<9} {clip(part_text(part), 88)}{origin}")
    return lines


def plain(value: Any) -> Any:
    """`value` as plain JSON data: records through `turns.serde`, tuples as lists."""
    if attrs.has(type(value)):
        return to_dict(value)
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    return value
