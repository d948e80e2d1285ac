"""Models named by a string (pipeline/providers/_strings.py)."""

import pytest

from pipeline import ConfigError
from pipeline.providers import AnthropicMessages, OpenAIChat, model_from_string
from pipeline.testing import ScriptedModel

from .support import collect


def test_openai() -> None:
    assert model_from_string("openai:gpt-4o-mini") == OpenAIChat("gpt-4o-mini")


def test_anthropic() -> None:
    assert model_from_string("anthropic:claude-sonnet-4-5") == AnthropicMessages(
        "claude-sonnet-4-5"
    )


def test_ollama_is_local_and_needs_no_key() -> None:
    model = model_from_string("ollama:llama3.2")
    assert model == OpenAIChat("llama3.2", base_url="http://localhost:11434/v1", api_key_env=None)


def test_openrouter_uses_its_own_key_variable() -> None:
    model = model_from_string("openrouter:meta-llama/llama-3.1-8b-instruct")
    assert model == OpenAIChat(
        "meta-llama/llama-3.1-8b-instruct",
        base_url="https://openrouter.ai/api/v1",
        api_key_env="OPENROUTER_API_KEY",
    )


async def test_scripted_replies_offline() -> None:
    model = model_from_string("scripted")
    assert isinstance(model, ScriptedModel)
    assert "offline" in "".join(getattr(event, "text", "") for event in await collect(model))


@pytest.mark.parametrize("spec", ["gemini:pro", "openai", "openai:", ":gpt", ""])
def test_a_bad_spec_is_a_config_error_naming_it_and_the_valid_prefixes(spec: str) -> None:
    with pytest.raises(ConfigError) as caught:
        model_from_string(spec)
    assert repr(spec) in str(caught.value)
    assert "openai:<model>" in str(caught.value)
    assert "scripted" in str(caught.value)


def test_a_model_name_after_scripted_says_scripted_takes_none() -> None:
    """Catches: 'scripted:x' refused as naming the unknown provider 'scripted', with
    'scripted' itself in the list of valid forms the same message gave."""
    with pytest.raises(ConfigError, match="the scripted model takes no model name") as caught:
        model_from_string("scripted:gpt-4o")
    assert "'scripted:gpt-4o'" in str(caught.value)
    assert "unknown provider" not in str(caught.value)
