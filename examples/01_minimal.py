"""The smallest useful pipeline: one pre hook that adds context, one offline model.

Run it: ``python examples/01_minimal.py``
"""

import trio

from pipeline import Cont, Pipeline, TurnResult, cont
from pipeline.testing import ScriptedModel
from turns import Text, Turn


def add_house_rules(turn: Turn) -> Cont[Turn]:
    """A pre hook: a plain function that returns the (changed) turn wrapped in cont()."""
    return cont(turn.inject("Answer in one sentence."))


PIPE = Pipeline(
    model=ScriptedModel(["Hello! How can I help you today?"]),
    system="You are a friendly assistant.",
    pre=[add_house_rules],
)


async def main() -> TurnResult:
    result = await PIPE.run(Turn.start("hi"))
    print(f"outcome: {result.outcome}")
    assert result.reply is not None
    print(f"reply:   {result.reply.text}")
    for injection in result.turn.injections:
        text = " ".join(part.text for part in injection.parts if isinstance(part, Text))
        print(f"injected by {injection.source}: {text}")
    return result


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
