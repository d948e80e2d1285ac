"""Streaming redaction: an e-mail address split across chunks never reaches the consumer.

The model streams ``"...ada@exa"`` and then ``"mple.com..."``. `hooks.redact` holds back only
the word that could still become an address and releases everything else at once, so the
consumer sees ``[EMAIL]`` and nothing of the address, in every delta and in the reply.

Run it: ``python examples/04_streaming_redaction.py``
"""

import trio

from hooks import redact
from pipeline import Pipeline, TurnResult
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Turn

EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"

PIPE = Pipeline(
    model=ScriptedModel([["Sure. I will write to ada@exa", "mple.com", " tomorrow."]]),
    transformers=[redact(EMAIL, replacement="[EMAIL]")],
)


async def main() -> tuple[list[str], TurnResult]:
    deltas: list[str] = []
    async with PIPE.stream(Turn.start("Can you confirm by mail?")) as events:
        async for event in events:
            if isinstance(event, ev.TextDelta):
                deltas.append(event.text)
                print(f"delta -> {event.text!r}")
    result = events.result
    assert result.reply is not None
    print(f"reply -> {result.reply.text}")
    print(f"annotations -> {dict(result.reply.annotations)}")
    return deltas, result


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
