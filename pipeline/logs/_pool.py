"""Blocking database connections driven from trio through worker threads.

The durable logs use blocking drivers (stdlib `sqlite3`, psycopg's sync API: psycopg's async
API is built on asyncio). Each database call runs in a trio worker thread with a connection
of its own: a connection is never used by two threads at once, but it moves from one
worker thread to the next, so drivers must allow that (``check_same_thread=False``).

Cancellation: a worker thread cannot be interrupted, and a thread abandoned mid-transaction
would leave the caller unsure whether its commit happened. So a call is not abandoned: a
cancelled task waits for its database call to finish (a commit then either happened, and
the caller learns it before the cancellation is delivered, or did not), and the
cancellation is delivered at the next checkpoint. Database calls are short; connection and
lock timeouts bound them.
"""

from collections.abc import Callable
from typing import Generic, TypeVar, final

import trio

from .._errors import LogError

C = TypeVar("C")
T = TypeVar("T")


@final
class Connections(Generic[C]):
    """At most `size` connections, opened on demand and reused.

    Args:
        size: How many database calls may run at once.
        connect: Opens a ready connection (called in a worker thread).
        close: Closes one.
        usable: Whether a connection is still good after its call raised.
        translate: The seam for driver errors: the `LogError` to raise instead, or None
            to let the exception through.
    """

    def __init__(
        self,
        *,
        size: int,
        connect: Callable[[], C],
        close: Callable[[C], None],
        usable: Callable[[C], bool],
        translate: Callable[[Exception], LogError | None],
        name: str,
    ) -> None:
        self._limiter = trio.CapacityLimiter(size)
        self._connect = connect
        self._close = close
        self._usable = usable
        self._translate = translate
        self._name = name
        self._idle: list[C] = []
        self._closed = False

    async def run(self, work: Callable[[C], T]) -> T:
        """`work(connection)` in a worker thread; driver errors become `LogError`."""
        if self._closed:
            raise RuntimeError(f"{self._name} is closed; open a new one to use it again")
        async with self._limiter:
            holder: list[C | None] = [self._idle.pop() if self._idle else None]
            try:
                return await trio.to_thread.run_sync(self._call, holder, work)
            except Exception as exc:
                error = self._translate(exc)
                if error is None:
                    raise
                raise error from exc
            finally:
                if holder[0] is not None:
                    self._release(holder[0])

    def _release(self, connection: C) -> None:
        if self._closed:  # closed while the call ran
            self._close(connection)
        else:
            self._idle.append(connection)

    def _call(self, holder: list[C | None], work: Callable[[C], T]) -> T:
        connection = holder[0]
        if connection is None:
            connection = holder[0] = self._connect()
        try:
            return work(connection)
        except BaseException:
            if not self._usable(connection):
                holder[0] = None
                self._close(connection)
            raise

    async def aclose(self) -> None:
        """Close the idle connections; those in use are closed when their call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        if idle:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: [self._close(c) for c in idle])
