"""Events: how a UI, a log or a tracer watches a turn.

Every event is a frozen record carrying the `turn_ref` of its turn and `at`, the seconds since
its turn started. They are produced only when someone listens (`Pipeline.stream`, or a tracer
installed by `pipeline.otel.instrument`); `Pipeline.run` otherwise builds none.
`timeline(events)` renders a list of them as the readable timeline ``turnplug demo`` prints.
"""

import re
from collections.abc import Iterable
from typing import Literal, TypeAlias, final

import attrs

from turns import Message, Part, Reply, RequestOptions, Text, ToolCall, ToolResult, Usage

__all__ = [
    "AttemptRejected",
    "Committed",
    "Event",
    "Halted",
    "HookFailed",
    "HookFinished",
    "HookSkipped",
    "HookStarted",
    "Injected",
    "ModelCalled",
    "ModelFinished",
    "Outcome",
    "ReplyReady",
    "ShadowVerdict",
    "TextDelta",
    "ToolBlocked",
    "ToolCallRequested",
    "ToolFinished",
    "ToolStarted",
    "ToolStepFinished",
    "TurnFinished",
    "TurnStarted",
    "timeline",
]

Outcome: TypeAlias = Literal["completed", "halted", "exhausted"]


@attrs.frozen
class Event:
    """Base of every event.

    Attributes:
        turn_ref: The turn it belongs to.
        at: Seconds since the turn started, by the turn's clock (trio's, so virtual time in
            tests), set when the event is emitted. A background hook's events in a session
            (``session.events``) carry the seconds since their turn started, on the loop's
            clock; the session hooks' events, outside any turn, carry 0.0. Not part of an
            event's equality: two runs of the same turn emit equal events.
    """

    turn_ref: str
    at: float = attrs.field(default=0.0, kw_only=True, eq=False, repr=False)


@final
@attrs.frozen
class TurnStarted(Event):
    """The turn entered the pipeline."""


@final
@attrs.frozen
class HookStarted(Event):
    """A hook started.

    Attributes:
        hook: Its name (chain members carry the chain's name as a prefix).
        stage: ``"pre"``, ``"post"``, ...
    """

    hook: str
    stage: str


@final
@attrs.frozen
class HookFinished(Event):
    """A hook returned.

    Attributes:
        hook: Its name.
        stage: Its stage.
        elapsed: Seconds it took (the event loop's clock).
        verdict: ``"cont"``, ``"halt"``, ``"parts"`` (a parallel member's contribution), ...
    """

    hook: str
    stage: str
    elapsed: float
    verdict: str


@final
@attrs.frozen
class HookFailed(Event):
    """A hook raised or timed out (or was cut short, see `enforced`).

    Attributes:
        hook: Its name.
        stage: Its stage.
        error: The failure, as ``"Type: message"``.
        enforced: True when the failure stops the turn, and always for a hook that raised
            KeyboardInterrupt or SystemExit (raised to the caller whatever its
            ``on_error``, a background hook's too); False when the hook fails open
            (``on_error="skip"``), is a shadow hook, or is a background hook (one cut
            short too, when a sibling's interrupt or a session's end cancelled it).
    """

    hook: str
    stage: str
    error: str
    enforced: bool


@final
@attrs.frozen
class HookSkipped(Event):
    """A hook did not run because its ``when`` predicate was false."""

    hook: str
    stage: str


@final
@attrs.frozen
class Injected(Event):
    """A hook added content to the turn.

    Attributes:
        hook: The injecting hook.
        parts: What it added.
        durable: Whether it joins the log on commit.
        tokens: Its size by the pipeline's tokenizer.
        stage: ``"pre"`` or ``"post"``.
    """

    hook: str
    parts: tuple[Part, ...]
    durable: bool
    tokens: int
    stage: str


@final
@attrs.frozen
class Halted(Event):
    """A hook stopped the turn."""

    hook: str
    reason: str


@final
@attrs.frozen
class ShadowVerdict(Event):
    """What a shadow hook decided; recorded, never enforced.

    Attributes:
        hook: The shadow hook.
        stage: Its stage.
        verdict: ``"cont"``, ``"halt"``, ``"parts"``, ...
        reason: The halt reason (or other detail), when there is one.
    """

    hook: str
    stage: str
    verdict: str
    reason: str | None = None


@final
@attrs.frozen
class ModelCalled(Event):
    """The model is being called.

    Attributes:
        attempt: The attempt, from 1 (regenerations start new attempts).
        step: The model call within the attempt, from 1 (tool steps add calls).
        model: The model's name (a provider's ``model``, or the ``model`` of the options'
            ``extra`` that replaced it in this request; else the model's class name).
        provider: The provider's name (``"openai"``, ``"anthropic"``, ...), where the model
            has one.
        options: The request options of this call, as sent: with the model's own defaults
            (a config's ``[model]`` temperature) where the turn left an option unset, and
            the values a provider sent from ``extra`` in place of the options' own.

    The last three describe the call; like `at`, they are not part of the event's equality.
    """

    attempt: int
    step: int
    model: str | None = attrs.field(default=None, kw_only=True, eq=False)
    provider: str | None = attrs.field(default=None, kw_only=True, eq=False)
    options: RequestOptions | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)


@final
@attrs.frozen
class ModelFinished(Event):
    """A model call ended: why it stopped and what it cost.

    Emitted as soon as the call ends, also with ``hold_until_accepted`` (it carries no
    text); the call's text is in its `TextDelta` events and, for the last call of an
    attempt, in `ReplyReady`.

    Attributes:
        attempt: The attempt, from 1.
        step: The model call within the attempt, from 1.
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``, ... as the provider said.
        usage: This call's token counts, where the provider reported them.
    """

    attempt: int
    step: int
    finish_reason: str | None
    usage: Usage


@final
@attrs.frozen
class TextDelta(Event):
    """A chunk of the reply's text, as delivered (after stream transformers).

    With ``hold_until_accepted=True`` the chunks are released once the post hooks accept
    the attempt; if a hook rewrote the text, they are replaced by the accepted text, one
    event per assistant message.
    """

    text: str
    attempt: int


@final
@attrs.frozen
class ToolCallRequested(Event):
    """The model asked for a tool call (as the model wrote it, before any hook).

    Attributes:
        call: The call.
        attempt: The attempt, from 1.
        step: The model call within the attempt that asked for it, from 1.
    """

    call: ToolCall
    attempt: int
    step: int


@final
@attrs.frozen
class ToolStarted(Event):
    """A tool call passed every before-tool hook and runs.

    Attributes:
        call: The call as it runs: its arguments after every before-tool rewrite.
    """

    call: ToolCall


@final
@attrs.frozen
class ToolBlocked(Event):
    """A before-tool hook blocked a call (``block``, or ``ask`` without permission).

    Attributes:
        call: The call as the blocking hook saw it.
        hook: The blocking hook.
        reason: Why; the model reads it in the error result.
    """

    call: ToolCall
    hook: str
    reason: str


@final
@attrs.frozen
class ToolFinished(Event):
    """A tool call has its result: the effective one, after every after-tool rewrite.

    Attributes:
        call: The call as it ran.
        result: What the model reads (an after-tool hook's rewrite, never the raw result
            it replaced).
        elapsed: Seconds from the start of the call's handling (its before-tool hooks) to
            its effective result.
    """

    call: ToolCall
    result: ToolResult
    elapsed: float


@final
@attrs.frozen
class ToolStepFinished(Event):
    """Every tool call of one model call has its result: the step settled, as one unit.

    `ToolStarted` and `ToolFinished` are live progress, in completion order; this event is
    the atomic surface. It comes once per tool step, after the whole batch settled and
    before the model is called with the results, and never for a batch a hook halted or a
    failure ended (none of that batch is kept). A consumer that must not show a partial
    batch waits for it.

    Attributes:
        attempt: The attempt, from 1.
        step: The model call within the attempt that asked for the tools, from 1.
        results: The effective results (after every after-tool rewrite), in call order:
            what the model reads next.
    """

    attempt: int
    step: int
    results: tuple[ToolResult, ...]


@final
@attrs.frozen
class ReplyReady(Event):
    """The model's reply for an attempt is complete.

    With ``hold_until_accepted=True`` it is released once the post hooks accept the attempt,
    and carries the reply as they left it.
    """

    reply: Reply


@final
@attrs.frozen
class AttemptRejected(Event):
    """A post hook rejected an attempt; its text must be discarded.

    With ``hold_until_accepted=False`` (the default) the attempt's `TextDelta` events were
    already delivered: a consumer drops those carrying this `attempt`.

    Attributes:
        attempt: The rejected attempt.
        hook: The rejecting hook.
        feedback: What the model is told before it tries again.
    """

    attempt: int
    hook: str
    feedback: str


@final
@attrs.frozen
class Committed(Event):
    """The turn's durable messages were appended to the conversation log.

    Attributes:
        conversation_id: The conversation.
        messages: What the log received, in order.
    """

    conversation_id: str
    messages: tuple[Message, ...]


@final
@attrs.frozen
class TurnFinished(Event):
    """The turn ended with `outcome`."""

    outcome: Outcome


def timeline(events: Iterable[Event]) -> str:
    """Render events as a readable timeline, one line per event worth showing.

    Each line is ``<ms since the turn started>  <what>  <detail>``; the text of every
    `TextDelta` is shown as delivered (after stream transformers). Events the timeline does
    not show (`ModelFinished`, events of other kinds) add no line. An empty string when no
    event adds one. Lines end with a newline, so timelines of successive batches of events
    concatenate. A line break or other control character in what an event carries (a
    multi-line error, reason or feedback, a name the model wrote) is shown escaped (``\\n``),
    so that an event is always one line and cannot pass for others.

    ``turnplug demo`` and ``turnplug run --events`` print it event by event.

    Raises:
        TypeError: An item of `events` is not an `Event`.
    """
    lines = []
    for position, event in enumerate(events, 1):
        if not isinstance(event, Event):
            raise TypeError(
                f"timeline() renders pipeline.events events; item {position} is a"
                f" {type(event).__name__}: {event!r:.100}"
            )
        described = _describe(event)
        if described is not None:
            what, detail = (_one_line(text) for text in described)
            lines.append(f"  {event.at * 1e3:6.1f} ms  {what:<44} {detail}".rstrip() + "\n")
    return "".join(lines)


_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
"""Characters a terminal may break a line at or act on: control characters, C0 and C1 (the
escape of a terminal sequence among them, and U+009B, a CSI on its own), and Unicode's line
separators; and lone surrogates, which UTF-8 cannot carry (writing one would fail)."""


def _one_line(text: str) -> str:
    if _BREAKING.search(text) is None:
        return text
    return _BREAKING.sub(lambda found: found[0].encode("unicode_escape").decode("ascii"), text)


def _describe(event: Event) -> tuple[str, str] | None:
    match event:
        case TurnStarted():
            return "turn started", f"turn_ref {event.turn_ref[:8]}"
        case HookStarted(hook=name, stage=stage):
            return f"  {name} started", stage
        case HookFinished(hook=name, elapsed=elapsed, verdict=verdict):
            return f"  {name} -> {verdict}", f"{elapsed * 1e3:.1f} ms"
        case HookSkipped(hook=name):
            return f"  {name} skipped", "when= was false"
        case HookFailed(hook=name, error=error):
            return f"  {name} FAILED", error
        case Injected(hook=name, parts=parts, durable=durable, tokens=tokens):
            kind = "durable" if durable else "transient"
            text = " ".join(part.text for part in parts if isinstance(part, Text))
            return f"  {name} injected ({kind}, {tokens} tok)", _clip(text, 44)
        case Halted(hook=name, reason=reason):
            return f"halted by {name}", reason
        case ShadowVerdict(hook=name, verdict=verdict, reason=reason):
            return f"  {name} (shadow) would {verdict}", reason or ""
        case ModelCalled(attempt=attempt, step=1):
            return f"model called (attempt {attempt})", ""
        case ModelCalled(attempt=attempt, step=step):
            return f"model called again (attempt {attempt}, call {step})", "with the tool results"
        case ToolCallRequested(call=call):
            return f"  model asks for tool {call.name}", _clip(repr(dict(call.arguments)), 44)
        case ToolStarted(call=call):
            return f"  {call.name} started", "tool"
        case ToolBlocked(call=call, hook=name, reason=reason):
            return f"  {call.name} blocked by {name}", reason
        case ToolFinished(call=call, elapsed=elapsed):
            return f"  {call.name} -> result", f"{elapsed * 1e3:.1f} ms"
        case TextDelta(text=text, attempt=attempt):
            return f"  text (attempt {attempt})", repr(text)
        case ReplyReady(reply=reply):
            return "reply ready", f"{reply.finish_reason}, {reply.usage.output_tokens} tok out"
        case AttemptRejected(attempt=attempt, hook=name, feedback=feedback):
            return f"attempt {attempt} rejected by {name}", feedback
        case Committed(messages=messages):
            return "committed to the log", f"{len(messages)} messages"
        case TurnFinished(outcome=outcome):
            return "turn finished", outcome
    return None


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
