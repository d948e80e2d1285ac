"""A representative few behaviours on uvloop's event loop, which asyncio applications often
install: a turn and a stream, a cancelled turn, a session on SQLiteLog, an MCP stdio server,
and the gateway served by Hypercorn's asyncio worker.

Every test here runs once, on asyncio with uvloop's loop (AnyIO's ``use_uvloop`` option).
"""

import asyncio
import threading
from pathlib import Path

import anyio
import anyio.lowlevel
import httpx
import pytest
import uvloop

from pipeline import Pipeline, cont, hook, parallel
from pipeline.logs import SQLiteLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import ToolCall, Turn

from .hooks.serve_support import served, user
from .pipeline.mcp.servers import faulty_toolset, server_processes


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    """asyncio on uvloop's loop, for every test of this module (in place of both loops)."""
    return ("asyncio", {"use_uvloop": True})


async def note(turn: Turn) -> object:
    await anyio.lowlevel.checkpoint()
    return cont(turn.inject("noted"))


def checked(turn: Turn) -> object:
    return cont(turn)


async def adds_nothing(turn: Turn) -> list[object]:
    await anyio.lowlevel.checkpoint()
    return []


def adds_nothing_in_a_thread(turn: Turn) -> list[object]:
    return []


async def test_the_tests_here_run_on_uvloop() -> None:
    """Catches: this module's tests running on asyncio's own loop, so uvloop goes untested."""
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


async def test_a_turn_and_a_stream_run_their_hooks_threads_and_parallel_groups() -> None:
    """Catches: a hook in a worker thread or a parallel group failing on uvloop's loop."""
    pipe = Pipeline(
        model=ScriptedModel(["one", ["t", "wo"]]),
        pre=[
            hook(note),
            hook(checked, timeout=30),
            parallel(hook(adds_nothing), hook(adds_nothing_in_a_thread)),
        ],
    )
    result = await pipe.run(Turn.start("hi"))
    async with pipe.stream(Turn.start("hi")) as events:
        kinds = [type(event).__name__ async for event in events]
    assert (result.outcome, result.reply.text) == ("completed", "one")
    assert (events.result.outcome, events.result.reply.text) == ("completed", "two")
    assert kinds[0] == "TurnStarted"
    assert kinds[-1] == "TurnFinished"


async def test_a_timeout_cancels_a_turn_waiting_for_a_sync_hooks_thread() -> None:
    """Catches: asyncio.timeout not ending a turn on uvloop once the hook's thread returns."""
    release = threading.Event()

    def held(turn: Turn) -> object:
        release.wait(30)
        return cont(turn)

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        release.set()

    pipe = Pipeline(model=ScriptedModel(["never"]), pre=[hook(held, timeout=60)])
    async with anyio.create_task_group() as group:
        group.start_soon(release_soon)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await pipe.run(Turn.start("hi"))


async def test_a_session_on_sqlitelog_commits_and_a_later_session_loads_it(
    tmp_path: Path,
) -> None:
    """Catches: SQLiteLog's own thread failing to wake a uvloop loop, or a commit lost."""
    pipe = Pipeline(model=ScriptedModel(["one", "two"]))
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send("a")
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send("b")
            texts = [message.text for message in session.context.messages]
    assert texts == ["a", "one", "b", "two"]


async def test_an_mcp_stdio_server_answers_and_is_ended_with_its_block() -> None:
    """Catches: the stdio server's process or pipes failing on uvloop, or left running."""

    def echo_once(request: object) -> object:
        if request.messages[-1].role == "tool":  # type: ignore[attr-defined]
            return "ok"
        return [ToolCall("c1", "faulty_echo", {"text": "hi"})]

    pipe = Pipeline(model=FunctionModel(echo_once), toolsets=[faulty_toolset("tools")])
    async with pipe:
        result = await pipe.run(Turn.start("go"))
    answer = result.reply.messages[1].parts[0]
    assert (answer.content, answer.is_error) == ("echo: hi", False)
    assert server_processes() == []


async def test_the_gateway_answers_through_hypercorns_asyncio_worker() -> None:
    """Catches: `turnplug serve`'s asyncio worker failing on uvloop's loop."""
    async with served(Pipeline(model=ScriptedModel(["Hello!"]))) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": user("hi")}
        )
    assert response.status_code == httpx.codes.OK
    assert response.json()["choices"][0]["message"]["content"] == "Hello!"
