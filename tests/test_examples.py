"""Every example runs offline, as a script, and does what its docstring says."""

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import pytest
import trio

from pipeline import Pipeline, SessionInfo, cont, hook, regenerate
from pipeline.testing import FunctionModel, ScriptedModel
from turns import ToolCall, Turn

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str) -> ModuleType:
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested() -> None:
    tested = {
        "01_minimal",
        "02_halt",
        "03_parallel_retrieval",
        "04_streaming_redaction",
        "05_guardrail_retry",
        "06_session_log",
        "07_openai_compatible",
        "08_tools_policy",
        "11_mcp_memory",
        "10_tracing",
        "09_fastapi",
        "assistant_hooks",
    }
    assert {path.stem for path in EXAMPLES.glob("*.py")} == tested


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda path: path.stem)
def test_example_runs_as_a_script(path: Path) -> None:
    # Offline: no key, so an example that needs a real provider explains and exits.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "reply" in done.stdout or "->" in done.stdout


async def test_minimal_injects_its_rule_before_the_user_text() -> None:
    example = _load("01_minimal")
    result = await example.main()
    assert result.outcome == "completed"
    sent = example.PIPE.model.requests[0].messages
    assert [m.role for m in sent] == ["system", "user"]
    assert [part.text for part in sent[-1].parts] == ["Answer in one sentence.", "hi"]


async def test_halt_stops_before_the_model() -> None:
    example = _load("02_halt")
    results = await example.main()
    assert [r.outcome for r in results] == ["halted", "halted", "completed"]
    assert [r.halt.hook if r.halt else None for r in results] == [
        "require_login",
        "refuse_secrets",
        None,
    ]
    assert len(example.MODEL.requests) == 1


async def test_parallel_retrieval_injects_in_declaration_order() -> None:
    """Catches: the lookups merged in the order they finish (20, 30, 50 ms), or the example
    awaiting trio itself, so that it failed under asyncio."""
    result = await _load("03_parallel_retrieval").main()
    assert [i.source for i in result.turn.injections] == [
        "search_docs",
        "search_tickets",
        "load_profile",
    ]
    assert result.reply.text == "I was given 3 pieces of context."


async def test_parallel_retrieval_takes_as_long_as_the_slowest_member(
    autojump_clock: trio.testing.MockClock,  # virtual time, so trio alone
) -> None:
    """Catches: the group running its members one after another (100 ms, not 50)."""
    started = anyio.current_time()
    await _load("03_parallel_retrieval").main()
    assert anyio.current_time() - started == pytest.approx(0.050)


async def test_openai_compatible_runs_a_turn_against_a_local_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.providers import server as wire

    async with wire.running(wire.stream(wire.openai_text(["A tube for water."]))) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "dummy")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        monkeypatch.setenv("OPENAI_MODEL", "local-test")
        result = await _load("07_openai_compatible").main()
    assert result is not None
    assert result.reply.text == "A tube for water."
    assert server.requests[0].body["model"] == "local-test"
    assert server.requests[0].headers["authorization"] == "Bearer dummy"


async def test_streaming_redaction_never_shows_the_split_address() -> None:
    example = _load("04_streaming_redaction")
    deltas, result = await example.main()
    joined = "".join(deltas)
    assert joined == result.reply.text == "Sure. I will write to [EMAIL] tomorrow."
    assert not any("@" in delta or "exa" in delta or "mple" in delta for delta in deltas)
    # Text that cannot be part of an address is released before the address is complete.
    assert deltas[0] == "Sure. I will write to "


async def test_guardrail_retry_recovers_once_and_exhausts_the_stubborn_model() -> None:
    example = _load("05_guardrail_retry")
    fixed, stubborn = await example.main()
    assert fixed.outcome == "completed"
    assert fixed.reply.text == "Refunds are issued within 14 days of a return."
    assert [(r.attempt, r.hook) for r in fixed.rejections] == [(1, "no_guarantees")]
    assert stubborn.outcome == "exhausted"
    assert stubborn.reply is None
    assert [r.attempt for r in stubborn.rejections] == [1, 2, 3]


async def test_session_log_keeps_durable_notes_and_drops_transient_ones() -> None:
    example = _load("06_session_log")
    committed = await example.main()
    texts = [[part.text for part in message.parts] for message in committed]
    assert texts == [
        ["[profile] answer in English", "How fast are refunds?"],
        ["Within 14 days."],
        ["[profile] answer in English", "Does that hold for sale items?"],
        ["Yes, for any item."],
    ]
    second = example.MODEL.requests[1].messages
    assert list(second[:2]) == list(committed[:2])
    assert "[doc] Refunds are issued within 14 days." in [p.text for p in second[2].parts]
    assert example.closed[-1] == "c-42 closed (closed) after 2 turns"


async def test_tools_policy_blocks_asks_and_scrubs_before_the_model_reads_results() -> None:
    example = _load("08_tools_policy")
    result = await example.main()
    assert result.outcome == "completed"
    # The dangerous tool never ran: the file is still there.
    assert "docs/intro.md" in example.FILES
    exchange = result.reply.messages
    results = [m.parts[0] for m in exchange if m.role == "tool"]
    assert [(r.call_id, r.error_class) for r in results] == [
        ("c1", None),
        ("c2", "hook_blocked"),
        ("c3", "hook_blocked"),
    ]
    assert results[0].content == "Welcome! Questions go to [EMAIL]."
    assert results[2].content == "permission denied: read config/secrets.toml?"
    assert "help@example.com" not in repr(result.audit)


async def test_tools_policy_leaves_a_call_without_a_path_to_the_argument_check() -> None:
    """Catches: the example's policy reading ``call.arguments["path"]`` before the arguments
    are checked, so a model that left the path out failed the whole turn with a KeyError
    instead of getting invalid_arguments."""
    example = _load("08_tools_policy")
    model = ScriptedModel([[ToolCall("c1", "read_file", {"file": "docs/intro.md"})], "Sorry."])
    pipe = Pipeline(
        model=model,
        tools=[example.read_file],
        before_tool=[example.file_policy],
        permission=example.operator,
    )

    result = await pipe.run(Turn.start("Read the intro."))

    (refused,) = [m.parts[0] for m in result.reply.messages if m.role == "tool"]
    assert (result.outcome, refused.error_class) == ("completed", "invalid_arguments")


async def test_mcp_memory_reads_back_what_the_model_stored() -> None:
    from tests.pipeline.mcp.servers import memory_server, server_processes

    memory_server()  # installed (by .ci/run), or a skip without node
    first, second = await _load("11_mcp_memory").main()
    assert first.turn.injections[0].parts[1].content == '{\n  "entities": [],\n  "relations": []\n}'
    stored = first.reply.messages[1].parts[0]
    assert '"name": "Ada"' in stored.content
    remembered = second.turn.injections[0].parts[1].content
    assert "prefers tea" in remembered
    assert server_processes() == []


async def test_assistant_config_injects_the_hours_rejects_a_guarantee_redacts_pii() -> None:
    # assistant_hooks.py loads assistant.toml with hooks.config.load_pipeline.
    result = await _load("assistant_hooks").main()
    assert result.outcome == "completed"
    assert [(r.attempt, r.hook) for r in result.rejections] == [(1, "no_guarantees")]
    assert result.reply.text == (
        "Refunds are issued within 14 days of a return. Questions? Write to [EMAIL]."
    )
    assert [(i.source, i.durable) for i in result.turn.injections] == [
        ("house_rules", False),
        ("inject_opening_hours", True),
        ("search_faq", False),
        ("load_profile", True),
    ]
    # The tool ran before the model was called; the model read its call and result.
    call, answer = result.turn.injections[1].parts
    assert (call.name, call.arguments) == ("opening_hours", {"shop": "Main Street"})
    assert answer.content == "Monday to Saturday, 9:00 to 18:00"
    assert [t.name for t in result.turn.context.tools] == ["opening_hours"]


async def test_tracing_exports_the_turn_as_one_trace() -> None:
    """Catches: the tracing example exporting nothing, or a broken span tree."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    result = await _load("10_tracing").traced_turn(exporter)
    spans = exporter.get_finished_spans()
    turn = next(span for span in spans if span.name == "turn")
    children = sorted(
        span.name for span in spans if span.parent and span.parent.span_id == turn.context.span_id
    )
    assert result.outcome == "completed"
    assert children == [
        "add_today",
        "chat ScriptedModel",
        "chat ScriptedModel",
        "execute_tool order_status",
        "retrieval",
    ]
    assert len({span.context.trace_id for span in spans}) == 1


# -- 09: an asyncio web app, served by uvicorn ------------------------------------------------


async def _serve(app):
    """Start a real uvicorn server for `app` on a free port of 127.0.0.1: (server, task, url)."""
    example = _load("09_fastapi")
    running = example.server(app)
    task = asyncio.create_task(running.serve())
    with anyio.fail_after(10):
        while not running.started:  # noqa: ASYNC110 (uvicorn sets a flag, not an event)
            await asyncio.sleep(0.01)
    return running, task, f"http://127.0.0.1:{example.port_of(running)}"


def test_fastapi_streams_each_turn_and_commits_it(tmp_path: Path) -> None:
    """Catches: the web example's turns not streaming as server-sent events, or not landing in
    the log in order."""
    example = _load("09_fastapi")

    async def main():
        running, task, url = await _serve(example.create_app(tmp_path / "chat.db"))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                first = await example.read_turn(client, "c1", "hello there")
                second = await example.read_turn(client, "c1", "bye")
                refused = await client.post("/chat/c1", json={"text": "wrong key"})
                logged = (await client.get("/conversations/c1")).json()
        finally:
            running.should_exit = True
            await task
        return first, second, refused, logged

    first, second, refused, logged = asyncio.run(main())

    assert first == {
        "streamed": "You said: hello there",
        "outcome": "completed",
        "reply": "You said: hello there",
    }
    assert second["streamed"] == second["reply"] == "You said: bye"
    assert refused.status_code == 400
    assert logged == [
        {"role": "user", "text": "hello there"},
        {"role": "assistant", "text": "You said: hello there"},
        {"role": "user", "text": "bye"},
        {"role": "assistant", "text": "You said: bye"},
    ]


def test_fastapi_client_clears_the_text_of_a_rejected_attempt(tmp_path: Path) -> None:
    """Bug caught: the example's client ignored ``retract``, so a turn whose first attempt a
    post hook rejected read as both attempts' text run together."""
    example = _load("09_fastapi")

    def once(turn: Turn):  # type: ignore[no-untyped-def]
        return regenerate("Again.") if turn.reply.attempt == 1 else cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["Rejected words.", "Accepted words."]),
        post=[hook(once, name="once")],
    )

    async def main():
        running, task, url = await _serve(example.create_app(tmp_path / "chat.db", pipe))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                return await example.read_turn(client, "c1", "hello")
        finally:
            running.should_exit = True
            await task

    assert asyncio.run(main()) == {
        "streamed": "Accepted words.",
        "outcome": "completed",
        "reply": "Accepted words.",
    }


def test_fastapi_refuses_a_body_that_is_not_json_with_400(tmp_path: Path) -> None:
    """Bug caught: a body that is not JSON (``curl -d hello``) or not UTF-8 failed the request
    with a 500 and a traceback on the server, where a missing message gets a 400 saying what
    to send."""
    example = _load("09_fastapi")

    async def main():
        running, task, url = await _serve(example.create_app(tmp_path / "chat.db"))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                return [await client.post("/chat/c1", content=body) for body in (b"hello", b"\xff")]
        finally:
            running.should_exit = True
            await task

    for refused in asyncio.run(main()):
        assert (refused.status_code, refused.json()) == (
            400,
            {"error": 'send {"message": "some text"}'},
        )


def test_fastapi_refuses_a_body_nested_too_deep_to_parse_with_400(tmp_path: Path) -> None:
    """Bug caught: a body nested deeper than the JSON parser recurses (``[`` 100000 times)
    raised a RecursionError, not a ValueError, and failed with a 500 and a traceback."""
    example = _load("09_fastapi")

    async def main():
        running, task, url = await _serve(example.create_app(tmp_path / "chat.db"))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                return await client.post("/chat/c1", content=b"[" * 100_000 + b"]" * 100_000)
        finally:
            running.should_exit = True
            await task

    refused = asyncio.run(main())
    assert (refused.status_code, refused.json()) == (
        400,
        {"error": 'send {"message": "some text"}'},
    )


def test_fastapi_client_reads_what_failed_in_a_turn_that_failed(tmp_path: Path) -> None:
    """Bug caught: a turn that failed other than by a conflict (a hook raising, the model
    failing) broke off the event stream with no ``error`` event, so the client could not
    tell its user what happened."""
    example = _load("09_fastapi")

    def audit(turn: Turn):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"audit store down while holding {turn.reply.text!r}")

    async def broken(request):
        yield "Half a rep"
        raise RuntimeError("connection reset while sending 'my card is 4111'")

    pipes = {
        "hook": Pipeline(model=ScriptedModel(["Secret words."]), post=[hook(audit, name="audit")]),
        "model": Pipeline(model=FunctionModel(broken)),
    }

    async def main(pipe):
        running, task, url = await _serve(example.create_app(tmp_path / "chat.db", pipe))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                turn = await example.read_turn(client, "c1", "my card is 4111")
                return turn, (await client.get("/conversations/c1")).json()
        finally:
            running.should_exit = True
            await task

    assert asyncio.run(main(pipes["hook"])) == (
        {
            "streamed": "Secret words.",
            "error": "hook 'audit' (post) failed; nothing of the turn was committed",
        },
        [],
    )
    assert asyncio.run(main(pipes["model"])) == (
        {"streamed": "Half a rep", "error": "the model failed; nothing of the turn was committed"},
        [],
    )


def test_fastapi_client_that_disconnects_mid_stream_commits_nothing(tmp_path: Path) -> None:
    """Catches: a browser closing the connection mid-turn leaving a partial turn in the log,
    the turn running on after the disconnect, or the server failing later requests."""
    example = _load("09_fastapi")
    reasons: list[str] = []
    words: list[str] = []

    async def slow(request):
        said = request.messages[-1].parts[-1].text
        for word in ["You", " said:", *(f" {w}" for w in said.split())]:
            words.append(word)
            yield word
            await asyncio.sleep(0.2 if said == "long story" else 0.0)

    def ended(info: SessionInfo, reason: str) -> None:
        reasons.append(reason)

    pipe = Pipeline(model=FunctionModel(slow), on_session_end=[hook(ended, name="ended")])

    async def main():
        running, task, url = await _serve(example.create_app(tmp_path / "chat.db", pipe))
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                request = {"message": "long story"}
                async with client.stream("POST", "/chat/c1", json=request) as sent:
                    async for line in sent.aiter_lines():
                        if line.startswith("data: "):
                            break  # the first delta: hang up mid-turn
                with anyio.fail_after(10):
                    while reasons != ["cancelled"]:  # noqa: ASYNC110 (the hook appends)
                        await asyncio.sleep(0.01)
                streamed_when_cut = len(words)
                await asyncio.sleep(0.5)  # a turn still running would stream more words
                after_cut = (await client.get("/conversations/c1")).json()
                again = await example.read_turn(client, "c1", "short")
                logged = (await client.get("/conversations/c1")).json()
        finally:
            running.should_exit = True
            await task
        return streamed_when_cut, after_cut, again, logged

    streamed_when_cut, after_cut, again, logged = asyncio.run(main())

    assert streamed_when_cut < 4  # "You", " said:", " long", " story": cut before the end
    assert words[streamed_when_cut:] == ["You", " said:", " short"]
    assert after_cut == []
    assert again["reply"] == "You said: short"
    assert logged == [
        {"role": "user", "text": "short"},
        {"role": "assistant", "text": "You said: short"},
    ]
    assert reasons == ["cancelled", "closed"]
