"""The regeneration loop: post hooks send the model back, within a visible bound."""

from collections.abc import Callable

import anyio
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import (
    ConfigError,
    HookReturnError,
    Pipeline,
    Regenerate,
    Rejection,
    TurnResult,
    cont,
    halt,
    hook,
    per_chunk,
    regenerate,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Message, Text, ToolCall, Turn

from .support import collect as streamed

TURN_REF = "turn-regen"


# -- helpers --------------------------------------------------------------------------------


def start(text: str = "hi") -> Turn:
    return Turn.start(text, turn_ref=TURN_REF)


def feedback_note(feedback: str, attempt: int) -> Message:
    """The transient user message that tells the model why `attempt` was rejected."""
    return Message.user(feedback, meta={"feedback_for_attempt": attempt})


def judge(bad: str = "bad", feedback: str = "do better", name: str = "judge"):
    """A guardrail rejecting any reply whose text contains `bad`."""

    async def check(turn):
        if bad in turn.reply.text:
            return regenerate(feedback)
        return cont(turn)

    return hook(check, name=name)


def always_reject(name: str = "judge"):
    """A guardrail rejecting every attempt, with feedback naming the attempt."""

    async def check(turn):
        return regenerate(f"no {turn.reply.attempt}")

    return hook(check, name=name)


def tracer(trace: list, label: str, **options):
    """A post hook recording (label, attempt) and continuing unchanged."""

    async def record(turn):
        trace.append((label, turn.reply.attempt))
        return cont(turn)

    return hook(record, name=label, **options)


def timeline(events) -> list[tuple[str, object]]:
    """Events as (type name, attempt) where they carry one, else (type name, hook or None)."""
    out: list[tuple[str, object]] = []
    for event in events:
        if isinstance(event, ev.ModelCalled | ev.ModelFinished | ev.TextDelta | ev.AttemptRejected):
            detail: object = event.attempt
        elif isinstance(event, ev.ReplyReady):
            detail = event.reply.attempt
        else:
            detail = getattr(event, "hook", None)
        out.append((type(event).__name__, detail))
    return out


def essentials(result: TurnResult) -> tuple:
    """What run and stream, held or not, must agree on."""
    return (result.outcome, result.reply, result.rejections, result.log_messages)


# -- what the next attempt is sent ----------------------------------------------------------


async def test_the_next_attempt_is_sent_the_rejected_reply_and_the_feedback() -> None:
    model = ScriptedModel(["bad", "good"])
    pipe = Pipeline(model=model, system="Be brief.", post=[judge(feedback="too rude")])

    await pipe.run(start())

    assert model.requests[1].messages == (
        Message.system("Be brief."),
        Message.user("hi"),
        Message.assistant("bad"),
        feedback_note("too rude", 1),
    )


async def test_a_rejected_replys_unanswered_tool_call_is_shown_again_with_a_result() -> None:
    """Bug: a pipeline without tools keeps the model's tool calls in its reply; rejecting such
    a reply sent the call back with no tool result after it, a request every provider refuses
    (400), so the turn failed instead of regenerating."""
    call = ToolCall("call_1", "lookup", {"q": "hours"})
    model = ScriptedModel([["Let me look.", call], "We open at nine."])
    pipe = Pipeline(model=model, post=[judge(bad="look", feedback="answer from what you know")])

    result = await pipe.run(start())

    sent = model.requests[1].messages
    assert (result.outcome, sent[:2]) == (
        "completed",
        (Message.user("hi"), Message("assistant", (Text("Let me look."), call))),
    )
    assert sent[2].role == "tool"
    [answer] = sent[2].parts
    assert (answer.call_id, answer.is_error, "not run" in answer.content) == ("call_1", True, True)
    assert sent[3:] == (feedback_note("answer from what you know", 1),)


async def test_the_first_attempt_is_sent_no_feedback() -> None:
    model = ScriptedModel(["bad", "good"])
    pipe = Pipeline(model=model, post=[judge()])

    await pipe.run(start())

    assert model.requests[0].messages == (Message.user("hi"),)


async def test_the_feedback_follows_the_rendered_turn_with_its_pre_injections() -> None:
    async def date(turn):
        return cont(turn.inject("today is Monday"))

    model = ScriptedModel(["bad", "good"])
    pipe = Pipeline(model=model, pre=[date], post=[judge(feedback="fb")])

    await pipe.run(start())

    first, second = model.requests
    assert second.messages == (*first.messages, Message.assistant("bad"), feedback_note("fb", 1))


async def test_feedback_accumulates_over_attempts() -> None:
    model = ScriptedModel(["one", "two", "three"])
    pipe = Pipeline(model=model, post=[always_reject()], max_regenerations=2)

    await pipe.run(start())

    assert model.requests[2].messages == (
        Message.user("hi"),
        Message.assistant("one"),
        feedback_note("no 1", 1),
        Message.assistant("two"),
        feedback_note("no 2", 2),
    )


async def test_the_next_attempt_keeps_the_request_options_the_pre_hooks_shaped() -> None:
    async def cool(turn):
        return cont(turn.with_request(temperature=0.2))

    model = ScriptedModel(["bad", "good"])
    pipe = Pipeline(model=model, pre=[cool], post=[judge()])

    await pipe.run(start())

    assert [request.options.temperature for request in model.requests] == [0.2, 0.2]


async def test_post_injections_of_a_rejected_attempt_are_not_sent_to_the_model() -> None:
    async def note(turn):
        return cont(turn.inject("post note"))

    model = ScriptedModel(["bad", "good"])
    pipe = Pipeline(model=model, post=[hook(note, name="note"), judge(feedback="fb")])

    await pipe.run(start())

    assert model.requests[1].messages == (
        Message.user("hi"),
        Message.assistant("bad"),
        feedback_note("fb", 1),
    )


async def test_the_model_is_sent_the_rejected_text_as_the_transformers_left_it() -> None:
    model = ScriptedModel(["bad", "good"])
    pipe = Pipeline(model=model, transformers=[per_chunk(str.upper)], post=[judge(bad="BAD")])

    await pipe.run(start())

    assert model.requests[1].messages[1] == Message.assistant("BAD")


# -- the log never sees a rejection ---------------------------------------------------------


async def test_the_log_holds_only_the_accepted_attempt() -> None:
    pipe = Pipeline(model=ScriptedModel(["bad", "good"]), post=[judge()])

    result = await pipe.run(start())

    assert result.log_messages == (Message.user("hi"), Message.assistant("good"))


async def test_a_durable_post_injection_joins_the_log_once_after_regenerations() -> None:
    async def summary(turn):
        return cont(turn.inject(f"summary of attempt {turn.reply.attempt}"))

    pipe = Pipeline(
        model=ScriptedModel(["bad", "bad", "good"]),
        post=[hook(summary, name="summary", durable=True), judge()],
    )

    result = await pipe.run(start())

    assert result.log_messages == (
        Message.user("hi"),
        Message.assistant("good"),
        Message.user([Text("summary of attempt 3", meta={"injected_by": "summary"})]),
    )


async def test_the_final_turn_carries_the_accepted_reply() -> None:
    pipe = Pipeline(model=ScriptedModel(["bad", "good"]), post=[judge()])

    result = await pipe.run(start())

    assert result.turn.reply is not None
    assert (result.turn.reply.text, result.turn.reply.attempt, result.turn.reply) == (
        "good",
        2,
        result.reply,
    )


# -- the loop -------------------------------------------------------------------------------


async def test_post_hooks_rerun_from_the_first_one_on_each_attempt() -> None:
    trace: list[tuple[str, int]] = []

    async def picky(turn):
        trace.append(("picky", turn.reply.attempt))
        return regenerate("again") if turn.reply.attempt < 3 else cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["one", "two", "three"]),
        post=[tracer(trace, "first"), hook(picky, name="picky"), tracer(trace, "last")],
    )

    await pipe.run(start())

    assert trace == [
        ("first", 1),
        ("picky", 1),
        ("first", 2),
        ("picky", 2),
        ("first", 3),
        ("picky", 3),
        ("last", 3),
    ]


async def test_the_reply_attempt_counts_up_from_one() -> None:
    seen: list[tuple[int, str]] = []

    async def look(turn):
        seen.append((turn.reply.attempt, turn.reply.text))
        return cont(turn)

    pipe = Pipeline(
        model=ScriptedModel(["one", "two", "three"]),
        post=[look, always_reject()],
        max_regenerations=2,
    )

    await pipe.run(start())

    assert seen == [(1, "one"), (2, "two"), (3, "three")]


async def test_a_guardrail_that_relaxes_on_the_last_attempt_lets_the_turn_complete() -> None:
    pipes: list[Pipeline] = []

    async def strict_until_last(turn):
        last = pipes[0].max_regenerations + 1
        if turn.reply.attempt < last:
            return regenerate("stricter, please")
        return cont(turn)

    model = ScriptedModel(["one", "two", "three", "four"])
    pipes.append(Pipeline(model=model, post=[strict_until_last], max_regenerations=2))

    result = await pipes[0].run(start())

    assert (result.outcome, result.reply.text if result.reply else None, len(model.requests)) == (
        "completed",
        "three",
        3,
    )


async def test_a_halt_after_a_rejection_keeps_the_rejection() -> None:
    async def stop_at_two(turn):
        if turn.reply.attempt == 2:
            return halt("enough", reply="Sorry.")
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["bad", "worse"]), post=[judge(bad="bad"), stop_at_two])

    result = await pipe.run(start())

    assert (result.outcome, result.rejections, result.log_messages) == (
        "halted",
        (Rejection(1, "judge", "do better", "bad"),),
        (),
    )


# -- the bound ------------------------------------------------------------------------------


@pytest.mark.parametrize("bound", [0, 1, 3])
async def test_the_model_is_called_at_most_one_more_time_than_the_bound(bound: int) -> None:
    model = ScriptedModel([f"r{n}" for n in range(1, bound + 4)])
    pipe = Pipeline(model=model, post=[always_reject()], max_regenerations=bound)

    await pipe.run(start())

    assert len(model.requests) == bound + 1


@pytest.mark.parametrize("bound", [0, 1, 3])
async def test_a_spent_bound_gives_outcome_exhausted_and_no_answer(bound: int) -> None:
    model = ScriptedModel([f"r{n}" for n in range(1, bound + 4)])
    pipe = Pipeline(model=model, post=[always_reject()], max_regenerations=bound)

    result = await pipe.run(start())

    assert (result.outcome, result.reply, result.turn.reply, result.halt) == (
        "exhausted",
        None,
        None,
        None,
    )


async def test_no_regeneration_allowed_means_exhausted_after_one_attempt() -> None:
    model = ScriptedModel(["one", "two"])
    pipe = Pipeline(model=model, post=[always_reject()], max_regenerations=0)

    result = await pipe.run(start())

    assert (result.outcome, len(model.requests), result.rejections) == (
        "exhausted",
        1,
        (Rejection(1, "judge", "no 1", "one"),),
    )


async def test_an_exhausted_turn_holds_every_rejection_in_order() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["one", "two", "three"]),
        post=[always_reject()],
        max_regenerations=2,
    )

    result = await pipe.run(start())

    assert result.rejections == (
        Rejection(1, "judge", "no 1", "one"),
        Rejection(2, "judge", "no 2", "two"),
        Rejection(3, "judge", "no 3", "three"),
    )


async def test_the_audit_record_holds_the_same_rejections() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["one", "two", "three"]),
        post=[always_reject()],
        max_regenerations=2,
    )

    result = await pipe.run(start())

    assert (result.audit.outcome, result.audit.rejections) == ("exhausted", result.rejections)


async def test_the_audit_record_holds_every_attempt() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["one", "two", "three"]),
        post=[always_reject()],
        max_regenerations=2,
    )

    result = await pipe.run(start())

    assert [(a.attempt, a.text) for a in result.audit.attempts] == [
        (1, "one"),
        (2, "two"),
        (3, "three"),
    ]


async def test_a_completed_turn_audits_its_rejected_attempts_too() -> None:
    pipe = Pipeline(model=ScriptedModel(["bad", "good"]), post=[judge()])

    result = await pipe.run(start())

    assert (
        [(a.attempt, a.text) for a in result.audit.attempts],
        result.rejections,
        result.audit.rejections,
    ) == (
        [(1, "bad"), (2, "good")],
        (Rejection(1, "judge", "do better", "bad"),),
        (Rejection(1, "judge", "do better", "bad"),),
    )


async def test_an_exhausted_turn_has_no_log_messages() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["one", "two"]), post=[always_reject()], max_regenerations=1
    )

    result = await pipe.run(start())

    assert result.log_messages == ()


async def test_the_rejection_text_is_the_transformed_text() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["bad", "good"]),
        transformers=[per_chunk(str.upper)],
        post=[judge(bad="BAD")],
    )

    result = await pipe.run(start())

    assert result.rejections == (Rejection(1, "judge", "do better", "BAD"),)


@settings(max_examples=60)
@given(
    st.integers(min_value=0, max_value=4).flatmap(
        lambda bound: st.tuples(
            st.just(bound), st.lists(st.booleans(), min_size=bound + 1, max_size=bound + 1)
        )
    )
)
async def test_the_loop_stops_at_the_first_accepted_attempt_or_the_bound(
    case: tuple[int, list[bool]],
) -> None:
    bound, accepts = case

    async def verdict(turn):
        if accepts[turn.reply.attempt - 1]:
            return cont(turn)
        return regenerate(f"no {turn.reply.attempt}")

    model = ScriptedModel([f"r{n}" for n in range(1, bound + 3)])
    pipe = Pipeline(model=model, post=[hook(verdict, name="judge")], max_regenerations=bound)

    result = await pipe.run(start())

    accepted = accepts.index(True) + 1 if True in accepts else None
    calls = accepted if accepted is not None else bound + 1
    expected_rejections = tuple(
        Rejection(n, "judge", f"no {n}", f"r{n}") for n in range(1, calls + (accepted is None))
    )
    assert (result.outcome, len(model.requests), result.rejections) == (
        "completed" if accepted is not None else "exhausted",
        calls,
        expected_rejections,
    )
    assert (result.reply.text if result.reply else None) == (
        f"r{accepted}" if accepted is not None else None
    )


# -- events ---------------------------------------------------------------------------------


def one_rejection(**options) -> Pipeline:
    trace: list[tuple[str, int]] = []
    return Pipeline(
        model=ScriptedModel([["ba", "d"], ["go", "od"]]),
        post=[judge(), tracer(trace, "after")],
        **options,
    )


async def test_a_turn_with_one_rejection_reports_the_whole_event_trace() -> None:
    events, _ = await streamed(one_rejection(), start())

    assert timeline(events) == [
        ("TurnStarted", None),
        ("ModelCalled", 1),
        ("TextDelta", 1),
        ("TextDelta", 1),
        ("ModelFinished", 1),
        ("ReplyReady", 1),
        ("HookStarted", "judge"),
        ("HookFinished", "judge"),
        ("AttemptRejected", 1),
        ("ModelCalled", 2),
        ("TextDelta", 2),
        ("TextDelta", 2),
        ("ModelFinished", 2),
        ("ReplyReady", 2),
        ("HookStarted", "judge"),
        ("HookFinished", "judge"),
        ("HookStarted", "after"),
        ("HookFinished", "after"),
        ("TurnFinished", None),
    ]


async def test_the_attempt_rejected_event_names_the_attempt_hook_and_feedback() -> None:
    events, _ = await streamed(one_rejection(), start())

    assert [event for event in events if type(event) is ev.AttemptRejected] == [
        ev.AttemptRejected(TURN_REF, 1, "judge", "do better")
    ]


async def test_the_judging_hook_finishes_with_verdict_regenerate() -> None:
    events, _ = await streamed(one_rejection(), start())

    assert [
        event.verdict
        for event in events
        if type(event) is ev.HookFinished and event.hook == "judge"
    ] == ["regenerate", "cont"]


async def test_an_exhausted_stream_rejects_every_attempt_and_finishes_exhausted() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["one", "two"]), post=[always_reject()], max_regenerations=1
    )

    events, _ = await streamed(pipe, start())

    assert timeline(events) == [
        ("TurnStarted", None),
        ("ModelCalled", 1),
        ("TextDelta", 1),
        ("ModelFinished", 1),
        ("ReplyReady", 1),
        ("HookStarted", "judge"),
        ("HookFinished", "judge"),
        ("AttemptRejected", 1),
        ("ModelCalled", 2),
        ("TextDelta", 2),
        ("ModelFinished", 2),
        ("ReplyReady", 2),
        ("HookStarted", "judge"),
        ("HookFinished", "judge"),
        ("AttemptRejected", 2),
        ("TurnFinished", None),
    ]
    assert events[-1] == ev.TurnFinished(TURN_REF, "exhausted")


async def test_held_text_of_an_accepted_attempt_follows_its_post_hooks() -> None:
    events, _ = await streamed(one_rejection(hold_until_accepted=True), start())

    assert timeline(events) == [
        ("TurnStarted", None),
        ("ModelCalled", 1),
        ("ModelFinished", 1),
        ("HookStarted", "judge"),
        ("HookFinished", "judge"),
        ("AttemptRejected", 1),
        ("ModelCalled", 2),
        ("ModelFinished", 2),
        ("HookStarted", "judge"),
        ("HookFinished", "judge"),
        ("HookStarted", "after"),
        ("HookFinished", "after"),
        ("TextDelta", 2),
        ("TextDelta", 2),
        ("ReplyReady", 2),
        ("TurnFinished", None),
    ]


async def test_held_text_delivers_the_accepted_texts_chunks_in_order() -> None:
    events, _ = await streamed(one_rejection(hold_until_accepted=True), start())

    assert [event for event in events if type(event) is ev.TextDelta] == [
        ev.TextDelta(TURN_REF, "go", 2),
        ev.TextDelta(TURN_REF, "od", 2),
    ]


async def test_held_text_of_an_exhausted_turn_is_never_delivered() -> None:
    pipe = Pipeline(
        model=ScriptedModel(["one", "two"]),
        post=[always_reject()],
        max_regenerations=1,
        hold_until_accepted=True,
    )

    events, _ = await streamed(pipe, start())

    assert [type(e).__name__ for e in events if type(e) in (ev.TextDelta, ev.ReplyReady)] == []


# -- run, stream, held: one drive loop -------------------------------------------------------


def _plain(**options) -> Pipeline:
    return Pipeline(model=ScriptedModel([["Hel", "lo"]]), **options)


def _regeneration_once(**options) -> Pipeline:
    return Pipeline(model=ScriptedModel([["ba", "d"], ["go", "od"]]), post=[judge()], **options)


def _exhausted(**options) -> Pipeline:
    return Pipeline(
        model=ScriptedModel(["one", "two"]),
        post=[always_reject()],
        max_regenerations=1,
        **options,
    )


def _post_halt_with_reply(**options) -> Pipeline:
    async def stop(turn):
        return halt("leak", reply="I can't share that.")

    return Pipeline(model=ScriptedModel(["secret"]), post=[hook(stop, name="guard")], **options)


def _pre_halt(**options) -> Pipeline:
    async def gate(turn):
        return halt("off topic", reply="Ask about something else.")

    return Pipeline(model=ScriptedModel(["never"]), pre=[gate], **options)


def _transformers_and_regeneration(**options) -> Pipeline:
    async def note(turn):
        return cont(turn.inject("summary"))

    return Pipeline(
        model=ScriptedModel([["a ba", "d one"], ["a go", "od one"]]),
        transformers=[per_chunk(str.upper), per_chunk(lambda text: text.replace("A", "4"))],
        post=[judge(bad="B4D"), hook(note, name="summary", durable=True)],
        **options,
    )


def _background_hook(**options) -> Pipeline:
    async def later(turn):
        await anyio.sleep(1)
        return cont(turn.inject("remembered"))

    return Pipeline(
        model=ScriptedModel(["bad", "good"]),
        post=[judge(), hook(later, name="memory", background=True, durable=True)],
        **options,
    )


BUILDERS: list[tuple[str, Callable[..., Pipeline]]] = [
    ("plain", _plain),
    ("regeneration-once", _regeneration_once),
    ("exhausted", _exhausted),
    ("post-halt-with-reply", _post_halt_with_reply),
    ("pre-halt", _pre_halt),
    ("transformers-and-regeneration", _transformers_and_regeneration),
    ("background-hook", _background_hook),
]
PIPELINES = [pytest.param(build, id=name) for name, build in BUILDERS]


@pytest.mark.parametrize("build", PIPELINES)
@pytest.mark.parametrize("hold", [False, True], ids=["live", "held"])
async def test_run_and_stream_give_the_same_result(
    build: Callable[..., Pipeline], hold: bool, autojump_clock: trio.testing.MockClock
) -> None:
    ran = await build(hold_until_accepted=hold).run(start())
    _, streamed_result = await streamed(build(hold_until_accepted=hold), start())

    assert essentials(streamed_result) == essentials(ran)


@pytest.mark.parametrize("build", PIPELINES)
async def test_holding_text_does_not_change_the_result(
    build: Callable[..., Pipeline], autojump_clock: trio.testing.MockClock
) -> None:
    _, live = await streamed(build(hold_until_accepted=False), start())
    _, held = await streamed(build(hold_until_accepted=True), start())

    assert essentials(held) == essentials(live)


async def test_the_compared_pipelines_reach_the_outcomes_they_are_named_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Guards the comparisons above against pipelines that all quietly do the same thing.
    outcomes = [((await build().run(start())).outcome, name) for name, build in BUILDERS]

    assert outcomes == [
        ("completed", "plain"),
        ("completed", "regeneration-once"),
        ("exhausted", "exhausted"),
        ("halted", "post-halt-with-reply"),
        ("halted", "pre-halt"),
        ("completed", "transformers-and-regeneration"),
        ("completed", "background-hook"),
    ]


# -- wrong signals and configuration --------------------------------------------------------


@pytest.mark.parametrize(
    "signal",
    [
        pytest.param(regenerate(""), id="empty"),
        pytest.param(Regenerate(None), id="none"),  # type: ignore[arg-type]
    ],
)
async def test_regenerate_without_feedback_is_a_hook_return_error_naming_the_hook(
    signal: Regenerate,
) -> None:
    async def mute(turn):
        return signal

    pipe = Pipeline(
        model=ScriptedModel(["one", "two"]), post=[judge(bad="zzz"), hook(mute, name="mute")]
    )

    with pytest.raises(HookReturnError, match=r"'mute' \(post, position 2\)") as raised:
        await pipe.run(start())

    assert (raised.value.hook, raised.value.stage) == ("mute", "post")


@pytest.mark.parametrize("bound", [-1, True, 1.5, "2", None])
def test_max_regenerations_must_be_a_whole_number_from_zero(bound: object) -> None:
    with pytest.raises(ConfigError, match="max_regenerations"):
        Pipeline(model=ScriptedModel(["x"]), max_regenerations=bound)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", [1, "yes", None])
def test_hold_until_accepted_must_be_a_bool(flag: object) -> None:
    with pytest.raises(ConfigError, match="hold_until_accepted"):
        Pipeline(model=ScriptedModel(["x"]), hold_until_accepted=flag)  # type: ignore[arg-type]


def test_no_regeneration_and_holding_text_are_valid_settings() -> None:
    pipe = Pipeline(model=ScriptedModel(["x"]), max_regenerations=0, hold_until_accepted=True)

    assert (pipe.max_regenerations, pipe.hold_until_accepted) == (0, True)
