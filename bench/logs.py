"""Commit throughput of the durable logs, for 1 and 8 concurrent sessions.

A commit is what a session does after each turn: `append` of the turn's messages (a user
message and a reply) with its audit record and the expected length. With 8 sessions, 8 trio
tasks commit to 8 conversations through one shared log.

The floors, measured in the same run on the same kind of storage with the same settings,
insert the same rows (the JSON a log stores, prepared beforehand) into a table without
constraints with the driver alone: sqlite3, one transaction per row, through one connection
(SQLite has one writer at a time); psycopg autocommit INSERTs, one round trip per row, one
connection per writer. Each floor is measured twice: blocking the caller (the driver's own
speed), and as a trio program must call a blocking driver without stalling its event loop,
each insert handed to a worker thread with ``trio.to_thread.run_sync``. The logs do the
latter, so that is the floor their ratio is taken against; the note gives the ratio to the
blocking floor too. Reported per turn, with turns per second.

PostgreSQL runs when ``TURNPLUG_BENCH_POSTGRES_DSN`` (or ``TURNPLUG_TEST_POSTGRES_DSN``)
names a server; the benchmark works in a schema of its own and drops it.
"""

import os
import secrets
import sqlite3
import statistics
import tempfile
import urllib.parse
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from pipeline import AuditRecord, Pipeline, cont, hook
from pipeline.logs import PostgresLog, SQLiteLog
from pipeline.logs._codec import audit_to_json, messages_to_json
from pipeline.testing import FunctionModel
from turns import Message, Text, Turn

from ._harness import Row, Sample, measure, per_rep, spread

SESSIONS = 8
QUESTION = "How long do refunds take for an order that was shipped abroad last week? " * 3
ANSWER = "Refunds are issued within 14 days of the return reaching our warehouse. " * 10

FLOOR_TABLE = (
    "CREATE TABLE floor (conversation_id TEXT, position INTEGER, turn_ref TEXT,"
    " message_count INTEGER, messages TEXT, audit TEXT, committed_at TEXT)"
)
FLOOR_INSERT_SQLITE = (
    "INSERT INTO floor VALUES (?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
)
FLOOR_INSERT_POSTGRES = "INSERT INTO floor VALUES (%s, %s, %s, %s, %s, %s, now())"


async def a_turn() -> tuple[tuple[Message, ...], AuditRecord]:
    """The messages and audit record of a real turn with three hooks."""

    def note(turn: Turn) -> Any:
        return cont(turn.inject(Text("The customer is on the Pro plan.")))

    pipe = Pipeline(
        model=FunctionModel(lambda request: ANSWER),
        pre=[hook(note, durable=True, name="plan"), hook(note, name="today")],
        post=[lambda turn: cont(turn)],
    )
    result = await pipe.run(Turn.start(QUESTION))
    return result.log_messages, result.audit


class Workload:
    """Batches of turns: each batch commits `per_session` turns in each of `sessions` fresh
    conversations, numbered so that no two batches share one."""

    def __init__(
        self, messages: tuple[Message, ...], audit: AuditRecord, sessions: int, per_session: int
    ) -> None:
        self.messages, self.audit = messages, audit
        self.sessions, self.per_session = sessions, per_session
        self.turns = sessions * per_session
        self.batch = 0
        self.stored = (messages_to_json(messages), audit_to_json(audit))

    def next_batch(self, tag: str) -> list[str]:
        self.batch += 1
        return [f"{tag}-{self.batch}-{index}" for index in range(self.sessions)]

    def rows(self, conversation: str) -> list[tuple[Any, ...]]:
        return [
            (conversation, turn, f"ref-{turn}", len(self.messages), *self.stored)
            for turn in range(self.per_session)
        ]

    async def commit(self, log: SQLiteLog | PostgresLog, conversation: str) -> None:
        length = 0
        for turn in range(self.per_session):
            await log.append(
                conversation, f"ref-{turn}", self.messages, self.audit, expected_length=length
            )
            length += len(self.messages)

    async def commit_batch(self, log: SQLiteLog | PostgresLog, tag: str) -> None:
        conversations = self.next_batch(tag)
        if len(conversations) == 1:
            await self.commit(log, conversations[0])
            return
        async with trio.open_nursery() as nursery:
            for conversation in conversations:
                nursery.start_soon(self.commit, log, conversation)


async def run(quick: bool) -> list[Row]:
    repeats, turns = (2, 8) if quick else (11, 160)
    messages, audit = await a_turn()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as directory:
        rows += await _sqlite(directory, messages, audit, repeats, turns)
    dsn = os.environ.get("TURNPLUG_BENCH_POSTGRES_DSN") or os.environ.get(
        "TURNPLUG_TEST_POSTGRES_DSN"
    )
    if dsn:
        rows += await _postgres(dsn, messages, audit, repeats, turns)
    else:
        rows.append(Row("PostgresLog", None, None, note="skipped: set TURNPLUG_BENCH_POSTGRES_DSN"))
    return rows


# -- SQLite ---------------------------------------------------------------------------------


async def _sqlite(
    directory: str,
    messages: tuple[Message, ...],
    audit: AuditRecord,
    repeats: int,
    turns: int,
) -> list[Row]:
    floor_db = sqlite3.connect(
        os.path.join(directory, "floor.db"), isolation_level=None, check_same_thread=False
    )
    floor_db.execute("PRAGMA journal_mode=WAL")
    floor_db.execute("PRAGMA synchronous=FULL")  # as SQLiteLog
    floor_db.execute(FLOOR_TABLE)
    one = Workload(messages, audit, 1, turns)
    eight = Workload(messages, audit, SESSIONS, turns // SESSIONS)
    lock = trio.Lock()  # one connection: one insert at a time, as SQLite writes anyway

    def insert(row: tuple[Any, ...]) -> None:
        floor_db.execute("BEGIN IMMEDIATE")
        floor_db.execute(FLOOR_INSERT_SQLITE, row)
        floor_db.execute("COMMIT")

    def blocking(workload: Workload) -> Callable[[], Awaitable[None]]:
        async def floor() -> None:
            for conversation in workload.next_batch("floor"):
                for row in workload.rows(conversation):
                    insert(row)

        return floor

    async def insert_rows(rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            async with lock:
                await trio.to_thread.run_sync(insert, row)

    def threaded(workload: Workload) -> Callable[[], Awaitable[None]]:
        async def floor() -> None:
            async with trio.open_nursery() as nursery:
                for conversation in workload.next_batch("floor"):
                    nursery.start_soon(insert_rows, workload.rows(conversation))

        return floor

    log = SQLiteLog(os.path.join(directory, "log.db"))
    try:
        samples = await _measure(log, one, eight, blocking, threaded, repeats)
    finally:
        await log.aclose()
        floor_db.close()
    return _rows("SQLiteLog", "raw sqlite3 inserts", samples, one, eight)


# -- PostgreSQL -----------------------------------------------------------------------------


async def _postgres(
    dsn: str, messages: tuple[Message, ...], audit: AuditRecord, repeats: int, turns: int
) -> list[Row]:
    import psycopg
    from psycopg import sql

    schema = f"turnplug_bench_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    scoped = _with_search_path(dsn, schema)
    one = Workload(messages, audit, 1, turns)
    eight = Workload(messages, audit, SESSIONS, turns // SESSIONS)
    floors = [psycopg.connect(scoped, autocommit=True) for _ in range(SESSIONS)]
    floors[0].execute(FLOOR_TABLE)
    pool = ThreadPoolExecutor(SESSIONS)

    def insert_rows(connection: "psycopg.Connection[Any]", rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            connection.execute(FLOOR_INSERT_POSTGRES, row)

    def blocking(workload: Workload) -> Callable[[], Awaitable[None]]:
        # One connection per writer, each writer an OS thread of its own.
        async def floor() -> None:
            batch = workload.next_batch("floor")
            jobs = [
                pool.submit(insert_rows, connection, workload.rows(conversation))
                for connection, conversation in zip(floors, batch, strict=False)
            ]
            for job in jobs:
                job.result()

        return floor

    async def insert_each(connection: "psycopg.Connection[Any]", rows: list[Any]) -> None:
        for row in rows:
            await trio.to_thread.run_sync(connection.execute, FLOOR_INSERT_POSTGRES, row)

    def threaded(workload: Workload) -> Callable[[], Awaitable[None]]:
        # One connection per writer, each a trio task handing its inserts to worker threads.
        async def floor() -> None:
            batch = workload.next_batch("floor")
            async with trio.open_nursery() as nursery:
                for connection, conversation in zip(floors, batch, strict=False):
                    nursery.start_soon(insert_each, connection, workload.rows(conversation))

        return floor

    log = PostgresLog(scoped, max_connections=SESSIONS)
    try:
        samples = await _measure(log, one, eight, blocking, threaded, repeats)
    finally:
        await log.aclose()
        pool.shutdown()
        for connection in floors:
            connection.close()
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return _rows("PostgresLog", "raw psycopg inserts", samples, one, eight)


async def _measure(
    log: SQLiteLog | PostgresLog,
    one: "Workload",
    eight: "Workload",
    blocking: Callable[["Workload"], Callable[[], Awaitable[None]]],
    threaded: Callable[["Workload"], Callable[[], Awaitable[None]]],
    repeats: int,
) -> dict[str, Sample]:
    """Time the log against both floors, for 1 and 8 sessions, interleaved."""
    return await measure(
        {
            "blocking 1": blocking(one),
            "threaded 1": threaded(one),
            "log 1": lambda: one.commit_batch(log, "log"),
            "blocking 8": blocking(eight),
            "threaded 8": threaded(eight),
            "log 8": lambda: eight.commit_batch(log, "log"),
        },
        repeats=repeats,
        inner=1,
        warmup=1,
    )


def _with_search_path(dsn: str, schema: str) -> str:
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(dsn)
        query = [*urllib.parse.parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    return f"{dsn} options='-csearch_path={schema}'"


# -- the report -----------------------------------------------------------------------------


def _rows(
    log: str,
    floor: str,
    samples: dict[str, Sample],
    one: Workload,
    eight: Workload,
) -> list[Row]:
    rows = []
    for sessions, workload in ((1, one), (SESSIONS, eight)):

        def per_turn(name: str, workload: Workload = workload) -> list[float]:
            return [t / workload.turns for t in samples[name].times]

        blocking = per_turn(f"blocking {sessions}")
        threaded = per_turn(f"threaded {sessions}")
        appended = per_turn(f"log {sessions}")
        ratio = per_rep(
            lambda f, g: g / f, samples[f"threaded {sessions}"], samples[f"log {sessions}"]
        )
        ratio_blocking = per_rep(
            lambda f, g: g / f, samples[f"blocking {sessions}"], samples[f"log {sessions}"]
        )
        writers = "1 writer" if sessions == 1 else f"{sessions} writers"
        for name, values in (
            (f"{floor} blocking the caller", blocking),
            (f"{floor} in trio worker threads", threaded),
        ):
            rows.append(
                Row(
                    f"floor: {name}, {writers}, per turn",
                    statistics.median(values),
                    spread(values),
                    note=f"{1 / statistics.median(values):,.0f} turns/s",
                )
            )
        rows.append(
            Row(
                f"{log}.append, {sessions} session{'s' if sessions > 1 else ''}, per turn",
                statistics.median(appended),
                spread(appended),
                statistics.median(threaded),
                statistics.median(ratio),
                note=f"{1 / statistics.median(appended):,.0f} turns/s;"
                f" {statistics.median(ratio_blocking):.2f}x the blocking floor;"
                " target <= 2x the threaded floor",
            )
        )
    return rows
