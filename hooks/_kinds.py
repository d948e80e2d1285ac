"""The entries of a config file: one frozen record per kind, each with its builder.

An entry record declares the keys its kind accepts (its attrs fields; their types are
checked by `hooks.config` when the file is loaded, and written into the JSON Schema by
`hooks._schema`) and `build`s the hook, group or transformer factory it stands for. The
lists of a config accept the kinds of their union (`PreEntry`, `MemberEntry`,
`TransformerEntry`, `PostEntry`); the model table is a union on ``provider``.

Adding a kind is local: one record here (with ``KIND`` and ``build``) and its name in the
union of each list it may stand in. A new list is a field of `Config`, its union in
`TAGGED` and its name in `STAGE_LISTS`.
"""

import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Literal, TypeAlias, final

import attrs

from pipeline import (
    Budget,
    Cont,
    Hook,
    Model,
    ModelEvent,
    ModelRequest,
    Parallel,
    TransformerFactory,
    cont,
    hook,
    parallel,
)
from pipeline.providers import AnthropicMessages, OpenAIChat, model_from_string
from pipeline.testing import ScriptedModel
from turns import Text as TextPart
from turns import Turn

from ._config_types import (
    CompactRef,
    Count,
    EndRef,
    FactoryRef,
    HookRef,
    Invalid,
    Positive,
    ScriptReply,
    Seconds,
    StartRef,
    Temperature,
    Text,
    TokenizerRef,
)
from ._redact import redact


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
    """

    environ: Mapping[str, str]
    tools: Mapping[str, Any] = attrs.field(factory=dict)


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


MemberEntry: TypeAlias = PythonHook | Static
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
        return parallel(*(member.build_member(env) for member in self.hooks), name=self.name)


PreEntry: TypeAlias = PythonHook | Static | ParallelGroup
"""The kinds the ``pre`` list accepts."""

PostEntry: TypeAlias = PythonPost
"""The kinds the ``post`` list accepts."""


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


TransformerEntry: TypeAlias = PythonTransformer | Redact
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
    (MemberEntry, "kind"),
    (PreEntry, "kind"),
    (TransformerEntry, "kind"),
    (PostEntry, "kind"),
    (SessionStart, "kind"),
    (SessionEnd, "kind"),
    (ModelSpec, "provider"),
)
"""Every union of records (or single record) a table is tagged for, and its tag key."""

STAGE_LISTS: tuple[str, ...] = (
    "pre",
    "transformers",
    "post",
    "on_session_start",
    "on_session_end",
)
"""The keys of `Config` that hold entry lists, in the order a turn meets them."""
