"""Running one hook: calling it, judging what it returned, recording what happened.

`Runner` holds one turn's bookkeeping (records, events, the injection budget) and the steps
every stage shares; the drive loop (`_drive.py`) and parallel groups (`_parallel.py`) build
on it. `emit` is None when nobody listens, and then no event object is built.
"""

import contextvars
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import anyio
import anyio.lowlevel
import attrs

from turns import Injection, Message, Part, Stage, Stamper, ToolCall, ToolResult, Turn
from turns._parts import exchange_problem

from . import events as ev
from ._audit import AttemptRecord, HookRecord, Rejection, ToolRecord, new_record
from ._budget import parts_tokens
from ._describe import as_raised, describe, exc_text, wrong_return_hint
from ._emit import hook_finished, hook_started
from ._errors import HookError, HookFailed, HookReturnError, HookTimeout, InjectionOverflow
from ._loop import spurious_cancellation
from ._plan import Plan, Step
from ._signals import Ask, Block, Cont, Halt, Regenerate, check_halt_reply

Emit: TypeAlias = Callable[[ev.Event], None]
Failed: TypeAlias = Callable[[Step, Exception, float, "list[HookRecord] | None"], None]

log = logging.getLogger("turnplug.pipeline")

# Shadow verdicts an operator rolling out a guardrail needs to hear about.
_REFUSALS = frozenset(("halt", "regenerate", "block", "ask"))


RUNNING: contextvars.ContextVar["Runner | None"] = contextvars.ContextVar(
    "turnplug_running", default=None
)
"""The runner of the turn whose hooks are running (set for the drive), or None outside a turn:
`judge_tool_call` stamps its events' `at` on the turn's clock when a hook of that turn calls it."""


class Runner:
    """One turn's bookkeeping and the hook-running steps all stages share."""

    __slots__ = (
        "attempts",
        "calls",
        "compacted",
        "emit",
        "given",
        "injected_tokens",
        "known",
        "known_of",
        "late",
        "now",
        "plan",
        "records",
        "rejections",
        "relay",
        "shaped_by",
        "sizes",
        "stamper",
        "start",
        "threads",
        "tools",
        "turn_ref",
        "viewed_by",
    )

    def __init__(self, plan: Plan, emit: Emit | None) -> None:
        self.plan = plan
        self.emit = emit
        # Set by the turn's watch at its first event: ``relay[0]`` hands on an event whose
        # `at` is already stamped (from a clock read the caller took anyway), against
        # `start`, the turn's start on the same clock. A one-item list, read afresh for every
        # event: a streamed turn's consumer swaps what is in it (`TurnEvents`). None until
        # then, and for a turn nobody watches.
        self.relay: list[Emit] | None = None
        self.start = 0.0
        self.records: list[HookRecord] = []
        self.attempts: list[AttemptRecord] = []
        self.rejections: list[Rejection] = []
        self.calls: list[ToolRecord] = []
        # Injections of background hooks awaited by run(): in the audit, not on the turn.
        self.late: tuple[Injection, ...] = ()
        self.injected_tokens = 0
        # Token size of every injection on the turn, by identity, so that an injection a later
        # hook removes or rewrites is taken off the running total.
        self.sizes: dict[int, int] = {}
        # The identities of the injections of the turn last stamped (`known_ids`).
        self.known_of: tuple[Injection, ...] = ()
        self.known: set[int] | None = None
        # Stamps what `Turn.inject` adds while an ordered hook runs (see `stamp`).
        self.stamper = Stamper()
        self.turn_ref = ""
        self.tools: tuple[str, ...] = ()
        # The history the turn began with, before any view (``compact=``, pre hooks): a call
        # already split from its result there is not a view's fault (`check_exchange`).
        self.given: tuple[Message, ...] = ()
        # The history ``compact=`` returned (None: it failed open, or there is none), and the
        # last pre hook that replaced the history after it: who a ContextOverflow blames.
        self.compacted: tuple[Message, ...] | None = None
        self.viewed_by: str | None = None
        # Which hook last narrowed active_tools or set tool_choice, for RequestError messages.
        self.shaped_by: dict[str, str] = {}
        self.now: Callable[[], float] = anyio.current_time
        # Where a session keeps the scopes of its background hooks' worker threads, which its
        # drain timeout abandons (`in_thread`); None: a cancellation waits for the thread.
        self.threads: set[anyio.CancelScope] | None = None

    # -- calling ------------------------------------------------------------------------------

    async def call(self, step: Step, *args: Any, threaded: bool = False) -> Any:
        """Call a hook's function, applying its timeout; sync functions may run in a thread.

        A sync hook runs inline unless it is a group member (`threaded`) or has a timeout: in
        a worker thread it cannot block its siblings. A thread cannot be interrupted: without
        a timeout, a cancelled turn waits for it to return (no work is left behind); with a
        timeout, it is abandoned when the timeout fires.

        Every exception out of it is the hook's own; a timeout is `TIMED_OUT`, returned.
        """
        hook = step.hook
        if hook.timeout is None:
            if hook.is_async:
                return await hook.fn(*args)
            if threaded:
                (result,) = await self.in_thread(hook.fn, *args)
                # A cancellation that came while the thread ran is left pending (the thread
                # could not be interrupted): the turn stops here, not at a later checkpoint
                # it may never reach.
                await anyio.lowlevel.checkpoint_if_cancelled()
                return await _settle(result)
            return await _settle(hook.fn(*args))
        with anyio.move_on_after(hook.timeout) as scope:
            if hook.is_async:
                result = await hook.fn(*args)
            else:
                (result,) = await anyio.to_thread.run_sync(
                    _boxed, hook.fn, *args, abandon_on_cancel=True
                )
                result = await _settle(result)
        # Past its timeout, whatever the hook returned is too late: one that shielded itself
        # from the cancellation, or caught it and returned, does not outlast its timeout.
        if scope.cancel_called or anyio.current_time() >= scope.deadline:
            return TIMED_OUT
        return result

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> tuple[Any]:
        """`fn(*args)`, boxed, in a worker thread that a cancellation of the caller waits for.

        With `threads` set, the thread's scope is kept there while it runs: cancelling that
        scope (a session's drain timeout) abandons the thread, as a hook's own timeout does,
        and the caller's cancellation, which comes with it, is raised.
        """
        if self.threads is None:
            return await anyio.to_thread.run_sync(_boxed, fn, *args)
        # A caller cancelled before its thread starts (a hook whose task first ran after the
        # drain timeout had abandoned the threads it found) starts none: the shield below
        # would hold off that cancellation, and the session would wait for the thread.
        await anyio.lowlevel.checkpoint_if_cancelled()
        with anyio.CancelScope(shield=True) as scope:
            self.threads.add(scope)
            try:
                return await anyio.to_thread.run_sync(_boxed, fn, *args, abandon_on_cancel=True)
            finally:
                self.threads.discard(scope)
        await anyio.lowlevel.checkpoint()  # the caller's cancellation, which came with it
        raise RuntimeError("a worker thread was abandoned while its caller was not cancelled")

    async def timed(
        self,
        step: Step,
        *args: Any,
        records: list[HookRecord] | None = None,
        threaded: bool = False,
        failed: Failed | None = None,
    ) -> tuple[object, float] | None:
        """Emit `HookStarted`, call the hook, and time it: what it returned and how long it took.

        The one way a hook is run (the drive's inlined hot path aside). None when it raised:
        the failure is recorded by `failed` (`fail` by default: raised when enforced).
        """
        if self.emit is not None:
            self.emit(hook_started(self.turn_ref, step.name, step.stage))
        started = self.now()
        try:
            if step.direct:
                result = await step.hook.fn(*args)
            else:
                result = await self.call(step, *args, threaded=threaded)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not spurious_cancellation(exc):
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    self.interrupted(step, exc, self.now() - started, records)
                raise
            error = raised_by(step, exc)
            (self.fail if failed is None else failed)(step, error, self.now() - started, records)
            return None
        if result is TIMED_OUT:
            timeout = step.hook.timeout
            assert timeout is not None
            error = HookTimeout(
                f"hook {step.label} did not finish within its timeout of {timeout} s",
                hook=step.name,
                stage=step.stage,
                timeout=timeout,
            )
            (self.fail if failed is None else failed)(step, error, self.now() - started, records)
            return None
        return result, self.now() - started

    def passes(
        self,
        step: Step,
        turn: Turn,
        records: list[HookRecord] | None = None,
        *,
        enforceable: bool = True,
    ) -> bool:
        """Evaluate a hook's ``when`` predicate; a false one records the skip."""
        assert step.hook.when is not None
        verdict = self.predicate(
            step, "when=", step.hook.when, turn, records, enforceable=enforceable
        )
        if verdict is False:
            (self.records if records is None else records).append(
                HookRecord(step.name, step.stage, step.position, 0.0, "skipped")
            )
            if self.emit is not None:
                self.emit(ev.HookSkipped(self.turn_ref, step.name, step.stage))
        return verdict is True

    def predicate(
        self,
        step: Step,
        option: str,
        check: Callable[[Any], object],
        value: object,
        records: list[HookRecord] | None = None,
        *,
        enforceable: bool = True,
    ) -> bool | None:
        """Evaluate one of a hook's predicates (``when=``, ``match=``) on `value`.

        None when it failed: a raising predicate is the hook's failure, and one returning
        anything but a bool a `HookReturnError`; either is recorded (and raised, when
        enforced) like a failure of the hook itself, `enforceable` as for `fail`.
        """
        error: HookError
        try:
            verdict = check(value)
        except Exception as exc:
            # Whatever it raised, a HookError of a pipeline it ran included, is its failure.
            error = HookFailed(
                f"the {option} predicate of hook {step.label} raised {exc_text(exc)}",
                hook=step.name,
                stage=step.stage,
            )
            error.__cause__ = exc
        else:
            if type(verdict) is bool:
                return verdict
            hint = ""
            if inspect.iscoroutine(verdict):
                verdict.close()  # never awaited: it would warn again when collected
                hint = (
                    f" — {option} is called without await: make it a plain predicate and do"
                    " the async work in the hook itself"
                )
            error = HookReturnError(
                f"the {option} predicate of hook {step.label} must return True or False,"
                f" got {describe(verdict)}{hint}",
                hook=step.name,
                stage=step.stage,
            )
        if self.emit is not None:
            # The failure closes a HookStarted, like every hook failure.
            self.emit(hook_started(self.turn_ref, step.name, step.stage))
        self.fail(step, error, 0.0, records, enforceable=enforceable)
        return None

    # -- judging ------------------------------------------------------------------------------

    def halt_of(self, step: Step, result: Halt) -> Halt:
        """A hook's halt, checked and stamped with the hook's name."""
        reason: object = result.reason  # a Halt built by hand may hold anything
        if not isinstance(reason, str):
            raise HookReturnError(
                f"hook {step.label} returned a Halt whose reason is {type(reason).__name__}"
                f' {reason!r:.60}, not text — halt("why") (the reason goes to the result,'
                " the events and the audit record)",
                hook=step.name,
                stage=step.stage,
            )
        try:
            check_halt_reply(result.reply)
        except (TypeError, ValueError) as exc:
            raise HookReturnError(
                f"hook {step.label} returned a Halt with an invalid reply: {exc}",
                hook=step.name,
                stage=step.stage,
            ) from None
        return attrs.evolve(result, hook=step.name)

    def wrong_return(
        self, step: Step, result: object, expected: str, *, group: bool
    ) -> HookReturnError:
        """The error for a hook that returned something its stage does not allow.

        A coroutine it returned (an ``await`` forgotten) is closed: it will never be awaited,
        and would otherwise add a "never awaited" RuntimeWarning to the error.
        """
        if inspect.iscoroutine(result):
            result.close()
        return HookReturnError(
            f"expected hook {step.label} to return {expected}, got {describe(result)}"
            f"{wrong_return_hint(result, group=group, stage=step.stage)}",
            hook=step.name,
            stage=step.stage,
        )

    # -- recording ----------------------------------------------------------------------------

    def finished(
        self,
        step: Step,
        elapsed: float,
        verdict: str,
        detail: str | None = None,
        records: list[HookRecord] | None = None,
    ) -> None:
        """Record a hook that returned (or was cancelled) and close its HookStarted."""
        # new_record skips the named tuple's Python-level __new__: this runs once per hook.
        (self.records if records is None else records).append(
            new_record(
                HookRecord, (step.name, step.stage, step.position, elapsed, verdict, False, detail)
            )
        )
        if self.emit is not None:
            self.emit(hook_finished(self.turn_ref, step.name, step.stage, elapsed, verdict))

    def shadow_verdict(
        self,
        step: Step,
        elapsed: float,
        verdict: str,
        outcome: object,
        records: list[HookRecord] | None = None,
    ) -> None:
        """Record what a shadow hook decided; nothing of it is enforced."""
        reason = _reason(outcome)
        if verdict in _REFUSALS:
            log.warning(
                "shadow hook %r (%s) would have refused (%s): %s — not enforced",
                step.name,
                step.stage,
                verdict,
                reason,
            )
        (self.records if records is None else records).append(
            HookRecord(step.name, step.stage, step.position, elapsed, verdict, True, reason)
        )
        if self.emit is not None:
            self.emit(hook_finished(self.turn_ref, step.name, step.stage, elapsed, verdict))
            self.emit(ev.ShadowVerdict(self.turn_ref, step.name, step.stage, verdict, reason))

    def fail(
        self,
        step: Step,
        exc: Exception,
        elapsed: float,
        records: list[HookRecord] | None = None,
        *,
        enforceable: bool = True,
    ) -> None:
        """Record a hook's failure; raise it unless the hook fails open or is a shadow.

        `enforceable` is False where nothing the hook says is kept (an after-tool hook of a
        cancelled call): its failure is recorded, and stops nothing.
        """
        hook = step.hook
        if isinstance(exc, HookError):
            error: HookError = exc
        else:
            error = HookFailed(
                f"hook {step.label} raised {exc_text(exc)}", hook=step.name, stage=step.stage
            )
            error.__cause__ = exc
        enforced = (
            enforceable
            and not hook.shadow
            and (hook.on_error == "halt" or type(error) is HookReturnError)
        )
        detail = failure_detail(error)
        self._record_failed(step, elapsed, detail, enforced, records)
        if enforced:
            raise error
        if not enforceable:
            log.warning(
                "hook %r (%s) failed on a cancelled tool call; nothing it returns is kept: %s",
                step.name,
                step.stage,
                detail,
            )
            return
        log.warning(
            "%s hook %r (%s) failed and was not enforced; the turn goes on without it (nothing"
            " it would have injected was added): %s",
            "shadow" if hook.shadow else "fail-open (on_error='skip')",
            step.name,
            step.stage,
            detail,
        )

    def interrupted(
        self,
        step: Step,
        exc: BaseException,
        elapsed: float,
        records: list[HookRecord] | None = None,
    ) -> None:
        """Record a hook that raised a KeyboardInterrupt or SystemExit and close its
        HookStarted; the caller raises the interrupt on.

        Its `HookFailed` is always enforced: an interrupt stops the turn (or the run or
        session around a background hook) whatever the hook's ``on_error``, and is raised to
        the caller. Nothing here awaits: the interrupt is not held back.
        """
        try:
            detail = exc_text(exc)
        except Exception:
            # Its str() failed (a SystemExit of an object whose __str__ raises): that error
            # must not replace the interrupt on its way to the caller.
            detail = type(exc).__name__
        self._record_failed(step, elapsed, detail, True, records)

    def _record_failed(
        self,
        step: Step,
        elapsed: float,
        detail: str,
        enforced: bool,
        records: list[HookRecord] | None,
    ) -> None:
        """Record `step`'s failure and close its HookStarted with a `HookFailed`."""
        (self.records if records is None else records).append(
            HookRecord(
                step.name, step.stage, step.position, elapsed, "failed", step.hook.shadow, detail
            )
        )
        if self.emit is not None:
            self.emit(ev.HookFailed(self.turn_ref, step.name, step.stage, detail, enforced))

    # -- injections ---------------------------------------------------------------------------

    def stamp(
        self, step: Step, before: Turn, after: Turn, made: tuple[str, bool, Stage] | None = None
    ) -> Turn:
        """Stamp the injections `step` added with its name, durability and the stage.

        An injection that was not on the turn before the hook ran is stamped with this hook,
        whatever source it claims: provenance cannot be forged. An injection the hook left in
        place (the same one, or an equal one at the same position) is kept as it was; one it
        rewrote in place (same position, same source) keeps its stamp.

        `made` is the stamp the runner's `Stamper` was set to while this hook ran. When the
        hook only called `Turn.inject` (the stamper says so in constant time), its injections
        were stamped as they were made and the turn is kept as it is: an injecting hook costs
        O(1) here, whatever the number of injections before it. Otherwise the hook appended
        injections and left the earlier ones alone — one comparison of the earlier ones (in
        C, by identity first) and work for the new ones only — or changed or removed earlier
        ones, and every injection is looked at.
        """
        stage: Stage = "post" if step.stage == "post" else "pre"
        plan = self.plan
        if made is not None and self.stamper.added(made, before, after):
            if stage == "pre":
                if plan.budget is not None or self.emit is not None or plan.tokenizer is not None:
                    self.charge(step, after.injections[len(before.injections) :])
            elif self.emit is not None:
                self.announce(step, after.injections[len(before.injections) :])
            return after
        old = before.injections
        new = after.injections
        count = len(old)
        fresh: list[Injection]
        if len(new) >= count and new[:count] == old:
            known = self.known_ids(old)
            durable = step.hook.durable
            fresh = []
            for added in new[count:]:
                if id(added) not in known:
                    _check_injection(step, added)
                    fresh.append(Injection(added.parts, step.name, durable, stage))
            if len(fresh) == len(new) - count:
                stamped = old + tuple(fresh)
            else:  # the hook appended an injection the turn already had: it stays as it is
                iterator = iter(fresh)
                stamped = old + tuple(
                    added if id(added) in known else next(iterator) for added in new[count:]
                )
            gone: list[Injection] = []
            known.update(map(id, fresh))
            self.known_of = stamped
        else:
            stamped, fresh, gone = self.restamp(step, old, new, stage, made)
            self.known = None
        for injection in fresh:
            # `Turn.inject` checks this; an injection built by hand is checked here.
            problem = exchange_problem(injection.parts)
            if problem is not None:
                raise HookReturnError(
                    f"hook {step.label} added an injection with unpaired tool parts: {problem}",
                    hook=step.name,
                    stage=step.stage,
                )
        if stage == "pre":
            if plan.budget is not None or self.emit is not None or plan.tokenizer is not None:
                self.charge(step, fresh, gone)
        elif self.emit is not None:
            # Post-stage content is never sent to the model: no budget, only the events.
            self.announce(step, fresh)
        return attrs.evolve(after, injections=stamped)

    def known_ids(self, injections: tuple[Injection, ...]) -> set[int]:
        """The identities of `injections`, the turn's injections before a hook ran.

        Kept from one hook to the next while the turn's injections only grow: each hook's
        new injections are added to the set instead of building it again. (A hook whose
        injections the stamper vouched for does not touch it: the next hook that needs it
        builds it again.)
        """
        if injections is self.known_of and self.known is not None:
            return self.known
        known = {id(injection) for injection in injections}
        self.known_of, self.known = injections, known
        return known

    def restamp(
        self,
        step: Step,
        old: tuple[Injection, ...],
        new: tuple[Injection, ...],
        stage: Stage,
        made: tuple[str, bool, Stage] | None = None,
    ) -> tuple[tuple[Injection, ...], list[Injection], list[Injection]]:
        """Stamp a hook's injections when it changed or removed earlier ones.

        The stamped injections, the new ones among them, and the earlier ones now gone. An
        injection carrying the hook's own stamp (`made`: `Turn.inject` stamped it while the
        hook ran) is the hook's new injection, never a rewrite of an earlier one, even when
        an earlier hook of the same name left one at the same position.
        """
        known = {id(injection) for injection in old}
        fresh: list[Injection] = []
        stamped: list[Injection] = []
        for index, added in enumerate(new):
            if id(added) in known:
                stamped.append(added)
                continue
            _check_injection(step, added)
            own = made is not None and (added.source, added.durable, added.stage) == made
            origin = None if own or index >= len(old) else old[index]
            if origin is not None and added == origin:
                stamped.append(origin)
                continue
            if origin is not None and added.source is not None and added.source == origin.source:
                added = Injection(added.parts, added.source, origin.durable, origin.stage)
            else:
                added = Injection(added.parts, step.name, step.hook.durable, stage)
            fresh.append(added)
            stamped.append(added)
        kept = {id(injection) for injection in stamped}
        gone = [injection for injection in old if id(injection) not in kept]
        return tuple(stamped), fresh, gone

    def charge(
        self, step: Step, fresh: Sequence[Injection], gone: Sequence[Injection] = ()
    ) -> None:
        """Count a hook's new injections against the budget, then announce them."""
        plan = self.plan
        # A custom tokenizer counts whether or not anyone listens, so that one failing on
        # some text fails run() and stream() alike.
        if plan.budget is None and self.emit is None and plan.tokenizer is None:
            return
        sizes = [parts_tokens(injection.parts, plan.count) for injection in fresh]
        tokens = sum(sizes)
        self.injected_tokens += tokens - sum(self.sizes.pop(id(i), 0) for i in gone)
        self.sizes.update(zip(map(id, fresh), sizes, strict=True))
        if plan.budget is not None and self.injected_tokens > plan.budget.injection_reserve:
            reserve = plan.budget.injection_reserve
            raise InjectionOverflow(
                f"hook {step.label} injected {tokens} tokens, bringing the turn's injections"
                f" to {self.injected_tokens} tokens, over the reserve of {reserve}: shrink what"
                " it injects or raise Budget.injection_reserve",
                hook=step.name,
                tokens=tokens,
                total=self.injected_tokens,
                reserve=reserve,
            )
        if self.emit is not None:
            self.announce(step, fresh, sizes)

    def announce(
        self, step: Step, fresh: Sequence[Injection], sizes: Sequence[int] | None = None
    ) -> None:
        """Emit one `Injected` event per injection `step` added."""
        assert self.emit is not None
        if sizes is None:
            sizes = [parts_tokens(injection.parts, self.plan.count) for injection in fresh]
        for injection, size in zip(fresh, sizes, strict=True):
            self.emit(
                ev.Injected(
                    self.turn_ref,
                    step.name,
                    injection.parts,
                    injection.durable,
                    size,
                    injection.stage or "pre",
                )
            )

    def added(self, turn: Turn, parts: Sequence[tuple[Step, tuple[Part, ...]]]) -> Turn:
        """`turn` with each step's parts injected, stamped and charged, in order."""
        injections = [
            Injection(member_parts, member.name, member.hook.durable, "pre")
            for member, member_parts in parts
        ]
        plan = self.plan
        if plan.budget is not None or self.emit is not None or plan.tokenizer is not None:
            for (member, _), injection in zip(parts, injections, strict=True):
                self.charge(member, (injection,))
        return attrs.evolve(turn, injections=turn.injections + tuple(injections))


TIMED_OUT: Any = object()
"""What `Runner.call` returns for a hook that ran past its timeout, so that an exception out
of the call is always the hook's own (a `HookTimeout` it raised included)."""


def raised_by(step: Step, exc: BaseException) -> Exception:
    """What an exception a hook's own code raised is recorded and raised as.

    A `HookError` out of a hook is not a verdict of this pipeline on it: a pipeline the
    hook ran, or a hook it called, raised it about a hook of its own. It is this hook's
    failure (`HookFailed` naming it, subject to its ``on_error``), the original as the
    cause; so is a `CancelledError` it raised itself (`spurious_cancellation`). Any other
    exception is left to `Runner.fail`, which wraps it alike (a `StopIteration` the hook
    raised as itself, not as the RuntimeError a coroutine made of it: `as_raised`).
    """
    if not isinstance(exc, Exception):
        return cancelled_itself(step, exc)
    if not isinstance(exc, HookError):
        # A sync hook's StopIteration came out of `call` as "RuntimeError: coroutine raised
        # StopIteration", blaming a coroutine the hook never had: named as it was raised.
        return as_raised(exc)
    error = HookFailed(
        f"hook {step.label} raised {exc_text(exc)}", hook=step.name, stage=step.stage
    )
    error.__cause__ = exc
    return error


def failure_detail(error: Exception) -> str:
    """A hook's failure as its `HookFailed` event and audit record give it: what the hook
    raised (``Type: message``), or, for a `CancelledError` it raised itself, the sentence
    saying so (`cancelled_itself`), which the bare exception would not: every stage words it
    alike, whether the failure is raised, recorded or both."""
    cause = error.__cause__ if type(error) is HookFailed else None
    if cause is None or not isinstance(cause, Exception):
        return exc_text(error)
    return exc_text(cause)


def cancelled_itself(step: Step, exc: BaseException) -> HookFailed:
    """The failure of a hook that raised a `CancelledError` of its own while nothing
    cancelled the turn (`spurious_cancellation`): its failure, subject to its ``on_error``."""
    what = "session" if step.stage in ("session_start", "session_end") else "turn"
    error = HookFailed(
        f"hook {step.label} raised {exc_text(exc)} itself (the {what} was not cancelled)",
        hook=step.name,
        stage=step.stage,
    )
    error.__cause__ = exc
    return error


def _check_injection(step: Step, injection: object) -> None:
    """An injection a hook put on the turn itself (not through `Turn.inject`) is one."""
    if type(injection) is not Injection:
        raise HookReturnError(
            f"hook {step.label} put {describe(injection)} among turn.injections, not an"
            " Injection — add content with turn.inject(...)",
            hook=step.name,
            stage=step.stage,
        )


def _reason(signal: object) -> str | None:
    """The text a refusing signal carries: a halt's reason, a rejection's feedback, ..."""
    if type(signal) is Halt or type(signal) is Block:
        return signal.reason
    if type(signal) is Regenerate:
        return signal.feedback
    if type(signal) is Ask:
        return signal.question
    return None


def malformed(step: Step, what: str) -> HookReturnError:
    """The error for a hook that returned `what` (a malformed part, unpaired tool parts)."""
    return HookReturnError(f"hook {step.label} returned {what}", hook=step.name, stage=step.stage)


def _boxed(fn: Callable[..., Any], *args: Any) -> tuple[Any]:
    """`fn`'s result in a tuple, so that a worker thread may hand back a coroutine.

    trio refuses a thread's coroutine result (it takes the function for an async one that
    looked sync); asyncio passes it on. Boxed, both pass it to `_settle`, which awaits it.
    """
    return (fn(*args),)


async def _settle(result: Any) -> Any:
    # A function that looked sync but returned an awaitable (a decorated coroutine function,
    # a lambda around one) is awaited rather than reported as a wrong return.
    if type(result) is Cont or type(result) is Halt or not inspect.isawaitable(result):
        return result
    return await result


def check_history(step: Step, messages: object) -> tuple[Message, ...]:
    """`messages` as a history tuple, or a HookReturnError naming `step`."""
    if (
        isinstance(messages, str | bytes)
        or not isinstance(messages, Sequence)
        or not all(type(message) is Message for message in messages)
    ):
        hint = ""
        if inspect.iscoroutine(messages):
            messages.close()  # an await forgotten: closed, not left to warn "never awaited"
            hint = wrong_return_hint(messages, group=False)
        raise HookReturnError(
            f"expected {step.label} to return the history as a sequence of Message, got"
            f" {describe(messages)}{hint}",
            hook=step.name,
            stage=step.stage,
        )
    return tuple(messages)


def check_exchange(
    step: Step, given: tuple[Message, ...], last: Message, messages: tuple[Message, ...]
) -> None:
    """Raise `HookReturnError` for a history view `step` made (``compact=``, a pre hook
    replacing the history) that parts a tool call from its result.

    Every provider refuses a tool result that answers no call right before it, and a call
    whose result does not follow: sent, the turn would fail as the provider's 400, naming no
    hook. Only calls the view broke are its fault: one already broken in `given`, the history
    the turn began with (a log cut to its last messages starts with a result whose call is
    gone), is sent as it is, and does not hide another the view breaks. `last` is the turn's
    own message, which the view cannot drop.
    """
    if messages is given:
        # The history as the turn began: whatever is broken in it is its own.
        return
    broken = broken_calls(messages, last)
    if broken:
        for call_id in broken_calls(given, last):
            broken.pop(call_id, None)
    if not broken:
        return
    call_id, (kind, index) = next(iter(broken.items()))
    fix = (
        "keep or drop an assistant message with tool calls together with the tool messages"
        " that answer them"
    )
    if kind == "call":
        calls = [other for other, where in broken.items() if where == (kind, index)]
        problem = f"the tool calls {calls} of the assistant message at index {index} get no result"
    else:
        turns = index == len(messages)
        holder = "the turn's own" if turns else f"the {messages[index].role}"
        at = "" if turns else f" at index {index}"
        problem = (
            f"{holder} message{at} holds a result for call {call_id!r}, which no assistant"
            " message right before it made"
        )
        if turns:
            # The turn's own message cannot be dropped with it: the call must stay.
            fix = (
                "keep the last assistant message with its tool calls, which the turn's own"
                " message answers"
            )
    who = step.label if step.stage == "compact" else f"hook {step.label}"
    raise HookReturnError(
        f"{who} returned a history in which {problem}: no provider accepts it — {fix}",
        hook=step.name,
        stage=step.stage,
    )


def broken_calls(messages: Sequence[Message], last: Message) -> dict[str, tuple[str, int]]:
    """The tool calls `messages` (then `last`, the turn's own message) do not pair with their
    results, in the order met: each id with ``("result", index)`` for a result at `index`
    that no assistant message right before it asked for, or ``("call", index)`` for a call
    of the assistant message at `index` whose result does not follow.

    The results that answer an assistant message's calls are in the tool messages right
    after it, or in a user message there: both adapters send a user message's results as
    the provider wants them (Anthropic's API carries results in a user message), so a
    history in that shape pairs up too. A user message with more than results ends the
    exchange.
    """
    broken: dict[str, tuple[str, int]] = {}
    waiting: dict[str, int] = {}  # the calls of the last assistant message not answered yet
    for index, message in enumerate((*messages, last)):
        role = message.role
        if role == "tool" or role == "user":
            only_results = True
            for part in message.parts:
                if type(part) is ToolResult:
                    if waiting.pop(part.call_id, None) is None:
                        broken.setdefault(part.call_id, ("result", index))
                else:
                    only_results = False
            if role == "tool" or (only_results and message.parts):
                continue
        for call_id, asked in waiting.items():
            broken.setdefault(call_id, ("call", asked))
        waiting = (
            {part.id: index for part in message.parts if type(part) is ToolCall}
            if role == "assistant"
            else {}
        )
    for call_id, asked in waiting.items():
        broken.setdefault(call_id, ("call", asked))
    return broken
