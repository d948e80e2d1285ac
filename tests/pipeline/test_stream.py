"""Pipeline.stream: one drive loop with run, events of the turn, failures and cancellation."""

from collections.abc import AsyncIterable, Awaitable, Callable

import anyio
import anyio.lowlevel
import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from pipeline import (
    HookFailed,
    HookTimeout,
    Pipeline,
    TurnResult,
    cont,
    halt,
    hook,
    parallel,
    regenerate,
)
from pipeline import events as ev
from pipeline.events import Committed, Event, HookStarted, TextDelta, TurnFinished
from pipeline.logs import MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Text, Turn

from .support import collect, collect_into, live_tasks, warnings_of_an_interrupted_run

TURN_REF = "turn-0123"


def start(text: str = "hi") -> Turn:
    return Turn.start(text, turn_ref=TURN_REF)


def timeless(result: TurnResult) -> TurnResult:
    """The result with hook timings zeroed: the only part two runs may differ in."""
    hooks = tuple(record._replace(elapsed=0.0) for record in result.audit.hooks)
    return attrs.evolve(result, audit=attrs.evolve(result.audit, hooks=hooks))


# -- pipelines to compare run and stream on --------------------------------------------------


def note(text: str, *, name: str, durable: bool = False):
    async def inject(turn: Turn):
        return cont(turn.inject(text))

    return hook(inject, name=name, durable=durable)


def member(text: str, *, name: str):
    async def contribute(turn: Turn):
        return [Text(text)]

    return hook(contribute, name=name)


def stopper(reason: str, *, reply: str | None = None):
    async def stop(turn: Turn):
        return halt(reason, reply=reply)

    return hook(stop, name="stopper")


def plain() -> Pipeline:
    return Pipeline(model=ScriptedModel([["Hel", "lo!"]]))


def with_injections() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(["Noted."]),
        pre=[note("today is Monday", name="date"), note("likes tea", name="memory", durable=True)],
        system="Be brief.",
    )


def halting() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(["never sent"]),
        pre=[note("context", name="ctx"), stopper("off topic"), note("late", name="late")],
    )


def halting_with_reply() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(["never sent"]),
        pre=[stopper("off topic", reply="I only talk about cooking.")],
    )


def with_parallel_group() -> Pipeline:
    return Pipeline(
        model=ScriptedModel([["Found ", "it."]]),
        pre=[
            parallel(member("doc one", name="docs"), member("memory one", name="memory")),
            note("after the group", name="after"),
        ],
    )


def with_halting_group() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(["never sent"]),
        pre=[parallel(member("doc", name="docs"), stopper("blocked by policy"))],
    )


PIPELINES = [
    pytest.param(plain, id="plain"),
    pytest.param(with_injections, id="injections"),
    pytest.param(halting, id="halting"),
    pytest.param(halting_with_reply, id="halting-with-reply"),
    pytest.param(with_parallel_group, id="parallel-group"),
    pytest.param(with_halting_group, id="halting-group"),
]


@pytest.mark.parametrize("build", PIPELINES)
async def test_stream_gives_the_same_result_as_run(build: Callable[[], Pipeline]):
    ran = await build().run(start())
    _, streamed = await collect(build(), start())

    assert (streamed.outcome, streamed.reply, streamed.halt) == (ran.outcome, ran.reply, ran.halt)
    assert timeless(streamed) == timeless(ran)


@pytest.mark.parametrize("build", PIPELINES)
async def test_every_streamed_event_carries_the_turn_ref(build: Callable[[], Pipeline]):
    events, _ = await collect(build(), start())

    assert events
    assert [event for event in events if event.turn_ref != TURN_REF] == []


# -- events.result ---------------------------------------------------------------------------


async def test_result_before_iterating_raises_runtime_error():
    async with plain().stream(start()) as events:
        with pytest.raises(RuntimeError):
            _ = events.result
        async for _ in events:
            pass


async def test_result_in_the_middle_of_the_iteration_raises_runtime_error():
    async with plain().stream(start()) as events:
        await anext(events)
        with pytest.raises(RuntimeError):
            _ = events.result
        async for _ in events:
            pass


async def test_result_after_breaking_out_early_raises_runtime_error(autojump_clock):
    async def slow(turn: Turn):
        await anyio.sleep(10)
        return cont(turn)

    async with Pipeline(model=ScriptedModel(["x"]), pre=[slow]).stream(start()) as events:
        async for _ in events:
            break

    with pytest.raises(RuntimeError):
        _ = events.result


# -- text deltas -----------------------------------------------------------------------------


async def test_text_deltas_of_the_first_attempt_carry_attempt_one():
    events, _ = await collect(plain(), start())

    assert [(e.text, e.attempt) for e in events if isinstance(e, TextDelta)] == [
        ("Hel", 1),
        ("lo!", 1),
    ]


@given(st.lists(st.text(min_size=1), min_size=1, max_size=6))
async def test_text_deltas_concatenate_to_the_reply_text(chunks: list[str]):
    events, result = await collect(Pipeline(model=ScriptedModel([chunks])), start())

    delivered = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert delivered == result.reply.text == "".join(chunks)


# -- failures --------------------------------------------------------------------------------


async def test_failing_hook_raises_hook_failed_from_the_iteration():
    cause = ValueError("boom")

    async def explode(turn: Turn):
        raise cause

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(explode, name="explode")])

    async with pipe.stream(start()) as events:
        with pytest.raises(HookFailed) as excinfo:
            async for _ in events:
                pass

    assert type(excinfo.value) is HookFailed
    assert (excinfo.value.hook, excinfo.value.stage) == ("explode", "pre")
    assert excinfo.value.__cause__ is cause


class ConsumerError(Exception):
    """Raised by the code reading the events."""


async def raise_at_first_delta(pipe: Pipeline) -> None:
    async with pipe.stream(start()) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                raise ConsumerError("the UI crashed")


async def raise_after_the_end(pipe: Pipeline) -> None:
    async with pipe.stream(start()) as events:
        async for _ in events:
            pass
        raise ConsumerError("could not render the result")


async def test_consumer_exception_while_the_turn_runs_propagates_unwrapped(autojump_clock):
    async def slowly(request):
        yield "first "
        await anyio.sleep(10)
        yield "second"

    with pytest.raises(ConsumerError) as excinfo:
        await raise_at_first_delta(Pipeline(model=FunctionModel(slowly)))

    assert type(excinfo.value) is ConsumerError


async def test_consumer_exception_after_the_turn_ended_propagates_unwrapped():
    with pytest.raises(ConsumerError) as excinfo:
        await raise_after_the_end(plain())

    assert type(excinfo.value) is ConsumerError


# -- leaving early and cancellation ----------------------------------------------------------


def slow_then_later(trace: list[str]) -> Pipeline:
    async def slow(turn: Turn):
        trace.append("slow started")
        await anyio.sleep(10)
        trace.append("slow finished")
        return cont(turn)

    async def later(turn: Turn):
        trace.append("later")
        return cont(turn)

    model = FunctionModel(lambda request: trace.append("model") or "reply")
    return Pipeline(model=model, pre=[hook(slow, name="slow"), hook(later, name="later")])


async def break_during_slow(pipe: Pipeline) -> None:
    async with pipe.stream(start()) as events:
        async for event in events:
            if isinstance(event, HookStarted) and event.hook == "slow":
                await anyio.sleep(1)  # the slow hook is surely running by now
                break


async def test_breaking_out_early_cancels_the_rest_of_the_turn(autojump_clock):
    trace: list[str] = []
    started = anyio.current_time()

    await break_during_slow(slow_then_later(trace))
    left_at = anyio.current_time() - started
    await anyio.sleep(100)

    assert left_at == 1.0
    assert trace == ["slow started"]


async def test_breaking_out_early_leaves_no_task_behind(autojump_clock):
    before = live_tasks()

    await break_during_slow(slow_then_later([]))

    assert live_tasks() == before


async def test_cancelling_the_callers_scope_mid_stream_propagates_and_stops_the_turn(
    autojump_clock,
):
    trace: list[str] = []

    async def slowly(request):
        trace.append("sent first")
        yield "first "
        await anyio.sleep(10)
        trace.append("sent second")
        yield "second"

    pipe = Pipeline(model=FunctionModel(slowly))
    before = live_tasks()
    started = anyio.current_time()

    with anyio.move_on_after(5) as scope:
        async with pipe.stream(start()) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    trace.append(f"got {event.text.strip()}")
    stopped_at = anyio.current_time() - started
    remaining = live_tasks()
    await anyio.sleep(100)

    assert scope.cancelled_caught
    assert stopped_at == 5.0
    assert remaining == before
    assert trace == ["sent first", "got first"]


async def test_events_result_after_a_failed_turn_says_it_failed():
    async def boom(turn):
        raise ValueError("boom")

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[boom])

    seen = []

    async def capture():
        async with pipe.stream(Turn.start("hi")) as events:
            seen.append(events)
            async for _ in events:
                pass

    with pytest.raises(HookFailed):
        await capture()
    with pytest.raises(RuntimeError, match="failed with HookFailed"):
        _ = seen[0].result


@pytest.mark.parametrize("mode", ["run", "stream"])
async def test_cancellation_reaches_the_caller_as_trio_cancelled(autojump_clock, mode):
    async def slow(turn):
        await anyio.sleep(10)
        return [Text("late")]

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[parallel(slow, slow)])
    caught = []
    with anyio.move_on_after(1):
        try:
            if mode == "run":
                await pipe.run(Turn.start("hi"))
            else:
                async with pipe.stream(Turn.start("hi")) as events:
                    async for _ in events:
                        pass
        except anyio.get_cancelled_exc_class():
            caught.append("Cancelled")
            raise
    assert caught == ["Cancelled"]


async def raise_group_at_first_delta(pipe: Pipeline, group: ExceptionGroup) -> None:
    async with pipe.stream(start()) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                raise group


async def raise_group_after_the_end(pipe: Pipeline, group: ExceptionGroup) -> None:
    async with pipe.stream(start()) as events:
        async for _ in events:
            pass
        raise group


@pytest.mark.parametrize(
    "consume",
    [
        pytest.param(raise_group_at_first_delta, id="while-the-turn-runs"),
        pytest.param(raise_group_after_the_end, id="after-the-turn-ended"),
    ],
)
async def test_a_consumers_exception_group_propagates_intact(autojump_clock, consume):
    # Not flattened to its first member, not wrapped in the stream's own nursery group.
    async def slowly(request):
        yield "first "
        await anyio.sleep(10)
        yield "second"

    first, second = ValueError("a"), KeyError("b")

    with pytest.raises(ExceptionGroup) as excinfo:
        await consume(
            Pipeline(model=FunctionModel(slowly)), ExceptionGroup("mine", [first, second])
        )

    group = excinfo.value
    assert type(group) is ExceptionGroup
    assert group.message == "mine"
    assert len(group.exceptions) == 2
    assert (group.exceptions[0] is first, group.exceptions[1] is second) == (True, True)


async def test_shadow_skip_and_failed_open_hooks_audit_alike_in_run_and_stream(autojump_clock):
    def broken(turn):
        raise ValueError("x")

    def stop(turn):
        return halt("would stop")

    pipe = Pipeline(
        model=ScriptedModel(["ok", "ok"]),
        pre=[
            hook(broken, name="broken", on_error="skip"),
            hook(stop, name="watch", shadow=True),
            hook(broken, name="never", when=lambda turn: False),
        ],
    )
    ran = await pipe.run(Turn.start("hi", turn_ref="same"))
    async with pipe.stream(Turn.start("hi", turn_ref="same")) as events:
        async for _ in events:
            pass
    assert events.result.audit == ran.audit
    assert [(r.hook, r.verdict) for r in ran.audit.hooks] == [
        ("broken", "failed"),
        ("watch", "halt"),
        ("never", "skipped"),
    ]


# -- the consumer and the turn side by side ---------------------------------------------------
#
# The turn is driven apart from the code that reads its events: what the consumer does between
# two events (its own awaits, its own deadlines, leaving) reaches the turn only by leaving the
# block, and what the turn does (a hook's deadline, a failure) reaches the consumer only
# through the iteration. A design that runs the turn inside the consumer's own awaits breaks
# these first.


def kinds(events) -> list[str]:
    return [type(event).__name__ for event in events]


@pytest.mark.parametrize("timeout", [10, None], ids=["hook-with-timeout", "plain-hook"])
async def test_a_consumers_own_timeout_around_anext_leaves_the_turn_and_its_hook_deadline_alone(
    autojump_clock, timeout: float | None
):
    """Catches: the consumer's deadline on one ``anext`` cancelling the turn (a turn driven
    inside the consumer's await dies with it, whatever the hook), and the hook's
    ``timeout=`` scope entered on the consumer's side (trio reports a corrupted cancel-scope
    stack when the consumer leaves its own ``move_on_after`` while the hook's deadline is
    still open)."""

    async def slow(turn: Turn):
        await anyio.sleep(2.5)
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["done"]), pre=[hook(slow, name="slow", timeout=timeout)])
    trace: list[tuple[str, float]] = []
    started = anyio.current_time()

    async with pipe.stream(start()) as events:
        while True:
            with anyio.move_on_after(1) as waited:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
            at = anyio.current_time() - started
            if waited.cancelled_caught:
                trace.append(("gave up waiting", at))
            else:
                trace.append((type(event).__name__, at))

    assert trace == [
        ("TurnStarted", 0.0),
        ("HookStarted", 0.0),
        ("gave up waiting", 1.0),
        ("gave up waiting", 2.0),
        ("HookFinished", 2.5),
        ("ModelCalled", 2.5),
        ("TextDelta", 2.5),
        ("ModelFinished", 2.5),
        ("ReplyReady", 2.5),
        ("TurnFinished", 2.5),
    ]
    assert events.result.outcome == "completed"
    assert [(h.hook, h.verdict) for h in events.result.audit.hooks] == [("slow", "cont")]


async def test_a_hooks_deadline_does_not_cancel_the_consumers_own_awaits(autojump_clock):
    """Catches: a hook's ``timeout=`` scope open in the consumer's task while the consumer
    runs its own code: the hook's deadline would cancel the consumer's sleep instead of the
    hook, and the consumer would see a cancellation instead of `HookTimeout`."""

    async def stuck(turn: Turn):
        await anyio.sleep(100)
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(stuck, name="stuck", timeout=1)])
    trace: list[tuple[str, float]] = []
    started = anyio.current_time()

    async with pipe.stream(start()) as events:
        try:
            async for event in events:
                trace.append((type(event).__name__, anyio.current_time() - started))
                if isinstance(event, HookStarted):
                    await anyio.sleep(5)
                    trace.append(("slept", anyio.current_time() - started))
        except HookTimeout as error:
            trace.append((f"raised HookTimeout {error.hook}", anyio.current_time() - started))

    assert trace == [
        ("TurnStarted", 0.0),
        ("HookStarted", 0.0),
        ("slept", 5.0),
        ("HookFailed", 5.0),
        ("raised HookTimeout stuck", 5.0),
    ]


async def test_the_turn_goes_on_while_the_consumer_awaits_between_events(autojump_clock):
    """Catches: a turn that only moves while the consumer waits in ``anext`` (a slow consumer
    would slow the model's stream and hold its connection open): each delta is stamped when
    the model produced it, and the turn has finished before the consumer reads its end."""

    async def paced(request):
        for index, word in enumerate(("one ", "two ", "three")):
            if index:
                await anyio.sleep(1)
            yield word

    pipe = Pipeline(model=FunctionModel(paced))
    trace: list[tuple[str, float, float]] = []
    started = anyio.current_time()

    async with pipe.stream(start()) as events:
        async for event in events:
            label = event.text if isinstance(event, TextDelta) else type(event).__name__
            trace.append((label, event.at, anyio.current_time() - started))
            if isinstance(event, TextDelta):
                await anyio.sleep(5)

    assert trace == [
        ("TurnStarted", 0.0, 0.0),
        ("ModelCalled", 0.0, 0.0),
        ("one ", 0.0, 0.0),
        ("two ", 1.0, 5.0),
        ("three", 2.0, 10.0),
        ("ModelFinished", 2.0, 15.0),
        ("ReplyReady", 2.0, 15.0),
        ("TurnFinished", 2.0, 15.0),
    ]


class Blocked:
    """A hook that blocks until cancelled, and records that it started and how it ended."""

    def __init__(self, trace: list[str]) -> None:
        self.trace = trace
        self.started = anyio.Event()

    async def __call__(self, turn: Turn):
        self.trace.append("hook started")
        self.started.set()
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            self.trace.append("hook cancelled")
            raise
        return cont(turn)


async def test_leaving_the_block_early_on_either_loop_cancels_the_turn_and_leaves_no_task():
    """Catches: a turn left running (or a task left behind) after the consumer breaks out,
    and a turn wound up without a real cancellation (its hook never sees one); on both
    loops. The consumer waits for the hook to start with its own await: a turn that moves
    only inside ``anext`` would never start it (the safety deadline turns that into a
    failure instead of a hang)."""
    trace: list[str] = []
    blocked = Blocked(trace)
    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(blocked, name="blocked")])
    before = live_tasks()

    with anyio.fail_after(5):
        async with pipe.stream(start()) as events:
            async for event in events:
                if isinstance(event, HookStarted):
                    await blocked.started.wait()
                    break

    assert trace == ["hook started", "hook cancelled"]
    assert live_tasks() == before
    with pytest.raises(RuntimeError, match="has not finished: its stream block was left"):
        _ = events.result


class Shielded(Blocked):
    """A hook that does its work behind an AnyIO shield (as a commit being written does)."""

    async def __call__(self, turn: Turn):
        self.trace.append("hook started")
        with anyio.CancelScope(shield=True):
            self.started.set()
            for _ in range(5):
                await anyio.sleep(0.01)
            self.trace.append("shielded work done")
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.trace.append("hook cancelled after its shield")
            raise
        return cont(turn)


async def test_a_cancelled_caller_waits_for_the_turns_shielded_work_on_either_loop():
    """Catches: a streamed turn stopped with a bare ``Task.cancel()`` under asyncio, which
    breaks through AnyIO's shields (a commit being written, a cancelled tool's after-tool
    hooks), and a block that goes on before the turn has ended. The caller's own scope is
    cancelled while the hook is inside its shield; AnyIO keeps cancelling the caller until
    it leaves that scope."""
    trace: list[str] = []
    shielded = Shielded(trace)
    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(shielded, name="shielded")])
    before = live_tasks()

    with anyio.fail_after(5):
        with anyio.CancelScope() as outer:
            async with pipe.stream(start()) as events:
                async for event in events:
                    if isinstance(event, HookStarted):
                        await shielded.started.wait()
                        outer.cancel()
                        await anyio.sleep(1)
                        trace.append("slept through the cancel")
        trace.append("left the block")

    assert outer.cancelled_caught
    assert trace == [
        "hook started",
        "shielded work done",
        "hook cancelled after its shield",
        "left the block",
    ]
    assert live_tasks() == before


async def test_a_streamed_turns_hook_sees_the_callers_deadline_on_either_loop():
    """Catches: the turn driven in a task outside the caller's cancel scopes under asyncio,
    so that a hook reading ``anyio.current_effective_deadline()`` (to skip slow work when
    time is short) sees none, unlike under trio and unlike the same turn through ``run()``."""
    seen: list[float] = []

    async def looks(turn: Turn):
        seen.append(anyio.current_effective_deadline())
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["ok", "ok"]), pre=[hook(looks, name="looks")])

    with anyio.move_on_after(60) as scope:
        await pipe.run(start())
        async with pipe.stream(start()) as events:
            async for _ in events:
                pass

    assert seen == [scope.deadline, scope.deadline]


async def test_a_deadline_the_caller_moves_while_streaming_is_the_one_the_turn_keeps():
    """Catches: the turn driven outside the caller's cancel scopes with a copy of the
    deadline taken when the block was entered, so that a caller pushing its deadline back
    (an idle timeout) still has the turn cut at the old one; on both loops."""

    async def paced(request: object):
        for index, word in enumerate(("one ", "two ", "three")):
            if index:
                await anyio.sleep(0.05)
            yield word

    pipe = Pipeline(model=FunctionModel(paced))
    deltas: list[str] = []

    with anyio.fail_after(5):
        with anyio.CancelScope(deadline=anyio.current_time() + 0.08) as scope:
            async with pipe.stream(start()) as events:
                scope.deadline = anyio.current_time() + 10
                async for event in events:
                    if isinstance(event, TextDelta):
                        deltas.append(event.text)

    assert not scope.cancelled_caught
    assert (deltas, events.result.outcome) == (["one ", "two ", "three"], "completed")


async def test_the_callers_deadline_passing_mid_turn_cancels_the_consumer_not_ends_it():
    """Catches: a caller's deadline that stops the turn and lets the consumer see a plain end
    of the events (running the code after its loop) instead of its own cancellation; on
    both loops, with the consumer waiting for the next event when the deadline passes."""
    trace: list[str] = []
    blocked = Blocked(trace)
    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(blocked, name="blocked")])

    with anyio.fail_after(5):
        with anyio.move_on_after(0.05) as scope:
            async with pipe.stream(start()) as events:
                async for event in events:
                    trace.append(type(event).__name__)
                trace.append("after the loop")

    assert scope.cancelled_caught
    # The drive runs ahead of its consumer until the hook blocks.
    assert trace == ["hook started", "TurnStarted", "HookStarted", "hook cancelled"]


class Fatal(BaseException):
    """Not an Exception: what a hook's SystemExit or KeyboardInterrupt is."""


async def test_a_turn_ended_by_a_base_exception_is_never_a_plain_end_of_its_events():
    """Catches: a turn whose task a BaseException that is not an Exception ended (a hook's
    SystemExit) read by its consumer as a plain end of the events — the code after its
    loop running as if the turn had finished — or that exception lost; on both loops."""

    async def fatal(turn: Turn):
        raise Fatal("stop everything")

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(fatal, name="fatal")])
    trace: list[str] = []

    async def consume() -> None:
        async with pipe.stream(start()) as events:
            async for event in events:
                trace.append(type(event).__name__)
            trace.append("after the loop")

    with pytest.raises(Fatal, match="stop everything"):
        await consume()

    assert trace == ["TurnStarted", "HookStarted"]


async def test_a_failing_hook_surfaces_once_from_the_iteration_and_not_again_on_leaving():
    """Catches: the turn's error raised twice (from the iteration and again from the
    block's exit), or lost when the consumer catches it; iterating again after it is a
    plain end, not a second raise."""
    cause = ValueError("boom")

    async def explode(turn: Turn):
        raise cause

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(explode, name="explode")])
    trace: list[str] = []

    async with pipe.stream(start()) as events:
        try:
            async for event in events:
                trace.append(type(event).__name__)
        except HookFailed as error:
            trace.append(f"raised {type(error).__name__} {error.hook}")
        async for event in events:
            trace.append(f"again {type(event).__name__}")
        trace.append("iterated again")
    trace.append("left the block")

    assert trace == [
        "TurnStarted",
        "HookStarted",
        "HookFailed",
        "raised HookFailed explode",
        "iterated again",
        "left the block",
    ]


async def test_a_failing_hook_of_a_turn_nobody_iterates_is_raised_once_on_leaving():
    """Catches: the error of a turn whose events were never read lost on leaving the block
    (or wrapped in an ExceptionGroup)."""

    async def explode(turn: Turn):
        raise ValueError("boom")

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(explode, name="explode")])

    with pytest.raises(HookFailed) as excinfo:
        async with pipe.stream(start()) as events:
            await anext(events)  # TurnStarted; the failure comes after it

    assert type(excinfo.value) is HookFailed
    assert excinfo.value.hook == "explode"


def every_stage() -> Pipeline:
    """Pre hooks (one skipped, one shadow, one with a deadline), a guardrail that rejects
    the first attempt, and a post hook: every kind of event but tools, in a fixed order."""
    attempts = iter(["internal use only", "fine"])

    async def keep(turn: Turn):
        return cont(turn)

    async def shadowed(turn: Turn):
        return halt("would stop")

    async def guard(turn: Turn):
        if "internal" in turn.reply.text:
            return regenerate("no internal material")
        return cont(turn)

    return Pipeline(
        model=FunctionModel(lambda request: [*next(attempts).split(" ")]),
        pre=[
            hook(keep, name="first"),
            hook(keep, name="skipped", when=lambda turn: False),
            hook(shadowed, name="shadow", shadow=True),
            hook(keep, name="timed", timeout=5),
        ],
        post=[hook(guard, name="guard"), hook(keep, name="after")],
    )


def debug_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The turn's events as the debug log reported them, without their times."""
    return [
        record.getMessage().split(" at=")[0]
        for record in caplog.records
        if record.levelname == "DEBUG"
    ]


async def test_streamed_events_arrive_in_the_order_run_emits_them(caplog):
    """Catches: events reordered on their way to the consumer (a buffered event handed over
    after a later one, events of a scoped step delivered late out of turn), by comparing
    the whole sequence the consumer receives with the sequence `run` reports for the same
    turn through the debug log."""
    caplog.set_level("DEBUG", logger="turnplug.pipeline")
    await every_stage().run(start())
    ran = debug_lines(caplog)
    caplog.clear()

    received = []
    async with every_stage().stream(start()) as events:
        async for event in events:
            received.append(event)
    logged = debug_lines(caplog)

    prefix = f"turn {TURN_REF}: "
    assert ran == logged
    assert [line.removeprefix(prefix).split(" ")[0] for line in ran] == [
        kind for kind in kinds(received) if kind != "TextDelta"
    ]
    assert [line.removeprefix(prefix) for line in ran] == [
        "TurnStarted",
        "HookStarted hook=first stage=pre",
        "HookFinished hook=first stage=pre verdict=cont",
        "HookSkipped hook=skipped stage=pre",
        "HookStarted hook=shadow stage=pre",
        "HookFinished hook=shadow stage=pre verdict=halt",
        "ShadowVerdict hook=shadow stage=pre verdict=halt",
        "HookStarted hook=timed stage=pre",
        "HookFinished hook=timed stage=pre verdict=cont",
        "ModelCalled attempt=1 step=1 model=FunctionModel",
        "ModelFinished attempt=1 step=1",
        "ReplyReady",
        "HookStarted hook=guard stage=post",
        "HookFinished hook=guard stage=post verdict=regenerate",
        "AttemptRejected hook=guard attempt=1",
        "ModelCalled attempt=2 step=1 model=FunctionModel",
        "ModelFinished attempt=2 step=1",
        "ReplyReady",
        "HookStarted hook=guard stage=post",
        "HookFinished hook=guard stage=post verdict=cont",
        "HookStarted hook=after stage=post",
        "HookFinished hook=after stage=post verdict=cont",
        "TurnFinished outcome=completed",
    ]
    assert [(event.text, event.attempt) for event in received if isinstance(event, TextDelta)] == [
        ("internal", 1),
        ("use", 1),
        ("only", 1),
        ("fine", 2),
    ]


# -- entering a stream or a session once ------------------------------------------------------


async def test_entering_one_pipe_stream_twice_is_a_runtime_error_saying_what_to_call():
    """Catches: a `pipe.stream(turn)` kept and entered again failing with contextlib's
    AttributeError ("'_AsyncGeneratorContextManager' object has no attribute 'args'")."""
    model = ScriptedModel(["one", "two"])
    streamed = Pipeline(model=model).stream(start())
    async with streamed as events:
        async for _ in events:
            pass

    with pytest.raises(RuntimeError) as excinfo:
        async with streamed:
            pass

    assert str(excinfo.value) == (
        "pipe.stream(turn) is for one `async with`, and this one was entered already — call"
        " pipe.stream(turn) again for each block"
    )
    assert len(model.requests) == 1


async def test_entering_one_session_stream_twice_is_a_runtime_error_saying_what_to_call():
    """Catches: a `session.stream(text)` kept and entered again failing with contextlib's
    AttributeError, naming nothing."""
    model = ScriptedModel(["one", "two"])
    async with Pipeline(model=model).session(log=MemoryLog(), conversation_id="c") as session:
        streamed = session.stream("hi")
        async with streamed as events:
            async for _ in events:
                pass

        with pytest.raises(RuntimeError, match=r"^session\.stream\(\.\.\.\) is for one `async"):
            async with streamed:
                pass

    assert len(model.requests) == 1


async def test_entering_one_pipe_session_twice_is_a_runtime_error_saying_what_to_call():
    """Catches: a `pipe.session(...)` kept and entered again (once per request, say) failing
    with contextlib's AttributeError, naming nothing."""
    trace = []
    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_start=[lambda info: trace.append("start") or cont(info.scope)],
    )
    opened = pipe.session(log=MemoryLog(), conversation_id="c")
    async with opened:
        pass

    with pytest.raises(RuntimeError, match=r"^pipe\.session\(\.\.\.\) is for one `async with`"):
        async with opened:
            pass

    assert trace == ["start"]


async def test_exiting_a_pipe_session_never_entered_or_twice_is_a_runtime_error_saying_which():
    """Bug caught: `await pipe.session(...).__aexit__(...)` never entered ran the session's
    setup (its start hooks, its task group) and failed with contextlib's "generator didn't
    stop", leaving that setup open; a second exit said the same."""
    trace = []
    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_start=[lambda info: trace.append("start") or cont(info.scope)],
        on_session_end=[lambda info, reason: trace.append(reason)],
    )
    opened = pipe.session(log=MemoryLog(), conversation_id="c")

    with pytest.raises(RuntimeError, match=r"^exiting pipe\.session\(\.\.\.\), which was never"):
        await opened.__aexit__(None, None, None)
    assert trace == []
    async with opened:
        pass
    with pytest.raises(RuntimeError, match=r"^exiting pipe\.session\(\.\.\.\), which was exited"):
        await opened.__aexit__(None, None, None)

    assert trace == ["start", "closed"]


async def test_the_result_of_a_stream_left_early_says_the_block_was_left_not_to_iterate_on():
    """Catches: `events.result` read after leaving the block early telling the caller to
    iterate the events to the end, which the closed stream no longer allows."""

    async def waits(turn):
        await anyio.sleep_forever()

    async with Pipeline(pre=[waits], model=ScriptedModel([["a", "b"]])).stream(start()) as events:
        async for event in events:
            if isinstance(event, HookStarted):
                break

    with pytest.raises(RuntimeError) as excinfo:
        _ = events.result

    assert str(excinfo.value) == (
        "the turn has not finished: its stream block was left before the end of its events,"
        " which cancels a turn still running, so it has no result — iterate the events to the"
        " end inside the block, then read events.result"
    )


@pytest.mark.parametrize("last", [Committed, TurnFinished])
async def test_the_result_of_a_finished_turn_whose_events_were_left_unread_says_it_finished(last):
    """Catches: `events.result` read after the block was left on `Committed` or
    `TurnFinished` saying the block's exit cancelled the turn, so it has no result, when the
    turn had finished and was committed (a caller believing it would send the turn again);
    and the claim that the rest of the events cannot be read after the block."""
    log = MemoryLog()
    async with Pipeline(model=ScriptedModel(["answer"])).session(log=log, conversation_id="c") as s:
        async with s.stream("hi") as events:
            async for event in events:
                if isinstance(event, last):
                    break

        with pytest.raises(RuntimeError) as excinfo:
            _ = events.result
        rest = [type(event) async for event in events]

    assert str(excinfo.value) == (
        "the turn finished, but its events were not read to the end: iterate the rest of them"
        " (they can still be read after the stream block), then read events.result"
    )
    assert rest == ([TurnFinished] if last is Committed else [])
    assert events.result.outcome == "completed"
    assert [m.text for m in (await log.load("c")).messages] == ["hi", "answer"]


# -- interrupts -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["pipeline", "session"])
@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_in_a_streamed_turn_reaches_the_consumer_cleanly(
    loop: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a hook of a streamed turn raising KeyboardInterrupt under asyncio let it out
    of the drive's task, which stopped the loop: the consumer's iteration was cancelled, and
    once the caller got the interrupt asyncio printed "Task exception was never retrieved"
    with its traceback (under trio too the iteration was cancelled, the block raising it).
    The iteration now raises it, as if the consumer had run the turn itself, and nothing of
    the turn is committed."""

    pipe = interrupted_pipe()
    log = MemoryLog()
    raised: list[str] = []

    async def consume(events) -> None:
        try:
            async for _ in events:
                pass
        except BaseException as exc:
            raised.append(type(exc).__name__)
            raise

    async def main() -> None:
        await consume_in(where, pipe, consume, log)

    left = warnings_of_an_interrupted_run(loop, main)
    assert raised == ["KeyboardInterrupt"]
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert left == []
    assert trio.run(log.entries, "c") == ()


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_in_a_streamed_turn_stops_a_consumer_busy_elsewhere(
    loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a streamed turn's hook raising KeyboardInterrupt while its consumer awaited
    something else in its block (not the next event): under asyncio it left the drive's
    task and stopped the loop, asyncio reporting the task ("Task exception was never
    retrieved"). The block is cancelled, as trio's nursery cancels it, and raises it."""

    async def main() -> None:
        gate = anyio.Event()

        async def interrupted(turn):
            await gate.wait()
            raise KeyboardInterrupt

        pipe = Pipeline(model=ScriptedModel(["never"]), pre=[hook(interrupted, name="i")])
        async with pipe.stream(Turn.start("hi")) as events:
            async for event in events:
                if isinstance(event, HookStarted):
                    gate.set()
                    await anyio.sleep(10)

    left = warnings_of_an_interrupted_run(loop, main)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert left == []


async def test_a_system_exit_in_a_streamed_turn_is_not_lost_to_the_callers_cancellation():
    """Bug caught: a streamed turn's hook cancelling the caller's scope (as a deadline passing
    at that instant would) and raising SystemExit: kept only by the drive, the stream's task
    group absorbing its own cancellation of the block would have lost it, and the caller's
    scope absorbed the rest: the stream ended as if nothing happened."""
    scopes: list[anyio.CancelScope] = []

    async def exiting(turn):
        scopes[0].cancel()
        raise SystemExit(3)

    pipe = Pipeline(model=ScriptedModel(["never"]), pre=[hook(exiting, name="exiting")])

    async def caller() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            async with pipe.stream(Turn.start("hi")) as events:
                async for _ in events:
                    await anyio.lowlevel.checkpoint()

    with pytest.raises(SystemExit) as info:
        await caller()
    assert info.value.code == 3


def woken_then_interrupted() -> tuple[Pipeline, anyio.Event]:
    """A turn interrupted just after the drive woke the waiting consumer, and its gate.

    `first` waits for the gate, which the consumer sets on its HookStarted before waiting again
    at once: `first` ends, `second` starts and raises KeyboardInterrupt while the consumer is
    woken for HookFinished but has not run yet.
    """
    gate = anyio.Event()

    async def first(turn):
        await gate.wait()
        return cont(turn)

    async def second(turn):
        raise KeyboardInterrupt

    pipe = Pipeline(
        model=ScriptedModel(["never"]), pre=[hook(first, name="first"), hook(second, name="second")]
    )
    return pipe, gate


async def consume_in(
    where: str,
    pipe: Pipeline,
    consume: Callable[[AsyncIterable[Event]], Awaitable[None]],
    log: MemoryLog | None = None,
) -> None:
    """Run `consume` in the block of a streamed turn of `pipe`, or of its session's turn
    (conversation "c" of `log`, a new one by default)."""
    if where == "pipeline":
        async with pipe.stream(Turn.start("hi")) as events:
            await consume(events)
    else:
        async with (
            pipe.session(log=log or MemoryLog(), conversation_id="c") as session,
            session.stream("hi") as events,
        ):
            await consume(events)


def hook_event(event: Event) -> str:
    return f"{type(event).__name__} {getattr(event, 'hook', '')}".strip()


def started(event: Event, name: str) -> bool:
    return isinstance(event, HookStarted) and event.hook == name


@pytest.mark.parametrize("leaves", [False, True], ids=["in_its_loop", "broke_out"])
@pytest.mark.parametrize("where", ["pipeline", "session"])
async def test_an_interrupt_just_after_the_consumer_was_woken_cancels_its_await_after_the_events(
    where, leaves
):
    """Bug caught: a stream that spared a consumer woken for an event just before a hook
    raised KeyboardInterrupt (to hand it the events emitted before) let an await of the
    consumer's own (in its loop, or after breaking out) hold the interrupt back as long as it
    waited, forever on what a later hook would have done (both loops)."""
    pipe, gate = woken_then_interrupted()
    seen: list[str] = []

    async def busy() -> None:
        # Waiting on something the turn would have done; bounded, so that an await left
        # alone fails the test instead of hanging it.
        try:
            for _ in range(1000):
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            seen.append("await cancelled")
            raise
        seen.append("await not cancelled")

    async def consume(events: AsyncIterable[Event]) -> None:
        async for event in events:
            seen.append(hook_event(event))
            if started(event, "first"):
                gate.set()
            elif started(event, "second"):
                if leaves:
                    break
                await busy()
        if leaves:
            await busy()

    with pytest.raises(KeyboardInterrupt):
        await consume_in(where, pipe, consume)
    assert seen == [
        "TurnStarted",
        "HookStarted first",
        "HookFinished first",
        "HookStarted second",
        "await cancelled",
    ]


def interrupted_pipe() -> Pipeline:
    async def interrupted(turn):
        raise KeyboardInterrupt

    return Pipeline(model=ScriptedModel(["never"]), pre=[hook(interrupted, name="interrupted")])


async def no_interrupt_after(main: Callable[[], Awaitable[None]]) -> None:
    """Await `main`, failing the test (not ending the test run) if a KeyboardInterrupt escapes."""
    try:
        await main()
    except KeyboardInterrupt:
        pytest.fail("the block raised the KeyboardInterrupt its consumer had handled")


@pytest.mark.parametrize("where", ["pipeline", "session"])
async def test_a_consumer_that_handles_the_interrupt_its_iteration_raised_carries_on(where):
    """Bug caught: a streamed turn's KeyboardInterrupt, raised by the consumer's iteration and
    caught there, was raised again by the stream block when it exited, so a consumer could
    not handle it as `pipe.run`'s caller can (Pipeline.stream and session.stream)."""
    pipe = interrupted_pipe()
    seen: list[str] = []

    async def consume(events) -> None:
        try:
            async for _ in events:
                pass
        except KeyboardInterrupt:
            seen.append("interrupt")

    async def main() -> None:
        await consume_in(where, pipe, consume)
        seen.append("after the block")

    await no_interrupt_after(main)
    assert seen == ["interrupt", "after the block"]


@pytest.mark.parametrize("where", ["pipeline", "session"])
async def test_a_consumer_that_turns_the_interrupt_into_its_own_error_keeps_it(where):
    """Bug caught: a consumer turning the KeyboardInterrupt its iteration raised into an error
    of its own (`raise RuntimeError(...) from exc`) had that error replaced by the same
    KeyboardInterrupt, raised again by the stream block."""
    pipe = interrupted_pipe()

    async def consume(events) -> None:
        try:
            async for _ in events:
                pass
        except KeyboardInterrupt as exc:
            raise RuntimeError("aborted by the user") from exc

    async def main() -> None:
        await consume_in(where, pipe, consume)

    with pytest.raises(RuntimeError, match="aborted by the user") as info:
        await no_interrupt_after(main)
    assert isinstance(info.value.__cause__, KeyboardInterrupt)


def interrupted_at(where: str) -> Pipeline:
    """A pipeline whose hook 'stop' raises KeyboardInterrupt: an ordered pre hook (the
    drive's inlined path, or with a when= predicate), a post hook, or a parallel group's
    member once its sibling 'other' has started."""
    started = anyio.Event()

    async def stop(turn):
        await started.wait()
        raise KeyboardInterrupt

    async def other(turn):
        started.set()
        await anyio.sleep_forever()

    if where != "member":
        started.set()
    model = ScriptedModel(["never" if where != "post" else "ok"])
    if where == "pre":
        return Pipeline(model=model, pre=[hook(stop, name="stop")])
    if where == "pre_when":
        return Pipeline(model=model, pre=[hook(stop, name="stop", when=lambda turn: True)])
    if where == "post":
        return Pipeline(model=model, post=[hook(stop, name="stop")])
    group = parallel(hook(stop, name="stop"), hook(other, name="other"))
    return Pipeline(model=model, pre=[group])


@pytest.mark.parametrize("where", ["pre", "pre_when", "post", "member"])
async def test_a_hook_raising_an_interrupt_ends_its_hook_started_in_the_events(where):
    """Bug caught: an ordered hook or a parallel member raising KeyboardInterrupt left its
    HookStarted open in the streamed events, so a timeline showed it running forever."""
    seen: list[Event] = []

    async def consume(events: AsyncIterable[Event]) -> None:
        async for event in events:
            seen.append(event)

    with pytest.raises(KeyboardInterrupt):
        await consume_in("pipeline", interrupted_at(where), consume)
    trace = [
        (type(e).__name__, e.hook, getattr(e, "error", getattr(e, "verdict", None)))
        for e in seen
        if type(e) in (ev.HookStarted, ev.HookFinished, ev.HookFailed)
    ]
    if where == "member":
        # The two start together, in the order the loop runs their tasks.
        assert sorted(trace[:2]) == [("HookStarted", "other", None), ("HookStarted", "stop", None)]
        assert trace[2:] == [
            ("HookFailed", "stop", "KeyboardInterrupt"),
            ("HookFinished", "other", "cancelled"),
        ]
    else:
        assert trace == [("HookStarted", "stop", None), ("HookFailed", "stop", "KeyboardInterrupt")]
    assert [e.enforced for e in seen if type(e) is ev.HookFailed] == [True]


class Unprintable:
    """An exit code whose str() raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this exit code")


async def test_an_interrupt_whose_text_cannot_be_made_still_reaches_the_caller():
    """Bug caught: a hook raising SystemExit of an object whose __str__ raises had that
    RuntimeError, raised while its HookFailed was written, replace the SystemExit."""
    code = Unprintable()

    async def leave(turn: Turn):
        raise SystemExit(code)

    pipe = Pipeline(model=ScriptedModel(["never"]), pre=[hook(leave, name="leave")])
    seen: list[Event] = []

    with pytest.raises(SystemExit) as info:
        await collect_into(seen, pipe, Turn.start("hi"))
    assert info.value.code is code
    assert [(e.hook, e.error, e.enforced) for e in seen if type(e) is ev.HookFailed] == [
        ("leave", "SystemExit", True)
    ]
