"""`MemoryLog`: a log in a dict, for tests, examples and single-process tools."""

from collections.abc import Sequence
from typing import final

from turns import Context, Message

from .._audit import AuditRecord
from .._errors import LogConflict
from ._protocol import LogEntry


@final
class MemoryLog:
    """A `Log` held in memory; it is lost when the process ends.

    Commits never await before they are complete, so a cancelled turn either committed
    wholly or not at all.
    """

    def __init__(self) -> None:
        self._entries: dict[str, list[LogEntry]] = {}
        self._lengths: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"MemoryLog({len(self._entries)} conversations)"

    async def load(self, conversation_id: str) -> Context:
        _check_id(conversation_id)
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
        _check_id(conversation_id)
        entry = LogEntry(turn_ref, tuple(messages), audit)
        entries = self._entries.setdefault(conversation_id, [])
        if any(existing.turn_ref == turn_ref for existing in entries):
            return
        length = self._lengths.get(conversation_id, 0)
        if expected_length is not None and expected_length != length:
            raise LogConflict(
                f"conversation {conversation_id!r} holds {length} messages, not the"
                f" {expected_length} turn {turn_ref!r} was answered from: another writer"
                " committed first; nothing was committed — reload and answer again"
            )
        entries.append(entry)
        self._lengths[conversation_id] = length + len(entry.messages)

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        """Every commit of a conversation, in order, with its audit record."""
        _check_id(conversation_id)
        return tuple(self._entries.get(conversation_id, ()))


def _check_id(conversation_id: object) -> None:
    if not isinstance(conversation_id, str) or not conversation_id:
        raise ValueError(f"a conversation id must be a non-empty string, got {conversation_id!r}")
