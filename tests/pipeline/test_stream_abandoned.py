"""A stream inside an async generator that its consumer never closed (`TurnEvents._abandoned`).

The generator is closed later by the event loop's finaliser, in a task of its own, so the
stream's block is left by a task other than the one that entered it. Most of these run under
asyncio alone (`asyncio.run`), whose finaliser is where the pattern lives (a web framework's
response body); under trio the task that entered the stream is always told of the misnesting by
trio itself, and the trio test checks what turnplug still owes there (see "Streams inside async
generators" in docs/concurrency.md).
"""

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
import trio.lowlevel

from pipeline import Pipeline, Session
from pipeline import events as ev
from pipeline.logs import SQLiteLog
from pipeline.testing import FunctionModel
from turns import Turn

ACLOSING = "contextlib.aclosing"


def first_then_forever(first: str = "Hel"):
    """A model that streams `first` and then waits for ever, recording how it ended."""
    ended: list[str] = []

    async def model(request: Any) -> AsyncIterator[str]:
        said = request.messages[-1].parts[-1].text
        if said != "hi":
            yield f"You said: {said}"
            return
        try:
            yield first
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        yield "never"

    return FunctionModel(model), ended


async def deltas(session: Session, text: str) -> AsyncIterator[str]:
    """What a web handler hands its framework: a stream's text, yielded from inside it."""
    async with session.stream(text) as events:
        async for event in events:
            if isinstance(event, ev.TextDelta):
                yield event.text


async def finalised() -> None:
    """Let the loop's finaliser close what was dropped, and the tasks it started end."""
    for _ in range(20):
        gc.collect()
        await asyncio.sleep(0)


def watch_loop_errors() -> list[dict[str, Any]]:
    """What the running loop reports to its exception handler ("Task exception was never
    retrieved", ...), kept instead of logged."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    return errors


def warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_session_stream_left_in_an_unclosed_generator_leaves_the_session_usable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a session.stream inside an async generator whose consumer task ended
    without closing it was exited by asyncio's finaliser in another task, which AnyIO
    refused: the session's lock stayed held and its next send waited for ever."""
    model, ended = first_then_forever()
    pipe = Pipeline(model=model)

    async def main() -> tuple[str, list[Any], list[dict[str, Any]]]:
        errors = watch_loop_errors()
        async with SQLiteLog(tmp_path / "chat.db") as log:
            async with pipe.session(log=log, conversation_id="c1") as session:

                async def consumer() -> str:  # takes one delta, then its client leaves
                    return await anext(deltas(session, "hi"))

                assert await asyncio.create_task(consumer()) == "Hel"
                await finalised()
                with anyio.fail_after(10):
                    result = await session.send("again")
            entries = list(await log.entries("c1"))
        return result.reply.text, entries, errors

    with caplog.at_level(logging.WARNING, logger="turnplug"):
        reply, entries, errors = asyncio.run(main())

    assert reply == "You said: again"
    assert [[m.text for m in e.messages] for e in entries] == [["again", "You said: again"]]
    assert ended == ["cancelled"]
    assert errors == []
    [warning] = warned(caplog)
    assert "nothing of it was committed" in warning
    assert ACLOSING in warning


def test_a_consumer_that_broke_out_of_a_generator_over_a_stream_is_not_cancelled(
    tmp_path: Path,
) -> None:
    """Bug caught: a generator over session.stream that its consumer task broke out of,
    closed later by asyncio's finaliser, left the session's lock held (the next send waited
    for ever), and the stream's task group, cancelled from the finaliser's task, cancelled
    the consumer (still in its scope for AnyIO) at its next await."""
    model, ended = first_then_forever()
    pipe = Pipeline(model=model)

    async def main() -> tuple[str, str, list[dict[str, Any]]]:
        errors = watch_loop_errors()
        async with (
            SQLiteLog(tmp_path / "chat.db") as log,
            pipe.session(log=log, conversation_id="c1") as session,
        ):
            go_on = asyncio.Event()

            async def consumer() -> str:
                async for _ in deltas(session, "hi"):
                    break  # the generator is dropped here, never closed
                await go_on.wait()  # carries on with other work
                return "carried on"

            task = asyncio.create_task(consumer())
            await finalised()
            with anyio.fail_after(10):
                result = await session.send("again")
            go_on.set()
            outcome = await task
        return result.reply.text, outcome, errors

    reply, outcome, errors = asyncio.run(main())

    assert (reply, outcome) == ("You said: again", "carried on")
    assert ended == ["cancelled"]
    assert errors == []


def test_a_pipe_stream_left_in_an_unclosed_generator_is_cancelled_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bug caught: a pipe.stream inside an async generator closed by asyncio's finaliser
    raised AnyIO's "exit cancel scope in a different task" in the finaliser's task, which
    the loop reported as "Task exception was never retrieved"."""
    model, ended = first_then_forever()
    pipe = Pipeline(model=model)

    async def texts() -> AsyncIterator[str]:
        async with pipe.stream(Turn.start("hi")) as events:
            async for event in events:
                if isinstance(event, ev.TextDelta):
                    yield event.text

    async def main() -> list[dict[str, Any]]:
        errors = watch_loop_errors()

        async def consumer() -> str:
            return await anext(texts())

        assert await asyncio.create_task(consumer()) == "Hel"
        await finalised()
        return errors

    with caplog.at_level(logging.WARNING, logger="turnplug"):
        errors = asyncio.run(main())

    assert errors == []
    assert ended == ["cancelled"]
    assert any(ACLOSING in message for message in warned(caplog))


# -- trio ------------------------------------------------------------------------------------


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


@pytest.mark.trio_only  # trio's finaliser (a system task) and its own report of the misnesting
async def test_on_trio_a_stream_left_in_an_unclosed_generator_frees_the_session(
    tmp_path: Path,
) -> None:
    """Bug caught: on trio, the finaliser's close of a generator over session.stream exited
    the stream's nursery from trio's system task, which crashed the whole run with
    TrioInternalError (the session's next turn never ran)."""

    async def model(request: Any) -> AsyncIterator[str]:
        said = request.messages[-1].parts[-1].text
        yield f"You said: {said}"
        if said == "hi":
            await trio.sleep_forever()

    pipe = Pipeline(model=FunctionModel(model))
    replies: list[str] = []

    async def break_out(session: Session) -> None:
        async for _ in deltas(session, "hi"):
            break  # the generator is dropped here, never closed
        for _ in range(10):
            gc.collect()
            await trio.lowlevel.checkpoint()

    entries: list[Any] = []

    async def consumer() -> None:
        async with SQLiteLog(tmp_path / "chat.db") as log:
            try:
                async with pipe.session(log=log, conversation_id="c1") as session:
                    # Trio's finaliser warns of the generator (its own advice: aclosing).
                    with pytest.warns(ResourceWarning, match="aclosing"):
                        await break_out(session)
                    with trio.fail_after(10):
                        replies.append((await session.send("again")).reply.text)
            finally:
                entries.extend(await log.entries("c1"))

    with pytest.raises(BaseException) as info:  # noqa: PT011 (trio's report, whatever its type)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)

    assert replies == ["You said: again"]
    assert [[m.text for m in e.messages] for e in entries] == [["again", "You said: again"]]
    # Trio tells the task that entered the stream, which is still inside its nursery.
    assert any("misnesting" in str(e) or "corrupted" in str(e) for e in leaves(info.value))


def test_a_turn_that_absorbs_the_cancellation_of_its_abandoned_stream_is_cancelled_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: on asyncio an abandoned stream cancelled its turn once (`Task.cancel`), so
    a model that absorbed that one cancellation and went on made the turn wait for ever for
    the gone consumer before its commit, and the session's next send waited for ever too."""
    absorbed: list[str] = []

    async def model(request: Any) -> AsyncIterator[str]:
        said = request.messages[-1].parts[-1].text
        if said != "hi":
            yield f"You said: {said}"
            return
        yield "Hel"
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            absorbed.append("absorbed")  # a model that retries instead
        yield "lo"

    pipe = Pipeline(model=FunctionModel(model))

    async def main() -> tuple[str, list[Any], list[dict[str, Any]]]:
        errors = watch_loop_errors()
        async with SQLiteLog(tmp_path / "chat.db") as log:
            async with pipe.session(log=log, conversation_id="c1") as session:

                async def consumer() -> str:
                    return await anext(deltas(session, "hi"))

                assert await asyncio.create_task(consumer()) == "Hel"
                await finalised()
                with anyio.fail_after(10):
                    result = await session.send("again")
            entries = list(await log.entries("c1"))
        return result.reply.text, entries, errors

    with caplog.at_level(logging.WARNING, logger="turnplug"):
        reply, entries, errors = asyncio.run(main())

    assert reply == "You said: again"
    assert absorbed == ["absorbed"]
    assert [[m.text for m in e.messages] for e in entries] == [["again", "You said: again"]]
    assert errors == []
    [warning] = warned(caplog)
    assert "nothing of it was committed" in warning


def test_a_stream_read_to_its_end_from_several_tasks_is_not_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a generator over session.stream read to its end one step per task (as
    asyncio.wait_for does before Python 3.12) was committed, yet warned of as a turn
    cancelled with nothing of it committed."""

    async def model(request: Any) -> AsyncIterator[str]:
        yield "Hel"
        yield "lo"

    pipe = Pipeline(model=FunctionModel(model))

    async def main() -> tuple[list[str], list[Any], list[dict[str, Any]]]:
        errors = watch_loop_errors()
        async with SQLiteLog(tmp_path / "chat.db") as log:
            async with pipe.session(log=log, conversation_id="c1") as session:
                texts = deltas(session, "hi")
                got: list[str] = []
                while True:  # each step in a task of its own
                    try:
                        got.append(await asyncio.create_task(anext(texts)))  # type: ignore[arg-type]
                    except StopAsyncIteration:
                        break
                with anyio.fail_after(10):
                    await session.send("again")
            entries = list(await log.entries("c1"))
        return got, entries, errors

    with caplog.at_level(logging.DEBUG, logger="turnplug"):
        got, entries, errors = asyncio.run(main())

    assert got == ["Hel", "lo"]
    assert [[m.text for m in e.messages] for e in entries] == [
        ["hi", "Hello"],
        ["again", "Hello"],
    ]
    assert errors == []
    assert warned(caplog) == []
    assert any("stand" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_a_stream_dropped_after_its_turn_ended_is_not_warned_of_as_cancelled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a generator over session.stream dropped unclosed after the turn had
    ended and committed was warned of as a turn cancelled with nothing of it committed."""

    async def model(request: Any) -> AsyncIterator[str]:
        yield "Hello"

    pipe = Pipeline(model=FunctionModel(model))

    async def every_event(session: Session) -> AsyncIterator[ev.Event]:
        async with session.stream("hi") as events:
            async for event in events:
                yield event

    async def main() -> list[Any]:
        async with SQLiteLog(tmp_path / "chat.db") as log:
            async with pipe.session(log=log, conversation_id="c1") as session:

                async def consumer() -> None:
                    async for event in every_event(session):
                        if isinstance(event, ev.TurnFinished):
                            break  # its last event: dropped unclosed

                await asyncio.create_task(consumer())
                await finalised()
                with anyio.fail_after(10):
                    await session.send("again")
            return list(await log.entries("c1"))

    with caplog.at_level(logging.WARNING, logger="turnplug"):
        entries = asyncio.run(main())

    assert [[m.text for m in e.messages] for e in entries] == [
        ["hi", "Hello"],
        ["again", "Hello"],
    ]
    assert warned(caplog) == []


def test_the_next_turn_of_a_session_waits_for_its_abandoned_turn_to_end(
    tmp_path: Path,
) -> None:
    """Bug caught: nothing checked that the session's next turn waits for an abandoned
    stream's turn to finish unwinding its cancellation: without that wait it ran beside it."""
    order: list[str] = []
    release = asyncio.Event()  # ends the abandoned turn's cleanup

    async def model(request: Any) -> AsyncIterator[str]:
        said = request.messages[-1].parts[-1].text
        order.append(f"{said} starts")
        if said != "hi":
            yield f"You said: {said}"
            return
        yield "Hel"
        try:
            await asyncio.sleep(3600)
        finally:
            with anyio.CancelScope(shield=True):  # a cleanup that takes a while
                await release.wait()
            order.append("hi ended")

    pipe = Pipeline(model=FunctionModel(model))

    async def main() -> str:
        async with (
            SQLiteLog(tmp_path / "chat.db") as log,
            pipe.session(log=log, conversation_id="c1") as session,
        ):

            async def consumer() -> None:
                async for _ in deltas(session, "hi"):
                    break  # dropped unclosed

            await asyncio.create_task(consumer())
            await finalised()
            again = asyncio.create_task(session.send("again"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert order == ["hi starts"]  # the next turn waits
            release.set()
            with anyio.fail_after(10):
                return (await again).reply.text

    assert asyncio.run(main()) == "You said: again"
    assert order == ["hi starts", "hi ended", "again starts"]


@pytest.mark.trio_only  # trio's finaliser; the asyncio test above checks asyncio's
async def test_on_trio_the_next_turn_of_a_session_waits_for_its_abandoned_turn_to_end(
    tmp_path: Path,
) -> None:
    """Bug caught: nothing checked that on trio the session's next turn waits for an
    abandoned stream's turn to finish unwinding its cancellation."""
    order: list[str] = []
    release = trio.Event()

    async def model(request: Any) -> AsyncIterator[str]:
        said = request.messages[-1].parts[-1].text
        order.append(f"{said} starts")
        if said != "hi":
            yield f"You said: {said}"
            return
        yield "Hel"
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await release.wait()
            order.append("hi ended")

    pipe = Pipeline(model=FunctionModel(model))
    replies: list[str] = []

    async def consumer(outer: trio.Nursery) -> None:
        async with (
            SQLiteLog(tmp_path / "chat.db") as log,
            pipe.session(log=log, conversation_id="c1") as session,
        ):

            async def break_out() -> None:
                async for _ in deltas(session, "hi"):
                    break  # dropped unclosed
                for _ in range(10):
                    gc.collect()
                    await trio.lowlevel.checkpoint()

            with pytest.warns(ResourceWarning, match="aclosing"):
                await break_out()
            sent = trio.Event()

            async def again() -> None:  # in a task of the outer nursery: this one is misnested
                replies.append((await session.send("again")).reply.text)
                sent.set()

            outer.start_soon(again)
            for _ in range(20):
                await trio.lowlevel.checkpoint()
            assert order == ["hi starts"]  # the next turn waits
            release.set()
            with trio.fail_after(10):
                await sent.wait()

    with pytest.raises(BaseException) as info:  # noqa: PT011 (trio's report, whatever its type)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer, nursery)

    assert replies == ["You said: again"]
    assert order == ["hi starts", "hi ended", "again starts"]
    assert any("misnesting" in str(e) or "corrupted" in str(e) for e in leaves(info.value))


def test_a_send_after_breaking_out_of_a_generator_over_a_stream_says_to_close_it(
    tmp_path: Path,
) -> None:
    """Bug caught: a send in the task that broke out of an unclosed generator over
    session.stream was refused as made "inside a session.stream block", which the code
    had left, without a word of the generator to close."""
    model, _ = first_then_forever()
    pipe = Pipeline(model=model)

    async def main() -> str:
        async with (
            SQLiteLog(tmp_path / "chat.db") as log,
            pipe.session(log=log, conversation_id="c1") as session,
        ):

            async def consumer() -> str:
                async for _ in deltas(session, "hi"):
                    break  # dropped unclosed; the loop's finaliser has not run yet
                with pytest.raises(RuntimeError) as info:
                    await session.send("again")
                return str(info.value)

            message = await asyncio.create_task(consumer())
            await finalised()
        return message

    message = asyncio.run(main())

    assert "async generator" in message
    assert ACLOSING in message
