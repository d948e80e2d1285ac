"""MCP toolsets against real servers: the reference time server and a misbehaving one.

Every test ends by checking the process table: no server process outlives its owner.
"""

import asyncio
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator

import anyio
import psutil
import pytest

from pipeline import (
    ConfigError,
    ModelRequest,
    Pipeline,
    ToolsetError,
    cont,
    hook,
    mcp_toolset,
    toolset,
)
from pipeline._mcp import SDKRecords
from pipeline.logs import MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import ToolCall, Turn

from ..support import warnings_of_an_interrupted_run
from .servers import FAULTY, HttpServer, faulty_toolset, free_port, server_processes, time_toolset

# The SDK's HTTP transport leaves an event stream it stops reading (at its answer, or when
# it cancels its GET stream) without closing httpx2's async iterators; trio warns when it
# collects them. The SDK's to fix, not ours: the response's own stream (a BoundAsyncStream),
# which the mending of lone surrogates walks, is closed, and not ignored here.
sdk_unclosed_streams = pytest.mark.filterwarnings(
    r"ignore:Async generator '(httpx2\._models|httpx2\._sse|httpcore2)\..*' was garbage"
    " collected:ResourceWarning"
)


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    """faulty_server.py's tools over streamable HTTP, running; killed after the test."""
    server = HttpServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def echo_turns(toolset: str, count: int) -> ScriptedModel:
    """A model that calls ``<toolset>_echo`` with the turn's number, `count` turns long."""
    replies: list[object] = []
    for n in range(count):
        replies += [[ToolCall(f"c{n}", f"{toolset}_echo", {"text": str(n)})], "ok"]
    return ScriptedModel(replies)


async def opening_error(pipe: Pipeline) -> ToolsetError:
    """The ToolsetError that opening `pipe` (connecting its toolsets) fails with."""
    with pytest.raises(ToolsetError) as caught:
        async with pipe:
            pass
    return caught.value


def mcp_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "turnplug.mcp" and r.levelno == logging.WARNING
    ]


async def test_a_turn_calls_the_time_server_through_tool_hooks():
    """Catches: MCP tools bypassing tool hooks, or the model not getting the server's answer."""
    trace = []

    def before(call, turn):
        trace.append(("before", call.name, dict(call.arguments)))
        return cont(call.with_arguments({"timezone": "Europe/Paris"}))

    def after(call, result, turn):
        trace.append(("after", call.name))
        return cont(result.with_content(result.content + "\n(checked)"))

    model = ScriptedModel(
        [[ToolCall("c1", "time_get_current_time", {"timezone": "Asia/Tokyo"})], "It is late."]
    )
    pipe = Pipeline(
        model=model, toolsets=[time_toolset()], before_tool=[before], after_tool=[after]
    )
    async with pipe:
        result = await pipe.run(Turn.start("What time is it in Paris?"))

    assert trace == [
        ("before", "time_get_current_time", {"timezone": "Asia/Tokyo"}),
        ("after", "time_get_current_time"),
    ]
    assert {s.name for s in model.requests[0].tools} == {
        "time_get_current_time",
        "time_convert_time",
    }
    answer = result.reply.messages[1].parts[0]
    text, note = answer.content.rsplit("\n", 1)
    assert note == "(checked)"
    assert json.loads(text)["timezone"] == "Europe/Paris"
    assert model.requests[1].messages[-1].parts[0].content == answer.content
    assert result.outcome == "completed"
    assert server_processes() == []


async def test_server_errors_hangs_and_bad_arguments_are_tool_errors_and_the_turn_goes_on():
    """Catches: a raising or hanging server tool failing or hanging the whole turn."""
    model = ScriptedModel(
        [
            [
                ToolCall("c1", "faulty_echo", {"text": "hi"}),
                ToolCall("c2", "faulty_boom", {}),
                ToolCall("c3", "faulty_hang", {}),
                ToolCall("c4", "faulty_echo", {"text": 3}),
                ToolCall("c5", "faulty_picture", {}),
            ],
            "done",
        ]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("tools", timeout=1.5)])
    async with pipe:
        started = time.monotonic()
        result = await pipe.run(Turn.start("go"))
        elapsed = time.monotonic() - started

    echo, boom, hang, bad, picture = (m.parts[0] for m in result.reply.messages[1:6])
    assert echo.content == "echo: hi"
    assert boom.error_class == "tool_error"
    assert "MCP server 'faulty' reported an error" in boom.content
    assert "the boom tool always fails" in boom.content
    assert hang.error_class == "tool_error"
    assert "MCP server 'faulty' did not answer within its timeout of 1.5 s" in hang.content
    assert bad.error_class == "invalid_arguments"
    assert "3 is not of type 'string'" in bad.content
    assert picture.content.startswith("[image: image/png, about 102 bytes, not shown]")
    assert "[resource memo://1, text/plain]\na memo" in picture.content
    assert result.reply.message.text == "done"
    assert elapsed < 10
    assert server_processes() == []


async def test_a_server_that_exits_mid_call_is_a_tool_error_and_is_reconnected_next_turn():
    """Catches: a crashed server hanging the call, leaking, or staying dead for good."""
    model = ScriptedModel(
        [
            [ToolCall("c1", "faulty_crash", {})],
            "noted",
            [ToolCall("c2", "faulty_echo", {"text": "back"})],
            "ok",
        ]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("tools", timeout=20)])
    async with pipe:
        started = time.monotonic()
        first = await pipe.run(Turn.start("crash"))
        crashed_in = time.monotonic() - started
        second = await pipe.run(Turn.start("again"))
        connects = pipe._lifetime.toolbox.connections[0].connects

    crashed = first.reply.messages[1].parts[0]
    assert crashed.error_class == "tool_error"
    assert "MCP server 'faulty' closed the connection during the call" in crashed.content
    assert crashed_in < 10  # well within the call's timeout of 20 s
    assert second.reply.messages[1].parts[0].content == "echo: back"
    assert connects == 2
    assert server_processes() == []


async def test_a_server_that_never_answers_initialize_fails_the_open_naming_it():
    """Catches: a silent server hanging the pipeline's start, or left running."""
    pipe = Pipeline(
        model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("silent", connect_timeout=1.0)]
    )
    started = time.monotonic()
    error = await opening_error(pipe)

    assert time.monotonic() - started < 12
    assert error.toolset == "faulty"
    assert "MCP server 'faulty'" in str(error)
    assert "did not answer initialize within its connect_timeout of 1 s" in str(error)
    assert server_processes() == []


async def test_a_server_that_writes_no_json_rpc_on_stdout_is_told_by_what_it_wrote():
    """Catches: a program that answers on stdout with plain text (no MCP server, or one
    that logs to stdout) reported only as not answering initialize: what it wrote, which
    says what is wrong, was dropped."""
    pipe = Pipeline(
        model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("chatty", connect_timeout=5.0)]
    )
    error = await opening_error(pipe)

    assert str(error).endswith(
        "did not answer initialize within its connect_timeout of 5 s; it wrote on its stdout"
        " what is not a JSON-RPC message: 'usage: faulty [--port N] (got a request)' (a"
        " server writes only protocol messages there, its logs go to stderr)"
    )
    assert server_processes() == []


async def test_a_program_that_prints_its_usage_and_exits_is_told_by_its_usage():
    """Catches: a command that is no MCP server (it printed its usage on stdout and exited)
    reported only as having closed the connection: the usage line, which says what is wrong,
    was dropped (its stderr, quoted, was empty)."""
    pipe = Pipeline(model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("usage")])
    error = await opening_error(pipe)

    assert str(error).endswith(
        "closed the connection during initialize (did it exit?); it wrote on its stdout what"
        " is not a JSON-RPC message: 'usage: faulty MODE [STATE_FILE]' (a server writes only"
        " protocol messages there, its logs go to stderr)"
    )
    assert server_processes() == []


async def test_a_call_answered_with_no_json_rpc_on_stdout_says_what_the_server_wrote():
    """Catches: a server tool that writes plain text on stdout instead of an answer (a log
    line) reported only as a timeout, dropping the line that explains it."""
    model = ScriptedModel([[ToolCall("c1", "faulty_babble", {})], "done"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("babbling", timeout=1.5)])
    async with pipe:
        result = await pipe.run(Turn.start("go"))

    assert result.reply.messages[1].parts[0].content == (
        "tool 'faulty_babble' failed: MCP server 'faulty' did not answer within its timeout"
        " of 1.5 s; it wrote on its stdout what is not a JSON-RPC message: 'DEBUG babble:"
        " connecting to the backend' (a server writes only protocol messages there, its logs"
        " go to stderr)"
    )
    assert server_processes() == []


async def test_a_server_that_fails_at_once_fails_the_open_without_waiting_for_a_hung_one(
    tmp_path,
):
    """Catches: the open of several servers waiting for a hung one's connect_timeout (30 s
    here) before reporting another that failed at once, and a start it stopped left
    running."""
    starts = tmp_path / "starts"
    hung = faulty_toolset(
        "silent", name="hung", env={"FAULTY_STARTS": str(starts)}, connect_timeout=30
    )
    # Exits as soon as the hung server is running: its failure comes while that one hangs.
    waits = "import os, sys, time\nwhile not os.path.getsize(sys.argv[1]):\n    time.sleep(0.01)"
    starts.write_text("")
    broken = mcp_toolset(
        "broken",
        command=sys.executable,
        args=["-c", f"{waits}\nsys.exit(3)", str(starts)],
        connect_timeout=30,
    )
    pipe = Pipeline(model=ScriptedModel([]), toolsets=[hung, broken])
    started = time.monotonic()
    error = await opening_error(pipe)

    assert time.monotonic() - started < 15
    assert error.toolset == "broken"
    assert "closed the connection during initialize (did it exit?)" in str(error)
    (pid,) = map(int, starts.read_text().split())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert server_processes() == []


async def test_a_failed_start_quotes_the_servers_stderr_with_its_secrets_hidden():
    """Catches: the stderr tail quoted in a failed start's `ToolsetError` (which `turnplug
    check` prints) showing an `env` value the server wrote there, such as the API key it
    rejected: secrets read from the environment must never be printed."""
    secret = "sk-live-7Hx9Qw2ZLp4K"
    says = "import os, sys; print('auth failed for', os.environ['API_TOKEN'], file=sys.stderr)"
    pipe = Pipeline(
        model=ScriptedModel([]),
        toolsets=[
            mcp_toolset(
                "leaky", command=sys.executable, args=["-c", says], env={"API_TOKEN": secret}
            )
        ],
    )
    error = await opening_error(pipe)

    assert str(error).endswith("its stderr ends with: auth failed for ***")
    assert server_processes() == []


async def test_a_tool_list_that_changes_between_connections_is_read_again(tmp_path):
    """Catches: a tool list cached across connections, offering tools the server dropped."""
    state = tmp_path / "starts"
    model = ScriptedModel(["one", [ToolCall("c1", "changing_alpha", {})], "two"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("changing", str(state), name="changing")])

    for text in ("first", "second"):
        async with pipe.session(log=MemoryLog(), conversation_id=text) as session:
            result = await session.send(text)

    assert [s.name for s in model.requests[0].tools] == ["changing_alpha"]
    assert [s.name for s in model.requests[1].tools] == ["changing_beta"]
    gone = result.reply.messages[1].parts[0]
    assert gone.error_class == "unknown_tool"
    assert "changing_beta" in gone.content
    assert server_processes() == []


async def test_two_server_tools_with_one_final_name_fail_the_open_naming_both():
    """Catches: one of two colliding tools silently shadowing the other."""
    pipe = Pipeline(model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("colliding", name="c")])
    with pytest.raises(ToolsetError) as caught:
        await pipe.run(Turn.start("hi"))

    assert "tools 'a.b' and 'a_b' are both offered as 'c_a_b'" in str(caught.value)
    assert server_processes() == []


async def test_a_server_tool_clashing_with_a_local_toolsets_is_named_by_its_toolset():
    """Bug caught: an MCP tool clashing with a tool of a local toolset named that tool by its
    final name as one "of the pipeline" (``tool 'time_get_current_time' of the pipeline``),
    a tool the pipeline's tools= does not hold, instead of by its toolset and own name."""

    def current_time() -> str:
        """The local clock."""
        return "noon"

    pipe = Pipeline(
        model=ScriptedModel(["hi"]),
        toolsets=[time_toolset(), toolset("time_get", [current_time])],
    )
    with pytest.raises(ConfigError) as caught:
        async with pipe:
            pass

    assert str(caught.value).startswith(
        "tool 'current_time' of toolset 'time_get' and tool 'get_current_time' of MCP toolset"
        " 'time' are both offered as 'time_get_current_time'"
    )
    assert server_processes() == []


async def test_a_server_listing_two_tools_of_one_name_fails_the_open_naming_it():
    """Catches: a server that lists two different tools under one name having one of them
    silently dropped (the last listed kept), so that the model was offered a tool the
    server may not run by that name."""
    pipe = Pipeline(model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("duplicate")])
    error = await opening_error(pipe)

    assert "lists two different tools named 'echo'" in str(error)
    assert server_processes() == []


async def test_a_tool_listed_twice_alike_or_left_out_does_not_fail_the_open():
    """Catches: a server listing a tool twice (alike, as a paging glitch repeats one, or two
    different ones the toolset excludes) failing the whole toolset's open, with no way to
    keep its other tools: exclude = [...] did not help."""
    model = ScriptedModel(["hi"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("duplicate", exclude=["echo"])])
    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "completed"
    assert [spec.name for spec in model.requests[0].tools] == ["faulty_babble"]
    assert server_processes() == []


async def test_a_tool_listed_with_no_input_schema_fails_the_open_naming_it_and_the_rule():
    """Bug caught: a server listing one tool with no inputSchema failed the open with the
    SDK's pydantic dump, which neither said what MCP requires nor that `exclude` cannot
    help (the SDK refuses the whole list)."""
    pipe = Pipeline(
        model=ScriptedModel([]), toolsets=[faulty_toolset("schemaless", exclude=["bare"])]
    )
    error = await opening_error(pipe)

    assert error.toolset == "faulty"
    assert str(error) == (
        f"MCP server 'faulty' (`{sys.executable} {FAULTY} schemaless`) answered tools/list"
        " with what the MCP SDK refuses: tools.1.inputSchema: Field required (got {'name':"
        " 'bare', 'description': 'Takes nothing, says so by listing no schema.'}) — MCP"
        ' requires an inputSchema of every tool ({"type": "object"} for one that takes no'
        " arguments): the server needs fixing (exclude cannot leave the tool out: the SDK"
        " refuses the whole list)"
    )
    assert server_processes() == []


async def test_a_tool_list_whose_pages_never_end_fails_the_open_saying_so():
    """Catches: a server answering every tools/list page with the same next cursor listed
    until its connect_timeout (60 s by default), then reported as not answering tools/list,
    though it answered every request."""
    pipe = Pipeline(
        model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("paging", connect_timeout=60)]
    )
    with anyio.fail_after(30), pytest.raises(ToolsetError) as caught:
        async with pipe:
            pass

    assert str(caught.value).endswith(
        "answered tools/list with the cursor 'page-2' it had already given: its pages never end"
    )
    assert server_processes() == []


async def test_an_error_result_or_a_refusal_with_no_message_says_so():
    """Bug caught: a server's error result with no content, or its JSON-RPC error with an
    empty message, reached the model as "reported an error: " / "refused the call: ", a
    sentence ending on nothing."""
    model = ScriptedModel(
        [[ToolCall("c1", "mute_mute", {}), ToolCall("c2", "mute_refuse", {})], "done"]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("mute", name="mute")])
    result = await pipe.run(Turn.start("go"))

    mute, refuse = (m.parts[0] for m in result.reply.messages[1:3])
    assert mute.error_class == refuse.error_class == "tool_error"
    assert mute.content.endswith("MCP server 'mute' reported an error: (it said nothing about it)")
    assert refuse.content.endswith(
        "MCP server 'mute' refused the call: JSON-RPC error -32602, with no message"
    )
    assert server_processes() == []


async def test_a_turn_outside_async_with_connects_for_itself_and_closes_after():
    """Catches: pipe.run leaving the servers it started running."""
    model = ScriptedModel([[ToolCall("c1", "faulty_echo", {"text": "once"})], "ok"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("tools")])

    result = await pipe.run(Turn.start("hi"))

    assert result.reply.messages[1].parts[0].content == "echo: once"
    assert server_processes() == []


async def test_cancelling_a_turn_during_a_call_closes_the_server():
    """Catches: a cancelled owner leaking the server process or hanging on it."""
    model = ScriptedModel([[ToolCall("c1", "faulty_hang", {})], "never"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("tools", timeout=60)])
    started = time.monotonic()
    with anyio.move_on_after(8) as scope:
        async with pipe:
            await pipe.run(Turn.start("hang"))

    assert scope.cancelled_caught
    assert time.monotonic() - started < 20
    assert server_processes() == []


async def test_an_error_in_the_block_comes_out_as_it_was_raised():
    """Catches: the connections' task group wrapping the caller's error in a group."""
    pipe = Pipeline(model=ScriptedModel(["hi"]), toolsets=[faulty_toolset("tools")])
    with pytest.raises(KeyError):
        async with pipe:
            raise KeyError("mine")
    assert server_processes() == []


async def test_an_http_server_nobody_listens_on_fails_the_open_naming_it():
    """Catches: an unreachable HTTP server opening silently with no tools (the transport's
    connect error cancelled the start, and the cancellation passed for a success)."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    pipe = Pipeline(
        model=ScriptedModel(["hi"]),
        toolsets=[mcp_toolset("tickets", url=url, connect_timeout=5)],
    )
    error = await opening_error(pipe)

    assert error.toolset == "tickets"
    assert f"MCP server 'tickets' ({url}) could not be reached: ConnectError" in str(error)


async def test_a_servers_url_is_named_without_its_password_and_query():
    """Bug caught: messages named an HTTP server by its whole url, so the password of its
    userinfo and a key in its query reached the errors, the events and the logs."""
    port = free_port()
    url = f"http://user:pa55word@127.0.0.1:{port}/mcp?api_key=SECRET123"
    pipe = Pipeline(
        model=ScriptedModel(["hi"]),
        toolsets=[mcp_toolset("tickets", url=url, connect_timeout=5)],
    )
    error = await opening_error(pipe)

    told = str(error)
    assert f"MCP server 'tickets' (http://127.0.0.1:{port}/mcp?...) could not be reached" in told
    assert "pa55word" not in told
    assert "SECRET123" not in told


async def test_a_servers_url_the_sdk_logs_is_relayed_without_its_password_and_query(caplog):
    """Bug caught: the SDK's DEBUG line relayed to turnplug.mcp ("Connecting to
    StreamableHTTP endpoint: <url>") quoted the url whole, password and query's key included."""
    caplog.set_level(logging.DEBUG)  # the SDK's DEBUG records too, which turnplug relays
    port = free_port()
    url = f"http://user:pa55word@127.0.0.1:{port}/mcp?api_key=SECRET123"
    pipe = Pipeline(
        model=ScriptedModel(["hi"]),
        toolsets=[mcp_toolset("tickets", url=url, connect_timeout=5)],
    )
    await opening_error(pipe)

    relayed = [r.getMessage() for r in caplog.records if r.name == "turnplug.mcp"]
    assert any(
        f"Connecting to StreamableHTTP endpoint: http://127.0.0.1:{port}/mcp?..." in line
        for line in relayed
    ), relayed
    assert [line for line in relayed if "pa55word" in line or "SECRET123" in line] == []


@sdk_unclosed_streams
async def test_a_header_value_with_a_trailing_newline_is_sent_without_it(http_server):
    """Bug caught: a token read from a secret file, with its trailing newline, failed the
    first request with "Illegal header value b'Bearer <the whole token>\\n'"."""
    web = http_server.toolset(headers={"Authorization": "Bearer tk-secret\n"}, connect_timeout=5)
    pipe = Pipeline(model=echo_turns("web", 1), toolsets=[web])
    async with pipe:
        result = await pipe.run(Turn.start("0"))

    assert result.reply.messages[1].parts[0].content == "echo: 0"


@sdk_unclosed_streams
async def test_a_failed_http_reconnect_warns_and_a_later_turn_reconnects(http_server, caplog):
    """Catches: a failed reconnect of an HTTP server passing for a success: no warning, and
    calls failing with "not connected (None)" for good, even once the server is back."""
    pipe = Pipeline(
        model=echo_turns("web", 4), toolsets=[http_server.toolset(timeout=5, connect_timeout=5)]
    )
    results = []
    async with pipe:
        for n in range(4):
            if n == 1:
                http_server.stop()
            if n == 3:
                http_server.start()
            result = await pipe.run(Turn.start(str(n)))
            results.append(result.reply.messages[1].parts[0])
    http_server.stop()

    assert [r.error_class for r in results] == [None, "tool_error", "tool_error", None]
    assert (results[0].content, results[3].content) == ("echo: 0", "echo: 3")
    assert "MCP server 'web' is not connected (" in results[2].content
    assert "could not be reached: ConnectError" in results[2].content
    warnings = mcp_warnings(caplog)
    assert warnings
    assert all(w.startswith("reconnecting failed: MCP server 'web'") for w in warnings)
    assert server_processes() == []


async def test_a_reconnect_whose_tools_collide_is_a_warning(tmp_path, caplog):
    """Catches: a server that came back with a tool clashing with a local one staying down
    without a word in the turnplug.mcp log."""

    def changing_beta() -> str:
        """A local tool named as the server's tool ``beta`` is offered."""
        return "local"

    state = tmp_path / "starts"
    model = ScriptedModel(["one", [ToolCall("c1", "changing_alpha", {})], "two", "three"])
    pipe = Pipeline(
        model=model,
        tools=[changing_beta],
        toolsets=[faulty_toolset("changing", str(state), name="changing")],
    )
    async with pipe:
        await pipe.run(Turn.start("one"))
        for process in server_processes():
            process.kill()
        crashed = await pipe.run(Turn.start("two"))  # its call finds the server gone
        await pipe.run(Turn.start("three"))  # reconnects: beta clashes

    assert crashed.reply.messages[1].parts[0].error_class == "tool_error"
    assert mcp_warnings(caplog) == [
        "reconnecting failed: tool 'changing_beta' of the pipeline's tools and tool 'beta' of MCP"
        " toolset 'changing' are both offered as 'changing_beta'; the model calls tools by"
        " name — rename a toolset or exclude one of them (exclude = [...])"
    ]
    assert server_processes() == []


@sdk_unclosed_streams
async def test_an_http_server_restarted_between_turns_is_found_by_a_call_then_reconnected(
    http_server,
):
    """Catches: a server that forgot the connection's session (a 404 for it) answering
    "Session not found" to every later call instead of being connected again."""
    pipe = Pipeline(
        model=echo_turns("web", 3), toolsets=[http_server.toolset(timeout=5, connect_timeout=5)]
    )
    results = []
    async with pipe:
        for n in range(3):
            result = await pipe.run(Turn.start(str(n)))
            results.append(result.reply.messages[1].parts[0])
            if n == 0:
                http_server.stop()
                http_server.start()
        connects = pipe._lifetime.toolbox.connections[0].connects
    http_server.stop()

    assert results[0].content == "echo: 0"
    assert results[1].error_class == "tool_error"
    assert "MCP server 'web' no longer knows this connection's session" in results[1].content
    assert results[2].content == "echo: 2"
    assert connects == 2
    assert server_processes() == []


async def test_a_schema_whose_ref_points_nowhere_gives_the_call_a_tool_error():
    """Catches: a server's input schema that fails while it checks the arguments (an
    unresolvable $ref) failing the whole turn."""
    model = ScriptedModel([[ToolCall("c1", "badref_refd", {"a": 1})], "done"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("badref", name="badref")])

    result = await pipe.run(Turn.start("go"))

    refd = result.reply.messages[1].parts[0]
    assert refd.error_class == "tool_error"
    assert (
        "MCP server 'badref' lists an input schema for 'refd' that cannot check these"
        " arguments (PointerToNowhere: '/$defs/missing' does not exist" in refd.content
    )
    assert result.reply.message.text == "done"
    assert server_processes() == []


async def test_two_tasks_entering_the_block_at_once_share_one_connection():
    """Catches: a second task entering `async with pipe` while the first was connecting
    opening connections of its own over the first's, and the exits corrupting the cancel
    scopes."""
    pipe = Pipeline(model=ScriptedModel([]), toolsets=[faulty_toolset("tools")])
    inside, counted = anyio.Event(), anyio.Event()
    entered, servers = [], []

    async def user(n: int) -> None:
        async with pipe:
            entered.append(n)
            if len(entered) == 2:
                inside.set()
            await inside.wait()
            servers.append(len(server_processes()))
            if len(servers) == 2:
                counted.set()
            await counted.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(user, 1)
        group.start_soon(user, 2)

    assert servers == [1, 1]
    assert server_processes() == []


def counted_tools(starts) -> object:
    """faulty_server.py's tools, each start of its process logged (its pid) in `starts`."""
    return faulty_toolset("tools", env={"FAULTY_STARTS": str(starts)})


def started_pids(starts) -> list[int]:
    return [int(line) for line in starts.read_text().split()]


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


async def test_a_turn_in_flight_keeps_the_connections_until_it_ends_when_the_block_leaves(
    tmp_path,
):
    """Catches: the first task's `async with pipe` closing the connections when it leaves
    while another task's turn is between its tool hook and its tool call, which then failed
    on a closed connection; the block's exit now waits for the turn, then closes."""
    starts = tmp_path / "starts"
    in_call, release = anyio.Event(), anyio.Event()
    trace: list[object] = []

    async def hold(call, turn):
        in_call.set()
        await release.wait()
        return cont(call)

    pipe = Pipeline(
        model=echo_turns("faulty", 1), toolsets=[counted_tools(starts)], before_tool=[hold]
    )

    async def turn() -> None:
        result = await pipe.run(Turn.start("hi"))
        trace.append(result.reply.messages[1].parts[0].content)
        trace.append([alive(pid) for pid in started_pids(starts)])

    async def owner(group) -> None:
        async with pipe:
            group.start_soon(turn)
            await in_call.wait()
            group.start_soon(let_go)
        trace.append("block left")

    async def let_go() -> None:
        await anyio.wait_all_tasks_blocked()  # the owner waits in its block's exit
        trace.append("released")
        release.set()

    async with anyio.create_task_group() as group:
        group.start_soon(owner, group)

    assert trace == ["released", "echo: 0", [True], "block left"]
    (pid,) = started_pids(starts)
    assert not alive(pid)
    assert server_processes() == []


async def test_a_server_ignoring_its_stdin_closing_and_sigterm_is_killed_with_its_child(
    tmp_path,
):
    """Bug caught: closing a stdio server that outlives its stdin's closing and ignores SIGTERM
    leaving it or the process it started running, where its whole process group is killed."""
    pids = tmp_path / "pids"
    pipe = Pipeline(model=ScriptedModel([]), toolsets=[faulty_toolset("stubborn", str(pids))])

    async with pipe:
        server, child = started_pids(pids)
        assert alive(server)
        assert alive(child)

    assert not alive(server)
    # Killed with the server, by one signal that it may take a moment to act on.
    for _ in range(100):
        if not alive(child):
            break
        await anyio.sleep(0.05)
    assert not alive(child)
    assert server_processes() == []


async def test_a_session_of_another_task_does_not_hold_the_block_open(tmp_path):
    """Catches: the block's exit waiting for a session of another task that itself waits for
    what comes after the block (a hang); the session's next turn connects for itself."""
    starts = tmp_path / "starts"
    pipe = Pipeline(model=echo_turns("faulty", 1), toolsets=[counted_tools(starts)])
    opened, after_block = anyio.Event(), anyio.Event()
    contents = []

    async def conversation() -> None:
        async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
            opened.set()
            await after_block.wait()  # set by the owner once its block has ended
            result = await session.send("one")
            contents.append(result.reply.messages[1].parts[0].content)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            async with pipe:
                group.start_soon(conversation)
                await opened.wait()
            after_block.set()

    assert contents == ["echo: 0"]
    assert len(started_pids(starts)) == 2  # the block's, then the turn's own
    assert server_processes() == []


async def test_an_error_leaving_the_first_block_is_not_held_back_by_other_blocks():
    """Catches: the first block's exit waiting for other tasks' blocks also when it ends with
    an error: a deadlock when those blocks wait for the task group the error is to cancel."""
    pipe = Pipeline(model=ScriptedModel([]), toolsets=[faulty_toolset("tools")])
    inside = anyio.Event()

    async def borrower() -> None:
        async with pipe:
            inside.set()
            await anyio.sleep_forever()

    async def owner() -> None:
        try:
            async with anyio.create_task_group() as group, pipe:
                group.start_soon(borrower)
                await inside.wait()
                raise KeyError("mine")
        except BaseExceptionGroup as caught:
            raise caught.exceptions[0] from None

    with anyio.fail_after(60), pytest.raises(KeyError):
        await owner()
    assert server_processes() == []


class RawMCP:
    """A hand-written streamable HTTP MCP server with one tool, `echo`, on 127.0.0.1, whose
    answers a test bends: `hang` names the methods it never answers (and ``"DELETE"`` for
    the session's end), `call_error` the JSON-RPC error a tools/call gets (with the code
    `call_code`), `call_body` the body a tools/call gets instead (sent as JSON, or as an
    event's data when `sse`), `call_result`
    the result a tools/call gets instead (as an event stream when `sse`, streamed in pieces
    of `chunk` bytes with no content-length when `chunk` is given), `status` the
    HTTP status that answers a method instead, and a GET (the optional event stream) is answered 404, as by a server that
    routes POST alone. `set_cookies` are sent with the answer to initialize, one
    ``Set-Cookie`` header each; `targets` and `cookies` record each POST's request target
    (an absolute URI when it came through a proxy) and ``Cookie`` header."""

    def __init__(
        self,
        *,
        hang: tuple[str, ...] = (),
        call_error: str | None = None,
        call_code: int = -32602,
        status: dict[str, int] | None = None,
        call_body: bytes | None = None,
        call_result: object = None,
        sse: bool = False,
        set_cookies: tuple[str, ...] = (),
        chunk: int | None = None,
        endless: int = 0,
    ) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.initialized = 0
        self.targets: list[str] = []
        self.cookies: list[str | None] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(
                self, status: int, body: object = None, cookies: tuple[str, ...] = ()
            ) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                if body is not None:
                    self.send_header("content-type", "application/json")
                self.send_header("mcp-session-id", "s-1")
                for cookie in cookies:
                    self.send_header("set-cookie", cookie)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                server.targets.append(self.path)
                server.cookies.append(self.headers.get("cookie"))
                message = json.loads(self.rfile.read(int(self.headers["content-length"])))
                method = message.get("method")
                if "id" not in message:
                    return self.answer(202)
                if method in hang:
                    server.release.wait(60)
                    return None
                if method in (status or {}):
                    # An HTTP refusal whose body is no JSON-RPC error (a proxy's, say).
                    assert status is not None
                    return self.answer(status[method], {"detail": "invalid token"})
                if method == "tools/call" and call_body is not None and sse:
                    # A body that is no JSON-RPC message, as an event's data.
                    data = b"event: message\ndata: " + call_body + b"\n\n"
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("mcp-session-id", "s-1")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return None
                if method == "tools/call" and call_body is not None:
                    # A body that is no JSON-RPC message, sent as JSON.
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("mcp-session-id", "s-1")
                    self.send_header("content-length", str(len(call_body)))
                    self.end_headers()
                    self.wfile.write(call_body)
                    return None
                if method == "tools/call" and endless:
                    return self.endless_line()
                if method == "tools/call" and call_result is not None:
                    answer = {"jsonrpc": "2.0", "id": message["id"], "result": call_result}
                    if not sse:
                        return self.answer(200, answer)
                    data = f"event: message\ndata: {json.dumps(answer)}\n\n".encode()
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("mcp-session-id", "s-1")
                    if chunk is None:
                        self.send_header("content-length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return None
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(data), chunk):
                        piece = data[start : start + chunk]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                        time.sleep(0.002)  # pacing, so the client reads the pieces apart
                    self.wfile.write(b"0\r\n\r\n")
                    return None
                result: object
                if method == "initialize":
                    server.initialized += 1
                    result = {
                        "protocolVersion": message["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "raw", "version": "1"},
                    }
                elif method == "tools/list":
                    result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
                else:
                    error = {"code": call_code, "message": call_error or "no"}
                    return self.answer(200, {"jsonrpc": "2.0", "id": message["id"], "error": error})
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
                cookies = set_cookies if method == "initialize" else ()
                return self.answer(200, answer, cookies)

            def endless_line(self) -> None:
                # An event whose data line runs `endless` MiB before its end, in chunks of
                # one MiB object sent again and again: the server itself holds little.
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("mcp-session-id", "s-1")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                piece = b"a" * (1 << 20)
                try:
                    self.wfile.write(b"6\r\ndata: \r\n")
                    for _ in range(endless):
                        self.wfile.write(b"%x\r\n" % len(piece))
                        self.wfile.write(piece)
                        self.wfile.write(b"\r\n")
                    self.wfile.write(b"2\r\n\n\n\r\n0\r\n\r\n")
                except OSError:
                    pass  # the client stopped reading

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_DELETE(self) -> None:
                if "DELETE" in hang:
                    server.release.wait(60)
                self.answer(200)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_port}/mcp"

    def __enter__(self) -> "RawMCP":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


async def test_a_server_that_stops_answering_while_listed_fails_the_open_with_its_timeout():
    """Catches: the open of a server that answered initialize and then hung (tools/list and
    the session's end alike) waiting for the transport to close (httpx's 300 s read
    timeout) instead of its connect_timeout, and then reporting the close's error."""
    with RawMCP(hang=("tools/list", "DELETE")) as server:
        pipe = Pipeline(
            model=ScriptedModel([]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=0.5, timeout=1)],
        )
        with anyio.fail_after(30), pytest.raises(ToolsetError) as caught:
            async with pipe:
                pass

    assert str(caught.value) == (
        f"MCP server 'raw' ({server.url}) did not answer tools/list within its"
        " connect_timeout of 0.5 s"
    )


@pytest.mark.parametrize("code", [-32602, -32000], ids=["invalid-params", "server-error"])
@sdk_unclosed_streams
async def test_a_refused_call_is_not_a_lost_session(code: int):
    """Catches, with -32602: a server answering the SDK's GET stream with 404 (one that
    routes POST alone) marking the session lost for good: every later call's own error
    reported as a restart, and the server connected again on every turn. With -32000 (the
    first of the range the protocol leaves to servers' errors, which the SDK also gives a
    call whose connection closed): the server's own error reported as a crash, its message
    lost and the healthy server connected again on every turn."""
    with RawMCP(call_error="quota exceeded for echo", call_code=code) as server:
        model = ScriptedModel(
            [[ToolCall("c1", "raw_echo", {})], "ok", [ToolCall("c2", "raw_echo", {})], "ok"]
        )
        pipe = Pipeline(
            model=model, toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5)]
        )
        results = []
        async with pipe:
            for n in range(2):
                result = await pipe.run(Turn.start(str(n)))
                results.append(result.reply.messages[1].parts[0].content)

    assert (
        results
        == ["tool 'raw_echo' failed: MCP server 'raw' refused the call: quota exceeded for echo"]
        * 2
    )
    assert server.initialized == 1


@sdk_unclosed_streams
async def test_an_http_refusal_names_its_status_when_opening_and_calling():
    """Catches: a server (or the proxy before it) refusing with HTTP 401 or 403 and no
    JSON-RPC error reported as "Server returned an error response" alone: nothing said the
    request was refused for its credentials, so the operator could not tell a bad token in
    `headers` from a crashed server."""
    with RawMCP(status={"initialize": 401}) as server:
        pipe = Pipeline(
            model=ScriptedModel([]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5)],
        )
        error = await opening_error(pipe)
    assert str(error) == (
        f"MCP server 'raw' ({server.url}) failed during initialize: it answered HTTP 401"
        " — check the credentials in its headers"
    )

    with RawMCP(status={"tools/call": 403}) as server:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5)],
        )
        async with pipe:
            result = await pipe.run(Turn.start("hi"))
    assert result.reply.messages[1].parts[0].content == (
        "tool 'raw_echo' failed: MCP server 'raw' refused the call: it answered HTTP 403"
        " — check the credentials in its headers"
    )


async def test_a_tool_hook_matching_a_name_no_server_lists_fails_the_open():
    """Catches: a tool hook whose `match` names a server's tool with a typo (known only once
    the server is connected) never being checked: the hook silently never ran."""

    def guard(call, turn):
        return cont(call)

    pipe = Pipeline(
        model=ScriptedModel([]),
        toolsets=[time_toolset()],
        before_tool=[hook(guard, name="guard", match="time_get_curent_time")],
    )
    with pytest.raises(ConfigError) as caught:
        async with pipe:
            pass

    assert "hook 'guard' (before_tool, position 1) matches the tool 'time_get_curent_time'" in (
        str(caught.value)
    )
    assert "'time_get_current_time'" in str(caught.value)
    assert server_processes() == []


@pytest.mark.parametrize("where", ["open", "call"])
@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_in_a_connections_task_is_raised_by_the_block(
    loop: str, where: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a KeyboardInterrupt landing in a task that keeps an MCP connection (as
    Ctrl-C does in whatever code runs) left that task: under asyncio the loop stopped with
    "unhandled exception during asyncio.run() shutdown" for the tasks, under trio the block
    raised it wrapped in an exception group, or a call waiting on the connection ran out its
    timeout and the turn went on. Here it lands while the connection lists the tools (open)
    or takes what the server wrote during a call."""
    import pipeline._mcp as mcp_module

    if where == "open":
        real_list = mcp_module._list_tools

        async def listing(session):
            await real_list(session)
            raise KeyboardInterrupt

        monkeypatch.setattr(mcp_module, "_list_tools", listing)
        server = faulty_toolset("tools", timeout=60)
    else:

        def masked(self, text):
            raise KeyboardInterrupt  # as the line the server wrote is read

        monkeypatch.setattr(mcp_module.Connection, "_masked", masked)
        server = faulty_toolset("babbling", timeout=60)
    model = ScriptedModel([[ToolCall("c1", "faulty_babble", {})], "never"])
    pipe = Pipeline(model=model, toolsets=[server])
    after: list[str] = []

    async def main() -> None:
        async with pipe:
            await pipe.run(Turn.start("go"))
            after.append("the turn ended")

    assert warnings_of_an_interrupted_run(loop, main) == []
    assert after == []
    assert len(model.requests) == (1 if where == "call" else 0)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert server_processes() == []


async def test_a_result_over_max_message_bytes_is_refused_at_once_and_one_within_arrives():
    """Bug caught: a stdio server's 20 MB result had no bound: it was read whole, each chunk
    joined to the line read so far (a 40 MB message took 10 s, so a short call timeout ran
    out first and was reported as the server not answering). A message over
    max_message_bytes is now a tool_error saying its size, the next turn reconnects, and a
    5 MB result arrives whole."""
    model = ScriptedModel(
        [
            [ToolCall("c1", "faulty_big", {"size": 20_000_000})],
            "noted",
            [ToolCall("c2", "faulty_big", {"size": 5_000_000})],
            "ok",
        ]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("tools", timeout=5)])
    async with pipe:
        first = await pipe.run(Turn.start("big"))
        second = await pipe.run(Turn.start("smaller"))

    refused = first.reply.messages[1].parts[0]
    assert refused.error_class == "tool_error"
    assert refused.content.startswith("tool 'faulty_big' failed: MCP server 'faulty' sent a")
    assert "(its max_message_bytes is 16.0 MiB): the connection was closed" in refused.content
    assert second.reply.messages[1].parts[0].content == "x" * 5_000_000
    assert server_processes() == []


async def test_max_message_bytes_holds_to_the_byte_for_a_message_arriving_in_one_read(
    tmp_path,
):
    """Bug caught: a message whose newline came in the read that passed max_message_bytes was
    delivered whole (a limit of 1000 let 1001 and 60000 bytes through): only a line still
    unfinished at the end of a read was measured."""
    sized = [ToolCall(f"c{n}", "faulty_sized", {"size": n}) for n in (1000, 1001, 60_000)]
    model = ScriptedModel([[sized[0]], [sized[1]], "noted", [sized[2]], "noted"])
    toolset = faulty_toolset("sized", str(tmp_path / "state"), max_message_bytes=1000)
    pipe = Pipeline(model=model, toolsets=[toolset])
    async with pipe:
        first = await pipe.run(Turn.start("at the limit, then over"))
        second = await pipe.run(Turn.start("far over"))

    within, over = first.reply.messages[1].parts[0], first.reply.messages[3].parts[0]
    far_over = second.reply.messages[1].parts[0]
    assert within.error_class is None
    assert set(within.content) == {"x"}
    assert over.error_class == far_over.error_class == "tool_error"
    # Written at once, 1001 bytes arrive in one read; 60000 may come in several.
    assert "a message of more than 1001 bytes (its max_message_bytes is 1000" in over.content
    assert "(its max_message_bytes is 1000 bytes): the connection was closed" in far_over.content
    assert server_processes() == []


async def test_an_argument_holding_a_lone_surrogate_is_a_tool_error_and_the_server_stays():
    """Bug caught: a call whose arguments held a lone surrogate (a model's JSON may carry
    "\\ud800") failed the stdio writer's encoding, which ended the connection: the call was
    told the server closed it ("did it crash?") and the next call that it was not connected."""
    model = ScriptedModel(
        [
            [ToolCall("c1", "faulty_echo", {"text": "a\ud800b"})],
            [ToolCall("c2", "faulty_echo", {"text": "fine"})],
            "ok",
        ]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("tools", timeout=10)])
    async with pipe:
        result = await pipe.run(Turn.start("hi"))

    refused, answered = result.reply.messages[1].parts[0], result.reply.messages[3].parts[0]
    assert refused.error_class == "tool_error"
    assert refused.content == (
        "tool 'faulty_echo' failed: MCP server 'faulty' was not sent the call: its arguments"
        ' hold text that UTF-8 cannot encode (a lone surrogate, such as JSON\'s "\\ud800", in'
        " text)"
    )
    assert answered.content == "echo: fine"
    assert server_processes() == []


async def test_a_lone_surrogate_a_stdio_server_escapes_is_read_as_a_replacement_character():
    """Bug caught: a stdio server's answer holding a string cut inside a surrogate pair
    (``"\\ud83d"``, as JavaScript's JSON.stringify writes it) was refused whole by the SDK's
    parser, so its call waited out its timeout and was reported as no answer."""
    model = ScriptedModel([[ToolCall("c1", "faulty_cut", {})], "done"])
    toolset = faulty_toolset("surrogate", connect_timeout=10, timeout=10)
    pipe = Pipeline(model=model, toolsets=[toolset])
    result = await pipe.run(Turn.start("go"))

    (spec,) = model.requests[0].tools
    assert spec.description == "Cut \ufffd"
    cut = result.reply.messages[1].parts[0]
    assert (cut.is_error, cut.content) == (False, "smile \ufffd")
    assert server_processes() == []


async def test_a_result_the_sdk_finds_invalid_is_told_in_one_short_line():
    """Bug caught: a result the SDK refused (``content`` not a list, a block of a type MCP
    does not define) reached the model, the events and the audit as the SDK's whole pydantic
    dump, 2.4-2.7 KB for one unknown block type, naming neither the tool nor the problem."""
    model = ScriptedModel(
        [[ToolCall("c1", "faulty_notlist", {}), ToolCall("c2", "faulty_video", {})], "done"]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("malformed", timeout=10)])
    result = await pipe.run(Turn.start("go"))

    notlist, video = (m.parts[0] for m in result.reply.messages[1:3])
    assert (notlist.error_class, notlist.content) == (
        "tool_error",
        "tool 'faulty_notlist' failed: MCP server 'faulty' answered the call of 'notlist' with a"
        " result that is no valid tools/call result: content: Input should be a valid list"
        " (got 'hello')",
    )
    assert (video.error_class, video.content) == (
        "tool_error",
        "tool 'faulty_video' failed: MCP server 'faulty' answered the call of 'video' with a"
        " result that is no valid tools/call result: content.0: its type 'video' is none that"
        " MCP defines here (got {'type': 'video', 'url': 'https://example.com/v.mp4'})",
    )
    assert server_processes() == []


async def test_an_invalid_block_is_told_by_its_own_types_problem_and_the_sdk_error_logged(
    caplog,
):
    """Bug caught: the short line named the first error of the first type the SDK tried (an
    image block with no data told as ``content.0.TextContent.text: Field required``), not
    one of the block's own type, and the SDK's full error was kept nowhere."""
    caplog.set_level(logging.DEBUG, logger="turnplug.mcp")
    model = ScriptedModel(
        [[ToolCall("c1", "faulty_nodata", {}), ToolCall("c2", "faulty_textnum", {})], "done"]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("malformed", timeout=10)])
    result = await pipe.run(Turn.start("go"))

    nodata, textnum = (m.parts[0].content for m in result.reply.messages[1:3])
    assert nodata == (
        "tool 'faulty_nodata' failed: MCP server 'faulty' answered the call of 'nodata' with a"
        " result that is no valid tools/call result: content.0.data: Field required (got"
        " {'type': 'image', 'mimeType': 'image/png'})"
    )
    assert textnum == (
        "tool 'faulty_textnum' failed: MCP server 'faulty' answered the call of 'textnum' with"
        " a result that is no valid tools/call result: content.1.text: Input should be a valid"
        " string (got 5)"
    )
    logged = sorted(
        r.getMessage()
        for r in caplog.records
        if r.name == "turnplug.mcp" and "refused the result" in r.getMessage()
    )
    label = f"MCP server 'faulty' (`{sys.executable} {FAULTY} malformed`)"
    assert [line.split(": ValidationError: ")[0] for line in logged] == [
        f"{label}: the MCP SDK refused the result of a call of 'nodata'",
        f"{label}: the MCP SDK refused the result of a call of 'textnum'",
    ]
    assert all("ImageContent.data Field required" in line for line in logged)
    assert server_processes() == []


async def test_an_invalid_result_counts_one_problem_a_bad_block_and_names_no_class():
    """Bug caught: the "and N more problems" of the short line counted every union member's
    refusal of the other bad blocks ("and 10 more" for two images with no data), and a block
    that is no object was told as no "instance of TextContent", a class of the SDK's."""
    names = ("twoimages", "twonope", "notblock")
    model = ScriptedModel([[ToolCall(f"c{n}", f"faulty_{n}", {}) for n in names], "done"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("malformed", timeout=10)])
    result = await pipe.run(Turn.start("go"))

    told = [m.parts[0].content.split("tools/call result: ")[1] for m in result.reply.messages[1:4]]
    assert told == [
        "content.0.data: Field required (got {'type': 'image', 'mimeType': 'image/png'}), and 1"
        " more problem",
        "content.0: its type 'nope' is none that MCP defines here (got {'type': 'nope'}), and 1"
        " more problem",
        "content.0: Input should be an object (got 'hi')",
    ]
    assert server_processes() == []


async def test_the_sdks_error_for_an_invalid_result_is_logged_clipped(caplog):
    """Bug caught: the DEBUG line quoting the SDK's error whole had no bound (23 MB for
    10,000 bad blocks). (That it is not built with DEBUG off is a cost no test can see.)"""
    caplog.set_level(logging.DEBUG, logger="turnplug.mcp")
    model = ScriptedModel([[ToolCall("c1", "faulty_manynope", {})], "done"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("malformed", timeout=10)])
    await pipe.run(Turn.start("go"))

    (logged,) = (
        r.getMessage()
        for r in caplog.records
        if r.name == "turnplug.mcp" and "refused the result" in r.getMessage()
    )
    said = logged.split(": the MCP SDK refused the result of a call of 'manynope': ")[1]
    assert said.startswith("ValidationError: 24000 validation errors for CallToolResult")
    assert said.endswith("...")
    assert len(said) == 64 * 1024
    assert server_processes() == []


async def test_a_response_with_a_null_result_or_none_fails_its_call_at_once():
    """Bug caught: a stdio server answering a call with ``"result": null`` (or no result at
    all) left the call waiting out its whole timeout, then reported as no answer."""
    model = ScriptedModel(
        [[ToolCall("c1", "faulty_null", {}), ToolCall("c2", "faulty_none", {})], "done"]
    )
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("malformed", timeout=60)])
    result = await pipe.run(Turn.start("go"))

    null, none = (m.parts[0] for m in result.reply.messages[1:3])
    assert (null.error_class, null.content) == (
        "tool_error",
        "tool 'faulty_null' failed: MCP server 'faulty' answered the call of 'null' with a"
        " response whose result is null, where a tools/call result is an object",
    )
    assert (none.error_class, none.content) == (
        "tool_error",
        "tool 'faulty_none' failed: MCP server 'faulty' answered the call of 'none' with a"
        " response holding no result, where a tools/call result is an object",
    )
    assert server_processes() == []


async def test_a_result_that_is_a_cut_string_is_quoted_with_a_replacement_character():
    """Bug caught: a stdio server's non-object result holding a lone surrogate was quoted
    from the line as it came, so the call's message held text UTF-8 cannot encode."""
    model = ScriptedModel([[ToolCall("c1", "faulty_cutstring", {})], "done"])
    pipe = Pipeline(model=model, toolsets=[faulty_toolset("malformed", timeout=10)])
    result = await pipe.run(Turn.start("go"))

    assert result.reply.messages[1].parts[0].content == (
        "tool 'faulty_cutstring' failed: MCP server 'faulty' answered the call of 'cutstring'"
        ' with a response whose result is "cut \ufffd", where a tools/call result is an object'
    )
    assert server_processes() == []


@pytest.mark.parametrize(
    ("sse", "chunk"),
    [(False, None), (True, None), (True, 5)],
    ids=["json", "event-stream", "event-stream-in-5-byte-pieces"],
)
@sdk_unclosed_streams
async def test_a_lone_surrogate_an_http_server_escapes_is_read_as_a_replacement_character(
    sse: bool, chunk: int | None
):
    """Bug caught: an HTTP server's answer holding a string cut inside a surrogate pair
    (``"\\ud83d"``) failed its call with the SDK's parse error, where a stdio server's is
    read with U+FFFD in its place. Streamed in 5-byte pieces, the escapes arrive cut apart,
    and so does the line that holds them."""
    cut = {"content": [{"type": "text", "text": "smile \ud83d, pair \ud83d\ude00"}]}
    with RawMCP(call_result=cut, sse=sse, chunk=chunk) as server:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5, timeout=10)],
        )
        async with pipe:
            result = await pipe.run(Turn.start("hi"))

    answer = result.reply.messages[1].parts[0]
    assert (answer.is_error, answer.content) == (False, "smile \ufffd, pair \U0001f600")


@sdk_unclosed_streams
async def test_an_http_server_is_reached_through_the_proxy_the_environment_names(monkeypatch):
    """Bug caught: the HTTP client was given a transport of ours, so it ignored HTTP_PROXY
    (and ALL_PROXY, NO_PROXY): a server only a proxy reaches could not be reached."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    # The server is its own forward proxy: it answers a request for an absolute URI.
    with RawMCP() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.http.server_port}")
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url="http://mcp.invalid/mcp", connect_timeout=5)],
        )
        async with pipe:
            result = await pipe.run(Turn.start("hi"))

    assert result.reply.messages[1].parts[0].content == (
        "tool 'raw_echo' failed: MCP server 'raw' refused the call: no"
    )
    # initialize, its notification, tools/list, tools/call: all through the proxy
    assert proxy.targets == ["http://mcp.invalid/mcp"] * 4


@sdk_unclosed_streams
async def test_every_cookie_an_http_server_sets_is_sent_back():
    """Bug caught: each JSON response was rebuilt from its headers joined by name, so of
    several Set-Cookie headers (a load balancer's sticky session) none was kept."""
    cookies = ("AWSALB=abc; Expires=Tue, 01 Dec 2037 00:00:00 GMT; Path=/", "LB=def; Path=/")
    with RawMCP(set_cookies=cookies) as server:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5)],
        )
        async with pipe:
            await pipe.run(Turn.start("hi"))

    # initialize, then its notification, tools/list and tools/call with both cookies
    sent = [sorted(c.split("; ")) if c else c for c in server.cookies]
    assert sent == [None, *[["AWSALB=abc", "LB=def"]] * 3]


@sdk_unclosed_streams
async def test_an_event_line_over_the_sdks_limit_is_refused_without_being_held_whole():
    """Bug caught: the event stream's mending held every chunk of a ``data:`` line until its
    end, so a server's endless line took as much memory as it sent (a 200 MB line 844 MB)
    before the SDK refused the event at its 1 MiB limit."""
    import tracemalloc

    with RawMCP(endless=48) as server:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5, timeout=30)],
        )
        async with pipe:
            tracemalloc.start()
            try:
                result = await pipe.run(Turn.start("hi"))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()

    # The SDK's refusal ("SSE stream failed: Server-sent event exceeded the 1048576 byte
    # limit.") ends its stream: the call is told the connection closed.
    assert result.reply.messages[1].parts[0].content == (
        "tool 'raw_echo' failed: MCP server 'raw' closed the connection during the call (did"
        " it crash?); it is connected again on the next turn"
    )
    # The 48 MiB line took some 250 MB; now the mending holds at most 4 MiB of it, which the
    # SDK decodes and measures a few times over before it refuses the event (about 18 MB).
    assert peak < 24 * 1024 * 1024


PAIRS = json.dumps({"t": [f"row {i} \U0001f600" for i in range(500)]})


@pytest.mark.parametrize(
    ("body", "read"),
    [
        (PAIRS, None),
        (r'{"t": "pair \ud83d\ude00, \u00e9"}', None),
        (r'{"t": "cut \ud83d"}', "cut \ufffd"),
        (r'{"t": "\ude00 cut"}', "\ufffd cut"),
        (r'{"t": "low \ude00, high \ud83d"}', "low \ufffd, high \ufffd"),
        (r'{"t": "\ud83d, a backslash: \\ude00"}', "\ufffd, a backslash: \\ude00"),
    ],
    ids=["pairs", "pair", "high", "low", "swapped", "escaped-backslash"],
)
def test_only_a_lone_surrogate_escape_has_an_http_body_read_and_written_again(
    body: str, read: str | None
):
    """Bug caught: any surrogate escape, a valid pair too (each emoji json.dumps writes),
    had an HTTP server's JSON body parsed and written again on the event loop: 33 MB of
    them blocked it about 2 s and took about 250 MB more."""
    from pipeline._mcp import _mended

    data = body.encode()
    mended = _mended(data)
    if read is None:
        assert mended is data
    else:
        assert json.loads(mended) == {"t": read}


def test_a_compact_body_mended_is_no_longer_than_it_was():
    """Bug caught: a mended body was written with a space after every comma and colon, so a
    compact event of 0.86 MiB holding a lone surrogate grew past the SDK's 1 MiB limit and
    the call failed as a connection the server closed."""
    from pipeline._mcp import _mended

    data = b'{"t":"cut \\ud83d","v":[' + b",".join([b"0"] * 1000) + b"]}"
    mended = _mended(data)
    assert json.loads(mended)["t"] == "cut \ufffd"
    assert len(mended) <= len(data)


async def test_a_server_whose_message_was_too_large_sees_its_stdin_close_and_exits(tmp_path):
    """Bug caught: once a message passed max_message_bytes, the server's stdout was no longer
    read, so a server still writing it blocked on the full pipe, never saw its stdin close
    and was killed by SIGTERM 2 s later."""
    state = tmp_path / "state"
    model = ScriptedModel([[ToolCall("c1", "faulty_sized", {"size": 3_000_000})], "noted"])
    toolset = faulty_toolset("sized", str(state), max_message_bytes=1_000_000, timeout=10)
    pipe = Pipeline(model=model, toolsets=[toolset])
    async with pipe:
        result = await pipe.run(Turn.start("big"))

    refused = result.reply.messages[1].parts[0].content
    assert "MCP server 'faulty' sent a message of more than" in refused
    # Written by the server after its stdin ended: a server killed first writes nothing.
    assert (state.read_text() if state.exists() else "") == "stdin closed\n"
    assert server_processes() == []


@pytest.mark.parametrize(
    ("body", "sse", "told"),
    [
        (
            b'{"jsonrpc": "2.0", "id": 9, "result": null}',
            False,
            "Failed to parse JSON response (got {'jsonrpc': '2.0', 'id': 9, 'result': None})",
        ),
        (
            b"<html>bad gateway</html>",
            False,
            "Failed to parse JSON response (invalid JSON: expected value at line 1 column 1)",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 9, "result": null}',
            True,
            "Failed to parse SSE message (got {'jsonrpc': '2.0', 'id': 9, 'result': None})",
        ),
    ],
    ids=["null-result", "no-json", "event-stream"],
)
@sdk_unclosed_streams
async def test_an_http_answer_the_sdk_cannot_parse_is_told_short_and_not_as_a_refusal(
    body: bytes, sse: bool, told: str
):
    """Bug caught: an HTTP server's answer the SDK could not parse (``"result": null``, a
    body that is no JSON) reached the model as ``refused the call: Failed to parse JSON
    response:`` and about 1 KB of the SDK's pydantic error."""
    with RawMCP(call_body=body, sse=sse) as server:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5, timeout=5)],
        )
        async with pipe:
            result = await pipe.run(Turn.start("hi"))

    assert result.reply.messages[1].parts[0].content == (
        "tool 'raw_echo' failed: MCP server 'raw' answered the call of 'echo' with what the"
        f" MCP SDK cannot read as a JSON-RPC response: {told}"
    )


@sdk_unclosed_streams
async def test_what_the_sdk_logs_in_a_connection_goes_to_turnplug_mcp_at_debug(caplog):
    """Bug caught: a server answering a call with a body that is no JSON-RPC message had the
    SDK log an ERROR with its traceback ("Error parsing JSON response"), printed on stderr by
    default, beside the call's own tool_error; it is now one DEBUG line of turnplug.mcp."""
    caplog.set_level(logging.DEBUG)
    with RawMCP(call_body=b"<html>bad gateway</html>") as server:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "raw_echo", {})], "ok"]),
            toolsets=[mcp_toolset("raw", url=server.url, connect_timeout=5, timeout=5)],
        )
        async with pipe:
            result = await pipe.run(Turn.start("hi"))

    assert result.reply.messages[1].parts[0].error_class == "tool_error"
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.getMessage()) for r in loud] == []
    assert not any(r.exc_info for r in caplog.records if not r.name.startswith("turnplug"))
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "turnplug.mcp" and "Error parsing JSON response" in r.getMessage()
    ]
    assert line.startswith(f"MCP server 'raw' ({server.url}): the MCP SDK logged")


async def test_a_warning_the_sdk_logs_in_a_connection_stays_a_warning_on_one_line(caplog):
    """Bug caught: every record the SDK logged in a connection's tasks was sent to DEBUG,
    warnings nothing else reports too (a server's notification it could not read and
    dropped), hidden at the default level."""
    caplog.set_level(logging.DEBUG)
    pipe = Pipeline(
        model=ScriptedModel([[ToolCall("c1", "faulty_note", {})], "ok"]),
        toolsets=[faulty_toolset("notifying", timeout=10)],
    )
    async with pipe:
        result = await pipe.run(Turn.start("hi"))

    assert result.reply.messages[1].parts[0].content == "noted"
    (warning,) = mcp_warnings(caplog)
    assert warning.startswith("MCP server 'faulty' (`")
    assert "the MCP SDK logged (client, WARNING): Failed to validate notification" in warning
    assert "ValidationError" in warning
    assert "\n" not in warning
    sdk = [r for r in caplog.records if not r.name.startswith("turnplug")]
    assert [r for r in sdk if r.levelno >= logging.WARNING or r.exc_info] == []
    assert server_processes() == []


def test_listing_the_sdks_loggers_while_another_thread_creates_loggers_does_not_fail():
    """Bug caught: SDKRecords went through logging's dict of loggers while another thread
    could add to it (a module being imported), and failed with "dictionary changed size
    during iteration", reported as the server failing to start."""

    def create_loggers() -> None:
        for n in range(20_000):
            logging.getLogger(f"turnplug_tests.churn.{n}")

    errors = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hands the GIL over as often as it can
    churn = threading.Thread(target=create_loggers)
    churn.start()
    try:
        while churn.is_alive() and not errors:
            try:
                SDKRecords.loggers()
            except RuntimeError as exc:
                errors.append(str(exc))
    finally:
        churn.join()
        sys.setswitchinterval(interval)
    assert errors == []


def test_installing_sdkrecords_from_threads_at_once_puts_one_filter_on_each_logger():
    """Bug caught: SDKRecords.install checked whether a filter was made, then made one, with
    no lock: threads connecting servers at once could each make and put their own, and
    uninstall then took off only the last one."""
    SDKRecords.install()  # imports the SDK: its loggers exist
    loggers = SDKRecords.loggers()
    saved = (SDKRecords.installed, SDKRecords.off, [list(each.filters) for each in loggers])
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hands the GIL over as often as it can
    counts = []
    try:
        for _ in range(100):
            for each in loggers:
                each.filters[:] = [f for f in each.filters if not isinstance(f, SDKRecords)]
            SDKRecords.installed, SDKRecords.off = None, False
            barrier = threading.Barrier(8)

            def install(barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                SDKRecords.install()

            threads = [threading.Thread(target=install) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            counts.append(
                {sum(isinstance(f, SDKRecords) for f in each.filters) for each in loggers}
            )
    finally:
        sys.setswitchinterval(interval)
        SDKRecords.installed, SDKRecords.off = saved[0], saved[1]
        for each, filters in zip(loggers, saved[2], strict=True):
            each.filters[:] = filters
    assert all(count == {1} for count in counts)


def echo_once(request: ModelRequest) -> object:
    """A model that calls ``faulty_echo`` and then answers: turns of any number of threads."""
    if request.messages[-1].role == "tool":
        return "ok"
    return [ToolCall("c1", "faulty_echo", {"text": "hi"})]


def test_each_threads_loop_keeps_connections_of_its_own_in_its_block():
    """Bug caught: a thread's loop entering `async with pipe` while another thread's block was
    open used that loop's MCP connections, and its tool calls failed (or hung)."""
    pipe = Pipeline(model=FunctionModel(echo_once), toolsets=[faulty_toolset("tools")])
    both_inside = threading.Barrier(2, timeout=60)
    answers: dict[str, object] = {}

    async def turn_in_block() -> object:
        async with pipe:
            await anyio.to_thread.run_sync(both_inside.wait)
            result = await pipe.run(Turn.start("go"))
            await anyio.to_thread.run_sync(both_inside.wait)
        answer = result.reply.messages[1].parts[0]
        return (answer.content, answer.is_error)

    def worker(backend: str) -> None:
        try:
            answers[backend] = anyio.run(turn_in_block, backend=backend)
        except BaseException as exc:
            answers[backend] = exc

    threads = [threading.Thread(target=worker, args=(b,)) for b in ("asyncio", "trio")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert answers == {"asyncio": ("echo: hi", False), "trio": ("echo: hi", False)}
    assert server_processes() == []


def test_a_turn_on_another_loop_connects_for_itself_while_a_paused_loops_block_is_open():
    """Bug caught: a turn on one loop, outside any block, borrowed the connections that a
    paused loop's `async with pipe` held (a fixture's loop, say), and its call timed out."""
    pipe = Pipeline(model=FunctionModel(echo_once), toolsets=[faulty_toolset("tools", timeout=5)])
    fixture_loop = asyncio.new_event_loop()
    opened, done = fixture_loop.create_future(), asyncio.Event()

    async def hold_open() -> None:
        async with pipe:
            opened.set_result(None)
            await done.wait()

    holder = fixture_loop.create_task(hold_open())
    try:
        fixture_loop.run_until_complete(opened)
        result = asyncio.run(pipe.run(Turn.start("go")))
    finally:
        done.set()
        fixture_loop.run_until_complete(holder)
        fixture_loop.close()
    answer = result.reply.messages[1].parts[0]
    assert (answer.content, answer.is_error) == ("echo: hi", False)
    assert server_processes() == []


def test_exiting_the_block_in_another_task_than_the_one_that_entered_it_is_an_error():
    """Bug caught: `async with pipe` exited by a task that did not enter it (a fixture's
    teardown run as a task of its own, say) closed nothing, silently, and the MCP server of
    the block that entered it kept running."""
    pipe = Pipeline(model=ScriptedModel([]), toolsets=[faulty_toolset("tools")])
    loop = asyncio.new_event_loop()
    opened, done = loop.create_future(), asyncio.Event()

    async def hold_open() -> None:
        async with pipe:
            opened.set_result(None)
            await done.wait()

    holder = loop.create_task(hold_open())
    try:
        loop.run_until_complete(opened)
        with pytest.raises(RuntimeError, match="in another task than the one that entered it"):
            loop.run_until_complete(pipe.__aexit__(None, None, None))
        assert len(server_processes()) == 1  # refused: nothing was closed
    finally:
        done.set()
        loop.run_until_complete(holder)  # the block that entered it closes it
        loop.close()
    assert server_processes() == []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_exiting_the_block_on_a_loop_that_entered_none_is_an_error_and_the_owner_still_closes(
    backend: str,
):
    """Bug caught: `pipe.__aexit__` on a loop that entered no block, while another loop's
    block was open, passed, ending that other loop's model hold; the owner's own exit then
    failed ("no open block") and left its MCP server running."""
    pipe = Pipeline(model=ScriptedModel([]), toolsets=[faulty_toolset("tools")])
    loop = asyncio.new_event_loop()
    opened, done = loop.create_future(), asyncio.Event()

    async def hold_open() -> None:
        async with pipe:
            opened.set_result(None)
            await done.wait()

    holder = loop.create_task(hold_open())
    try:
        loop.run_until_complete(opened)
        with pytest.raises(RuntimeError, match="entered on another event loop than this one"):
            anyio.run(pipe.__aexit__, None, None, None, backend=backend)
        assert len(server_processes()) == 1  # refused: nothing was closed
    finally:
        done.set()
        loop.run_until_complete(holder)  # the owner's exit closes what it opened
        loop.close()
    assert server_processes() == []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_loop_closed_with_its_block_open_is_forgotten_and_its_server_stopped_by_the_next(
    backend: str,
):
    """Bug caught: a loop closed while its `async with pipe` was open (a fixture's loop closed
    without its teardown) kept its entry for good, the loop and its MCP server with it: the
    server ran until the process ended."""
    pipe = Pipeline(model=FunctionModel(echo_once), toolsets=[faulty_toolset("tools")])
    loop = asyncio.new_event_loop()
    opened = loop.create_future()

    async def hold_open() -> None:
        async with pipe:
            opened.set_result(None)
            await asyncio.Event().wait()

    holder = loop.create_task(hold_open())
    loop.run_until_complete(opened)
    (server,) = server_processes()
    assert not holder.done()  # the block is still open as its loop closes
    loop.close()

    async def turn_in_block() -> tuple[object, bool]:
        async with pipe:
            result = await pipe.run(Turn.start("go"))
        answer = result.reply.messages[1].parts[0]
        return answer.content, answer.is_error

    assert anyio.run(turn_in_block, backend=backend) == ("echo: hi", False)
    server.wait(timeout=30)  # stopped when the next loop entered, not when the process ends
    assert server_processes() == []


async def test_a_block_waiting_for_a_close_enters_when_another_task_reopened_meanwhile(
    tmp_path,
):
    """Bug caught: a block entered while the owner waited for a turn in flight (C) waited on
    the close's event, and a block entered during the close itself (B) replaced that event:
    the close set B's, and C's `async with pipe` never entered."""
    pids = tmp_path / "pids"
    in_turn, release = anyio.Event(), anyio.Event()

    async def held_turn(request: ModelRequest) -> object:
        in_turn.set()
        await release.wait()
        return "ok"

    # `stubborn` outlives its stdin's closing: the close lasts until it is killed.
    pipe = Pipeline(
        model=FunctionModel(held_turn), toolsets=[faulty_toolset("stubborn", str(pids))]
    )
    entered: list[str] = []
    a_in, a_may_exit, a_exited = anyio.Event(), anyio.Event(), anyio.Event()

    async def a() -> None:
        async with pipe:
            a_in.set()
            await a_may_exit.wait()
        a_exited.set()

    async def block(name: str) -> None:
        async with pipe:
            entered.append(name)

    with anyio.fail_after(30):  # against a hang: C's entry is what the test waits for
        async with anyio.create_task_group() as group:
            group.start_soon(a)
            await a_in.wait()
            group.start_soon(pipe.run, Turn.start("go"))
            await in_turn.wait()
            a_may_exit.set()
            await anyio.wait_all_tasks_blocked()  # A's exit waits for the turn
            group.start_soon(block, "C")
            await anyio.wait_all_tasks_blocked()  # C waits for A's close
            release.set()
            await anyio.wait_all_tasks_blocked()  # A is closing: its server is stubborn
            assert not a_exited.is_set()
            group.start_soon(block, "B")
            await a_exited.wait()
    assert sorted(entered) == ["B", "C"]
    assert server_processes() == []
