"""Log entries as JSON: what the durable logs store and what ``turnplug log --json`` prints.

Messages and parts go through `turns.serde`. The audit record is written as the converter
would write it (built by hand, for speed) and read back through it, except for two fields it
cannot read back on its own: a halt's substitute reply (``str | Message``, a union the
converter has no rule for) and the hook records (named tuples, written as objects here so
that a reader sees field names, not positions).
"""

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from turns import Message, ToolCall, ToolResult, serde

from .._audit import AuditRecord, HookRecord
from .._signals import Halt
from ._protocol import ConversationInfo, LogEntry, by_recency

_HOOK_KEYS = HookRecord._fields
_HOOK_FIELDS = frozenset(_HOOK_KEYS)
_HALT_FIELDS = frozenset(("reason", "reply", "hook"))
_ENTRY_FIELDS = frozenset(("turn_ref", "messages", "audit", "committed_at"))


def audit_to_dict(audit: AuditRecord) -> dict[str, Any]:
    """An audit record as JSON-shaped data.

    Built directly, not through the converter's generated hooks: every commit writes one,
    and those cost about three times as much. The keys and their order are the generated
    hooks' (a property test compares the two), with the hook records and the halt written
    as described above.
    """
    part, untagged = serde.to_dict, _untagged
    return {
        "turn_ref": audit.turn_ref,
        "outcome": audit.outcome,
        "injections": [
            {
                "parts": [part(item) for item in injection.parts],
                "source": injection.source,
                "durable": injection.durable,
                "stage": injection.stage,
            }
            for injection in audit.injections
        ],
        "hooks": [dict(zip(_HOOK_KEYS, record, strict=True)) for record in audit.hooks],
        "attempts": [
            {
                "attempt": attempt.attempt,
                "steps": attempt.steps,
                "text": attempt.text,
                "finish_reason": attempt.finish_reason,
                "usage": {
                    "input_tokens": attempt.usage.input_tokens,
                    "output_tokens": attempt.usage.output_tokens,
                },
            }
            for attempt in audit.attempts
        ],
        "halt": _halt_to_dict(audit.halt) if audit.halt is not None else None,
        "rejections": [
            {
                "attempt": rejection.attempt,
                "hook": rejection.hook,
                "feedback": rejection.feedback,
                "text": rejection.text,
            }
            for rejection in audit.rejections
        ],
        "tools": [
            {
                "attempt": record.attempt,
                "step": record.step,
                "requested": untagged(record.requested),
                "call": untagged(record.call),
                "result": untagged(record.result),
            }
            for record in audit.tools
        ],
    }


def audit_from_dict(data: Any) -> AuditRecord:
    """Read back what `audit_to_dict` wrote.

    Raises:
        ValueError: `data` does not describe an audit record; the message has the path.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"cannot read an AuditRecord from {type(data).__name__} data")
    rest = dict(data)
    hooks = rest.pop("hooks", [])
    halt = rest.pop("halt", None)
    audit = serde.from_dict(AuditRecord, rest)
    return attrs.evolve(
        audit,
        hooks=tuple(_hook_from_dict(item, f"AuditRecord.hooks[{i}]") for i, item in _items(hooks)),
        halt=_halt_from_dict(halt) if halt is not None else None,
    )


def entry_to_dict(entry: LogEntry) -> dict[str, Any]:
    """A log entry as JSON-shaped data: ``turn_ref``, ``messages``, ``audit`` (or None) and
    ``committed_at`` (ISO 8601, or None).

    Messages and parts keep their ``meta``; ``json.dumps`` of the result is what
    ``turnplug log --json`` prints for each entry.
    """
    committed_at = entry.committed_at
    return {
        "turn_ref": entry.turn_ref,
        "messages": [serde.to_dict(message) for message in entry.messages],
        "audit": audit_to_dict(entry.audit) if entry.audit is not None else None,
        "committed_at": committed_at.isoformat() if committed_at is not None else None,
    }


def entry_from_dict(data: Any) -> LogEntry:
    """Read back what `entry_to_dict` wrote.

    Raises:
        ValueError: `data` does not describe a log entry; the message has the path.
    """
    # Entries written before commit times were kept have no ``committed_at``.
    if not isinstance(data, Mapping) or set(data) | {"committed_at"} != _ENTRY_FIELDS:
        found = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise ValueError(
            f"cannot read a LogEntry: expected an object with keys {sorted(_ENTRY_FIELDS)},"
            f" got {found}"
        )
    turn_ref = data["turn_ref"]
    if not isinstance(turn_ref, str):
        raise ValueError(f"cannot read a LogEntry: turn_ref must be a string, got {turn_ref!r}")
    audit, committed_at = data["audit"], data.get("committed_at")
    if not (committed_at is None or isinstance(committed_at, str)):
        raise ValueError(
            f"cannot read a LogEntry: committed_at must be an ISO 8601 string or null,"
            f" got {committed_at!r}"
        )
    return LogEntry(
        turn_ref,
        messages_from_data(data["messages"]),
        audit_from_dict(audit) if audit is not None else None,
        datetime.fromisoformat(committed_at) if committed_at is not None else None,
    )


# -- the stored text ------------------------------------------------------------------------


def dumps(data: Any, *, sliced: bool = False) -> str:
    """Compact JSON that any UTF-8 store accepts.

    Text stays readable (no ``\\u`` escapes) unless it holds a lone surrogate, which UTF-8
    cannot encode; then everything non-ASCII is escaped, and still reads back exactly.

    With `sliced` (a worker thread encoding a large commit), long strings are encoded a
    slice at a time, with the same result: `json` encodes a string in one C call, which
    holds the GIL throughout (0.4 s for 100 MB), so the event loop's thread would stall as
    if it encoded the string itself. Here the thread lets go of the GIL between slices.
    `data` must be free of cycles (`check_values` refuses them as too deep).
    """
    if sliced and _SLICED_UTF8 is not None and _SLICED_ASCII is not None:
        text = "".join(_SLICED_UTF8(data, 0))
        if not text.isascii() and not _utf8(text):
            text = "".join(_SLICED_ASCII(data, 0))
        return text
    text = _UTF8.encode(data)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _ASCII.encode(data)
    return text


# What json.dumps(data, **options) would build on every call.
_UTF8 = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

# Strings longer than this are encoded a slice at a time by `dumps(sliced=True)`: about a
# quarter of a millisecond each, after which the GIL may change hands.
_SLICE = 1 << 15


def _by_slices(whole: Callable[[str], str]) -> Callable[[str], str]:
    """`whole` (json's encoder of one string), a slice at a time for a long string: JSON
    escapes each character alone, so the slices' encodings joined are the whole's."""

    def encode(value: str) -> str:
        if len(value) <= _SLICE:
            return whole(value)
        step = _SLICE
        inner = [whole(value[at : at + step])[1:-1] for at in range(0, len(value), step)]
        return f'"{"".join(inner)}"'

    return encode


def _sliced(whole: Callable[[str], str]) -> Callable[[Any, int], Sequence[str]] | None:
    """json's C encoder with `_UTF8`'s options, calling `_by_slices(whole)` for each string.

    The C encoder calls back a Python function for strings when it is given one in place of
    its own, and the interpreter may hand the GIL over in that function, between slices.
    No markers (cycle checks): they would be state shared by the threads that call it.
    None where `json` has no C encoder (or one built otherwise): `dumps` then encodes
    whole.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encoder: Callable[[Any, int], Sequence[str]] = make(
            None, _UTF8.default, _by_slices(whole), None, ":", ",", False, False, False
        )
    except TypeError:
        return None
    return encoder


_SLICED_UTF8 = _sliced(json.encoder.encode_basestring)
_SLICED_ASCII = _sliced(json.encoder.encode_basestring_ascii)


def _utf8(text: str) -> bool:
    """Whether UTF-8 can encode `text` (it holds no lone surrogate), a slice at a time."""
    step = _SLICE * 32
    try:
        for at in range(0, len(text), step):
            text[at : at + step].encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def messages_to_json(messages: Sequence[Message], *, sliced: bool = False) -> str:
    return dumps([serde.to_dict(message) for message in messages], sliced=sliced)


def messages_from_data(data: Any) -> tuple[Message, ...]:
    if not isinstance(data, list):
        raise ValueError(f"cannot read messages: expected a list, got {type(data).__name__}")
    return tuple(serde.from_dict(Message, item) for item in data)


def messages_from_json(text: str) -> tuple[Message, ...]:
    return messages_from_data(json.loads(text))


def audit_to_json(audit: AuditRecord | None, *, sliced: bool = False) -> str | None:
    return dumps(audit_to_dict(audit), sliced=sliced) if audit is not None else None


def audit_from_json(text: str | None) -> AuditRecord | None:
    return audit_from_dict(json.loads(text)) if text is not None else None


# -- helpers --------------------------------------------------------------------------------


def _items(value: Any) -> enumerate[Any]:
    if not isinstance(value, list):
        raise ValueError(f"cannot read AuditRecord.hooks: expected a list, got {value!r}")
    return enumerate(value)


def _untagged(part: ToolCall | ToolResult) -> dict[str, Any]:
    # A tool record's call and result are typed as their own classes, not as parts: the
    # converter writes them without the part's tag (which it puts last).
    data: dict[str, Any] = serde.to_dict(part)
    del data["type"]
    return data


def _halt_to_dict(halt: Halt) -> dict[str, Any]:
    reply = serde.to_dict(halt.reply) if isinstance(halt.reply, Message) else halt.reply
    return {"reason": halt.reason, "reply": reply, "hook": halt.hook}


def _halt_from_dict(data: Any) -> Halt:
    if not isinstance(data, Mapping) or set(data) != _HALT_FIELDS:
        raise ValueError(
            f"cannot read AuditRecord.halt: expected an object with keys"
            f" {sorted(_HALT_FIELDS)}, got {data!r}"
        )
    reason, reply, hook = data["reason"], data["reply"], data["hook"]
    if not isinstance(reason, str) or not (hook is None or isinstance(hook, str)):
        raise ValueError(
            f"cannot read AuditRecord.halt: reason and hook must be text, got {data!r}"
        )
    if isinstance(reply, Mapping):
        reply = serde.from_dict(Message, reply)
    elif not (reply is None or isinstance(reply, str)):
        raise ValueError(
            f"cannot read AuditRecord.halt.reply: expected text, a message or null, got {reply!r}"
        )
    return Halt(reason, reply, hook)


def _hook_from_dict(data: Any, path: str) -> HookRecord:
    required = set(HookRecord._fields[:5])  # the rest have defaults
    if not isinstance(data, Mapping) or not required <= set(data) <= _HOOK_FIELDS:
        raise ValueError(
            f"cannot read {path}: expected an object with keys {list(HookRecord._fields)},"
            f" got {data!r}"
        )
    record = HookRecord(**data)
    texts = (record.hook, record.stage, record.position, record.verdict)
    elapsed = record.elapsed
    if (
        not all(isinstance(text, str) for text in texts)
        or isinstance(elapsed, bool)
        or not isinstance(elapsed, int | float)
        or not isinstance(record.shadow, bool)
        or not (record.detail is None or isinstance(record.detail, str))
    ):
        raise ValueError(f"cannot read {path}: a field has the wrong type in {data!r}")
    return record._replace(elapsed=float(elapsed))


# -- reading stored rows --------------------------------------------------------------------


class StoredDataError(Exception):
    """A stored row cannot be read back (the logs turn it into `pipeline.LogError`)."""


def read_messages(conversation_id: str, turn_ref: str, text: str) -> tuple[Message, ...]:
    """The messages of one stored turn."""
    try:
        return messages_from_json(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StoredDataError(
            f"turn {turn_ref!r} of conversation {conversation_id!r} cannot be read: {exc}"
        ) from exc


def read_entry(
    conversation_id: str,
    turn_ref: str,
    messages: str,
    audit: str | None,
    committed_at: datetime | str | None = None,
) -> LogEntry:
    """One stored turn with its audit record and commit time (see `read_time`)."""
    where = f"turn {turn_ref!r} of conversation {conversation_id!r}"
    when = None if committed_at is None else read_time(where, committed_at)
    try:
        return LogEntry(turn_ref, messages_from_json(messages), audit_from_json(audit), when)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StoredDataError(f"{where} cannot be read: {exc}") from exc


def read_time(where: str, value: object) -> datetime:
    """A stored commit time, in UTC, from a timezone-aware datetime (PostgreSQL's
    timestamptz) or ISO 8601 text with its offset (SQLite, which writes UTC with a ``Z``).

    Anything else — text that is no time, a time without its zone, which could not be
    compared with the others — is a `StoredDataError` naming `where` (the turn), as a
    row's unreadable messages are.
    """
    if isinstance(value, datetime):
        when = value
    else:
        try:
            when = datetime.fromisoformat(value if isinstance(value, str) else repr(value))
        except ValueError as exc:
            raise StoredDataError(
                f"{where} cannot be read: its commit time {value!r} is not an ISO 8601 time ({exc})"
            ) from exc
    if when.tzinfo is None:
        raise StoredDataError(f"{where} cannot be read: its commit time {value!r} has no time zone")
    # PostgreSQL gives the time in its session's TimeZone (the server's default, a role's
    # setting, the client's PGTZ); every log gives UTC.
    try:
        return when.astimezone(UTC)
    except OverflowError as exc:
        # Year 1 with an offset ahead of UTC, or year 9999 with one behind it.
        raise StoredDataError(
            f"{where} cannot be read: its commit time {value!r} is out of range in UTC ({exc})"
        ) from exc


def read_conversations(
    rows: Sequence[tuple[str, int, int, object]],
) -> tuple[ConversationInfo, ...]:
    """Rows of (conversation id, turns, messages, last commit time), most recent first; a
    commit time is read as `read_time` reads one."""
    return by_recency(
        [
            ConversationInfo(
                id_, turns, length, read_time(f"the last turn of conversation {id_!r}", last)
            )
            for id_, turns, length, last in rows
        ]
    )
