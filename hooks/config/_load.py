"""Declarative pipelines: a TOML or JSON file, or a dict, to a `Pipeline`.

``load_pipeline("assistant.toml")`` reads the file, checks every value (unknown keys,
types, regexes compiled, ``module:attribute`` references imported and their signatures
checked, API keys present), builds each entry and returns the `Pipeline`. Every problem is
reported at once, in one `ConfigError` whose lines carry the file name and the path of the
value (``pre[2].ref``). ``config_schema()`` is the JSON Schema of the same format, written
from the same definitions. The format is described in ``docs/config.md``.

This is the one module of `hooks` that uses cattrs (its converter is private): entry lists
are tagged unions on ``kind``, the model table one on ``provider``.
"""

import copy
import difflib
import functools
import json
import operator
import os
import re
import sys
import tomllib
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, final, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override
from cattrs.strategies import configure_tagged_union

from pipeline import ConfigError, LocalToolset, MCPToolset, Model, Pipeline, Tool
from pipeline.providers import model_from_string

from .._terminal import one_line
from ._entry import Env
from ._file import STAGE_LISTS, TAGGED, Config
from ._hooks import MemberEntry, RunningSummary
from ._schema import schema_of
from ._types import CHECKS, FAILED, FOLDER, Invalid, Ref, ToolRef, shown

_Problem = tuple[str, str]
"""The path of a value (``pre[2].ref``; ``""`` for the whole file) and what is wrong."""
_Cause = tuple[str, BaseException]
"""What the config's own code raised, with the path of the problem it caused."""


def _members(union: Any) -> tuple[type, ...]:
    return get_args(union) or (union,)


def _tag_of(cls: type, tag: str) -> str:
    """A record's tag: its ``KIND`` (tag ``kind``) or ``PROVIDER`` (tag ``provider``)."""
    return str(getattr(cls, tag.upper()))


# -- the converter ----------------------------------------------------------------------------


def _is_pattern(kind: Any) -> bool:
    return kind is re.Pattern or get_origin(kind) is re.Pattern


def _is_ref(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Ref)


def _is_literal(kind: Any) -> bool:
    return get_origin(kind) is Literal


def _is_list(kind: Any) -> bool:
    return get_origin(kind) is tuple and get_args(kind)[1:] == (...,)


def _is_table(kind: Any) -> bool:
    return attrs.has(kind) and not _is_ref(kind)


def _checked(check: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda value, _kind: check(value)


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    for kind, check in CHECKS.items():
        # Direct registrations replace cattrs' own primitives, which convert ("3" to 3): a
        # config value must already have the type its key expects.
        if kind is re.Pattern:
            converter.register_structure_hook_func(_is_pattern, _checked(check))
        else:
            converter.register_structure_hook(kind, _checked(check))
    converter.register_structure_hook_func(_is_ref, lambda value, kind: kind.resolve(value))
    converter.register_structure_hook_func(_is_literal, _literal)
    converter.register_structure_hook_func(
        _is_list, lambda value, kind: _list(converter, value, get_args(kind)[0])
    )
    converter.register_structure_hook_func(
        _is_optional, lambda value, kind: _optional(converter, value, kind)
    )
    converter.register_structure_hook_factory(_is_table, lambda cls: _table(converter, cls))
    for union, tag in TAGGED:
        _configure_entries(converter, union, tag)
    return converter


def _is_optional(kind: Any) -> bool:
    return get_origin(kind) in (Union, UnionType) and type(None) in get_args(kind)


def _optional(converter: cattrs.Converter, value: Any, kind: Any) -> Any:
    """``X | None``: absent in TOML, ``null`` in JSON; otherwise an ``X`` (a union too)."""
    if value is None:
        return None
    rest = [arg for arg in get_args(kind) if arg is not type(None)]
    return converter.structure(value, functools.reduce(operator.or_, rest))


def _literal(value: Any, kind: Any) -> Any:
    allowed = get_args(kind)
    if isinstance(value, bool) or value not in allowed:
        choices = ", ".join(json.dumps(choice) for choice in allowed)
        raise Invalid(f"expected one of {choices}, got {shown(value)}")
    return value


def _list(converter: cattrs.Converter, value: Any, item: Any) -> tuple[Any, ...]:
    """A list whose every item is checked, all problems kept (strings are not lists)."""
    if not isinstance(value, list | tuple):
        raise Invalid(f"expected a list, got {shown(value)}")
    items: list[Any] = []
    errors: list[Exception] = []
    for index, element in enumerate(value):
        try:
            items.append(converter.structure(element, item))
        except Exception as exc:
            exc.__notes__ = [
                *getattr(exc, "__notes__", []),
                IterableValidationNote("", index, item),
            ]
            errors.append(exc)
    if errors:
        raise IterableValidationError("invalid list items", errors, tuple)
    return tuple(items)


def _table(converter: cattrs.Converter, cls: type) -> Callable[[Any, Any], Any]:
    """Structure a table into `cls`: keys renamed as its fields say, unknown keys refused."""
    renames = {
        field.name: override(rename=field.metadata["key"])
        for field in attrs.fields(cls)
        if "key" in field.metadata
    }
    make: Any = make_dict_structure_fn
    plain: Callable[[Any, Any], Any] = make(
        cls, converter, _cattrs_forbid_extra_keys=True, **renames
    )

    def structure(value: Any, _t: Any) -> Any:
        if not isinstance(value, dict):
            raise Invalid(f"expected a table, got {shown(value)}")
        return plain(value, cls)

    return structure


def _configure_entries(converter: cattrs.Converter, union: Any, tag: str) -> None:
    """Entries of one list: a tagged union on `tag`, with the tag checked first."""
    members = _members(union)
    by_tag = {_tag_of(cls, tag): cls for cls in members}
    if len(members) > 1:
        configure_tagged_union(
            union, converter, tag_generator=lambda cls: _tag_of(cls, tag), tag_name=tag
        )
        tagged = converter.get_structure_hook(union)
    else:
        (only,) = members
        plain = converter.get_structure_hook(only)

        def tagged(value: Any, _t: Any) -> Any:
            return plain({k: v for k, v in value.items() if k != tag}, only)

    def structure(value: Any, _t: Any) -> Any:
        choices = ", ".join(json.dumps(name) for name in sorted(by_tag))
        if not isinstance(value, dict):
            raise Invalid(f"expected a table with a {tag} ({choices}), got {shown(value)}")
        if tag not in value:
            raise Invalid(f"required: one of {choices}", key=tag)
        given = value[tag]
        if not isinstance(given, str) or given not in by_tag:
            raise Invalid(_unknown_tag(tag, given, by_tag, choices), key=tag)
        return tagged(value, union)

    converter.register_structure_hook(union, structure)


def _unknown_tag(tag: str, given: Any, known: Mapping[str, type], choices: str) -> str:
    if not isinstance(given, str):
        return f"expected one of {choices}, got {shown(given)}"
    # Where a kind meant for another list belongs; said only in lists of entries (a
    # `refresh` table's kind is no entry).
    entries = tag == "kind" and any(name in _ALL_KINDS for name in known)
    elsewhere = [stage for stage, kinds in _KINDS_BY_STAGE.items() if given in kinds]
    if entries and given in _MEMBER_KINDS and not elsewhere:
        return (
            f"kind {json.dumps(given)} is a member of a parallel group (expected one of"
            f' {choices}); put it in the hooks of a kind = "parallel" entry'
        )
    if entries and elsewhere:
        lists = " or ".join(elsewhere)
        return (
            f"kind {json.dumps(given)} cannot stand here (expected one of {choices}); it goes"
            f" in {lists}"
        )
    close = difflib.get_close_matches(given, known, n=1)
    hint = f" — did you mean {json.dumps(close[0])}?" if close else ""
    return f"unknown {tag} {json.dumps(given)}{hint} (expected one of {choices})"


_KINDS_BY_STAGE: dict[str, frozenset[str]] = {
    stage: frozenset(
        _tag_of(cls, "kind") for cls in _members(get_args(typing.get_type_hints(Config)[stage])[0])
    )
    for stage in STAGE_LISTS
}
"""The kinds each list of a config accepts, to say where a misplaced entry belongs."""

_ALL_KINDS = frozenset().union(*_KINDS_BY_STAGE.values())
_MEMBER_KINDS = frozenset(_tag_of(cls, "kind") for cls in _members(MemberEntry))

_converter = _make_converter()


# -- problems, with their paths ---------------------------------------------------------------


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _key_of(cls: type, name: str) -> str:
    for field in attrs.fields(cls):
        if field.name == name:
            return str(field.metadata.get("key", name))
    return name


def _keys(cls: type) -> list[str]:
    keys = [_key_of(cls, field.name) for field in attrs.fields(cls)]
    return [key for key in keys if not key.startswith("$")]


def _problems(exc: BaseException, path: str) -> Iterator[_Problem]:
    """Every problem in a structuring failure, with the path of its value."""
    if isinstance(exc, ClassValidationError):
        noted, others = exc.group_exceptions()
        for error, note in noted:
            yield from _problems(error, _join(path, _key_of(exc.cl, note.name)))
        for error in others:
            if isinstance(error, ForbiddenExtraKeysError):
                allowed = _keys(error.cl)
                extra: set[object] = set(error.extra_fields)  # typed str; a dict's may not be
                for key in sorted(extra, key=str):
                    if isinstance(key, str):
                        yield _join(path, key), _unknown_key(key, allowed, error.cl)
                    else:  # a dict built in Python (`pipeline_from_dict`); files have no such
                        yield path, f"a key must be a string, got {shown(key)}"
            else:
                yield from _problems(error, path)
    elif isinstance(exc, IterableValidationError):
        for error, inote in exc.group_exceptions()[0]:
            yield from _problems(error, _join(path, inote.index))
    elif isinstance(exc, Invalid):
        yield (_join(path, exc.key) if exc.key else path), str(exc)
    elif type(exc) is KeyError:
        # cattrs reports a missing key as the KeyError of its lookup; no check of ours
        # raises one.
        yield path, "required"
    else:
        yield path, f"{type(exc).__name__}: {exc}"


def _unknown_key(key: str, allowed: list[str], cls: type) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {json.dumps(close[0])}?)" if close else ""
    tag = getattr(cls, "KIND", None) or getattr(cls, "PROVIDER", None)
    owner = f"{json.dumps(tag)} accepts" if tag else "expected one of"
    return f"unknown key{hint}; {owner}: {', '.join(allowed)}"


def _order(data: Any, path: str) -> tuple[int, ...]:
    """Where the value at `path` stands in the file, for listing problems in file order."""
    order: list[int] = []
    node = data
    for token in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if token.startswith("["):
            index = int(token[1:-1])
            order.append(index)
            node = node[index] if isinstance(node, list) and index < len(node) else None
        elif isinstance(node, dict):
            keys = list(node)
            order.append(keys.index(token) if token in node else len(keys))
            node = node.get(token)
        else:
            order.append(0)
    return tuple(order)


# -- building ---------------------------------------------------------------------------------


@final
@attrs.frozen
class _Loaded:
    """A config read and built: what `turnplug check` shows.

    Attributes:
        source: Where the config came from (a file name, or ``"<dict>"``).
        config: The checked entries.
        pipeline: The pipeline they build.
    """

    source: str
    config: Config
    pipeline: Pipeline


def _salvage(data: Mapping[str, Any]) -> tuple[Config, dict[str, list[int]], list[str]]:
    """The parts of a failing config that are valid on their own, to build and check them.

    So that a file with a structural mistake also reports what building the rest would
    find (an API key that is not set, a pattern that matches the empty string). An entry
    or table whose mistakes are all in keys it can do without is kept without those keys,
    so that a bad ``temperature`` does not hide the missing API key of the same model.
    Returns the config, per list the positions in the file of the entries kept, and the
    paths of the keys left out (problems about them, or about what holds them, are not
    reported again).
    """
    kept: dict[str, Any] = {}
    positions: dict[str, list[int]] = {}
    dropped: list[str] = []
    hints = typing.get_type_hints(Config)
    for field in attrs.fields(Config):
        key = _key_of(Config, field.name)
        if key not in data:
            continue
        if field.name in STAGE_LISTS and isinstance(data[key], list):
            entries = []
            positions[field.name] = []
            for index, raw in enumerate(data[key]):
                path = f"{key}[{index}]"
                entry = _structure_without_mistakes(raw, get_args(hints[field.name])[0], path)
                if entry is None:  # already reported
                    continue
                entries.append(entry[0])
                dropped.extend(entry[1])
                positions[field.name].append(index)
            kept[field.name] = tuple(entries)
            continue
        made = _structure_without_mistakes(data[key], hints[field.name], key)
        if made is not None:
            kept[field.name] = made[0]
            dropped.extend(made[1])
    return Config(**kept), positions, dropped


_NEEDED = frozenset({"name", "toolset", "include", "exclude"})
"""Keys that other keys are read with: without its ``name``, a tool or transformer would
take a default one that may clash with another's; without its ``toolset``, a tool_call's
``tool`` would be looked up among the plain tools; without its ``include`` or ``exclude``,
a toolset would offer tools the config left out, whose names may clash with others'."""


def _structure_without_mistakes(raw: Any, kind: Any, path: str) -> tuple[Any, list[str]] | None:
    """`raw` structured as `kind`, else without the keys its mistakes are in (with their
    paths), when those keys may be left out; None when it cannot be structured.

    A key is never left out when it is unknown (a misspelt key may be the one meant) or
    one of `_NEEDED`, so that what the rest reports is not a consequence of the mistake.
    """
    try:
        return _converter.structure(raw, kind), []
    except Exception as exc:
        failed = exc
    if not isinstance(raw, dict) or _has_unknown_keys(failed):
        return None
    try:
        pruned = copy.deepcopy(raw)
    except Exception:  # a value built in Python that cannot be copied (a module, a lock)
        return None
    dropped: list[str] = []
    # A key holding a list is left out whole (`deny[1]` leaves out `deny`).
    wrong = {re.split(r"\[\d+\]", where, maxsplit=1)[0] for where, _ in _problems(failed, "")}
    for where in sorted(wrong):
        keys = where.split(".")
        node: Any = pruned
        for step in keys[:-1]:
            node = node.get(step) if isinstance(node, dict) else None
        if keys[-1] in _NEEDED or not isinstance(node, dict) or keys[-1] not in node:
            return None
        del node[keys[-1]]
        dropped.append(_join(path, ".".join(keys)))
    try:
        return _converter.structure(pruned, kind), dropped
    except Exception:
        return None


def _has_unknown_keys(exc: BaseException) -> bool:
    if isinstance(exc, ForbiddenExtraKeysError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_has_unknown_keys(each) for each in exc.exceptions)
    return False


def _related(path: str, dropped: Iterable[str]) -> bool:
    """Whether `path` is a dropped key, inside one, or holds one."""
    return any(path == each or _inside(path, each) or _inside(each, path) for each in dropped)


def _inside(path: str, holder: str) -> bool:
    return path.startswith((f"{holder}.", f"{holder}["))


def _build(
    config: Config,
    positions: Mapping[str, list[int]],
    env: Env,
    data: Mapping[str, Any],
    model: Model | None = None,
) -> tuple[dict[str, Any], list[_Problem], list[_Cause]]:
    """Build every entry; the keyword arguments of `Pipeline`, the problems met and what
    the config's own code raised under them (`_causes`).

    The tools are built first: entries that name a tool (``tool_call``, a tool hook's
    ``match``) are checked against them. With `model`, the config's model is not built (its
    API key is not needed): `model` answers instead.
    """
    problems: list[_Problem] = []
    causes: list[_Cause] = []

    def attempt(path: str, build: Callable[[Env], Any]) -> Any:
        try:
            return build(env)
        except* Invalid as group:
            for exc in _leaves(group):
                where = _join(path, exc.key) if exc.key else path
                problems.append((where, str(exc)))
                if exc.__cause__ is not None:
                    causes.append((where, exc.__cause__))
        except* ConfigError as group:
            problems.extend((path, str(exc)) for exc in _leaves(group))
        return None

    def build_list(stage: str) -> list[Any]:
        entries = getattr(config, stage)
        where = positions.get(stage, range(len(entries)))
        built[stage] = [
            attempt(f"{stage}[{index}]", entry.build)
            for index, entry in zip(where, entries, strict=True)
        ]
        return list(zip(where, built[stage], strict=True))

    built: dict[str, Any] = {}
    # The turn's model first: entries that use it by default (a running summary) get it.
    if model is not None:
        built["model"] = model
    elif config.model is not None:
        built["model"] = attempt("model", config.model.build)
    else:
        built["model"] = model_from_string("scripted")
    # A model that failed is reported at `model`; the scripted one stands in for it, so
    # that what uses it is still checked (the pipeline is not built).
    turn_model = built["model"]
    env = attrs.evolve(
        env, model=model_from_string("scripted") if turn_model is None else turn_model
    )
    tools = [(index, made) for index, made in build_list("tools") if made is not None]
    named_toolsets = [(index, made) for index, made in build_list("toolsets") if made is not None]
    toolsets = [made for _, made in named_toolsets]
    grouped = {
        made.name: made
        for each in toolsets
        if isinstance(each, LocalToolset)
        for made in each.final_tools()
    }
    env = attrs.evolve(
        env,
        tools={made.name: made for _, made in tools} | grouped,
        declared=frozenset(made.name for _, made in tools)
        | frozenset(grouped)
        | _unbuilt_tools(data, {index for index, _ in tools}),
        remote=frozenset(each.name for each in toolsets if isinstance(each, MCPToolset)),
        local={
            each.name: tuple(
                made.name
                for made in each.tools
                if (each.include is None or made.name in each.include)
                and made.name not in (each.exclude or ())
            )
            for each in toolsets
            if isinstance(each, LocalToolset)
        },
    )
    problems.extend(
        _same_names(
            "tools",
            tools,
            'the model calls tools by name — give one another name (name = "...")',
        )
    )
    problems.extend(
        _same_names(
            "toolsets",
            named_toolsets,
            "its tools' final names are built from it — give one another name",
        )
    )
    problems.extend(_colliding_tools(tools, named_toolsets))
    for stage in STAGE_LISTS:
        if stage not in ("tools", "toolsets"):
            build_list(stage)
    problems.extend(_second_summaries(positions.get("post", range(len(config.post))), config.post))
    problems.extend(
        _same_names(
            "transformers",
            zip(
                positions.get("transformers", range(len(config.transformers))),
                built["transformers"],
                strict=True,
            ),
            "a transformer's name keys its annotations in Reply.annotations and names it in"
            ' errors — give one another name with its `name` key (name = "...")',
        )
    )
    if config.budget is not None:
        built["budget"] = attempt("budget", config.budget.build)
    for key in ("tokenizer", "compact"):
        ref = getattr(config, key)
        if ref is not None:
            built[key] = ref.target
    if "tokenizer" in built:
        # Pipeline probes the tokenizer when it is built, but its error has no config path:
        # probed here first, a tokenizer that fails is a problem at `tokenizer`.
        try:
            Pipeline(model=model_from_string("scripted"), tokenizer=built["tokenizer"])
        except ConfigError as exc:
            problems.append(("tokenizer", str(exc)))
            del built["tokenizer"]
    if config.compact is not None and "budget" not in data:
        # Pipeline refuses this too, but without the path; a budget given but invalid is
        # reported at budget already.
        problems.append(
            (
                "compact",
                "needs a budget: compaction targets budget.context_tokens -"
                " budget.injection_reserve — add budget = { context_tokens = ...,"
                " injection_reserve = ... }",
            )
        )
    return built, problems, causes


def _causes(exc: BaseException, path: str) -> Iterator[_Cause]:
    """What the config's own code raised (a module failing to import, a factory), under
    the problems in a structuring failure, with the path of each: the cause of the
    `ConfigError`, whose traceback (``--debug``) shows where in that code it happened."""
    if isinstance(exc, ClassValidationError):
        noted, others = exc.group_exceptions()
        for error, note in noted:
            yield from _causes(error, _join(path, _key_of(exc.cl, note.name)))
        for error in others:
            yield from _causes(error, path)
    elif isinstance(exc, IterableValidationError):
        for error, inote in exc.group_exceptions()[0]:
            yield from _causes(error, _join(path, inote.index))
    elif isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _causes(inner, path)
    elif isinstance(exc, Invalid) and exc.__cause__ is not None:
        yield (_join(path, exc.key) if exc.key else path), exc.__cause__


def _noted(data: Any, causes: list[_Cause]) -> list[BaseException]:
    """Each distinct cause once, in file order, with a note naming the path of each problem
    it caused: several are shown as one group, whose members would otherwise say nothing of
    where in the file they belong. (One module failing to import is named by each ref to it,
    with one cause. An exception the config's code keeps and raises again in a later load
    already has its note.)"""
    distinct: dict[int, BaseException] = {}
    for path, cause in sorted(causes, key=lambda pair: _order(data, pair[0])):
        distinct.setdefault(id(cause), cause)
        note = f"the problem at {path}"
        if note not in getattr(cause, "__notes__", ()):
            cause.add_note(note)
    return list(distinct.values())


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[Any]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _same_names(stage: str, built: Iterable[tuple[int, Any]], why: str) -> Iterator[_Problem]:
    """A problem for each entry of `stage` named as an earlier one."""
    names: dict[str, int] = {}
    for index, made in built:
        name = getattr(made, "name", None)
        if not isinstance(name, str):
            continue
        if name in names:
            yield (
                f"{stage}[{index}].name",
                f"{json.dumps(name)} is also the name of {stage}[{names[name]}]; {why}",
            )
        else:
            names[name] = index


def _second_summaries(where: Iterable[int], entries: Iterable[Any]) -> Iterator[_Problem]:
    """A problem at each running summary after the first: each would fold the same turns
    into a summary of its own, so the log would get two of each (and two model calls)."""
    first: int | None = None
    for index, entry in zip(where, entries, strict=True):
        if not isinstance(entry, RunningSummary):
            continue
        if first is None:
            first = index
            continue
        yield (
            f"post[{index}]",
            f"a second running_summary (the first is post[{first}]): both would summarize"
            " the same turns, writing two summaries of them into the log — keep one entry",
        )


def _colliding_tools(
    tools: Iterable[tuple[int, Tool]], toolsets: Iterable[tuple[int, Any]]
) -> Iterator[_Problem]:
    """A problem at each local toolset offering a tool under a final name already taken (by
    a ``[[tools]]`` tool or an earlier toolset's); the Pipeline would refuse it at no path."""
    taken = {made.name: f"tools[{index}]" for index, made in tools}
    named: set[str] = set()
    for index, each in toolsets:
        if each.name in named or not isinstance(each, LocalToolset):
            # A second toolset of one name is reported as such; an MCP server's tools are
            # known, and checked, once it is connected.
            continue
        named.add(each.name)
        for made in each.final_tools():
            if made.name in taken:
                yield (
                    f"toolsets[{index}].name",
                    f"toolset {json.dumps(each.name)} offers a tool as {json.dumps(made.name)},"
                    f" the name of a tool of {taken[made.name]}; the model calls tools by name"
                    " — rename the toolset, or exclude the tool (exclude = [...])",
                )
            else:
                taken[made.name] = f"toolsets[{index}]"


def _unbuilt_tools(data: Mapping[str, Any], built: set[int]) -> frozenset[str]:
    """The names of the tools the file declares that did not build (already reported).

    A tool's name is its ``name``, else the name of what its ref names (as `pipeline.tool`
    gives it), else what follows the ref's colon.
    """
    entries = data.get("tools")
    names: set[str] = set()
    for index, entry in enumerate(entries if isinstance(entries, list) else ()):
        if index in built or not isinstance(entry, dict):
            continue
        name, ref = entry.get("name"), entry.get("ref")
        if isinstance(name, str):
            names.add(name)
        elif isinstance(ref, str):
            names.add(_tool_name(ref))
    return frozenset(names)


def _tool_name(ref: str) -> str:
    attribute = ref.rpartition(":")[2].rpartition(".")[2]
    try:
        target = ToolRef.resolve(ref).target
    except Invalid:  # already reported
        return attribute
    name = target.name if isinstance(target, Tool) else getattr(target, "__name__", None)
    return name if isinstance(name, str) else attribute


def _resolve(
    data: Any,
    source: str,
    environ: Mapping[str, str] | None,
    offline: bool = False,
    model: Model | None = None,
    folder: str | None = None,
) -> _Loaded:
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a table of settings at the top level, got {shown(data)}",
            source=source,
            problems=(("", f"expected a table of settings at the top level, got {shown(data)}"),),
        )
    token = FAILED.set({})
    try:
        return _resolve_checked(data, source, environ, offline, model, folder)
    except RecursionError:
        raise _too_deep(source) from None
    finally:
        FAILED.reset(token)


def _resolve_checked(
    data: dict[str, Any],
    source: str,
    environ: Mapping[str, str] | None,
    offline: bool,
    model: Model | None,
    folder: str | None,
) -> _Loaded:
    problems: list[_Problem] = []
    positions: dict[str, list[int]] = {}
    try:
        config = _converter.structure(data, Config)
    except Exception as exc:
        problems.extend(_problems(exc, ""))
        causes = list(_causes(exc, ""))
        config, positions, dropped = _salvage(data)
    else:
        causes, dropped = [], []
    env = Env(os.environ if environ is None else environ, offline=offline, folder=folder)
    built, more, raised = _build(config, positions, env, data, model)
    causes.extend(raised)
    problems.extend(problem for problem in more if not _related(problem[0], dropped))
    if not problems:
        try:
            pipeline = Pipeline(
                system=config.system,
                max_regenerations=config.max_regenerations,
                hold_until_accepted=config.hold_until_accepted,
                max_steps=config.max_steps,
                tool_concurrency=config.tool_concurrency,
                **built,
            )
        except ConfigError as exc:
            problems.append(("", str(exc)))
        else:
            return _Loaded(source, config, pipeline)
    problems.sort(key=lambda problem: _order(data, problem[0]))
    error = _error(source, problems)
    distinct = _noted(data, causes)
    if len(distinct) == 1:
        raise error from distinct[0]
    if distinct:
        raise error from BaseExceptionGroup("what the config's own code raised", distinct)
    raise error


def _error(source: str, problems: list[_Problem]) -> ConfigError:
    """The error listing `problems`, one line each: a line break in a file's name, a key or
    a message is escaped, so that no line of it passes for another problem or error."""
    lines = [one_line(f"{path}: {message}" if path else message) for path, message in problems]
    shown = one_line(source)
    if len(lines) == 1:
        message = f"{shown}: {lines[0]}"
    else:
        message = "\n  ".join([f"{shown}: {len(lines)} problems", *lines])
    return ConfigError(message, source=source, problems=tuple(problems))


# -- reading files ----------------------------------------------------------------------------


def _read(path: Path) -> Any:
    source = str(path)
    suffix = path.suffix.lower()
    if path.is_dir():
        raise ConfigError(
            f"{source}: is a directory, not a config file — pass the .toml or .json file in it",
            source=source,
        )
    if suffix not in (".toml", ".json"):
        raise ConfigError(
            f"{source}: unknown config format {suffix or '(no extension)'!r} — expected a"
            " .toml or .json file",
            source=source,
        )
    try:
        text = _utf8(path.read_bytes(), source)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file", source=source) from None
    except IsADirectoryError:
        raise ConfigError(
            f"{source}: is a directory, not a config file — pass the .toml or .json file in it",
            source=source,
        ) from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it: {exc}", source=source) from exc
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        data = json.loads(text, object_pairs_hook=_no_repeated_keys)
        repeated = _first_repeated(data, "")
        halves = [] if repeated else list(_lone_surrogates(data, ""))
        if repeated is None and not halves:
            return data
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: TOML syntax error: {exc}", source=source) from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: JSON syntax error: {exc.msg} (at line {exc.lineno}, column {exc.colno})",
            source=source,
        ) from exc
    except RecursionError:
        raise _too_deep(source) from None
    except ValueError as exc:
        # Python reads no integer of more than 4300 digits (sys.get_int_max_str_digits);
        # both parsers let its ValueError out, which named neither the file nor the cause.
        message = (
            f"a number in it is too long to read ({str(exc).partition(';')[0]}) — no setting"
            " takes a number that long; check what wrote the file"
        )
        raise _error(source, [("", message)]) from exc
    if repeated is None:
        raise _error(source, halves)
    where, key = repeated
    message = (
        f"the key {json.dumps(key)} appears twice in one object — JSON would keep only the"
        " last; write it once (TOML refuses this too)"
    )
    raise _error(source, [(where, message)])


def _utf8(raw: bytes, source: str) -> str:
    """A config file's text, which must be UTF-8; a byte order mark at its start, as some
    Windows editors write, is dropped rather than read as a stray character at line 1,
    column 1. Other bytes are a `ConfigError` saying where the first bad byte stands."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(
            f"{source}: is UTF-16 text (it starts with a UTF-16 byte order mark), not UTF-8"
            " — save it as UTF-8",
            source=source,
        )
    body = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The bytes before the bad one decode, so its column counts characters, as the
        # TOML and JSON parsers' columns do.
        start = body.rfind(b"\n", 0, exc.start) + 1
        line = body.count(b"\n", 0, exc.start) + 1
        column = len(body[start : exc.start].decode("utf-8")) + 1
        where = f"line {line}, column {column} (byte {len(raw) - len(body) + exc.start})"
        raise ConfigError(
            f"{source}: is not UTF-8 text: the byte 0x{body[exc.start]:02x} at {where} is"
            f" not valid UTF-8 ({exc.reason}) — a config file must be UTF-8: save it as UTF-8",
            source=source,
        ) from None


class _Repeats(dict[str, Any]):
    """A JSON object that gives a key twice; `repeated` is the first such key."""

    repeated = ""


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, marked when it gives a key twice (the parser keeps the last).

    Marked rather than refused here: an object is built before the one holding it, so only
    the whole document can tell where it stands (`_first_repeated`).
    """
    table = dict(pairs)
    if len(table) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                marked = _Repeats(table)
                marked.repeated = key
                return marked
            seen.add(key)
    return table


def _first_repeated(value: Any, path: str) -> tuple[str, str] | None:
    """The path of a key given twice in `value` (outer objects first), and the key."""
    if isinstance(value, _Repeats):
        return _join(path, value.repeated), value.repeated
    items: Iterable[tuple[str | int, Any]] = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, item in items:
        found = _first_repeated(item, _join(path, key))
        if found is not None:
            return found
    return None


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _lone_surrogates(value: Any, path: str) -> Iterator[_Problem]:
    """A problem for each string (or key) of a JSON document holding half a surrogate pair.

    JSON escapes a character beyond U+FFFF as two ``\\u`` escapes, and a program that cut
    a string between them (JavaScript slices UTF-16) writes one alone. Python reads it as
    a lone surrogate, which no model request, log or strict terminal can encode.
    """
    items: Iterable[tuple[str | int, Any]] = ()
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found is not None:
            escape = f"\\u{ord(found.group()):04x}"
            yield (
                path,
                f"{escape} is half of a surrogate pair, not a character (JSON writes a"
                " character beyond U+FFFF as two \\u escapes, high then low); check what"
                " wrote the file",
            )
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, item in items:
        if isinstance(key, str):
            yield from _lone_surrogates(key, _join(path, key))
        yield from _lone_surrogates(item, _join(path, key))


def _too_deep(source: str) -> ConfigError:
    # The parsers (and the checks after them) recurse once per level of nesting; a config
    # nested hundreds deep is a mistake or an attack, never a pipeline.
    message = (
        "nested too deeply to read (hundreds of tables or lists inside each other) — a"
        " config's values nest a few levels at most; check what wrote the file"
    )
    return _error(source, [("", message)])


def _load(
    path: str | os.PathLike[str],
    environ: Mapping[str, str] | None = None,
    *,
    offline: bool = False,
    model: Model | None = None,
) -> _Loaded:
    """Read, check and build the config at `path` (see `load_pipeline`); `offline` lets a
    missing API key or environment variable pass (``turnplug check --offline``); `model`
    replaces the config's, which is then not built (``--model``)."""
    path = Path(path)
    data = _read(path)
    # References resolve next to the config file first, as a script's imports resolve next
    # to the script: `ref = "assistant_hooks:search"` finds assistant_hooks.py beside it.
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    token = FOLDER.set(directory)
    try:
        return _resolve(data, str(path), environ, offline, model, directory)
    finally:
        FOLDER.reset(token)


def load_pipeline(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Pipeline:
    """The pipeline a TOML (``.toml``) or JSON (``.json``) config file declares.

    The file's directory is put at the front of ``sys.path`` (as Python does for a script),
    so ``ref = "my_hooks:search"`` finds ``my_hooks.py`` next to the file. Without a
    ``[model]`` table the pipeline uses the offline scripted model.

    Args:
        path: The config file.
        environ: Where API keys are read; defaults to ``os.environ``.

    Raises:
        ConfigError: The file is missing or malformed, or any value in it is wrong. The
            message lists every problem, each with the file name and its path
            (``pre[2].ref: ...``); ``.problems`` holds them as ``(path, message)`` pairs.
    """
    return _load(path, environ).pipeline


def pipeline_from_dict(
    data: Mapping[str, Any],
    *,
    source: str = "<dict>",
    environ: Mapping[str, str] | None = None,
) -> Pipeline:
    """The pipeline a config already read into a dict declares (see `load_pipeline`).

    Args:
        data: The config, as `tomllib` or `json` would read it.
        source: The name problems are reported under.
        environ: Where API keys are read; defaults to ``os.environ``.

    Raises:
        ConfigError: Any value is wrong; the message lists every problem with its path.
    """
    return _resolve(dict(data) if isinstance(data, Mapping) else data, source, environ).pipeline


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the config format, for editors and other validators.

    It is written from the same definitions the loader checks against. What only loading
    can check (that a reference imports, that a regex compiles, that a key is set) is
    described in the schema but not enforced by it.
    """
    return schema_of(Config, TAGGED)
