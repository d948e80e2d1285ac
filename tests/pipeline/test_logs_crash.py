"""Crash safety: a writer killed with SIGKILL at random moments never leaves a torn turn.

A fork server (crash_writer.py) starts writer after writer on the same log; each commits
turns in a loop and is killed at a random moment: while it opens the log, mid-commit,
between commits. After each kill the log must open cleanly and hold turns 0..k-1 exactly
(every turn wholly present, with its audit record, or wholly absent), including every
turn whose append had returned, and at most one more: the commit in flight at the kill.
"""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from pipeline.logs import LogEntry

from ..logs import Backend, close
from ..postgres import with_params
from .crash_writer import CONVERSATION, turn_audit, turn_messages

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]
# How many writers are killed (a PostgreSQL writer's transactions are the server's, so fewer
# kills suffice there), and when, in seconds: one in four within EARLY of its start, while
# it opens the log (a PostgreSQL writer takes longer to connect than an SQLite one takes to
# open its file); the others within MID_LOOP of its first commit, however long that took.
KILLS = {"sqlite": 40, "postgres": 20}
EARLY = {"sqlite": 0.004, "postgres": 0.03}
MID_LOOP = 0.01
SEED = 20240607
WRITER_APP = "turnplug-crash-writer"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs fork and SIGKILL")


class ForkServer:
    """Drives crash_writer.py: start a writer, kill it, learn what it acknowledged."""

    def __init__(self, kind: str, where: str, stderr: Path) -> None:
        self.stderr = stderr
        self._stderr_file = stderr.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(WRITER), kind, where],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr_file,
            text=True,
        )
        self.acked: list[int] = []  # what the current writer acknowledged

    def _send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n")
        self.process.stdin.flush()

    def _read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the fork server died"
        return line.strip()

    def fork(self) -> int:
        self._send("fork")
        command, _, pid = self._read().partition(" ")
        assert command == "child"
        self.acked = []
        return int(pid)

    def _ack(self, line: str) -> None:
        assert line != "failed", f"a writer failed:\n{self.stderr.read_text()}"
        command, _, number = line.partition(" ")
        assert command == "ack", line
        self.acked.append(int(number))

    def first_commit(self) -> None:
        """Wait until the writer has committed a turn (so it is past opening the log)."""
        self._ack(self._read())

    def kill(self, pid: int) -> list[int]:
        """SIGKILL the writer, wait for it to be gone, return the turns it acknowledged."""
        os.kill(pid, signal.SIGKILL)
        self._send(f"reap {pid}")
        while (line := self._read()) != f"reaped {pid}":
            self._ack(line)
        return self.acked

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()
        self._stderr_file.close()


def wait_for_writers_to_leave(dsn: str) -> None:
    """Until the server has finished what the killed writer's connection was doing."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as admin:
        deadline = time.monotonic() + 10
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (WRITER_APP,)
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the killed writer's connection stayed"
            time.sleep(0.002)


async def read_back(backend: Backend) -> tuple[tuple[LogEntry, ...], tuple]:
    log = backend.open()
    try:
        return await log.entries(CONVERSATION), (await log.load(CONVERSATION)).messages
    finally:
        await close(log)


def check(backend: Backend, acked: int) -> int:
    """The log after a kill; returns how many turns it holds."""
    if backend.kind == "postgres":
        wait_for_writers_to_leave(backend.where)
    else:
        with sqlite3.connect(backend.where) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    entries, messages = trio.run(read_back, backend)
    assert entries == tuple(
        LogEntry(f"turn-{n}", turn_messages(n), turn_audit(n)) for n in range(len(entries))
    )
    assert messages == tuple(m for entry in entries for m in entry.messages)
    assert acked <= len(entries) <= acked + 1
    return len(entries)


def test_a_writer_killed_at_random_moments_leaves_every_turn_whole_or_absent(
    durable: Backend, tmp_path
):
    rng = random.Random(SEED)
    where = durable.where
    if durable.kind == "postgres":
        where = with_params(where, application_name=WRITER_APP)
    stderr_path = tmp_path / "writers.err"
    acked = 0  # turns the log holds so far, every acknowledged one included
    mid_loop = 0  # writers killed after their first commit
    server = ForkServer(durable.kind, where, stderr_path)
    try:
        for _ in range(KILLS[durable.kind]):
            pid = server.fork()
            if rng.random() < 0.25:
                time.sleep(rng.uniform(0, EARLY[durable.kind]))
            else:
                server.first_commit()
                mid_loop += 1
                time.sleep(rng.uniform(0, MID_LOOP))
            numbers = server.kill(pid)
            # Each writer goes on from what the log held when the last one was killed.
            assert numbers == list(range(acked, acked + len(numbers)))
            acked = check(durable, acked + len(numbers))
    finally:
        server.close()

    # No writer failed: each opened the log cleanly and committed from what it read.
    assert stderr_path.read_text() == ""
    assert acked >= mid_loop > 0  # the writers did commit
