"""One turn against a real OpenAI-compatible server (OpenAI, OpenRouter, vLLM, Ollama, ...).

It needs ``OPENAI_API_KEY`` (any non-empty value for a local server) and, for anything but
OpenAI itself, ``OPENAI_BASE_URL`` including the version prefix, e.g.
``http://localhost:11434/v1`` for Ollama. ``OPENAI_MODEL`` picks the model (default
``gpt-4o-mini``). Without a key it explains what it needs and exits.

Run it: ``OPENAI_API_KEY=... python examples/07_openai_compatible.py``
"""

import os

import trio

from pipeline import Pipeline, ProviderError, TurnResult
from pipeline.providers import OpenAIChat
from turns import Turn


def model_from_env() -> OpenAIChat | None:
    """The provider the environment describes, or None without a key."""
    if not os.environ.get("OPENAI_API_KEY"):
        return None
    return OpenAIChat(
        os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    )


async def main() -> TurnResult | None:
    model = model_from_env()
    if model is None:
        print("-> skipped: set OPENAI_API_KEY (and OPENAI_BASE_URL for a server other than")
        print("   OpenAI, e.g. http://localhost:11434/v1 for Ollama) to run this example")
        return None
    pipe = Pipeline(model=model, system="Answer in one short sentence.")
    try:
        result = await pipe.run(Turn.start("What is a pipeline, in plumbing?"))
    except ProviderError as exc:
        print(f"-> the provider failed: {type(exc).__name__}: {exc}")
        raise SystemExit(1) from exc
    assert result.reply is not None
    print(f"reply: {result.reply.text}")
    print(f"-> {result.reply.finish_reason}, {result.reply.usage}")
    return result


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
