"""Stages 4-5 of one attempt: the model call and, when the model asks for tools, the tool loop.

An attempt is a bounded loop of model calls (``max_steps``). When a call ends with tool
calls, they form one *batch*: each call goes through the before-tool hooks, runs, and goes
through the after-tool hooks, in a task of its own; tasks start in call order, at most
``tool_concurrency`` at a time. The batch is atomic: the model gets every result, in call
order, or the turn stops (a hook's halt or failure) and none of it is kept.
"""

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import attrs

from turns import Message, Reply, RequestOptions, ToolCall, ToolResult, Turn, Usage

from . import events as ev
from ._audit import AttemptRecord, ToolRecord
from ._errors import HookError, StepLimitExceeded
from ._excgroups import first_failure, stopping_interrupt
from ._model import ModelRequest
from ._observe import TOOL_CALL
from ._parallel import stop_group
from ._request import annotations_of, call_model, check_context, open_seam
from ._runner import Runner
from ._signals import Halt
from ._tooljudge import ToolJob, run_after_hooks, run_before_hooks
from ._tools import CANCELLED, CURRENT_TOOLS, UNKNOWN_TOOL, Tool, invalid_arguments

TOOL_HOOKS = "tool_hooks"
"""The `ToolResult.meta` key saying which hooks blocked or rewrote a call or its result, so
a replay of the log can tell a hook's substitution from a real tool result."""

CANCELLED_GRACE = 2.0
"""Seconds the after-tool hooks of a cancelled call get, shielded, to see the cancellation."""


async def answer(
    runner: Runner, turn: Turn, request: ModelRequest, attempt: int, held: list[ev.Event] | None
) -> Reply | Halt:
    """One attempt: call the model, run the tools it asks for, until it answers.

    Returns the attempt's reply, or a tool hook's halt.

    Raises:
        StepLimitExceeded: The model still asked for tools on its ``max_steps``-th call.
    """
    plan = runner.plan
    emit = runner.emit
    deliver = held.append if held is not None and emit is not None else emit
    seam = open_seam(runner)
    exchange: tuple[Message, ...] = ()
    usage = Usage()
    for call_index in range(1, plan.max_steps + 1):
        message, finish = await call_model(runner, request, attempt, call_index, seam, deliver)
        usage = finish.usage if call_index == 1 else usage + finish.usage
        calls = [part for part in message.parts if type(part) is ToolCall]
        # A pipeline without tools does not hide that the model asked for some: the calls
        # stay in the reply for the caller to run.
        if not calls or not CURRENT_TOOLS.get():
            bound = plan.max_regenerations + 1
            annotations = annotations_of(runner, seam)
            messages = (*exchange, message)
            reply = (
                Reply(message, messages, attempt, finish.reason, usage, annotations, bound)
                if annotations
                else Reply(message, messages, attempt, finish.reason, usage, max_attempts=bound)
            )
            runner.attempts.append(
                AttemptRecord(attempt, call_index, message.text, finish.reason, usage)
            )
            if deliver is not None:
                deliver(ev.ReplyReady(runner.turn_ref, reply))
            return reply
        if call_index == plan.max_steps:
            raise StepLimitExceeded(
                f"the model still asked for tools ({', '.join(c.name for c in calls)}) on"
                f" model call {call_index} of attempt {attempt}, the last one max_steps={call_index}"
                " allows, without a final answer; raise max_steps, or check what the tools"
                " return",
                attempt=attempt,
                max_steps=plan.max_steps,
            )
        if emit is not None:
            for call in calls:
                emit(ev.ToolCallRequested(runner.turn_ref, call, attempt, call_index))
        outcome = await run_batch(runner, turn, calls, request, attempt, call_index)
        if type(outcome) is Halt:
            # The attempt stops here, but it happened: the audit keeps its model calls (and
            # what they cost) beside the tool calls of its settled steps.
            runner.attempts.append(
                AttemptRecord(attempt, call_index, message.text, finish.reason, usage)
            )
            return outcome
        if emit is not None:
            emit(ev.ToolStepFinished(runner.turn_ref, attempt, call_index, outcome))
        answers = tuple(Message.tool(result) for result in outcome)
        exchange = (*exchange, message, *answers)
        messages = (*request.messages, message, *answers)
        check_context(runner, messages, request.tools, (message, outcome))
        request = ModelRequest(messages, request.tools, _after_tools(request.options))
    raise AssertionError("unreachable: the last model call returns or raises")


def _after_tools(options: RequestOptions) -> RequestOptions:
    """The options of the model calls after a tool step.

    A forcing ``tool_choice`` (``"required"`` or a tool's name) has done its work once the
    model called a tool; kept, it would force a call on every step until ``max_steps``. The
    same holds for one in ``extra``, in the provider's own form, which the provider sends in
    place of the option's: it is relaxed to the choice that forces nothing but keeps its
    restrictions (`_relaxed`).
    """
    choice = options.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        options = attrs.evolve(options, tool_choice=None)
    if "tool_choice" in options.extra:
        given = options.extra["tool_choice"]
        relaxed = _relaxed(given)
        if relaxed is not given:
            extra = {key: value for key, value in options.extra.items() if key != "tool_choice"}
            if relaxed is not None:
                extra["tool_choice"] = relaxed
            options = attrs.evolve(options, extra=extra)
    return options


def _relaxed(choice: object) -> object | None:
    """A provider's own ``tool_choice`` for the calls after a tool step; None to leave it out.

    One that forces nothing is kept as it is (the same object): ``"auto"`` and ``"none"``, as
    text or as a dict's ``type``, and OpenAI's ``allowed_tools`` in ``"auto"`` mode. One that
    forces a call keeps what restricts the model beside the forcing: OpenAI's
    ``allowed_tools`` in ``"required"`` mode goes to ``"auto"`` mode over the same tools;
    Anthropic's ``"any"`` or ``"tool"`` goes to ``{"type": "auto"}`` with its
    ``disable_parallel_tool_use``, if it has one. Anything else (``"required"``, OpenAI's
    ``"function"``) restricts nothing but the forcing, and is left out.
    """
    if isinstance(choice, str):
        return choice if choice in ("auto", "none") else None
    if not isinstance(choice, Mapping):
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return choice
    if kind == "allowed_tools":
        allowed = choice.get("allowed_tools")
        if not isinstance(allowed, Mapping):
            return None
        if allowed.get("mode") == "auto":
            return choice
        return {**choice, "allowed_tools": {**allowed, "mode": "auto"}}
    if kind in ("any", "tool"):
        relaxed: dict[str, object] = {"type": "auto"}
        if "disable_parallel_tool_use" in choice:
            relaxed["disable_parallel_tool_use"] = choice["disable_parallel_tool_use"]
        return relaxed
    return None


async def run_batch(
    runner: Runner,
    turn: Turn,
    calls: list[ToolCall],
    request: ModelRequest,
    attempt: int,
    call_index: int,
) -> tuple[ToolResult, ...] | Halt:
    """Run one model call's tool calls; their results in call order, or the halt."""
    tools = CURRENT_TOOLS.get()
    active = {spec.name: tools[spec.name] for spec in request.tools if spec.name in tools}
    jobs = [ToolJob(call) for call in calls]
    limiter = anyio.CapacityLimiter(runner.plan.tool_concurrency)
    stopping = _Stopping()
    try:
        async with anyio.create_task_group() as batch:
            for job in jobs:
                await limiter.acquire_on_behalf_of(job)
                if stopping:
                    # A call halted or failed meanwhile: the calls not started are dropped.
                    limiter.release_on_behalf_of(job)
                    break
                # start(), not start_soon(): a loop may run newly started tasks in any order,
                # and calls start in call order.
                await batch.start(
                    _run_job, runner, turn, job, active, limiter, batch.cancel_scope, stopping
                )
    except BaseException:
        # The caller's scope cancelled as a call was interrupted: the interrupt wins.
        if not any(job.interrupt is not None for job in jobs):
            raise
    interrupt = stopping_interrupt(
        [
            (
                job.interrupt,
                job.interrupt_late,
                f"tool call {job.requested.id} ({job.requested.name!r})",
            )
            for job in jobs
            if job.interrupt is not None
        ],
        "the batch",
    )
    if interrupt is not None:
        raise interrupt
    for job in jobs:
        runner.records.extend(job.records)
    failures = [job.failure for job in jobs if job.failure is not None]
    if failures:
        raise first_failure(
            failures, lambda other: f"another tool call's hook also failed: {other}"
        )
    for job in jobs:
        if job.result is not None:
            runner.calls.append(
                ToolRecord(attempt, call_index, job.requested, job.call, job.result)
            )
    for job in jobs:
        if job.halt is not None:
            return job.halt
    results = tuple(job.result for job in jobs)
    assert all(result is not None for result in results)
    return results  # type: ignore[return-value]


async def _run_job(
    runner: Runner,
    turn: Turn,
    job: ToolJob,
    active: Mapping[str, Tool],
    limiter: anyio.CapacityLimiter,
    batch: anyio.CancelScope,
    stopping: "_Stopping",
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    TOOL_CALL.set(job.requested.id)  # which call this task's hook events are about
    task_status.started()
    try:
        try:
            await _handle(runner, turn, job, active, stopping)
        except HookError as error:
            job.failure = error
        except (KeyboardInterrupt, SystemExit) as exc:
            # Raised by `run_batch`, in the task awaiting the batch, once the calls running
            # ended (a sync tool's thread cannot be interrupted), as trio's nursery would:
            # out of a task, asyncio would stop its loop at once, the later calls never run
            # and a sync tool's thread left behind.
            job.interrupt = exc
            job.interrupt_late = batch.cancel_called
        if job.failure is not None or job.halt is not None or job.interrupt is not None:
            # From now on no tool of the batch starts, not even one whose before-tool hooks
            # already let it through: the siblings still run until the batch is cancelled
            # (`stop_group` lets those woken at the same instant finish their step first).
            stopping.now = True
            # Fail fast: calls in flight are cancelled, calls not started are dropped. The
            # slot is kept until the batch is cancelled: given back first, it would let the
            # next call start while the batch stops.
            await stop_group(batch)
    finally:
        limiter.release_on_behalf_of(job)


class _Stopping:
    """Whether a call of the batch has halted or failed: no tool may start after that."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = False

    def __bool__(self) -> bool:
        return self.now


async def _handle(
    runner: Runner, turn: Turn, job: ToolJob, active: Mapping[str, Tool], stopping: _Stopping
) -> None:
    started = runner.now()
    tool = active.get(job.requested.name)
    if tool is None:
        names = list(active)
        _settle(
            runner,
            job,
            ToolResult(
                job.requested.id,
                f"there is no tool named {job.requested.name!r} this turn; the active tools"
                f" are {names} — call one of them",
                is_error=True,
                error_class=UNKNOWN_TOOL,
            ),
            started,
        )
        return
    call = await run_before_hooks(runner, job, turn)
    if call is None:
        if job.halt is None:
            assert job.result is not None
            _settle(runner, job, job.result, started)
        return
    job.call = call
    arguments = tool.check(call)
    if isinstance(arguments, str):
        _settle(runner, job, invalid_arguments(tool, call, arguments), started)
        return
    if stopping:
        # Another call halted or failed while this one's hooks ran: it is dropped, unrun.
        return
    if runner.emit is not None:
        runner.emit(ev.ToolStarted(runner.turn_ref, call))
    try:
        result = await tool.execute(call, arguments, turn.scope)
    except anyio.get_cancelled_exc_class():
        # After-tool hooks see every executed call, a cancelled one too (to release what
        # the call held, say); shielded and bounded, and nothing they say is kept.
        cancelled = ToolResult(
            call.id, "the call was cancelled", is_error=True, error_class=CANCELLED
        )
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCELLED_GRACE):
            await run_after_hooks(runner, job, call, cancelled, turn, enforce=False)
        raise
    final = await run_after_hooks(runner, job, call, result, turn, enforce=True)
    if final is not None:
        _settle(runner, job, final, started)


def _settle(runner: Runner, job: ToolJob, result: ToolResult, started: float) -> None:
    """Give `job` its effective result, marked with the hooks that shaped it."""
    provenance: dict[str, Any] = {}
    if job.blocked_by is not None:
        provenance["blocked_by"] = job.blocked_by
    if job.call_rewritten_by:
        provenance["arguments_rewritten_by"] = list(job.call_rewritten_by)
        provenance["arguments"] = dict(job.call.arguments)
    if job.result_rewritten_by:
        provenance["result_rewritten_by"] = list(job.result_rewritten_by)
    if provenance:
        result = attrs.evolve(result, meta={**result.meta, TOOL_HOOKS: provenance})
    job.result = result
    if runner.emit is not None:
        runner.emit(ev.ToolFinished(runner.turn_ref, job.call, result, runner.now() - started))
