"""The value types of a config file, checked when the file is loaded.

Each type here is what a field of an entry (`hooks.config._hooks`, `_transformers`, `_models`, `_tools`) is annotated with; `hooks.config`
registers one structuring check per type with its converter, and `hooks.config._schema` reads the
same types to write the JSON Schema. A check raises `Invalid` with the sentence a user reads;
the loader adds the file name and the path of the value.
"""

import contextlib
import difflib
import importlib
import inspect
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, NewType, final

import attrs

from .._pii import KINDS as PII_KINDS
from .._summary import drop_oldest, running_summary


class Invalid(ValueError):
    """A value in a config file is not what its key expects; the message says why.

    Attributes:
        key: The key, inside the value being checked, that is wrong (``kind`` of an entry),
            or ``None`` when the value itself is.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def shown(value: object) -> str:
    """`value` as a user wrote it, with its type as TOML and JSON name it.

    An integer too long to show (TOML and JSON read any; Python will not write one of more
    than 4300 digits) is shown by its number of digits; a list or table holding one, by its
    type alone.
    """
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**57:
        sign = "a negative" if value < 0 else "an"
        return f"{sign} integer of {_digits(abs(value))} digits"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        try:
            text = repr(value)
        except ValueError:  # it holds an integer past the digit limit
            return f"a {type_name(value)} too long to show"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type_name(value)})"


def _digits(number: int) -> int:
    """How many digits `number` (> 0) has, without writing it out."""
    digits = int(math.log10(number)) + 1  # a float's log may be one off near a power of 10
    if number < 10 ** (digits - 1):
        return digits - 1
    return digits + 1 if number >= 10**digits else digits


def type_name(value: object) -> str:
    """The name a config file's reader gives the type of `value`."""
    match value:
        case bool():
            return "boolean"
        case int():
            return "integer"
        case float():
            return "float"
        case str():
            return "string"
        case list() | tuple():
            return "list"
        case dict():
            return "table"
        case None:
            return "null"
    return type(value).__name__


Seconds = NewType("Seconds", float)
"""A positive, finite number of seconds."""

Minutes = NewType("Minutes", float)
"""A positive, finite number of minutes."""

Hours = NewType("Hours", float)
"""A positive, finite number of hours."""

Count = NewType("Count", int)
"""A whole number >= 0."""

Positive = NewType("Positive", int)
"""A whole number >= 1."""

Temperature = NewType("Temperature", float)
"""A sampling temperature, between 0 and 2."""

UnitTemperature = NewType("UnitTemperature", float)
"""A sampling temperature between 0 and 1: Anthropic's range (OpenAI's reaches 2)."""

Text = NewType("Text", str)
"""A string that is not empty."""

ScriptReply = NewType("ScriptReply", tuple[str, ...])
"""A scripted reply: one string, or a list of the chunks it is streamed in."""

ToolName = NewType("ToolName", str)
"""A name providers accept for a tool: 1 to 64 letters, digits, ``_`` or ``-``."""

PiiKind = NewType("PiiKind", str)
"""A kind of personal data `hooks.pii` knows (``"email"``, ``"card"``, ...)."""

Arguments = NewType("Arguments", dict[str, Any])

StrMap = NewType("StrMap", dict[str, str])
"""A table of strings (a server's environment variables, HTTP headers)."""
"""A table of arguments for a tool, checked against the tool's schema when it is built."""


@final
@attrs.frozen
class ToolMatch:
    """Which tools a tool hook applies to: a tool's name, or a regex the whole name matches.

    Attributes:
        value: The name, or the compiled regex (`pipeline.hook`'s ``match=``).
    """

    value: str | re.Pattern[str]

    @property
    def shown(self) -> str:
        """As `turnplug check` shows it: ``"lookup"`` or ``/look.*/``."""
        if isinstance(self.value, str):
            return json.dumps(self.value)
        return f"/{self.value.pattern}/"


def check_str(value: Any) -> str:
    if not isinstance(value, str):
        raise Invalid(f"expected a string, got {shown(value)}")
    return value


def check_text(value: Any) -> str:
    if not check_str(value).strip():
        raise Invalid("expected some text, got an empty string")
    return value  # type: ignore[no-any-return]


def check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {shown(value)}")
    return value


WHOLE_MOST = 2**63 - 1
"""The largest whole number a config takes: what a 64-bit signed integer holds, the most a
provider takes as ``max_tokens``; no other count or limit is meaningful past it."""


def _whole(value: Any, least: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise Invalid(f"expected {what}, got {shown(value)}")
    if value > WHOLE_MOST:
        raise Invalid(f"expected {what} and at most 2**63 - 1 ({WHOLE_MOST}), got {shown(value)}")
    return value


def check_count(value: Any) -> int:
    return _whole(value, 0, "a whole number >= 0")


def check_positive(value: Any) -> int:
    return _whole(value, 1, "a whole number >= 1")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of more digits than a float holds (TOML reads any)
        return None
    return number if math.isfinite(number) else None


def _positive(unit: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        number = _number(value)
        if number is None or number <= 0:
            raise Invalid(f"expected a positive number of {unit}, got {shown(value)}")
        return number

    return check


check_seconds = _positive("seconds")
check_minutes = _positive("minutes")
check_hours = _positive("hours")


def check_temperature(value: Any) -> float:
    temperature = _number(value)
    if temperature is None or not 0 <= temperature <= 2:
        raise Invalid(f"expected a number between 0 and 2, got {shown(value)}")
    return temperature


def check_unit_temperature(value: Any) -> float:
    temperature = _number(value)
    if temperature is None or not 0 <= temperature <= 1:
        raise Invalid(f"expected a number between 0 and 1 (Anthropic's range), got {shown(value)}")
    return temperature


def check_reply(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and value and all(isinstance(c, str) for c in value):
        return tuple(value)
    raise Invalid(
        f"expected a reply: a string, or a list of the string chunks it streams in, got"
        f" {shown(value)}"
    )


def check_pattern(value: Any) -> re.Pattern[str]:
    """A regular expression, compiled now so that a bad one is reported with its path."""
    try:
        return re.compile(check_str(value))
    except re.error as exc:
        # The usual cause of a bad escape is TOML's own escaping in "double quotes".
        hint = (
            " — in TOML, write regexes in single quotes ('...'), which keep backslashes"
            if "escape" in str(exc)
            else ""
        )
        raise Invalid(f"invalid regular expression {json.dumps(value)}: {exc}{hint}") from None


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_tool_name(value: Any) -> str:
    if not _TOOL_NAME.fullmatch(check_str(value)):
        raise Invalid(
            f"{json.dumps(value)} is not a name providers accept for a tool: use 1 to 64"
            " letters, digits, '_' or '-'"
        )
    return value  # type: ignore[no-any-return]


def check_pii_kind(value: Any) -> str:
    if isinstance(value, str) and value in PII_KINDS:
        return value
    choices = ", ".join(json.dumps(kind) for kind in PII_KINDS)
    close = difflib.get_close_matches(value, PII_KINDS, n=1) if isinstance(value, str) else []
    hint = f" — did you mean {json.dumps(close[0])}?" if close else ""
    raise Invalid(f"unknown pii kind {shown(value)}{hint} (expected one of {choices})")


def check_arguments(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(f"expected a table of arguments, got {shown(value)}")
    for key, item in value.items():
        _json_value(item, key)
    return value


def _json_value(value: Any, path: str) -> None:
    """Refuse what a tool call cannot carry: its arguments travel as JSON (to the model, in
    the log), which has no dates or times (TOML has) and no NaN or infinity."""
    if isinstance(value, dict):
        for key, item in value.items():
            _json_value(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _json_value(item, f"{path}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise Invalid(
            f"expected a finite number (JSON has no NaN or infinity), got {shown(value)}", key=path
        )
    elif not isinstance(value, str | int | float | bool) and value is not None:
        raise Invalid(
            f"expected a string, number, boolean, list or table, got {type_name(value)}"
            f" {value} — tool arguments travel as JSON, which has no dates or times: write it"
            " as a string",
            key=path,
        )


def check_str_map(value: Any) -> StrMap:
    if not isinstance(value, dict):
        raise Invalid(f"expected a table of strings, got {shown(value)}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise Invalid(f"expected a string, got {shown(item)}", key=key)
    return StrMap(value)


def check_match(value: Any) -> ToolMatch:
    """A tool's name, or ``{ regex = "..." }`` compiled now."""
    if isinstance(value, str):
        return ToolMatch(check_text(value))
    if not isinstance(value, dict):
        raise Invalid(f"expected a tool's name or a table with a regex, got {shown(value)}")
    if "regex" not in value:
        raise Invalid("required: the regex the whole tool name must match", key="regex")
    extra = sorted(key for key in value if key != "regex")
    if extra:
        raise Invalid("unknown key; a match table accepts: regex", key=extra[0])
    try:
        return ToolMatch(check_pattern(value["regex"]))
    except Invalid as exc:
        raise Invalid(str(exc), key="regex") from None


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@attrs.frozen
class Ref:
    """A ``module:attribute`` reference to a function, imported and checked when loaded.

    Each subclass is one shape of function: the positional arguments it is called with
    (`ARGUMENTS`) and what it is for (`SHAPE`, shown in errors and in the schema).

    Attributes:
        text: The reference as written.
        target: The callable it names.
    """

    ARGUMENTS: ClassVar[tuple[str, ...] | None] = ()
    SHAPE: ClassVar[str] = "a function"
    PLAIN: ClassVar[bool] = False
    """Whether it is called without being awaited (a factory, a tokenizer): ``async def``
    would give a coroutine in place of what it makes."""
    CATALOGUE: ClassVar[Mapping[str, Callable[[], Callable[..., Any]]]] = {}
    """Names the config may write in place of a reference, each with what makes the
    function it names (the `hooks` catalogue's, with their defaults)."""
    MADE_BY: ClassVar[tuple[Callable[..., Any], ...]] = ()
    """The catalogue's factories (`_FACTORIES`) whose product this ref takes: a ref naming
    one is told to call it; one naming another factory, what it makes and where that goes."""

    text: str
    target: Callable[..., Any] = attrs.field(eq=False, repr=False)

    @classmethod
    def resolve(cls, value: Any) -> "Ref":
        """Import what `value` names and check it can be called with `ARGUMENTS`."""
        text = check_str(value)
        module_name, colon, attribute = text.partition(":")
        if cls.CATALOGUE and not colon:
            return cls._catalogued(text)
        if not (colon and _DOTTED.fullmatch(module_name) and _DOTTED.fullmatch(attribute)):
            declared = "" if colon else _declared(text)  # ref = "running_summary"
            raise Invalid(
                f"{json.dumps(text)} is not a reference"
                + (f"; it {declared} — here, expected" if declared else ": expected")
                + " 'module:attribute', e.g. 'mypkg.hooks:search_docs'"
            )
        target: Any = _import(module_name)
        parts = attribute.split(".")
        for index, part in enumerate(parts):
            try:
                target = getattr(target, part)
            except AttributeError:
                owner = ".".join([module_name, *parts[:index]])
                names = _names(target, part, last=index == len(parts) - 1)
                close = difflib.get_close_matches(part, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else "check the name after the colon"
                raise Invalid(
                    f"{owner!r} has no attribute {part!r} (from {json.dumps(text)}) — {hint}"
                ) from None
        if not callable(target):
            raise Invalid(
                f"{json.dumps(text)} is {type(target).__name__} {_clip(repr(target))}, not"
                f" callable: expected {cls.SHAPE}"
            )
        factory = next((each for each in _FACTORIES if each is target), None)
        if factory is not None:
            raise Invalid(_factory_named(text, factory, cls))
        if cls.PLAIN and inspect.iscoroutinefunction(target):
            raise Invalid(
                f"{json.dumps(text)} is an async function, but is called without being awaited"
                f" (its coroutine would stand in for its result): expected {cls.SHAPE} —"
                " define it with def, not async def"
            )
        if cls.ARGUMENTS is not None:
            _check_arguments(text, target, cls.ARGUMENTS, cls.SHAPE)
        return cls(text, target)

    @classmethod
    def _catalogued(cls, text: str) -> "Ref":
        """The function a catalogue name stands for, made now."""
        if text in cls.CATALOGUE:
            return cls(text, cls.CATALOGUE[text]())
        names = sorted(cls.CATALOGUE)
        choices = ", ".join(json.dumps(name) for name in names)
        expected = f"expected one of {choices}, or 'module:attribute' of {cls.SHAPE}"
        if declared := _declared(text):  # the catalogue's, declared elsewhere: running_summary
            raise Invalid(f"{json.dumps(text)} {declared} — here, {expected}")
        # A module path written with dots only, put right (but hooks.drop_oldest, the
        # catalogue's own factory), then the closest name of the catalogue.
        module, dot, attribute = text.rpartition(".")
        dotted = dot and module != "hooks" and _DOTTED.fullmatch(text)
        close = difflib.get_close_matches(text, names, n=1)
        guesses = [f"{module}:{attribute}"] * bool(dotted) + close
        if not close:  # a reference's own example
            expected += ", e.g. 'mypkg.hooks:search_docs'"
        hint = f"did you mean {' or '.join(map(json.dumps, guesses))}? " if guesses else ""
        raise Invalid(
            f"{json.dumps(text)} is neither a name of the catalogue nor a reference — {hint}"
            f"{expected}"
        )


_FACTORIES: dict[Callable[..., Any], tuple[str, str, str]] = {
    drop_oldest: ("a compactor", 'compact = "drop_oldest"', "a compact name"),
    running_summary: (
        "a post hook",
        'a [[post]] entry of kind = "running_summary"',
        "a post kind",
    ),
}
"""The catalogue's factories a config declares by name: what each makes, how the config
writes it and what its name is there. A ref naming one names the factory, not what it
makes."""


def _declared(text: str) -> str:
    """What a config writes to use the catalogue's factory named `text`, as said after the
    name (``is a post kind: write ...``), or ``""`` when `text` names none."""
    for factory, (_what, written, kind) in _FACTORIES.items():
        if getattr(factory, "__name__", "") == text:
            return f"is {kind}: write {written} to use it"
    return ""


def _factory_named(text: str, factory: Callable[..., Any], expected: type["Ref"]) -> str:
    what, written, _kind = _FACTORIES[factory]
    name = getattr(factory, "__name__", "")
    if factory not in expected.MADE_BY:  # e.g. the compactor's factory as a model factory
        return (
            f"{json.dumps(text)} names the factory hooks.{name}, which makes {what} — expected"
            f" {expected.SHAPE}; the catalogue's {what.removeprefix('a ')} is declared as"
            f" {written}"
        )
    return (
        f"{json.dumps(text)} names the factory hooks.{name}, which makes {what} rather than"
        f" being one: write {written} to use the catalogue's, or call {name}(...) in a module"
        " of yours and name what it returns"
    )


def _names(owner: object, part: str, *, last: bool) -> list[str]:
    """The names of `owner` (a module, a class) a ref could mean in place of `part`, for a
    suggestion: as its last part, only callables (a ref names a function; a constant close
    to the name would only fail next as "not callable"); a private name (``_x``) only for a
    `part` that is one too. None if `owner` will not say."""
    try:
        names = [name for name in dir(owner) if not name.startswith("__")]
    except Exception:  # a __dir__ of the user's that fails: no suggestion, the error stands
        return []
    if not part.startswith("_"):
        names = [name for name in names if not name.startswith("_")]
    if last:
        names = [name for name in names if callable(_attribute(owner, name))]
    return names


def _attribute(owner: object, name: str) -> object:
    """``getattr(owner, name)``, or None when getting it fails (a property that raises)."""
    try:
        return getattr(owner, name)
    except Exception:
        return None


def _clip(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


FOLDER: ContextVar[str | None] = ContextVar("FOLDER", default=None)
"""The directory of the config file being loaded, whose modules its refs name first."""


FAILED: ContextVar[dict[str, BaseException] | None] = ContextVar("FAILED", default=None)
"""The modules whose import failed while the current config loads, and what each raised:
such a module is imported once per load, however many refs name it, a module inside it or
a module importing it (Python keeps no failed module, and would run its code, side effects
included, again for each)."""


def _import(module_name: str) -> Any:
    failed = FAILED.get()
    if failed is not None:
        for name in _enclosing(module_name):
            if name in failed:
                problem = _import_failed(module_name, failed[name])
                raise problem from problem.__cause__
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # Ctrl-C (KeyboardInterrupt) still stops it
        if failed is not None:
            failed[_failing(module_name)] = exc
            for name in _failed_inside(exc):  # a module it imports, failing in turn
                failed.setdefault(name, exc)
        problem = _import_failed(module_name, exc)
        raise problem from problem.__cause__
    _check_beside(module_name)
    return module


def _enclosing(module_name: str) -> list[str]:
    """`module_name` and the packages it is in, outermost first: importing it imports each."""
    parts = module_name.split(".")
    return [".".join(parts[: count + 1]) for count in range(len(parts))]


def _failing(module_name: str) -> str:
    """Which of `module_name` and its packages failed to import: the outermost Python did not
    keep (it keeps a package whose own code ran through, and drops one that failed)."""
    return next((name for name in _enclosing(module_name) if name not in sys.modules), module_name)


def _failed_inside(exc: BaseException) -> Iterator[str]:
    """The modules whose top-level code `exc` came up through: each failed to import (Python
    kept none), the innermost where it was raised."""
    trace = exc.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        name = frame.f_globals.get("__name__")
        if frame.f_code.co_name == "<module>" and isinstance(name, str) and name not in sys.modules:
            yield name
        trace = trace.tb_next


def _import_failed(module_name: str, exc: BaseException) -> Invalid:
    """The problem of `module_name` failing to import with `exc`; caused by what its own code
    raised (its traceback, which ``--debug`` shows)."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None and (module_name + ".").startswith(missing + "."):
        return Invalid(
            f"cannot import {module_name!r}: no such module — check the spelling; a module"
            " next to the config file, or installed in this environment, is found"
        )
    if isinstance(exc, SystemExit):
        # A module that exits when imported (a script's `sys.exit()` run at the top level)
        # would end the loading process silently.
        problem = Invalid(
            f"importing {module_name!r} called sys.exit({exc.code!r}) — a module a config"
            " names must not exit when imported; guard its script part with"
            ' `if __name__ == "__main__":`'
        )
    else:  # the module's own code failed: say how, keep going
        problem = Invalid(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    problem.__cause__ = exc
    return problem


def _check_beside(module_name: str) -> None:
    """Refuse a module of the config's directory that Python will not import: one of the
    same name was imported already, from elsewhere (another config's directory, an
    installed package), and a process imports a module once; its functions would be
    another file's. (Not evicted and imported anew: what imported the other one, turnplug's
    own `hooks` say, would lose it.)"""
    folder = FOLDER.get()
    top = module_name.partition(".")[0]
    if folder is None:
        return
    beside = next(
        (
            path
            for path in (Path(folder, f"{top}.py"), Path(folder, top, "__init__.py"))
            if path.is_file()
        ),
        None,
    )
    origin = getattr(sys.modules.get(top), "__file__", None)
    if beside is None or origin is None or Path(origin).resolve() == beside.resolve():
        return
    if beside.name != "__init__.py":
        # A package's other modules may differ where its __init__.py files agree.
        with contextlib.suppress(OSError):
            if Path(origin).read_bytes() == beside.read_bytes():
                return  # the same code (a file copied beside each config): the same functions
    raise Invalid(
        f"{str(beside)!r} is not what {top!r} names here: a module {top!r} was imported"
        f" already, from {origin!r}, and Python imports a module once per process — give"
        " the one beside the config another name"
    )


def _check_arguments(
    text: str, target: Callable[..., Any], arguments: tuple[str, ...], shape: str
) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # builtins without a readable signature: the call itself will tell
    try:
        signature.bind(*arguments)
    except TypeError:
        count = len(arguments)
        taking = f"{count} positional argument{'s' if count != 1 else ''}"
        if count:
            taking += f" ({', '.join(arguments)})"
        raise Invalid(
            f"{json.dumps(text)} has the signature {signature}, but is called with {taking}:"
            f" expected {shape}{_factory_hint(signature, count)}"
        ) from None


def _factory_hint(signature: inspect.Signature, count: int) -> str:
    """A hint for a function that takes nothing where arguments are given: a factory (it
    makes the function rather than being one), named in place of what it makes."""
    try:
        signature.bind()
    except TypeError:
        return ""
    if not count:
        return ""
    return " — if it is a factory, call it in a module of yours and name what it returns"


@final
class HookRef(Ref):
    """A pre hook or a parallel-group member: ``fn(turn)``."""

    ARGUMENTS = ("turn",)
    SHAPE = "a pre hook fn(turn) returning a signal (or, in a parallel group, a list of parts)"


@final
class PostRef(Ref):
    """A post hook: ``fn(turn)``, or what the catalogue's `running_summary` makes."""

    ARGUMENTS = ("turn",)
    SHAPE = "a post hook fn(turn) returning a signal"
    MADE_BY = (running_summary,)


@final
class FactoryRef(Ref):
    """A stream-transformer factory: called with nothing, returns ``feed``/``flush``."""

    PLAIN = True
    SHAPE = "a transformer factory fn() returning an object with feed(text) and flush()"


@final
class ModelRef(Ref):
    """A model factory: called with nothing, returns a model (an object with ``stream``)."""

    PLAIN = True
    SHAPE = "a model factory fn() returning a model, e.g. pipeline.testing.FunctionModel(...)"


@final
class StartRef(Ref):
    """An ``on_session_start`` hook: ``fn(session_info)``."""

    ARGUMENTS = ("session_info",)
    SHAPE = "a session start hook fn(session_info) returning cont(scope)"


@final
class EndRef(Ref):
    """An ``on_session_end`` hook: ``fn(session_info, reason)``."""

    ARGUMENTS = ("session_info", "reason")
    SHAPE = "a session end hook fn(session_info, reason)"


@final
class TokenizerRef(Ref):
    """A tokenizer: ``fn(text) -> int``."""

    ARGUMENTS = ("text",)
    PLAIN = True
    SHAPE = "a tokenizer fn(text) returning a token count"


@final
class CompactRef(Ref):
    """A history compactor: ``fn(history, target_tokens, tokenizer) -> history``, or the
    catalogue's, by name (``"drop_oldest"``)."""

    ARGUMENTS = ("history", "target_tokens", "tokenizer")
    SHAPE = "a compactor fn(history, target_tokens, tokenizer) returning the history"
    MADE_BY = (drop_oldest,)
    CATALOGUE: ClassVar[Mapping[str, Callable[[], Callable[..., Any]]]] = {
        "drop_oldest": drop_oldest
    }


@final
class GuardRef(Ref):
    """A guardrail's check: ``fn(text)`` returning True, False or feedback text."""

    ARGUMENTS = ("text",)
    SHAPE = "a check fn(text) returning True, False or feedback text"


@final
class SearchRef(Ref):
    """A retrieval search: ``fn(query, k)`` returning passages."""

    ARGUMENTS = ("query", "k")
    SHAPE = "a search fn(query, k) returning a list of passages (strings or parts)"


@final
class ToolRef(Ref):
    """A tool's function, called with keyword arguments its annotations describe.

    Its signature is checked by `pipeline.tool` when the tool is built, not here: any typed
    parameters will do.
    """

    ARGUMENTS = None
    SHAPE = "a typed function, or a pipeline.Tool"


@final
class BeforeToolRef(Ref):
    """A before-tool hook: ``fn(call, turn)``."""

    ARGUMENTS = ("call", "turn")
    SHAPE = "a before-tool hook fn(call, turn) returning cont(call), block, ask or halt"


@final
class AfterToolRef(Ref):
    """An after-tool hook: ``fn(call, result, turn)``."""

    ARGUMENTS = ("call", "result", "turn")
    SHAPE = "an after-tool hook fn(call, result, turn) returning cont(result) or halt"


CHECKS: dict[Any, Callable[[Any], Any]] = {
    str: check_str,
    bool: check_bool,
    Text: check_text,
    Count: check_count,
    Positive: check_positive,
    Seconds: check_seconds,
    Minutes: check_minutes,
    Hours: check_hours,
    Temperature: check_temperature,
    UnitTemperature: check_unit_temperature,
    ScriptReply: check_reply,
    re.Pattern: check_pattern,
    ToolName: check_tool_name,
    PiiKind: check_pii_kind,
    Arguments: check_arguments,
    StrMap: check_str_map,
    ToolMatch: check_match,
}
"""The check of each value type; `Ref` subclasses check with their `resolve`."""
