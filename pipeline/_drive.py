"""The drive loop: one turn through the stages, in order, always.

`Pipeline.run` and `Pipeline.stream` both run a `Drive`; the only difference is `emit`,
which is None when nobody listens, so that `run` builds no event at all.
"""

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TypeAlias, final

import attrs

from turns import (
    Context,
    Injection,
    Message,
    Reply,
    RequestOptions,
    Scope,
    Stage,
    Stamper,
    Text,
    ToolCall,
    ToolResult,
    Turn,
    Usage,
)
from turns._parts import exchange_problem

from . import events as ev
from ._audit import AuditRecord, HookRecord, Rejection, new_record
from ._background import run_all_background
from ._budget import estimate_tokens
from ._describe import describe
from ._emit import hook_finished, hook_started
from ._errors import HookReturnError, RequestError
from ._hooks import Hook
from ._loop import clock_reader, current_loop, spurious_cancellation
from ._observe import watch_turn
from ._parallel import run_group
from ._plan import Group, Plan, PreStep, Step
from ._request import build_request
from ._result import TurnResult
from ._runner import RUNNING, Emit, Runner, check_exchange, check_history, raised_by
from ._signals import Cont, Halt, Regenerate
from ._toolloop import answer
from ._tools import CURRENT_TOOLS, Tool


@final
@attrs.frozen
class TurnHost:
    """What a session does for the turns it runs: the drive's one way out to a session.

    A turn run without a session (`Pipeline.run`, `Pipeline.stream`) has no host: nothing is
    committed and background hooks are awaited before the result is returned.
    """

    commit: Callable[[TurnResult], Awaitable[tuple[str, tuple[Message, ...]]]]
    """Append a completed turn to the log: the conversation id and the messages committed."""
    spawn: Callable[[Turn], None]
    """Start a committed turn's background hooks in the session's task group."""


@final
@attrs.frozen
class Accepted:
    """A stage's verdict: every hook let the turn through; `turn` is as they left it."""

    turn: Turn


@final
@attrs.frozen
class Halted:
    """A stage's verdict: a hook halted; `turn` is as the hooks before it left it."""

    turn: Turn
    halt: Halt


@final
@attrs.frozen
class Rejected:
    """A stage's verdict: a post hook sent the model back (``regenerate(feedback)``)."""

    turn: Turn
    hook: str
    feedback: str


Verdict: TypeAlias = Accepted | Halted | Rejected

OpenTools: TypeAlias = Callable[[], AbstractAsyncContextManager[Mapping[str, Tool]]]
"""Opens a turn's tools where they are connected (MCP toolsets) and closes them after it."""


class Drive(Runner):
    """One turn's run through a pipeline."""

    __slots__ = ("caught_up", "host", "open_tools", "watch")

    def __init__(
        self,
        plan: Plan,
        emit: Emit | None,
        host: TurnHost | None = None,
        caught_up: Callable[[], Awaitable[None]] | None = None,
        open_tools: OpenTools | None = None,
        relay: list[Emit] | None = None,
    ) -> None:
        super().__init__(plan, emit)
        self.host = host
        # A streamed session's turn waits for its consumer before committing.
        self.caught_up = caught_up
        # MCP toolsets: the turn's tools come from the servers' connections, which the
        # session or the pipeline running the turn opened (None: the plan's own tools).
        self.open_tools = open_tools
        # Built where the turn is set up, in the caller's context (a tracer's parent span).
        # `relay`: the listener's own way in for stamped events, which it may swap (a
        # streamed turn's `TurnEvents`); used when nothing else watches the turn.
        self.watch = watch_turn(self, emit, relay)
        if self.watch is not None:
            self.emit = self.watch.emit

    def run(self, turn: Turn) -> Awaitable[TurnResult]:
        """Drive `turn` through every stage; what it returns, awaited, is the turn's result.

        Not a coroutine of its own: it starts the turn and hands back the coroutine that
        drives it, which every caller awaits at once. Each checkpoint of the model's stream
        suspends and resumes every frame between the model and the task, once per chunk and
        turn: a frame fewer there is cheaper on every chunk.
        """
        self.turn_ref = turn.turn_ref
        self.now = clock_reader(current_loop("a turn (Pipeline.run, Pipeline.stream, send)"))
        if self.emit is not None:
            self.emit(ev.TurnStarted(turn.turn_ref))
        if self.open_tools is not None:
            return self.drive_with_tools(turn, self.open_tools)
        return self.drive(turn, self.plan.tool_map)

    async def drive_with_tools(self, turn: Turn, open_tools: OpenTools) -> TurnResult:
        """`drive` with the tools of the turn's MCP toolsets open."""
        driven = False
        try:
            async with open_tools() as tools:
                driven = True
                return await self.drive(turn, tools)
        except BaseException as error:
            # A server that could not be started or reached (or a cancellation while it
            # connected) ends the turn before `drive` could: its trace ends here. Once
            # driven, `drive` has ended it.
            if not driven and self.watch is not None:
                self.watch.failed(error)
            raise

    async def drive(self, turn: Turn, tools: Mapping[str, Tool]) -> TurnResult:
        # Hooks that run a pipeline tool themselves (a synthetic tool call) find it here,
        # and so does the tool loop.
        token = CURRENT_TOOLS.set(tools)
        running = RUNNING.set(self)
        try:
            turn = await self.prepare(turn)
            match await self.ordered(self.plan.pre, turn):
                case Accepted(turn=accepted):
                    return await self.respond(accepted)
                case Halted(turn=reached, halt=stop):
                    return self.halted(reached, stop)
                case Rejected():
                    raise AssertionError("a pre hook is never judged as a post hook")
        except BaseException as error:
            if self.watch is not None:
                self.watch.failed(error)
            raise
        finally:
            RUNNING.reset(running)
            CURRENT_TOOLS.reset(token)

    # -- stage 0: the turn as the pipeline sees it -------------------------------------------

    async def prepare(self, turn: Turn) -> Turn:
        """Fill the context from the pipeline's defaults and compact the history."""
        plan = self.plan
        if plan.system is not None and turn.context.system is None:
            turn = attrs.evolve(turn, context=attrs.evolve(turn.context, system=plan.system))
        tools = CURRENT_TOOLS.get()
        if tools:
            turn = _with_tools(turn, tuple(tools.values()))
        self.tools = turn.context.tool_names
        self.given = turn.context.messages
        if plan.compact is not None:
            turn = await self.compact(turn, plan.compact)
        return turn

    async def compact(self, turn: Turn, compact: Hook) -> Turn:
        """Apply ``compact=`` to the history: a per-turn view, recorded like a hook."""
        budget = self.plan.budget
        assert budget is not None
        step = Step(compact, compact.name, "compact", "1")
        count = self.plan.tokenizer or estimate_tokens
        called = await self.timed(step, turn.context.messages, budget.history_target, count)
        if called is None:
            return turn
        result, elapsed = called
        try:
            messages = check_history(step, result)
            check_exchange(step, self.given, turn.user_message, messages)
        except HookReturnError as error:
            self.fail(step, error, elapsed)
            return turn
        self.finished(step, elapsed, "cont")
        self.compacted = messages
        return attrs.evolve(turn, context=attrs.evolve(turn.context, messages=messages))

    # -- stages 1-3: pre hooks, parallel groups, the injection budget ------------------------

    async def ordered(self, steps: tuple[PreStep, ...], turn: Turn) -> Verdict:
        """Run a stage's hooks (and, before the model, parallel groups) in order: its verdict.

        The drive's stage loop: `ordered_step_by_step` with its hottest case inlined. A plain
        step (an enforced async hook without timeout or ``when=``) that continues with the
        turn's request, context, reply, user message and correlation unchanged (and a `Scope`)
        is run, recorded and announced here, without a call per hook; every other step and
        signal goes through `run_step` and `settle`, as in the reference loop. A test runs both
        loops over every verdict and compares their records and events.
        """
        now, emit, records = self.now, self.emit, self.records
        # A watched turn's hook events are stamped from the clock reads that time the hook
        # and posted as they are: no second clock read, no stamping layer per event.
        relay, start = self.relay, self.start
        assert relay is not None or emit is None, "the watch relays from the turn's first event"
        # What a hook injects through `Turn.inject` is stamped as it is made (`stamp`).
        stamper = self.stamper
        with stamper:
            return await self.ordered_with(steps, turn, stamper, now, records, relay, start)

    async def ordered_with(
        self,
        steps: tuple[PreStep, ...],
        turn: Turn,
        stamper: Stamper,
        now: Callable[[], float],
        records: list[HookRecord],
        relay: list[Emit] | None,
        start: float,
    ) -> Verdict:
        """`ordered`'s loop, with the stamper current."""
        plan = self.plan
        # Whether injections are counted or announced: only then is `stamp` needed for a
        # hook whose injections the stamper made.
        counting = relay is not None or plan.budget is not None or plan.tokenizer is not None
        for step in steps:
            if type(step) is Step and step.plain:
                started = now()
                if relay is not None:
                    relay[0](hook_started(self.turn_ref, step.name, step.stage, started - start))
                stamper.stamp = made = step.stamp
                try:
                    result = await step.hook.fn(turn)
                except BaseException as exc:
                    stamper.stamp = None
                    if not isinstance(exc, Exception) and not spurious_cancellation(exc):
                        if isinstance(exc, KeyboardInterrupt | SystemExit):
                            self.interrupted(step, exc, now() - started)
                        raise
                    self.fail(step, raised_by(step, exc), now() - started)
                    continue
                stamper.stamp = None
                ended = now()
                elapsed = ended - started
                if type(result) is Cont:
                    outcome = result.value
                    # The turn came back with its request, context, reply, message and
                    # correlation as they were, and a scope (injections may have changed):
                    # nothing to check.
                    if (
                        type(outcome) is Turn
                        and outcome.request is turn.request
                        and outcome.context is turn.context
                        and outcome.reply is turn.reply
                        and outcome.turn_ref is turn.turn_ref
                        and outcome.user_message is turn.user_message
                        and type(outcome.scope) is Scope
                    ):
                        # finished(), inlined.
                        record = (
                            step.name,
                            step.stage,
                            step.position,
                            elapsed,
                            "cont",
                            False,
                            None,
                        )
                        records.append(new_record(HookRecord, record))
                        if relay is not None:
                            relay[0](
                                hook_finished(
                                    self.turn_ref,
                                    step.name,
                                    step.stage,
                                    elapsed,
                                    "cont",
                                    ended - start,
                                )
                            )
                        if outcome.injections is not turn.injections and (
                            counting or not stamper.added(made, turn, outcome)
                        ):
                            outcome = self.stamp(step, turn, outcome, made)
                        turn = outcome
                        continue
                settled = self.settle(step, turn, result, elapsed, made)
            else:
                settled = await self.run_step(step, turn)
            if type(settled) is Turn:
                turn = settled
            elif type(settled) is Halt:
                return Halted(turn, settled)
            else:
                assert type(settled) is Regenerate
                return Rejected(turn, step.name, settled.feedback)
        return Accepted(turn)

    async def ordered_step_by_step(self, steps: tuple[PreStep, ...], turn: Turn) -> Verdict:
        """The reference stage loop: `ordered` without its inlined hot path."""
        with self.stamper:
            for step in steps:
                match await self.run_step(step, turn):
                    case Turn() as settled:
                        turn = settled
                    case Halt() as stop:
                        return Halted(turn, stop)
                    case Regenerate(feedback=feedback):
                        return Rejected(turn, step.name, feedback)
        return Accepted(turn)

    async def run_step(self, step: PreStep, turn: Turn) -> Turn | Halt | Regenerate:
        """Run one step of a stage: the turn to go on with, a halt, or a post hook's rejection."""
        if type(step) is Group:
            return await run_group(self, step, turn)
        assert type(step) is Step
        if step.hook.when is not None and not self.passes(step, turn):
            return turn
        stamper = self.stamper
        stamper.stamp = step.stamp
        try:
            called = await self.timed(step, turn)
        finally:
            stamper.stamp = None
        if called is None:
            return turn
        return self.settle(step, turn, *called, step.stamp)

    # -- stages 4-7: the model call, the post hooks, the regeneration loop --------------------

    async def respond(self, turn: Turn) -> TurnResult:
        """Ask the model, judge its reply, and ask again within the bound until accepted."""
        plan = self.plan
        emit = self.emit
        held: list[ev.Event] | None = [] if plan.hold_until_accepted and emit is not None else None
        extra: tuple[Message, ...] = ()
        request = build_request(self, turn)
        for attempt in range(1, plan.max_regenerations + 2):
            reply = await answer(self, turn, request, attempt, held)
            if type(reply) is Halt:
                # A tool hook halted the turn: nothing of the attempt is kept.
                return self.halted(turn, reply, attempt)
            match await self.ordered(plan.post, attrs.evolve(turn, reply=reply)):
                case Accepted(turn=accepted):
                    if accepted.reply is not reply:
                        self.judged(accepted.reply)
                        if held:
                            assert accepted.reply is not None
                            held = _as_accepted(held, accepted.reply, attempt)
                    if held:
                        assert emit is not None
                        for event in held:
                            emit(event)
                    return await self.complete(accepted)
                case Halted(turn=reached, halt=stop):
                    # What the post hooks before it did stays in the record; the halted reply
                    # does not stay on the turn.
                    self.judged(reached.reply)
                    return self.halted(attrs.evolve(reached, reply=None), stop, attempt)
                case Rejected(turn=reached, hook=hook, feedback=feedback):
                    text = self.judged(reached.reply)
                    self.rejections.append(Rejection(attempt, hook, feedback, text))
                    if held is not None:
                        held.clear()
                    if emit is not None:
                        emit(ev.AttemptRejected(self.turn_ref, attempt, hook, feedback))
                    # The model sees what it said and why it was rejected; the log never does.
                    note = Message("user", (Text(feedback),), {"feedback_for_attempt": attempt})
                    extra = (*extra, *_shown_again(reply, attempt), note)
                    request = build_request(self, turn, extra)
        return self.finish("exhausted", turn, None, None)

    def judged(self, reply: Reply | None) -> str:
        """The attempt's text as the post hook that decided on it saw it, now in its record.

        The audit is stored next to the committed turn: like the log, it holds what a post
        hook rewrote (a scrub, a disclaimer) as rewritten, never the text the hook replaced.
        A rejected or halted attempt's is the text its rejecting or halting hook judged,
        after the rewrites of the post hooks before it.
        """
        assert reply is not None, "the post stage runs on a turn with its reply"
        record = self.attempts[-1]
        text = reply.text
        if text != record.text:
            self.attempts[-1] = attrs.evolve(record, text=text)
        return text

    def settle(
        self,
        step: Step,
        turn: Turn,
        result: object,
        elapsed: float,
        made: tuple[str, bool, Stage] | None = None,
    ) -> Turn | Halt | Regenerate:
        """Judge what an ordered hook returned, record it, and give what goes on.

        The turn to go on with (the hook's, or `turn` itself when the hook failed open or is
        a shadow), the hook's halt, or, in the post stage, its ``regenerate(feedback)``.
        `made` is the stamp the hook's injections were made with (`Runner.stamp`).
        """
        post = step.stage == "post"
        outcome: Turn | Halt | Regenerate
        try:
            if type(result) is Cont and type(result.value) is Turn:
                verdict, outcome = "cont", result.value
                _check_unchanged(step, turn, outcome, self.given)
                if post and outcome.reply is not turn.reply:
                    outcome = _checked_reply(step, turn, outcome)
            elif type(result) is Halt:
                verdict, outcome = "halt", self.halt_of(step, result)
            elif post and type(result) is Regenerate:
                verdict, outcome = "regenerate", result
                feedback: object = result.feedback  # a Regenerate built by hand
                if not isinstance(feedback, str) or not feedback.strip():
                    said = (
                        "without feedback"
                        if feedback is None or isinstance(feedback, str)
                        else f"with feedback {type(feedback).__name__} {feedback!r:.60}, not text"
                    )
                    raise HookReturnError(
                        f"hook {step.label} returned regenerate() {said}; the"
                        " model needs to know why its reply was rejected",
                        hook=step.name,
                        stage=step.stage,
                    )
            else:
                expected = "Cont(turn), Halt or Regenerate" if post else "Cont(turn) or Halt"
                raise self.wrong_return(step, result, expected, group=False)
        except HookReturnError as error:
            self.fail(step, error, elapsed)
            return turn
        if step.hook.shadow:
            self.shadow_verdict(step, elapsed, verdict, outcome)
            return turn
        if type(outcome) is Halt:
            self.finished(step, elapsed, verdict, outcome.reason)
            return outcome
        if type(outcome) is Regenerate:
            self.finished(step, elapsed, verdict, outcome.feedback)
            return outcome
        assert type(outcome) is Turn
        self.finished(step, elapsed, verdict)
        if outcome.request is not turn.request:
            self.note_shaping(step, turn, outcome)
        if outcome.injections is not turn.injections:
            outcome = self.stamp(step, turn, outcome, made)
        if not post and outcome.context.messages is not turn.context.messages:
            self.viewed_by = step.label
        return outcome

    def note_shaping(self, step: Step, before: Turn, after: Turn) -> None:
        """Remember which hook narrowed the tools or chose one, for RequestError messages."""
        if after.request.active_tools != before.request.active_tools:
            self.shaped_by["active_tools"] = step.name
        if after.request.tool_choice != before.request.tool_choice:
            self.shaped_by["tool_choice"] = step.name

    # -- stage 8: the commit, then background hooks ------------------------------------------

    async def complete(self, turn: Turn) -> TurnResult:
        """Commit an accepted turn, then start (or, without a session, await) background hooks."""
        result = self.result("completed", turn, turn.reply, None)
        host = self.host
        if host is not None:
            if self.caught_up is not None:
                # A streamed turn commits once its consumer has seen the reply: leaving the
                # stream before that cancels the turn, and nothing is committed.
                await self.caught_up()
            conversation_id, messages = await host.commit(result)
            if self.emit is not None:
                self.emit(ev.Committed(self.turn_ref, conversation_id, messages))
        background = self.plan.background
        if background:
            if host is not None:
                host.spawn(turn)
            else:
                self.late = await run_all_background(self, background, turn)
                result = self.result("completed", turn, turn.reply, None)
        if self.emit is not None:
            self.emit(ev.TurnFinished(self.turn_ref, "completed"))
        return result

    # -- outcomes -----------------------------------------------------------------------------

    def halted(self, turn: Turn, stop: Halt, attempt: int = 0) -> TurnResult:
        assert stop.hook is not None
        if self.emit is not None:
            self.emit(ev.Halted(self.turn_ref, stop.hook, stop.reason))
        reply = None
        if stop.reply is not None:
            message = (
                stop.reply if isinstance(stop.reply, Message) else Message.assistant(stop.reply)
            )
            reply = Reply(message, (message,), attempt, "halted", Usage())
            turn = attrs.evolve(turn, reply=reply)
        return self.finish("halted", turn, reply, stop)

    def finish(
        self, outcome: ev.Outcome, turn: Turn, reply: Reply | None, stop: Halt | None
    ) -> TurnResult:
        result = self.result(outcome, turn, reply, stop)
        if self.emit is not None:
            self.emit(ev.TurnFinished(self.turn_ref, outcome))
        return result

    def result(
        self, outcome: ev.Outcome, turn: Turn, reply: Reply | None, stop: Halt | None
    ) -> TurnResult:
        if self.watch is not None:
            self.watch.settled(turn, reply)
        rejections = tuple(self.rejections)
        audit = AuditRecord(
            turn.turn_ref,
            outcome,
            (*turn.injections, *self.late) if self.late else turn.injections,
            tuple(self.records),
            tuple(self.attempts),
            stop,
            rejections,
            tuple(self.calls),
        )
        return TurnResult(outcome, turn, reply, stop, rejections, audit)


def _as_accepted(held: list[ev.Event], reply: Reply, attempt: int) -> list[ev.Event]:
    """A held attempt's events as the post hooks accepted it, a hook having changed the reply.

    Released as the post hooks left the reply, which is what the log holds: a `ReplyReady`
    with the accepted reply, and, when a hook rewrote the text (a scrub, a disclaimer), the
    text events replaced by the accepted reply's text, one per assistant message, where the
    first of them stood, so that no event carries text a hook replaced. Text a hook left as
    it was keeps its chunks.
    """
    said = [m.text for m in reply.messages if m.role == "assistant" and m.text]
    streamed = [event.text for event in held if type(event) is ev.TextDelta]
    rewritten = "".join(said) != "".join(streamed)
    released: list[ev.Event] = []
    for event in held:
        ready = type(event) is ev.ReplyReady
        if rewritten and (ready or type(event) is ev.TextDelta):
            # The accepted text goes where the first text event stood (or, if the model
            # streamed none, before the reply).
            released.extend(ev.TextDelta(event.turn_ref, text, attempt) for text in said)
            said = []
            if not ready:
                continue
        if isinstance(event, ev.ReplyReady):
            event = attrs.evolve(event, reply=reply)
        released.append(event)
    return released


NOT_RUN = "not run: this reply was rejected (the reason follows)"
"""The result a rejected reply's unanswered tool call is shown with when the model is asked
again."""


def _shown_again(reply: Reply, attempt: int) -> tuple[Message, ...]:
    """A rejected attempt's messages as the model is shown them with the feedback.

    A tool call the attempt left unanswered (a pipeline without tools keeps the model's calls
    in its reply, for the caller to run) is followed by a result saying it was not run:
    providers refuse a request in which a tool call has no result, so regenerating would
    fail with a 400 instead of asking the model again.
    """
    answered = {
        part.call_id
        for message in reply.messages
        if message.role == "tool"
        for part in message.parts
        if type(part) is ToolResult
    }
    shown: list[Message] = []
    for message in reply.messages:
        shown.append(message)
        if message.role == "assistant":
            shown.extend(
                Message.tool(
                    ToolResult(part.id, NOT_RUN, is_error=True),
                    meta={"feedback_for_attempt": attempt},
                )
                for part in message.parts
                if type(part) is ToolCall and part.id not in answered
            )
    return tuple(shown)


def _checked_reply(step: Step, before: Turn, after: Turn) -> Turn:
    """A post hook's changed reply, its messages kept in step with its message.

    The log commits ``reply.messages``, whose last item is ``reply.message``: a hook that
    rewrites only ``message`` (a disclaimer, a scrub) has the last message replaced too, so
    the log holds what the reply says.
    """
    reply, old = after.reply, before.reply
    assert old is not None
    if type(reply) is not Reply:
        raise HookReturnError(
            f"hook {step.label} set turn.reply to {describe(reply)}; a post hook may change"
            " the reply, not remove or replace it with something else — e.g."
            " attrs.evolve(turn.reply, message=Message.assistant(...))",
            hook=step.name,
            stage=step.stage,
        )
    if reply.messages and reply.messages[-1] == reply.message:
        return after
    if reply.messages == old.messages:
        reply = attrs.evolve(reply, messages=(*reply.messages[:-1], reply.message))
        return attrs.evolve(after, reply=reply)
    raise HookReturnError(
        f"hook {step.label} changed the reply so that its last message is not its message;"
        " the log commits reply.messages — change both, or only reply.message",
        hook=step.name,
        stage=step.stage,
    )


def _with_tools(turn: Turn, tools: tuple[Tool, ...]) -> Turn:
    """The turn offering the pipeline's tools; a context that offers tools must offer only
    tools the pipeline can run."""
    context = turn.context
    if not context.tools:
        return attrs.evolve(turn, context=attrs.evolve(context, tools=[t.spec for t in tools]))
    runnable = {t.name for t in tools}
    strangers = [name for name in context.tool_names if name not in runnable]
    if strangers:
        raise RequestError(
            f"the turn's context offers tools {strangers} that the pipeline cannot run (its"
            f" tools are {sorted(runnable)}); the model would call them and get no result —"
            " leave context.tools empty to offer the pipeline's tools"
        )
    return turn


# The turn's other fields a hook may replace, each with the one record type it holds.
_RECORD_FIELDS = (
    ("user_message", Message, "build it with Message.user(...)"),
    ("scope", Scope, "build it with Scope(...), change it with turn.assign(...)"),
    ("request", RequestOptions, "change it with turn.with_request(...)"),
)


def turn_problem(turn: Turn, before: Turn | None = None) -> tuple[str, str] | None:
    """What is malformed in `turn` (what, and the fix), or None; only what changed since
    `before`, when given.

    `Turn` does not check its fields (``attrs.evolve`` or the constructor pass anything):
    unchecked, a context set to None would fail later, in rendering, the model call or the
    commit, as an AttributeError naming no culprit or a ProviderError blaming the model. A
    `Context` checks its own history, system prompt and tools as it is built.
    """
    context: object = turn.context  # anything may have been set
    if (before is None or context is not before.context) and not isinstance(context, Context):
        return (
            f"turn.context is {describe(context)}, not a Context",
            "a history view is attrs.evolve(turn.context, messages=...)",
        )
    for field, kind, fix in _RECORD_FIELDS:
        value = getattr(turn, field)
        if (before is None or value is not getattr(before, field)) and type(value) is not kind:
            return f"turn.{field} is {describe(value)}, not a {kind.__name__}", fix
    if before is None:
        odd = [i for i in turn.injections if type(i) is not Injection]
        if odd:
            what = f"turn.injections holds {describe(odd[0])}, not an Injection"
            return what, "add content with turn.inject(...)"
        role = turn.user_message.role
        if role not in ("user", "tool"):
            # It would be sent as the user's turn, and committed as what the user said.
            return (
                f"turn.user_message is a {role!r} message, not the user's (or tool results)",
                "start the turn with Turn.start(text or a user message)",
            )
        for index, injection in enumerate(turn.injections):
            # `Turn.inject` pairs tool parts; an injection built by hand is checked here,
            # before its lone call is sent as a request no provider accepts.
            problem = exchange_problem(injection.parts)
            if problem is not None:
                return f"turn.injections[{index}] is malformed: {problem}", "use turn.inject(...)"
        return None
    message, role = turn.user_message, before.user_message.role
    if message is not before.user_message and message.role != role:
        # An assistant message in its place would be committed as what the user said.
        return (
            f"turn.user_message is a {message.role!r} message, not the turn's {role!r} one",
            "rewrite its parts instead: attrs.evolve(turn.user_message, parts=...)",
        )
    reply: object = turn.reply
    if before.reply is None and reply is not None and type(reply) is not Reply:
        # (A post hook's reply is checked by `_checked_reply`.)
        return f"turn.reply is {describe(reply)}, not a Reply", "post hooks change the reply"
    return None


def _check_fields(step: Step, before: Turn, after: Turn) -> None:
    """What a hook changed on the turn holds records of the right types (`turn_problem`)."""
    problem = turn_problem(after, before)
    if problem is not None:
        what, fix = problem
        raise HookReturnError(
            f"hook {step.label} returned a turn in which {what}, so it cannot be sent or"
            f" committed — {fix}",
            hook=step.name,
            stage=step.stage,
        )


def _check_unchanged(step: Step, before: Turn, after: Turn, given: tuple[Message, ...]) -> None:
    """A hook may not re-correlate the turn, change its tools, or widen the active ones, nor
    part a tool call from its result in a history it replaced (`given`: the turn's own)."""
    _check_fields(step, before, after)
    if after.turn_ref != before.turn_ref:
        raise HookReturnError(
            f"hook {step.label} changed the turn_ref from {before.turn_ref!r} to"
            f" {after.turn_ref!r}; it correlates the turn's events and audit record and is"
            " fixed when the turn starts",
            hook=step.name,
            stage=step.stage,
        )
    if step.stage != "post" and after.context.messages is not before.context.messages:
        # (A post hook's history is never sent: the request went out before it ran.)
        check_exchange(step, given, before.user_message, after.context.messages)
    if after.context.tools != before.context.tools:
        raise HookReturnError(
            f"hook {step.label} changed the context's tools from"
            f" {list(before.context.tool_names)} to {list(after.context.tool_names)}; tools"
            " are fixed per pipeline — narrow them for this turn with"
            " turn.with_request(active_tools=...)",
            hook=step.name,
            stage=step.stage,
        )
    was, now = before.request.active_tools, after.request.active_tools
    if was is not None and (now is None or not set(now) <= set(was)):
        raise HookReturnError(
            f"hook {step.label} widened active_tools from {list(was)} to"
            f" {'all tools' if now is None else list(now)}; tools can only be narrowed — use"
            " turn.with_request(active_tools=...)",
            hook=step.name,
            stage=step.stage,
        )
