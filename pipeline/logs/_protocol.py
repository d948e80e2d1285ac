"""The `Log` protocol every conversation log implements."""

from collections.abc import Sequence
from typing import Protocol, final, runtime_checkable

import attrs

from turns import Context, Message

from .._audit import AuditRecord


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
    """A conversation log: async, so that a log backed by a database never blocks a turn."""

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
