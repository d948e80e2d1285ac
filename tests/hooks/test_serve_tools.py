"""`turnplug serve` continuing a turn from the results of tool calls the client ran: the
official OpenAI SDK as the client, a real OpenAI-protocol upstream on loopback
(tests/providers/server.py), the pipeline's hooks, guardrails and transformers in between."""

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from hooks import deny, redact
from pipeline import Pipeline, cont, hook
from pipeline.logs import SQLiteLog
from pipeline.providers import OpenAIChat
from tests.providers.server import openai_text, openai_tool_calls, running, stream
from turns import Turn

from .serve_support import openai_error, served, user

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def calls_weather() -> Any:
    return stream(openai_tool_calls([("call_1", "get_weather", ['{"city":', '"Oslo"}'])]))


def upstream_model(url: str) -> OpenAIChat:
    return OpenAIChat("up", base_url=url + "/v1", api_key="sk-up", max_retries=0)


def pipeline(url: str, seen: list[tuple[str, str]]) -> Pipeline:
    """A pipeline whose pre hook records what each turn starts from, whose transformer
    redacts a secret word and whose guardrail rejects "hail"."""

    def record(turn: Turn) -> Any:
        seen.append((turn.user_message.role, turn.user_message.text))
        return cont(turn.inject("Answer briefly."))

    return Pipeline(
        model=upstream_model(url),
        pre=[hook(record, name="record")],
        transformers=[redact(["Oslo"], replacement="[CITY]")],
        post=[deny("(?i)hail", feedback="No hail forecasts.")],
    )


def continuation(first: dict[str, Any], result: str = "sunny, 21 C") -> list[dict[str, Any]]:
    """The conversation a client sends back: its question, the gateway's tool calls, and
    one tool message per call."""
    return [
        *user("weather in Oslo?"),
        first,
        *(
            {"role": "tool", "tool_call_id": call["id"], "content": result}
            for call in first["tool_calls"]
        ),
    ]


async def test_tool_results_continue_the_turn_through_the_pipeline() -> None:
    """Catches: a request ending with tool results refused (400) or answered without them;
    the continuation's reply skipping the post guardrail (rejected text returned) or the
    transformer (unredacted text); the pre hooks not run on the continuation."""
    seen: list[tuple[str, str]] = []
    async with running(
        calls_weather(),
        stream(openai_text(["Hail ", "in Oslo"])),
        stream(openai_text(["Sunny ", "in Oslo", "."])),
    ) as upstream:
        async with served(pipeline(upstream.url, seen)) as gw:
            sdk = gw.sdk()
            first = await sdk.chat.completions.create(
                model="m", messages=user("weather in Oslo?"), tools=[WEATHER]
            )
            assert first.choices[0].finish_reason == "tool_calls"
            assistant = first.choices[0].message.model_dump(exclude_none=True)
            final = await sdk.chat.completions.create(
                model="m", messages=continuation(assistant), tools=[WEATHER]
            )
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "Sunny in [CITY]."
    # The continuation's first attempt was rejected; the model was asked again.
    asked = [r.body["messages"] for r in upstream.requests]
    assert len(asked) == 3
    assert [(m["role"], m.get("tool_call_id")) for m in asked[1]] == [
        ("user", None),
        ("assistant", None),
        ("tool", "call_1"),
        ("user", None),
    ]
    assert asked[1][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(asked[1][1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert asked[1][2]["content"] == "sunny, 21 C"
    assert asked[1][3]["content"] == "Answer briefly."
    assert asked[2][-1]["content"] == "No hail forecasts."
    assert seen == [("user", "weather in Oslo?"), ("tool", "")]


async def test_a_streamed_continuation_arrives_as_chunks() -> None:
    """Catches: a streamed continuation refused, or streaming text an attempt the guardrail
    rejected, or unredacted text."""
    seen: list[tuple[str, str]] = []
    async with running(
        calls_weather(),
        stream(openai_text(["Hail ", "in Oslo"])),
        stream(openai_text(["Sunny ", "in Oslo", "."])),
    ) as upstream:
        async with served(pipeline(upstream.url, seen)) as gw:
            chunks = await gw.sdk_stream(model="m", messages=user("weather?"), tools=[WEATHER])
            [delta] = [
                d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])
            ]
            assert delta.function is not None
            assistant = {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": delta.id,
                        "type": "function",
                        "function": {
                            "name": delta.function.name,
                            "arguments": delta.function.arguments,
                        },
                    }
                ],
            }
            final = await gw.sdk_stream(
                model="m",
                messages=continuation(assistant),
                tools=[WEATHER],
                stream_options={"include_usage": True},
            )
    text = "".join(c.choices[0].delta.content or "" for c in final if c.choices)
    assert text == "Sunny in [CITY]."
    assert [c.choices[0].finish_reason for c in final if c.choices][-1] == "stop"
    assert final[-1].usage is not None
    assert "Hail" not in repr(final)
    assert upstream.requests[1].body["messages"][2] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "sunny, 21 C",
    }


async def test_a_continuation_may_call_tools_again_and_answers_every_call() -> None:
    """Catches: a continuation whose reply asks for more tools losing the calls; two tool
    messages answering two calls merged or reordered on the way upstream."""
    two = openai_tool_calls([("c1", "get_weather", ['{"city":"Oslo"}']), ("c2", "get_time", [""])])
    again = openai_tool_calls([("c3", "get_time", ["{}"])])
    async with running(stream(two), stream(again)) as upstream:
        async with served(Pipeline(model=upstream_model(upstream.url))) as gw:
            sdk = gw.sdk()
            first = await sdk.chat.completions.create(
                model="m", messages=user("weather and time?"), tools=[WEATHER, CLOCK]
            )
            assistant = first.choices[0].message.model_dump(exclude_none=True)
            messages = [
                *user("weather and time?"),
                assistant,
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
            ]
            second = await sdk.chat.completions.create(
                model="m", messages=messages, tools=[WEATHER, CLOCK]
            )
    assert second.choices[0].finish_reason == "tool_calls"
    assert [c.id for c in second.choices[0].message.tool_calls or []] == ["c3"]
    sent = upstream.requests[1].body["messages"]
    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in sent[2:]] == [
        ("tool", "c1", "sunny"),
        ("tool", "c2", "12:00"),
    ]


@pytest.mark.parametrize("streamed", [False, True])
async def test_undecodable_arguments_reach_the_client_as_the_model_wrote_them(
    streamed: bool,
) -> None:
    """Catches: a client tool call whose arguments the model wrote as broken JSON returned
    as ``"{}"``, so the client ran the tool with no arguments instead of seeing the model's
    mistake; and the client's echo of that text in its continuation refused with a 400."""
    broken = '{"city": "Os'
    cut = stream(openai_tool_calls([("call_1", "get_weather", [broken])]))
    async with running(cut, stream(openai_text(["Which city?"]))) as upstream:
        async with served(Pipeline(model=upstream_model(upstream.url))) as gw:
            sdk = gw.sdk()
            if streamed:
                chunks = await gw.sdk_stream(model="m", messages=user("weather?"), tools=[WEATHER])
                [delta] = [
                    d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []
                ]
                assert delta.function is not None
                arguments = delta.function.arguments
                assistant = {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": delta.id,
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": arguments},
                        }
                    ],
                }
            else:
                first = await sdk.chat.completions.create(
                    model="m", messages=user("weather?"), tools=[WEATHER]
                )
                [call] = first.choices[0].message.tool_calls or []
                arguments = call.function.arguments  # type: ignore[union-attr]
                assistant = first.choices[0].message.model_dump(exclude_none=True)
            second = await sdk.chat.completions.create(
                model="m",
                messages=continuation(assistant, "error: arguments are not JSON"),
                tools=[WEATHER],
            )
    assert arguments == broken
    assert second.choices[0].message.content == "Which city?"
    sent = upstream.requests[1].body["messages"]
    # Upstream, the call goes out with valid JSON, as the providers send such a call.
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert sent[2]["content"] == "error: arguments are not JSON"


ASKED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ],
}


# Two calls under one id (a client's bug): no tool message could say which it answers, and
# an upstream refuses them (Anthropic: tool_use ids must be unique).
TWICE = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ],
}


@pytest.mark.parametrize(
    ("messages", "param", "says"),
    [
        (
            [
                *user("q"),
                ASKED,
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "tool", "tool_call_id": "nope", "content": "y"},
            ],
            "messages[3].tool_call_id",
            "'nope', which matches no tool call",
        ),
        (
            [*user("q"), ASKED, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
            "messages",
            "c2 (get_time)",
        ),
        (
            [
                *user("q"),
                ASKED,
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
            ],
            "messages[3].tool_call_id",
            "answered twice",
        ),
        (
            [*user("q"), {"role": "tool", "tool_call_id": "c1", "content": "x"}],
            "messages[1].role",
            "not an assistant message with tool calls",
        ),
        (
            [{"role": "tool", "tool_call_id": "c1", "content": "x"}],
            "messages[0].role",
            "not an assistant message with tool calls",
        ),
        (
            [*user("q"), TWICE, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
            "messages[1].tool_calls[1].id",
            "'c1', the id of an earlier call of the same message",
        ),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_malformed_continuation_is_400_naming_the_message(
    messages: list[dict[str, Any]], param: str, says: str, streamed: bool
) -> None:
    """Catches: tool results that answer no call (or leave one unanswered, or answer two
    calls sharing one id) sent upstream, where the provider would refuse them (a 502), or
    answered 500."""
    async with running() as upstream:
        async with served(Pipeline(model=upstream_model(upstream.url))) as gw:
            request = {"model": "m", "messages": messages, "tools": [WEATHER, CLOCK]}
            send = gw.sdk_stream if streamed else gw.sdk().chat.completions.create
            with pytest.raises(openai.BadRequestError) as caught:
                await send(**request)
            async with gw.http() as client:
                raw = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": messages, "stream": streamed},
                )
    assert caught.value.status_code == 400
    error = openai_error(raw.content)
    assert raw.status_code == 400
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert says in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("messages", "param", "says"),
    [
        ([*user("q"), ASKED, *user("never mind")], "messages[2].role", "c1 (get_weather)"),
        (
            [
                {"role": "system", "content": "Be brief."},
                *user("q"),
                ASKED,
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "assistant", "content": "It is x."},
                *user("and?"),
            ],
            "messages[4].role",
            "['c2 (get_time)'] of 'messages[2]'",
        ),
        (
            [
                *user("q"),
                {"role": "tool", "tool_call_id": "c9", "content": "x"},
                {"role": "assistant", "content": "ok"},
                *user("and?"),
            ],
            "messages[1].tool_call_id",
            "'c9', which answers no tool call",
        ),
        (
            [
                *user("q"),
                TWICE,
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "assistant", "content": "ok"},
                *user("and?"),
            ],
            "messages[1].tool_calls[1].id",
            "'c1', the id of an earlier call of the same message",
        ),
    ],
)
async def test_tool_calls_unanswered_in_the_history_are_400_naming_the_message(
    messages: list[dict[str, Any]], param: str, says: str
) -> None:
    """Catches: a history whose tool calls have no tool messages after them (or a tool
    message answering no call, or two calls under one id) sent upstream, which refuses it:
    the client got a 502 "upstream failed", which the SDK retries, instead of a 400 naming
    the message."""
    async with running(stream(openai_text(["never"]))) as upstream:
        async with served(Pipeline(model=upstream_model(upstream.url))) as gw:
            with pytest.raises(openai.BadRequestError) as caught:
                await gw.sdk().chat.completions.create(
                    model="m", messages=messages, tools=[WEATHER, CLOCK]
                )
    error = openai_error(caught.value.response.content)
    assert error["param"] == param
    assert says in error["message"]
    assert upstream.requests == []


async def test_a_history_with_answered_tool_calls_reaches_the_upstream() -> None:
    """Catches: a history check that refuses the SDK's ordinary tool loop, earlier turns'
    calls and results followed by a new question."""
    history = [
        *user("q"),
        ASKED,
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
        {"role": "tool", "tool_call_id": "c2", "content": "y"},
        {"role": "assistant", "content": "x and y"},
        *user("thanks"),
    ]
    async with running(stream(openai_text(["You're welcome."]))) as upstream:
        async with served(Pipeline(model=upstream_model(upstream.url))) as gw:
            reply = await gw.sdk().chat.completions.create(
                model="m", messages=history, tools=[WEATHER, CLOCK]
            )
    assert reply.choices[0].message.content == "You're welcome."
    sent = upstream.requests[0].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "assistant", "user"]


async def test_a_new_message_on_a_conversation_awaiting_tool_results_is_400(
    tmp_path: Path,
) -> None:
    """Catches: a conversation whose log ends with tool calls returned to the client taking
    a new user message: the upstream refuses the history, so the turn was a 502 (retried
    by the SDK) and every later message of the conversation failed the same way."""
    async with running(calls_weather(), stream(openai_text(["never"]))) as upstream:
        async with (
            SQLiteLog(tmp_path / "log.db") as log,
            served(Pipeline(model=upstream_model(upstream.url)), log=log) as gw,
        ):
            sdk = gw.sdk()
            headers = {"X-Conversation-Id": "c"}
            await sdk.chat.completions.create(
                model="m", messages=user("weather?"), tools=[WEATHER], extra_headers=headers
            )
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.chat.completions.create(
                    model="m", messages=user("never mind"), tools=[WEATHER], extra_headers=headers
                )
            stored = await log.load("c")
    error = openai_error(caught.value.response.content)
    assert error["param"] == "messages"
    assert "call_1" in error["message"]
    assert len(upstream.requests) == 1
    assert [m.role for m in stored.messages] == ["user", "assistant"]


async def test_a_conversation_turn_ignores_a_cut_history_the_request_carries(
    tmp_path: Path,
) -> None:
    """Catches: a conversation's request refused for the history it carries, which the turn
    ignores (the log is the history): a client keeping a sliding window that begins with a
    tool message, whose call was cut off, got a 400 where it got its answer before."""
    async with running(
        calls_weather(), stream(openai_text(["Sunny."])), stream(openai_text(["Third."]))
    ) as upstream:
        async with (
            SQLiteLog(tmp_path / "log.db") as log,
            served(Pipeline(model=upstream_model(upstream.url)), log=log) as gw,
        ):
            sdk = gw.sdk()
            headers = {"X-Conversation-Id": "c"}
            first = await sdk.chat.completions.create(
                model="m", messages=user("weather?"), tools=[WEATHER], extra_headers=headers
            )
            assistant = first.choices[0].message.model_dump(exclude_none=True)
            answered = continuation(assistant, "sunny")
            await sdk.chat.completions.create(
                model="m", messages=answered, tools=[WEATHER], extra_headers=headers
            )
            window = [answered[-1], {"role": "assistant", "content": "Sunny."}, *user("three")]
            third = await sdk.chat.completions.create(
                model="m", messages=window, tools=[WEATHER], extra_headers=headers
            )
            stored = await log.load("c")
    assert third.choices[0].message.content == "Third."
    assert [m.role for m in stored.messages][-2:] == ["user", "assistant"]


async def test_a_conversation_commits_the_tool_results_and_the_answer(tmp_path: Path) -> None:
    """Catches: a conversation continuation checked against the request instead of the log,
    or committing nothing (or the results twice)."""
    seen: list[tuple[str, str]] = []
    async with running(
        calls_weather(), stream(openai_text(["Sunny."])), stream(openai_text(["Bye."]))
    ) as upstream:
        async with (
            SQLiteLog(tmp_path / "log.db") as log,
            served(pipeline(upstream.url, seen), log=log) as gw,
        ):
            sdk = gw.sdk()
            headers = {"X-Conversation-Id": "c"}
            first = await sdk.chat.completions.create(
                model="m", messages=user("weather?"), tools=[WEATHER], extra_headers=headers
            )
            assistant = first.choices[0].message.model_dump(exclude_none=True)
            wrong = [*continuation(assistant)]
            wrong[-1] = {**wrong[-1], "tool_call_id": "call_9"}
            async with gw.http() as client:
                refused = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": wrong, "tools": [WEATHER]},
                    headers=headers,
                )
            await sdk.chat.completions.create(
                model="m",
                messages=continuation(assistant, "sunny"),
                tools=[WEATHER],
                extra_headers=headers,
            )
            await sdk.chat.completions.create(
                model="m", messages=user("thanks"), extra_headers=headers
            )
            stored = await log.load("c")
    assert refused.status_code == 400
    assert openai_error(refused.content)["param"] == "messages[2].tool_call_id"
    assert [(m.role, m.text) for m in stored.messages] == [
        ("user", "weather?"),
        ("assistant", ""),
        ("tool", ""),
        ("assistant", "Sunny."),
        ("user", "thanks"),
        ("assistant", "Bye."),
    ]
    assert stored.messages[2].parts[0].content == "sunny"  # type: ignore[union-attr]
    assert [m["role"] for m in upstream.requests[2].body["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
