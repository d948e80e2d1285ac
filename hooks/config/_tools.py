"""The entries that build tools and tool hooks."""

import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar, TypeAlias, final

import attrs

from pipeline import (
    ConfigError,
    Hook,
    Tool,
    Toolset,
    mcp_toolset,
    tool,
    toolset,
)

from ._entry import Env, HookEntry, doc, raise_all
from ._types import (
    AfterToolRef,
    BeforeToolRef,
    Invalid,
    Seconds,
    StrMap,
    Text,
    ToolMatch,
    ToolName,
    ToolRef,
)

# -- tools and tool hooks ---------------------------------------------------------------------


@final
@attrs.frozen(kw_only=True)
class PythonTool:
    """A typed function the model may call (`pipeline.tool`)."""

    KIND: ClassVar[str] = "python"
    ref: ToolRef = attrs.field(
        metadata=doc("The function (or a pipeline.Tool), as 'module:attribute'.")
    )
    name: ToolName | None = attrs.field(
        default=None, metadata=doc("The name the model calls it by; the function's by default.")
    )
    description: Text | None = attrs.field(
        default=None, metadata=doc("What it does, for the model; the docstring by default.")
    )

    def build(self, env: Env) -> Tool:
        target = self.ref.target
        try:
            if isinstance(target, Tool):  # already described: rename or redescribe it only
                if self.name is None and self.description is None:
                    return target
                return tool(
                    target.fn,
                    name=self.name or target.name,
                    description=self.description or target.description,
                )
            return tool(target, name=self.name, description=self.description)
        except ConfigError as exc:  # a signature the model cannot be told about
            raise Invalid(str(exc), key="ref") from None


ToolEntry: TypeAlias = PythonTool
"""The kinds the ``tools`` list accepts."""


# -- toolsets ---------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(values: Mapping[str, str] | None, key: str, env: Env) -> dict[str, str] | None:
    """`values` with each ``${VARIABLE}`` replaced from the environment (secrets stay there).

    A variable that is not set is a problem naming the variable, never its value; with
    ``turnplug check --offline`` it is left empty.
    """
    if values is None:
        return None
    missing: list[str] = []

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        value = env.environ.get(name)
        if value is None:
            missing.append(name)
            return ""
        return value

    expanded = {name: _VARIABLE.sub(lookup, value) for name, value in values.items()}
    if missing and not env.offline:
        names = sorted(set(missing))
        which = (
            f"variable {names[0]} is not set — export it"
            if len(names) == 1
            else f"variables {', '.join(names)} are not set — export them"
        )
        raise Invalid(
            f"the environment {which} before starting (values are read from the"
            " environment, never from the file)",
            key=key,
        )
    return expanded


def _beside(path: str | None, env: Env) -> str | None:
    """A path from the config, relative to the config file's directory as `ref` is."""
    if path is None or env.folder is None or os.path.isabs(path):
        return path
    return os.path.join(env.folder, path)


@final
@attrs.frozen(kw_only=True)
class MCPToolsetEntry:
    """An MCP server's tools (`pipeline.mcp_toolset`), offered as ``<name>_<tool>``."""

    KIND: ClassVar[str] = "mcp"
    name: Text = attrs.field(metadata=doc("The toolset's name, the prefix of its tools' names."))
    command: Text | None = attrs.field(
        default=None, metadata=doc("The program that runs the server over stdio.")
    )
    args: tuple[str, ...] = attrs.field(default=(), metadata=doc("The program's arguments."))
    env: StrMap | None = attrs.field(
        default=None,
        metadata=doc("Environment variables for the server; ${VARIABLE} reads one of yours."),
    )
    cwd: Text | None = attrs.field(
        default=None,
        metadata=doc("The server's working directory; a relative one is the config file's."),
    )
    url: Text | None = attrs.field(
        default=None, metadata=doc("The server's streamable HTTP endpoint (instead of command).")
    )
    headers: StrMap | None = attrs.field(
        default=None,
        metadata=doc("HTTP headers for every request; ${VARIABLE} reads one of yours."),
    )
    timeout: Seconds | None = attrs.field(
        default=None, metadata=doc("Seconds for each call (30 by default).")
    )
    connect_timeout: Seconds | None = attrs.field(
        default=None, metadata=doc("Seconds to start, initialize and list tools (60 by default).")
    )
    include: tuple[str, ...] | None = attrs.field(
        default=None, metadata=doc("Only these tools (the server's names).")
    )
    exclude: tuple[str, ...] | None = attrs.field(
        default=None, metadata=doc("Not these tools (the server's names).")
    )

    def build(self, env: Env) -> Toolset:
        if self.command is None and self.url is None:
            raise Invalid("required: one of command or url", key="command")
        if self.command is not None and self.url is not None:
            raise Invalid("command and url cannot be given together: keep one of them", key="url")
        options = {
            key: getattr(self, key)
            for key in ("timeout", "connect_timeout")
            if getattr(self, key) is not None
        }
        try:
            return mcp_toolset(
                self.name,
                command=self.command,
                args=self.args,
                env=_expand(self.env, "env", env),
                cwd=_beside(self.cwd, env),
                url=self.url,
                headers=_expand(self.headers, "headers", env),
                include=self.include,
                exclude=self.exclude,
                **options,
            )
        except ConfigError as exc:
            # A problem of an argument (each bad header) is one at the key that gave it.
            raise_all([Invalid(text, key=key) for key, text in exc.problems])
            raise Invalid(_unowned(str(exc), f"mcp_toolset({self.name!r})")) from None


def _unowned(text: str, *owners: str) -> str:
    """An error of `pipeline.toolset` or `mcp_toolset` without the owner it starts with: the
    config's path says where instead. (Cut at an owner, not at the first ": ", which may be
    the toolset's name's or the message's own.)"""
    for owner in owners:
        if text.startswith(owner + ": "):
            return text[len(owner) + 2 :]
    return text


@final
@attrs.frozen(kw_only=True)
class PythonToolsetEntry:
    """Local tools grouped under a name (`pipeline.toolset`), offered as ``<name>_<tool>``."""

    KIND: ClassVar[str] = "python"
    name: Text = attrs.field(metadata=doc("The toolset's name, the prefix of its tools' names."))
    refs: tuple[ToolRef, ...] = attrs.field(
        metadata=doc("The tools' functions (or pipeline.Tools), as 'module:attribute'.")
    )
    include: tuple[str, ...] | None = attrs.field(default=None, metadata=doc("Only these tools."))
    exclude: tuple[str, ...] | None = attrs.field(default=None, metadata=doc("Not these tools."))

    def build(self, env: Env) -> Toolset:
        tools: list[Tool] = []
        for index, ref in enumerate(self.refs):
            target = ref.target
            try:
                tools.append(target if isinstance(target, Tool) else tool(target))
            except ConfigError as exc:  # a signature the model cannot be told about
                raise Invalid(str(exc), key=f"refs[{index}]") from None
        # Checked here, not left to `toolset`, so that the problem has the path of its key.
        names = [made.name for made in tools]
        problems = [
            Invalid(
                f"a second tool named {name!r} (refs[{names.index(name)}] is the first) — give"
                " one of them another name: pipeline.tool(fn, name=...)",
                key=f"refs[{index}]",
            )
            for index, name in enumerate(names)
            if name in names[:index]
        ]
        for key in ("include", "exclude"):
            unknown = [name for name in getattr(self, key) or () if name not in names]
            if unknown:
                problems.append(
                    Invalid(
                        f"names tools it does not have: {unknown}; its tools are"
                        f" {list(dict.fromkeys(names))}",
                        key=key,
                    )
                )
        raise_all(problems)
        try:
            return toolset(self.name, tools, include=self.include, exclude=self.exclude)
        except ConfigError as exc:
            raise Invalid(
                _unowned(str(exc), f"toolset({self.name!r})", f"toolset {self.name!r}")
            ) from None


ToolsetEntry: TypeAlias = MCPToolsetEntry | PythonToolsetEntry
"""The kinds the ``toolsets`` list accepts."""


@attrs.frozen(kw_only=True)
class ToolHookEntry(HookEntry):
    """What the entries of ``before_tool`` and ``after_tool`` share: ``match``."""

    match: ToolMatch | None = attrs.field(
        default=None,
        metadata=doc(
            "The tools it applies to: a tool's name, or { regex = '...' } matching the whole"
            " name; every tool by default."
        ),
    )


def match_option(match: ToolMatch | None, env: Env) -> dict[str, Any]:
    """The ``match=`` option of a tool hook entry, for `Pipeline` to take as keywords.

    A tool named must be declared, or may be a tool of an MCP toolset (known only once the
    server is connected); a regex is taken as it is.
    """
    if match is None:
        return {}
    value = match.value
    if isinstance(value, str) and not env.known(value):
        raise env.unknown_tool(value, "match")
    return {"match": value}


@final
@attrs.frozen(kw_only=True)
class BeforeTool(ToolHookEntry):
    """A hook run before each tool call it matches: ``fn(call, turn)``."""

    KIND: ClassVar[str] = "python"
    ref: BeforeToolRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, **match_option(self.match, env))


@final
@attrs.frozen(kw_only=True)
class AfterTool(ToolHookEntry):
    """A hook run after each tool call it matches: ``fn(call, result, turn)``."""

    KIND: ClassVar[str] = "python"
    ref: AfterToolRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, **match_option(self.match, env))
