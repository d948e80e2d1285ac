"""Serialization of `turns` records: dictionaries and JSON.

One private `cattrs.Converter` with ``forbid_extra_keys=True``; parts are a tagged union on
``"type"`` (``"text"``, ``"tool_call"``, ``"tool_result"``). Every record round-trips exactly,
provided its opaque values (`meta`, `arguments`, `assigns`, ...) are JSON values.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import cattrs
from cattrs.strategies import configure_tagged_union
from cattrs.v import format_exception

from ._message import Message
from ._parts import Part, Text, ToolCall, ToolResult

__all__ = ["from_dict", "from_json", "to_dict", "to_json"]

T = TypeVar("T")

_TAGS: dict[type, str] = {Text: "text", ToolCall: "tool_call", ToolResult: "tool_result"}
_KNOWN_TAGS = frozenset(_TAGS.values())


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    # Sequences unstructure to lists so that `to_dict` output is JSON-shaped; they are
    # structured back into the tuples the records hold.
    converter.register_unstructure_hook(
        tuple, lambda value: [converter.unstructure(item) for item in value]
    )
    configure_tagged_union(Part, converter, tag_generator=_TAGS.__getitem__, tag_name="type")
    tagged = converter.get_structure_hook(Part)

    def structure_part(value: Any, cls: Any) -> Any:
        # cattrs reports an unknown tag as a bare KeyError ("required field missing"); say
        # which tag was wrong and which ones exist instead.
        if isinstance(value, dict) and "type" in value and value["type"] not in _KNOWN_TAGS:
            raise _UnknownTag(
                f"unknown part type {value['type']!r}, expected one of {sorted(_KNOWN_TAGS)}"
            )
        return tagged(value, cls)

    converter.register_structure_hook(Part, structure_part)
    return converter


_PLAIN: frozenset[type] = frozenset((str, int, float, bool, type(None)))


def _with_direct_hooks(converter: cattrs.Converter) -> cattrs.Converter:
    """`converter` with hand-written unstructure hooks for messages and parts.

    Every commit writes its messages and the audit record's parts: cattrs' generated hooks
    dispatch each field, each opaque value and each part through the converter, about three
    times the cost of building the same dicts directly. These build exactly what the
    generated hooks build (same keys, same order, the tag last; opaque values that are not
    plain scalars still go through the converter), which a property test checks against
    the generated converter.
    """
    unstructure = converter.unstructure
    plain = _PLAIN

    def opaque(mapping: Any) -> dict[Any, Any]:
        if not mapping:
            return {}
        return {
            key if type(key) in plain else unstructure(key): (
                value if type(value) in plain else unstructure(value)
            )
            for key, value in mapping.items()
        }

    def text(part: Text) -> dict[str, Any]:
        return {"text": part.text, "meta": opaque(part.meta), "type": "text"}

    def tool_call(part: ToolCall) -> dict[str, Any]:
        return {
            "id": part.id,
            "name": part.name,
            "arguments": opaque(part.arguments),
            "meta": opaque(part.meta),
            "type": "tool_call",
        }

    def tool_result(part: ToolResult) -> dict[str, Any]:
        return {
            "call_id": part.call_id,
            "content": part.content,
            "is_error": part.is_error,
            "error_class": part.error_class,
            "meta": opaque(part.meta),
            "type": "tool_result",
        }

    by_type: dict[type, Any] = {Text: text, ToolCall: tool_call, ToolResult: tool_result}
    generated = converter.get_unstructure_hook(Part)

    def part(value: Part) -> Any:
        direct = by_type.get(type(value))
        return direct(value) if direct is not None else generated(value)

    def message(value: Message) -> dict[str, Any]:
        return {
            "role": value.role,
            "parts": [part(item) for item in value.parts],
            "meta": opaque(value.meta),
        }

    converter.register_unstructure_hook(Part, part)
    converter.register_unstructure_hook(Message, message)
    return converter


_converter = _with_direct_hooks(_make_converter())


class _UnknownTag(ValueError):
    pass


def _describe(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _UnknownTag):
        return str(exc)
    return format_exception(exc, type_)


def to_dict(obj: Any) -> Any:
    """Unstructure a record into plain dicts, lists and scalars.

    A part carries its ``"type"`` tag even on its own, so `from_dict(Part, ...)` can read it.
    """
    if type(obj) in _TAGS:
        return _converter.unstructure(obj, Part)
    return _converter.unstructure(obj)


def from_dict(cls: type[T], data: Any) -> T:
    """Structure `data` into `cls`.

    Raises:
        ValueError: `data` does not describe a `cls` (unknown keys, missing keys, wrong
            types); the message lists every problem with its path.
    """
    target: Any = cls
    if cls in _TAGS and isinstance(data, dict) and "type" in data:
        # A tagged part read as its own class: read it as a part, then check the class.
        if data["type"] != _TAGS[cls]:
            raise ValueError(
                f"cannot read a {cls.__name__} from this data: its type tag is"
                f" {data['type']!r}, expected {_TAGS[cls]!r}"
            )
        target = Part
    try:
        return _converter.structure(data, target)  # type: ignore[no-any-return]
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            problems = "; ".join(
                cattrs.transform_error(exc, path=cls.__name__, format_exception=_describe)
            )
        else:
            problems = f"{cls.__name__}: {exc}"
        raise ValueError(f"cannot read a {cls.__name__} from this data: {problems}") from exc


def to_json(obj: Any) -> str:
    """Serialize a record to a JSON string."""
    return json.dumps(to_dict(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def from_json(cls: type[T], text: str | bytes) -> T:
    """Parse a JSON string produced by `to_json` back into `cls`."""
    return from_dict(cls, json.loads(text))
