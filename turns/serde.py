"""Serialization of `turns` records: dictionaries and JSON.

One private `cattrs.Converter` with ``forbid_extra_keys=True``; parts are a tagged union on
``"type"`` (``"text"``, ``"tool_call"``, ``"tool_result"``). Every record round-trips exactly,
provided its opaque values (`meta`, `arguments`, `assigns`, ...) are JSON values.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.gen import make_dict_structure_fn
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
    # cattrs reads a record from anything with keys, and reports other data as an
    # AttributeError (``'list' object has no attribute 'keys'``) or worse: say what it got.
    converter.register_structure_hook_factory(
        attrs.has, lambda cls: _strict_object(cls, make_dict_structure_fn(cls, converter))
    )
    # Sequences unstructure to lists so that `to_dict` output is JSON-shaped; they are
    # structured back into the tuples the records hold.
    converter.register_unstructure_hook(
        tuple, lambda value: [converter.unstructure(item) for item in value]
    )
    # cattrs' own scalar hooks call the type on the value (``bool("false")`` is True,
    # ``str(3)`` is "3"): a value of the wrong type is refused instead, naming its path.
    for kind, accepted in _SCALARS.items():
        converter.register_structure_hook(kind, _strict_scalar(kind, accepted))
    converter.register_structure_hook_factory(
        _is_homogeneous_tuple, lambda cls: _strict_sequence(cls, converter)
    )
    configure_tagged_union(Part, converter, tag_generator=_TAGS.__getitem__, tag_name="type")
    tagged = converter.get_structure_hook(Part)

    def structure_part(value: Any, cls: Any) -> Any:
        # cattrs reports an unknown or missing tag as a bare KeyError ("required field
        # missing"), and data that is no object as an AttributeError; say what was wrong
        # and which tags exist instead.
        if not isinstance(value, dict):
            raise _Refused(f'a part must be an object with a "type" tag, got {_shown(value)}')
        if value.get("type") not in _KNOWN_TAGS:
            found = repr(value["type"]) if "type" in value else "none"
            raise _Refused(f"unknown part type {found}, expected one of {sorted(_KNOWN_TAGS)}")
        return tagged(value, cls)

    converter.register_structure_hook(Part, structure_part)
    return converter


_PLAIN: frozenset[type] = frozenset((str, int, float, bool, type(None)))
# The values each scalar field accepts: whatever a record of that type may have been written
# with (the records do not check their scalar fields, and logs written earlier must stay
# readable), never a value of another kind that a conversion would turn into a wrong one
# ("false" read as True, "12" as 12, 1 as "1").
_SCALARS: dict[type, tuple[type, ...]] = {
    str: (str,),
    bool: (bool, int),
    int: (int, float),
    float: (float, int),
}


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _strict_scalar(kind: type, accepted: tuple[type, ...]) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _cls: Any) -> Any:
        # isinstance: a str subclass (a StrEnum) is a str, and a bool is an int; but a bool
        # is no number of a record (a count, a temperature), and an int as a bool is 0 or 1.
        if (
            not isinstance(value, accepted)
            or (kind is not bool and type(value) is bool)
            or (kind is bool and type(value) is int and value not in (0, 1))
        ):
            raise _Refused(f"expected {kind.__name__}, got {_shown(value)}")
        # Converted only when nothing is lost (12.0 tokens read as 12, 0 as False): a
        # fractional count a record was written with is given back as it was, not cut.
        converted = kind(value)
        return converted if converted == value else value

    return structure


def _strict_object(cls: Any, fields: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def structure(value: Any, target: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Refused(
                f"expected an object with the fields of a {cls.__name__}, got {_shown(value)}"
            )
        return fields(value, target)

    return structure


def _is_homogeneous_tuple(cls: Any) -> bool:
    args = get_args(cls)
    return get_origin(cls) is tuple and len(args) == 2 and args[1] is Ellipsis


def _strict_sequence(cls: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    # cattrs would iterate any iterable: a string would become a tuple of its characters.
    items = homogenous_tuple_structure_factory(cls, converter)

    def structure(value: Any, target: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise _Refused(f"expected a list, got {_shown(value)}")
        return items(value, target)

    return structure


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


class _Refused(ValueError):
    pass


_TOO_DEEP = (
    "a value in it is nested too deeply (lists and objects inside each other), or holds itself"
)


def _name(cls: Any) -> str:
    # `Part` is a union, which has no __name__.
    return getattr(cls, "__name__", None) or ("Part" if cls == Part else repr(cls))


def _describe(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _Refused):
        return str(exc)
    if type_ is None and type(exc) in (ValueError, TypeError) and str(exc):
        # Raised by a record's own checks as it is built (``RequestOptions.temperature must
        # be between 0 and 2, got 5.0``): cattrs would say only "invalid value".
        return str(exc)
    return format_exception(exc, type_)


def to_dict(obj: Any) -> Any:
    """Unstructure a record into plain dicts, lists and scalars.

    A part carries its ``"type"`` tag even on its own, so `from_dict(Part, ...)` can read it.

    Raises:
        ValueError: An opaque value is nested too deeply to be written.
    """
    try:
        if type(obj) in _TAGS:
            return _converter.unstructure(obj, Part)
        return _converter.unstructure(obj)
    except TypeError as exc:
        # A key that unstructures to a list (a tuple key) makes a dict that cannot be built:
        # Python says only "unhashable type: 'list'". Looked for only then.
        found = _odd_key(obj, _name(type(obj)))
        if found is None:
            raise
        path, key = found
        raise TypeError(
            f"cannot write a {_name(type(obj))}: {path} holds the key {_shown(key)}, and JSON"
            " keys are strings — use string keys"
        ) from exc
    except RecursionError:
        # Not a bug of the caller's program but of its data (a model's tool-call arguments
        # nested hundreds of levels deep): a ValueError naming the record, as for other data
        # that cannot be written, rather than a RecursionError out of cattrs.
        raise ValueError(
            f"cannot write a {_name(type(obj))}: {_TOO_DEEP} — flatten it, or encode it as"
            " JSON text"
        ) from None


def from_dict(cls: type[T], data: Any) -> T:
    """Structure `data` into `cls`.

    Raises:
        ValueError: `data` does not describe a `cls` (unknown keys, missing keys, wrong
            types); the message lists every problem with its path.
    """
    target: Any = cls
    name = _name(cls)
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
            problems = "; ".join(cattrs.transform_error(exc, path=name, format_exception=_describe))
        else:
            problems = f"{name}: {exc}"
        raise ValueError(f"cannot read a {name} from this data: {problems}") from exc


def to_json(obj: Any) -> str:
    """Serialize a record to a JSON string.

    Raises:
        TypeError, ValueError: An opaque value (`meta`, `arguments`, ...) JSON cannot hold
            (a date, a set, bytes, NaN, a key that is not a string, an int of more digits
            than Python writes as text); the message names its path.
    """
    data = to_dict(obj)
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        found = _not_json(data, _name(type(obj)))
        if found is None:  # a key JSON cannot hold (a tuple): its own message says which
            raise
        raise (TypeError if found[2] == "key" else type(exc))(_unwritable(obj, *found)) from exc
    # json writes the keys 1, 1.5, True and None as "1", "1.5", "true" and "null": the
    # record would read back as another one (two keys could even become one). Looked for in
    # one flat pass; the path is named only when a key that is not a str turns up.
    if not _str_keys(data):
        found = _not_json(data, _name(type(obj)))
        if found is not None:
            raise TypeError(_unwritable(obj, *found))
    return text


def _unwritable(obj: Any, path: str, value: Any, kind: str) -> str:
    """`to_json`'s message for `value`, at `path`, which JSON cannot hold."""
    name = _name(type(obj))
    if kind == "key":
        return (
            f"cannot write a {name} as JSON: {path} holds the key {_shown(value)}, and JSON"
            " keys are strings, so it would read back as another value — use string keys"
        )
    if kind == "int":
        return (
            f"cannot write a {name} as JSON: {path} holds an int of more than"
            f" {sys.get_int_max_str_digits()} digits, more than Python writes as text (see"
            " sys.set_int_max_str_digits) — write it as a string"
        )
    return (
        f"cannot write a {name} as JSON: {path} holds {_shown(value)}, which"
        " JSON cannot hold — convert it first (a date to its ISO text, a set to a sorted"
        " list; no NaN or infinity)"
    )


def _str_keys(data: Any) -> bool:
    """Whether every key of every mapping in `data` (what `to_dict` made) is a plain str."""
    pending = [data]
    pop, extend = pending.pop, pending.extend
    while pending:
        item = pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            extend(item.values())
        elif kind is list:
            extend(item)
    return True


def _odd_key(value: Any, path: str) -> tuple[str, Any] | None:
    """The path and key of the first mapping key in the record `value` that is no JSON
    scalar (a tuple, a frozenset, a record), or None."""
    if attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            found = _odd_key(getattr(value, field.name), f"{path}.{field.name}")
            if found is not None:
                return found
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key is not None and not isinstance(key, str | int | float):
                return path, key
            inner = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else None
            found = _odd_key(item, inner or f"{path}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _odd_key(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _not_json(value: Any, path: str) -> tuple[str, Any, str] | None:
    """The path, value and kind (``"key"``, ``"int"`` or ``"value"``) of the first thing in
    `value` that JSON cannot hold, or None."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, key, "key"
            inner = f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]"
            found = _not_json(item, inner)
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _not_json(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value, "value")
    if isinstance(value, int) and value.bit_length() > _SHORT_INT_BITS:
        try:
            int.__repr__(value)
        except ValueError:  # more digits than sys.get_int_max_str_digits()
            return path, value, "int"
        return None
    if value is None or isinstance(value, str | int):
        return None
    return path, value, "value"


# No int of this many bits has more digits than the least limit Python allows (640).
_SHORT_INT_BITS = 2000


def from_json(cls: type[T], text: str | bytes) -> T:
    """Parse a JSON string produced by `to_json` back into `cls`.

    Raises:
        ValueError: `text` is not JSON (NaN and Infinity included; a number past a
            float's range too), is nested too deeply to be read, or does not
            describe a `cls` (see `from_dict`).
    """
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"cannot read a {_name(cls)} from this data: {_TOO_DEEP}") from None
    except _Refused as exc:
        raise ValueError(f"cannot read a {_name(cls)} from this data: {exc}") from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):  # not JSON: json's error says where
            raise
        # An int of more digits than Python reads (sys.set_int_max_str_digits), or bytes
        # that are not UTF-8: json's message names neither the record nor the cause.
        raise ValueError(f"cannot read a {_name(cls)} from this data: {exc}") from exc
    return from_dict(cls, data)


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which are not JSON and which `to_json` refuses
    # to write: a record read with one could not be written back.
    raise _Refused(f"{name} is not a JSON value (to_json never writes it)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON that a float cannot hold
        raise _Refused(f"the number {text} is out of a float's range")
    return value
