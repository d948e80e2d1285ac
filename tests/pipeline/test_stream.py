"""Pipeline.stream: one drive loop with run, events of the turn, failures and cancellation."""

from collections.abc import Callable

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import HookFailed, Pipeline, TurnResult, cont, halt, hook, parallel
from pipeline.events import HookStarted, TextDelta
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Text, Turn

from .support import collect, live_tasks

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
