"""Background post hooks: run after the commit, never delaying or failing the turn.

A background hook (``hook(..., background=True)``) sees the committed turn. What it returns
cannot change the turn any more: its durable injections are committed on their own by a
session; a failure, a timeout or a wrong return is recorded (a `HookFailed` event with
``enforced=False`` and an audit entry), never raised — the turn it follows already stands.
Only a KeyboardInterrupt or SystemExit it raises is raised (its `HookFailed` enforced), and
cuts the others short (each a `HookFailed` naming it).
A shadow background hook's verdict is recorded and its injections are discarded.
"""

import inspect
import logging
from collections.abc import Sequence

import anyio

from turns import Injection, Turn
from turns._parts import exchange_problem

from . import events as ev
from ._audit import HookRecord
from ._describe import describe, exc_text
from ._emit import hook_started
from ._excgroups import stopping_interrupt
from ._parallel import stop_group
from ._plan import Step
from ._runner import Runner, failure_detail
from ._signals import Cont

log = logging.getLogger("turnplug.pipeline")


async def run_background(
    runner: Runner, step: Step, turn: Turn, records: list[HookRecord]
) -> tuple[Injection, ...]:
    """Run one background hook; its new injections, stamped, or () when it failed."""
    emit = runner.emit
    when = step.hook.when
    if when is not None:
        # A failure is worded as `HookFailed.error` promises, ``Type: message``, with the
        # type an ordered hook's predicate reports (a trace's ``error.type`` reads it). An
        # exception with no message gets none, as an ordered hook's: only the note saying
        # where it came from, after the colon all the same.
        detail = None
        try:
            runs: object = when(turn)
        except Exception as exc:
            message = str(exc)
            where = "raised by its when= predicate"
            detail = (
                f"{type(exc).__name__}: {message} ({where})"
                if message
                else f"{type(exc).__name__}: {where}"
            )
        else:
            if type(runs) is not bool:
                if inspect.iscoroutine(runs):
                    runs.close()  # never awaited: it would warn again when collected
                detail = (
                    "HookReturnError: its when= predicate must return True or False, got"
                    f" {describe(runs)}"
                )
        if detail is not None:
            if emit is not None:
                emit(hook_started(runner.turn_ref, step.name, step.stage))
            _failed(runner, step, records, 0.0, detail)
            return ()
        if not runs:
            records.append(HookRecord(step.name, step.stage, step.position, 0.0, "skipped"))
            if emit is not None:
                emit(ev.HookSkipped(runner.turn_ref, step.name, step.stage))
            return ()

    def failed(step: Step, exc: Exception, elapsed: float, _: list[HookRecord] | None) -> None:
        _failed(runner, step, records, elapsed, failure_detail(exc))

    called = await runner.timed(step, turn, threaded=True, failed=failed)
    if called is None:
        return ()
    result, elapsed = called
    if type(result) is not Cont or type(result.value) is not Turn:
        error = runner.wrong_return(
            step,
            result,
            "Cont(turn) — a background hook runs after the commit, so it cannot halt or regenerate",
            group=False,
        )
        _failed(runner, step, records, elapsed, exc_text(error))
        return ()
    if step.hook.shadow:
        # Recorded, never kept: nothing a shadow hook injects is committed.
        runner.shadow_verdict(step, elapsed, "cont", result, records)
        return ()
    known = {id(injection) for injection in turn.injections}
    added = [item for item in result.value.injections if id(item) not in known]
    problem = _added_problem(added)
    if problem is not None:
        # Checked like an ordered hook's: what is committed must be sendable again.
        _failed(runner, step, records, elapsed, f"HookReturnError: hook {step.label} {problem}")
        return ()
    runner.finished(step, elapsed, "cont", records=records)
    fresh = tuple(
        Injection(injection.parts, step.name, step.hook.durable, "post") for injection in added
    )
    if emit is not None:
        runner.announce(step, fresh)
    return fresh


def _added_problem(added: Sequence[object]) -> str | None:
    """What is wrong with the injections a background hook added, or None."""
    for item in added:
        if type(item) is not Injection:
            return (
                f"returned a turn whose injections hold {describe(item)}, not an Injection"
                " — add content with `turn.inject(...)`"
            )
        problem = exchange_problem(item.parts)
        if problem is not None:
            return f"added an injection with unpaired tool parts: {problem}"
    return None


async def run_all_background(
    runner: Runner, steps: Sequence[Step], turn: Turn
) -> tuple[Injection, ...]:
    """Run every background hook concurrently and wait for them (no session to hold them).

    Their records join the turn's audit in declaration order, whatever order they end in;
    their injections are returned, in the same order, for the audit record.
    """
    records: list[list[HookRecord]] = [[] for _ in steps]
    injected: list[tuple[Injection, ...]] = [() for _ in steps]
    # Each hook's KeyboardInterrupt or SystemExit, in declaration order (`stopping_interrupt`).
    interrupts: list[tuple[BaseException, bool, str] | None] = [None for _ in steps]

    async def one(index: int, hooks: anyio.CancelScope) -> None:
        try:
            injected[index] = await run_background(runner, steps[index], turn, records[index])
        except anyio.get_cancelled_exc_class():
            # Only a hook that started can be cancelled in `run_background` (it awaits
            # nothing before its HookStarted): one a sibling's interrupt cut short ends as a
            # session's does, a failure not enforced. (A caller's cancellation stops the
            # turn's consumer too: nobody would read it.)
            stopped = [raised for raised in interrupts if raised is not None]
            if stopped and runner.emit is not None:
                # Named as `stopping_interrupt` picks it: the first raised before the cancel.
                interrupt, _, who = min(stopped, key=lambda raised: raised[1])
                cut = f"cut short: {who} raised {type(interrupt).__name__}, which stopped the turn"
                step = steps[index]
                runner.emit(ev.HookFailed(runner.turn_ref, step.name, step.stage, cut, False))
            raise
        except (KeyboardInterrupt, SystemExit) as exc:
            # Raised below, by the task awaiting the hooks, as a parallel member's is: out of
            # a task, asyncio would stop its loop before the other hooks' tasks even started.
            interrupts[index] = (exc, hooks.cancel_called, f"background hook {steps[index].label}")
            await stop_group(hooks)

    try:
        async with anyio.create_task_group() as hooks:
            for index in range(len(steps)):
                hooks.start_soon(one, index, hooks.cancel_scope)
    except BaseException:
        # A cancellation of the caller's arriving meanwhile must not swallow the interrupt.
        if not any(interrupts):
            raise
    interrupt = stopping_interrupt(
        [raised for raised in interrupts if raised is not None], "the background hooks"
    )
    if interrupt is not None:
        raise interrupt
    for step_records in records:
        runner.records.extend(step_records)
    return tuple(injection for step_injected in injected for injection in step_injected)


def _failed(
    runner: Runner, step: Step, records: list[HookRecord], elapsed: float, detail: str
) -> None:
    """Record a background hook's failure: an audit entry and an event, never raised."""
    log.warning("background hook %r failed after turn %s: %s", step.name, runner.turn_ref, detail)
    records.append(
        HookRecord(
            step.name, step.stage, step.position, elapsed, "failed", step.hook.shadow, detail
        )
    )
    if runner.emit is not None:
        runner.emit(ev.HookFailed(runner.turn_ref, step.name, step.stage, detail, False))
