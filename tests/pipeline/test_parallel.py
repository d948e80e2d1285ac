"""Parallel groups in the pre list: concurrency, declaration order, halts and failures."""

import inspect
import threading

import anyio
import anyio.lowlevel
import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given, settings

from pipeline import (
    HookFailed,
    HookReturnError,
    HookTimeout,
    Pipeline,
    chain,
    cont,
    halt,
    hook,
    parallel,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Injection, Message, Text, ToolCall, Turn

from .support import collect, warnings_of_an_interrupted_run

BARRIER_TIMEOUT = 5.0
"""Real seconds a sync member waits for its sibling at the barrier before giving up."""


def member(name, *, delay=0, parts=None, trace=None, seen=None, **options):
    """A group member: sleeps `delay` (if any), notes it finished, then adds `parts`."""

    async def run(turn):
        if seen is not None:
            seen[name] = turn
        if delay:
            await anyio.sleep(delay)
        if trace is not None:
            trace.append(name)
        return [Text(name)] if parts is None else parts

    return hook(run, name=name, **options)


def halter(name, *, delay=0, trace=None, **options):
    """A group member that halts, after `delay` if given (else without any checkpoint)."""

    async def run(turn):
        if delay:
            await anyio.sleep(delay)
        if trace is not None:
            trace.append(name)
        return halt(f"{name} says no")

    return hook(run, name=name, **options)


def failer(name, *, delay=0, trace=None, error=None, **options):
    """A group member that raises, after `delay` if given (else without any checkpoint)."""

    async def run(turn):
        if delay:
            await anyio.sleep(delay)
        if trace is not None:
            trace.append(name)
        raise error if error is not None else ValueError(f"{name} broke")

    return hook(run, name=name, **options)


def returning(name, make, **options):
    """A group member that returns `make(turn)`."""

    async def run(turn):
        return make(turn)

    return hook(run, name=name, **options)


def injecting(name, text):
    """An ordered hook that injects `text`."""

    async def run(turn):
        return cont(turn.inject(Text(text)))

    return hook(run, name=name)


def passing(name):
    """An ordered hook that changes nothing."""

    async def run(turn):
        return cont(turn)

    return hook(run, name=name)


def pipe_with(*entries, model=None):
    return Pipeline(model=model or ScriptedModel(["ok"]), pre=list(entries))


def sources(result):
    return [injection.source for injection in result.turn.injections]


# -- latency and order ---------------------------------------------------------------------


async def test_group_takes_as_long_as_its_slowest_member(autojump_clock):
    pipe = pipe_with(
        parallel(member("a", delay=1), member("b", delay=3), member("c", delay=2)),
    )
    started = anyio.current_time()
    await pipe.run(Turn.start("hi"))
    assert anyio.current_time() - started == 3


@settings(deadline=None, max_examples=40)
@given(st.permutations([0, 1, 2, 3]))
def test_injections_follow_declaration_order_whatever_the_completion_order(delays):
    names = ["m0", "m1", "m2", "m3"]
    pipe = pipe_with(parallel(*(member(n, delay=d) for n, d in zip(names, delays, strict=True))))

    async def main():
        return await pipe.run(Turn.start("hi"))

    result = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [(i.source, i.parts) for i in result.turn.injections] == [
        (name, (Text(name),)) for name in names
    ]


async def test_injections_are_stamped_with_their_member_name_and_durability():
    pipe = pipe_with(parallel(member("a", durable=True), member("b")))
    result = await pipe.run(Turn.start("hi"))
    assert result.turn.injections == (
        Injection((Text("a"),), "a", True, "pre"),
        Injection((Text("b"),), "b", False, "pre"),
    )


async def test_members_all_see_the_same_input_turn_not_each_others_output(autojump_clock):
    seen = {}
    pipe = pipe_with(
        injecting("before", "earlier"),
        parallel(
            member("a", delay=0, seen=seen),
            member("b", delay=1, seen=seen),
            member("c", delay=2, seen=seen),
        ),
    )
    await pipe.run(Turn.start("hi"))
    before = (Injection((Text("earlier"),), "before", False, "pre"),)
    assert {name: turn.injections for name, turn in seen.items()} == {
        "a": before,
        "b": before,
        "c": before,
    }


async def test_injected_events_come_in_declaration_order_in_the_stream(autojump_clock):
    pipe = pipe_with(
        parallel(member("a", delay=3), member("b", delay=2), member("c", delay=1)),
    )
    events, _ = await collect(pipe, Turn.start("hi"))
    assert [e.hook for e in events if isinstance(e, ev.Injected)] == ["a", "b", "c"]


async def test_member_returning_an_empty_list_adds_nothing():
    model = ScriptedModel(["ok"])
    pipe = pipe_with(parallel(member("a", parts=[])), model=model)
    result = await pipe.run(Turn.start("hi"))
    assert (result.turn.injections, model.requests[0].messages) == ((), (Message.user("hi"),))


async def test_member_whose_when_is_false_is_skipped():
    pipe = pipe_with(parallel(member("a"), member("b", when=lambda turn: False)))
    result = await pipe.run(Turn.start("hi"))
    assert sources(result) == ["a"]


async def test_skipped_member_is_reported_as_skipped():
    pipe = pipe_with(parallel(member("a"), member("b", when=lambda turn: False)))
    events, result = await collect(pipe, Turn.start("hi"))
    assert ev.HookSkipped(result.turn.turn_ref, "b", "pre") in events
    assert [(r.hook, r.verdict) for r in result.audit.hooks if r.hook == "b"] == [("b", "skipped")]


async def test_group_inside_a_chain_runs_between_its_neighbours():
    seen = []

    async def last(turn):
        seen.extend(injection.source for injection in turn.injections)
        return cont(turn)

    pipe = pipe_with(
        chain(
            injecting("first", "1"),
            parallel(member("b"), member("c")),
            hook(last, name="last"),
            name="ch",
        ),
    )
    await pipe.run(Turn.start("hi"))
    assert seen == ["ch.first", "ch.b", "ch.c"]


# -- sync members ---------------------------------------------------------------------------


async def test_sync_members_run_concurrently():
    # Both members can only pass the barrier if they wait at it at the same time.
    barrier = threading.Barrier(2)

    def make(name):
        def run(turn):
            barrier.wait(timeout=BARRIER_TIMEOUT)
            return [Text(name)]

        return hook(run, name=name)

    result = await pipe_with(parallel(make("a"), make("b"))).run(Turn.start("hi"))
    assert sources(result) == ["a", "b"]


async def test_sync_member_runs_in_a_worker_thread():
    threads = []

    def run(turn):
        threads.append(threading.get_ident())
        return [Text("a")]

    await pipe_with(parallel(hook(run, name="a"))).run(Turn.start("hi"))
    assert threads != [threading.get_ident()]
    assert len(threads) == 1


async def parts_named(name):
    await anyio.lowlevel.checkpoint()
    return [Text(name)]


async def test_a_sync_member_returning_an_awaitable_is_awaited():
    """A sync member that returns a coroutine (a lambda around an async function) used to
    fail on trio, which refuses a coroutine from a worker thread, while asyncio awaited it."""
    result = await pipe_with(parallel(hook(lambda turn: parts_named("a"), name="a"))).run(
        Turn.start("hi")
    )
    assert sources(result) == ["a"]


async def test_a_sync_member_with_a_timeout_returning_an_awaitable_is_awaited():
    """The same through the timeout's worker thread."""
    late = hook(lambda turn: parts_named("a"), name="a", timeout=5)
    result = await pipe_with(parallel(late)).run(Turn.start("hi"))
    assert sources(result) == ["a"]


# -- halts ------------------------------------------------------------------------------------


async def test_halting_member_cancels_its_running_siblings(autojump_clock):
    trace = []
    pipe = pipe_with(
        parallel(
            member("slow1", delay=10, trace=trace),
            halter("stop", delay=1, trace=trace),
            member("slow2", delay=10, trace=trace),
        ),
    )
    await pipe.run(Turn.start("hi"))
    assert trace == ["stop"]


async def test_cancelled_siblings_are_audited_as_cancelled(autojump_clock):
    pipe = pipe_with(
        parallel(
            member("slow1", delay=10),
            halter("stop", delay=1),
            member("slow2", delay=10),
        ),
    )
    result = await pipe.run(Turn.start("hi"))
    assert {r.hook: r.verdict for r in result.audit.hooks} == {
        "slow1": "cancelled",
        "stop": "halt",
        "slow2": "cancelled",
    }


async def test_halting_member_halts_the_turn_before_the_model(autojump_clock):
    model = ScriptedModel(["ok"])
    pipe = pipe_with(parallel(member("a", delay=5), halter("stop", delay=1)), model=model)
    result = await pipe.run(Turn.start("hi"))
    assert (result.outcome, result.halt.hook, model.requests) == ("halted", "stop", [])


async def test_group_halts_with_the_lowest_position_halting_member():
    # Both halt in the same scheduling batch; trio randomizes which runs first, so repeat.
    pipe = pipe_with(parallel(member("a"), halter("first"), halter("second")))
    halts = [(await pipe.run(Turn.start("hi"))).halt for _ in range(12)]
    assert {(h.hook, h.reason) for h in halts} == {("first", "first says no")}


async def test_shadow_member_halt_does_not_halt_the_group():
    pipe = pipe_with(parallel(member("a"), halter("watch", shadow=True)))
    result = await pipe.run(Turn.start("hi"))
    assert (result.outcome, sources(result)) == ("completed", ["a"])


# -- failures ---------------------------------------------------------------------------------


async def test_failing_member_raises_hook_failed_naming_it():
    pipe = pipe_with(passing("first"), parallel(member("ok"), failer("boom")))
    with pytest.raises(HookFailed) as info:
        await pipe.run(Turn.start("hi"))
    assert type(info.value) is HookFailed
    assert info.value.hook == "boom"
    assert "'boom' (pre, position 2.2)" in str(info.value)


async def test_failing_member_keeps_the_original_exception_as_cause():
    original = ValueError("bad input")
    pipe = pipe_with(parallel(member("ok"), failer("boom", error=original)))
    with pytest.raises(HookFailed) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.__cause__ is original


async def test_failing_member_raises_directly_from_the_stream():
    pipe = pipe_with(parallel(member("ok"), failer("boom")))
    with pytest.raises(HookFailed) as info:
        await collect(pipe, Turn.start("hi"))
    assert (type(info.value), info.value.hook) == (HookFailed, "boom")


async def test_failing_member_cancels_its_running_siblings(autojump_clock):
    trace = []
    pipe = pipe_with(
        parallel(
            member("slow1", delay=10, trace=trace),
            failer("boom", delay=1, trace=trace),
            member("slow2", delay=10, trace=trace),
        ),
    )
    with pytest.raises(HookFailed):
        await pipe.run(Turn.start("hi"))
    assert trace == ["boom"]


async def test_two_failing_members_raise_the_lowest_position_failure():
    # Both fail in the same scheduling batch; trio randomizes which runs first, so repeat.
    pipe = pipe_with(parallel(member("ok"), failer("first"), failer("second")))
    raised = []
    for _ in range(12):
        with pytest.raises(HookFailed) as info:
            await pipe.run(Turn.start("hi"))
        raised.append(info.value.hook)
    assert raised == ["first"] * 12


async def test_two_failing_members_attach_the_other_failure_as_a_note():
    pipe = pipe_with(parallel(failer("first"), failer("second")))
    with pytest.raises(HookFailed) as info:
        await pipe.run(Turn.start("hi"))
    notes = getattr(info.value, "__notes__", [])
    assert any("second" in note for note in notes)


async def test_skip_member_that_raises_contributes_nothing_and_the_others_land():
    pipe = pipe_with(parallel(member("a"), failer("flaky", on_error="skip"), member("c")))
    result = await pipe.run(Turn.start("hi"))
    assert (result.outcome, sources(result)) == ("completed", ["a", "c"])


async def test_skip_member_failure_is_reported_as_not_enforced():
    pipe = pipe_with(parallel(member("a"), failer("flaky", on_error="skip")))
    events, _ = await collect(pipe, Turn.start("hi"))
    failed = [(e.hook, e.enforced) for e in events if isinstance(e, ev.HookFailed)]
    assert failed == [("flaky", False)]


async def test_group_audit_records_follow_declaration_order_whatever_finishes_first(
    autojump_clock,
):
    pipe = pipe_with(
        parallel(
            member("slow", delay=3),
            failer("flaky", delay=1, on_error="skip"),
            member("watch", delay=2, shadow=True),
            member("fast", delay=0),
        )
    )
    result = await pipe.run(Turn.start("hi"))
    assert [(r.hook, r.verdict) for r in result.audit.hooks] == [
        ("slow", "parts"),
        ("flaky", "failed"),
        ("watch", "parts"),
        ("fast", "parts"),
    ]


def broken_predicate(turn):
    raise ValueError("when= broke")


@pytest.mark.parametrize(
    ("when", "verdict"), [(lambda turn: False, "skipped"), (broken_predicate, "failed")]
)
async def test_a_skipped_members_audit_record_keeps_its_declaration_position(when, verdict):
    """Bug caught: a member skipped by its `when=` (or failing open in it) was audited before
    every member of its group, whatever its position, as the others were added after the run."""
    pipe = pipe_with(
        parallel(member("first"), member("middle", when=when, on_error="skip"), member("last"))
    )
    result = await pipe.run(Turn.start("hi"))
    assert [(r.hook, r.verdict) for r in result.audit.hooks] == [
        ("first", "parts"),
        ("middle", verdict),
        ("last", "parts"),
    ]


# -- shadow members ---------------------------------------------------------------------------


async def test_shadow_member_parts_are_discarded():
    pipe = pipe_with(parallel(member("a"), member("watch", shadow=True)))
    result = await pipe.run(Turn.start("hi"))
    assert sources(result) == ["a"]


async def test_shadow_member_verdict_is_recorded_in_the_audit():
    pipe = pipe_with(parallel(member("a"), member("watch", shadow=True)))
    result = await pipe.run(Turn.start("hi"))
    assert [(r.verdict, r.shadow) for r in result.audit.hooks if r.hook == "watch"] == [
        ("parts", True)
    ]


async def test_shadow_member_verdict_is_an_event():
    pipe = pipe_with(parallel(member("a"), member("watch", shadow=True)))
    events, _ = await collect(pipe, Turn.start("hi"))
    verdicts = [(e.hook, e.verdict) for e in events if isinstance(e, ev.ShadowVerdict)]
    assert verdicts == [("watch", "parts")]


# -- wrong returns ----------------------------------------------------------------------------

WRONG_RETURNS = [
    pytest.param(lambda turn: turn, id="turn"),
    pytest.param(lambda turn: cont(turn), id="cont"),
    pytest.param(lambda turn: None, id="none"),
    pytest.param(lambda turn: "some text", id="str"),
    pytest.param(lambda turn: Text("some text"), id="single-text"),
    pytest.param(lambda turn: ["some text"], id="list-of-str"),
]


@pytest.mark.parametrize("make", WRONG_RETURNS)
async def test_member_with_a_wrong_return_fails_naming_it(make):
    pipe = pipe_with(parallel(member("ok"), returning("bad", make)))
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "bad"
    assert "'bad' (pre, position 1.2)" in str(info.value)
    assert "list of parts" in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda turn: turn, id="turn"),
        pytest.param(lambda turn: cont(turn), id="cont"),
    ],
)
async def test_member_returning_the_turn_is_told_members_are_append_only(make):
    pipe = pipe_with(parallel(returning("bad", make)))
    with pytest.raises(HookReturnError, match="append-only"):
        await pipe.run(Turn.start("hi"))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda turn: (Text(doc) for doc in ("a", "b")), id="generator"),
        pytest.param(lambda turn: map(Text, ("a", "b")), id="map"),
    ],
)
async def test_member_returning_an_iterator_of_parts_is_told_to_return_a_list(make):
    """Bug caught: a member returning its parts as a generator expression or map(...) got
    an error naming what it returned but no likely fix."""
    pipe = pipe_with(parallel(returning("lazy", make)))
    with pytest.raises(
        HookReturnError, match=r"'lazy' \(pre, position 1\.1\).*return a list, not an iterator"
    ):
        await pipe.run(Turn.start("hi"))


async def test_member_returning_a_coroutine_it_forgot_to_await_is_told_to_await_it():
    """Bug: a member returning a search's coroutine without awaiting it got no hint, and the
    coroutine was left to warn "never awaited" after the error."""
    made = []

    async def search(turn):
        return [Text("doc")]

    async def sloppy(turn):
        coroutine = search(turn)
        made.append(coroutine)
        return coroutine

    pipe = pipe_with(parallel(member("ok"), hook(sloppy, name="sloppy")))
    with pytest.raises(HookReturnError, match=r"'sloppy' \(pre, position 1\.2\).*forget `await`"):
        await pipe.run(Turn.start("hi"))
    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED]


async def test_member_wrong_return_is_enforced_even_with_on_error_skip():
    pipe = pipe_with(parallel(member("ok"), returning("bad", lambda t: t, on_error="skip")))
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "bad"


async def test_shadow_member_wrong_return_is_not_enforced():
    pipe = pipe_with(parallel(member("ok"), returning("bad", lambda t: t, shadow=True)))
    result = await pipe.run(Turn.start("hi"))
    assert (result.outcome, sources(result)) == ("completed", ["ok"])


async def test_a_cancelled_member_closes_its_started_event_as_cancelled(autojump_clock):
    pipe = pipe_with(parallel(member("slow", delay=10), halter("stop", delay=1)))
    events, _ = await collect(pipe, Turn.start("hi"))
    assert [(e.hook, e.verdict) for e in events if isinstance(e, ev.HookFinished)] == [
        ("stop", "halt"),
        ("slow", "cancelled"),
    ]


async def test_members_halting_at_the_same_instant_resolve_to_the_lowest_position(
    autojump_clock,
):
    # trio runs members woken together in random order; the outcome must not depend on it.
    pipe = pipe_with(parallel(halter("first", delay=1), halter("second", delay=1)))
    winners = {(await pipe.run(Turn.start("hi"))).halt.hook for _ in range(30)}
    assert winners == {"first"}


async def test_members_failing_at_the_same_instant_raise_the_lowest_position(autojump_clock):
    pipe = pipe_with(parallel(failer("first", delay=1), failer("second", delay=1)))
    raised = set()
    for _ in range(30):
        with pytest.raises(HookFailed) as info:
            await pipe.run(Turn.start("hi"))
        raised.add(info.value.hook)
    assert raised == {"first"}


async def test_a_sync_member_still_running_when_a_sibling_halts_is_waited_for():
    # A thread cannot be interrupted; the group must not return while it still runs.
    import time

    trace = []
    started = threading.Event()

    def lookup(turn):
        started.set()
        time.sleep(0.2)
        trace.append("lookup returned")
        return [Text("late")]

    async def gate(turn):
        await anyio.to_thread.run_sync(started.wait, BARRIER_TIMEOUT)
        return halt("no")

    result = await pipe_with(parallel(lookup, hook(gate, name="gate"))).run(Turn.start("hi"))
    assert (result.halt.hook, trace) == ("gate", ["lookup returned"])


def acting_member(name, delay, result, **options):
    async def run(turn):
        await anyio.sleep(delay)
        if isinstance(result, Exception):
            raise result
        return result

    return hook(run, name=name, **options)


def pipe_of_group(*pre, **options):
    return Pipeline(model=ScriptedModel(["ok"]), pre=list(pre), **options)


async def test_a_shadow_members_halt_does_not_cancel_its_siblings(autojump_clock):
    group = parallel(
        acting_member("slow", 2, [Text("slow")]),
        acting_member("watch", 1, halt("would stop"), shadow=True),
    )
    result = await pipe_of_group(group).run(Turn.start("hi"))
    assert [i.source for i in result.turn.injections] == ["slow"]


async def test_a_group_members_timeout_applies(autojump_clock):
    group = parallel(acting_member("slow", 60, [Text("late")], timeout=1))
    started = anyio.current_time()
    with pytest.raises(HookTimeout, match="'slow'"):
        await pipe_of_group(group).run(Turn.start("hi"))
    assert anyio.current_time() - started == 1


async def test_a_group_members_timeout_with_skip_lets_the_others_land(autojump_clock):
    group = parallel(
        acting_member("slow", 60, [Text("late")], timeout=1, on_error="skip"),
        acting_member("fast", 0, [Text("fast")]),
    )
    result = await pipe_of_group(group).run(Turn.start("hi"))
    assert [i.source for i in result.turn.injections] == ["fast"]


async def test_in_a_group_a_failure_wins_over_a_halt(autojump_clock):
    group = parallel(
        acting_member("gate", 1, halt("no")), acting_member("broken", 1, ValueError("x"))
    )
    with pytest.raises(HookFailed, match="'broken'"):
        await pipe_of_group(group).run(Turn.start("hi"))


async def test_a_note_names_the_other_failing_acting_member(autojump_clock):
    group = parallel(
        acting_member("a", 1, ValueError("first")),
        acting_member("b", 1, KeyError("second")),
        name="g",
    )
    with pytest.raises(HookFailed) as info:
        await pipe_of_group(group).run(Turn.start("hi"))
    assert any("'b'" in note and "second" in note for note in info.value.__notes__)


async def test_a_member_that_halts_the_group_is_named_in_the_halted_event(autojump_clock):
    pipe = pipe_of_group(
        parallel(acting_member("ok", 0, []), acting_member("gate", 1, halt("no entry")))
    )
    async with pipe.stream(Turn.start("hi")) as events:
        halted = [(e.hook, e.reason) async for e in events if isinstance(e, ev.Halted)]
    assert halted == [("gate", "no entry")]


async def test_a_member_returning_a_malformed_part_fails_naming_it():
    """Catches: a member's [Text(3)] accepted, to fail later in rendering as a bare TypeError
    (or as the model provider's failure) that names no hook."""
    pipe = pipe_with(parallel(member("ok"), returning("bad", lambda turn: [Text(3)])))
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "bad"
    assert "returned a malformed part: Text.text must be a str, got int 3" in str(info.value)


async def test_a_member_returning_a_part_whose_meta_is_no_mapping_fails_naming_it():
    """Catches: a member's [Text("a", meta=[...])] accepted, so a durable member's injection
    failed only at commit, after the model call, as a bare TypeError naming no hook."""
    pipe = pipe_with(
        parallel(member("ok"), returning("bad", lambda turn: [Text("a", meta=[("k", 1)])]))
    )
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "bad"
    assert "returned a malformed part: Text.meta must be a mapping, got list" in str(info.value)


async def test_a_member_returning_a_lone_tool_call_fails_naming_it():
    """Catches: a member's [ToolCall] without its ToolResult accepted and sent as an
    assistant tool-call message no tool message follows, which the provider refuses (and a
    durable member's lone call committed to the log, breaking every later turn)."""
    pipe = pipe_with(
        parallel(member("ok"), returning("bad", lambda turn: [ToolCall("c1", "lookup", {})]))
    )
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "bad"
    assert "returned unpaired tool parts: tool calls ['c1'] have no result" in str(info.value)


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_out_of_a_member_passes_through_leaving_no_coroutine_unrun(
    loop: str,
) -> None:
    """Bug caught: a member raising KeyboardInterrupt under asyncio let it out of its task,
    which stopped the loop before its siblings started: the coroutine AnyIO had made for
    each when scheduling it was never awaited ("RuntimeWarning: coroutine '_run_member' was
    never awaited"). Run from sync code, as an application would, and collected, so that a
    coroutine left unawaited warns inside the test."""

    async def interrupted(turn):
        raise KeyboardInterrupt

    async def sibling(turn):
        return [Text("[note]")]

    group = parallel(
        hook(interrupted, name="interrupted"),
        hook(sibling, name="one"),
        hook(sibling, name="two"),
        name="group",
    )
    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[group])

    async def main() -> None:
        await pipe.run(Turn.start("hi"))

    assert warnings_of_an_interrupted_run(loop, main) == []


async def test_a_system_exit_out_of_a_member_is_not_lost_to_the_callers_cancellation():
    """Bug caught: a member cancelling the caller's scope (as a deadline passing at that
    instant would) and raising SystemExit: the group's task group raised the cancellation
    instead, the caller's scope absorbed it, and the run returned as if nothing happened,
    the SystemExit silently lost."""
    scopes: list[anyio.CancelScope] = []

    async def exiting(turn):
        scopes[0].cancel()
        raise SystemExit(3)

    async def sibling(turn):
        await anyio.sleep(10)
        return [Text("[note]")]

    group = parallel(hook(exiting, name="exiting"), hook(sibling, name="sibling"), name="group")
    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[group])

    async def caller() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await pipe.run(Turn.start("hi"))

    with pytest.raises(SystemExit) as info:
        await caller()
    assert info.value.code == 3


async def test_the_interrupt_that_stopped_the_group_wins_over_one_raised_as_it_stops():
    """Bug caught: the group raised the first interrupt in declaration order, not the one that
    stopped it: a later member raising SystemExit(5) cancelled an earlier one, which raised
    KeyboardInterrupt as it was cancelled, and the caller got that KeyboardInterrupt, the
    exit code lost. The later one rides along as a note."""

    async def interrupted_on_cancel(turn):
        try:
            await anyio.Event().wait()
        finally:
            raise KeyboardInterrupt  # in place of the cancellation
        return [Text("[never]")]

    async def exiting(turn):
        await anyio.lowlevel.checkpoint()
        raise SystemExit(5)

    group = parallel(
        hook(interrupted_on_cancel, name="first"), hook(exiting, name="second"), name="group"
    )
    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[group])

    async def run() -> None:
        try:
            await pipe.run(Turn.start("hi"))
        except KeyboardInterrupt:
            pytest.fail("the KeyboardInterrupt raised as the group stopped replaced SystemExit(5)")

    with pytest.raises(SystemExit) as info:
        await run()
    assert info.value.code == 5
    assert any("'first'" in note and "KeyboardInterrupt" in note for note in info.value.__notes__)
