"""Parallel groups: append-only members run concurrently, merged in declaration order."""

import anyio
import anyio.lowlevel

from turns import Part, Turn
from turns._parts import exchange_problem, part_problem

from ._audit import HookRecord
from ._describe import PART_TYPES
from ._errors import HookError
from ._excgroups import first_failure, stopping_interrupt
from ._plan import Group, Step
from ._runner import Runner, malformed
from ._signals import Halt


class _Member:
    """One member's run: what it decided, or how it failed, and its records."""

    __slots__ = ("failure", "interrupt", "interrupt_late", "outcome", "records", "step")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.records: list[HookRecord] = []
        self.outcome: tuple[Part, ...] | Halt | None = None
        self.failure: HookError | None = None
        self.interrupt: BaseException | None = None
        # Whether it came once the group was being stopped (raised while being cancelled).
        self.interrupt_late = False


async def run_group(runner: Runner, group: Group, turn: Turn) -> Turn | Halt:
    """Run a group's members on the same turn; their parts are added in declaration order.

    A member that halts or fails (enforced) cancels its running siblings. Failures win over
    halts; among several, the lowest position wins and, for failures, the others are attached
    as notes. Members never raise into the task group, so no ExceptionGroup leaves it: a
    `KeyboardInterrupt` or `SystemExit` out of a member stops the group like a failure and is
    raised here, once its siblings were cancelled, even when the caller's scope is cancelled
    meanwhile.
    """
    members = [_Member(step) for step in group.members]
    # A member skipped (or failing open in its `when=`) is recorded with the others, at its
    # position: the group's audit records follow declaration order.
    running = [
        m for m in members if m.step.hook.when is None or runner.passes(m.step, turn, m.records)
    ]
    try:
        async with anyio.create_task_group() as members_group:
            for member in running:
                members_group.start_soon(
                    _run_member, runner, member, turn, members_group.cancel_scope
                )
    except BaseException:
        # The caller's scope cancelled as a member was interrupted (a deadline passing then,
        # or the member cancelling it itself): the task group raises the cancellation, which
        # the caller's `move_on_after` would absorb, losing the interrupt. The interrupt wins.
        if not any(member.interrupt is not None for member in members):
            raise
    interrupt = stopping_interrupt(
        [
            (member.interrupt, member.interrupt_late, f"member {member.step.label}")
            for member in members
            if member.interrupt is not None
        ],
        "the group",
    )
    if interrupt is not None:
        raise interrupt
    return _merge(runner, group, turn, members)


async def _run_member(
    runner: Runner, member: _Member, turn: Turn, group: anyio.CancelScope
) -> None:
    step = member.step
    started = runner.now()
    try:
        called = await runner.timed(step, turn, records=member.records, threaded=True)
    except anyio.get_cancelled_exc_class():
        runner.finished(step, runner.now() - started, "cancelled", records=member.records)
        raise
    except HookError as error:
        # Enforced: recorded by `timed`, and it stops the group.
        member.failure = error
        await stop_group(group)
        return
    except BaseException as exc:
        # A KeyboardInterrupt or SystemExit of the member's own: raised by `run_group`, in
        # the task awaiting the group. Out of a task, asyncio would stop its loop at once:
        # siblings not yet started never run (AnyIO made each one's coroutine when it
        # scheduled it: never awaited, it warns), those started are dropped mid-await.
        member.interrupt = exc
        member.interrupt_late = group.cancel_called
        await stop_group(group)
        return
    if called is None:
        return
    result, elapsed = called
    outcome: tuple[Part, ...] | Halt
    try:
        if type(result) is Halt:
            verdict, outcome = "halt", runner.halt_of(step, result)
        elif (type(result) is list or type(result) is tuple) and all(
            type(part) in PART_TYPES for part in result
        ):
            for part in result:
                problem = part_problem(part)
                if problem is not None:
                    raise malformed(step, f"a malformed part: {problem}")
            problem = exchange_problem(result)
            if problem is not None:
                raise malformed(step, f"unpaired tool parts: {problem}")
            verdict, outcome = "parts", tuple(result)
        else:
            raise runner.wrong_return(step, result, "a list of parts or Halt", group=True)
    except HookError as error:
        if _failed(runner, member, error, elapsed):
            await stop_group(group)
        return
    if step.hook.shadow:
        runner.shadow_verdict(step, elapsed, verdict, outcome, member.records)
        return
    detail = outcome.reason if type(outcome) is Halt else None
    runner.finished(step, elapsed, verdict, detail, member.records)
    member.outcome = outcome
    if type(outcome) is Halt:
        await stop_group(group)


def _failed(runner: Runner, member: _Member, exc: Exception, elapsed: float) -> bool:
    """Record a member's failure; True when it is enforced and must stop the group."""
    try:
        runner.fail(member.step, exc, elapsed, member.records)
    except HookError as error:
        member.failure = error
        return True
    return False


async def stop_group(group: anyio.CancelScope) -> None:
    """Cancel a group's running tasks (members, tool calls), once those already woken have run.

    Siblings woken in the same scheduler batch (at the same instant) finish first, so that
    when several halt or fail at once the lowest position wins, whatever order the loop happened
    to run them in. The checkpoint is shielded: the caller's outcome is already recorded.
    """
    await anyio.lowlevel.cancel_shielded_checkpoint()
    group.cancel()


def _merge(runner: Runner, group: Group, turn: Turn, members: list[_Member]) -> Turn | Halt:
    for member in members:
        runner.records.extend(member.records)
    failures = [member.failure for member in members if member.failure is not None]
    if failures:
        raise first_failure(failures, lambda other: f"{group.name!r} also failed: {other}")
    for member in members:
        if type(member.outcome) is Halt:
            return member.outcome
    contributions = [
        (member.step, member.outcome)
        for member in members
        if type(member.outcome) is tuple and member.outcome
    ]
    if not contributions:
        return turn
    return runner.added(turn, contributions)
