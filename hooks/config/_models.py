"""The ``[model]`` table: one record per provider."""

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, TypeAlias, final

import attrs

from pipeline import (
    Model,
    ModelEvent,
    ModelRequest,
)
from pipeline.providers import AnthropicMessages, OpenAIChat, model_from_string
from pipeline.testing import ScriptedModel
from turns import RequestOptions

from ._entry import Env, doc
from ._types import (
    Invalid,
    ModelRef,
    Positive,
    ScriptReply,
    Seconds,
    Temperature,
    Text,
    UnitTemperature,
)

# -- the model --------------------------------------------------------------------------------


@final
class Shaped:
    """A model whose requests get default options the turn did not set.

    ``temperature`` and ``max_tokens`` of the ``[model]`` table are defaults for every
    request; a hook that shapes the request (``turn.with_request``) still wins. It stands
    for the model it wraps everywhere else: its name and provider (in events and traces)
    and its connection pool (``hold()``: a pipeline, a session or the CLI keep one pool of
    connections open for their turns).
    """

    __slots__ = ("defaults", "inner")

    def __init__(self, model: Model, defaults: Mapping[str, Any]) -> None:
        self.inner = model
        self.defaults = dict(defaults)

    def __repr__(self) -> str:
        given = ", ".join(f"{key}={value!r}" for key, value in self.defaults.items())
        return f"{self.inner!r} with {given}"

    @property
    def model(self) -> str:
        """The wrapped model's name: a provider's ``model``, else its class name."""
        name = getattr(self.inner, "model", None)
        return name if isinstance(name, str) else type(self.inner).__name__

    @property
    def provider(self) -> str | None:
        """The wrapped model's provider, where it has one."""
        provider = getattr(self.inner, "provider", None)
        return provider if isinstance(provider, str) else None

    def hold(self) -> AbstractAsyncContextManager[object]:
        """The wrapped model's ``hold()`` (its connection pool), where it has one."""
        hold = getattr(self.inner, "hold", None)
        if callable(hold):
            held: AbstractAsyncContextManager[object] = hold()
            return held
        return contextlib.nullcontext(self)

    def effective_options(self, options: RequestOptions) -> RequestOptions:
        """`options` with the defaults filled in where the turn left them unset, as the
        wrapped model sends them (its own ``effective_options``, where it has one).

        The runtime reads it for `ModelCalled.options`, so events and traces show what is
        sent (a ``[model]`` temperature is the chat span's ``gen_ai.request.temperature``).
        """
        options = self._with_defaults(options)
        inner = getattr(self.inner, "effective_options", None)
        return inner(options) if callable(inner) else options

    def _with_defaults(self, options: RequestOptions) -> RequestOptions:
        unset = {k: v for k, v in self.defaults.items() if getattr(options, k) is None}
        return attrs.evolve(options, **unset) if unset else options

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        options = self._with_defaults(request.options)
        if options is not request.options:
            request = attrs.evolve(request, options=options)
        return self.inner.stream(request)


def unwrapped(model: Model) -> Model:
    """The model `model` stands for: the provider a config's ``[model]`` wraps in `Shaped`
    (to fill in its defaults), else `model` itself.

    For what only the wrapped model can tell, such as the API it speaks (the gateway names
    the parameters it forwards as that API does).
    """
    while isinstance(model, Shaped):
        model = model.inner
    return model


def _shaped(model: Model, **defaults: Any) -> Model:
    given = {key: value for key, value in defaults.items() if value is not None}
    return Shaped(model, given) if given else model


def _key(env: Env, variable: str, provider: str) -> None:
    key = env.environ.get(variable, "").strip() if variable else ""
    if variable and not key and not env.offline:
        # A variable set to whitespace only is no key either; saying "not set" of it would
        # send the reader to check the name rather than the value.
        state = "is set but blank" if variable in env.environ else "is not set"
        raise Invalid(
            f"the environment variable {variable} {state} — export it with your {provider}"
            ' key, or name the variable that holds it (api_key_env = "" for a server that'
            " needs no key)",
            key="api_key_env",
        )
    if not all("!" <= char <= "~" for char in key):
        # The provider would refuse it at the first request, after the turn's pre hooks.
        raise Invalid(
            f"the key in {variable} contains characters an HTTP header cannot carry (spaces,"
            " control characters or non-ASCII); it is not shown here — check the secret for a"
            " stray character",
            key="api_key_env",
        )


@contextlib.contextmanager
def _bad_base_url(given: str | None, variable: str) -> Iterator[None]:
    """A base URL the provider refuses, as a problem of ``base_url`` (naming `variable`
    when the URL came from there)."""
    try:
        yield
    except ValueError as exc:
        text = str(exc)
        if not text.startswith("base_url "):
            raise
        where = "" if given else f" (from the environment variable {variable})"
        raise Invalid(f"{text.removeprefix('base_url ')}{where}", key="base_url") from None


@final
@attrs.frozen(kw_only=True)
class ScriptedSpec:
    """The offline scripted model: each model call plays the next reply."""

    PROVIDER: ClassVar[str] = "scripted"
    replies: tuple[ScriptReply, ...] | None = attrs.field(
        default=None,
        metadata=doc(
            "One reply per model call: a string, or a list of the chunks it streams in."
            " Without it, a fixed greeting for every call.",
            min_items=1,
        ),
    )

    def build(self, env: Env) -> Model:
        if self.replies is None:
            return model_from_string("scripted")
        if not self.replies:
            # The first model call would fail, as "ran out of replies", mid-turn.
            raise Invalid(
                "expected at least one reply — leave replies out for a fixed greeting on"
                " every call",
                key="replies",
            )
        return ScriptedModel([list(reply) for reply in self.replies])


_OPENAI_BASE = "https://api.openai.com/v1"
_ANTHROPIC_BASE = "https://api.anthropic.com"


@final
@attrs.frozen(kw_only=True)
class OpenAISpec:
    """An OpenAI Chat Completions model (OpenAI, OpenRouter, vLLM, Ollama, llama.cpp)."""

    PROVIDER: ClassVar[str] = "openai"
    BASE_URL_VARIABLE: ClassVar[str] = "OPENAI_BASE_URL"
    DEFAULT_BASE_URL: ClassVar[str] = _OPENAI_BASE
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
        base_url, _ = base_url_of(self, env.environ)
        extra: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        with _bad_base_url(self.base_url, self.BASE_URL_VARIABLE):
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
    BASE_URL_VARIABLE: ClassVar[str] = "ANTHROPIC_BASE_URL"
    DEFAULT_BASE_URL: ClassVar[str] = _ANTHROPIC_BASE
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
    temperature: UnitTemperature | None = attrs.field(
        default=None, metadata=doc("The sampling temperature when a turn sets none.")
    )
    timeout: Seconds | None = attrs.field(
        default=None, metadata=doc("The longest silence allowed between bytes, in seconds.")
    )

    def build(self, env: Env) -> Model:
        _key(env, self.api_key_env, "Anthropic")
        base_url, _ = base_url_of(self, env.environ)
        extra: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        with _bad_base_url(self.base_url, self.BASE_URL_VARIABLE):
            model = AnthropicMessages(
                self.name,
                base_url=base_url,
                api_key=env.environ.get(self.api_key_env) if self.api_key_env else None,
                api_key_env=None,
                max_tokens=self.max_tokens,
                **extra,
            )
        return _shaped(model, temperature=self.temperature)


@final
@attrs.frozen(kw_only=True)
class PythonModelSpec:
    """A model built by a function of yours: a `FunctionModel`, a fake, your own client."""

    PROVIDER: ClassVar[str] = "python"
    ref: ModelRef = attrs.field(
        metadata=doc(
            "'module:attribute' naming a function called with no arguments, once per load,"
            " that returns the model (an object with stream(request))."
        )
    )

    def build(self, env: Env) -> Model:
        try:
            model = self.ref.target()
        except Exception as exc:
            raise Invalid(
                f"{self.ref.text!r} raised {type(exc).__name__}: {exc}", key="ref"
            ) from exc
        if not callable(getattr(model, "stream", None)):
            raise Invalid(
                f"{self.ref.text!r} returned {type(model).__name__} {model!r}, not a model:"
                " expected an object with stream(request), e.g."
                " pipeline.testing.FunctionModel(answer)",
                key="ref",
            )
        return model  # type: ignore[no-any-return]


def base_url_of(
    spec: "OpenAISpec | AnthropicSpec", environ: Mapping[str, str]
) -> tuple[str, str | None]:
    """The base URL `spec`'s provider is built with, and the environment variable it came
    from (None when the file sets it, or when it is the provider's default)."""
    if spec.base_url:
        return spec.base_url, None
    from_environment = environ.get(spec.BASE_URL_VARIABLE)
    if from_environment:
        return from_environment, spec.BASE_URL_VARIABLE
    return spec.DEFAULT_BASE_URL, None


ModelSpec: TypeAlias = ScriptedSpec | OpenAISpec | AnthropicSpec | PythonModelSpec
"""The ``[model]`` table: a union on ``provider``."""
