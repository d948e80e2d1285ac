"""A guardrail that sends the model back, within a visible bound.

A post hook returns ``regenerate(feedback)``: the model sees its rejected answer and why, and
tries again. The bound is explicit (``max_regenerations``); when it is spent the outcome is
``"exhausted"`` and no rejected text is offered as the reply. A guardrail can read the attempt
number and relax on the last one.

Run it: ``python examples/05_guardrail_retry.py``
"""

import trio

from pipeline import Cont, Pipeline, Regenerate, TurnResult, cont, regenerate
from pipeline.testing import ScriptedModel
from turns import Turn


def no_guarantees(turn: Turn) -> Cont[Turn] | Regenerate:
    assert turn.reply is not None
    if "guarantee" in turn.reply.text.lower():
        return regenerate("Never promise a guarantee; describe the refund policy instead.")
    return cont(turn)


def fixed_model() -> ScriptedModel:
    return ScriptedModel(
        [
            "We guarantee a full refund, always!",
            "Refunds are issued within 14 days of a return.",
        ]
    )


def stubborn_model() -> ScriptedModel:
    return ScriptedModel(["I guarantee it."] * 3)


async def main() -> list[TurnResult]:
    results = []
    for label, model in [("fixed on retry", fixed_model()), ("stubborn", stubborn_model())]:
        pipe = Pipeline(model=model, post=[no_guarantees], max_regenerations=2)
        result = await pipe.run(Turn.start("Can I get my money back?"))
        print(f"{label}: {result.outcome} after {len(model.requests)} model call(s)")
        for rejection in result.rejections:
            print(f"  attempt {rejection.attempt} rejected by {rejection.hook}: {rejection.text!r}")
        print(f"  reply -> {result.reply.text if result.reply else None}")
        results.append(result)
    return results


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
