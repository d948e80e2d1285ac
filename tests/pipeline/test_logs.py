"""pipeline.logs: one suite, run against MemoryLog, SQLiteLog and PostgresLog.

The `log` fixture (tests/conftest.py, tests/logs.py) is each kind of log in turn, on storage of its
own; `durable` is each durable kind, for what only a database can show (reopening).
"""

import datetime
import json
import random
import string
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import (
    AuditRecord,
    LogConflict,
    Pipeline,
    PipelineError,
    cont,
    halt,
    hook,
    regenerate,
)
from pipeline.logs import Log, LogEntry, MemoryLog, entry_from_dict, entry_to_dict
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Message, Text, ToolCall, ToolResult, Turn

from ..logs import Backend, close
from ..turns import strategies as turn_strategies

CONVERSATION = "conv-1"


def exchange(question: str, answer: str) -> tuple[Message, ...]:
    return (Message.user(question), Message.assistant(answer))


async def audit_of(text: str) -> AuditRecord:
    """A real audit record: the one a completed turn produces."""
    result = await Pipeline(model=ScriptedModel(["ok"])).run(Turn.start(text))
    return result.audit


async def rich_audit() -> AuditRecord:
    """An audit record with every field filled: injections, hooks, attempts, a rejection
    and a halt whose substitute reply is a message."""

    async def note(turn):
        return cont(turn.inject(Text("a note", meta={"k": [1, 2.5]})))

    async def picky(turn):
        if turn.reply.attempt == 1:
            return regenerate("shorter")
        return halt("enough", reply=Message.assistant("Sorry.", meta={"why": "policy"}))

    pipe = Pipeline(
        model=ScriptedModel(["a long answer", "short"]),
        pre=[hook(note, durable=True)],
        post=[picky],
    )
    result = await pipe.run(Turn.start("hi"))
    audit = result.audit
    assert audit.halt is not None
    assert isinstance(audit.halt.reply, Message)
    assert audit.injections
    assert audit.rejections
    assert audit.hooks
    return audit


# -- the protocol ---------------------------------------------------------------------------


async def test_every_log_is_a_log(log):
    assert isinstance(log, Log)


def test_an_object_without_append_is_not_a_log():
    class ReadOnly:
        async def load(self, conversation_id):
            return Context()

        async def entries(self, conversation_id):
            return ()

    assert not isinstance(ReadOnly(), Log)


def test_an_object_without_entries_is_not_a_log():
    class NoEntries:
        async def load(self, conversation_id):
            return Context()

        async def append(self, conversation_id, turn_ref, messages, audit=None, **kw):
            return None

    assert not isinstance(NoEntries(), Log)


def test_log_conflict_is_a_pipeline_error():
    assert issubclass(LogConflict, PipelineError)


# -- load -----------------------------------------------------------------------------------


async def test_loading_an_unknown_conversation_gives_an_empty_context(log):
    assert await log.load("never-seen") == Context()


async def test_load_returns_what_was_appended_in_order(log):
    first, second = exchange("hi", "hello"), exchange("how are you?", "fine")

    await log.append(CONVERSATION, "turn-1", first)
    await log.append(CONVERSATION, "turn-2", second)

    assert await log.load(CONVERSATION) == Context(messages=(*first, *second))


MESSAGES_WITH_META = (
    Message.user(
        [Text("note", meta={"injected_by": "memory"}), Text("hi ✓ \x00 \ud800")],
        meta={"client": "web"},
    ),
    Message.assistant(
        [
            Text("let me look", meta={"provider": {"signature": "abc", "n": [1, 2.5, None]}}),
            ToolCall("call_1", "search", {"q": "tea", "limit": 3}, meta={"cache": True}),
        ]
    ),
    Message.tool(ToolResult("call_1", "found", meta={"source": "db"})),
    Message.tool(ToolResult("call_2", "boom", is_error=True, error_class="tool_error")),
)


async def test_load_keeps_part_and_message_meta(log):
    await log.append(CONVERSATION, "turn-1", MESSAGES_WITH_META)

    loaded = await log.load(CONVERSATION)
    assert loaded.messages == MESSAGES_WITH_META
    assert [m.meta for m in loaded.messages] == [{"client": "web"}, {}, {}, {}]
    assert [[p.meta for p in m.parts] for m in loaded.messages] == [
        [{"injected_by": "memory"}, {}],
        [{"provider": {"signature": "abc", "n": [1, 2.5, None]}}, {"cache": True}],
        [{"source": "db"}],
        [{}],
    ]


async def test_conversations_are_kept_apart(log):
    await log.append("a", "turn-1", exchange("to a", "from a"))
    await log.append("b", "turn-2", exchange("to b", "from b"))

    assert await log.load("a") == Context(messages=exchange("to a", "from a"))
    assert await log.load("b") == Context(messages=exchange("to b", "from b"))


async def test_the_same_turn_ref_in_two_conversations_is_two_commits(log):
    await log.append("a", "turn-1", exchange("to a", "from a"))
    await log.append("b", "turn-1", exchange("to b", "from b"))

    assert await log.load("b") == Context(messages=exchange("to b", "from b"))


async def test_append_keeps_its_own_copy_of_the_messages(log):
    messages = list(exchange("hi", "hello"))

    await log.append(CONVERSATION, "turn-1", messages)
    messages.append(Message.user("added later"))

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


async def test_an_empty_commit_is_recorded_and_adds_no_message(log):
    await log.append(CONVERSATION, "turn-1", ())
    await log.append(CONVERSATION, "turn-2", exchange("hi", "hello"), expected_length=0)

    assert [e.turn_ref for e in await log.entries(CONVERSATION)] == ["turn-1", "turn-2"]
    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


# -- idempotency per turn_ref ---------------------------------------------------------------


async def test_appending_the_same_turn_ref_twice_commits_once(log):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


async def test_a_repeated_turn_ref_keeps_the_first_commit_whatever_the_second_holds(log):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    await log.append(CONVERSATION, "turn-1", exchange("other", "text"))

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


async def test_a_repeated_turn_ref_with_a_stale_expected_length_is_a_no_op_not_a_conflict(log):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)

    # A retry of a commit that already happened: the length it expected is now stale.
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


# -- expected_length ------------------------------------------------------------------------


async def test_append_with_the_right_expected_length_commits(log):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)

    await log.append(CONVERSATION, "turn-2", exchange("again", "sure"), expected_length=2)

    loaded = await log.load(CONVERSATION)
    assert loaded.messages == (*exchange("hi", "hello"), *exchange("again", "sure"))


@pytest.mark.parametrize("expected_length", [0, 1, 3])
async def test_a_wrong_expected_length_raises_log_conflict_naming_the_conversation(
    log, expected_length
):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    with pytest.raises(LogConflict) as excinfo:
        await log.append(
            CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=expected_length
        )

    assert CONVERSATION in str(excinfo.value)
    assert "holds 2 messages" in str(excinfo.value)


async def test_a_log_conflict_carries_the_conversation_and_both_lengths(log):
    """Catches: a conflict whose culprit is only in its message, so a caller that retries or
    reports it has to parse text."""
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    with pytest.raises(LogConflict) as excinfo:
        await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=0)

    error = excinfo.value
    assert (error.conversation_id, error.expected, error.actual) == (CONVERSATION, 0, 2)


async def test_an_expected_length_past_any_database_integer_is_a_conflict(log):
    """Catches: PostgreSQL failing such a commit with a LogError ("bigint out of range")
    where the other logs raise the LogConflict a wrong expected_length gets."""
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    with pytest.raises(LogConflict) as excinfo:
        await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=2**64)

    assert (excinfo.value.expected, excinfo.value.actual) == (2**64, 2)
    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


async def test_a_conflict_writes_nothing(log):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    before = await log.entries(CONVERSATION)

    with pytest.raises(LogConflict):
        await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=0)

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))
    assert await log.entries(CONVERSATION) == before


async def test_a_conflict_on_an_unknown_conversation_writes_nothing(log):
    with pytest.raises(LogConflict):
        await log.append("fresh", "turn-1", exchange("hi", "hello"), expected_length=2)

    assert await log.load("fresh") == Context()
    assert await log.entries("fresh") == ()
    await log.append("fresh", "turn-1", exchange("hi", "hello"), expected_length=0)
    assert await log.load("fresh") == Context(messages=exchange("hi", "hello"))


async def test_a_conflicted_turn_ref_can_commit_later_with_the_right_length(log):
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    with pytest.raises(LogConflict):
        await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=0)

    await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=2)

    loaded = await log.load(CONVERSATION)
    assert loaded.messages == (*exchange("hi", "hello"), *exchange("late", "writer"))


async def test_expected_length_zero_on_an_unknown_conversation_commits(log):
    await log.append("fresh", "turn-1", exchange("hi", "hello"), expected_length=0)

    assert await log.load("fresh") == Context(messages=exchange("hi", "hello"))


# -- entries: the audit beside the messages -------------------------------------------------


async def test_entries_keep_each_commit_with_its_audit_record(log):
    audit = await audit_of("hi")

    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), audit)
    await log.append(CONVERSATION, "turn-1:summary", (Message.user("summary"),))

    assert await log.entries(CONVERSATION) == (
        LogEntry("turn-1", exchange("hi", "hello"), audit),
        LogEntry("turn-1:summary", (Message.user("summary"),), None),
    )


async def test_entries_keep_an_audit_record_with_every_field_filled(log):
    audit = await rich_audit()

    await log.append(CONVERSATION, "turn-1", MESSAGES_WITH_META, audit)

    assert await log.entries(CONVERSATION) == (LogEntry("turn-1", MESSAGES_WITH_META, audit),)


async def test_entries_of_an_unknown_conversation_are_empty(log):
    assert await log.entries("never-seen") == ()


# -- durability: what a new handle on the same storage sees ---------------------------------


async def test_a_reopened_log_holds_exactly_what_was_committed(durable: Backend):
    audit = await rich_audit()
    first = durable.open()
    try:
        await first.append(CONVERSATION, "turn-1", MESSAGES_WITH_META, audit, expected_length=0)
        await first.append(CONVERSATION, "turn-2", exchange("hi", "hello"), expected_length=4)
    finally:
        await close(first)

    second = durable.open()
    try:
        loaded = await second.load(CONVERSATION)
        entries = await second.entries(CONVERSATION)
        with pytest.raises(LogConflict):
            await second.append(CONVERSATION, "turn-3", exchange("x", "y"), expected_length=4)
    finally:
        await close(second)

    assert loaded == Context(messages=(*MESSAGES_WITH_META, *exchange("hi", "hello")))
    assert entries == (
        LogEntry("turn-1", MESSAGES_WITH_META, audit),
        LogEntry("turn-2", exchange("hi", "hello"), None),
    )


async def test_two_handles_on_one_storage_see_each_others_commits(durable: Backend):
    a, b = durable.open(), durable.open()
    try:
        await a.append(CONVERSATION, "turn-1", exchange("from a", "ok"), expected_length=0)
        seen_by_b = await b.load(CONVERSATION)
        with pytest.raises(LogConflict):
            await b.append(CONVERSATION, "turn-2", exchange("from b", "ok"), expected_length=0)
        await b.append(CONVERSATION, "turn-1", exchange("from a", "ok"), expected_length=0)
    finally:
        await close(a)
        await close(b)

    assert seen_by_b == Context(messages=exchange("from a", "ok"))


async def test_a_closed_durable_log_refuses_calls_naming_itself(durable: Backend):
    log = durable.open()
    await log.load(CONVERSATION)
    await close(log)

    with pytest.raises(RuntimeError, match="closed") as excinfo:
        await log.load(CONVERSATION)

    assert type(log).__name__ in str(excinfo.value)


async def test_a_durable_log_is_an_async_context_manager_that_closes(durable: Backend):
    async with durable.open() as log:  # type: ignore[attr-defined]
        await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    with pytest.raises(RuntimeError, match="closed"):
        await log.entries(CONVERSATION)


# -- large turns ----------------------------------------------------------------------------


def one_connection(durable: Backend) -> Log:
    """A log of `durable`'s kind that makes one database call at a time, as SQLite does."""
    from pipeline.logs import PostgresLog, SQLiteLog

    if durable.kind == "sqlite":
        return SQLiteLog(durable.where)
    return PostgresLog(durable.where, max_connections=1)


GATE_SECONDS = 30.0


class Gate(dict[str, Any]):
    """A message's meta whose reading in a thread other than the loop's waits until the
    test opens it: a commit checked and encoded in a worker thread stays there, however
    fast that thread runs, while one encoded on the loop's thread is not held."""

    def __init__(self) -> None:
        super().__init__(gate="held")
        self.loop_thread = threading.get_ident()
        self.opened = threading.Event()

    def __iter__(self) -> Iterator[str]:
        # Opened once the short commit returned: a commit that waits for this one never is,
        # and then the test fails here rather than hang until the run's own timeout.
        if threading.get_ident() != self.loop_thread and not self.opened.wait(GATE_SECONDS):
            raise AssertionError(
                f"the gate was not opened within {GATE_SECONDS:g} s: the short commit did not"
                " return while the heavy one was held"
            )
        return super().__iter__()


async def committed_behind(durable: Backend, heavy: tuple[Message, ...]) -> list[str]:
    """Commit `heavy` to conversation "heavy" and, once that is under way, a short turn to
    "small": the conversations in the order their commits returned ("heavy" is checked to
    hold `heavy` as it was given).

    The heavy commit carries a `Gate`, opened once the short one has returned: so the order
    does not hang on how fast a loaded machine runs the encoding thread, and a heavy commit
    encoded on the loop's thread still holds up the short one (it had taken the write lock
    before the short one started)."""
    trace: list[str] = []
    gate = Gate()
    gated = (attrs.evolve(heavy[0], meta=gate), *heavy[1:])

    async def commit(conversation_id: str, messages: tuple[Message, ...]) -> None:
        await log.append(conversation_id, "turn-1", messages, expected_length=0)
        trace.append(conversation_id)

    async with one_connection(durable) as log:  # type: ignore[attr-defined]
        async with anyio.create_task_group() as nursery:
            nursery.start_soon(commit, "heavy", gated)
            await anyio.wait_all_tasks_blocked()  # the heavy commit is under way
            try:
                await commit("small", exchange("hi", "hello"))
            finally:
                gate.opened.set()
        assert await log.load("heavy") == Context(messages=gated)
        return trace


@pytest.mark.parametrize("kind", ["ascii", "not ascii"])
async def test_a_large_turn_being_encoded_holds_up_neither_the_loop_nor_other_commits(
    durable: Backend, kind: str
):
    """Bug caught: a large turn's commit encoded its JSON on the event loop's thread (most
    of a second for 100 MB), so the other commits, turns and requests of the process
    stalled behind it, a commit of a short turn to another conversation included. Text
    not all ASCII goes to the driver as UTF-8 bytes, and is stored as the same text."""
    large = exchange("summarize it", "x" * (32 << 20) if kind == "ascii" else "é" * (32 << 20))
    assert await committed_behind(durable, large) == ["small", "heavy"]


async def test_a_turn_of_many_empty_parts_is_encoded_away_from_the_loop_too(durable: Backend):
    """Bug caught: a commit was weighed by its characters alone, so one of 150,000 empty
    parts (little text, a quarter of a second to check and encode) was encoded on the event
    loop's thread, and a short turn's commit made meanwhile waited behind it."""
    many = (Message.user("go"), Message.assistant([Text("") for _ in range(150_000)]))
    assert await committed_behind(durable, many) == ["small", "heavy"]


async def test_a_large_turn_round_trips_whatever_its_text_holds(durable: Backend):
    """Guards the encoding of a large turn, a slice at a time: escapes (quotes, control
    characters), text outside the BMP and a lone surrogate (which turns the whole commit to
    ASCII escapes) read back as written, split wherever the slices fall."""
    text = "".join(random.Random(7).choices('ab"\\\n\x00é中😀\ud800', k=300_000))
    messages = (Message.user(text), Message.assistant([Text("ok", meta={"echo": text})]))
    async with durable.open() as log:  # type: ignore[attr-defined]
        await log.append(CONVERSATION, "turn-1", messages)
        assert await log.load(CONVERSATION) == Context(messages=messages)


async def test_a_large_turn_of_many_mid_sized_strings_round_trips_in_order(durable: Backend):
    """Guards the strings a large commit's encoding sets aside from json's own output (those
    over a thousand characters, each whole or a slice at a time) and puts back in order:
    tool results and meta of every size around the limits read back as written."""
    rng = random.Random(11)
    sizes = [1023, 1024, 1025, 4000, 32767, 32768, 32769, 70000] * 4
    texts = ["".join(rng.choices('ab"\\\n\x00é中😀', k=size)) for size in sizes]
    rng.shuffle(texts)
    calls = [ToolCall(f"c{i}", "fetch", {"url": text[:2000]}) for i, text in enumerate(texts)]
    messages = (
        Message.user("fetch them"),
        Message.assistant(calls),
        *(Message.tool(ToolResult(f"c{i}", text)) for i, text in enumerate(texts)),
        Message.assistant([Text(texts[0], meta={"pages": texts[:5], texts[1][:1500]: 1})]),
    )
    async with durable.open() as log:  # type: ignore[attr-defined]
        await log.append(CONVERSATION, "turn-1", messages)
        assert await log.load(CONVERSATION) == Context(messages=messages)


async def test_a_large_turn_with_a_value_json_cannot_hold_is_refused_like_a_small_one(
    durable: Backend,
):
    """Guards the check of a large turn, made away from the event loop: the same LogError,
    naming the turn and the value's path, and nothing written."""
    from pipeline import LogError

    messages = (Message.user("x" * 300_000), Message.assistant([Text("ok", meta={"s": {1}})]))
    async with durable.open() as log:  # type: ignore[attr-defined]
        with pytest.raises(LogError, match="JSON values only") as caught:
            await log.append(CONVERSATION, "turn-1", messages)
        assert await log.entries(CONVERSATION) == ()
    assert "'turn-1'" in str(caught.value)
    assert "messages[1].parts[0].meta" in str(caught.value)


# -- cancellation ---------------------------------------------------------------------------


async def test_an_append_cancelled_before_it_starts_commits_nothing(log):
    with anyio.CancelScope() as scope:
        scope.cancel()
        await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    assert scope.cancelled_caught
    assert await log.entries(CONVERSATION) == ()


async def test_an_append_cancelled_while_it_runs_completes_and_says_so(log):
    # A worker thread in the middle of a transaction is not abandoned: the commit finishes,
    # append returns, and the cancellation arrives at the caller's next checkpoint. So
    # "append returned" and "the turn is in the log" always agree.
    returned = []

    async def commit():
        await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)
        returned.append("turn-1")
        await anyio.sleep_forever()

    async with anyio.create_task_group() as nursery:
        nursery.start_soon(commit)
        await anyio.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()

    assert returned == ["turn-1"]
    assert [e.turn_ref for e in await log.entries(CONVERSATION)] == ["turn-1"]


async def test_a_session_cancelled_during_its_commit_stays_in_step_with_the_log(log):
    pipe = Pipeline(model=FunctionModel(lambda request: f"re: {request.messages[-1].text}"))

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        async with anyio.create_task_group() as nursery:
            nursery.start_soon(session.send, "first")
            await anyio.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        # Had the session missed its own commit, this would be a LogConflict.
        await session.send("second")

    assert await log.load(CONVERSATION) == Context(
        messages=(*exchange("first", "re: first"), *exchange("second", "re: second"))
    )


# -- bad arguments --------------------------------------------------------------------------


BAD_IDS = [
    pytest.param("", id="empty"),
    pytest.param(None, id="none"),
    pytest.param(7, id="int"),
    # Catches: a NUL stored by SQLite and the memory log but failing PostgreSQL's commit
    # with a DataError that named no argument, so the logs disagreed.
    pytest.param("conv\x00", id="nul"),
    # Catches: a lone surrogate (a "\ud800" escape decoded from JSON) taken by the memory
    # log but failing SQLite and PostgreSQL with a bare UnicodeEncodeError naming no argument.
    pytest.param("conv\ud800", id="lone-surrogate"),
]
TOO_LONG_IDS = [
    # Catches: an id too long for PostgreSQL's index (about 2.7 kB) taken by the memory log
    # and SQLite but failing PostgreSQL's commit with a LogError (ProgramLimitExceeded).
    pytest.param("c" * 1025, id="too-long"),
    pytest.param("\U0001f600" * 257, id="too-long-in-bytes"),
]


@pytest.mark.parametrize("conversation_id", BAD_IDS)
async def test_load_rejects_a_bad_conversation_id(log, conversation_id):
    with pytest.raises(ValueError, match="conversation id"):
        await log.load(conversation_id)


@pytest.mark.parametrize("conversation_id", BAD_IDS + TOO_LONG_IDS)
async def test_append_rejects_a_bad_conversation_id(log, conversation_id):
    with pytest.raises(ValueError, match="conversation id"):
        await log.append(conversation_id, "turn-1", exchange("hi", "hello"))


@pytest.mark.parametrize("conversation_id", BAD_IDS)
async def test_entries_rejects_a_bad_conversation_id(log, conversation_id):
    with pytest.raises(ValueError, match="conversation id"):
        await log.entries(conversation_id)


@pytest.mark.parametrize("conversation_id", TOO_LONG_IDS)
async def test_an_id_too_long_to_store_is_still_looked_up(log, conversation_id):
    """Catches: load and entries refusing an id over MAX_ID_BYTES, which a log written
    before the limit may hold (SQLite stored any length): its conversations became
    unreadable. A log that holds none under it finds nothing, as for any unknown id."""
    assert (await log.load(conversation_id), await log.entries(conversation_id)) == (
        Context(),
        (),
    )


@pytest.mark.parametrize(
    "turn_ref",
    [
        "",
        None,
        3,
        "turn\x00",
        # Catches: a lone surrogate stored by the memory log but failing the durable logs'
        # commit with a bare UnicodeEncodeError.
        pytest.param("turn\udc80", id="lone-surrogate"),
        # Catches: a turn_ref too long for PostgreSQL's index, taken by the other logs.
        pytest.param("t" * 1025, id="too-long"),
    ],
)
async def test_append_rejects_a_bad_turn_ref(log, turn_ref):
    with pytest.raises(ValueError, match="turn_ref"):
        await log.append(CONVERSATION, turn_ref, exchange("hi", "hello"))


async def test_a_conversation_id_and_turn_ref_at_the_length_limit_are_stored(log):
    """Catches: a length limit that PostgreSQL could not index, an id and a turn_ref of the
    largest length every log takes together (random, so not compressed) failing its commit."""
    rng = random.Random(7)
    conversation_id = "".join(rng.choice(string.ascii_letters) for _ in range(1024))
    turn_ref = "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(256))

    await log.append(conversation_id, turn_ref, exchange("hi", "hello"))

    assert [e.turn_ref for e in await log.entries(conversation_id)] == [turn_ref]


async def test_append_rejects_something_that_is_not_a_message_naming_its_position(log):
    with pytest.raises(TypeError, match=r"messages\[1\] is str") as excinfo:
        await log.append(CONVERSATION, "turn-1", [Message.user("hi"), "hello"])

    assert "Message.user" in str(excinfo.value)
    assert await log.entries(CONVERSATION) == ()


@pytest.mark.parametrize(
    ("messages", "said"),
    [
        pytest.param(Context(messages=exchange("hi", "hello")), "is a Context", id="context"),
        pytest.param(Message.user("hi"), "is one Message", id="message"),
        pytest.param(5, "sequence of turns.Message, got int", id="int"),
        pytest.param("hello", "messages is str 'hello'", id="str"),
        pytest.param("", "messages is str ''", id="empty-str"),
        pytest.param(b"hello", "messages is bytes", id="bytes"),
    ],
)
async def test_append_says_what_its_messages_were_instead_of_a_sequence(log, messages, said):
    """Catches: a Context, a lone Message or a number passed as `messages` failing with
    Python's own "object is not iterable", which named neither the call nor the fix; and
    text, taken as its characters ("messages[0] is str 'h'"), an empty one committing a
    turn of no messages without a word."""
    with pytest.raises(TypeError, match=said) as excinfo:
        await log.append(CONVERSATION, "turn-1", messages)

    assert "append('turn-1')" in str(excinfo.value)
    assert await log.entries(CONVERSATION) == ()


async def test_append_rejects_an_audit_that_is_not_an_audit_record(log):
    with pytest.raises(TypeError, match="AuditRecord"):
        await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), {"outcome": "x"})


@pytest.mark.parametrize("expected_length", [-1, 1.0, True, "2"])
async def test_append_rejects_a_bad_expected_length(log, expected_length):
    with pytest.raises(ValueError, match="expected_length"):
        await log.append(
            CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=expected_length
        )


# -- the JSON shape of an entry -------------------------------------------------------------


async def test_an_entry_round_trips_through_its_dict():
    entry = LogEntry("turn-1", MESSAGES_WITH_META, await rich_audit())

    assert entry_from_dict(entry_to_dict(entry)) == entry


async def test_an_entry_dict_names_its_fields_and_the_hook_records_fields():
    data = entry_to_dict(LogEntry("turn-1", exchange("hi", "hello"), await rich_audit()))

    assert sorted(data) == ["audit", "committed_at", "messages", "turn_ref"]
    assert data["messages"][0] == {
        "role": "user",
        "parts": [{"type": "text", "text": "hi", "meta": {}}],
        "meta": {},
    }
    assert sorted(data["audit"]["hooks"][0]) == [
        "detail",
        "elapsed",
        "hook",
        "position",
        "shadow",
        "stage",
        "verdict",
    ]
    assert data["audit"]["halt"]["reply"]["role"] == "assistant"


def test_an_entry_with_a_text_halt_reply_round_trips():
    audit = AuditRecord("t", "halted", halt=halt("no", reply="Sorry."))

    assert entry_from_dict(entry_to_dict(LogEntry("t", (), audit))).audit == audit


@pytest.mark.parametrize(
    ("data", "culprit"),
    [
        ({"turn_ref": "t", "messages": []}, "keys"),
        ({"turn_ref": "t", "messages": [], "audit": None, "extra": 1}, "keys"),
        ({"turn_ref": 1, "messages": [], "audit": None}, "turn_ref"),
        ({"turn_ref": "t", "messages": {}, "audit": None}, "list"),
        (
            {
                "turn_ref": "t",
                "messages": [{"role": "user", "parts": [{"type": "image"}]}],
                "audit": None,
            },
            "image",
        ),
        (
            {
                "turn_ref": "t",
                "messages": [],
                "audit": {"turn_ref": "t", "outcome": "completed", "x": 1},
            },
            "x",
        ),
        (
            {
                "turn_ref": "t",
                "messages": [],
                "audit": {"turn_ref": "t", "outcome": "halted", "halt": {"reason": "r"}},
            },
            "halt",
        ),
        (
            {
                "turn_ref": "t",
                "messages": [],
                "audit": {"turn_ref": "t", "outcome": "completed", "hooks": [{"hook": "h"}]},
            },
            r"hooks\[0\]",
        ),
    ],
)
def test_a_malformed_entry_dict_is_a_value_error_naming_the_culprit(data, culprit):
    with pytest.raises(ValueError, match=culprit):
        entry_from_dict(data)


# -- the law: the log behaves like a list of commits per conversation -----------------------


appends = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # conversation
        st.sampled_from(["t1", "t2", "t3", "t4", "t5"]),  # turn_ref: repeats are likely
        st.integers(min_value=0, max_value=3),  # how many messages
        st.one_of(st.none(), st.integers(min_value=0, max_value=8)),  # expected_length
    ),
    max_size=25,
)

# Examples against a database are slower; they share the test's storage, each on
# conversations of its own.
EXAMPLES = {"memory": 200, "sqlite": 60, "postgres": 60}


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_any_sequence_of_appends_loads_like_a_simple_model(backend: Backend, loop: str):
    @settings(
        max_examples=EXAMPLES[backend.kind],
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(appends)
    def law(steps):
        anyio.run(check, steps, backend=loop)

    async def check(steps):
        prefix = uuid.uuid4().hex
        log = backend.open()
        try:
            await replay(log, prefix, steps)
        finally:
            await close(log)

    law()


async def replay(log: Log, prefix: str, steps) -> None:
    model: dict[str, list[tuple[str, tuple[Message, ...]]]] = {"a": [], "b": []}
    for index, (conversation, turn_ref, count, expected) in enumerate(steps):
        messages = tuple(Message.user(f"{turn_ref} #{index}.{n}") for n in range(count))
        commits = model[conversation]
        length = sum(len(m) for _, m in commits)
        if any(ref == turn_ref for ref, _ in commits):
            conflict = False  # already committed: a no-op
        elif expected is not None and expected != length:
            conflict = True
        else:
            conflict = False
            commits.append((turn_ref, messages))
        target = f"{prefix}-{conversation}"
        if conflict:
            with pytest.raises(LogConflict):
                await log.append(target, turn_ref, messages, expected_length=expected)
        else:
            await log.append(target, turn_ref, messages, expected_length=expected)
    for conversation, commits in model.items():
        target = f"{prefix}-{conversation}"
        loaded = await log.load(target)
        assert loaded == Context(messages=tuple(m for _, ms in commits for m in ms))
        entries = await log.entries(target)
        assert [(e.turn_ref, e.messages) for e in entries] == commits


def test_memory_log_repr_counts_conversations():
    assert repr(MemoryLog()) == "MemoryLog(0 conversations)"


def nested(depth: int) -> dict:
    """A JSON object `depth` levels deep: {"a": {"a": ... {} ...}}."""
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


async def test_a_turn_with_arguments_too_deep_to_store_is_refused_alike_by_every_log(log):
    """Catches: SQLiteLog and PostgresLog raising a raw RecursionError out of session.send
    for tool arguments 400+ levels deep while MemoryLog stored them."""
    from pipeline import LogError, tool

    @tool
    def lookup(query: dict) -> str:
        """Look something up."""
        return "found"

    model = ScriptedModel([[ToolCall("1", "lookup", {"query": nested(450)})], "done"])
    pipe = Pipeline(model=model, tools=[lookup])
    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        with pytest.raises(LogError) as caught:
            await session.send("look it up")
    message = str(caught.value)
    assert repr(CONVERSATION) in message
    assert "nested more than 100 levels deep" in message
    assert "messages[1].parts[0].arguments" in message
    assert (await log.load(CONVERSATION)).messages == ()


async def test_a_value_as_deep_as_a_log_allows_round_trips(log):
    """Catches: a limit set above what the codec can read back (a commit that is written
    and then cannot be loaded)."""
    from pipeline.logs import MAX_DEPTH

    messages = (
        Message.user("deep"),
        Message.assistant([ToolCall("1", "t", nested(MAX_DEPTH))], meta={"m": nested(50)}),
    )
    await log.append(CONVERSATION, "t-1", messages)
    assert (await log.load(CONVERSATION)).messages == messages
    assert (await log.entries(CONVERSATION))[0].messages == messages


@pytest.mark.parametrize(
    ("message", "path"),
    [
        (Message.user([Text("hi", meta={"ranks": {1: "first"}})]), "messages[0].parts[0].meta"),
        (Message.assistant([ToolCall("1", "t", {"by": [{True: 1}]})]), "parts[0].arguments"),
    ],
    ids=["meta", "arguments"],
)
async def test_a_key_json_would_turn_into_text_is_refused_alike_by_every_log(
    log, message: Message, path: str
):
    """Catches: the durable logs writing a non-string key as text, so that the commit read
    back as another value ({1: ...} as {"1": ...}) instead of being refused as not JSON; and
    the memory log keeping what the others refuse, so a test against it passed where
    production failed."""
    from pipeline import LogError

    with pytest.raises(LogError, match="JSON values only") as caught:
        await log.append(CONVERSATION, "t-1", (message,))
    loaded = await log.load(CONVERSATION)
    assert path in str(caught.value)
    assert "'t-1'" in str(caught.value)
    assert loaded == Context()


@pytest.mark.parametrize(
    "meta",
    [
        pytest.param({"when": datetime.date(2024, 1, 1)}, id="date"),
        pytest.param({"ids": [{1, 2}]}, id="set"),
        pytest.param({"score": float("nan")}, id="nan"),
        pytest.param({"blob": b"raw"}, id="bytes"),
    ],
)
async def test_a_value_json_cannot_hold_is_refused_alike_by_every_log(log, meta):
    """Catches: the memory log keeping a date, a set, NaN or bytes that every durable log
    refuses, so a test run against it passed where production failed."""
    from pipeline import LogError

    with pytest.raises(LogError, match="JSON values only") as caught:
        await log.append(CONVERSATION, "t-1", (Message.user([Text("hi", meta=meta)]),))

    assert "messages[0].parts[0].meta" in str(caught.value)
    assert await log.entries(CONVERSATION) == ()


async def test_a_str_enum_key_is_a_string_key_for_every_log(log):
    """Guards the check for keys that are not strings: a `StrEnum` key is a string, which
    JSON writes as its value and reads back equal, so no log refuses it."""
    import enum

    class Kind(enum.StrEnum):
        NOTE = "note"

    message = Message.user([Text("hi", meta={Kind.NOTE: "x"})])
    await log.append(CONVERSATION, "t-1", (message,))
    (stored,) = (await log.load(CONVERSATION)).messages
    assert stored.parts[0].meta == {"note": "x"}


async def test_conversations_lists_each_with_its_turns_messages_and_last_commit(log):
    """Catches: no way to list a log's conversations, and entries without commit times."""
    await log.append("a", "t-1", exchange("q", "a"))
    await log.append("a", "t-2", exchange("q", "a"))
    await anyio.sleep(0.01)
    await log.append("b", "t-1", (Message.user("q"),))

    listed = await log.conversations()

    assert [(c.conversation_id, c.turns, c.messages) for c in listed] == [("b", 1, 1), ("a", 2, 4)]
    entries = await log.entries("a")
    assert entries[0].committed_at is not None
    assert entries[0].committed_at <= entries[1].committed_at == listed[1].last_committed_at
    assert listed[1].last_committed_at < listed[0].last_committed_at


def audit_records() -> st.SearchStrategy[AuditRecord]:
    """Audit records with every field drawn, the halt's reply as text, a message or none."""
    from pipeline import AttemptRecord, HookRecord, Rejection, ToolRecord
    from pipeline._signals import Halt

    s = turn_strategies

    hook_records = st.builds(
        HookRecord,
        s.names,
        st.sampled_from(["pre", "post", "background"]),
        s.texts,
        st.floats(min_value=0, max_value=1e3),
        st.sampled_from(["cont", "halt", "raised"]),
        st.booleans(),
        st.none() | s.texts,
    )
    replies = st.none() | s.texts | s.messages(roles=("assistant",))
    return st.builds(
        AuditRecord,
        s.texts,
        st.sampled_from(["completed", "halted", "exhausted"]),
        injections=st.lists(s.injections(), max_size=3).map(tuple),
        hooks=st.lists(hook_records, max_size=3).map(tuple),
        attempts=st.lists(
            st.builds(
                AttemptRecord,
                st.integers(1, 5),
                st.integers(1, 5),
                s.texts,
                st.none() | s.names,
                s.usages(),
            ),
            max_size=2,
        ).map(tuple),
        halt=st.none() | st.builds(Halt, s.texts, replies, st.none() | s.names),
        rejections=st.lists(
            st.builds(Rejection, st.integers(1, 5), s.names, s.texts, s.texts), max_size=2
        ).map(tuple),
        tools=st.lists(
            st.builds(
                ToolRecord,
                st.integers(1, 5),
                st.integers(1, 5),
                s.tool_calls(),
                s.tool_calls(),
                s.tool_results(),
            ),
            max_size=2,
        ).map(tuple),
    )


@given(audit=audit_records())
def test_an_audit_dict_is_what_the_generated_converter_builds(audit):
    """Catches: the hand-built audit dict (the commit path's) drifting from the converter's
    generated hooks — a field added to a record and not written, a key out of order, a tool
    record's call written with a part's tag."""
    from turns import serde

    expected = serde._make_converter().unstructure(audit)
    expected["hooks"] = [record._asdict() for record in audit.hooks]
    expected["halt"] = (
        None
        if audit.halt is None
        else {
            "reason": audit.halt.reason,
            "reply": serde.to_dict(audit.halt.reply)
            if isinstance(audit.halt.reply, Message)
            else audit.halt.reply,
            "hook": audit.halt.hook,
        }
    )

    assert json.dumps(entry_to_dict(LogEntry("t", (), audit))["audit"]) == json.dumps(expected)
    assert entry_from_dict(entry_to_dict(LogEntry("t", (), audit))).audit == audit


@given(
    audit=st.none() | audit_records(),
    messages=st.lists(turn_strategies.messages(), max_size=3),
)
def test_the_depth_check_looks_at_every_value_it_can_name(audit, messages):
    """Catches: the depth check's fast pass (values without their paths) skipping a place
    the path-naming pass covers, so a value too deep to read back there is stored."""
    from pipeline.logs import _protocol

    named = [value for _, value in _protocol._values(tuple(messages), audit)]

    assert list(_protocol._opaque(tuple(messages), audit)) == named
