"""The `Log` protocol every conversation log implements."""

from collections.abc import Sequence
from typing import Protocol, final, runtime_checkable

import attrs

from turns import Context, Message

from .._audit import AuditRecord
from .._errors import LogConflict


@final
@attrs.frozen
class LogEntry:
    """One commit, as a log keeps it.

    Attributes:
        turn_ref: The committed turn (or ``turn_ref:hook`` for a background hook's commit).
        messages: What was committed, in order.
        audit: The turn's audit record, when one was given.
    """

    turn_ref: str
    messages: tuple[Message, ...]
    audit: AuditRecord | None = None


@runtime_checkable
class Log(Protocol):
    """A conversation log: async, so that a log backed by a database never blocks a turn.

    A session needs only `load` and `append`; `entries` is for tools that show a
    conversation with its audit records.
    """

    async def load(self, conversation_id: str) -> Context:
        """The conversation so far; an empty `Context` when it does not exist."""
        ...

    async def append(
        self,
        conversation_id: str,
        turn_ref: str,
        messages: Sequence[Message],
        audit: AuditRecord | None = None,
        *,
        expected_length: int | None = None,
    ) -> None:
        """Commit `messages` as one turn, atomically.

        Committing a `turn_ref` the conversation already holds does nothing. With
        `expected_length`, the commit happens only if the conversation holds exactly that
        many messages; otherwise `pipeline.LogConflict` is raised and nothing is written.
        """
        ...

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        """Every commit of a conversation, in order, with its audit record.

        Empty when the conversation does not exist. This is what ``turnplug log`` shows.
        """
        ...


def check_id(conversation_id: object) -> None:
    """Raise unless `conversation_id` is a non-empty string."""
    if not isinstance(conversation_id, str) or not conversation_id:
        raise ValueError(f"a conversation id must be a non-empty string, got {conversation_id!r}")


def check_append(
    conversation_id: object,
    turn_ref: object,
    messages: tuple[object, ...],
    audit: object,
    expected_length: object,
) -> None:
    """Raise unless `append`'s arguments are what a log can commit."""
    check_id(conversation_id)
    if not isinstance(turn_ref, str) or not turn_ref:
        raise ValueError(f"a turn_ref must be a non-empty string, got {turn_ref!r}")
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise TypeError(
                f"append({turn_ref!r}): messages[{index}] is {type(message).__name__}"
                f" {message!r}, expected a turns.Message — build one with Message.user(...)"
            )
    if audit is not None and not isinstance(audit, AuditRecord):
        raise TypeError(
            f"append({turn_ref!r}): audit must be an AuditRecord or None, got"
            f" {type(audit).__name__}"
        )
    if expected_length is not None and (
        isinstance(expected_length, bool)
        or not isinstance(expected_length, int)
        or expected_length < 0
    ):
        raise ValueError(
            f"append({turn_ref!r}): expected_length must be an int >= 0 or None, got"
            f" {expected_length!r}"
        )


def conflict(conversation_id: str, turn_ref: str, length: int, expected: int) -> LogConflict:
    """The error of a commit refused because the conversation grew (or shrank) meanwhile."""
    return LogConflict(
        f"conversation {conversation_id!r} holds {length} messages, not the"
        f" {expected} turn {turn_ref!r} was answered from: another writer"
        " committed first; nothing was committed — reload and answer again",
        conversation_id=conversation_id,
        expected=expected,
        actual=length,
    )
