"""Signals: what a hook returns to tell the runtime what happens next.

Halting is a value, not an exception. `None` never means "continue".
"""

from typing import Generic, TypeAlias, TypeVar, final

import attrs

from turns import Message

T = TypeVar("T")


@final
@attrs.frozen
class Cont(Generic[T]):
    """Continue with `value` (the turn, or at tool stages the call or result)."""

    value: T


@final
@attrs.frozen
class Halt:
    """Stop the turn.

    Attributes:
        reason: Why, for the result, the events and the audit record.
        reply: A substitute answer (text or an assistant `Message`), if any.
        hook: The halting hook's name, stamped by the runtime.
    """

    reason: str
    reply: str | Message | None = None
    hook: str | None = None


@final
@attrs.frozen
class Regenerate:
    """Post stage only: reject the reply and ask the model again with `feedback`."""

    feedback: str


@final
@attrs.frozen
class Block:
    """Before-tool only: do not run this tool call; the model is told `reason`."""

    reason: str


@final
@attrs.frozen
class Ask:
    """Before-tool only: ask the pipeline's ``permission`` callback `question`."""

    question: str


Signal: TypeAlias = Cont[object] | Halt | Regenerate | Block | Ask


def cont(value: T) -> Cont[T]:
    """Continue with `value`."""
    return Cont(value)


def _check_text(signal: str, name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(
            f"{signal}({name}) takes text, got {type(value).__name__} {value!r:.60} — say it"
            " in words: it is shown to the model, the user or the audit record"
        )


def halt(reason: str, *, reply: str | Message | None = None) -> Halt:
    """Stop the turn for `reason`, optionally answering with `reply` instead of the model."""
    _check_text("halt", "reason", reason)
    check_halt_reply(reply)
    return Halt(reason, reply)


def check_halt_reply(reply: object) -> None:
    """Raise if `reply` cannot be a halt's substitute answer (text or an assistant message)."""
    if reply is not None and not isinstance(reply, str | Message):
        raise TypeError(f"halt(reply=...) takes text or a Message, got {type(reply).__name__}")
    if isinstance(reply, Message) and reply.role != "assistant":
        raise ValueError(
            f"halt(reply=...) must be an assistant message (it answers the user), got role"
            f" {reply.role!r} — pass the text, or Message.assistant(...)"
        )


def regenerate(feedback: str) -> Regenerate:
    """Reject the reply and ask the model again, telling it `feedback`."""
    _check_text("regenerate", "feedback", feedback)
    return Regenerate(feedback)


def block(reason: str) -> Block:
    """Do not run this tool call; the model receives an error result saying `reason`."""
    _check_text("block", "reason", reason)
    return Block(reason)


def ask(question: str) -> Ask:
    """Let the pipeline's ``permission`` callback decide whether this tool call runs."""
    _check_text("ask", "question", question)
    return Ask(question)
