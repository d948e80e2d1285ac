"""Conversation logs: where committed turns live.

A `Log` holds, per conversation, the messages of every committed turn, in order, and each
turn's audit record beside them. A commit is all-or-nothing and idempotent per ``turn_ref``;
with ``expected_length`` it is also optimistic: it happens only if the conversation still
holds exactly that many messages, else `pipeline.LogConflict` and nothing is written.

`MemoryLog` is for tests and examples; `SQLiteLog` is the embedded default (one file, one
machine); `PostgresLog` serves several worker processes or machines (``pip install
'turnplug[postgres]'``). Storage failures of the durable logs are `pipeline.LogError`, and
every log refuses alike (`pipeline.LogError`, nothing written) a commit holding a value nested
deeper than `MAX_DEPTH` levels, and (`ValueError`) a conversation id or turn_ref longer than
`MAX_ID_BYTES` bytes as UTF-8 (``load`` and ``entries`` still read a conversation an older
log stored under a longer id).
`entry_to_dict` and `entry_from_dict` give a log entry's JSON shape.
"""

from ._codec import entry_from_dict, entry_to_dict
from ._memory import MemoryLog
from ._postgres import PostgresLog
from ._protocol import MAX_DEPTH, MAX_ID_BYTES, ConversationInfo, Log, LogEntry
from ._sqlite import SQLiteLog

__all__ = [
    "ConversationInfo",
    "Log",
    "LogEntry",
    "MAX_DEPTH",
    "MAX_ID_BYTES",
    "MemoryLog",
    "PostgresLog",
    "SQLiteLog",
    "entry_from_dict",
    "entry_to_dict",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(f"{__name__}._"):
        _obj.__module__ = __name__
del _name, _obj
