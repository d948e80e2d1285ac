"""The event loops a benchmark runs on, and each loop's own primitives for the floors.

Every floor is plain Python written with the loop's own primitives (trio's nursery and
``trio.sleep(0)``; asyncio's ``TaskGroup`` and ``asyncio.sleep(0)``), never with turnplug's
objects or with AnyIO, so that it measures the loop and nothing else. A benchmark module lists
the loops its turnplug rows can run on in ``LOOPS``; its floors are written for both.
"""

import asyncio
from collections.abc import Awaitable, Callable
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
