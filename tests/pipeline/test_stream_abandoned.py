"""A stream inside an async generator that its consumer never closed (`TurnEvents._abandoned`).

The generator is closed later by the event loop's finaliser, in a task of its own, so the
stream's block is left by a task other than the one that entered it. These run under asyncio
alone (`asyncio.run`): its finaliser is where the pattern lives (Starlette's
`StreamingResponse`), and under trio the task that entered the stream is always told of the
misnesting by trio itself (see "Streams inside async generators" in docs/concurrency.md).
"""

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

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
