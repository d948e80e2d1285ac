"""The event loops a benchmark runs on, and each loop's own primitives for the floors.

Every floor is plain Python written with the loop's own primitives (trio's nursery and
``trio.sleep(0)``; asyncio's ``TaskGroup`` and ``asyncio.sleep(0)``), never with turnplug's
objects or with AnyIO, so that it measures the loop and nothing else. A benchmark module lists
the loops its turnplug rows can run on in ``LOOPS``; its floors are written for both.
"""

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import trio

ALL = ("trio", "asyncio")


def pause(loop: str) -> Callable[[float], Awaitable[None]]:
    """The loop's own sleep (``pause(loop)(0)`` is a bare checkpoint)."""
    return trio.sleep if loop == "trio" else asyncio.sleep


async def gather(loop: str, fn: Callable[..., Awaitable[Any]], args: list[Any]) -> None:
    """Run ``fn(arg)`` for every arg concurrently in the loop's own task group; wait for all."""
    if loop == "trio":
        async with trio.open_nursery() as nursery:
            for arg in args:
                nursery.start_soon(fn, arg)
    else:
        async with asyncio.TaskGroup() as group:
            for arg in args:
                group.create_task(fn(arg))


async def to_thread(loop: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a blocking `fn` in a worker thread, the loop's own way."""
    if loop == "trio":
        return await trio.to_thread.run_sync(fn, *args)
    return await asyncio.to_thread(fn, *args)


def run(fn: Callable[..., Awaitable[Any]], *args: Any, loop: str) -> Any:
    """Run ``fn(*args)`` on a fresh `loop`."""
    return anyio.run(fn, *args, backend=loop)


async def hand_over(loop: str, produce: Callable[[], AsyncIterator[Any]]) -> None:
    """Iterate ``produce()`` in a task of its own, taking every item in the calling task.

    The items cross through a deque, and the consumer, once it has caught up, waits with the
    loop's cheapest wake-up (trio's ``wait_task_rescheduled``/``reschedule``, one asyncio
    future): the least a design costs that keeps a producer moving while its consumer is busy.
    """
    buffer: deque[Any] = deque()
    done = False
    if loop == "trio":
        waiting: trio.lowlevel.Task | None = None

        async def producer() -> None:
            nonlocal done, waiting
            async for item in produce():
                buffer.append(item)
                if waiting is not None:
                    task, waiting = waiting, None
                    trio.lowlevel.reschedule(task)
            done = True
            if waiting is not None:
                task, waiting = waiting, None
                trio.lowlevel.reschedule(task)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            while True:
                while buffer:
                    buffer.popleft()
                if done:
                    return
                waiting = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.SUCCEEDED)
    future: asyncio.Future[None] | None = None

    async def feeder() -> None:
        nonlocal done, future
        async for item in produce():
            buffer.append(item)
            if future is not None:
                woken, future = future, None
                woken.set_result(None)
        done = True
        if future is not None:
            woken, future = future, None
            woken.set_result(None)

    async with asyncio.TaskGroup() as group:
        group.create_task(feeder())
        while True:
            while buffer:
                buffer.popleft()
            if done:
                return
            future = asyncio.get_running_loop().create_future()
            await future
