"""The plain functions `examples/assistant.toml` refers to, and the same turn from Python.

From the repository root, the command line:

    .venv/bin/turnplug run examples/assistant.toml "How long do refunds take?"

or this file, which loads the config with `hooks.config.load_pipeline`:

    .venv/bin/python examples/assistant_hooks.py
"""

from pathlib import Path

import trio

from pipeline import TurnResult
from turns import Text, Turn

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


async def main() -> TurnResult:
    from hooks.config import load_pipeline

    pipe = load_pipeline(Path(__file__).with_name("assistant.toml"))
    result = await pipe.run(Turn.start("How long do refunds take?"))
    for rejection in result.rejections:
        print(f"attempt {rejection.attempt} rejected by {rejection.hook}: {rejection.feedback}")
    print(f"reply: {result.reply.text if result.reply else None}")
    return result


if __name__ == "__main__":
    trio.run(main)
