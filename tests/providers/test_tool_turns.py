"""Whole turns with tools, through each provider and the local protocol server.

The model asks for tools over the wire; the pipeline's tool loop runs them (one blocked by a
policy hook, one result rewritten), and the next request carries the results in the
provider's own format. The session commits the exchange as the model saw it.
"""

import json
import math
import re
from typing import Any

import attrs
import pytest

from pipeline import TOOL_HOOKS, ModelRequest, Pipeline, block, cont, tool
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.providers import AnthropicMessages, OpenAIChat
from turns import Context, Message, Text, ToolCall, ToolResult, Turn

from . import server as wire
from .server import ProtocolServer
from .support import KEY

SIZES = {"README.md": 5120, "secrets.env": 64}


@tool
def stat_file(path: str) -> dict[str, Any]:
    """Size of a file in the project.

    Args:
        path: The file's path.
    """
    return {"path": path, "bytes": SIZES[path]}


def no_env_files(call: ToolCall, turn: Turn) -> Any:
    if str(call.arguments.get("path", "")).endswith(".env"):
        return block("reading .env files is not allowed")
    return cont(call)


def kilobytes(call: ToolCall, result: ToolResult, turn: Turn) -> Any:
    if result.is_error:
        return cont(result)
    data = json.loads(result.content)
    return cont(result.with_content(f"{data['path']}: {data['bytes'] // 1024} KB"))


def pipeline_for(model: Any) -> Pipeline:
    return Pipeline(
        model=model, tools=[stat_file], before_tool=[no_env_files], after_tool=[kilobytes]
    )


QUESTION = "How big are README.md and secrets.env?"


def client(provider: str, server: ProtocolServer) -> Any:
    """The provider's client ("openai" or "anthropic"), talking to `server`."""
    if provider == "openai":
        return OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY)
    return AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)


def text_reply(provider: str, text: str) -> tuple[bytes, ...]:
    """A reply of plain `text`, in the provider's event stream."""
    return wire.openai_text([text]) if provider == "openai" else wire.anthropic_text([text])


def openai(server: ProtocolServer) -> OpenAIChat:
    server.script(
        wire.stream(
            wire.openai_tool_calls(
                [
                    ("call_a", "stat_file", ['{"pa', 'th": "READ', 'ME.md"}']),
                    ("call_b", "stat_file", ['{"path"', ': "secrets.env"}']),
                ],
                text="Checking.",
            )
        ),
        wire.stream(wire.openai_text(["README.md is 5 KB."])),
    )
    return client("openai", server)


def anthropic(server: ProtocolServer) -> AnthropicMessages:
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                *wire.anthropic_text_block(0, ["Checking."]),
                *wire.anthropic_tool_block(1, "call_a", "stat_file", ['{"path": "READ', 'ME.md"}']),
                *wire.anthropic_tool_block(2, "call_b", "stat_file", ['{"path": "secrets.env"}']),
                *wire.anthropic_end("tool_use", 40),
            )
        ),
        wire.stream(wire.anthropic_text(["README.md is 5 KB."])),
    )
    return client("anthropic", server)


def sent_results(provider: str, body: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The tool results a request body carries: (call id, content, is_error), in order."""
    if provider == "openai":
        # Chat Completions has no error flag on tool messages: the text carries it.
        return [
            (m["tool_call_id"], m["content"], False)
            for m in body["messages"]
            if m["role"] == "tool"
        ]
    return [
        (block["tool_use_id"], block["content"], block.get("is_error", False))
        for m in body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_result"
    ]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_tool_results_reach_the_provider_in_call_order_shaped_by_the_hooks(
    server: ProtocolServer, provider: str
) -> None:
    model = openai(server) if provider == "openai" else anthropic(server)

    result = await pipeline_for(model).run(Turn.start(QUESTION))

    assert len(server.requests) == 2
    results = sent_results(provider, server.requests[1].body)
    assert [(call_id, content) for call_id, content, _ in results] == [
        ("call_a", "README.md: 5 KB"),
        ("call_b", "reading .env files is not allowed"),
    ]
    if provider == "anthropic":
        assert [is_error for _, _, is_error in results] == [False, True]
    assert result.reply is not None
    assert result.reply.text == "README.md is 5 KB."


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_session_commits_the_exchange_with_its_provenance(
    server: ProtocolServer, provider: str
) -> None:
    model = openai(server) if provider == "openai" else anthropic(server)
    log = MemoryLog()

    async with pipeline_for(model).session(log=log, conversation_id="c1") as session:
        await session.send(QUESTION)

    committed = (await log.load("c1")).messages
    assert [m.role for m in committed] == ["user", "assistant", "tool", "tool", "assistant"]
    assert committed[1] == Message.assistant(
        [
            Text("Checking."),
            ToolCall("call_a", "stat_file", {"path": "README.md"}),
            ToolCall("call_b", "stat_file", {"path": "secrets.env"}),
        ]
    )
    first, second = committed[2].parts[0], committed[3].parts[0]
    assert isinstance(first, ToolResult)
    assert isinstance(second, ToolResult)
    assert first.meta[TOOL_HOOKS] == {"result_rewritten_by": ["kilobytes"]}
    assert second.meta[TOOL_HOOKS] == {"blocked_by": "no_env_files"}
    assert (second.is_error, second.error_class) == (True, "hook_blocked")


async def test_arguments_that_are_not_json_get_an_error_result_and_the_tool_never_runs(
    server: ProtocolServer,
) -> None:
    ran: list[str] = []

    @tool
    def lookup(path: str) -> str:
        ran.append(path)
        return "found"

    server.script(
        wire.stream(wire.openai_tool_calls([("call_a", "lookup", ['{"path": "READ'])])),
        wire.stream(wire.openai_text(["Sorry, let me try again later."])),
    )
    model = OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY)

    result = await Pipeline(model=model, tools=[lookup]).run(Turn.start("find README"))

    assert ran == []
    [(call_id, content, _)] = sent_results("openai", server.requests[1].body)
    assert call_id == "call_a"
    assert content.startswith(
        "invalid arguments for tool 'lookup': the arguments are not valid JSON"
    )
    assert result.audit.tools[0].result.error_class == "invalid_arguments"


def _strict_json(raw: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(raw, parse_constant=refuse)


async def test_nan_in_the_models_arguments_is_invalid_and_never_sent_back(
    server: ProtocolServer,
) -> None:
    """Catches: arguments holding NaN (which Python's decoder reads, JSON does not) taken as
    valid, so the tool ran with them and every later request carried "input": {"x": NaN},
    a body the API cannot parse, failing the conversation's every turn."""
    ran: list[float] = []

    @tool
    def scale(x: float) -> str:
        ran.append(x)
        return "scaled"

    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                *wire.anthropic_tool_block(0, "toolu_1", "scale", ['{"x": Na', "N}"]),
                *wire.anthropic_end("tool_use"),
            )
        ),
        wire.stream(wire.anthropic_text(["Sorry."])),
    )
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)

    result = await Pipeline(model=model, tools=[scale]).run(Turn.start("scale it"))

    assert (ran, result.audit.tools[0].result.error_class) == ([], "invalid_arguments")
    sent = _strict_json(server.requests[1].raw)
    assert sent["messages"][1]["content"][0]["input"] == {}


def _number_past_range_stream(provider: str, number: str) -> tuple[bytes, ...]:
    raw = '{"x": ' + number + "}"
    if provider == "openai":
        return wire.openai_tool_calls([("call_1", "scale", [raw])])
    return (
        wire.anthropic_start(),
        *wire.anthropic_tool_block(0, "toolu_1", "scale", [raw]),
        *wire.anthropic_end("tool_use"),
    )


@pytest.mark.parametrize("number", ["1e400", "-1E+400", "1.5e999"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_number_past_a_floats_range_in_the_arguments_is_invalid(
    server: ProtocolServer, provider: str, number: str
) -> None:
    """Catches: a number such as 1e400 (valid JSON, which Python reads as infinity) taken as
    valid arguments, where NaN and Infinity were refused: the tool ran with inf, and the next
    request, which must echo the call, failed with a RequestError, so the turn failed."""
    ran: list[float] = []

    @tool
    def scale(x: float) -> str:
        ran.append(x)
        return "scaled"

    second = text_reply(provider, "Sorry.")
    server.script(wire.stream(_number_past_range_stream(provider, number)), wire.stream(second))
    model = client(provider, server)

    result = await Pipeline(model=model, tools=[scale]).run(Turn.start("scale it"))

    assert (ran, result.outcome) == ([], "completed")
    record = result.audit.tools[0].result
    assert record.error_class == "invalid_arguments"
    assert f"the number {number} is past a float's range" in record.content
    _strict_json(server.requests[1].raw)


async def test_an_input_sent_whole_with_a_number_past_range_is_invalid(
    server: ProtocolServer,
) -> None:
    """Catches: the input a content_block_start carried whole (as some servers send it) taken
    unchecked, so NaN or 1e400 in it ran the tool and then failed the next request."""
    ran: list[float] = []

    @tool
    def scale(x: float) -> str:
        ran.append(x)
        return "scaled"

    start = '{"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use",'
    start += ' "id": "toolu_1", "name": "scale", "input": {"x": 1e400}}}'
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                wire.sse(start, "content_block_start"),
                wire.sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                *wire.anthropic_end("tool_use"),
            )
        ),
        wire.stream(wire.anthropic_text(["Sorry."])),
    )
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)

    result = await Pipeline(model=model, tools=[scale]).run(Turn.start("scale it"))

    assert (ran, result.outcome) == ([], "completed")
    assert result.audit.tools[0].result.error_class == "invalid_arguments"
    assert _strict_json(server.requests[1].raw)["messages"][1]["content"][0]["input"] == {}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_nan_and_infinity_in_a_call_of_the_history_are_sent_as_strings(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: a conversation holding a tool call whose arguments have NaN or an infinity
    (decoded before such arguments were refused, or put there by a hook) failing every later
    turn with a RequestError, since each request must echo the call and JSON has no number
    for them."""
    call = ToolCall("call_1", "scale", {"x": math.inf, "more": [math.nan, -math.inf], "n": 2})
    history = (
        Message.user("scale it"),
        Message.assistant([call]),
        Message.tool(ToolResult("call_1", "scaled to inf")),
        Message.assistant("Done."),
    )
    reply = text_reply(provider, "ok")
    server.script(wire.stream(reply))
    model = client(provider, server)

    turn = Turn.start("again", context=Context(messages=history))
    result = await Pipeline(model=model).run(turn)

    assert result.outcome == "completed"
    sent = _strict_json(server.requests[0].raw)["messages"][1]
    arguments = (
        json.loads(sent["tool_calls"][0]["function"]["arguments"])
        if provider == "openai"
        else sent["content"][0]["input"]
    )
    assert arguments == {"x": "Infinity", "more": ["NaN", "-Infinity"], "n": 2}


@tool
def stat_path(path: str) -> str:
    """Describe a path.

    Args:
        path: The path.
    """
    return f"stat of {path}"


def _calls_sharing_one_id(provider: str, paths: list[str]) -> tuple[bytes, ...]:
    """A reply calling `stat_path` once per path, every call with the id ``call_0`` (as some
    OpenAI-compatible servers number them)."""
    if provider == "openai":
        calls = [("call_0", "stat_path", [json.dumps({"path": path})]) for path in paths]
        return wire.openai_tool_calls(calls)
    blocks = [
        piece
        for index, path in enumerate(paths)
        for piece in wire.anthropic_tool_block(
            index, "call_0", "stat_path", [json.dumps({"path": path})]
        )
    ]
    return (wire.anthropic_start(), *blocks, *wire.anthropic_end("tool_use"))


def _sent_calls(provider: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The tool calls a request body echoes: (call id, path), in order."""
    if provider == "openai":
        return [
            (call["id"], json.loads(call["function"]["arguments"])["path"])
            for m in body["messages"]
            if m["role"] == "assistant"
            for call in m.get("tool_calls", ())
        ]
    return [
        (block["id"], block["input"]["path"])
        for m in body["messages"]
        if m["role"] == "assistant"
        for block in m["content"]
        if block["type"] == "tool_use"
    ]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_calls_sharing_one_id_get_ids_of_their_own_everywhere(
    server: ProtocolServer, provider: str
) -> None:
    """Bug caught: a reply whose tool calls all had the id "call_0" kept it on every call, so
    each tool result named all of them: the next request paired no result with exactly its
    call (the provider refuses it), and the log could not tell which result answered which
    call. A repeated id is now replaced with a fresh call_<hex>, the same in the hooks, the
    events, the log and the next request."""
    paths = ["README.md", "secrets.env", "setup.py"]

    before_saw: list[str] = []
    after_saw: list[tuple[str, str]] = []

    def note_before(call: ToolCall, turn: Turn) -> Any:
        before_saw.append(call.id)
        return cont(call)

    def note_after(call: ToolCall, result: ToolResult, turn: Turn) -> Any:
        after_saw.append((call.id, result.call_id))
        return cont(result)

    second = text_reply(provider, "Done.")
    server.script(wire.stream(_calls_sharing_one_id(provider, paths)), wire.stream(second))
    model = client(provider, server)
    pipe = Pipeline(
        model=model, tools=[stat_path], before_tool=[note_before], after_tool=[note_after]
    )
    log = MemoryLog()

    async with (
        pipe.session(log=log, conversation_id="c") as session,
        session.stream("stat them") as events,
    ):
        seen = [event async for event in events]

    committed = (await log.load("c")).messages
    ids = [part.id for part in committed[1].parts if isinstance(part, ToolCall)]
    assert ids[0] == "call_0"
    assert len(set(ids)) == len(paths)
    assert all(re.fullmatch(r"call_[0-9a-f]{16}", call_id) for call_id in ids[1:])
    results = {
        part.call_id: part.content
        for message in committed[2:]
        for part in message.parts
        if isinstance(part, ToolResult)
    }
    assert [results[call_id] for call_id in ids] == [f"stat of {path}" for path in paths]
    requested = [e.call.id for e in seen if isinstance(e, ev.ToolCallRequested)]
    finished = {e.call.id: e.result.content for e in seen if isinstance(e, ev.ToolFinished)}
    assert requested == ids
    assert finished == results
    assert sorted(before_saw) == sorted(ids)
    assert sorted(after_saw) == sorted((call_id, call_id) for call_id in ids)
    body = server.requests[1].body
    assert _sent_calls(provider, body) == list(zip(ids, paths, strict=True))
    sent = {call_id: content for call_id, content, _ in sent_results(provider, body)}
    assert [sent[call_id] for call_id in ids] == [f"stat of {path}" for path in paths]
    assert len(sent_results(provider, body)) == len(paths)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_call_repeating_an_id_of_an_earlier_step_or_turn_gets_one_of_its_own(
    server: ProtocolServer, provider: str
) -> None:
    """Bug caught: a server that gives every reply's call the id "call_0" (as some
    OpenAI-compatible servers do) repeated an id of the conversation on the next step and
    turn, which Anthropic refuses in every later request; the call is now given the id with
    a suffix, and the committed log and the next request hold each id once."""

    done = text_reply(provider, "Done.")
    server.script(
        wire.stream(_calls_sharing_one_id(provider, ["a"])),
        wire.stream(_calls_sharing_one_id(provider, ["b"])),
        wire.stream(done),
        wire.stream(_calls_sharing_one_id(provider, ["c"])),
        wire.stream(done),
    )
    model = client(provider, server)
    log = MemoryLog()

    async with Pipeline(model=model, tools=[stat_path]).session(
        log=log, conversation_id="c"
    ) as session:
        assert (await session.send("stat a, then b")).reply.text == "Done."
        assert (await session.send("stat c")).reply.text == "Done."

    committed = (await log.load("c")).messages
    ids = [part.id for m in committed for part in m.parts if isinstance(part, ToolCall)]
    assert ids == ["call_0", "call_0_2", "call_0_3"]
    assert _sent_calls(provider, server.requests[4].body) == list(zip(ids, "abc", strict=True))


class _Window:
    """A model wrapper that sends the provider only the last three messages."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def stream(self, request: ModelRequest) -> Any:
        return self.inner.stream(attrs.evolve(request, messages=request.messages[-3:]))


async def test_a_wrapper_sending_fewer_messages_gets_the_same_fresh_ids(
    server: ProtocolServer,
) -> None:
    """Bug caught: a model wrapper trimming the request (a sliding window) around OpenAIChat
    failed the second turn: the provider renamed a repeated "call_0" against the messages it
    was sent, the runtime refused it against the whole request; the runtime now gives the
    fresh id itself, against the whole request."""

    done = wire.stream(wire.openai_text(["Done."]))
    server.script(
        wire.stream(_calls_sharing_one_id("openai", ["a"])),
        done,
        wire.stream(_calls_sharing_one_id("openai", ["b"])),
        done,
    )
    model = _Window(OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY))
    log = MemoryLog()

    async with Pipeline(model=model, tools=[stat_path]).session(
        log=log, conversation_id="c"
    ) as session:
        assert (await session.send("stat a")).reply.text == "Done."
        assert (await session.send("stat b")).reply.text == "Done."

    committed = (await log.load("c")).messages
    assert [part.id for m in committed for part in m.parts if isinstance(part, ToolCall)] == [
        "call_0",
        "call_0_2",
    ]
    assert _sent_calls("openai", server.requests[3].body) == [("call_0_2", "b")]
