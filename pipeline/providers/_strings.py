"""Models named by a string, for config files and the command line."""

import os
from collections.abc import Callable

from .._errors import ConfigError
from .._model import Model
from ..testing import ScriptedModel
from ._anthropic import AnthropicMessages
from ._openai import OpenAIChat

OPENAI_BASE = "https://api.openai.com/v1"
ANTHROPIC_BASE = "https://api.anthropic.com"

SCRIPTED_REPLY = (
    "Hello from the offline scripted model. Name a real one, e.g. openai:gpt-4o-mini, to talk"
    " to a provider."
)


def _scripted(name: str) -> Model:
    # One reply per call, enough for any interactive session: the model never runs out.
    return ScriptedModel([SCRIPTED_REPLY] * 1000)


def _openai(name: str) -> Model:
    # As the official SDKs do, a base URL in the environment points the provider elsewhere
    # (a proxy, a gateway, a local server speaking the same protocol).
    return _from_environment(OpenAIChat, name, "OPENAI_BASE_URL", OPENAI_BASE)


def _anthropic(name: str) -> Model:
    return _from_environment(AnthropicMessages, name, "ANTHROPIC_BASE_URL", ANTHROPIC_BASE)


def _from_environment(make: Callable[..., Model], name: str, variable: str, default: str) -> Model:
    """The provider at the base URL `variable` names, else at `default`; a URL it refuses
    is a `ConfigError` naming the variable (the caller's to fix, not a crash)."""
    base_url = os.environ.get(variable)
    try:
        return make(name, base_url=base_url or default)
    except ValueError as exc:
        if not base_url:
            raise
        problem = str(exc).removeprefix("base_url ")
        raise ConfigError(
            f"the environment variable {variable}: {problem}; fix it, or unset it to use {default}"
        ) from None


_PROVIDERS: dict[str, Callable[[str], Model]] = {
    "anthropic": _anthropic,
    "ollama": lambda name: OpenAIChat(name, base_url="http://localhost:11434/v1", api_key_env=None),
    "openai": _openai,
    "openrouter": lambda name: OpenAIChat(
        name, base_url="https://openrouter.ai/api/v1", api_key_env="OPENROUTER_API_KEY"
    ),
}


def model_from_string(spec: str) -> Model:
    """The model a ``"provider:model"`` string names.

    ``"openai:gpt-4o-mini"`` (base URL from ``OPENAI_BASE_URL`` when set),
    ``"anthropic:claude-sonnet-4-5"`` (``ANTHROPIC_BASE_URL``), ``"ollama:llama3.2"`` (the
    local Ollama server, no key), ``"openrouter:meta-llama/llama-3.1-8b-instruct"`` (key in
    ``OPENROUTER_API_KEY``), or ``"scripted"`` (an offline model with a fixed reply).

    Raises:
        ConfigError: The spec is malformed or names an unknown provider (the message lists
            the valid prefixes), or the base URL variable holds no usable URL.
    """
    valid = ", ".join([*(f"{prefix}:<model>" for prefix in _PROVIDERS), "scripted"])
    if not isinstance(spec, str):
        raise ConfigError(f"a model spec must be a string like 'openai:gpt-4o-mini', got {spec!r}")
    if spec.strip() == "scripted":
        return _scripted(spec)
    prefix, colon, name = spec.partition(":")
    prefix, name = prefix.strip().lower(), name.strip()
    if not colon or not name:
        raise ConfigError(
            f"model spec {spec!r} is not of the form 'provider:model' — valid forms: {valid}"
        )
    make = _PROVIDERS.get(prefix)
    if make is None and prefix == "scripted":
        raise ConfigError(
            f"model spec {spec!r}: the scripted model takes no model name — write 'scripted'"
        )
    if make is None:
        raise ConfigError(
            f"model spec {spec!r} names unknown provider {prefix!r} — valid forms: {valid}"
        )
    return make(name)
