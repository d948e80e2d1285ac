"""SQLiteLog: what only SQLite shows (WAL, the schema and its migrations, the error seam).

What every log does is in test_logs.py, which runs against SQLiteLog too.
"""

import contextlib
import datetime
import os
import re
import sqlite3
import threading
import time
from pathlib import Path

import anyio
import pytest
import trio

from pipeline import LogConflict, LogError
from pipeline.logs import MAX_ID_BYTES, SQLiteLog, _sqlite
from turns import Context, Message, Text

from ..logs import read_only_files


def exchange(question: str, answer: str) -> tuple[Message, ...]:
    return (Message.user(question), Message.assistant(answer))


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


async def committed(path: Path, *turns: str) -> None:
    async with SQLiteLog(path) as log:
        for turn in turns:
            await log.append("c", turn, exchange(f"q {turn}", f"a {turn}"))


# -- the file -------------------------------------------------------------------------------


def holding_the_write_lock(path: Path) -> sqlite3.Connection:
    """A connection in the default journal mode holding `path`'s write lock, as another
    process creating the same new file holds it."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other VALUES (1)")
    return holder


async def test_opening_a_new_file_waits_for_another_connections_write_lock(tmp_path):
    """Catches: `PRAGMA journal_mode=WAL` failing at once with "database is locked" while
    another connection holds the write lock (SQLite skips its busy handler there), so a
    worker process opening a log another one was creating failed instead of waiting."""
    path = tmp_path / "log.db"
    holder = holding_the_write_lock(path)
    release = threading.Timer(0.3, holder.execute, ("COMMIT",))
    release.start()
    try:
        started = time.monotonic()
        async with SQLiteLog(path, timeout=10) as log:
            await log.append("c", "t1", exchange("q", "a"))
            stored = await log.load("c")
        assert time.monotonic() - started >= 0.25
        assert stored.messages == exchange("q", "a")
    finally:
        release.join()
        holder.close()


async def test_opening_gives_up_on_a_write_lock_held_past_the_timeout(tmp_path):
    """Catches: the wait for the write lock while entering WAL mode retrying forever, or
    giving up before the log's `timeout=`, instead of failing with a LogError after it."""
    path = tmp_path / "log.db"
    holder = holding_the_write_lock(path)
    try:
        started = time.monotonic()
        with pytest.raises(LogError, match=r"more than 0\.3 s"):
            async with SQLiteLog(path, timeout=0.3):
                pass
        assert 0.25 <= time.monotonic() - started < 5
    finally:
        holder.close()


async def test_the_database_is_in_wal_mode_at_the_latest_schema_version(tmp_path):
    path = tmp_path / "log.db"
    await committed(path, "t1")

    with raw(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT version FROM turnplug_schema").fetchall() == [
            (len(_sqlite.MIGRATIONS),)
        ]
        rows = db.execute(
            "SELECT conversation_id, position, turn_ref, message_count FROM turnplug_turns"
        ).fetchall()
    assert rows == [("c", 0, "t1", 2)]


async def test_the_tables_live_beside_an_applications_own(tmp_path):
    path = tmp_path / "app.db"
    with raw(path) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('ada')")

    await committed(path, "t1")

    with raw(path) as db:
        assert db.execute("SELECT name FROM users").fetchall() == [("ada",)]


async def test_an_in_memory_log_works_for_the_life_of_the_log():
    async with SQLiteLog(":memory:") as log:
        await log.append("c", "t1", exchange("hi", "hello"), expected_length=0)
        assert await log.load("c") == Context(messages=exchange("hi", "hello"))


def test_repr_shows_the_path():
    assert repr(SQLiteLog("chat.db")) == "SQLiteLog('chat.db')"


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((3,), {}, TypeError),
        (("",), {}, TypeError),
        (("x.db",), {"timeout": 0}, ValueError),
        (("x.db",), {"timeout": True}, ValueError),
        (("x.db",), {"read_only": "yes"}, TypeError),
        ((":memory:",), {"read_only": True}, ValueError),
        # Catches: a path holding a NUL or a lone surrogate taken when the log was built and
        # failing its first call with a bare ValueError or UnicodeEncodeError naming no log.
        pytest.param(("chat\x00.db",), {}, ValueError, id="nul"),
        pytest.param(("chat\ud800.db",), {}, ValueError, id="lone-surrogate"),
    ],
)
def test_bad_arguments_fail_when_the_log_is_built(args, kwargs, error):
    with pytest.raises(error, match="SQLiteLog"):
        SQLiteLog(*args, **kwargs)


# -- migrations -----------------------------------------------------------------------------

EXTRA_MIGRATION = ("CREATE INDEX turnplug_turns_by_time ON turnplug_turns (committed_at)",)


async def test_an_older_database_is_migrated_forward_keeping_its_turns(tmp_path, monkeypatch):
    path = tmp_path / "log.db"
    await committed(path, "t1")
    monkeypatch.setattr(_sqlite, "MIGRATIONS", (*_sqlite.MIGRATIONS, EXTRA_MIGRATION))

    async with SQLiteLog(path) as log:
        loaded = await log.load("c")

    with raw(path) as db:
        version = db.execute("SELECT version FROM turnplug_schema").fetchall()
        index = db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'turnplug_turns_by_time'"
        ).fetchall()
    assert (version, index) == ([(2,)], [("turnplug_turns_by_time",)])
    assert loaded == Context(messages=exchange("q t1", "a t1"))


async def test_a_failing_migration_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "log.db"
    await committed(path, "t1")
    broken = ("CREATE TABLE turnplug_extra (x TEXT)", "CREATE INDEX nope ON missing (x)")
    monkeypatch.setattr(_sqlite, "MIGRATIONS", (*_sqlite.MIGRATIONS, broken))

    with pytest.raises(LogError, match="missing"):
        async with SQLiteLog(path):
            pass

    with raw(path) as db:
        assert db.execute("SELECT version FROM turnplug_schema").fetchall() == [(1,)]
        assert (
            db.execute("SELECT name FROM sqlite_master WHERE name = 'turnplug_extra'").fetchall()
            == []
        )


async def test_a_database_from_a_newer_turnplug_is_refused_with_both_versions(tmp_path):
    path = tmp_path / "log.db"
    await committed(path, "t1")
    with raw(path) as db:
        db.execute("UPDATE turnplug_schema SET version = 99")

    with pytest.raises(LogError) as excinfo:
        async with SQLiteLog(path):
            pass

    message = str(excinfo.value)
    assert "version 99" in message
    assert f"({len(_sqlite.MIGRATIONS)})" in message
    assert "upgrade turnplug" in message
    assert str(path) in message


# -- the error seam -------------------------------------------------------------------------


async def test_a_missing_directory_is_a_log_error_naming_the_path(tmp_path):
    path = tmp_path / "no-such-dir" / "log.db"
    log = SQLiteLog(path)

    with pytest.raises(LogError, match="directory exists") as excinfo:
        await log.load("c")

    assert str(path) in str(excinfo.value)
    assert excinfo.value.log == repr(log)
    assert isinstance(excinfo.value.__cause__, sqlite3.Error)
    await log.aclose()


async def test_a_file_that_is_not_a_database_is_a_log_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes, " * 100)

    with pytest.raises(LogError, match="not an SQLite database") as excinfo:
        async with SQLiteLog(path):
            pass

    assert str(path) in str(excinfo.value)
    assert path.read_text() == "just some notes, " * 100


async def test_a_write_lock_held_too_long_is_a_log_error_and_commits_nothing(tmp_path):
    path = tmp_path / "log.db"
    await committed(path, "t1")
    holder = raw(path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        async with SQLiteLog(path, timeout=0.05) as log:
            with pytest.raises(LogError, match="write lock") as excinfo:
                await log.append("c", "t2", exchange("q", "a"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    assert "timeout=" in str(excinfo.value)
    async with SQLiteLog(path) as log:
        assert [e.turn_ref for e in await log.entries("c")] == ["t1"]


async def test_a_commit_waiting_for_the_lock_does_not_block_the_event_loop(tmp_path):
    # The commit waits in a worker thread for another connection's write lock. Only if the
    # event loop keeps running can this task release that lock; otherwise the commit would
    # fail after its timeout.
    path = tmp_path / "log.db"
    await committed(path, "t1")
    holder = raw(path)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO turnplug_schema VALUES (1)")  # some write of its own
    async with SQLiteLog(path, timeout=30) as log, anyio.create_task_group() as nursery:
        nursery.start_soon(log.append, "c", "t2", exchange("q", "a"), None)
        await anyio.wait_all_tasks_blocked()
        holder.execute("ROLLBACK")
        holder.close()

    async with SQLiteLog(path) as log:
        assert [e.turn_ref for e in await log.entries("c")] == ["t1", "t2"]


async def test_a_stored_row_that_cannot_be_read_is_a_log_error_naming_the_turn(tmp_path):
    path = tmp_path / "log.db"
    await committed(path, "t1", "t2")
    with raw(path) as db:
        db.execute("UPDATE turnplug_turns SET messages = '[{\"role\": 1}]' WHERE turn_ref = 't2'")

    async with SQLiteLog(path) as log:
        with pytest.raises(LogError) as excinfo:
            await log.load("c")

    message = str(excinfo.value)
    assert "'t2'" in message
    assert "'c'" in message


async def test_a_conversation_stored_under_an_id_over_the_limit_can_still_be_read(tmp_path):
    """Catches: a conversation that a log written before MAX_ID_BYTES was enforced holds
    under a longer id (SQLite took any length) refused by load and entries with a ValueError,
    so neither the conversation nor ``turnplug log`` could read it any more."""
    path = tmp_path / "log.db"
    await committed(path, "t1")
    long_id = "c" * (MAX_ID_BYTES + 1)
    with raw(path) as db:  # as an earlier version stored it
        for table in ("turnplug_turns", "turnplug_conversations"):
            db.execute(f"UPDATE {table} SET conversation_id = ?", (long_id,))

    async with SQLiteLog(path) as log:
        [info] = await log.conversations()
        context = await log.load(info.conversation_id)
        entries = await log.entries(info.conversation_id)

    assert context == Context(messages=exchange("q t1", "a t1"))
    assert [entry.turn_ref for entry in entries] == ["t1"]


@pytest.mark.parametrize(
    "meta",
    [
        pytest.param({"when": datetime.date(2024, 1, 1)}, id="date"),
        pytest.param({"ids": {1, 2}}, id="set"),
        pytest.param({"score": float("nan")}, id="nan"),
    ],
)
async def test_meta_that_json_cannot_hold_is_a_log_error_and_commits_nothing(tmp_path, meta):
    async with SQLiteLog(tmp_path / "log.db") as log:
        with pytest.raises(LogError, match="JSON values only") as excinfo:
            await log.append("c", "t1", [Message.user([Text("hi", meta=meta)])])
        assert await log.entries("c") == ()

    assert "'t1'" in str(excinfo.value)


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16le"])
async def test_a_large_turn_is_stored_as_text_whatever_the_databases_encoding(tmp_path, encoding):
    """Guards a large commit's JSON, handed to SQLite as UTF-8 bytes: it is stored as TEXT,
    as a small one is (a reader's json_extract or LIKE works on it), also in a file made
    with another encoding before turnplug's tables, where SQLite's documentation has CAST
    read the bytes in that encoding."""
    path = tmp_path / "log.db"
    with raw(path) as connection:
        connection.execute(f"PRAGMA encoding = '{encoding}'")
        connection.execute("CREATE TABLE other (x)")
    large = exchange("é" * 200_000, "中😀" * 100_000)
    async with SQLiteLog(path) as log:
        await log.append("c", "t1", large)
        await log.append("c", "t2", exchange("q", "a"))
        assert await log.load("c") == Context(messages=(*large, *exchange("q", "a")))

    with raw(path) as connection:
        kinds = connection.execute(
            "SELECT typeof(messages), json_extract(messages, '$[1].parts[0].text')"
            " FROM turnplug_turns ORDER BY position"
        ).fetchall()
    assert kinds == [("text", "中😀" * 100_000), ("text", "a")]


# -- group commit ---------------------------------------------------------------------------


class GatedBatches:
    """Wraps the transaction writer: records each transaction's commits and holds it until
    the test opens the gate, so a test can act while a transaction is in flight."""

    def __init__(self, monkeypatch) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)
        write = _sqlite._append_batch

        def gated(commits, connection):
            self.batches.append([commit[1] for commit in commits])
            self.entered.release()
            self.gate.acquire()
            return write(commits, connection)

        monkeypatch.setattr(_sqlite, "_append_batch", gated)

    async def wait_entered(self) -> None:
        await anyio.to_thread.run_sync(self.entered.acquire)


async def test_commits_waiting_together_share_one_transaction(tmp_path, monkeypatch):
    batches = GatedBatches(monkeypatch)

    async with SQLiteLog(tmp_path / "log.db") as log, anyio.create_task_group() as nursery:
        nursery.start_soon(log.append, "a", "t1", exchange("q", "a"))
        await batches.wait_entered()
        for conversation in ("b", "c", "d"):
            nursery.start_soon(log.append, conversation, "t1", exchange("q", "a"))
        await anyio.wait_all_tasks_blocked()
        batches.gate.release()  # a's transaction; then b, c and d's
        await batches.wait_entered()
        batches.gate.release()

    assert batches.batches == [["t1"], ["t1", "t1", "t1"]]
    async with SQLiteLog(tmp_path / "log.db") as log:
        for conversation in "abcd":
            assert await log.load(conversation) == Context(messages=exchange("q", "a"))


async def test_commits_of_one_conversation_in_one_transaction_are_checked_in_order(
    tmp_path, monkeypatch
):
    batches = GatedBatches(monkeypatch)
    results = {}

    async def commit(ref: str, expected: int) -> None:
        try:
            await log.append("c", ref, exchange(ref, "a"), expected_length=expected)
            results[ref] = "committed"
        except LogConflict:
            results[ref] = "conflict"

    async with SQLiteLog(tmp_path / "log.db") as log, anyio.create_task_group() as nursery:
        nursery.start_soon(commit, "t0", 0)
        await batches.wait_entered()
        nursery.start_soon(commit, "t1", 2)
        await anyio.wait_all_tasks_blocked()
        nursery.start_soon(commit, "t1-stale", 2)  # answered from the same length as t1
        await anyio.wait_all_tasks_blocked()
        nursery.start_soon(commit, "t1", 2)  # a retry of t1: a no-op
        await anyio.wait_all_tasks_blocked()
        batches.gate.release()
        await batches.wait_entered()
        batches.gate.release()

    assert batches.batches == [["t0"], ["t1", "t1-stale", "t1"]]
    assert results == {"t0": "committed", "t1": "committed", "t1-stale": "conflict"}
    async with SQLiteLog(tmp_path / "log.db") as log:
        stored = await log.load("c")
    assert stored == Context(messages=(*exchange("t0", "a"), *exchange("t1", "a")))


async def test_cancelled_commits_are_written_once_taken_and_dropped_before(tmp_path, monkeypatch):
    # b and c are taken into the second transaction, d queues behind it; then every task
    # is cancelled. b and c are written and their appends return (the cancellation comes
    # at their next checkpoint); d was never taken: it raises and is not written.
    batches = GatedBatches(monkeypatch)
    returned = []

    async def commit(conversation: str) -> None:
        await log.append(conversation, "t1", exchange("q", "a"))
        returned.append(conversation)
        await anyio.sleep_forever()

    async with SQLiteLog(tmp_path / "log.db") as log:
        async with anyio.create_task_group() as nursery:
            nursery.start_soon(commit, "a")
            await batches.wait_entered()
            nursery.start_soon(commit, "b")
            nursery.start_soon(commit, "c")
            await anyio.wait_all_tasks_blocked()
            batches.gate.release()
            await batches.wait_entered()  # b and c's transaction is in flight
            nursery.start_soon(commit, "d")
            await anyio.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
            batches.gate.release()
        batches.gate.release()  # a later commit must not carry d along
        await log.append("e", "t1", exchange("q", "a"))
        stored = {c: [e.turn_ref for e in await log.entries(c)] for c in "abcd"}

    assert batches.batches == [["t1"], ["t1", "t1"], ["t1"]]
    assert sorted(returned) == ["a", "b", "c"]
    assert stored == {"a": ["t1"], "b": ["t1"], "c": ["t1"], "d": []}


async def test_a_failed_transaction_fails_each_of_its_commits_and_writes_none(tmp_path):
    path = tmp_path / "log.db"
    await committed(path, "t0")
    holder = raw(path)
    holder.execute("BEGIN IMMEDIATE")
    errors = []

    async def commit(conversation: str) -> None:
        try:
            await log.append(conversation, "t1", exchange("q", "a"))
        except LogError as exc:
            errors.append(exc)

    try:
        async with SQLiteLog(path, timeout=0.2) as log, anyio.create_task_group() as nursery:
            for conversation in "xyz":
                nursery.start_soon(commit, conversation)
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    assert len(errors) == 3
    assert len({id(error) for error in errors}) == 3  # each task raised its own
    assert all("write lock" in str(error) for error in errors)
    async with SQLiteLog(path) as log:
        assert [await log.entries(c) for c in "xyz"] == [(), (), ()]


async def test_an_append_in_a_cancelled_scope_writes_nothing(tmp_path):
    """Catches: the write lock or the connection taken without a pass through the scheduler
    also skipping its cancellation check, so a commit whose task was already cancelled is
    written (and its caller, cancelled, never learns it)."""
    async with SQLiteLog(tmp_path / "log.db") as log:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await log.append("c", "t1", exchange("q", "a"))
        assert scope.cancelled_caught
        assert await log.entries("c") == ()
        await log.append("c", "t2", exchange("q", "a"))
        assert [entry.turn_ref for entry in await log.entries("c")] == ["t2"]


async def test_a_read_waits_for_the_connection_a_commit_holds(tmp_path, monkeypatch):
    """Catches: a free connection taken without waiting on its limiter when it is not free,
    so that a read runs while a commit's transaction holds the single connection."""
    batches = GatedBatches(monkeypatch)
    trace: list[str] = []

    async def commit() -> None:
        await log.append("c", "t1", exchange("q", "a"))
        trace.append("committed")

    async def read() -> None:
        entries = await log.entries("c")
        trace.append(f"read {len(entries)}")

    async with SQLiteLog(tmp_path / "log.db") as log, anyio.create_task_group() as nursery:
        nursery.start_soon(commit)
        await batches.wait_entered()
        nursery.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        trace.append("released")
        batches.gate.release()
    assert trace == ["released", "committed", "read 1"]


# -- the log's own thread -------------------------------------------------------------------


def log_threads(log: SQLiteLog) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"{log!r} worker"]


async def wait_gone(name: str) -> None:
    for thread in [t for t in threading.enumerate() if t.name == name]:
        await anyio.to_thread.run_sync(thread.join, 5)
        assert not thread.is_alive(), f"{name} is still running"


async def test_closing_a_log_ends_its_thread(tmp_path):
    """Catches: a thread left behind by every log opened and closed (a server that opens a
    log per tenant would pile them up)."""
    log = SQLiteLog(tmp_path / "log.db")
    async with log:
        await log.append("c", "t1", exchange("q", "a"))
        assert len(log_threads(log)) == 1

    await wait_gone(f"{log!r} worker")


async def test_a_log_dropped_unclosed_does_not_keep_its_thread(tmp_path):
    """Catches: a log never closed keeping a thread (and its connection) for the life of the
    process."""
    import gc

    log = SQLiteLog(tmp_path / "log.db")
    await log.append("c", "t1", exchange("q", "a"))
    name = f"{log!r} worker"
    assert [t for t in threading.enumerate() if t.name == name]

    del log
    gc.collect()
    await wait_gone(name)


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_one_log_serves_one_event_loop_after_another(tmp_path, loop):
    """Catches: the log's thread answering the loop it first served (gone by then), so that
    a log kept across `anyio.run` calls hangs or fails on the second."""

    async def commit(log: SQLiteLog, turn: str) -> tuple[str, ...]:
        await log.append("c", turn, exchange(f"q {turn}", f"a {turn}"))
        return tuple(e.turn_ref for e in await log.entries("c"))

    log = SQLiteLog(tmp_path / "log.db")
    assert anyio.run(commit, log, "t1", backend=loop) == ("t1",)
    assert anyio.run(commit, log, "t2", backend=loop) == ("t1", "t2")
    anyio.run(log.aclose, backend=loop)


@pytest.mark.parametrize(("first", "then"), [("trio", "asyncio"), ("asyncio", "trio")])
@pytest.mark.parametrize("call", ["append", "load"])
def test_a_log_used_under_the_other_kind_of_loop_is_refused_naming_both(
    tmp_path, first, then, call
):
    """Bug caught: a log used under trio and then under asyncio (or the reverse) failed
    with the other loop's own error from deep inside AnyIO ("must be called from async
    context", "no running event loop"), naming neither the log nor the cause, since its
    locks belong to the kind of loop that used them first."""

    async def commit(log: SQLiteLog, turn: str) -> None:
        await log.append("c", turn, exchange(f"q {turn}", f"a {turn}"))

    async def use(log: SQLiteLog) -> None:
        if call == "append":
            await commit(log, "t2")
        else:
            await log.load("c")

    log = SQLiteLog(tmp_path / "log.db")
    anyio.run(commit, log, "t1", backend=first)

    with pytest.raises(RuntimeError) as caught:
        anyio.run(use, log, backend=then)

    message = str(caught.value)
    assert repr(log) in message
    assert f"first used under {first} and is now used under {then}" in message
    assert "open a log for each event loop" in message
    # Refused before anything was written, and still whole on its own kind of loop.
    entries = anyio.run(log.entries, "c", backend=first)
    assert [entry.turn_ref for entry in entries] == ["t1"]
    anyio.run(log.aclose, backend=first)


def test_a_log_used_by_another_threads_running_trio_run_is_refused_not_broken(tmp_path):
    """Bug caught: one SQLiteLog used at once by two threads, each running its own
    `trio.run`, failed one thread's calls with a bare AssertionError from inside trio and hung
    the other's (each run's locks woken from the other's thread), where asyncio loops were
    already refused; once the first run has ended, the next one may use the log."""
    log = SQLiteLog(tmp_path / "log.db")
    seen: dict[str, object] = {}

    def other_thread() -> None:
        async def commit() -> None:
            with trio.fail_after(5):
                await log.append("b", "t1", exchange("q", "b"))

        try:
            trio.run(commit)
            seen["other"] = "committed"
        except BaseException as exc:
            seen["other"] = exc

    async def main() -> None:
        await log.append("a", "t1", exchange("q", "a"))  # the first run to use the log
        await trio.to_thread.run_sync(other_thread)  # this run is still going meanwhile
        await log.append("a", "t2", exchange("q2", "a2"))

    trio.run(main)
    entries = trio.run(log.entries, "a")  # the first run ended: another may use the log
    trio.run(log.aclose)

    error = seen["other"]
    assert isinstance(error, RuntimeError), error
    assert f"{log!r} is used by another event loop, still running" in str(error)
    assert "trio.run or asyncio.run" in str(error)
    assert [e.turn_ref for e in entries] == ["t1", "t2"]


async def test_a_call_waiting_when_the_log_closes_is_refused_and_no_thread_is_left(
    tmp_path, monkeypatch
):
    """Catches: a read that waited for the connection while the log was closed starting a
    new thread for itself after the close, which nothing then stopped."""
    batches = GatedBatches(monkeypatch)
    log = SQLiteLog(tmp_path / "log.db")
    outcomes: list[str] = []

    async def commit() -> None:
        await log.append("c", "t1", exchange("q", "a"))
        outcomes.append("committed")

    async def read() -> None:
        try:
            await log.entries("c")
        except RuntimeError as exc:
            outcomes.append(str(exc))

    async with anyio.create_task_group() as nursery:
        nursery.start_soon(commit)
        await batches.wait_entered()
        nursery.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        await log.aclose()
        batches.gate.release()

    assert outcomes == ["committed", f"{log!r} is closed; open a new one to use it again"]
    await wait_gone(f"{log!r} worker")


@pytest.mark.parametrize(
    "stored",
    ["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00"],
    ids=["year 1", "year 9999"],
)
async def test_a_commit_time_out_of_range_in_utc_is_a_log_error_naming_the_turn(tmp_path, stored):
    """Catches: a stored commit time that cannot be given in UTC (year 1 with an offset
    ahead of it, year 9999 with one behind) failing with a bare OverflowError instead of a
    LogError naming the turn, as any other unreadable commit time does."""
    path = tmp_path / "log.db"
    await committed(path, "t1")
    with raw(path) as db:
        db.execute("UPDATE turnplug_turns SET committed_at = ?", (stored,))

    async with SQLiteLog(path) as log:
        with pytest.raises(
            LogError, match=f"turn 't1' of conversation 'c'.*{re.escape(repr(stored))}"
        ):
            await log.entries("c")
        with pytest.raises(
            LogError, match=f"the last turn of conversation 'c'.*{re.escape(repr(stored))}"
        ):
            await log.conversations()


# -- read_only ------------------------------------------------------------------------------


def untouched(directory: Path) -> dict[str, tuple[bytes, int]]:
    """What a reader must leave as it was: each file's bytes and mtime, and the directory's
    mtime (which a file created and removed again changes, even for root)."""
    files = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}
    return {**files, ".": (b"", directory.stat().st_mtime_ns)}


async def test_a_read_only_log_reads_a_closed_log_and_writes_nothing(tmp_path):
    """Bug caught: reading a log opened it for writing, which fails in a directory or for a
    file this user may only read, and leaves ``-wal`` and ``-shm`` files beside it."""
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "log.db"
    await committed(path, "t1", "t2")

    with read_only_files(directory):
        before = untouched(directory)
        async with SQLiteLog(path, read_only=True) as log:
            context = await log.load("c")
            entries = await log.entries("c")
            conversations = await log.conversations()
        after = untouched(directory)

    assert len(context.messages) == 4
    assert [entry.turn_ref for entry in entries] == ["t1", "t2"]
    assert [(info.conversation_id, info.turns) for info in conversations] == [("c", 2)]
    assert after == before
    assert list(after) == ["log.db", "."]


async def test_a_read_only_log_reads_what_a_writer_holding_the_file_commits(tmp_path):
    """Bug caught: a read-only reader opening the file as immutable while a writer has it
    open (its ``-wal`` file beside it) would miss the commits not yet folded into the file."""
    path = tmp_path / "log.db"
    async with SQLiteLog(path) as writer, SQLiteLog(path, read_only=True) as reader:
        await writer.append("c", "t1", exchange("q", "a"))
        assert [entry.turn_ref for entry in await reader.entries("c")] == ["t1"]
        await writer.append("c", "t2", exchange("q2", "a2"))
        assert [entry.turn_ref for entry in await reader.entries("c")] == ["t1", "t2"]


@pytest.mark.parametrize(
    ("count", "size"), [(2, 1), (199, 3000)], ids=["a few commits", "pages rewritten"]
)
async def test_a_read_only_log_sees_what_a_writer_opening_the_file_later_commits(
    tmp_path, count, size
):
    """Bug caught: a reader that opened a file without a ``-wal`` file kept reading it as
    immutable, so it never saw a writer's later commits, and once the writer had rewritten
    the file's pages it failed with "database disk image is malformed"."""
    path = tmp_path / "log.db"
    await committed(path, "t0")
    async with SQLiteLog(path, read_only=True) as reader:
        assert [entry.turn_ref for entry in await reader.entries("c")] == ["t0"]
        refs = [f"t{i}" for i in range(1, count + 1)]
        async with SQLiteLog(path) as writer:  # opened, committed to and closed
            for ref in refs:
                await writer.append(f"c{len(ref)}", ref, exchange("q" * size, "a"))

        conversations = await reader.conversations()
        assert {info.conversation_id for info in conversations} == {
            "c",
            *(f"c{len(ref)}" for ref in refs),
        }
        assert [entry.turn_ref for entry in await reader.entries("c")] == ["t0"]
        assert [entry.turn_ref for entry in await reader.entries("c2")] == refs[:9]


async def test_a_read_only_log_opened_beside_a_writer_sees_a_file_renamed_into_place(tmp_path):
    """Bug caught: a reader that opened the file while a writer held it (a ``-wal`` file
    beside it) kept reading the old file forever once another was renamed into its place."""
    path = tmp_path / "log.db"
    await committed(path, "t1")
    writer = SQLiteLog(path)
    await writer.load("c")  # it has the file open, with its -wal file
    async with SQLiteLog(path, read_only=True) as reader:
        assert [entry.turn_ref for entry in await reader.entries("c")] == ["t1"]
        await writer.aclose()
        assert (tmp_path / "log.db-wal").exists()  # the reader still has it open
        await committed(tmp_path / "other.db", "n1", "n2")
        os.replace(tmp_path / "other.db", path)

        assert [entry.turn_ref for entry in await reader.entries("c")] == ["n1", "n2"]


async def test_a_read_only_log_is_never_created(tmp_path):
    """Bug caught: reading a missing file created an empty database there."""
    path = tmp_path / "nope.db"

    with pytest.raises(LogError, match="no file at that path") as excinfo:
        async with SQLiteLog(path, read_only=True):
            pass

    assert str(path) in str(excinfo.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("wal", [False, True], ids=["rollback journal", "WAL mode"])
async def test_a_read_only_log_refuses_a_database_without_its_tables_and_leaves_it_so(
    tmp_path, wal
):
    """Bug caught: reading another program's database added turnplug's tables to it."""
    path = tmp_path / "app.db"
    with contextlib.closing(raw(path)) as db:
        if wal:
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE users (id INTEGER)")
    before = untouched(tmp_path)

    with pytest.raises(LogError, match="without turnplug's tables") as excinfo:
        async with SQLiteLog(path, read_only=True):
            pass

    assert str(path) in str(excinfo.value)
    assert untouched(tmp_path) == before


@pytest.mark.parametrize(("version", "advice"), [(0, "migrates it forward"), (99, "upgrade")])
async def test_a_read_only_log_refuses_another_schema_version_naming_both(
    tmp_path, version, advice
):
    """Bug caught: a read-only reader would migrate an older schema, writing to the file."""
    path = tmp_path / "log.db"
    await committed(path, "t1")
    with contextlib.closing(raw(path)) as db:
        db.execute("UPDATE turnplug_schema SET version = ?", (version,))
    before = untouched(tmp_path)

    with pytest.raises(LogError, match=advice) as excinfo:
        async with SQLiteLog(path, read_only=True):
            pass

    assert f"version {version}" in str(excinfo.value)
    assert f"version {len(_sqlite.MIGRATIONS)}" in str(excinfo.value)
    assert untouched(tmp_path) == before


async def test_a_read_only_log_refuses_a_commit_naming_the_turn(tmp_path):
    path = tmp_path / "log.db"
    await committed(path, "t1")

    async with SQLiteLog(path, read_only=True) as log:
        with pytest.raises(LogError, match="read_only=True") as excinfo:
            await log.append("c", "t2", exchange("q", "a"))

    assert "'t2'" in str(excinfo.value)
    async with SQLiteLog(path) as log:
        assert [entry.turn_ref for entry in await log.entries("c")] == ["t1"]


async def test_an_audit_record_holding_a_negative_token_count_still_reads_back(tmp_path):
    """Bug caught: an audit record committed before Usage refused a negative count (a
    server's -1, passed through) made entries() a LogError, and with it every later turn
    sent with a turn_ref on that conversation; the count now reads back as 0, while
    Usage(-1, 2) built by code is still refused."""
    from pipeline import Pipeline
    from pipeline.testing import ScriptedModel
    from turns import Usage

    path = tmp_path / "log.db"
    async with (
        SQLiteLog(path) as log,
        Pipeline(model=ScriptedModel(["hi"])).session(log=log, conversation_id="c") as session,
    ):
        await session.send("hello", turn_ref="t1")
    with raw(path) as db:  # as an earlier version wrote it
        db.execute(
            "UPDATE turnplug_turns"
            " SET audit = json_set(audit, '$.attempts[0].usage.input_tokens', -1)"
        )

    async with (
        SQLiteLog(path) as log,
        Pipeline(model=ScriptedModel(["ok"])).session(log=log, conversation_id="c") as session,
    ):
        [entry] = await log.entries("c")
        assert entry.audit is not None
        assert entry.audit.attempts[0].usage.input_tokens == 0
        assert (await session.send("next", turn_ref="t2")).reply.text == "ok"
    with pytest.raises(
        ValueError, match=r"Usage\.input_tokens must be a number of tokens of 0 or more"
    ):
        Usage(-1, 2)
