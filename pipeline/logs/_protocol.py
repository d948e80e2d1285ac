"""The `Log` protocol every conversation log implements."""

import itertools
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, cast, final, runtime_checkable

import attrs

from turns import Context, Message, Part, Text, ToolCall, ToolResult

from .._audit import AuditRecord
from .._errors import LogConflict, LogError

MAX_DEPTH = 100
"""How deeply a value in a commit (``meta``, tool arguments) may nest.

JSON readers and writers recurse once per level, so a deeper value would be written and then
fail to read back, or fail to write with a `RecursionError`. Every log refuses it alike.
"""

logger = logging.getLogger("turnplug.logs")


@final
@attrs.frozen
class LogEntry:
    """One commit, as a log keeps it.

    Attributes:
        turn_ref: The committed turn (or ``turn_ref:hook`` for a background hook's commit).
        messages: What was committed, in order.
        audit: The turn's audit record, when one was given.
        committed_at: When the log committed it (UTC), where the log knows. It is left out
            of equality: two entries are equal when they hold the same commit.
    """

    turn_ref: str
    messages: tuple[Message, ...]
    audit: AuditRecord | None = None
    committed_at: datetime | None = attrs.field(default=None, eq=False)


@final
@attrs.frozen
class ConversationInfo:
    """One conversation a log holds, as `conversations()` lists it.

    Attributes:
        conversation_id: Its id.
        turns: How many commits it holds.
        messages: How many messages those commits hold.
        last_committed_at: When its latest commit was made (UTC).
    """

    conversation_id: str
    turns: int
    messages: int
    last_committed_at: datetime


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


def by_recency(infos: Iterable[ConversationInfo]) -> tuple[ConversationInfo, ...]:
    """Conversations with the most recently committed first (ties by id)."""
    ordered = sorted(infos, key=lambda info: info.conversation_id)
    return tuple(sorted(ordered, key=lambda info: info.last_committed_at, reverse=True))


def check_id(conversation_id: object, *, to_read: bool = False) -> None:
    """Raise unless `conversation_id` is a non-empty string a log can store.

    `to_read` (``load``, ``entries``) lets a longer one than `MAX_ID_BYTES` through: a log
    written before the limit was enforced may hold one, and what it holds stays readable.
    """
    if not isinstance(conversation_id, str) or not conversation_id:
        raise ValueError(f"a conversation id must be a non-empty string, got {conversation_id!r}")
    if "\x00" in conversation_id:
        raise ValueError(
            f"a conversation id must not hold a NUL character, got {conversation_id!r}{_NUL}"
        )
    if not _encodable(conversation_id):
        raise ValueError(
            f"a conversation id must not hold a lone surrogate, got {conversation_id!r}{_LONE}"
        )
    if not to_read and _too_long(conversation_id):
        raise ValueError(
            f"a conversation id must be at most {MAX_ID_BYTES} bytes as UTF-8, got"
            f" {_byte_length(conversation_id)} ({conversation_id[:40]!r}...){_LONG}"
        )


_NUL = " — PostgreSQL cannot store one in text, so no log takes it (the logs agree)"
_LONE = (
    " — UTF-8 cannot encode one, so neither database can store it, and no log takes it"
    " (the logs agree)"
)


MAX_ID_BYTES = 1024
"""How long a conversation id or a turn_ref may be, in bytes as UTF-8.

PostgreSQL indexes the two together, and an index entry must fit in about a third of a page
(2.7 kB). Every log refuses to store a longer one alike; a conversation stored under a longer
id before the limit was enforced can still be read (``load``, ``entries``).
"""
_LONG = (
    " — PostgreSQL cannot index a longer one, so no log takes it (the logs agree); use a"
    " shorter key, such as a hash of this one"
)


def _too_long(text: str) -> bool:
    # A character is at most 4 bytes: most ids are decided without encoding them.
    return len(text) * 4 > MAX_ID_BYTES and _byte_length(text) > MAX_ID_BYTES


def _byte_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _encodable(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (it holds no lone surrogate, such as a
    ``\\ud800`` escape decoded from JSON)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_messages(turn_ref: object, messages: object) -> tuple[Message, ...]:
    """`append`'s messages as a tuple, or a TypeError saying what was passed instead."""
    if isinstance(messages, Context):
        raise TypeError(
            f"append({turn_ref!r}): messages is a Context; pass the messages to add, not a"
            " conversation: e.g. result.log_messages"
        )
    if isinstance(messages, Message):
        raise TypeError(
            f"append({turn_ref!r}): messages is one Message; pass a sequence of them: (message,)"
        )
    if isinstance(messages, str | bytes):
        # Iterated, text gives characters: an empty one would commit a turn of no messages.
        raise TypeError(
            f"append({turn_ref!r}): messages is {type(messages).__name__} {messages[:40]!r};"
            " pass a sequence of turns.Message: (Message.user(text),)"
        )
    try:
        items = iter(cast("Iterable[Message]", messages))
    except TypeError:
        raise TypeError(
            f"append({turn_ref!r}): messages must be a sequence of turns.Message, got"
            f" {type(messages).__name__}"
        ) from None
    return tuple(items)


def check_turn_ref(turn_ref: object) -> None:
    """Raise unless `turn_ref` is a non-empty string a log can store."""
    if not isinstance(turn_ref, str) or not turn_ref:
        raise ValueError(f"a turn_ref must be a non-empty string, got {turn_ref!r}")
    if "\x00" in turn_ref:
        raise ValueError(f"a turn_ref must not hold a NUL character, got {turn_ref!r}{_NUL}")
    if not _encodable(turn_ref):
        raise ValueError(f"a turn_ref must not hold a lone surrogate, got {turn_ref!r}{_LONE}")
    if _too_long(turn_ref):
        raise ValueError(
            f"a turn_ref must be at most {MAX_ID_BYTES} bytes as UTF-8, got"
            f" {_byte_length(turn_ref)} ({turn_ref[:40]!r}...){_LONG}"
        )


def check_append(
    conversation_id: object,
    turn_ref: object,
    messages: tuple[object, ...],
    audit: object,
    expected_length: object,
) -> None:
    """Raise unless `append`'s arguments are what a log can commit."""
    check_id(conversation_id)
    check_turn_ref(turn_ref)
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


def check_values(
    log: object,
    conversation_id: str,
    turn_ref: str,
    messages: tuple[Message, ...],
    audit: AuditRecord | None,
) -> None:
    """Raise `LogError` if a value in the commit could not be stored and read back as it is.

    A value nested deeper than `MAX_DEPTH` levels (JSON is read recursively), a mapping
    with a key that is not a string (JSON writes ``1`` as ``"1"``), or a leaf JSON cannot
    hold (a set, a date, NaN). Every log calls this, so
    that the three agree: a commit a durable log could not store and read back is refused by
    the memory log too, and nothing is written.
    """
    # Most values are empty or flat: look for a problem first, and name its path only then.
    if not any(value and _problem(value) for value in _opaque(messages, audit)):
        return
    for path, value in _values(messages, audit):
        found = _problem(value) if value else None
        if found is None:
            continue
        kind, key = found
        if kind == "deep":
            problem = (
                f"{path} is nested more than {MAX_DEPTH} levels deep, more than a log can"
                " store and read back; nothing was committed — refuse such arguments in a"
                " before_tool hook, or keep meta shallower"
            )
        elif kind == "key":
            problem = (
                f"{path} holds the key {key!r} ({type(key).__name__}): a log stores JSON"
                " values only, whose keys are strings, so it would read back as another value;"
                " nothing was committed — use string keys"
            )
        else:
            problem = (
                f"{path} holds {key!r} ({type(key).__name__}): a log stores JSON values only"
                " (str, finite numbers, bools, None, lists and dicts); nothing was committed"
                " — convert it first (a date to its ISO text, a set to a sorted list)"
            )
        raise LogError(
            f"{log!r} cannot store turn {turn_ref!r} of conversation {conversation_id!r}:"
            f" {problem}",
            log=repr(log),
        )


def _opaque(messages: tuple[Message, ...], audit: AuditRecord | None) -> Iterator[object]:
    """What `_values` yields, without the paths."""
    for message in messages:
        yield message.meta
        for part in message.parts:
            yield part.meta
            if isinstance(part, ToolCall):
                yield part.arguments
    if audit is None:
        return
    for injection in audit.injections:
        for part in injection.parts:
            yield part.meta
            if isinstance(part, ToolCall):
                yield part.arguments
    for record in audit.tools:
        yield from (record.requested.meta, record.requested.arguments)
        yield from (record.call.meta, record.call.arguments)
        yield record.result.meta
    if audit.halt is not None and isinstance(audit.halt.reply, Message):
        yield from _opaque((audit.halt.reply,), None)


def _values(
    messages: tuple[Message, ...], audit: AuditRecord | None
) -> Iterator[tuple[str, object]]:
    """Every opaque value of a commit, with its path."""
    for index, message in enumerate(messages):
        yield from _message_values(f"messages[{index}]", message)
    if audit is None:
        return
    for index, injection in enumerate(audit.injections):
        for position, part in enumerate(injection.parts):
            yield from _part_values(f"audit.injections[{index}].parts[{position}]", part)
    for index, record in enumerate(audit.tools):
        yield from _part_values(f"audit.tools[{index}].requested", record.requested)
        yield from _part_values(f"audit.tools[{index}].call", record.call)
        yield from _part_values(f"audit.tools[{index}].result", record.result)
    if audit.halt is not None and isinstance(audit.halt.reply, Message):
        yield from _message_values("audit.halt.reply", audit.halt.reply)


def _message_values(path: str, message: Message) -> Iterator[tuple[str, object]]:
    yield f"{path}.meta", message.meta
    for position, part in enumerate(message.parts):
        yield from _part_values(f"{path}.parts[{position}]", part)


def _part_values(path: str, part: Part) -> Iterator[tuple[str, object]]:
    yield f"{path}.meta", part.meta
    if isinstance(part, ToolCall):
        yield f"{path}.arguments", part.arguments


def _problem(value: object) -> tuple[str, object] | None:
    """What keeps `value` from being stored and read back: ``("deep", None)`` when it nests
    deeper than `MAX_DEPTH`, ``("key", key)`` for a mapping key that is not a string,
    ``("value", leaf)`` for a leaf JSON has no value for (a set, a date, NaN), or None.

    A loop, not recursion: the point is to measure values too deep to recurse through.
    """
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            for key in item:
                if not isinstance(key, str):
                    return ("key", key)
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        elif (
            item is None
            or isinstance(item, str | int)
            or (isinstance(item, float) and math.isfinite(item))
        ):
            continue
        else:
            return ("value", item)
        if depth > MAX_DEPTH:
            return ("deep", None)
        pending.extend((child, depth + 1) for child in children)
    return None


HEAVY = 1 << 17
"""How many units (a character of text or ids, a string, a message, a part, a node of an
opaque value) make a commit heavy: checking and encoding it would hold the event loop for
about a millisecond or more, longer than a hand-over to a worker thread costs."""


def heavy(messages: tuple[Message, ...], audit: AuditRecord | None) -> bool:
    """Whether the commit weighs at least `HEAVY` units, counted cheaply: text part by part,
    and opaque values (``meta``, tool arguments) walked only until the count is reached, so
    that a commit of any size is weighed in a bounded time. Each string, message and part
    counts as well as its characters: encoding a part costs far more than a character, and
    a commit of many empty parts is as heavy as one long text."""
    budget = HEAVY
    for text in _texts(messages, audit):
        budget -= 1 + len(text)
        if budget <= 0:
            return True
    for value in _opaque(messages, audit):  # a meta for each message and part
        budget = _spend(value, budget) if value else budget - 1
        if budget <= 0:
            return True
    return False


def _texts(messages: tuple[Message, ...], audit: AuditRecord | None) -> Iterator[str]:
    """The strings of a commit outside its opaque values: what `_opaque` leaves out."""
    for message in messages:
        for part in message.parts:
            yield from _part_texts(part)
    if audit is None:
        return
    for injection in audit.injections:
        for part in injection.parts:
            yield from _part_texts(part)
    for hook in audit.hooks:
        yield from (hook.hook, hook.detail or "")
    for attempt in audit.attempts:
        yield attempt.text
    for rejection in audit.rejections:
        yield from (rejection.feedback, rejection.text)
    for record in audit.tools:
        for part in (record.requested, record.call, record.result):
            yield from _part_texts(part)
    if audit.halt is not None:
        yield audit.halt.reason
        if isinstance(audit.halt.reply, str):
            yield audit.halt.reply
        elif audit.halt.reply is not None:
            yield from _texts((audit.halt.reply,), None)


def _part_texts(part: Part) -> Iterator[str]:
    if isinstance(part, Text):
        yield part.text
    elif isinstance(part, ToolCall):
        yield from (part.id, part.name)
    elif isinstance(part, ToolResult):
        yield from (part.call_id, part.content)


def _spend(value: object, budget: int) -> int:
    """`budget` less a unit per node of `value` and the length of each string in it, down
    to 0 at most: a loop that stops there, whatever the size or depth of `value`."""
    pending: list[Any] = [value]
    while pending and budget > 0:
        item = pending.pop()
        budget -= 1
        if isinstance(item, str):
            budget -= len(item)
        elif isinstance(item, Mapping):
            pending.extend(itertools.islice(item.items(), budget))
        elif isinstance(item, list | tuple):
            pending.extend(item[:budget])
    return budget


def conflict(conversation_id: str, turn_ref: str, length: int, expected: int) -> LogConflict:
    """The error of a commit refused because the conversation grew (or shrank) meanwhile."""
    logger.warning(
        "commit of turn %s refused: conversation %r holds %d messages, not the %d it was"
        " answered from (another writer committed first)",
        turn_ref,
        conversation_id,
        length,
        expected,
    )
    return LogConflict(
        f"conversation {conversation_id!r} holds {length} messages, not the"
        f" {expected} turn {turn_ref!r} was answered from: another writer"
        " committed first; nothing was committed — reload and answer again",
        conversation_id=conversation_id,
        expected=expected,
        actual=length,
    )
