"""Event streaming: a turn driven in a task of its own while its caller iterates the events.

`Pipeline.stream` and `Session.stream` both hand out a `TurnEvents`; the drive emits into it
and never waits for the consumer, except a session's turn before its commit (`caught_up`).
"""

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from types import TracebackType
from typing import Any, NoReturn, TypeVar, final

import anyio
import anyio.lowlevel
import sniffio
import trio

from turns import Turn

from . import events as ev
from ._drive import Drive
from ._excgroups import own_error, raise_single, reraise
from ._loop import Lot, current_loop, new_lot, shielded
from ._result import TurnResult

T = TypeVar("T")
_Scope = trio.CancelScope | anyio.CancelScope
log = logging.getLogger("turnplug.pipeline")


@final
class OneUse(AbstractAsyncContextManager[T]):
    """An ``async with`` target that can be entered once, and says so when entered again.

    ``@asynccontextmanager`` objects can be entered once too, but a second entry fails with
    an AttributeError from inside contextlib that names nothing (a stream or a session kept
    in a variable and entered per request, say). Exiting one that is not open is refused
    too: contextlib would run its setup (a session's start hooks, its task group) and fail
    with "generator didn't stop", leaving that setup open.
    """

    __slots__ = ("_entered", "_exited", "_manager", "_used", "_what")

    def __init__(self, manager: AbstractAsyncContextManager[T], what: str) -> None:
        self._manager = manager
        self._what = what
        self._used = False
        self._entered = False
        self._exited = False

    async def __aenter__(self) -> T:
        if self._used:
            raise RuntimeError(
                f"{self._what} is for one `async with`, and this one was entered already —"
                f" call {self._what} again for each block"
            )
        self._used = True
        value = await self._manager.__aenter__()
        self._entered = True
        return value

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if not self._entered or self._exited:
            raise RuntimeError(
                f"exiting {self._what}, which "
                + ("was exited already" if self._exited else "was never entered")
                + " — let its `async with` block enter and exit it, once each"
            )
        self._exited = True
        return await self._manager.__aexit__(exc_type, exc, tb)


@asynccontextmanager
async def stream_turn(
    make_drive: Callable[[], Drive], turn: Turn, events: "TurnEvents"
) -> AsyncIterator["TurnEvents"]:
    """Drive `turn` in a task of its own while the caller iterates `events`.

    The drive is made when the stream is entered, in the caller's context (where a tracer
    takes the caller's current span as the turn's parent): a stream never entered starts
    no trace it would never end.

    Under trio the task is a trio nursery's, which is what AnyIO's task group wraps there:
    the same semantics at 60% of the cost. Under asyncio it is an AnyIO task group's, the
    only way to make the task a child of the caller's AnyIO cancel scopes (their deadlines,
    moved or not, and their cancellation reach the turn as they reach its caller).
    """
    loop = current_loop("a streamed turn (Pipeline.stream, session.stream)")
    drive = make_drive()
    events._lot, events._taken = new_lot(loop), new_lot(loop)
    group = _Held(trio.open_nursery() if loop == "trio" else anyio.create_task_group())
    entered = _current_task(loop)
    error: BaseException | None = None
    try:
        async with group as tasks:
            tasks.start_soon(events._drive, drive, turn, tasks.cancel_scope, loop == "trio")
            try:
                yield events
            finally:
                events._left = True
                if _current_task(loop) is not entered:
                    # Left by another task (`_abandoned`): its task group is not exited there.
                    group.abandoned = True
                    await events._abandoned()
                elif not events._done:
                    # A consumer that read to the end finds the drive finished: nothing is
                    # left to cancel, and a cancel is not free (AnyIO's asyncio scope writes
                    # the current task's repr into its cancel reason). One that leaves early,
                    # or is cancelled or fails, cancels the turn still running.
                    tasks.cancel_scope.cancel()
    except BaseException as exc:
        # The block cancelled by the turn's interrupt (or the caller's scope cancelled at
        # that moment): the interrupt wins, never lost to the cancellation. One the
        # consumer's iteration raised is delivered: what the block does with it (carries
        # on, raises an error of its own) stands, as after `pipe.run`.
        if group.abandoned:
            raise
        if events._interrupt is None or events._delivered:
            if not isinstance(exc, BaseExceptionGroup):
                raise
            error = own_error(exc)
    if group.abandoned:
        return
    if events._interrupt is not None and not events._delivered:
        # The task group absorbs the cancellation it made, and the block's with it.
        raise events._interrupt
    if error is not None:
        raise error
    if events._stopped_at_end:
        # The consumer asked for more of a turn that had been stopped, and what stopped it
        # did not reach the caller (a stray cancellation inside the turn, say): fail loudly.
        raise RuntimeError(_STOPPED)
    if events._error is not None and not events._raised:
        events._raised = True
        raise events._error


def _current_task(loop: str) -> object:
    return trio.lowlevel.current_task() if loop == "trio" else asyncio.current_task()


@final
class _Held(AbstractAsyncContextManager[Any]):
    """A stream's task group (a trio nursery, an AnyIO task group), not exited when abandoned.

    A stream left by a task other than the one that entered it (`TurnEvents._abandoned`)
    cannot exit its task group there: trio and AnyIO refuse to exit a cancel scope in another
    task (trio's own state is corrupted by the attempt), and the entering task would keep
    the scope as its current one all the same.
    """

    __slots__ = ("_group", "abandoned")

    def __init__(self, group: AbstractAsyncContextManager[Any]) -> None:
        self._group = group
        self.abandoned = False

    async def __aenter__(self) -> Any:
        return await self._group.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self.abandoned:
            return None
        return await self._group.__aexit__(exc_type, exc, tb)


_ABANDONED = (
    "a streamed turn (pipe.stream or session.stream) was left by a task other than the one"
    " that entered it, before the turn ended: an async generator yielding from inside its"
    " `async with` block was not closed where it was used (the consumer broke out of its"
    " loop, or a web framework dropped a response body whose client left), and the event"
    " loop closed it later from a task of its own. {outcome} Close such a generator where it"
    " is used: `async with contextlib.aclosing(gen()) as events:`."
)
_CANCELLED = (
    "The turn was cancelled: nothing of it was committed, unless the cancellation came while"
    " a session's commit of it was being written (then only the log knows whether it was,"
    " and the session reloads the conversation before its next turn)."
)
_FINISHED_ANYWAY = (
    "The turn was cancelled, but it finished first: its result, and a session's commit of"
    " it, stand."
)
_LEFT_AFTER_END = (
    "a streamed turn (pipe.stream or session.stream) was left by a task other than the one"
    " that entered it, after the turn ended (its result, and a session's commit of it,"
    " stand): an async generator over it was closed from another task (the event loop's"
    " finaliser, or asyncio.wait_for, which before Python 3.12 runs each step in a task of"
    " its own)"
)


async def _consumer_gone() -> None:
    """Stop a turn before its commit once its stream was abandoned (`TurnEvents._abandoned`).

    Trio's cancellation of the drive (its own scope) stays in force, and comes at the next
    checkpoint. asyncio's (`Task.cancel`) is delivered once: a turn that absorbed it (a model
    that retries, asyncio.wait_for's race before Python 3.12) runs on, and would wait for
    ever for its gone consumer to catch up. It is cancelled again here.
    """
    if sniffio.current_async_library() == "asyncio":
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
    await anyio.lowlevel.checkpoint()


def _gone() -> None:
    """What `TurnEvents._stop` is once the stream is abandoned before its drive started."""


_STOPPED = (
    "the turn was stopped before it finished (cancelled, or its task ended by a"
    " BaseException): its events end there, and it has no result"
)


@final
class TurnEvents:
    """The async iterator of a streamed turn's events; `result` once it is exhausted.

    Events are buffered without bound (a turn produces a bounded number of them), so a slow
    consumer never slows the turn. Buffered events are handed over without a trip through the
    scheduler; the consumer waits, and so checkpoints, once it has caught up with the turn.
    """

    # Slots: the consumer reads `_buffer` twice and `_behind` once per event.
    __slots__ = (
        "_behind",
        "_buffer",
        "_delivered",
        "_done",
        "_error",
        "_exhausted",
        "_interrupt",
        "_left",
        "_lot",
        "_raised",
        "_relay",
        "_result",
        "_stop",
        "_stopped_at_end",
        "_taken",
        "_waiting",
    )

    def __init__(self) -> None:
        self._buffer: deque[ev.Event] = deque()
        # How the drive's watch hands over each event when nothing else watches the turn
        # (`Watch._relay`): into the buffer directly, a C call, while the consumer is not
        # waiting; through `_emit`, which wakes it, while it is.
        self._relay: list[Callable[[ev.Event], None]] = [self._emit]
        # The loop's own wake-ups, set when the turn starts (the loop is known then).
        self._lot: Lot = _NOT_STARTED
        self._taken: Lot = _NOT_STARTED
        self._waiting = False
        # Whether the drive waits on `_taken` for the consumer to catch up (`_caught_up`).
        self._behind = False
        self._done = False
        self._result: TurnResult | None = None
        self._error: Exception | None = None
        # A KeyboardInterrupt or SystemExit that ended the turn: raised to the consumer.
        self._interrupt: BaseException | None = None
        # Whether the consumer's iteration raised it (the block then does not raise it again).
        self._delivered = False
        self._raised = False
        self._exhausted = False
        # The consumer found the turn stopped before its end (`_stopped`).
        self._stopped_at_end = False
        # The stream block was left (`result` can no longer be reached by iterating unless
        # the turn finished before, its events buffered).
        self._left = False
        # Cancels the drive alone (`_abandoned`); None until the drive starts.
        self._stop: Callable[[], object] | None = None

    @property
    def result(self) -> TurnResult:
        """The turn's result; available once every event was consumed."""
        if self._error is not None:
            raise RuntimeError(
                f"the turn failed with {type(self._error).__name__}, so it has no result"
            ) from self._error
        if self._result is None or not self._exhausted:
            if self._left and self._result is not None:
                raise RuntimeError(
                    "the turn finished, but its events were not read to the end: iterate the"
                    " rest of them (they can still be read after the stream block), then read"
                    " events.result"
                )
            if self._left:
                raise RuntimeError(
                    "the turn has not finished: its stream block was left before the end of"
                    " its events, which cancels a turn still running, so it has no result —"
                    " iterate the events to the end inside the block, then read events.result"
                )
            raise RuntimeError(
                "the turn has not finished: iterate the events to the end before reading"
                " events.result"
            )
        return self._result

    def __aiter__(self) -> "TurnEvents":
        return self

    async def __anext__(self) -> ev.Event:
        while not self._buffer:
            if self._done:
                if self._interrupt is not None:
                    self._delivered = True
                    raise self._interrupt
                if self._result is None and self._error is None:
                    await self._stopped()
                self._end()
            self._waiting = True
            self._relay[0] = self._emit
            try:
                await self._lot.park()
            finally:
                self._waiting = False
        event = self._buffer.popleft()
        if self._behind and not self._buffer:
            self._behind = False
            self._taken.unpark_all()
        return event

    async def _caught_up(self) -> None:
        """Wait until the consumer has taken every event emitted so far."""
        while self._buffer or self._stop is _gone:
            if self._stop is _gone:  # the consumer is gone (`_abandoned`)
                await _consumer_gone()
                continue
            self._behind = True
            await self._taken.park()

    def _emit(self, event: ev.Event) -> None:
        self._buffer.append(event)
        if self._waiting:
            # Wake the consumer once; until it waits again, later events go straight into
            # the buffer (`_relay`).
            self._waiting = False
            self._relay[0] = self._buffer.append
            self._lot.unpark_all()

    async def _stopped(self) -> None:
        """The turn ended with neither a result nor an error: it was stopped.

        Cancelled with its caller (a deadline, the caller's scope), or its task ended by a
        BaseException that is neither an Exception nor an interrupt (KeyboardInterrupt and
        SystemExit are the drive's `_interrupt`), which the task group raises when the block
        is left. Never a plain end of the events, which
        would let the consumer take a cut-short turn for a finished one: the caller's own
        cancellation, or the task group's, is delivered here; if none is (the consumer is
        shielded), the iteration fails.
        """
        self._stopped_at_end = True
        await anyio.lowlevel.checkpoint()
        if not self._exhausted:
            self._exhausted = True
            raise RuntimeError(_STOPPED)

    def _end(self) -> NoReturn:
        self._exhausted = True
        if self._error is not None and not self._raised:
            self._raised = True
            reraise(self._error)
        raise StopAsyncIteration

    async def _abandoned(self) -> None:
        """The stream was left by a task other than the one that entered it.

        An async generator yielding from inside the stream's block, not closed by its
        consumer, is closed by the loop's finaliser in a task of its own (asyncio's
        async-generator hooks, trio's system task). The turn is cancelled (the drive alone:
        its task group's scope may still be the entering task's, which is alive when the
        consumer merely broke out of its loop) and awaited, so that a session's next turn
        never starts beside it (the wait is shielded: what closes the generator cannot cut
        it short); the session's lock is then released by the block around. A turn that had
        ended is left as it is, its result (and a session's commit) standing.
        """
        stop, self._stop = self._stop, _gone  # a drive not started yet returns at once
        if self._done:
            log.debug(_LEFT_AFTER_END)
            return
        try:
            if stop is not None:
                stop()
            self._taken.unpark_all()  # a drive waiting in `_caught_up` is stopped there
            # Trio's finaliser closes the generator inside a cancelled scope (no async work
            # there): the wait is shielded from it. On both loops the drive ends, at its next
            # checkpoint, or at `_caught_up` if it absorbed asyncio's cancellation.
            with shielded():
                while not self._done:
                    await self._lot.park()
        finally:
            outcome = _FINISHED_ANYWAY if self._result is not None else _CANCELLED
            log.warning(_ABANDONED.format(outcome=outcome))

    def _left_elsewhere(self) -> bool:
        return self._stop is _gone

    async def _drive(self, drive: Drive, turn: Turn, tasks: _Scope, trio_loop: bool) -> None:
        if self._stop is _gone:
            # Abandoned before it started: on trio, a task that closes the generator (one
            # handed over by the task that entered it) can run before this one in the same
            # batch, which trio shuffles.
            self._done = True
            self._lot.unpark_all()
            return
        # What `_abandoned` cancels: on trio a scope of the drive's own; on asyncio its task's
        # own cancellation, which costs nothing until it is used. (One coroutine: each more
        # would cost at every resumption of the turn.)
        own: trio.CancelScope | nullcontext[None] = _NO_SCOPE
        task = None
        if trio_loop:
            own = trio.CancelScope()
            self._stop = own.cancel
        else:
            task = asyncio.current_task()
            assert task is not None
            self._stop = task.cancel
        try:
            with own:
                try:
                    try:
                        self._result = await drive.run(turn)
                    except BaseExceptionGroup as group:
                        raise_single(group)
                except Exception as exc:  # delivered to the consumer through the iteration
                    self._error = exc
                except (KeyboardInterrupt, SystemExit) as exc:
                    # Raised to the consumer, as if it had run the turn itself: by its
                    # waiting `__anext__`, or, when it is elsewhere in its block, by the
                    # block, which is cancelled (as trio's nursery would). Out of the task,
                    # asyncio would stop its loop and report the task ("Task exception was
                    # never retrieved").
                    self._interrupt = exc
                    if not self._waiting:
                        tasks.cancel()
                finally:
                    self._done = True
                    self._lot.unpark_all()
        except asyncio.CancelledError:
            if task is None or not self._left_elsewhere():
                raise
            # `_abandoned`'s, and the task ends quietly: an AnyIO task group would take a
            # child's cancellation for a failure and cancel its scope, the entering task's.


_NO_SCOPE: nullcontext[None] = nullcontext()


class _NotStarted:
    """The lots of a TurnEvents whose turn has not started: nothing waits, nothing wakes."""

    def __bool__(self) -> bool:
        return False

    async def park(self) -> None:
        raise RuntimeError("a turn's events are read inside `async with pipe.stream(...)`")

    def unpark_all(self) -> None:
        pass


_NOT_STARTED = _NotStarted()
