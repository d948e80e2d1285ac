"""Blocking database connections driven from the event loop through worker threads.

The durable logs use blocking drivers (stdlib `sqlite3`, psycopg's sync API: psycopg's async
API is built on asyncio alone). Each database call runs in a worker thread (AnyIO's, under
trio and asyncio alike) with a connection
of its own: a connection is never used by two threads at once, but it moves from one
worker thread to the next, so drivers must allow that (``check_same_thread=False``).

Cancellation: a worker thread cannot be interrupted, and a thread abandoned mid-transaction
would leave the caller unsure whether its commit happened. So a call is not abandoned: a
cancelled task waits for its database call to finish (a commit then either happened, and
the caller learns it before the cancellation is delivered, or did not), and the
cancellation is delivered at the next checkpoint. Database calls are short; connection and
lock timeouts bound them.
"""

import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar, final

import anyio
import anyio.lowlevel

from turns import Context, Message

from .._errors import LogError
from .._loop import current_loop
from ._protocol import ConversationInfo, LogEntry, check_id

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
        self._limiter = anyio.CapacityLimiter(size)
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
        current_loop(self._name)
        # A free connection is taken without a pass through the scheduler (the thread hop
        # below is one): the cancellation check of a checkpoint, not its yield.
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            self._limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self._limiter.acquire()
        try:
            holder: list[C | None] = [self._idle.pop() if self._idle else None]
            try:
                return await anyio.to_thread.run_sync(self._call, holder, work)
            except Exception as exc:
                error = self._translate(exc)
                if error is None:
                    raise
                raise error from exc
            finally:
                if holder[0] is not None:
                    self._release(holder[0])
        finally:
            self._limiter.release()

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
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: [self._close(c) for c in idle])


class DatabaseLog:
    """What the database logs share: their lifecycle, `load` and `entries`.

    A subclass sets `_connections` and names its driver's queries, each run in a worker
    thread with a connection: ``_load_rows(conversation_id, connection)`` (each commit's
    messages, in order), ``_entry_rows(conversation_id, connection)`` and
    ``_conversation_rows(connection)``.
    """

    _connections: Connections[Any]
    _load_rows: ClassVar[Callable[[str, Any], list[tuple[Message, ...]]]]
    _entry_rows: ClassVar[Callable[[str, Any], tuple[LogEntry, ...]]]
    _conversation_rows: ClassVar[Callable[[Any], tuple[ConversationInfo, ...]]]

    async def __aenter__(self) -> Self:
        # Connect now, so that a bad path or DSN, or a newer schema, fails here, not mid-turn.
        await self._connections.run(lambda connection: None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections; the log cannot be used afterwards."""
        await self._connections.aclose()

    async def load(self, conversation_id: str) -> Context:
        check_id(conversation_id)
        load = type(self)._load_rows
        rows = await self._connections.run(functools.partial(load, conversation_id))
        return Context(messages=tuple(m for messages in rows for m in messages))

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        """Every commit of a conversation, in order, with its audit record."""
        check_id(conversation_id)
        entries = type(self)._entry_rows
        return await self._connections.run(functools.partial(entries, conversation_id))

    async def conversations(self) -> tuple[ConversationInfo, ...]:
        """Every conversation with at least one commit, the most recently committed first."""
        return await self._connections.run(type(self)._conversation_rows)
