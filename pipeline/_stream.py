"""Event streaming: a turn driven in a task of its own while its caller iterates the events.

`Pipeline.stream` and `Session.stream` both hand out a `TurnEvents`; the drive emits into it
and never waits for the consumer, except a session's turn before its commit (`caught_up`).
"""

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NoReturn, final

import anyio
import trio

from turns import Turn

from . import events as ev
from ._drive import Drive
from ._excgroups import own_error, raise_single
from ._loop import Lot, current_loop, is_cancellation, new_lot
from ._result import TurnResult


@asynccontextmanager
async def stream_turn(
    drive: Drive, turn: Turn, events: "TurnEvents"
) -> AsyncIterator["TurnEvents"]:
    """Drive `turn` in a task of its own while the caller iterates `events`.

    The task is the loop's own, not one of an AnyIO task group, which costs a third more on
    trio and twice as much on asyncio: a trio nursery (what AnyIO's task group wraps there),
    or an asyncio task in an AnyIO cancel scope, awaited to its end whatever happens to the
    caller meanwhile, as a task group's would be.
    """
    loop = current_loop("a streamed turn (Pipeline.stream, session.stream)")
    events._lot, events._taken = new_lot(loop), new_lot(loop)
    if loop == "trio":
        error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(events._drive, drive, turn)
                try:
                    yield events
                finally:
                    # A consumer that read to the end finds the drive finished: nothing is
                    # left to cancel. One that leaves early, or is cancelled or fails,
                    # cancels the turn still running.
                    if not events._done:
                        nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            error = own_error(group)
        if error is not None:
            raise error
    else:
        # The task copies the caller's context, and its scope takes the caller's deadline,
        # as a task group's would: a hook sees the deadline it runs under, and the turn
        # ends when it passes, as under trio.
        deadline = anyio.current_effective_deadline()
        task = asyncio.get_running_loop().create_task(events._drive_in_scope(drive, turn, deadline))
        try:
            yield events
        finally:
            await _end_task(task, events)
    if events._error is not None and not events._raised:
        events._raised = True
        raise events._error


async def _end_task(task: "asyncio.Task[None]", events: "TurnEvents") -> None:
    """Stop an asyncio drive task that is still running, and wait for its end."""
    if not task.done():
        scope = events._scope
        if scope is None:
            # Not started yet: it never will.
            task.cancel()
        else:
            # Through AnyIO, so that the turn's shielded work (a commit being written, a
            # cancelled tool's after-tool hooks) finishes as under a task group: a bare
            # Task.cancel() would break through AnyIO's shields.
            scope.cancel()
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            # The caller is cancelled: the turn still ends before the caller goes on.
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    if not task.cancelled():
        # What `_drive` does not keep for the iteration (nothing, unless it is broken).
        failure = task.exception()
        if failure is not None:
            raise failure


@final
class TurnEvents:
    """The async iterator of a streamed turn's events; `result` once it is exhausted.

    Events are buffered without bound (a turn produces a bounded number of them), so a slow
    consumer never slows the turn. Buffered events are handed over without a trip through the
    scheduler; the consumer waits, and so checkpoints, once it has caught up with the turn.
    """

    # Slots: the drive reads `_waiting` once per event, the consumer `_buffer` twice and
    # `_behind` once.
    __slots__ = (
        "_behind",
        "_buffer",
        "_done",
        "_error",
        "_exhausted",
        "_lot",
        "_raised",
        "_result",
        "_scope",
        "_taken",
        "_waiting",
    )

    def __init__(self) -> None:
        self._buffer: deque[ev.Event] = deque()
        # The loop's own wake-ups, set when the turn starts (the loop is known then).
        self._lot: Lot = _NOT_STARTED
        self._taken: Lot = _NOT_STARTED
        self._waiting = False
        # Whether the drive waits on `_taken` for the consumer to catch up (`_caught_up`).
        self._behind = False
        self._done = False
        self._result: TurnResult | None = None
        self._error: BaseException | None = None
        # Under asyncio, the drive task's scope: how the stream cancels it.
        self._scope: anyio.CancelScope | None = None
        self._raised = False
        self._exhausted = False

    @property
    def result(self) -> TurnResult:
        """The turn's result; available once every event was consumed."""
        if self._error is not None:
            raise RuntimeError(
                f"the turn failed with {type(self._error).__name__}, so it has no result"
            ) from self._error
        if self._result is None or not self._exhausted:
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
                self._end()
            self._waiting = True
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
        while self._buffer:
            self._behind = True
            await self._taken.park()

    def _emit(self, event: ev.Event) -> None:
        self._buffer.append(event)
        if self._waiting:
            # Wake the consumer once; until it runs, later events only join the buffer.
            self._waiting = False
            self._lot.unpark_all()

    def _end(self) -> NoReturn:
        self._exhausted = True
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error from self._error.__cause__
        raise StopAsyncIteration

    async def _drive(self, drive: Drive, turn: Turn) -> None:
        try:
            try:
                self._result = await drive.run(turn)
            except BaseExceptionGroup as group:
                raise_single(group)
        except Exception as exc:  # delivered to the consumer through the iteration
            self._error = exc
        except BaseException as exc:
            if is_cancellation(exc):
                raise
            # Not an Exception (a hook's SystemExit, say): still the consumer's to see, from
            # the iteration, on both loops alike.
            self._error = exc
        finally:
            self._done = True
            self._lot.unpark_all()

    async def _drive_in_scope(self, drive: Drive, turn: Turn, deadline: float) -> None:
        with anyio.CancelScope(deadline=deadline) as self._scope:
            await self._drive(drive, turn)


class _NotStarted:
    """The lots of a TurnEvents whose turn has not started: nothing waits, nothing wakes."""

    def __bool__(self) -> bool:
        return False

    async def park(self) -> None:
        raise RuntimeError("a turn's events are read inside `async with pipe.stream(...)`")

    def unpark_all(self) -> None:
        pass


_NOT_STARTED = _NotStarted()
