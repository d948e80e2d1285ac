"""`PostgresLog`: a log shared by several worker processes or machines, with psycopg 3.

psycopg is an optional dependency (``pip install 'turnplug[postgres]'``), imported when a
`PostgresLog` is built. Its sync API runs in worker threads, under trio and asyncio alike
(psycopg's async API is built on asyncio alone); see `._pool`.
"""

import contextlib
import functools
import math
import os
import re
import socket
import struct
import sys
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar, final

from turns import Message

from .._audit import AuditRecord
from .._errors import ConfigError, LogError
from . import _codec
from ._pool import Connections, DatabaseLog
from ._protocol import (
    ConversationInfo,
    LogEntry,
    as_messages,
    check_append,
    conflict,
)

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")

# Forward migrations, as for SQLite: MIGRATIONS[n] takes a database from schema version n to
# n + 1, in one transaction. Never edit a migration that has shipped: add the next one.
MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    (
        """
        CREATE TABLE turnplug_conversations (
            conversation_id text PRIMARY KEY,
            length bigint NOT NULL,  -- messages committed so far
            turns bigint NOT NULL    -- commits so far
        )
        """,
        # JSON is kept as text, exactly as written: jsonb would reorder keys and refuse some
        # strings (\u0000) that a message may hold. Cast to json to query it.
        """
        CREATE TABLE turnplug_turns (
            conversation_id text NOT NULL,
            position bigint NOT NULL,  -- the commit's place in its conversation, from 0
            turn_ref text NOT NULL,
            message_count integer NOT NULL,
            messages text NOT NULL,    -- JSON array of turns.serde messages
            audit text,                -- JSON audit record, or NULL
            committed_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (conversation_id, position),
            UNIQUE (conversation_id, turn_ref)
        )
        """,
        # One commit is one call: one round trip, one transaction. The conversation's row is
        # the lock that orders its commits; commits to other conversations do not wait.
        """
        CREATE FUNCTION turnplug_append(
            p_conversation text, p_turn_ref text, p_count integer, p_messages text,
            p_audit text, p_expected bigint, OUT o_outcome text, OUT o_length bigint
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_turns bigint;
        BEGIN
            SELECT c.length, c.turns INTO o_length, v_turns FROM turnplug_conversations c
                WHERE c.conversation_id = p_conversation FOR UPDATE;
            IF NOT FOUND THEN
                INSERT INTO turnplug_conversations (conversation_id, length, turns)
                    VALUES (p_conversation, 0, 0) ON CONFLICT (conversation_id) DO NOTHING;
                SELECT c.length, c.turns INTO o_length, v_turns FROM turnplug_conversations c
                    WHERE c.conversation_id = p_conversation FOR UPDATE;
            END IF;
            IF EXISTS (SELECT 1 FROM turnplug_turns t
                       WHERE t.conversation_id = p_conversation AND t.turn_ref = p_turn_ref) THEN
                o_outcome := 'duplicate';
                RETURN;
            END IF;
            IF p_expected IS NOT NULL AND p_expected <> o_length THEN
                o_outcome := 'conflict';
                RETURN;
            END IF;
            INSERT INTO turnplug_turns
                (conversation_id, position, turn_ref, message_count, messages, audit)
                VALUES (p_conversation, v_turns, p_turn_ref, p_count, p_messages, p_audit);
            UPDATE turnplug_conversations c SET length = c.length + p_count, turns = c.turns + 1
                WHERE c.conversation_id = p_conversation;
            o_length := o_length + p_count;
            o_outcome := 'committed';
        END
        $$
        """,
    ),
)

_BIGINT = 2**63 - 1

# Serializes migrations of workers starting at once (a transaction-scoped advisory lock).
_MIGRATION_LOCK = zlib.crc32(b"turnplug schema migration")


@final
class PostgresLog(DatabaseLog):
    """A `Log` in a PostgreSQL database, for several worker processes or machines.

    A commit is one statement calling a function the schema defines: it locks the
    conversation's row, checks the turn and the expected length, and inserts, all in one
    transaction, so two workers answering the same conversation can never interleave turns
    (the later one gets `pipeline.LogConflict`). The tables (``turnplug_*``) and the
    function are created, or migrated forward, on first use, in the first schema of the
    connection's ``search_path`` (set ``options=-csearch_path=...`` in the DSN to choose).

    Close the log with ``await log.aclose()`` or use it as ``async with PostgresLog(dsn)
    as log``. The DSN's password never appears in reprs or errors.

    Args:
        dsn: A libpq connection string or a ``postgresql://`` URL.
        max_connections: How many database calls may run at once (each on its own
            connection, opened on demand and kept).
        timeout: Seconds a call may wait before it fails with `pipeline.LogError`. The
            server gives up a commit (or a check made on connecting) that has lasted that
            long, however many locks it waited on (its ``statement_timeout``), and a read
            that has waited that long on one lock (its ``lock_timeout``), rolled back, the
            connection kept; a read is otherwise not bounded, however long a large one
            takes to arrive. A shorter (non-zero) limit the DSN's ``options``,
            ``PGOPTIONS`` (for a DSN without them), the role or the database sets is
            kept; a longer one, or 0, is replaced by ``timeout``. For a server that sends
            nothing for a second longer: the log closes the connection. Over TCP on Linux that is measured silence, however
            long a server still sending takes; elsewhere (a Unix-domain socket, a TCP
            stack that does not report when the server last sent anything, gVisor's say)
            the call's whole length. A call given up on for silence on a connection kept
            from an earlier call is made once more on a new one; a commit given up on for
            silence may have reached the server, and its error says so. Connecting
            waits as long (rounded up to whole seconds, at least 2), unless the DSN gives a
            ``connect_timeout``. A schema migration is not bounded.
        create_tables: False refuses a database without turnplug's tables with
            `pipeline.LogError` instead of creating them, for a reader that must not write
            (``turnplug log``); an older schema is still migrated forward.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 10,
        timeout: float = 10.0,
        create_tables: bool = True,
    ) -> None:
        self._psycopg = _import_psycopg()
        if not isinstance(dsn, str) or not dsn:
            raise ConfigError(f"PostgresLog(dsn) takes a connection string, got {dsn!r}")
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ConfigError(
                f"PostgresLog(max_connections=...) must be an int >= 1, got {max_connections!r}"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise ConfigError(f"PostgresLog(timeout=...) must be seconds > 0, got {timeout!r}")
        if problem := _unpassable(dsn):
            # libpq reads a DSN as a C string in UTF-8: a NUL would silently cut off what
            # follows it (an sslmode, say), and a lone surrogate (undecodable bytes from the
            # command line or the environment) cannot be sent at all.
            raise ConfigError(
                f"PostgresLog(dsn): not a valid connection string or postgresql:// URL ({problem})"
                " — check where the DSN came from"
            )
        try:
            params = self._psycopg.conninfo.conninfo_to_dict(dsn)
        except self._psycopg.Error as exc:
            # The driver's message may quote part of the DSN, password included: drop quotes.
            why = re.sub(r'"[^"]*"', '"..."', str(exc)).strip()
            raise ConfigError(
                f"PostgresLog(dsn): not a valid connection string or postgresql:// URL ({why})"
                " — check its syntax; in a URL, percent-encode spaces and reserved characters"
            ) from None
        if not isinstance(create_tables, bool):
            raise ConfigError(
                f"PostgresLog(create_tables=...) must be True or False, got {create_tables!r}"
            )
        self._create_tables = create_tables
        self._dsn = dsn
        self._name = _describe(params)
        # Messages are sent as UTF-8 whatever the client's PGCLIENTENCODING, the DSN or the
        # role asks: in another encoding (LATIN1, WIN1252) psycopg could not encode an emoji,
        # and the commit would fail with a bare UnicodeEncodeError.
        self._connect_options: dict[str, Any] = {"client_encoding": "utf8"}
        # Bound how long a connection attempt may hold a worker thread, unless the DSN says
        # (libpq counts whole seconds, and psycopg waits at least 2).
        self._timeout = float(timeout)
        if "connect_timeout" not in params:
            self._connect_options["connect_timeout"] = max(2, math.ceil(self._timeout))
        # Where the server's settings a connection asks for come from: the DSN's options, or
        # PGOPTIONS, which libpq reads for a DSN without options.
        self._options_from = "the DSN's" if "options" in params else "PGOPTIONS'"
        # The server's lock_timeout and statement_timeout on the log's connections, in
        # milliseconds, and where a shorter one the log kept comes from (None: the log's).
        self._milliseconds = max(1, math.ceil(self._timeout * 1000))
        self._limits: dict[str, tuple[int, str | None]] = dict.fromkeys(
            _LIMITS, (self._milliseconds, None)
        )
        self._watchdog = _Watchdog(f"{self!r} watchdog")
        weakref.finalize(self, self._watchdog.stop)
        self._migrated = False
        self._connections: Connections[psycopg.Connection[Any]] = Connections(
            size=max_connections,
            connect=self._connect,
            close=_close,
            usable=lambda connection: not (connection.closed or connection.broken),
            translate=self._translate,
            name=repr(self),
        )

    def __repr__(self) -> str:
        return f"PostgresLog({self._name!r})"

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
        stored = await self._stored(conversation_id, turn_ref, messages, audit)
        # A length no bigint holds is one no conversation has: a conflict, as in every log.
        expected = expected_length if expected_length is None else min(expected_length, _BIGINT)
        work = functools.partial(
            _append, conversation_id, turn_ref, len(messages), *stored, expected
        )
        what = f"committing turn {turn_ref!r} of conversation {conversation_id!r}"
        outcome, length = await self._connections.run(self._bounded(work, what))
        if outcome == "conflict":
            assert expected_length is not None
            raise conflict(conversation_id, turn_ref, length, expected_length)

    # -- inside worker threads -------------------------------------------------------------

    def _connect(self) -> "psycopg.Connection[Any]":
        connection: psycopg.Connection[Any] = self._psycopg.connect(
            self._dsn, autocommit=True, **self._connect_options
        )
        try:
            check_server_version(connection.info.server_version, repr(self))
            connection.adapters.register_dumper(bytearray, _utf8_text(self._psycopg))
            if self._bounded(self._prepare, "opening a connection")(connection):
                # Not bounded by the timeout: a migration may take long, and a log opening
                # meanwhile must wait for it (on its lock), not fail.
                _migrate(connection, repr(self))
                self._migrated = True
        except BaseException:
            _close(connection)
            raise
        return connection

    def _prepare(self, connection: "psycopg.Connection[Any]") -> bool:
        """Set the connection up; whether the schema needs migrating."""
        # The server gives up a statement that lasted the log's timeout (statement_timeout,
        # however many locks it waited on) or waited that long on one lock (lock_timeout),
        # and rolls it back: a clean error, a usable connection. Reads lift the first
        # (`_unlimited`): a large read still sending to a slow client is not ended. A
        # shorter limit set elsewhere (the DSN, PGOPTIONS, the role) is kept; a longer one,
        # or none (0), would leave a live server silent past the watchdog's limit.
        milliseconds = self._milliseconds
        # Racing commits are ordered by the conversation's row lock, and the one that waited
        # must then see the other's commit and report a LogConflict: at READ COMMITTED, each
        # statement sees what was committed before it. A stricter default the DSN, the role
        # or the database sets (repeatable read, serializable) would fail it with a
        # serialization failure instead, and a migration waiting on another's would not
        # see the version it wrote.
        connection.execute("SET default_transaction_isolation = 'read committed'")
        rows = connection.execute(
            "SELECT name, setting, source, kept,"
            " set_config(name, CASE WHEN kept THEN setting ELSE %s END, false)"
            " FROM (SELECT name, setting, source, setting::bigint BETWEEN 1 AND %s AS kept"
            " FROM pg_settings WHERE name = ANY(%s)) AS s",
            (str(milliseconds), milliseconds, list(_LIMITS)),
        ).fetchall()
        for name, setting, source, kept, _ in rows:
            if kept:
                self._limits[name] = (int(setting), self._source(str(source)))
            else:
                self._limits[name] = (milliseconds, None)
        if self._migrated:
            return False
        if _migrated(connection, repr(self), create=self._create_tables):
            self._migrated = True
            return False
        return True

    def _bounded(self, work: Callable[[Any], T], what: str) -> Callable[[Any], T]:
        """`work` given up on after the log's timeout: the server's own statement_timeout
        ends a commit that lasted that long, and its lock_timeout a read waiting that long
        on a lock; a server that sends nothing for a second longer has its connection shut
        (`_Watchdog`), which ends the call where it waits."""
        driver = self._psycopg
        watchdog = self._watchdog
        deadline = self._timeout + _GRACE

        def bounded(connection: "psycopg.Connection[Any]") -> T:
            started = time.monotonic()
            armed = watchdog.arm(connection.fileno(), deadline)
            try:
                return work(connection)
            except driver.Error as exc:
                measured = watchdog.disarm(armed)
                if measured is not None:
                    raise _TimedOut(what, measured=measured) from exc
                # Told apart by SQLSTATE: the message is in the server's lc_messages.
                if exc.sqlstate in (_LOCK_NOT_AVAILABLE, _QUERY_CANCELED):
                    raise _Refused(what, exc.sqlstate, time.monotonic() - started) from exc
                raise
            finally:
                watchdog.disarm(armed)

        return bounded

    async def aclose(self) -> None:
        await super().aclose()
        self._watchdog.stop()

    # -- the seam -------------------------------------------------------------------------

    def _translate(self, exc: Exception) -> LogError | None:
        why = self._why(exc)
        if why is None:
            return None
        # A kept connection that went silent is closed and the call made once more on a new
        # one (`Connections`): the failure of that second try is raised in handling the
        # first, which the error must tell too.
        first = _earlier_silence(exc)
        if first is not None:
            silence = self._silence(first)
            if isinstance(exc, _TimedOut):
                why = (
                    f"{first.what} was given up on twice: the server {silence} on a kept"
                    " connection, then on a new one, so the log closed both (a hung server or"
                    f" a dropped network){self._unsure(first)} — check the server and the"
                    " network, or give PostgresLog a longer timeout="
                )
            else:
                why = (
                    f"{first.what} was given up on: the server {silence} on a kept connection,"
                    " so the log closed it and tried once more on a new connection, which"
                    f" failed{self._unsure(first)}; {why}"
                )
        return LogError(f"{self!r}: {why}", log=repr(self))

    def _silence(self, exc: "_TimedOut") -> str:
        limit = f"{self._timeout + _GRACE:g} s (timeout={self._timeout:g} s, plus {_GRACE:g})"
        if exc.measured:
            return f"sent nothing for {limit}"
        return (
            f"had not answered in full after {limit} (over a connection that is not TCP on"
            " Linux, a Unix-domain socket say, or whose TCP stack does not report when the"
            " server last sent anything, gVisor's say, the log cannot see whether the server"
            " is still sending, so it bounds the whole call)"
        )

    def _source(self, source: str) -> str:
        """Who set a server setting, from its pg_settings.source."""
        return {
            "client": self._options_from,
            "user": "the role's",
            "database": "the database's",
            "database user": "the role's in this database",
        }.get(source, "the server's configured")

    def _limit(self, name: str) -> tuple[str, str]:
        """The limit the server's `name` (lock_timeout, statement_timeout) puts on the
        log's calls, as errors name it, and how to make it longer."""
        milliseconds, source = self._limits[name]
        if source is None:
            return f"timeout={self._timeout:g} s (the server's {name})", (
                "give PostgresLog a longer timeout="
            )
        return f"{source} {name} ({milliseconds} ms)", f"raise {source} {name}"

    @staticmethod
    def _unsure(exc: "_TimedOut") -> str:
        if not exc.what.startswith("committing "):
            return ""
        return (
            "; the commit may have reached the server, which then finished or rolled it back"
            " whole: load the conversation to know whether it holds the turn (a session"
            " reloads it before its next turn)"
        )

    def _why(self, exc: Exception) -> str | None:
        if isinstance(exc, _TimedOut):
            return (
                f"{exc.what} was given up on: the server {self._silence(exc)}, so the log"
                f" closed the connection{self._unsure(exc)} — check the server and the"
                " network, or give PostgresLog a longer timeout="
            )
        if isinstance(exc, _Refused) and exc.sqlstate == _LOCK_NOT_AVAILABLE:
            limit, longer = self._limit("lock_timeout")
            why = (
                f"{exc.what} waited longer than {limit} for a lock another transaction holds"
                " (lock_not_available): the server gave it up, nothing of it was committed,"
                " and the log stays usable — retry, find what holds the lock (pg_locks,"
                f" pg_stat_activity), or {longer}"
            )
        elif (
            isinstance(exc, _Refused) and exc.elapsed >= self._limits["statement_timeout"][0] / 1000
        ):
            limit, longer = self._limit("statement_timeout")
            why = (
                f"{exc.what} waited longer than {limit}, kept waiting by a lock another"
                " transaction holds or by an overloaded server (query_canceled): the server"
                " gave it up, nothing of it was committed, and the log stays usable — retry,"
                " find what holds the lock or loads the server (pg_locks, pg_stat_activity),"
                f" or {longer}"
            )
        elif isinstance(exc, _Refused):
            why = (
                f"{exc.what} was cancelled by the server before any timeout (query_canceled:"
                " an administrator's pg_cancel_backend, say): nothing of it was committed,"
                " and the log stays usable — retry"
            )
        elif isinstance(exc, self._psycopg.errors.ConnectionTimeout):
            seconds = self._connect_options.get("connect_timeout", "the DSN's connect_timeout")
            why = (
                f"opening a connection: cannot reach the database, which did not answer within"
                f" {seconds} s"
                " (connect_timeout) — check that the server is running and the DSN's host and"
                " port"
            )
        elif isinstance(exc, _codec.StoredDataError):
            why = f"{exc} — the row was changed by something other than turnplug"
        elif isinstance(exc, self._psycopg.OperationalError) and "connection" in str(exc):
            first = str(exc).strip().splitlines()[0]
            why = (
                f"cannot reach the database ({first}) — check that the server is running and"
                " the DSN's host, port, user and database name"
            )
        elif isinstance(exc, self._psycopg.Error):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            why = f"PostgreSQL failed: {type(exc).__name__}: {first}"
        else:
            return None
        return why


# How much longer than its timeout a call waits for a server that sends nothing before
# closing its connection: time for the server's own statement_timeout or lock_timeout to
# end a commit waiting on a lock cleanly first, its answer on the way.
_GRACE = 1.0

# The oldest PostgreSQL the log works with, as libpq numbers versions (major * 10000 +
# minor): before 13, a server timed a message of several statements as one for
# statement_timeout, which would end a long read (`_unlimited`).
MIN_SERVER_VERSION = 130000


def check_server_version(version: int, name: str) -> None:
    """Refuse a server older than `MIN_SERVER_VERSION` (`version` as libpq gives it), with
    a `LogError` naming its version and the oldest the log works with."""
    if version >= MIN_SERVER_VERSION:
        return
    if version >= 100000:
        shown = f"{version // 10000}.{version % 10000}"
    else:  # 9.6.24 is 90624
        shown = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    raise LogError(
        f"{name}: the server runs PostgreSQL {shown}, older than the"
        f" {MIN_SERVER_VERSION // 10000} a PostgresLog needs — upgrade the server",
        log=name,
    )


# The server's settings that bound the log's calls, set on each connection.
_LIMITS = ("lock_timeout", "statement_timeout")

# The SQLSTATEs of a statement the server gave up: waiting on a lock (lock_timeout), and
# cancelled (statement_timeout, pg_cancel_backend).
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"

# A connection outside any transaction: libpq's PQTRANS_IDLE, psycopg's
# pq.TransactionStatus.IDLE (psycopg is imported only when a log is built).
_IDLE = 0


class _TimedOut(Exception):
    """A call the watchdog gave up on (its connection is closed): `what` it was, and
    whether the server's silence was `measured` or only the call's duration."""

    def __init__(self, what: str, *, measured: bool) -> None:
        super().__init__(what)
        self.what = what
        self.measured = measured


def _earlier_silence(exc: BaseException) -> _TimedOut | None:
    """The silence of a kept connection that `exc`, the failure of the call's second try,
    was raised in handling (its context, a few links back), or None."""
    seen: set[int] = {id(exc)}
    earlier = exc.__context__
    while earlier is not None and id(earlier) not in seen:
        if isinstance(earlier, _TimedOut):
            return earlier
        seen.add(id(earlier))
        earlier = earlier.__context__
    return None


class _Refused(Exception):
    """A statement the server gave up (`sqlstate` says why), rolled back: `what` it was,
    and how many seconds the call had lasted (`elapsed`: a cancel that came no sooner than
    the statement_timeout is that timeout's; the SQLSTATE is the same)."""

    def __init__(self, what: str, sqlstate: str, elapsed: float) -> None:
        super().__init__(what)
        self.what = what
        self.sqlstate = sqlstate
        self.elapsed = elapsed


@final
class _Watchdog:
    """A thread of the log's own that shuts the socket of a call whose server went silent.

    A psycopg call blocks its worker thread until the server answers; nothing else can
    interrupt it. Shutting its socket down makes it fail at once, the connection broken.
    Over TCP on Linux the kernel says how long ago the server last sent anything (data, or
    the acknowledgement of data the log sent, not of a TCP keepalive probe: `_silence`), so
    a call is given up on only after that long a silence, however long a server still
    sending takes; elsewhere (a Unix-domain socket, another system) a call is given up on
    that long after it started.
    Started on the first call, ended with the log.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Condition()
        # token: (when to look next, when the call started, its limit, the socket)
        self._armed: dict[int, tuple[float, float, float, int]] = {}
        self._fired: dict[int, bool] = {}  # token: whether its silence was measured
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stopped = False

    def arm(self, fileno: int, seconds: float) -> int:
        with self._lock:
            self._next += 1
            token = self._next
            was_idle = not self._armed
            now = time.monotonic()
            self._armed[token] = (now + seconds, now, seconds, fileno)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            elif was_idle:
                # Limits are all alike, so a call looks no sooner than those armed
                # before it: only the first needs the thread to look again.
                self._lock.notify()
        return token

    def disarm(self, token: int) -> bool | None:
        """Take the call off: None if its socket was left alone, else whether it was shut
        for a measured silence (True) or, where silence cannot be measured, for the
        call's duration (False)."""
        with self._lock:
            self._armed.pop(token, None)
            return self._fired.pop(token, None)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify()

    def _serve(self) -> None:
        with self._lock:
            while not self._stopped:
                now = time.monotonic()
                for token, (due, started, limit, fileno) in list(self._armed.items()):
                    if due > now:
                        continue
                    silence = _silence(fileno)
                    quiet = now - started if silence is None else min(now - started, silence)
                    if quiet < limit:
                        # The server sent something meanwhile: look again once it could
                        # have been silent for the whole limit.
                        self._armed[token] = (now + limit - quiet, started, limit, fileno)
                        continue
                    del self._armed[token]
                    self._fired[token] = silence is not None
                    _shut(fileno)
                wait = min((due for due, *_ in self._armed.values()), default=None)
                self._lock.wait(None if wait is None else max(wait - now, 0.005))


# struct tcp_info (linux/tcp.h, a stable part of the kernel's ABI), the fields read:
# tcpi_state, the byte at 0 (TCP_ESTABLISHED is 1); tcpi_snd_mss and tcpi_rcv_mss, the 32-bit
# sizes at bytes 16 and 20, which Linux fills in on every established connection (and gVisor's
# netstack, which fills in the state but not the times, leaves at 0); tcpi_unacked, the 32-bit
# count at byte 24 of segments sent and not yet acknowledged; and the four 32-bit fields from
# byte 44, milliseconds since the log last sent data (tcpi_last_data_sent) and acknowledged
# data (tcpi_last_ack_sent, unused), and since the server last sent data (tcpi_last_data_recv)
# and acknowledged anything (tcpi_last_ack_recv).
_TCP_INFO = getattr(socket, "TCP_INFO", None) if sys.platform.startswith("linux") else None
_ESTABLISHED = 1
_SEGMENT_SIZES = struct.Struct("=II")
_SEGMENT_SIZES_AT = 16
_UNACKED = struct.Struct("=I")
_UNACKED_AT = 24
_TIMES = struct.Struct("=IIII")
_TIMES_AT = 44


def _silence(fileno: int) -> float | None:
    """Seconds since the server at the other end of the TCP socket `fileno` last sent
    anything that shows it alive (`_silence_in`). None where the system cannot say (not
    Linux, not TCP, a TCP stack that does not fill tcp_info's times in): the caller then
    bounds the whole call."""
    if _TCP_INFO is None:
        return None
    try:
        with socket.socket(fileno=os.dup(fileno)) as duplicate:
            if duplicate.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            info = duplicate.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 64)
    except OSError:
        return None
    return _silence_in(info)


def _silence_in(info: bytes) -> float | None:
    """Seconds since the server last showed itself alive, read from a socket's `info`
    (struct tcp_info): data it sent, or its acknowledgement of data the log sent (a commit
    still being uploaded). None if `info` cannot say: too short, not of an established
    connection, or without the segment sizes Linux always fills in on one. A stack that
    leaves the times at zero would read as a server that just spoke, however long it has
    been silent: gVisor's netstack fills in the state (established), the round-trip times
    and the congestion window, but no time since anything was sent or received, nor the
    segment sizes.

    An acknowledgement counts only while data the log sent awaits one: with none in flight,
    the server's kernel also acknowledges TCP keepalive probes, however hung the server
    process is, and would pass for an answer every keepalive interval. Then the last
    acknowledgement of data came after that data was sent: the time since the log last sent
    data bounds it."""
    if len(info) < _TIMES_AT + _TIMES.size or info[0] != _ESTABLISHED:
        return None
    if 0 in _SEGMENT_SIZES.unpack_from(info, _SEGMENT_SIZES_AT):
        return None
    (unacked,) = _UNACKED.unpack_from(info, _UNACKED_AT)
    sent, _, received, acknowledged = _TIMES.unpack_from(info, _TIMES_AT)
    heard = acknowledged if unacked else sent
    return min(int(received), int(heard)) / 1000


def _shut(fileno: int) -> None:
    """End what a blocked call waits for on the socket `fileno`: it reads the end of the
    connection at once. (The socket is the connection's: only a duplicate is closed.)"""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fileno)) as duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)


def _import_psycopg() -> ModuleType:
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "PostgresLog needs psycopg 3, which is not installed — pip install 'turnplug[postgres]'"
        ) from None
    return psycopg


def _unpassable(dsn: str) -> str | None:
    """What keeps `dsn` from reaching libpq whole, saying where without quoting it (it may
    hold a password), or None."""
    nul = dsn.find("\x00")
    if nul >= 0:
        return f"it holds a NUL character at position {nul}"
    if dsn.strip().startswith(("postgresql://", "postgres://")):
        # A URL cannot hold whitespace (RFC 3986); libpq before 18 read it into the value
        # (a password with a space worked there and failed under libpq 18): refused whatever
        # libpq the driver brings, so the same DSN means the same thing everywhere. At its
        # ends it is no part of the URL: said apart, as percent-encoding it would be wrong.
        ends = [end for end, at in (("start", 0), ("end", -1)) if dsn[at].isspace()]
        if ends:
            return (
                f"the URL has whitespace at its {' and '.join(ends)}, a newline from a file or"
                " an environment variable perhaps: remove it"
            )
        for position, character in enumerate(dsn):
            if character.isspace():
                return (
                    f"the URL holds whitespace at position {position}:"
                    " percent-encode it, a space as %20"
                )
    if not dsn.isascii():
        for position, character in enumerate(dsn):
            if "\ud800" <= character <= "\udfff":
                return (
                    f"it holds a lone surrogate at position {position}: undecodable bytes"
                    " from the command line or the environment, which UTF-8 cannot encode"
                )
    return None


def _describe(params: dict[str, Any]) -> str:
    """The DSN as a URL without its password: what reprs and errors show."""
    user = f"{params['user']}@" if params.get("user") else ""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = f":{params['port']}" if params.get("port") else ""
    database = f"/{params['dbname']}" if params.get("dbname") else ""
    return f"postgresql://{user}{host}{port}{database}"


def _close(connection: "psycopg.Connection[Any]") -> None:
    # Closing a broken connection: there is nothing more to release.
    with contextlib.suppress(Exception):
        connection.close()


def _migrated(connection: "psycopg.Connection[Any]", name: str, *, create: bool) -> bool:
    """Whether the schema is the latest (the common case: no lock needed); refuses a
    database without one when it must not be created."""
    version = _version(connection)
    if version == len(MIGRATIONS):
        return True
    if version is None and not create:
        row = connection.execute("SELECT current_schema()").fetchone()
        schema = row[0] if row is not None else None
        where = f"schema {schema!r}" if schema is not None else "no schema (an empty search_path)"
        raise LogError(
            f"{name}: the database holds no turnplug log (no turnplug_schema table in {where});"
            " nothing was created — pass the DSN the turns were committed to (add"
            " options=-csearch_path=SCHEMA if they are in another schema)",
            log=name,
        )
    return False


def _migrate(connection: "psycopg.Connection[Any]", name: str) -> None:
    latest = len(MIGRATIONS)
    with connection.transaction():
        # A migration takes as long as it takes, and so does waiting for another process's.
        connection.execute("SET LOCAL lock_timeout = 0")
        connection.execute("SET LOCAL statement_timeout = 0")
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        connection.execute("CREATE TABLE IF NOT EXISTS turnplug_schema (version integer NOT NULL)")
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
        connection.execute("INSERT INTO turnplug_schema (version) VALUES (%s)", (latest,))


def _version(connection: "psycopg.Connection[Any]") -> int | None:
    row = connection.execute("SELECT to_regclass('turnplug_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return None
    row = connection.execute("SELECT max(version) FROM turnplug_schema").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


def _append(
    conversation_id: str,
    turn_ref: str,
    count: int,
    messages: str | bytearray,
    audit: str | bytearray | None,
    expected_length: int | None,
    connection: "psycopg.Connection[Any]",
) -> tuple[str, int]:
    row = connection.execute(
        "SELECT o_outcome, o_length FROM turnplug_append("
        "%s::text, %s::text, %s::integer, %s::text, %s::text, %s::bigint)",
        (conversation_id, turn_ref, count, messages, audit, expected_length),
    ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


@functools.cache
def _utf8_text(driver: ModuleType) -> type:
    """psycopg's dumper for a large commit's JSON, UTF-8 in a bytearray (`DatabaseLog._stored`):
    sent as it is, as text in binary format (for text, its bytes in the client encoding,
    UTF-8 here), where psycopg would send a bytearray as bytea, and a str not all ASCII it
    would convert to UTF-8 whole, holding the GIL. Registered on the log's connections
    alone."""

    class Utf8Text(driver.adapt.Dumper):  # type: ignore[name-defined,misc]
        format = driver.pq.Format.BINARY
        oid = driver.postgres.types["text"].oid

        def dump(self, obj: bytearray) -> bytearray:
            return obj

    return Utf8Text


def _unlimited(
    connection: "psycopg.Connection[Any]", query: LiteralString, params: Sequence[object] = ()
) -> list[tuple[Any, ...]]:
    """The rows of `query`, a read of a conversation or a listing, in a transaction no
    statement_timeout ends, however long it takes to send to a slow client (the watchdog
    still gives up on a silent server, and lock_timeout on a lock).

    One round trip: BEGIN, SET LOCAL, the query and COMMIT go to the server as one message
    (the simple query protocol, which takes several statements; psycopg's ClientCursor
    quotes the parameters into it). The server times each statement of it alone, so the
    query runs with no statement_timeout. (Pipeline mode sends them as four messages and
    costs more in psycopg than the round trips it saves on loopback.) If a statement
    fails, the server skips the rest, COMMIT included, leaving the transaction aborted: it
    is rolled back here, so that the connection stays usable.
    """
    from psycopg import ClientCursor

    cursor = ClientCursor(connection)
    try:
        cursor.execute(
            "BEGIN; SET LOCAL statement_timeout = 0; " + query + "; COMMIT",
            params,
        )
        cursor.nextset()  # past BEGIN's result
        cursor.nextset()  # and SET's: the query's
        return cursor.fetchall()
    except BaseException:
        if not connection.closed and connection.info.transaction_status != _IDLE:
            try:
                connection.rollback()
            except Exception:
                _close(connection)  # unusable: the next call opens a new one
        raise
    finally:
        cursor.close()


def _load(conversation_id: str, connection: "psycopg.Connection[Any]") -> list[tuple[Message, ...]]:
    rows = _unlimited(
        connection,
        "SELECT turn_ref, messages FROM turnplug_turns WHERE conversation_id = %s"
        " ORDER BY position",
        (conversation_id,),
    )
    return [_codec.read_messages(conversation_id, turn_ref, text) for turn_ref, text in rows]


def _entries(conversation_id: str, connection: "psycopg.Connection[Any]") -> tuple[LogEntry, ...]:
    rows = _unlimited(
        connection,
        "SELECT turn_ref, messages, audit, committed_at FROM turnplug_turns"
        " WHERE conversation_id = %s ORDER BY position",
        (conversation_id,),
    )
    return tuple(_codec.read_entry(conversation_id, *row) for row in rows)


def _conversations(connection: "psycopg.Connection[Any]") -> tuple[ConversationInfo, ...]:
    rows = _unlimited(
        connection,
        "SELECT c.conversation_id, c.turns, c.length, max(t.committed_at)"
        " FROM turnplug_conversations AS c JOIN turnplug_turns AS t USING (conversation_id)"
        " GROUP BY c.conversation_id, c.turns, c.length",
    )
    return _codec.read_conversations(rows)


# The queries DatabaseLog runs for load(), entries() and conversations().
PostgresLog._load_rows = _load
PostgresLog._entry_rows = _entries
PostgresLog._conversation_rows = _conversations
