"""The entries of a config file: one frozen record per kind, each with its builder.

An entry record declares the keys its kind accepts (its attrs fields; their types are
checked by `hooks.config` when the file is loaded, and written into the JSON Schema by
`hooks._schema`) and `build`s the hook, group or transformer factory it stands for. The
lists of a config accept the kinds of their union (`PreEntry`, `MemberEntry`,
`TransformerEntry`, `PostEntry`); the model table is a union on ``provider``.

Adding a kind is local: one record here (with ``KIND`` and ``build``) and its name in the
union of each list it may stand in. A new list is a field of `Config`, its union in
`TAGGED` and its name in `STAGE_LISTS`. A record whose keys are alternatives names them in
``ONE_OF``, and one whose key needs others names them in ``REQUIRES`` (the schema says both
too); its `build` calls `exactly_one` and `required_with`. A build that finds several
problems raises them together (`raise_all`), so each is reported.
"""

import difflib
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Literal, TypeAlias, final

import attrs

from pipeline import (
    Budget,
    ConfigError,
    Cont,
    Hook,
    Model,
    ModelEvent,
    ModelRequest,
    Parallel,
    Tool,
    TransformerFactory,
    cont,
    hook,
    parallel,
    tool,
)
from pipeline.providers import AnthropicMessages, OpenAIChat, model_from_string
from pipeline.testing import ScriptedModel
from turns import Text as TextPart
from turns import Turn

from ._citations import citations
from ._config_types import (
    AfterToolRef,
    Arguments,
    BeforeToolRef,
    CompactRef,
    Count,
    EndRef,
    FactoryRef,
    GuardRef,
    HookRef,
    Invalid,
    PiiKind,
    Positive,
    ScriptReply,
    SearchRef,
    Seconds,
    StartRef,
    Temperature,
    Text,
    TokenizerRef,
    ToolMatch,
    ToolName,
    ToolRef,
)
from ._guardrails import deny, guardrail, judge, max_length
from ._inject import retrieve
from ._pii import KINDS as PII_KINDS
from ._pii import pii
from ._redact import redact
from ._tool_call import inject_tool_call


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
    """

    environ: Mapping[str, str]
    tools: Mapping[str, Tool] = attrs.field(factory=dict)
    declared: frozenset[str] = frozenset()

    def unknown_tool(self, name: str, key: str) -> Invalid:
        """The problem of an entry naming a tool the file does not declare."""
        close = difflib.get_close_matches(name, self.declared, n=1)
        hint = f" — did you mean {json.dumps(close[0])}?" if close else ""
        declared = ", ".join(sorted(self.declared)) or "none"
        return Invalid(
            f"no tool named {json.dumps(name)}{hint}; the tools declared in [[tools]]: {declared}",
            key=key,
        )


def raise_all(problems: list[Invalid]) -> None:
    """Raise the problems a build found: one as it is, several together."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ExceptionGroup("problems", problems)


def within(key: str, exc: Invalid) -> Invalid:
    """`exc`, found in the value of `key`, as a problem of the entry holding that value."""
    return Invalid(str(exc), key=f"{key}.{exc.key}" if exc.key else key)


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

    name: str | None = attrs.field(
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
    ref: HookRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))
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
    name: str | None = attrs.field(default=None, metadata=doc("The group's name in events."))

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
    minutes: Seconds | None = attrs.field(
        default=None, metadata=doc("Fresh for this many minutes.")
    )
    hours: Seconds | None = attrs.field(default=None, metadata=doc("Fresh for this many hours."))

    def total(self) -> float:
        """The time to live, in seconds."""
        unit = exactly_one(self)
        value: float = getattr(self, unit)
        return value * {"seconds": 1, "minutes": 60, "hours": 3600}[unit]


@final
@attrs.frozen(kw_only=True)
class ToolCallEntry(HookEntry):
    """A synthetic tool call: runs a tool of ``[[tools]]`` and injects the call and its result.

    Durable by default, and fails open (``on_error = "skip"``), as `hooks.inject_tool_call`.
    """

    KIND: ClassVar[str] = "tool_call"
    tool: Text = attrs.field(metadata=doc("The name of a tool declared in [[tools]]."))
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
        found = env.tools.get(self.tool)
        if found is None and self.tool not in env.declared:
            problems.append(env.unknown_tool(self.tool, "tool"))
        try:
            made = inject_tool_call(
                # A declared tool that failed to build is reported already: name it.
                found if found is not None else self.tool,
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


PreEntry: TypeAlias = PythonHook | Static | ParallelGroup | ToolCallEntry
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


# -- stream transformers ----------------------------------------------------------------------


@final
class _Named:
    """A transformer factory under the name its config entry gave it."""

    __slots__ = ("factory", "name")

    def __init__(self, factory: Callable[[], Any], name: str) -> None:
        self.factory = factory
        self.name = name

    def __call__(self) -> Any:
        return self.factory()

    def __repr__(self) -> str:
        return f"{self.name}={self.factory!r}"


@final
@attrs.frozen(kw_only=True)
class PythonTransformer:
    """A transformer factory of your own: ``fn()`` returning ``feed``/``flush``."""

    KIND: ClassVar[str] = "python"
    ref: FactoryRef = attrs.field(metadata=doc("The factory, as 'module:attribute'."))
    name: str | None = attrs.field(
        default=None, metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        factory = self.ref.target
        return _Named(factory, self.name) if self.name is not None else factory


@final
@attrs.frozen(kw_only=True)
class Redact:
    """Replace every match of the patterns while the reply streams (`hooks.redact`)."""

    KIND: ClassVar[str] = "redact"
    patterns: tuple[re.Pattern[str], ...] = attrs.field(
        metadata=doc("Regular expressions; a match is replaced.", min_items=1)
    )
    replacement: str = attrs.field(
        default="[REDACTED]", metadata=doc("The literal text put in place of each match.")
    )
    max_match: Positive = attrs.field(
        default=Positive(256), metadata=doc("The longest match redacted whatever the chunking.")
    )
    name: str = attrs.field(
        default="redact", metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        if not self.patterns:
            raise Invalid("redact needs at least one pattern", key="patterns")
        return redact(
            self.patterns, replacement=self.replacement, max_match=self.max_match, name=self.name
        )


def _named(factory: Any, name: str) -> TransformerFactory:
    return factory if factory.name == name else _Named(factory, name)


@final
@attrs.frozen(kw_only=True)
class Pii:
    """Redact personal data while the reply streams (`hooks.pii`)."""

    KIND: ClassVar[str] = "pii"
    kinds: tuple[PiiKind, ...] = attrs.field(
        default=tuple(PiiKind(kind) for kind in PII_KINDS),
        metadata=doc("The kinds of personal data to redact; by default all.", min_items=1),
    )
    replacement: str | None = attrs.field(
        default=None,
        metadata=doc(
            "The text put in place of every match; by default one naming the kind ([EMAIL],"
            " [CARD], ...)."
        ),
    )
    name: str = attrs.field(
        default="pii", metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        if not self.kinds:
            raise Invalid(f"choose at least one kind among {', '.join(PII_KINDS)}", key="kinds")
        return _named(pii(self.kinds, replacement=self.replacement), self.name)


@final
@attrs.frozen(kw_only=True)
class CitationsEntry:
    """Report the reply's ``[n]`` markers in ``Reply.annotations`` (`hooks.citations`)."""

    KIND: ClassVar[str] = "citations"
    name: str = attrs.field(
        default="citations", metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        return _named(citations(), self.name)


TransformerEntry: TypeAlias = PythonTransformer | Redact | Pii | CitationsEntry
"""The kinds the ``transformers`` list accepts."""


# -- the model --------------------------------------------------------------------------------


@final
class Shaped:
    """A model whose requests get default options the turn did not set.

    ``temperature`` and ``max_tokens`` of the ``[model]`` table are defaults for every
    request; a hook that shapes the request (``turn.with_request``) still wins.
    """

    __slots__ = ("defaults", "model")

    def __init__(self, model: Model, defaults: Mapping[str, Any]) -> None:
        self.model = model
        self.defaults = dict(defaults)

    def __repr__(self) -> str:
        given = ", ".join(f"{key}={value!r}" for key, value in self.defaults.items())
        return f"{self.model!r} with {given}"

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        options = request.options
        unset = {k: v for k, v in self.defaults.items() if getattr(options, k) is None}
        if unset:
            request = attrs.evolve(request, options=attrs.evolve(options, **unset))
        return self.model.stream(request)


def _shaped(model: Model, **defaults: Any) -> Model:
    given = {key: value for key, value in defaults.items() if value is not None}
    return Shaped(model, given) if given else model


def _key(env: Env, variable: str, provider: str) -> None:
    if variable and not env.environ.get(variable):
        raise Invalid(
            f"the environment variable {variable} is not set — export it with your {provider}"
            ' key, or name the variable that holds it (api_key_env = "" for a server that'
            " needs no key)",
            key="api_key_env",
        )


@final
@attrs.frozen(kw_only=True)
class ScriptedSpec:
    """The offline scripted model: each model call plays the next reply."""

    PROVIDER: ClassVar[str] = "scripted"
    replies: tuple[ScriptReply, ...] | None = attrs.field(
        default=None,
        metadata=doc(
            "One reply per model call: a string, or a list of the chunks it streams in."
            " Without it, a fixed greeting for every call."
        ),
    )

    def build(self, env: Env) -> Model:
        if self.replies is None:
            return model_from_string("scripted")
        return ScriptedModel([list(reply) for reply in self.replies])


_OPENAI_BASE = "https://api.openai.com/v1"
_ANTHROPIC_BASE = "https://api.anthropic.com"


@final
@attrs.frozen(kw_only=True)
class OpenAISpec:
    """An OpenAI Chat Completions model (OpenAI, OpenRouter, vLLM, Ollama, llama.cpp)."""

    PROVIDER: ClassVar[str] = "openai"
    name: Text = attrs.field(metadata=doc("The model name sent in each request."))
    base_url: str | None = attrs.field(
        default=None,
        metadata=doc(
            "The API root, version included; defaults to OPENAI_BASE_URL when set, else"
            f" {_OPENAI_BASE}."
        ),
    )
    api_key_env: str = attrs.field(
        default="OPENAI_API_KEY",
        metadata=doc('The environment variable holding the key; "" sends no key.'),
    )
    max_tokens: Positive | None = attrs.field(
        default=None, metadata=doc("The output token limit when a turn sets none.")
    )
    temperature: Temperature | None = attrs.field(
        default=None, metadata=doc("The sampling temperature when a turn sets none.")
    )
    timeout: Seconds | None = attrs.field(
        default=None, metadata=doc("The longest silence allowed between bytes, in seconds.")
    )

    def build(self, env: Env) -> Model:
        _key(env, self.api_key_env, "OpenAI")
        base_url = self.base_url or env.environ.get("OPENAI_BASE_URL") or _OPENAI_BASE
        extra: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        model = OpenAIChat(
            self.name,
            base_url=base_url,
            api_key=env.environ.get(self.api_key_env) if self.api_key_env else None,
            api_key_env=None,
            **extra,
        )
        return _shaped(model, max_tokens=self.max_tokens, temperature=self.temperature)


@final
@attrs.frozen(kw_only=True)
class AnthropicSpec:
    """An Anthropic Messages model."""

    PROVIDER: ClassVar[str] = "anthropic"
    name: Text = attrs.field(metadata=doc("The model name sent in each request."))
    base_url: str | None = attrs.field(
        default=None,
        metadata=doc(
            "The API root, without the version; defaults to ANTHROPIC_BASE_URL when set,"
            f" else {_ANTHROPIC_BASE}."
        ),
    )
    api_key_env: str = attrs.field(
        default="ANTHROPIC_API_KEY",
        metadata=doc('The environment variable holding the key; "" sends no key.'),
    )
    max_tokens: Positive = attrs.field(
        default=Positive(1024),
        metadata=doc("The output token limit when a turn sets none (the API requires one)."),
    )
    temperature: Temperature | None = attrs.field(
        default=None, metadata=doc("The sampling temperature when a turn sets none.")
    )
    timeout: Seconds | None = attrs.field(
        default=None, metadata=doc("The longest silence allowed between bytes, in seconds.")
    )

    def build(self, env: Env) -> Model:
        _key(env, self.api_key_env, "Anthropic")
        base_url = self.base_url or env.environ.get("ANTHROPIC_BASE_URL") or _ANTHROPIC_BASE
        extra: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        model = AnthropicMessages(
            self.name,
            base_url=base_url,
            api_key=env.environ.get(self.api_key_env) if self.api_key_env else None,
            api_key_env=None,
            max_tokens=self.max_tokens,
            **extra,
        )
        return _shaped(model, temperature=self.temperature)


ModelSpec: TypeAlias = ScriptedSpec | OpenAISpec | AnthropicSpec
"""The ``[model]`` table: a union on ``provider``."""


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
        if pattern.search("") is not None:
            yield Invalid(
                f"{json.dumps(pattern.pattern)} matches the empty string, so it would reject"
                " every reply — require at least one character",
                key=f"deny[{index}]",
            )


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
            raise within("model", exc) from None
        return self.wrap(judge(model, self.instruction, feedback=self.feedback))


PostEntry: TypeAlias = PythonPost | Guardrail | MaxLength | Judge
"""The kinds the ``post`` list accepts."""


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

    def matched(self, env: Env) -> dict[str, Any]:
        """The ``match=`` option; a tool named must be declared."""
        if self.match is None:
            return {}
        value = self.match.value
        if isinstance(value, str) and value not in env.declared:
            raise env.unknown_tool(value, "match")
        return {"match": value}


@final
@attrs.frozen(kw_only=True)
class BeforeTool(ToolHookEntry):
    """A hook run before each tool call it matches: ``fn(call, turn)``."""

    KIND: ClassVar[str] = "python"
    ref: BeforeToolRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, **self.matched(env))


@final
@attrs.frozen(kw_only=True)
class AfterTool(ToolHookEntry):
    """A hook run after each tool call it matches: ``fn(call, result, turn)``."""

    KIND: ClassVar[str] = "python"
    ref: AfterToolRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, **self.matched(env))


# -- the whole file ---------------------------------------------------------------------------


@final
@attrs.frozen(kw_only=True)
class BudgetSpec:
    """Token limits (`pipeline.Budget`)."""

    context_tokens: Positive = attrs.field(metadata=doc("The most the request may hold."))
    injection_reserve: Positive = attrs.field(
        metadata=doc("The most all of a turn's injections together may hold.")
    )

    def build(self, env: Env) -> Budget:
        if self.injection_reserve >= self.context_tokens:
            raise Invalid(
                f"must be smaller than context_tokens ({self.context_tokens}), got"
                f" {self.injection_reserve}: the history needs room too",
                key="injection_reserve",
            )
        return Budget(self.context_tokens, self.injection_reserve)


@final
@attrs.frozen(kw_only=True)
class Config:
    """A pipeline config: the model, the bounds and the lists of entries of each stage."""

    schema: str | None = attrs.field(
        default=None,
        metadata=doc("The JSON Schema this file follows (for editors); ignored.", key="$schema"),
    )
    system: str | None = attrs.field(
        default=None, metadata=doc("The system prompt, used when a turn's context has none.")
    )
    model: ModelSpec | None = attrs.field(
        default=None,
        metadata=doc("The model. Without it, the offline scripted model answers.", tag="provider"),
    )
    max_regenerations: Count = attrs.field(
        default=Count(2), metadata=doc("How many times post hooks may send the model back.")
    )
    hold_until_accepted: bool = attrs.field(
        default=False,
        metadata=doc("Hold each attempt's text until the post hooks accept it."),
    )
    max_steps: Positive = attrs.field(
        default=Positive(8),
        metadata=doc("The most model calls of one attempt (each tool round is one more)."),
    )
    tool_concurrency: Positive = attrs.field(
        default=Positive(4), metadata=doc("The most tool calls of one model call run at once.")
    )
    budget: BudgetSpec | None = attrs.field(default=None, metadata=doc("Token limits."))
    tokenizer: TokenizerRef | None = attrs.field(
        default=None, metadata=doc("Counts tokens: 'module:attribute' of fn(text) -> int.")
    )
    compact: CompactRef | None = attrs.field(
        default=None,
        metadata=doc("Compacts the history before the pre hooks (needs a budget)."),
    )
    pre: tuple[PreEntry, ...] = attrs.field(
        default=(), metadata=doc("Pre-message hooks and parallel groups, in order.")
    )
    tools: tuple[ToolEntry, ...] = attrs.field(
        default=(), metadata=doc("The tools the model may call.")
    )
    before_tool: tuple[BeforeTool, ...] = attrs.field(
        default=(), metadata=doc("Hooks run before each tool call they match, in order.")
    )
    after_tool: tuple[AfterTool, ...] = attrs.field(
        default=(), metadata=doc("Hooks run after each tool call they match, in order.")
    )
    transformers: tuple[TransformerEntry, ...] = attrs.field(
        default=(), metadata=doc("Stream transformers every text chunk passes through.")
    )
    post: tuple[PostEntry, ...] = attrs.field(
        default=(), metadata=doc("Post-message hooks (guardrails first), in order.")
    )
    on_session_start: tuple[SessionStart, ...] = attrs.field(
        default=(), metadata=doc("Hooks run when a session opens.")
    )
    on_session_end: tuple[SessionEnd, ...] = attrs.field(
        default=(), metadata=doc("Hooks run whenever a session closes.")
    )


TAGGED: tuple[tuple[Any, str], ...] = (
    # A union is configured after the unions its records hold (a judge holds a model).
    (ModelSpec, "provider"),
    (MemberEntry, "kind"),
    (PreEntry, "kind"),
    (Ttl, "kind"),
    (ToolEntry, "kind"),
    (BeforeTool, "kind"),
    (AfterTool, "kind"),
    (TransformerEntry, "kind"),
    (PostEntry, "kind"),
    (SessionStart, "kind"),
    (SessionEnd, "kind"),
)
"""Every union of records (or single record) a table is tagged for, and its tag key."""

STAGE_LISTS: tuple[str, ...] = (
    "pre",
    "tools",
    "before_tool",
    "after_tool",
    "transformers",
    "post",
    "on_session_start",
    "on_session_end",
)
"""The keys of `Config` that hold entry lists, in the order a turn meets them (the tools
are built first, for the entries that name one)."""
