"""Blocking database connections driven from the event loop through worker threads.

The durable logs use blocking drivers (stdlib `sqlite3`, psycopg's sync API: psycopg's async
API is built on asyncio alone). Each database call runs in a worker thread with a connection
of its own: a pool of threads (AnyIO's under trio, the log's own under asyncio) for a log
with several connections, a `Worker` thread of the log's own for a log with one. A connection is never
used by two threads at once, but it may move from one worker thread to the next, so drivers
must allow that (``check_same_thread=False``).

Cancellation: a worker thread cannot be interrupted, and a thread abandoned mid-transaction
would leave the caller unsure whether its commit happened. So a call is not abandoned: a
cancelled task waits for its database call to finish (a commit then either happened, and
the caller learns it before the cancellation is delivered, or did not), and the
cancellation is delivered at the next checkpoint. asyncio's own cancellation
(``Task.cancel``, ``asyncio.timeout``), which no cancel scope holds, is raised as soon as the
call has ended: the caller is cancelled, and the call ran to its end. Database calls are
short, and each log's ``timeout`` bounds their waits: SQLite's lock timeout; PostgreSQL's
``statement_timeout`` (a commit), ``lock_timeout`` (a read) and a watchdog closing the
connection of a server that sends nothing back (docs/logs.md, "Cancellation").
"""

import asyncio
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar, final

import anyio
import anyio.lowlevel
import sniffio
import trio

from turns import Context, Message

from .._audit import AuditRecord
from .._errors import LogError
from .._loop import Loop, current_loop, trio_run_finished
from . import _codec
from ._protocol import ConversationInfo, LogEntry, check_id, check_values, heavy

C = TypeVar("C")
T = TypeVar("T")


@final
class Worker:
    """A thread of its own that runs blocking calls for the event loop, one at a time.

    A log with one connection hands every call to the same thread: the hop costs about
    two-thirds of a pass through the loop's thread pool (no pool lookup, limiter or context
    copy), which a commit pays each time. A call, once handed over, is waited for to its end
    whatever happens to the caller, as a pool thread's is; the cancellation comes at the
    caller's next checkpoint. The thread starts on the first call and ends at `stop`; it
    is a daemon, so a log never closed does not keep the process alive.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._stopped:
            raise RuntimeError(f"{self._name} was stopped with its log")
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        answer: list[tuple[bool, Any]] = []  # (returned, its value or what it raised)
        if sniffio.current_async_library() == "trio":
            task = trio.lowlevel.current_task()
            token = trio.lowlevel.current_trio_token()

            def wake_trio() -> None:
                token.run_sync_soon(trio.lowlevel.reschedule, task)

            self._calls.put((fn, args, answer, wake_trio))
            # Abort.FAILED: a cancellation waits for the call (see the class).
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        else:
            loop = asyncio.get_running_loop()
            # What the call's end wakes: a future, replaced if asyncio's own cancellation
            # cancels the one awaited.
            waiter = [loop.create_future()]

            def wake_asyncio() -> None:
                loop.call_soon_threadsafe(_settle, waiter)

            self._calls.put((fn, args, answer, wake_asyncio))
            deferred: BaseException | None = None
            with anyio.CancelScope(shield=True):  # AnyIO's cancellation waits for the call
                while True:
                    try:
                        await waiter[0]
                        break
                    except asyncio.CancelledError as exc:
                        # asyncio's own cancellation passes AnyIO's shield, and cancels the
                        # future awaited: wait on for the call, and raise it once it ended.
                        deferred = exc
                        if answer:  # the call ended; its wake found the future cancelled
                            break
                        waiter[0] = loop.create_future()
            if deferred is not None:
                raise deferred
        returned, value = answer.pop()
        if returned:
            return value  # type: ignore[no-any-return]
        raise value

    def stop(self) -> None:
        """End the thread once the calls handed over so far have run."""
        self._stopped = True
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, args, answer, wake = call
            try:
                answer.append((True, fn(*args)))
            except BaseException as exc:  # the caller's to raise, in its own task
                answer.append((False, exc))
            # Nothing of the call is kept past this point: once woken, its caller may drop
            # the last reference to the log, whose collection ends this thread.
            del call, fn, args, answer
            # The caller waits for its answer, so its loop is running; should it be gone
            # all the same, the thread must go on serving the next caller.
            with contextlib.suppress(Exception):
                wake()
            del wake


def _settle(waiter: "list[asyncio.Future[None]]") -> None:
    if not waiter[0].done():
        waiter[0].set_result(None)


async def _in_pool_thread(executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread of `executor`, waited for to its end whatever happens.

    AnyIO's ``to_thread.run_sync`` holds off AnyIO's cancellation, but asyncio's own
    (``Task.cancel``, ``asyncio.timeout``) cancels the future it awaits: its caller would
    go on, told the call was cancelled, while the thread still ran it (and a connection it
    released would be used by two threads at once). Here the thread's future is awaited
    through ``asyncio.shield``, again after each such cancellation, which is raised once the
    call has ended.
    """
    future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    deferred: BaseException | None = None
    with anyio.CancelScope(shield=True):
        while True:
            try:
                await asyncio.shield(future)
                break
            except asyncio.CancelledError as exc:
                deferred = exc
                if future.done():
                    break
    if deferred is not None:
        raise deferred
    return future.result()


@final
class Connections(Generic[C]):
    """At most `size` connections, opened on demand and reused.

    Args:
        size: How many database calls may run at once.
        connect: Opens a ready connection (called in a worker thread).
        close: Closes one.
        usable: Whether a connection is still good after its call raised. A call whose
            kept connection turns out broken is made again on a new one, so `work` must be
            safe to repeat.
        translate: The seam for driver errors: the `LogError` to raise instead, or None
            to let the exception through.
        own_thread: With `size` 1, run every call in one `Worker` thread of the log's own,
            not in the loop's thread pool.
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
        own_thread: bool = False,
    ) -> None:
        if own_thread and size != 1:
            raise ValueError(f"Connections(own_thread=True) takes size=1, got {size}")
        self._limiter = anyio.CapacityLimiter(size)
        self._size = size
        self._executor: ThreadPoolExecutor | None = None
        self._worker = Worker(f"{name} worker") if own_thread else None
        if self._worker is not None:  # a log dropped unclosed does not keep its thread
            weakref.finalize(self, self._worker.stop)
        self._connect = connect
        self._close = close
        self._usable = usable
        self._translate = translate
        self._name = name
        self._idle: list[C] = []
        self._closed = False
        # The kind of loop the locks are bound to: the running one if built inside a loop
        # (AnyIO makes them for it at once), else the first to use them.
        try:
            running = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            running = None
        self._loop: Loop | None = (
            "trio" if running == "trio" else "asyncio" if running == "asyncio" else None
        )
        # The loop using the locks (an asyncio loop, or a trio run by its token): another may
        # take them over once it has stopped (successive asyncio.run or trio.run calls), never
        # while it runs (another thread's loop).
        self._asyncio_loop: Callable[[], asyncio.AbstractEventLoop | None] = lambda: None
        self._trio_run: trio.lowlevel.TrioToken | None = None
        self._handover = threading.Lock()

    def check_loop(self) -> None:
        """Refuse a loop that is not trio or asyncio, or not of the kind that used the log first.

        The log's locks (AnyIO's) are bound to the kind of loop that first used them: under
        the other kind they would fail with that loop's own error ("must be called from async
        context", "no running event loop"), naming neither the log nor the cause.
        """
        loop = current_loop(self._name)
        if self._loop is None:
            self._loop = loop
        elif loop != self._loop:
            raise RuntimeError(
                f"{self._name} was first used under {self._loop} and is now used under {loop}:"
                f" its locks belong to {self._loop} — open a log for each event loop, inside"
                " the loop that uses it (`async with ... as log:` in the function given to"
                " trio.run or asyncio.run, or in a web app's lifespan)"
            )
        if loop == "asyncio" and self._asyncio_loop() is not (here := asyncio.get_running_loop()):
            with self._handover:
                using = self._asyncio_loop()
                if using is not None and using is not here and using.is_running():
                    raise self._in_use()
                self._asyncio_loop = weakref.ref(here)
        elif loop == "trio" and self._trio_run is not (run := trio.lowlevel.current_trio_token()):
            with self._handover:
                used = self._trio_run
                if used is not None and used is not run and not trio_run_finished(used):
                    raise self._in_use()
                self._trio_run = run

    def _in_use(self) -> RuntimeError:
        # Under trio the second run would trip an assertion inside trio, or hang; under asyncio
        # it would hang.
        return RuntimeError(
            f"{self._name} is used by another event loop, still running (another thread's):"
            " its locks wake only the loop that waits on them — open a log for each thread's"
            " loop, inside the loop that uses it (`async with ... as log:` in the function"
            " given to trio.run or asyncio.run)"
        )

    async def run(self, work: Callable[[C], T], *, held: bool = False) -> T:
        """`work(connection)` in a worker thread; driver errors become `LogError`.

        Args:
            held: The call must be made whatever cancels the caller (a group commit others
                wait for), which holds off its cancel scopes with a shield: asyncio's own
                cancellation, which no shield holds, is then not taken while it waits for a
                connection either, but raised once the call has ended.
        """
        if self._closed:
            raise RuntimeError(f"{self._name} is closed; open a new one to use it again")
        self.check_loop()
        # A free connection is taken without a pass through the scheduler (the thread hop
        # below is one): the cancellation check of a checkpoint, not its yield.
        await anyio.lowlevel.checkpoint_if_cancelled()
        deferred: BaseException | None = None
        try:
            self._limiter.acquire_nowait()
        except anyio.WouldBlock:
            while True:
                try:
                    await self._limiter.acquire()
                    break
                except asyncio.CancelledError as exc:
                    if not held:
                        raise
                    deferred = exc  # the limiter gave back a token granted meanwhile
        if deferred is None:
            return await self._run(work)
        await self._run(work)  # what the call raises is raised as it is
        raise deferred

    async def _run(self, work: Callable[[C], T]) -> T:
        try:
            if self._closed:  # while this call waited for a connection
                raise RuntimeError(f"{self._name} is closed; open a new one to use it again")
            holder: list[C | None] = [self._idle.pop() if self._idle else None]
            try:
                if self._worker is not None:
                    return await self._worker.run(self._call, holder, work)
                if sniffio.current_async_library() == "asyncio":
                    return await _in_pool_thread(self._threads(), self._call, holder, work)
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

    def _threads(self) -> ThreadPoolExecutor:
        """The log's own threads under asyncio, one per connection: not the loop's default
        executor, whose few threads also resolve host names for every connection a provider
        opens, and which calls blocked on a lock would take from it."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._size, thread_name_prefix=self._name)
        return self._executor

    def _release(self, connection: C) -> None:
        if self._closed:  # closed while the call ran
            self._close(connection)
        else:
            self._idle.append(connection)

    def _call(self, holder: list[C | None], work: Callable[[C], T]) -> T:
        reused = holder[0] is not None
        try:
            return self._attempt(holder, work)
        except Exception:
            # A kept connection found broken, whether the server dropped it while it was
            # idle (a restart, a failover, an idle timeout: found out only when it is next
            # used, which says nothing about the server now) or during this call (a backend
            # terminated mid-statement; the client cannot tell the two apart): make the call
            # once more, on a new connection. Every call a log makes may be made twice:
            # reads, and commits, which their turn_ref makes idempotent (one that did
            # commit before the connection broke is a duplicate). So is a kept connection
            # the log closed because the server went silent on it (a firewall or NAT that
            # forgot it while it was idle); a new connection that does is not tried again.
            if not reused or holder[0] is not None or self._closed:
                raise
            return self._attempt(holder, work)

    def _attempt(self, holder: list[C | None], work: Callable[[C], T]) -> T:
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
        if self._worker is not None:
            self._worker.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False)  # its threads end once their calls have


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

    def _bounded(self, work: Callable[[Any], T], what: str) -> Callable[[Any], T]:
        """`work` as the log runs it, `what` naming it in errors: a log whose calls have a
        deadline of their own wraps it here."""
        return work

    async def _stored(
        self,
        conversation_id: str,
        turn_ref: str,
        messages: tuple[Message, ...],
        audit: AuditRecord | None,
    ) -> tuple[str | bytearray, str | bytearray | None]:
        """The commit checked (`check_values`) and encoded: the JSON of its messages and of
        its audit record, as stored, as text or (a heavy commit's) as UTF-8 bytes.

        A heavy commit (`heavy`) is checked and encoded in a worker thread, a long string a
        slice at a time, into UTF-8 that the driver takes as it is, so that the event loop
        goes on meanwhile (a 100 MB turn takes most of a second): the driver's own
        conversion of text to UTF-8 would hold the GIL for the whole of it. The thread is
        not one of the log's: a commit being encoded holds no connection and does not hold
        up the commits behind it. A commit whose task is cancelled meanwhile is dropped, as
        one waiting for its turn to be written is.
        """
        if not heavy(messages, audit):
            return self._encode(conversation_id, turn_ref, messages, audit)
        # The thread reads what the caller handed over while the caller awaits it: messages,
        # parts and audit records are frozen and hold tuples, and their opaque values are
        # values too (nothing changes a committed message's meta in place), so it reads what
        # the loop's thread would have.
        encode = functools.partial(
            self._encode, conversation_id, turn_ref, messages, audit, sliced=True
        )
        stored = await anyio.to_thread.run_sync(encode)
        await anyio.lowlevel.checkpoint_if_cancelled()
        return stored

    def _encode(
        self,
        conversation_id: str,
        turn_ref: str,
        messages: tuple[Message, ...],
        audit: AuditRecord | None,
        *,
        sliced: bool = False,
    ) -> tuple[str | bytearray, str | bytearray | None]:
        check_values(self, conversation_id, turn_ref, messages, audit)
        try:
            if sliced:
                return _codec.messages_to_utf8(messages), _codec.audit_to_utf8(audit)
            return _codec.messages_to_json(messages), _codec.audit_to_json(audit)
        except (TypeError, ValueError, RecursionError) as exc:
            raise LogError(
                f"{self!r} cannot store turn {turn_ref!r} of conversation"
                f" {conversation_id!r}: {exc} — a durable log stores JSON values only, so"
                " keep meta, arguments and assigns to str, numbers, bools, None, lists and"
                " dicts",
                log=repr(self),
            ) from exc

    async def __aenter__(self) -> Self:
        # Connect now, so that a bad path or DSN, or a newer schema, fails here, not mid-turn.
        await self._connections.run(self._bounded(lambda connection: None, "opening the log"))
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
        check_id(conversation_id, to_read=True)
        load = functools.partial(type(self)._load_rows, conversation_id)
        what = f"loading conversation {conversation_id!r}"
        rows = await self._connections.run(self._bounded(load, what))
        return Context(messages=tuple(m for messages in rows for m in messages))

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        """Every commit of a conversation, in order, with its audit record."""
        check_id(conversation_id, to_read=True)
        entries = functools.partial(type(self)._entry_rows, conversation_id)
        what = f"reading the entries of conversation {conversation_id!r}"
        return await self._connections.run(self._bounded(entries, what))

    async def conversations(self) -> tuple[ConversationInfo, ...]:
        """Every conversation with at least one commit, the most recently committed first."""
        listing = type(self)._conversation_rows
        return await self._connections.run(self._bounded(listing, "listing the conversations"))
