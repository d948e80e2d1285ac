"""The audit record: what answers "why did the model see this?" after the fact."""

from typing import NamedTuple, final

import attrs

from turns import Injection, ToolCall, ToolResult, Usage

from ._signals import Halt
from .events import Outcome


@final
class HookRecord(NamedTuple):
    """One hook run.

    A named tuple rather than an attrs record: one is built for every hook run, on the hot
    path, and a tuple is several times cheaper to build.

    Attributes:
        hook: The hook's name.
        stage: Its stage.
        position: Where it stands in its stage (``"3"``, ``"2.1"`` for a group or chain
            member), counted from 1.
        elapsed: Seconds it took.
        verdict: ``"cont"``, ``"halt"``, ``"parts"``, ``"skipped"``, ``"failed"``, ...
        shadow: Whether it ran in shadow mode (its verdict was not enforced).
        detail: The halt reason or the failure, where there is one.
    """

    hook: str
    stage: str
    position: str
    elapsed: float
    verdict: str
    shadow: bool = False
    detail: str | None = None


new_record = tuple.__new__
"""``new_record(HookRecord, (all seven fields))``: a record without the named tuple's
Python-level ``__new__``, for the paths that build one per hook."""


@final
@attrs.frozen
class AttemptRecord:
    """One attempt at a reply.

    Attributes:
        attempt: Its number, from 1.
        steps: How many model calls it made.
        text: The reply text it produced (after stream transformers), as the post hooks
            left it: rewritten where one rewrote it (a scrub, a disclaimer), as the log holds
            it; for a rejected or halted attempt, as the hook that rejected or halted it saw
            it.
        finish_reason: Why the model stopped.
        usage: Token counts over its model calls.
    """

    attempt: int
    steps: int
    text: str
    finish_reason: str | None
    usage: Usage


@final
@attrs.frozen
class Rejection:
    """An attempt a post hook rejected.

    Attributes:
        attempt: The rejected attempt's number.
        hook: The rejecting hook.
        feedback: What the hook told the model.
        text: The rejected reply's text (after stream transformers) as the rejecting hook
            saw it: after the rewrites of the post hooks before it in that pass.
    """

    attempt: int
    hook: str
    feedback: str
    text: str


@final
@attrs.frozen
class ToolRecord:
    """One tool call the model asked for, and what answered it.

    Attributes:
        attempt: The attempt, from 1.
        step: The model call within the attempt that asked for it, from 1.
        requested: The call as the model wrote it, but for an id repeating another call's,
            which the runtime gave a suffix (``c1_2``) before anything saw the call.
        call: The call as it ran (or as the hook that blocked it saw it), after every
            before-tool rewrite.
        result: What the model read: the effective result, after every after-tool rewrite;
            its ``meta["tool_hooks"]`` says which hooks blocked or rewrote what.
    """

    attempt: int
    step: int
    requested: ToolCall
    call: ToolCall
    result: ToolResult


@final
@attrs.frozen
class AuditRecord:
    """Everything that shaped a turn, transient parts included.

    Attributes:
        turn_ref: The turn.
        outcome: ``"completed"``, ``"halted"`` or ``"exhausted"``.
        injections: Every injection, stamped with its hook, durability and stage.
        hooks: Every hook run, in the order they finished (group members in declaration
            order), with its timing and verdict.
        attempts: Every attempt, including rejected ones and one a tool hook halted.
        halt: The halt that stopped the turn, if one did.
        rejections: Every rejected attempt, with its hook and feedback.
        tools: Every tool call of every attempt, in call order, with its effective result.
    """

    turn_ref: str
    outcome: Outcome
    injections: tuple[Injection, ...] = ()
    hooks: tuple[HookRecord, ...] = ()
    attempts: tuple[AttemptRecord, ...] = ()
    halt: Halt | None = None
    rejections: tuple[Rejection, ...] = ()
    tools: tuple[ToolRecord, ...] = ()
