"""The ASGI application of `turnplug serve`: a pipeline behind the OpenAI Chat Completions API.

Routes: ``POST /v1/chat/completions`` (one turn per request, streamed or not), ``GET
/v1/models`` and ``GET /v1/models/{id}``, ``GET /healthz``, the live page at ``/`` and its
feed of turn events at ``GET /v1/turnplug/events``. Starlette (on AnyIO, so on trio and on
asyncio) does the routing; the completion endpoint is a plain ASGI callable so that it
decides its status only once it knows the turn's fate. What each outcome maps to is in
``docs/serve.md``.
"""

import base64
import contextlib
import contextvars
import hashlib
import hmac
import importlib.resources
import json
import logging
import math
import os
import re
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from contextlib import asynccontextmanager
from functools import cache, partial
from typing import Any, final

import anyio
import anyio.abc
import attrs
from anyio.streams.memory import MemoryObjectSendStream
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline import (
    BudgetError,
    ConfigError,
    Cont,
    Halt,
    Hook,
    HookError,
    LogConflict,
    Pipeline,
    PipelineError,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    RequestError,
    TurnResult,
    cont,
    halt,
    hook,
)
from pipeline import events as ev
from pipeline.logs import MAX_ID_BYTES, Log
from pipeline.providers import AnthropicMessages
from turns import Context, Message, Reply, RequestOptions, ToolCall, ToolResult, Turn
from turns.serde import to_dict

from .._summary import needs_log
from ..config._models import unwrapped
from ._timeline import plain, rejected_by
from ._wire import (
    DONE,
    ChatRequest,
    Completion,
    Upstream,
    WireError,
    answer_text,
    check_continuation,
    json_bytes,
    parse_request,
    split_text,
    sse,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_Ended = ev.HookFinished | ev.HookFailed | ev.HookSkipped
"""The event a hook's run ends with."""

MIB = 1 << 20
_logger = logging.getLogger("turnplug.serve")
CONVERSATION_HEADER = "x-conversation-id"
REQUEST_ID_HEADER = b"x-request-id"
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "turnplug_serve_request_id", default=None
)
MODEL_PREFIX = "/v1/models/"
"""Where one model is described (``GET /v1/models/{id}``)."""
_REDACTED = "[REDACTED]"
POLICY_HOOK = "client_tool_policy"
"""The post hook that judges tool calls returned to the client (see `Gateway._police`)."""
ACCEPTED_HOOK = "gateway_accepted"
"""The last post hook of a pipeline with background hooks: it keeps the accepted turn, which
a stateless request is answered with when its background hooks outlast the turn timeout."""
RETRY_AFTER = 1
"""Seconds a client refused while the gateway shuts down is asked to wait (``Retry-After``)."""
_SHUTTING_DOWN = (
    (b"retry-after", str(RETRY_AFTER).encode()),
    # A retry on a new connection reaches another gateway behind a load balancer.
    (b"connection", b"close"),
)


def request_id() -> str | None:
    """The id of the gateway request being served here (its ``x-request-id``), or None.

    Set for everything the request runs, its turn's hooks, model calls and background hooks
    included (tasks and worker threads inherit it), so a log line can name the request it
    was written for (`turnplug serve` does, see docs/serve.md, "Logging").
    """
    return _request_id.get()


def scrub_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every one of `secrets` (the upstream and gateway keys) replaced."""
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return text


@final
@attrs.frozen(kw_only=True)
class Settings:
    """How a gateway runs.

    Attributes:
        model: The model name the gateway reports (``/v1/models``, every response).
        api_key: The bearer key clients must send; None serves without authentication.
        log: Where conversations live (``X-Conversation-Id``); None: stateless only.
        max_body: The largest request body accepted, in bytes.
        turn_timeout: The longest a turn may take, in seconds.
        secrets: Values that must never leave the gateway (the upstream key, the gateway
            key): scrubbed from every error and page event as a last line of defence.
        recent: How many page events are kept for a page that opens later.
        otel: Each request's turn joins its client's trace: the trace context of the
            request's headers (W3C ``traceparent``, read with OpenTelemetry's global
            propagator; never the client's baggage) is the current context where the turn
            is set up, so the turn's span (`pipeline.otel`, which whoever serves the gateway
            instruments) is its child. Needs OpenTelemetry (``turnplug[otel]``).
    """

    model: str
    api_key: str | None
    log: Log | None = None
    max_body: int = MIB
    turn_timeout: float = 300.0
    secrets: tuple[str, ...] = ()
    recent: int = 500
    otel: bool = False


# -- the page's feed --------------------------------------------------------------------------


@cache
def live_page() -> tuple[str, str]:
    """The live page, and the Content-Security-Policy it is served with.

    The page shows what clients, models and hooks wrote, always as text; the policy is the
    second line of defence should markup ever slip through: only the page's own script and
    style run (named by their hashes: no inline handler, no other script), it may connect
    to this gateway only, load nothing else, and be framed by no other site.
    """
    html = importlib.resources.files(__package__).joinpath("_page.html").read_text("utf-8")
    return html, page_policy(html)


def page_policy(html: str) -> str:
    """The Content-Security-Policy that lets `html`'s own inline scripts and styles run:
    every ``<script>`` and ``<style>`` block's hash, a block whose tag has attributes
    included (a block left out would be refused, the page broken without a word)."""

    def sources(tag: str) -> str:
        blocks = re.findall(rf"<{tag}(?:\s[^>]*)?>(.*?)</{tag}\s*>", html, re.DOTALL | re.I)
        assert blocks, f"the live page has no <{tag}>"
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
            for b in blocks
        )

    return (
        f"default-src 'none'; script-src {sources('script')}; style-src {sources('style')};"
        " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


@final
class Feed:
    """Turn events for the live page: the recent ones kept, new ones sent to every watcher.

    Events are kept as they come and turned into frames only when a page reads them, so a
    gateway that nobody watches spends nothing on its feed but a deque append. A watcher that
    falls behind by a whole buffer is dropped (its page reconnects), so a slow browser never
    slows a turn.
    """

    def __init__(self, recent: int, scrub: Callable[[str], str]) -> None:
        self._recent: deque[ev.Event | Mapping[str, Any]] = deque(maxlen=recent)
        self._watchers: set[MemoryObjectSendStream[bytes]] = set()
        self._scrub = scrub
        self._closed = False

    def close(self) -> None:
        """End every watcher's feed, now and from now on (the gateway is stopping: a page's
        feed never ends by itself, so the server would wait for it until its timeout)."""
        self._closed = True
        for watcher in self._watchers:
            watcher.close()
        self._watchers.clear()

    def publish(self, item: ev.Event | Mapping[str, Any]) -> None:
        """Keep a turn event (or a gateway record, a mapping) and send it to every watcher."""
        self._recent.append(item)
        if not self._watchers:
            return
        frame = self._frame(item)
        if frame is None:
            return
        for watcher in list(self._watchers):
            try:
                watcher.send_nowait(frame)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._watchers.discard(watcher)
                watcher.close()

    def _frame(self, item: ev.Event | Mapping[str, Any]) -> bytes | None:
        data = item if isinstance(item, Mapping) else page_event(item)
        if data is None:
            return None
        # (`sse` writes a lone surrogate escaped: the feed goes on for every watcher.)
        return sse(self._scrub(json.dumps(data, ensure_ascii=False, default=str)))

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[bytes]]:
        send, receive = anyio.create_memory_object_stream[bytes](1000)
        for item in self._recent:
            frame = self._frame(item)
            if frame is not None:
                send.send_nowait(frame)
        if self._closed:
            send.close()  # what was kept, then the end
        else:
            self._watchers.add(send)
        try:
            async with receive:
                yield receive
        finally:
            self._watchers.discard(send)
            send.close()


def page_event(event: ev.Event) -> dict[str, Any] | None:
    """An event as the page receives it: what a log could hold, nothing more.

    Text deltas are left out (the accepted reply comes whole in ``ReplyReady``); every other
    event goes with all of its fields, whatever they are, so fields added to events later
    reach the page without a change here. Request options (`ModelCalled.options`) go with
    the keys of their ``extra`` only: the log keeps no request options, and the values are
    a client's (its ``user``, an end user's id) or a hook's.
    """
    if type(event) is ev.TextDelta:
        return None
    data: dict[str, Any] = {"event": type(event).__name__}
    for field in attrs.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, Reply):
            data["text"] = value.text
            data["finish_reason"] = value.finish_reason
            data["attempt"] = value.attempt
            data["usage"] = to_dict(value.usage)
            # The calls returned to the client for it to run: the log holds them in the
            # reply, and without them a turn that asked for tools shows an empty reply.
            data["tool_calls"] = [plain(p) for p in value.message.parts if type(p) is ToolCall]
            continue
        if isinstance(value, RequestOptions):
            data[field.name] = plain(value) | {"extra": list(value.extra)}
            continue
        data[field.name] = plain(value)
    return data


# -- outcomes to HTTP -------------------------------------------------------------------------


def outcome_error(result: TurnResult) -> WireError | None:
    """The error a turn that did not complete is answered with; None when it completed."""
    if result.outcome == "halted" and result.halt is not None:
        extra = {"hook": result.halt.hook}
        if result.reply is not None:
            extra["reply"] = result.reply.text
        return WireError(
            422,
            f"the turn was halted by hook {result.halt.hook!r}: {result.halt.reason}",
            type="turn_halted",
            code="halted",
            extra=extra,
        )
    if result.outcome == "exhausted":
        last = result.rejections[-1]
        rejected = rejected_by(len(result.rejections))
        return WireError(
            422,
            f"no acceptable reply: {rejected} hook {last.hook!r}: {last.feedback}",
            type="regeneration_exhausted",
            code="exhausted",
            extra={"hook": last.hook},
        )
    return None


def failure_error(exc: BaseException) -> WireError:
    """The error a failed turn is answered with (see docs/serve.md for the table)."""
    name = type(exc).__name__
    if isinstance(exc, LogConflict):
        # The official SDKs retry a 409 (the API's lock timeout) by themselves: this one
        # asks the client to reload first, or its message would go after a turn it has not
        # seen, the whole turn run again for it.
        return WireError(
            409,
            "the conversation grew while this turn ran (another request committed first);"
            " nothing of this turn was committed — reload the conversation and send again",
            type="conversation_conflict",
            code="conflict",
            headers=((b"x-should-retry", b"false"),),
        )
    if isinstance(exc, RateLimited):
        # The upstream's wait goes on to the client: the SDKs wait as `Retry-After` says
        # instead of retrying within a second into the same limit.
        wait = exc.retry_after
        seconds = math.ceil(wait) if wait is not None and math.isfinite(wait) else None
        return WireError(
            429,
            "the upstream model is rate limited; retry later"
            + (f" (in {seconds} s)" if seconds is not None else ""),
            type="upstream_error",
            code="rate_limited",
            headers=((b"retry-after", str(seconds).encode()),) if seconds is not None else (),
        )
    if isinstance(exc, ProviderTimeout):
        return WireError(
            504,
            "the upstream model did not answer in time",
            type="upstream_error",
            code="upstream_timeout",
        )
    if isinstance(exc, ProviderError):
        # The upstream's own message is not passed on: some quote the (masked) key.
        upstream = getattr(exc, "status", None)
        status = f" (HTTP {upstream})" if upstream else ""
        # An upstream that refused the request itself (a 4xx other than a timeout, a
        # conflict or a rate limit) refuses it again: the SDKs, which retry every 5xx,
        # are told not to run the turn again for nothing.
        final = isinstance(upstream, int) and 400 <= upstream < 500 and upstream not in (408, 409)
        return WireError(
            502,
            f"the upstream model failed: {name}{status}",
            type="upstream_error",
            code="upstream_failed",
            headers=((b"x-should-retry", b"false"),) if final else (),
        )
    if isinstance(exc, TimeoutError):
        return WireError(
            504,
            "the turn did not finish within the gateway's turn timeout",
            type="turn_timeout",
            code="timeout",
        )
    if isinstance(exc, RequestError | BudgetError):
        return WireError(400, f"{name}: {exc}", code="invalid_turn")
    if isinstance(exc, HookError):
        # Which hook, and the kind of failure; not the exception's own text, which may quote
        # what the hook was handling (a password in a connection string, a user's data).
        # The gateway's log has it whole (`Gateway._failed`).
        cause = exc.__cause__
        raised = f", which raised {type(cause).__name__}" if cause is not None else ""
        return WireError(
            500,
            f"the pipeline failed: {name} in hook {exc.hook!r} ({exc.stage} stage){raised} —"
            " the gateway's log has the details",
            type="pipeline_error",
            code="pipeline_failed",
        )
    if isinstance(exc, PipelineError):
        return WireError(
            500,
            f"the pipeline failed: {name}: {exc}",
            type="pipeline_error",
            code="pipeline_failed",
        )
    return WireError(500, f"internal error: {name}", type="server_error", code="internal")


# -- client tools: the pipeline's before-tool hooks still apply -------------------------------


async def police_calls(
    pipe: Pipeline, turn: Turn, calls: list[ToolCall], emit: Callable[[ev.Event], None]
) -> tuple[list[ToolCall], WireError | None]:
    """Judge tool calls the client is to run with the pipeline's before-tool hooks.

    The gateway does not run a client's tools, but its tool policy still decides whether the
    client may be asked to (`Pipeline.judge_tool_call`, so every hook option applies): a
    blocked call (or an ``ask`` the pipeline's permission does not grant) refuses the whole
    reply with 403, a halt with 422. Returns the calls as the hooks left them (a hook may
    rewrite arguments), or the error.
    """
    judged: list[ToolCall] = []
    for call in calls:
        verdict = await pipe.judge_tool_call(call, turn, emit=emit)
        if verdict.outcome == "halted":
            return judged, WireError(
                422,
                f"the turn was halted by hook {verdict.hook!r}: {verdict.reason}",
                type="turn_halted",
                code="halted",
                extra={"hook": verdict.hook or ""},
            )
        if verdict.outcome == "blocked":
            return judged, WireError(
                403,
                f"the model asked the client to run tool {call.name!r}, which hook"
                f" {verdict.hook!r} blocked: {verdict.reason}",
                type="tool_blocked",
                param="tools",
                code="tool_blocked",
                extra={"hook": verdict.hook or "", "tool": call.name},
            )
        judged.append(verdict.call)
    return judged, None


# -- the gateway ------------------------------------------------------------------------------


@final
class Gateway:
    """A pipeline served as an OpenAI-compatible API; `app` is the ASGI application."""

    def __init__(self, pipe: Pipeline, settings: Settings) -> None:
        # Text reaches a client only once nothing can take it back: held until the post
        # hooks accept it when any hook could still reject or halt the attempt.
        self.holds = bool(pipe.post or pipe.before_tool or pipe.after_tool)
        # Refusals of the client tool policy, by turn, until the turn's answer is sent.
        self._refused: dict[str, WireError] = {}
        # The client tool policy's own events, by turn, until the policy ends (see `publish`).
        self._judging: dict[str, list[ev.Event]] = {}
        if pipe.before_tool and not pipe.tools:
            # Tool calls returned to the client are judged by the before-tool hooks in the
            # last post hook, so a refusal stops the turn before anything is committed.
            police = hook(self._police, name=POLICY_HOOK)
            pipe = pipe._sharing(post=(*pipe.post, police))
        # Derived by `_sharing`, not `attrs.evolve`: each derived pipeline's turns use the MCP
        # connections of the command's `async with pipe`, not servers started per request.
        self.pipe = pipe._sharing(hold_until_accepted=True) if self.holds else pipe
        # Accepted turns of stateless requests whose background hooks are still running.
        # Only a stateless turn runs its background hooks before it is answered, so only its
        # pipeline keeps the accepted turn; a conversation's audit record never names the hook.
        self._accepted: dict[str, Turn] = {}
        self._stateless_pipe = self.pipe
        # A stateless turn has no log: a hook whose output only later turns read from one
        # (a running summary) would make the answer wait for work thrown away.
        stateless_post = tuple(entry for entry in self.pipe.post if not needs_log(entry))
        if len(stateless_post) < len(self.pipe.post):
            self._stateless_pipe = self.pipe._sharing(post=stateless_post)
        # The background hooks' names, which a stateless turn cut at its timeout reports.
        self._background = [
            entry.name for entry in stateless_post if isinstance(entry, Hook) and entry.background
        ]
        if self._background:
            keep = hook(self._keep_accepted, name=ACCEPTED_HOOK)
            post = tuple(_abandonable(entry, settings.turn_timeout) for entry in stateless_post)
            self._stateless_pipe = self.pipe._sharing(post=(*post, keep))
        # The background hooks the drain timeout cut, which may still run (a sync hook's
        # worker thread cannot be stopped): "background hook 'bg' of turn tp_1".
        self.abandoned: list[str] = []
        self.settings = settings
        # The API whose names the forwarded request parameters take (`_wire.forwarded`):
        # the provider's, behind a config's `[model]` wrapper too.
        self.upstream: Upstream = (
            "anthropic" if isinstance(unwrapped(pipe.model), AnthropicMessages) else "openai"
        )
        self._secrets = tuple(s for s in settings.secrets if s)
        self.feed = Feed(settings.recent, self.scrub)
        self._flying: set[str] = set()  # the turns whose requests are in flight, by turn_ref
        if settings.otel:
            # One that cannot load is refused here, not per request.
            client_propagator("Settings.otel")
        self._trace_failed = False  # a request's trace context could not be read (said once)
        # The turns that raised an interrupt and are answered 503 for it (`_stop_for`): they
        # are not what a drain waits for (`finishing`).
        self._raised: set[str] = set()
        self.shutting_down = False  # `shut_down` was called: new turns are refused
        self.cut = False  # `cut_turns` was called: the turns in flight were stopped
        # The KeyboardInterrupt or SystemExit a turn raised, which stops the gateway (`_stop_for`).
        self.interrupt: BaseException | None = None
        # Set when `interrupt` is, once for all: one event, so that every waiter wakes.
        self._interrupted = anyio.Event()
        self._cuts: set[Callable[[], None]] = set()  # each stops one turn in flight
        # Set when the last turn in flight ends, then replaced for the next quiet: every
        # waiter of one quiet waits on the same event.
        self._quiet = anyio.Event()
        # Conversation sessions live in the gateway's own task group (`running`), so that one
        # outlives its request: the answer goes out once the turn is committed, and the
        # session closes (draining background hooks) afterwards.
        self._group: anyio.abc.TaskGroup | None = None
        self._sessions = 0  # session tasks alive
        self._stopping = False  # `running` is ending: what is left is cancelled
        self._idle: anyio.Event | None = None
        self.closing = 0  # sessions answered and still closing (background hooks running)
        # By conversation: sessions answered and still closing, each with its closed event.
        self._closing: dict[str, set[anyio.Event]] = {}
        routes = [
            Route("/", self.page, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            Route("/v1/turnplug/events", self.events, methods=["GET"]),
            Route("/v1/chat/completions", _Endpoint(self), methods=["POST"]),
        ]
        self.router = Starlette(routes=routes)
        self.app = self._guard

    @property
    def in_flight(self) -> int:
        """How many turns are in flight: their requests not answered yet."""
        return len(self._flying)

    @property
    def finishing(self) -> int:
        """How many turns in flight a drain waits for to finish: not one that raised the
        interrupt stopping the gateway, which is answered 503 at once."""
        return len(self._flying - self._raised)

    def left(self) -> str:
        """What still runs past the drain, for the command's hard stop: the turns in flight,
        the sessions not closed, the background hooks the drain timeout cut; and why they
        may not stop.

        Read from another thread (the hard stop's timer) while the loop's may change them.
        """
        what = [f"turn {turn_ref} (in flight)" for turn_ref in sorted(_copied(self._flying))]
        if self._sessions:
            what.append(f"{self._sessions} conversation sessions (closing)")
        what.extend(f"{name} (cancelled at the drain timeout)" for name in list(self.abandoned))
        held = "; ".join(what) or "nothing the gateway still tracks (a worker thread)"
        return (
            f"{held} — a hook that does not stop when cancelled (a sync hook in a worker"
            " thread, an async hook shielded from cancellation)"
        )

    def shut_down(self) -> None:
        """Refuse new turns from now on (503 ``shutting_down``); those in flight go on."""
        self.shutting_down = True

    def cut_turns(self) -> None:
        """Stop every turn still in flight (the drain timeout has passed): each is answered
        503 ``shutting_down`` (an error frame when its stream had begun), and nothing of it
        is committed."""
        self.cut = True
        for cut in list(self._cuts):
            cut()

    async def interrupted(self) -> BaseException:
        """Return the KeyboardInterrupt or SystemExit a turn raised, once one did.

        Such a turn is answered 503 and the gateway refuses new turns from then on, as after
        `shut_down`: whoever serves it stops the server as on SIGTERM, and `running` raises
        the interrupt when it ends.
        """
        await self._interrupted.wait()
        assert self.interrupt is not None
        return self.interrupt

    def _stop_for(self, turn_ref: str, exc: BaseException) -> WireError:
        """Keep the interrupt turn `turn_ref` raised (`_keep_interrupt`) and return the error
        the turn is answered with.

        Out of the request's task an interrupt would be lost: the server answers a bare 500
        and goes on serving (on asyncio the loop's handler prints it; on trio nothing does).
        """
        self._raised.add(turn_ref)
        self._keep_interrupt(turn_ref, exc)
        name = type(exc).__name__
        error = WireError(
            503,
            f"the gateway is stopping: this turn raised {name} (in a hook, a tool or the"
            " model), which stops the gateway as SIGTERM does; nothing of it was committed",
            type="server_error",
            code="shutting_down",
            headers=_SHUTTING_DOWN,
        )
        error.__cause__ = exc  # the gateway's log names it whole (`_failed`)
        return error

    def _keep_interrupt(self, turn_ref: str, exc: BaseException) -> None:
        """Keep the interrupt turn `turn_ref` raised (the first; later ones are notes on it)
        and refuse new turns: whoever serves the gateway stops it (`interrupted`)."""
        if self.interrupt is None:
            self.interrupt = exc
        elif exc is not self.interrupt:
            name = type(exc).__name__
            self.interrupt.add_note(f"turn {turn_ref} also raised {name} as the gateway stopped")
        self.shut_down()
        self._interrupted.set()

    async def turns_finished(self) -> None:
        """Return once no turn is in flight (after `shut_down`, none starts again)."""
        while self.in_flight:
            await self._quiet.wait()

    def _turn_ended(self, turn_ref: str) -> None:
        self._flying.discard(turn_ref)
        if not self._flying:
            self._quiet.set()
            self._quiet = anyio.Event()

    def _join_client_trace(self, scope: Scope) -> Any:
        """Make the trace context of the request's headers (``traceparent``,
        ``tracestate``, or whatever the global propagator reads) the current one; the token
        to leave it with, or None. Whatever baggage a propagator read from the headers is
        dropped: the hooks see the baggage current where the request is served, never the
        client's.

        Without such headers, the context has no span: the turn starts a trace of its own.
        When a span is current already (an ASGI instrumentation's server span, or one an
        application serves the gateway in), it is left as it is: the turn is its child, and
        the headers are not read. A propagator that fails leaves the request untraced by
        the client's trace, said once: tracing never fails a turn.
        """
        try:
            from opentelemetry import baggage, context, propagate, trace

            if trace.get_current_span().get_span_context().is_valid:
                return None
            carrier: dict[str, list[str]] = {}
            for name, value in scope["headers"]:
                if name.lower() not in UNREAD_HEADERS:
                    key = name.decode("latin-1").lower()
                    carrier.setdefault(key, []).append(value.decode("latin-1"))
            # Any format's baggage (W3C, Jaeger's uberctx-*, OpenTracing's ot-baggage-*)
            # would be the hooks' context, sent on by every instrumented HTTP client.
            joined = baggage.clear(propagate.extract(carrier))
            for key, kept in baggage.get_all().items():
                joined = baggage.set_baggage(key, kept, joined)
            return context.attach(joined)
        except Exception as exc:
            if not self._trace_failed:
                self._trace_failed = True
                _logger.warning(
                    "--otel: could not read the request's trace context (%s: %s): its turn"
                    " is a trace of its own, out of the client's (said once: so is every"
                    " later request whose context cannot be read)",
                    type(exc).__name__,
                    exc,
                )
            return None

    def scrub(self, text: str) -> str:
        return scrub_secrets(text, self._secrets)

    def scrub_frame(self, body: Mapping[str, Any]) -> bytes:
        return sse(self.scrub(json.dumps(body, ensure_ascii=False)))

    # -- the outer layer: JSON errors, authentication, body size -------------------------------

    async def _guard(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.router(scope, receive, send)
            return
        # Every response names its request, errors included, as the API's do: the SDKs
        # show it (`_request_id`), and the gateway's log lines for the request carry it.
        # A turn's `turn_ref` is the same id, so the page and the audit record match too.
        named = f"req_{secrets.token_hex(16)}"
        scope["turnplug.request_id"] = named
        token = _request_id.set(named)
        try:
            await self._routed(scope, receive, send, (REQUEST_ID_HEADER, named.encode()))
        finally:
            _request_id.reset(token)

    async def _routed(
        self, scope: Scope, receive: Receive, send: Send, header: tuple[bytes, bytes]
    ) -> None:
        path = scope["path"]
        if path.startswith("/v1/") and not self._authorized(scope):
            await self.reply_error(
                send,
                WireError(
                    401,
                    "a valid API key is required: send 'Authorization: Bearer <key>' with the"
                    " key the gateway was started with",
                    code="invalid_api_key",
                ),
                headers=[(b"www-authenticate", b"Bearer"), header],
            )
            return
        routes = {"/", "/healthz", "/v1/models", "/v1/turnplug/events", "/v1/chat/completions"}
        # `/v1/models/` names no model: an unknown route, as the API answers it.
        if path not in routes and not (path.startswith(MODEL_PREFIX) and path != MODEL_PREFIX):
            await self.reply_error(
                send,
                WireError(404, f"no route {scope['method']} {path}", code="not_found"),
                headers=[header],
            )
            return
        # The one layer every response's messages pass (a stream's chunks too): it adds the
        # request id to the response's start, so no other layer is needed for it.
        await self.router(scope, receive, _json_405(send, self, header))

    def _authorized(self, scope: Scope) -> bool:
        key = self.settings.api_key
        if key is None:
            return True
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.partition(b" ")
        # Compared in constant time, whatever the length or content of what was sent.
        return hmac.compare_digest(token.strip(), key.encode()) and scheme.lower() == b"bearer"

    async def reply_error(
        self, send: Send, error: WireError, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        body = json_bytes(self.scrub(json.dumps(error.body(), ensure_ascii=False)))
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # A 404 quotes the path it was sent: never read as anything but JSON.
                    (b"x-content-type-options", b"nosniff"),
                    *error.headers,
                    *(headers or []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    # -- small routes ----------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        if self.shutting_down:
            # A load balancer's health check takes the gateway out of rotation.
            return JSONResponse(
                {"status": "shutting_down", "in_flight": self.in_flight, "closing": self.closing},
                status_code=503,
                headers={name.decode(): value.decode() for name, value in _SHUTTING_DOWN},
            )
        return JSONResponse({"status": "ok", "in_flight": self.in_flight, "closing": self.closing})

    def _model_object(self) -> dict[str, Any]:
        return {"id": self.settings.model, "object": "model", "created": 0, "owned_by": "turnplug"}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{id}`` (the SDKs' ``models.retrieve``): the configured model, or
        a 404 in the API's own shape for any other id."""
        # The decoded path: an id the SDK sent with its slash escaped is read whole.
        model = request.scope["path"][len(MODEL_PREFIX) :]
        if model == self.settings.model:
            return JSONResponse(self._model_object())
        error = WireError(
            404,
            f"the model {model!r} does not exist on this gateway: it serves"
            f" {self.settings.model!r} only (GET /v1/models lists it)",
            param="model",
            code="model_not_found",
        )
        # It quotes what was sent, as any 404 does: never read as anything but JSON.
        return Response(
            json_bytes(self.scrub(json.dumps(error.body(), ensure_ascii=False))),
            status_code=404,
            media_type="application/json",
            headers={"x-content-type-options": "nosniff"},
        )

    async def page(self, request: Request) -> Response:
        html, policy = live_page()
        return HTMLResponse(
            html,
            headers={
                "cache-control": "no-store",
                "content-security-policy": policy,
                "x-content-type-options": "nosniff",
            },
        )

    async def events(self, request: Request) -> Response:
        async def frames() -> AsyncIterator[bytes]:
            yield b": turnplug events\n\n"
            async with self.feed.watch() as watched:
                async for frame in watched:
                    yield frame

        return StreamingResponse(
            frames(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-content-type-options": "nosniff"},
        )

    # -- one turn --------------------------------------------------------------------------------

    def publish(self, event: ev.Event) -> None:
        if type(event) is ev.TextDelta:
            return
        if isinstance(event, ev.HookStarted | ev.HookFinished) and event.hook == ACCEPTED_HOOK:
            return  # the gateway's bookkeeping, not the pipeline's
        if isinstance(event, ev.HookFinished | ev.HookFailed) and event.hook == POLICY_HOOK:
            self._flush_judging(event.turn_ref)
        self.feed.publish(event)

    def _judged(self, turn_ref: str, event: ev.Event) -> None:
        """Keep an event of the client tool policy's hooks until the policy's own end.

        `Pipeline.judge_tool_call` runs outside the turn's event stream: its events (stamped
        on the turn's clock, as the policy runs in the turn) would reach the page ahead of
        the turn's events still on their way (the model call's end, the post hooks before
        the policy).
        """
        self._judging.setdefault(turn_ref, []).append(event)

    def _flush_judging(self, turn_ref: str) -> None:
        """Publish the policy's kept events, between its HookStarted and its end."""
        for event in self._judging.pop(turn_ref, ()):
            self.feed.publish(event)

    async def turn(
        self,
        request: ChatRequest,
        conversation: str | None,
        on_text: Callable[[str], Awaitable[None]] | None,
        turn_ref: str,
    ) -> tuple[Turn, list[str]]:
        """Run turn `turn_ref`; with a conversation, through a session of it, which commits it.

        Returns the turn as answered (its accepted reply) and the text as it was streamed.

        `on_text` receives text as it may be shown (accepted, transformed); when it is None,
        text is collected and returned with the result.

        Raises:
            WireError: The turn did not complete, or a client tool call was refused.
            PipelineError, TimeoutError: The turn failed.
        """
        # Not the message yet: it is shown as the log would hold it, once the turn completed
        # (a pre hook may scrub it first, and nothing of a failed turn is logged).
        self.feed.publish(
            {
                "event": "GatewayRequest",
                "turn_ref": turn_ref,
                "conversation_id": conversation,
                "stream": request.stream,
            }
        )
        try:
            if conversation is None:
                answered = await self._stateless(turn_ref, request, on_text)
            else:
                answered = await self._in_conversation(turn_ref, request, conversation)
        except Exception as exc:
            error = exc if isinstance(exc, WireError) else failure_error(exc)
            self._failed(turn_ref, error, _text(exc))
            raise error from exc
        except (KeyboardInterrupt, SystemExit) as exc:
            # Answered here, never raised on: the request's task is the server's.
            error = self._stop_for(turn_ref, exc)
            self._failed(turn_ref, error, _text(exc))
            raise error from exc
        except anyio.get_cancelled_exc_class():
            if self.cut and conversation is None:
                # Stopped at the drain timeout: answered 503 (`_Endpoint`), so a failure
                # like any other. (A conversation turn's session reports it as an error.)
                error = _cut_short()
                self._failed(turn_ref, error, error.message)
            raise
        finally:
            self._refused.pop(turn_ref, None)
            self._accepted.pop(turn_ref, None)
            self._flush_judging(turn_ref)  # a turn cut while its policy ran
        self.feed.publish(
            {
                "event": "GatewayMessage",
                "turn_ref": turn_ref,
                "message": _said(answered[0].user_message),
            }
        )
        return answered

    def _failed(self, turn_ref: str, error: WireError, detail: str) -> None:
        """Report a turn answered with `error`: on the page, and as a warning for a 5xx."""
        if error.status >= 500:
            _logger.warning(
                "turn %s failed (HTTP %d): %s", turn_ref, error.status, self.scrub(detail)
            )
        self.feed.publish(
            {
                "event": "GatewayError",
                "turn_ref": turn_ref,
                "status": error.status,
                "type": error.type,
                "message": error.message,
            }
        )

    def _check(self, request: ChatRequest, context: Context) -> None:
        """Refuse what the turn could not run: client tools beside the pipeline's own, tool
        results that answer no call of `context`."""
        if (request.tools or context.tools) and self.pipe.tools:
            raise WireError(
                400,
                "this gateway's pipeline runs its own tools; it does not accept tools from the"
                " client — leave 'tools' out of the request",
                param="tools",
                code="unsupported_parameter",
            )
        if request.message.role == "tool":
            check_continuation(request, context)
            return
        last = context.messages[-1] if context.messages else None
        waiting = [p.id for p in last.parts if type(p) is ToolCall] if last is not None else []
        if waiting:
            # Only a conversation's log can end so: a stateless request's own history is
            # checked before its turn. The upstream would refuse the turn (a 502, retried
            # by the SDKs).
            raise WireError(
                400,
                f"the conversation's last message holds tool calls {waiting} that have no"
                " result yet: send the results first (the assistant message with its"
                " 'tool_calls', then one tool message per call), then the new message",
                param="messages",
            )

    async def _stateless(
        self,
        turn_ref: str,
        request: ChatRequest,
        on_text: Callable[[str], Awaitable[None]] | None,
    ) -> tuple[Turn, list[str]]:
        if request.history_problem is not None:
            raise request.history_problem
        context = request.context()
        self._check(request, context)
        turn = Turn.start(request.message, context=context, turn_ref=turn_ref)
        turn = turn.with_request(**_set(request.options))
        live = on_text if not self.holds else None
        timeout = self.settings.turn_timeout
        ended: list[_Ended] = []
        pieces: list[str] = []
        drained: list[bool] = []  # the gateway stopped it past its drain timeout

        def cut() -> None:
            # An accepted answer whose background hooks are still running is sent, as at
            # the turn timeout; a turn not accepted yet is stopped whole (`_Endpoint`).
            if turn_ref in self._accepted:
                drained.append(True)
                deadline.cancel()

        try:
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as deadline:
                self._cuts.add(cut)
                async with self._stateless_pipe.stream(turn) as events:
                    pieces = await self._watch(events, live, ended)
        except (KeyboardInterrupt, SystemExit) as exc:
            accepted = self._accepted.get(turn_ref)
            if accepted is None:
                raise  # answered 503 by `turn`: nothing of it stands
            # Only background hooks were left: the answer stands and is sent, as a
            # conversation's is once committed; the interrupt still stops the gateway.
            self._keep_interrupt(turn_ref, exc)
            self._stopped_background(turn_ref, ended, exc)
            return accepted, pieces
        finally:
            self._cuts.discard(cut)
        if not deadline.cancelled_caught:
            return self._answered(events.result).turn, pieces
        accepted = self._accepted.get(turn_ref)
        if accepted is None:
            raise TimeoutError(f"the turn did not finish within {timeout} s")
        # Only background hooks were left: they cannot change the answer, which is sent.
        why = (
            "was still running when the gateway stopped, past its drain timeout, and was"
            " cancelled; the answer was sent without it"
            if drained
            else f"did not finish within the gateway's turn timeout of {timeout} s and was"
            " cancelled; the answer was sent without it"
        )
        left = self._unended(ended)
        for name in left:
            _logger.warning("background hook %r of turn %s %s", name, turn_ref, why)
            if drained:
                self.abandoned.append(f"background hook {name!r} of turn {turn_ref}")
        self._cut_background(turn_ref, dict.fromkeys(left, why))
        return accepted, pieces

    def _stopped_background(
        self, turn_ref: str, ended: Sequence[_Ended], exc: BaseException
    ) -> None:
        """Report the background hooks of an answered stateless turn that one of them stopped
        by raising `exc`, a KeyboardInterrupt or SystemExit: the one that raised it, and the
        others, which it cancelled.

        The pipeline ends each hook it started: the one that raised the interrupt with an
        enforced `HookFailed` (no other background failure is enforced), each it cut short
        with one of its own; read on the way (`ended`), they are on the page already. Only
        the hooks not read ending are reported here (one not started yet, or all of them
        when the turn's events stopped being read first). When the interrupt's own
        `HookFailed` was not read, it does not say which hook raised it: the hook is named
        when it was the only one left running; among several, they are named together.
        """
        left = self._unended(ended)
        raised = self.scrub(repr(exc))  # SystemExit(3), KeyboardInterrupt()
        # Among hooks interrupted at one instant, the pipeline raises the first declared, not
        # the first to end: the one whose enforced HookFailed tells the raised interrupt.
        enforced = [e for e in ended if type(e) is ev.HookFailed and e.enforced]
        told = [e for e in enforced if e.error == _named(exc)]
        stopper = next((e.hook for e in (*told, *enforced)), None)
        if stopper is not None:
            culprit = f"background hook {stopper!r}"
            why = (
                f"ended when {culprit} raised {raised}, which stops the gateway; the answer"
                " was sent"
            )
            reasons = dict.fromkeys(left, why)
        elif len(left) == 1:
            culprit = f"background hook {left[0]!r}"
            reasons = {left[0]: f"raised {raised}, which stops the gateway; the answer was sent"}
        else:
            culprit = f"one of the background hooks {', '.join(map(repr, left))}"
            why = (
                f"ended when {culprit} raised {raised}, which stops the gateway (it raised it,"
                " or was cancelled); the answer was sent"
            )
            reasons = dict.fromkeys(left, why)
        _logger.warning(
            "turn %s: %s raised %s after the answer was accepted; the answer is sent and the"
            " gateway stops",
            turn_ref,
            culprit,
            raised,
        )
        self._cut_background(turn_ref, reasons)

    def _unended(self, ended: Sequence[_Ended]) -> list[str]:
        """The background hooks of a stateless turn not read ending (`ended`, their end
        events), in order.

        Also one whose `HookStarted` was not read, or that had not started yet: the turn's
        end (its timeout, an interrupt) stops the reading of its events, and the hooks
        start after the accepted reply.
        """
        left = list(self._background)
        for event in ended:
            if event.hook in left:
                left.remove(event.hook)
        return left

    def _cut_background(self, turn_ref: str, reasons: Mapping[str, str]) -> None:
        """Report the background hooks of an answered stateless turn that its end (the turn
        timeout, an interrupt) cut, each with why, as a session reports those its drain
        timeout cuts; then the turn's end."""
        for name, why in reasons.items():
            self.publish(ev.HookFailed(turn_ref, name, "post", why, False))
        self.publish(ev.TurnFinished(turn_ref, "completed"))

    @asynccontextmanager
    async def running(self) -> AsyncIterator["Gateway"]:
        """The gateway's lifetime: conversation requests need it (``async with``).

        It holds the task group where conversation sessions run, so a session may close
        after its request was answered. On exit, what is still running is cancelled: call
        `drain` first to let it finish. Then the KeyboardInterrupt or SystemExit a turn
        raised, if one did (`interrupted`), is raised.
        """
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                self._idle = anyio.Event()
                self._idle.set()
                try:
                    yield self
                finally:
                    self._group = None
                    self._stopping = True
                    group.cancel_scope.cancel()
        finally:
            if self.interrupt is not None:
                raise self.interrupt

    async def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every conversation session to close; whether
        they all did (those left are cancelled when `running` ends)."""
        if self._idle is not None:
            with anyio.move_on_after(timeout):
                await self._idle.wait()
        return self._sessions == 0

    async def _in_conversation(
        self, turn_ref: str, request: ChatRequest, conversation: str
    ) -> tuple[Turn, list[str]]:
        """The turn through a session of the conversation, in a task of the gateway's
        (`_session`): it is answered as soon as the turn is committed, while the session
        goes on to commit the durable output of background hooks and close."""
        group = self._group
        if group is None:
            raise RuntimeError(
                "conversation turns need the gateway running: serve it inside"
                " `async with gateway.running():`"
            )
        handoff = _Handoff()
        self._sessions += 1
        if self._idle is not None and self._idle.is_set():
            self._idle = anyio.Event()
        group.start_soon(self._session, turn_ref, request, conversation, handoff)

        def cut() -> None:
            # Past the drain timeout: a turn not yet committed is stopped, and its session
            # answers 503 (`_Handoff.outcome`); one committed gets its answer.
            if not handoff.answered:
                handoff.scope.cancel()

        self._cuts.add(cut)
        try:
            await handoff.done.wait()
        except BaseException:
            # The request is cancelled (its client hung up): so is its turn, unless it was
            # already answered, and nothing of it is committed.
            if not handoff.answered:
                handoff.scope.cancel()
            raise
        finally:
            self._cuts.discard(cut)
        result, pieces = handoff.outcome()
        return self._answered(result).turn, pieces

    async def _session(
        self, turn_ref: str, request: ChatRequest, conversation: str, handoff: "_Handoff"
    ) -> None:
        """A conversation's session for one request: it loads the history, runs and commits
        the turn (only if the conversation did not grow meanwhile), hands the result over,
        then closes, which commits the durable output of background hooks (bounded by the
        turn timeout, as the session's drain timeout)."""
        log = self.settings.log
        assert log is not None
        timeout = self.settings.turn_timeout
        closed = anyio.Event()
        session = None
        try:
            with handoff.scope:
                with anyio.fail_after(timeout):
                    # A session of this conversation that answered and is still closing
                    # commits its background output first; this turn loads after it, so it
                    # neither misses that output nor conflicts with it.
                    for earlier in list(self._closing.get(conversation, ())):
                        await earlier.wait()
                async with self.pipe.session(
                    log=log, conversation_id=conversation, drain_timeout=timeout
                ) as session:
                    # The log holds the conversation: only the request's last message is new.
                    self._check(request, session.context)
                    with anyio.fail_after(timeout):
                        async with session.stream(
                            request.message,
                            system=request.system,
                            tools=request.tools,
                            request=request.options,
                            turn_ref=turn_ref,
                        ) as events:
                            # Text is sent once the turn is committed: never a turn that
                            # lost a race.
                            pieces = await self._watch(events, None)
                    handoff.answer(events.result, pieces)
                    self.closing += 1
                    self._closing.setdefault(conversation, set()).add(closed)
        except Exception as exc:
            if not handoff.answered:
                handoff.fail(exc)
            else:
                _logger.warning(
                    "conversation %r: closing the session after turn %s failed: %s",
                    conversation,
                    turn_ref,
                    self.scrub(_text(exc)),
                )
        except (KeyboardInterrupt, SystemExit) as exc:
            # Kept by the gateway, never raised on: out of this task (the gateway's group),
            # it would stop the server at once, turns in flight and all.
            if not handoff.answered:
                handoff.fail(self._stop_for(turn_ref, exc))
            else:
                # Answered 200, which may still be on its way: the drain waits for it.
                self._keep_interrupt(turn_ref, exc)
                _logger.warning(
                    "conversation %r: closing the session after turn %s raised %s: the"
                    " gateway stops",
                    conversation,
                    turn_ref,
                    self.scrub(_text(exc)),
                )
        finally:
            if handoff.answered and self._stopping:
                # (The session absorbs the cancellation: it reports its hooks as events.)
                _logger.warning(
                    "conversation %r: the session of turn %s was cancelled before its"
                    " background hooks finished (the gateway stopped at its drain timeout);"
                    " their output was not committed",
                    conversation,
                    turn_ref,
                )
            if session is not None:
                for event in session.events:
                    self.publish(event)
            if handoff.answered:
                self.closing -= 1
                waiting = self._closing.get(conversation)
                if waiting is not None:
                    waiting.discard(closed)
                    if not waiting:
                        del self._closing[conversation]
            closed.set()
            handoff.done.set()
            self._sessions -= 1
            if not self._sessions and self._idle is not None:
                self._idle.set()

    async def _watch(
        self,
        events: AsyncIterator[ev.Event],
        on_text: Callable[[str], Awaitable[None]] | None,
        ended: list[_Ended] | None = None,
    ) -> list[str]:
        """Publish a turn's events; its text goes to `on_text`, or is collected and returned.

        `ended` receives the end events (finished, failed or skipped) of the hooks that
        ended after the gateway's accepted hook: the background hooks.
        """
        pieces: list[str] = []
        accepted = False
        async for event in events:
            if type(event) is ev.TextDelta:
                if on_text is not None:
                    await on_text(event.text)
                else:
                    pieces.append(event.text)
                continue
            if ended is not None and isinstance(event, _Ended):
                if accepted:
                    ended.append(event)
                elif event.hook == ACCEPTED_HOOK:
                    accepted = True
            self.publish(event)
        return pieces

    def _answered(self, result: TurnResult) -> TurnResult:
        """`result`, if the turn completed; else the error it is answered with."""
        error = self._refused.pop(result.turn.turn_ref, None) or outcome_error(result)
        if error is not None:
            raise error
        return result

    async def _keep_accepted(self, turn: Turn) -> Cont[Turn]:
        """Keep the turn the post hooks accepted (this hook is the last of them)."""
        self._accepted[turn.turn_ref] = turn
        return cont(turn)

    async def _police(self, turn: Turn) -> Cont[Turn] | Halt:
        """The client tool policy: tool calls the client is to run, judged by the before-tool
        hooks (`police_calls`); a refusal halts the turn and is answered with its own error."""
        reply = turn.reply
        assert reply is not None
        calls = [p for p in reply.message.parts if type(p) is ToolCall]
        if not calls:
            return cont(turn)
        emit = partial(self._judged, turn.turn_ref)
        judged, error = await police_calls(self.pipe, turn, calls, emit)
        if error is not None:
            self._refused[turn.turn_ref] = error
            return halt(error.message)
        if judged != calls:
            turn = attrs.evolve(turn, reply=_with_calls(reply, calls, judged))
        return cont(turn)


def _abandonable(entry: Any, turn_timeout: float) -> Any:
    """A stateless turn's sync background hook without a timeout, with the turn's timeout
    as its own: its worker thread is then abandoned when the turn ends (its timeout, the
    drain timeout), as a timed-out hook's is, instead of being waited for. It never fires
    first: the hook starts after the turn, whose timeout is the same."""
    if isinstance(entry, Hook) and entry.background and not entry.is_async:
        return entry if entry.timeout is not None else attrs.evolve(entry, timeout=turn_timeout)
    return entry


def _copied(items: set[str]) -> tuple[str, ...]:
    """The items of a set another thread may be changing: copying it then may fail ("Set
    changed size during iteration"), so it is tried again; empty if it never succeeds."""
    for _ in range(100):
        try:
            return tuple(items)
        except RuntimeError:
            continue
    return ()


def _said(message: Message) -> str:
    """What the page shows as a request's message: the user's text, or the results sent."""
    if message.role != "tool":
        return message.text
    results = [p for p in message.parts if type(p) is ToolResult]
    return "tool results: " + "; ".join(f"{r.call_id}: {r.content}" for r in results)


def _text(exc: BaseException) -> str:
    """``Type: message``, and its cause the same way; a transformer's cause by its type only:
    its message may quote the text the transformer was there to change (a number to
    redact), which the warning must not release."""
    cause = exc.__cause__
    if cause is None:
        return _named(exc)
    if isinstance(exc, HookError) and exc.stage == "transformers":
        return f"{_named(exc)} (caused by {type(cause).__name__})"
    return f"{_named(exc)} (caused by {_named(cause)})"


def _named(exc: BaseException) -> str:
    """``Type: message``, or ``Type`` for an exception without a message."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _set(options: Any) -> dict[str, Any]:
    given = {
        name: getattr(options, name)
        for name in ("temperature", "max_tokens", "tool_choice")
        if getattr(options, name) is not None
    }
    return given | ({"extra": options.extra} if options.extra else {})


def _json_405(send: Send, gateway: Gateway, header: tuple[bytes, bytes]) -> Send:
    """`send`, with `header` (the ``x-request-id``) added to the response's start, and
    Starlette's plain-text 405 turned into an OpenAI-style JSON error."""
    replaced = False

    async def wrapped(message: MutableMapping[str, Any]) -> None:
        nonlocal replaced
        if message["type"] == "http.response.start":
            if message["status"] == 405:
                replaced = True
                await gateway.reply_error(
                    send,
                    WireError(405, "method not allowed on this route", code="method_not_allowed"),
                    headers=[header],
                )
                return
            message = {**message, "headers": [*message.get("headers", ()), header]}
        elif replaced:
            return
        await send(message)

    return wrapped


@final
class _Endpoint:
    """``POST /v1/chat/completions`` as a plain ASGI callable (see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway = self.gateway
        if gateway.shutting_down:
            # Refused before its body is read (the connection closes after the answer).
            await gateway.reply_error(send, _shutting_down())
            return
        try:
            body = await _read_body(scope, receive, gateway.settings.max_body)
            request = parse_request(body, gateway.upstream)
            conversation = _conversation_id(scope)
            if conversation is not None and gateway.settings.log is None:
                raise WireError(
                    400,
                    "X-Conversation-Id needs a conversation log: start the gateway with --log"
                    " PATH_OR_DSN, or leave the header out to send the whole conversation",
                    param="X-Conversation-Id",
                    code="no_log",
                )
            if conversation is not None and not conversation.strip():
                raise WireError(
                    400,
                    "X-Conversation-Id must not be empty",
                    param="X-Conversation-Id",
                    code="invalid_value",
                )
            if conversation is not None and len(conversation.encode()) > MAX_ID_BYTES:
                # What the log would refuse once the session opens: a 400, not a 500.
                raise WireError(
                    400,
                    f"X-Conversation-Id must be at most {MAX_ID_BYTES} bytes as UTF-8 (a log"
                    " cannot store a longer one) — use a shorter key, such as a hash",
                    param="X-Conversation-Id",
                    code="invalid_value",
                )
            if conversation is not None:
                conversation = await _logged_id(gateway.settings.log, conversation)
            if gateway.shutting_down:
                # The body came in after the signal: the turn is not started either.
                raise _shutting_down()
        except WireError as error:
            await gateway.reply_error(send, error)
            return
        turn_ref: str = scope["turnplug.request_id"]
        # In the request's own task, before its turn is set up: a stateless turn starts
        # here, a conversation's session task starts with a copy of this context. Before
        # the turn counts as in flight, so nothing between the two can leave a turn the
        # drain would wait for.
        token = gateway._join_client_trace(scope) if gateway.settings.otel else None
        gateway._flying.add(turn_ref)
        try:
            await self._answer(scope, receive, send, request, conversation, turn_ref)
        finally:
            if token is not None:
                _leave_client_trace(token)
            gateway._turn_ended(turn_ref)

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request: ChatRequest,
        conversation: str | None,
        turn_ref: str,
    ) -> None:
        gateway = self.gateway
        completion = Completion(f"chatcmpl-{secrets.token_hex(12)}", gateway.settings.model)
        outbox = _Outbox(send, completion) if request.stream else None

        result: Turn | None = None
        pieces: list[str] = []
        failure: WireError | None = None
        async with anyio.create_task_group() as group:
            # A client that hangs up cancels its turn: nothing of it is committed. So does
            # the gateway, past its drain timeout (`Gateway.cut_turns`), unless the turn's
            # answer was accepted (its background hooks are cut, `Gateway._stateless`); a
            # conversation turn is stopped in its session instead, and only if it is not
            # committed yet.
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            # The turn returned its answer, which may still be going out: a cut then would
            # end the stream mid-send. (`Gateway.turn` forgets the accepted turn as it
            # returns, so `_accepted` cannot tell.)
            answered = False

            def cut() -> None:
                if not answered and turn_ref not in gateway._accepted:
                    group.cancel_scope.cancel()

            if conversation is None:
                gateway._cuts.add(cut)
            try:
                if outbox is None:
                    result, pieces = await gateway.turn(request, conversation, None, turn_ref)
                    answered = True
                else:
                    async with anyio.create_task_group() as writing:
                        writing.start_soon(outbox.write)
                        try:
                            result, pieces = await gateway.turn(
                                request, conversation, outbox.text, turn_ref
                            )
                            answered = True
                            if outbox.opened:
                                # The ending goes out with the last text, in one write.
                                assert result.reply is not None
                                ending = completion.ending(result.reply, request.include_usage)
                                outbox.finish(b"".join([*map(sse, ending), DONE]))
                        finally:
                            outbox.close()
            except Exception as exc:
                failure = _single(exc)
            finally:
                gateway._cuts.discard(cut)
            # Answer outside the cancelled scope, or the answer itself would be cancelled.
            group.cancel_scope.cancel()
        if result is None and failure is None and gateway.cut:
            failure = _cut_short()
        started = outbox is not None and outbox.started
        if failure is not None:
            if started:
                await _frame(send, gateway.scrub_frame(failure.body()), more=False)
            else:
                await gateway.reply_error(send, failure)
            return
        if result is None:
            return  # the client went away; the turn was cancelled
        if outbox is not None and outbox.finished:
            return  # the live stream's writer sent the ending
        reply = result.reply
        assert reply is not None
        if not request.stream:
            body = json_bytes(json.dumps(completion.whole(reply), ensure_ascii=False))
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if not started:
            await _start_stream(send)
            frames = [sse(completion.first())]
            text = answer_text(reply)
            frames += [sse(completion.text(piece)) for piece in split_text(text, pieces)]
        else:
            frames = []
        frames += [sse(chunk) for chunk in completion.ending(reply, request.include_usage)]
        frames.append(DONE)
        await _frame(send, b"".join(frames), more=False)


def _shutting_down() -> WireError:
    """The answer to a turn sent while the gateway shuts down."""
    return WireError(
        503,
        "the gateway is shutting down and takes no new turns; nothing of this request was"
        f" run — send it again (after {RETRY_AFTER} s, to another gateway if there is one)",
        type="server_error",
        code="shutting_down",
        headers=_SHUTTING_DOWN,
    )


@final
class _Handoff:
    """A conversation turn's result, passed from its session's task to its request."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()  # the request cancels the turn through it
        self.done = anyio.Event()
        self.answered = False
        self._result: tuple[TurnResult, list[str]] | None = None
        self._error: Exception | None = None

    def answer(self, result: TurnResult, pieces: list[str]) -> None:
        self._result = (result, pieces)
        self.answered = True
        self.done.set()

    def fail(self, exc: Exception) -> None:
        self._error = exc

    def outcome(self) -> tuple[TurnResult, list[str]]:
        if self._error is not None:
            raise self._error
        if self._result is None:
            # The session ended without an answer or an error: the gateway, stopping past
            # its drain timeout, cancelled it.
            raise _cut_short()
        return self._result


def _cut_short() -> WireError:
    """The answer to a turn the gateway stopped at its drain timeout."""
    return WireError(
        503,
        "the gateway stopped before this turn finished; nothing of it was committed"
        " — send it again",
        type="server_error",
        code="shutting_down",
        headers=_SHUTTING_DOWN,
    )


def _single(exc: Exception) -> WireError:
    """The error to answer with, out of what a turn raised (perhaps inside a task group)."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, WireError) else failure_error(exc)


@final
class _Outbox:
    """A live stream's text frames, written to the client by a task of their own.

    The turn only queues frames (`text` never waits for the socket unless the client has
    fallen a whole buffer behind); the writer sends everything queued since its last send as
    one ASGI message. A turn whose upstream delivers many deltas per read thus costs one
    socket write per read, not one per delta.
    """

    LIMIT = 1 << 20  # queued bytes before the turn waits for the client

    def __init__(self, send: Send, completion: Completion) -> None:
        self.send = send
        self.completion = completion
        self.started = False
        self.opened = False
        self.pending: list[bytes] = []
        self.size = 0
        self.closed = False
        self.finished = False  # the ending is queued: the last write ends the body
        self.ready = anyio.Event()
        self.drained = anyio.Event()

    async def text(self, text: str) -> None:
        if not self.opened:
            self.opened = True
            self.pending.append(sse(self.completion.first()))
        frame = self.completion.text_frame(text)
        self.pending.append(frame)
        self.size += len(frame)
        self.ready.set()
        if self.size > self.LIMIT:
            await self.drained.wait()

    def finish(self, ending: bytes) -> None:
        """Queue the stream's last frames; they go out with what is still queued, as the
        body's last message."""
        self.pending.append(ending)
        self.finished = True
        self.close()

    def close(self) -> None:
        self.closed = True
        self.ready.set()

    async def write(self) -> None:
        while True:
            await self.ready.wait()
            self.ready = anyio.Event()
            if self.pending:
                last = self.finished  # then the ending is among the pending frames
                data = b"".join(self.pending)
                self.pending.clear()
                self.size = 0
                if not self.started:
                    self.started = True
                    await _start_stream(self.send)
                await _frame(self.send, data, more=not last)
                self.drained.set()
                self.drained = anyio.Event()
            if self.closed and not self.pending:
                return


async def _start_stream(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
            ],
        }
    )


async def _frame(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


def _leave_client_trace(token: Any) -> None:
    from opentelemetry import context

    context.detach(token)


def instrument_turns() -> tuple[Callable[[], None] | None, bool]:
    """Trace every turn with the global tracer provider (`pipeline.otel`), for ``turnplug
    serve --otel``: the function that stops it, and whether the provider turns go to is set
    already (one that is not yet traces nothing until it is). Turns instrumented already (a
    hook module called `pipeline.otel.instrument` itself, with its own provider or content
    capture) stay as they are: no function to stop them.

    Raises:
        ConfigError: OpenTelemetry is not installed, or its propagators do not load.
    """
    try:
        from opentelemetry import trace

        from pipeline import otel
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        raise ConfigError(
            "--otel traces turns with OpenTelemetry, which is not installed: install the"
            " extra with pip install 'turnplug[otel]' (and, to export the traces,"
            " opentelemetry-distro with an exporter, to run under opentelemetry-instrument)"
        ) from None
    client_propagator("--otel")
    stop: Callable[[], None] | None = None
    if otel.instrumented() is None:
        otel.instrument()
        stop = otel.uninstrument
    # else a hook module instrumented turns itself (a provider or content capture of its
    # own, or the global provider): kept, and its provider is the one that must be set.
    provider = otel.instrumented()
    return stop, not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def client_propagator(option: str) -> Any:
    """The propagator that reads a request's trace context: OpenTelemetry's global one
    (``OTEL_PROPAGATORS``, or one an application set), loaded now so that one that cannot
    load fails where the gateway is set up rather than on every request; `option` is what
    asked for it, as the error names it (``--otel``, ``Settings.otel``).

    Raises:
        ConfigError: OpenTelemetry is not installed, or ``OTEL_PROPAGATORS`` names a
            propagator that does not load.
    """
    try:
        # The API alone: what it cannot import is its own or its dependencies', which the
        # extra installs.
        import opentelemetry.context  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{option} reads a request's trace context with OpenTelemetry, which is not"
            f" installed ({exc}): install the extra with pip install 'turnplug[otel]'"
        ) from None
    # The propagators load with the module, and OpenTelemetry logs the traceback of one
    # that fails: the error below says it, once.
    said = logging.getLogger("opentelemetry.propagate")
    said.addFilter(_nothing)
    try:
        from opentelemetry import propagate
    except Exception as exc:  # ValueError for a propagator not installed, or its own
        raise ConfigError(
            f"{option} reads a request's trace context with the propagators OTEL_PROPAGATORS"
            f" names ({os.environ.get('OTEL_PROPAGATORS', '')!r}), which do not load:"
            f" {type(exc).__name__}: {exc} — install the package of each one, or unset"
            " OTEL_PROPAGATORS for the W3C traceparent"
        ) from None
    finally:
        said.removeFilter(_nothing)
    return propagate.get_global_textmap()


def _nothing(record: logging.LogRecord) -> bool:
    return False


UNREAD_HEADERS = frozenset((b"baggage",))
"""The headers never passed to the propagator: the client's W3C baggage, which would be
dropped anyway (`Gateway._join_client_trace`), and a malformed one of which makes
OpenTelemetry log a warning per entry."""


def flush_traces(seconds: float) -> None:
    """Send what the tracer providers still hold (a batch span processor's pending spans):
    the one turns go to (`pipeline.otel.instrumented`) and the global one (other
    instrumentations' spans), for an exit that skips the handlers registered with `atexit`,
    where the SDK's provider flushes itself; nothing when OpenTelemetry is not loaded."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return
    otel = sys.modules.get("pipeline.otel")
    providers = [otel.instrumented() if otel is not None else None, trace.get_tracer_provider()]
    flushes = []
    for provider in dict.fromkeys(p for p in providers if p is not None):
        flush = getattr(provider, "force_flush", None)
        if callable(flush):
            flushes.append(flush)
    if not flushes:
        return
    end = time.monotonic() + seconds

    def send() -> None:
        for flush in flushes:
            with contextlib.suppress(Exception):
                flush(max(0, int((end - time.monotonic()) * 1000)))

    # The SDK's batch span processor does not keep to the timeout (it exports in the
    # calling thread, after waiting for an export already running): an exporter that never
    # answers would keep the process from exiting. A daemon thread is left behind instead.
    sender = threading.Thread(target=send, name="turnplug trace flush", daemon=True)
    sender.start()
    sender.join(max(0.0, end - time.monotonic()))


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def _conversation_id(scope: Scope) -> str | None:
    """The request's X-Conversation-Id, if it has one; `WireError` if it has several.

    A proxy may add its own header to the client's: which conversation the turn joins must
    not depend on the order the two arrive in.
    """
    wanted = CONVERSATION_HEADER.encode()
    given = [value for key, value in scope["headers"] if key == wanted]
    if len(given) > 1:
        raise WireError(
            400,
            f"X-Conversation-Id is given {len(given)} times: send it once, naming one conversation",
            param="X-Conversation-Id",
            code="invalid_value",
        )
    if not given:
        return None
    # HTTP leaves a header's charset open. Clients that send non-ASCII ids (curl, Go, Node)
    # send UTF-8, which Latin-1 would read as another id ("café" as "cafÃ©"): a conversation
    # `turnplug log café` could not find. Bytes that are not UTF-8 stay Latin-1 (Python's
    # `requests` writes Latin-1), as before.
    try:
        return str(given[0].decode("utf-8"))
    except UnicodeDecodeError:
        return str(given[0].decode("latin-1"))


async def _logged_id(log: Log | None, conversation: str) -> str:
    """`conversation`, or the Latin-1 reading of its UTF-8 bytes when only that is logged.

    Gateways that read every id as Latin-1 logged a UTF-8 "café" as "cafÃ©": such a
    conversation goes on under the id it was logged with, not anew with no history.
    """
    if log is None or conversation.isascii():
        return conversation
    try:
        legacy = conversation.encode().decode("latin-1")
    except UnicodeEncodeError:  # a lone surrogate: never a Latin-1 reading
        return conversation
    if len(legacy.encode()) > MAX_ID_BYTES:  # longer than a log could have stored
        return conversation
    try:
        if (await log.load(conversation)).messages or not (await log.load(legacy)).messages:
            return conversation
    except Exception:  # the turn's own load reports a failing log, as for any id
        return conversation
    return legacy


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope["headers"]:
        if key == wanted:
            return str(value.decode("latin-1"))
    return None


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body; 413 as soon as it is known to exceed `limit`, without reading on."""
    declared = _header(scope, "content-length")
    too_big = WireError(
        413,
        f"the request body exceeds the gateway's limit of {limit} bytes — send less"
        " conversation (or start the gateway with a larger --max-body)",
        code="request_too_large",
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise WireError(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _with_calls(reply: Reply, calls: list[ToolCall], judged: list[ToolCall]) -> Reply:
    """`reply` with its tool calls as the before-tool hooks rewrote them."""
    swap = {id(old): new for old, new in zip(calls, judged, strict=True)}
    message = reply.message
    message = attrs.evolve(message, parts=tuple(swap.get(id(p), p) for p in message.parts))
    messages = tuple(message if m is reply.message else m for m in reply.messages)
    return attrs.evolve(reply, message=message, messages=messages)
