"""`turnplug serve`'s gateway, in process: served for real on loopback, spoken to with the
official OpenAI SDK and, for malformed requests, raw httpx."""

import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
import openai
import pytest

from hooks import deny, pii, running_summary, scrub_input
from hooks.cli._serve import log_to_stderr
from pipeline import Pipeline, block, cont, halt, hook, tool
from pipeline.logs import SQLiteLog
from pipeline.providers import OpenAIChat
from pipeline.testing import FunctionModel, ScriptedModel
from tests.logs import Rendezvous
from tests.pipeline.mcp.servers import faulty_toolset
from tests.providers.server import json_error, openai_text, running, stream
from turns import Context, Message, Text, ToolCall, Turn

from .serve_support import KEY, MODEL, openai_error, served, sse_data, user, watch_feed


def texts(replies: list[Any]) -> Pipeline:
    return Pipeline(model=ScriptedModel(replies))


# -- the happy paths, as the SDK sees them ---------------------------------------------------


async def test_a_turn_answers_as_a_chat_completion() -> None:
    """Catches: a response the SDK cannot parse, or one missing finish_reason or usage."""
    async with served(texts([["Hel", "lo!"]])) as gw:
        reply = await gw.sdk().chat.completions.create(model="any", messages=user("hi"))
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    assert reply.choices[0].message.content == "Hello!"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_a_streamed_turn_arrives_in_chunks_and_ends_with_done() -> None:
    """Catches: a stream without [DONE], without its finish chunk, or with its usage lost."""
    async with served(texts([["Hel", "lo", "!"], "again"])) as gw:
        chunks = await gw.sdk_stream(
            model="any", messages=user("hi"), stream_options={"include_usage": True}
        )
        async with gw.http() as client:
            raw = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("hi"), "stream": True},
            )
    content = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert content == ["Hel", "lo", "!"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert len({c.id for c in chunks}) == 1
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert sse_data(raw.text)[-1] == "[DONE]"


async def test_the_request_history_and_system_reach_the_model() -> None:
    """Catches: a stateless request whose earlier messages or system prompt are dropped."""
    model = ScriptedModel(["ok"])
    async with served(Pipeline(model=model)) as gw:
        await gw.sdk().chat.completions.create(
            model="m",
            messages=[
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": [{"type": "text", "text": "two"}]},
            ],
            temperature=0.5,
            max_tokens=40,
        )
    request = model.requests[0]
    assert [(m.role, m.text) for m in request.messages] == [
        ("system", "Be terse."),
        ("user", "one"),
        ("assistant", "first answer"),
        ("user", "two"),
    ]
    assert (request.options.temperature, request.options.max_tokens) == (0.5, 40)


async def test_client_tool_calls_come_back_as_the_sdk_expects() -> None:
    """Catches: tool calls lost, or returned with object arguments instead of a JSON string."""
    call = ToolCall("call_1", "get_weather", {"city": "Oslo"})
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    model = ScriptedModel([[call], [call]])
    async with served(Pipeline(model=model)) as gw:
        sdk = gw.sdk()
        reply = await sdk.chat.completions.create(
            model="m", messages=user("weather?"), tools=[weather]
        )
        chunks = await gw.sdk_stream(model="m", messages=user("weather?"), tools=[weather])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [got] = choice.message.tool_calls
    assert (got.id, got.type, got.function.name) == ("call_1", "function", "get_weather")
    assert json.loads(got.function.arguments) == {"city": "Oslo"}
    assert [t.name for t in model.requests[0].tools] == ["get_weather"]
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.id, d.function.name) for d in deltas] == [(0, "call_1", "get_weather")]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize("held", [False, True])
async def test_text_around_the_pipelines_tool_calls_is_in_both_answers(held: bool) -> None:
    """Catches: a pipeline running its own tools answering a stream with the text the model
    wrote before a tool call ("Let me check. ") and a whole answer without it: the whole
    answer holds everything the stream would have sent, as the API's does."""

    def get_weather(city: str) -> str:
        return f"sunny in {city}"

    model = ScriptedModel(
        [["Let me check. ", ToolCall("c1", "get_weather", {"city": "Oslo"})], "It is sunny."] * 2
    )
    # A guardrail that passes makes the gateway hold the text until it is accepted.
    post = [deny("FORBIDDEN", feedback="no")] if held else []
    pipe = Pipeline(model=model, tools=[tool(get_weather)], post=post)
    async with served(pipe) as gw:
        whole = await gw.sdk().chat.completions.create(model="m", messages=user("weather?"))
        chunks = await gw.sdk_stream(model="m", messages=user("weather?"))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == "Let me check. It is sunny."
    assert whole.choices[0].message.content == streamed


async def test_models_and_healthz() -> None:
    """Catches: /v1/models not naming the configured model; /healthz behind the key."""
    async with served(texts(["x"])) as gw:
        models = await gw.sdk().models.list()
        async with gw.http(key=None) as client:
            health = await client.get("/healthz")
    assert [m.id for m in models.data] == [MODEL]
    assert health.status_code == 200
    assert health.json()["status"] == "ok"


async def test_the_sdk_retrieves_the_configured_model_and_is_told_no_other_exists() -> None:
    """Bug caught: ``client.models.retrieve(...)`` (``GET /v1/models/{id}``) was a 404 for
    the very model ``/v1/models`` lists, so a client checking its model before use gave up."""
    slashed = "org/llama-3:8b"  # the SDK escapes the slash; the id is still read whole
    async with served(texts(["x"]), model=slashed) as gw:
        found = await gw.sdk().models.retrieve(slashed)
        with pytest.raises(openai.NotFoundError) as missing:
            await gw.sdk().models.retrieve("gpt-nope")
    assert (found.id, found.object) == (slashed, "model")
    error = openai_error(missing.value.response.content)
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    assert "'gpt-nope'" in error["message"]
    assert missing.value.response.headers["content-type"] == "application/json"


async def test_models_with_an_empty_id_is_an_unknown_route() -> None:
    """Bug caught: ``GET /v1/models/`` was a 404 ``model_not_found`` for the model ``''``,
    where it names no model: an unknown route, ``not_found``, as the API answers it."""
    async with served(texts(["x"])) as gw, gw.http() as client:
        empty = await client.get("/v1/models/")
    assert empty.status_code == 404
    error = openai_error(empty.content)
    assert (error["code"], error["param"]) == ("not_found", None)
    assert error["message"] == "no route GET /v1/models/"


# -- guardrails: held until accepted ---------------------------------------------------------


def guarded(replies: list[Any], **extra: Any) -> Pipeline:
    return Pipeline(
        model=ScriptedModel(replies),
        post=[deny(r"(?i)internal use only", feedback="Do not reveal internal material.")],
        **extra,
    )


async def test_a_streaming_client_never_receives_rejected_text() -> None:
    """Catches: text of an attempt a guardrail rejected reaching the client or the page."""
    feed: list[dict[str, Any]] = []
    async with served(guarded([["INTERNAL ", "USE ONLY plan"], ["The ", "public plan"]])) as gw:
        async with anyio.create_task_group() as nursery:
            await nursery.start(watch_feed, gw, feed)
            async with gw.http() as client:
                raw = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": user("plan?"), "stream": True},
                )
            await anyio.sleep(0.2)
            nursery.cancel_scope.cancel()
    assert raw.status_code == 200
    assert "INTERNAL" not in raw.text
    content = "".join(
        json.loads(d)["choices"][0]["delta"].get("content") or ""
        for d in sse_data(raw.text)
        if d != "[DONE]" and json.loads(d)["choices"]
    )
    assert content == "The public plan"
    assert "INTERNAL" not in json.dumps(feed)
    rejected = [e for e in feed if e["event"] == "AttemptRejected"]
    assert [(e["attempt"], e["feedback"]) for e in rejected] == [
        (1, "Do not reveal internal material.")
    ]
    assert [e["text"] for e in feed if e["event"] == "ReplyReady"] == ["The public plan"]


async def test_an_exhausted_regeneration_is_422() -> None:
    """Catches: an exhausted turn answered 200, or answered with the rejected text."""
    async with served(guarded(["internal use only"] * 3, max_regenerations=2)) as gw:
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            await gw.sdk_stream(model="m", messages=user("x"))
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "regeneration_exhausted"
    assert "internal use only" not in json.dumps(error).lower().replace("internal material", "")


async def test_an_exhausted_turns_422_names_its_attempts_and_the_last_rejecting_hook() -> None:
    """Bug caught: the 422 of a turn whose attempts were all rejected worded apart from
    ``turnplug run``'s note ("3 attempts were rejected, the last by"), a wording no test
    pinned (only "3 attempts" was checked)."""
    async with served(guarded(["internal use only"] * 3, max_regenerations=2)) as gw:
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            await gw.sdk().chat.completions.create(model="m", messages=user("x"))
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["message"], error["hook"]) == (
        "no acceptable reply: 3 attempts rejected, the last by hook 'deny':"
        " Do not reveal internal material.",
        "deny",
    )


async def test_an_exhausted_turn_of_one_attempt_is_not_called_1_attempts() -> None:
    """Bug caught: with `max_regenerations=0` the 422 said "1 attempts were rejected, the last
    by hook ..." of a turn that had one attempt."""
    async with served(guarded(["internal use only"], max_regenerations=0)) as gw:
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            await gw.sdk().chat.completions.create(model="m", messages=user("x"))
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["message"] == (
        "no acceptable reply: its one attempt was rejected by hook 'deny':"
        " Do not reveal internal material."
    )


async def test_a_halted_turn_is_422_naming_the_hook() -> None:
    """Catches: a halt answered as an empty success."""

    def gate(turn: Any) -> Any:
        return halt("account suspended")

    async with (
        served(Pipeline(model=ScriptedModel(["never"]), pre=[hook(gate, name="gate")])) as gw,
        gw.http() as client,
    ):
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": user("x")}
        )
    assert response.status_code == 422
    error = openai_error(response.content)
    assert (error["type"], error["hook"]) == ("turn_halted", "gate")
    assert "account suspended" in error["message"]


async def test_a_blocked_client_tool_call_is_403_and_not_returned() -> None:
    """Catches: the pipeline's tool policy bypassed for tools the client runs."""

    def no_deletes(call: ToolCall, turn: Any) -> Any:
        return block("deleting is not allowed") if call.name == "delete_all" else cont(call)

    pipe = Pipeline(
        model=ScriptedModel([[ToolCall("c1", "delete_all", {})]]),
        before_tool=[hook(no_deletes, name="no_deletes")],
    )
    tools = [{"type": "function", "function": {"name": "delete_all"}}]
    async with served(pipe) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": user("x"), "tools": tools}
        )
    assert response.status_code == 403
    error = openai_error(response.content)
    assert (error["type"], error["hook"], error["tool"]) == (
        "tool_blocked",
        "no_deletes",
        "delete_all",
    )
    assert "c1" not in response.text


# -- the upstream failing --------------------------------------------------------------------

UPSTREAM_KEY = "sk-upstream-9f8e7d6c5b4a"


async def test_an_upstream_error_is_502_and_never_shows_the_key() -> None:
    """Catches: the provider's error (which may quote the key) passed through to the client."""
    failure = json_error(
        401, {"error": {"message": f"Incorrect API key provided: {UPSTREAM_KEY}", "type": "x"}}
    )
    async with running(failure, failure) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        async with served(Pipeline(model=model), secrets=(UPSTREAM_KEY, KEY)) as gw:
            async with gw.http() as client:
                plain = await client.post(
                    "/v1/chat/completions", json={"model": "m", "messages": user("x")}
                )
                streamed = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": user("x"), "stream": True},
                )
                page = await client.get("/")
    for response in (plain, streamed):
        assert response.status_code == 502
        assert openai_error(response.content)["type"] == "upstream_error"
    for text in (plain.text, streamed.text, page.text):
        assert UPSTREAM_KEY not in text
        assert KEY not in text
    assert upstream.requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


async def test_the_sdk_does_not_run_again_a_turn_the_upstream_refused() -> None:
    """Catches: an upstream 4xx (a refused request, a wrong upstream key) answered as a plain
    502, which the SDK retries: the turn ran three times, each refused again."""
    refused = json_error(400, {"error": {"message": "bad request", "type": "invalid"}})
    async with running(refused, refused, refused) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        async with served(Pipeline(model=model)) as gw:
            retrying = gw.sdk(max_retries=2)
            with pytest.raises(openai.InternalServerError) as caught:
                await retrying.chat.completions.create(model="m", messages=user("x"))
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(upstream.requests) == 1


async def test_a_rate_limited_upstream_is_429_with_its_retry_after() -> None:
    """Catches: the upstream's ``retry-after`` dropped from the gateway's 429, so the SDK
    retries on its own backoff (half a second) into the same rate limit."""
    limited = json_error(
        429, {"error": {"message": "slow down", "type": "rate"}}, [("retry-after", "6.2")]
    )
    async with running(limited) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        async with served(Pipeline(model=model)) as gw:
            with pytest.raises(openai.RateLimitError) as caught:
                await gw.sdk().chat.completions.create(model="m", messages=user("x"))
    assert caught.value.response.headers["retry-after"] == "7"
    assert openai_error(caught.value.response.content)["code"] == "rate_limited"


async def test_an_upstream_stream_reaches_the_client_through_the_pipeline() -> None:
    """Catches: the gateway not speaking to a real OpenAI-protocol upstream."""
    async with running(stream(openai_text(["up", "stream"]))) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        async with served(Pipeline(model=model)) as gw:
            reply = await gw.sdk().chat.completions.create(model="m", messages=user("x"))
    assert reply.choices[0].message.content == "upstream"
    assert upstream.requests[0].body["messages"][-1]["content"] == "x"


async def test_a_turn_past_its_timeout_is_504() -> None:
    """Catches: a hung hook holding the client forever."""

    async def hangs(turn: Any) -> Any:
        await anyio.sleep_forever()

    async with served(Pipeline(model=ScriptedModel(["x"]), pre=[hangs]), turn_timeout=0.3) as gw:
        async with gw.http() as client:
            response = await client.post(
                "/v1/chat/completions", json={"model": "m", "messages": user("x")}
            )
    assert response.status_code == 504
    assert openai_error(response.content)["type"] == "turn_timeout"


# -- malformed requests, auth, size ----------------------------------------------------------


async def test_an_integer_too_long_to_read_is_400_not_500() -> None:
    """Bug caught: a request body holding an integer of more than 4300 digits (valid JSON,
    which Python refuses to convert) raised a ValueError the reader did not catch: a bare
    500 with no OpenAI-style error."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": '
    model = ScriptedModel(["never"])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions",
            content=body + b"9" * 5000 + b"}",
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == (None, "invalid_json")
    assert "holds an integer of more than" in error["message"]
    assert model.requests == []


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        # Nested 100,000 deep (under the size limit): json.loads raises RecursionError.
        (b"[" * 100_000 + b"]" * 100_000, None, "invalid_json"),
        (b'{"model": "m"}', "messages", "missing_required_parameter"),
        (b'{"model": "m", "messages": "hi"}', "messages", "invalid_type"),
        (b'{"model": "m", "messages": []}', "messages", "invalid_type"),
        (
            b'{"messages": [{"role": "user", "content": "x"}]}',
            "model",
            "missing_required_parameter",
        ),
        (
            b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}',
            "messages[0].role",
            "invalid_value",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            "temperature",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "stream",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": {}}',
            "tools",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type":'
            b' "function", "function": {"name": "get weather"}}]}',
            "tools[0].function.name",
            "invalid_value",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type":'
            b' "function", "function": {"name": "' + b"f" * 65 + b'"}}]}',
            "tools[0].function.name",
            "invalid_value",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}',
            "messages[1].role",
            "invalid_value",
        ),
    ],
)
async def test_a_malformed_request_is_400_naming_the_field(
    body: bytes, param: str | None, code: str
) -> None:
    """Catches: a malformed request answered 500, or a 400 that does not say what is wrong."""
    model = ScriptedModel([])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert model.requests == []


async def test_two_client_tools_of_one_name_are_400_naming_the_second() -> None:
    """Catches: a request declaring two tools under one name passed to the model, which
    could not say which it calls (and a provider refuses: Anthropic's tool names must be
    unique), instead of a 400 naming the repeated name."""
    weather = {"type": "function", "function": {"name": "get_weather"}}
    model = ScriptedModel([])
    async with served(Pipeline(model=model)) as gw:
        with pytest.raises(openai.BadRequestError) as caught:
            await gw.sdk().chat.completions.create(
                model="m", messages=user("q"), tools=[weather, weather]
            )
    error = openai_error(caught.value.response.content)
    assert (error["param"], error["code"]) == ("tools[1].function.name", "invalid_value")
    assert "'get_weather', the name of an earlier tool" in error["message"]
    assert model.requests == []


async def test_tool_call_arguments_nested_too_deep_are_read_as_undecodable() -> None:
    """Catches: the deepest undecodable arguments in the history (nested 100,000 deep:
    json.loads raises RecursionError, not a decode error) escaping the mark that other
    broken text gets: a 500, or a 400 for a history the client only echoed."""
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}, {"role":'
        b' "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",'
        b' "function": {"name": "f", "arguments": "'
        + b"[" * 100_000
        + b"]" * 100_000
        + b'"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "bad"}]}'
    )
    model = ScriptedModel(["ok"])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 200
    [call] = model.requests[0].messages[1].parts
    assert isinstance(call, ToolCall)
    assert call.arguments == {}
    assert "nested too deeply" in call.meta["invalid_arguments"]["error"]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('{"x": NaN}', "not valid JSON (NaN is not a JSON value)"),
        ('{"x": Infinity}', "not valid JSON (Infinity is not a JSON value)"),
        ('{"x": [1, -Infinity]}', "not valid JSON (-Infinity is not a JSON value)"),
        (
            '{"x": {"y": 1e400}}',
            "out of range: the number 1e400 is past a float's range (about 1.8e308)",
        ),
    ],
)
async def test_tool_call_arguments_with_non_finite_numbers_are_read_as_undecodable(
    arguments: str, error: str
) -> None:
    """Bug caught: a client's tool-call arguments read with Python's lenient JSON, so NaN,
    Infinity or 1e400 (a number JSON has but a float cannot hold) reached the model as
    numbers, where the request body refuses them and the providers mark them undecodable."""
    model = ScriptedModel(["ok"])
    history = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "bad"},
    ]
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": history}
        )
    assert response.status_code == 200, response.text
    [call] = model.requests[0].messages[1].parts
    assert isinstance(call, ToolCall)
    assert call.arguments == {}
    assert call.meta["invalid_arguments"]["raw"] == arguments
    assert call.meta["invalid_arguments"]["error"] == f"{error}: {arguments!r}"


@pytest.mark.parametrize(
    ("field", "param"),
    [
        ({"tool_calls": 5}, "messages[1].tool_calls"),
        ({"tool_calls": True}, "messages[1].tool_calls"),
        ({"tool_calls": {"id": "c1"}}, "messages[1].tool_calls"),
        ({"n": True}, "n"),
        ({"n": "2"}, "n"),
    ],
)
async def test_a_field_of_the_wrong_json_type_is_400_naming_it(
    field: dict[str, Any], param: str
) -> None:
    """Catches: a field of the wrong JSON type reaching a Python operation (``tool_calls: 5``
    iterated) and answered with a plain-text 500, or silently taken (``n: true`` as 1)."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, **({} if "n" in field else field)},
        {"role": "user", "content": "x"},
    ]
    body = {"model": "m", "messages": messages, **(field if "n" in field else {})}
    model = ScriptedModel([])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == (param, "invalid_type")
    assert model.requests == []


@pytest.mark.parametrize(
    ("field", "said"),
    [
        ({"temperature": "hot"}, "'temperature' must be a number, got a string"),
        ({"max_tokens": 1.5}, "'max_tokens' must be an integer, got a number"),
        ({"stream": 1}, "'stream' must be a boolean, got a number"),
        ({"n": [1]}, "'n' must be an integer, got an array"),
    ],
)
async def test_a_field_of_the_wrong_json_type_is_named_in_jsons_words(
    field: dict[str, Any], said: str
) -> None:
    """Bug: the message named Python's types, not JSON's, to a client that wrote JSON:
    "'max_tokens' must be a int, got float", "'temperature' must be a float, got str"."""
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], **field}
    async with served(Pipeline(model=ScriptedModel([]))) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert openai_error(response.content)["message"] == said


@pytest.mark.parametrize("stream", [{}, {"stream": False}])
async def test_stream_options_without_a_stream_is_400_naming_it(stream: dict[str, Any]) -> None:
    """Bug caught: ``stream_options`` sent without ``"stream": true`` was accepted and
    ignored, where OpenAI answers a 400 naming the parameter."""
    body = {"model": "m", "messages": user("q"), "stream_options": {"include_usage": True}}
    model = ScriptedModel(["fine"])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body | stream)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["type"], error["param"]) == ("invalid_request_error", "stream_options")
    assert "only allowed when 'stream' is enabled" in error["message"]
    assert model.requests == []


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_a_refused_token_limit_names_the_field_sent(field: str) -> None:
    """Catches: ``max_completion_tokens: 0`` refused naming ``max_tokens``, a field the
    client never sent."""
    body = {"model": "m", "messages": user("x"), field: 0}
    async with served(texts([])) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == (field, "invalid_value")
    assert field in error["message"]


async def test_a_lone_surrogate_is_400_and_the_feed_goes_on() -> None:
    """Catches: valid JSON holding a lone surrogate (``"\\ud800"``) answered 502 or 500,
    and the page's feed broken for every watcher by the request's event."""
    # json.dumps escapes the lone surrogate, as a client's encoder does.
    bad = json.dumps({"model": "m", "messages": user("hi \ud800 there")})
    feed: list[dict[str, Any]] = []
    model = ScriptedModel(["fine"])
    async with served(Pipeline(model=model)) as gw, anyio.create_task_group() as nursery:
        await nursery.start(watch_feed, gw, feed)
        async with gw.http() as client:
            refused = await client.post("/v1/chat/completions", content=bad)
        reply = await gw.sdk().chat.completions.create(model="m", messages=user("and now?"))
        await anyio.sleep(0.2)
        late: list[dict[str, Any]] = []
        with anyio.move_on_after(0.5):
            await watch_feed(gw, late, task_status=anyio.TASK_STATUS_IGNORED)
        nursery.cancel_scope.cancel()
    assert refused.status_code == 400
    error = openai_error(refused.content)
    assert (error["param"], error["code"]) == ("messages[0].content", "invalid_value")
    assert model.requests[0].messages[-1].text == "and now?"
    assert reply.choices[0].message.content == "fine"
    # Both the page that watched and one that opened afterwards see the next turn whole.
    for seen in (feed, late):
        assert [e["event"] for e in seen][-2:] == ["TurnFinished", "GatewayMessage"]


@pytest.mark.parametrize(
    "body",
    [
        # A surrogate's UTF-8 form: no UTF-8, but JSON's reader of bytes takes it.
        json.dumps({"model": "m", "messages": user("hi \ud800 there")}, ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        ),
        # The same beside a valid pair's escape, which once had the body looked through.
        json.dumps({"model": "m", "messages": user("\U0001f600 hi \ud800")}, ensure_ascii=False)
        .replace("\U0001f600", "\\ud83d\\ude00")
        .encode("utf-8", "surrogatepass"),
        # The escape, in a body sent as UTF-16 (which JSON's reader of bytes detects).
        json.dumps({"model": "m", "messages": user("hi \ud800 there")}).encode("utf-16"),
    ],
    ids=["utf8-bytes", "utf8-bytes-beside-a-pair", "utf16-escape"],
)
async def test_a_lone_surrogate_not_escaped_in_utf8_is_400(body: bytes) -> None:
    """Bug caught: a lone surrogate sent as its UTF-8 form, or escaped in a UTF-16 body, was
    let through, as the lone surrogate check looked only for UTF-8 escapes."""
    model = ScriptedModel(["fine"])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", content=body)
    assert response.status_code == 400, response.text
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == ("messages[0].content", "invalid_value")
    # No escape need be in the body: the message names the bytes too.
    said = "holds a lone surrogate (an escape such as \\ud800, or its bytes in the body's"
    assert said in error["message"]
    assert model.requests == []


async def test_escaped_surrogate_pairs_reach_the_model_as_the_characters_they_are() -> None:
    """Catches: a request whose escapes are valid pairs (each emoji json.dumps writes) taken
    for one holding a lone surrogate, refused or its text changed, once `turnplug serve`
    tells a lone surrogate's escape from a pair's."""
    text = "smile \U0001f600, wave \U0001f44b, " * 200
    body = json.dumps({"model": "m", "messages": user(text)})
    assert "\\ud83d\\ude00" in body
    model = ScriptedModel(["fine"])
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", content=body)
    assert response.status_code == 200
    assert model.requests[0].messages[-1].text == text


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_holding_a_lone_surrogate_reaches_the_client_and_the_page(
    stream: bool,
) -> None:
    """Catches: a model's (or a hook's) lone surrogate failing the response with a plain-text
    500, and breaking the page's feed, where JSON can carry it escaped."""
    odd = "odd \ud800 text"
    feed: list[dict[str, Any]] = []
    async with served(texts([odd])) as gw, anyio.create_task_group() as nursery:
        await nursery.start(watch_feed, gw, feed)
        async with gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("x"), "stream": stream},
            )
        await anyio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert response.status_code == 200
    if stream:
        chunks = [json.loads(data) for data in sse_data(response.text)[:-1]]
        got = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    else:
        got = response.json()["choices"][0]["message"]["content"]
    assert got == odd
    assert [e["text"] for e in feed if e["event"] == "ReplyReady"] == [odd]
    assert feed[-1]["event"] == "GatewayMessage"


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", f"Basic {KEY}", f"Bearer {KEY}x"])
async def test_a_missing_or_wrong_key_is_401(header: str | None) -> None:
    """Catches: a gateway that serves without its key, or accepts a near miss."""
    model = ScriptedModel([])
    async with served(Pipeline(model=model)) as gw:
        headers = {"authorization": header} if header else {}
        async with httpx.AsyncClient(base_url=gw.url) as client:
            chat = await client.post(
                "/v1/chat/completions", json={"model": "m", "messages": user("x")}, headers=headers
            )
            models = await client.get("/v1/models", headers=headers)
            feed = await client.get("/v1/turnplug/events", headers=headers)
    assert [chat.status_code, models.status_code, feed.status_code] == [401, 401, 401]
    assert openai_error(chat.content)["code"] == "invalid_api_key"
    assert model.requests == []


async def test_without_a_key_the_sdk_gets_an_authentication_error() -> None:
    """Catches: a 401 the SDK does not recognise."""
    async with served(texts(["x"])) as gw:
        with pytest.raises(openai.AuthenticationError):
            await gw.sdk(key="nope").chat.completions.create(model="m", messages=user("x"))


async def test_no_auth_serves_without_a_key() -> None:
    """Catches: --no-auth still demanding a key."""
    async with served(texts(["open"]), api_key=None) as gw, gw.http(key=None) as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": user("x")}
        )
    assert response.json()["choices"][0]["message"]["content"] == "open"


async def test_a_body_over_the_limit_is_413_declared_or_streamed() -> None:
    """Catches: an oversized body read whole into memory before it is refused."""
    model = ScriptedModel([])
    big = json.dumps({"model": "m", "messages": user("x" * 5000)}).encode()

    def chunks() -> Any:
        """100 kB in 1 kB pieces, with no length declared."""
        yield big[:1000]
        for _ in range(99):
            yield b" " * 1000

    def send_chunked(url: str) -> httpx.Response:
        with httpx.Client(headers={"authorization": f"Bearer {KEY}"}) as client:
            return client.post(url + "/v1/chat/completions", content=chunks())

    async with served(Pipeline(model=model), max_body=2000) as gw, gw.http() as client:
        declared = await client.post("/v1/chat/completions", content=big)
        streamed = await anyio.to_thread.run_sync(send_chunked, gw.url)
    assert declared.status_code == 413
    assert streamed.status_code == 413
    assert openai_error(declared.content)["code"] == "request_too_large"
    assert model.requests == []


async def test_unknown_routes_and_methods_get_json_errors() -> None:
    """Catches: plain-text 404/405 pages that OpenAI clients cannot parse."""
    async with served(texts(["x"])) as gw, gw.http() as client:
        missing = await client.get("/v1/nothing")
        wrong = await client.get("/v1/chat/completions")
    assert (missing.status_code, openai_error(missing.content)["code"]) == (404, "not_found")
    assert (wrong.status_code, openai_error(wrong.content)["code"]) == (405, "method_not_allowed")


# -- conversations ---------------------------------------------------------------------------


async def test_a_conversation_continues_from_the_log(tmp_path: Path) -> None:
    """Catches: a conversation id that does not load the history, or commits nothing."""
    model = ScriptedModel(["first answer", "second answer"])
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(Pipeline(model=model), log=log) as gw:
            sdk = gw.sdk()
            headers = {"X-Conversation-Id": "c1"}
            await sdk.chat.completions.create(
                model="m", messages=user("one"), extra_headers=headers
            )
            await sdk.chat.completions.create(
                model="m", messages=user("two"), extra_headers=headers
            )
        stored = await log.load("c1")
    assert [(m.role, m.text) for m in stored.messages] == [
        ("user", "one"),
        ("assistant", "first answer"),
        ("user", "two"),
        ("assistant", "second answer"),
    ]
    assert [m.text for m in model.requests[1].messages] == ["one", "first answer", "two"]


async def test_a_non_ascii_conversation_id_is_read_as_the_utf_8_it_was_sent_in(
    tmp_path: Path,
) -> None:
    """Catches: an ``X-Conversation-Id`` sent in UTF-8 ("café", as curl and Go send it) read
    as Latin-1, so its turns were committed to conversation "cafÃ©", which ``turnplug log
    café`` and every client naming the id in Latin-1 could not find."""
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(Pipeline(model=ScriptedModel(["one", "two"])), log=log) as gw:
            async with gw.http() as client:
                for header in ("café".encode(), "café".encode("latin-1")):
                    response = await client.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": user("hi")},
                        headers={"X-Conversation-Id": header},
                    )
                    assert response.status_code == 200, response.text
        assert [(c.conversation_id, c.turns) for c in await log.conversations()] == [("café", 2)]


async def test_a_utf_8_conversation_id_continues_its_conversation_logged_in_latin_1(
    tmp_path: Path,
) -> None:
    """Catches: a conversation whose UTF-8 id ("café") a gateway of an earlier release logged
    under its Latin-1 reading ("cafÃ©") started over with no history once the id was read as
    UTF-8, instead of continuing the conversation it names."""
    model = ScriptedModel(["first answer", "second answer"])
    pipe = Pipeline(model=model)
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with pipe.session(log=log, conversation_id="café".encode().decode("latin-1")) as s:
            await s.send("one")
        async with served(pipe, log=log) as gw, gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("two")},
                headers={"X-Conversation-Id": "café".encode()},
            )
        assert response.status_code == 200, response.text
        assert [m.text for m in model.requests[1].messages] == ["one", "first answer", "two"]
        assert [c.turns for c in await log.conversations()] == [2]


async def test_two_racing_turns_on_one_conversation_give_one_409(tmp_path: Path) -> None:
    """Catches: a lost update — both racing turns committed, or both refused."""
    rendezvous = Rendezvous()

    async def answer(request: Any) -> str:
        await rendezvous.meet()
        return "answer"

    statuses: list[int] = []
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(Pipeline(model=FunctionModel(answer)), log=log) as gw:
            async with gw.http() as client:

                async def send(text: str) -> None:
                    response = await client.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": user(text)},
                        headers={"X-Conversation-Id": "race"},
                    )
                    statuses.append(response.status_code)
                    if response.status_code == 409:
                        assert openai_error(response.content)["type"] == "conversation_conflict"

                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(send, "a")
                    nursery.start_soon(send, "b")
        stored = await log.load("race")
    assert sorted(statuses) == [200, 409]
    assert len(stored.messages) == 2


async def test_the_sdk_does_not_retry_a_turn_that_lost_a_race(tmp_path: Path) -> None:
    """Bug caught: the official SDK retries a 409 by itself (twice by default), so the
    turn that lost a race ran again and its message was committed after a turn its client
    had not seen, where the client was to reload and send again."""
    rendezvous = Rendezvous()

    async def answer(request: Any) -> str:
        await rendezvous.meet()
        return "answer"

    outcomes: list[str] = []
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(Pipeline(model=FunctionModel(answer)), log=log) as gw:
            # The SDK's default retries, which the fixture's clients turn off.
            client = gw.sdk(max_retries=openai.DEFAULT_MAX_RETRIES)

            async def send(text: str) -> None:
                try:
                    await client.chat.completions.create(
                        model="m",
                        messages=user(text),
                        extra_headers={"X-Conversation-Id": "race"},
                    )
                    outcomes.append("answered")
                except openai.ConflictError as exc:
                    outcomes.append(f"conflict, retry: {exc.response.headers['x-should-retry']}")

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(send, "a")
                nursery.start_soon(send, "b")
        stored = await log.load("race")
    assert sorted(outcomes) == ["answered", "conflict, retry: false"]
    assert rendezvous.arrived == 2  # the losing turn was not run again
    assert len(stored.messages) == 2


def remembers(seen: list[str] | None = None) -> Any:
    """A durable background post hook that records the reply it followed."""

    def remember(turn: Turn) -> Any:
        assert turn.reply is not None
        if seen is not None:
            seen.append(turn.reply.text)
        return cont(turn.inject(f"noted: {turn.reply.text}"))

    return hook(remember, name="remember", background=True, durable=True)


async def test_background_hooks_output_is_committed_in_a_conversation(tmp_path: Path) -> None:
    """Catches: the gateway committing a conversation turn itself and dropping what its
    background post hooks add to the conversation (a running summary, a memory)."""
    feed: list[dict[str, Any]] = []
    pipe = Pipeline(model=ScriptedModel(["first", ["sec", "ond"]]), post=[remembers()])
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(pipe, log=log) as gw:
            async with anyio.create_task_group() as nursery:
                await nursery.start(watch_feed, gw, feed)
                headers = {"X-Conversation-Id": "c"}
                await gw.sdk().chat.completions.create(
                    model="m", messages=user("one"), extra_headers=headers
                )
                chunks = await gw.sdk_stream(model="m", messages=user("two"), extra_headers=headers)
                await anyio.sleep(0.2)
                nursery.cancel_scope.cancel()
    async with SQLiteLog(tmp_path / "log.db") as reopened:
        stored = await reopened.load("c")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "second"
    assert [(m.role, m.text) for m in stored.messages] == [
        ("user", "one"),
        ("assistant", "first"),
        ("user", "noted: first"),
        ("user", "two"),
        ("assistant", "second"),
        ("user", "noted: second"),
    ]
    committed = [e for e in feed if e["event"] == "Committed"]
    assert len(committed) == 4  # each turn, then each background hook's output


async def test_a_running_summary_runs_in_conversations_only(tmp_path: Path) -> None:
    """Bug caught: a stateless request ran a running summary before its answer was sent,
    a model call whose summary no log kept, re-summarizing the client's whole history."""
    summarizer = ScriptedModel(["S1", "S2"])
    pipe = Pipeline(model=ScriptedModel(["a1", "a2"]), post=[running_summary(summarizer, every=1)])
    history = [
        {"role": role, "content": f"{role} {n}"} for n in range(5) for role in ("user", "assistant")
    ]
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(pipe, log=log) as gw:
            stateless = await gw.sdk().chat.completions.create(
                model="m", messages=[*history, *user("q")]
            )
            assert summarizer.requests == []
            await gw.sdk().chat.completions.create(
                model="m", messages=user("q2"), extra_headers={"X-Conversation-Id": "c"}
            )
        stored = await log.load("c")
    assert stateless.choices[0].message.content == "a1"
    assert len(summarizer.requests) == 1
    assert [m.text for m in stored.messages] == [
        "q2",
        "a2",
        "Summary of the conversation so far:\nS1",
    ]


async def test_a_race_with_background_hooks_commits_one_turn_and_its_output(
    tmp_path: Path,
) -> None:
    """Catches: a turn that lost the race (409) still running its background hooks, whose
    output then lands in the conversation after the winner's."""
    rendezvous = Rendezvous()

    async def answer(request: Any) -> str:
        await rendezvous.meet()
        return f"answer to {request.messages[-1].text}"

    seen: list[str] = []
    pipe = Pipeline(model=FunctionModel(answer), post=[remembers(seen)])
    statuses: list[int] = []
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(pipe, log=log) as gw, gw.http() as client:

            async def send(text: str) -> None:
                response = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": user(text)},
                    headers={"X-Conversation-Id": "race"},
                )
                statuses.append(response.status_code)

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(send, "a")
                nursery.start_soon(send, "b")
        stored = await log.load("race")
    assert sorted(statuses) == [200, 409]
    [winner] = seen
    assert [m.text for m in stored.messages] == [
        winner.removeprefix("answer to "),
        winner,
        f"noted: {winner}",
    ]


async def test_a_blocked_client_tool_call_in_a_conversation_commits_nothing(
    tmp_path: Path,
) -> None:
    """Catches: the tool policy judging calls after the session committed the turn, so a
    403 answer leaves a turn (and its refused call) in the conversation."""

    def no_deletes(call: ToolCall, turn: Any) -> Any:
        return block("deleting is not allowed")

    pipe = Pipeline(
        model=ScriptedModel([[ToolCall("c1", "delete_all", {})]]),
        before_tool=[hook(no_deletes, name="no_deletes")],
        post=[remembers()],
    )
    tools = [{"type": "function", "function": {"name": "delete_all"}}]
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(pipe, log=log) as gw, gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("x"), "tools": tools},
                headers={"X-Conversation-Id": "c"},
            )
        stored = await log.load("c")
    assert response.status_code == 403
    assert (openai_error(response.content)["hook"]) == "no_deletes"
    assert stored.messages == ()


async def test_a_failed_turn_commits_nothing(tmp_path: Path) -> None:
    """Catches: a halted or exhausted conversation turn leaving messages in the log."""
    pipe = guarded(["internal use only"] * 3)
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(pipe, log=log) as gw, gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("x"), "stream": True},
                headers={"X-Conversation-Id": "c"},
            )
        stored = await log.load("c")
    assert response.status_code == 422
    assert stored.messages == ()


async def test_a_conversation_id_without_a_log_is_400() -> None:
    """Catches: a conversation silently treated as stateless."""
    async with served(texts(["x"])) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": user("x")},
            headers={"X-Conversation-Id": "c"},
        )
    assert response.status_code == 400
    assert openai_error(response.content)["param"] == "X-Conversation-Id"


async def test_a_conversation_id_too_long_for_a_log_is_400_before_the_turn_runs(
    tmp_path: Path,
) -> None:
    """Catches: an X-Conversation-Id no log takes (over 1024 bytes) answered with a 500
    once the session opened, instead of a 400 naming the header."""
    model = ScriptedModel(["x"])
    pipe = Pipeline(model=model)
    async with SQLiteLog(tmp_path / "log.db") as log, served(pipe, log=log) as gw:
        async with gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("x")},
                headers={"X-Conversation-Id": "c" * 1025},
            )
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == ("X-Conversation-Id", "invalid_value")
    assert "1024 bytes" in error["message"]
    assert model.requests == []


async def test_a_conversation_id_given_twice_is_400(tmp_path: Path) -> None:
    """Bug: a request with two X-Conversation-Id headers (a proxy adding its own to the
    client's) joined the first one's conversation silently, whichever came first."""
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(texts(["x"]), log=log) as gw, gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("x")},
                headers=[("X-Conversation-Id", "a"), ("X-Conversation-Id", "b")],
            )
        stored = (await log.load("a"), await log.load("b"))
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == ("X-Conversation-Id", "invalid_value")
    assert "given 2 times" in error["message"]
    assert stored == (Context(), Context())


async def test_the_codes_of_refused_requests_are_the_documented_ones(tmp_path: Path) -> None:
    """Catches: 400s answered with a code the status table of docs/serve.md does not list
    (``unsupported_parameter``, ``no_log``), or with none (an empty X-Conversation-Id)."""

    def get_time() -> str:
        return "noon"

    clock = [{"type": "function", "function": {"name": "get_time"}}]
    async with served(texts(["x"])) as gw, gw.http() as client:
        no_log = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": user("x")},
            headers={"X-Conversation-Id": "c"},
        )
    async with SQLiteLog(tmp_path / "log.db") as log, served(texts(["x"]), log=log) as gw:
        async with gw.http() as client:
            empty = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("x")},
                headers={"X-Conversation-Id": ""},
            )
    async with served(Pipeline(model=ScriptedModel(["x"]), tools=[tool(get_time)])) as gw:
        async with gw.http() as client:
            tools = await client.post(
                "/v1/chat/completions", json={"model": "m", "messages": user("x"), "tools": clock}
            )
    codes = {
        (openai_error(r.content)["param"], openai_error(r.content)["code"])
        for r in (no_log, empty, tools)
    }
    assert codes == {
        ("X-Conversation-Id", "no_log"),
        ("X-Conversation-Id", "invalid_value"),
        ("tools", "unsupported_parameter"),
    }
    table = (Path(__file__).parents[2] / "docs" / "serve.md").read_text()
    table = table.split("## Status codes", 1)[1].split("\n## ", 1)[0]
    for _param, code in codes:
        assert f"`{code}`" in table, code


# -- the page's feed -------------------------------------------------------------------------


async def test_the_feed_carries_a_turns_hooks_and_its_reply() -> None:
    """Catches: a page feed missing hook verdicts, or an event type it cannot show."""

    def note(turn: Any) -> Any:
        return cont(turn.inject("today is Monday"))

    feed: list[dict[str, Any]] = []
    pipe = Pipeline(model=ScriptedModel(["hello"]), pre=[hook(note, name="note")])
    async with served(pipe) as gw, anyio.create_task_group() as nursery:
        await nursery.start(watch_feed, gw, feed)
        await gw.sdk().chat.completions.create(model="m", messages=user("hi"))
        await anyio.sleep(0.2)
        nursery.cancel_scope.cancel()
    names = [e["event"] for e in feed]
    assert names[0] == "GatewayRequest"
    assert names[1:] == [
        "TurnStarted",
        "HookStarted",
        "HookFinished",
        "Injected",
        "ModelCalled",
        "ModelFinished",
        "ReplyReady",
        "TurnFinished",
        "GatewayMessage",
    ]
    assert feed[-1]["message"] == "hi"
    finished = feed[names.index("HookFinished")]
    assert (finished["hook"], finished["verdict"]) == ("note", "cont")
    assert feed[names.index("Injected")]["parts"][0]["text"] == "today is Monday"
    assert len({e["turn_ref"] for e in feed}) == 1
    assert re.fullmatch(r"req_[0-9a-f]{32}", feed[0]["turn_ref"])  # the x-request-id


@pytest.mark.parametrize("strategy", ["redact", "block"])
async def test_the_feed_shows_the_message_only_as_the_log_would_hold_it(strategy: Any) -> None:
    """Catches: the page's feed carrying the user's message as sent, before a pre hook
    (``scrub_input``) scrubbed it, or for a turn halted for holding it: neither the log nor
    the model ever sees that text."""
    feed: list[dict[str, Any]] = []
    pipe = Pipeline(model=ScriptedModel(["noted"]), pre=[scrub_input(pii(), strategy=strategy)])
    async with served(pipe) as gw, anyio.create_task_group() as nursery:
        await nursery.start(watch_feed, gw, feed)
        async with gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("mail bob@secret.org today")},
            )
        await anyio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert response.status_code == (200 if strategy == "redact" else 422)
    assert feed
    assert "bob@secret.org" not in json.dumps(feed)
    said = [e["message"] for e in feed if e["event"] == "GatewayMessage"]
    assert said == (["mail [EMAIL] today"] if strategy == "redact" else [])


async def test_the_feed_shows_the_names_of_a_clients_extra_options_not_their_values() -> None:
    """Catches: ``ModelCalled.options`` on the page with its ``extra`` whole, so every
    client's ``user`` (an end user's id) was on the live page, which carries only what the
    log could hold (and the log keeps no request options)."""
    feed: list[dict[str, Any]] = []
    answered = anyio.Event()
    async with served(Pipeline(model=ScriptedModel(["ok"]))) as gw:
        async with anyio.create_task_group() as nursery:
            await nursery.start(partial(watch_feed, gw, feed, answered=answered))
            await gw.sdk().chat.completions.create(
                model="m", messages=user("hi"), temperature=0.3, user="enduser-7f3a", seed=5
            )
            with anyio.fail_after(10):
                await answered.wait()
            nursery.cancel_scope.cancel()
    [called] = [e for e in feed if e["event"] == "ModelCalled"]
    assert called["options"]["temperature"] == 0.3
    assert sorted(called["options"]["extra"]) == ["seed", "user"]
    assert "enduser-7f3a" not in json.dumps(feed)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_feed_shows_the_reply_as_the_client_got_it(stream: bool) -> None:
    """Catches: the page's ``ReplyReady`` carrying the model's text from before a post hook
    rewrote it, while the client and the log get the rewritten reply."""

    def mask_mail(turn: Turn) -> Any:
        assert turn.reply is not None
        text = turn.reply.text.replace("alice@example.com", "[MAIL]")
        message = Message.assistant((Text(text),))
        reply = attrs.evolve(turn.reply, message=message, messages=(message,))
        return cont(attrs.evolve(turn, reply=reply))

    feed: list[dict[str, Any]] = []
    pipe = Pipeline(
        model=ScriptedModel(["write to alice@example.com"]), post=[hook(mask_mail, name="mask")]
    )
    async with served(pipe) as gw, anyio.create_task_group() as nursery:
        await nursery.start(watch_feed, gw, feed)
        if stream:
            chunks = await gw.sdk_stream(model="m", messages=user("who?"))
            got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = await gw.sdk().chat.completions.create(model="m", messages=user("who?"))
            got = reply.choices[0].message.content
        await anyio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert got == "write to [MAIL]"
    assert [e["text"] for e in feed if e["event"] == "ReplyReady"] == ["write to [MAIL]"]
    assert "alice@example.com" not in json.dumps(feed)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_feed_shows_the_tool_calls_returned_to_the_client(stream: bool) -> None:
    """Catches: the page's ``ReplyReady`` carrying only the reply's text, so a turn whose
    answer was tool calls for the client to run showed on the page as an empty reply, with
    no trace of the calls the client received (and the log holds)."""
    call = ToolCall("call_1", "get_weather", {"city": "Oslo"})
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    feed = await weather_feed(Pipeline(model=ScriptedModel([[call]])), weather, stream=stream)
    [ready] = [e for e in feed if e["event"] == "ReplyReady"]
    assert ready["finish_reason"] == "tool_calls"
    assert [(c["id"], c["name"], c["arguments"]) for c in ready["tool_calls"]] == [
        ("call_1", "get_weather", {"city": "Oslo"})
    ]


async def weather_feed(
    pipe: Pipeline, weather: dict[str, Any], *, stream: bool
) -> list[dict[str, Any]]:
    """The live feed of one turn asking about the weather with the client tool `weather`,
    sent through the official SDK, streamed or not, until the turn's answer is on it."""
    feed: list[dict[str, Any]] = []
    answered = anyio.Event()
    async with served(pipe) as gw:
        async with anyio.create_task_group() as nursery:
            await nursery.start(partial(watch_feed, gw, feed, answered=answered))
            if stream:
                await gw.sdk_stream(model="m", messages=user("weather?"), tools=[weather])
            else:
                await gw.sdk().chat.completions.create(
                    model="m", messages=user("weather?"), tools=[weather]
                )
            await answered.wait()
            nursery.cancel_scope.cancel()
    return feed


@pytest.mark.parametrize("stream", [False, True])
async def test_the_client_tool_policy_hooks_show_in_order_and_on_the_turns_clock(
    stream: bool,
) -> None:
    """Catches: the before-tool hooks that judge a client's tool calls reaching the page
    ahead of the turn's earlier events (before the model call's end and the post hooks that
    ran first), stamped ``at: 0.0``: the page's timeline showed them first, at 0 ms."""

    def check(turn: Turn) -> Any:
        return cont(turn)

    def allow(call: ToolCall, turn: Turn) -> Any:
        return cont(call)

    weather = {"type": "function", "function": {"name": "get_weather"}}
    pipe = Pipeline(
        model=ScriptedModel([[ToolCall("c1", "get_weather", {})]]),
        post=[hook(check, name="check")],
        before_tool=[hook(allow, name="allow")],
    )
    feed = await weather_feed(pipe, weather, stream=stream)
    hooks = [
        (e["event"], e["hook"], e["at"])
        for e in feed
        if e["event"] in ("HookStarted", "HookFinished")
    ]
    assert [(name, which) for name, which, _ in hooks] == [
        ("HookStarted", "check"),
        ("HookFinished", "check"),
        ("HookStarted", "client_tool_policy"),
        ("HookStarted", "allow"),
        ("HookFinished", "allow"),
        ("HookFinished", "client_tool_policy"),
    ]
    times = [at for _, _, at in hooks]
    assert times == sorted(times)  # on the turn's clock: after the model call and `check`
    assert times[3] > 0


async def test_client_tool_calls_are_judged_with_every_hook_option() -> None:
    """Catches: the gateway matching before-tool hooks itself and ignoring `when=` (a hook
    that does not apply to this turn blocked it) and argument rewrites (the client received
    the call as the model wrote it, not as the pipeline's policy rewrote it)."""

    def no_deletes(call: ToolCall, turn: Any) -> Any:
        return block("deleting is not allowed")

    def cap_limit(call: ToolCall, turn: Any) -> Any:
        return cont(call.with_arguments({**call.arguments, "limit": 10}))

    pipe = Pipeline(
        model=ScriptedModel([[ToolCall("c1", "delete_all", {"limit": 500})]]),
        before_tool=[
            hook(
                no_deletes,
                name="no_deletes",
                when=lambda turn: "admin" not in turn.user_message.text,
            ),
            hook(cap_limit, name="cap_limit"),
        ],
    )
    tools = [{"type": "function", "function": {"name": "delete_all"}}]
    async with served(pipe) as gw, gw.http() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": user("admin: clean up"), "tools": tools},
        )
    assert response.status_code == 200, response.text
    [call] = response.json()["choices"][0]["message"]["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("c1", "delete_all")
    assert json.loads(call["function"]["arguments"]) == {"limit": 10}


@contextmanager
def command_log() -> Iterator[io.StringIO]:
    """What the ``turnplug`` loggers write, as `turnplug serve` writes it on stderr, for the
    time of the block."""
    written = io.StringIO()
    library = logging.getLogger("turnplug")
    before = (library.propagate, library.level)
    handler = log_to_stderr((), stream=written)
    try:
        yield written
    finally:
        library.removeHandler(handler)
        library.propagate, library.level = before


async def test_every_response_carries_a_request_id_of_its_own_that_its_warning_names() -> None:
    """Bug caught: no response carried an ``x-request-id`` (the SDK's ``_request_id`` was
    None, streamed or not, error or not), and the gateway's warning lines named no request,
    so a user's report could not be matched with them; then a 5xx's line said the id twice,
    as the request's and as its turn's."""

    def fails_on_boom(turn: Turn) -> Turn:
        if turn.user_message.text == "boom":
            raise RuntimeError("the check is down")
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["ok", "ok"]), pre=[hook(fails_on_boom, name="check")])
    with command_log() as written:
        async with served(pipe) as gw, gw.http() as client, gw.http(key="wrong") as stranger:
            reply = await gw.sdk().chat.completions.create(model="m", messages=user("hi"))
            with pytest.raises(openai.InternalServerError) as failed:
                await gw.sdk().chat.completions.create(model="m", messages=user("boom"))
            body = {"model": "m", "messages": user("hi"), "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as streamed:
                await streamed.aread()
            others = [
                await client.post("/v1/chat/completions", content=b"{"),
                await stranger.get("/v1/models"),
                await client.get("/v1/nowhere"),
                await client.delete("/v1/models"),
                await client.get("/healthz"),
            ]
    assert [r.status_code for r in (streamed, *others)] == [200, 400, 401, 404, 405, 200]
    ids = [reply._request_id, failed.value.request_id]
    ids += [r.headers.get("x-request-id") for r in (streamed, *others)]
    assert all(re.fullmatch(r"req_[0-9a-f]{32}", named or "") for named in ids), ids
    assert len(set(ids)) == len(ids)
    # One line, naming the failed request (once: it is its turn's id too).
    warned = [line for line in written.getvalue().splitlines() if "check" in line]
    assert [f" turnplug.serve [{ids[1]}]: the turn failed (HTTP 500)" in w for w in warned] == [
        True
    ], warned
    assert warned[0].count(ids[1][4:]) == 1, warned


async def test_the_hook_warnings_of_overlapping_requests_name_each_its_own_request(
    tmp_path: Path,
) -> None:
    """Bug caught: a warning of a sync hook in its worker thread, or of a background hook
    after the answer, named no request, or the other request in flight."""
    said = logging.getLogger("turnplug.tests.overlap")
    both_in_flight = threading.Barrier(2, timeout=10)
    both_answered = anyio.Event()

    def checks(turn: Turn) -> Any:  # with a timeout: in a worker thread
        both_in_flight.wait()
        said.warning("the check of %s", turn.user_message.text)
        return cont(turn)

    async def summarize(turn: Turn) -> Any:
        await both_answered.wait()
        said.warning("the summary of %s", turn.user_message.text)
        return cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["a", "b"]),
        pre=[hook(checks, name="checks", timeout=10)],
        post=[hook(summarize, name="summarize", background=True)],
    )
    ids: dict[str, str] = {}
    with command_log() as written:
        async with SQLiteLog(tmp_path / "log.db") as log, served(pipe, log=log) as gw:

            async def ask(text: str) -> None:
                raw = await gw.sdk().chat.completions.with_raw_response.create(
                    model="m", messages=user(text), extra_headers={"X-Conversation-Id": text}
                )
                ids[text] = raw.headers["x-request-id"]

            async with anyio.create_task_group() as group:
                group.start_soon(ask, "one")
                group.start_soon(ask, "two")
            both_answered.set()
            assert await gw.gateway.drain(10)
    lines = [line for line in written.getvalue().splitlines() if "turnplug.tests" in line]
    named = sorted((line.rsplit(" ", 1)[1], line.split(" ")[4]) for line in lines)
    assert named == [
        ("one", f"[{ids['one']}]:"),
        ("one", f"[{ids['one']}]:"),
        ("two", f"[{ids['two']}]:"),
        ("two", f"[{ids['two']}]:"),
    ], lines
    assert sorted(line.split(": ", 1)[1] for line in lines) == [
        "the check of one",
        "the check of two",
        "the summary of one",
        "the summary of two",
    ]


async def test_a_warning_of_a_server_a_request_reconnected_names_no_request(
    tmp_path: Path,
) -> None:
    """Bug caught: an MCP server reconnected while a request ran kept that request's id in
    its connection's tasks, so a later warning of the connection (a notification the SDK
    could not read, during another request) named the request that had reconnected it."""
    pipe = Pipeline(
        model=ScriptedModel(
            [
                [ToolCall("c1", "faulty_note", {})],
                "tool lost",
                "reconnected",
                [ToolCall("c2", "faulty_note", {})],
                "noted",
            ]
        ),
        toolsets=[faulty_toolset("notifying", str(tmp_path / "starts"), timeout=10)],
    )
    ids = []
    with command_log() as written:
        async with pipe, served(pipe) as gw:  # held for the server's life, as the command does
            for text in ("the server exits", "it is reconnected", "it notifies"):
                raw = await gw.sdk().chat.completions.with_raw_response.create(
                    model="m", messages=user(text)
                )
                ids.append(raw.headers["x-request-id"])
    assert (tmp_path / "starts").read_text() == "2"
    [line] = [line for line in written.getvalue().splitlines() if "the MCP SDK logged" in line]
    assert " WARNING turnplug.mcp: MCP server 'faulty' (`" in line, line
    assert not any(named in line for named in ids)


async def _allow(call: ToolCall, turn: Turn) -> Any:
    return cont(call)


async def _audit(turn: Turn) -> Any:
    return cont(turn)


@pytest.mark.parametrize(
    "hooks",
    [
        {"post": [hook(_audit, name="audit", background=True)]},
        {"before_tool": [hook(_allow, name="allow")]},  # judges the client's tool calls
    ],
    ids=["background", "before_tool"],
)
async def test_requests_use_the_mcp_servers_the_held_pipeline_started(
    tmp_path: Path, hooks: dict[str, Any]
) -> None:
    """Bug caught: with a background hook, or a before_tool hook and no tools of its own, the
    gateway ran turns through copies of the pipeline that the command's `async with pipe`
    never held, so every request started its MCP servers anew."""
    starts = tmp_path / "starts"
    pipe = Pipeline(
        model=ScriptedModel(["a", "b", "c"]),
        toolsets=[faulty_toolset("babbling", env={"FAULTY_STARTS": str(starts)}, timeout=10)],
        **hooks,
    )
    async with pipe, served(pipe) as gw:  # held for the server's life, as the command does
        for text in ("one", "two", "three"):
            reply = await gw.sdk().chat.completions.create(model="m", messages=user(text))
            assert reply.choices[0].message.content is not None
    assert len(starts.read_text().split()) == 1


# -- logging is the application's ------------------------------------------------------------


async def test_a_gateway_in_a_library_users_process_configures_no_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Catches: the gateway (not only the ``turnplug serve`` command) putting a handler on the
    ``turnplug`` loggers, stopping their propagation or touching the root logger: an
    application serving it in process decides where its records go."""

    def broken(turn: Turn) -> Any:
        raise RuntimeError("the check is down")

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[hook(broken, on_error="skip")])
    async with served(pipe) as gw:
        reply = await gw.sdk().chat.completions.create(model="any", messages=user("hi"))
    library = logging.getLogger("turnplug")
    assert reply.choices[0].message.content == "ok"
    assert [type(h) for h in library.handlers] == [logging.NullHandler]
    assert (library.propagate, library.level) == (True, logging.NOTSET)
    assert (list(root.handlers), root.level) == before
    # The warning reached the application's own (root) handler, pytest's here.
    assert [r.name for r in caplog.records if r.levelno == logging.WARNING] == ["turnplug.pipeline"]


async def test_a_failing_hook_is_500_naming_it_without_its_exceptions_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Catches: a hook's exception text (here a connection string with its password) sent to
    the client in the 500's body, where the upstream's own errors are already withheld;
    the gateway's log keeps it for the operator."""

    def lookup(turn: Turn) -> Turn:
        raise ValueError("cannot reach postgres://app:hunter2@db/prod")

    model = ScriptedModel(["never"])
    pipe = Pipeline(model=model, pre=[hook(lookup, name="lookup")])
    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        async with served(pipe) as gw, gw.http() as client:
            response = await client.post(
                "/v1/chat/completions", json={"model": "m", "messages": user("hi")}
            )
    assert response.status_code == 500
    error = openai_error(response.content)
    assert (error["type"], error["code"]) == ("pipeline_error", "pipeline_failed")
    assert "hook 'lookup' (pre stage), which raised ValueError" in error["message"]
    assert "hunter2" not in response.text
    assert any("hunter2" in r.getMessage() for r in caplog.records if r.name == "turnplug.serve")
    assert model.requests == []


async def test_a_failing_transformers_warning_names_its_exception_by_type_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bug caught: the turn-failure warning ended with "(caused by KeyError: '555-9876')",
    releasing in the gateway's log the text a transformer was there to change."""

    class Lookup:
        def feed(self, text: str) -> str:
            raise KeyError("555-9876")

        def flush(self) -> str:
            return ""

    def lookup() -> Lookup:
        return Lookup()

    pipe = Pipeline(model=ScriptedModel(["call 555-9876"]), transformers=[lookup])
    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        async with served(pipe) as gw, gw.http() as client:
            response = await client.post(
                "/v1/chat/completions", json={"model": "m", "messages": user("hi")}
            )
    assert response.status_code == 500
    said = [r.getMessage() for r in caplog.records if r.name == "turnplug.serve"]
    assert any("(caused by KeyError)" in line for line in said), said
    assert not any("555-9876" in line for line in said), said


def stops_the_process(interrupt: BaseException) -> Pipeline:
    """A pipeline whose pre hook raises `interrupt` (a hook calling ``sys.exit(3)``, say)."""

    async def stop(turn: Turn) -> Turn:
        raise interrupt

    return Pipeline(model=ScriptedModel(["never"] * 2), pre=[hook(stop, name="stop")])


@pytest.mark.parametrize("interrupt", [SystemExit(3), KeyboardInterrupt()], ids=repr)
@pytest.mark.parametrize("where", ["stateless", "streamed", "conversation"])
async def test_a_turn_raising_an_interrupt_is_503_and_stops_the_gateway_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, interrupt: BaseException
) -> None:
    """Bug caught: a KeyboardInterrupt or SystemExit out of a turn lost in the server's request
    task (a bare 500, the gateway serving on; on asyncio the loop's handler printing it) or,
    out of a conversation's session, stopping the loop at once."""
    conversation = {"X-Conversation-Id": "c"} if where == "conversation" else {}
    body = {"model": "m", "messages": user("hi"), "stream": where == "streamed"}
    answers: list[httpx.Response] = []

    async def serve_until_stopped(log: SQLiteLog) -> None:
        async with served(stops_the_process(interrupt), log=log) as gw, gw.http() as client:
            answers.append(
                await client.post("/v1/chat/completions", json=body, headers=conversation)
            )
            answers.append(await client.post("/v1/chat/completions", json=body))
            answers.append(await client.get("/healthz"))

    async with SQLiteLog(tmp_path / "log.db") as log:
        with pytest.raises(type(interrupt)) as raised:
            await serve_until_stopped(log)
        stored = await log.load("c")
    assert raised.value is interrupt
    response, later, health = answers
    assert response.status_code == 503, response.text
    error = openai_error(response.content)
    assert (error["type"], error["code"]) == ("server_error", "shutting_down")
    assert f"this turn raised {type(interrupt).__name__}" in error["message"]
    assert response.headers["retry-after"] == "1"
    assert openai_error(later.content)["code"] == "shutting_down"
    assert health.json()["status"] == "shutting_down"
    assert stored.messages == ()
    # Nothing left a task for the loop to report (asyncio's "never retrieved", say).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_every_waiter_of_interrupted_wakes_when_a_turn_raises_one() -> None:
    """Bug caught: each `interrupted()` call replacing the event the interrupt sets, so only
    the last waiter woke and the earlier ones waited forever."""
    interrupt = SystemExit(3)
    woke: list[str] = []

    async def wait(gw: Any, name: str) -> None:
        assert await gw.gateway.interrupted() is interrupt
        woke.append(name)

    answers: list[httpx.Response] = []

    async def serve_until_stopped() -> None:
        async with served(stops_the_process(interrupt)) as gw, gw.http() as client:
            # The group ends once both waiters woke.
            with anyio.fail_after(10):
                async with anyio.create_task_group() as waiters:
                    waiters.start_soon(wait, gw, "first")
                    await anyio.wait_all_tasks_blocked()
                    waiters.start_soon(wait, gw, "second")
                    await anyio.wait_all_tasks_blocked()
                    body = {"model": "m", "messages": user("hi")}
                    answers.append(await client.post("/v1/chat/completions", json=body))

    with pytest.raises(SystemExit):
        await serve_until_stopped()
    assert [a.status_code for a in answers] == [503]
    assert sorted(woke) == ["first", "second"]


async def test_every_waiter_of_turns_finished_wakes_when_the_last_turn_ends() -> None:
    """Bug caught: each `turns_finished()` call replacing the event the last turn's end
    sets, so only the last waiter woke and the earlier ones waited forever."""
    entered, release = anyio.Event(), anyio.Event()
    woke: list[str] = []

    async def held(turn: Turn) -> Any:
        entered.set()
        await release.wait()
        return cont(turn)

    async def wait(gw: Any, name: str) -> None:
        await gw.gateway.turns_finished()
        woke.append(name)

    async def ask(client: httpx.AsyncClient, into: list[httpx.Response]) -> None:
        body = {"model": "m", "messages": user("hi")}
        into.append(await client.post("/v1/chat/completions", json=body))

    pipe = Pipeline(model=ScriptedModel(["done"]), pre=[hook(held, name="held")])
    answers: list[httpx.Response] = []
    async with served(pipe) as gw, gw.http() as client:
        # The group ends once the turn was answered and both waiters woke.
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(ask, client, answers)
                await entered.wait()
                group.start_soon(wait, gw, "first")
                await anyio.wait_all_tasks_blocked()
                group.start_soon(wait, gw, "second")
                await anyio.wait_all_tasks_blocked()
                release.set()
    assert [a.status_code for a in answers] == [200]
    assert sorted(woke) == ["first", "second"]


async def test_the_page_has_a_security_policy_and_nothing_reflected_is_sniffed() -> None:
    """Bug caught: the live page was served without a Content-Security-Policy, and it, its
    feed and the error that quotes the path sent (a 404) without ``nosniff``."""
    async with served(Pipeline(model=ScriptedModel(["hi"]))) as gw:
        async with gw.http() as client:
            page = await client.get("/")
            missing = await client.get("/v1/<script>alert(1)</script>")
            async with client.stream("GET", "/v1/turnplug/events") as feed:
                feed_headers = feed.headers
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'sha256-" in policy
    assert "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/json"
    assert feed_headers["content-type"].startswith("text/event-stream")
    for response in (page.headers, missing.headers, feed_headers):
        assert response["x-content-type-options"] == "nosniff"
