"""`MemoryLog`: a log in a dict, for tests, examples and single-process tools."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import final

import anyio.lowlevel

from turns import Context, Message

from .._audit import AuditRecord
from ._protocol import (
    ConversationInfo,
    LogEntry,
    as_messages,
    by_recency,
    check_append,
    check_id,
    check_values,
    conflict,
)


@final
class MemoryLog:
    """A `Log` held in memory; it is lost when the process ends.

    A commit checks for cancellation first, then completes without awaiting: a cancelled
    commit either raises before writing anything or writes everything.
    """

    def __init__(self) -> None:
        self._entries: dict[str, list[LogEntry]] = {}
        self._lengths: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"MemoryLog({len(self._entries)} conversations)"

    async def load(self, conversation_id: str) -> Context:
        check_id(conversation_id, to_read=True)
        entries = self._entries.get(conversation_id, ())
        return Context(messages=tuple(m for entry in entries for m in entry.messages))

    async def append(
        self,
        conversation_id: str,
        turn_ref: str,
        messages: Sequence[Message],
        audit: AuditRecord | None = None,
        *,
        expected_length: int | None = None,
    ) -> None:
        messages = as_messages(turn_ref, messages)
        check_append(conversation_id, turn_ref, messages, audit, expected_length)
        check_values(self, conversation_id, turn_ref, messages, audit)
        await anyio.lowlevel.checkpoint_if_cancelled()
        entry = LogEntry(turn_ref, messages, audit, datetime.now(UTC))
        entries = self._entries.setdefault(conversation_id, [])
        if any(existing.turn_ref == turn_ref for existing in entries):
            return
        length = self._lengths.get(conversation_id, 0)
        if expected_length is not None and expected_length != length:
            raise conflict(conversation_id, turn_ref, length, expected_length)
        entries.append(entry)
        self._lengths[conversation_id] = length + len(entry.messages)

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        """Every commit of a conversation, in order, with its audit record."""
        check_id(conversation_id, to_read=True)
        return tuple(self._entries.get(conversation_id, ()))

    async def conversations(self) -> tuple[ConversationInfo, ...]:
        """Every conversation with at least one commit, the most recently committed first."""
        return by_recency(
            [
                ConversationInfo(
                    conversation_id,
                    len(entries),
                    self._lengths[conversation_id],
                    entries[-1].committed_at or datetime.now(UTC),
                )
                for conversation_id, entries in self._entries.items()
                if entries
            ]
        )
