"""Laws of a whole turn over generated pipelines, checked against a reference interpreter.

A pipeline here is built from data: pre hooks that inject, halt or do nothing; post hooks
that inject, halt, reject chosen attempts or do nothing; any of them possibly a shadow; a
model whose answer names its attempt; a regeneration bound; held or live streaming. The
reference says what the stages and the commit rules promise: hooks run in list order and a halt stops
everything after it; a rejection sends the model back with the rejected answer and the
feedback after the user message, and the post hooks run again from the first one; the bound
spent is "exhausted"; shadow hooks enforce nothing; a completed turn commits its durable pre
injections at the head of the user message, the user message, the accepted answer and its
durable post injections as one user message, and nothing else ever is committed.
`run()`, `stream()` and a session's `send()` must all agree with it, on trio and on asyncio.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import (
    INJECTED_BY,
    Cont,
    Halt,
    Hook,
    ModelRequest,
    Pipeline,
    Regenerate,
    Rejection,
    TurnResult,
    cont,
    halt,
    hook,
    regenerate,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Message, Reply, Text, Turn

from .support import collect

T = TypeVar("T")

USER_TEXT = "hi"
CONVERSATION = "laws"

# -- the vocabulary -------------------------------------------------------------------------


@attrs.frozen
class Pre:
    action: str  # "inject" | "halt" | "noop"
    durable: bool = False
    reply: bool = False  # a halt with a substitute reply
    shadow: bool = False


@attrs.frozen
class Post:
    action: str  # "inject" | "halt" | "reject" | "noop"
    durable: bool = False
    reply: bool = False
    attempts: frozenset[int] = frozenset()  # a reject hook rejects these attempts
    shadow: bool = False


@attrs.frozen
class Plan:
    pre: tuple[Pre, ...]
    post: tuple[Post, ...]
    max_regenerations: int
    hold: bool
    scripted: bool  # ScriptedModel, else FunctionModel
    cut: int  # where the model splits its answer into two chunks


def pre_name(index: int) -> str:
    return f"pre{index + 1}"


def post_name(index: int) -> str:
    return f"post{index + 1}"


def note_of(name: str) -> str:
    return f"note from {name}"


def reason_of(name: str) -> str:
    return f"{name} stops"


def substitute_of(name: str) -> str:
    return f"{name} answers instead"


def feedback_of(name: str, attempt: int) -> str:
    return f"{name} rejects attempt {attempt}"


def answer_of(attempt: int) -> str:
    return f"answer {attempt}"


pre_steps = st.builds(
    Pre,
    action=st.sampled_from(["inject", "inject", "inject", "noop", "halt"]),
    durable=st.booleans(),
    reply=st.booleans(),
    shadow=st.sampled_from([False, False, False, True]),
)
post_steps = st.builds(
    Post,
    action=st.sampled_from(["reject", "inject", "reject", "noop", "inject", "halt", "reject"]),
    durable=st.booleans(),
    reply=st.booleans(),
    # Sampled rather than built, so that 150 examples see each shape: the first k attempts
    # (a guardrail the model satisfies on attempt k + 1), later ones, scattered ones.
    attempts=st.sampled_from(
        [frozenset(s) for s in ((1,), (1, 2), (2,), (1, 3), (), (1, 2, 3, 4), (2, 4), (1, 2, 3))]
    ),
    shadow=st.sampled_from([False, False, False, True]),
)


# Hypothesis favours the first of sampled values and small sizes and integers: the samples
# below put the shapes that exercise the most (rejections, then acceptance) first.


def steps(step: st.SearchStrategy[T], sizes: list[int]) -> st.SearchStrategy[tuple[T, ...]]:
    return st.sampled_from(sizes).flatmap(
        lambda n: st.lists(step, min_size=n, max_size=n).map(tuple)
    )


def plans(hold: st.SearchStrategy[bool] | None = None) -> st.SearchStrategy[Plan]:
    return st.builds(
        Plan,
        pre=steps(pre_steps, [2, 1, 0, 3]),
        post=steps(post_steps, [2, 3, 1, 4, 0]),
        max_regenerations=st.sampled_from([2, 1, 3, 0]),
        hold=st.booleans() if hold is None else hold,
        scripted=st.booleans(),
        cut=st.integers(0, 8),
    )


# -- the reference interpreter --------------------------------------------------------------

Part = tuple[str, str | None]  # (text, injected_by)
Injected = tuple[str, str, bool, str]  # (source, text, durable, stage)
Rejected = tuple[int, str, str, str]  # (attempt, hook, feedback, rejected text)
Sent = tuple[str, tuple[str, ...], int | None]  # (role, part texts, feedback_for_attempt)
Milestone = tuple[object, ...]


@attrs.frozen
class Expected:
    """What a turn's result says, as plain data."""

    outcome: str
    halted_by: str | None
    reason: str | None
    reply: tuple[str, int] | None  # (text, attempt)
    turn_reply: tuple[str, int] | None
    rejections: tuple[Rejected, ...]
    audited: tuple[Rejected, ...]
    injections: tuple[Injected, ...]
    log: tuple[tuple[str, tuple[Part, ...]], ...]


@attrs.frozen
class Prediction:
    result: Expected
    seen: tuple[tuple[Sent, ...], ...]  # the messages of each model call
    trace: tuple[Milestone, ...]  # the stream's milestones, in order (see `milestones`)
    accepted: int | None  # the accepted attempt


@attrs.define
class Reference:
    """A turn as the stages and the commit rules describe it, interpreted step by step."""

    plan: Plan
    trace: list[Milestone] = attrs.Factory(lambda: [("TurnStarted",)])
    pre: list[Injected] = attrs.Factory(list)
    rejections: list[Rejected] = attrs.Factory(list)
    seen: list[tuple[Sent, ...]] = attrs.Factory(list)

    def run(self) -> Prediction:
        for index, step in enumerate(self.plan.pre):
            name = pre_name(index)
            self.trace.append(("HookStarted", name, "pre"))
            if step.shadow:
                continue
            if step.action == "inject":
                self.pre.append((name, note_of(name), step.durable, "pre"))
            elif step.action == "halt":
                reply = (substitute_of(name), 0) if step.reply else None
                return self.ended("halted", self.pre, halted_by=name, reply=reply)
        # Pre-stage text goes at the head of the user message, transient or durable.
        user: Sent = ("user", (*(text for _, text, _, _ in self.pre), USER_TEXT), None)
        extra: list[Sent] = []
        for attempt in range(1, self.plan.max_regenerations + 2):
            self.seen.append((user, *extra))
            self.trace.append(("ModelCalled", attempt))
            answer = answer_of(attempt)
            # Every attempt's post stage starts from the pre-stage turn.
            post: list[Injected] = []
            for index, check in enumerate(self.plan.post):
                name = post_name(index)
                self.trace.append(("HookStarted", name, "post"))
                if check.shadow:
                    continue
                if check.action == "inject":
                    post.append((name, note_of(name), check.durable, "post"))
                elif check.action == "halt":
                    reply = (substitute_of(name), attempt) if check.reply else None
                    return self.ended("halted", [*self.pre, *post], halted_by=name, reply=reply)
                elif check.action == "reject" and attempt in check.attempts:
                    feedback = feedback_of(name, attempt)
                    self.rejections.append((attempt, name, feedback, answer))
                    self.trace.append(("AttemptRejected", attempt, name, feedback))
                    extra += [("assistant", (answer,), None), ("user", (feedback,), attempt)]
                    break
            else:
                return self.ended(
                    "completed",
                    [*self.pre, *post],
                    reply=(answer, attempt),
                    log=self.log(answer, post),
                    accepted=attempt,
                )
        return self.ended("exhausted", self.pre)

    def log(self, answer: str, post: list[Injected]) -> list[tuple[str, tuple[Part, ...]]]:
        """What is committed: durable pre text, the user message, the answer, durable post text."""
        head = tuple((text, source) for source, text, durable, _ in self.pre if durable)
        log = [("user", (*head, (USER_TEXT, None))), ("assistant", ((answer, None),))]
        tail = tuple((text, source) for source, text, durable, _ in post if durable)
        if tail:
            log.append(("user", tail))
        return log

    def ended(
        self,
        outcome: str,
        injections: list[Injected],
        *,
        halted_by: str | None = None,
        reply: tuple[str, int] | None = None,
        log: list[tuple[str, tuple[Part, ...]]] | None = None,
        accepted: int | None = None,
    ) -> Prediction:
        reason = None if halted_by is None else reason_of(halted_by)
        if halted_by is not None:
            self.trace.append(("Halted", halted_by, reason))
        self.trace.append(("TurnFinished", outcome))
        rejections = tuple(self.rejections)
        result = Expected(
            outcome,
            halted_by,
            reason,
            reply,
            reply,
            rejections,
            rejections,
            tuple(injections),
            tuple(log or ()),
        )
        return Prediction(result, tuple(self.seen), tuple(self.trace), accepted)


def expect(plan: Plan) -> Prediction:
    """What the stages and the commit rules say the turn does."""
    return Reference(plan).run()


# -- building the pipeline from the same data -----------------------------------------------


def _pre_hook(step: Pre, name: str) -> Hook:
    async def run(turn: Turn) -> Cont[Turn] | Halt:
        if step.action == "inject":
            return cont(turn.inject(note_of(name)))
        if step.action == "halt":
            return halt(reason_of(name), reply=substitute_of(name) if step.reply else None)
        return cont(turn)

    return hook(run, name=name, durable=step.durable, shadow=step.shadow)


def _post_hook(step: Post, name: str) -> Hook:
    async def run(turn: Turn) -> Cont[Turn] | Halt | Regenerate:
        if step.action == "inject":
            return cont(turn.inject(note_of(name)))
        if step.action == "halt":
            return halt(reason_of(name), reply=substitute_of(name) if step.reply else None)
        assert turn.reply is not None
        attempt = turn.reply.attempt
        if step.action == "reject" and attempt in step.attempts:
            return regenerate(feedback_of(name, attempt))
        return cont(turn)

    return hook(run, name=name, durable=step.durable, shadow=step.shadow)


def chunks_of(text: str, cut: int) -> list[str]:
    return [chunk for chunk in (text[:cut], text[cut:]) if chunk]


def build(plan: Plan) -> Pipeline:
    if plan.scripted:
        model: ScriptedModel | FunctionModel = ScriptedModel(
            [chunks_of(answer_of(n), plan.cut) for n in range(1, plan.max_regenerations + 2)]
        )
    else:

        def answer(request: ModelRequest) -> list[str]:
            # The attempt is one more than the rejections the model has been told about.
            told = [m for m in request.messages if m.meta.get("feedback_for_attempt")]
            return chunks_of(answer_of(len(told) + 1), plan.cut)

        model = FunctionModel(answer)
    return Pipeline(
        model=model,
        pre=[_pre_hook(step, pre_name(i)) for i, step in enumerate(plan.pre)],
        post=[_post_hook(step, post_name(i)) for i, step in enumerate(plan.post)],
        max_regenerations=plan.max_regenerations,
        hold_until_accepted=plan.hold,
    )


# -- observing what the library did ---------------------------------------------------------


def _reply_view(reply: Reply | None) -> tuple[str, int] | None:
    return None if reply is None else (reply.text, reply.attempt)


def _rejection_views(rejections: Sequence[Rejection]) -> tuple[Rejected, ...]:
    return tuple((r.attempt, r.hook, r.feedback, r.text) for r in rejections)


def _text(part: object) -> str:
    assert isinstance(part, Text), part
    return part.text


def log_view(messages: Sequence[Message]) -> tuple[tuple[str, tuple[Part, ...]], ...]:
    return tuple(
        (m.role, tuple((_text(p), p.meta.get(INJECTED_BY)) for p in m.parts)) for m in messages
    )


def observe(result: TurnResult) -> Expected:
    return Expected(
        result.outcome,
        result.halt.hook if result.halt else None,
        result.halt.reason if result.halt else None,
        _reply_view(result.reply),
        _reply_view(result.turn.reply),
        _rejection_views(result.rejections),
        _rejection_views(result.audit.rejections),
        tuple(
            (str(i.source), _text(i.parts[0]), i.durable, str(i.stage))
            for i in result.turn.injections
        ),
        log_view(result.log_messages),
    )


def seen_by(model: ScriptedModel | FunctionModel) -> tuple[tuple[Sent, ...], ...]:
    return tuple(
        tuple(
            (m.role, tuple(_text(p) for p in m.parts), m.meta.get("feedback_for_attempt"))
            for m in request.messages
        )
        for request in model.requests
    )


def milestones(events: list[ev.Event]) -> tuple[Milestone, ...]:
    """The events that say which hooks ran, when the model was called, and how it ended."""
    out: list[Milestone] = []
    for event in events:
        match event:
            case ev.TurnStarted():
                out.append(("TurnStarted",))
            case ev.HookStarted(hook=name, stage=stage):
                out.append(("HookStarted", name, stage))
            case ev.ModelCalled(attempt=attempt):
                out.append(("ModelCalled", attempt))
            case ev.AttemptRejected(attempt=attempt, hook=name, feedback=feedback):
                out.append(("AttemptRejected", attempt, name, feedback))
            case ev.Halted(hook=name, reason=reason):
                out.append(("Halted", name, reason))
            case ev.TurnFinished(outcome=outcome):
                out.append(("TurnFinished", outcome))
    return tuple(out)


def _on(loop: str, fn: Callable[[Pipeline], Awaitable[T]], pipe: Pipeline) -> T:
    """Run `fn(pipe)` on `loop`: trio (in virtual time) or asyncio."""
    if loop == "asyncio":
        return asyncio.run(fn(pipe))  # type: ignore[arg-type]
    return trio.run(fn, pipe, clock=trio.testing.MockClock(autojump_threshold=0))


def _delta_text(event: ev.Event) -> str:
    assert isinstance(event, ev.TextDelta)
    return event.text


def start() -> Turn:
    return Turn.start(USER_TEXT, turn_ref="law")


async def _run(pipe: Pipeline) -> TurnResult:
    return await pipe.run(start())


async def _stream(pipe: Pipeline) -> tuple[list[ev.Event], TurnResult]:
    return await collect(pipe, start())


async def _send(pipe: Pipeline) -> tuple[TurnResult, tuple[Message, ...]]:
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        result = await session.send(USER_TEXT)
    return result, (await log.load(CONVERSATION)).messages


LAWS = settings(max_examples=150, deadline=None)
# Every law holds on both event loops.
LOOPS = pytest.mark.parametrize("loop", ["trio", "asyncio"])

# -- run ------------------------------------------------------------------------------------


@LOOPS
@LAWS
@given(plans())
def test_run_follows_the_reference(loop: str, plan: Plan) -> None:
    assert observe(_on(loop, _run, build(plan))) == expect(plan).result


@LOOPS
@LAWS
@given(plans())
def test_the_model_sees_every_rejected_answer_and_its_feedback(loop: str, plan: Plan) -> None:
    pipe = build(plan)
    _on(loop, _run, pipe)
    assert isinstance(pipe.model, ScriptedModel | FunctionModel)
    assert seen_by(pipe.model) == expect(plan).seen


# -- stream ---------------------------------------------------------------------------------


@LOOPS
@LAWS
@given(plans())
def test_stream_follows_the_reference(loop: str, plan: Plan) -> None:
    _, result = _on(loop, _stream, build(plan))
    assert observe(result) == expect(plan).result


@LOOPS
@LAWS
@given(plans())
def test_stream_reports_hooks_model_calls_and_rejections_in_order(loop: str, plan: Plan) -> None:
    events, _ = _on(loop, _stream, build(plan))
    assert milestones(events) == expect(plan).trace


@LOOPS
@LAWS
@given(plans())
def test_every_hook_started_is_closed_exactly_once(loop: str, plan: Plan) -> None:
    events, _ = _on(loop, _stream, build(plan))
    open_hooks: list[tuple[str, str]] = []
    for event in events:
        if isinstance(event, ev.HookStarted):
            assert (event.hook, event.stage) not in open_hooks, event
            open_hooks.append((event.hook, event.stage))
        elif isinstance(event, ev.HookFinished | ev.HookFailed):
            assert (event.hook, event.stage) in open_hooks, event
            open_hooks.remove((event.hook, event.stage))
    assert open_hooks == []


@LOOPS
@LAWS
@given(plans(hold=st.just(True)))
def test_a_held_stream_shows_only_the_accepted_attempt(loop: str, plan: Plan) -> None:
    events, _ = _on(loop, _stream, build(plan))
    accepted = expect(plan).accepted
    shown = [e for e in events if isinstance(e, ev.TextDelta)]
    ready = [e.reply.attempt for e in events if isinstance(e, ev.ReplyReady)]
    assert {delta.attempt for delta in shown} <= {accepted}
    assert "".join(delta.text for delta in shown) == (
        answer_of(accepted) if accepted is not None else ""
    )
    assert ready == ([accepted] if accepted is not None else [])


@LOOPS
@LAWS
@given(plans(hold=st.just(False)))
def test_a_live_stream_retracts_every_rejected_attempt_after_its_text(
    loop: str, plan: Plan
) -> None:
    events, _ = _on(loop, _stream, build(plan))
    prediction = expect(plan)
    calls = len(prediction.seen)
    for attempt in range(1, calls + 1):
        deltas = [
            i for i, e in enumerate(events) if isinstance(e, ev.TextDelta) and e.attempt == attempt
        ]
        assert "".join(_delta_text(events[i]) for i in deltas) == answer_of(attempt)
    for attempt, *_ in prediction.result.rejections:
        deltas = [
            i for i, e in enumerate(events) if isinstance(e, ev.TextDelta) and e.attempt == attempt
        ]
        retracted = [
            i
            for i, e in enumerate(events)
            if isinstance(e, ev.AttemptRejected) and e.attempt == attempt
        ]
        assert len(retracted) == 1
        assert max(deltas) < retracted[0]


# -- a session over a log -------------------------------------------------------------------


@LOOPS
@LAWS
@given(plans())
def test_session_send_follows_the_reference(loop: str, plan: Plan) -> None:
    result, _ = _on(loop, _send, build(plan))
    assert observe(result) == expect(plan).result


@LOOPS
@LAWS
@given(plans())
def test_session_log_holds_exactly_the_predicted_messages(loop: str, plan: Plan) -> None:
    _, loaded = _on(loop, _send, build(plan))
    assert log_view(loaded) == expect(plan).result.log
