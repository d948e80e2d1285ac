"""Tool hooks: each call of a batch through its before-tool hooks, each result through its
after-tool hooks, each hook's signal judged for its stage.

The tool loop (`_toolloop.py`) runs the calls; this module decides, per hook, whether it
applies (``match=``, ``when=``), what its signal means (`Cont`, `Block`, `Ask`, `Halt`), and
records it on the call's `ToolJob`.
"""

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, Literal, final

import anyio
import attrs

from turns import ToolCall, ToolResult, Turn
from turns._parts import part_problem

from . import events as ev
from ._audit import HookRecord
from ._describe import describe, exc_text
from ._errors import HookError, HookFailed, HookReturnError
from ._hooks import callable_name
from ._loop import spurious_cancellation
from ._plan import Plan, Step
from ._runner import RUNNING, Emit, Runner, malformed
from ._signals import Ask, Block, Cont, Halt
from ._tools import HOOK_BLOCKED


class ToolJob:
    """One tool call of a batch: what became of it, and its hooks' records."""

    __slots__ = (
        "blocked_by",
        "call",
        "call_rewritten_by",
        "failure",
        "halt",
        "interrupt",
        "interrupt_late",
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
        # A KeyboardInterrupt or SystemExit out of the call (its hooks or its tool).
        self.interrupt: BaseException | None = None
        # Whether it came once the batch was being stopped (raised while being cancelled).
        self.interrupt_late = False
        self.records: list[HookRecord] = []
        self.blocked_by: str | None = None
        self.call_rewritten_by: list[str] = []
        self.result_rewritten_by: list[str] = []


async def run_before_hooks(runner: Runner, job: ToolJob, turn: Turn) -> ToolCall | None:
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
            except anyio.get_cancelled_exc_class():
                runner.finished(
                    step, elapsed + runner.now() - asked, "cancelled", None, job.records
                )
                raise
            except (KeyboardInterrupt, SystemExit) as exc:
                # A Ctrl-C at the callback's prompt, say: the hook's HookStarted is closed,
                # as for an interrupt out of the hook itself (`Runner.timed`).
                runner.interrupted(step, exc, elapsed + runner.now() - asked, job.records)
                raise
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
        _check_rewrite(step, value, "call")
        return result
    if type(result) is Halt:
        return runner.halt_of(step, result)
    if type(result) is Block or type(result) is Ask:
        text: object = result.reason if type(result) is Block else result.question
        if not isinstance(text, str) or not text.strip():
            said = (
                "without a reason"
                if text is None or isinstance(text, str)
                else f"with {type(text).__name__} {text!r:.60} for its reason, not text"
            )
            raise HookReturnError(
                f"hook {step.label} returned {type(result).__name__.lower()}() {said}; the"
                " model (or the person asked) needs to know why",
                hook=step.name,
                stage=step.stage,
            )
        return result
    raise runner.wrong_return(step, result, "Cont(call), Block, Ask or Halt", group=False)


def _check_rewrite(step: Step, part: ToolCall | ToolResult, what: str) -> None:
    """A rewritten call or result whose fields have the wrong types is the hook's error.

    `with_arguments` and `with_content` do not check what they are given; unchecked, a
    call's arguments that are no mapping or a result's content that is no text would fail
    later, far from the hook, as a bare TypeError naming none.
    """
    problem = part_problem(part)
    if problem is not None:
        raise malformed(step, f"a malformed {what}: {problem}")


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
    except BaseException as exc:
        # A CancelledError of its own (a person's answer awaited on a future the UI
        # cancelled, say) is its failure too; a cancellation of the turn propagates.
        if not isinstance(exc, Exception) and not spurious_cancellation(exc):
            raise
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


def _block(runner: Runner, job: ToolJob, step: Step, call: ToolCall, reason: str) -> None:
    job.blocked_by = step.name
    job.result = ToolResult(call.id, reason, is_error=True, error_class=HOOK_BLOCKED)
    if runner.emit is not None:
        runner.emit(ev.ToolBlocked(runner.turn_ref, call, step.name, reason))


async def run_after_hooks(
    runner: Runner, job: ToolJob, call: ToolCall, result: ToolResult, turn: Turn, *, enforce: bool
) -> ToolResult | None:
    """Run the after-tool hooks on a result: the effective result, or None (halted)."""
    for step in runner.plan.after_tool:
        judged = await _judged(
            runner, step, job, turn, call.name, (call, result, turn), _after_signal, enforce
        )
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
        _check_rewrite(step, rewritten, "result")
        return value
    if type(value) is Halt:
        return runner.halt_of(step, value)
    raise runner.wrong_return(step, value, "Cont(result) or Halt", group=False)


async def _judged(
    runner: Runner,
    step: Step,
    job: ToolJob,
    turn: Turn,
    name: str,
    args: tuple[Any, ...],
    judge: Callable[[Runner, Step, tuple[Any, ...], object], object],
    enforce: bool = True,
) -> tuple[object, float] | None:
    """Run a tool hook on `args` if it applies to the tool `name`: its checked signal and time.

    None when it did not apply, failed open, returned the wrong signal (recorded; raised when
    enforced), or is a shadow (its verdict recorded, nothing enforced). Without `enforce` (a
    cancelled call's after-tool hooks), no failure is raised, nor said to stop the turn.
    """
    if not _applies(runner, step, name, turn, job.records, enforce):
        return None
    fail = runner.fail if enforce else functools.partial(runner.fail, enforceable=False)
    started = runner.now()
    try:
        called = await runner.timed(step, *args, records=job.records, failed=fail)
    except anyio.get_cancelled_exc_class():
        # A sibling call's halt or failure stopped the batch (or the caller cancelled the
        # turn) while the hook ran: its HookStarted is closed, as a parallel member's is.
        runner.finished(step, runner.now() - started, "cancelled", records=job.records)
        raise
    if called is None:
        return None
    returned, elapsed = called
    try:
        signal = judge(runner, step, args, returned)
    except HookReturnError as error:
        fail(step, error, elapsed, job.records)
        return None
    if step.hook.shadow:
        runner.shadow_verdict(step, elapsed, _verdict(signal), signal, job.records)
        return None
    return signal, elapsed


def _applies(
    runner: Runner,
    step: Step,
    name: str,
    turn: Turn,
    records: list[HookRecord],
    enforce: bool = True,
) -> bool:
    """Whether a tool hook's ``match=`` accepts the tool `name` (and its ``when=`` the turn).

    A predicate that fails is the hook's failure, enforced only with `enforce` (`_judged`).
    """
    match = step.hook.match
    if isinstance(match, str):
        accepted: bool | None = match == name
    elif isinstance(match, re.Pattern):
        accepted = match.fullmatch(name) is not None
    elif match is not None:
        accepted = runner.predicate(step, "match=", match, name, records, enforceable=enforce)
    else:
        accepted = True
    if not accepted:
        return False
    if step.hook.when is not None:
        return runner.passes(step, turn, records, enforceable=enforce)
    return True


@final
@attrs.frozen(kw_only=True)
class ToolVerdict:
    """What a pipeline's before-tool hooks decided about one tool call
    (`Pipeline.judge_tool_call`).

    Attributes:
        call: The call as the hooks left it: a hook may have rewritten its arguments.
        outcome: ``"run"`` (every applying hook let it through, an ``ask`` was granted),
            ``"blocked"`` (a ``block``, or an ``ask`` not granted) or ``"halted"``.
        hook: The hook that blocked or halted it; None when it may run.
        reason: Why it was blocked or halted (what the model would read); ``""`` for run.
        records: One `HookRecord` per hook that applied, in order (shadows included).
    """

    call: ToolCall
    outcome: Literal["run", "blocked", "halted"]
    hook: str | None = None
    reason: str = ""
    records: tuple[HookRecord, ...] = ()


async def judge_call(plan: Plan, call: ToolCall, turn: Turn, emit: Emit | None) -> ToolVerdict:
    """Run `plan`'s before-tool hooks on `call`, exactly as the tool loop runs them."""
    runner = Runner(plan, None if emit is None else _stamping(emit, turn.turn_ref))
    runner.turn_ref = turn.turn_ref
    job = ToolJob(call)
    allowed = await run_before_hooks(runner, job, turn)
    records = tuple(job.records)
    if allowed is not None:
        return ToolVerdict(call=allowed, outcome="run", records=records)
    if job.halt is not None:
        return ToolVerdict(
            call=job.call,
            outcome="halted",
            hook=job.halt.hook,
            reason=job.halt.reason,
            records=records,
        )
    assert job.result is not None
    return ToolVerdict(
        call=job.call,
        outcome="blocked",
        hook=job.blocked_by,
        reason=str(job.result.content),
        records=records,
    )


_set_at = ev.Event.at.__set__  # type: ignore[attr-defined]


def _stamping(emit: Emit, turn_ref: str) -> Emit:
    """`emit`, handed each event with its `at`: on the turn's clock when a hook of that turn
    (the gateway's client-tool policy, say) judges the call; else from the judgment's start."""
    running = RUNNING.get()
    if running is not None and running.turn_ref == turn_ref and running.relay is not None:
        now, start = running.now, running.start
    else:
        now = anyio.current_time
        start = now()

    def stamped(event: ev.Event) -> None:
        _set_at(event, now() - start)
        emit(event)

    return stamped
