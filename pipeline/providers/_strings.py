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
    return OpenAIChat(name, base_url=os.environ.get("OPENAI_BASE_URL") or OPENAI_BASE)


def _anthropic(name: str) -> Model:
    return AnthropicMessages(name, base_url=os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_BASE)


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
        ConfigError: The spec is malformed or names an unknown provider; the message lists
            the valid prefixes.
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
    if make is None:
        raise ConfigError(
            f"model spec {spec!r} names unknown provider {prefix!r} — valid forms: {valid}"
        )
    return make(name)
