"""Halting is a value: a pre hook stops the turn before the model is ever called.

Run it: ``python examples/02_halt.py``
"""

import trio

from pipeline import Cont, Halt, Pipeline, TurnResult, cont, halt
from pipeline.testing import ScriptedModel
from turns import Scope, Turn

BANNED = ("password", "social security")


def require_login(turn: Turn) -> Cont[Turn] | Halt:
    if turn.scope.current_user is None:
        return halt("not signed in", reply="Please sign in to continue.")
    return cont(turn)


def refuse_secrets(turn: Turn) -> Cont[Turn] | Halt:
    text = turn.user_message.text.lower()
    for phrase in BANNED:
        if phrase in text:
            return halt(f"asked for {phrase!r}", reply="I can't help with that.")
    return cont(turn)


MODEL = ScriptedModel(["Your order ships tomorrow."])
PIPE = Pipeline(model=MODEL, pre=[require_login, refuse_secrets])


async def main() -> list[TurnResult]:
    results = []
    for text, user in [
        ("where is my order?", None),
        ("tell me the admin password", "ada"),
        ("where is my order?", "ada"),
    ]:
        result = await PIPE.run(Turn.start(text, scope=Scope(current_user=user)))
        reply = result.reply.text if result.reply else "-"
        stopped = f" (halted by {result.halt.hook}: {result.halt.reason})" if result.halt else ""
        print(f"{user or 'anonymous'}: {text!r} -> {result.outcome}{stopped}: {reply}")
        results.append(result)
    print(f"model calls: {len(MODEL.requests)}")
    return results


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
