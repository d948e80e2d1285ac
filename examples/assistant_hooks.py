"""The plain functions `examples/assistant.toml` refers to, and the same turn from Python.

From the repository root, the command line:

    .venv/bin/turnplug run examples/assistant.toml "How long do refunds take?"
    .venv/bin/turnplug chat examples/assistant.toml

or this file, which loads the config with `hooks.config.load_pipeline`:

    .venv/bin/python examples/assistant_hooks.py
"""

from pathlib import Path

import trio

from pipeline import ModelRequest, TurnResult
from pipeline.testing import FunctionModel
from turns import Message, Text, ToolResult, Turn

HOURS = {"Main Street": "Monday to Saturday, 9:00 to 18:00"}

FAQ = {
    "refund": "Refunds are issued within 14 days of a return.",
    "shipping": "Orders ship within 2 working days.",
    "gift": "Gift cards never expire.",
}


def search_faq(turn: Turn) -> list[Text]:
    """Parallel member: the FAQ entries whose topic the question mentions."""
    question = turn.user_message.text.lower()
    return [Text(f"[faq] {answer}") for topic, answer in FAQ.items() if topic in question]


async def load_profile(turn: Turn) -> list[Text]:
    """Parallel member (durable): what we know of the customer, kept in the log."""
    customer = turn.scope.current_user or "a guest"
    return [Text(f"[profile] the customer is {customer}")]


def opening_hours(shop: str) -> str:
    """A tool: the opening hours of one of our shops.

    Args:
        shop: The shop's street, e.g. "Main Street".
    """
    return HOURS.get(shop, f"no shop on {shop}; our shops: {', '.join(HOURS)}")


def model() -> FunctionModel:
    """The offline model: it answers from what the pre hooks retrieved this turn.

    A stand-in for a real model that holds a whole conversation without a network. The
    first attempt at a refund question promises a guarantee, so that the guardrail has
    something to reject; the second answers from the FAQ and streams an e-mail address
    split across two chunks, which the `pii` transformer redacts all the same.
    """
    return FunctionModel(answer)


def answer(request: ModelRequest) -> str | list[str]:
    """One reply, from the rendered request: retrieved FAQ entries and the opening hours."""
    messages = request.messages
    # The user message of this turn is the last one carrying the profile note; anything
    # after it is a rejected attempt and the guardrail's feedback.
    asked = max(i for i, m in enumerate(messages) if m.role == "user" and _noted(m))
    texts = [part.text for part in messages[asked].parts if isinstance(part, Text)]
    question = texts[-1].lower()
    facts = [text.removeprefix("[faq] ") for text in texts if text.startswith("[faq] ")]
    retried = asked < len(messages) - 1
    if any(word in question for word in ("open", "hour", "when")):
        return f"Our Main Street shop is open {_hours(messages)}."
    if not facts:
        return (
            "I can tell you about refunds, shipping, gift cards and our opening hours."
            " What would you like to know?"
        )
    if "refund" in question and not retried:
        return "We guarantee a refund within 14 days!"
    return [" ".join(facts) + " ", "Questions? Write to help@exa", "mple.com."]


def _noted(message: Message) -> bool:
    return any(isinstance(p, Text) and p.text.startswith("[profile] ") for p in message.parts)


def _hours(messages: tuple[Message, ...]) -> str:
    results = [p for m in messages for p in m.parts if isinstance(p, ToolResult)]
    return results[-1].content if results else "at the usual hours"


async def main() -> TurnResult:
    from hooks.config import load_pipeline

    pipe = load_pipeline(Path(__file__).with_name("assistant.toml"))
    result = await pipe.run(Turn.start("How long do refunds take?"))
    for rejection in result.rejections:
        print(f"attempt {rejection.attempt} rejected by {rejection.hook}: {rejection.feedback}")
    print(f"reply: {result.reply.text if result.reply else None}")
    return result


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
