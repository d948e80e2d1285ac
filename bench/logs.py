"""A committed turn: `SQLiteLog.append` against the same rows written with `sqlite3` directly.

A commit is what a session does after each turn: `append` of the turn's messages (a user
message and a reply) with its audit record and the expected length. The floor writes the same
rows with the driver alone, in tables of the same shape and indexes, with the same durability
settings (WAL, ``synchronous=FULL``), one transaction per turn: the turn row and the
conversation's row, the JSON encoded from plain dicts of the same content with `json.dumps`,
the transaction handed to a worker thread with the loop's own call (as an async program must
call a blocking driver). Both are timed per turn in wall time (what a caller waits: bound by
the fsync) and in CPU time (this process, all threads).

PostgreSQL runs when ``TURNPLUG_BENCH_POSTGRES_DSN`` (or ``TURNPLUG_TEST_POSTGRES_DSN``)
names a server, in wall time (the server's CPU is not this process's); the benchmark works in
a schema of its own and drops it.
"""

import json
import os
import secrets
import sqlite3
import statistics
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline import AuditRecord, Pipeline, cont, hook
from pipeline.logs import PostgresLog, SQLiteLog
from pipeline.logs._codec import audit_to_json, messages_to_json
from pipeline.testing import FunctionModel
from turns import Message, Text, Turn

from ._harness import Row, Sample, measure, per_rep, spread
from ._loops import gather, to_thread

LOOPS = ("trio", "asyncio")
CPU_TARGET = 2.0
WALL_TARGET = 1.1

SESSIONS = 8
SESSIONS_TARGET = 2.0  # commit throughput of 1 and 8 concurrent sessions, against the floor's
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
        self,
        messages: tuple[Message, ...],
        audit: AuditRecord,
        sessions: int,
        per_session: int,
        loop: str = "trio",
    ) -> None:
        self.messages, self.audit, self.loop = messages, audit, loop
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
        await gather(self.loop, lambda conversation: self.commit(log, conversation), conversations)


async def run(quick: bool, loop: str) -> list[Row]:
    repeats, turns = (2, 8) if quick else (11, 160)
    messages, audit = await a_turn()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as directory:
        rows += await _sqlite(directory, messages, audit, repeats, turns, loop)
    dsn = os.environ.get("TURNPLUG_BENCH_POSTGRES_DSN") or os.environ.get(
        "TURNPLUG_TEST_POSTGRES_DSN"
    )
    if dsn:
        rows += await _postgres(dsn, messages, audit, repeats, turns, loop)
    else:
        rows.append(Row("PostgresLog", None, None, note="skipped: set TURNPLUG_BENCH_POSTGRES_DSN"))
    return rows


# -- SQLite ---------------------------------------------------------------------------------


FLOOR_SCHEMA = (
    "CREATE TABLE conversations (conversation_id TEXT PRIMARY KEY, length INTEGER NOT NULL,"
    " turns INTEGER NOT NULL)",
    "CREATE TABLE turns (conversation_id TEXT NOT NULL, position INTEGER NOT NULL,"
    " turn_ref TEXT NOT NULL, message_count INTEGER NOT NULL, messages TEXT NOT NULL,"
    " audit TEXT, committed_at TEXT NOT NULL, PRIMARY KEY (conversation_id, position),"
    " UNIQUE (conversation_id, turn_ref))",
)
FLOOR_TURN = "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
FLOOR_CONVERSATION = (
    "INSERT INTO conversations VALUES (?, ?, 1) ON CONFLICT (conversation_id)"
    " DO UPDATE SET length = length + excluded.length, turns = turns + 1"
)


async def _sqlite(
    directory: str,
    messages: tuple[Message, ...],
    audit: AuditRecord,
    repeats: int,
    turns: int,
    loop: str,
) -> list[Row]:
    floor_db = sqlite3.connect(
        os.path.join(directory, "floor.db"), isolation_level=None, check_same_thread=False
    )
    floor_db.execute("PRAGMA journal_mode=WAL")
    floor_db.execute("PRAGMA synchronous=FULL")  # as SQLiteLog
    for statement in FLOOR_SCHEMA:
        floor_db.execute(statement)
    # The turn's content as plain data: what a program without turnplug would hold.
    plain_messages = json.loads(messages_to_json(messages))
    plain_audit = json.loads(audit_to_json(audit) or "null")
    batch = 0

    def write(conversation: str, position: int, encoded: tuple[str, str]) -> None:
        floor_db.execute("BEGIN IMMEDIATE")
        floor_db.execute(
            FLOOR_TURN, (conversation, position, f"ref-{position}", len(plain_messages), *encoded)
        )
        floor_db.execute(FLOOR_CONVERSATION, (conversation, len(plain_messages)))
        floor_db.execute("COMMIT")

    async def floor() -> None:
        nonlocal batch
        batch += 1
        conversation = f"floor-{batch}"
        for position in range(turns):
            encoded = (json.dumps(plain_messages), json.dumps(plain_audit))
            await to_thread(loop, write, conversation, position, encoded)

    log = SQLiteLog(os.path.join(directory, "log.db"))

    async def commit() -> None:
        nonlocal batch
        batch += 1
        conversation = f"log-{batch}"
        length = 0
        for position in range(turns):
            await log.append(
                conversation, f"ref-{position}", messages, audit, expected_length=length
            )
            length += len(messages)

    # Eight sessions, each committing its own conversation at once. SQLite has one writer,
    # and SQLiteLog writes the commits that wait together in one transaction; so does the
    # floor, as a plain program would: each writer queues its turn's rows and, in a worker
    # thread, takes the write lock and writes every queued turn in one transaction (its own
    # among them, unless a writer before it took it along).
    eight = Workload(messages, audit, SESSIONS, turns // SESSIONS, loop)
    queued: list[tuple[str, int, tuple[str, str]]] = []
    queue_lock, write_lock = threading.Lock(), threading.Lock()

    def write_queued(conversation: str, position: int, encoded: tuple[str, str]) -> None:
        with queue_lock:
            queued.append((conversation, position, encoded))
        with write_lock:
            with queue_lock:
                batch = queued[:]
                queued.clear()
            if not batch:
                return  # a writer before this one wrote it
            floor_db.execute("BEGIN IMMEDIATE")
            for where, at, rows in batch:
                floor_db.execute(FLOOR_TURN, (where, at, f"ref-{at}", len(plain_messages), *rows))
                floor_db.execute(FLOOR_CONVERSATION, (where, len(plain_messages)))
            floor_db.execute("COMMIT")

    async def writer_turns(conversation: str) -> None:
        for position in range(eight.per_session):
            encoded = (json.dumps(plain_messages), json.dumps(plain_audit))
            await to_thread(loop, write_queued, conversation, position, encoded)

    async def floor_eight() -> None:
        await gather(loop, writer_turns, eight.next_batch("floor8"))

    async def commit_eight() -> None:
        await eight.commit_batch(log, "log8")

    try:
        wall = await measure(
            {"floor": floor, "log": commit, "floor 8": floor_eight, "log 8": commit_eight},
            repeats=repeats,
            inner=1,
            warmup=1,
            clock=time.perf_counter,
        )
        cpu = await measure({"floor": floor, "log": commit}, repeats=repeats, inner=1, warmup=0)
    finally:
        await log.aclose()
        floor_db.close()
    rows = []
    for clock, samples, target in (("wall", wall, WALL_TARGET), ("CPU", cpu, CPU_TARGET)):
        floor_turn = [t / turns for t in samples["floor"].times]
        log_turn = [t / turns for t in samples["log"].times]
        ratios = per_rep(lambda g, f: g / f, samples["log"], samples["floor"])
        ratio = statistics.median(ratios)
        rows.append(
            Row(
                f"floor: raw sqlite3, one transaction per turn, {clock} time per turn",
                statistics.median(floor_turn),
                spread(floor_turn),
                note=f"{1 / statistics.median(floor_turn):,.0f} turns/s" if clock == "wall" else "",
            )
        )
        rows.append(
            Row(
                f"SQLiteLog.append, {clock} time per turn",
                statistics.median(log_turn),
                spread(ratios),
                statistics.median(floor_turn),
                ratio,
                note=f"{1 / statistics.median(log_turn):,.0f} turns/s" if clock == "wall" else "",
                target=f"<= {target:g}x",
                met=ratio <= target,
            )
        )
    floor_turn = [t / eight.turns for t in wall["floor 8"].times]
    log_turn = [t / eight.turns for t in wall["log 8"].times]
    ratio = statistics.median(per_rep(lambda g, f: g / f, wall["log 8"], wall["floor 8"]))
    rows.append(
        Row(
            f"floor: raw sqlite3, {SESSIONS} writers, the queued turns in one transaction,"
            " wall time per turn",
            statistics.median(floor_turn),
            spread(floor_turn),
            note=f"{1 / statistics.median(floor_turn):,.0f} turns/s",
        )
    )
    rows.append(
        Row(
            f"SQLiteLog.append, {SESSIONS} sessions at once, wall time per turn",
            statistics.median(log_turn),
            spread(log_turn),
            statistics.median(floor_turn),
            ratio,
            note=f"{1 / statistics.median(log_turn):,.0f} turns/s",
            target=f"<= {SESSIONS_TARGET:g}x",
            met=ratio <= SESSIONS_TARGET,
        )
    )
    return rows


# -- PostgreSQL -----------------------------------------------------------------------------


async def _postgres(
    dsn: str,
    messages: tuple[Message, ...],
    audit: AuditRecord,
    repeats: int,
    turns: int,
    loop: str,
) -> list[Row]:
    import psycopg
    from psycopg import sql

    schema = f"turnplug_bench_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    scoped = _with_search_path(dsn, schema)
    one = Workload(messages, audit, 1, turns, loop)
    eight = Workload(messages, audit, SESSIONS, turns // SESSIONS, loop)
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
            await to_thread(loop, connection.execute, FLOOR_INSERT_POSTGRES, row)

    def threaded(workload: Workload) -> Callable[[], Awaitable[None]]:
        # One connection per writer, each a task handing its inserts to worker threads.
        async def floor() -> None:
            batch = workload.next_batch("floor")
            pairs = list(zip(floors, batch, strict=False))
            await gather(loop, lambda pair: insert_each(pair[0], workload.rows(pair[1])), pairs)

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
        clock=time.perf_counter,  # the server's CPU is not this process's
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
            (f"{floor} in the loop's worker threads", threaded),
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
                f" {statistics.median(ratio_blocking):.2f}x the blocking floor",
                target=f"<= {SESSIONS_TARGET:g}x",
                met=statistics.median(ratio) <= SESSIONS_TARGET,
            )
        )
    return rows
