"""Log entries as JSON: what the durable logs store and what ``turnplug log --json`` prints.

Messages and parts go through `turns.serde`. The audit record is written as the converter
would write it (built by hand, for speed) and read back through it, except for two fields it
cannot read back on its own: a halt's substitute reply (``str | Message``, a union the
converter has no rule for) and the hook records (named tuples, written as objects here so
that a reader sees field names, not positions).
"""

import collections
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
    attempts = rest.get("attempts")
    if isinstance(attempts, list):
        rest["attempts"] = [_known_usage(attempt) for attempt in attempts]
    audit = serde.from_dict(AuditRecord, rest)
    return attrs.evolve(
        audit,
        hooks=tuple(_hook_from_dict(item, f"AuditRecord.hooks[{i}]") for i, item in _items(hooks)),
        halt=_halt_from_dict(halt) if halt is not None else None,
    )


def _known_usage(attempt: Any) -> Any:
    # A record committed before `Usage` refused a negative count may hold one (a server's
    # -1 for "unknown", passed through): read as 0, what a provider now makes of it, so the
    # conversation's entries (and a session refusing a held turn_ref) still read back.
    usage = attempt.get("usage") if isinstance(attempt, Mapping) else None
    if not isinstance(usage, Mapping) or not any(
        type(count) in (int, float) and count < 0 for count in usage.values()
    ):
        return attempt
    counts = {
        key: 0 if type(count) in (int, float) and count < 0 else count
        for key, count in usage.items()
    }
    return {**attempt, "usage": counts}


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


def dumps(data: Any) -> str:
    """Compact JSON that any UTF-8 store accepts.

    Text stays readable (no ``\\u`` escapes) unless it holds a lone surrogate, which UTF-8
    cannot encode; then everything non-ASCII is escaped, and still reads back exactly.
    """
    text = _UTF8.encode(data)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _ASCII.encode(data)
    return text


def dumps_utf8(data: Any) -> bytearray:
    """`dumps(data)` encoded to UTF-8, made a slice at a time: for a worker thread encoding
    a large commit, which hands the driver the bytes.

    `json` encodes a string in one C call, which holds the GIL throughout (0.4 s for
    100 MB), and so do joining the slices of a string into one and converting text that is
    not all ASCII to UTF-8 (all of it four bytes a character once it holds one emoji): the
    event loop's thread would stall as if it did the work itself. Here each long string is
    encoded and converted a slice at a time, and the result grows a slice at a time, so the
    thread lets go of the GIL between slices. `data` must be free of cycles (`check_values`
    refuses them as too deep).
    """
    try:
        return _by_slices(data, json.encoder.encode_basestring)
    except UnicodeEncodeError:  # a lone surrogate: everything non-ASCII escaped
        return _by_slices(data, json.encoder.encode_basestring_ascii)


# What json.dumps(data, **options) would build on every call.
_UTF8 = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

# Strings longer than this are encoded a slice at a time by `dumps_utf8`: about a quarter
# of a millisecond each, after which the GIL may change hands.
_SLICE = 1 << 15

# Strings longer than this are set aside by `dumps_utf8`, out of the C encoder's output:
# the encoder joins its output into one str, holding the GIL, and a str takes four bytes a
# character once it holds one emoji (3,000 tool results of 30,000 characters held the loop
# for 0.3 s). Left in, only the structure and short strings are joined.
_ASIDE = 1 << 10

# What stands for a long string in the C encoder's output, to be replaced by its slices: a
# character JSON never writes unescaped, so it cannot stand for anything else.
_MARK = "\x00"


def _by_slices(data: Any, whole: Callable[[str], str]) -> bytearray:
    """`data` as JSON in UTF-8, `whole` (json's encoder of one string) encoding each string.

    json's C encoder calls back a Python function for strings when it is given one in place
    of its own, and the interpreter may hand the GIL over in that function. A string longer
    than `_ASIDE` is encoded there (a long one a slice at a time, JSON escaping each
    character alone) and kept aside as UTF-8; the encoder writes `_MARK` in its place. Its output is then read a
    slice at a time, each mark replaced by its string's slices. No cycle checks (the C
    encoder's "markers"): `data` has none. Without a C encoder (or with one built
    otherwise), `data` is encoded whole.
    """
    longs: collections.deque[list[bytes]] = collections.deque()

    def encode(value: str) -> str:
        if len(value) <= _ASIDE:
            return whole(value)
        if len(value) <= _SLICE:
            longs.append([whole(value).encode("utf-8")])
            return _MARK
        slices = [b'"']
        for at in range(0, len(value), _SLICE):
            slices.append(whole(value[at : at + _SLICE])[1:-1].encode("utf-8"))
        slices.append(b'"')
        longs.append(slices)
        return _MARK

    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        if make is None:
            raise TypeError("json has no C encoder")
        encoder: Callable[[Any, int], Sequence[str]] = make(
            None, _UTF8.default, encode, None, ":", ",", False, False, False
        )
    except TypeError:
        ascii = whole is json.encoder.encode_basestring_ascii
        return bytearray((_ASCII if ascii else _UTF8).encode(data), "utf-8")
    out = bytearray()
    step = _SLICE * 32
    for chunk in encoder(data, 0):
        for at in range(0, len(chunk), step):
            first, *rest = chunk[at : at + step].split(_MARK)
            out += first.encode("utf-8")
            for after in rest:
                for piece in longs.popleft():
                    out += piece
                out += after.encode("utf-8")
    return out


def messages_to_json(messages: Sequence[Message]) -> str:
    return dumps([serde.to_dict(message) for message in messages])


def messages_to_utf8(messages: Sequence[Message]) -> bytearray:
    """`messages_to_json` in UTF-8, made a slice at a time (`dumps_utf8`)."""
    return dumps_utf8([serde.to_dict(message) for message in messages])


def messages_from_data(data: Any) -> tuple[Message, ...]:
    if not isinstance(data, list):
        raise ValueError(f"cannot read messages: expected a list, got {type(data).__name__}")
    return tuple(serde.from_dict(Message, item) for item in data)


def messages_from_json(text: str) -> tuple[Message, ...]:
    return messages_from_data(json.loads(text))


def audit_to_json(audit: AuditRecord | None) -> str | None:
    return dumps(audit_to_dict(audit)) if audit is not None else None


def audit_to_utf8(audit: AuditRecord | None) -> bytearray | None:
    """`audit_to_json` in UTF-8, made a slice at a time (`dumps_utf8`)."""
    return dumps_utf8(audit_to_dict(audit)) if audit is not None else None


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
