"""The JSON Schema of the config format, written from the entry records themselves.

The loader (`hooks.config`) and this schema read the same attrs fields and the same value
types (`hooks.config._types`), so the schema cannot drift from what loading accepts. Only
what needs the file to be loaded — that a reference imports and has the right signature,
that a regex compiles, that an API key is set — is left to the loader.
"""

import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args, get_origin

import attrs

from .._pii import KINDS as PII_KINDS
from ._types import (
    WHOLE_MOST,
    Arguments,
    Count,
    Hours,
    Minutes,
    PiiKind,
    Positive,
    Ref,
    ScriptReply,
    Seconds,
    StrMap,
    Temperature,
    Text,
    ToolMatch,
    ToolName,
    UnitTemperature,
)

DRAFT = "https://json-schema.org/draft/2020-12/schema"

_VALUES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    bool: {"type": "boolean"},
    Text: {"type": "string", "pattern": r"\S"},
    Count: {"type": "integer", "minimum": 0, "maximum": WHOLE_MOST},
    Positive: {"type": "integer", "minimum": 1, "maximum": WHOLE_MOST},
    Seconds: {"type": "number", "exclusiveMinimum": 0},
    Minutes: {"type": "number", "exclusiveMinimum": 0},
    Hours: {"type": "number", "exclusiveMinimum": 0},
    Temperature: {"type": "number", "minimum": 0, "maximum": 2},
    UnitTemperature: {"type": "number", "minimum": 0, "maximum": 1},
    ScriptReply: {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
        ]
    },
    re.Pattern: {"type": "string", "format": "regex"},
    ToolName: {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
    PiiKind: {"enum": list(PII_KINDS)},
    Arguments: {"type": "object"},
    StrMap: {"type": "object", "additionalProperties": {"type": "string"}},
    ToolMatch: {
        "oneOf": [
            {"type": "string", "pattern": r"\S"},
            {
                "type": "object",
                "properties": {"regex": {"type": "string", "format": "regex"}},
                "required": ["regex"],
                "additionalProperties": False,
            },
        ]
    },
}

_REF = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


def schema_of(root: type, unions: Iterable[tuple[Any, str]]) -> dict[str, Any]:
    """The schema of `root` (an attrs class); `unions` are the tagged unions and their tag."""
    writer = _Writer({member: tag for union, tag in unions for member in _members(union)})
    body = writer.table(root)
    return {
        "$schema": DRAFT,
        "title": "turnplug pipeline config",
        **body,
        "$defs": dict(sorted(writer.defs.items())),
    }


def _members(union: Any) -> tuple[Any, ...]:
    return get_args(union) or (union,)


class _Writer:
    def __init__(self, tags: dict[Any, str]) -> None:
        self.tags = tags
        self.defs: dict[str, dict[str, Any]] = {}

    def value(self, kind: Any) -> dict[str, Any]:
        origin = get_origin(kind)
        if kind in _VALUES:
            return dict(_VALUES[kind])
        if origin in _VALUES:
            return dict(_VALUES[origin])
        if isinstance(kind, type) and issubclass(kind, Ref):
            ref = {"type": "string", "pattern": _REF}
            if not kind.CATALOGUE:
                return ref | {"description": f"'module:attribute' of {kind.SHAPE}"}
            names = sorted(kind.CATALOGUE)
            return {
                "anyOf": [{"enum": names}, ref],
                "description": f"one of {', '.join(names)} (the catalogue's), or"
                f" 'module:attribute' of {kind.SHAPE}",
            }
        if origin is Literal:
            return {"enum": list(get_args(kind))}
        if origin is tuple:
            return {"type": "array", "items": self.value(get_args(kind)[0])}
        if origin in (typing.Union, types.UnionType):
            options = [self.value(arg) for arg in get_args(kind) if arg is not type(None)]
            if type(None) in get_args(kind):
                options.append({"type": "null"})
            return options[0] if len(options) == 1 else {"oneOf": options}
        if attrs.has(kind):
            return self.reference(kind)
        raise TypeError(f"no JSON Schema for {kind!r}")  # a new value type needs an entry

    def reference(self, cls: type) -> dict[str, Any]:
        if cls.__name__ not in self.defs:
            self.defs[cls.__name__] = {}  # reserve: tables may nest
            self.defs[cls.__name__] = self.table(cls)
        return {"$ref": f"#/$defs/{cls.__name__}"}

    def table(self, cls: type) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        tag = self.tags.get(cls)
        if tag is not None:
            properties[tag] = {"const": getattr(cls, tag.upper())}
            required.append(tag)
        hints = typing.get_type_hints(cls)
        fixed: Mapping[str, Any] = getattr(cls, "FIXED", {})
        for field in attrs.fields(cls):
            key = field.metadata.get("key", field.name)
            schema = self.value(hints[field.name])
            if key in fixed:  # null stands for the key left out
                schema = {"enum": [fixed[key], None]}
            if "doc" in field.metadata:
                schema["description"] = field.metadata["doc"]
            if "min_items" in field.metadata:
                schema["minItems"] = field.metadata["min_items"]
            if field.default is attrs.NOTHING:
                required.append(key)
            elif field.default is not None:
                schema["default"] = (
                    list(field.default) if isinstance(field.default, tuple) else field.default
                )
            properties[key] = schema
        description = (cls.__doc__ or "").strip().split("\n")[0]
        table: dict[str, Any] = {"type": "object", "description": description}
        table["properties"] = properties
        if required:
            table["required"] = required
        table["additionalProperties"] = False
        alternatives: tuple[str, ...] = getattr(cls, "ONE_OF", ())
        if alternatives:
            table["oneOf"] = [_given(key) for key in alternatives]
        needs: dict[str, tuple[str, ...]] = getattr(cls, "REQUIRES", {})
        if needs:
            table["allOf"] = [
                {"if": _given(key), "then": {"allOf": [_given(other) for other in keys]}}
                for key, keys in needs.items()
            ]
        return table


def _given(key: str) -> dict[str, Any]:
    """The key is given: present and not null (null stands for a key left out, as the
    loader reads it)."""
    return {"required": [key], "properties": {key: {"not": {"type": "null"}}}}
