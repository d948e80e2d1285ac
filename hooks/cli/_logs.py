"""The conversation log the command line's ``--log PATH_OR_DSN`` names.

One place, so that the commands (`run`, `chat`, `log`) agree on what a path means: a
``postgresql://`` DSN is a `PostgresLog`, anything else the path of an SQLite file. Without
``--log`` a command keeps its conversation in a `MemoryLog` for as long as it runs.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pipeline.logs import Log, MemoryLog, PostgresLog, SQLiteLog

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def durable_log(where: str) -> SQLiteLog | PostgresLog:
    """The durable log `where` names (an SQLite file is created when missing).

    Raises:
        ConfigError: A malformed DSN, or psycopg is not installed.
    """
    if where.startswith(POSTGRES_SCHEMES):
        return PostgresLog(where, max_connections=1)
    return SQLiteLog(where)


@asynccontextmanager
async def open_log(where: str | None) -> AsyncIterator[Log]:
    """The log `where` names, closed on exit; a fresh `MemoryLog` when `where` is None."""
    if where is None:
        yield MemoryLog()
        return
    async with durable_log(where) as log:
        yield log
