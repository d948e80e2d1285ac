"""The entries that build hooks: pre hooks, parallel groups, synthetic tool calls, session
hooks and post-stage guardrails."""

import difflib
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import ClassVar, Literal, TypeAlias, final

import attrs

from pipeline import (
    ConfigError,
    Cont,
    Hook,
    Parallel,
    cont,
    parallel,
    toolset_tool_name,
)
from turns import Text as TextPart
from turns import Turn

from .._guardrails import deny, guardrail, judge, max_length
from .._inject import retrieve
from .._redact import zero_width
from .._summary import running_summary
from .._tool_call import inject_tool_call
from ._entry import Env, HookEntry, doc, exactly_one, raise_all, required_with, within
from ._models import ModelSpec
from ._scrub import ScrubInput
from ._types import (
    Arguments,
    EndRef,
    GuardRef,
    HookRef,
    Hours,
    Invalid,
    Minutes,
    Positive,
    PostRef,
    SearchRef,
    Seconds,
    StartRef,
    Text,
)


@final
@attrs.frozen(kw_only=True)
class PythonHook(HookEntry):
    """A plain function of your own: ``fn(turn)``, sync or async."""

    KIND: ClassVar[str] = "python"
    ref: HookRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target)

    build_member = build


@final
@attrs.frozen(kw_only=True)
class PythonPost(HookEntry):
    """A post hook of your own: ``fn(turn)`` with ``turn.reply`` set."""

    KIND: ClassVar[str] = "python"
    ref: PostRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))
    background: bool = attrs.field(
        default=False,
        metadata=doc("Run after the turn is committed, without delaying it."),
    )

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, background=self.background)


@final
@attrs.frozen(kw_only=True)
class Static(HookEntry):
    """Fixed text injected into every turn (a house rule, a date format, ...)."""

    KIND: ClassVar[str] = "static"
    text: Text = attrs.field(metadata=doc("The text to inject."))

    def build(self, env: Env) -> Hook:
        text = self.text

        def static(turn: Turn) -> Cont[Turn]:
            return cont(turn.inject(text))

        return self.wrap(static, "static")

    def build_member(self, env: Env) -> Hook:
        parts = (TextPart(self.text),)

        def static(turn: Turn) -> tuple[TextPart, ...]:
            return parts

        return self.wrap(static, "static")


@final
@attrs.frozen(kw_only=True)
class Retrieve(HookEntry):
    """Passages a search of yours finds for the user's message (`hooks.retrieve`)."""

    KIND: ClassVar[str] = "retrieve"
    search: SearchRef = attrs.field(
        metadata=doc("The search, as 'module:attribute' of fn(query, k), sync or async.")
    )
    k: Positive = attrs.field(
        default=Positive(4), metadata=doc("How many passages to ask for and keep at most.")
    )

    def build_member(self, env: Env) -> Hook:
        return self.wrap(retrieve(self.search.target, k=self.k))


MemberEntry: TypeAlias = PythonHook | Static | Retrieve
"""The kinds a parallel group may hold."""


@final
@attrs.frozen(kw_only=True)
class ParallelGroup:
    """Members that run concurrently; their parts are added in declaration order."""

    KIND: ClassVar[str] = "parallel"
    hooks: tuple[MemberEntry, ...] = attrs.field(
        metadata=doc("The members: hook entries returning lists of parts.", min_items=1)
    )
    name: Text | None = attrs.field(default=None, metadata=doc("The group's name in events."))

    def build(self, env: Env) -> Parallel:
        if not self.hooks:
            raise Invalid("a parallel group needs at least one member", key="hooks")
        members: list[Hook] = []
        problems: list[Invalid] = []
        for index, member in enumerate(self.hooks):
            try:
                members.append(member.build_member(env))
            except Invalid as exc:
                problems.append(within(f"hooks[{index}]", exc))
        raise_all(problems)
        return parallel(*members, name=self.name)


@final
@attrs.frozen(kw_only=True)
class Ttl:
    """How long an injected tool result stays fresh; exactly one of the units."""

    KIND: ClassVar[str] = "ttl"
    ONE_OF: ClassVar[tuple[str, ...]] = ("seconds", "minutes", "hours")
    seconds: Seconds | None = attrs.field(
        default=None, metadata=doc("Fresh for this many seconds.")
    )
    minutes: Minutes | None = attrs.field(
        default=None, metadata=doc("Fresh for this many minutes.")
    )
    hours: Hours | None = attrs.field(default=None, metadata=doc("Fresh for this many hours."))

    def total(self) -> float:
        """The time to live, in seconds."""
        unit = exactly_one(self)
        value: float = getattr(self, unit)
        total = value * {"seconds": 1, "minutes": 60, "hours": 3600}[unit]
        if not math.isfinite(total):
            raise Invalid(
                f"expected a number of {unit} whose seconds a float can hold, got {value:g}",
                key=unit,
            )
        return total


@final
@attrs.frozen(kw_only=True)
class ToolCallEntry(HookEntry):
    """A synthetic tool call: runs a tool of ``[[tools]]`` and injects the call and its result.

    Durable by default, and fails open (``on_error = "skip"``), as `hooks.inject_tool_call`.
    """

    KIND: ClassVar[str] = "tool_call"
    tool: Text = attrs.field(
        metadata=doc(
            "A tool's name: verbatim, or within `toolset` (the final name is then"
            " <toolset>_<tool>, sanitized)."
        )
    )
    toolset: Text | None = attrs.field(
        default=None, metadata=doc("The [[toolsets]] entry the tool belongs to.")
    )
    arguments: Arguments | None = attrs.field(
        default=None, metadata=doc("The tool's arguments, checked against its schema.")
    )
    frequency: Literal["always", "if_changed"] = attrs.field(
        default="always",
        metadata=doc(
            "'always' injects every turn; 'if_changed' skips when the last injected result is"
            " the same."
        ),
    )
    refresh: Ttl | None = attrs.field(
        default=None,
        metadata=doc("{ kind = 'ttl', minutes = N }: skip while the last injection is fresher."),
    )

    def build(self, env: Env) -> Hook:
        problems: list[Invalid] = []
        ttl = None
        if self.refresh is not None:
            try:
                ttl = self.refresh.total()
            except Invalid as exc:
                problems.append(within("refresh", exc))
        name = self.tool if self.toolset is None else toolset_tool_name(self.toolset, self.tool)
        found = env.tools.get(name)
        offered = env.local.get(self.toolset) if self.toolset is not None else None
        if offered is not None and found is None:
            problems.append(_not_in_toolset(self.tool, str(self.toolset), offered))
        elif self.toolset is not None and found is None and self.toolset not in env.remote:
            problems.append(
                Invalid(
                    f"no toolset named {json.dumps(self.toolset)} in [[toolsets]]", key="toolset"
                )
            )
        elif found is None and not env.known(name):
            problems.append(env.unknown_tool(name, "tool"))
        if self.durable is False and (self.frequency == "if_changed" or self.refresh is not None):
            problems.append(
                Invalid(
                    "frequency = 'if_changed' and refresh look for the last pair in the"
                    " conversation log, which a transient pair (durable = false) never joins,"
                    " so they would never skip — remove durable = false, or them",
                    key="durable",
                )
            )
        else:
            try:
                made = inject_tool_call(
                    # A declared tool that failed to build is reported already: name it. An
                    # MCP toolset's tool is checked once its server is connected.
                    found if found is not None else name,
                    self.arguments,
                    frequency=self.frequency,
                    ttl=ttl,
                    durable=True if self.durable is None else self.durable,
                    name=self.name,
                )
            except ConfigError as exc:  # what the tool's schema refuses in the arguments
                problems.append(Invalid(str(exc), key="arguments"))
        raise_all(problems)
        return self.wrap(made)


def _not_in_toolset(tool: str, toolset: str, tools: tuple[str, ...]) -> Invalid:
    close = difflib.get_close_matches(tool, tools, n=1)
    hint = f" — did you mean {json.dumps(close[0])}?" if close else ""
    return Invalid(
        f"toolset {json.dumps(toolset)} has no tool named {json.dumps(tool)}{hint}; its tools:"
        f" {', '.join(tools) or 'none'}",
        key="tool",
    )


PreEntry: TypeAlias = PythonHook | Static | ParallelGroup | ToolCallEntry | ScrubInput
"""The kinds the ``pre`` list accepts."""


@final
@attrs.frozen(kw_only=True)
class SessionStart(HookEntry):
    """A function run when a session opens: ``fn(session_info) -> cont(scope)``."""

    KIND: ClassVar[str] = "python"
    ref: StartRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target)


@final
@attrs.frozen(kw_only=True)
class SessionEnd(HookEntry):
    """A function run whenever a session closes: ``fn(session_info, reason)``."""

    KIND: ClassVar[str] = "python"
    ref: EndRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target)


# -- guardrails (post) ------------------------------------------------------------------------


@final
@attrs.frozen(kw_only=True)
class Guardrail(HookEntry):
    """Reject replies in which a pattern is found, or that a check of yours refuses."""

    KIND: ClassVar[str] = "guardrail"
    ONE_OF: ClassVar[tuple[str, ...]] = ("deny", "check")
    REQUIRES: ClassVar[Mapping[str, tuple[str, ...]]] = {"deny": ("feedback",)}
    deny: tuple[re.Pattern[str], ...] | None = attrs.field(
        default=None,
        metadata=doc("Regexes searched in the reply; one found rejects it.", min_items=1),
    )
    check: GuardRef | None = attrs.field(
        default=None,
        metadata=doc("Or a check, 'module:attribute' of fn(text) -> True, False or feedback."),
    )
    feedback: Text | None = attrs.field(
        default=None,
        metadata=doc("What the model is told on a rejection (required with deny)."),
    )

    def build(self, env: Env) -> Hook:
        problems: list[Invalid] = []
        try:
            exactly_one(self)
        except Invalid as exc:
            problems.append(exc)
        if self.deny is not None:
            problems.extend(_deny_problems(self.deny))
        problems.extend(required_with(self))
        raise_all(problems)
        if self.deny is not None:
            assert self.feedback is not None
            return self.wrap(deny(*self.deny, feedback=self.feedback))
        assert self.check is not None
        return self.wrap(guardrail(self.check.target, feedback=self.feedback))


def _deny_problems(patterns: tuple[re.Pattern[str], ...]) -> Iterator[Invalid]:
    if not patterns:
        yield Invalid("deny needs at least one pattern", key="deny")
    for index, pattern in enumerate(patterns):
        if (why := zero_width(pattern, deny=True)) is not None:
            yield Invalid(f"{json.dumps(pattern.pattern)} {why}", key=f"deny[{index}]")


@final
@attrs.frozen(kw_only=True)
class MaxLength(HookEntry):
    """Reject replies longer than a number of characters (`hooks.max_length`)."""

    KIND: ClassVar[str] = "max_length"
    chars: Positive = attrs.field(metadata=doc("The longest reply accepted, in characters."))
    feedback: Text | None = attrs.field(
        default=None,
        metadata=doc("What the model is told; by default the reply's length and the limit."),
    )

    def build(self, env: Env) -> Hook:
        return self.wrap(max_length(self.chars, feedback=self.feedback))


@final
@attrs.frozen(kw_only=True)
class Judge(HookEntry):
    """A model of its own judges whether the reply follows a rule (`hooks.judge`)."""

    KIND: ClassVar[str] = "judge"
    model: ModelSpec = attrs.field(
        metadata=doc("The judging model: a table of the same keys as [model].")
    )
    instruction: Text = attrs.field(metadata=doc("The rule the reply must follow."))
    feedback: Text | None = attrs.field(
        default=None,
        metadata=doc("What the main model is told on a rejection; by default the judge's reason."),
    )

    def build(self, env: Env) -> Hook:
        try:
            model = self.model.build(env)
        except Invalid as exc:
            raise within("model", exc) from exc.__cause__
        return self.wrap(judge(model, self.instruction, feedback=self.feedback))


@final
@attrs.frozen(kw_only=True)
class RunningSummary(HookEntry):
    """A running summary written into the log every few turns (`hooks.running_summary`).

    A durable background post hook: it runs after the turn is committed, and its summary
    joins the log.
    """

    KIND: ClassVar[str] = "running_summary"
    FIXED: ClassVar[Mapping[str, bool]] = {"durable": True, "shadow": False}
    """Common keys this kind takes at one value only (or left out): the schema refuses the
    other value, as `build` does."""
    every: Positive = attrs.field(
        default=Positive(10), metadata=doc("Summarize after every this many turns.")
    )
    model: ModelSpec | None = attrs.field(
        default=None,
        metadata=doc(
            "The summarizing model: a table of the same keys as [model]; by default the turn's"
            " model."
        ),
    )

    def build(self, env: Env) -> Hook:
        problems: list[Invalid] = []
        if self.durable is False:
            problems.append(
                Invalid(
                    "a running summary is written into the conversation log, which a"
                    " transient one (durable = false) never joins, so no later turn would"
                    " read it — remove durable = false",
                    key="durable",
                )
            )
        if self.shadow:
            problems.append(
                Invalid(
                    "nothing a shadow hook (shadow = true) injects is committed, so the"
                    " summary would never join the log while its model is still called —"
                    " remove shadow = true",
                    key="shadow",
                )
            )
        model = env.model
        if self.model is not None:
            try:
                model = self.model.build(env)
            except Invalid as exc:
                problems.append(within("model", exc))
        raise_all(problems)
        assert model is not None  # the loader gives every build the turn's model
        return self.wrap(running_summary(model, every=self.every))


PostEntry: TypeAlias = PythonPost | Guardrail | MaxLength | Judge | RunningSummary
"""The kinds the ``post`` list accepts."""
