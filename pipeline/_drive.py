"""The drive loop: one turn through the stages, in order, always.

`Pipeline.run` and `Pipeline.stream` both run a `Drive`; the only difference is `emit`, which
is None when nobody listens, so that `run` builds no event at all.
"""

import inspect
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import trio

from turns import (
    Injection,
    Message,
    Part,
    Reply,
    Stage,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    Usage,
    render,
)

from . import events as ev
from ._audit import AttemptRecord, AuditRecord, HookRecord
from ._budget import message_tokens, parts_tokens
from ._errors import (
    ContextOverflow,
    HookError,
    HookFailed,
    HookReturnError,
    HookTimeout,
    InjectionOverflow,
    PipelineError,
    ProviderError,
    ProviderProtocolError,
    RequestError,
)
from ._hooks import Hook
from ._model import ModelFinish, ModelRequest, ModelText, ModelToolCall
from ._plan import Group, Step
from ._result import TurnResult
from ._signals import Ask, Block, Cont, Halt, Regenerate

if TYPE_CHECKING:
    from ._pipeline import Pipeline

Emit: TypeAlias = Callable[[ev.Event], None]

_PART_TYPES = (Text, ToolCall, ToolResult)
_new = tuple.__new__
_CHOICE_KEYWORDS = frozenset(("auto", "none", "required"))


class _Member:
    """A parallel group member's run: what it decided, or how it failed, and its records."""

    __slots__ = ("failure", "outcome", "records", "step")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.records: list[HookRecord] = []
        self.outcome: tuple[Part, ...] | Halt | None = None
        self.failure: HookError | None = None


class Drive:
    """One turn's run through a pipeline."""

    __slots__ = ("attempts", "emit", "injected_tokens", "now", "pipe", "records", "turn_ref")

    def __init__(self, pipe: "Pipeline", emit: Emit | None) -> None:
        self.pipe = pipe
        self.emit = emit
        self.records: list[HookRecord] = []
        self.attempts: list[AttemptRecord] = []
        self.injected_tokens = 0
        self.turn_ref = ""
        self.now: Callable[[], float] = trio.current_time

    async def run(self, turn: Turn) -> TurnResult:
        """Drive `turn` through every stage and return its result."""
        self.turn_ref = turn.turn_ref
        # The run's clock, read directly: trio's clock (so a MockClock drives hook timings in
        # tests) without self.now()'s lookups on every hook.
        self.now = trio.lowlevel.current_clock().current_time
        if self.emit is not None:
            self.emit(ev.TurnStarted(turn.turn_ref))
        turn = await self.prepare(turn)
        turn, stop = await self.pre_stage(turn)
        if stop is not None:
            return self.halted(turn, stop)
        reply = await self.call_model(turn, attempt=1)
        return self.finish("completed", attrs.evolve(turn, reply=reply), reply, None)

    # -- stage 0: the turn as the pipeline sees it -------------------------------------------

    async def prepare(self, turn: Turn) -> Turn:
        """Fill the context from the pipeline's defaults and compact the history."""
        pipe = self.pipe
        if pipe.system is not None and turn.context.system is None:
            turn = attrs.evolve(turn, context=attrs.evolve(turn.context, system=pipe.system))
        if pipe.compact_hook is not None:
            turn = await self.compact(turn, pipe.compact_hook)
        return turn

    async def compact(self, turn: Turn, compact: Hook) -> Turn:
        pipe = self.pipe
        assert pipe.budget is not None
        step = Step(compact, compact.name, "compact", "1")
        try:
            messages = await self.call(
                step, turn.context.messages, pipe.budget.history_target, pipe.count
            )
        except Exception as exc:
            self.fail(step, exc, 0.0)
            return turn
        if (
            isinstance(messages, str | bytes)
            or not isinstance(messages, Sequence)
            or not all(type(message) is Message for message in messages)
        ):
            raise HookReturnError(
                f"expected compact {step.name!r} to return the history as a sequence of"
                f" Message, got {_describe(messages)}",
                hook=step.name,
                stage="compact",
            )
        return attrs.evolve(turn, context=attrs.evolve(turn.context, messages=tuple(messages)))

    # -- stages 1-3: pre hooks, parallel groups, the injection budget ------------------------

    async def pre_stage(self, turn: Turn) -> tuple[Turn, Halt | None]:
        now = self.now
        for step in self.pipe.pre_plan:
            if type(step) is Group:
                outcome = await self.run_group(step, turn)
            else:
                assert type(step) is Step
                hook = step.hook
                if hook.when is not None and not self.passes(step, turn):
                    continue
                if self.emit is not None:
                    self.emit(ev.HookStarted(self.turn_ref, step.name, step.stage))
                started = now()
                try:
                    if step.direct:
                        result = await hook.fn(turn)
                    else:
                        result = await self.call(step, turn)
                except Exception as exc:
                    self.fail(step, exc, now() - started)
                    continue
                outcome = self.settle(step, turn, result, now() - started)
            if type(outcome) is Halt:
                return turn, outcome
            turn = outcome
        return turn, None

    def settle(self, step: Step, turn: Turn, result: object, elapsed: float) -> Turn | Halt:
        """Check an ordered hook's signal, record it, and give the turn that goes on."""
        outcome: Turn | Halt
        if type(result) is Cont and type(result.value) is Turn:
            verdict, outcome = "cont", result.value
        elif type(result) is Halt:
            verdict, outcome = "halt", attrs.evolve(result, hook=step.name)
        else:
            error = self.wrong_return(step, result, "Cont(turn) or Halt", group=False)
            self.fail(step, error, elapsed)
            return turn
        if step.hook.shadow:
            self.shadow_verdict(step, elapsed, verdict, outcome)
            return turn
        # tuple.__new__ skips the named tuple's Python-level __new__: this runs once per hook.
        detail = outcome.reason if type(outcome) is Halt else None
        self.records.append(
            _new(
                HookRecord, (step.name, step.stage, step.position, elapsed, verdict, False, detail)
            )
        )
        if self.emit is not None:
            self.emit(ev.HookFinished(self.turn_ref, step.name, step.stage, elapsed, verdict))
        if isinstance(outcome, Halt):
            return outcome
        if outcome.injections is not turn.injections:
            outcome = self.stamp(step, turn, outcome)
        return outcome

    async def run_group(self, group: Group, turn: Turn) -> Turn | Halt:
        members = [_Member(step) for step in group.members]
        running = [m for m in members if m.step.hook.when is None or self.passes(m.step, turn)]
        async with trio.open_nursery() as nursery:
            for member in running:
                nursery.start_soon(self.run_member, member, turn, nursery.cancel_scope)
        return self.merge(group, turn, members)

    async def run_member(self, member: _Member, turn: Turn, group: trio.CancelScope) -> None:
        """Run one group member; its outcome is left on `member`, never raised here."""
        step = member.step
        if self.emit is not None:
            self.emit(ev.HookStarted(self.turn_ref, step.name, step.stage))
        started = self.now()
        try:
            result = await self.call(step, turn, threaded=True)
        except trio.Cancelled:
            elapsed = self.now() - started
            member.records.append(
                HookRecord(step.name, step.stage, step.position, elapsed, "cancelled")
            )
            raise
        except Exception as exc:
            self.settle_member_failure(member, group, exc, self.now() - started)
            return
        elapsed = self.now() - started
        outcome: tuple[Part, ...] | Halt
        if type(result) is Halt:
            verdict, outcome = "halt", attrs.evolve(result, hook=step.name)
        elif (type(result) is list or type(result) is tuple) and all(
            type(part) in _PART_TYPES for part in result
        ):
            verdict, outcome = "parts", tuple(result)
        else:
            error = self.wrong_return(step, result, "a list of parts or Halt", group=True)
            self.settle_member_failure(member, group, error, elapsed)
            return
        if step.hook.shadow:
            self.shadow_verdict(step, elapsed, verdict, outcome, member.records)
            return
        if self.emit is not None:
            self.emit(ev.HookFinished(self.turn_ref, step.name, step.stage, elapsed, verdict))
        detail = outcome.reason if type(outcome) is Halt else None
        member.records.append(
            HookRecord(step.name, step.stage, step.position, elapsed, verdict, False, detail)
        )
        member.outcome = outcome
        if type(outcome) is Halt:
            group.cancel()

    def settle_member_failure(
        self, member: _Member, group: trio.CancelScope, exc: Exception, elapsed: float
    ) -> None:
        try:
            self.fail(member.step, exc, elapsed, member.records)
        except HookError as error:
            member.failure = error
            group.cancel()

    def merge(self, group: Group, turn: Turn, members: list[_Member]) -> Turn | Halt:
        """Combine a group's outcomes in declaration order, never completion order."""
        for member in members:
            self.records.extend(member.records)
        failures = [member.failure for member in members if member.failure is not None]
        if failures:
            first = failures[0]
            for other in failures[1:]:
                first.add_note(f"{group.name!r} also failed: {other}")
            raise first
        halts = [member.outcome for member in members if type(member.outcome) is Halt]
        if halts:
            return halts[0]
        added = [
            self.charge(member.step, (self.injection(member.step, member.outcome, "pre"),))[0]
            for member in members
            if type(member.outcome) is tuple and member.outcome
        ]
        if not added:
            return turn
        return attrs.evolve(turn, injections=(*turn.injections, *added))

    def stamp(self, step: Step, before: Turn, after: Turn) -> Turn:
        """Stamp the injections `step` added with its name, durability and the stage.

        Every injection that was not on the turn before the hook ran is stamped, whatever
        source the hook wrote into it: provenance cannot be forged.
        """
        known = {id(injection) for injection in before.injections}
        fresh = [
            self.injection(step, injection.parts, "pre")
            for injection in after.injections
            if id(injection) not in known
        ]
        if not fresh:
            return after
        self.charge(step, fresh)
        replacements = iter(fresh)
        stamped = tuple(
            injection if id(injection) in known else next(replacements)
            for injection in after.injections
        )
        return attrs.evolve(after, injections=stamped)

    def injection(self, step: Step, parts: tuple[Part, ...], stage: Stage) -> Injection:
        return Injection(parts, step.name, step.hook.durable, stage)

    def charge(self, step: Step, injections: Sequence[Injection]) -> Sequence[Injection]:
        """Count a hook's new injections against the budget, then announce them."""
        pipe = self.pipe
        if pipe.budget is None and self.emit is None:
            return injections
        sizes = [parts_tokens(injection.parts, pipe.count) for injection in injections]
        tokens = sum(sizes)
        self.injected_tokens += tokens
        if pipe.budget is not None and self.injected_tokens > pipe.budget.injection_reserve:
            reserve = pipe.budget.injection_reserve
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
            for injection, size in zip(injections, sizes, strict=True):
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
        return injections

    # -- calling hooks ------------------------------------------------------------------------

    async def call(self, step: Step, *args: Any, threaded: bool = False) -> Any:
        """Call a hook's function, applying its timeout; sync functions may run in a thread.

        A sync hook runs inline unless it is a group member (`threaded`) or has a timeout: in a
        worker thread it cannot block its siblings, and a timeout can abandon it.
        """
        hook = step.hook
        if hook.timeout is None:
            if hook.is_async:
                return await hook.fn(*args)
            if threaded:
                return await _settle(
                    await trio.to_thread.run_sync(hook.fn, *args, abandon_on_cancel=True)
                )
            return await _settle(hook.fn(*args))
        with trio.move_on_after(hook.timeout) as scope:
            if hook.is_async:
                return await hook.fn(*args)
            return await _settle(
                await trio.to_thread.run_sync(hook.fn, *args, abandon_on_cancel=True)
            )
        assert scope.cancelled_caught
        raise HookTimeout(
            f"hook {step.label} did not finish within its timeout of {hook.timeout} s",
            hook=step.name,
            stage=step.stage,
            timeout=hook.timeout,
        )

    def passes(self, step: Step, turn: Turn) -> bool:
        """Evaluate a hook's ``when`` predicate; a false one records the skip."""
        assert step.hook.when is not None
        try:
            verdict = step.hook.when(turn)
        except Exception as exc:
            error = HookFailed(
                f"the when= predicate of hook {step.label} raised {_exc_text(exc)}",
                hook=step.name,
                stage=step.stage,
            )
            error.__cause__ = exc
            self.fail(step, error, 0.0)
            return False
        if type(verdict) is not bool:
            raise HookReturnError(
                f"the when= predicate of hook {step.label} must return True or False, got"
                f" {_describe(verdict)}",
                hook=step.name,
                stage=step.stage,
            )
        if not verdict:
            self.records.append(HookRecord(step.name, step.stage, step.position, 0.0, "skipped"))
            if self.emit is not None:
                self.emit(ev.HookSkipped(self.turn_ref, step.name, step.stage))
        return verdict

    def fail(
        self,
        step: Step,
        exc: Exception,
        elapsed: float,
        records: list[HookRecord] | None = None,
    ) -> None:
        """Record a hook's failure; raise it unless the hook fails open or is a shadow."""
        hook = step.hook
        if isinstance(exc, HookError):
            error: HookError = exc
        else:
            error = HookFailed(
                f"hook {step.label} raised {_exc_text(exc)}", hook=step.name, stage=step.stage
            )
            error.__cause__ = exc
        enforced = not hook.shadow and (hook.on_error == "halt" or type(error) is HookReturnError)
        cause = error.__cause__ if type(error) is HookFailed else None
        detail = _exc_text(cause or error)
        (self.records if records is None else records).append(
            HookRecord(step.name, step.stage, step.position, elapsed, "failed", hook.shadow, detail)
        )
        if self.emit is not None:
            self.emit(ev.HookFailed(self.turn_ref, step.name, step.stage, detail, enforced))
        if enforced:
            raise error

    def wrong_return(
        self, step: Step, result: object, expected: str, *, group: bool
    ) -> HookReturnError:
        return HookReturnError(
            f"expected hook {step.label} to return {expected}, got {_describe(result)}"
            f"{_hint(result, group=group)}",
            hook=step.name,
            stage=step.stage,
        )

    def shadow_verdict(
        self,
        step: Step,
        elapsed: float,
        verdict: str,
        outcome: object,
        records: list[HookRecord] | None = None,
    ) -> None:
        reason = outcome.reason if type(outcome) is Halt else None
        (self.records if records is None else records).append(
            HookRecord(step.name, step.stage, step.position, elapsed, verdict, True, reason)
        )
        if self.emit is not None:
            self.emit(ev.ShadowVerdict(self.turn_ref, step.name, step.stage, verdict, reason))

    # -- stage 4: the model call --------------------------------------------------------------

    def request(self, turn: Turn) -> ModelRequest:
        """Render the turn and check the request before any provider sees it."""
        options = turn.request
        tools = turn.context.tools
        if options.active_tools is not None:
            active = frozenset(options.active_tools)
            tools = tuple(spec for spec in tools if spec.name in active)
        choice = options.tool_choice
        if (choice is not None and choice not in _CHOICE_KEYWORDS) or choice == "required":
            names = [spec.name for spec in tools]
            if choice == "required" and not names:
                raise RequestError(
                    "tool_choice='required' but no tool is active this turn: the model could"
                    " not comply — add tools, or drop tool_choice"
                )
            if choice != "required" and choice not in names:
                raise RequestError(
                    f"tool_choice={choice!r} names a tool that is not active this turn; the"
                    f" active tools are {names} — name one of them, or use 'auto', 'none' or"
                    " 'required'"
                )
        messages = render(turn)
        budget = self.pipe.budget
        if budget is not None:
            tokens = message_tokens(messages, self.pipe.count) + _spec_tokens(
                tools, self.pipe.count
            )
            if tokens > budget.context_tokens:
                raise ContextOverflow(
                    f"the rendered request holds {tokens} tokens, over the budget's"
                    f" context_tokens of {budget.context_tokens}: compact the history"
                    " (compact=) or inject less",
                    tokens=tokens,
                    limit=budget.context_tokens,
                )
        return ModelRequest(messages, tools, options)

    async def call_model(self, turn: Turn, attempt: int) -> Reply:
        request = self.request(turn)
        emit = self.emit
        if emit is not None:
            emit(ev.ModelCalled(self.turn_ref, attempt, 1))
        model = self.pipe.model
        chunks: list[str] = []
        calls: list[ToolCall] = []
        finish: ModelFinish | None = None
        try:
            async with model.stream(request) as stream:
                async for event in stream:
                    kind = type(event)
                    if kind is ModelText:
                        text = event.text  # type: ignore[union-attr]
                        chunks.append(text)
                        if emit is not None and text:
                            emit(ev.TextDelta(self.turn_ref, text, attempt))
                    elif kind is ModelToolCall:
                        calls.append(event.call)  # type: ignore[union-attr]
                    elif kind is ModelFinish:
                        finish = event  # type: ignore[assignment]
                    else:
                        raise ProviderProtocolError(
                            f"model {model!r} yielded {_describe(event)}; a model yields"
                            " ModelText, ModelToolCall and ModelFinish",
                            provider=_model_name(model),
                        )
        except PipelineError:
            raise
        except Exception as exc:
            raise ProviderError(
                f"model {model!r} failed: {_exc_text(exc)}", provider=_model_name(model)
            ) from exc
        if finish is None:
            raise ProviderProtocolError(
                f"model {model!r} ended its stream without a ModelFinish: the response is"
                " truncated",
                provider=_model_name(model),
            )
        text = "".join(chunks)
        parts: tuple[Part, ...] = (Text(text), *calls) if text or not calls else tuple(calls)
        message = Message("assistant", parts)
        reply = Reply(message, (message,), attempt, finish.reason, finish.usage)
        self.attempts.append(AttemptRecord(attempt, 1, text, finish.reason, finish.usage))
        if emit is not None:
            emit(ev.ReplyReady(self.turn_ref, reply))
        return reply

    # -- outcomes -----------------------------------------------------------------------------

    def halted(self, turn: Turn, stop: Halt) -> TurnResult:
        assert stop.hook is not None
        if self.emit is not None:
            self.emit(ev.Halted(self.turn_ref, stop.hook, stop.reason))
        reply = None
        if stop.reply is not None:
            message = (
                stop.reply if isinstance(stop.reply, Message) else Message.assistant(stop.reply)
            )
            reply = Reply(message, (message,), 0, "halted", Usage())
        return self.finish("halted", turn, reply, stop)

    def finish(
        self, outcome: ev.Outcome, turn: Turn, reply: Reply | None, stop: Halt | None
    ) -> TurnResult:
        audit = AuditRecord(
            turn.turn_ref,
            outcome,
            turn.injections,
            tuple(self.records),
            tuple(self.attempts),
            stop,
        )
        if self.emit is not None:
            self.emit(ev.TurnFinished(self.turn_ref, outcome))
        return TurnResult(outcome, turn, reply, stop, (), audit)


async def _settle(result: Any) -> Any:
    # A function that looked sync but returned an awaitable (a decorated coroutine function,
    # a lambda around one) is awaited rather than reported as a wrong return.
    if type(result) is Cont or type(result) is Halt or not inspect.isawaitable(result):
        return result
    return await result


def _spec_tokens(tools: tuple[ToolSpec, ...], count: Callable[[str], int]) -> int:
    return sum(
        count(spec.name) + count(spec.description) + count(json.dumps(spec.parameters))
        for spec in tools
    )


def _model_name(model: object) -> str:
    return str(getattr(model, "provider", type(model).__name__))


def _exc_text(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _describe(value: object) -> str:
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}" if not isinstance(value, type) else text


def _hint(result: object, *, group: bool) -> str:
    if group and (result is None or type(result) in (Turn, Cont)):
        return (
            " — parallel members are append-only: return the parts to add, e.g."
            " `return [Text(...)]`, or [] to add nothing"
        )
    if result is None:
        return " — did you forget `return cont(turn)`?"
    if type(result) is Turn:
        return " — wrap it: `return cont(turn)`"
    if type(result) is Cont:
        return " — Cont must carry the Turn: `return cont(turn)`"
    if type(result) is Regenerate:
        return " — regenerate() is for post hooks, which see the reply"
    if type(result) in (Block, Ask):
        return f" — {type(result).__name__.lower()}() is for before_tool hooks"
    if isinstance(result, str) or type(result) in _PART_TYPES or isinstance(result, list):
        if group:
            return " — return a list of parts: `return [Text(...)]`"
        return " — to add content, inject it: `return cont(turn.inject(...))`"
    return ""
