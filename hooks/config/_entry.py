"""What every config entry shares: the Env its builders get, the problem helpers, and
`HookEntry`, the keys every hook entry accepts.

The entries themselves live by what they build: `_hooks` (hook entries and guardrails),
`_transformers`, `_models` and `_tools`; `_file` holds `Config`, the whole file.
"""

import difflib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, final

import attrs

from pipeline import (
    Hook,
    Model,
    Tool,
    hook,
    toolset_tool_name,
)

from ._types import (
    Invalid,
    Seconds,
    Text,
)


def doc(text: str, **more: Any) -> dict[str, Any]:
    """Field metadata: the description the schema and the docs show for a key."""
    return {"doc": text, **more}


@final
@attrs.frozen
class Env:
    """What builders may consult beyond their own entry.

    Attributes:
        environ: The environment variables (API keys are read from here).
        tools: The pipeline's tools by name, for entries that name one.
        declared: The names of every tool the file declares, also those that failed to
            build (already reported: an entry naming one is not reported again).
        remote: The names of the MCP toolsets, whose tools are known once connected.
        local: Each local toolset's name, and the names of the tools it offers (their own,
            without the toolset's prefix).
        offline: Checking without the environment's secrets (``turnplug check --offline``):
            a missing API key or variable is not a problem.
        folder: The config file's directory, against which relative paths in it resolve;
            None for a config given as data (they resolve against the working directory).
        model: The turn's model (the config's, the one replacing it, or the offline scripted
            one), for entries that use it by default.
    """

    environ: Mapping[str, str]
    tools: Mapping[str, Tool] = attrs.field(factory=dict)
    declared: frozenset[str] = frozenset()
    remote: frozenset[str] = frozenset()
    local: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    offline: bool = False
    folder: str | None = None
    model: Model | None = None

    def known(self, name: str) -> bool:
        """Whether a tool of this name is declared, or may be one of an MCP toolset's."""
        return name in self.declared or any(
            name.startswith(toolset_tool_name(each, "")) for each in self.remote
        )

    def unknown_tool(self, name: str, key: str) -> Invalid:
        """The problem of an entry naming a tool the file does not declare."""
        close = difflib.get_close_matches(name, self.declared, n=1)
        hint = f" — did you mean {json.dumps(close[0])}?" if close else ""
        declared = ", ".join(sorted(self.declared)) or "none"
        return Invalid(
            f"no tool named {json.dumps(name)}{hint}; the tools declared in [[tools]] and"
            f" [[toolsets]]: {declared}",
            key=key,
        )


def raise_all(problems: list[Invalid]) -> None:
    """Raise the problems a build found: one as it is, several together."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ExceptionGroup("problems", problems)


def within(key: str, exc: Invalid) -> Invalid:
    """`exc`, found in the value of `key`, as a problem of the entry holding that value.

    It keeps `exc`'s cause (what the user's code raised), which ``--debug`` shows.
    """
    problem = Invalid(str(exc), key=f"{key}.{exc.key}" if exc.key else key)
    problem.__cause__ = exc.__cause__
    return problem


def required_with(entry: Any) -> list[Invalid]:
    """A problem for each key ``entry.REQUIRES`` asks for that is missing."""
    needs: Mapping[str, tuple[str, ...]] = entry.REQUIRES
    return [
        Invalid(f"required when {key} is given", key=needed)
        for key, keys in needs.items()
        if getattr(entry, key) is not None
        for needed in keys
        if getattr(entry, needed) is None
    ]


def exactly_one(entry: Any) -> str:
    """The one key of ``entry.ONE_OF`` that `entry` sets; `Invalid` unless exactly one."""
    keys: tuple[str, ...] = entry.ONE_OF
    given = [key for key in keys if getattr(entry, key) is not None]
    if len(given) == 1:
        return given[0]
    if not given:
        raise Invalid(f"required: one of {', '.join(keys[:-1])} or {keys[-1]}")
    raise Invalid(
        f"{', '.join(given[:-1])} and {given[-1]} cannot be given together: keep one of them"
    )


# -- hook entries -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HookEntry:
    """The keys every hook entry accepts (`pipeline.hook`'s options); unset keys keep the
    kind's default."""

    name: Text | None = attrs.field(
        default=None, metadata=doc("Name in events, errors and the audit record.")
    )
    timeout: Seconds | None = attrs.field(
        default=None, metadata=doc("Seconds the hook may take before it fails (HookTimeout).")
    )
    on_error: Literal["halt", "skip"] | None = attrs.field(
        default=None,
        metadata=doc("'halt' fails the turn when the hook fails; 'skip' goes on without it."),
    )
    shadow: bool | None = attrs.field(
        default=None, metadata=doc("Run and record the hook's verdicts without enforcing them.")
    )
    durable: bool | None = attrs.field(
        default=None, metadata=doc("Whether what the hook injects joins the conversation log.")
    )

    def options(self) -> dict[str, Any]:
        """The common keys this entry sets (so that a kind's own defaults apply otherwise)."""
        keys = ("name", "timeout", "on_error", "shadow", "durable")
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}

    def wrap(self, fn: Callable[..., Any], name: str | None = None, **more: Any) -> Hook:
        """`fn` as a hook with this entry's options; `name` unless the entry names it."""
        options = self.options() | more
        if name is not None:
            options.setdefault("name", name)
        return hook(fn, **options)
