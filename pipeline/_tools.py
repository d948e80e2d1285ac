"""Tools: typed functions the model may call.

`tool(fn)` reads the function's signature once, when the tool is built: each parameter's
annotation becomes a *shape* that gives its JSON Schema and checks (and converts) what the
model sends. An annotation the model could not be told about is a `ConfigError` then, never a
surprise mid-turn. The model's arguments are checked against the same shapes before the call,
so a tool only ever sees arguments of the types it declared.
"""

import collections.abc
import contextvars
import dataclasses
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, final, overload

import anyio
import anyio.lowlevel
import attrs

from turns import Scope, ToolCall, ToolResult, ToolSpec

from ._describe import as_raised, describe, exc_text
from ._errors import ConfigError
from ._hooks import callable_name, is_async_callable
from ._loop import spurious_cancellation

INVALID_ARGUMENTS = "invalid_arguments"
"""`ToolResult.error_class` of a call whose arguments do not fit the tool's schema; also the
`ToolCall.meta` key a provider sets when the model's arguments are not a JSON object
(``{"raw": the text the model sent, "error": why it does not decode}``)."""
TOOL_ERROR = "tool_error"
"""`ToolResult.error_class` of a tool that raised."""
UNKNOWN_TOOL = "unknown_tool"
"""`ToolResult.error_class` of a call naming a tool that is not active."""
HOOK_BLOCKED = "hook_blocked"
"""`ToolResult.error_class` of a call a before-tool hook blocked (or a permission denied)."""
CANCELLED = "cancelled"
"""`ToolResult.error_class` of a call cancelled while it ran (after-tool hooks still see it)."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

CURRENT_TOOLS: contextvars.ContextVar[Mapping[str, "Tool"]] = contextvars.ContextVar(
    "turnplug_current_tools", default=types.MappingProxyType({})
)


def current_tools() -> Mapping[str, "Tool"]:
    """The tools of the pipeline running the current turn, by name; empty outside a turn.

    For hooks that run one of the pipeline's tools themselves (a synthetic tool call). A hook
    that needs tools by name declares them in a ``needs_tools`` attribute of its function, so
    that a pipeline without them is a `ConfigError` when it is built, not a failure mid-turn.
    """
    return CURRENT_TOOLS.get()


_MAX_PROBLEMS = 20
"""How many problems an ``invalid_arguments`` result lists, those inside a union's options
included; the rest are counted. A model that sends a huge array of wrong items gets a short
answer, not one larger than what it sent."""


class _Problems:
    """What is wrong with a model's arguments, each with its path.

    `budget` is how many problems it lists: a union of several objects tries the value as each
    and lists each option's problems inside its own, so each option gets a share of what is
    left, and nested unions cannot multiply the cap (20 per option at each level would).
    """

    __slots__ = ("budget", "found", "items", "listed")

    def __init__(self, budget: int = _MAX_PROBLEMS) -> None:
        self.items: list[str] = []
        self.found = 0
        """How many problems there are, listed or not."""
        self.budget = budget
        self.listed = 0
        """How many problems `items` lists, counting those inside a union's problem."""

    def add(self, path: str, message: str, listed: int = 1) -> None:
        self.found += 1
        if self.listed < self.budget:
            self.items.append(f"{path}: {message}" if path else message)
            self.listed += listed

    def __str__(self) -> str:
        more = self.found - len(self.items)
        if not self.items:
            return f"{more} problem{'s' if more > 1 else ''} not listed"
        listed = "; ".join(self.items)
        return f"{listed}; and {more} more" if more else listed


_INVALID = object()


class _Shape:
    """One annotation: its JSON Schema and how a JSON value is checked against it."""

    schema: dict[str, Any]

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        raise NotImplementedError


class _Any(_Shape):
    def __init__(self) -> None:
        self.schema = {}

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        return value


class _Primitive(_Shape):
    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.schema = {"type": _JSON_TYPES[kind]}

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        kind = self.kind
        # JSON has no separate bool: True is not an integer here, 3.0 is one.
        if type(value) is kind:
            return value
        if kind is float and type(value) is int:
            try:
                return float(value)
            except OverflowError:
                problems.add(path, f"expected number, got {_json_describe(value)}: too large")
                return _INVALID
        if kind is int and type(value) is float and value.is_integer():
            return int(value)
        problems.add(path, f"expected {self.schema['type']}, got {_json_describe(value)}")
        return _INVALID


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


class _Literal(_Shape):
    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values
        self.schema = {"enum": list(values)}
        kinds = {_JSON_TYPES.get(type(v)) for v in values}
        if len(kinds) == 1 and None not in kinds:
            self.schema = {"type": kinds.pop(), "enum": list(values)}

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        # As for int and float: JSON has one number type (1.0 is 1), and no bool among them.
        numbers = (int, float)
        for allowed in self.values:
            if value == allowed and (
                type(value) is type(allowed)
                or (type(value) in numbers and type(allowed) in numbers)
            ):
                return allowed
        problems.add(path, f"expected one of {list(self.values)!r}, got {_json_describe(value)}")
        return _INVALID


class _List(_Shape):
    """A JSON array, given to the tool as a list, or as a tuple (``tuple[X, ...]``)."""

    def __init__(self, item: _Shape, into: type = list) -> None:
        self.item = item
        self.into = into
        self.schema = {"type": "array", "items": item.schema}

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        if type(value) is not list:
            problems.add(path, f"expected array, got {_json_describe(value)}")
            return _INVALID
        items = [self.item.convert(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        return items if self.into is list else self.into(items)


class _Dict(_Shape):
    def __init__(self, value: _Shape) -> None:
        self.value = value
        self.schema = {"type": "object", "additionalProperties": value.schema}

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        if type(value) is not dict:
            problems.add(path, f"expected object, got {_json_describe(value)}")
            return _INVALID
        return {k: self.value.convert(v, _join_sent(path, k), problems) for k, v in value.items()}


class _Union(_Shape):
    def __init__(self, options: tuple[_Shape, ...], nullable: bool) -> None:
        self.options = options
        self.nullable = nullable
        schemas = [option.schema for option in options]
        if nullable:
            schemas.append({"type": "null"})
        self.schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        self.kinds = tuple(_container_type(option) for option in options)
        """Each option's JSON Schema type when it is an object or an array, else None."""

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        if value is None and self.nullable:
            return None
        if len(self.options) == 1 and not self.nullable:
            return self.options[0].convert(value, path, problems)
        kind = _container(value)
        budgets = self.budgets(kind, problems)
        trials: list[_Problems] = []
        for i, option in enumerate(self.options):
            trial = _Problems(budgets[i] if budgets else 0)
            converted = option.convert(value, path, trial)
            if not trial.found:
                return converted
            trials.append(trial)
        fitting = [
            (option, trial)
            for option, option_kind, trial in zip(self.options, self.kinds, trials, strict=True)
            if kind is not None and option_kind == kind
        ]
        if len(fitting) == 1:
            # The one object (or array) the value can be: what is wrong inside it
            # (`point.x`) says more than "expected object or null, got object".
            return fitting[0][0].convert(value, path, problems)
        if fitting:
            # Several objects (or arrays) it could be (`Circle | Square`): what is wrong for
            # each, since "expected object or object, got object" tells the model nothing;
            # bracketed, so that a union inside one of them reads unambiguously.
            tried = "; ".join(f"as {kind} {i} ({t})" for i, (_, t) in enumerate(fitting, 1))
            problems.add(
                path,
                f"fits none of the {len(fitting)} {kind}s it may be — {tried}",
                sum(t.listed for _, t in fitting),
            )
            return _INVALID
        names = [_schema_name(s) for s in self.schema.get("anyOf", [self.schema])]
        expected = " or ".join(dict.fromkeys(names))
        problems.add(path, f"expected {expected}, got {_json_describe(value)}")
        return _INVALID

    def budgets(self, kind: str | None, problems: _Problems) -> list[int] | None:
        """How many problems each option's trial lists: for a value (of container `kind`)
        several options may be (an object of `Circle | Square`), each of those a share of
        what is left of the answer's budget, since what is wrong for each is listed
        (`convert`); None when every trial only tells whether the value fits, listing
        nothing."""
        fit = self.kinds.count(kind) if kind is not None else 0
        if fit < 2:
            return None
        share, extra = divmod(problems.budget - problems.listed, fit)
        budgets = []
        for option_kind in self.kinds:
            fits = option_kind == kind
            budgets.append(share + (extra > 0) if fits else 0)
            extra -= fits
        return budgets


class _Checked(_Shape):
    """Arguments described by a JSON Schema the tool brought (an MCP server's tool), checked
    by a function that lists what is wrong with a value."""

    def __init__(self, schema: Mapping[str, Any], problems_of: Callable[[Any], list[str]]) -> None:
        self.schema = dict(schema)
        self.problems_of = problems_of

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        for problem in self.problems_of(value):
            problems.add(path, problem)
        return value


class ToolFailure(Exception):
    """Raised by a tool's function to fail the call with exactly this message (a server's
    own error, a timeout): the result is a ``tool_error`` without the exception's type."""


class _Object(_Shape):
    """A set of named fields: a tool's parameters, or an attrs class."""

    def __init__(
        self,
        fields: dict[str, _Shape],
        required: tuple[str, ...],
        defaults: dict[str, Any],
        descriptions: Mapping[str, str],
        build: Callable[..., Any] | None = None,
    ) -> None:
        self.fields = fields
        self.required = required
        self.build = build
        properties: dict[str, Any] = {}
        for name, shape in fields.items():
            schema = dict(shape.schema)
            if name in descriptions:
                schema["description"] = descriptions[name]
            if name in defaults and _is_json(defaults[name]):
                # As JSON holds it (a tuple default is an array), so the schema round-trips.
                schema["default"] = json.loads(json.dumps(defaults[name]))
            properties[name] = schema
        self.schema = {
            "type": "object",
            "properties": properties,
            "required": list(required),
            "additionalProperties": False,
        }

    def convert(self, value: Any, path: str, problems: _Problems) -> Any:
        if type(value) is not dict:
            problems.add(path, f"expected object, got {_json_describe(value)}")
            return _INVALID
        converted: dict[str, Any] = {}
        for name in self.required:
            if name not in value:
                problems.add(_join(path, name), "required")
        for name, item in value.items():
            shape = self.fields.get(name)
            if shape is None:
                known = ", ".join(self.fields) or "none"
                problems.add(_join_sent(path, name), f"unexpected argument (expected: {known})")
                continue
            converted[name] = shape.convert(item, _join(path, name), problems)
        if problems.found or self.build is None:
            return converted
        try:
            return self.build(**converted)
        except Exception as exc:
            # The class's own validators (and __attrs_post_init__) have the last word on its
            # values, whatever they raise: it is the model's value they refuse, and a bare
            # exception here would fail the whole turn.
            name = getattr(self.build, "__name__", "the value")
            problems.add(path, f"{name} refused it: {exc_text(exc)}")
            return _INVALID


def _container_type(shape: _Shape) -> str | None:
    """`shape`'s JSON Schema type when it is an object or an array (see `_container`)."""
    kind = shape.schema.get("type")
    return kind if kind == "object" or kind == "array" else None


def _container(value: Any) -> str | None:
    """The JSON Schema type of `value` when it is an object or an array."""
    return "object" if type(value) is dict else "array" if type(value) is list else None


def _join(path: str, name: object) -> str:
    key = str(name)
    return f"{path}.{key}" if path else key


def _join_sent(path: str, key: object) -> str:
    """`_join` for a key the model chose (one the tool does not declare): shown as far as a
    value is (`_json_describe`), since a huge one is the model's; a declared name is whole."""
    text = str(key)
    return _join(path, text if len(text) <= 40 else text[:37] + "...")


def _schema_name(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return f"one of {schema['enum']!r}"
    return str(schema.get("type", "any value"))


def _json_describe(value: Any) -> str:
    kind = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)
    text = json.dumps(value) if _is_json(value) else repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


def _is_json(value: Any) -> bool:
    # Strict JSON: a default of math.inf written into a schema as ``Infinity`` would make
    # every request offering the tool a body no provider can parse.
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _shape(annotation: Any, where: str, within: tuple[type, ...] = ()) -> _Shape:
    """The shape of `annotation`, or a ConfigError naming `where`.

    `within` holds the attrs classes whose fields are being described, outermost first.
    """
    if annotation is Any:
        return _Any()
    if annotation in _JSON_TYPES:
        return _Primitive(annotation)
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is Literal:
        # None among the values (Literal["a", None]) is the optional Literal["a"] | None.
        values = tuple(v for v in arguments if v is not None)
        if not values or not all(type(v) in _JSON_TYPES for v in values):
            raise ConfigError(f"{where}: Literal values must be str, int, float, bool or None")
        literal = _Literal(values)
        return literal if len(values) == len(arguments) else _Union((literal,), nullable=True)
    if origin is list or annotation is list:
        return _List(_shape(arguments[0], where, within) if arguments else _Any())
    if origin is tuple or annotation is tuple:
        # tuple[X, ...]: any number of X, as the frozen records of this library hold them.
        if arguments and (len(arguments) != 2 or arguments[1] is not Ellipsis):
            raise ConfigError(
                f"{where}: cannot describe {annotation!r} to the model; a tuple argument is"
                " tuple[X, ...] (any number of X)"
            )
        return _List(_shape(arguments[0], where, within) if arguments else _Any(), into=tuple)
    if origin is collections.abc.Sequence or annotation is collections.abc.Sequence:
        return _List(_shape(arguments[0], where, within) if arguments else _Any(), into=tuple)
    if origin is dict or annotation is dict:
        if arguments and arguments[0] is not str:
            raise ConfigError(f"{where}: dict keys must be str (JSON object keys are strings)")
        return _Dict(_shape(arguments[1], where, within) if arguments else _Any())
    if origin is typing.Union or origin is types.UnionType:
        options = tuple(_shape(a, where, within) for a in arguments if a is not type(None))
        return _Union(options, nullable=len(options) < len(arguments))
    if isinstance(annotation, type) and attrs.has(annotation):
        return _attrs_shape(annotation, where, within)
    raise ConfigError(
        f"{where}: cannot describe {annotation!r} to the model; use str, int, float, bool,"
        " list[...], tuple[..., ...], dict[str, ...], Literal[...], an optional (X | None) or"
        " an attrs class"
    )


def _defaulted(shape: _Shape, default: Any) -> _Shape:
    """The shape of an argument with `default`: one whose default is None takes null too
    (``limit: int = None``), since its schema shows ``"default": null`` and a model told so
    may send it; the function gets what it gets when the argument is left out."""
    if default is not None:
        return shape
    trial = _Problems()
    shape.convert(None, "", trial)
    if not trial.found:
        return shape
    options = shape.options if isinstance(shape, _Union) else (shape,)
    return _Union(options, nullable=True)


def _attrs_shape(cls: type, where: str, within: tuple[type, ...]) -> _Object:
    if cls in within:
        # Described inline, a class that holds itself would never end.
        path = " -> ".join(c.__name__ for c in (*within[within.index(cls) :], cls))
        raise ConfigError(
            f"{where}: cannot describe the attrs class {cls.__name__} to the model: it holds"
            f" itself ({path}); give the tool a flat shape (e.g. a list of nodes with parent"
            " ids)"
        )
    try:
        hints = typing.get_type_hints(cls)
    except (TypeError, NameError) as exc:
        raise ConfigError(
            f"{where}: cannot read the annotations of the attrs class {cls.__name__}: {exc}"
        ) from exc
    fields: dict[str, _Shape] = {}
    required: list[str] = []
    defaults: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if not field.init:
            continue
        name = field.alias or field.name
        if field.name not in hints:
            raise ConfigError(f"{where}: field {cls.__name__}.{field.name} has no annotation")
        fields[name] = _defaulted(
            _shape(hints[field.name], f"{where} ({cls.__name__}.{field.name})", (*within, cls)),
            field.default,
        )
        if field.default is attrs.NOTHING:
            required.append(name)
        elif not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            defaults[name] = field.default
    return _Object(fields, tuple(required), defaults, {}, build=cls)


_SECTIONS = frozenset(
    (
        "args",
        "arguments",
        "attention",
        "attributes",
        "caution",
        "danger",
        "error",
        "example",
        "examples",
        "hint",
        "important",
        "keyword args",
        "keyword arguments",
        "methods",
        "note",
        "notes",
        "other parameters",
        "parameters",
        "raise",
        "raises",
        "references",
        "return",
        "returns",
        "see also",
        "tip",
        "todo",
        "warning",
        "warnings",
        "warns",
        "yield",
        "yields",
    )
)
"""The section headings of a Google-style docstring (Sphinx's napoleon reads these): a
description's own line ending in a colon ("Supported currencies:") is no section."""

_ARGS = ("Args", "Arguments", "Parameters")
"""The sections whose indented entries describe the arguments."""


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description and per-argument notes of a Google-style docstring."""
    doc = inspect.getdoc(fn) or ""
    if doc and doc == _dataclass_doc(fn if isinstance(fn, type) else type(fn)):
        doc = ""  # written by @dataclass, not by the class's author
    lines = doc.splitlines()
    description: list[str] = []
    notes: dict[str, str] = {}
    section = None
    current = None
    for line in lines:
        stripped = line.strip()
        if (
            stripped.endswith(":")
            and stripped[:-1].lower() in _SECTIONS
            and not line.startswith(" ")
        ):
            section = stripped[:-1].capitalize()
            current = None
            continue
        if section in _ARGS and stripped and not line.startswith(" "):
            # An argument and its note are indented under the heading: a line that is not
            # (another heading, "Usage:") ends the section, and is description again.
            section = current = None
        if section is None:
            description.append(line)
        elif section in _ARGS:
            match = re.match(r"\s{1,8}(\*{0,2}\w+)(?:\s*\(.*?\))?:\s*(.*)", line)
            if match and line[: len(line) - len(line.lstrip())] and match.group(1).isidentifier():
                current = match.group(1)
                notes[current] = match.group(2).strip()
            elif current is not None and stripped:
                notes[current] = f"{notes[current]} {stripped}".strip()
    return "\n".join(description).strip(), notes


def _dataclass_doc(cls: type) -> str | None:
    """The docstring ``@dataclass`` gives a class that has none (``Converter(rate: float)``),
    or None when `cls` is no dataclass."""
    if not dataclasses.is_dataclass(cls):
        return None
    try:
        return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):
        return None


@final
@attrs.frozen
class Tool:
    """A function the model may call, with the JSON Schema of its arguments.

    Build one with `tool`. Calling a `Tool` calls its function, so it can be tested alone;
    `run` is what the tool loop does with a model's call.

    Attributes:
        fn: The function (sync or async).
        name: The name the model calls it by.
        description: What it does, for the model (the docstring by default).
        parameters: The JSON Schema object of its arguments.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: Mapping[str, Any] = attrs.field(repr=False)
    _arguments: _Shape = attrs.field(repr=False, eq=False, alias="arguments")
    _scope: str | None = attrs.field(repr=False, eq=False, alias="scope")
    is_async: bool = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(lambda self: is_async_callable(self.fn), takes_self=True),
    )

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def check(self, call: ToolCall) -> dict[str, Any] | str:
        """The call's arguments as the function takes them, or what is wrong with them."""
        invalid = call.meta.get(INVALID_ARGUMENTS)
        if isinstance(invalid, Mapping):
            return f"the arguments are {invalid.get('error', 'not a JSON object')}"
        problems = _Problems()
        converted = self._arguments.convert(dict(call.arguments), "", problems)
        if problems.found:
            return str(problems)
        assert isinstance(converted, dict)
        return converted

    async def run(self, call: ToolCall, scope: Scope | None = None) -> ToolResult:
        """Check `call`'s arguments, run the tool, and give the model's `ToolResult`.

        Bad arguments give an ``invalid_arguments`` error result without running the tool;
        an exception from the tool gives a ``tool_error`` result. Cancellation propagates.
        """
        arguments = self.check(call)
        if isinstance(arguments, str):
            return invalid_arguments(self, call, arguments)
        return await self.execute(call, arguments, scope)

    async def execute(
        self, call: ToolCall, arguments: dict[str, Any], scope: Scope | None
    ) -> ToolResult:
        """Run the tool on arguments `check` gave; an exception becomes a ``tool_error``.

        A sync tool runs in a worker thread, so that it cannot block the turn's other tool
        calls; a thread cannot be interrupted, so a cancelled turn waits for it to return. An
        awaitable it returns is awaited.
        """
        if self._scope is not None:
            arguments = {**arguments, self._scope: scope if scope is not None else Scope()}
        try:
            if self.is_async:
                value = await self.fn(**arguments)
            else:
                (value,) = await anyio.to_thread.run_sync(_call_with, self.fn, arguments)
                # A cancellation that came while the thread ran is left pending: the call is
                # cancelled now, as an async tool would have been (a coroutine it returned
                # is closed unrun, not left to warn that it was never awaited).
                try:
                    await anyio.lowlevel.checkpoint_if_cancelled()
                except BaseException:
                    if inspect.iscoroutine(value):
                        value.close()
                    raise
                if inspect.isawaitable(value):
                    # A function that looked sync but returned an awaitable (a decorated
                    # coroutine function), as for hooks.
                    value = await value
            content = encode_result(value)
        except ToolFailure as exc:
            return ToolResult(
                call.id, f"tool {self.name!r} failed: {exc}", is_error=True, error_class=TOOL_ERROR
            )
        except Exception as exc:
            return ToolResult(
                call.id,
                f"tool {self.name!r} failed: {exc_text(as_raised(exc))}",
                is_error=True,
                error_class=TOOL_ERROR,
            )
        except BaseException as exc:
            if not spurious_cancellation(exc):
                raise
            return ToolResult(
                call.id,
                f"tool {self.name!r} failed: {exc_text(exc)}, raised by the tool itself (the"
                " turn was not cancelled)",
                is_error=True,
                error_class=TOOL_ERROR,
            )
        return ToolResult(call.id, content)


def invalid_arguments(tool: Tool, call: ToolCall, problems: str) -> ToolResult:
    """The error result for a call whose arguments do not fit the tool's schema."""
    return ToolResult(
        call.id,
        f"invalid arguments for tool {tool.name!r}: {problems} — call it again with arguments"
        " matching its schema",
        is_error=True,
        error_class=INVALID_ARGUMENTS,
    )


def _call_with(fn: Callable[..., Any], arguments: dict[str, Any]) -> tuple[Any]:
    # Boxed: trio refuses a coroutine a worker thread returns, asyncio passes it on.
    try:
        return (fn(**arguments),)
    except StopIteration as exc:
        # Raised on through the loop's coroutines, it would become "RuntimeError: coroutine
        # raised StopIteration" (PEP 479), blaming a coroutine the sync tool never had.
        raise ToolFailure(exc_text(exc)) from exc


def encode_result(value: Any) -> str:
    """A tool's return value as the model reads it: a str as its plain text (a `str, Enum`
    member as its value, not ``Mode.FAST``), anything else as JSON."""
    if isinstance(value, str):
        # As plain text: a str subclass (a `str, Enum` member) formats as itself, so a hook's
        # f"{result.content}" would read "Mode.FAST" where the model and the log read "fast".
        return str.__str__(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"returned {describe(value)}, which cannot be encoded as JSON") from exc


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-encodable")


@overload
def tool(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> Tool: ...
@overload
def tool(
    fn: None = None, *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a `Tool`; usable as ``@tool`` or ``@tool(name=...)``.

    Each parameter becomes an argument of the JSON Schema: str, int, float, bool, list[...],
    tuple[X, ...] and Sequence[X] (given as tuples), dict[str, ...], Literal[...], optional
    values (``X | None``), attrs classes; a parameter
    with a default is not required. A parameter annotated `Scope` (or ``Scope | None``)
    receives the turn's scope and is not shown to the model. The description is the
    docstring's text, and each argument's note in its ``Args:`` section describes that
    argument. `fn` may also be a `functools.partial` (what it binds by keyword is fixed, not
    shown to the model) or an object with a typed ``__call__`` (described by its class's
    docstring, or by its ``__call__``'s when the class has none or notes no argument).

    Raises:
        ConfigError: The function cannot be described to the model (a missing or
            unsupported annotation, ``*args``, a bad name).
    """
    if fn is None:
        return lambda f: tool(f, name=name, description=description)
    return _build(fn, name, description)


def _build(fn: Callable[..., Any], name: str | None, description: str | None) -> Tool:
    if isinstance(fn, Tool):
        raise ConfigError(f"tool {fn.name!r} is already a Tool; pass it as it is")
    if not callable(fn):
        raise ConfigError(f"tool(...) needs a function, got {describe(fn)}")
    inner, bound = _unwrapped(fn)
    label = name if name is not None else getattr(inner, "__name__", callable_name(fn))
    if not isinstance(label, str) or not _NAME.fullmatch(label):
        # A name taken from the function (a lambda's '<lambda>') is fixed by giving one.
        fix = "" if name is not None else ' — give the tool one: tool(fn, name="...")'
        raise ConfigError(
            f"tool name {label!r} is not one providers accept: use 1-64 letters, digits, '_'"
            f" or '-'{fix}"
        )
    if description is not None and not isinstance(description, str):
        raise ConfigError(f"tool {label!r}: description must be text, got {describe(description)}")
    body = _annotated(inner)
    if inspect.isgeneratorfunction(body) or inspect.isasyncgenfunction(body):
        raise ConfigError(
            f"tool {label!r} is a generator function (it yields): calling it gives a generator,"
            " not a result the model can read — `return` the result once (a list, say)"
            " instead of `yield`"
        )
    doc, notes = _docstring(inner)
    if not notes and body is not inner:
        # A callable object whose class says nothing (or notes no argument): its __call__
        # may, where its Args naturally are.
        call_doc, notes = _docstring(body)
        doc = doc or call_doc
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(body)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigError(f"tool {label!r}: cannot read the signature of {fn!r}: {exc}") from exc
    fields: dict[str, _Shape] = {}
    required: list[str] = []
    defaults: dict[str, Any] = {}
    scope: str | None = None
    for parameter in signature.parameters.values():
        if parameter.name in bound:
            continue  # fixed by a partial: not the model's to choose
        where = f"tool {label!r}, argument {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ConfigError(f"{where}: *args and **kwargs cannot be described to the model")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise ConfigError(f"{where}: tools are called with keyword arguments, not positional")
        annotation = hints.get(parameter.name, inspect.Parameter.empty)
        if _is_scope(annotation):
            if scope is not None:
                # Only one receives the scope: the other would be missing from every call.
                raise ConfigError(
                    f"{where}: a second Scope parameter (after {scope!r}); the tool receives"
                    " the turn's scope once — keep one"
                )
            scope = parameter.name
            continue
        if annotation is inspect.Parameter.empty:
            raise ConfigError(
                f"{where} has no type annotation; the model needs a schema — annotate it"
                " (e.g. `city: str`)"
            )
        fields[parameter.name] = _defaulted(_shape(annotation, where), parameter.default)
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        else:
            defaults[parameter.name] = parameter.default
    arguments = _Object(fields, tuple(required), defaults, notes)
    return Tool(
        fn,
        label,
        description if description is not None else doc,
        arguments.schema,
        arguments=arguments,
        scope=scope,
    )


def _unwrapped(fn: Callable[..., Any]) -> tuple[Callable[..., Any], frozenset[str]]:
    """The function inside `fn`'s partials (what names and describes it), and the
    arguments they bind by keyword."""
    bound: set[str] = set()
    while isinstance(fn, functools.partial):
        bound.update(fn.keywords)
        fn = fn.func
    return fn, frozenset(bound)


def _annotated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What holds the annotations of `fn`'s parameters: a callable object's ``__call__``."""
    if inspect.isroutine(fn) or isinstance(fn, type):
        return fn
    call: Callable[..., Any] = type(fn).__call__
    return call


def _is_scope(annotation: Any) -> bool:
    """Whether a parameter annotated so receives the turn's scope: `Scope`, or an optional
    one (``Scope | None = None``, so that the function can still be called without it)."""
    if annotation is Scope:
        return True
    origin = typing.get_origin(annotation)
    return (origin is typing.Union or origin is types.UnionType) and set(
        typing.get_args(annotation)
    ) == {Scope, type(None)}


def schema_tool(
    fn: Callable[..., Any],
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    problems_of: Callable[[Any], list[str]],
) -> Tool:
    """A `Tool` whose JSON Schema comes with it (from an MCP server), not from a signature.

    `problems_of(arguments)` lists what is wrong with the model's arguments (empty when they
    fit); `fn` is called with the arguments as keywords.
    """
    return Tool(
        fn,
        name,
        description,
        dict(parameters),
        arguments=_Checked(parameters, problems_of),
        scope=None,
    )
