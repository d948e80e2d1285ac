"""The drive's stage loop: its inlined hot path against the step-by-step reference.

`Drive.ordered` runs the common case of a plain hook (async, enforced, no timeout, no
``when=``, continuing with the turn unchanged but for injections) inline; every other case
goes through `run_step` and `settle`. `Drive.ordered_step_by_step` runs every step through
them. Both must record and announce exactly the same thing for every verdict a hook can give,
streamed or run with nobody listening.
"""

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio

from pipeline import AuditRecord, Pipeline, PipelineError, cont, halt, hook, regenerate
from pipeline import events as ev
from pipeline._drive import Drive
from pipeline.testing import ScriptedModel
from turns import Injection, Message, Text, Turn


class StepByStep(Drive):
    """The drive with the reference stage loop in place of the inlined one."""

    __slots__ = ()

    ordered = Drive.ordered_step_by_step


def fn(action: Callable[[Turn], Any], *, delay: float = 0) -> Callable[[Turn], Any]:
    async def run(turn: Turn) -> Any:
        if delay:
            await trio.sleep(delay)
        return action(turn)

    return run


def fail(turn: Turn) -> Any:
    raise ValueError("broken")


_rejected: set[str] = set()


def reject_once(turn: Turn) -> Any:
    # The first attempt is sent back, the second accepted.
    if turn.turn_ref in _rejected:
        return cont(turn)
    _rejected.add(turn.turn_ref)
    return regenerate("shorter, please")


def forge(turn: Turn) -> Any:
    # Injections added by hand rather than through Turn.inject, claiming another source:
    # the runtime must stamp them with this hook all the same.
    forged = Injection((Text("forged"),), "someone else", True, "pre")
    return cont(attrs.evolve(turn, injections=(*turn.injections, forged)))


def reply_rewritten(turn: Turn) -> Any:
    assert turn.reply is not None
    message = Message.assistant(turn.reply.text + " (checked)")
    return cont(attrs.evolve(turn, reply=attrs.evolve(turn.reply, message=message)))


VERDICTS: dict[str, dict[str, list[Any]]] = {
    "cont": {"pre": [hook(fn(cont), name="a"), hook(fn(cont), name="b")]},
    "cont, taking a while": {"pre": [hook(fn(cont, delay=1), name="a")]},
    "changed turn: injections": {"pre": [hook(fn(lambda t: cont(t.inject("note"))), name="a")]},
    "changed turn: injections set by hand": {
        "pre": [hook(fn(lambda t: cont(t.inject("note"))), name="a"), hook(fn(forge), name="b")]
    },
    "changed turn: request": {
        "pre": [hook(fn(lambda t: cont(t.with_request(temperature=0.5))), name="a")]
    },
    "halt": {"pre": [hook(fn(cont), name="a"), hook(fn(lambda t: halt("no")), name="stop")]},
    "halt with a reply": {"pre": [hook(fn(lambda t: halt("no", reply="Sorry.")), name="stop")]},
    "regenerate": {"post": [hook(fn(cont), name="a"), hook(fn(reject_once), name="judge")]},
    "changed turn in post: injections": {
        "post": [hook(fn(lambda t: cont(t.inject("seen"))), name="a")]
    },
    "changed reply": {"post": [hook(fn(reply_rewritten), name="scrub")]},
    "wrong return": {"pre": [hook(fn(lambda t: None), name="forgot")]},
    "wrong return in post": {"post": [hook(fn(lambda t: t), name="forgot")]},
    "exception, enforced": {"pre": [hook(fn(fail), name="broken")]},
    "exception, failing open": {
        "pre": [hook(fn(fail), name="broken", on_error="skip"), hook(fn(cont), name="b")]
    },
    "timeout": {
        "pre": [hook(fn(cont, delay=5), name="slow", timeout=1, on_error="skip")],
    },
    "skip": {
        "pre": [hook(fn(fail), name="never", when=lambda turn: False), hook(fn(cont), name="b")]
    },
    "shadow": {
        "pre": [hook(fn(lambda t: halt("would stop")), name="watch", shadow=True)],
        "post": [hook(fn(lambda t: regenerate("would reject")), name="critic", shadow=True)],
    },
}


async def _drive(
    cls: type[Drive], name: str, turn_ref: str, *, listened: bool
) -> tuple[object, list[Any]]:
    """The turn's result (or error), and its events with their times (none unless
    `listened`: `Pipeline.run` with nobody watching passes no emit at all)."""
    # A pipeline of its own: a scripted model hands out each reply once.
    pipe = Pipeline(model=ScriptedModel(["first", "second"]), **VERDICTS[name])
    events: list[ev.Event] = []
    _rejected.discard(turn_ref)
    emit = events.append if listened else None
    try:
        result = await cls(pipe._plan, emit).run(Turn.start("hi", turn_ref=turn_ref))
    except PipelineError as error:
        outcome: object = (type(error), str(error), vars(error))
    else:
        outcome = (result.outcome, result.audit, result.reply, result.turn)
    # An event's `at` is left out of its equality: compared here, in virtual time.
    return outcome, [(event, event.at) for event in events]


@pytest.mark.parametrize("listened", [True, False], ids=["streamed", "run"])
@pytest.mark.parametrize("name", sorted(VERDICTS))
async def test_the_inlined_and_the_reference_stage_loop_agree(
    name: str, listened: bool, autojump_clock
) -> None:
    """Catches: the inlined hot path recording, announcing or deciding anything differently
    from run_step + settle (a verdict string, a stamp, a record's detail, an event's order or
    time), whether or not anyone listens: with nobody listening (`run`) it skips work the
    events need, such as stamping injections a hook added by hand."""
    inlined = await _drive(Drive, name, "same", listened=listened)
    reference = await _drive(StepByStep, name, "same", listened=listened)

    assert inlined == reference
    # The comparison saw the turn run at all: it started, and every hook was announced.
    outcome, events = inlined
    if listened:
        assert isinstance(events[0][0], ev.TurnStarted)
        assert any(isinstance(event, ev.HookStarted) for event, _ in events)
    else:
        assert events == []
        assert isinstance(outcome, tuple)
        if isinstance(outcome[1], AuditRecord):
            assert outcome[1].hooks, "no hook was recorded"
