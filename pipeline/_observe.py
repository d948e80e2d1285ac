"""The one seam where a turn is watched: the time on its events, its debug log, its trace.

A `Drive` asks `watch_turn` for a `Watch` when it is built — in the caller's context, so a
tracer takes the caller's current span as the turn's parent there and then, with no context
variable having to cross into the task that drives the turn. Every event of the turn is
emitted through `Watch.emit`, which stamps the event's `at`, hands it to the tracer (when
`pipeline.otel` is instrumented) and to the debug log (when ``turnplug.pipeline`` is enabled
for DEBUG), then to the listener. With nobody listening, no tracer and DEBUG off there is no
watch, and `Pipeline.run` builds no event at all.

This module imports no OpenTelemetry: `pipeline.otel` plugs a tracer in through
`set_tracing`.
"""

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from . import events as ev

if TYPE_CHECKING:
    from turns import Reply, Turn

    from ._plan import Plan
    from ._runner import Runner

log = logging.getLogger("turnplug.pipeline")

# A library's loggers stay silent until the application configures logging: without this,
# Python's last-resort handler would print turnplug's warnings to stderr.
logging.getLogger("turnplug").addHandler(logging.NullHandler())

TOOL_CALL: ContextVar[str | None] = ContextVar("turnplug_tool_call", default=None)
"""The id of the tool call whose hooks the current task runs.

Each tool call of a batch is handled in a task of its own, which sets this first: a tracer
reads it, in that same task, to tell which call a tool hook's events belong to."""


class TurnTracer(Protocol):
    """What `pipeline.otel` plugs in: it is told every event of one turn, and how it ended."""

    def event(self, event: ev.Event) -> None: ...

    def settled(self, turn: "Turn", reply: "Reply | None") -> None: ...

    def ended(self, error: BaseException, at: float) -> None: ...


TracerFactory = Callable[["Plan"], TurnTracer | None]

_tracing: list[TracerFactory] = []


def set_tracing(factory: TracerFactory | None) -> None:
    """Install (or, with None, remove) the factory that gives each new turn its tracer."""
    _tracing.clear()
    if factory is not None:
        _tracing.append(factory)


def tracing() -> TracerFactory | None:
    """The factory `set_tracing` installed, if any."""
    return _tracing[0] if _tracing else None


_set_at = ev.Event.at.__set__  # type: ignore[attr-defined]


class Watch:
    """One turn's watch: `emit` stamps and dispatches each event; `failed` ends the trace.

    The first event (the turn's `TurnStarted`) fixes the turn's start on the turn's clock
    and hands the runner two emitters: ``relay[0]``, which dispatches an event already
    stamped, and ``emit``, which stamps it with one clock read and then relays it. With a
    listener and nothing else, ``relay[0]`` is the listener itself (or what it put in its own
    relay), so an event the drive stamps from a clock read it takes anyway (a hook's start
    and end) costs no more than it would unwatched.
    """

    __slots__ = ("debug", "own_relay", "runner", "sink", "start", "tracer")

    def __init__(
        self,
        runner: "Runner",
        sink: Callable[[ev.Event], None] | None,
        tracer: TurnTracer | None,
        debug: bool,
        own_relay: list[Callable[[ev.Event], None]] | None = None,
    ) -> None:
        self.runner = runner
        self.sink = sink
        self.own_relay = own_relay
        self.tracer = tracer
        self.debug = debug
        self.start: float | None = None

    def emit(self, event: ev.Event) -> None:
        """Emit the turn's first event, then hand the runner its emitters for the rest."""
        runner = self.runner
        now = runner.now
        start = self.start = runner.start = now()
        relay = runner.relay = self._relay()

        def emit(event: ev.Event) -> None:
            _set_at(event, now() - start)
            relay[0](event)

        runner.emit = emit
        # The first event is at 0.0 exactly: the turn starts with it.
        _set_at(event, 0.0)
        relay[0](event)

    def _relay(self) -> list[Callable[[ev.Event], None]]:
        """What dispatches a stamped event (to the tracer, the debug log, the listener), in
        the one-item list the runner reads it from for every event."""
        sink, tracer, debug = self.sink, self.tracer, self.debug
        if tracer is None and not debug and sink is not None:
            # The common case: a listener, nothing else. A streamed turn's listener has a
            # relay of its own, which it keeps pointing at the cheapest way in (`TurnEvents`).
            return self.own_relay if self.own_relay is not None else [sink]

        def dispatch(event: ev.Event) -> None:
            nonlocal tracer
            if tracer is not None:
                try:
                    tracer.event(event)
                except Exception as error:
                    tracer = None
                    self.drop_tracer(error)
            if debug and type(event) is not ev.TextDelta:
                log.debug("turn %s: %s", event.turn_ref, _brief(event))
            if sink is not None:
                sink(event)

        return [dispatch]

    def settled(self, turn: "Turn", reply: "Reply | None") -> None:
        """The turn as it ends, before its `TurnFinished`: the final turn and the reply it
        commits, which bound what the tracer may record of its content."""
        if self.tracer is not None:
            try:
                self.tracer.settled(turn, reply)
            except Exception as failure:
                self.drop_tracer(failure)

    def failed(self, error: BaseException) -> None:
        """The turn raised (or was cancelled) instead of finishing: end its trace."""
        start = self.start
        at = 0.0 if start is None else self.runner.now() - start
        if log.isEnabledFor(logging.DEBUG):
            log.debug("turn %s: ended by %s", self.runner.turn_ref, type(error).__name__)
        if self.tracer is not None:
            try:
                self.tracer.ended(error, at)
            except Exception as failure:
                # Never in place of the turn's own error.
                self.drop_tracer(failure)

    def drop_tracer(self, error: Exception) -> None:
        """The tracer raised (a span processor or exporter failed): the turn goes on, and
        ends as it would have, untraced from here on."""
        self.tracer = None
        _tracer_failed(self.runner.turn_ref, error)


def watch_turn(
    runner: "Runner",
    sink: Callable[[ev.Event], None] | None,
    own_relay: list[Callable[[ev.Event], None]] | None = None,
) -> Watch | None:
    """The watch of a turn about to be driven, or None when nothing needs its events.

    Called where the turn is set up, in the caller's context (see the module docstring).
    """
    tracer = None
    if _tracing:
        try:
            tracer = _tracing[0](runner.plan)
        except Exception as error:
            _tracer_failed(None, error)
    debug = log.isEnabledFor(logging.DEBUG)
    if sink is None and tracer is None and not debug:
        return None
    return Watch(runner, sink, tracer, debug, own_relay)


def _tracer_failed(turn_ref: str | None, error: Exception) -> None:
    # Tracing watches a turn; a failure of its own must not fail the turn it watches.
    log.warning(
        "turn %s: the tracer failed (%s: %s); the turn goes on untraced",
        turn_ref or "(not started)",
        type(error).__name__,
        error,
        exc_info=error,
    )


def _brief(event: ev.Event) -> str:
    """An event for the debug log: its kind and what names it, never any content."""
    fields = []
    for name in ("hook", "stage", "verdict", "attempt", "step", "outcome", "model"):
        value = getattr(event, name, None)
        if value is not None:
            fields.append(f"{name}={value}")
    call = getattr(event, "call", None)
    if call is not None:
        fields.append(f"tool={call.name} call_id={call.id}")
    fields.append(f"at={event.at * 1e3:.1f}ms")
    return " ".join((type(event).__name__, *fields))
