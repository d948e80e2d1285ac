"""The shared shell (pipeline/providers/_http.py): retry policy, error seam, and every fault
the protocol server can play, each through `provider.stream` and the important ones through
`Pipeline.run` too."""

import datetime
import decimal
import email.utils
import json
import os
import re
import socket
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
import trio
import trio.testing

from pipeline import (
    ConfigError,
    ModelFinish,
    ModelRequest,
    ModelText,
    Pipeline,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
    RateLimited,
    RequestError,
    cont,
    tool,
)
from pipeline.providers import AnthropicMessages, OpenAIChat, _http
from pipeline.providers._http import (
    ERROR_BODY_CAP,
    backoff,
    retry_after,
    retry_delay,
    scrub,
    should_retry,
)
from turns import Message, ToolCall, ToolResult, Turn, Usage

from . import server as wire
from .server import ProtocolServer
from .support import KEY, collect, fails_in_pipeline, hi

OPENAI_ERROR = {
    "error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}
}
SERVER_ERROR = {"error": {"message": "boom", "type": "server_error"}}


def openai(server: ProtocolServer, **changes: Any) -> OpenAIChat:
    return OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY, **changes)


def anthropic(server: ProtocolServer, **changes: Any) -> AnthropicMessages:
    return AnthropicMessages("claude-test", base_url=server.url, api_key=KEY, **changes)


async def fails(model: Any, error: type[ProviderError]) -> ProviderError:
    with pytest.raises(error) as caught:
        await collect(model)
    assert KEY not in str(caught.value)
    return caught.value


# --- The retry policy (pure) ----------------------------------------------------------------


def test_retry_after_ms_wins_over_retry_after() -> None:
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5


def test_retry_after_in_seconds() -> None:
    assert retry_after({"retry-after": "2"}) == 2.0


def test_retry_after_as_an_http_date() -> None:
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after({"retry-after": date}, now=1_000_000) == 30.0


def test_garbage_retry_after_is_no_hint() -> None:
    assert retry_after({"retry-after": "soon"}) is None


@pytest.fixture
def local_time_five_hours_behind_utc() -> Iterator[None]:
    """The process's local time zone set to UTC-5 for the test, then restored."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "EST+5"
    time.tzset()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


@pytest.mark.parametrize(
    "date",
    ["Sun Nov  6 08:49:37 1994", "Sun, 06 Nov 1994 08:49:37", "Sun, 06 Nov 1994 08:49:37 -0000"],
    ids=["asctime", "no-zone", "unknown-zone"],
)
@pytest.mark.usefixtures("local_time_five_hours_behind_utc")
def test_a_retry_after_date_without_a_zone_is_read_as_gmt(date: str) -> None:
    """Bug caught: a retry-after date without a zone (HTTP's asctime format, which is GMT) was
    read in the machine's local time, so 7 s asked for became 18007 s five hours west of UTC
    (no retry at all) and nothing east of it."""
    now = datetime.datetime(1994, 11, 6, 8, 49, 30, tzinfo=datetime.UTC).timestamp()
    assert retry_after({"retry-after": date}, now=now) == 7.0


ABSURD_DATES = [
    "Mon, 01 Jan 99999999999 00:00:00 GMT",
    "Mon, 01 Jan 2025 00:00:00 +99999999999999999999",
    "Mon, 01 Jan 2025 00:00:99999999999999999999 GMT",
]


@pytest.mark.parametrize("date", ABSURD_DATES)
async def test_a_retry_after_date_past_any_calendar_is_no_hint(
    server: ProtocolServer, date: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Bug caught: a 429 whose retry-after date had a year or an offset too large for a
    datetime raised a bare OverflowError out of the call, where garbage is no hint."""
    assert retry_after({"retry-after": date}) is None
    server.script(
        wire.json_error(429, OPENAI_ERROR, [("retry-after", date)]),
        wire.stream(wire.openai_text(["ok"])),
    )
    assert (await collect(openai(server)))[0] == ModelText("ok")


@pytest.mark.parametrize(("made", "delay"), [(0, 0.5), (1, 1.0), (2, 2.0), (5, 8.0), (9, 8.0)])
def test_backoff_doubles_from_half_a_second_up_to_eight(made: int, delay: float) -> None:
    assert backoff(made, 0.0) == delay


def test_jitter_shortens_the_backoff_by_at_most_a_quarter() -> None:
    assert backoff(1, 0.999) == pytest.approx(0.75, abs=0.001)


@pytest.mark.parametrize(
    ("status", "retried"),
    [
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (529, True),
        (400, False),
        (401, False),
        (402, False),
        (404, False),
    ],
)
def test_retried_statuses(status: int, retried: bool) -> None:
    assert should_retry(status, {}, "") is retried


def test_x_should_retry_false_forbids_a_retry() -> None:
    assert not should_retry(503, {"x-should-retry": "false"}, "")


def test_x_should_retry_true_forces_a_retry() -> None:
    assert should_retry(400, {"x-should-retry": "true"}, "")


def test_insufficient_quota_is_not_retried() -> None:
    assert not should_retry(429, {}, '{"error": {"code": "insufficient_quota"}}')


def test_a_hint_beyond_the_cap_means_no_retry() -> None:
    assert retry_delay(0, {"retry-after": "120"}, 0.0) is None


# --- Retries over the socket ----------------------------------------------------------------


async def test_429_then_success_waits_the_servers_hint(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(
        wire.json_error(429, OPENAI_ERROR, [("retry-after", "3")]),
        wire.stream(wire.openai_text(["ok"])),
    )
    started = trio.current_time()
    events = await collect(openai(server))
    assert (trio.current_time() - started, events[0]) == (pytest.approx(3.0), ModelText("ok"))


async def test_retry_after_ms_is_honoured(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(
        wire.json_error(429, OPENAI_ERROR, [("retry-after-ms", "250")]),
        wire.stream(wire.openai_text(["ok"])),
    )
    started = trio.current_time()
    await collect(openai(server))
    assert trio.current_time() - started == pytest.approx(0.25)


async def test_500_then_success_backs_off_and_succeeds(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(wire.json_error(500, SERVER_ERROR), wire.stream(wire.openai_text(["ok"])))
    started = trio.current_time()
    await collect(openai(server))
    assert 0.375 <= trio.current_time() - started <= 0.5
    assert len(server.requests) == 2


async def test_anthropic_529_overloaded_is_retried(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.script(wire.json_error(529, overloaded), wire.stream(wire.anthropic_text(["ok"])))
    assert (await collect(anthropic(server)))[0] == ModelText("ok")


async def test_rate_limited_after_the_retry_budget(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(
        *[wire.json_error(429, OPENAI_ERROR, [("retry-after", "2"), ("x-request-id", "req_42")])]
        * 3
    )
    error = await fails(openai(server), RateLimited)
    assert (error.status, error.retry_after, error.request_id, len(server.requests)) == (
        429,
        2.0,
        "req_42",
        3,
    )  # type: ignore[attr-defined]
    assert "requests: Rate limit reached" in str(error)


async def test_rate_limited_through_the_pipeline(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(*[wire.json_error(429, OPENAI_ERROR, [("retry-after", "1")])] * 3)
    error = await fails_in_pipeline(openai(server), RateLimited)
    assert error.retry_after == 1.0


async def test_max_retries_zero_sends_once(server: ProtocolServer) -> None:
    server.script(wire.json_error(500, SERVER_ERROR))
    await fails(openai(server, max_retries=0), ProviderStatusError)
    assert len(server.requests) == 1


async def test_x_should_retry_false_stops_at_the_first_answer(server: ProtocolServer) -> None:
    server.script(wire.json_error(503, SERVER_ERROR, [("x-should-retry", "false")]))
    error = await fails(openai(server), ProviderStatusError)
    assert (error.status, len(server.requests)) == (503, 1)


async def test_a_long_hint_gives_up_at_once_with_the_hint(server: ProtocolServer) -> None:
    server.script(wire.json_error(429, OPENAI_ERROR, [("retry-after", "600")]))
    error = await fails(openai(server), RateLimited)
    assert (error.retry_after, len(server.requests)) == (600.0, 1)  # type: ignore[attr-defined]


async def test_connection_refused_is_retried_then_a_connection_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    started = trio.current_time()
    await fails(model, ProviderConnectionError)
    assert trio.current_time() - started >= 0.375 + 0.75  # two backoffs: 0.5 s and 1 s, jittered


async def test_a_connection_error_after_retries_says_how_many_attempts_were_made(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Catches: the connection error raised once the retries were spent reading as if the
    request had been tried once, where a status error says "after 3 attempts"."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    error = await fails(model, ProviderConnectionError)
    assert str(error).endswith(" — after 3 attempts")
    once = OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    assert "attempts" not in str(await fails(once, ProviderConnectionError))


def error_body_cut_short(status: int = 503, stall: bool = False) -> wire.Reply:
    """An error answer whose JSON body breaks off (no final chunk, the connection closed), or
    stalls."""
    head = (("content-type", "application/json"),)
    return wire.Reply(status, head, (b'{"error": {"message": "overl',), complete=False, stall=stall)


@pytest.mark.parametrize("stall", [False, True], ids=["cut", "stalled"])
async def test_a_5xx_whose_body_is_cut_short_or_stalls_is_retried(
    server: ProtocolServer, stall: bool
) -> None:
    """Catches: a failure while reading an error body raised at once as a connection error
    "before any response", losing the 503 (every 5xx is retried)."""
    server.script(error_body_cut_short(stall=stall), wire.stream(wire.openai_text(["ok"])))
    events = await collect(openai(server, timeout=httpx.Timeout(5, read=0.2)))
    assert (events[0], len(server.requests)) == (ModelText("ok"), 2)


async def test_an_error_body_cut_short_gives_the_status_error_with_what_arrived(
    server: ProtocolServer,
) -> None:
    """Catches: the status lost (a ProviderConnectionError with .status None) when the retries
    run out on error bodies that break off."""
    server.script(error_body_cut_short(), error_body_cut_short())
    error = await fails(openai(server, max_retries=1), ProviderStatusError)
    assert (error.status, error.body, len(server.requests)) == (  # type: ignore[attr-defined]
        503,
        '{"error": {"message": "overl',
        2,
    )
    assert "answered HTTP 503" in str(error)
    assert "its body was cut short (RemoteProtocolError" in str(error)


def huge_error_body(status: int = 500, *, endless: bool = False) -> wire.Reply:
    """An error answer whose body is far over the cap: 16 MiB with a Content-Length, or (when
    `endless`) two caps' worth and then nothing more, the body never ending."""
    head = (("content-type", "text/html"),)
    if endless:
        return wire.Reply(status, head, (b"x" * 2 * ERROR_BODY_CAP,), complete=False, stall=True)
    return wire.Reply(status, head, (b"x" * 16 * 1024 * 1024,), "length")


@pytest.mark.parametrize("endless", [False, True], ids=["16MiB", "endless"])
async def test_a_huge_error_body_is_cut_at_the_cap(server: ProtocolServer, endless: bool) -> None:
    """Catches: an error body read whole, however large, and kept in
    ProviderStatusError.body (a 100 MB 500 cost 350 MB), and one that never ends holding the
    call until the read timeout."""
    server.script(huge_error_body(endless=endless))
    with anyio.fail_after(5):
        error = await fails_in_pipeline(openai(server, max_retries=0), ProviderStatusError)
    assert (error.status, error.body) == (500, "x" * ERROR_BODY_CAP)
    assert f"its body was cut short (at {ERROR_BODY_CAP} bytes" in str(error)


@pytest.mark.parametrize("kept", [8, 13, len(KEY) - 1])
async def test_a_key_the_cap_cuts_through_is_not_shown(server: ProtocolServer, kept: int) -> None:
    """Catches: the start of a key that the cap cuts through left in the body (whole keys
    are scrubbed; one cut short must be too)."""
    before = b"x" * (ERROR_BODY_CAP - kept)
    body = before + KEY.encode() + b"y" * ERROR_BODY_CAP
    server.script(wire.Reply(500, (("content-type", "text/plain"),), (body,), "length"))
    error = await fails(openai(server, max_retries=0), ProviderStatusError)
    assert error.body == before.decode() + "[redacted]"  # type: ignore[attr-defined]
    assert KEY[:8] not in str(error)


async def test_a_5xx_with_a_huge_body_is_still_retried(server: ProtocolServer) -> None:
    """Catches: the cap changing the retry decision, or a body that never ends holding the
    call until the read timeout before the retry."""
    server.script(huge_error_body(503, endless=True), wire.stream(wire.openai_text(["ok"])))
    with anyio.fail_after(5):
        events = await collect(openai(server))
    assert (events[0], len(server.requests)) == (ModelText("ok"), 2)


async def test_an_error_body_that_trickles_is_read_for_a_bounded_time(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: an error body sent a byte at a time holding the call for as long as it lasts
    (the read timeout bounds only the silence between bytes)."""
    monkeypatch.setattr(_http, "ERROR_BODY_SECONDS", 0.3)  # 10 s in earnest: too long to wait
    head = (("content-type", "text/plain"),)
    server.script(wire.Reply(503, head, (b"x",) * 1000, pace=0.02))  # 20 s in all
    with anyio.fail_after(5):
        error = await fails(openai(server, max_retries=0), ProviderStatusError)
    assert 0 < len(error.body) < 1000  # type: ignore[attr-defined]
    assert "its body was cut short (not finished after 0.3 s" in str(error)


# --- Compressed bodies ------------------------------------------------------------------------

MEMORY_BOUND = 8 * 1024 * 1024
"""The most a call may allocate at its peak while refusing a gzip bomb: the caps (64 KiB of
error body, 1 MiB of line) and a few pieces, with room to spare. Inflating one read of the
bomb whole takes about 64 MiB."""


async def fails_within(model: Any, error: type[ProviderError], memory: int) -> ProviderError:
    """`fails`, the call allocating less than `memory` bytes at its peak (tracemalloc traces
    every allocation of the interpreter, zlib's output included)."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        failure = await fails(model, error)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    assert peak < memory, f"{peak} bytes allocated at the peak"
    return failure


def gzip_bomb_reply(status: int, content_type: str) -> wire.Reply:
    """A gigabyte of zeros as a megabyte of gzip."""
    head = (("content-type", content_type), ("content-encoding", "gzip"))
    return wire.Reply(status, head, wire.pieces_of(wire.gzip_bomb()))


async def test_a_gzip_bomb_error_body_is_cut_at_the_cap_in_bounded_memory(
    server: ProtocolServer,
) -> None:
    """Catches: the error body's cap applied after httpx inflated a whole read (a 64 KiB read
    of a gzip bomb is 64 MiB), so a megabyte of gzip could cost gigabytes."""
    server.script(gzip_bomb_reply(500, "text/html"))
    error = await fails_within(openai(server, max_retries=0), ProviderStatusError, MEMORY_BOUND)
    assert (error.status, error.body) == (500, "\0" * ERROR_BODY_CAP)  # type: ignore[attr-defined]
    assert f"its body was cut short (at {ERROR_BODY_CAP} bytes" in str(error)


async def test_a_gzip_bomb_event_stream_is_refused_at_max_line_bytes_in_bounded_memory(
    server: ProtocolServer,
) -> None:
    """Catches: max_line_bytes applied after httpx inflated a whole read of the stream (a
    64 KiB read of a gzip bomb is 64 MiB), so a megabyte of gzip could cost gigabytes."""
    server.script(gzip_bomb_reply(200, "text/event-stream"))
    model = openai(server, max_line_bytes=1024 * 1024)
    error = await fails_within(model, ProviderProtocolError, MEMORY_BOUND)
    assert "event-stream line longer than max_line_bytes=1048576 bytes" in str(error)


async def test_requests_accept_gzip_and_deflate_only(server: ProtocolServer) -> None:
    """Catches: the codings asked for left to httpx, which adds br and zstd wherever their
    packages are installed (those are not decoded within a bound)."""
    server.script(wire.stream(wire.openai_text(["ok"])))
    await collect(openai(server))
    assert server.requests[0].headers["accept-encoding"] == "gzip, deflate"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
async def test_a_compressed_event_stream_gives_the_same_events(
    server: ProtocolServer, encoding: str
) -> None:
    """Catches: a compressed stream no longer decoded once the shell reads raw bytes (raw
    deflate, which servers also send as "deflate", included)."""
    body = wire.compressed(b"".join(wire.openai_text(["Hello", ", world"])), encoding)
    named = "deflate" if encoding == "raw-deflate" else encoding
    head = (("content-type", "text/event-stream"), ("content-encoding", named))
    server.script(wire.Reply(200, head, wire.pieces_of(body, 5)))
    assert await collect(openai(server)) == [
        ModelText("Hello"),
        ModelText(", world"),
        ModelFinish("stop", Usage(9, 2)),
    ]


async def test_a_gzip_error_body_keeps_the_providers_message(server: ProtocolServer) -> None:
    """Catches: a compressed error body no longer decoded once the shell reads raw bytes."""
    body = wire.compressed(json.dumps(OPENAI_ERROR).encode())
    head = (("content-type", "application/json"), ("content-encoding", "gzip"))
    server.script(wire.Reply(400, head, (body,), "length"))
    error = await fails(openai(server), ProviderStatusError)
    assert error.body == json.dumps(OPENAI_ERROR)  # type: ignore[attr-defined]
    assert "requests: Rate limit reached" in str(error)


async def test_an_event_stream_in_a_coding_not_asked_for_is_refused_by_name(
    server: ProtocolServer,
) -> None:
    """Catches: a brotli stream passed on still compressed (parsed as garbage), or decoded
    whole where the brotli package is installed."""
    head = (("content-type", "text/event-stream"), ("content-encoding", "br"))
    server.script(wire.Reply(200, head, (b"\x1b\x00\x00",)))
    error = await fails(openai(server), ProviderProtocolError)
    assert "answered 200" in str(error)
    assert "content-encoding 'br' is not one decoded here" in str(error)


async def test_an_error_body_in_a_coding_not_asked_for_keeps_its_status(
    server: ProtocolServer,
) -> None:
    """Catches: a zstd error body kept compressed as the error's body (or decoded whole where
    the zstandard package is installed), or its status lost."""
    head = (("content-type", "application/json"), ("content-encoding", "zstd"))
    server.script(wire.Reply(400, head, (b"(\xb5/\xfd",), "length"))
    error = await fails(openai(server), ProviderStatusError)
    assert (error.status, error.body) == (400, "")  # type: ignore[attr-defined]
    assert "its body was cut short (not read: its content-encoding 'zstd'" in str(error)


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
async def test_an_injected_transports_response_built_with_its_content_is_read(
    encoding: str,
) -> None:
    """Catches: a body httpx has already read (an ``httpx.Response(content=...)`` an injected
    transport returns, decoded when it was built) read again as raw bytes: StreamConsumed."""
    body = b"".join(wire.openai_text(["ok"]))
    if encoding == "gzip":
        body = wire.compressed(body)

    def answer(request: httpx.Request) -> httpx.Response:
        head = {"content-type": "text/event-stream", "content-encoding": encoding}
        return httpx.Response(200, headers=head, content=body)

    transport = httpx.MockTransport(answer)
    model = OpenAIChat("m", base_url="http://provider.test/v1", api_key=KEY, transport=transport)
    assert (await collect(model))[0] == ModelText("ok")


async def test_a_gzip_stream_that_does_not_decode_is_a_protocol_error(
    server: ProtocolServer,
) -> None:
    """Catches: a body that does not decode raised as a bare zlib error, or leaving httpx's
    byte generators unfinished (the loop reports them as garbage collected)."""
    head = (("content-type", "text/event-stream"), ("content-encoding", "gzip"))
    server.script(wire.Reply(200, head, (b"data: this is not gzip\n\n",)))
    error = await fails(openai(server), ProviderProtocolError)
    assert "its gzip body does not decode" in str(error)


# --- Non-2xx answers --------------------------------------------------------------------------


async def test_401_is_a_status_error_with_body_and_request_id_and_no_key(
    server: ProtocolServer,
) -> None:
    body = {
        "error": {
            "message": f"Incorrect API key provided: {KEY}.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    server.script(wire.json_error(401, body, [("x-request-id", "req_7")]))
    error = await fails(openai(server), ProviderStatusError)
    assert (type(error), error.status, error.request_id, len(server.requests)) == (
        ProviderStatusError,
        401,
        "req_7",
        1,
    )
    assert "invalid_request_error: Incorrect API key provided" in str(error)
    assert KEY not in error.body  # type: ignore[attr-defined]


async def test_401_through_the_pipeline_names_the_providers_error(server: ProtocolServer) -> None:
    body = {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        "request_id": "req_9",
    }
    server.script(wire.json_error(401, body, [("request-id", "req_9")]))
    error = await fails_in_pipeline(anthropic(server), ProviderStatusError)
    assert "authentication_error: invalid x-api-key" in str(error)
    assert error.request_id == "req_9"


async def test_401_without_a_key_says_which_variable_to_set(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.script(wire.json_error(401, {"error": {"message": "no key", "type": "auth"}}))
    error = await fails(OpenAIChat("m", base_url=f"{server.url}/v1"), ProviderStatusError)
    assert "OPENAI_API_KEY" in str(error)


async def test_a_200_that_is_not_an_event_stream_is_a_protocol_error(
    server: ProtocolServer,
) -> None:
    server.script(wire.Reply(200, (("content-type", "application/json"),), (b"{}",), "length"))
    error = await fails(openai(server), ProviderProtocolError)
    assert "application/json" in str(error)


@pytest.mark.parametrize("provider", [openai, anthropic])
async def test_a_200_json_error_keeps_the_providers_type_and_message(
    server: ProtocolServer, provider: Any
) -> None:
    """Catches: a server answering an error with 200 and a JSON body (not an event
    stream) reported without a word of what the body said, so the user saw a content-type
    complaint instead of the provider's reason."""
    error = {"error": {"type": "invalid_request_error", "message": f"context too long {KEY}"}}
    server.script(wire.json_error(200, error))
    raised = await fails(provider(server), ProviderProtocolError)
    assert "invalid_request_error: context too long [redacted]" in str(raised)
    assert "text/event-stream" in str(raised)


# --- Faults inside the stream ---------------------------------------------------------------


async def test_bytes_one_at_a_time_give_the_same_openai_events(server: ProtocolServer) -> None:
    server.script(wire.stream(wire.openai_text(["é😀", "\u2028 ok"]), bytewise=True))
    assert await collect(openai(server)) == [
        ModelText("é😀"),
        ModelText("\u2028 ok"),
        ModelFinish("stop", Usage(9, 2)),
    ]


async def test_bytes_one_at_a_time_give_the_same_anthropic_events(server: ProtocolServer) -> None:
    server.script(
        wire.stream(wire.anthropic_text(["é😀", "\u2029"]), bytewise=True, framing="close")
    )
    assert await collect(anthropic(server)) == [
        ModelText("é😀"),
        ModelText("\u2029"),
        ModelFinish("stop", Usage(12, 3)),
    ]


async def test_a_chunked_stream_cut_before_done_is_a_protocol_error(server: ProtocolServer) -> None:
    pieces = wire.openai_text(["a", "b"])[:-1]
    server.script(wire.stream(pieces, complete=False))
    error = await fails(openai(server), ProviderProtocolError)
    assert len(server.requests) == 1  # never retried once the stream started
    assert "cut off" in str(error)


async def test_a_close_delimited_stream_cut_before_done_is_a_protocol_error(
    server: ProtocolServer,
) -> None:
    server.script(wire.stream(wire.openai_text(["a"])[:-1], framing="close"))
    error = await fails_in_pipeline(openai(server), ProviderProtocolError)
    assert "before [DONE]" in str(error)


async def test_an_anthropic_stream_without_message_stop_is_a_protocol_error(
    server: ProtocolServer,
) -> None:
    server.script(wire.stream(wire.anthropic_text(["a"])[:-1], framing="close"))
    error = await fails_in_pipeline(anthropic(server), ProviderProtocolError)
    assert "before message_stop" in str(error)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_connection_reset_after_a_2xx_is_a_protocol_error(
    server: ProtocolServer, provider: str
) -> None:
    """Catches: a TCP reset in the middle of a reply raised as a ProviderConnectionError, the
    error of a server that could not be reached (which callers retry), where the docs say a
    connection cut after a 2xx is a ProviderProtocolError: the reply had begun."""
    pieces = (
        wire.openai_text(["Hel"])[:2] if provider == "openai" else wire.anthropic_text(["Hel"])[:4]
    )
    server.script(wire.stream(pieces, reset=True))
    read = anyio.Event()
    server.before_reset = read.wait  # a reset discards what the client has not read yet
    model = openai(server) if provider == "openai" else anthropic(server)
    events: list[Any] = []

    async def read_all() -> None:
        async with model.stream(hi()) as stream:
            async for event in stream:
                events.append(event)
                read.set()

    with pytest.raises(ProviderProtocolError) as caught:
        await read_all()
    assert events == [ModelText("Hel")]
    assert "was cut off or garbled" in str(caught.value)
    assert len(server.requests) == 1


async def test_an_openai_mid_stream_error_keeps_type_and_message(server: ProtocolServer) -> None:
    pieces = (*wire.openai_text(["partial"])[:2], wire.sse(SERVER_ERROR))
    server.script(wire.stream(pieces))
    error = await fails_in_pipeline(openai(server), ProviderProtocolError)
    assert ("server_error: boom" in str(error), len(server.requests)) == (True, 1)


async def test_an_anthropic_error_event_keeps_type_and_message(server: ProtocolServer) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    pieces = (*wire.anthropic_text(["partial"])[:4], wire.sse(overloaded, "error"))
    server.script(wire.stream(pieces, framing="close"))
    error = await fails_in_pipeline(anthropic(server), ProviderProtocolError)
    assert "overloaded_error: Overloaded" in str(error)


def huge_error(where: str) -> wire.Reply:
    """An error whose message is a megabyte (60 KB in an error body, under its cap): in an OpenAI
    error chunk, in an Anthropic error event, in a 400's body or in a 200's JSON body."""
    if where == "openai-chunk":
        error = {"error": {"type": "server_error", "message": "x" * 1_000_000}}
        return wire.stream((*wire.openai_text(["partial"])[:2], wire.sse(error)))
    if where == "anthropic-event":
        error = {"type": "error", "error": {"type": "api_error", "message": "x" * 1_000_000}}
        return wire.stream((*wire.anthropic_text(["partial"])[:4], wire.sse(error, "error")))
    error = {"error": {"type": "invalid_request_error", "message": "x" * 60_000}}
    return wire.json_error(400 if where == "status" else 200, error)


@pytest.mark.parametrize("where", ["openai-chunk", "anthropic-event", "status", "200-json"])
async def test_a_huge_error_message_is_quoted_in_bounded_length(
    server: ProtocolServer, where: str
) -> None:
    """Bug caught: the provider's own error message was quoted whole in the error, a 1 MB
    mid-stream error making a 1 MB exception message (in every log line and traceback)."""
    server.script(huge_error(where))
    model = anthropic(server) if where == "anthropic-event" else openai(server)
    error = await fails(model, ProviderError)
    message = str(error)
    assert len(message) < 10_000
    assert re.search(r"x{1000}\.\.\. \(\d+ more characters\)", message)
    if where == "status":
        assert error.body.endswith("x" * 1000 + '"}}')  # type: ignore[attr-defined]


async def test_invalid_json_in_a_data_line_is_a_protocol_error(server: ProtocolServer) -> None:
    server.script(wire.stream((wire.openai_text(["a"])[0], b'data: {"choices": [\n\n')))
    error = await fails_in_pipeline(openai(server), ProviderProtocolError)
    assert "not valid JSON" in str(error)


async def test_a_silent_server_is_an_idle_timeout(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(wire.stream(wire.openai_text(["a"])[:2], stall=True))
    model = openai(server, timeout=httpx.Timeout(60, read=5))
    started = trio.current_time()
    error = await fails(model, ProviderTimeout)
    assert (trio.current_time() - started, len(server.requests)) == (pytest.approx(5), 1)
    assert "5" in str(error)


async def test_a_silent_server_times_out_through_the_pipeline(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(wire.stream((), stall=True))
    started = trio.current_time()
    await fails_in_pipeline(openai(server, timeout=httpx.Timeout(60, read=5)), ProviderTimeout)
    # The read timeout is the idle gap: one gap, no retry once the response has started.
    assert trio.current_time() - started == pytest.approx(5)
    assert len(server.requests) == 1


async def test_the_callers_deadline_cancels_and_is_not_converted(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.script(wire.stream(wire.openai_text(["a"])[:2], stall=True))
    with anyio.move_on_after(1) as scope:
        await collect(openai(server))
    assert scope.cancelled_caught
    with anyio.fail_after(1):
        await server.wait_hangup()


async def test_leaving_the_stream_early_closes_the_response(server: ProtocolServer) -> None:
    server.script(wire.stream(wire.openai_text(["a", "b"])[:2], stall=True))
    async with openai(server).stream(hi()) as events:
        async for _ in events:
            break
    with anyio.fail_after(5):
        await server.wait_hangup()
    assert server.hangups == 1


# --- Keys a header cannot carry, odd content types, malformed payloads -----------------------


async def test_a_key_with_a_trailing_newline_is_sent_stripped(server: ProtocolServer) -> None:
    # A key read from a secret file often ends in a newline.
    server.script(wire.stream(wire.openai_text(["ok"])))
    model = OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY + "\n")
    events = await collect(model)
    assert events[0] == ModelText("ok")
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("bad", ["\r\nx-injected: 1", " inner space", "caf\u00e9"])
async def test_a_key_a_header_cannot_carry_is_refused_without_showing_it(
    server: ProtocolServer, bad: str
) -> None:
    for model in (
        OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY + bad),
        AnthropicMessages("claude-test", base_url=server.url, api_key=KEY + bad),
    ):
        with pytest.raises(ConfigError) as caught:
            await collect(model)
        assert KEY not in str(caught.value)
        assert "api_key=" in str(caught.value)
    assert server.requests == []


async def test_the_content_type_is_matched_without_regard_to_case(server: ProtocolServer) -> None:
    pieces = wire.openai_text(["ok"])
    server.script(
        wire.stream(pieces, headers=(("content-type", "Text/Event-Stream; charset=UTF-8"),))
    )
    assert (await collect(openai(server)))[0] == ModelText("ok")


async def test_a_malformed_token_count_is_a_protocol_error(server: ProtocolServer) -> None:
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": "n/a", "completion_tokens": 1}}\n\n'
    server.script(wire.stream((wire.openai_text(["a"])[0], usage)))
    error = await fails(openai(server), ProviderProtocolError)
    assert "n/a" in str(error)


@pytest.mark.parametrize("count", ["Infinity", "-Infinity", "1e400"])
async def test_an_infinite_token_count_is_a_protocol_error(
    server: ProtocolServer, count: str
) -> None:
    """Catches: a token count of Infinity (which Python's JSON decoder accepts) or one
    past a float's range escaping the stream as a bare OverflowError, not a ProviderError."""
    usage = f'{{"prompt_tokens": {count}, "completion_tokens": 1}}'
    chunk = f'data: {{"choices": [], "usage": {usage}}}\n\n'.encode()
    server.script(wire.stream((*wire.openai_text(["a"])[:-2], chunk, b"data: [DONE]\n\n")))
    await fails(openai(server), ProviderProtocolError)
    delta = f'{{"type": "message_delta", "delta": {{}}, "usage": {{"output_tokens": {count}}}}}'
    server.script(
        wire.stream(
            (
                wire.anthropic_start(),
                *wire.anthropic_text_block(0, ["a"]),
                f"event: message_delta\ndata: {delta}\n\n".encode(),
            )
        )
    )
    await fails(anthropic(server), ProviderProtocolError)


def test_a_short_placeholder_key_does_not_mangle_messages() -> None:
    # Local servers take keys like "EMPTY" or "ollama"; they are not secrets.
    assert scrub("Name or service not known", "k") == "Name or service not known"
    assert scrub(f"Bearer {KEY}", KEY) == "Bearer [redacted]"


# --- Every httpx exception maps into the tree ------------------------------------------------


def _httpx_exception_classes() -> set[type[Exception]]:
    return {
        value
        for value in vars(httpx).values()
        if isinstance(value, type) and issubclass(value, Exception)
    }


def _instance(cls: type[Exception]) -> Exception:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    if cls is httpx.HTTPStatusError:
        response = httpx.Response(503, request=request)
        return cls("boom", request=request, response=response)
    try:
        return cls("boom")  # type: ignore[call-arg]
    except TypeError:
        return cls()


# The expected member of the ProviderError tree for each httpx exception, as the seam maps it
# before a response arrives. A class httpx adds later fails the test until it is decided.
EXPECTED_BEFORE_RESPONSE: dict[type[Exception], type[ProviderError]] = {
    httpx.HTTPError: ProviderError,
    httpx.RequestError: ProviderError,
    httpx.TransportError: ProviderConnectionError,
    httpx.TimeoutException: ProviderTimeout,
    httpx.ConnectTimeout: ProviderTimeout,
    httpx.ReadTimeout: ProviderTimeout,
    httpx.WriteTimeout: ProviderTimeout,
    httpx.PoolTimeout: ProviderTimeout,
    httpx.NetworkError: ProviderConnectionError,
    httpx.ConnectError: ProviderConnectionError,
    httpx.ReadError: ProviderConnectionError,
    httpx.WriteError: ProviderConnectionError,
    httpx.CloseError: ProviderConnectionError,
    httpx.ProtocolError: ProviderConnectionError,
    httpx.LocalProtocolError: ProviderError,
    httpx.RemoteProtocolError: ProviderConnectionError,
    httpx.ProxyError: ProviderConnectionError,
    httpx.UnsupportedProtocol: ProviderConnectionError,
    httpx.DecodingError: ProviderProtocolError,
    httpx.TooManyRedirects: ProviderError,
    httpx.HTTPStatusError: ProviderStatusError,
    httpx.InvalidURL: ProviderError,
    httpx.CookieConflict: ProviderError,
    httpx.StreamError: ProviderError,
    httpx.StreamConsumed: ProviderError,
    httpx.StreamClosed: ProviderError,
    httpx.ResponseNotRead: ProviderError,
    httpx.RequestNotRead: ProviderError,
}


def test_every_httpx_exception_class_is_in_the_mapping_table() -> None:
    """Catches: an httpx exception class (today's or one added by an upgrade) that nobody
    decided a mapping for, found by introspecting httpx itself."""
    assert _httpx_exception_classes() == set(EXPECTED_BEFORE_RESPONSE)


def test_the_seam_catches_every_httpx_exception() -> None:
    """Catches: an httpx exception outside the seam's except clauses (InvalidURL, the
    StreamError family), which would escape as a bare httpx error."""
    from pipeline.providers._http import HTTPX_ERRORS

    assert all(issubclass(cls, HTTPX_ERRORS) for cls in _httpx_exception_classes())


@pytest.mark.parametrize("streaming", [False, True], ids=["before", "streaming"])
@pytest.mark.parametrize("cls", sorted(EXPECTED_BEFORE_RESPONSE, key=lambda c: c.__name__))
def test_every_httpx_exception_maps_into_the_provider_error_tree(
    cls: type[Exception], streaming: bool
) -> None:
    """Catches: a translation that returns something outside the tree, leaks the key, or
    maps a class to another member than the table says."""
    from pipeline.providers._http import Endpoint, translate

    url = "https://api.example.com/v1/chat/completions"
    endpoint = Endpoint("openai", url, {}, KEY, httpx.Timeout(5), 0)
    error = translate(_instance(cls), endpoint, streaming=streaming, request_id="req_1")
    expected = EXPECTED_BEFORE_RESPONSE[cls]
    if streaming and issubclass(cls, httpx.NetworkError | httpx.RemoteProtocolError):
        # A reset or cut connection after a 2xx: a truncated reply, not an unreachable server.
        expected = ProviderProtocolError
    assert type(error) is expected
    assert (error.provider, error.request_id) == ("openai", "req_1")
    assert KEY not in str(error)


@pytest.mark.parametrize("url", ["http://[::1/v1", "api.openai.com/v1", "ftp://host/v1", ""])
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_base_url_requests_cannot_go_to_is_refused_when_built(provider: Any, url: str) -> None:
    """Catches: a bad base_url found only at the first request, as a bare ValueError from
    urlsplit or an httpx.InvalidURL (not an httpx.HTTPError) escaping the seam."""
    with pytest.raises(ValueError, match=re.escape(f"base_url {url!r} is not a URL requests can")):
        provider("m", base_url=url)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "30", True])
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_timeout_that_is_no_positive_number_is_refused_when_built(
    provider: Any, timeout: Any
) -> None:
    """Catches: timeout=-1, nan or "30" accepted, then every request failing with httpx's
    own "ValueError: `seconds`..." (or timeout=0 timing every request out at once)."""
    with pytest.raises(ValueError, match=re.escape("timeout must be a positive number of seconds")):
        provider("m", timeout=timeout)
    provider("m", timeout=httpx.Timeout(None))  # httpx's own form for no timeout at all


async def test_timeout_none_means_no_timeout_as_in_httpx(server: ProtocolServer) -> None:
    """Catches: timeout=None (httpx's and the official SDKs' way to say no timeout, which
    ran requests with none) refused as a ValueError when the provider is built."""
    server.script(wire.stream(wire.openai_text(["ok"])), wire.stream(wire.anthropic_text(["ok"])))
    for model in (openai(server, timeout=None), anthropic(server, timeout=None)):
        assert model.timeout is None
        events = await collect(model)
        assert "ok" in "".join(getattr(event, "text", "") for event in events)
    assert len(server.requests) == 2


@pytest.mark.parametrize("model", ["", " ", None, 3])
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_model_name_that_is_no_text_is_refused_when_built(provider: Any, model: Any) -> None:
    """Catches: OpenAIChat(None) or OpenAIChat(3) accepted and sent as "model": null or 3 in
    every request."""
    with pytest.raises(ValueError, match=re.escape("model must be the model's name")):
        provider(model)


@pytest.mark.parametrize("url", ["ftp://user:hunter2@host/v1", "localhost:hunter2@host/v1"])
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_refused_base_url_does_not_show_the_credentials_in_it(provider: Any, url: str) -> None:
    """Catches: the error for a bad base_url quoting a password written into it."""
    with pytest.raises(ValueError, match="is not a URL requests can go to") as caught:
        provider("m", base_url=url)
    assert "hunter2" not in str(caught.value)
    assert "***@host/v1" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("ftp://h/v1?key=hunter2", "'ftp://h/v1?...'"),
        ("localhost:11434/v1?key=hunter2", "'localhost:11434/v1?...'"),
        ("https:///v1#hunter2", "'https:///v1#...'"),
    ],
)
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_base_url_refused_for_its_scheme_or_host_does_not_show_its_query(
    provider: Any, url: str, shown: str
) -> None:
    """Bug caught: the query (which may hold a key) was hidden only when it was the URL's
    one problem: refused for its scheme or host first, the error quoted the whole URL."""
    with pytest.raises(ValueError, match="is not a URL requests can go to") as caught:
        provider("m", base_url=url)
    assert "hunter2" not in str(caught.value)
    assert f"base_url {shown} is not" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pa?hunter2@h/v1", "'https://***@...'"),
        ("https://user:pa#hunter2@h/v1", "'https://***@...'"),
        ("https://user:pa/hunter2@h/v1", "'https://***@h/v1'"),
        ("https://user:pa/hunter2@h/v1?key=x", "'https://***@h/v1?...'"),
        ("https://h/v1?key=x@hunter2", "'https://***@...'"),
    ],
)
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_refused_base_url_hides_a_password_holding_a_raw_url_delimiter(
    provider: Any, url: str, shown: str
) -> None:
    """Bug caught: a raw "?", "#" or "/" in a base_url's password ended what was hidden as
    credentials there, so the error quoted the password's rest (and httpx's "Invalid port"
    its start); an "@" in a query, which the same rule reads as a password's end, hides all."""
    with pytest.raises(ValueError, match="is not a URL requests can go to") as caught:
        provider("m", base_url=url)
    assert "hunter2" not in str(caught.value)
    assert "'pa'" not in str(caught.value)
    assert f"base_url {shown} is not" in str(caught.value)


@pytest.mark.parametrize("tail", ["?api-version=2024-02-01&key=hunter2", "#hunter2", "?"])
@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
def test_a_base_url_with_a_query_or_fragment_is_refused_when_built(
    provider: Any, tail: str
) -> None:
    """Bug caught: `base_url="http://h/v1?api-version=..."` was accepted and every request
    went to `/v1?api-version=.../chat/completions` (the path in the query), and with a
    `#fragment` to `/v1`, the endpoint's path dropped."""
    with pytest.raises(ValueError, match=re.escape("would land in its query")) as caught:
        provider("m", base_url=f"http://127.0.0.1:1/v1{tail}")
    assert "hunter2" not in str(caught.value)
    assert f"'http://127.0.0.1:1/v1{tail[0]}...'" in str(caught.value)


@pytest.mark.parametrize("provider", [OpenAIChat, AnthropicMessages])
async def test_credentials_in_a_working_base_url_are_in_no_repr_or_error(
    server: ProtocolServer, provider: Any
) -> None:
    """Catches: a password written into a base_url that works (httpx sends it as Basic
    auth) shown in the provider's repr and in every error naming the URL, though the error
    for a base_url that does not work hides it."""
    server.script(wire.json_error(500, {"error": {"message": "down"}}))
    model = provider("m", base_url=server.url.replace("//", "//user:hunter2@"), max_retries=0)
    with pytest.raises(ProviderStatusError) as caught:
        await collect(model)
    assert server.requests[0].headers["authorization"].startswith("Basic ")
    for shown in (repr(model), str(caught.value)):
        assert "hunter2" not in shown
        assert "//***@127.0.0.1" in shown


@pytest.mark.parametrize("value", [decimal.Decimal("7"), float("nan")], ids=["decimal", "nan"])
@pytest.mark.parametrize("provider", [openai, anthropic])
async def test_a_value_json_cannot_encode_is_a_request_error_naming_it(
    server: ProtocolServer, provider: Any, value: Any
) -> None:
    """Catches: a RequestOptions.extra value JSON has no form for failing the turn as a
    ProviderError about a bare TypeError naming no field ("Object of type Decimal is not
    JSON serializable"), and NaN sent as the invalid JSON token NaN."""

    def shape(turn: Turn) -> Any:
        return cont(turn.with_request(extra={"seed": value}))

    with pytest.raises(RequestError, match=r"body\.seed is ") as caught:
        await Pipeline(model=provider(server), pre=[shape]).run(Turn.start("hi"))
    assert "RequestOptions.extra" in str(caught.value)
    assert server.requests == []


_REFUSED = [
    ("messages", "the turn's conversation"),
    ("stream", "every request streams"),
    ("tools", "turn.with_request(active_tools=...)"),
]


@pytest.mark.parametrize(
    ("provider", "key", "advice"),
    [(openai, key, advice) for key, advice in _REFUSED]
    + [(anthropic, key, advice) for key, advice in _REFUSED]
    + [(anthropic, "system", "Pipeline(system=...)")],
)
async def test_an_extra_key_that_replaces_the_turn_is_a_request_error_naming_it(
    server: ProtocolServer, provider: Any, key: str, advice: str
) -> None:
    """Bug caught: a RequestOptions.extra key that makes up the turn itself (messages,
    stream, tools, Anthropic's system) silently replaced what the provider wrote, so the
    request sent was not the turn's (the conversation or the tools lost, a non-streamed
    answer the provider cannot read), with nothing said; it is now a RequestError naming the
    key and what to use instead, and nothing is sent."""
    reply = wire.openai_text(["ok"]) if provider is openai else wire.anthropic_text(["ok"])
    server.script(wire.stream(reply))

    def shape(turn: Turn) -> Any:
        return cont(turn.with_request(extra={"seed": 7, key: "set by a hook"}))

    with pytest.raises(RequestError) as caught:
        await Pipeline(model=provider(server), pre=[shape]).run(Turn.start("hi"))
    message = str(caught.value)
    assert f"RequestOptions.extra sets {key!r}" in message
    assert advice in message
    assert "'seed'" not in message
    assert server.requests == []


_DISABLE_PARALLEL = {"type": "auto", "disable_parallel_tool_use": True}


@pytest.mark.parametrize(
    ("provider", "tool_choice"),
    [
        (openai, {"type": "function", "function": {"name": "stat_path"}}),
        (anthropic, _DISABLE_PARALLEL),
    ],
)
async def test_extra_wins_over_the_values_the_provider_derives(
    server: ProtocolServer, provider: Any, tool_choice: dict[str, Any]
) -> None:
    """Bug caught: every key the provider writes was refused in RequestOptions.extra, so a
    hook could not pick the model per turn (extra={"model": ...}), nor send a tool_choice
    the turn's string option has no form for (Anthropic's disable_parallel_tool_use), nor
    its own temperature or max_tokens: each was a RequestError with no replacement."""
    reply = wire.openai_text(["ok"]) if provider is openai else wire.anthropic_text(["ok"])
    server.script(wire.stream(reply))
    extra = {"model": "picked-by-a-hook", "temperature": 0.9, "max_tokens": 77}

    @tool
    def stat_path(path: str) -> str:
        """Describe a path.

        Args:
            path: The path.
        """
        return path

    def shape(turn: Turn) -> Any:
        return cont(
            turn.with_request(
                temperature=0.2,
                max_tokens=500,
                tool_choice="auto",
                extra={**extra, "tool_choice": tool_choice},
            )
        )

    pipe = Pipeline(model=provider(server), tools=[stat_path], pre=[shape])
    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "completed"
    sent = server.requests[0].body
    assert {key: sent[key] for key in extra} == extra
    assert sent["tool_choice"] == tool_choice
    assert (sent["stream"], [t.get("name") or t["function"]["name"] for t in sent["tools"]]) == (
        True,
        ["stat_path"],
    )


@pytest.mark.parametrize(
    ("asked", "sent"),
    [
        (
            {"continuous_usage_stats": True},
            {"include_usage": True, "continuous_usage_stats": True},
        ),
        ({"include_usage": False}, {"include_usage": False}),
    ],
)
async def test_stream_options_in_extra_add_to_the_usage_request(
    server: ProtocolServer, asked: dict[str, Any], sent: dict[str, Any]
) -> None:
    """Bug caught: vLLM's extra={"stream_options": {..., "continuous_usage_stats": True}}
    was a RequestError; taken as it is, it would also drop the include_usage the provider
    asks with, and the turn's usage would be lost. A dict is merged over the provider's
    own, so usage is still asked for unless the user's dict sets include_usage itself."""
    server.script(wire.stream(wire.openai_text(["ok"], usage=(9, 2))))

    def shape(turn: Turn) -> Any:
        return cont(turn.with_request(extra={"stream_options": asked}))

    result = await Pipeline(model=openai(server), pre=[shape]).run(Turn.start("hi"))

    assert result.outcome == "completed"
    assert server.requests[0].body["stream_options"] == sent
    assert result.reply.usage == Usage(9, 2)


@pytest.mark.parametrize("provider", [openai, anthropic])
async def test_extra_keys_the_provider_does_not_write_are_sent_as_they_are(
    server: ProtocolServer, provider: Any
) -> None:
    """Bug caught (guard of the refusal above): options the provider leaves to extra (seed,
    top_p, stop sequences) refused along with the keys it writes."""
    reply = wire.openai_text(["ok"]) if provider is openai else wire.anthropic_text(["ok"])
    server.script(wire.stream(reply))
    extra = {"seed": 7, "top_p": 0.5, "stop": ["END"], "metadata": {"user_id": "ada"}}

    def shape(turn: Turn) -> Any:
        return cont(turn.with_request(temperature=0.2, extra=extra))

    result = await Pipeline(model=provider(server), pre=[shape]).run(Turn.start("hi"))

    assert result.outcome == "completed"
    sent = server.requests[0].body
    assert {key: sent[key] for key in extra} == extra
    assert (sent["stream"], sent["temperature"]) == (True, 0.2)


@pytest.mark.parametrize(
    ("provider", "where"),
    [(openai, "arguments.when is a date"), (anthropic, "input.when is a date")],
)
async def test_tool_call_arguments_json_cannot_encode_are_a_request_error_naming_them(
    server: ProtocolServer, provider: Any, where: str
) -> None:
    """Catches: a tool call in the conversation whose arguments hold a date escaping the
    provider as a bare TypeError that names neither the call nor the argument."""
    call = ToolCall("call_1", "plan", {"when": datetime.date(2026, 1, 1)})
    messages = (
        Message.user("plan it"),
        Message.assistant([call]),
        Message.tool(ToolResult("call_1", "planned")),
    )
    with pytest.raises(RequestError, match=re.escape(where)):
        await collect(provider(server), ModelRequest(messages))
    assert server.requests == []


@pytest.mark.parametrize("provider", [openai, anthropic])
async def test_a_negative_token_count_is_read_as_unknown_and_the_reply_completes(
    server: ProtocolServer, provider: Any
) -> None:
    """Bug caught: a server reporting a token count of -1 (unknown) failed the paid reply
    with a ProviderError from Usage; the count is read as 0 and the turn completes."""
    stream = (
        wire.openai_text(["ok"], usage=(-1, 2))
        if provider is openai
        else wire.anthropic_text(["ok"], input_tokens=12, output_tokens=-1)
    )
    server.script(wire.stream(stream))

    result = await Pipeline(model=provider(server)).run(Turn.start("hi"))

    assert result.reply.text == "ok"
    assert result.reply.usage == (Usage(0, 2) if provider is openai else Usage(12, 0))
