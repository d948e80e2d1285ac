"""Helpers the pipeline tests share."""

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest
import sniffio
import trio

from pipeline import LogError, Pipeline, TurnResult, cont, hook
from pipeline import events as ev
from pipeline.logs import LogEntry, MemoryLog
from pipeline.testing import ScriptedModel
from turns import Context, Turn


async def collect(pipe: Pipeline, turn: Turn) -> tuple[list[ev.Event], TurnResult]:
    """Stream `turn` to the end: every event, and the result."""
    async with pipe.stream(turn) as events:
        seen = [event async for event in events]
    return seen, events.result


async def collect_into(seen: list[ev.Event], pipe: Pipeline, turn: Turn) -> None:
    """Stream `turn`, appending each event to `seen` as it comes (kept if the turn fails)."""
    async with pipe.stream(turn) as events:
        async for event in events:
            seen.append(event)


def live_tasks() -> set[object]:
    """Every task of the run: asyncio's task set, or trio's task tree walked from the root."""
    if sniffio.current_async_library() == "asyncio":
        return set(asyncio.all_tasks())
    tasks: set[object] = set()

    def walk(task: trio.lowlevel.Task) -> None:
        tasks.add(task)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return tasks


# Failures that are not a hook run: nothing opened them.
NEVER_STARTED = {"transformers", "commit"}


def pairing_problems(events) -> list[str]:
    """What breaks "every HookStarted is closed exactly once" in a whole event list.

    A HookStarted is closed by the next HookFinished or HookFailed of the same turn, hook and
    stage; a second close, a close that nothing opened, or a start left open is a problem.
    """
    problems: list[str] = []
    opened: set[tuple[str, str, str]] = set()
    for event in events:
        if type(event) not in (ev.HookStarted, ev.HookFinished, ev.HookFailed):
            continue
        key = (event.turn_ref, event.hook, event.stage)
        if type(event) is ev.HookStarted:
            if key in opened:
                problems.append(f"{key} started again before it was closed")
            opened.add(key)
        elif key in opened:
            opened.remove(key)
        elif event.stage not in NEVER_STARTED:
            problems.append(f"{type(event).__name__} {key} closes nothing")
    problems.extend(f"{key} never closed" for key in sorted(opened))
    return problems


def run_on(loop: str, main: Callable[[], Awaitable[None]]) -> None:
    """Run `main` from sync code, as an application would: what a loop leaves over shows."""
    if loop == "trio":
        trio.run(main)
    else:
        asyncio.run(main())  # type: ignore[arg-type]


def warnings_of_an_interrupted_run(loop: str, main: Callable[[], Awaitable[None]]) -> list[str]:
    """Run `main` on `loop` from sync code, which must end in KeyboardInterrupt; the warnings
    the run left once collected (a coroutine created and never run shows only then)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt):
            run_on(loop, main)
        gc.collect()
    return [str(warning.message) for warning in caught]


def exiting_with_a_late_interrupt() -> Pipeline:
    """A pipeline whose background hook 'second' raises SystemExit(5) while 'first' waits,
    and 'first', cancelled by it, raises KeyboardInterrupt in place of its cancellation."""

    async def interrupted_on_cancel(turn: Turn) -> object:
        try:
            await anyio.Event().wait()
        finally:
            raise KeyboardInterrupt  # in place of the cancellation
        return cont(turn)

    async def exiting(turn: Turn) -> object:
        await anyio.lowlevel.checkpoint()
        raise SystemExit(5)

    post = [
        hook(interrupted_on_cancel, name="first", background=True),
        hook(exiting, name="second", background=True),
    ]
    return Pipeline(model=ScriptedModel(["ok"]), post=post)


class AnswerLostLog:
    """A `MemoryLog` whose append under `lose` writes the turn, then fails with a LogError
    once, as a PostgresLog commit does when its answer is lost on the way back."""

    def __init__(self, lose: str) -> None:
        self.log = MemoryLog()
        self.lose: str | None = lose

    def __repr__(self) -> str:
        return "AnswerLostLog()"

    async def load(self, conversation_id: str) -> Context:
        return await self.log.load(conversation_id)

    async def append(self, conversation_id: str, turn_ref: str, *args, **options) -> None:
        await self.log.append(conversation_id, turn_ref, *args, **options)
        if turn_ref == self.lose:
            self.lose = None
            raise LogError(
                "AnswerLostLog(): the answer was lost; the commit may have been written",
                log="AnswerLostLog()",
            )

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        return await self.log.entries(conversation_id)
