"""`SQLiteLog`: the embedded default, one file, stdlib `sqlite3` in worker threads."""

import asyncio
import contextlib
import functools
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias, TypeVar, final

import anyio

from turns import Message

from .._audit import AuditRecord
from .._errors import LogError
from .._loop import cancelled_by_scope, shielded
from . import _codec
from ._pool import Connections, DatabaseLog
from ._protocol import (
    ConversationInfo,
    LogEntry,
    as_messages,
    check_append,
    conflict,
)

_Outcome: TypeAlias = tuple[Literal["committed", "duplicate", "conflict"], int]
T = TypeVar("T")

# Forward migrations: MIGRATIONS[n] takes a database from schema version n to n + 1. A
# database records its version in turnplug_schema; opening one runs what it lacks, in one
# transaction. Never edit a migration that has shipped: add the next one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE turnplug_conversations (
            conversation_id TEXT PRIMARY KEY,
            length INTEGER NOT NULL,  -- messages committed so far
            turns INTEGER NOT NULL    -- commits so far
        )
        """,
        """
        CREATE TABLE turnplug_turns (
            conversation_id TEXT NOT NULL,
            position INTEGER NOT NULL,       -- the commit's place in its conversation, from 0
            turn_ref TEXT NOT NULL,
            message_count INTEGER NOT NULL,
            messages TEXT NOT NULL,          -- JSON array of turns.serde messages
            audit TEXT,                      -- JSON audit record, or NULL
            committed_at TEXT NOT NULL,      -- UTC, ISO 8601
            PRIMARY KEY (conversation_id, position),
            UNIQUE (conversation_id, turn_ref)
        )
        """,
    ),
)


@final
class SQLiteLog(DatabaseLog):
    """A `Log` in one SQLite file: the embedded default, for one machine.

    Writes use WAL mode with ``synchronous=FULL``: a commit that returned survives a crash
    of the process or of the machine. Commits are written in ``BEGIN IMMEDIATE``
    transactions, so each length check and its insert are atomic also against other
    processes using the same file. Many sessions in one process share one `SQLiteLog`: it
    holds one connection, used by one worker thread at a time (SQLite serializes writers
    anyway), so the event loop never blocks on the database; commits that arrive while a
    transaction is being written are written together in the next one (group commit: one
    fsync for all of them, each checked as if alone).

    The tables (``turnplug_*``) are created, or migrated forward, on first use. Close the
    log with ``await log.aclose()`` or use it as ``async with SQLiteLog(path) as log``.

    Args:
        path: The database file, created if missing (its directory must exist), or
            ``":memory:"`` for a private in-memory database that lives as long as the log.
        timeout: Seconds to wait for another process's write lock before a commit fails
            with `pipeline.LogError`.
        read_only: True reads the log without writing anything, for a reader such as
            ``turnplug log`` (a file on a read-only mount, or one the user may only read):
            the file must exist and hold turnplug's tables, at the current schema version
            (else `pipeline.LogError`); nothing is created, migrated or changed, and
            ``append`` raises `pipeline.LogError`. Without a ``-wal`` file beside it,
            everything is in the file itself, which is read as immutable: SQLite would
            otherwise leave ``-wal`` and ``-shm`` files next to it, or fail in a directory
            it may not write to. A writer may open the file later: each read first checks
            that the file is as it was and has no ``-wal`` file, else it reads through a new
            connection (through SQLite's locks, while the ``-wal`` file is there), so a
            long-lived reader sees later commits; a read during which a writer folded its
            ``-wal`` file into the file is made again, or, on a connection opened for it,
            fails with a `pipeline.LogError` saying so — read again. A connection reading
            through the locks is made anew when another file was renamed into the path.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 10.0, read_only: bool = False
    ) -> None:
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise TypeError(f"SQLiteLog(path) takes a file path, got {path!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"SQLiteLog(timeout=...) must be seconds > 0, got {timeout!r}")
        self._path = os.fspath(path)
        # What sqlite3 would refuse at the first call, with an error naming no log.
        try:
            file = os.fsencode(self._path)
        except UnicodeEncodeError:
            raise ValueError(
                f"SQLiteLog(path): {self._path!r} cannot be a file name on this system (it holds"
                " a lone surrogate)"
            ) from None
        if b"\x00" in file:
            raise ValueError(f"SQLiteLog(path): {self._path!r} holds a NUL character")
        self._timeout = float(timeout)
        if not isinstance(read_only, bool):
            raise TypeError(f"SQLiteLog(read_only=...) must be True or False, got {read_only!r}")
        if read_only and self._path == ":memory:":
            raise ValueError(
                "SQLiteLog(':memory:', read_only=True) would read an empty database that"
                " nothing can write — pass the path of an existing log file"
            )
        self._read_only = read_only
        self._queue: list[_Commit] = []
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._connections = Connections(
            size=1,
            connect=self._connect,
            close=_close,
            usable=lambda connection: not connection.changed,
            translate=self._translate,
            name=repr(self),
            own_thread=True,
        )

    def __repr__(self) -> str:
        return f"SQLiteLog({self._path!r})"

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
        if self._read_only:
            raise LogError(
                f"{self!r} was opened with read_only=True: turn {turn_ref!r} of conversation"
                f" {conversation_id!r} was not committed — open it without read_only to write",
                log=repr(self),
            )
        stored = await self._stored(conversation_id, turn_ref, messages, audit)
        commit = _Commit((conversation_id, turn_ref, len(messages), *stored, expected_length))
        self._connections.check_loop()  # before the write lock, which is the loop's too
        outcome, length = await self._commit(commit)
        if outcome == "conflict":
            assert expected_length is not None
            raise conflict(conversation_id, turn_ref, length, expected_length)

    async def _commit(self, commit: "_Commit") -> _Outcome:
        """Group commit: one transaction (one fsync) for every commit waiting.

        Commits queue; whoever holds the write lock takes the whole queue and writes it in
        one transaction, each commit checked as if alone, in queue order. A commit taken
        into a transaction is not abandoned: if its task is cancelled meanwhile, it waits
        for the transaction and reports it (the cancellation comes at the next checkpoint).
        A commit cancelled before it was taken is dropped and never written.
        """
        self._queue.append(commit)
        try:
            await self._write_lock.acquire()
        except anyio.get_cancelled_exc_class() as cancelled:
            if not commit.taken:
                self._queue.remove(commit)
                raise
            native = await _written(commit)
            if native is not None:
                raise native  # asyncio's own, caught while waiting: it must not be lost
            if not cancelled_by_scope(cancelled):
                raise  # asyncio's own: the caller's `asyncio.timeout` must fire
            return commit.result()  # the scope's cancellation comes at the next checkpoint
        try:
            if not commit.taken:
                await self._write(self._take())
        finally:
            self._write_lock.release()
        return commit.result()

    def _take(self) -> "list[_Commit]":
        batch, self._queue = self._queue, []
        for commit in batch:
            commit.taken = True
        return batch

    async def _write(self, batch: "list[_Commit]") -> None:
        try:
            with shielded():  # taken: written whatever happens to us
                # The outcomes are kept by the thread: the writer's task may be cancelled
                # (by asyncio's own cancellation) once the transaction has ended, and the
                # other commits of the batch must learn theirs all the same.
                await self._connections.run(functools.partial(_write_batch, batch), held=True)
        except Exception as exc:
            for commit in batch:
                commit.error = exc
        finally:
            for commit in batch:
                if commit.outcome is None and commit.error is None:
                    # The writer was stopped before it handed the batch over (asyncio's own
                    # cancellation, say, while it waited for the connection): none of it
                    # was written, and the others must not wait for it.
                    commit.error = LogError(
                        f"{self!r} did not write turn {commit.args[1]!r} of conversation"
                        f" {commit.args[0]!r}: the task writing its batch was stopped first;"
                        " nothing of it was committed — send it again",
                        log=repr(self),
                    )
                commit.done.set()

    def _bounded(self, work: Callable[[Any], T], what: str) -> Callable[[Any], T]:
        if not self._read_only:
            return work
        return functools.partial(_read_unchanged, self._path, work)

    # -- inside worker threads -------------------------------------------------------------

    def _connect(self) -> "_Connection":
        if self._read_only:
            return self._connect_read_only()
        connection = sqlite3.connect(
            self._path,
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=_Connection,
        )
        try:
            _enter_wal(connection, self._timeout)
            connection.execute("PRAGMA synchronous=FULL")
            _migrate(connection, repr(self))
            # Fixed once the database holds tables, as it does now.
            connection.utf8 = _utf8(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def _connect_read_only(self) -> "_Connection":
        name = repr(self)
        if not os.path.isfile(self._path):
            # mode=ro never creates one, but its error would not say which file is missing.
            raise LogError(
                f"{name}: no file at that path (a log opened with read_only=True is never"
                " created) — pass the path of an existing log",
                log=name,
            )
        stamp = _stamp(self._path)  # before the -wal check: a change after it shows
        wal = os.path.exists(f"{self._path}-wal")
        path = urllib.parse.quote(os.fsencode(os.path.abspath(self._path)))
        # Without a -wal file everything is in the file, and no writer has it open. SQLite
        # trusts an immutable file not to change: each read checks it did not
        # (`_read_unchanged`).
        # An empty authority: a path starting with "//", which POSIX keeps, would be one.
        uri = f"file://{path}?mode=ro{'' if wal else '&immutable=1'}"
        connection = sqlite3.connect(
            uri,
            uri=True,
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=_Connection,
        )
        try:
            try:
                version = _version(connection)
            except sqlite3.DatabaseError as exc:
                if not wal and _stamp(self._path) != stamp:
                    raise _Changed from exc  # a writer folded its -wal file in meanwhile
                if "unable to open" not in str(exc) or os.path.exists(f"{self._path}-shm"):
                    raise
                # Read as immutable, the file would show the log without the commits its
                # -wal file holds: say why it cannot be read instead.
                raise LogError(
                    f"{name}: its -wal file holds commits SQLite reads through a -shm file,"
                    " which is missing and cannot be created beside it (a directory this"
                    " user may not write to, or a read-only mount) — open the log once"
                    " where it can be written, which folds the -wal file into it",
                    log=name,
                ) from exc
            if version is None:
                raise LogError(
                    f"{name}: no log in that file: it is an SQLite database without"
                    " turnplug's tables, so it holds no conversations; it was not written to"
                    " — pass the path of the log file",
                    log=name,
                )
            if version != len(MIGRATIONS):
                raise LogError(
                    f"{name}: the database has schema version {version}, and this turnplug"
                    f" reads version {len(MIGRATIONS)} — "
                    + (
                        "upgrade turnplug to read it"
                        if version > len(MIGRATIONS)
                        else "open it once without read_only=True, which migrates it forward"
                    ),
                    log=name,
                )
        except BaseException:
            connection.close()
            raise
        if not wal:
            connection.stamp = stamp
        elif stamp is not None:
            connection.inode = stamp[:2]
        return connection

    # -- the seam -------------------------------------------------------------------------

    def _translate(self, exc: Exception) -> LogError | None:
        if not isinstance(exc, sqlite3.Error | _codec.StoredDataError | _Changed):
            return None
        text = str(exc)
        if isinstance(exc, _Changed):
            why = (
                "the file changed while it was read (a writer opened it and folded its -wal"
                " file in), so what was read may mix two states; it was not used — read it"
                " again"
            )
        elif isinstance(exc, _codec.StoredDataError):
            why = f"{text} — the file was changed by something other than turnplug"
        elif "locked" in text or "busy" in text:
            why = (
                f"another connection held the database's write lock for more than"
                f" {self._timeout:g} s ({text}); nothing was committed — retry, or give"
                " SQLiteLog a longer timeout="
            )
        elif "unable to open" in text and self._read_only:
            why = f"cannot open the file ({text}) — check that this user may read it"
        elif "unable to open" in text:
            why = f"cannot open the file ({text}) — check that its directory exists and is writable"
        elif "not a database" in text:
            why = f"the file is not an SQLite database ({text}) — pick another path"
        else:
            why = f"SQLite failed: {type(exc).__name__}: {text}"
        return LogError(f"{self!r}: {why}", log=repr(self))


async def _written(commit: "_Commit") -> BaseException | None:
    """Wait until another task's transaction has written `commit`, whatever cancels us.

    A cancel scope's cancellation (trio's, AnyIO's) is held off by the shield; asyncio's own
    passes it, and is caught here and returned, for the caller to raise once the commit is
    known.
    """
    native: BaseException | None = None
    with anyio.CancelScope(shield=True):
        while not commit.done.is_set():
            try:
                await commit.done.wait()
            except asyncio.CancelledError as exc:
                native = exc
    return native


class _Commit:
    """One `append` waiting to be written, and then what became of it."""

    __slots__ = ("args", "done", "error", "outcome", "taken")

    def __init__(
        self, args: tuple[str, str, int, str | bytearray, str | bytearray | None, int | None]
    ) -> None:
        self.args = args
        self.taken = False  # in a transaction: it will be written or fail, not dropped
        self.done = anyio.Event()
        self.outcome: _Outcome | None = None
        self.error: Exception | None = None

    def result(self) -> _Outcome:
        if self.error is not None:
            # Each waiter raises its own copy: one exception object, raised in several
            # tasks, would collect all their tracebacks.
            error = self.error
            if isinstance(error, LogError):
                raise LogError(str(error), log=error.log) from error.__cause__
            raise error
        assert self.outcome is not None
        return self.outcome


class _Connection(sqlite3.Connection):
    """A connection that knows its database's text encoding, read once (`_utf8`)."""

    utf8 = True
    # A read-only connection reading the file as immutable: the file's `_stamp` when it was
    # opened. SQLite then caches its pages and never looks at the file's locks or -wal file.
    stamp: "_Stamp | None" = None
    # A read-only connection reading through SQLite's locks (a -wal file was there): the
    # file's device and inode when it was opened, since a file put in its place by rename
    # is one SQLite would never look at.
    inode: tuple[int, int] | None = None
    used = False  # it has served a read: it is kept from an earlier call
    changed = False  # the file changed under it: the pool closes it


_Stamp: TypeAlias = tuple[int, int, int, int]


class _Changed(Exception):
    """The file read as immutable changed, or a writer has it open: read it anew."""


def _stamp(path: str) -> _Stamp | None:
    """What changes when a writer changes the file: a checkpoint writes pages into it (its
    size or mtime), a new file replaces it (its inode); None if it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_unchanged(path: str, work: Callable[[_Connection], T], connection: _Connection) -> T:
    """`work(connection)`, refused on a read-only connection whose file changed.

    A connection kept from an earlier call and made stale by a writer (the file changed, or
    a -wal file now holds commits it would not see) is refused before the read; one whose
    file changed during the read, which may have returned rows from two states or failed as
    "malformed", after it. Either way the pool closes it and makes the call again on a new
    connection once (`Connections`), where a kept connection was refused; a new connection
    refused raises `_Changed` itself.

    A connection reading through SQLite's locks sees every commit made to its file, so it
    is only checked to still have its file (not one renamed into its place) before a read
    it is kept for: one stat, and none after the read, since SQLite's locks keep the read
    whole.
    """
    stamp = connection.stamp
    if stamp is None:
        inode = connection.inode
        if inode is not None:
            if connection.used and (_stamp(path) or ())[:2] != inode:
                connection.changed = True
                raise _Changed
            connection.used = True
        return work(connection)
    if connection.used and (_stamp(path) != stamp or os.path.exists(f"{path}-wal")):
        connection.changed = True
        raise _Changed
    try:
        result = work(connection)
    except (sqlite3.DatabaseError, _codec.StoredDataError) as exc:
        if _stamp(path) != stamp:
            connection.changed = True
            raise _Changed from exc
        raise
    if _stamp(path) != stamp:
        connection.changed = True
        raise _Changed
    connection.used = True
    return result


def _close(connection: sqlite3.Connection) -> None:
    # Closing a broken connection: there is nothing more to release.
    with contextlib.suppress(sqlite3.Error):
        connection.close()


def _enter_wal(connection: sqlite3.Connection, timeout: float) -> None:
    """Put the database in WAL mode, waiting up to `timeout` for other connections.

    Switching a file to WAL takes its exclusive lock. When another connection holds the
    write lock (another process creating the same new file, say), SQLite answers "database is
    locked" at once instead of calling its busy handler, which would deadlock there, so the
    connection's own timeout does not apply: wait and try again here, within the same budget.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # in a worker thread: the event loop goes on
        pause = min(pause * 2, 0.05)


def _migrate(connection: sqlite3.Connection, name: str) -> None:
    latest = len(MIGRATIONS)
    if _version(connection) == latest:
        return  # the common case: no write lock needed
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.execute("CREATE TABLE IF NOT EXISTS turnplug_schema (version INTEGER NOT NULL)")
        version = _version(connection) or 0
        if version > latest:
            raise LogError(
                f"{name}: the database has schema version {version}, newer than this"
                f" turnplug knows ({latest}) — upgrade turnplug to use it",
                log=name,
            )
        for statements in MIGRATIONS[version:]:
            for statement in statements:
                connection.execute(statement)
        connection.execute("DELETE FROM turnplug_schema")
        connection.execute("INSERT INTO turnplug_schema (version) VALUES (?)", (latest,))
        connection.execute("COMMIT")
    except BaseException:
        _rollback(connection)
        raise


def _version(connection: sqlite3.Connection) -> int | None:
    exists = connection.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turnplug_schema'"
    ).fetchone()
    if exists is None:
        return None
    row = connection.execute("SELECT max(version) FROM turnplug_schema").fetchone()
    return int(row[0]) if row[0] is not None else None


def _rollback(connection: sqlite3.Connection) -> None:
    if connection.in_transaction:
        connection.execute("ROLLBACK")


def _write_batch(batch: "list[_Commit]", connection: _Connection) -> None:
    outcomes = _append_batch([commit.args for commit in batch], connection)
    for commit, outcome in zip(batch, outcomes, strict=True):
        commit.outcome = outcome


def _append_batch(
    commits: list[tuple[str, str, int, str | bytearray, str | bytearray | None, int | None]],
    connection: _Connection,
) -> list[_Outcome]:
    # IMMEDIATE takes the write lock now, before the reads: no other connection can commit
    # between a length check and its insert.
    connection.execute("BEGIN IMMEDIATE")
    try:
        outcomes = [_append_locked(connection, *commit) for commit in commits]
        wrote = any(outcome == "committed" for outcome, _ in outcomes)
        connection.execute("COMMIT" if wrote else "ROLLBACK")
    except BaseException:
        _rollback(connection)
        raise
    return outcomes


def _append_locked(
    connection: _Connection,
    conversation_id: str,
    turn_ref: str,
    count: int,
    messages: str | bytearray,
    audit: str | bytearray | None,
    expected_length: int | None,
) -> _Outcome:
    row = connection.execute(
        "SELECT length, turns FROM turnplug_conversations WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()
    length, turns = row if row is not None else (0, 0)
    if expected_length is not None and expected_length != length:
        # A turn committed already is a duplicate, whatever length its retry expects.
        if _committed(connection, conversation_id, turn_ref):
            return "duplicate", 0
        return "conflict", length
    if isinstance(messages, bytearray) and not connection.utf8:
        messages = messages.decode("utf-8")
        audit = audit.decode("utf-8") if isinstance(audit, bytearray) else audit
    # The turn_ref's unique index tells a duplicate apart: no row inserted, and no read of
    # the turns for the common case. A large commit's JSON comes as UTF-8 bytes, which the
    # driver binds as they are (a str not all ASCII it would convert to UTF-8 whole, holding
    # the GIL), as a BLOB: CAST stores it as the TEXT it is, and leaves text as it is.
    inserted = connection.execute(
        "INSERT INTO turnplug_turns (conversation_id, position, turn_ref, message_count,"
        " messages, audit, committed_at)"
        " VALUES (?, ?, ?, ?, CAST(? AS TEXT), CAST(? AS TEXT),"
        " strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
        " ON CONFLICT (conversation_id, turn_ref) DO NOTHING",
        (conversation_id, turns, turn_ref, count, messages, audit),
    ).rowcount
    if not inserted:
        return "duplicate", 0
    if row is None:
        connection.execute(
            "INSERT INTO turnplug_conversations (conversation_id, length, turns) VALUES (?, ?, 1)",
            (conversation_id, count),
        )
    else:
        connection.execute(
            "UPDATE turnplug_conversations SET length = ?, turns = ? WHERE conversation_id = ?",
            (length + count, turns + 1, conversation_id),
        )
    return "committed", length + count


def _utf8(connection: sqlite3.Connection) -> bool:
    """Whether the database keeps its text in UTF-8, as SQLite does unless a file was made
    otherwise (``PRAGMA encoding``) before turnplug's tables: CAST reads bytes as text in
    the database's encoding."""
    row = connection.execute("PRAGMA encoding").fetchone()
    return row is not None and row[0] == "UTF-8"


def _committed(connection: sqlite3.Connection, conversation_id: str, turn_ref: str) -> bool:
    return (
        connection.execute(
            "SELECT 1 FROM turnplug_turns WHERE conversation_id = ? AND turn_ref = ?",
            (conversation_id, turn_ref),
        ).fetchone()
        is not None
    )


def _load(conversation_id: str, connection: sqlite3.Connection) -> list[tuple[Message, ...]]:
    rows = connection.execute(
        "SELECT turn_ref, messages FROM turnplug_turns WHERE conversation_id = ? ORDER BY position",
        (conversation_id,),
    ).fetchall()
    return [_codec.read_messages(conversation_id, turn_ref, text) for turn_ref, text in rows]


def _entries(conversation_id: str, connection: sqlite3.Connection) -> tuple[LogEntry, ...]:
    rows = connection.execute(
        "SELECT turn_ref, messages, audit, committed_at FROM turnplug_turns"
        " WHERE conversation_id = ? ORDER BY position",
        (conversation_id,),
    ).fetchall()
    return tuple(_codec.read_entry(conversation_id, *row) for row in rows)


def _conversations(connection: sqlite3.Connection) -> tuple[ConversationInfo, ...]:
    rows = connection.execute(
        "SELECT c.conversation_id, c.turns, c.length, max(t.committed_at)"
        " FROM turnplug_conversations AS c JOIN turnplug_turns AS t USING (conversation_id)"
        " GROUP BY c.conversation_id"
    ).fetchall()
    # committed_at is written by strftime('%Y-%m-%dT%H:%M:%fZ'): UTC, which fromisoformat
    # reads from 3.11; a value changed by hand is a StoredDataError (a LogError).
    return _codec.read_conversations(rows)


# The queries DatabaseLog runs for load(), entries() and conversations().
SQLiteLog._load_rows = _load
SQLiteLog._entry_rows = _entries
SQLiteLog._conversation_rows = _conversations
