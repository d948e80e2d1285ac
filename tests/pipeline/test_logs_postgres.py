"""PostgresLog: what only PostgreSQL shows (the schema, migrations, connections, the seam).

What every log does is in test_logs.py, which runs against PostgresLog too. Each test here
works in a fresh schema of the test server (the `postgres` fixture, tests/postgres.py).
"""

import contextlib
import datetime
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from functools import partial

import anyio
import pytest

from pipeline import ConfigError, LogConflict, LogError, Pipeline
from pipeline.logs import PostgresLog, _postgres, entry_to_dict
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Message, Text

from ..logs import Rendezvous
from ..postgres import with_params


def exchange(question: str, answer: str) -> tuple[Message, ...]:
    return (Message.user(question), Message.assistant(answer))


def admin(dsn: str):
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


async def committed(dsn: str, *turns: str) -> None:
    async with PostgresLog(dsn) as log:
        for turn in turns:
            await log.append("c", turn, exchange(f"q {turn}", f"a {turn}"))


# -- building one (no server needed) --------------------------------------------------------


def test_repr_and_errors_never_show_the_password():
    log = PostgresLog("postgresql://ada:s3cret-pw@db.internal:6543/chats")

    assert repr(log) == "PostgresLog('postgresql://ada@db.internal:6543/chats')"


def test_a_key_value_dsn_is_described_as_a_url_without_its_password():
    log = PostgresLog("host=db.internal port=6543 dbname=chats user=ada password=s3cret-pw")

    assert repr(log) == "PostgresLog('postgresql://ada@db.internal:6543/chats')"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://ada:s3cret pw@db/chats",
        "postgres://ada:s3cret-pw@db/chats\n",
        "host='db password=s3cret-pw",
        "not a dsn",
        # libpq would cut the DSN at the NUL, silently dropping the sslmode after it.
        "postgresql://ada:s3cret-pw@db/chats\x00?sslmode=require",
        # Undecodable bytes from the command line: no UTF-8 to send.
        "postgresql://ada:s3cret-pw@db\udc80/chats",
    ],
)
def test_a_malformed_dsn_is_a_config_error_that_does_not_echo_it(dsn):
    """Also catches a DSN holding a NUL being cut short by libpq without a word, one
    holding a lone surrogate failing with a bare UnicodeEncodeError, and a URL holding a raw
    space taken as part of the password by the libpq before 18 that psycopg's binary
    wheels up to 3.2 bring (refused only by libpq 18)."""
    with pytest.raises(ConfigError, match="not a valid connection string") as excinfo:
        PostgresLog(dsn)

    assert "s3cret" not in str(excinfo.value)


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("postgresql://ada:s3cret-pw@db/chats\n", "whitespace at its end, a newline from a file"),
        ("\tpostgres://ada:s3cret-pw@db/chats", "whitespace at its start, a newline from a file"),
        (" postgresql://ada:s3cret-pw@db/chats\r\n", "whitespace at its start and end, a newline"),
        ("postgresql://ada:s3cret pw@db/chats", "whitespace at position 23: percent-encode it"),
    ],
)
def test_whitespace_around_a_url_is_to_be_removed_and_inside_it_percent_encoded(dsn, said):
    """Bug caught: a URL ending in a newline (read from a file or an environment variable)
    was told to percent-encode it, which would put the newline in the database's name,
    instead of removing it."""
    with pytest.raises(ConfigError) as excinfo:
        PostgresLog(dsn)

    message = str(excinfo.value)
    assert said in message
    assert ("remove it" in message) == ("position" not in message)
    assert "s3cret" not in message
    # One pair of parentheses, around what is wrong, none nested inside it.
    assert (message.count("("), message.count(")")) == (2, 2)  # PostgresLog(dsn) and (...)


@pytest.mark.parametrize(
    ("args", "kwargs", "culprit"),
    [
        (("",), {}, "dsn"),
        ((None,), {}, "dsn"),
        (("postgresql://db/chats",), {"max_connections": 0}, "max_connections"),
        (("postgresql://db/chats",), {"max_connections": True}, "max_connections"),
        (("postgresql://db/chats",), {"create_tables": "no"}, "create_tables"),
        (("postgresql://db/chats",), {"timeout": 0}, "timeout"),
        (("postgresql://db/chats",), {"timeout": "10"}, "timeout"),
    ],
)
def test_bad_arguments_fail_when_the_log_is_built(args, kwargs, culprit):
    with pytest.raises(ConfigError, match=culprit):
        PostgresLog(*args, **kwargs)


def test_without_psycopg_the_package_imports_and_postgres_log_says_what_to_install():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None  # as if it were not installed
        from pipeline import ConfigError
        from pipeline.logs import PostgresLog, SQLiteLog
        try:
            PostgresLog("postgresql://db/chats")
        except ConfigError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    assert "pip install 'turnplug[postgres]'" in done.stdout


# -- the schema -----------------------------------------------------------------------------


async def test_the_tables_and_function_are_created_in_the_dsns_schema(postgres):
    await committed(postgres, "t1")

    with admin(postgres) as db:
        schema = db.execute("SELECT current_schema()").fetchone()[0]
        tables = db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
            " ORDER BY table_name",
            (schema,),
        ).fetchall()
        version = db.execute("SELECT version FROM turnplug_schema").fetchall()
        rows = db.execute(
            "SELECT conversation_id, position, turn_ref, message_count FROM turnplug_turns"
        ).fetchall()
    assert tables == [("turnplug_conversations",), ("turnplug_schema",), ("turnplug_turns",)]
    assert version == [(len(_postgres.MIGRATIONS),)]
    assert rows == [("c", 0, "t1", 2)]


async def test_workers_starting_together_on_an_empty_database_migrate_it_once(postgres):
    logs = [PostgresLog(postgres) for _ in range(4)]
    try:
        async with anyio.create_task_group() as nursery:
            for index, log in enumerate(logs):
                nursery.start_soon(log.append, f"c{index}", "t1", exchange("q", "a"))
    finally:
        for log in logs:
            await log.aclose()

    with admin(postgres) as db:
        assert db.execute("SELECT version FROM turnplug_schema").fetchall() == [(1,)]
        assert db.execute("SELECT count(*) FROM turnplug_turns").fetchone() == (4,)


EXTRA_MIGRATION = ("CREATE INDEX turnplug_turns_by_time ON turnplug_turns (committed_at)",)


async def test_an_older_database_is_migrated_forward_keeping_its_turns(postgres, monkeypatch):
    await committed(postgres, "t1")
    monkeypatch.setattr(_postgres, "MIGRATIONS", (*_postgres.MIGRATIONS, EXTRA_MIGRATION))

    async with PostgresLog(postgres) as log:
        loaded = await log.load("c")

    with admin(postgres) as db:
        version = db.execute("SELECT version FROM turnplug_schema").fetchall()
        index = db.execute("SELECT to_regclass('turnplug_turns_by_time') IS NOT NULL").fetchone()
    assert (version, index) == ([(2,)], (True,))
    assert loaded == Context(messages=exchange("q t1", "a t1"))


async def test_a_failing_migration_changes_nothing(postgres, monkeypatch):
    await committed(postgres, "t1")
    broken = ("CREATE TABLE turnplug_extra (x text)", "CREATE INDEX nope ON missing (x)")
    monkeypatch.setattr(_postgres, "MIGRATIONS", (*_postgres.MIGRATIONS, broken))

    with pytest.raises(LogError, match="missing"):
        async with PostgresLog(postgres):
            pass

    with admin(postgres) as db:
        assert db.execute("SELECT version FROM turnplug_schema").fetchall() == [(1,)]
        assert db.execute("SELECT to_regclass('turnplug_extra')").fetchone() == (None,)


async def test_a_migration_longer_than_the_timeout_finishes_and_a_log_opening_meanwhile_waits(
    postgres, monkeypatch
):
    """Bug caught: a migration was bounded by the log's timeout, so one taking longer (a
    large table) was cancelled by the server every time the log was opened, and a second
    process opening the log meanwhile gave up waiting for the first's migration lock; both
    open now, the migration done once."""
    await committed(postgres, "t1")
    slow = ("SELECT pg_sleep(1.5)",)  # stands for a migration over a large table
    monkeypatch.setattr(_postgres, "MIGRATIONS", (*_postgres.MIGRATIONS, slow))
    opened = []

    async def open_log() -> None:
        async with PostgresLog(postgres, timeout=0.5) as log:
            opened.append(await log.load("c"))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(open_log)
            task_group.start_soon(open_log)

    assert opened == [Context(messages=exchange("q t1", "a t1"))] * 2
    with admin(postgres) as db:
        assert db.execute("SELECT version FROM turnplug_schema").fetchall() == [(2,)]


async def test_a_database_from_a_newer_turnplug_is_refused_with_both_versions(postgres):
    await committed(postgres, "t1")
    with admin(postgres) as db:
        db.execute("UPDATE turnplug_schema SET version = 99")

    with pytest.raises(LogError) as excinfo:
        async with PostgresLog(postgres):
            pass

    message = str(excinfo.value)
    assert "version 99" in message
    assert "upgrade turnplug" in message


# -- connections ----------------------------------------------------------------------------


async def test_concurrent_calls_use_at_most_max_connections(postgres):
    tagged = with_params(postgres, application_name="turnplug-cap")

    async with PostgresLog(tagged, max_connections=3) as log:

        async def commit(index: int) -> None:
            await log.append(f"c{index}", "t1", exchange("q", "a"))

        async with anyio.create_task_group() as nursery:
            for index in range(12):
                nursery.start_soon(commit, index)
        with admin(postgres) as db:
            peak = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'turnplug-cap'"
            ).fetchone()[0]

    assert 1 <= peak <= 3


@pytest.mark.parametrize("level", ["repeatable\\ read", "serializable"])
async def test_racing_sessions_lose_with_a_log_conflict_whatever_isolation_the_dsn_sets(
    postgres, level
):
    """Bug caught: with a stricter default_transaction_isolation (set by the DSN, the role
    or the database), the commit that waited on the conversation's row lock failed with a
    LogError (a serialization failure) instead of a LogConflict."""
    rendezvous = Rendezvous()

    async def answer(request):
        await rendezvous.meet()
        return f"re: {request.messages[-1].text}"

    pipe = Pipeline(model=FunctionModel(answer))
    dsn = with_options(postgres, f"-c default_transaction_isolation={level}")
    outcomes: list[str] = []

    async def race(session, text: str) -> None:
        try:
            await session.send(text)
            outcomes.append("committed")
        except LogConflict:
            outcomes.append("conflict")

    async with (
        PostgresLog(dsn) as first,
        PostgresLog(dsn) as second,
        pipe.session(log=first, conversation_id="c") as a,
        pipe.session(log=second, conversation_id="c") as b,
    ):
        for round_ in range(3):  # the conversation's first commit, then later ones
            rendezvous.reset()
            async with anyio.create_task_group() as nursery:
                nursery.start_soon(race, a, f"a{round_}")
                nursery.start_soon(race, b, f"b{round_}")
        stored = await first.load("c")

    assert outcomes.count("committed") == outcomes.count("conflict") == 3
    assert len(stored.messages) == 6


@pytest.mark.parametrize(("first", "then"), [("trio", "asyncio"), ("asyncio", "trio")])
def test_a_log_used_under_the_other_kind_of_loop_is_refused_naming_both(postgres, first, then):
    """Bug caught: a log used under trio and then under asyncio (or the reverse) failed with
    the other loop's own error from inside AnyIO ("must be called from async context", "no
    running event loop"), naming neither the log nor the cause: its connection limiter
    belongs to the kind of loop that used it first."""
    log = PostgresLog(postgres)
    anyio.run(log.append, "c", "t1", exchange("q", "a"), backend=first)

    with pytest.raises(RuntimeError) as caught:
        anyio.run(log.append, "c", "t2", exchange("q", "a"), backend=then)

    message = str(caught.value)
    assert repr(log) in message
    assert f"first used under {first} and is now used under {then}" in message
    entries = anyio.run(log.entries, "c", backend=first)
    assert [entry.turn_ref for entry in entries] == ["t1"]
    anyio.run(log.aclose, backend=first)


def drop_connections(dsn: str, application_name: str) -> int:
    """End the server side of every connection tagged `application_name`, as a server
    restart or an idle timeout would; how many there were."""
    with admin(dsn) as db:
        row = db.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    return int(row[0])


async def test_a_kept_connection_the_server_dropped_is_replaced_without_failing_a_call(postgres):
    """Catches a kept connection the server ended while it was idle (a restart, a failover,
    an idle timeout) failing the next call with "cannot reach the database", though the
    server answers: each dropped connection used to cost one failed load or commit."""
    tagged = with_params(postgres, application_name="turnplug-drop")
    async with PostgresLog(tagged, max_connections=1) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        assert drop_connections(postgres, "turnplug-drop") == 1
        loaded = await log.load("c")
        assert drop_connections(postgres, "turnplug-drop") == 1
        await log.append("c", "t2", exchange("q2", "a2"), expected_length=2)
        assert drop_connections(postgres, "turnplug-drop") == 1
        entries = await log.entries("c")

    assert loaded == Context(messages=exchange("q1", "a1"))
    assert [entry.turn_ref for entry in entries] == ["t1", "t2"]


def end_connection_waiting_on_a_lock(dsn: str, application_name: str) -> None:
    """End the server side of the connection tagged `application_name` once it waits on a
    lock, in the middle of its statement (an administrator's pg_terminate_backend, a crash
    of that backend)."""
    with admin(dsn) as db:
        for _ in range(2000):
            ended = db.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s AND wait_event_type = 'Lock'",
                (application_name,),
            ).fetchone()[0]
            if ended:
                return
            time.sleep(0.005)
    raise AssertionError(f"no connection {application_name!r} waited on the lock")


async def test_a_kept_connection_ended_in_the_middle_of_a_commit_is_replaced_and_commits_once(
    postgres,
):
    """Pins what docs/logs.md says is made once more, which said only a connection ended
    while it was idle: a kept connection whose server side ended during the call (here
    while the commit waited on a lock) is replaced and the commit is made again, once."""
    import psycopg

    tagged = with_params(postgres, application_name="turnplug-mid-call")
    async with PostgresLog(tagged, max_connections=1) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        with psycopg.connect(postgres) as holder:
            holder.execute("LOCK TABLE turnplug_conversations IN ACCESS EXCLUSIVE MODE")
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(
                    partial(log.append, "c", "t2", exchange("q2", "a2"), expected_length=2)
                )
                await anyio.to_thread.run_sync(
                    end_connection_waiting_on_a_lock, postgres, "turnplug-mid-call"
                )
                holder.rollback()
        entries = await log.entries("c")

    assert [entry.turn_ref for entry in entries] == ["t1", "t2"]


async def test_a_session_commits_its_turn_after_the_server_dropped_its_connections(postgres):
    """Catches a session's turn failing with LogError after a server restart ended the
    log's kept connections, though the server was up again."""
    tagged = with_params(postgres, application_name="turnplug-restart")
    pipe = Pipeline(model=ScriptedModel(["first", "second"]))
    async with PostgresLog(tagged, max_connections=2) as log:
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send("one")
            assert drop_connections(postgres, "turnplug-restart") >= 1
            result = await session.send("two")
        loaded = await log.load("c")

    assert result.outcome == "completed"
    assert [message.text for message in loaded.messages] == ["one", "first", "two", "second"]


async def test_an_unreachable_server_is_a_log_error_without_the_password():
    log = PostgresLog("postgresql://ada:s3cret-pw@127.0.0.1:1/chats?connect_timeout=2")
    with pytest.raises(LogError, match="cannot reach the database") as excinfo:
        await log.load("c")
    await log.aclose()

    assert "s3cret" not in str(excinfo.value)
    assert excinfo.value.log == "PostgresLog('postgresql://ada@127.0.0.1:1/chats')"


class SilentServer:
    """A TCP server on loopback that accepts connections and never says a word."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.listener.accept()[0])

    def close(self) -> None:
        for connection in [*self.held, self.listener]:
            connection.close()


class Relay:
    """A TCP relay on loopback to the test server, which can stand for a slow link or a
    network that goes silent without closing anything.

    While `dropping`, what either side sends is dropped (a network losing packets, a hung
    server); while `dropping_replies`, only what the server sends. `rate` limits what the server sends to that many bytes a second (a slow link
    that still delivers). `forget_existing()` silences the connections made so far for good
    (a firewall or NAT that forgot them while they were idle). With `mute_new`, a new
    connection goes silent from its first query on. `accepted` counts the connections.
    With `reported_major`, the server's version as it reports it when a connection starts
    (its server_version parameter) is that major version, as an older server's would be.
    """

    def __init__(self, dsn: str, *, unix: bool = False) -> None:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
        self.upstream = (params.get("host", "127.0.0.1"), int(params.get("port", 5432)))
        self.directory = tempfile.mkdtemp(prefix="relay-", dir="/tmp") if unix else None
        if self.directory is None:
            self.listener = socket.create_server(("127.0.0.1", 0))
            self.port = self.listener.getsockname()[1]
        else:  # libpq's name for the socket of port 5432 in a directory given as the host
            self.port = 5432
            self.listener = socket.socket(socket.AF_UNIX)
            self.listener.bind(os.path.join(self.directory, f".s.PGSQL.{self.port}"))
            self.listener.listen()
        self.dropping = False
        self.dropping_replies = False
        self.rate: float | None = None
        self.mute_new = False
        self.reported_major: int | None = None
        self.accepted = 0
        self.forgotten: set[int] = set()
        self.muted: set[int] = set()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self, dsn: str) -> str:
        return with_params(dsn, host=self.directory or "127.0.0.1", port=str(self.port))

    def forget_existing(self) -> None:
        self.forgotten |= set(range(self.accepted))

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client = self.listener.accept()[0]
                server = socket.socket()
                # A small receive buffer: a slow link holds the server's sends back at once.
                server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
                server.connect(self.upstream)
                number = self.accepted
                self.accepted += 1
                self.sockets += [client, server]
                mute = self.mute_new
                for source, target, replies in ((client, server, False), (server, client, True)):
                    threading.Thread(
                        target=self._pump,
                        args=(source, target, number, replies, mute),
                        daemon=True,
                    ).start()

    def _pump(
        self, source: socket.socket, target: socket.socket, number: int, replies: bool, mute: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(4096 if replies and self.rate else 65536):
                # A query (simple or extended protocol) ends a muted connection's startup.
                if mute and not replies and data[:1] in (b"Q", b"P"):
                    self.muted.add(number)
                if self.dropping or (replies and self.dropping_replies):
                    continue
                if number in self.forgotten or number in self.muted:
                    continue
                if replies and self.rate:
                    time.sleep(len(data) / self.rate)
                if replies and self.reported_major is not None:
                    data = re.sub(rb"(?<=server_version\x00)[^\x00]+", self._reported, data)
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)

    def _reported(self, version: re.Match[bytes]) -> bytes:
        # As long as the real one, so that the message's length stays right: "15.18" -> "12.22",
        # padded with spaces (after which libpq reads nothing).
        return f"{self.reported_major}.22".encode().ljust(len(version[0]))

    def close(self) -> None:
        for connection in [*self.sockets, self.listener]:
            # Shut down first: a close alone would wait for a thread blocked reading it.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


async def test_a_server_older_than_postgresql_13_is_refused_naming_both_versions(postgres):
    """Bug caught: a server before PostgreSQL 13, which times a message of several statements
    as one for statement_timeout, was used, and a long read (sent as one message) could be
    ended by the limit the log lifts for it."""
    relay = Relay(postgres)
    relay.reported_major = 12
    try:
        with pytest.raises(LogError) as raised:
            async with PostgresLog(relay.dsn(postgres)):
                pass
    finally:
        relay.close()

    message = str(raised.value)
    assert "PostgreSQL 12.22" in message
    assert "older than the 13 a PostgresLog needs" in message


def test_the_server_version_check_reads_libpqs_numbers():
    """Guards the version shown for a refused server: libpq numbers 12.22 as 120022 and
    9.6.24 as 90624."""
    _postgres.check_server_version(130000, "log")
    _postgres.check_server_version(170002, "log")
    for version, shown in ((120022, "12.22"), (90624, "9.6.24")):
        with pytest.raises(LogError, match=rf"PostgreSQL {re.escape(shown)}, older than the 13"):
            _postgres.check_server_version(version, "log")


async def test_opening_the_log_on_a_server_that_never_answers_is_a_bounded_log_error():
    """Bug caught: nothing bounded PostgresLog's waits but a fixed connect_timeout of 10 s;
    the log takes a timeout= that the connection attempt follows (at least libpq's 2 s)."""
    server = SilentServer()
    try:
        log = PostgresLog(f"postgresql://ada:s3cret-pw@127.0.0.1:{server.port}/chats", timeout=0.5)
        with anyio.fail_after(60), pytest.raises(LogError) as raised:
            async with log:
                pass
    finally:
        server.close()

    message = str(raised.value)
    assert f"PostgresLog('postgresql://ada@127.0.0.1:{server.port}/chats')" in message
    assert "within 2 s (connect_timeout)" in message
    assert "s3cret" not in message


async def test_a_commit_to_a_server_that_stops_answering_is_a_bounded_log_error(postgres):
    """Bug caught: a commit sent to a server that then sent nothing back (a hung server, a
    network dropping packets) waited for it forever, and so did its turn, cancellation and
    all; now it fails once the server has been silent for the log's timeout and a second,
    is tried once more on a new connection, which cannot be opened either, and the error
    tells both; the log commits again once the server answers."""
    relay = Relay(postgres)
    try:
        async with PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5) as log:
            await log.append("c", "t1", exchange("q1", "a1"))
            relay.dropping = True
            with anyio.fail_after(60), pytest.raises(LogError) as raised:
                await log.append("c", "t2", exchange("q2", "a2"), expected_length=2)
            relay.dropping = False
            await log.append("c", "t2", exchange("q2", "a2"), expected_length=2)
            entries = await log.entries("c")
    finally:
        relay.close()

    message = str(raised.value)
    assert message.startswith(f"{log!r}: committing turn 't2' of conversation 'c' was given up")
    assert "sent nothing for 1.5 s (timeout=0.5 s, plus 1) on a kept connection" in message
    assert "the commit may have reached the server" in message
    assert "tried once more on a new connection, which failed" in message
    assert "did not answer within 2 s (connect_timeout)" in message
    assert [entry.turn_ref for entry in entries] == ["t1", "t2"]


async def test_a_kept_connection_the_network_forgot_is_replaced_and_the_commit_made(postgres):
    """Bug caught: a kept connection silently dropped while idle (a firewall or NAT that
    forgot it) failed the commit made on it, once the server had been silent for the
    timeout, though a new connection would have made it at once: calls given up on were
    never made again."""
    relay = Relay(postgres)
    try:
        async with PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5) as log:
            await log.append("c", "t1", exchange("q1", "a1"))
            relay.forget_existing()
            with anyio.fail_after(60):
                await log.append("c", "t2", exchange("q2", "a2"), expected_length=2)
            entries = await log.entries("c")
    finally:
        relay.close()

    assert relay.accepted == 2
    assert [entry.turn_ref for entry in entries] == ["t1", "t2"]


async def test_a_call_silent_on_a_kept_connection_and_on_a_new_one_is_not_tried_again(postgres):
    """Bug caught (with the test above): a call given up on was never made again; now it
    is made once more when the silent connection was a kept one, and a new connection
    that goes silent too ends it, with an error telling both silences."""
    relay = Relay(postgres)
    try:
        async with PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5) as log:
            await log.append("c", "t1", exchange("q1", "a1"))
            relay.forget_existing()
            relay.mute_new = True
            with anyio.fail_after(60), pytest.raises(LogError) as raised:
                await log.load("c")
    finally:
        relay.close()

    assert relay.accepted == 2
    message = str(raised.value)
    assert message.startswith(f"{log!r}: loading conversation 'c' was given up on twice")
    assert (
        "sent nothing for 1.5 s (timeout=0.5 s, plus 1) on a kept connection, then on a new"
        in message
    )
    assert "may have reached" not in message  # a read


async def test_a_session_whose_commit_answer_was_lost_reloads_before_its_next_turn(postgres):
    """Bug caught: a commit the server made but whose answer was lost failed the turn with
    a LogError, and the session's next turn ran on the conversation without it, to end
    in a misleading LogConflict; the session reloads the log before that turn now."""
    relay = Relay(postgres)
    seen = []

    def model(request):
        seen.append([message.text for message in request.messages])
        return f"a{len(seen)}"

    pipe = Pipeline(model=FunctionModel(model))
    log = PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5)
    try:
        async with log, pipe.session(log=log, conversation_id="c") as session:
            await session.send("q1")
            relay.dropping_replies = True  # the server commits; its answer is lost
            with anyio.fail_after(60), pytest.raises(LogError, match="may have reached"):
                await session.send("q2")
            relay.dropping_replies = False
            third = await session.send("q3")
    finally:
        relay.close()

    assert third.outcome == "completed"
    assert seen[-1] == ["q1", "a1", "q2", "a2", "q3"]


async def test_a_slow_server_still_sending_is_waited_for_however_long_the_call_takes(postgres):
    """Bug caught: a call lasting longer than the log's timeout plus a second had its
    connection closed, the error saying the server had sent nothing back, though it was
    still sending: a conversation too big to arrive in that time over a slow link could
    never be loaded. Only a server silent that long is given up on now."""
    relay = Relay(postgres)
    turns = [exchange(f"{number}" * 100_000, "ok") for number in range(6)]
    try:
        async with PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5) as log:
            for number, messages in enumerate(turns):
                await log.append("big", f"t{number}", messages)
            relay.rate = 200_000  # bytes a second: 600 KB take 3 s, a steady flow
            with anyio.fail_after(60):
                loaded = await log.load("big")
    finally:
        relay.close()

    assert loaded == Context(messages=tuple(message for turn in turns for message in turn))


async def test_over_a_unix_socket_a_call_is_bounded_as_a_whole_and_the_error_says_so(postgres):
    """Bug caught: the error said the server had sent nothing back whatever the
    connection: over a Unix-domain socket, where the log cannot see the server's silence,
    a call is given up on when it has lasted that long, and the error says that."""
    relay = Relay(postgres, unix=True)
    try:
        async with PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5) as log:
            await log.append("c", "t1", exchange("q1", "a1"))
            relay.rate = 100  # bytes a second: the answer takes seconds to arrive
            with anyio.fail_after(60), pytest.raises(LogError) as raised:
                await log.entries("c")
            relay.rate = None
            entries = await log.entries("c")
    finally:
        relay.close()

    message = str(raised.value)
    assert message.startswith(f"{log!r}: reading the entries of conversation 'c' was given up")
    assert "had not answered in full after 1.5 s (timeout=0.5 s, plus 1)" in message
    assert "Unix-domain socket" in message
    assert [entry.turn_ref for entry in entries] == ["t1"]


# TCP keepalive probes every second of idleness, as a DSN set against idle NAT drops would.
KEEPALIVES = {"keepalives_idle": "1", "keepalives_interval": "1"}


async def test_a_server_that_stops_answering_is_given_up_on_though_keepalives_are_acked(postgres):
    """Bug caught: the server's kernel (here the relay's) acknowledges TCP keepalive probes
    however hung the server is, and each acknowledgement counted as the server speaking:
    with keepalives more frequent than the timeout plus a second, a commit to a server
    that stopped answering waited forever. Only acknowledgements of data the log sent
    count now."""
    relay = Relay(postgres)
    # Against a hang: the relay's connections end (a different error) if nothing did before.
    guard = threading.Timer(30, relay.close)
    try:
        dsn = with_params(relay.dsn(postgres), **KEEPALIVES)
        async with PostgresLog(dsn, max_connections=1, timeout=0.5) as log:
            await log.append("c", "t1", exchange("q1", "a1"))
            relay.dropping = True
            guard.start()
            with pytest.raises(LogError) as raised:
                await log.append("c", "t2", exchange("q2", "a2"), expected_length=2)
    finally:
        guard.cancel()
        relay.close()

    message = str(raised.value)
    assert message.startswith(f"{log!r}: committing turn 't2' of conversation 'c' was given up")
    assert "sent nothing for 1.5 s (timeout=0.5 s, plus 1) on a kept connection" in message


@contextlib.contextmanager
def stopped_backend(dsn: str, application_name: str, *, at_most: float):
    """The server process serving the connection named `application_name` stopped
    (SIGSTOP: hung, while its kernel still acknowledges what reaches its socket), for
    `at_most` seconds (against a hang); yields an Event set when that ran out."""
    import signal

    with admin(dsn) as db:
        row = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone()
    assert row is not None, f"no backend named {application_name!r}"
    pid = row[0]
    ran_out = threading.Event()

    def resume() -> None:
        ran_out.set()
        os.kill(pid, signal.SIGCONT)

    try:
        os.kill(pid, signal.SIGSTOP)
    except (PermissionError, ProcessLookupError):
        pytest.skip("the test server's processes are not this machine's to signal")
    guard = threading.Timer(at_most, resume)
    guard.start()
    try:
        yield ran_out
    finally:
        guard.cancel()
        os.kill(pid, signal.SIGCONT)


async def test_a_hung_backend_is_given_up_on_though_its_kernel_acks_keepalives(postgres):
    """Bug caught: a hung server process (stopped here) whose kernel acknowledged the TCP
    keepalive probes the DSN asks for every second seemed to speak each time, so a read
    from it waited as long as it was hung; now its silence ends the read's try on that
    connection, and the try on a new connection (another server process) answers."""
    dsn = with_params(postgres, application_name="hung", **KEEPALIVES)
    async with PostgresLog(dsn, max_connections=1, timeout=0.5) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        with stopped_backend(postgres, "hung", at_most=30) as ran_out:
            loaded = await log.load("c")
            resumed_first = ran_out.is_set()

    assert not resumed_first, "the read waited for the hung server process to resume"
    assert loaded == Context(messages=exchange("q1", "a1"))


def tcp_info(
    *, state=1, mss=(32768, 536), unacked=0, data_sent=0, data_received=0, ack_received=0
) -> bytes:
    """A struct tcp_info as Linux fills it in (linux/tcp.h: tcpi_state at byte 0, 1 being
    TCP_ESTABLISHED; tcpi_snd_mss and tcpi_rcv_mss at 16, here a loopback connection's;
    tcpi_unacked at 24; tcpi_last_data_sent, _ack_sent, _data_recv and _ack_recv, in
    milliseconds, from 44), the other fields zero."""
    info = bytearray(104)
    info[0] = state
    struct.pack_into("=II", info, 16, *mss)
    struct.pack_into("=I", info, 24, unacked)
    struct.pack_into("=IIII", info, 44, data_sent, 0, data_received, ack_received)
    return bytes(info)


@pytest.mark.parametrize(
    "info",
    [
        bytes(104),  # gVisor's netstack: full length, all zeros
        tcp_info(state=0, data_sent=0, data_received=0, ack_received=0),
        tcp_info(state=8, data_sent=9000, data_received=9000, ack_received=9000),  # CLOSE_WAIT
        tcp_info()[:40],
    ],
    ids=["zeros", "no-state", "close-wait", "short"],
)
def test_tcp_info_that_cannot_tell_the_servers_silence_says_so(info):
    """Bug caught: a TCP stack that returns a full-length tcp_info of zeros (gVisor's)
    read as a server heard from just now, on every look, so the watchdog never gave up on
    a silent server, and nothing else bounded the call; a tcp_info not of an established
    connection now says nothing, and the call is bounded as a whole."""
    assert _postgres._silence_in(info) is None


def test_tcp_info_of_gvisors_netstack_cannot_tell_the_servers_silence():
    """Bug caught: gVisor's netstack fills in tcp_info's state (established), its
    round-trip times, retransmission timeout and congestion window, but leaves every
    time since something was sent or received at 0: that read as a server heard from
    just now, on every look, so the watchdog never gave up on a hung server and nothing
    else bounded the call. Such a tcp_info now says nothing, and the call is bounded as a
    whole."""
    info = bytearray(104)
    info[0] = 1  # tcpi_state: TCP_ESTABLISHED; tcpi_ca_state (byte 1) 0, TCP_CA_Open
    struct.pack_into("=I", info, 8, 200_000)  # tcpi_rto, microseconds
    # tcpi_rtt, tcpi_rttvar, tcpi_snd_ssthresh, tcpi_snd_cwnd
    struct.pack_into("=IIII", info, 68, 5_000, 2_500, 0x7FFFFFFF, 10)

    assert _postgres._silence_in(bytes(info)) is None


@pytest.mark.parametrize(
    ("fields", "silence"),
    [
        # Nothing in flight, the server hung: its kernel still acknowledges keepalive probes.
        ({"data_sent": 4000, "data_received": 4000, "ack_received": 300}, 4.0),
        # A commit still being uploaded: each acknowledgement of it is the server's.
        ({"unacked": 3, "data_sent": 10, "data_received": 9000, "ack_received": 200}, 0.2),
        # An upload just acknowledged whole: the server spoke since the last of it was sent.
        ({"data_sent": 700, "data_received": 9000, "ack_received": 100}, 0.7),
        # A server still sending.
        ({"data_sent": 9000, "data_received": 50, "ack_received": 9000}, 0.05),
    ],
    ids=["keepalive-acks", "upload", "uploaded", "sending"],
)
def test_the_servers_silence_read_from_tcp_info(fields, silence):
    """Bug caught (with the keepalive tests above): an acknowledgement of a keepalive
    probe counted as the server speaking; acknowledgements count only while data the log
    sent awaits one."""
    assert _postgres._silence_in(tcp_info(**fields)) == pytest.approx(silence)


def test_the_silence_of_a_real_tcp_socket_is_read_only_while_it_is_established():
    """Bug caught: tcp_info was read whatever the connection's state; on the socket of a
    real TCP connection, the silence is read while it is established, and nothing is said
    once it is closing."""
    if _postgres._TCP_INFO is None:
        pytest.skip("tcp_info is Linux's")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server = listener.accept()[0]
        with client, server:
            server.sendall(b"hello")
            assert client.recv(5) == b"hello"
            silence = _postgres._silence(client.fileno())
            assert silence is not None
            assert 0 <= silence < 60
            client.shutdown(socket.SHUT_WR)  # FIN_WAIT: no longer established
            assert _postgres._silence(client.fileno()) is None


def lock_tables(dsn: str):
    """A connection holding every table of the log locked in an open transaction."""
    import psycopg

    holder = psycopg.connect(dsn)
    holder.execute(
        "LOCK TABLE turnplug_schema, turnplug_conversations, turnplug_turns"
        " IN ACCESS EXCLUSIVE MODE"
    )
    return holder


async def commit_behind_locked_tables(log: PostgresLog, dsn: str) -> LogError:
    """The LogError of committing turn t2 of conversation c while another connection holds
    every table of the log locked (released afterwards); a hang fails the test."""
    holder = lock_tables(dsn)
    try:
        with anyio.fail_after(60), pytest.raises(LogError) as raised:
            await log.append("c", "t2", exchange("q2", "a2"), expected_length=2)
    finally:
        holder.rollback()
        holder.close()
    return raised.value


async def test_a_commit_waiting_on_a_lock_another_transaction_holds_is_a_bounded_log_error(
    postgres,
):
    """Bug caught: a commit waiting on a lock another connection held (a long migration,
    an administrator's LOCK TABLE) waited as long as the lock was held, forever if it never
    was released; now the server gives it up after the log's timeout, nothing of it is
    committed, and the log commits once the lock is gone."""
    async with PostgresLog(postgres, max_connections=1, timeout=0.5) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        refused = await commit_behind_locked_tables(log, postgres)
        await log.append("c", "t3", exchange("q3", "a3"), expected_length=2)
        entries = await log.entries("c")

    message = str(refused)
    assert message.startswith(f"{log!r}: committing turn 't2' of conversation 'c' waited longer")
    assert "timeout=0.5 s (the server's statement_timeout)" in message
    assert "nothing of it was committed" in message
    assert [entry.turn_ref for entry in entries] == ["t1", "t3"]


async def test_a_read_longer_than_the_timeout_is_not_ended_by_the_server(postgres):
    """Bug caught: the server was told to give up any statement lasting longer than the
    log's timeout (statement_timeout), which also ended a large read whose rows were still
    being sent to a slow client; a read runs with no statement_timeout now (the limit
    of a commit), and only its waits on a lock are given up on (lock_timeout)."""
    relay = Relay(postgres)
    # More than the server's socket buffers hold: it is still sending after the timeout.
    turns = [exchange(f"{number}" * 500_000, "ok") for number in range(12)]
    try:
        async with PostgresLog(relay.dsn(postgres), max_connections=1, timeout=0.5) as log:
            for number, messages in enumerate(turns):
                await log.append("big", f"t{number}", messages)
            relay.rate = 2_000_000  # bytes a second: 6 MB take 3 s
            with anyio.fail_after(60):
                loaded = await log.load("big")
    finally:
        relay.close()

    assert loaded == Context(messages=tuple(message for turn in turns for message in turn))


def with_options(dsn: str, options: str) -> str:
    """`dsn` with more server options, after those it has (its search_path)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    return make_conninfo(**{**params, "options": f"{params.get('options', '')} {options}"})


async def test_a_lock_timeout_the_dsn_sets_is_kept_and_named_in_the_error(postgres):
    """Bug caught: a lock_timeout the DSN set ended a commit with a bare 'PostgreSQL
    failed: LockNotAvailable' in the server's words; the error names that lock_timeout and
    says nothing was committed, however the server words it."""
    async with PostgresLog(
        with_options(postgres, "-c lock_timeout=200ms"), max_connections=1, timeout=30
    ) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        refused = await commit_behind_locked_tables(log, postgres)
        entries = await log.entries("c")

    message = str(refused)
    assert message.startswith(f"{log!r}: committing turn 't2' of conversation 'c' waited longer")
    assert "the DSN's lock_timeout" in message
    assert "nothing of it was committed" in message
    assert [entry.turn_ref for entry in entries] == ["t1"]


async def test_a_lock_timeout_the_dsn_sets_in_another_case_is_kept(postgres):
    """Bug caught: a lock_timeout the DSN's options set with its name in another case
    (PostgreSQL's setting names are case-insensitive) was not seen, and the log overwrote
    it with its own timeout: a commit waiting on a lock waited the log's 5 s, not 200 ms."""
    async with PostgresLog(
        with_options(postgres, "-c Lock_Timeout=200ms"), max_connections=1, timeout=5
    ) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        refused = await commit_behind_locked_tables(log, postgres)

    message = str(refused)
    assert "waited longer than the DSN's lock_timeout" in message
    assert "raise the DSN's lock_timeout" in message


async def test_a_lock_timeout_pgoptions_sets_is_kept_and_named(postgres, monkeypatch):
    """Bug caught: libpq takes the server's options from PGOPTIONS for a DSN without
    options, but the log looked at the DSN's alone, and overwrote a lock_timeout set there
    with its own timeout: a commit waiting on a lock waited the log's 5 s, not 200 ms, and
    the error named the wrong limit."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(postgres)
    monkeypatch.setenv("PGOPTIONS", f"{params.pop('options')} -c lock_timeout=200ms")
    async with PostgresLog(make_conninfo(**params), max_connections=1, timeout=5) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        refused = await commit_behind_locked_tables(log, postgres)
        entries = await log.entries("c")

    message = str(refused)
    assert "waited longer than PGOPTIONS' lock_timeout" in message
    assert "raise PGOPTIONS' lock_timeout" in message
    assert [entry.turn_ref for entry in entries] == ["t1"]  # PGOPTIONS' search_path


async def test_a_statement_timeout_the_dsn_sets_is_not_overwritten(postgres):
    """Bug caught: the log set statement_timeout on each connection to its own timeout,
    overwriting the one the DSN's options gave: a commit waiting on a lock waited the
    log's 30 s instead of the DSN's 200 ms."""
    async with PostgresLog(
        with_options(postgres, "-cstatement_timeout=200"), max_connections=1, timeout=30
    ) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        refused = await commit_behind_locked_tables(log, postgres)

    message = str(refused)
    assert message.startswith(f"{log!r}: committing turn 't2' of conversation 'c' waited longer")
    assert "than the DSN's statement_timeout (200 ms)" in message
    assert "nothing of it was committed" in message


async def test_a_second_commit_waiting_on_a_conversations_row_is_given_up_at_the_timeout(
    postgres,
):
    """Bug caught: lock_timeout bounds each lock wait of a statement separately, and a
    second commit to a conversation whose row is locked waits twice (for the first
    commit's hold on the row, then for the lock's holder): the server stayed silent longer
    than the timeout plus a second, so the watchdog closed the connection, made the commit
    again and reported a hung server or a dropped network. The server's statement_timeout
    now ends the whole statement at the timeout, cleanly."""
    import psycopg

    results: dict[str, str] = {}
    async with (
        PostgresLog(postgres, max_connections=1, timeout=2) as first,
        PostgresLog(postgres, max_connections=1, timeout=2) as second,
    ):
        await first.append("c", "t1", exchange("q1", "a1"))
        await second.load("c")  # its connection is a kept one, which a silence would retry

        async def commit(log: PostgresLog, turn_ref: str, delay: float) -> None:
            await anyio.sleep(delay)
            with pytest.raises(LogError) as raised:
                await log.append("c", turn_ref, exchange("q", "a"))
            results[turn_ref] = str(raised.value)

        holder = psycopg.connect(postgres)
        try:
            holder.execute(
                "SELECT 1 FROM turnplug_conversations WHERE conversation_id = 'c' FOR UPDATE"
            )
            with anyio.fail_after(60):
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(commit, first, "ta", 0)
                    task_group.start_soon(commit, second, "tb", 0.3)
        finally:
            holder.rollback()
            holder.close()
        await second.append("c", "t2", exchange("q2", "a2"), expected_length=2)
        entries = await first.entries("c")

    for turn_ref, log in (("tb", second), ("ta", first)):
        message = results[turn_ref]
        assert message.startswith(
            f"{log!r}: committing turn {turn_ref!r} of conversation 'c' waited longer than"
            " timeout=2 s (the server's statement_timeout)"
        ), message
        assert "nothing of it was committed" in message
    assert [entry.turn_ref for entry in entries] == ["t1", "t2"]


def without_options(dsn: str, monkeypatch, options: str) -> str:
    """`dsn` without options, its options (the search_path) and `options` in PGOPTIONS, as
    a machine-wide setting would give them."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    monkeypatch.setenv("PGOPTIONS", f"{params.pop('options', '')} {options}")
    return make_conninfo(**params)


@pytest.mark.parametrize("lock_timeout", ["0", "1min"])
async def test_a_lock_timeout_pgoptions_sets_to_none_or_longer_still_ends_a_commit_cleanly(
    postgres, monkeypatch, lock_timeout
):
    """Bug caught: a lock_timeout of 0 (none) or longer than the log's timeout, set by
    PGOPTIONS (often machine-wide) or the DSN, was kept, so a commit waiting on a lock kept
    the server silent past the timeout plus a second: the watchdog closed the connection,
    made the commit again on a new one, which waited as long, and reported a hung server or
    a dropped network twice. The server now gives the commit up at the timeout, cleanly."""
    dsn = without_options(postgres, monkeypatch, f"-c lock_timeout={lock_timeout}")
    async with PostgresLog(dsn, max_connections=1, timeout=1) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        refused = await commit_behind_locked_tables(log, postgres)
        entries = await log.entries("c")

    message = str(refused)
    assert message.startswith(
        f"{log!r}: committing turn 't2' of conversation 'c' waited longer than timeout=1 s"
        " (the server's statement_timeout)"
    ), message
    assert [entry.turn_ref for entry in entries] == ["t1"]


async def test_a_read_waiting_on_a_lock_is_given_up_at_the_timeout_whatever_pgoptions_says(
    postgres, monkeypatch
):
    """Bug caught: a lock_timeout of 0 set by PGOPTIONS was kept, so a read waiting on a
    lock (a migration's, an administrator's LOCK TABLE) kept the server silent: the
    watchdog closed the connection, read again on a new one, and reported a hung server or
    a dropped network twice. Reads, which no statement_timeout ends, are given up on by the
    log's lock_timeout, cleanly."""
    dsn = without_options(postgres, monkeypatch, "-c lock_timeout=0")
    async with PostgresLog(dsn, max_connections=1, timeout=1) as log:
        await log.append("c", "t1", exchange("q1", "a1"))
        holder = lock_tables(postgres)
        try:
            with anyio.fail_after(60), pytest.raises(LogError) as raised:
                await log.load("c")
        finally:
            holder.rollback()
            holder.close()
        loaded = await log.load("c")

    message = str(raised.value)
    assert message.startswith(
        f"{log!r}: loading conversation 'c' waited longer than timeout=1 s"
        " (the server's lock_timeout) for a lock another transaction holds"
    ), message
    assert loaded == Context(messages=exchange("q1", "a1"))


async def test_opening_a_log_whose_tables_another_transaction_locks_is_a_bounded_log_error(
    postgres,
):
    """Bug caught: opening a log (its schema check) while another connection held its
    tables locked waited as long as the lock was held, forever if never released."""
    await committed(postgres, "t1")
    holder = lock_tables(postgres)
    try:
        log = PostgresLog(postgres, timeout=0.5)
        with anyio.fail_after(60), pytest.raises(LogError) as raised:
            async with log:
                pass
    finally:
        holder.rollback()
        holder.close()
    async with PostgresLog(postgres, timeout=0.5) as log:
        entries = await log.entries("c")

    assert "opening a connection waited longer than timeout=0.5 s" in str(raised.value)
    assert [entry.turn_ref for entry in entries] == ["t1"]


# -- stored data ----------------------------------------------------------------------------


async def test_a_stored_row_that_cannot_be_read_is_a_log_error_naming_the_turn(postgres):
    await committed(postgres, "t1", "t2")
    with admin(postgres) as db:
        db.execute("UPDATE turnplug_turns SET messages = 'not json' WHERE turn_ref = 't2'")

    async with PostgresLog(postgres) as log:
        with pytest.raises(LogError) as excinfo:
            await log.entries("c")

    assert "'t2'" in str(excinfo.value)


async def test_meta_that_json_cannot_hold_is_a_log_error_and_commits_nothing(postgres):
    async with PostgresLog(postgres) as log:
        with pytest.raises(LogError, match="JSON values only"):
            await log.append(
                "c", "t1", [Message.user([Text("hi", meta={"d": datetime.date.today()})])]
            )
        assert await log.entries("c") == ()


async def test_commit_times_are_in_utc_whatever_the_sessions_time_zone(postgres, monkeypatch):
    """Catches commit times read in the PostgreSQL session's TimeZone (the server's default,
    a role's setting, or here the client's PGTZ) instead of UTC, as documented and as the
    other logs give them, so that `turnplug log --json` showed -05:00 offsets."""
    monkeypatch.setenv("PGTZ", "America/New_York")
    async with PostgresLog(postgres) as log:
        await log.append("c", "t1", exchange("q", "a"))
        (entry,) = await log.entries("c")
        (info,) = await log.conversations()

    assert entry.committed_at is not None
    assert entry.committed_at.tzinfo == datetime.UTC
    assert info.last_committed_at.tzinfo == datetime.UTC
    assert entry_to_dict(entry)["committed_at"].endswith("+00:00")


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252"])
async def test_text_in_any_script_is_committed_whatever_the_clients_encoding(
    postgres, monkeypatch, encoding
):
    """Catches a commit holding an emoji failing with a bare UnicodeEncodeError, past the
    LogError seam, when the client's encoding (here PGCLIENTENCODING; also the DSN's
    client_encoding or the role's) is not UTF-8, while other text went through."""
    monkeypatch.setenv("PGCLIENTENCODING", encoding)
    messages = exchange("Ça va? 😀", "Très bien 👍 — 很好")
    async with PostgresLog(postgres) as log:
        await log.append("chat 💬", "t1", messages)
        loaded = await log.load("chat 💬")

    assert loaded == Context(messages=messages)


async def test_the_stored_json_is_queryable_as_json(postgres):
    await committed(postgres, "t1")

    with admin(postgres) as db:
        roles = db.execute(
            "SELECT json_array_elements(messages::json)->>'role' FROM turnplug_turns"
        ).fetchall()
    assert roles == [("user",), ("assistant",)]
