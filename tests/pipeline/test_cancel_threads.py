"""Cancellation that arrives while a sync hook, member or tool runs in a worker thread.

A worker thread cannot be interrupted, so the turn waits for it; the loop leaves the
cancellation pending until its next checkpoint, which a turn of offline models and sync
hooks may never reach. These run on both loops in real time: the thread sleeps 0.3 s and
the caller's deadline passes after 0.1 s.
"""

import math
import threading
import time

import anyio
import pytest

from pipeline import Cont, Pipeline, Session, cont, hook, parallel, tool
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import Text, ToolCall, Turn


def sync_member(turn: Turn) -> list[Text]:
    time.sleep(0.3)
    return [Text("member")]


def slow(query: str) -> str:
    time.sleep(0.3)
    return query


def pipelines(trace: list[str]) -> dict[str, Pipeline]:
    def after(turn: Turn):
        trace.append("post hook ran")
        return cont(turn)

    return {
        "member": Pipeline(model=ScriptedModel(["a"]), pre=[parallel(sync_member)], post=[after]),
        "tool": Pipeline(
            model=ScriptedModel([[ToolCall("1", "slow", {"query": "x"})], "done"]),
            tools=[tool(slow)],
            post=[after],
        ),
    }


@pytest.mark.parametrize("what", ["member", "tool"])
async def test_a_turn_cancelled_while_a_thread_runs_stops_when_the_thread_returns(what) -> None:
    """Catches: on trio, the turn going on after the thread returned (the model called
    again, the post hooks run) and `run` returning "completed" inside the expired scope,
    because nothing after the thread reached a checkpoint."""
    trace: list[str] = []
    pipe = pipelines(trace)[what]
    model = pipe.model
    assert isinstance(model, ScriptedModel)

    with anyio.fail_after(5):
        with anyio.move_on_after(0.1) as scope:
            await pipe.run(Turn.start("hi"))
            trace.append("run returned")

    assert scope.cancelled_caught
    assert trace == []
    assert len(model.requests) == (0 if what == "member" else 1)


async def sleeps(turn: Turn):
    await anyio.sleep(1)
    return cont(turn)


def sleeps_in_a_thread(turn: Turn):
    time.sleep(0.5)
    return cont(turn)


@pytest.mark.parametrize("background", [sleeps, sleeps_in_a_thread], ids=["async", "sync"])
async def test_a_cancellation_during_the_drain_ends_the_session_cancelled(background) -> None:
    """Catches: a cancellation that arrives while the session drains its background hooks
    (the body returned) swallowed — the session left without raising, its end hooks told
    "closed" — under asyncio, and under trio with a sync background hook."""
    reasons: list[str] = []
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(background, background=True)],
        on_session_end=[lambda info, reason: reasons.append(reason)],
    )

    with anyio.fail_after(5):
        with anyio.move_on_after(0.2) as scope:
            async with pipe.session(
                log=MemoryLog(), conversation_id="c", drain_timeout=30
            ) as session:
                await session.send("hi")
            reasons.append("left the session normally")

    assert scope.cancelled_caught
    assert reasons == ["cancelled"]


class HeldThread:
    """A sync background hook whose worker thread waits until `release` is set (5 s at most)
    and notes in `trace` which came first; what it would add comes too late to commit."""

    def __init__(self, trace: list[str]) -> None:
        self.trace = trace
        self.started = threading.Event()  # the thread is running
        self.release = threading.Event()  # the test lets it return
        self.ended = threading.Event()  # it has returned

    def __call__(self, turn: Turn) -> Cont[Turn]:
        self.started.set()
        self.trace.append("thread released" if self.release.wait(5) else "thread gave up waiting")
        self.ended.set()
        return cont(turn.inject("late"))


async def test_the_drain_timeout_abandons_a_sync_background_hooks_thread() -> None:
    """Bug caught: a session waited for a sync background hook's worker thread past its drain
    timeout (until the thread returned), though the drain timeout had reported the hook cut."""
    trace: list[str] = []
    summary = HeldThread(trace)
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(summary, name="summary", background=True, durable=True)],
        on_session_end=[lambda info, reason: trace.append(reason)],
    )
    log = MemoryLog()

    async with pipe.session(log=log, conversation_id="c", drain_timeout=0.05) as session:
        result = await session.send("hi")
    trace.append("session returned")
    summary.release.set()
    await anyio.to_thread.run_sync(summary.ended.wait, 10)

    assert trace == ["closed", "session returned", "thread released"]
    [failed] = [event for event in session.events if isinstance(event, ev.HookFailed)]
    assert (failed.turn_ref, failed.hook) == (result.turn.turn_ref, "summary")
    assert "drain timeout of 0.05 s" in failed.error
    assert [entry.turn_ref for entry in await log.entries("c")] == [result.turn.turn_ref]


async def test_a_background_hook_not_started_at_the_drain_timeout_starts_no_thread() -> None:
    """Bug caught: a background hook whose task first ran after the drain timeout had fired
    (drain_timeout=0, three hooks) started its worker thread anyway, in a shield the timeout
    had not reached, and the session waited for that thread to return."""
    trace: list[str] = []
    summary = HeldThread(trace)
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(summary, name=f"summary{i}", background=True) for i in range(3)],
    )

    async with pipe.session(log=MemoryLog(), conversation_id="c", drain_timeout=0) as session:
        await session.send("hi")
    trace.append("session returned")
    summary.release.set()

    assert trace[0] == "session returned"
    failed = [event.hook for event in session.events if isinstance(event, ev.HookFailed)]
    assert sorted(failed) == ["summary0", "summary1", "summary2"]


async def test_a_cancellation_during_the_drain_abandons_a_sync_background_hooks_thread() -> None:
    """Bug caught: a session cancelled while it drained (as `turnplug serve` cancels one still
    closing at its --drain-timeout) waited for a sync background hook's worker thread to
    return, up to the session's own drain timeout, though the hook was reported cut."""
    trace: list[str] = []
    summary = HeldThread(trace)
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), post=[hook(summary, name="summary", background=True)]
    )

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def converse() -> None:
                async with pipe.session(
                    log=MemoryLog(), conversation_id="c", drain_timeout=30
                ) as session:
                    sessions.append(session)
                    await session.send("hi")

            sessions: list[Session] = []
            group.start_soon(converse)
            await anyio.to_thread.run_sync(summary.started.wait, 10)
            scope.cancel()
    trace.append("session returned")
    summary.release.set()

    assert scope.cancelled_caught
    assert trace[0] == "session returned"
    [failed] = [event for event in sessions[0].events if isinstance(event, ev.HookFailed)]
    assert failed.error == "cut short: the session was cancelled; nothing of it was committed"


async def test_an_interrupt_ending_the_body_abandons_a_sync_background_hooks_thread() -> None:
    """Bug caught: a session whose body raised KeyboardInterrupt (trio's Ctrl-C) waited for a
    sync background hook's worker thread to return, and up to its drain timeout for the hook
    (for ever with math.inf), where a cancellation arriving during the drain abandons it."""
    trace: list[str] = []
    summary = HeldThread(trace)
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), post=[hook(summary, name="summary", background=True)]
    )

    sessions: list[Session] = []

    async def converse() -> None:
        async with pipe.session(
            log=MemoryLog(), conversation_id="c", drain_timeout=math.inf
        ) as session:
            sessions.append(session)
            await session.send("hi")
            await anyio.to_thread.run_sync(summary.started.wait, 10)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await converse()
    trace.append("session returned")
    summary.release.set()

    assert trace[0] == "session returned"
    [failed] = [event for event in sessions[0].events if isinstance(event, ev.HookFailed)]
    assert failed.error == (
        "cut short: the session was interrupted (KeyboardInterrupt); nothing of it was committed"
    )


@pytest.mark.parametrize("body", ["body still running", "body returned"])
async def test_a_background_hooks_interrupt_abandons_a_sibling_hooks_thread(body: str) -> None:
    """Bug caught: a background hook raising SystemExit stopped the session but left it
    waiting for another sync background hook's worker thread to return, where an interrupt
    ending the body abandons that thread at once; whether the body still ran or the session
    drained its background hooks when the hook raised."""
    trace: list[str] = []
    summary = HeldThread(trace)
    may_raise = anyio.Event()  # set by the body, before it sleeps or as it returns

    async def exiting(turn: Turn):
        await anyio.to_thread.run_sync(summary.started.wait, 10)
        await may_raise.wait()
        raise SystemExit(3)

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[
            hook(exiting, name="exiting", background=True),
            hook(summary, name="summary", background=True),
        ],
    )

    sessions: list[Session] = []

    async def converse() -> None:
        async with pipe.session(
            log=MemoryLog(), conversation_id="c", drain_timeout=math.inf
        ) as session:
            sessions.append(session)
            await session.send("hi")
            may_raise.set()
            if body == "body still running":
                await anyio.sleep(math.inf)
            # Nothing waits between here and the drain: the hook raises as the session drains.

    with pytest.raises(SystemExit):
        await converse()
    trace.append("session returned")
    summary.release.set()

    assert trace[0] == "session returned"
    failed = [event for event in sessions[0].events if isinstance(event, ev.HookFailed)]
    assert [(event.hook, event.error) for event in failed] == [
        ("exiting", "SystemExit: 3"),
        (
            "summary",
            "cut short: background hook 'exiting' raised SystemExit, which stopped the"
            " session; nothing of it was committed",
        ),
    ]
