"""Which event loop runs a turn, and the few primitives that cost too much through AnyIO.

The runtime is written against AnyIO, so it runs under trio and asyncio alike. Three things
are not: telling which loop is running (to refuse anything else with a clear error instead
of a hang), whether a loop has ended (`loop_finished`: what it left open is then dropped),
and `Lot`, the wake-up a streamed turn's consumer waits on once per catch-up.
AnyIO's `Event` costs about a microsecond more to create than trio's own; on the event
stream's hot path the loop's native primitive is used instead.
"""

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, Protocol, TypeVar, cast

import anyio
import anyio.lowlevel
import sniffio
import trio

Loop = Literal["trio", "asyncio"]

_T = TypeVar("_T")


def current_loop(what: str) -> Loop:
    """The event loop running the caller: "trio" or "asyncio", or a RuntimeError naming `what`.

    A coroutine driven by anything else (by hand with ``.send(None)``, or another loop such
    as curio) would hand that driver objects it cannot resume, and could hang; it is refused
    here, before any work is done.
    """
    try:
        name = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        name = None
    if name == "trio":
        return "trio"
    if name == "asyncio":
        return "asyncio"
    found = "no event loop" if name is None else f"the {name} event loop"
    raise RuntimeError(
        f"{what} must run under trio or asyncio, but it was awaited with {found} running —"
        " run it with trio.run(...) or asyncio.run(...), or await it from code running"
        " under either"
    )


def is_cancellation(exc: BaseException) -> bool:
    """Whether `exc` is a cancellation of either loop (no loop needs to be running)."""
    return isinstance(exc, trio.Cancelled | asyncio.CancelledError)


def spurious_cancellation(exc: BaseException) -> bool:
    """Whether `exc`, caught around a hook's or a tool's own code, is a `CancelledError` that
    cancels nothing: one the code raised itself (a library awaiting a future that another
    task cancelled, say), while nobody cancelled the turn.

    A cancellation of the turn (an AnyIO scope, ``Task.cancel``, ``asyncio.timeout``) is
    asked of the task, and its ``cancelling()`` count shows it; under trio the cancellation is
    trio's `Cancelled`. A spurious one is the code's failure: let through, an AnyIO task group
    on asyncio would take it for the cancellation of its task and drop the task's work
    without a word.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    if sniffio.current_async_library() != "asyncio":
        return True
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def shielded() -> "trio.CancelScope | anyio.CancelScope":
    """A cancel scope shielded from the caller's cancellation, the running loop's cheapest.

    Under trio it is trio's own: AnyIO's wrapper of it costs about 15 µs more around an
    await (a log's commit pays it once per transaction); under asyncio, AnyIO's.
    """
    if sniffio.current_async_library() == "trio":
        return trio.CancelScope(shield=True)
    return anyio.CancelScope(shield=True)


async def to_the_end(work: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Await `work()` to its end whatever cancels the caller meanwhile, then raise that.

    An AnyIO shield holds off a cancel scope's cancellation (trio's, AnyIO's), not asyncio's
    own (``Task.cancel``, ``asyncio.timeout``): that is raised at the next await inside the
    shield, cutting `work` short. Under asyncio `work` runs in a task of its own, awaited
    again after each such cancellation, which is raised once `work` has ended. What `work` raises is raised here, by the caller (a KeyboardInterrupt
    out of its task would stop asyncio's loop), over a cancellation that came meanwhile.
    """
    if sniffio.current_async_library() == "trio":
        with trio.CancelScope(shield=True):
            return await work()

    async def contained() -> tuple[_T | None, BaseException | None]:
        try:
            return await work(), None
        except BaseException as exc:
            return None, exc

    task = asyncio.ensure_future(contained())
    deferred: BaseException | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait([task])  # which, unlike awaiting it, never cancels it
            except asyncio.CancelledError as exc:
                deferred = exc
    result, failure = task.result()
    if failure is not None:
        raise failure
    if deferred is not None:
        raise deferred
    return cast(_T, result)


def cancelled_by_scope(cancellation: BaseException) -> bool:
    """Whether `cancellation`, caught, is a cancel scope's, which comes again by itself.

    Code that must not be abandoned halfway (a commit handed to a database thread) catches
    a cancellation to wait for the work to end. A cancel scope's (trio's, AnyIO's) is then
    delivered again at the next checkpoint, since the scope stays cancelled: the caller may
    return what it waited for. asyncio's own (``Task.cancel``, ``asyncio.timeout``,
    ``asyncio.wait_for``) is raised once and is lost if it is caught, so it must be raised
    again as soon as the work has ended. Told apart by whether an enclosing AnyIO scope is
    cancelled now (an effective deadline of minus infinity).
    """
    if not isinstance(cancellation, asyncio.CancelledError):
        return True  # trio's
    return anyio.current_effective_deadline() == -math.inf


def clock_reader(loop: Loop) -> Callable[[], float]:
    """How a turn reads the loop's clock for hook timings, as cheaply as possible.

    Under trio the clock may be a MockClock (virtual time in tests): it is read through its
    ``current_time``. Trio's default clock is ``perf_counter()`` plus a fixed offset and
    asyncio's is ``monotonic()``; both are read as ``perf_counter`` itself: the differences
    (the only use of these readings) are the same, without a Python-level call twice per hook.
    """
    if loop == "asyncio":
        return time.perf_counter
    clock = trio.lowlevel.current_clock()
    kind = type(clock)
    if kind.__name__ == "SystemClock" and kind.__module__.startswith("trio."):
        return time.perf_counter
    return clock.current_time


class Lot(Protocol):
    """Tasks waiting for something to change, woken all at once (after trio's ParkingLot)."""

    def __bool__(self) -> bool: ...

    def park(self) -> Awaitable[object]: ...

    def unpark_all(self) -> object: ...


def new_lot(loop: Loop) -> Lot:
    """A `Lot` for `loop`: one built on trio's task rescheduling, or on asyncio futures."""
    return _TaskLot() if loop == "trio" else _FutureLot()


class _TaskLot:
    """The trio form of a parking lot: the waiting tasks, rescheduled all at once.

    Trio's `ParkingLot` with only what a stream needs (no breaking, no repositioning, no
    count to unpark): the consumer of a busy stream parks once per event, and ParkingLot's
    bookkeeping (an ordered dict, a generator and a list per wake-up) cost more than the
    wait itself. Both methods are protected from KeyboardInterrupt, as ParkingLot's are, so
    that the list never holds a task that is not waiting.
    """

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: list[trio.lowlevel.Task] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    @trio.lowlevel.enable_ki_protection
    async def park(self) -> None:
        task = trio.lowlevel.current_task()
        waiting = self._waiting
        waiting.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            # Cancelled while waiting: it was not woken, so it is still in this list.
            waiting.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    @trio.lowlevel.enable_ki_protection
    def unpark_all(self) -> None:
        waiting, self._waiting = self._waiting, []
        for task in waiting:
            trio.lowlevel.reschedule(task)


class _FutureLot:
    """The asyncio form of a parking lot: one future per waiting task."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: list[asyncio.Future[None]] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def park(self) -> "asyncio.Future[None]":
        # The future itself is awaited: no coroutine per wait. One cancelled while waiting
        # stays listed until the next `unpark_all`, which passes over it (it is done).
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        return future

    def unpark_all(self) -> None:
        # Emptied in place, not swapped for a new list: a wake-up per event allocates nothing.
        # (Setting a result only schedules the waiter; nothing parks meanwhile.)
        waiting = self._waiting
        for future in waiting:
            if not future.done():
                future.set_result(None)
        waiting.clear()


def loop_finished(token: anyio.lowlevel.EventLoopToken) -> bool:
    """Whether the loop behind `token` has ended: it will never run a task again."""
    native = token.native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        return native.is_closed()
    return isinstance(native, trio.lowlevel.TrioToken) and trio_run_finished(native)


def trio_run_finished(token: trio.lowlevel.TrioToken) -> bool:
    """Whether the trio run behind `token` has ended (it wakes a live run's thread briefly)."""
    try:
        token.run_sync_soon(_nothing_to_run)  # the one way to ask a trio run whether it is over
    except trio.RunFinishedError:
        return True
    return False


def _nothing_to_run() -> None:
    pass
