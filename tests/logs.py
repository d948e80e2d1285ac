"""Each kind of log on storage of its own per test (the fixtures are in conftest.py)."""

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import attrs
import pytest

from pipeline.logs import Log, MemoryLog, PostgresLog, SQLiteLog

LOGS = ("memory", "sqlite", "postgres")
DURABLE_LOGS = ("sqlite", "postgres")


@attrs.frozen
class Backend:
    """One kind of log on this test's own storage.

    Attributes:
        kind: ``"memory"``, ``"sqlite"`` or ``"postgres"``.
        where: The SQLite path or the PostgreSQL DSN (empty for memory).
        make: Opens a new handle on that storage (the same `MemoryLog` every time).
    """

    kind: str
    where: str
    make: Callable[[], Log]

    def open(self) -> Log:
        return self.make()


async def close(log: Log) -> None:
    aclose = getattr(log, "aclose", None)
    if aclose is not None:
        await aclose()


def make_backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if kind == "memory":
        memory = MemoryLog()
        return Backend(kind, "", lambda: memory)
    if kind == "sqlite":
        path = str(tmp_path / "log.db")
        return Backend(kind, path, lambda: SQLiteLog(path))
    dsn = request.getfixturevalue("postgres")
    return Backend(kind, dsn, lambda: PostgresLog(dsn))


class Rendezvous:
    """Holds a round's model calls until both racers' turns have reached the model, so
    both answer from the same conversation; `reset` starts the next round."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.arrived = 0
        self.both = anyio.Event()

    async def meet(self) -> None:
        self.arrived += 1
        if self.arrived == 2:
            self.both.set()
        await self.both.wait()


@contextlib.contextmanager
def read_only_files(directory: Path) -> Iterator[None]:
    """`directory` and its files made read-only (which root ignores: what is asserted must
    hold without it), their mtimes set in the past so that any write shows."""
    for path in (*directory.iterdir(), directory):
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        yield
    finally:
        directory.chmod(0o755)
        for path in directory.iterdir():
            path.chmod(0o644)
