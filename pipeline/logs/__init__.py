"""Conversation logs: where committed turns live.

A `Log` holds, per conversation, the messages of every committed turn, in order, and each
turn's audit record beside them. A commit is all-or-nothing and idempotent per ``turn_ref``;
with ``expected_length`` it is also optimistic: it happens only if the conversation still
holds exactly that many messages, else `pipeline.LogConflict` and nothing is written.
"""

from ._memory import MemoryLog
from ._protocol import Log, LogEntry

__all__ = ["Log", "LogEntry", "MemoryLog"]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
