"""OpenTelemetry tracing: every turn becomes one trace (extra ``turnplug[otel]``).

``pipeline.otel.instrument()`` instruments every pipeline in the process; `uninstrument`
undoes it. Each turn is a ``turn`` span — a child of the caller's current span when there is
one — holding a span per hook, a span per parallel group and per chain around their
members, a ``chat {model}`` span per model call and an ``execute_tool {name}`` span per tool
call, following the OpenTelemetry GenAI semantic conventions where they apply. Halts,
blocks, rejections, injections and the commit are span events. docs/observability.md lists
every span, attribute and event.

The trace is built from the turn's events (`pipeline.events`), with the times they carry:
nothing here runs inside a hook's call, and nothing depends on the event loop. Content —
reply text, injected text, tool arguments and results — is recorded only with
``capture_content=True`` (or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``), and
then only as the log could hold it: text after the stream transformers, tool results after
the after-tool hooks, nothing of a blocked call but what the blocking hook said.
"""

import asyncio
import json
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextvars import Token
from typing import Any, final

import attrs
import trio

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
except ImportError as exc:
    # The extra's package is missing: say which install brings it, not only its module.
    raise ModuleNotFoundError(
        f"pipeline.otel needs opentelemetry-api, which is not installed ({exc}) —"
        " pip install 'turnplug[otel]'",
        name=exc.name,
    ) from exc

from turns import Message, Part, Reply, Text, ToolCall, ToolResult, Turn

from . import events as ev
from ._errors import ConfigError, ProviderError, ProviderProtocolError
from ._hooks import Chain, Hook, Parallel
from ._observe import TOOL_CALL, set_tracing, tracing
from ._plan import Plan
from ._toolloop import TOOL_HOOKS
from ._tools import HOOK_BLOCKED

__all__ = ["CAPTURE_CONTENT_ENV", "instrument", "instrumented", "uninstrument"]

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The environment variable that turns content capture on (``true``) when `instrument` is
not told either way."""

_TOOL_STAGES = frozenset(("before_tool", "after_tool"))

# The runtime's verdicts as the trace reports them: a parallel member's contribution is a
# `cont`, a session hook's return an `ok`.
_VERDICTS = {"parts": "cont", "skipped": "skip", "failed": "fail"}


def instrument(
    *, tracer_provider: TracerProvider | None = None, capture_content: bool | None = None
) -> None:
    """Trace every turn of every pipeline in this process.

    Args:
        tracer_provider: Where spans go; None uses the global one
            (``opentelemetry.trace.set_tracer_provider``), even one set later.
        capture_content: Record reply text, injected text, tool arguments and results;
            None reads ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true`` turns
            it on). Off, no message text, tool argument or tool result is in any span.

    Calling it again replaces the previous instrumentation.
    """
    if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
        raise ConfigError(
            f"instrument(tracer_provider=...) needs an OpenTelemetry TracerProvider (e.g."
            f" opentelemetry.sdk.trace.TracerProvider()), got {type(tracer_provider).__name__}"
            f" {tracer_provider!r}; pass None to use the global one"
        )
    if capture_content is None:
        capture_content = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    elif type(capture_content) is not bool:
        raise ConfigError(
            f"instrument(capture_content=...) must be True, False or None (read"
            f" {CAPTURE_CONTENT_ENV}), got {capture_content!r}"
        )
    tracer = trace.get_tracer("turnplug", tracer_provider=tracer_provider)
    capture = capture_content

    def start(plan: Plan) -> "_TurnTrace | None":
        # Runs where the turn is set up, in the caller's context: its current span (if
        # any) becomes the turn's parent.
        span = tracer.start_span("turn", otel_context.get_current(), attributes=_TURN_ATTRIBUTES)
        if not span.is_recording():
            # A no-op provider, or a sampler that dropped the trace: the turn runs as if
            # nobody watched (run() builds no events).
            return None
        return _TurnTrace(tracer, span, _table(plan), capture)

    set_tracing(start)
    _given[:] = [tracer_provider]


def uninstrument() -> None:
    """Stop tracing turns (turns already running finish their traces)."""
    set_tracing(None)
    _given.clear()


def instrumented() -> TracerProvider | None:
    """The tracer provider turns go to, when `instrument` was called and `uninstrument` not
    since; None otherwise.

    It is the one `instrument` was given, or else the global one as it is now: a
    ``ProxyTracerProvider`` while none is set (or a ``NoOpTracerProvider``) traces nothing.
    For code that instruments on someone's behalf (``turnplug serve --otel``): it must not
    replace what the application set up itself (its own provider, content capture), and it
    flushes this provider where it exits without the provider's own flush at exit.
    """
    if tracing() is None or not _given:
        return None
    return _given[0] if _given[0] is not None else trace.get_tracer_provider()


_given: list[TracerProvider | None] = []
"""What the `instrument` in force was given as its tracer provider (none: the global one)."""


_TURN_ATTRIBUTES = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "turnplug"}


# -- what the trace knows of a pipeline's hooks ------------------------------------------------


@final
@attrs.frozen
class _HookInfo:
    """A hook as the trace describes it: its options, and the groups and chains around it."""

    durable: bool
    shadow: bool
    background: bool
    path: tuple[tuple[str, str], ...]  # ("parallel" | "chain", name), outermost first


_Table = dict[tuple[str, str], _HookInfo]
_tables: dict[int, _Table] = {}


def _table(plan: Plan) -> _Table:
    """The hooks of a pipeline's plan by (stage, name), as the drive names them; built once."""
    table = _tables.get(id(plan))
    if table is None:
        table = {}
        for stage, entries in plan.declared:
            _walk(entries, stage, "", (), table)
        compact = plan.compact
        if compact is not None:
            table[("compact", compact.name)] = _HookInfo(False, False, False, ())
        _tables[id(plan)] = table
        weakref.finalize(plan, _tables.pop, id(plan), None)
    return table


def _walk(
    entries: Iterable[Hook | Parallel | Chain],
    stage: str,
    prefix: str,
    path: tuple[tuple[str, str], ...],
    table: _Table,
) -> None:
    # The names follow the pipeline's compilation: chain members are prefixed with the
    # chain's name and a dot; a group's members with the prefix of the chain around it.
    for entry in entries:
        if isinstance(entry, Hook):
            info = _HookInfo(entry.durable, entry.shadow, entry.background, path)
            table.setdefault((stage, prefix + entry.name), info)
        elif isinstance(entry, Parallel):
            inner = (*path, ("parallel", prefix + entry.name))
            for member in entry.members:
                info = _HookInfo(member.durable, member.shadow, False, inner)
                table.setdefault((stage, prefix + member.name), info)
        else:
            name = prefix + entry.name
            _walk(entry.members, stage, name + ".", (*path, ("chain", name)), table)


# -- one turn's trace ---------------------------------------------------------------------------


class _Box:
    """An open parallel-group or chain span, ended at its last member's end."""

    __slots__ = ("context", "key", "last", "span")

    def __init__(self, key: tuple[str, str], span: Span, start: int) -> None:
        self.key = key
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.last = start


class _TurnTrace:
    """Builds one turn's spans from its events."""

    def __init__(self, tracer: Tracer, turn: Span, table: _Table, capture: bool) -> None:
        self.tracer = tracer
        self.turn = turn
        self.turn_context = trace.set_span_in_context(turn)
        self.table = table
        self.capture = capture
        self.wall = time.time_ns()
        self.hooks: dict[tuple[str, str, str | None], list[tuple[Span, _HookInfo | None]]] = {}
        self.shadows: dict[tuple[str, str, str | None], Span] = {}
        self.boxes: dict[str | None, list[_Box]] = {}
        self.chat: Span | None = None
        self.tools: dict[str, Span] = {}
        # The context tokens of the tool spans made current in their calls' tasks.
        self.current: dict[str, Token[otel_context.Context]] = {}
        self.names: dict[str, str] = {}
        self.blocked: set[str] = set()
        self.executed: set[str] = set()
        # Content waits for the turn's end: a later hook may remove what an injection or a
        # model call held (`settled`), and content capture never records a removed value.
        self.final: tuple[Turn, Reply | None] | None = None
        # The turn span's events, in order, added when it ends: an injection's with its
        # content if that survived.
        self.turn_events: list[tuple[str, dict[str, Any], int] | ev.Injected] = []
        self.chats: list[tuple[Span, str, str | None, int]] = []
        # Finished tool calls, ended when the turn ends too: (span, call id, the arguments
        # it ran with, its result — None when blocked, end).
        self.calls: list[tuple[Span, str, dict[str, Any] | None, str | None, int]] = []
        self.arguments: dict[str, dict[str, Any]] = {}
        self.done = False
        self.handlers: dict[type, Callable[[Any], None]] = {
            ev.TurnStarted: self.started,
            ev.HookStarted: self.hook_started,
            ev.HookFinished: self.hook_finished,
            ev.HookFailed: self.hook_failed,
            ev.HookSkipped: self.hook_skipped,
            ev.ShadowVerdict: self.shadow_verdict,
            ev.Injected: self.injected,
            ev.Halted: self.halted,
            ev.ModelCalled: self.model_called,
            ev.ModelFinished: self.model_finished,
            ev.ToolCallRequested: self.tool_requested,
            ev.ToolStarted: self.tool_started,
            ev.ToolBlocked: self.tool_blocked,
            ev.ToolFinished: self.tool_finished,
            ev.AttemptRejected: self.rejected,
            ev.Committed: self.committed,
            ev.TurnFinished: self.finished,
        }
        self.text: list[str] = []
        if capture:
            self.handlers[ev.TextDelta] = self.text_delta

    def ns(self, at: float) -> int:
        return self.wall + int(at * 1e9)

    # -- the seam -------------------------------------------------------------------------------

    def event(self, event: ev.Event) -> None:
        handler = self.handlers.get(type(event))
        if handler is not None and not self.done:
            handler(event)

    def ended(self, error: BaseException, at: float) -> None:
        """The turn raised or was cancelled: end every span it left open."""
        if self.done:
            return
        end = self.ns(at)
        failure = _own(error)
        if self.chat is not None:
            if isinstance(failure, ProviderError):
                self.fail(self.chat, failure)
            self.chat.end(end)
            self.chat = None
        # Nothing of a failed turn is committed: no content of it is recorded.
        self.final = None
        self.flush_content()
        self.close_all(end)
        if failure is None:
            self.turn.set_attribute("turnplug.turn.outcome", "cancelled")
        else:
            self.turn.set_attribute("turnplug.turn.outcome", "failed")
            self.fail(self.turn, failure)
        self.turn.end(end)
        self.done = True

    def fail(self, span: Span, error: BaseException) -> None:
        kind = type(error).__name__
        span.set_attribute("error.type", kind)
        attributes: dict[str, str] = {"exception.type": kind}
        # A malformed stream's error quotes the provider's raw event, model text no
        # transformer has seen: it is recorded by its type only, even with capture on.
        said = self.capture and not isinstance(error, ProviderProtocolError)
        if said:
            attributes["exception.message"] = str(error)
        span.add_event("exception", attributes)
        span.set_status(Status(StatusCode.ERROR, str(error) if said else kind))

    def close_all(self, end: int) -> None:
        for spans in self.hooks.values():
            for span, _ in spans:
                span.end(end)
        self.hooks.clear()
        for span in self.shadows.values():
            span.end(end)
        self.shadows.clear()
        for scope in list(self.boxes):
            self.close_boxes(scope, 0)
        for span in self.tools.values():
            span.end(end)
        self.tools.clear()

    # -- groups and chains ------------------------------------------------------------------------

    def parent(self, scope: str | None, path: tuple[tuple[str, str], ...], start: int) -> Any:
        """The context a hook's span starts in: inside the groups and chains around it."""
        boxes = self.boxes.setdefault(scope, [])
        keep = 0
        while keep < len(boxes) and keep < len(path) and boxes[keep].key == path[keep]:
            keep += 1
        self.close_boxes(scope, keep)
        if boxes:
            context = boxes[-1].context
        elif scope is None:
            context = self.turn_context
        else:
            context = trace.set_span_in_context(self.tool_span(scope, start))
        for kind, name in path[keep:]:
            span = self.tracer.start_span(
                name, context, start_time=start, attributes={"turnplug.hook.kind": kind}
            )
            box = _Box((kind, name), span, start)
            boxes.append(box)
            context = box.context
        return context

    def close_boxes(self, scope: str | None, keep: int) -> None:
        boxes = self.boxes.get(scope)
        while boxes and len(boxes) > keep:
            box = boxes.pop()
            box.span.end(box.last)
            if boxes:
                boxes[-1].last = max(boxes[-1].last, box.last)

    def ended_at(self, scope: str | None, end: int) -> None:
        for box in self.boxes.get(scope, ()):
            box.last = max(box.last, end)

    # -- the turn ---------------------------------------------------------------------------------

    def started(self, event: ev.TurnStarted) -> None:
        self.wall = time.time_ns() - int(event.at * 1e9)
        self.turn.set_attribute("turnplug.turn_ref", event.turn_ref)

    def finished(self, event: ev.TurnFinished) -> None:
        end = self.ns(event.at)
        self.close_all(end)
        self.turn.set_attribute("turnplug.turn.outcome", event.outcome)
        if event.outcome != "completed" and self.final is not None:
            # A halted or exhausted turn commits no reply: its injections only.
            self.final = (self.final[0], None)
        self.flush_content()
        reply = self.final[1] if self.final is not None else None
        if self.capture and event.outcome == "completed" and reply is not None:
            # The accepted reply as the log holds it: after the post hooks.
            self.turn.set_attribute(
                "gen_ai.output.messages", _messages_json((reply.message,), reply.finish_reason)
            )
        self.turn.end(end)
        self.done = True

    def settled(self, turn: Turn, reply: Reply | None) -> None:
        """The turn as it ends (before its `TurnFinished`): what content capture may record."""
        self.final = (turn, reply)

    def flush_content(self) -> None:
        """Record the injections and end the chat and tool spans, with the content that
        survived.

        An injection's content is recorded when the final turn still holds it; a model
        call's text when the accepted reply holds it as the call gave it (not a rejected
        attempt's, not one a post hook rewrote); a tool call's arguments and result when
        the accepted reply holds them (not a rejected attempt's calls, not a result a post
        hook rewrote).
        """
        final = self.final
        # Compared by equality (parts carry mappings, so they do not hash).
        kept: list[tuple[str | None, tuple[Part, ...]]] = []
        said: set[str] = set()
        held_arguments: dict[str, list[dict[str, Any]]] = {}
        held_results: dict[str, str] = {}
        if self.capture and final is not None:
            turn, reply = final
            kept = [(injection.source, injection.parts) for injection in turn.injections]
            if reply is not None:
                said = {m.text for m in reply.messages if m.role == "assistant"}
                held_arguments, held_results = _held_calls(reply)
        for item in self.turn_events:
            if type(item) is not ev.Injected:
                self.turn.add_event(*item)
                continue
            attributes: dict[str, Any] = {
                "turnplug.hook.name": item.hook,
                "turnplug.injection.durable": item.durable,
                "turnplug.injection.tokens": item.tokens,
                "turnplug.injection.stage": item.stage,
            }
            if (item.hook, item.parts) in kept:
                attributes["turnplug.injection.content"] = _parts_json(item.parts)
            self.turn.add_event("turnplug.injection", attributes, self.ns(item.at))
        self.turn_events.clear()
        for span, text, finish_reason, end in self.chats:
            if text and text in said:
                message = Message.assistant(text)
                span.set_attribute(
                    "gen_ai.output.messages", _messages_json((message,), finish_reason)
                )
            span.end(end)
        self.chats.clear()
        for span, call_id, arguments, result, end in self.calls:
            if arguments is not None and arguments in held_arguments.get(call_id, ()):
                span.set_attribute("gen_ai.tool.call.arguments", _json(arguments))
            if result is not None and held_results.get(call_id) == result:
                span.set_attribute("gen_ai.tool.call.result", result)
            span.end(end)
        self.calls.clear()

    def halted(self, event: ev.Halted) -> None:
        self.turn.set_attribute("turnplug.halt.hook", event.hook)
        self.turn_events.append(
            (
                "turnplug.halt",
                {"turnplug.hook.name": event.hook, "turnplug.halt.reason": event.reason},
                self.ns(event.at),
            )
        )

    def rejected(self, event: ev.AttemptRejected) -> None:
        self.turn_events.append(
            (
                "turnplug.rejection",
                {
                    "turnplug.attempt": event.attempt,
                    "turnplug.hook.name": event.hook,
                    "turnplug.rejection.feedback": event.feedback,
                },
                self.ns(event.at),
            )
        )

    def injected(self, event: ev.Injected) -> None:
        # Recorded when the turn ends (`flush_content`), with its content if it survived.
        self.turn_events.append(event)

    def committed(self, event: ev.Committed) -> None:
        self.turn.set_attribute("gen_ai.conversation.id", event.conversation_id)
        self.turn_events.append(
            (
                "turnplug.commit",
                {
                    "gen_ai.conversation.id": event.conversation_id,
                    "turnplug.commit.messages": len(event.messages),
                },
                self.ns(event.at),
            )
        )

    # -- hooks --------------------------------------------------------------------------------------

    def hook_started(self, event: ev.HookStarted) -> None:
        self.open_hook(event.hook, event.stage, self.ns(event.at))

    def open_hook(self, name: str, stage: str, start: int) -> tuple[Span, _HookInfo | None]:
        call = TOOL_CALL.get() if stage in _TOOL_STAGES else None
        info = self.table.get((stage, name))
        context = self.parent(call, info.path if info is not None else (), start)
        attributes: dict[str, Any] = {"turnplug.hook.name": name, "turnplug.hook.stage": stage}
        if info is not None:
            attributes["turnplug.hook.durable"] = info.durable
            attributes["turnplug.hook.shadow"] = info.shadow
            if info.background:
                attributes["turnplug.hook.background"] = True
        if call is not None:
            attributes["gen_ai.tool.call.id"] = call
        span = self.tracer.start_span(name, context, start_time=start, attributes=attributes)
        entry = (span, info)
        self.hooks.setdefault((name, stage, call), []).append(entry)
        return entry

    def close_hook(self, name: str, stage: str, at: float) -> tuple[Span, _HookInfo | None, int]:
        call = TOOL_CALL.get() if stage in _TOOL_STAGES else None
        end = self.ns(at)
        spans = self.hooks.get((name, stage, call))
        if spans:
            span, info = spans.pop()
        else:
            # A failure with no start (a stream transformer): a span of its own, no length.
            span, info = self.open_hook(name, stage, end)
            self.hooks[(name, stage, call)].pop()
        self.ended_at(call, end)
        return span, info, end

    def hook_finished(self, event: ev.HookFinished) -> None:
        span, info, end = self.close_hook(event.hook, event.stage, event.at)
        span.set_attribute("turnplug.hook.verdict", _VERDICTS.get(event.verdict, event.verdict))
        if info is not None and info.shadow:
            # Its ShadowVerdict follows at once with the reason.
            call = TOOL_CALL.get() if event.stage in _TOOL_STAGES else None
            self.shadows[(event.hook, event.stage, call)] = span
            return
        span.end(end)

    def shadow_verdict(self, event: ev.ShadowVerdict) -> None:
        call = TOOL_CALL.get() if event.stage in _TOOL_STAGES else None
        span = self.shadows.pop((event.hook, event.stage, call), None)
        if span is None:
            return
        if event.reason is not None:
            span.set_attribute("turnplug.hook.reason", event.reason)
        span.end(self.ns(event.at))

    def hook_failed(self, event: ev.HookFailed) -> None:
        span, _, end = self.close_hook(event.hook, event.stage, event.at)
        span.set_attribute("turnplug.hook.verdict", "fail")
        span.set_attribute("turnplug.hook.enforced", event.enforced)
        kind = event.error.partition(":")[0] or "Exception"
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, event.error if self.capture else kind))
        span.end(end)

    def hook_skipped(self, event: ev.HookSkipped) -> None:
        span, _, end = self.close_hook(event.hook, event.stage, event.at)
        span.set_attribute("turnplug.hook.verdict", "skip")
        span.end(end)

    # -- model calls ----------------------------------------------------------------------------

    def model_called(self, event: ev.ModelCalled) -> None:
        self.close_boxes(None, 0)
        model = event.model or "model"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "turnplug.attempt": event.attempt,
            "turnplug.step": event.step,
        }
        if event.provider is not None:
            attributes["gen_ai.provider.name"] = event.provider
            attributes["gen_ai.system"] = event.provider
        options = event.options
        if options is not None:
            if options.temperature is not None:
                attributes["gen_ai.request.temperature"] = options.temperature
            if options.max_tokens is not None:
                attributes["gen_ai.request.max_tokens"] = options.max_tokens
            if isinstance(options.tool_choice, str):
                attributes["turnplug.request.tool_choice"] = options.tool_choice
            if options.active_tools is not None:
                attributes["turnplug.request.active_tools"] = list(options.active_tools)
        self.chat = self.tracer.start_span(
            f"chat {model}",
            self.turn_context,
            kind=trace.SpanKind.CLIENT,
            start_time=self.ns(event.at),
            attributes=attributes,
        )

    def model_finished(self, event: ev.ModelFinished) -> None:
        span = self.chat
        if span is None:
            return
        self.chat = None
        if event.finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [event.finish_reason])
        span.set_attribute("gen_ai.usage.input_tokens", event.usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", event.usage.output_tokens)
        # Ended (at this instant) when the turn ends, with its text if the log holds it.
        self.chats.append((span, "".join(self.text), event.finish_reason, self.ns(event.at)))
        self.text.clear()

    def text_delta(self, event: ev.TextDelta) -> None:
        # Only with content capture; text held back until its attempt is accepted
        # (hold_until_accepted) comes after its call ended and is not on the chat span.
        if self.chat is not None:
            self.text.append(event.text)

    # -- tool calls -----------------------------------------------------------------------------

    def tool_requested(self, event: ev.ToolCallRequested) -> None:
        self.close_boxes(None, 0)
        self.names[event.call.id] = event.call.name

    def tool_span(self, call_id: str, start: int) -> Span:
        span = self.tools.get(call_id)
        if span is None:
            name = self.names.get(call_id, "tool")
            span = self.tracer.start_span(
                f"execute_tool {name}",
                self.turn_context,
                start_time=start,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": call_id,
                    "gen_ai.tool.type": "function",
                },
            )
            self.tools[call_id] = span
        return span

    def tool_started(self, event: ev.ToolStarted) -> None:
        span = self.tool_span(event.call.id, self.ns(event.at))
        self.close_boxes(event.call.id, 0)
        span.set_attribute("turnplug.tool.executed", True)
        self.executed.add(event.call.id)
        if self.capture:
            # Recorded when the turn ends, if its accepted reply holds the call.
            self.arguments[event.call.id] = dict(event.call.arguments)
        # The call's own task emits its ToolStarted just before it runs the tool, and its
        # ToolFinished after the after-tool hooks: the span is the current one in between,
        # so the spans the tool opens (its own, an instrumented client's) are its children,
        # in a sync tool's worker thread too (the thread runs in a copy of the task's
        # context). A call that raises instead ends its task, and the context with it.
        self.current[event.call.id] = otel_context.attach(trace.set_span_in_context(span))

    def tool_blocked(self, event: ev.ToolBlocked) -> None:
        at = self.ns(event.at)
        span = self.tool_span(event.call.id, at)
        self.blocked.add(event.call.id)
        self.executed.discard(event.call.id)
        span.set_attribute("turnplug.tool.executed", False)
        span.set_attribute("turnplug.tool.blocked_by", event.hook)
        span.set_attribute("turnplug.tool.block_reason", event.reason)
        span.add_event(
            "turnplug.block",
            {"turnplug.hook.name": event.hook, "turnplug.block.reason": event.reason},
            at,
        )

    def tool_finished(self, event: ev.ToolFinished) -> None:
        call_id = event.call.id
        end = self.ns(event.at)
        span = self.tool_span(call_id, end)
        self.close_boxes(call_id, 0)
        result = event.result
        if result.is_error and result.error_class != HOOK_BLOCKED:
            span.set_attribute("error.type", result.error_class or "tool_error")
            span.set_status(Status(StatusCode.ERROR, result.error_class or "tool_error"))
        if call_id not in self.executed:
            # Finished without starting: invalid arguments, an unknown tool.
            span.set_attribute("turnplug.tool.executed", False)
        del self.tools[call_id]
        token = self.current.pop(call_id, None)
        if token is not None:
            otel_context.detach(token)
        # Ended (at this instant) when the turn ends, with the content the log holds.
        content = None if call_id in self.blocked else result.content
        self.calls.append((span, call_id, self.arguments.pop(call_id, None), content, end))


# What a cancelled turn raises, on either event loop.
_CANCELLED = (trio.Cancelled, asyncio.CancelledError)


def _own(error: BaseException) -> BaseException | None:
    """The failure a turn raised, out of any exception group; None for a cancellation."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _own(inner)
            if found is not None:
                return found
        return None
    if isinstance(error, _CANCELLED):
        return None
    return error


def _held_calls(reply: Reply) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """The tool calls the accepted reply holds: by call id, the arguments it holds for the
    call (the model's, and those a before-tool hook rewrote them to) and the result."""
    arguments: dict[str, list[dict[str, Any]]] = {}
    results: dict[str, str] = {}
    for message in reply.messages:
        for part in message.parts:
            if isinstance(part, ToolCall):
                arguments.setdefault(part.id, []).append(dict(part.arguments))
            elif isinstance(part, ToolResult):
                results[part.call_id] = part.content
                hooks = part.meta.get(TOOL_HOOKS)
                if isinstance(hooks, dict) and isinstance(hooks.get("arguments"), dict):
                    arguments.setdefault(part.call_id, []).append(hooks["arguments"])
    return arguments, results


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def _part(part: Part) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "text", "content": part.text}
    if isinstance(part, ToolCall):
        return {
            "type": "tool_call",
            "id": part.id,
            "name": part.name,
            "arguments": dict(part.arguments),
        }
    assert isinstance(part, ToolResult)
    return {"type": "tool_call_response", "id": part.call_id, "response": part.content}


def _parts_json(parts: Sequence[Part]) -> str:
    return _json([_part(part) for part in parts])


def _messages_json(messages: Sequence[Message], finish_reason: str | None) -> str:
    return _json(
        [
            {
                "role": message.role,
                "parts": [_part(part) for part in message.parts],
                **({"finish_reason": finish_reason} if finish_reason else {}),
            }
            for message in messages
        ]
    )
