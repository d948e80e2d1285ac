"""Sessions: one conversation over a log, its lifecycle hooks and its background work."""

import asyncio
import inspect
import math
from typing import NoReturn

import anyio
import anyio.lowlevel
import pytest
import trio

from pipeline import (
    ConfigError,
    HookFailed,
    HookReturnError,
    LogConflict,
    LogError,
    Pipeline,
    Session,
    SessionInfo,
    cont,
    halt,
    hook,
    parallel,
    regenerate,
)
from pipeline import events as ev
from pipeline.logs import LogEntry, MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Message, Scope, Text, Turn

from .support import (
    AnswerLostLog,
    exiting_with_a_late_interrupt,
    live_tasks,
    pairing_problems,
    warnings_of_an_interrupted_run,
)

CONVERSATION = "conv-1"


# -- helpers --------------------------------------------------------------------------------


def note(name: str, make_text, *, durable: bool = False):
    """A pre hook that injects `make_text(turn)`."""

    async def inject(turn: Turn):
        return cont(turn.inject(make_text(turn)))

    return hook(inject, name=name, durable=durable)


def end_recorder(trace: list, name: str = "farewell"):
    """An end hook that records the reason and the session info it was given."""

    async def farewell(info: SessionInfo, reason: str):
        trace.append(("end", reason, info))

    return hook(farewell, name=name)


def echo_model() -> FunctionModel:
    """Answers 're: <last user text>' so replies do not depend on the order of calls."""
    return FunctionModel(lambda request: f"re: {request.messages[-1].text}")


class Boom(Exception):
    pass


async def consume(session: Session, text: str) -> list[ev.Event]:
    async with session.stream(text) as events:
        return [event async for event in events]


# -- sending turns --------------------------------------------------------------------------


async def test_send_commits_the_completed_turn_to_the_log():
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["Hello!"]))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    assert result.outcome == "completed"
    assert await log.load(CONVERSATION) == Context(
        messages=(Message.user("hi"), Message.assistant("Hello!"))
    )


async def test_the_commit_stores_the_turns_audit_under_its_turn_ref():
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["Hello!"]))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    assert await log.entries(CONVERSATION) == (
        LogEntry(result.turn.turn_ref, result.log_messages, result.audit),
    )


async def test_a_session_opens_on_the_conversation_already_in_the_log():
    log = MemoryLog()
    earlier = (Message.user("yesterday"), Message.assistant("noted"))
    await log.append(CONVERSATION, "old-turn", earlier)
    model = ScriptedModel(["Hello again"])

    async with Pipeline(model=model).session(log=log, conversation_id=CONVERSATION) as session:
        opened_with = session.context
        await session.send("hi")

    assert opened_with == Context(messages=earlier)
    assert model.requests[0].messages == (*earlier, Message.user("hi"))


async def test_the_second_turn_sees_the_first_turns_committed_messages_not_its_transient_ones():
    model = ScriptedModel(["one", "two"])
    pipe = Pipeline(
        model=model,
        pre=[
            note("retrieval", lambda turn: f"retrieved for {turn.user_message.text}"),
            note("memory", lambda turn: f"remember {turn.user_message.text}", durable=True),
        ],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        first = await session.send("first")
        await session.send("second")

    sent = model.requests[1].messages
    history = sent[: len(first.log_messages)]
    assert history == first.log_messages
    assert history == (
        Message("user", (Text("remember first", meta={"injected_by": "memory"}), Text("first"))),
        Message.assistant("one"),
    )
    assert len(sent) == len(history) + 1  # then this turn's user message, nothing else
    assert "retrieved for first" not in [p.text for m in sent for p in m.parts]


async def test_the_session_context_grows_by_each_committed_turn():
    pipe = Pipeline(model=ScriptedModel(["one", "two"]))

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        contexts = [session.context]
        first = await session.send("first")
        contexts.append(session.context)
        second = await session.send("second")
        contexts.append(session.context)

    assert contexts == [
        Context(),
        Context(messages=first.log_messages),
        Context(messages=(*first.log_messages, *second.log_messages)),
    ]


async def test_send_accepts_a_message():
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["ok"]))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send(Message.user("hi", meta={"client": "web"}))

    loaded = await log.load(CONVERSATION)
    assert loaded.messages[0] == Message.user("hi", meta={"client": "web"})


async def test_a_halted_turn_commits_nothing():
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["never"]),
        pre=[hook(lambda turn: halt("off topic", reply="Let's talk cooking."), name="topic")],
    )

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")
        context = session.context

    assert result.outcome == "halted"
    assert context == Context()
    assert await log.entries(CONVERSATION) == ()


async def test_an_exhausted_turn_commits_nothing():
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["no", "no"]),
        post=[hook(lambda turn: regenerate("try again"), name="guard")],
        max_regenerations=1,
    )

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")
        context = session.context

    assert result.outcome == "exhausted"
    assert context == Context()
    assert await log.entries(CONVERSATION) == ()


async def test_info_counts_the_turns_sent():
    pipe = Pipeline(
        model=ScriptedModel(["one", "two"]),
        pre=[hook(lambda t: halt("no") if t.user_message.text == "stop" else cont(t), name="gate")],
    )
    counts = []

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        counts.append(session.info.turns)
        await session.send("one")
        counts.append(session.info.turns)
        await session.send("stop")
        counts.append(session.info.turns)
        await session.send("two")
        counts.append(session.info.turns)

    assert counts == [0, 1, 2, 3]
    assert session.info == SessionInfo(CONVERSATION, Scope(), 3)


async def test_concurrent_sends_run_one_at_a_time_each_on_the_committed_conversation(
    autojump_clock,
):
    async def slow_echo(request):
        await anyio.sleep(1)  # long enough for the other send to try to start
        yield f"re: {request.messages[-1].text}"

    log = MemoryLog()
    model = FunctionModel(slow_echo)
    pipe = Pipeline(model=model)
    results = {}

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:

        async def send(text: str) -> None:
            results[text] = await session.send(text)

        async with anyio.create_task_group() as nursery:
            nursery.start_soon(send, "a")
            nursery.start_soon(send, "b")

    # Whichever ran first, the other was answered from the conversation it committed.
    order = [request.messages[-1].text for request in model.requests]
    assert sorted(order) == ["a", "b"]
    earlier, later = results[order[0]], results[order[1]]
    assert model.requests[1].messages == (*earlier.log_messages, Message.user(order[1]))
    assert await log.load(CONVERSATION) == Context(
        messages=(*earlier.log_messages, *later.log_messages)
    )


# -- streaming ------------------------------------------------------------------------------


async def test_stream_reports_the_commit_with_the_committed_messages():
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel([["Hel", "lo"]]))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        async with session.stream("hi") as events:
            seen = [event async for event in events]
        result = events.result

    ref = result.turn.turn_ref
    assert [type(event) for event in seen] == [
        ev.TurnStarted,
        ev.ModelCalled,
        ev.TextDelta,
        ev.TextDelta,
        ev.ModelFinished,
        ev.ReplyReady,
        ev.Committed,
        ev.TurnFinished,
    ]
    assert seen[6] == ev.Committed(
        ref, CONVERSATION, (Message.user("hi"), Message.assistant("Hello"))
    )
    assert await log.load(CONVERSATION) == Context(messages=seen[6].messages)


async def test_a_streamed_halted_turn_reports_no_commit():
    pipe = Pipeline(model=ScriptedModel(["never"]), pre=[hook(lambda t: halt("no"), name="gate")])

    async with (
        pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session,
        session.stream("hi") as events,
    ):
        seen = [event async for event in events]

    assert not any(isinstance(event, ev.Committed) for event in seen)


async def test_leaving_a_stream_early_commits_nothing_and_the_session_goes_on(autojump_clock):
    log = MemoryLog()

    async def reply(request):
        if request.messages[-1].text == "first":
            yield "Hel"
            await anyio.sleep(10)  # the consumer leaves while the model still streams
            yield "lo"
        else:
            yield "second answer"

    pipe = Pipeline(model=FunctionModel(reply))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        async with session.stream("first") as events:
            async for event in events:
                if isinstance(event, ev.TextDelta):
                    break
        left_early = session.context
        result = await session.send("second")

    assert left_early == Context()
    assert result.outcome == "completed"
    assert await log.load(CONVERSATION) == Context(
        messages=(Message.user("second"), Message.assistant("second answer"))
    )


# -- conflicts ------------------------------------------------------------------------------


async def test_a_second_writer_on_the_conversation_makes_the_stale_session_raise_log_conflict():
    log = MemoryLog()
    pipe = Pipeline(model=echo_model())

    async with (
        pipe.session(log=log, conversation_id=CONVERSATION) as a,
        pipe.session(log=log, conversation_id=CONVERSATION) as b,
    ):
        first = await a.send("from a")
        with pytest.raises(LogConflict) as excinfo:
            await b.send("from b")

    assert CONVERSATION in str(excinfo.value)
    assert await log.load(CONVERSATION) == Context(messages=first.log_messages)


async def test_after_a_conflict_the_next_send_works_on_the_reloaded_conversation():
    log = MemoryLog()
    model = echo_model()
    pipe = Pipeline(model=model)

    async with (
        pipe.session(log=log, conversation_id=CONVERSATION) as a,
        pipe.session(log=log, conversation_id=CONVERSATION) as b,
    ):
        first = await a.send("from a")
        with pytest.raises(LogConflict):
            await b.send("from b")
        reloaded = b.context
        retry = await b.send("again from b")

    assert reloaded == Context(messages=first.log_messages)
    assert model.requests[-1].messages == (*first.log_messages, Message.user("again from b"))
    assert await log.load(CONVERSATION) == Context(
        messages=(*first.log_messages, *retry.log_messages)
    )


async def test_a_conflict_in_a_streamed_turn_raises_and_the_session_reloads():
    log = MemoryLog()
    pipe = Pipeline(model=echo_model())

    async with (
        pipe.session(log=log, conversation_id=CONVERSATION) as a,
        pipe.session(log=log, conversation_id=CONVERSATION) as b,
    ):
        first = await a.send("from a")
        with pytest.raises(LogConflict):
            await consume(b, "from b")
        reloaded = b.context

    assert reloaded == Context(messages=first.log_messages)


# -- on_session_start -----------------------------------------------------------------------


async def test_start_hooks_thread_the_scope_and_the_turn_sees_it():
    trace = []

    def profile(info: SessionInfo):
        trace.append(("profile", info.scope))
        return cont(info.scope.assign(plan="pro"))

    async def locale(info: SessionInfo):
        trace.append(("locale", info.scope))
        return cont(info.scope.assign(locale="fr"))

    def look(turn: Turn):
        trace.append(("turn", turn.scope))
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[look], on_session_start=[profile, locale])
    user = Scope(current_user="ada")

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION, scope=user) as s:
        await s.send("hi")

    assert trace == [
        ("profile", Scope(current_user="ada")),
        ("locale", Scope(current_user="ada", assigns={"plan": "pro"})),
        ("turn", Scope(current_user="ada", assigns={"plan": "pro", "locale": "fr"})),
    ]
    assert s.info.scope == Scope(current_user="ada", assigns={"plan": "pro", "locale": "fr"})


async def test_start_hooks_are_told_the_conversation_and_no_turns_yet():
    seen = []

    def opened(info: SessionInfo):
        seen.append(info)
        return cont(info.scope)

    pipe = Pipeline(model=ScriptedModel([]), on_session_start=[opened])
    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
        pass

    assert seen == [SessionInfo(CONVERSATION, Scope(), 0)]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda info: None, id="none"),
        pytest.param(lambda info: info.scope, id="bare-scope"),
        pytest.param(lambda info: cont("pro"), id="cont-of-str"),
        pytest.param(lambda info: halt("no"), id="halt"),
    ],
)
async def test_a_start_hook_returning_anything_but_cont_scope_fails_the_entry(make):
    entered = []
    pipe = Pipeline(model=ScriptedModel([]), on_session_start=[hook(make, name="load_profile")])

    with pytest.raises(HookReturnError) as excinfo:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            entered.append(True)

    assert "load_profile" in str(excinfo.value)
    assert excinfo.value.hook == "load_profile"
    assert entered == []


async def test_a_start_hook_returning_a_coroutine_it_forgot_to_await_is_told_to_await_it():
    """Bug: an async start hook that returned another function's coroutine without awaiting
    it got a HookReturnError with no hint (only "return cont(info.scope)"), and the coroutine
    was left to warn "never awaited" after the error."""
    made = []

    async def fetch_profile(info: SessionInfo):
        return cont(info.scope.assign(plan="pro"))

    async def load_profile(info: SessionInfo):
        coroutine = fetch_profile(info)
        made.append(coroutine)
        return coroutine

    pipe = Pipeline(
        model=ScriptedModel([]), on_session_start=[hook(load_profile, name="load_profile")]
    )

    with pytest.raises(HookReturnError, match=r"'load_profile' \(session_start.*forget `await`"):
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            pass

    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED]


async def test_a_start_hook_that_raises_fails_the_entry_and_end_hooks_run_with_error():
    trace = []

    def load_profile(info: SessionInfo):
        raise Boom("profile store down")

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_start=[hook(load_profile, name="load_profile")],
        on_session_end=[end_recorder(trace)],
    )

    with pytest.raises(HookFailed) as excinfo:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            trace.append("body")

    assert excinfo.value.hook == "load_profile"
    assert "load_profile" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, Boom)
    assert trace == [("end", "error", SessionInfo(CONVERSATION, Scope(), 0))]


async def test_a_start_hook_failure_stops_the_later_start_hooks():
    trace = []

    def first(info: SessionInfo):
        raise Boom("down")

    def second(info: SessionInfo):
        trace.append("second")
        return cont(info.scope)

    pipe = Pipeline(model=ScriptedModel([]), on_session_start=[first, second])

    with pytest.raises(HookFailed):
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            pass

    assert trace == []


async def test_a_start_hook_that_fails_open_is_an_event_and_the_session_opens():
    def load_profile(info: SessionInfo):
        raise Boom("profile store down")

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_start=[hook(load_profile, name="load_profile", on_error="skip")],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        events = session.events
        scope = session.info.scope

    assert events == (
        ev.HookStarted("", "load_profile", "session_start"),
        ev.HookFailed("", "load_profile", "session_start", "Boom: profile store down", False),
    )
    assert scope == Scope()


async def test_a_shadow_start_hooks_scope_is_recorded_not_kept():
    """A shadow start hook's scope used to become the session's scope, though a shadow
    hook's changes are discarded."""
    trace = []

    def trial_profile(info: SessionInfo):
        return cont(info.scope.assign(plan="trial"))

    def look(turn: Turn):
        trace.append(turn.scope)
        return cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[look],
        on_session_start=[hook(trial_profile, name="trial_profile", shadow=True)],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        await session.send("hi")

    assert trace == [Scope()]
    assert session.info.scope == Scope()
    assert [
        (type(event), event.hook, getattr(event, "verdict", None))
        for event in session.events
        if event.turn_ref == ""
    ] == [
        (ev.HookStarted, "trial_profile", None),
        (ev.HookFinished, "trial_profile", "cont"),
        (ev.ShadowVerdict, "trial_profile", "cont"),
    ]


async def test_session_hooks_are_reported_as_events_in_session_events():
    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_start=[hook(lambda info: cont(info.scope), name="open")],
        on_session_end=[hook(lambda info, reason: None, name="close")],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        pass

    assert [(type(event), event.hook, event.stage) for event in session.events] == [
        (ev.HookStarted, "open", "session_start"),
        (ev.HookFinished, "open", "session_start"),
        (ev.HookStarted, "close", "session_end"),
        (ev.HookFinished, "close", "session_end"),
    ]


# -- on_session_end -------------------------------------------------------------------------


async def test_end_hooks_run_in_order_with_closed_on_a_normal_exit():
    trace = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        on_session_end=[end_recorder(trace, "first"), end_recorder(trace, "second")],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        await session.send("hi")
        trace.append("body done")

    info = SessionInfo(CONVERSATION, Scope(), 1)
    assert trace == ["body done", ("end", "closed", info), ("end", "closed", info)]


async def test_end_hooks_see_the_scope_the_start_hooks_made():
    trace = []
    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_start=[lambda info: cont(info.scope.assign(plan="pro"))],
        on_session_end=[end_recorder(trace)],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
        pass

    assert trace == [
        ("end", "closed", SessionInfo(CONVERSATION, Scope(assigns={"plan": "pro"}), 0))
    ]


async def test_an_error_in_the_body_runs_end_hooks_with_error_and_propagates_unwrapped():
    trace = []
    pipe = Pipeline(model=ScriptedModel([]), on_session_end=[end_recorder(trace)])

    with pytest.raises(Boom) as excinfo:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            raise Boom("body failed")

    assert type(excinfo.value) is Boom
    assert str(excinfo.value) == "body failed"
    assert trace == [("end", "error", SessionInfo(CONVERSATION, Scope(), 0))]


async def test_a_failed_turn_propagates_unwrapped_and_end_hooks_run_with_error():
    trace = []

    def broken(turn: Turn):
        raise Boom("retrieval down")

    pipe = Pipeline(
        model=ScriptedModel(["never"]),
        pre=[hook(broken, name="retrieval")],
        on_session_end=[end_recorder(trace)],
    )

    with pytest.raises(HookFailed) as excinfo:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            await session.send("hi")

    assert excinfo.value.hook == "retrieval"
    assert trace == [("end", "error", SessionInfo(CONVERSATION, Scope(), 1))]


async def test_a_failing_end_hook_does_not_mask_the_bodys_error_and_becomes_an_event():
    trace = []

    def close_db(info: SessionInfo, reason: str):
        raise RuntimeError("db already closed")

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_end=[hook(close_db, name="close_db"), end_recorder(trace, "after")],
    )

    with pytest.raises(Boom):
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            raise Boom("body failed")

    failures = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert failures == [
        ev.HookFailed("", "close_db", "session_end", "RuntimeError: db already closed", False)
    ]
    assert trace == [("end", "error", SessionInfo(CONVERSATION, Scope(), 0))]


async def test_a_failing_end_hook_on_a_normal_exit_is_an_event_not_an_error():
    def close_db(info: SessionInfo, reason: str):
        raise RuntimeError("db already closed")

    pipe = Pipeline(model=ScriptedModel([]), on_session_end=[hook(close_db, name="close_db")])

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        pass

    assert [event for event in session.events if isinstance(event, ev.HookFailed)] == [
        ev.HookFailed("", "close_db", "session_end", "RuntimeError: db already closed", False)
    ]


async def test_an_end_hooks_return_value_is_ignored():
    pipe = Pipeline(
        model=ScriptedModel([]), on_session_end=[hook(lambda info, reason: 42, name="odd")]
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        pass

    assert not any(isinstance(event, ev.HookFailed) for event in session.events)


async def test_an_end_hook_returning_a_coroutine_it_forgot_to_await_is_an_event():
    """Bug: an async end hook that returned its cleanup's coroutine without awaiting it was
    recorded as finished: the cleanup never ran, and nothing but a "never awaited" warning
    said so."""
    made = []

    async def close_db(info: SessionInfo, reason: str):
        raise AssertionError("never run")

    async def close(info: SessionInfo, reason: str):
        coroutine = close_db(info, reason)
        made.append(coroutine)
        return coroutine

    pipe = Pipeline(model=ScriptedModel([]), on_session_end=[hook(close, name="close")])

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        pass

    [failed] = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert (failed.hook, failed.stage, failed.enforced) == ("close", "session_end", False)
    assert "forget `await`" in failed.error
    assert not any(isinstance(event, ev.HookFinished) for event in session.events)
    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED]


async def test_an_end_hook_past_its_timeout_is_an_event_and_the_session_closes(autojump_clock):
    trace = []

    async def flush(info: SessionInfo, reason: str):
        await anyio.sleep(100)
        trace.append("flushed")

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_end=[hook(flush, name="flush", timeout=2), end_recorder(trace)],
    )
    started = anyio.current_time()

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        pass
    closed_at = anyio.current_time() - started

    failures = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert closed_at == 2.0
    assert [(event.hook, event.stage) for event in failures] == [("flush", "session_end")]
    assert trace == [("end", "closed", SessionInfo(CONVERSATION, Scope(), 0))]


async def test_cancelling_the_body_runs_end_hooks_with_cancelled(autojump_clock):
    trace = []
    pipe = Pipeline(model=ScriptedModel([]), on_session_end=[end_recorder(trace)])

    with anyio.move_on_after(5) as scope:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            trace.append("body")
            await anyio.sleep(100)
            trace.append("never")

    assert scope.cancelled_caught
    assert trace == ["body", ("end", "cancelled", SessionInfo(CONVERSATION, Scope(), 0))]


async def test_cancellation_reaches_the_caller_as_trio_cancelled_not_a_group(autojump_clock):
    pipe = Pipeline(model=ScriptedModel([]))
    caught = []

    with anyio.move_on_after(1):
        try:
            async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
                await anyio.sleep(10)
        except BaseException as exc:
            caught.append(type(exc))
            raise

    assert caught == [trio.Cancelled]


async def test_an_end_hook_that_awaits_still_runs_to_completion_when_cancelled(autojump_clock):
    trace = []

    async def flush(info: SessionInfo, reason: str):
        await anyio.sleep(2)
        trace.append(("flushed", reason))

    pipe = Pipeline(model=ScriptedModel([]), on_session_end=[flush])

    with anyio.move_on_after(1):
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            await anyio.sleep(10)

    assert trace == [("flushed", "cancelled")]


def slow_model(trace: list) -> FunctionModel:
    async def slowly(request):
        trace.append("model sent first")
        yield "first "
        await anyio.sleep(10)
        trace.append("model sent second")
        yield "second"

    return FunctionModel(slowly)


async def test_cancelling_a_streamed_turn_mid_stream_commits_nothing_and_leaves_no_task(
    autojump_clock,
):
    trace = []
    log = MemoryLog()
    pipe = Pipeline(model=slow_model(trace), on_session_end=[end_recorder(trace)])
    before = live_tasks()
    started = anyio.current_time()

    with anyio.move_on_after(5) as scope:
        async with (
            pipe.session(log=log, conversation_id=CONVERSATION) as session,
            session.stream("hi") as events,
        ):
            async for event in events:
                if isinstance(event, ev.TextDelta):
                    trace.append(f"got {event.text.strip()}")
    stopped_at = anyio.current_time() - started
    remaining = live_tasks()
    await anyio.sleep(100)

    assert scope.cancelled_caught
    assert stopped_at == 5.0
    assert remaining == before
    assert trace == [
        "model sent first",
        "got first",
        ("end", "cancelled", SessionInfo(CONVERSATION, Scope(), 1)),
    ]
    assert await log.entries(CONVERSATION) == ()


async def test_cancelling_send_mid_stream_commits_nothing_and_leaves_no_task(autojump_clock):
    trace = []
    log = MemoryLog()
    pipe = Pipeline(model=slow_model(trace), on_session_end=[end_recorder(trace)])
    before = live_tasks()

    with anyio.move_on_after(5) as scope:
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            await session.send("hi")
            trace.append("send returned")
    remaining = live_tasks()
    await anyio.sleep(100)

    assert scope.cancelled_caught
    assert remaining == before
    assert trace == [
        "model sent first",
        ("end", "cancelled", SessionInfo(CONVERSATION, Scope(), 1)),
    ]
    assert await log.entries(CONVERSATION) == ()


# -- background hooks -----------------------------------------------------------------------


def background(
    trace: list,
    name: str,
    seconds: float,
    text: str | None = None,
    *,
    announce: bool = True,
    **options,
):
    """A background post hook that sleeps, records, and injects `text` if given."""

    async def work(turn: Turn):
        if announce:
            trace.append(f"{name} started")
        await anyio.sleep(seconds)
        trace.append(f"{name} finished")
        return cont(turn.inject(text) if text is not None else turn)

    return hook(work, name=name, background=True, **options)


async def test_send_returns_without_waiting_for_background_hooks(autojump_clock):
    trace = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), post=[background(trace, "summary", 5, announce=False)]
    )
    started = anyio.current_time()

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        await session.send("hi")
        trace.append(("send returned", anyio.current_time() - started))
        await anyio.sleep(1)
        trace.append("body done")
    trace.append(("session closed", anyio.current_time() - started))

    assert trace == [
        ("send returned", 0.0),
        "body done",
        "summary finished",
        ("session closed", 5.0),
    ]


async def test_a_background_hooks_durable_injection_is_committed_as_its_own_entry(
    autojump_clock,
):
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background([], "summary", 1, "user greeted us", durable=True)],
    )

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    ref = result.turn.turn_ref
    entries = await log.entries(CONVERSATION)
    assert [(entry.turn_ref, entry.messages) for entry in entries] == [
        (ref, (Message.user("hi"), Message.assistant("ok"))),
        (
            f"{ref}:summary",
            (Message("user", (Text("user greeted us", meta={"injected_by": "summary"}),)),),
        ),
    ]


async def test_a_shadow_background_hooks_durable_injection_is_not_committed(autojump_clock):
    """A shadow background hook's durable injection used to be committed to the log, though a
    shadow hook's changes are discarded."""
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background([], "summary", 1, "user greeted us", durable=True, shadow=True)],
    )

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    entries = await log.entries(CONVERSATION)
    assert [entry.turn_ref for entry in entries] == [result.turn.turn_ref]
    assert [
        (type(event), event.hook, getattr(event, "verdict", None)) for event in session.events
    ] == [
        (ev.HookStarted, "summary", None),
        (ev.HookFinished, "summary", "cont"),
        (ev.ShadowVerdict, "summary", "cont"),
    ]


async def test_a_background_hooks_committed_output_joins_the_history_of_the_next_turn(
    autojump_clock,
):
    model = ScriptedModel(["one", "two"])
    pipe = Pipeline(
        model=model, post=[background([], "summary", 1, "summary so far", durable=True)]
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        first = await session.send("first")
        await anyio.sleep(2)
        await session.send("second")

    summary = Message("user", (Text("summary so far", meta={"injected_by": "summary"}),))
    assert model.requests[1].messages == (
        *first.log_messages,
        summary,
        Message.user("second"),
    )


async def test_a_transient_background_injection_is_not_committed(autojump_clock):
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=[background([], "scratch", 1, "notes")])

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    assert await log.entries(CONVERSATION) == (
        LogEntry(result.turn.turn_ref, result.log_messages, result.audit),
    )


async def test_a_background_hook_failure_becomes_an_event_not_an_error(autojump_clock):
    async def memory(turn: Turn):
        await anyio.sleep(1)
        raise Boom("memory store down")

    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), post=[hook(memory, name="memory", background=True)]
    )

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    failures = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert result.outcome == "completed"
    assert failures == [
        ev.HookFailed(result.turn.turn_ref, "memory", "post", "Boom: memory store down", False)
    ]
    assert await log.load(CONVERSATION) == Context(messages=result.log_messages)


@pytest.mark.parametrize(
    ("where", "stage", "what"),
    [
        ("background", "post", "turn"),
        ("fail_open_pre", "pre", "turn"),
        ("on_session_start", "session_start", "session"),
        ("on_session_end", "session_end", "session"),
    ],
)
async def test_a_cancelled_error_a_recorded_hook_raises_itself_is_worded_as_a_raised_one(
    where: str, stage: str, what: str
):
    """Bug caught: a CancelledError that a background hook or an on_session_end hook (or a
    fail-open hook) raised itself, while nothing cancelled anything, recorded as a bare
    "CancelledError" in its HookFailed event and audit record, which reads as if the turn
    had been cancelled, where a pre or post hook's raised HookFailed says the hook "raised
    CancelledError itself (the turn was not cancelled)"."""

    async def stray(*args: object):
        raise asyncio.CancelledError()

    made = hook(stray, name="stray", on_error="skip")
    placed = {
        "background": {"post": [hook(stray, name="stray", background=True)]},
        "fail_open_pre": {"pre": [made]},
        "on_session_start": {"on_session_start": [made]},
        "on_session_end": {"on_session_end": [made]},
    }[where]
    pipe = Pipeline(model=ScriptedModel(["ok"]), **placed)

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        seen = await consume(session, "hi")

    [failed] = [event for event in [*seen, *session.events] if isinstance(event, ev.HookFailed)]
    assert (failed.hook, failed.stage, failed.enforced) == ("stray", stage, False)
    assert failed.error.endswith(f"raised CancelledError itself (the {what} was not cancelled)")


async def test_background_hooks_that_outlive_the_drain_timeout_are_cancelled(autojump_clock):
    trace = []
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background(trace, "slow_summary", 100, "late", durable=True)],
        on_session_end=[end_recorder(trace)],
    )
    started = anyio.current_time()

    async with pipe.session(log=log, conversation_id=CONVERSATION, drain_timeout=3) as session:
        result = await session.send("hi")
    closed_at = anyio.current_time() - started
    await anyio.sleep(200)

    assert closed_at == 3.0
    assert trace == [
        "slow_summary started",
        ("end", "closed", SessionInfo(CONVERSATION, Scope(), 1)),
    ]
    assert await log.load(CONVERSATION) == Context(messages=result.log_messages)


async def test_the_drain_timeout_is_reported_as_a_hook_failed_event(autojump_clock):
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=[background([], "slow_summary", 100)])

    async with pipe.session(
        log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=3
    ) as session:
        await session.send("hi")

    failures = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert len(failures) == 1
    assert "drain timeout" in failures[0].error
    assert failures[0].enforced is False


async def test_the_drain_timeout_event_names_the_cancelled_hook_and_its_turn(autojump_clock):
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=[background([], "slow_summary", 100)])

    async with pipe.session(
        log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=3
    ) as session:
        result = await session.send("hi")

    assert [
        (event.turn_ref, event.hook) for event in session.events if isinstance(event, ev.HookFailed)
    ] == [(result.turn.turn_ref, "slow_summary")]


async def test_background_hooks_that_finish_within_the_drain_timeout_report_nothing(
    autojump_clock,
):
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=[background([], "summary", 2)])

    async with pipe.session(
        log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=3
    ) as session:
        await session.send("hi")

    assert not any(isinstance(event, ev.HookFailed) for event in session.events)


async def test_a_background_commit_that_conflicts_becomes_an_event(autojump_clock):
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background([], "summary", 5, "a summary", durable=True, announce=False)],
    )

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send("hi")
        await log.append(CONVERSATION, "other-writer", (Message.user("meanwhile"),))

    failures = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert [(e.turn_ref, e.hook, e.enforced) for e in failures] == [
        (result.turn.turn_ref, "summary", False)
    ]
    assert "LogConflict" in failures[0].error
    assert await log.load(CONVERSATION) == Context(
        messages=(*result.log_messages, Message.user("meanwhile"))
    )


async def test_background_hooks_cut_short_by_a_cancelled_session_are_reported(autojump_clock):
    trace = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background(trace, "summary", 100, "a summary", durable=True, announce=False)],
    )

    with anyio.move_on_after(5):
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            result = await session.send("hi")
            await anyio.sleep(100)
    await anyio.sleep(200)

    failures = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert trace == []
    assert [(event.turn_ref, event.hook) for event in failures] == [
        (result.turn.turn_ref, "summary")
    ]


# -- arguments ------------------------------------------------------------------------------


class NotALog:
    async def load(self, conversation_id):
        return Context()


@pytest.mark.parametrize(
    ("arguments", "culprit"),
    [
        pytest.param({"log": None}, "log", id="log-none"),
        pytest.param({"log": NotALog()}, "log", id="log-without-append"),
        pytest.param({"log": MemoryLog}, "log", id="log-class-not-instance"),
        pytest.param({"conversation_id": ""}, "conversation_id", id="empty-id"),
        pytest.param({"conversation_id": 7}, "conversation_id", id="int-id"),
        pytest.param({"scope": {"user": "ada"}}, "scope", id="scope-dict"),
        pytest.param({"drain_timeout": -1}, "drain_timeout", id="negative-drain"),
        pytest.param({"drain_timeout": math.nan}, "drain_timeout", id="nan-drain"),
        pytest.param({"drain_timeout": "10"}, "drain_timeout", id="str-drain"),
        pytest.param({"drain_timeout": True}, "drain_timeout", id="bool-drain"),
    ],
)
async def test_bad_session_arguments_are_config_errors_naming_the_argument(arguments, culprit):
    pipe = Pipeline(model=ScriptedModel([]))
    given = {"log": MemoryLog(), "conversation_id": CONVERSATION, **arguments}

    with pytest.raises(ConfigError, match=culprit):
        async with pipe.session(**given):
            pass


async def test_a_drain_timeout_of_zero_is_accepted():
    pipe = Pipeline(model=ScriptedModel([]))

    async with pipe.session(
        log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=0
    ) as session:
        assert isinstance(session, Session)


# -- building the pipeline ------------------------------------------------------------------


def test_an_end_hook_with_the_wrong_arity_is_a_config_error_at_build():
    def farewell(info):
        return None

    with pytest.raises(ConfigError, match="farewell"):
        Pipeline(model=ScriptedModel([]), on_session_end=[farewell])


def test_a_start_hook_with_the_wrong_arity_is_a_config_error_at_build():
    def greet(info, reason):
        return cont(info.scope)

    with pytest.raises(ConfigError, match="greet"):
        Pipeline(model=ScriptedModel([]), on_session_start=[greet])


def test_a_parallel_group_is_not_a_session_hook():
    def a(info):
        return cont(info.scope)

    with pytest.raises(ConfigError, match="on_session_start"):
        Pipeline(model=ScriptedModel([]), on_session_start=[parallel(a)])


# -- closed and nested sessions -------------------------------------------------------------


async def take_turn(session: Session, method: str, message) -> None:
    """One turn through ``session.send`` or ``session.stream``, as `method` says."""
    if method == "send":
        await session.send(message)
        return
    async with session.stream(message) as events:
        async for _ in events:
            pass


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_closed_session_refuses_turns_naming_the_conversation(method):
    log = MemoryLog()
    model = ScriptedModel(["one", "two"])
    pipe = Pipeline(model=model)

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send("first")
    committed = await log.entries(CONVERSATION)

    with pytest.raises(RuntimeError, match=f"'{CONVERSATION}'"):
        await take_turn(session, method, "after the close")

    assert (len(model.requests), await log.entries(CONVERSATION)) == (1, committed)


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_turn_inside_a_stream_block_of_the_same_session_is_a_runtime_error_naming_it(
    method,
):
    pipe = Pipeline(model=ScriptedModel(["one", "two"]))

    async with (
        pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session,
        session.stream("outer") as events,
    ):
        with pytest.raises(RuntimeError) as excinfo:
            await take_turn(session, method, "nested")
        async for _ in events:
            pass

    assert f"session '{CONVERSATION}'" in str(excinfo.value)


def held_model(asked: anyio.Event, release: anyio.Event) -> FunctionModel:
    """Answers once `release` is set, after setting `asked` when it is called."""

    async def answer(request):
        asked.set()
        await release.wait()
        return "late answer"

    return FunctionModel(answer)


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_turn_still_running_in_another_task_when_the_session_closes_commits_nothing(
    method,
):
    """Catches: a turn sent from a task outside the session's block, still running when the
    block was left, committed after the end hooks had run, then failed with AnyIO's "task
    group is not active" as it started its background hooks, which never ran."""
    log = MemoryLog()
    asked, release = anyio.Event(), anyio.Event()
    trace: list = []

    async def summary(turn: Turn):
        trace.append("summary")
        return cont(turn)

    pipe = Pipeline(
        model=held_model(asked, release),
        post=[hook(summary, background=True)],
        on_session_end=[end_recorder(trace)],
    )
    errors: list[RuntimeError] = []

    async def late_turn(session: Session) -> None:
        try:
            await take_turn(session, method, "hi")
        except RuntimeError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as task_group:
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            task_group.start_soon(late_turn, session)
            await asked.wait()
        trace.append("session left")
        release.set()

    (error,) = errors
    assert f"session '{CONVERSATION}' was closed while turn" in str(error)
    assert "nothing of the turn was committed" in str(error)
    assert await log.entries(CONVERSATION) == ()
    assert trace == [
        ("end", "closed", SessionInfo(CONVERSATION, Scope(), 1)),
        "session left",
    ]


async def test_a_send_waiting_for_the_turn_before_it_is_refused_once_the_session_closes():
    """Catches: a send queued behind a running turn (from tasks outside the session's block)
    started its turn after the session closed, and paid for a model call that could never be
    committed."""
    asked, release = anyio.Event(), anyio.Event()
    model = held_model(asked, release)
    pipe = Pipeline(model=model)
    errors: list[str] = []

    async def send(session: Session, text: str) -> None:
        try:
            await session.send(text)
        except RuntimeError as exc:
            errors.append(f"{text}: {exc}")

    async with anyio.create_task_group() as task_group:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            task_group.start_soon(send, session, "first")
            await asked.wait()
            task_group.start_soon(send, session, "queued")
            await anyio.wait_all_tasks_blocked()
        release.set()

    assert (len(model.requests), sorted(error.split(":")[0] for error in errors)) == (
        1,
        ["first", "queued"],
    )
    assert any(error.startswith(f"queued: session '{CONVERSATION}' is closed;") for error in errors)


class GatedLog:
    """A `MemoryLog` whose appends wait for `release` (after setting `writing`)."""

    def __init__(self) -> None:
        self.log = MemoryLog()
        self.writing = anyio.Event()
        self.release = anyio.Event()

    async def load(self, conversation_id: str) -> Context:
        return await self.log.load(conversation_id)

    async def append(self, *args, **options) -> None:
        self.writing.set()
        await self.release.wait()
        await self.log.append(*args, **options)


async def test_a_session_closing_while_a_turn_is_committed_reports_its_unstarted_background_hooks():
    """Catches: a turn whose commit was being written when the session's block was left
    raised AnyIO's "task group is not active" after its commit had gone through (the caller
    was told the turn failed while the log held it), and its background hooks were lost
    without an event."""
    log = GatedLog()

    async def summary(turn: Turn):
        return cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["answer"]), post=[hook(summary, name="summary", background=True)]
    )
    results = []

    async def late_turn(session: Session) -> None:
        results.append(await session.send("hi"))

    async with anyio.create_task_group() as task_group:
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            task_group.start_soon(late_turn, session)
            await log.writing.wait()
        log.release.set()

    assert [result.outcome for result in results] == ["completed"]
    assert [entry.turn_ref for entry in await log.log.entries(CONVERSATION)] == [
        results[0].turn.turn_ref
    ]
    assert [(type(e), e.hook, e.stage, e.error) for e in session.events] == [
        (
            ev.HookFailed,
            "summary",
            "post",
            "not started: the session closed while its turn was being committed",
        )
    ]


def summary_hook(release: anyio.Event | None = None):
    """A durable background hook injecting "summary", once `release` is set (if given)."""

    async def summary(turn: Turn):
        if release is not None:
            await release.wait()
        return cont(turn.inject("summary"))

    return hook(summary, name="summary", background=True, durable=True)


async def test_a_turn_ref_a_background_hook_committed_under_is_refused_before_the_turn_runs():
    """Catches: a turn sent under "ref:summary", the entry the summary hook of turn "ref"
    had committed, answered and reported committed while the log ignored it as a repeat, so
    that the session's history held messages the log did not."""
    log = MemoryLog()
    model = ScriptedModel(["one", "two"])
    pipe = Pipeline(model=model, post=[summary_hook()])

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send("first", turn_ref="ref")
        await anyio.wait_all_tasks_blocked()  # the summary is committed
        with pytest.raises(ValueError, match="'ref:summary'"):
            await session.send("second", turn_ref="ref:summary")
        history = session.context

    assert len(model.requests) == 1
    assert (await log.load(CONVERSATION)) == history
    assert [m.text for m in history.messages] == ["first", "one", "summary"]


async def test_a_background_commit_whose_entry_a_turn_took_is_a_failure_not_a_lost_commit():
    """Catches: the summary of turn "ref" committed under "ref:summary" after a turn of that
    turn_ref: the log ignored it as a repeat, but the session counted its messages, so its
    history and the length it expects left the log's."""
    log = MemoryLog()
    release = anyio.Event()
    pipe = Pipeline(model=ScriptedModel(["one", "two", "three"]), post=[summary_hook(release)])

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send("first", turn_ref="ref")
        await session.send("second", turn_ref="ref:summary")
        release.set()
        await anyio.wait_all_tasks_blocked()
        third = await session.send("third")

    assert third.outcome == "completed"
    assert (await log.load(CONVERSATION)) == session.context
    failures = [
        (e.turn_ref, e.hook, e.stage, e.error)
        for e in session.events
        if isinstance(e, ev.HookFailed)
    ]
    assert failures[0] == (
        "ref",
        "summary",
        "commit",
        "committing its output failed: ValueError: a turn of the session was committed under"
        " 'ref:summary', the entry this output goes under, and a log keeps one commit per"
        " turn_ref",
    )


# -- conflicts, wherever they happen ----------------------------------------------------------


async def test_a_conflict_caught_inside_a_stream_block_still_reloads_the_session():
    log = MemoryLog()
    model = echo_model()
    pipe = Pipeline(model=model)
    caught = []

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await log.append(CONVERSATION, "other-writer", (Message.user("meanwhile"),))
        async with session.stream("stale") as events:
            try:
                async for _ in events:
                    pass
            except LogConflict as exc:
                caught.append(exc)
        asked = len(model.requests)
        result = await session.send("fresh")

    assert (len(caught), result.outcome, len(model.requests) - asked) == (1, "completed", 1)
    assert model.requests[-1].messages == (Message.user("meanwhile"), Message.user("fresh"))


def intruding_summary(log: MemoryLog):
    """A durable background hook; while it runs after the first turn, someone else commits."""

    async def summary(turn: Turn):
        await anyio.sleep(1)
        if turn.user_message.text == "first":
            await log.append(CONVERSATION, "other-writer", (Message.user("meanwhile"),))
        return cont(turn.inject(f"summary of {turn.user_message.text}"))

    return hook(summary, name="summary", background=True, durable=True)


async def test_a_background_commit_conflict_reloads_the_session_for_the_next_send(
    autojump_clock,
):
    log = MemoryLog()
    model = echo_model()
    pipe = Pipeline(model=model, post=[intruding_summary(log)])

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        first = await session.send("first")
        await anyio.sleep(5)  # the summary ran, and its commit met the other writer's
        second = await session.send("second")

    assert (second.outcome, len(model.requests)) == ("completed", 2)
    assert model.requests[1].messages == (
        *first.log_messages,
        Message.user("meanwhile"),
        Message.user("second"),
    )


async def test_a_background_commit_conflict_is_a_commit_failure_closing_no_hook_twice(
    autojump_clock,
):
    log = MemoryLog()
    pipe = Pipeline(model=echo_model(), post=[intruding_summary(log)])

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        first = await session.send("first")
        await anyio.sleep(5)

    ref = first.turn.turn_ref
    events = session.events
    assert [(type(e).__name__, e.turn_ref, e.hook, e.stage) for e in events] == [
        ("HookStarted", ref, "summary", "post"),
        ("HookFinished", ref, "summary", "post"),
        ("Injected", ref, "summary", "post"),
        ("HookFailed", ref, "summary", "commit"),
    ]
    assert "LogConflict" in events[-1].error
    assert pairing_problems(events) == []


# -- background hooks and when= ---------------------------------------------------------------


async def test_a_background_hook_whose_when_is_false_is_skipped_without_starting(autojump_clock):
    trace = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background(trace, "summary", 1, when=lambda turn: False)],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    assert session.events == (ev.HookSkipped(result.turn.turn_ref, "summary", "post"),)
    assert trace == []


async def test_a_background_hook_whose_when_is_not_a_bool_fails_without_running(autojump_clock):
    trace = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background(trace, "summary", 1, when=lambda turn: "yes")],
    )

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        result = await session.send("hi")

    ref = result.turn.turn_ref
    assert [(type(e).__name__, e.turn_ref, e.hook, e.stage) for e in session.events] == [
        ("HookStarted", ref, "summary", "post"),
        ("HookFailed", ref, "summary", "post"),
    ]
    assert pairing_problems(session.events) == []
    assert trace == []


# -- what leaves a session --------------------------------------------------------------------


async def test_a_users_exception_group_leaves_the_session_intact():
    # Not flattened to its first member, not wrapped in the session's own nursery group.
    first, second = ValueError("a"), KeyError("b")
    pipe = Pipeline(model=ScriptedModel([]))

    with pytest.raises(ExceptionGroup) as excinfo:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            raise ExceptionGroup("mine", [first, second])

    group = excinfo.value
    assert type(group) is ExceptionGroup
    assert group.message == "mine"
    assert len(group.exceptions) == 2
    assert (group.exceptions[0] is first, group.exceptions[1] is second) == (True, True)


# -- arguments, again -------------------------------------------------------------------------


class SyncLoad:
    def load(self, conversation_id):
        return Context()

    async def append(
        self, conversation_id, turn_ref, messages, audit=None, *, expected_length=None
    ):
        return None


class SyncAppend:
    async def load(self, conversation_id):
        return Context()

    def append(self, conversation_id, turn_ref, messages, audit=None, *, expected_length=None):
        return None


class SyncLog:
    def load(self, conversation_id):
        return Context()

    def append(self, conversation_id, turn_ref, messages, audit=None, *, expected_length=None):
        return None


@pytest.mark.parametrize("log_class", [SyncLog, SyncLoad, SyncAppend])
async def test_a_log_with_sync_methods_is_a_config_error_naming_the_log(log_class):
    pipe = Pipeline(model=ScriptedModel([]))

    with pytest.raises(ConfigError, match="log") as excinfo:
        async with pipe.session(log=log_class(), conversation_id=CONVERSATION):
            pass

    assert log_class.__name__ in str(excinfo.value)


class MessagesLoad:
    """A log of one's own whose load returns the messages instead of a Context."""

    def __init__(self, conflict: bool = False) -> None:
        self.loads = 0
        self.conflict = conflict

    async def load(self, conversation_id):
        self.loads += 1
        return Context() if self.conflict and self.loads == 1 else (Message.user("earlier"),)

    async def append(
        self, conversation_id, turn_ref, messages, audit=None, *, expected_length=None
    ):
        raise LogConflict(f"{conversation_id} moved on")


async def test_a_log_whose_load_returns_no_context_is_a_type_error_naming_it():
    """Catches: a log of one's own returning the messages from load() failing the session's
    entry with AttributeError: 'tuple' object has no attribute 'messages', naming nothing."""
    pipe = Pipeline(model=ScriptedModel([]))

    with pytest.raises(TypeError) as excinfo:
        async with pipe.session(log=MessagesLoad(), conversation_id=CONVERSATION):
            pass

    assert str(excinfo.value).startswith(
        f"MessagesLoad.load('{CONVERSATION}') returned tuple (Message(role='user'"
    )
    assert "not a turns.Context" in str(excinfo.value)


async def test_a_log_whose_load_returns_no_context_on_the_reload_after_a_conflict_is_named():
    """Catches: the reload after a LogConflict keeping whatever load() returned, so that the
    next send failed with an AttributeError naming nothing."""
    pipe = Pipeline(model=ScriptedModel(["one"]))

    async with pipe.session(log=MessagesLoad(conflict=True), conversation_id=CONVERSATION) as s:
        with pytest.raises(TypeError, match=r"^MessagesLoad\.load\('conv-1'\) returned tuple"):
            await s.send("hi")


async def test_an_infinite_drain_timeout_waits_for_every_background_hook(autojump_clock):
    trace = []
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background(trace, "summary", 1000, "late summary", durable=True, announce=False)],
    )
    started = anyio.current_time()

    async with pipe.session(log=log, conversation_id=CONVERSATION, drain_timeout=math.inf) as s:
        result = await s.send("hi")
    closed_at = anyio.current_time() - started

    ref = result.turn.turn_ref
    assert (closed_at, trace) == (1000.0, ["summary finished"])
    assert [entry.turn_ref for entry in await log.entries(CONVERSATION)] == [ref, f"{ref}:summary"]


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_turn_refused_for_its_message_is_not_counted(method):
    pipe = Pipeline(model=ScriptedModel(["ok"]))

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        await session.send("hi")
        with pytest.raises(TypeError):
            await take_turn(session, method, 42)
        turns = session.info.turns

    assert turns == 1


async def test_a_cancellation_during_the_drain_tells_end_hooks_cancelled(autojump_clock):
    # The body left normally, then the caller's scope cancelled the session while it waited
    # for its background hooks: they were cut short, and the caller sees a cancellation, so
    # the session did not close normally.
    trace = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[background(trace, "summary", 100, announce=False)],
        on_session_end=[end_recorder(trace)],
    )

    with anyio.move_on_after(5) as scope:
        async with pipe.session(
            log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=30
        ) as session:
            await session.send("hi")

    assert scope.cancelled_caught
    assert trace == [("end", "cancelled", SessionInfo(CONVERSATION, Scope(), 1))]


def remembering(*, after: float) -> Pipeline:
    """Two turns, each with a durable background hook that injects `after` seconds in."""

    async def remember(turn: Turn):
        await anyio.sleep(after)
        return cont(turn.inject(Text("remembered")))

    return Pipeline(
        model=ScriptedModel(["one", "two"]),
        post=[hook(remember, name="remember", background=True, durable=True)],
    )


async def test_a_background_hooks_events_carry_the_seconds_since_their_turn_started(
    autojump_clock,
):
    """Catches: every event of a background hook in `session.events` stamped 0.0 (only the
    turn's own events were stamped), and a later turn's background events stamped against
    the session's start or the first turn instead of their own turn."""

    pipe = remembering(after=2)

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        first = await session.send("hi")
        await anyio.sleep(5)
        second = await session.send("again")

    stamped = [
        (type(event).__name__, event.turn_ref, round(event.at, 3)) for event in session.events
    ]
    refs = first.turn.turn_ref, second.turn.turn_ref
    assert stamped == [
        (kind, ref, at)
        for ref in refs
        for kind, at in (
            ("HookStarted", 0.0),
            ("HookFinished", 2.0),
            ("Injected", 2.0),
            ("Committed", 2.0),
        )
    ]


async def test_a_background_hooks_events_are_timed_from_their_own_turn_on_either_loop():
    """Catches, on asyncio as on trio (in real time): background events stamped 0.0, or a
    later turn's stamped against an earlier turn's start (the gap between the turns would
    then show in them)."""

    pipe = remembering(after=0.05)

    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
        await session.send("hi")
        await anyio.sleep(0.5)
        second = await session.send("again")

    late = [event for event in session.events if event.turn_ref == second.turn.turn_ref]
    assert [type(event).__name__ for event in late] == [
        "HookStarted",
        "HookFinished",
        "Injected",
        "Committed",
    ]
    assert 0.0 <= late[0].at < 0.25
    assert 0.05 <= late[1].at < 0.3


class StrayCancellingLog:
    """A `MemoryLog` whose next `load` or `append` (those named in `stray`) raises a
    ``CancelledError`` of its own, as a library awaiting a future another task cancelled
    would, while nothing cancels the caller."""

    def __init__(self, *stray: str) -> None:
        self.log = MemoryLog()
        self.stray = set(stray)

    def __repr__(self) -> str:
        return "StrayCancellingLog()"

    async def load(self, conversation_id: str) -> Context:
        if "load" in self.stray:
            self.stray.discard("load")
            raise asyncio.CancelledError()
        return await self.log.load(conversation_id)

    async def append(self, *args, **options) -> None:
        if "append" in self.stray:
            self.stray.discard("append")
            raise asyncio.CancelledError()
        await self.log.append(*args, **options)


async def test_a_logs_own_cancelled_error_at_the_commit_is_a_log_error_naming_it():
    """Bug caught: a custom log whose append raised a CancelledError of its own (nothing
    cancelling the turn) let it out of send(): a bare cancellation, which under asyncio
    cancels the caller's task for nothing, and stopped a streamed turn with a RuntimeError
    naming no log; other parts of a turn (models, tools, hooks) fail by name."""
    log = StrayCancellingLog("append")
    pipe = Pipeline(model=ScriptedModel(["one", "two"]))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        with pytest.raises(
            LogError, match=r"StrayCancellingLog\(\) failed committing turn 'first'"
        ):
            await session.send("lost", turn_ref="first")
        second = await session.send("kept", turn_ref="second")

    assert second.outcome == "completed"
    assert [m.text for m in (await log.log.load(CONVERSATION)).messages] == ["kept", "two"]


async def test_after_a_commit_fails_with_a_log_error_the_next_turn_reloads_first():
    """Bug caught: after a commit failed with a LogError though it had been written (a
    PostgresLog commit whose answer was lost), the next turn ran on the conversation
    without that turn and failed with a LogConflict, where it reloads the log first."""
    log = AnswerLostLog(lose="ref-2")
    seen = []

    def model(request):
        seen.append([message.text for message in request.messages])
        return f"a{len(seen)}"

    pipe = Pipeline(model=FunctionModel(model))
    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send("q1")
        with pytest.raises(LogError, match="the answer was lost"):
            await session.send("q2", turn_ref="ref-2")
        third = await session.send("q3")

    assert third.outcome == "completed"
    assert seen[-1] == ["q1", "a1", "q2", "a2", "q3"]
    assert [m.text for m in (await log.load(CONVERSATION)).messages] == [
        "q1",
        "a1",
        "q2",
        "a2",
        "q3",
        "a3",
    ]


class DownOnReloadLog:
    """A log over a shared `MemoryLog` whose loads fail with a LogError while `down` (a
    database that went away just as a commit's conflict came back)."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.down = False

    async def load(self, conversation_id: str) -> Context:
        if self.down:
            raise LogError("DownOnReloadLog(): cannot reach the database", log="DownOnReloadLog()")
        return await self.log.load(conversation_id)

    async def append(self, *args, **options) -> None:
        await self.log.append(*args, **options)


async def test_after_a_conflict_whose_reload_failed_the_next_turn_reloads_first():
    """Bug caught: when the reload after a LogConflict failed, the session kept the stale
    conversation and its length, so its next turn answered from it and lost the race again
    with a second LogConflict, where it reloads the log first."""
    shared = MemoryLog()
    log = DownOnReloadLog(shared)
    seen = []

    def model(request):
        seen.append([message.text for message in request.messages])
        return f"a{len(seen)}"

    pipe = Pipeline(model=FunctionModel(model))
    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await shared.append(CONVERSATION, "other", (Message.user("x"), Message.assistant("y")))
        log.down = True
        with pytest.raises(LogError, match="cannot reach the database"):
            await session.send("q1")
        log.down = False
        second = await session.send("q2")

    assert second.outcome == "completed"
    assert seen[-1] == ["x", "y", "q2"]
    assert [m.text for m in (await shared.load(CONVERSATION)).messages] == ["x", "y", "q2", "a2"]


async def test_a_logs_own_cancelled_error_while_loading_is_a_log_error_naming_it():
    """Bug caught: a custom log whose load raised a CancelledError of its own (nothing
    cancelling the caller) made opening the session a bare cancellation, naming no log."""
    log = StrayCancellingLog("load")
    pipe = Pipeline(model=ScriptedModel(["never"]))

    with pytest.raises(
        LogError, match=rf"StrayCancellingLog\(\) failed loading conversation '{CONVERSATION}'"
    ) as raised:
        async with pipe.session(log=log, conversation_id=CONVERSATION):
            pass

    assert raised.value.log == "StrayCancellingLog()"
    assert isinstance(raised.value.__cause__, asyncio.CancelledError)


async def test_a_turn_cancelled_while_its_log_commits_is_still_cancelled():
    """Bug caught (in the fix above): every CancelledError out of a log's append taken for
    the log's own failure, so that cancelling a turn while it was being committed failed it
    with a LogError instead of cancelling it."""
    log = GatedLog()
    pipe = Pipeline(model=ScriptedModel(["one"]))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(session.send, "hi")
                await log.writing.wait()
                scope.cancel()

    assert scope.cancelled_caught
    assert await log.log.load(CONVERSATION) == Context()


# -- interrupts -----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_out_of_a_background_hook_leaves_the_session_block(
    loop: str,
) -> None:
    """Bug caught: a session's background hook raising KeyboardInterrupt under asyncio let it
    out of its task, which stopped the loop before the other background hooks started
    ("coroutine 'Session._background' was never awaited", then "Task exception was never
    retrieved"). Run from sync code, as an application would, and collected, so that a
    coroutine left unawaited warns inside the test."""
    ran: list[str] = []

    async def interrupted(turn):
        raise KeyboardInterrupt

    async def sibling(turn):
        ran.append("sibling")
        return cont(turn)

    background = [
        hook(interrupted, name="interrupted", background=True),
        hook(sibling, name="one", background=True),
        hook(sibling, name="two", background=True),
    ]
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=background)

    async def main() -> None:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            await session.send("hi")
            await anyio.sleep(10)
        ran.append("after the block")

    assert warnings_of_an_interrupted_run(loop, main) == []
    assert ran == ["sibling", "sibling"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
async def test_an_interrupt_ending_the_body_cuts_background_hooks_at_once(interrupt) -> None:
    """Bug caught: a KeyboardInterrupt or SystemExit raised by a session's body (trio's Ctrl-C
    between turns) told the end hooks "error" and waited out the drain timeout for the
    background hooks, where a cancellation (asyncio's Ctrl-C) cut them at once."""
    trace: list[object] = []

    async def summary(turn):
        await anyio.sleep(5)  # the drain would wait for it: math.inf below
        trace.append("summary finished")
        return cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(summary, name="summary", background=True)],
        on_session_end=[end_recorder(trace)],
    )
    log = MemoryLog()

    sessions: list[Session] = []

    async def converse() -> None:
        async with pipe.session(
            log=log, conversation_id=CONVERSATION, drain_timeout=math.inf
        ) as session:
            sessions.append(session)
            await session.send("hi")
            raise interrupt

    with pytest.raises(interrupt):
        await converse()

    assert [entry[:2] for entry in trace] == [("end", "cancelled")]
    [failed] = [event for event in sessions[0].events if isinstance(event, ev.HookFailed)]
    assert failed.error == (
        f"cut short: the session was interrupted ({interrupt.__name__}); nothing of it was"
        " committed"
    )
    assert len(await log.entries(CONVERSATION)) == 1  # the turn, not the hook's output


async def test_a_system_exit_out_of_a_background_hook_is_not_lost_to_the_callers_cancellation():
    """Bug caught: a session's background hook cancelling the caller's scope (as a deadline
    passing at that instant would) and raising SystemExit: the interrupt was lost to the
    cancellation, or, kept to be raised when the block is left, swallowed by the session's
    task group absorbing its own cancellation of the block. The end hooks say "error": the
    block was left by an exception, not cancelled."""
    scopes: list[anyio.CancelScope] = []
    trace: list[object] = []

    async def exiting(turn):
        scopes[0].cancel()
        raise SystemExit(3)

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(exiting, name="exiting", background=True)],
        on_session_end=[end_recorder(trace)],
    )

    async def caller() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
                await session.send("hi")
                await anyio.sleep(10)

    with pytest.raises(SystemExit) as info:
        await caller()
    assert info.value.code == 3
    assert [entry[:2] for entry in trace] == [("end", "error")]


async def test_the_interrupt_that_stopped_a_sessions_background_hooks_carries_later_ones_as_notes():
    """Bug caught: a session's background hooks raised the first interrupt to come, and one
    another hook raised as the session stopped (KeyboardInterrupt in place of its
    cancellation) was dropped without a word, where a parallel group's rides along as a note."""

    pipe = exiting_with_a_late_interrupt()

    async def converse() -> None:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            await session.send("hi")
            await anyio.sleep(10)

    with pytest.raises(SystemExit) as info:
        await converse()
    assert info.value.code == 5
    assert info.value.__notes__ == [
        "background hook 'first' (post, position 1) also raised KeyboardInterrupt as the"
        " session stopped"
    ]


async def test_an_interrupt_raised_while_handling_an_error_keeps_that_error_as_its_context():
    """Bug caught: unwrapping the task groups' exception groups raised the interrupt with the
    group as its context, so its traceback lost the error it was raised while handling."""

    def leave(turn):
        try:
            {}["missing"]
        except KeyError:
            raise SystemExit(3)

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[hook(leave, name="leave")])

    async def sent() -> None:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            await session.send("hi")

    async def streamed() -> None:
        session = pipe.session(log=MemoryLog(), conversation_id=CONVERSATION)
        async with session as opened, opened.stream("hi") as events:
            async for _ in events:
                pass

    for run in (lambda: pipe.run(Turn.start("hi")), sent, streamed):
        with pytest.raises(SystemExit) as info:
            await run()
        assert type(info.value.__context__) is KeyError
        assert not info.value.__suppress_context__


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
async def test_an_end_hooks_interrupt_runs_the_later_end_hooks_then_is_raised(interrupt):
    """Bug caught: an end hook raising KeyboardInterrupt or SystemExit skipped the end hooks
    after it, which are to run on every exit."""
    trace: list[object] = []

    def first(info: SessionInfo, reason: str):
        trace.append(("first", reason))
        raise interrupt

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_end=[hook(first, name="first"), end_recorder(trace, "second")],
    )

    with pytest.raises(interrupt):
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            pass

    assert trace == [
        ("first", "closed"),
        ("end", "closed", SessionInfo(CONVERSATION, Scope(), 0)),
    ]
    ends = [(type(e).__name__, e.hook) for e in session.events if type(e) is not ev.HookStarted]
    assert ends == [("HookFailed", "first"), ("HookFinished", "second")]
    [failed] = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert failed.enforced
    assert pairing_problems(session.events) == []


async def test_end_hooks_after_an_end_hooks_interrupt_keep_the_bodys_reason_and_notes():
    """Bug caught: after an end hook's interrupt, the later end hooks never ran, so neither
    the reason they are told nor an interrupt of theirs (a note on the first) was kept."""
    trace: list[object] = []

    def leave(info: SessionInfo, reason: str):
        raise SystemExit(4)

    def interrupted(info: SessionInfo, reason: str):
        trace.append(reason)
        raise KeyboardInterrupt

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_end=[
            hook(leave, name="leave"),
            hook(interrupted, name="interrupted"),
            end_recorder(trace),
        ],
    )

    with pytest.raises(SystemExit) as info:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
            raise Boom("body failed")

    assert info.value.code == 4
    assert type(info.value.__context__) is Boom
    assert info.value.__notes__ == [
        "end hook 'interrupted' (session_end, position 2) also raised KeyboardInterrupt as the"
        " session ended"
    ]
    assert trace == ["error", ("end", "error", SessionInfo(CONVERSATION, Scope(), 0))]


async def test_an_end_hook_blocking_after_an_end_hooks_interrupt_gets_the_drain_timeout(
    autojump_clock,
):
    """Bug caught: the end hooks after one raising KeyboardInterrupt did not run at all;
    run, one that never returns must not hold the interrupt past the drain timeout."""
    trace: list[object] = []

    def first(info: SessionInfo, reason: str):
        raise KeyboardInterrupt

    async def stuck(info: SessionInfo, reason: str):
        trace.append("stuck started")
        await anyio.Event().wait()

    pipe = Pipeline(
        model=ScriptedModel([]),
        on_session_end=[hook(first, name="first"), hook(stuck, name="stuck"), end_recorder(trace)],
    )
    started = anyio.current_time()

    with pytest.raises(KeyboardInterrupt):
        async with pipe.session(
            log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=3
        ) as session:
            pass

    assert anyio.current_time() - started == 3.0
    assert trace == ["stuck started", ("end", "closed", SessionInfo(CONVERSATION, Scope(), 0))]
    failed = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert [(event.hook, event.enforced) for event in failed] == [
        ("first", True),
        ("stuck", False),
    ]
    assert failed[1].error == (
        "cut short: end hook 'first' (session_end, position 1) raised KeyboardInterrupt, and"
        " the end hooks after it did not finish within the session's drain timeout of 3 s"
    )
    assert pairing_problems(session.events) == []


async def _forever(turn: Turn):
    await anyio.sleep(math.inf)
    return cont(turn)


async def _raise_in_a_session(trace: list[object], raised: BaseException, drain: float) -> NoReturn:
    """Send one turn in a session whose background hook never ends, then raise `raised` in
    its body; `trace` gets the session, then what its end hooks were told."""
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(_forever, name="forever", background=True)],
        on_session_end=[end_recorder(trace)],
    )
    async with pipe.session(
        log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=drain
    ) as session:
        trace.append(session)
        await session.send("hi")
        raise raised


async def test_the_bodys_exception_is_raised_when_the_drain_timeout_cuts_a_background_hook():
    """Bug caught: when the body raised and a background hook outlived the drain timeout, the
    timeout's cancellation replaced the body's exception and the task group absorbed it: the
    `async with` returned normally, the ValueError lost."""
    trace: list[object] = []

    with pytest.raises(ValueError, match="boom"):
        await _raise_in_a_session(trace, ValueError("boom"), drain=0.05)

    [session, *ends] = trace
    assert ends == [("end", "error", SessionInfo(CONVERSATION, Scope(), 1))]
    assert isinstance(session, Session)
    failed = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert [event.hook for event in failed] == ["forever"]


async def test_a_body_group_holding_an_interrupt_beside_an_error_cuts_background_hooks():
    """Bug caught: a body raising a group of a KeyboardInterrupt and a ValueError was taken
    for an error, so the session waited out the drain timeout (for ever with math.inf) before
    the interrupt reached the caller, where a lone KeyboardInterrupt cuts the hooks at once."""
    trace: list[object] = []
    group = BaseExceptionGroup("body", [KeyboardInterrupt(), ValueError("boom")])

    # The bound only ends a session that waits for ever (as before the fix) with a failure.
    with pytest.raises(BaseExceptionGroup) as raised, anyio.fail_after(30):
        await _raise_in_a_session(trace, group, drain=math.inf)

    assert [type(exc) for exc in raised.value.exceptions] == [KeyboardInterrupt, ValueError]
    assert trace[1:] == [("end", "cancelled", SessionInfo(CONVERSATION, Scope(), 1))]
