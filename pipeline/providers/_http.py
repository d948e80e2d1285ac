"""The thin I/O shell the providers share: one POST, retries, SSE, and the error seam.

Everything that touches httpx lives here. `translate` is the one place where httpx's
exceptions become the `ProviderError` tree; `status_error` is the one place where a non-2xx
answer does. Bodies are read as raw bytes and decoded by `_encoding` a bounded piece at a
time, so that the caps on what is read hold on what a compressed body inflates to. Retries
happen only before a stream starts: once a 2xx status has been read, whatever goes wrong goes
straight to the caller, because the pipeline may already have passed tokens on.

A total deadline is not ours to enforce: it is the caller's cancel scope (trio's or AnyIO's,
on either loop), and its cancellation passes through untouched (neither loop's cancellation
exception is an `Exception`). Nothing here is specific to one loop: sleeps are AnyIO's, and
httpx runs on both.

A provider owns a `Pool`: while it is held (``async with model``, `Pool.hold` for a pipeline,
a session or the CLI) every call goes through one `httpx.AsyncClient`, so connections are
kept alive and reused; unheld, each call opens a client of its own and closes it.
"""

import contextlib
import datetime
import email.utils
import functools
import json
import logging
import math
import os
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol, Self, final

import anyio
import anyio.lowlevel
import attrs
import httpx
import trio
import trio.socket

from .._errors import (
    ConfigError,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
    RateLimited,
    RequestError,
)
from .._loop import loop_finished
from .._model import ModelEvent
from .._urls import hide_userinfo, shown_url
from ._convert import decode_json, quoted
from ._encoding import (
    ACCEPT_ENCODING,
    Decode,
    UndecodableBody,
    UnsupportedEncoding,
    decoder_for,
)
from ._sse import (
    DEFAULT_MAX_LINE_BYTES,
    EventTooLong,
    LineTooLong,
    ServerSentEvent,
    SSEDecoder,
)

log = logging.getLogger("turnplug.providers")

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
"""Ten minutes of silence before a read fails (reasoning models can think that long before
their first token), five seconds to connect."""

RETRY_STATUSES = frozenset({408, 409, 429})
"""Retried statuses besides every 5xx (Anthropic's 529 "overloaded" included)."""

BACKOFF_START = 0.5
BACKOFF_CAP = 8.0
DRAIN_SECONDS = 0.5
"""How long a pooled call waits, after the provider's terminator, for the body's end (usually
sent with it), so that its connection can serve the next call; a server that keeps the
stream open longer gets its connection closed instead."""

HINT_CAP = 60.0
"""A server's delay hint above this many seconds means "give up now", not "block the turn"."""

ERROR_BODY_CAP = 64 * 1024
"""The most bytes of an error answer's body that are read; the rest is not read, and the
connection is closed. Error bodies are short JSON documents or HTML pages (a few KiB): 64 KiB
keeps all of any real one, while a misbehaving server or proxy that sends megabytes (or never
stops) costs no more memory than this, in `ProviderStatusError.body` or while reading."""

ERROR_BODY_SECONDS = 10.0
"""The longest an error answer's body is read, whatever its pace. The read timeout bounds only
the silence between bytes, so a body that trickles a byte at a time would hold the call for
hours (64 KiB at a byte a second) before the cap is reached. An error body comes with its
headers (no model is thinking behind it): ten seconds is ample."""

_REDACTED = "[redacted]"
_SHORTEST_SECRET = 8

_PUBLIC_KEY_PREFIXES = (
    "sk-ant-admin01-",
    "sk-ant-api03-",
    "sk-svcacct-",
    "sk-admin-",
    "sk-or-v1-",
    "sk-proj-",
    "sk-None-",
    "sk-ant-",
    "gsk_",
    "xai-",
    "sk-",
    "hf_",
)
"""The vendors' published key formats start with these: the same for every key of a kind, so
no part of the secret. Showing one (OpenAI's error for a wrong key quotes the key's start
and end, stars between) tells a user which kind of key was sent, and gives nothing away."""


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building a context loads the CA bundle (milliseconds of CPU); one per process is enough.
    return httpx.create_ssl_context()


def scrub(text: str, secret: str | None) -> str:
    """`text` with the key replaced wherever it shows: whole, JSON-escaped, or cut short.

    A JSON body may echo the key escaped (``sk-a\\/b``, ``\\u0073k-...``), which decodes to the
    key again; a quote cut at a fixed length (ours, or Python's own ``int()`` message) may end
    inside it. So any run of its leading characters (eight, or a published public prefix and
    one character more: `_shortest_run`), any of them escaped, is replaced too. A placeholder key a few
    characters long (``"ollama"``, ``"EMPTY"``) is no secret, and replacing it would mangle
    words of the message.
    """
    if not secret or len(secret) < _SHORTEST_SECRET:
        return text
    text = text.replace(secret, _REDACTED)
    if secret[: _shortest_run(secret)] in text or "\\" in text:
        text = _redact_key_runs(text, secret)
    return text


@functools.lru_cache(maxsize=8)
def _shortest_run(secret: str) -> int:
    """How many of the key's leading characters `scrub` replaces when they show together.

    Eight, so that a few letters a key happens to start with are not replaced in every word
    they start; or, for a key of a published format, its public prefix and one character
    more: the prefix is no secret, and alone it must stay readable (``sk-proj-***...abcd``
    says a project key was sent), but a single character past it is part of the secret.
    """
    prefix = next((p for p in _PUBLIC_KEY_PREFIXES if secret.startswith(p)), "")
    return max(_SHORTEST_SECRET, len(prefix) + 1)


def _redact_key_runs(text: str, secret: str) -> str:
    head, rest = _key_patterns(secret)
    pieces: list[str] = []
    done = 0
    while (found := head.search(text, done)) is not None:
        end = found.end()
        for unit in rest:  # extend the run as far as the key goes on
            more = unit.match(text, end)
            if more is None:
                break
            end = more.end()
        pieces += (text[done : found.start()], _REDACTED)
        done = end
    return "".join(pieces) + text[done:] if pieces else text


_JSON_SHORT_ESCAPES = frozenset('"\\/')


@functools.lru_cache(maxsize=8)
def _key_patterns(secret: str) -> tuple[re.Pattern[str], tuple[re.Pattern[str], ...]]:
    """The key's first `_shortest_run` characters, and each later one, as patterns that
    also match the character JSON-escaped (``\\/``, ``\\u002f``), the backslash doubled too, as
    ``repr`` writes it."""
    units = []
    for char in secret:
        code = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{ord(char):04x}")
        forms = [re.escape(char), rf"\\\\?u{code}"]
        if char in _JSON_SHORT_ESCAPES:
            forms.append(rf"\\\\?{re.escape(char)}")
        units.append(f"(?:{'|'.join(forms)})")
    shortest = _shortest_run(secret)
    head = re.compile("".join(units[:shortest]))
    return head, tuple(re.compile(unit) for unit in units[shortest:])


def scrub_error(error: BaseException, secret: str | None) -> None:
    """Replace `secret` in the message of `error` and of every exception chained to it.

    What a provider sends inside a stream (an error event, a line that is not JSON) is
    quoted in the errors raised for it, so an upstream that echoes the key would put it in
    the message, or in that of the exception it was raised from.
    """
    if not secret or len(secret) < _SHORTEST_SECRET:
        return
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.args = tuple(
            scrub(arg, secret) if isinstance(arg, str) else arg for arg in current.args
        )
        current = current.__cause__ or current.__context__


def checked_key(key: str | None, provider: str, source: str) -> str | None:
    """The API key as it can be sent: surrounding whitespace (a secret file's trailing
    newline) removed, anything else a header cannot carry refused without showing it."""
    if key is None:
        return None
    key = key.strip()
    if not key:
        return None
    if not all("!" <= char <= "~" for char in key):
        raise ConfigError(
            f"{provider}: the API key from {source} contains characters an HTTP header cannot"
            " carry (spaces, control characters or non-ASCII); it is not shown here — check"
            " the secret for a stray character"
        )
    return key


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The delay, in seconds, a response asks for before a retry, if it asks for one.

    ``retry-after-ms`` (milliseconds) wins over ``retry-after``, which is seconds or an HTTP
    date. Unparseable or negative values count as no hint.
    """
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            delay = float(value) / 1000
        except ValueError:
            delay = -1.0
        if delay >= 0:
            return delay
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        delay = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, OverflowError):  # a year or offset past a datetime's
            return None
        if when.tzinfo is None:
            # No zone (HTTP's asctime format, or ``-0000``): HTTP dates are GMT, never the
            # local time `timestamp` would read them in.
            when = when.replace(tzinfo=datetime.UTC)
        delay = when.timestamp() - (time.time() if now is None else now)
        return max(delay, 0.0)
    return delay if delay >= 0 else None


def backoff(retries_made: int, jitter: float) -> float:
    """Exponential backoff: 0.5 s, 1 s, 2 s, ... capped at 8 s, times 1 - jitter/4.

    Args:
        retries_made: How many retries happened before this one.
        jitter: A number in [0, 1); spreads clients that failed together.
    """
    delay: float = min(BACKOFF_START * 2.0**retries_made, BACKOFF_CAP)
    return delay * (1 - jitter / 4)


def should_retry(status: int, headers: Mapping[str, str], body: str) -> bool:
    """Whether a non-2xx answer is worth another attempt.

    ``x-should-retry`` decides first. Billing failures (402, OpenAI's 429
    ``insufficient_quota``) never heal by waiting. Otherwise 408, 409, 429 and every 5xx.
    """
    forced = headers.get("x-should-retry", "").strip().lower()
    if forced in ("true", "false"):
        return forced == "true"
    if status == 429 and "insufficient_quota" in body:
        return False
    return status in RETRY_STATUSES or status >= 500


def retry_delay(retries_made: int, headers: Mapping[str, str], jitter: float) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` if the hint says not to retry."""
    hint = retry_after(headers)
    if hint is not None and hint > HINT_CAP:
        return None
    if hint is not None and hint > 0:
        return hint
    return backoff(retries_made, jitter)


def error_detail(body: str) -> tuple[str | None, str | None]:
    """The provider's own error type (or code) and message from an error body, where present.

    Handles the OpenAI/Anthropic envelope ``{"error": {"type", "code", "message"}}``, the flat
    ``{"message": ...}`` of older vLLM, and a string ``error``.
    """
    try:
        data = decode_json(body)
    except ValueError:
        return None, None
    return _detail(data)


def _detail(data: Any) -> tuple[str | None, str | None]:
    if not isinstance(data, dict):
        return None, None
    error = data.get("error", data)
    if isinstance(error, str):
        return None, error
    if not isinstance(error, dict):
        return None, None
    kind = error.get("type") or error.get("code")
    message = error.get("message")
    return (
        None if kind is None else str(kind),
        None if message is None else str(message),
    )


def request_id_of(headers: Mapping[str, str], secret: str | None) -> str | None:
    """The provider's request id (``x-request-id`` for OpenAI, ``request-id`` for Anthropic),
    scrubbed: it is shown in messages, and a proxy may echo anything there."""
    found = headers.get("x-request-id") or headers.get("request-id")
    return None if found is None else scrub(found, secret)


def as_timeout(value: float | httpx.Timeout | None) -> httpx.Timeout:
    """A provider's ``timeout=``: seconds for every phase, an ``httpx.Timeout``, or None for
    no timeout."""
    return value if isinstance(value, httpx.Timeout) else httpx.Timeout(value)


def check_retries(_instance: object, _attribute: object, value: int) -> None:
    """Validate a provider's ``max_retries=``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_retries must be an int >= 0, got {value!r}")


def check_model(_instance: object, _attribute: object, value: str) -> None:
    """Validate a provider's model name (sent in every request)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"model must be the model's name, a non-empty string (e.g. 'gpt-4o-mini'), got"
            f" {value!r}"
        )


def check_timeout(
    _instance: object, _attribute: object, value: float | httpx.Timeout | None
) -> None:
    """Validate a provider's ``timeout=``: refused now, not by every request it would fail.

    None is no timeout, as it is to httpx and the official SDKs.
    """
    if value is None or isinstance(value, httpx.Timeout):
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(
            f"timeout must be a positive number of seconds (the longest silence allowed"
            f" between bytes), an httpx.Timeout or None (no timeout), got {value!r}"
        )


def check_line_cap(_instance: object, _attribute: object, value: int) -> None:
    """Validate a provider's ``max_line_bytes=``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_line_bytes must be a positive int (bytes), got {value!r}")


def strip_slash(base_url: str) -> str:
    """A base URL without its trailing slash, so that paths join cleanly; one httpx cannot
    send to is refused when the provider is built, not at its first request."""
    problem = None
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        problem = str(exc)
        if isinstance(base_url, str) and "@" in base_url:
            # httpx quotes the host or port it could not read, which may be a piece of a
            # password holding a raw "/", "?" or "#" (``https://user:pa?ss@host``).
            problem = problem.split(": ", 1)[0]
    else:
        if url.scheme not in ("http", "https") or not url.host:
            problem = "it needs http:// or https:// and a host"
        elif re.search("[?#]", base_url):
            # Each request's path is appended to the base URL: it would land in the query
            # (``/v1?api-version=1/chat/completions``) or be dropped with the fragment.
            problem = (
                "each request appends its path to it, which would land in its query or be"
                " dropped with its fragment — give it without them"
            )
    if problem is not None:
        shown = shown_url(base_url) if isinstance(base_url, str) else base_url
        raise ValueError(
            f"base_url {shown!r} is not a URL requests can go to ({problem}) — e.g."
            " 'https://api.openai.com/v1' or 'http://localhost:11434/v1'"
        )
    return base_url.rstrip("/")


def shown_base_url(base_url: str) -> str:
    """A provider's ``base_url`` in its repr, credentials hidden."""
    return repr(hide_userinfo(base_url))


@final
@attrs.frozen
class Endpoint:
    """What the shell needs to know to POST one streaming request.

    Attributes:
        provider: The provider's name, for errors.
        url: The full URL.
        headers: The request headers (authentication included; never shown).
        secret: The API key, so that it can be scrubbed from anything shown.
        timeout: httpx's timeouts; ``read`` is the longest silence allowed between bytes.
        max_retries: Retries allowed before the stream starts.
        transport: An injected httpx transport (owned by the caller), or ``None``.
        missing_key: A hint added to an error status when no key was sent.
        max_line_bytes: The longest event-stream line accepted.
    """

    provider: str
    url: str
    headers: Mapping[str, str] = attrs.field(repr=False)
    secret: str | None = attrs.field(repr=False)
    timeout: httpx.Timeout
    max_retries: int
    transport: httpx.AsyncBaseTransport | None = None
    missing_key: str | None = None
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    @property
    def shown(self) -> str:
        """The URL as messages show it: without the credentials it may carry."""
        return hide_userinfo(self.url)


def endpoint_for(
    model: Any, url: str, headers: dict[str, str], auth: Callable[[str], dict[str, str]]
) -> Endpoint:
    """Where one request of `model` (a provider) goes, its key read and checked now.

    Args:
        model: The provider: its ``provider``, ``api_key``, ``api_key_env``, ``timeout``,
            ``max_retries``, ``transport`` and ``max_line_bytes`` are read.
        url: The request's URL.
        headers: The provider's own headers.
        auth: The headers that carry a key.
    """
    variable = model.api_key_env
    given = model.api_key is not None  # api_key="" is no key, as in the official SDKs
    key = checked_key(
        model.api_key if given else (os.environ.get(variable) if variable else None),
        model.provider,
        "api_key=" if given else str(variable),
    )
    if given:
        # The variable is not read when a key is given, so setting it cannot help.
        instead = f", or leave api_key out (None) to read {variable}" if variable else ""
        missing = f"no API key was sent: api_key is empty — pass the key as api_key={instead}"
    else:
        where = f"set {variable} or " if variable else ""
        missing = f"no API key was sent: {where}pass api_key="
    return Endpoint(
        model.provider,
        url,
        {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": ACCEPT_ENCODING,
            **headers,
        }
        | (auth(key) if key else {}),
        key,
        as_timeout(model.timeout),
        model.max_retries,
        model.transport,
        None if key else missing,
        model.max_line_bytes,
    )


@final
@attrs.frozen
class OpenedStream:
    """A 2xx streaming response: its request id, its events, whether its connection
    belongs to a pool (then it is worth reading the body to its end, to reuse it), and the
    decoder reading it."""

    request_id: str | None
    events: AsyncIterator[ServerSentEvent]
    pooled: bool = False
    decoder: SSEDecoder | None = None

    def unterminated(self) -> ServerSentEvent | None:
        """The event the body ended inside (no blank line after it), once `events` is
        exhausted: the SSE rules discard it, but a provider may recognise its end marker."""
        return None if self.decoder is None else self.decoder.unterminated


HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL, httpx.CookieConflict, httpx.StreamError)
"""Every exception httpx defines: the roots of its tree (a test checks none is missing)."""

_LOCAL_HOSTS = frozenset({"localhost", "::1", "0.0.0.0"})
_LOCAL_SERVERS: Mapping[int, str] = {
    11434: "an Ollama server (start it with `ollama serve`)",
    8000: "a vLLM server (start it with `vllm serve <model>`)",
    8080: "a llama.cpp server (start it with `llama-server -m <model.gguf>`)",
    1234: "LM Studio's local server (start it from LM Studio)",
    4000: "a LiteLLM proxy (start it with `litellm --model <model>`)",
}
"""The local servers that listen on a port by default, for the hint of a refused connection."""


def _local_server_hint(endpoint: Endpoint) -> str | None:
    """What a refused connection to a local base URL most likely means, or ``None``."""
    url = httpx.URL(endpoint.url)
    host = url.host
    if host not in _LOCAL_HOSTS and not host.startswith("127."):
        return None
    protocol = "Anthropic Messages" if endpoint.provider == "anthropic" else "OpenAI-compatible"
    server = _LOCAL_SERVERS.get(url.port or 80, f"a local {protocol} server")
    origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
    return (
        f"{endpoint.provider}: nothing accepted a connection at {origin} ({endpoint.shown}):"
        f" expected {server} there — start it, or point base_url at the server you run"
    )


def translate(
    exc: Exception, endpoint: Endpoint, *, streaming: bool, request_id: str | None = None
) -> ProviderError:
    """The seam: map one httpx exception to the `ProviderError` tree.

    Args:
        exc: What httpx raised (any of `HTTPX_ERRORS`).
        endpoint: Where the request went.
        streaming: Whether a 2xx response had arrived: a connection reset, cut or garbled
            then is a truncated stream (`ProviderProtocolError`), before it a connection
            failure.
        request_id: The response's request id, if one had arrived.
    """
    name, url = endpoint.provider, endpoint.shown
    detail = scrub(str(exc) or type(exc).__name__, endpoint.secret)
    where = "while streaming the response" if streaming else "before any response"
    if isinstance(exc, httpx.TimeoutException):
        if isinstance(exc, httpx.ReadTimeout):
            message = (
                f"{name} sent nothing for {endpoint.timeout.read} s {where} ({url}): the read"
                " timeout is the longest silence allowed between bytes — raise timeout= if the"
                " model is slow to start"
            )
        elif isinstance(exc, httpx.ConnectTimeout):
            message = f"{name}: connecting to {url} took longer than {endpoint.timeout.connect} s"
        else:
            message = f"{name}: {type(exc).__name__} {where} ({url}): {detail}"
        return ProviderTimeout(message, provider=name, request_id=request_id)
    if isinstance(exc, httpx.DecodingError) or (
        # After a 2xx the reply has begun (tokens may have been passed on): a reset or a
        # cut connection truncates it, which no retry of the caller's can mend silently.
        streaming and isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError)
    ):
        return ProviderProtocolError(
            f"{name} stream from {url} was cut off or garbled: {detail}",
            provider=name,
            request_id=request_id,
        )
    if isinstance(exc, httpx.LocalProtocolError):
        # httpx refused to send the request: its message may quote a header, key included.
        return ProviderError(
            f"{name}: the request to {url} could not be sent (a header or the body is not"
            " valid HTTP)",
            provider=name,
            request_id=request_id,
        )
    if isinstance(exc, httpx.ConnectError) and not streaming:
        hint = _local_server_hint(endpoint)
        if hint is not None:
            return ProviderConnectionError(hint, provider=name, request_id=request_id)
    if isinstance(exc, httpx.TransportError):
        return ProviderConnectionError(
            f"{name}: could not talk to {url} ({where}): {type(exc).__name__}: {detail}",
            provider=name,
            request_id=request_id,
        )
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        return ProviderStatusError(
            f"{name} answered HTTP {response.status_code} at {url}",
            provider=name,
            status=response.status_code,
            request_id=request_id or request_id_of(response.headers, endpoint.secret),
        )
    if isinstance(exc, httpx.InvalidURL):
        return ProviderError(
            f"{name}: {url!r} is not a valid URL ({detail}) — check base_url",
            provider=name,
            request_id=request_id,
        )
    # TooManyRedirects (redirects are not followed), CookieConflict and the StreamError
    # family (misuse of a response) would be bugs here: still an error of the tree.
    return ProviderError(
        f"{name}: {type(exc).__name__} {where} ({url}): {detail}",
        provider=name,
        request_id=request_id,
    )


def status_error(
    endpoint: Endpoint,
    status: int,
    headers: Mapping[str, str],
    body: str,
    attempts: int,
    *,
    cut: str | None = None,
) -> ProviderStatusError:
    """The error for a non-2xx answer; the message keeps the provider's type and message.

    `cut` says what cut the body short, when something did (the body is what arrived).
    """
    secret = endpoint.secret
    body = scrub(body, secret)
    # Decoding may turn an escaped key back into the key: scrub what was decoded too.
    kind, text = (None if part is None else scrub(part, secret) for part in error_detail(body))
    request_id = request_id_of(headers, secret)
    said = quoted(f"{kind}: {text}" if kind and text else (text or kind or "")) or (
        body[:200] or "(empty body)"
    )
    message = f"{endpoint.provider} answered HTTP {status} at {endpoint.shown}: {said}"
    if request_id:
        message += f" (request id {request_id})"
    if cut is not None:
        message += f" — its body was cut short ({cut})"
    if attempts > 1:
        message += f" — after {attempts} attempts"
    if endpoint.missing_key:
        # Whatever the status: servers answer a missing key with 400, 403, 404 or even 500.
        message += f" — {endpoint.missing_key}"
    if status == 429:
        return RateLimited(
            message,
            provider=endpoint.provider,
            body=body,
            request_id=request_id,
            retry_after=retry_after(headers),
        )
    return ProviderStatusError(
        message, provider=endpoint.provider, status=status, body=body, request_id=request_id
    )


def _new_client(endpoint: Endpoint) -> httpx.AsyncClient:
    if endpoint.transport is not None:
        return httpx.AsyncClient(
            transport=endpoint.transport, timeout=endpoint.timeout, trust_env=False
        )
    return httpx.AsyncClient(timeout=endpoint.timeout, verify=_ssl_context(), limits=_LIMITS)


KEEPALIVE_EXPIRY = 5.0
"""Seconds an idle pooled connection is kept for the next call before it is closed (httpx's
default), well under the idle timeouts servers and proxies apply (60 s and more), so a call
is not sent on a connection the server is closing."""

# No cap on connections, busy or idle: concurrency is the caller's to bound (a gateway's
# clients), and the pool keeps what that concurrency opened. httpx's defaults cap a client at
# 100 connections (the 101st concurrent turn would queue, or time out) and at 100 idle ones,
# a limit httpcore compares with all of its connections, busy ones included: above 100
# concurrent streams each finished stream's connection was closed and the next call opened a
# new one. Idle connections never outnumber the peak of concurrent calls, and each closes
# `KEEPALIVE_EXPIRY` seconds after its last use (checked whenever the pool is used).
_LIMITS = httpx.Limits(
    max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY
)


async def _close_client(client: httpx.AsyncClient, endpoint: Endpoint) -> None:
    # The caller owns an injected transport: closing the client would close it too.
    if endpoint.transport is None:
        await client.aclose()


def _loop_name(token: anyio.lowlevel.EventLoopToken) -> str:
    """``"trio"`` or ``"asyncio"``: the package of the loop behind `token`."""
    return type(token.native_token).__module__.partition(".")[0]


def _shut_sockets(client: httpx.AsyncClient) -> None:
    """Shut down the sockets of `client`'s connections, whose loop has ended.

    Awaiting the client's close is no longer possible. Shutting the socket down is what can
    be done synchronously: the server sees the connection closed. A trio socket's descriptor
    is closed too; an asyncio transport closes its own when it is collected, as every
    transport left open by a closed loop does (with a ResourceWarning), since closing it
    needs its loop. httpx and httpcore keep their connections in private attributes: the
    client's transport, and the proxies' that the environment (``HTTP_PROXY``...) mounts,
    each wrap a pool whose connections wrap, through a proxy's forwarding or tunnel, the one
    holding the socket. Whatever is not found where expected is left to the garbage
    collector: nothing here may fail.
    """
    with contextlib.suppress(Exception):
        mounted = list(getattr(client, "_mounts", {}).values())
        for transport in [getattr(client, "_transport", None), *mounted]:
            pool = getattr(transport, "_pool", None)
            for connection in list(getattr(pool, "connections", ())):
                _shut_socket(connection)


def _shut_socket(connection: object) -> None:
    """Shut down the socket of one httpcore connection, if it has one open."""
    for _ in range(4):  # a pool's connection, a proxy's, the HTTP/1.1 or /2 one within
        if connection is None or hasattr(connection, "_network_stream"):
            break
        connection = getattr(connection, "_connection", None)
    stream = getattr(connection, "_network_stream", None)
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return
    with contextlib.suppress(OSError):  # the peer closed it already
        sock.shutdown(socket.SHUT_RDWR)
    if isinstance(sock, trio.socket.SocketType):
        # trio's own close() needs its run; the descriptor, detached, does not.
        with contextlib.suppress(OSError):
            os.close(sock.detach())


LANE_CALLS = 16
"""Concurrent calls one pooled httpx client carries; more go to the pool's next client."""


@final
class _Lane:
    """One httpx client of a pool, how many calls use it now, and whether the pool shut it."""

    __slots__ = ("calls", "client", "shut")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.calls = 0
        self.shut = False


@final
class _LoopPool:
    """A pool's lanes on one event loop, and how many holds of that loop keep them open."""

    __slots__ = ("endpoint", "holds", "lanes", "token")

    def __init__(self, endpoint: Endpoint, token: anyio.lowlevel.EventLoopToken) -> None:
        self.endpoint = endpoint
        self.token = token
        self.lanes: list[_Lane] = []
        self.holds = 0


@final
class Pool:
    """A provider's connections and their lifetime.

    Held (`hold`), the pool keeps its connections open for later calls. Holds nest and
    overlap (a user's ``async with model``, a pipeline's, each session's); the connections
    close when the last hold ends, and a later hold opens new ones. `close` ends the pool for
    good: any later call is a `ProviderError`.

    Connections belong to the event loop that opened them, so each loop's holds keep
    connections of their own: one pipeline may serve successive ``asyncio.run`` calls, or
    several threads each running a loop at once. The owner's ``async with model``
    (`acquire` with ``own=True``) opens the provider on its loop alone: a call or hold on
    another loop while it is open is refused (its sockets belong to the first), with an
    error rather than a hang, and so is that open while another loop holds the pool. A loop
    that ended with a hold still taken has its connections shut down by the next loop's first
    hold.

    The connections are spread over httpx clients, *lanes*, of at most `LANE_CALLS`
    concurrent calls each: a call takes the first lane with room, and a new lane is opened
    when all are full. httpcore's bookkeeping costs, on every request and every response
    closed, time that grows with the square of its pool's connections once many are idle
    (a client with 150 idle connections spent ~30 ms per request on it); lanes keep each
    pool small, and filling them in order sends the next call to the lane whose connection
    just became idle.
    """

    __slots__ = ("_closed", "_guard", "_loops", "_owned")

    def __init__(self) -> None:
        # Each loop's entry is used by its own thread alone; the guard keeps the table and
        # the owner's loop consistent when threads' loops take or end holds at once.
        self._loops: dict[anyio.lowlevel.EventLoopToken, _LoopPool] = {}
        self._owned: anyio.lowlevel.EventLoopToken | None = None
        self._guard = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    def acquire(self, endpoint: Endpoint, owner: str, *, own: bool = False) -> None:
        """Take a hold on this loop: open its connections if they are not open. Pair it with
        `release`, or with `close` for the owner's (``own=True``)."""
        here = anyio.lowlevel.current_token()
        with self._guard:
            if own or here not in self._loops:
                # Asking another thread's trio run whether it has ended wakes it: only a
                # loop's first hold asks (so the next loop to arrive drops what ended ones
                # left), and the owner's open, which another loop's entry would refuse.
                self._drop_finished(here)
            self._check(endpoint.provider, owner, here)
            if own and (other := next((t for t in self._loops if t != here), None)):
                raise ProviderError(
                    f"{owner} is held on another event loop ({_loop_name(other)}), by a"
                    " pipeline or session running there, and `async with model` would open it"
                    f" on this one ({_loop_name(here)}) alone: the other loop's calls would be"
                    " refused — give this loop a provider of its own, or let the pipeline or"
                    " session hold the model (they do so on each loop)",
                    provider=endpoint.provider,
                )
            pool = self._loops.get(here)
            if pool is None:
                pool = self._loops[here] = _LoopPool(endpoint, here)
            pool.holds += 1
            if own:
                self._owned = here

    async def release(self) -> None:
        """End a hold of this loop; its last one closes the loop's connections."""
        here = anyio.lowlevel.current_token()
        with self._guard:
            pool = self._loops.get(here)
            if pool is None:
                return
            pool.holds -= 1
            if pool.holds > 0:
                return
            del self._loops[here]
        await self._shut(pool)

    async def close(self) -> None:
        """Close the pool's connections, whatever holds remain, and refuse every later call.

        Another loop's connections cannot be closed from this one: its holds close them as
        they end (the owner's open on another loop has no hold left to do so, and they are
        dropped, as they would be at that loop's end)."""
        here = anyio.lowlevel.current_token()
        with self._guard:
            self._closed = True
            pool = self._loops.pop(here, None)
            owned, self._owned = self._owned, None
            if owned is not None and owned != here and owned in self._loops:
                self._loops[owned].holds -= 1
                if self._loops[owned].holds <= 0:
                    del self._loops[owned]
        if pool is not None:
            await self._shut(pool)

    def take(self, endpoint: Endpoint, owner: str) -> _Lane | None:
        """The lane for one call (give it back with `give_back`), or ``None`` when this loop
        holds none (a client per call)."""
        here = anyio.lowlevel.current_token()
        self._check(endpoint.provider, owner, here)
        pool = self._loops.get(here)
        if pool is None:
            return None
        for lane in pool.lanes:
            # An injected transport pools (or not) by itself: one lane.
            if lane.calls < LANE_CALLS or endpoint.transport is not None:
                break
        else:
            lane = _Lane(_new_client(pool.endpoint))
            pool.lanes.append(lane)
        lane.calls += 1
        return lane

    @staticmethod
    def give_back(lane: _Lane) -> None:
        """A call that `take` gave `lane` is over."""
        lane.calls -= 1

    def _drop_finished(self, here: anyio.lowlevel.EventLoopToken) -> None:
        """Forget the connections of loops that ended with a hold still taken.

        A loop stopped and closed with a session still open (a worker thread's loop at
        shutdown) never releases its hold: its entry would keep its clients and their sockets
        for the pool's life. Its sockets cannot be awaited any more, so they are shut down
        here, without awaiting, and the objects go with the entry.
        """
        for token in [t for t in self._loops if t != here and loop_finished(t)]:
            # An owner's open stays: the provider was opened on that loop and never closed,
            # so other loops are still refused (`_check`).
            pool = self._loops.pop(token)
            for lane in pool.lanes:
                lane.shut = True
                if pool.endpoint.transport is None:  # an injected one is its caller's
                    _shut_sockets(lane.client)

    @staticmethod
    async def _shut(pool: _LoopPool) -> None:
        for lane in pool.lanes:
            lane.shut = True
        for lane in pool.lanes:
            await _close_client(lane.client, pool.endpoint)

    def _check(self, provider: str, owner: str, here: anyio.lowlevel.EventLoopToken) -> None:
        if self._closed:
            raise ProviderError(
                f"{owner} is closed (aclose() was called, or its `async with` block ended):"
                " its connections are gone — create a new one, and keep it open for as long"
                " as you use it",
                provider=provider,
            )
        if (owned := self._owned) is not None and owned != here:
            raise ProviderError(
                f"{owner} was opened on another event loop ({_loop_name(owned)}) and is used"
                f" on this one ({_loop_name(here)}): its connections belong to the loop that"
                " opened them — open the provider (`async with model`) inside the loop that"
                " uses it, e.g. inside the function given to asyncio.run or trio.run, or let"
                " the pipeline or session hold it (they do so on each loop)",
                provider=provider,
            )


@asynccontextmanager
async def _client(
    endpoint: Endpoint, pool: Pool | None, owner: str
) -> AsyncIterator[tuple[httpx.AsyncClient, bool]]:
    """A client for one call, and whether it is pooled (it outlives the call)."""
    lane = pool.take(endpoint, owner) if pool is not None else None
    if lane is not None:
        try:
            yield lane.client, True
        except Exception as exc:
            # Only what reading the reply raised: an error of the caller's own block (a
            # transformer's, say) is left as it is.
            if not lane.shut or not _cut_by_close(exc):
                raise
            # Its connection was closed under it: the cause is here, not at the server
            # (which the read error alone would blame, as a stream cut off).
            raise ProviderError(
                f"{owner} was closed while this call was running (aclose(), or the end of"
                " the last block holding it: `async with` the provider, the pipeline or a"
                " session): its connections were closed under the call — keep the provider"
                " open until every call using it has ended",
                provider=endpoint.provider,
            ) from exc
        finally:
            Pool.give_back(lane)
        return
    client = _new_client(endpoint)
    try:
        yield client, False
    finally:
        await _close_client(client, endpoint)


def _cut_by_close(exc: Exception) -> bool:
    """Whether `exc` is what a call whose connection was closed under it raises: its read
    cut off (a protocol or connection error, translated or not) or httpx's closed client."""
    if isinstance(
        exc,
        ProviderProtocolError
        | ProviderConnectionError
        | httpx.TransportError
        | anyio.ClosedResourceError
        | anyio.BrokenResourceError,
    ):
        return True
    return isinstance(exc, RuntimeError) and "client has been closed" in str(exc)


async def _send(client: httpx.AsyncClient, endpoint: Endpoint, content: bytes) -> httpx.Response:
    """POST until a 2xx status arrives, retrying what may heal; raise what does not."""
    try:
        request = client.build_request(
            "POST", endpoint.url, headers=endpoint.headers, content=content
        )
    except HTTPX_ERRORS as exc:
        raise translate(exc, endpoint, streaming=False) from exc
    attempts = endpoint.max_retries + 1
    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            # A request httpx refuses to send (a bad header) fails the same way every time.
            if last or isinstance(exc, httpx.LocalProtocolError):
                error = translate(exc, endpoint, streaming=False)
                if attempt > 1:  # as a status error says, so the retries are not a mystery
                    error.args = (f"{error.args[0]} — after {attempt} attempts", *error.args[1:])
                raise error from exc
            pause = backoff(attempt - 1, random.random())
            log.warning(
                "%s: request %d failed (%s); retrying in %.2f s",
                endpoint.provider,
                attempt,
                scrub(str(exc), endpoint.secret),  # httpx may quote a malformed answer
                pause,
            )
            await anyio.sleep(pause)
            continue
        except HTTPX_ERRORS as exc:
            raise translate(exc, endpoint, streaming=False) from exc
        if response.is_success:
            return response
        body, cut = await _error_body(response, endpoint)
        delay = None
        if not last and should_retry(response.status_code, response.headers, body):
            delay = retry_delay(attempt - 1, response.headers, random.random())
        if delay is None:
            raise status_error(
                endpoint, response.status_code, response.headers, body, attempt, cut=cut
            )
        # The status and the delay only: never a header, so never a key.
        log.warning(
            "%s: request %d answered %d; retrying in %.2f s",
            endpoint.provider,
            attempt,
            response.status_code,
            delay,
        )
        await anyio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


async def _error_body(response: httpx.Response, endpoint: Endpoint) -> tuple[str, str | None]:
    """The body of an error answer as text, and what cut it short if something did.

    A 503 whose body breaks off or stalls is still a 503: retried as one, and reported with
    the body that arrived, rather than as a failure "before any response" that loses the
    status. At most `ERROR_BODY_CAP` bytes are kept, read for at most `ERROR_BODY_SECONDS`;
    then the response is closed without reading further. The cap counts decoded bytes, and a
    compressed body is decoded a piece at a time (`_encoding`), so a small gzip body that
    inflates to gigabytes costs no more than the cap either.
    """
    try:
        chunks, decode = _body(response)
    except UnsupportedEncoding as exc:
        await response.aclose()
        return "", f"not read: {exc}"
    received = bytearray()
    cut = None
    try:
        with anyio.move_on_after(ERROR_BODY_SECONDS) as deadline:
            async for chunk in chunks:
                for piece in decode(chunk):
                    received += piece
                    if len(received) > ERROR_BODY_CAP:
                        break
                if len(received) > ERROR_BODY_CAP:
                    # Cut before scrubbing, so that a key the cut ends inside is scrubbed as
                    # the start of a key (`scrub` removes any run of its leading characters).
                    del received[ERROR_BODY_CAP:]
                    cut = f"at {ERROR_BODY_CAP} bytes, the most read of an error body"
                    break
        if deadline.cancelled_caught:
            cut = f"not finished after {ERROR_BODY_SECONDS:g} s, the longest an error body is read"
    except HTTPX_ERRORS as exc:
        cut = f"{type(exc).__name__}: {scrub(str(exc) or 'no detail', endpoint.secret)}"
    except UndecodableBody as exc:
        cut = str(exc)
    finally:
        await _abandon(response, chunks)
    return received.decode("utf-8", "replace"), cut


def _body(response: httpx.Response) -> tuple[AsyncIterator[bytes], Decode]:
    """The reads of `response`'s body, and how to decode them.

    httpx's own decoding is not used: it inflates each read whole, however large that makes
    it. A body already read (an injected transport's ``httpx.Response(content=...)``) was
    decoded by httpx when it was built: it is passed on as it is.

    Raises:
        UnsupportedEncoding: The body is compressed in a coding that is not decoded.
    """
    if response.is_stream_consumed:
        return response.aiter_bytes(), decoder_for("identity")
    return response.aiter_raw(), decoder_for(response.headers.get("content-encoding", ""))


async def _check_content_type(endpoint: Endpoint, response: httpx.Response) -> None:
    kind = response.headers.get("content-type", "")
    if not kind.lower().startswith("text/event-stream"):
        # Some servers answer an error with a 2xx and a JSON body: what it says is the
        # provider's own account of the failure. The body is read as an error body is.
        body, _cut = await _error_body(response, endpoint)
        body = scrub(body, endpoint.secret)
        detail = [
            None if part is None else scrub(part, endpoint.secret) for part in error_detail(body)
        ]
        said = quoted(": ".join(part for part in detail if part)) or body[:200].strip()
        raise ProviderProtocolError(
            f"{endpoint.provider} answered {response.status_code} with content-type"
            f" {kind or '(none)'!r} at {endpoint.shown}, expected a text/event-stream — is the"
            " base_url right, and does the server support streaming?"
            + (f" It said: {said}" if said else ""),
            provider=endpoint.provider,
            status=response.status_code,
            request_id=request_id_of(response.headers, endpoint.secret),
        )


def _stream_body(
    endpoint: Endpoint, response: httpx.Response
) -> tuple[AsyncIterator[bytes], Decode]:
    try:
        return _body(response)
    except UnsupportedEncoding as exc:
        raise ProviderProtocolError(
            f"{endpoint.provider} answered {response.status_code} at {endpoint.shown}, but {exc}",
            provider=endpoint.provider,
            status=response.status_code,
            request_id=request_id_of(response.headers, endpoint.secret),
        ) from exc


async def _events(
    endpoint: Endpoint,
    response: httpx.Response,
    request_id: str | None,
    reads: tuple[AsyncIterator[bytes], Decode],
    decoder: SSEDecoder,
) -> AsyncIterator[ServerSentEvent]:
    chunks, decode = reads
    suspended = False  # whether httpx's byte generators are paused at a yield
    try:
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                suspended = False
                break
            except HTTPX_ERRORS as exc:
                suspended = False
                raise translate(exc, endpoint, streaming=True, request_id=request_id) from exc
            except BaseException:
                suspended = False
                raise
            suspended = True
            try:
                # One piece at a time: a compressed read may inflate far past the cap.
                for piece in decode(chunk):
                    for event in decoder.feed(piece):
                        yield event
            except LineTooLong as exc:
                raise _too_long(exc, endpoint, request_id) from exc
            except UndecodableBody as exc:
                raise ProviderProtocolError(
                    f"{endpoint.provider} stream from {endpoint.shown} was cut off or garbled:"
                    f" {exc}",
                    provider=endpoint.provider,
                    request_id=request_id,
                ) from exc
        try:
            decoder.close()  # the event the body ended inside is held to the cap too
        except LineTooLong as exc:
            raise _too_long(exc, endpoint, request_id) from exc
    finally:
        if suspended:
            await _abandon(response, chunks)


def _too_long(
    exc: LineTooLong, endpoint: Endpoint, request_id: str | None
) -> ProviderProtocolError:
    """The `ProviderProtocolError` of a line or an event past the decoder's cap."""
    what = "event whose data lines are" if isinstance(exc, EventTooLong) else "event-stream line"
    return ProviderProtocolError(
        f"{endpoint.provider} sent an {what} longer than"
        f" max_line_bytes={exc.limit} bytes ({endpoint.shown}); raise the provider's"
        " max_line_bytes= if such events are expected",
        provider=endpoint.provider,
        request_id=request_id,
    )


async def _abandon(response: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
    """Stop reading early: close the connection, then let httpx's generators finish.

    httpx reads the body through a chain of async generators. Left paused, they would be
    finalized by the garbage collector, which the loop reports as a ResourceWarning; after the
    close their next read fails at once, which ends them properly.
    """
    await response.aclose()
    try:
        async for _ in chunks:
            pass
    except Exception:
        pass  # the connection was closed on purpose: a failing read is expected


def encode_body(body: Mapping[str, Any], provider: str = "") -> bytes:
    """The request body as UTF-8 JSON, whatever its text holds.

    A value JSON has no form for (a ``date`` or ``Decimal`` in `RequestOptions.extra`, in a
    tool spec or in tool-call arguments; ``NaN``, which Python would write but no API parses)
    is a `RequestError` naming where it is in the body, before anything is sent.

    A lone surrogate (half of a character a server split across deltas and never completed,
    kept in the conversation) has no UTF-8 form: the encoding would fail, and so would every
    later turn of the conversation. Then the text goes through UTF-16, which makes a pair of
    halves the character it stands for and a lone half U+FFFD. The ``\\udXXX`` escape
    ``ensure_ascii`` would write keeps a lone half, but strict JSON parsers reject it.
    """
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RequestError(
            f"{provider}: the request cannot be sent as JSON: {not_json(body)} ({exc}) —"
            " RequestOptions.extra, tool specs and tool-call arguments may hold only JSON"
            " values: str, finite numbers, bool, None, lists and dicts with string keys"
        ) from None
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


def not_json(value: Any, path: str = "body", seen: frozenset[int] = frozenset()) -> str:
    """Where in `value` the first value JSON cannot encode is, and what it is (``""`` when
    there is none)."""
    if value is None or isinstance(value, str | bool | int):
        return ""
    if isinstance(value, float):
        return "" if math.isfinite(value) else f"{path} is {value!r}"
    if not isinstance(value, dict | list | tuple):
        return f"{path} is a {type(value).__name__}"
    if id(value) in seen:
        return f"{path} contains itself"
    inner = seen | {id(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            if not (key is None or isinstance(key, str | int | float | bool)):
                return f"{path} has a key that is a {type(key).__name__}"
            if found := not_json(item, f"{path}.{key}", inner):
                return found
        return ""
    for index, item in enumerate(value):
        if found := not_json(item, f"{path}[{index}]", inner):
            return found
    return ""


@asynccontextmanager
async def open_stream(
    endpoint: Endpoint, body: Mapping[str, Any], pool: Pool | None = None, owner: str = ""
) -> AsyncIterator[OpenedStream]:
    """POST `body` as JSON and yield the response's SSE events; close everything on exit.

    The request goes through `pool`'s client when it is held, else through a client of its
    own. `owner` names the provider in the errors of a closed pool.
    """
    content = encode_body(body, endpoint.provider)
    async with _client(endpoint, pool, owner or endpoint.provider) as (client, pooled):
        try:
            response = await _send(client, endpoint, content)
        except ProviderError as error:
            # The httpx error it was raised from may quote what the server sent (an illegal
            # header line echoing the key): formatted tracebacks print the whole chain.
            scrub_error(error, endpoint.secret)
            raise
        try:
            request_id = request_id_of(response.headers, endpoint.secret)
            await _check_content_type(endpoint, response)
            reads = _stream_body(endpoint, response)
            decoder = SSEDecoder(endpoint.max_line_bytes)
            events = _events(endpoint, response, request_id, reads, decoder)
            try:
                yield OpenedStream(request_id, events, pooled, decoder)
            finally:
                await events.aclose()  # type: ignore[attr-defined]
        finally:
            await response.aclose()


async def _drain(events: AsyncIterator[ServerSentEvent]) -> None:
    """Read the body to its end, briefly, so that the connection returns to the pool."""
    with anyio.move_on_after(DRAIN_SECONDS):
        try:
            async for _ in events:
                pass
        except ProviderError:
            pass  # the answer is complete: a fault after it costs the connection only


class Parser(Protocol):
    """The pure half of a provider: turns SSE events into model events."""

    @property
    def done(self) -> bool:
        """Whether the provider's terminator (``[DONE]``, ``message_stop``) has been seen."""
        ...

    def feed(self, event: ServerSentEvent) -> list[ModelEvent]:
        """The model events one SSE event yields; raises `ProviderProtocolError`."""
        ...

    def end(self, unterminated: ServerSentEvent | None = None) -> list[ModelEvent]:
        """The body ended (EOF) without a dispatched terminator. `unterminated` is the event
        the body ended inside (no blank line after it): when it is the provider's end marker,
        whole, the stream is complete and this returns what that marker yields; otherwise
        raise for a truncated stream."""
        ...


@asynccontextmanager
async def open_model_stream(
    endpoint: Endpoint,
    body: Mapping[str, Any],
    parser: Callable[[str | None], Parser],
    pool: Pool | None = None,
    owner: str = "",
) -> AsyncIterator[AsyncIterator[ModelEvent]]:
    """The `Model.stream` of a provider: POST `body`, parse the stream with `parser`.

    Args:
        endpoint: Where to send the request.
        body: The request body (the pure core built it).
        parser: Makes the stream's parser, given the response's request id.
        pool: The provider's pool (its pooled client, when held).
        owner: The provider as errors name it.
    """
    async with open_stream(endpoint, body, pool, owner) as opened:
        events = _model_events(opened, parser(opened.request_id), endpoint)
        try:
            yield events
        finally:
            await events.aclose()  # type: ignore[attr-defined]


_UNREADABLE = (TypeError, ValueError, KeyError, AttributeError, RecursionError)
"""What a parser raises on a payload of the right JSON shape with wrong types inside (or
nested too deep to handle): still a protocol error, never a bare Python one."""


def _unreadable(
    exc: Exception, event: ServerSentEvent, opened: OpenedStream, endpoint: Endpoint
) -> ProviderProtocolError:
    """The `ProviderProtocolError` of an event whose payload the parser could not read."""
    # Scrubbed before it is cut: a key cut in two would no longer match.
    data = scrub(event.data, endpoint.secret)[:200]
    return ProviderProtocolError(
        f"{endpoint.provider} sent an event the parser could not read:"
        f" {type(exc).__name__}: {exc} (data: {data!r})",
        provider=endpoint.provider,
        request_id=opened.request_id,
    )


async def _model_events(
    opened: OpenedStream, parser: Parser, endpoint: Endpoint
) -> AsyncIterator[ModelEvent]:
    try:
        async for event in opened.events:
            try:
                items = parser.feed(event)
            except _UNREADABLE as exc:
                raise _unreadable(exc, event, opened, endpoint) from exc
            for item in items:
                yield item
            if parser.done:
                # Nothing after the terminator matters; a pooled connection is worth its end.
                if opened.pooled:
                    await _drain(opened.events)
                return
        # The body ended without a dispatched terminator: whole in the event it ended
        # inside (`data: [DONE]` without the blank line after it), or truncated.
        unterminated = opened.unterminated()
        try:
            items = parser.end(unterminated)
        except _UNREADABLE as exc:
            event = unterminated or ServerSentEvent()  # only a payload can be unreadable
            raise _unreadable(exc, event, opened, endpoint) from exc
        for item in items:
            yield item
    except ProviderError as error:
        # These errors quote what the stream said (an error event, a line that is not
        # JSON): an upstream echoing the key must not put it in them.
        scrub_error(error, endpoint.secret)
        raise


class PooledProvider:
    """The lifetime both providers share: ``async with model``, `aclose`, `hold`.

    ``async with model:`` opens the provider's connection pool and `aclose` (or the end of
    that block) closes it for good. `hold` keeps the pool open without owning the provider's
    lifetime: a pipeline, a session and the CLI hold their model, so every turn of theirs
    reuses one connection, and they close what they opened when they end.
    """

    _pool: Pool

    @property
    def provider(self) -> str:
        """The provider's name in errors."""
        raise NotImplementedError

    def _endpoint(self) -> Endpoint:
        raise NotImplementedError

    def _owner(self) -> str:
        return f"{type(self).__name__}({getattr(self, 'model', '')!r})"

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called (or an ``async with`` block of the provider ended)."""
        return self._pool.closed

    async def __aenter__(self) -> Self:
        self._pool.acquire(self._endpoint(), self._owner(), own=True)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the provider's connections; using it afterwards is a `ProviderError`."""
        await self._pool.close()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[Self]:
        """Keep the connection pool open for the block (holds nest and overlap); the last
        hold to end closes the pool, and the provider stays usable."""
        self._pool.acquire(self._endpoint(), self._owner())
        try:
            yield self
        finally:
            await self._pool.release()
