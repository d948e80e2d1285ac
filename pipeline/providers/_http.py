"""The thin I/O shell the providers share: one POST, retries, SSE, and the error seam.

Everything that touches httpx lives here. `translate` is the one place where httpx's
exceptions become the `ProviderError` tree; `status_error` is the one place where a non-2xx
answer does. Retries happen only before a stream starts: once a 2xx status has been read,
whatever goes wrong goes straight to the caller, because the pipeline may already have passed
tokens on.

A total deadline is not ours to enforce: it is the caller's trio cancel scope, and its
cancellation passes through untouched (`trio.Cancelled` is not an `Exception`).
"""

import email.utils
import functools
import json
import logging
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol, final

import attrs
import httpx
import trio

from .._errors import (
    ConfigError,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
    RateLimited,
)
from .._model import ModelEvent
from ._sse import ServerSentEvent, SSEDecoder

log = logging.getLogger("turnplug.providers")

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
"""Ten minutes of silence before a read fails (reasoning models can think that long before
their first token), five seconds to connect."""

RETRY_STATUSES = frozenset({408, 409, 429})
"""Retried statuses besides every 5xx (Anthropic's 529 "overloaded" included)."""

BACKOFF_START = 0.5
BACKOFF_CAP = 8.0
HINT_CAP = 60.0
"""A server's delay hint above this many seconds means "give up now", not "block the turn"."""

_REDACTED = "[redacted]"
_SHORTEST_SECRET = 8


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building a context loads the CA bundle (milliseconds of CPU); one per process is enough.
    return httpx.create_ssl_context()


def scrub(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced: no key may leak into an error.

    A placeholder key a few characters long (``"ollama"``, ``"EMPTY"``) is no secret, and
    replacing it would mangle words of the message.
    """
    if not secret or len(secret) < _SHORTEST_SECRET:
        return text
    return text.replace(secret, _REDACTED)


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
        except (TypeError, ValueError):
            return None
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
        data = json.loads(body)
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


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The provider's request id (``x-request-id`` for OpenAI, ``request-id`` for Anthropic)."""
    return headers.get("x-request-id") or headers.get("request-id")


def as_timeout(value: float | httpx.Timeout) -> httpx.Timeout:
    """A provider's ``timeout=``: seconds for every phase, or an ``httpx.Timeout``."""
    return value if isinstance(value, httpx.Timeout) else httpx.Timeout(value)


def check_retries(_instance: object, _attribute: object, value: int) -> None:
    """Validate a provider's ``max_retries=``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_retries must be an int >= 0, got {value!r}")


def strip_slash(base_url: str) -> str:
    """A base URL without its trailing slash, so that paths join cleanly."""
    return base_url.rstrip("/")


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
        missing_key: A hint added to a 401 when no key was sent.
    """

    provider: str
    url: str
    headers: Mapping[str, str] = attrs.field(repr=False)
    secret: str | None = attrs.field(repr=False)
    timeout: httpx.Timeout
    max_retries: int
    transport: httpx.AsyncBaseTransport | None = None
    missing_key: str | None = None


def endpoint_for(
    model: Any, url: str, headers: dict[str, str], auth: Callable[[str], dict[str, str]]
) -> Endpoint:
    """Where one request of `model` (a provider) goes, its key read and checked now.

    Args:
        model: The provider: its ``provider``, ``api_key``, ``api_key_env``, ``timeout``,
            ``max_retries`` and ``transport`` are read.
        url: The request's URL.
        headers: The provider's own headers.
        auth: The headers that carry a key.
    """
    variable = model.api_key_env
    key = checked_key(
        model.api_key or (os.environ.get(variable) if variable else None),
        model.provider,
        "api_key=" if model.api_key else str(variable),
    )
    where = f"set {variable} or " if variable else ""
    return Endpoint(
        model.provider,
        url,
        {"content-type": "application/json", "accept": "text/event-stream", **headers}
        | (auth(key) if key else {}),
        key,
        as_timeout(model.timeout),
        model.max_retries,
        model.transport,
        None if key else f"no API key was sent: {where}pass api_key=",
    )


@final
@attrs.frozen
class OpenedStream:
    """A 2xx streaming response: its request id and its events."""

    request_id: str | None
    events: AsyncIterator[ServerSentEvent]


def translate(
    exc: httpx.HTTPError, endpoint: Endpoint, *, streaming: bool, request_id: str | None = None
) -> ProviderError:
    """The seam: map one httpx exception to the `ProviderError` tree.

    Args:
        exc: What httpx raised.
        endpoint: Where the request went.
        streaming: Whether a 2xx response had arrived: a connection cut then is a truncated
            stream (`ProviderProtocolError`), before it a connection failure.
        request_id: The response's request id, if one had arrived.
    """
    name, url = endpoint.provider, endpoint.url
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
    if streaming and isinstance(exc, httpx.RemoteProtocolError | httpx.DecodingError):
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
    if isinstance(exc, httpx.TransportError):
        return ProviderConnectionError(
            f"{name}: could not talk to {url} ({where}): {type(exc).__name__}: {detail}",
            provider=name,
            request_id=request_id,
        )
    return ProviderError(
        f"{name}: {type(exc).__name__} {where} ({url}): {detail}",
        provider=name,
        request_id=request_id,
    )


def status_error(
    endpoint: Endpoint, status: int, headers: Mapping[str, str], body: str, attempts: int
) -> ProviderStatusError:
    """The error for a non-2xx answer; the message keeps the provider's type and message."""
    body = scrub(body, endpoint.secret)
    kind, text = error_detail(body)
    request_id = request_id_of(headers)
    said = f"{kind}: {text}" if kind and text else (text or kind or body[:200] or "(empty body)")
    message = f"{endpoint.provider} answered HTTP {status} at {endpoint.url}: {said}"
    if request_id:
        message += f" (request id {request_id})"
    if attempts > 1:
        message += f" — after {attempts} attempts"
    if status == 401 and endpoint.missing_key:
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


@asynccontextmanager
async def _client(endpoint: Endpoint) -> AsyncIterator[httpx.AsyncClient]:
    if endpoint.transport is not None:
        # The caller owns an injected transport: closing the client would close it too.
        yield httpx.AsyncClient(
            transport=endpoint.transport, timeout=endpoint.timeout, trust_env=False
        )
        return
    async with httpx.AsyncClient(timeout=endpoint.timeout, verify=_ssl_context()) as client:
        yield client


async def _send(client: httpx.AsyncClient, endpoint: Endpoint, content: bytes) -> httpx.Response:
    """POST until a 2xx status arrives, retrying what may heal; raise what does not."""
    request = client.build_request("POST", endpoint.url, headers=endpoint.headers, content=content)
    attempts = endpoint.max_retries + 1
    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            # A request httpx refuses to send (a bad header) fails the same way every time.
            if last or isinstance(exc, httpx.LocalProtocolError):
                raise translate(exc, endpoint, streaming=False) from exc
            log.warning("%s: request %d failed (%s); retrying", endpoint.provider, attempt, exc)
            await trio.sleep(backoff(attempt - 1, random.random()))
            continue
        if response.is_success:
            return response
        try:
            body = (await response.aread()).decode("utf-8", "replace")
        except httpx.HTTPError as exc:
            raise translate(
                exc, endpoint, streaming=False, request_id=request_id_of(response.headers)
            ) from exc
        finally:
            await response.aclose()
        delay = None
        if not last and should_retry(response.status_code, response.headers, body):
            delay = retry_delay(attempt - 1, response.headers, random.random())
        if delay is None:
            raise status_error(endpoint, response.status_code, response.headers, body, attempt)
        # The status and the delay only: never a header, so never a key.
        log.warning(
            "%s: request %d answered %d; retrying in %.2f s",
            endpoint.provider,
            attempt,
            response.status_code,
            delay,
        )
        await trio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def _check_content_type(endpoint: Endpoint, response: httpx.Response) -> None:
    kind = response.headers.get("content-type", "")
    if not kind.lower().startswith("text/event-stream"):
        raise ProviderProtocolError(
            f"{endpoint.provider} answered {response.status_code} with content-type"
            f" {kind or '(none)'!r} at {endpoint.url}, expected a text/event-stream — is the"
            " base_url right, and does the server support streaming?",
            provider=endpoint.provider,
            status=response.status_code,
            request_id=request_id_of(response.headers),
        )


async def _events(
    endpoint: Endpoint, response: httpx.Response, request_id: str | None
) -> AsyncIterator[ServerSentEvent]:
    decoder = SSEDecoder()
    chunks = response.aiter_bytes()
    suspended = False  # whether httpx's byte generators are paused at a yield
    try:
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                suspended = False
                break
            except httpx.HTTPError as exc:
                suspended = False
                raise translate(exc, endpoint, streaming=True, request_id=request_id) from exc
            except BaseException:
                suspended = False
                raise
            suspended = True
            for event in decoder.feed(chunk):
                yield event
        decoder.close()
    finally:
        if suspended:
            await _abandon(response, chunks)


async def _abandon(response: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
    """Stop reading early: close the connection, then let httpx's generators finish.

    httpx reads the body through a chain of async generators. Left paused, they would be
    finalized by the garbage collector, which trio reports as a ResourceWarning; after the
    close their next read fails at once, which ends them properly.
    """
    await response.aclose()
    try:
        async for _ in chunks:
            pass
    except Exception:
        pass  # the connection was closed on purpose: a failing read is expected


@asynccontextmanager
async def open_stream(endpoint: Endpoint, body: Mapping[str, Any]) -> AsyncIterator[OpenedStream]:
    """POST `body` as JSON and yield the response's SSE events; close everything on exit."""
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    async with _client(endpoint) as client:
        response = await _send(client, endpoint, content)
        try:
            request_id = request_id_of(response.headers)
            _check_content_type(endpoint, response)
            events = _events(endpoint, response, request_id)
            try:
                yield OpenedStream(request_id, events)
            finally:
                await events.aclose()  # type: ignore[attr-defined]
        finally:
            await response.aclose()


class Parser(Protocol):
    """The pure half of a provider: turns SSE events into model events."""

    @property
    def done(self) -> bool:
        """Whether the provider's terminator (``[DONE]``, ``message_stop``) has been seen."""
        ...

    def feed(self, event: ServerSentEvent) -> list[ModelEvent]:
        """The model events one SSE event yields; raises `ProviderProtocolError`."""
        ...

    def end(self) -> list[ModelEvent]:
        """The body ended (EOF) without the terminator: raise for a truncated stream."""
        ...


@asynccontextmanager
async def open_model_stream(
    endpoint: Endpoint, body: Mapping[str, Any], parser: Callable[[str | None], Parser]
) -> AsyncIterator[AsyncIterator[ModelEvent]]:
    """The `Model.stream` of a provider: POST `body`, parse the stream with `parser`.

    Args:
        endpoint: Where to send the request.
        body: The request body (the pure core built it).
        parser: Makes the stream's parser, given the response's request id.
    """
    async with open_stream(endpoint, body) as opened:
        events = _model_events(opened, parser(opened.request_id), endpoint.provider)
        try:
            yield events
        finally:
            await events.aclose()  # type: ignore[attr-defined]


async def _model_events(
    opened: OpenedStream, parser: Parser, provider: str
) -> AsyncIterator[ModelEvent]:
    async for event in opened.events:
        try:
            items = parser.feed(event)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # A payload of the right JSON shape with wrong types inside: still a protocol
            # error, never a bare Python one.
            raise ProviderProtocolError(
                f"{provider} sent an event the parser could not read:"
                f" {type(exc).__name__}: {exc} (data: {event.data[:200]!r})",
                provider=provider,
                request_id=opened.request_id,
            ) from exc
        for item in items:
            yield item
        if parser.done:
            return  # open_stream closes the response: nothing after the terminator matters
    for item in parser.end():
        yield item
