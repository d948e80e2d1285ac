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
