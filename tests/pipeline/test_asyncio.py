"""The runtime's guarantees under asyncio, in real time.

The behaviour tests run on trio and asyncio alike (tests/conftest.py), but those that need
virtual time (``autojump_clock``) run on trio only. These tests check the same laws under
asyncio with short real timeouts, from plain sync code through ``asyncio.run`` (as an
asyncio application would), and with hooks, tools and models that use asyncio's own API.
Durations are asserted with generous bounds: they tell "cancelled at once" from "ran to the
end", not milliseconds apart.
"""

import asyncio
import contextvars
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

from hooks import retrieve
from pipeline import (
    HookFailed,
    HookTimeout,
    LogError,
    Pipeline,
    ProviderError,
    Session,
    SessionInfo,
    cont,
    halt,
    hook,
    parallel,
    tool,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog, PostgresLog, SQLiteLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Message, Text, ToolCall, Turn

CONVERSATION = "conv"


def hello() -> ScriptedModel:
    return ScriptedModel(["hello"])


def exchange(question: str, answer: str) -> tuple[Message, ...]:
    return (Message.user(question), Message.assistant(answer))


# -- asyncio.run from plain sync code ---------------------------------------------------------


def test_asyncio_run_runs_a_turn_from_sync_code() -> None:
    """Catches: `asyncio.run(pipe.run(...))` failing with "must be called from async context"
    (the runtime reading trio's clock under asyncio)."""
    pipe = Pipeline(model=hello())

    result = asyncio.run(pipe.run(Turn.start("x")))

    assert (result.outcome, result.reply.text if result.reply else None) == ("completed", "hello")


def test_a_streamed_session_runs_under_asyncio_run() -> None:
    """Catches: streaming or a session (task group, lock, events) tied to trio."""
    pipe = Pipeline(model=ScriptedModel([["hel", "lo"], "again"]))
    log = MemoryLog()

    async def main() -> tuple[list[str], str]:
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            async with session.stream("one") as events:
                deltas = [e.text async for e in events if isinstance(e, ev.TextDelta)]
            second = await session.send("two")
        return deltas, second.reply.text if second.reply else ""

    deltas, second = asyncio.run(main())

    assert (deltas, second) == (["hel", "lo"], "again")
    assert asyncio.run(log.load(CONVERSATION)).messages == (
        *exchange("one", "hello"),
        *exchange("two", "again"),
    )


async def _stray() -> None:
    """Await a future someone cancelled: a ``CancelledError`` while nothing cancels the turn."""
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future


async def _consume_into(trace: list[str], pipe: Pipeline) -> None:
    """Stream a turn, noting each event's type and the code after the loop."""
    async with pipe.stream(Turn.start("x")) as events:
        async for event in events:
            trace.append(type(event).__name__)
        trace.append("after the loop")


class _StrayLog(MemoryLog):
    """A log whose append lets a stray ``CancelledError`` out, nothing cancelling it."""

    async def append(self, *args: Any, **kwargs: Any) -> None:
        await _stray()


def test_a_streamed_turn_stopped_by_a_stray_cancellation_fails_loudly() -> None:
    """Catches: a stray ``CancelledError`` out of a custom log's append (it awaited a future
    someone cancelled; nothing cancelled the turn) ending the turn's events as if it had
    finished, the consumer's code after its loop running and the block left without a
    word; then stopping the turn with a RuntimeError that named no log, where the log's
    failure is a LogError naming it."""
    pipe = Pipeline(model=ScriptedModel(["hello"]))
    trace: list[str] = []

    async def main() -> None:
        async with (
            pipe.session(log=_StrayLog(), conversation_id="c") as session,
            session.stream("x") as events,
        ):
            async for event in events:
                trace.append(type(event).__name__)
            trace.append("after the loop")

    with pytest.raises(LogError, match=r"log MemoryLog\(.*\) failed committing turn"):
        asyncio.run(main())

    assert "after the loop" not in trace
    assert "Committed" not in trace


@pytest.mark.parametrize("streamed", [False, True])
def test_a_stray_cancellation_out_of_a_model_is_a_provider_error(streamed: bool) -> None:
    """Catches: a model's stray ``CancelledError`` (it awaited a future someone cancelled;
    nothing cancelled the turn) escaping run() as a bare cancellation, the caller's task
    taken for cancelled, or stopping a streamed turn without naming the model, where every
    other failure of a model is a ProviderError."""

    async def reply(request: object) -> str:
        await _stray()
        return "never"

    pipe = Pipeline(model=FunctionModel(reply))
    trace: list[str] = []

    async def main() -> None:
        if streamed:
            await _consume_into(trace, pipe)
        else:
            await pipe.run(Turn.start("x"))

    with pytest.raises(ProviderError, match="raised CancelledError itself"):
        asyncio.run(main())
    if streamed:
        assert trace == ["TurnStarted", "ModelCalled"]


def test_a_stray_cancellation_out_of_a_hook_is_the_hooks_failure() -> None:
    """Catches: a hook's stray ``CancelledError`` stopping the streamed turn without naming
    the hook (a RuntimeError saying only that the turn was stopped), where any other
    exception out of a hook is its HookFailed."""

    async def stray(turn: Turn):
        await _stray()
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[hook(stray, name="stray")])
    trace: list[str] = []

    with pytest.raises(HookFailed, match="'stray'"):
        asyncio.run(_consume_into(trace, pipe))

    assert trace == ["TurnStarted", "HookStarted", "HookFailed"]


def test_hooks_tools_models_and_search_may_use_asyncio_itself() -> None:
    """Catches: user code awaiting asyncio's own API (asyncio.sleep, an asyncio.Queue,
    asyncio.to_thread) failing inside a turn, as it would if the turn ran on trio."""
    trace: list[str] = []
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def note(turn: Turn):
        await asyncio.sleep(0.001)
        await queue.put("noted")
        trace.append(await queue.get())
        return cont(turn.inject("[note]"))

    async def search(query: str, k: int) -> list[str]:
        await asyncio.sleep(0.001)
        return [f"found {query}"]

    async def weather(city: str) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: f"sunny in {city}")

    async def answer(request):
        await asyncio.sleep(0.001)
        if request.messages[-1].role == "tool":
            return [
                await asyncio.to_thread(lambda: "it is "),
                request.messages[-1].parts[0].content,
            ]
        return [ToolCall("c1", "weather", {"city": "Oslo"})]

    def after(call, result, turn):
        trace.append(f"after {result.content}")
        return cont(result)

    pipe = Pipeline(
        model=FunctionModel(answer),
        pre=[hook(note, name="note"), parallel(retrieve(search))],
        tools=[tool(weather)],
        after_tool=[hook(after, name="after")],
    )

    result = asyncio.run(pipe.run(Turn.start("rain?")))

    assert result.reply is not None
    assert result.reply.text == "it is sunny in Oslo"
    sources = [i.source for i in result.turn.injections]
    assert sources == ["note", search.__qualname__.replace("<locals>.", "")]
    assert trace == ["noted", "after sunny in Oslo"]


def _by_hand(coroutine) -> RuntimeError:
    """Drive `coroutine` one step by hand, as no event loop would: the error it raises."""
    with pytest.raises(RuntimeError) as excinfo:
        coroutine.send(None)
    coroutine.close()
    return excinfo.value


async def _open_session(pipe: Pipeline) -> None:
    async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION):
        pass


async def _stream(pipe: Pipeline) -> None:
    async with pipe.stream(Turn.start("x")) as events:
        async for _ in events:
            pass


@pytest.mark.parametrize(
    ("what", "start"),
    [
        ("a turn", lambda pipe, path: pipe.run(Turn.start("x"))),
        ("a streamed turn", lambda pipe, path: _stream(pipe)),
        ("pipe.session", lambda pipe, path: _open_session(pipe)),
        ("SQLiteLog", lambda pipe, path: SQLiteLog(path).load(CONVERSATION)),
    ],
    ids=["run", "stream", "session", "sqlite"],
)
def test_a_coroutine_driven_by_hand_is_refused_not_hung(what, start, tmp_path: Path) -> None:
    """Catches: a turnplug coroutine driven by something that is neither asyncio nor trio
    hanging, or failing deep inside with an obscure error."""
    error = _by_hand(start(Pipeline(model=hello()), tmp_path / "log.db"))

    message = str(error)
    assert message.startswith(what), message
    assert "must run under trio or asyncio, but it was awaited with no event loop" in message
    assert "asyncio.run(...)" in message


def test_a_turn_under_another_event_loop_is_refused_naming_it() -> None:
    """Catches: a turn awaited under another loop (here one that says it is curio) running
    into trio's or asyncio's internals instead of a clear error."""
    pipe = Pipeline(model=hello())

    def under_curio() -> RuntimeError:
        sniffio.current_async_library_cvar.set("curio")
        return _by_hand(pipe.run(Turn.start("x")))

    error = contextvars.copy_context().run(under_curio)

    assert "awaited with the curio event loop running" in str(error)


# -- timeouts ---------------------------------------------------------------------------------


def test_a_hook_timeout_is_a_hook_timeout() -> None:
    """Catches: a timeout that surfaces as asyncio's TimeoutError or CancelledError, or never
    fires."""

    async def slow(turn: Turn):
        await asyncio.sleep(5)
        return cont(turn)

    pipe = Pipeline(model=hello(), pre=[hook(slow, name="slow", timeout=0.05)])
    started = time.monotonic()

    with pytest.raises(HookTimeout) as excinfo:
        asyncio.run(pipe.run(Turn.start("x")))

    assert (excinfo.value.hook, excinfo.value.timeout) == ("slow", 0.05)
    assert time.monotonic() - started < 2


def test_a_blocking_sync_hook_with_a_timeout_is_abandoned_when_it_fires() -> None:
    """Catches: a sync hook that blocks (time.sleep) holding the turn past its timeout=."""
    release = threading.Event()

    def blocking(turn: Turn):
        release.wait(5)
        return cont(turn)

    pipe = Pipeline(model=hello(), pre=[hook(blocking, name="blocking", timeout=0.05)])
    started = time.monotonic()

    try:
        with pytest.raises(HookTimeout):
            asyncio.run(pipe.run(Turn.start("x")))
        elapsed = time.monotonic() - started
    finally:
        release.set()

    assert elapsed < 2


# -- parallel groups --------------------------------------------------------------------------


def member(trace: list[str], name: str, seconds: float, outcome: str = "parts"):
    async def run(turn: Turn):
        await asyncio.sleep(seconds)
        trace.append(f"{name} done")
        if outcome == "halt":
            return halt(f"{name} stops")
        return [Text(name)]

    return hook(run, name=name)


def test_a_parallel_group_merges_in_declaration_order() -> None:
    """Catches: members' parts added in the order they finished, not declared."""
    trace: list[str] = []
    pipe = Pipeline(
        model=hello(),
        pre=[
            parallel(
                member(trace, "slow", 0.06), member(trace, "fast", 0.0), member(trace, "mid", 0.03)
            )
        ],
    )

    result = asyncio.run(pipe.run(Turn.start("x")))

    assert trace == ["fast done", "mid done", "slow done"]
    assert [i.source for i in result.turn.injections] == ["slow", "fast", "mid"]


def test_a_halting_member_cancels_its_siblings_with_no_late_output() -> None:
    """Catches: siblings of a halting member left running (or finishing after the turn) under
    asyncio."""
    trace: list[str] = []
    pipe = Pipeline(
        model=hello(),
        pre=[
            parallel(
                member(trace, "slow", 2.0),
                member(trace, "stop", 0.02, "halt"),
                member(trace, "b", 2.0),
            )
        ],
    )

    async def main():
        started = time.monotonic()
        result = await pipe.run(Turn.start("x"))
        elapsed = time.monotonic() - started
        await asyncio.sleep(2.1)  # anything left running would finish by now
        return result, elapsed

    result, elapsed = asyncio.run(main())

    assert (result.outcome, result.halt.hook if result.halt else None) == ("halted", "stop")
    assert trace == ["stop done"]
    assert elapsed < 1.5  # the siblings' 2 s were not waited for (generous: a loaded machine)
    verdicts = {r.hook: r.verdict for r in result.audit.hooks}
    assert verdicts == {"slow": "cancelled", "stop": "halt", "b": "cancelled"}


# -- cancellation from outside ----------------------------------------------------------------


def slow_model(started: asyncio.Event) -> FunctionModel:
    async def chunks(request):
        yield "first "
        started.set()
        await asyncio.sleep(10)
        yield "never"

    return FunctionModel(chunks)


@pytest.mark.parametrize("log_kind", ["memory", "sqlite"])
def test_a_task_cancelled_mid_stream_commits_nothing_and_leaves_no_task(
    log_kind: str, tmp_path: Path
) -> None:
    """Catches: `task.cancel()` on the task streaming a turn (a web framework dropping a
    disconnected client) committing a partial turn or leaving the turn's task running."""
    seen: list[object] = []
    reasons: list[str] = []

    def end(info: SessionInfo, reason: str) -> None:
        reasons.append(reason)

    async def main() -> tuple[Context, set[asyncio.Task[object]]]:
        log = MemoryLog() if log_kind == "memory" else SQLiteLog(tmp_path / "log.db")
        started = asyncio.Event()
        pipe = Pipeline(model=slow_model(started), on_session_end=[hook(end, name="end")])

        async def client() -> None:
            async with (
                pipe.session(log=log, conversation_id=CONVERSATION) as session,
                session.stream("hi") as events,
            ):
                async for event in events:
                    seen.append(type(event).__name__)

        task = asyncio.create_task(client())
        await started.wait()
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = asyncio.all_tasks() - {asyncio.current_task()}
        loaded = await log.load(CONVERSATION)
        if isinstance(log, SQLiteLog):
            await log.aclose()
        return loaded, left

    loaded, left = asyncio.run(main())

    assert "TextDelta" in seen
    assert loaded == Context()
    assert left == set()
    assert reasons == ["cancelled"]


# -- tool batches -----------------------------------------------------------------------------


def call(call_id: str, city: str, name: str = "lookup") -> ToolCall:
    return ToolCall(call_id, name, {"city": city})


def stopper(delay: float):
    async def run(c: ToolCall, turn: Turn):
        if c.arguments["city"] != "a":
            return cont(c)
        await asyncio.sleep(delay)
        return halt("stopper stopped a")

    return hook(run, name="stopper")


def test_a_fail_fast_batch_cancels_calls_in_flight() -> None:
    """Catches: a tool call still running (and its result kept) after another call's hook
    halted the batch."""
    trace: list[str] = []

    async def slow(city: str) -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            trace.append("slow cancelled")
            raise
        return "late"

    async def lookup(city: str) -> str:
        return city

    pipe = Pipeline(
        model=ScriptedModel([[call("c1", "x", "slow"), call("c2", "a")], "done"]),
        tools=[tool(slow), tool(lookup)],
        before_tool=[stopper(0.02)],
        tool_concurrency=2,
    )
    started = time.monotonic()

    result = asyncio.run(pipe.run(Turn.start("go")))

    assert (result.outcome, result.halt.hook if result.halt else None) == ("halted", "stopper")
    assert trace == ["slow cancelled"]
    assert time.monotonic() - started < 2


def test_a_fail_fast_batch_drops_the_calls_not_started() -> None:
    """Catches: calls queued behind tool_concurrency starting after the batch halted."""
    ran: list[str] = []

    async def lookup(city: str) -> str:
        ran.append(city)
        return city

    pipe = Pipeline(
        model=ScriptedModel([[call("c1", "a"), call("c2", "b"), call("c3", "c")], "done"]),
        tools=[tool(lookup)],
        before_tool=[stopper(0.0)],
        tool_concurrency=1,
    )

    result = asyncio.run(pipe.run(Turn.start("go")))

    assert result.outcome == "halted"
    assert ran == []


# -- sessions: background hooks and end hooks -------------------------------------------------


def test_background_hooks_are_drained_on_exit_and_their_failures_reported() -> None:
    """Catches: session exit under asyncio not waiting for background hooks, losing their
    durable output, or swallowing their failures."""

    async def summary(turn: Turn):
        await asyncio.sleep(0.03)
        return cont(turn.inject("[summary]"))

    async def broken(turn: Turn):
        await asyncio.sleep(0.01)
        raise ValueError("store down")

    pipe = Pipeline(
        model=hello(),
        post=[
            hook(summary, name="summary", background=True, durable=True),
            hook(broken, name="broken", background=True),
        ],
    )
    log = MemoryLog()

    async def main():
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            await session.send("hi")
        return session.events, await log.entries(CONVERSATION)

    events, entries = asyncio.run(main())

    first = entries[0].turn_ref
    assert [e.turn_ref for e in entries] == [first, f"{first}:summary"]
    assert entries[1].messages[0].parts[0].text == "[summary]"
    failed = [e for e in events if isinstance(e, ev.HookFailed)]
    assert [(e.hook, e.enforced) for e in failed] == [("broken", False)]
    assert "store down" in failed[0].error


def test_a_background_hook_past_the_drain_timeout_is_cancelled_and_reported() -> None:
    """Catches: a drain timeout that is not applied under asyncio (exit hangs)."""

    async def forever(turn: Turn):
        await asyncio.sleep(10)
        return cont(turn)

    pipe = Pipeline(model=hello(), post=[hook(forever, name="forever", background=True)])

    async def main():
        started = time.monotonic()
        async with pipe.session(
            log=MemoryLog(), conversation_id=CONVERSATION, drain_timeout=0.05
        ) as session:
            await session.send("hi")
        return session.events, time.monotonic() - started

    events, elapsed = asyncio.run(main())

    failed = [e for e in events if isinstance(e, ev.HookFailed)]
    assert [e.hook for e in failed] == ["forever"]
    assert "drain timeout" in failed[0].error
    assert elapsed < 2


@pytest.mark.parametrize(
    ("how", "backend"),
    [
        ("cancel scope", "trio"),
        ("cancel scope", "asyncio"),
        ("asyncio.timeout", "asyncio"),
        ("task.cancel", "asyncio"),
    ],
)
def test_a_cancellation_during_the_drain_cuts_background_hooks_at_once_however_it_comes(
    how: str, backend: str
) -> None:
    """Bug caught: asyncio's own cancellation (`task.cancel()`, an `asyncio.timeout`, and so
    asyncio.run's Ctrl-C) arriving while a session drained let its background hooks run on
    for the drain timeout, where a cancel scope's cuts them at once on both loops."""
    trace: list[str] = []
    started = anyio.Event()

    async def summary(turn: Turn):
        started.set()
        await anyio.sleep(0.5)
        trace.append("summary finished")
        return cont(turn.inject("[summary]"))

    pipe = Pipeline(
        model=hello(),
        post=[hook(summary, name="summary", background=True, durable=True)],
        on_session_end=[lambda info, reason: trace.append(reason)],
    )
    log = MemoryLog()
    sessions: list[Session] = []

    async def converse() -> None:
        async with pipe.session(log=log, conversation_id=CONVERSATION, drain_timeout=30) as s:
            sessions.append(s)
            await s.send("hi")

    async def cancelled() -> str:
        """How the session's caller saw the cancellation."""
        if how == "cancel scope":
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(converse)
                    await started.wait()
                    scope.cancel()
            return "scope" if scope.cancelled_caught else "returned"
        if how == "asyncio.timeout":
            try:
                async with asyncio.timeout(None) as timeout:
                    task = asyncio.create_task(converse())
                    await started.wait()
                    timeout.reschedule(asyncio.get_running_loop().time())
                    await task
            except TimeoutError:
                return f"TimeoutError, cancelling {asyncio.current_task().cancelling()}"
            return "returned"
        task = asyncio.create_task(converse())
        await started.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return f"CancelledError, cancelling {task.cancelling()}"
        return "returned"

    seen = anyio.run(cancelled, backend=backend)

    expected = {
        "cancel scope": "scope",
        "asyncio.timeout": "TimeoutError, cancelling 0",
        "task.cancel": "CancelledError, cancelling 1",
    }
    assert seen == expected[how]
    assert trace == ["cancelled"]
    assert len(anyio.run(log.entries, CONVERSATION)) == 1  # the turn, not the summary
    [failed] = [e for e in sessions[0].events if isinstance(e, ev.HookFailed)]
    assert failed.hook == "summary"
    assert failed.error == "cut short: the session was cancelled; nothing of it was committed"


@pytest.mark.parametrize("how", ["closed", "error", "cancelled"])
def test_on_session_end_runs_with_the_reason(how: str) -> None:
    """Catches: end hooks skipped, or told the wrong reason, when an asyncio session ends by
    returning, raising, or being cancelled from outside."""
    reasons: list[str] = []

    async def end(info: SessionInfo, reason: str) -> None:
        await asyncio.sleep(0.01)  # an end hook that awaits, even in a cancelled session
        reasons.append(reason)

    pipe = Pipeline(model=hello(), on_session_end=[hook(end, name="end")])

    async def body() -> None:
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            await session.send("hi")
            if how == "error":
                raise LookupError("body failed")
            if how == "cancelled":
                await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(body())
        await asyncio.sleep(0.05)
        if how == "cancelled":
            task.cancel()
        await task

    expected = {"closed": None, "error": LookupError, "cancelled": asyncio.CancelledError}[how]
    if expected is None:
        asyncio.run(main())
    else:
        with pytest.raises(expected):
            asyncio.run(main())

    assert reasons == [how]


def test_an_asyncio_timeout_firing_while_end_hooks_run_lets_them_all_finish_first() -> None:
    """Bug caught: asyncio's own cancellation (an `asyncio.timeout`) firing while an end hook
    ran went through the session's shield, cutting that hook short and skipping the later end
    hooks, which a cancel scope's cancellation never did."""
    trace: list[tuple[str, str]] = []

    async def flush(info: SessionInfo, reason: str) -> None:
        await asyncio.sleep(0.2)
        trace.append(("flush", reason))

    async def audit(info: SessionInfo, reason: str) -> None:
        await asyncio.sleep(0)
        trace.append(("audit", reason))

    pipe = Pipeline(
        model=hello(), on_session_end=[hook(flush, name="flush"), hook(audit, name="audit")]
    )
    sessions: list[Session] = []

    async def main() -> None:
        async with asyncio.timeout(0.05):
            async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
                sessions.append(session)

    with pytest.raises(TimeoutError):
        asyncio.run(main())

    assert trace == [("flush", "closed"), ("audit", "closed")]
    assert [(type(e), e.hook) for e in sessions[0].events] == [
        (ev.HookStarted, "flush"),
        (ev.HookFinished, "flush"),
        (ev.HookStarted, "audit"),
        (ev.HookFinished, "audit"),
    ]


def test_an_end_hook_that_fails_is_reported_not_raised() -> None:
    """Catches: a failing end hook under asyncio replacing the session's own outcome."""

    def end(info: SessionInfo, reason: str) -> None:
        raise OSError("flush failed")

    pipe = Pipeline(model=hello(), on_session_end=[hook(end, name="end")])

    async def main():
        async with pipe.session(log=MemoryLog(), conversation_id=CONVERSATION) as session:
            await session.send("hi")
        return session.events

    events = asyncio.run(main())

    failed = [e for e in events if isinstance(e, ev.HookFailed)]
    assert [(e.hook, e.stage, e.enforced) for e in failed] == [("end", "session_end", False)]
    assert "flush failed" in failed[0].error


# -- durable logs work in threads, never on the loop ------------------------------------------


async def ticking_while(work, period: float = 0.002) -> tuple[int, object]:
    """Run `work()` while a ticker counts its wake-ups every `period` seconds."""
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(period)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        value = await work()
    finally:
        done.set()
        await task
    return ticks, value


def test_a_sqlite_commit_waiting_for_a_lock_keeps_the_loop_running(tmp_path: Path) -> None:
    """Catches: SQLiteLog doing its blocking work (here, waiting for another connection's
    write lock) on the asyncio loop's thread instead of a worker thread."""
    path = tmp_path / "log.db"

    async def first() -> None:
        async with SQLiteLog(path) as log:
            await log.append(CONVERSATION, "t1", exchange("q", "a"))

    asyncio.run(first())
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: holder.execute("ROLLBACK"))

    async def commit() -> list[str]:
        release.start()
        async with SQLiteLog(path, timeout=10) as log:
            await log.append(CONVERSATION, "t2", exchange("q2", "a2"))
            return [e.turn_ref for e in await log.entries(CONVERSATION)]

    try:
        ticks, refs = asyncio.run(ticking_while(commit))
    finally:
        release.join()
        holder.close()

    assert refs == ["t1", "t2"]
    assert ticks >= 20  # 0.3 s of waiting at one tick per 2 ms; a blocked loop ticks ~once


def committed_and_locked(postgres: str) -> Any:
    """A psycopg connection holding PostgresLog's turns table locked, after one commit."""
    import psycopg

    async def first() -> None:
        async with PostgresLog(postgres) as log:
            await log.append(CONVERSATION, "t1", exchange("q", "a"))

    asyncio.run(first())
    holder = psycopg.connect(postgres)
    holder.execute("LOCK TABLE turnplug_turns IN ACCESS EXCLUSIVE MODE")
    return holder


def test_a_postgres_commit_waiting_for_a_lock_keeps_the_loop_running(postgres: str) -> None:
    """Catches: PostgresLog doing its blocking work on the asyncio loop's thread."""
    holder = committed_and_locked(postgres)
    release = threading.Timer(0.3, holder.rollback)

    async def commit() -> list[str]:
        release.start()
        async with PostgresLog(postgres) as log:
            await log.append(CONVERSATION, "t2", exchange("q2", "a2"))
            return [e.turn_ref for e in await log.entries(CONVERSATION)]

    try:
        ticks, refs = asyncio.run(ticking_while(commit))
    finally:
        release.join()
        holder.close()

    assert refs == ["t1", "t2"]
    assert ticks >= 20


# -- asyncio's own cancellation of a commit in flight ---------------------------------------


def commit_under_an_asyncio_timeout(
    open_log: Callable[[], Any], lock: Callable[[], object], unlock: Callable[[], object]
) -> tuple[float, list[str]]:
    """Commit "t1", then "t2" under a 0.05 s `asyncio.timeout` while another connection
    holds the lock the commit needs for 0.4 s: how long the timeout took to fire, and the
    turns the log then holds."""
    release = threading.Timer(0.4, unlock)

    async def main() -> tuple[float, list[str]]:
        async with open_log() as log:
            await log.append(CONVERSATION, "t1", exchange("q", "a"))
            lock()
            release.start()
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await log.append(CONVERSATION, "t2", exchange("q2", "a2"))
            waited = time.monotonic() - started
            return waited, [entry.turn_ref for entry in await log.entries(CONVERSATION)]

    try:
        return asyncio.run(main())
    finally:
        release.join()


def test_an_asyncio_timeout_firing_during_a_sqlite_commit_fires_once_the_commit_ended(
    tmp_path: Path,
) -> None:
    """Catches: asyncio's own cancellation passing the shield a commit's hand-over waits
    behind: the caller was told "timed out" at once while the worker thread went on and
    committed the turn, so the caller's view of the conversation (a session's) no longer
    matched the log."""
    path = tmp_path / "log.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (x)")
    try:
        waited, refs = commit_under_an_asyncio_timeout(
            lambda: SQLiteLog(path, timeout=10),
            lambda: holder.execute("BEGIN IMMEDIATE"),
            lambda: holder.execute("ROLLBACK"),
        )
    finally:
        holder.close()

    assert refs == ["t1", "t2"]  # the commit was under way: it ran to its end
    assert waited >= 0.3  # and the timeout came once it had, not at 0.05 s


class GatedWrites:
    """Holds each SQLite transaction until the test lets it go, and says when one started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from pipeline.logs import _sqlite

        self.gate = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)
        write = _sqlite._append_batch

        def gated(commits, connection):  # type: ignore[no-untyped-def]
            self.entered.release()
            self.gate.acquire()
            return write(commits, connection)

        monkeypatch.setattr(_sqlite, "_append_batch", gated)

    async def wait_entered(self) -> None:
        await asyncio.to_thread(self.entered.acquire)


async def _a_batch_in_flight(log: SQLiteLog, writes: GatedWrites) -> tuple[asyncio.Task, ...]:
    """Three commits: "a" written alone, then "b" and "c" in one transaction that "b"'s task
    writes; returned once that transaction is in flight."""
    tasks = [asyncio.create_task(log.append("a", "t1", exchange("q", "a")))]
    await writes.wait_entered()
    tasks += [asyncio.create_task(log.append(c, "t1", exchange("q", "a"))) for c in "bc"]
    await asyncio.sleep(0.05)  # both queued behind "a"
    writes.gate.release()
    await writes.wait_entered()
    return tuple(tasks)


def test_the_writer_of_a_batch_cancelled_by_asyncio_leaves_the_others_their_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: the task writing a group commit, cancelled by asyncio's own cancellation
    while the transaction ran, leaving its batch without outcomes: another task's commit,
    written, failed with an AssertionError, and the cancelled one returned at once."""
    writes = GatedWrites(monkeypatch)

    async def main() -> tuple[bool, list[object], dict[str, int]]:
        async with SQLiteLog(tmp_path / "log.db") as log:
            a, b, c = await _a_batch_in_flight(log, writes)
            b.cancel()
            await asyncio.sleep(0.05)
            waited = not b.done()
            writes.gate.release()
            results = await asyncio.gather(a, b, c, return_exceptions=True)
            stored = {k: len(await log.entries(k)) for k in "abc"}
            return waited, results, stored

    waited, results, stored = asyncio.run(main())

    assert waited  # b's transaction was under way: its task waited for it
    assert [results[0], results[2]] == [None, None]
    assert isinstance(results[1], asyncio.CancelledError)
    assert stored == {"a": 1, "b": 1, "c": 1}


def test_a_commit_cancelled_by_asyncio_inside_anothers_batch_is_cancelled_once_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: a commit taken into another task's transaction swallowing asyncio's own
    cancellation while it waited for that transaction: its task went on as if never
    cancelled, and an `asyncio.timeout` around it never fired."""
    writes = GatedWrites(monkeypatch)

    async def main() -> tuple[list[object], dict[str, int]]:
        async with SQLiteLog(tmp_path / "log.db") as log:
            a, b, c = await _a_batch_in_flight(log, writes)
            c.cancel()
            await asyncio.sleep(0.05)
            writes.gate.release()
            results = await asyncio.gather(a, b, c, return_exceptions=True)
            return results, {k: len(await log.entries(k)) for k in "abc"}

    results, stored = asyncio.run(main())

    assert results[:2] == [None, None]
    assert isinstance(results[2], asyncio.CancelledError)
    assert stored == {"a": 1, "b": 1, "c": 1}  # c was in the transaction: written


def test_a_send_cancelled_by_asyncio_during_its_commit_leaves_the_session_in_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: a `send` cancelled by asyncio's own cancellation while its commit was being
    written: the turn was in the log, but the session never counted it, so its next `send`
    failed with a LogConflict against its own commit."""
    writes = GatedWrites(monkeypatch)
    pipe = Pipeline(model=FunctionModel(lambda request: f"re: {request.messages[-1].text}"))

    async def main() -> tuple[Context, Context, str]:
        async with SQLiteLog(tmp_path / "log.db") as log:
            async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
                first = asyncio.create_task(session.send("first"))
                await writes.wait_entered()
                first.cancel()
                writes.gate.release()
                with pytest.raises(asyncio.CancelledError):
                    await first
                writes.gate.release()  # the next commit's transaction
                second = await session.send("second")
                seen = session.context
            return await log.load(CONVERSATION), seen, second.outcome

    stored, seen, outcome = asyncio.run(main())

    assert outcome == "completed"
    assert (
        stored
        == seen
        == Context(messages=(*exchange("first", "re: first"), *exchange("second", "re: second")))
    )


def test_the_writer_of_a_batch_cancelled_by_asyncio_while_it_waits_for_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: the task writing a group commit, cancelled by asyncio's own cancellation
    while a read held the log's one connection, failing every other commit of its batch
    ("the task writing its batch was stopped first"), although their tasks were not
    cancelled: the batch is now written, and only the writer's task is cancelled after."""
    gate, entered = threading.Semaphore(0), threading.Semaphore(0)
    load = SQLiteLog._load_rows

    def gated_load(conversation_id, connection):  # type: ignore[no-untyped-def]
        entered.release()
        gate.acquire()
        return load(conversation_id, connection)

    monkeypatch.setattr(SQLiteLog, "_load_rows", gated_load)

    async def main() -> tuple[list[object], dict[str, int]]:
        async with SQLiteLog(tmp_path / "log.db") as log:
            reads = [asyncio.create_task(log.load("x"))]
            await asyncio.to_thread(entered.acquire)  # the read holds the connection
            writer = asyncio.create_task(log.append("w", "t1", exchange("q", "a")))
            await asyncio.sleep(0.05)  # w holds the write lock, waits for the connection
            reads.append(asyncio.create_task(log.load("y")))  # next for it after w
            a = asyncio.create_task(log.append("a", "t1", exchange("q", "a")))
            b = asyncio.create_task(log.append("b", "t1", exchange("q", "a")))
            await asyncio.sleep(0.05)  # a and b queue behind w
            gate.release()
            await writer
            await asyncio.to_thread(entered.acquire)  # the second read holds it again
            await asyncio.sleep(0.05)  # a took [a, b] and waits for the connection
            a.cancel()
            await asyncio.sleep(0.05)
            gate.release()
            results = await asyncio.gather(a, b, *reads, return_exceptions=True)
            return results, {k: len(await log.entries(k)) for k in "wab"}

    results, stored = asyncio.run(main())

    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1] is None
    assert stored == {"w": 1, "a": 1, "b": 1}


def test_an_asyncio_timeout_is_not_lost_by_a_commit_inside_anothers_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: a commit inside another task's transaction, cancelled first by an AnyIO
    scope and then by an `asyncio.timeout` around it, swallowing the timeout's cancellation
    while it waited for the transaction: the timeout block exited without TimeoutError."""
    writes = GatedWrites(monkeypatch)
    outcome: list[str] = []

    async def timed(log: SQLiteLog) -> None:
        try:
            async with asyncio.timeout(0.2):
                with anyio.CancelScope() as scope:
                    asyncio.get_running_loop().call_later(0.1, scope.cancel)
                    await log.append("c", "t1", exchange("q", "a"))
                outcome.append("the scope ended")
            outcome.append("no TimeoutError")
        except TimeoutError:
            outcome.append("TimeoutError")

    async def main() -> dict[str, int]:
        async with SQLiteLog(tmp_path / "log.db") as log:
            a = asyncio.create_task(log.append("a", "t1", exchange("q", "a")))
            await writes.wait_entered()
            b = asyncio.create_task(log.append("b", "t1", exchange("q", "a")))
            c = asyncio.create_task(timed(log))
            await asyncio.sleep(0.05)
            writes.gate.release()
            await writes.wait_entered()  # [b, c] in flight
            await asyncio.sleep(0.4)  # the scope's cancel at 0.1 s, the timeout at 0.2 s
            writes.gate.release()
            await asyncio.gather(a, b, c)
            return {k: len(await log.entries(k)) for k in "abc"}

    stored = asyncio.run(main())

    assert outcome == ["TimeoutError"]
    assert stored == {"a": 1, "b": 1, "c": 1}


def test_an_asyncio_timeout_firing_during_a_postgres_commit_fires_once_the_commit_ended(
    postgres: str,
) -> None:
    """Catches: PostgresLog's call in the loop's thread pool abandoned by asyncio's own
    cancellation: the caller was told "timed out" at once, the thread went on and committed
    the turn, and the connection it still used went back to the pool for the next call."""
    import psycopg

    holder = psycopg.connect(postgres)
    try:
        waited, refs = commit_under_an_asyncio_timeout(
            lambda: PostgresLog(postgres),
            lambda: holder.execute("LOCK TABLE turnplug_turns IN ACCESS EXCLUSIVE MODE"),
            holder.rollback,
        )
    finally:
        holder.close()

    assert refs == ["t1", "t2"]
    assert waited >= 0.3


def test_postgres_calls_blocked_on_a_lock_leave_the_loops_default_threads_free(
    postgres: str,
) -> None:
    """Catches: PostgresLog's calls run in asyncio's default executor (at most 32 threads,
    a handful on a small machine), which also resolves host names for every connection a
    provider opens: calls blocked on a lock took every thread, and DNS and
    `asyncio.to_thread` waited for them. The log now has threads of its own."""
    holder = committed_and_locked(postgres)
    release = threading.Timer(2.0, holder.rollback)

    async def main() -> float:
        async with PostgresLog(postgres, max_connections=40) as log:
            release.start()
            reads = [asyncio.create_task(log.entries(CONVERSATION)) for _ in range(40)]
            await asyncio.sleep(0.3)  # every read is blocked on the lock, in a thread
            started = time.monotonic()
            await asyncio.to_thread(lambda: None)
            waited = time.monotonic() - started
            await asyncio.gather(*reads)
            return waited

    try:
        waited = asyncio.run(main())
    finally:
        release.join()
        holder.close()

    assert waited < 1.0  # not the 1.7 s left of the lock


def test_an_asyncio_timeout_around_a_turn_cancels_it() -> None:
    """Catches: a caller's `asyncio.timeout` not reaching the turn (it runs to its end) or
    surfacing as something other than TimeoutError."""
    trace: list[str] = []

    async def slow(request):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            trace.append("model cancelled")
            raise
        return "late"

    pipe = Pipeline(model=FunctionModel(slow))

    async def main() -> tuple[float, set[asyncio.Task[object]]]:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await pipe.run(Turn.start("x"))
        return time.monotonic() - started, asyncio.all_tasks() - {asyncio.current_task()}

    elapsed, left = asyncio.run(main())

    assert trace == ["model cancelled"]
    assert elapsed < 2
    assert left == set()


# -- one log, two threads' loops --------------------------------------------------------------


def test_a_sqlite_log_used_by_another_threads_running_loop_is_refused_not_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug caught: one SQLiteLog used at once by two threads, each running its own
    `asyncio.run`, hung the second thread's commit (its wake-up came from the other loop's
    thread, which never woke its loop), where a log used by two kinds of loop was already a
    clear RuntimeError; once the first loop has ended, the next one may use the log."""
    writes = GatedWrites(monkeypatch)
    log = SQLiteLog(tmp_path / "log.db")
    seen: dict[str, object] = {}

    async def first() -> None:
        await log.append("a", "t1", exchange("q", "a"))  # the first loop to use the log

    async def writing() -> None:
        await log.append("a", "t2", exchange("q2", "a2"))  # held until the gate opens

    def other_thread() -> None:
        async def commit() -> None:
            async with asyncio.timeout(5):
                await log.append("b", "t1", exchange("q", "b"))

        try:
            asyncio.run(commit())
            seen["other"] = "committed"
        except BaseException as exc:
            seen["other"] = exc

    async def main() -> None:
        await first()
        task = asyncio.create_task(writing())
        await writes.wait_entered()
        thread = threading.Thread(target=other_thread)
        thread.start()
        await asyncio.sleep(0.2)  # the other thread's commit waits for this one's
        writes.gate.release()
        writes.gate.release()  # and its own transaction, if it gets one
        await task
        await asyncio.to_thread(thread.join, 10)

    writes.gate.release()  # the first commit's transaction
    asyncio.run(main())
    entries = asyncio.run(log.entries("a"))  # the first loop ended: another may use the log
    asyncio.run(log.aclose())

    error = seen["other"]
    assert isinstance(error, RuntimeError), error
    assert f"{log!r} is used by another event loop, still running" in str(error)
    assert [e.turn_ref for e in entries] == ["t1", "t2"]
