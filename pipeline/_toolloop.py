"""Stages 4-5 of one attempt: the model call and, when the model asks for tools, the tool loop.

An attempt is a bounded loop of model calls (``max_steps``). When a call ends with tool
calls, they form one *batch*: each call goes through the before-tool hooks, runs, and goes
through the after-tool hooks, in a task of its own; tasks start in call order, at most
``tool_concurrency`` at a time. The batch is atomic: the model gets every result, in call
order, or the turn stops (a hook's halt or failure) and none of it is kept.
"""

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import attrs

from turns import Message, Reply, RequestOptions, ToolCall, ToolResult, Turn, Usage

from . import events as ev
from ._audit import AttemptRecord, HookRecord, ToolRecord
from ._describe import describe, exc_text
from ._emit import hook_started
from ._errors import HookError, HookFailed, HookReturnError, StepLimitExceeded
from ._excgroups import first_failure
from ._hooks import callable_name
from ._model import ModelRequest
from ._parallel import stop_group
from ._plan import Step
from ._request import annotations_of, call_model, check_context
from ._runner import Runner
from ._seam import Seam
from ._signals import Ask, Block, Cont, Halt
from ._tools import CANCELLED, HOOK_BLOCKED, UNKNOWN_TOOL, Tool, invalid_arguments

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
    seam = Seam(plan.transformers) if plan.transformers else None
    exchange: tuple[Message, ...] = ()
    usage = Usage()
    for call_index in range(1, plan.max_steps + 1):
        message, finish = await call_model(runner, request, attempt, call_index, seam, deliver)
        usage = finish.usage if call_index == 1 else usage + finish.usage
        calls = [part for part in message.parts if type(part) is ToolCall]
        # A pipeline without tools does not hide that the model asked for some: the calls
        # stay in the reply for the caller to run.
        if not calls or not plan.tool_map:
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
            return outcome
        answers = tuple(Message.tool(result) for result in outcome)
        exchange = (*exchange, message, *answers)
        messages = (*request.messages, message, *answers)
        check_context(runner, messages, request.tools)
        request = ModelRequest(messages, request.tools, _after_tools(request.options))
    raise AssertionError("unreachable: the last model call returns or raises")


def _after_tools(options: RequestOptions) -> RequestOptions:
    """The options of the model calls after a tool step.

    A forcing ``tool_choice`` (``"required"`` or a tool's name) has done its work once the
    model called a tool; kept, it would force a call on every step until ``max_steps``.
    """
    choice = options.tool_choice
    if choice is None or choice in ("auto", "none"):
        return options
    return attrs.evolve(options, tool_choice=None)


class _Job:
    """One tool call of a batch: what became of it, and its hooks' records."""

    __slots__ = (
        "blocked_by",
        "call",
        "call_rewritten_by",
        "failure",
        "halt",
        "records",
        "requested",
        "result",
        "result_rewritten_by",
    )

    def __init__(self, call: ToolCall) -> None:
        self.requested = call
        self.call = call
        self.result: ToolResult | None = None
        self.halt: Halt | None = None
        self.failure: HookError | None = None
        self.records: list[HookRecord] = []
        self.blocked_by: str | None = None
        self.call_rewritten_by: list[str] = []
        self.result_rewritten_by: list[str] = []


async def run_batch(
    runner: Runner,
    turn: Turn,
    calls: list[ToolCall],
    request: ModelRequest,
    attempt: int,
    call_index: int,
) -> tuple[ToolResult, ...] | Halt:
    """Run one model call's tool calls; their results in call order, or the halt."""
    tools = runner.plan.tool_map
    active = {spec.name: tools[spec.name] for spec in request.tools if spec.name in tools}
    jobs = [_Job(call) for call in calls]
    limiter = anyio.CapacityLimiter(runner.plan.tool_concurrency)
    async with anyio.create_task_group() as batch:
        for job in jobs:
            await limiter.acquire_on_behalf_of(job)
            # start(), not start_soon(): a loop may run newly started tasks in any order,
            # and calls start in call order.
            await batch.start(_run_job, runner, turn, job, active, limiter, batch.cancel_scope)
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
    job: _Job,
    active: Mapping[str, Tool],
    limiter: anyio.CapacityLimiter,
    batch: anyio.CancelScope,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    try:
        try:
            await _handle(runner, turn, job, active)
        except HookError as error:
            job.failure = error
        if job.failure is not None or job.halt is not None:
            # Fail fast: calls in flight are cancelled, calls not started are dropped. The
            # slot is kept until the batch is cancelled: given back first, it would let the
            # next call start while the batch stops.
            await stop_group(batch)
    finally:
        limiter.release_on_behalf_of(job)


async def _handle(runner: Runner, turn: Turn, job: _Job, active: Mapping[str, Tool]) -> None:
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
    call = await _before(runner, job, turn)
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
            await _after(runner, job, call, cancelled, turn, enforce=False)
        raise
    final = await _after(runner, job, call, result, turn, enforce=True)
    if final is not None:
        _settle(runner, job, final, started)


def _settle(runner: Runner, job: _Job, result: ToolResult, started: float) -> None:
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


async def _before(runner: Runner, job: _Job, turn: Turn) -> ToolCall | None:
    """Run the before-tool hooks on a call: the call to run, or None (blocked or halted)."""
    call = job.call
    for step in runner.plan.before_tool:
        judged = await _judged(runner, step, job, turn, call.name, (call, turn), _before_signal)
        if judged is None:
            continue
        signal, elapsed = judged
        if type(signal) is Cont:
            runner.finished(step, elapsed, "cont", records=job.records)
            if signal.value != call:
                job.call_rewritten_by.append(step.name)
                call = job.call = signal.value
        elif type(signal) is Halt:
            runner.finished(step, elapsed, "halt", signal.reason, job.records)
            job.halt = signal
            return None
        elif type(signal) is Block:
            runner.finished(step, elapsed, "block", signal.reason, job.records)
            _block(runner, job, step, call, signal.reason)
            return None
        else:
            assert type(signal) is Ask
            # The hook's time includes the wait for permission (a person may be asked).
            asked = runner.now()
            try:
                allowed, reason = await _ask(runner, step, call, signal.question, turn)
            except HookError as error:
                runner.fail(step, error, elapsed + runner.now() - asked, job.records)
                continue
            runner.finished(step, elapsed + runner.now() - asked, "ask", reason, job.records)
            if not allowed:
                _block(runner, job, step, call, reason)
                return None
    return call


def _before_signal(runner: Runner, step: Step, args: tuple[Any, ...], result: object) -> object:
    call: ToolCall = args[0]
    if type(result) is Cont:
        value = result.value
        if type(value) is not ToolCall:
            raise runner.wrong_return(step, result, "Cont(call), Block, Ask or Halt", group=False)
        if value.id != call.id or value.name != call.name:
            raise HookReturnError(
                f"hook {step.label} changed the call's {'id' if value.id != call.id else 'name'};"
                " a before-tool hook may rewrite the arguments (call.with_arguments(...)), not"
                " which call this is — block it instead",
                hook=step.name,
                stage=step.stage,
            )
        return result
    if type(result) is Halt:
        return runner.halt_of(step, result)
    if type(result) is Block or type(result) is Ask:
        text = result.reason if type(result) is Block else result.question
        if not isinstance(text, str) or not text.strip():
            raise HookReturnError(
                f"hook {step.label} returned {type(result).__name__.lower()}() without a"
                " reason; the model (or the person asked) needs to know why",
                hook=step.name,
                stage=step.stage,
            )
        return result
    raise runner.wrong_return(step, result, "Cont(call), Block, Ask or Halt", group=False)


def _verdict(signal: object) -> str:
    return type(signal).__name__.lower()


async def _ask(
    runner: Runner, step: Step, call: ToolCall, question: str, turn: Turn
) -> tuple[bool, str]:
    """Ask the pipeline's permission callback; (allowed, what to record and tell the model)."""
    permission = runner.plan.permission
    if permission is None:
        return False, (
            f"not run: the call needs permission ({question}) and the pipeline has no"
            " permission callback to ask"
        )
    name = callable_name(permission)
    try:
        answer = permission(call, question, turn)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:
        error = HookFailed(
            f"the permission callback {name!r} raised {exc_text(exc)} when hook {step.label}"
            f" asked {question!r}",
            hook=step.name,
            stage=step.stage,
        )
        raise error from exc
    if type(answer) is not bool:
        raise HookReturnError(
            f"the permission callback {name!r} must return True or False, got"
            f" {describe(answer)} (hook {step.label} asked {question!r})",
            hook=step.name,
            stage=step.stage,
        )
    if answer:
        return True, f"allowed: {question}"
    return False, f"permission denied: {question}"


def _block(runner: Runner, job: _Job, step: Step, call: ToolCall, reason: str) -> None:
    job.blocked_by = step.name
    job.result = ToolResult(call.id, reason, is_error=True, error_class=HOOK_BLOCKED)
    if runner.emit is not None:
        runner.emit(ev.ToolBlocked(runner.turn_ref, call, step.name, reason))


async def _after(
    runner: Runner, job: _Job, call: ToolCall, result: ToolResult, turn: Turn, *, enforce: bool
) -> ToolResult | None:
    """Run the after-tool hooks on a result: the effective result, or None (halted)."""
    for step in runner.plan.after_tool:
        try:
            judged = await _judged(
                runner, step, job, turn, call.name, (call, result, turn), _after_signal
            )
        except HookError:
            if enforce:
                raise
            continue
        if judged is None:
            continue
        signal, elapsed = judged
        if type(signal) is Halt:
            runner.finished(step, elapsed, "halt", signal.reason, job.records)
            if enforce:
                job.halt = signal
                return None
            continue
        assert type(signal) is Cont
        runner.finished(step, elapsed, "cont", records=job.records)
        if signal.value != result:
            job.result_rewritten_by.append(step.name)
            result = signal.value
    return result


def _after_signal(runner: Runner, step: Step, args: tuple[Any, ...], value: object) -> object:
    result: ToolResult = args[1]
    if type(value) is Cont:
        rewritten = value.value
        if type(rewritten) is not ToolResult:
            raise runner.wrong_return(step, value, "Cont(result) or Halt", group=False)
        if rewritten.call_id != result.call_id:
            raise HookReturnError(
                f"hook {step.label} changed the result's call_id; an after-tool hook may"
                " rewrite the content (result.with_content(...)), not which call it answers",
                hook=step.name,
                stage=step.stage,
            )
        return value
    if type(value) is Halt:
        return runner.halt_of(step, value)
    raise runner.wrong_return(step, value, "Cont(result) or Halt", group=False)


async def _judged(
    runner: Runner,
    step: Step,
    job: _Job,
    turn: Turn,
    name: str,
    args: tuple[Any, ...],
    judge: Callable[[Runner, Step, tuple[Any, ...], object], object],
) -> tuple[object, float] | None:
    """Run a tool hook on `args` if it applies to the tool `name`: its checked signal and time.

    None when it did not apply, failed open, returned the wrong signal (recorded; raised when
    enforced), or is a shadow (its verdict recorded, nothing enforced).
    """
    if not _applies(runner, step, name, turn, job.records):
        return None
    called = await _call(runner, step, job, *args)
    if called is None:
        return None
    returned, elapsed = called
    try:
        signal = judge(runner, step, args, returned)
    except HookReturnError as error:
        runner.fail(step, error, elapsed, job.records)
        return None
    if step.hook.shadow:
        runner.shadow_verdict(step, elapsed, _verdict(signal), signal, job.records)
        return None
    return signal, elapsed


async def _call(runner: Runner, step: Step, job: _Job, *args: Any) -> tuple[object, float] | None:
    """Run a tool hook: what it returned and how long it took; None when it failed open."""
    if runner.emit is not None:
        runner.emit(hook_started(runner.turn_ref, step.name, step.stage))
    started = runner.now()
    try:
        result = await runner.call(step, *args)
    except Exception as exc:
        runner.fail(step, exc, runner.now() - started, job.records)
        return None
    return result, runner.now() - started


def _applies(runner: Runner, step: Step, name: str, turn: Turn, records: list[HookRecord]) -> bool:
    """Whether a tool hook's ``match=`` accepts the tool `name` (and its ``when=`` the turn)."""
    match = step.hook.match
    if isinstance(match, str):
        accepted: bool | None = match == name
    elif isinstance(match, re.Pattern):
        accepted = match.fullmatch(name) is not None
    elif match is not None:
        accepted = runner.predicate(step, "match=", match, name, records)
    else:
        accepted = True
    if not accepted:
        return False
    if step.hook.when is not None:
        return runner.passes(step, turn, records)
    return True
