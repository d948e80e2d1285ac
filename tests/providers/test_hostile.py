"""Hostile and unlucky input through the providers: JSON nested too deep, undecodable tool
arguments on the next request, a missing key, a local server that is not running."""

import json
import socket
import traceback
from typing import Any

import httpx
import pytest

from pipeline import (
    ModelToolCall,
    Pipeline,
    ProviderConnectionError,
    ProviderProtocolError,
    ProviderStatusError,
    tool,
)
from pipeline.logs import MemoryLog
from pipeline.providers import AnthropicMessages, OpenAIChat
from pipeline.providers._http import Endpoint, translate
from turns import Turn

from . import server as wire
from .server import ProtocolServer
from .support import KEY, collect
from .test_tool_turns import sent_results

DEEP = 100_000
DEEP_ARGUMENTS = '{"path": ' + "[" * DEEP + "]" * DEEP + "}"


def openai(server: ProtocolServer, **changes: Any) -> OpenAIChat:
    return OpenAIChat("gpt-test", base_url=f"{server.url}/v1", **{"api_key": KEY, **changes})


def anthropic(server: ProtocolServer, **changes: Any) -> AnthropicMessages:
    return AnthropicMessages("claude-test", base_url=server.url, **{"api_key": KEY, **changes})


def make(provider: str, server: ProtocolServer, **changes: Any) -> Any:
    return (openai if provider == "openai" else anthropic)(server, **changes)


def tool_stream(provider: str, fragments: list[str]) -> wire.Reply:
    if provider == "openai":
        return wire.stream(wire.openai_tool_calls([("call_a", "lookup", fragments)]))
    return wire.stream(
        (
            wire.anthropic_start(),
            *wire.anthropic_tool_block(0, "call_a", "lookup", fragments),
            *wire.anthropic_end("tool_use"),
        )
    )


def text_stream(provider: str, text: str) -> wire.Reply:
    if provider == "openai":
        return wire.stream(wire.openai_text([text]))
    return wire.stream(wire.anthropic_text([text]))


# --- JSON nested 100,000 deep ---------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_stream_event_nested_too_deep_is_a_protocol_error(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: json.loads's RecursionError escaping the parser (the turn died with a bare
    error instead of a ProviderProtocolError)."""
    deep = "[" * DEEP + "]" * DEEP
    name = "content_block_delta" if provider == "anthropic" else None
    prefix = f"event: {name}\n" if name else ""
    server.script(wire.stream([f"{prefix}data: {deep}\n\n".encode()]))
    with pytest.raises(ProviderProtocolError, match="nested too deeply"):
        await collect(make(provider, server))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_tool_arguments_nested_too_deep_get_an_invalid_arguments_result(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: a RecursionError from decoding arguments killing the turn, instead of an
    invalid_arguments result the model can correct."""
    ran: list[Any] = []

    @tool
    def lookup(path: str) -> str:
        ran.append(path)
        return "found"

    server.script(tool_stream(provider, [DEEP_ARGUMENTS]), text_stream(provider, "Sorry."))
    result = await Pipeline(model=make(provider, server), tools=[lookup]).run(Turn.start("find it"))
    assert (ran, result.reply.text) == ([], "Sorry.")
    [(call_id, content, _)] = sent_results(provider, server.requests[1].body)
    assert call_id == "call_a"
    assert content.startswith(
        "invalid arguments for tool 'lookup': the arguments are not valid JSON (nested too"
        " deeply to decode)"
    )
    assert result.audit.tools[0].result.error_class == "invalid_arguments"


# --- Undecodable arguments on the next request ----------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_undecodable_arguments_go_back_as_an_empty_object_and_the_model_reads_them(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: the raw text echoed in the assistant message of the next request (a gateway
    translating to Anthropic rejects the whole request), or the raw text lost to the model."""

    @tool
    def lookup(path: str) -> str:
        return "found"

    raw = '{"path": "READ'
    server.script(tool_stream(provider, [raw]), text_stream(provider, "Retrying."))
    result = await Pipeline(model=make(provider, server), tools=[lookup]).run(Turn.start("find it"))
    sent = server.requests[1].body
    if provider == "openai":
        [assistant] = [m for m in sent["messages"] if m["role"] == "assistant"]
        assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"
    else:
        [assistant] = [m for m in sent["messages"] if m["role"] == "assistant"]
        [use] = [b for b in assistant["content"] if b["type"] == "tool_use"]
        assert use["input"] == {}
    assert "READ" not in json.dumps(assistant)
    [(_, content, _)] = sent_results(provider, sent)
    assert repr(raw) in content  # the model reads what it sent
    assert result.audit.tools[0].call.meta["invalid_arguments"]["raw"] == raw


async def test_a_parsed_call_keeps_the_whole_raw_text_in_its_meta(server: ProtocolServer) -> None:
    """Catches: the meta keeping only the quoted start of long undecodable arguments."""
    raw = '{"path": "' + "x" * 1000
    server.script(tool_stream("openai", [raw]))
    events = await collect(openai(server))
    [call] = [e.call for e in events if isinstance(e, ModelToolCall)]
    assert call.meta["invalid_arguments"]["raw"] == raw
    assert len(call.meta["invalid_arguments"]["error"]) < 400


# --- No key ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 403, 404, 500])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_any_error_status_to_a_request_without_a_key_says_no_key_was_sent(
    server: ProtocolServer, provider: str, status: int
) -> None:
    """Catches: the missing-key hint given on 401 only (servers answer a missing key with
    400, 403, 404 or a 500)."""
    server.script(wire.json_error(status, {"error": {"message": "denied", "type": "x"}}))
    model = make(provider, server, api_key=None, api_key_env=None, max_retries=0)
    with pytest.raises(ProviderStatusError) as caught:
        await collect(model)
    assert caught.value.status == status
    assert "no API key was sent" in str(caught.value)
    assert "authorization" not in server.requests[0].headers
    assert "x-api-key" not in server.requests[0].headers


@pytest.mark.parametrize("api_key", ["", "  "])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_empty_api_key_argument_is_not_told_to_set_the_variable(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch, provider: str, api_key: str
) -> None:
    """Catches: api_key="" (which sends no key, the environment unread) answered with "set
    OPENAI_API_KEY or pass api_key=": the variable was set already, and setting it cannot
    help while the argument is given."""
    variable = f"{provider.upper()}_API_KEY"
    monkeypatch.setenv(variable, KEY)
    server.script(wire.json_error(401, {"error": {"message": "denied", "type": "auth"}}))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(make(provider, server, api_key=api_key, max_retries=0))
    message = str(caught.value)
    assert message.endswith(
        "no API key was sent: api_key is empty — pass the key as api_key=, or leave api_key"
        f" out (None) to read {variable}"
    )
    assert f"set {variable}" not in message


async def test_an_error_status_with_a_key_does_not_mention_keys(server: ProtocolServer) -> None:
    """Catches: the hint given when a key was sent (it would mislead)."""
    server.script(wire.json_error(500, {"error": {"message": "boom", "type": "x"}}))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(openai(server, max_retries=0))
    assert "API key" not in str(caught.value)


# --- A local server that is not running -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_refused_connection_to_a_local_base_url_names_the_server_expected(
    provider: str,
) -> None:
    """Catches: a bare 'ConnectError: All connection attempts failed' for a local server
    (Ollama, vLLM, llama.cpp) that is simply not running."""
    base = f"http://127.0.0.1:{_free_port()}"
    model: Any = (
        OpenAIChat("m", base_url=f"{base}/v1", api_key_env=None, max_retries=0)
        if provider == "openai"
        else AnthropicMessages("m", base_url=base, api_key=KEY, max_retries=0)
    )
    with pytest.raises(ProviderConnectionError) as caught:
        await collect(model)
    message = str(caught.value)
    kind = "OpenAI-compatible" if provider == "openai" else "Anthropic Messages"
    assert f"nothing accepted a connection at {base}" in message
    assert f"expected a local {kind} server there" in message
    assert "point base_url at the server you run" in message


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("http://localhost:11434/v1/chat/completions", "an Ollama server"),
        ("http://127.0.0.1:8000/v1/chat/completions", "a vLLM server"),
        ("http://[::1]:8080/v1/chat/completions", "a llama.cpp server"),
    ],
)
def test_the_default_ports_of_local_servers_name_them(url: str, server: str) -> None:
    """Catches: a hint that does not say which server usually listens there."""
    endpoint = Endpoint("openai", url, {}, None, httpx.Timeout(5), 0)
    error = translate(httpx.ConnectError("refused"), endpoint, streaming=False)
    assert isinstance(error, ProviderConnectionError)
    assert f"expected {server}" in str(error)


def test_a_refused_connection_to_a_remote_host_gets_no_local_hint() -> None:
    """Catches: the local-server hint given for api.openai.com."""
    endpoint = Endpoint("openai", "https://api.openai.com/v1/x", {}, None, httpx.Timeout(5), 0)
    error = translate(httpx.ConnectError("refused"), endpoint, streaming=False)
    assert "expected" not in str(error)
    assert "ConnectError: refused" in str(error)


# --- A stream that echoes the key ---------------------------------------------------------


def echoing_streams() -> list[Any]:
    """Streams whose content quotes the API key: each becomes a protocol error."""
    said = f"key {KEY} revoked"
    return [
        pytest.param(
            "openai",
            wire.stream((wire.sse({"error": {"type": "auth", "message": said}}),)),
            id="openai error event",
        ),
        pytest.param(
            "anthropic",
            wire.stream(
                (
                    wire.anthropic_start(),
                    wire.sse(
                        {"type": "error", "error": {"type": "auth", "message": said}}, "error"
                    ),
                )
            ),
            id="anthropic error event",
        ),
        pytest.param("openai", wire.stream((wire.sse(f"not json {KEY}"),)), id="openai bad json"),
        pytest.param(
            "anthropic",
            wire.stream((wire.sse(f"not json {KEY}", "message_start"),)),
            id="anthropic bad json",
        ),
    ]


@pytest.mark.parametrize(("provider", "reply"), echoing_streams())
async def test_an_error_quoting_what_the_stream_said_never_holds_the_key(
    server: ProtocolServer, provider: str, reply: wire.Reply
) -> None:
    """Catches: the key in a mid-stream error's message, or in the message of the exception
    it was raised from, when the upstream's error event or a garbled line echoes it (only
    errors about the HTTP exchange and error statuses were scrubbed)."""
    server.script(reply)
    with pytest.raises(ProviderProtocolError) as caught:
        await collect(make(provider, server))
    chain = "".join(traceback.format_exception(caught.value))
    assert KEY not in chain
    assert "[redacted]" in str(caught.value)


# --- An error body that echoes the key JSON-escaped -----------------------------------------

SLASHED_KEY = "sk-live/AbCdEf0123456789+xyz"


def escaped_echoes() -> list[Any]:
    """(key, how the error body writes it): escapes its JSON decoder turns back into the key."""
    every_char = "".join(f"\\u{ord(char):04X}" for char in KEY)
    return [
        pytest.param(SLASHED_KEY, SLASHED_KEY.replace("/", "\\/"), id="escaped slash"),
        pytest.param(KEY, every_char, id="unicode escapes"),
        pytest.param(KEY, KEY[:2] + "\\u002d" + KEY[3:], id="one unicode escape"),
    ]


@pytest.mark.parametrize(("key", "echoed"), escaped_echoes())
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_error_body_echoing_the_key_json_escaped_never_shows_it(
    server: ProtocolServer, provider: str, key: str, echoed: str
) -> None:
    """Catches: the body scrubbed before it was JSON-decoded, so that the decoded provider
    message put the key in the error's message (and a span's exception.message), and the
    escaped key stayed in `.body`."""
    message = '"message":"Incorrect key: ' + echoed + '"'
    body = '{"error":{"type":"invalid_request_error",' + message + "}}"
    server.script(wire.json_error(401, body))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(make(provider, server, api_key=key))
    error = caught.value
    assert key not in str(error)
    assert "invalid_request_error: Incorrect key: [redacted]" in str(error)
    assert json.loads(error.body)["error"]["message"] == "Incorrect key: [redacted]"


# --- A key of a published format: its public prefix stays readable ------------------------

PROJECT_KEY = "sk-proj-Zq8vLr2TnW5yXb7Kc1Md4Pf6Gh9Jabcd"


def masked_hints() -> list[Any]:
    """(the error's message as the upstream writes it, as the user must read it)."""
    stars = "*" * 28
    hint = f"Incorrect API key provided: sk-proj-{stars}abcd. Find your key in your account."
    return [
        pytest.param(hint, hint, id="the upstream's own masked hint"),
        pytest.param(
            "Incorrect API key provided: sk-proj-Z",
            "Incorrect API key provided: [redacted]",
            id="one secret character past the prefix",
        ),
        pytest.param(
            "Incorrect API key provided: sk-proj-Zq8vLr2T",
            "Incorrect API key provided: [redacted]",
            id="a cut quote",
        ),
    ]


@pytest.mark.parametrize(("message", "shown"), masked_hints())
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_keys_public_prefix_stays_readable_and_its_secret_does_not(
    server: ProtocolServer, provider: str, message: str, shown: str
) -> None:
    """Catches: every run of a key's first eight characters scrubbed, which for an OpenAI
    project key is its public prefix ``sk-proj-`` alone: the upstream's masked hint of which
    key was sent (``sk-proj-***...abcd``) reached the user as ``[redacted]***...abcd``. The
    other two cases guard the other side: one character of the secret past the prefix is
    still scrubbed."""
    body = {"error": {"type": "invalid_request_error", "message": message}}
    server.script(wire.json_error(401, json.dumps(body)))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(make(provider, server, api_key=PROJECT_KEY))
    assert f"invalid_request_error: {shown}" in str(caught.value)
    assert json.loads(caught.value.body)["error"]["message"] == shown


async def test_a_long_public_prefix_with_one_secret_character_is_scrubbed(
    server: ProtocolServer,
) -> None:
    """Guards the public prefixes: one longer than eight characters (Anthropic's
    ``sk-ant-api03-``, 13) must not let the secret's first characters through when a quote is
    cut a few characters past it, as a rule of "the prefix is public, so skip it" would."""
    key = "sk-ant-api03-Hx7Qm2Lp9Rt4Vw6Yz1Bc3Dn5Fg8Jk"
    body = {"error": {"type": "authentication_error", "message": f"bad key {key[:15]}"}}
    server.script(wire.json_error(401, json.dumps(body)))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(make("anthropic", server, api_key=key))
    assert "authentication_error: bad key [redacted]" in str(caught.value)
    assert key[13:15] not in caught.value.body


# --- A quote cut inside the key, a request id that echoes it --------------------------------


def streams_cut_inside_the_key() -> list[Any]:
    """Streams whose error quotes 200 characters of an event that holds the key past them."""
    usage = '{"choices": [], "usage": {"prompt_tokens": "' + "x" * 185 + KEY + '"}}'
    start = {"type": "message_start", "message": {"usage": {"input_tokens": "x" * 185 + KEY}}}
    return [
        pytest.param("openai", wire.sse("x" * 190 + KEY), id="openai bad json"),
        pytest.param("openai", wire.sse(usage), id="openai bad usage count"),
        pytest.param("anthropic", wire.sse("x" * 190 + KEY, "message_start"), id="anthropic json"),
        pytest.param("anthropic", wire.sse(start, "message_start"), id="anthropic bad count"),
    ]


@pytest.mark.parametrize(("provider", "event"), streams_cut_inside_the_key())
async def test_a_quote_cut_inside_the_key_shows_none_of_it(
    server: ProtocolServer, provider: str, event: bytes
) -> None:
    """Catches: an event quoted to 200 characters (by us, or by Python's own int() message)
    before the key was scrubbed: the cut key no longer matched, and its first characters
    stayed in the message."""
    server.script(wire.stream((event,)))
    with pytest.raises(ProviderProtocolError) as caught:
        await collect(make(provider, server))
    chain = "".join(traceback.format_exception(caught.value))
    assert KEY[:8] not in chain
    assert "[redacted]" in str(caught.value)


@pytest.mark.parametrize("header", ["x-request-id", "request-id"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_request_id_that_echoes_the_key_is_scrubbed(
    server: ProtocolServer, provider: str, header: str
) -> None:
    """Catches: a key echoed in the request id header (a misconfigured proxy) put in the
    message and in `.request_id` unscrubbed."""
    server.script(wire.json_error(401, {}, [(header, f"req-{KEY}")]))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(make(provider, server))
    assert caught.value.request_id == "req-[redacted]"
    assert KEY not in str(caught.value)
    assert "(request id req-[redacted])" in str(caught.value)


async def test_a_streamed_errors_request_id_that_echoes_the_key_is_scrubbed(
    server: ProtocolServer,
) -> None:
    """Catches: the request id of a 2xx answer, quoted by every mid-stream error and kept in
    `.request_id`, left unscrubbed."""
    server.script(
        wire.stream((wire.sse("{oops"),), headers=(*wire.Reply().headers, ("x-request-id", KEY)))
    )
    with pytest.raises(ProviderProtocolError) as caught:
        await collect(make("openai", server))
    assert caught.value.request_id == "[redacted]"


# --- A character's UTF-16 halves in separate deltas -----------------------------------------


async def two_turns(provider: str, server: ProtocolServer, pieces: list[str]) -> str:
    """Two turns of a session whose first reply streams `pieces`: the first reply's text,
    once the second turn has gone through."""
    first_reply = (
        wire.stream(wire.openai_text(pieces))
        if provider == "openai"
        else wire.stream(wire.anthropic_text(pieces))
    )
    server.script(first_reply, text_stream(provider, "ok"))
    pipe = Pipeline(model=make(provider, server))
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        first = await session.send("one")
        second = await session.send("two")
    assert (second.reply.text, len(server.requests)) == ("ok", 2)
    return first.reply.text


def sent(server: ProtocolServer, index: int) -> str:
    """The text of a request's body, as the server decoded it."""
    return json.dumps(server.requests[index].body, ensure_ascii=False)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_character_split_into_utf16_halves_across_deltas_is_rejoined(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: an emoji whose UTF-16 halves came in separate deltas ("\\ud83d" then
    "\\ude00") kept as two lone surrogates in the committed reply, which made every later
    turn of the conversation fail before sending (UnicodeEncodeError)."""
    text = await two_turns(provider, server, ["hi \ud83d", "\ude00 there"])
    assert text == "hi \U0001f600 there"
    assert "hi \U0001f600 there" in sent(server, 1)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_lone_utf16_half_goes_out_as_a_replacement_character(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: a half never completed (kept as the server sent it) making the request body
    unencodable, so that the conversation could never be continued."""
    text = await two_turns(provider, server, ["a \ud83d", "b \ude00", "c \ud83d"])
    assert text == "a \ud83db \ude00c \ud83d"
    assert "a \ufffdb \ufffdc \ufffd" in sent(server, 1)
