"""`turnplug serve` against what real clients send: the request parameters the official
OpenAI SDK passes on, forwarded to the upstream, refused with a 400 naming them, or honoured
by the gateway itself; never dropped where the client would get something else."""

import tracemalloc
from pathlib import Path
from typing import Any

import openai
import pytest

from hooks.config import pipeline_from_dict
from pipeline import Pipeline, cont, hook
from pipeline.logs import SQLiteLog
from pipeline.providers import AnthropicMessages, OpenAIChat
from pipeline.testing import ScriptedModel
from tests.providers.server import anthropic_text, openai_text, running, stream

from .serve_support import openai_error, served, user

UPSTREAM_KEY = "sk-upstream-compat-1"

# What clients send to shape the reply, with the values the upstream must receive.
SHAPING: dict[str, Any] = {
    "stop": ["END", "STOP"],
    "seed": 7,
    "top_p": 0.5,
    "presence_penalty": 0.25,
    "frequency_penalty": -0.5,
    "logit_bias": {"50256": -100},
    "user": "user-42",
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
    },
    "reasoning_effort": "low",
}

# What sets something on the upstream account (the operator's), not in the reply.
ACCOUNT: dict[str, Any] = {"store": True, "service_tier": "flex", "metadata": {"team": "a"}}


def openai_upstream(url: str) -> OpenAIChat:
    return OpenAIChat("up", base_url=url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)


@pytest.mark.parametrize("streamed", [False, True])
async def test_reply_shaping_parameters_reach_an_openai_upstream(streamed: bool) -> None:
    """Bug caught: ``stop``, ``seed``, ``top_p``, the penalties, ``logit_bias``, ``user``,
    ``response_format`` (json_schema) and ``reasoning_effort`` were read and thrown away:
    the model wrote past the client's stop sequence, ignored its JSON schema, and the client
    was told nothing."""
    async with running(repeat=stream(openai_text(["{}"]))) as upstream:
        async with served(Pipeline(model=openai_upstream(upstream.url))) as gw:
            if streamed:
                await gw.sdk_stream(model="m", messages=user("x"), **SHAPING)
            else:
                await gw.sdk().chat.completions.create(model="m", messages=user("x"), **SHAPING)
    sent = upstream.requests[0].body
    assert {key: sent.get(key) for key in SHAPING} == SHAPING
    assert sent["stream"] is True  # the provider's own keys stay its own


async def test_a_clients_account_level_parameters_are_accepted_and_not_forwarded() -> None:
    """Bug caught: a client's ``store``, ``service_tier`` and ``metadata`` went to the
    upstream, setting on the operator's account whether completions are kept in it, which
    billing tier they use and what its dashboard shows."""
    async with running(repeat=stream(openai_text(["ok"]))) as upstream:
        async with served(Pipeline(model=openai_upstream(upstream.url))) as gw:
            reply = await gw.sdk().chat.completions.create(
                model="m", messages=user("x"), seed=3, **ACCOUNT
            )
    assert reply.choices[0].message.content == "ok"
    sent = upstream.requests[0].body
    assert sent["seed"] == 3
    assert not set(ACCOUNT) & set(sent)


async def test_a_string_stop_and_parallel_tool_calls_reach_an_openai_upstream() -> None:
    """Bug caught: ``stop`` given as one string, and ``parallel_tool_calls: false`` with the
    client's tools, dropped: the model called several tools at once for a client that can
    run one."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    async with running(repeat=stream(openai_text(["ok"]))) as upstream:
        async with served(Pipeline(model=openai_upstream(upstream.url))) as gw:
            await gw.sdk().chat.completions.create(
                model="m", messages=user("x"), stop="END", parallel_tool_calls=False, tools=tools
            )
    sent = upstream.requests[0].body
    assert (sent["stop"], sent["parallel_tool_calls"]) == ("END", False)


async def test_reply_shaping_parameters_reach_the_upstream_in_a_conversation(
    tmp_path: Path,
) -> None:
    """Bug caught: a conversation's turn (``X-Conversation-Id``, run through a session)
    sending the upstream none of the client's reply-shaping parameters."""
    async with running(repeat=stream(openai_text(["ok"]))) as upstream:
        async with SQLiteLog(tmp_path / "log.db") as log:
            async with served(Pipeline(model=openai_upstream(upstream.url)), log=log) as gw:
                await gw.sdk().chat.completions.create(
                    model="m",
                    messages=user("x"),
                    stop="END",
                    seed=3,
                    extra_headers={"X-Conversation-Id": "c1"},
                )
    sent = upstream.requests[0].body
    assert (sent["stop"], sent["seed"]) == ("END", 3)


async def test_an_anthropic_upstream_gets_stop_top_p_and_user_in_its_own_names() -> None:
    """Bug caught: ``stop``, ``top_p`` and ``user`` dropped on the way to an Anthropic
    upstream (or sent under OpenAI's names, which the Messages API refuses)."""
    async with running(repeat=stream(anthropic_text(["ok"]))) as upstream:
        model = AnthropicMessages("claude-x", base_url=upstream.url, api_key=UPSTREAM_KEY)
        async with served(Pipeline(model=model)) as gw:
            reply = await gw.sdk().chat.completions.create(
                model="m",
                messages=user("x"),
                stop="END",
                top_p=0.5,
                user="user-42",
                metadata={"team": "a"},
                store=True,
                parallel_tool_calls=True,
                response_format={"type": "text"},
            )
    assert reply.choices[0].message.content == "ok"
    sent = upstream.requests[0].body
    assert sent["stop_sequences"] == ["END"]
    assert sent["top_p"] == 0.5
    assert sent["metadata"] == {"user_id": "user-42"}
    assert not {"stop", "user", "store", "parallel_tool_calls", "response_format"} & set(sent)


async def test_a_config_built_anthropic_upstream_gets_the_parameters_in_its_own_names() -> None:
    """Bug caught: a config's ``[model]`` with a ``temperature`` wraps the Anthropic provider
    in a model that fills in its defaults, and the gateway, seeing no ``AnthropicMessages``,
    sent ``stop`` and ``user`` under OpenAI's names: the Messages API refuses them, and the
    client got a 502."""
    async with running(repeat=stream(anthropic_text(["ok"]))) as upstream:
        table = {"provider": "anthropic", "name": "claude-x", "base_url": upstream.url}
        pipe = pipeline_from_dict({"model": table | {"api_key_env": "", "temperature": 0.5}})
        async with served(pipe) as gw:
            reply = await gw.sdk().chat.completions.create(
                model="m", messages=user("x"), stop="END", user="user-42"
            )
    assert reply.choices[0].message.content == "ok"
    sent = upstream.requests[0].body
    assert (sent["stop_sequences"], sent["metadata"]) == (["END"], {"user_id": "user-42"})
    assert not {"stop", "user"} & set(sent)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 7),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
        ("logit_bias", {"1": 1}),
        ("response_format", {"type": "json_object"}),
        ("reasoning_effort", "low"),
        ("parallel_tool_calls", False),
    ],
)
async def test_what_an_anthropic_upstream_cannot_honour_is_400_naming_it(
    field: str, value: Any
) -> None:
    """Bug caught: a parameter the Messages API has no form of (a JSON ``response_format``,
    a ``seed``) silently dropped, so the client got free text where it asked for JSON."""
    async with running() as upstream:
        model = AnthropicMessages("claude-x", base_url=upstream.url, api_key=UPSTREAM_KEY)
        async with served(Pipeline(model=model)) as gw:
            with pytest.raises(openai.BadRequestError) as caught:
                await gw.sdk().chat.completions.create(
                    model="m", messages=user("x"), **{field: value}
                )
    error = openai_error(caught.value.response.content)
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert f"'{field}'" in error["message"]
    assert "Anthropic" in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("stop", 5, "'stop' must be a string or an array of strings, got a number"),
        ("stop", ["a", 1], "'stop' must be a string or an array of strings, got an array"),
        ("seed", 1.5, "'seed' must be an integer, got a number"),
        ("top_p", "high", "'top_p' must be a number, got a string"),
        ("response_format", "json", "'response_format' must be an object, got a string"),
        ("parallel_tool_calls", "no", "'parallel_tool_calls' must be a boolean, got a string"),
    ],
)
async def test_a_forwarded_parameter_of_the_wrong_type_is_400_naming_it(
    field: str, value: Any, said: str
) -> None:
    """Bug caught: a forwarded parameter of the wrong JSON type sent on, for the upstream to
    refuse behind a 502 that does not say which field was wrong."""
    model = ScriptedModel([])
    body = {"model": "m", "messages": user("x"), field: value}
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"], error["message"]) == (field, "invalid_type", said)
    assert model.requests == []


async def refused_before_any_hook(raw: str, param: str, said: str) -> None:
    """A body holding `raw` is a 400 whose ``param`` is `param` and whose message says the
    value is `said`, before any pre hook ran or the model was called."""
    ran: list[str] = []

    def pre(turn: Any) -> Any:
        ran.append("pre")
        return cont(turn)

    model = ScriptedModel(["ok"])
    body = '{"model": "m", "messages": [{"role": "user", "content": "x"}], ' + raw + "}"
    async with served(Pipeline(model=model, pre=[hook(pre, name="pre")])) as gw:
        async with gw.http() as client:
            response = await client.post(
                "/v1/chat/completions",
                content=body.encode(),
                headers={"content-type": "application/json"},
            )
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert f"'{param}' is {said}," in error["message"]
    assert (ran, model.requests) == ([], [])


@pytest.mark.parametrize(
    ("raw", "param", "said"),
    [
        ('"top_p": NaN', "top_p", "NaN"),
        ('"presence_penalty": Infinity', "presence_penalty", "Infinity"),
        ('"frequency_penalty": -Infinity', "frequency_penalty", "-Infinity"),
        ('"top_p": 1e400', "top_p", "Infinity"),
        ('"logit_bias": {"50256": NaN}', "logit_bias.50256", "NaN"),
    ],
)
async def test_a_forwarded_parameter_that_is_no_finite_number_is_400_naming_it(
    raw: str, param: str, said: str
) -> None:
    """Bug caught: ``NaN``, ``Infinity`` or ``1e400`` (which Python's JSON reader takes) in a
    forwarded parameter passed the type check and, after the pre hooks ran, ended in a 400
    with no ``param`` about ``RequestOptions.extra``, a name the client never sent."""
    await refused_before_any_hook(raw, param, said)


TOOL = '{"type": "function", "function": {"name": "f", "parameters": %s}}'


@pytest.mark.parametrize(
    ("raw", "param", "said"),
    [
        (
            '"tools": [%s]' % (TOOL % '{"type": "object", "properties": {"x": {"maximum": NaN}}}'),
            "tools[0].function.parameters.properties.x.maximum",
            "NaN",
        ),
        (
            '"tools": [%s]' % (TOOL % '{"type": "object", "minProperties": 1e400}'),
            "tools[0].function.parameters.minProperties",
            "Infinity",
        ),
        (
            '"tool_choice": {"type": "function", "function": {"name": "f", "x": -Infinity}}',
            "tool_choice.function.x",
            "-Infinity",
        ),
        ('"metadata": {"tags": [1, NaN]}', "metadata.tags[1]", "NaN"),
    ],
)
async def test_a_number_that_is_not_finite_anywhere_in_the_body_is_400_naming_it(
    raw: str, param: str, said: str
) -> None:
    """Bug caught: ``NaN``, ``Infinity`` or ``1e400`` (which Python's JSON reader takes)
    outside the forwarded parameters (a client tool's schema, say) was accepted: the pre
    hooks ran and the model was called, a provider then failing with a 400 about
    ``RequestOptions.extra`` that named no ``param``."""
    await refused_before_any_hook(raw, param, said)


LONG_KEY = "k" * 10_000
# A refused value (a NaN, a lone surrogate) after a long list under a long key: the body is
# walked to name its place.
UNDER_LONG_KEY = ["NaN", '"\\ud800"']


async def post_raw(body: str) -> Any:
    """`body` posted as is (json.dumps writes no NaN), to a gateway whose model never runs."""
    async with served(Pipeline(model=ScriptedModel([]))) as gw, gw.http() as client:
        return await client.post(
            "/v1/chat/completions",
            content=body.encode(),
            headers={"content-type": "application/json"},
        )


def with_long_key(leaf: str, length: int) -> str:
    head = '{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": '
    return head + f'{{"{LONG_KEY}": [{"0, " * length}{leaf}]}}}}'


@pytest.mark.parametrize("leaf", UNDER_LONG_KEY)
async def test_a_refused_value_in_a_long_list_under_a_long_key_is_400_in_bounded_memory(
    leaf: str,
) -> None:
    """Bug caught: the walk that names a refused value's place wrote the path of every value
    it went by, each as long as its parent's, so a long key over a long list cost their
    product (a 176 KiB body took 3.9 GB and 10 s; this one took 100 MB)."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        response = await post_raw(with_long_key(leaf, 10_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    assert response.status_code == 400
    assert peak < 16 * 1024 * 1024, f"{peak} bytes allocated at the peak"


@pytest.mark.parametrize("leaf", UNDER_LONG_KEY)
async def test_a_long_key_is_cut_in_the_path_a_400_names(leaf: str) -> None:
    """Bug caught: the error naming a refused value's place held each key of its path whole,
    twice (``param`` and the message), so a 100 KB key made a 200 KB error body."""
    response = await post_raw(with_long_key(leaf, 1))
    assert response.status_code == 400
    error = openai_error(response.content)
    assert error["param"] == "x." + "k" * 40 + "...[1]"
    assert f"'{error['param']}' " in error["message"]
    assert len(response.content) < 1000


async def test_a_model_of_ones_own_receives_the_parameters_in_extra() -> None:
    """Bug caught: a model of one's own (``provider = "python"``) never saw the client's
    ``stop`` or ``response_format``, so it could not honour them."""
    model = ScriptedModel(["ok"])
    async with served(Pipeline(model=model)) as gw:
        await gw.sdk().chat.completions.create(
            model="m", messages=user("x"), stop=["END"], response_format={"type": "json_object"}
        )
    assert dict(model.requests[0].options.extra) == {
        "stop": ["END"],
        "response_format": {"type": "json_object"},
    }


FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {}}}
ASKED_CALL = {
    "role": "assistant",
    "content": None,
    "function_call": {"name": "f", "arguments": "{}"},
}


@pytest.mark.parametrize(
    ("request_", "param", "code"),
    [
        ({"logprobs": True}, "logprobs", "unsupported_parameter"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs", "unsupported_parameter"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
        ({"functions": [FUNCTION]}, "functions", "unsupported_parameter"),
        ({"function_call": "auto"}, "function_call", "unsupported_parameter"),
        ({"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_parameter"),
        (
            {"tools": [{"type": "function", "function": {**FUNCTION, "strict": True}}]},
            "tools[0].function.strict",
            "unsupported_parameter",
        ),
        (
            {"messages": [*user("q"), ASKED_CALL, *user("x")]},
            "messages[1].function_call",
            "unsupported_parameter",
        ),
    ],
)
async def test_what_the_gateway_cannot_answer_as_asked_is_400_naming_it(
    request_: dict[str, Any], param: str, code: str
) -> None:
    """Bug caught: ``logprobs``, the legacy ``functions``/``function_call``, audio
    ``modalities`` and strict tool schemas read and dropped: the client got no log
    probabilities, text instead of a function call or audio, arguments not held to its
    schema, all with a 200 and no word of it."""
    model = ScriptedModel([])
    request_ = {"messages": user("x")} | request_
    async with served(Pipeline(model=model)) as gw:
        with pytest.raises(openai.BadRequestError) as caught:
            await gw.sdk().chat.completions.create(model="m", **request_)
    error = openai_error(caught.value.response.content)
    assert (error["param"], error["code"]) == (param, code)
    assert param.rsplit(".", 1)[-1] in error["message"]
    assert model.requests == []


async def test_the_defaults_of_refused_parameters_are_accepted() -> None:
    """Bug caught: a client that spells out the defaults (``logprobs: false``, ``modalities:
    ["text"]``, a tool with ``strict: false``) refused for parameters that ask for nothing
    the gateway lacks."""
    tool = {"type": "function", "function": {**FUNCTION, "strict": False}}
    model = ScriptedModel(["ok"])
    async with served(Pipeline(model=model)) as gw:
        reply = await gw.sdk().chat.completions.create(
            model="m",
            messages=user("x"),
            logprobs=False,
            top_logprobs=0,
            modalities=["text"],
            tools=[tool],
        )
    assert reply.choices[0].message.content == "ok"


async def test_a_messages_name_reaches_an_openai_upstream() -> None:
    """Bug caught: the ``name`` of a user or assistant message (who said it, in a
    conversation of several people) dropped, so the model read every message as one
    user's."""
    messages = [
        {"role": "user", "content": "I am Ann", "name": "ann"},
        {"role": "assistant", "content": "Hi Ann", "name": "bot"},
        {"role": "user", "content": "and I am Bo", "name": "bo"},
    ]
    async with running(repeat=stream(openai_text(["ok"]))) as upstream:
        async with served(Pipeline(model=openai_upstream(upstream.url))) as gw:
            await gw.sdk().chat.completions.create(model="m", messages=messages)
    sent = upstream.requests[0].body["messages"]
    assert [(m["content"], m.get("name")) for m in sent] == [
        ("I am Ann", "ann"),
        ("Hi Ann", "bot"),
        ("and I am Bo", "bo"),
    ]


@pytest.mark.parametrize(("name", "code"), [(5, "invalid_type"), ("", "invalid_value")])
async def test_a_messages_name_that_is_no_name_is_400_naming_it(name: Any, code: str) -> None:
    """Bug caught: a message's ``name`` of the wrong type (or empty) sent on for the
    upstream to refuse behind a 502 naming nothing."""
    model = ScriptedModel([])
    body = {"model": "m", "messages": [{"role": "user", "content": "x", "name": name}]}
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == ("messages[0].name", code)
    assert model.requests == []


async def test_a_tool_choice_naming_an_undeclared_tool_is_400_naming_tool_choice() -> None:
    """Bug caught: ``tool_choice`` naming a function the request's ``tools`` do not declare
    refused as the pipeline's ``invalid_turn`` with ``param: null``, where the API's own
    400 names ``tool_choice``."""
    model = ScriptedModel([])
    tools = [{"type": "function", "function": FUNCTION}]
    async with served(Pipeline(model=model)) as gw:
        with pytest.raises(openai.BadRequestError) as caught:
            await gw.sdk().chat.completions.create(
                model="m",
                messages=user("x"),
                tools=tools,
                tool_choice={"type": "function", "function": {"name": "g"}},
            )
    error = openai_error(caught.value.response.content)
    assert (error["param"], error["code"]) == ("tool_choice", "invalid_value")
    assert "'g'" in error["message"]
    assert model.requests == []


# What newer SDKs send to shape the reply, or to name its end user instead of ``user``.
NEWER: dict[str, Any] = {
    "verbosity": "low",
    "web_search_options": {"search_context_size": "low"},
    "safety_identifier": "hashed-user-42",
}


async def test_newer_sdk_parameters_reach_an_openai_upstream() -> None:
    """Bug caught: ``verbosity``, ``web_search_options`` and ``safety_identifier`` (which
    replaces ``user``), parameters of the SDK's own ``create``, were dropped as unknown
    fields: the model answered at its default length and search settings, and the upstream
    never learned the end user, all with a 200 and no word of it."""
    async with running(repeat=stream(openai_text(["ok"]))) as upstream:
        async with served(Pipeline(model=openai_upstream(upstream.url))) as gw:
            await gw.sdk().chat.completions.create(model="m", messages=user("x"), **NEWER)
    sent = upstream.requests[0].body
    assert {key: sent.get(key) for key in NEWER} == NEWER


async def test_an_anthropic_upstream_gets_safety_identifier_as_its_user_id() -> None:
    """Bug caught: ``safety_identifier``, the end user's id newer SDKs send instead of
    ``user``, dropped on the way to an Anthropic upstream, where ``user`` goes as
    ``metadata.user_id``."""
    async with running(repeat=stream(anthropic_text(["ok"]))) as upstream:
        model = AnthropicMessages("claude-x", base_url=upstream.url, api_key=UPSTREAM_KEY)
        async with served(Pipeline(model=model)) as gw:
            await gw.sdk().chat.completions.create(
                model="m", messages=user("x"), user="old-id", safety_identifier="new-id"
            )
    sent = upstream.requests[0].body
    assert sent["metadata"] == {"user_id": "new-id"}
    assert not {"user", "safety_identifier"} & set(sent)


@pytest.mark.parametrize("field", ["verbosity", "web_search_options"])
async def test_a_newer_parameter_an_anthropic_upstream_cannot_honour_is_400_naming_it(
    field: str,
) -> None:
    """Bug caught: ``verbosity`` or ``web_search_options`` silently dropped on the way to an
    Anthropic upstream, which has no form of them: the client got a reply of the default
    length, or one written without a search, with a 200."""
    async with running() as upstream:
        model = AnthropicMessages("claude-x", base_url=upstream.url, api_key=UPSTREAM_KEY)
        async with served(Pipeline(model=model)) as gw:
            with pytest.raises(openai.BadRequestError) as caught:
                await gw.sdk().chat.completions.create(
                    model="m", messages=user("x"), **{field: NEWER[field]}
                )
    error = openai_error(caught.value.response.content)
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert upstream.requests == []


async def test_moderation_is_400_naming_it() -> None:
    """Bug caught: ``moderation`` (moderate the input and output, maybe blocking them)
    dropped as an unknown field: the client got an unmoderated reply and no moderation
    results, with a 200."""
    model = ScriptedModel(["ok"])
    async with served(Pipeline(model=model)) as gw:
        with pytest.raises(openai.BadRequestError) as caught:
            await gw.sdk().chat.completions.create(
                model="m",
                messages=user("x"),
                moderation={
                    "model": "omni-moderation-latest",
                    "policy": {"output": {"mode": "block"}},
                },
            )
        reply = await gw.sdk().chat.completions.create(
            model="m", messages=user("x"), extra_body={"moderation": None}
        )
    error = openai_error(caught.value.response.content)
    assert (error["param"], error["code"]) == ("moderation", "unsupported_parameter")
    assert reply.choices[0].message.content == "ok"
    assert len(model.requests) == 1


@pytest.mark.parametrize(
    "refused",
    [
        {"content": None, "refusal": "I can't help with that."},
        {"content": [{"type": "refusal", "refusal": "I can't help with that."}]},
    ],
)
async def test_an_assistant_messages_refusal_reaches_the_upstream_as_its_text(
    refused: dict[str, Any],
) -> None:
    """Bug caught: an assistant message's ``refusal`` (how the API returns a model's
    refusal, which clients keep in their history) was dropped, leaving an empty assistant
    message upstream, and a ``refusal`` content part was a 400."""
    messages = [*user("q"), {"role": "assistant", **refused}, *user("why not?")]
    async with running(repeat=stream(openai_text(["ok"]))) as upstream:
        async with served(Pipeline(model=openai_upstream(upstream.url))) as gw:
            await gw.sdk().chat.completions.create(model="m", messages=messages)
    sent = upstream.requests[0].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "q"),
        ("assistant", "I can't help with that."),
        ("user", "why not?"),
    ]


@pytest.mark.parametrize("field", ["refusal", "text"])
async def test_a_content_part_whose_text_is_no_string_is_400_naming_the_field(field: str) -> None:
    """Bug caught: a ``refusal`` (or ``text``) part whose text was no string was refused as a
    kind of part the gateway does not accept, which it does, instead of naming the field."""
    model = ScriptedModel([])
    part = {"type": field, field: 3}
    body = {
        "model": "m",
        "messages": [*user("q"), {"role": "assistant", "content": [part]}, *user("x")],
    }
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == (f"messages[1].content[0].{field}", "invalid_type")
    assert "must be a string, got a number" in error["message"]
    assert model.requests == []


async def test_an_assistant_messages_refusal_that_is_no_text_is_400_naming_it() -> None:
    """Bug caught: an assistant message's ``refusal`` of the wrong type read as nothing,
    where the client sent something the gateway could not read."""
    model = ScriptedModel([])
    body = {
        "model": "m",
        "messages": [*user("q"), {"role": "assistant", "refusal": 3}, *user("x")],
    }
    async with served(Pipeline(model=model)) as gw, gw.http() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = openai_error(response.content)
    assert (error["param"], error["code"]) == ("messages[1].refusal", "invalid_type")
    assert model.requests == []
