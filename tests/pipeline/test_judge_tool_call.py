"""`Pipeline.judge_tool_call`: a pipeline's before-tool hooks on a call it does not run."""

from typing import Any

import anyio
import pytest

from pipeline import HookTimeout, Pipeline, ToolVerdict, ask, block, cont, halt, hook
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import ToolCall, Turn

CALL = ToolCall("c1", "search", {"q": "foxes"})


def pipe(*before: Any, permission: Any = None) -> Pipeline:
    return Pipeline(model=ScriptedModel(["ok"]), before_tool=list(before), permission=permission)


async def test_every_outcome_and_the_records() -> None:
    """Catches: a verdict that loses the rewritten call, the blocking hook or the halt."""
    turn = Turn.start("hi")

    def rewrite(call: ToolCall, turn: Turn) -> Any:
        return cont(call.with_arguments({"q": "cats"}))

    ran = await pipe(hook(rewrite, name="rewrite")).judge_tool_call(CALL, turn)
    assert ran == ToolVerdict(
        call=CALL.with_arguments({"q": "cats"}), outcome="run", records=ran.records
    )
    assert [r.hook for r in ran.records] == ["rewrite"]

    blocked = await pipe(hook(lambda call, turn: block("no searching"), name="no")).judge_tool_call(
        CALL, turn
    )
    assert (blocked.outcome, blocked.hook, blocked.reason) == ("blocked", "no", "no searching")

    halted = await pipe(hook(lambda call, turn: halt("stop"), name="stopper")).judge_tool_call(
        CALL, turn
    )
    assert (halted.outcome, halted.hook, halted.reason) == ("halted", "stopper", "stop")


async def test_when_match_shadow_and_permission_apply() -> None:
    """Catches: hook options ignored outside a turn (a re-implemented matcher)."""
    turn = Turn.start("hi")
    blocks = lambda call, turn: block("no")  # noqa: E731
    skipped = pipe(
        hook(blocks, name="other_tool", match="delete"),
        hook(blocks, name="never", when=lambda turn: False),
        hook(blocks, name="shadow", shadow=True),
        hook(lambda call, turn: ask("may I?"), name="asks"),
        permission=lambda call, question, turn: True,
    )
    verdict = await skipped.judge_tool_call(CALL, turn)
    assert verdict.outcome == "run"
    denied = await pipe(hook(lambda call, turn: ask("may I?"), name="asks")).judge_tool_call(
        CALL, turn
    )
    assert (denied.outcome, denied.hook) == ("blocked", "asks")


async def test_timeout_and_on_error_apply_and_events_are_emitted() -> None:
    """Catches: a hung tool hook holding the call forever, or no events for the page."""

    async def hangs(call: ToolCall, turn: Turn) -> Any:
        await anyio.sleep(10)

    events: list[ev.Event] = []
    open_ = pipe(hook(hangs, name="slow", timeout=0.05, on_error="skip"))
    assert (await open_.judge_tool_call(CALL, Turn.start("hi"), emit=events.append)).outcome == (
        "run"
    )
    assert [type(e).__name__ for e in events][:1] == ["HookStarted"]
    with pytest.raises(HookTimeout):
        await pipe(hook(hangs, name="slow", timeout=0.05, on_error="halt")).judge_tool_call(
            CALL, Turn.start("hi")
        )


async def test_a_wrong_argument_is_a_clear_error() -> None:
    """Catches: a dict passed for a ToolCall failing deep inside a hook."""
    with pytest.raises(TypeError, match="ToolCall"):
        await pipe().judge_tool_call({"name": "search"}, Turn.start("hi"))  # type: ignore[arg-type]


async def test_events_carry_their_time_since_the_judgment_started() -> None:
    """Catches: every event of a judgment stamped `at` 0.0, so a hook that took 50 ms shows
    as finishing when it started."""
    seen: list[ev.Event] = []

    async def slow(call: ToolCall, turn: Turn) -> Any:
        await anyio.sleep(0.05)
        return cont(call)

    await pipe(hook(slow, name="slow")).judge_tool_call(CALL, Turn.start("hi"), emit=seen.append)
    started, finished = seen
    assert [type(started), type(finished)] == [ev.HookStarted, ev.HookFinished]
    assert 0.0 <= started.at < 0.05 <= finished.at


async def test_a_judgment_inside_a_turn_is_stamped_on_the_turns_clock() -> None:
    """Catches: a hook of a turn (the gateway's client-tool policy) judging a call whose
    events sit at 0 ms on the turn's timeline, before the hook that judged them started."""
    judged: list[ev.Event] = []
    policy = pipe(hook(lambda call, turn: cont(call), name="policy"))

    async def wait(turn: Turn) -> Any:
        await anyio.sleep(0.05)
        return cont(turn)

    async def police(turn: Turn) -> Any:
        await policy.judge_tool_call(CALL, turn, emit=judged.append)
        return cont(turn)

    turn_pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[hook(wait, name="wait")],
        post=[hook(police, name="police")],
    )
    async with turn_pipe.stream(Turn.start("hi")) as events:
        own = [event async for event in events]
    police_started, police_finished = (
        e for e in own if isinstance(e, ev.HookStarted | ev.HookFinished) and e.hook == "police"
    )
    assert [type(e) for e in judged] == [ev.HookStarted, ev.HookFinished]
    assert 0.05 <= police_started.at <= judged[0].at <= judged[1].at <= police_finished.at
