"""Events: how a UI, a log or a tracer watches a turn.

Every event is a frozen record carrying the `turn_ref` of its turn. They are produced only
when someone listens (`Pipeline.stream`); `Pipeline.run` builds none.
"""

from typing import Literal, TypeAlias, final

import attrs

from turns import Message, Part, Reply, ToolCall, ToolResult

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
    "Outcome",
    "ReplyReady",
    "ShadowVerdict",
    "TextDelta",
    "ToolBlocked",
    "ToolCallRequested",
    "ToolFinished",
    "ToolStarted",
    "TurnFinished",
    "TurnStarted",
]

Outcome: TypeAlias = Literal["completed", "halted", "exhausted"]


@attrs.frozen
class Event:
    """Base of every event."""

    turn_ref: str


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
    """A hook raised or timed out.

    Attributes:
        hook: Its name.
        stage: Its stage.
        error: The failure, as ``"Type: message"``.
        enforced: True when the failure stops the turn; False when the hook fails open
            (``on_error="skip"``) or is a shadow hook.
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
    """

    attempt: int
    step: int


@final
@attrs.frozen
class TextDelta(Event):
    """A chunk of the reply's text, as delivered (after stream transformers)."""

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
class ReplyReady(Event):
    """The model's reply for an attempt is complete."""

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


for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
