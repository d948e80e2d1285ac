"""Anthropic Messages: the pure core on recorded payloads, then over a real socket."""

import json
import tracemalloc
from typing import Any

import pytest

from pipeline import (
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    Pipeline,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    RequestError,
    tool,
)
from pipeline.providers import AnthropicMessages
from pipeline.providers._anthropic import PAUSE_CONTINUATIONS, AnthropicStreamParser, build_body
from pipeline.providers._sse import ServerSentEvent
from turns import (
    Context,
    Message,
    RequestOptions,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    Usage,
)

from . import server as wire
from .server import ProtocolServer
from .support import KEY, collect, hi

SPEC = ToolSpec("stat_file", "Size of a file.", {"type": "object", "properties": {}})
SEARCH_SPEC = ToolSpec("web_search", "Search the web.", {"type": "object", "properties": {}})
THINKING = {"type": "thinking", "thinking": "Look it up.", "signature": "sig=="}


def body(*messages: Message, **options: Any) -> dict[str, Any]:
    request = ModelRequest(messages, (SPEC,), RequestOptions(**options))
    return build_body("claude-test", request, max_tokens=1024)


# --- The request body ---------------------------------------------------------------------------


def test_system_messages_become_the_top_level_system() -> None:
    sent = body(Message.system("Be terse."), Message.user("hi"))
    assert (sent["system"], [m["role"] for m in sent["messages"]]) == ("Be terse.", ["user"])


def test_max_tokens_defaults_to_the_providers_setting() -> None:
    assert body(Message.user("hi"))["max_tokens"] == 1024


def test_the_turns_max_tokens_wins() -> None:
    assert body(Message.user("hi"), max_tokens=50)["max_tokens"] == 50


def test_a_multi_part_user_message_becomes_text_blocks() -> None:
    assert body(Message.user([Text("a"), Text("b")]))["messages"][0]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]


def test_assistant_tool_calls_become_tool_use_blocks_with_object_input() -> None:
    call = ToolCall("toolu_1", "stat_file", {"path": "README.md"})
    assert body(Message.assistant([Text("Checking."), call]))["messages"][0]["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "stat_file", "input": {"path": "README.md"}},
    ]


def test_consecutive_tool_results_merge_into_one_user_message_before_its_text() -> None:
    sent = body(
        Message.tool(ToolResult("toolu_1", "5120")),
        Message.tool(ToolResult("toolu_2", "missing", is_error=True)),
        Message.user("Answer in KB."),
    )
    assert sent["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5120"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "missing",
                    "is_error": True,
                },
                {"type": "text", "text": "Answer in KB."},
            ],
        }
    ]


@pytest.mark.parametrize("content", ["", "  \n"])
def test_an_error_result_without_content_is_sent_with_some(content: str) -> None:
    """Catches: an error result with empty content (an after-tool hook's rewrite) sent as
    it is, which the API refuses with a 400 ("content cannot be empty if is_error is
    true"); kept in the log, it failed every later turn of the conversation."""
    sent = body(
        Message.tool(ToolResult("toolu_1", content, is_error=True)),
        Message.tool(ToolResult("toolu_2", "")),
    )
    failed, empty = sent["messages"][0]["content"]
    assert failed["is_error"] is True
    assert failed["content"].strip()
    assert empty == {"type": "tool_result", "tool_use_id": "toolu_2", "content": ""}


def test_empty_text_blocks_are_left_out() -> None:
    call = ToolCall("t", "stat_file", {})
    assert [
        b["type"] for b in body(Message.assistant([Text(""), call]))["messages"][0]["content"]
    ] == ["tool_use"]


def test_thinking_blocks_from_meta_go_first_in_the_assistant_message() -> None:
    call = ToolCall("t", "stat_file", {}, {"anthropic_thinking": [THINKING]})
    blocks = body(Message.assistant([Text("Checking."), call]))["messages"][0]["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0] == THINKING


def test_meta_fields_are_merged_into_the_block() -> None:
    part = Text("long document", {"anthropic": {"cache_control": {"type": "ephemeral"}}})
    assert body(Message.user([part]))["messages"][0]["content"][0]["cache_control"] == {
        "type": "ephemeral"
    }


def test_tools_use_input_schema() -> None:
    assert body(Message.user("hi"))["tools"] == [
        {
            "name": "stat_file",
            "description": "Size of a file.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]


@pytest.mark.parametrize(
    ("choice", "wire_choice"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ("stat_file", {"type": "tool", "name": "stat_file"}),
    ],
)
def test_tool_choice(choice: str, wire_choice: object) -> None:
    assert body(Message.user("hi"), tool_choice=choice)["tool_choice"] == wire_choice


@pytest.mark.parametrize(
    ("choice", "wire_choice"),
    [
        ("auto", {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ("stat_file", {"type": "tool", "name": "stat_file"}),
    ],
)
def test_a_tool_choice_sent_in_extra_is_the_effective_tool_choice(
    choice: str, wire_choice: object
) -> None:
    """Bug caught: ModelCalled.options (effective_options) kept the turn's tool_choice where
    extra's, in Anthropic's form, replaced it in the body sent."""
    options = RequestOptions(tool_choice="auto", extra={"tool_choice": wire_choice})
    assert AnthropicMessages("m").effective_options(options).tool_choice == choice


def test_extra_values_with_no_form_among_the_options_show_as_none() -> None:
    """Bug caught: a temperature or tool_choice extra sent that RequestOptions cannot hold
    left the options' own value shown, as if it had been sent."""
    extra = {"temperature": 3, "max_tokens": 0, "tool_choice": {"type": "mystery"}}
    options = RequestOptions(temperature=0.2, max_tokens=50, tool_choice="auto", extra=extra)
    shown = AnthropicMessages("m").effective_options(options)
    assert (shown.temperature, shown.max_tokens, shown.tool_choice, shown.extra) == (
        None,
        None,
        None,
        extra,
    )


def test_temperature_and_extra_are_sent() -> None:
    sent = body(Message.user("hi"), temperature=0.3, extra={"top_k": 5})
    assert (sent["temperature"], sent["top_k"]) == (0.3, 5)


# --- The stream parser --------------------------------------------------------------------------


def event(name: str, **payload: Any) -> ServerSentEvent:
    return ServerSentEvent(name, json.dumps({"type": name, **payload}))


START = event(
    "message_start",
    message={
        "id": "msg_1",
        "usage": {
            "input_tokens": 400,
            "cache_creation_input_tokens": 10,
            "cache_read_input_tokens": 2,
            "output_tokens": 1,
        },
    },
)


def text_delta(index: int, text: str) -> ServerSentEvent:
    return event("content_block_delta", index=index, delta={"type": "text_delta", "text": text})


def json_delta(index: int, fragment: str) -> ServerSentEvent:
    delta = {"type": "input_json_delta", "partial_json": fragment}
    return event("content_block_delta", index=index, delta=delta)


def stop(reason: str, output: int = 38) -> list[ServerSentEvent]:
    return [
        event("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": output}),
        event("message_stop"),
    ]


def parse(*events: ServerSentEvent, parser: AnthropicStreamParser | None = None) -> list[object]:
    parser = parser or AnthropicStreamParser()
    return [item for sse in events for item in parser.feed(sse)]


def test_text_then_a_tool_call_then_finish_with_cumulative_usage() -> None:
    tool = {"type": "tool_use", "id": "toolu_1", "name": "stat_file", "input": {}}
    events = parse(
        START,
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        ServerSentEvent("ping", '{"type": "ping"}'),
        text_delta(0, "Check"),
        text_delta(0, "ing."),
        event("content_block_stop", index=0),
        event("content_block_start", index=1, content_block=tool),
        json_delta(1, ""),
        json_delta(1, '{"path": "READ'),
        json_delta(1, 'ME.md"}'),
        event("content_block_stop", index=1),
        *stop("tool_use"),
    )
    assert events == [
        ModelText("Check"),
        ModelText("ing."),
        ModelToolCall(ToolCall("toolu_1", "stat_file", {"path": "README.md"})),
        ModelFinish("tool_calls", Usage(412, 38)),
    ]


@pytest.mark.parametrize(
    ("stop_reason", "reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
        ("something_new", "something_new"),
    ],
)
def test_stop_reasons_map_to_the_finish_vocabulary(stop_reason: str, reason: str) -> None:
    assert parse(START, *stop(stop_reason))[-1] == ModelFinish(reason, Usage(412, 38))


def test_unknown_events_blocks_and_deltas_are_ignored() -> None:
    events = parse(
        START,
        event("content_block_start", index=0, content_block={"type": "server_tool_use"}),
        event("content_block_delta", index=0, delta={"type": "citations_delta"}),
        event("content_block_stop", index=0),
        event("brand_new_event", anything=1),
        *stop("end_turn"),
    )
    assert events == [ModelFinish("stop", Usage(412, 38))]


def test_an_unnamed_event_is_dispatched_on_its_json_type() -> None:
    parser = AnthropicStreamParser()
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    for payload in (delta, {"type": "message_stop"}):
        events = parser.feed(ServerSentEvent("message", json.dumps(payload)))
    assert (parser.done, events) == (True, [ModelFinish("stop", Usage())])


def test_thinking_blocks_with_signatures_ride_on_the_next_tool_call() -> None:
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    tool = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    events = parse(
        START,
        event("content_block_start", index=0, content_block=thinking),
        event(
            "content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Look "}
        ),
        event(
            "content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "it up."}
        ),
        event(
            "content_block_delta", index=0, delta={"type": "signature_delta", "signature": "sig=="}
        ),
        event("content_block_stop", index=0),
        event("content_block_start", index=1, content_block=tool),
        event("content_block_stop", index=1),
        *stop("tool_use"),
    )
    assert events[0] == ModelToolCall(ToolCall("t", "f", {}, {"anthropic_thinking": [THINKING]}))


def test_a_tool_call_cut_by_max_tokens_is_reported_as_a_length_stop() -> None:
    tool = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    events = parse(
        START,
        event("content_block_start", index=0, content_block=tool),
        json_delta(0, '{"path": "RE'),
        *stop("max_tokens"),
    )
    assert events[0].call.meta["invalid_arguments"]["raw"] == '{"path": "RE'  # type: ignore[attr-defined]
    assert events[-1] == ModelFinish("length", Usage(412, 38))


def test_an_error_event_keeps_the_providers_type_and_message() -> None:
    error = ServerSentEvent(
        "error",
        json.dumps(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ),
    )
    with pytest.raises(ProviderProtocolError, match="overloaded_error: Overloaded"):
        parse(START, error)


def test_malformed_json_is_a_protocol_error() -> None:
    with pytest.raises(ProviderProtocolError, match="not valid JSON"):
        parse(ServerSentEvent("content_block_delta", "{not json"))


def test_the_end_of_the_body_before_message_stop_is_a_truncation() -> None:
    parser = AnthropicStreamParser()
    parse(START, text_delta(0, "a"), parser=parser)
    with pytest.raises(ProviderProtocolError, match="before message_stop"):
        parser.end()


# --- Over a real socket ---------------------------------------------------------------------


def provider(server: ProtocolServer) -> AnthropicMessages:
    return AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)


def test_the_key_is_not_in_the_repr() -> None:
    model = AnthropicMessages("claude-test", api_key=KEY)
    assert KEY not in repr(model)
    assert KEY not in str(model)


async def test_the_request_carries_the_key_and_version_headers(server: ProtocolServer) -> None:
    server.script(wire.stream(wire.anthropic_text(["ok"])))
    await collect(provider(server))
    sent = server.requests[0]
    assert (sent.path, sent.headers["x-api-key"], sent.headers["anthropic-version"]) == (
        "/v1/messages",
        KEY,
        "2023-06-01",
    )


async def test_a_text_turn_runs_through_the_pipeline(server: ProtocolServer) -> None:
    server.script(wire.stream(wire.anthropic_text(["Hello", ", world"], input_tokens=12)))
    result = await Pipeline(model=provider(server), system="Be terse.").run(Turn.start("hi"))
    assert result.reply is not None
    assert (result.reply.text, result.reply.finish_reason, result.reply.usage) == (
        "Hello, world",
        "stop",
        Usage(12, 3),
    )


async def test_a_tool_round_trip(server: ProtocolServer) -> None:
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                *wire.anthropic_text_block(0, ["Checking."]),
                *wire.anthropic_tool_block(
                    1, "toolu_a", "stat_file", ["", '{"path": "READ', 'ME.md"}']
                ),
                *wire.anthropic_tool_block(2, "toolu_b", "stat_file", ['{"path"', ': "setup.py"}']),
                *wire.anthropic_end("tool_use", 40),
            )
        ),
        wire.stream(wire.anthropic_text(["README.md is 5 KB."])),
    )
    model = provider(server)
    question = Message.user("How big are README.md and setup.py?")
    first = await collect(model, ModelRequest((question,), (SPEC,)))
    calls = [event.call for event in first if isinstance(event, ModelToolCall)]
    assert calls == [
        ToolCall("toolu_a", "stat_file", {"path": "README.md"}),
        ToolCall("toolu_b", "stat_file", {"path": "setup.py"}),
    ]
    follow_up = (
        question,
        Message.assistant([Text("Checking."), *calls]),
        Message.tool(ToolResult("toolu_a", "5120")),
        Message.tool(ToolResult("toolu_b", "no such file", is_error=True)),
    )
    second = await collect(model, ModelRequest(follow_up, (SPEC,)))
    assert server.requests[1].body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "5120"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_b",
                "content": "no such file",
                "is_error": True,
            },
        ],
    }
    assert second[0] == ModelText("README.md is 5 KB.")


def test_whitespace_only_text_blocks_are_not_sent() -> None:
    # The API rejects text blocks without non-whitespace text; a reply of "\n\n" in the
    # history must not break every later turn of the conversation.
    call = ToolCall("toolu_1", "stat_file", {})
    sent = body(
        Message.user("hi"),
        Message.assistant("\n\n"),
        Message.user("again"),
        Message.assistant([Text("\n"), call]),
    )["messages"]
    texts = [
        block.get("text")
        for message in sent
        for block in (message["content"] if isinstance(message["content"], list) else ())
        if block.get("type") == "text"
    ]
    assert all(text is None or text.strip() for text in texts)
    assert sent[-1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "stat_file", "input": {}}
    ]


def test_cache_counts_survive_a_delta_that_repeats_only_input_tokens() -> None:
    start = event(
        "message_start",
        message={
            "id": "m",
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1},
        },
    )
    delta = event(
        "message_delta",
        delta={"stop_reason": "end_turn"},
        usage={"input_tokens": 10, "output_tokens": 3},
    )
    events = parse(start, delta, event("message_stop"))
    assert events[-1] == ModelFinish("stop", Usage(15, 3))


def test_unknown_events_are_ignored_without_decoding_them() -> None:
    parser = AnthropicStreamParser()
    assert parser.feed(ServerSentEvent("future_event", "not json")) == []


@pytest.mark.parametrize("fragments", [[], [""], ["", " "]], ids=["none", "empty", "blank"])
async def test_an_input_sent_whole_in_the_block_start_survives_empty_deltas(
    server: ProtocolServer, fragments: list[str]
) -> None:
    """Catches: the whole input a content_block_start carried replaced by {} when empty
    input_json_delta fragments followed it (only the absence of any fragment kept it)."""
    start = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "stat_file",
        "input": {"path": "README.md"},
    }
    deltas = [
        wire.sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": fragment},
            },
            "content_block_delta",
        )
        for fragment in fragments
    ]
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                wire.sse(
                    {"type": "content_block_start", "index": 0, "content_block": start},
                    "content_block_start",
                ),
                *deltas,
                wire.sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                *wire.anthropic_end("tool_use"),
            )
        )
    )
    events = await collect(AnthropicMessages("claude-test", base_url=server.url, api_key=KEY))
    [call] = [event.call for event in events if isinstance(event, ModelToolCall)]
    assert (call.id, call.name, call.arguments, dict(call.meta)) == (
        "toolu_1",
        "stat_file",
        {"path": "README.md"},
        {},
    )


async def test_tool_use_blocks_without_an_id_get_distinct_ids(server: ProtocolServer) -> None:
    """Catches: a tool_use block sent without an id (a server imitating the API) became a
    call with the id "None", the same for every such call, where OpenAI's side makes one up."""
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                *(
                    wire.sse(
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {"type": "tool_use", "name": "stat_file", **extra},
                        },
                        "content_block_start",
                    )
                    + wire.sse({"type": "content_block_stop", "index": index}, "content_block_stop")
                    for index, extra in enumerate([{}, {"id": ""}, {"id": None}])
                ),
                *wire.anthropic_end("tool_use"),
            )
        )
    )
    events = await collect(AnthropicMessages("claude-test", base_url=server.url, api_key=KEY))
    ids = [event.call.id for event in events if isinstance(event, ModelToolCall)]
    assert len(ids) == len(set(ids)) == 3
    assert all(call_id.startswith("call_") for call_id in ids)


async def test_meta_fields_of_the_system_prompt_are_sent(server: ProtocolServer) -> None:
    """Catches: the system messages were sent as one joined string, so `meta["anthropic"]`
    on them (cache_control on the system prompt, where prompt caching usually starts) was
    dropped, though every other message and part echoes its fields."""
    server.script(wire.stream(wire.anthropic_text(["ok"])))
    cache = {"anthropic": {"cache_control": {"type": "ephemeral"}}}
    request = ModelRequest(
        (
            Message("system", (Text("Rules."), Text("Style.", cache))),
            Message.system("Long policy.", meta=cache),
            Message.user("hi"),
        )
    )
    await collect(AnthropicMessages("claude-test", base_url=server.url, api_key=KEY), request)
    assert server.requests[0].body["system"] == [
        {"type": "text", "text": "Rules."},
        {"type": "text", "text": "Style.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Long policy.", "cache_control": {"type": "ephemeral"}},
    ]


@pytest.mark.parametrize(
    "pieces",
    [(wire.anthropic_start(),), ()],
    ids=["after-message-start", "alone"],
)
async def test_message_stop_with_nothing_before_it_is_a_protocol_error(
    server: ProtocolServer, pieces: tuple[bytes, ...]
) -> None:
    """Catches: a stream of message_stop with no content and no message_delta (so no
    stop_reason) passed for a complete, empty answer, where OpenAI's [DONE] with nothing
    before it is a protocol error."""
    server.script(wire.stream((*pieces, wire.sse({"type": "message_stop"}, "message_stop"))))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    with pytest.raises(ProviderProtocolError, match="message_stop without any content"):
        await collect(model)


@pytest.mark.parametrize("text", ["", "  \n"], ids=["empty", "blank"])
async def test_a_blank_user_message_is_a_request_error_not_a_prefill(
    server: ProtocolServer, text: str
) -> None:
    """Catches: a user message with no text but whitespace left out of the request (the API
    refuses whitespace-only text blocks), so the request ended with the assistant's last
    message and the model continued it (a prefill) instead of answering."""
    history = Context(messages=(Message.user("hi"), Message.assistant("Hello!")))
    pipe = Pipeline(model=AnthropicMessages("claude-test", base_url=server.url, api_key=KEY))
    with pytest.raises(RequestError, match="the last message, a user message, holds no text"):
        await pipe.run(Turn.start(text, context=history))
    assert server.requests == []


async def test_a_blank_user_message_after_tool_results_is_left_out(
    server: ProtocolServer,
) -> None:
    """Catches: a blank user message refused where leaving it out is harmless, because the
    request still ends with the tool results the model answers."""
    server.script(wire.stream(wire.anthropic_text(["Done."])))
    call = ToolCall("toolu_1", "stat_file", {})
    messages = (
        Message.user("hi"),
        Message.assistant([call]),
        Message.tool(ToolResult("toolu_1", "5120")),
        Message.user(" "),
    )
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    await collect(model, ModelRequest(messages))
    assert server.requests[0].body["messages"][-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5120"}],
    }


# --- Server tools and pause_turn ----------------------------------------------------------------

SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
RESULTS = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [
        {
            "type": "web_search_result",
            "title": "Forecast",
            "url": "https://weather.example",
            "encrypted_content": "EqgfCioI",
            "page_age": None,
        }
    ],
}
CITATION = {
    "type": "web_search_result_location",
    "cited_text": "Sunny all day.",
    "url": "https://weather.example",
    "title": "Forecast",
    "encrypted_index": "Eo8BCioI",
}


def block(index: int, start: dict[str, Any], *deltas: dict[str, Any]) -> tuple[bytes, ...]:
    """One content block on the wire: its start, its deltas, its stop."""
    return (
        wire.sse(
            {"type": "content_block_start", "index": index, "content_block": start},
            "content_block_start",
        ),
        *(
            wire.sse(
                {"type": "content_block_delta", "index": index, "delta": delta},
                "content_block_delta",
            )
            for delta in deltas
        ),
        wire.sse({"type": "content_block_stop", "index": index}, "content_block_stop"),
    )


def paused_search() -> tuple[bytes, ...]:
    """A response that cites, runs a web search and pauses before its answer."""
    return (
        wire.anthropic_start(),
        *block(
            0,
            {"type": "text", "text": "", "citations": []},
            {"type": "citations_delta", "citation": CITATION},
            {"type": "text_delta", "text": "Earlier: sunny. "},
        ),
        *block(
            1,
            SEARCH,
            {"type": "input_json_delta", "partial_json": ""},
            {"type": "input_json_delta", "partial_json": '{"query": "wea'},
            {"type": "input_json_delta", "partial_json": 'ther"}'},
        ),
        *block(2, RESULTS),
        *wire.anthropic_end("pause_turn"),
    )


SENT_BACK = [
    {"type": "text", "text": "Earlier: sunny. ", "citations": [CITATION]},
    {**SEARCH, "input": {"query": "weather"}},
    RESULTS,
]
"""`paused_search`'s content as the API wants it back."""


async def test_a_paused_turn_is_continued_with_its_server_tool_blocks_sent_back(
    server: ProtocolServer,
) -> None:
    """Bug caught: a response stopping with pause_turn (a server tool's long turn) ended the
    turn with the half answer written before the search, and the search and its results
    were dropped, where the API continues the turn when the response is sent back as it came."""
    server.script(wire.stream(paused_search()), wire.stream(wire.anthropic_text(["Sunny today."])))
    pipe = Pipeline(model=AnthropicMessages("claude-test", base_url=server.url, api_key=KEY))
    reply = (await pipe.run(Turn.start("Weather?"))).reply
    assert reply is not None
    assert (reply.message.text, reply.finish_reason, reply.usage) == (
        "Earlier: sunny. Sunny today.",
        "stop",
        Usage(24, 6),
    )
    assert server.requests[1].body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": SENT_BACK},
    ]


async def test_a_turn_that_keeps_pausing_ends_with_pause_turn_after_the_bound(
    server: ProtocolServer,
) -> None:
    """Bug caught: a pause_turn ended the turn after the first response, where the model
    asks for its response back to go on; the continuations are bounded, each sending back
    everything the turn said so far."""
    rounds = PAUSE_CONTINUATIONS + 1
    server.script(*(wire.stream(paused_search()) for _ in range(rounds)))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    events = await collect(model)
    assert len(server.requests) == rounds
    assert server.requests[-1].body["messages"][-1] == {
        "role": "assistant",
        "content": SENT_BACK * (rounds - 1),
    }
    assert events[-1] == ModelFinish("pause_turn", Usage(12 * rounds, 3 * rounds))
    assert (
        "".join(e.text for e in events if isinstance(e, ModelText)) == "Earlier: sunny. " * rounds
    )


async def test_a_server_tool_block_is_never_a_client_call(server: ProtocolServer) -> None:
    """Bug caught (guard): a server tool's block (web_search, run at Anthropic) read as a
    call of the client tool of the same name, which would run it a second time here."""
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                *block(0, SEARCH, {"type": "input_json_delta", "partial_json": '{"query": "x"}'}),
                *block(1, RESULTS),
                *wire.anthropic_text_block(2, ["Sunny."]),
                *wire.anthropic_end("end_turn"),
            )
        )
    )
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    events = await collect(model, ModelRequest((Message.user("Weather?"),), (SEARCH_SPEC,)))
    assert events == [ModelText("Sunny."), ModelFinish("stop", Usage(12, 3))]


THOUGHT = {"type": "thinking", "thinking": "Search, then stat.", "signature": "sig=="}


def paused_thinking() -> tuple[bytes, ...]:
    """A response that thinks (text and signature streamed), searches and pauses."""
    return (
        wire.anthropic_start(),
        *block(
            0,
            {"type": "thinking", "thinking": "", "signature": ""},
            {"type": "thinking_delta", "thinking": "Search, "},
            {"type": "thinking_delta", "thinking": "then stat."},
            {"type": "signature_delta", "signature": "sig=="},
        ),
        *block(1, SEARCH, {"type": "input_json_delta", "partial_json": '{"query": "weather"}'}),
        *block(2, RESULTS),
        *wire.anthropic_end("pause_turn"),
    )


def calls_stat_file() -> tuple[bytes, ...]:
    """A response that calls the client tool ``stat_file``."""
    return (
        wire.anthropic_start(),
        *wire.anthropic_tool_block(0, "toolu_1", "stat_file", ["{}"]),
        *wire.anthropic_end("tool_use"),
    )


@tool
def stat_file() -> str:
    """Size of a file."""
    return "5120"


async def test_a_client_call_after_a_pause_goes_back_with_the_paused_thinking(
    server: ProtocolServer,
) -> None:
    """Bug caught: the thinking and server-tool blocks of a paused response were lost when
    its continuation called a client tool, so the tool loop's next request sent the calling
    assistant message without the thinking before the call, which the API refuses."""
    server.script(
        wire.stream(paused_thinking()),
        wire.stream(calls_stat_file()),
        wire.stream(wire.anthropic_text(["5 KiB."])),
    )
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    reply = (await Pipeline(model=model, tools=[stat_file]).run(Turn.start("Size?"))).reply
    assert reply is not None
    assert reply.message.text == "5 KiB."
    paused_blocks = [THOUGHT, {**SEARCH, "input": {"query": "weather"}}, RESULTS]
    # The continuation sends the thinking back with its text and its signature ...
    assert server.requests[1].body["messages"][-1] == {
        "role": "assistant",
        "content": paused_blocks,
    }
    # ... and so does the request after the call, first in the message that made it.
    assert server.requests[2].body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                *paused_blocks,
                {"type": "tool_use", "id": "toolu_1", "name": "stat_file", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5120"}],
        },
    ]


def paused_calling() -> tuple[bytes, ...]:
    """A paused response that called the client tool ``stat_file`` as well."""
    return (
        wire.anthropic_start(),
        *wire.anthropic_tool_block(0, "toolu_1", "stat_file", ["{}"]),
        *block(1, SEARCH),
        *block(2, RESULTS),
        *wire.anthropic_end("pause_turn"),
    )


async def test_a_paused_response_that_called_a_client_tool_is_not_continued(
    server: ProtocolServer,
) -> None:
    """Bug caught: a paused response that called a client tool was sent back to be
    continued, where the call needs its result first: the reply must end with pause_turn
    and the call, for the caller to run when the pipeline has no tools."""
    server.script(wire.stream(paused_calling()))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    reply = (await Pipeline(model=model).run(Turn.start("Size?"))).reply
    assert reply is not None
    assert reply.finish_reason == "pause_turn"
    assert [(c.id, c.name) for c in reply.message.parts if isinstance(c, ToolCall)] == [
        ("toolu_1", "stat_file")
    ]
    assert len(server.requests) == 1


async def test_a_paused_response_calling_a_tool_of_the_pipeline_gets_its_result(
    server: ProtocolServer,
) -> None:
    """Bug caught: a paused response that called a client tool was sent back to be
    continued instead of the tool loop sending the call's result."""
    server.script(wire.stream(paused_calling()), wire.stream(wire.anthropic_text(["5 KiB."])))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    reply = (await Pipeline(model=model, tools=[stat_file]).run(Turn.start("Size?"))).reply
    assert reply is not None
    assert (reply.message.text, reply.finish_reason) == ("5 KiB.", "stop")
    assert server.requests[1].body["messages"][-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5120"}],
    }


async def test_a_paused_response_with_no_blocks_is_continued_without_an_empty_message(
    server: ProtocolServer,
) -> None:
    """Bug caught: a paused response with no content blocks was sent back as an assistant
    message with empty content, which the API refuses."""
    empty = (wire.anthropic_start(), *wire.anthropic_end("pause_turn"))
    server.script(wire.stream(empty), wire.stream(wire.anthropic_text(["Sunny."])))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    events = await collect(model)
    assert events[-1] == ModelFinish("stop", Usage(24, 6))
    assert server.requests[1].body["messages"] == server.requests[0].body["messages"]


BAD_BLOCK = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad block"}}
SLOW_DOWN = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


@pytest.mark.parametrize(
    ("failures", "error"),
    [
        ((wire.json_error(400, BAD_BLOCK),), "HTTP 400"),
        ((wire.json_error(429, SLOW_DOWN, [("retry-after-ms", "1")]),) * 2, "after 2 attempts"),
        ((wire.json_error(529, OVERLOADED, [("retry-after-ms", "1")]),) * 2, "HTTP 529"),
        (
            (wire.stream(wire.anthropic_text(["Sun"])[:4], complete=False, reset=True),),
            "anthropic",
        ),
    ],
    ids=["400", "429-after-retries", "529-after-retries", "reset-mid-stream"],
)
async def test_a_failed_continuation_says_it_was_one(
    server: ProtocolServer, failures: tuple[wire.Reply, ...], error: str
) -> None:
    """Bug caught: a continuation request that failed raised the error of a first request,
    with no word that the turn's answer had already begun and paused."""
    server.script(wire.stream(paused_search()), *failures)
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY, max_retries=1)
    events: list[Any] = []

    async def read() -> None:
        async with model.stream(hi()) as stream:
            async for event in stream:
                events.append(event)

    with pytest.raises(ProviderError) as raised:
        await read()
    assert events[0] == ModelText("Earlier: sunny. ")  # what the paused response said
    message = str(raised.value)
    assert error in message
    assert message.endswith("— on continuation 1 of a pause_turn response")


async def test_a_rejected_key_raises_on_entering_the_stream(server: ProtocolServer) -> None:
    """Bug caught: the request was sent on the first step of the events, not on entering
    `model.stream(...)`, so a 401 surfaced later than with the other providers."""
    denied = {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
    server.script(wire.json_error(401, denied))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    with pytest.raises(ProviderStatusError, match="HTTP 401"):
        async with model.stream(hi()):
            pass


async def test_a_paused_block_json_cannot_hold_is_the_providers_fault(
    server: ProtocolServer,
) -> None:
    """Bug caught: a paused response holding 1e400 (read as inf) failed its continuation
    with a RequestError blaming the caller's options, tool specs and arguments."""
    results = wire.sse(
        {"type": "content_block_start", "index": 1, "content_block": RESULTS},
        "content_block_start",
    ).replace(b'"content": [', b'"score": 1e400, "content": [')
    paused = (
        wire.anthropic_start(),
        *block(0, SEARCH),
        results,
        wire.sse({"type": "content_block_stop", "index": 1}, "content_block_stop"),
        *wire.anthropic_end("pause_turn"),
    )
    server.script(wire.stream(paused))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    with pytest.raises(ProviderProtocolError, match=r"pause_turn.*content\[1\]\.score is inf"):
        await collect(model)
    assert len(server.requests) == 1


async def test_a_citations_delta_without_a_citation_is_not_sent_back(
    server: ProtocolServer,
) -> None:
    """Bug caught: a citations_delta with no citation went back in the paused text block as
    a null citation, which the API refuses."""
    paused = (
        wire.anthropic_start(),
        *block(
            0,
            {"type": "text", "text": ""},
            {"type": "citations_delta"},
            {"type": "citations_delta", "citation": CITATION},
            {"type": "text_delta", "text": "Hm."},
        ),
        *wire.anthropic_end("pause_turn"),
    )
    server.script(wire.stream(paused), wire.stream(wire.anthropic_text(["Sunny."])))
    model = AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)
    await collect(model)
    assert server.requests[1].body["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hm.", "citations": [CITATION]}],
    }


def test_a_long_answer_keeps_about_its_texts_size() -> None:
    """Bug caught: the parser kept every text delta's string of an answer that never
    paused, a dozen times the memory of the text itself."""
    parser = AnthropicStreamParser()

    def feed(name: str, **payload: Any) -> None:
        parser.feed(ServerSentEvent(event=name, data=json.dumps({"type": name, **payload})))

    feed("message_start", message={"usage": {"input_tokens": 1, "output_tokens": 1}})
    feed("content_block_start", index=0, content_block={"type": "text", "text": ""})
    delta = json.dumps(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "word "},
        }
    )
    deltas = [ServerSentEvent(event="content_block_delta", data=delta) for _ in range(40_000)]
    tracemalloc.start()
    try:
        for event in deltas:
            parser.feed(event)
        feed("content_block_stop", index=0)
        feed("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 9})
        feed("message_stop")
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 3 * len("word ") * len(deltas)  # the text is 200 kB
