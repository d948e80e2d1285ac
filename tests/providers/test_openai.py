"""OpenAI Chat Completions: the pure core on recorded payloads, then over a real socket."""

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import (
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    Pipeline,
    ProviderProtocolError,
    RequestError,
)
from pipeline.providers import OpenAIChat
from pipeline.providers._openai import OpenAIStreamParser, build_body, max_tokens_field_for
from pipeline.providers._sse import ServerSentEvent
from turns import Message, RequestOptions, Text, ToolCall, ToolResult, ToolSpec, Turn, Usage

from . import server as wire
from .server import ProtocolServer
from .support import KEY, collect

SPEC = ToolSpec("stat_file", "Size of a file.", {"type": "object", "properties": {}})


def body(*messages: Message, **options: Any) -> dict[str, Any]:
    request = ModelRequest(messages, (SPEC,), RequestOptions(**options))
    return build_body("gpt-test", request)


# --- The request body ---------------------------------------------------------------------------


def test_body_streams_with_usage() -> None:
    sent = body(Message.user("hi"))
    assert (sent["stream"], sent["stream_options"]) == (True, {"include_usage": True})


def test_system_and_single_text_user_messages_are_plain_strings() -> None:
    sent = body(Message.system("Be terse."), Message.user("hi"))
    assert sent["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
    ]


def test_a_multi_part_user_message_becomes_text_parts() -> None:
    sent = body(Message.user([Text("context"), Text("question")]))
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "context"},
        {"type": "text", "text": "question"},
    ]


def test_assistant_tool_calls_encode_arguments_as_a_json_string_without_null_content() -> None:
    call = ToolCall("call_1", "stat_file", {"path": "README.md"})
    sent = body(Message.assistant([call]))
    assert sent["messages"] == [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "stat_file", "arguments": '{"path":"README.md"}'},
                }
            ],
        }
    ]


def test_tool_results_become_tool_messages() -> None:
    sent = body(Message.tool(ToolResult("call_1", "5120")))
    assert sent["messages"] == [{"role": "tool", "tool_call_id": "call_1", "content": "5120"}]


def test_tools_are_function_definitions() -> None:
    assert body(Message.user("hi"))["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "stat_file",
                "parameters": {"type": "object", "properties": {}},
                "description": "Size of a file.",
            },
        }
    ]


@pytest.mark.parametrize(
    ("choice", "wire_choice"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        ("stat_file", {"type": "function", "function": {"name": "stat_file"}}),
    ],
)
def test_tool_choice(choice: str, wire_choice: object) -> None:
    assert body(Message.user("hi"), tool_choice=choice)["tool_choice"] == wire_choice


def test_tool_choice_is_left_out_without_tools() -> None:
    request = ModelRequest((Message.user("hi"),), (), RequestOptions(tool_choice="auto"))
    assert "tool_choice" not in build_body("m", request)


def test_temperature_max_tokens_and_extra_are_sent() -> None:
    sent = body(Message.user("hi"), temperature=0.2, max_tokens=50, extra={"seed": 7})
    assert (sent["temperature"], sent["max_tokens"], sent["seed"]) == (0.2, 50, 7)


def test_extra_overrides_what_the_core_chose() -> None:
    """Bug caught: extra keys the core derives from the turn's options (model, temperature,
    max_tokens, tool_choice) were refused, so a hook could not choose them per turn in a form
    the options have no field for; extra now wins over the derived value."""
    choice = {"type": "function", "function": {"name": "stat_file"}}
    extra = {"model": "other", "temperature": 0.9, "max_tokens": 7, "tool_choice": choice}
    sent = body(Message.user("hi"), temperature=0.2, max_tokens=50, tool_choice="auto", extra=extra)
    assert {key: sent[key] for key in extra} == extra


@pytest.mark.parametrize(
    ("base_url", "field"),
    [
        ("https://api.openai.com/v1", "max_completion_tokens"),
        ("http://localhost:11434/v1", "max_tokens"),
        ("https://openrouter.ai/api/v1", "max_tokens"),
    ],
)
def test_the_max_tokens_field_depends_on_the_server(base_url: str, field: str) -> None:
    assert max_tokens_field_for(base_url) == field


def test_meta_fields_are_echoed_into_the_tool_call() -> None:
    meta = {"openai": {"extra_content": {"google": {"thought_signature": "sig"}}}}
    sent = body(Message.assistant([ToolCall("c", "stat_file", {}, meta)]))
    assert sent["messages"][0]["tool_calls"][0]["extra_content"] == {
        "google": {"thought_signature": "sig"}
    }


def test_invalid_arguments_go_out_as_an_empty_object_never_raw() -> None:
    """Catches: the raw undecodable text echoed on the wire, which a gateway translating to
    Anthropic rejects with a 400 for the whole request."""
    meta = {"invalid_arguments": {"raw": '{"path": ', "error": "..."}}
    sent = body(Message.assistant([ToolCall("c", "stat_file", {}, meta)]))
    assert sent["messages"][0]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_a_tool_call_in_a_user_message_is_a_request_error_naming_the_tool() -> None:
    with pytest.raises(RequestError, match="stat_file"):
        body(Message.user([ToolCall("c", "stat_file", {})]))


# --- The stream parser --------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": choices, **extra})


def parse(*datas: str, parser: OpenAIStreamParser | None = None) -> list[object]:
    parser = parser or OpenAIStreamParser()
    return [event for data in datas for event in parser.feed(ServerSentEvent(data=data))]


def test_text_deltas_then_finish_with_usage_from_the_choices_free_chunk() -> None:
    events = parse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": None}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
        "[DONE]",
    )
    assert events == [ModelText("Hel"), ModelText("lo"), ModelFinish("stop", Usage(9, 2))]


def test_the_last_usage_wins() -> None:
    events = parse(
        chunk({"content": "a"}, usage={"prompt_tokens": 1, "completion_tokens": 1}),
        chunk({}, "length", usage={"prompt_tokens": 5, "completion_tokens": 8}),
        "[DONE]",
    )
    assert events[-1] == ModelFinish("length", Usage(5, 8))


def test_no_usage_reported_gives_zero_usage() -> None:
    assert parse(chunk({"content": "a"}), chunk({}, "stop"), "[DONE]")[-1] == ModelFinish(
        "stop", Usage()
    )


def test_an_unknown_finish_reason_passes_through() -> None:
    assert parse(chunk({}, "eos_token"), "[DONE]") == [ModelFinish("eos_token", Usage())]


def test_done_marks_the_parser_done() -> None:
    parser = OpenAIStreamParser()
    parse(chunk({}, "stop"), "[DONE]", parser=parser)
    assert parser.done


def test_parallel_tool_call_fragments_are_assembled_per_index() -> None:
    events = parse(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "function": {"name": "stat_file", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "function": {"name": "now", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th":"é"}'}}]}),
        chunk({}, "tool_calls"),
        "[DONE]",
    )
    assert events == [
        ModelToolCall(ToolCall("call_a", "stat_file", {"path": "é"})),
        ModelToolCall(ToolCall("call_b", "now", {})),
        ModelFinish("tool_calls", Usage()),
    ]


def ollama_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call as Ollama streams it: whole, at index 0, in a chunk of its own."""
    return {
        "id": call_id,
        "index": 0,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def test_calls_sharing_index_0_with_distinct_ids_are_separate_calls() -> None:
    """Catches: Ollama's calls, each whole at index 0 with an id of its own, were merged into
    one call (the second's name dropped, its arguments glued onto the first's)."""
    events = parse(
        chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [ollama_call("call_a", "stat_file", '{"path":"a"}')],
            }
        ),
        chunk(
            {"role": "assistant", "content": "", "tool_calls": [ollama_call("call_b", "now", "{}")]}
        ),
        chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [ollama_call("call_c", "stat_file", '{"path":"c"}')],
            }
        ),
        chunk({"role": "assistant", "content": ""}, "tool_calls"),
        "[DONE]",
    )
    assert events == [
        ModelToolCall(ToolCall("call_a", "stat_file", {"path": "a"})),
        ModelToolCall(ToolCall("call_b", "now", {})),
        ModelToolCall(ToolCall("call_c", "stat_file", {"path": "c"})),
        ModelFinish("tool_calls", Usage()),
    ]


def test_two_calls_at_index_0_in_one_delta_are_separate_calls() -> None:
    """Catches: two whole calls at the same index in one delta's tool_calls were merged."""
    events = parse(
        chunk(
            {
                "tool_calls": [
                    ollama_call("call_a", "f", '{"n":1}'),
                    ollama_call("call_b", "g", '{"n":2}'),
                ]
            }
        ),
        chunk({}, "tool_calls"),
    )
    assert events == [
        ModelToolCall(ToolCall("call_a", "f", {"n": 1})),
        ModelToolCall(ToolCall("call_b", "g", {"n": 2})),
    ]


@pytest.mark.parametrize("index", [0, None])
def test_calls_sharing_one_id_and_index_are_read_as_one_call_as_documented(
    index: int | None,
) -> None:
    """Pins what docs/providers.md says of calls sharing one id at one index (or with no
    index), where it claimed each got an id of its own. Catches: a change that splits them
    (a repeated id on every fragment of one call, or a closing fragment repeating the whole
    call, would then run the tool twice) or drops the second call's arguments silently."""
    fragments = [ollama_call("call_0", "f", '{"n":1}'), ollama_call("call_0", "g", '{"n":2}')]
    if index is None:
        fragments = [{k: v for k, v in fragment.items() if k != "index"} for fragment in fragments]
    events = parse(*(chunk({"tool_calls": [f]}) for f in fragments), chunk({}, "tool_calls"))
    assert len(events) == 1
    call = events[0].call  # type: ignore[attr-defined]
    assert (call.id, call.name, call.arguments) == ("call_0", "f", {})
    assert call.meta["invalid_arguments"]["raw"] == '{"n":1}{"n":2}'


def test_calls_keep_the_order_the_server_began_them_in_across_reused_indices() -> None:
    """Catches: calls sorted by index put a later call at index 0 before an earlier one at
    index 1 (Ollama numbers the calls within each chunk, starting again at 0)."""
    first = [ollama_call("call_a", "f", "{}"), {**ollama_call("call_b", "g", "{}"), "index": 1}]
    events = parse(
        chunk({"tool_calls": first}),
        chunk({"tool_calls": [ollama_call("call_c", "h", "{}")]}),
        chunk({}, "tool_calls"),
    )
    assert [event.call.id for event in events] == ["call_a", "call_b", "call_c"]  # type: ignore[attr-defined]


CALLS = st.lists(
    st.tuples(
        st.text("abcdefghij_", min_size=1, max_size=8),
        st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=6), max_size=3),
    ),
    min_size=1,
    max_size=4,
)


@given(calls=CALLS, data=st.data())
def test_how_arguments_are_split_over_deltas_does_not_change_the_calls(
    calls: list[tuple[str, dict[str, Any]]], data: st.DataObject
) -> None:
    """Law: OpenAI's way (id and name first, the arguments spread over any number of deltas
    at the call's index) and Ollama's way (each call whole at index 0) give the same calls.
    Catches: Ollama's calls at one index merged into one."""
    expected = [
        ModelToolCall(ToolCall(f"call_{n}", name, arguments))
        for n, (name, arguments) in enumerate(calls)
    ]
    openai: list[str] = []
    ollama: list[str] = []
    for n, (name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        cuts = sorted(data.draw(st.sets(st.integers(1, max(len(text) - 1, 1)), max_size=6)))
        pieces = [text[start:end] for start, end in itertools.pairwise([0, *cuts, len(text)])]
        first = {"index": n, "id": f"call_{n}", "type": "function"}
        openai.append(
            chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]})
        )
        openai += [
            chunk({"tool_calls": [{"index": n, "function": {"arguments": piece}}]})
            for piece in pieces
        ]
        ollama.append(chunk({"tool_calls": [ollama_call(f"call_{n}", name, text)]}))
    finish = [chunk({}, "tool_calls"), "[DONE]"]
    expected.append(ModelFinish("tool_calls", Usage()))
    assert parse(*openai, *finish) == expected
    assert parse(*ollama, *finish) == expected


def test_tool_calls_are_emitted_at_the_finish_reason_before_usage_arrives() -> None:
    parser = OpenAIStreamParser()
    first = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}
    events = parse(chunk({"tool_calls": [first]}), chunk({}, "tool_calls"), parser=parser)
    assert events == [ModelToolCall(ToolCall("c", "f", {}))]


def test_a_whole_call_in_one_chunk_with_repeated_id_and_name_is_not_duplicated() -> None:
    whole = {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}
    again = {"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}
    events = parse(chunk({"tool_calls": [whole]}), chunk({"tool_calls": [again]}), "[DONE]")
    assert events[0] == ModelToolCall(ToolCall("c", "f", {"a": 1}))


def test_a_call_without_an_id_gets_one() -> None:
    fragment = {"index": 3, "function": {"name": "f", "arguments": ""}}
    events = parse(chunk({"tool_calls": [fragment]}), chunk({}, "tool_calls"))
    assert events[0].call.id.startswith("call_")  # type: ignore[attr-defined]


def test_unknown_tool_call_fields_are_kept_in_meta_for_echoing() -> None:
    fragment = {
        "index": 0,
        "id": "c",
        "function": {"name": "f", "arguments": ""},
        "extra_content": {"google": {"thought_signature": "sig"}},
    }
    events = parse(chunk({"tool_calls": [fragment]}), chunk({}, "tool_calls"))
    assert events[0].call.meta == {  # type: ignore[attr-defined]
        "openai": {"extra_content": {"google": {"thought_signature": "sig"}}}
    }


def test_arguments_that_are_not_json_are_kept_raw_in_meta() -> None:
    fragment = {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"path": "REA'}}
    call = parse(chunk({"tool_calls": [fragment]}), chunk({}, "length"))[0].call  # type: ignore[attr-defined]
    assert (call.arguments, call.meta["invalid_arguments"]["raw"]) == ({}, '{"path": "REA')


def test_a_mid_stream_error_keeps_the_providers_type_and_message() -> None:
    error = {"error": {"message": "The server had an error", "type": "server_error"}}
    with pytest.raises(ProviderProtocolError, match="server_error: The server had an error"):
        parse(chunk({"content": "a"}), json.dumps(error))


def test_finish_reason_error_is_a_protocol_error() -> None:
    with pytest.raises(ProviderProtocolError, match="mid-stream"):
        parse(chunk({"content": ""}, "error"))


def test_malformed_json_is_a_protocol_error_quoting_the_data() -> None:
    with pytest.raises(ProviderProtocolError, match="not valid JSON"):
        parse('{"choices": [')


def test_the_end_of_the_body_before_done_is_a_truncation() -> None:
    parser = OpenAIStreamParser()
    parse(chunk({"content": "a"}), parser=parser)
    with pytest.raises(ProviderProtocolError, match=r"before \[DONE\]"):
        parser.end()


def test_done_with_nothing_before_it_is_a_protocol_error() -> None:
    with pytest.raises(ProviderProtocolError, match="empty completion"):
        parse("[DONE]")


# --- Over a real socket ---------------------------------------------------------------------


def provider(server: ProtocolServer, **changes: Any) -> OpenAIChat:
    return OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY, **changes)


def test_the_key_is_not_in_the_repr() -> None:
    model = OpenAIChat("gpt-test", api_key=KEY)
    assert KEY not in repr(model)
    assert KEY not in str(model)


async def test_the_request_goes_to_chat_completions_with_a_bearer_key(
    server: ProtocolServer,
) -> None:
    server.script(wire.stream(wire.openai_text(["ok"])))
    await collect(provider(server))
    sent = server.requests[0]
    assert (sent.method, sent.path, sent.headers["authorization"]) == (
        "POST",
        "/v1/chat/completions",
        f"Bearer {KEY}",
    )


async def test_without_a_key_no_authorization_header_is_sent(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.script(wire.stream(wire.openai_text(["ok"])))
    await collect(OpenAIChat("m", base_url=f"{server.url}/v1"))
    assert "authorization" not in server.requests[0].headers


async def test_an_empty_api_key_sends_no_key_not_the_environments(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: api_key="" (no key, for a local server) treated as no api_key at all, so the
    OpenAI key in the environment was sent to whatever server base_url named."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.script(wire.stream(wire.openai_text(["ok"])))
    await collect(OpenAIChat("m", base_url=f"{server.url}/v1", api_key=""))
    assert "authorization" not in server.requests[0].headers


async def test_the_key_defaults_to_the_environment(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    server.script(wire.stream(wire.openai_text(["ok"])))
    await collect(OpenAIChat("m", base_url=f"{server.url}/v1"))
    assert server.requests[0].headers["authorization"] == "Bearer from-env"


async def test_a_text_turn_runs_through_the_pipeline(server: ProtocolServer) -> None:
    server.script(wire.stream(wire.openai_text(["Hello", ", world"], usage=(9, 3))))
    result = await Pipeline(model=provider(server), system="Be terse.").run(Turn.start("hi"))
    assert result.reply is not None
    assert (result.reply.text, result.reply.usage) == ("Hello, world", Usage(9, 3))
    assert server.requests[0].body["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
    ]


async def test_a_tool_round_trip(server: ProtocolServer) -> None:
    server.script(
        wire.stream(
            wire.openai_tool_calls(
                [
                    ("call_a", "stat_file", ['{"pa', 'th": "READ', 'ME.md"}']),
                    ("call_b", "stat_file", ['{"path"', ': "setup.py"}']),
                ]
            )
        ),
        wire.stream(wire.openai_text(["README.md is 5 KB."])),
    )
    model = provider(server)
    question = Message.user("How big are README.md and setup.py?")
    first = await collect(model, ModelRequest((question,), (SPEC,)))
    calls = [event.call for event in first if isinstance(event, ModelToolCall)]
    assert calls == [
        ToolCall("call_a", "stat_file", {"path": "README.md"}),
        ToolCall("call_b", "stat_file", {"path": "setup.py"}),
    ]
    follow_up = (
        question,
        Message.assistant(calls),
        Message.tool(ToolResult("call_a", "5120")),
        Message.tool(ToolResult("call_b", "no such file", is_error=True)),
    )
    second = await collect(model, ModelRequest(follow_up, (SPEC,)))
    assert server.requests[1].body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "5120"},
        {"role": "tool", "tool_call_id": "call_b", "content": "no such file"},
    ]
    assert second[0] == ModelText("README.md is 5 KB.")


async def test_ollama_calls_at_one_index_arrive_as_separate_calls_over_the_socket(
    server: ProtocolServer,
) -> None:
    """Catches: Ollama's tool calls, each whole at index 0 with its own id, were merged into
    one call with both calls' arguments glued together."""
    server.script(
        wire.stream(
            wire.ollama_tool_calls(
                [
                    ("call_a", "stat_file", '{"path":"README.md"}'),
                    ("call_b", "stat_file", '{"path":"setup.py"}'),
                ]
            )
        )
    )
    events = await collect(provider(server), ModelRequest((Message.user("sizes?"),), (SPEC,)))
    assert events == [
        ModelToolCall(ToolCall("call_a", "stat_file", {"path": "README.md"})),
        ModelToolCall(ToolCall("call_b", "stat_file", {"path": "setup.py"})),
        ModelFinish("tool_calls", Usage(60, 15)),
    ]


def test_a_refusal_is_text_the_reply_carries() -> None:
    events = parse(chunk({"refusal": "I can't help with that."}), chunk({}, "stop"), "[DONE]")
    assert events[0] == ModelText("I can't help with that.")
    assert isinstance(events[-1], ModelFinish)


def test_content_sent_as_a_list_of_parts_is_its_text_parts() -> None:
    """Catches: a ``delta.content`` sent as a list of parts (Mistral's thinking models:
    ``thinking`` parts, then ``text`` parts) ignored, the turn completing with an empty
    answer that looked like success."""
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "Hmm, refunds."}]}
    events = parse(
        chunk({"content": [thinking]}),
        chunk({"content": [{"type": "text", "text": "Refunds take "}]}),
        chunk({"content": [{"type": "text", "text": "14 days."}, {"type": "image_url"}]}),
        chunk({}, "stop"),
        "[DONE]",
    )
    assert [e.text for e in events if isinstance(e, ModelText)] == ["Refunds take ", "14 days."]
    assert isinstance(events[-1], ModelFinish)


def test_a_token_count_that_is_not_a_number_is_a_protocol_error_over_the_socket() -> None:
    # Fed to the parser alone it is a Python error; the stream turns it into a protocol
    # error (see test_http); here: the parser does not guess a number.
    with pytest.raises(TypeError):
        parse(chunk(None, usage={"prompt_tokens": {"n": 1}, "completion_tokens": 1}))


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "Let me think."},
        {"reasoning": "Let me think."},
        {"reasoning": "Let me think.", "reasoning_details": [{"type": "reasoning.text"}]},
    ],
    ids=["reasoning_content", "reasoning", "reasoning_details"],
)
def test_reasoning_beside_the_answer_is_not_its_text(delta: dict[str, Any]) -> None:
    """Bug caught (guard of the reading above): a server's reasoning field (vLLM, DeepSeek,
    Ollama, OpenRouter) shown as the answer's text, and sent back in the next request."""
    url = {"url": "https://a.example", "title": "A", "start_index": 0, "end_index": 3}
    events = parse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": None, **delta}),
        chunk({"content": "Yes.", "annotations": [{"type": "url_citation", "url_citation": url}]}),
        chunk({}, "stop"),
        "[DONE]",
    )
    assert events == [ModelText("Yes."), ModelFinish("stop", Usage())]
