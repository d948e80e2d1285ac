"""hooks.running_summary and hooks.drop_oldest: alone, over several turns of a session."""

import anyio
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import DROPPED_TURNS, RUNNING_SUMMARY, drop_oldest, running_summary
from pipeline import (
    INJECTED_BY,
    Budget,
    ConfigError,
    Cont,
    HookFailed,
    Pipeline,
    message_tokens,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Message, Reply, Text, ToolCall, ToolResult, ToolSpec, Turn

HEADING = "Summary of the conversation so far:\n"


def exchange(n: int, *, tool: bool = False) -> list[Message]:
    """Turn `n` as a log holds it: the question, tool steps if any, the answer."""
    messages = [Message.user(f"question {n}")]
    if tool:
        call = ToolCall(f"call-{n}", "lookup", {"n": n})
        messages += [Message.assistant(call), Message.tool(ToolResult(f"call-{n}", f"found {n}"))]
    messages.append(Message.assistant(f"answer {n}"))
    return messages


def answered(n: int, history: list[Message]) -> Turn:
    """Turn `n`, answered, on top of `history`."""
    turn = Turn.start(f"question {n}", context=Context(messages=history))
    answer = Message.assistant(f"answer {n}")
    return attrs.evolve(turn, reply=Reply(answer, (answer,)))


def as_logged(turn: Turn) -> Message:
    """The summary a hook injected, as a session commits it."""
    (injection,) = turn.injections
    (part,) = injection.parts
    return Message(
        "user", (attrs.evolve(part, meta={**part.meta, INJECTED_BY: "running_summary"}),)
    )


def history(*turns: int) -> list[Message]:
    return [message for n in turns for message in exchange(n)]


def noted(message: Message, dropped: int) -> Message:
    """`message` as the first of a view from which `dropped` uncovered turns were dropped."""
    return attrs.evolve(message, meta={**message.meta, DROPPED_TURNS: dropped})


# -- running_summary alone ------------------------------------------------------------------


async def test_on_the_nth_turn_the_turns_so_far_are_summarized():
    model = ScriptedModel(["Ada wants a refund."])
    result = await running_summary(model, every=3)(answered(3, history(1, 2)))
    assert isinstance(result, Cont)
    (injection,) = result.value.injections
    (part,) = injection.parts
    assert isinstance(part, Text)
    assert part.text == HEADING + "Ada wants a refund."
    assert part.meta[RUNNING_SUMMARY]["turns"] == 3
    (request,) = model.requests
    sent = request.messages[-1].text
    for line in (
        "user: question 1",
        "assistant: answer 2",
        "user: question 3",
        "assistant: answer 3",
    ):
        assert line in sent


async def test_between_summaries_the_model_is_not_asked():
    model = ScriptedModel([])
    turn = answered(2, history(1))
    assert await running_summary(model, every=3)(turn) == Cont(turn)
    assert model.requests == []


async def test_the_next_summary_folds_in_only_the_turns_since_the_last():
    first = as_logged(
        (await running_summary(ScriptedModel(["S1."]), every=3)(answered(3, history(1, 2)))).value
    )
    model = ScriptedModel(["S2."])
    result = await running_summary(model, every=3)(
        answered(6, [*history(1, 2, 3), first, *history(4, 5)])
    )
    assert isinstance(result, Cont)
    (part,) = result.value.injections[0].parts
    assert part.meta[RUNNING_SUMMARY]["turns"] == 6
    sent = model.requests[0].messages[-1].text
    assert "S1." in sent
    assert ["question 4" in sent, "question 5" in sent, "question 6" in sent] == [True] * 3
    assert "question 3" not in sent
    assert "question 1" not in sent


async def test_a_turn_sent_before_the_summary_was_committed_is_neither_lost_nor_miscounted():
    # The summary written after turn 3 landed after turn 4 (turn 4 started while it was
    # being written). Turn 4 is not in it: the next summary, due after turn 6, takes it in.
    first = as_logged(
        (await running_summary(ScriptedModel(["S1."]), every=3)(answered(3, history(1, 2)))).value
    )
    late = [*history(1, 2, 3, 4), first]
    idle = ScriptedModel([])
    turn_five = answered(5, late)
    assert await running_summary(idle, every=3)(turn_five) == Cont(turn_five)
    model = ScriptedModel(["S2."])
    result = await running_summary(model, every=3)(answered(6, [*late, *history(5)]))
    assert result.value.injections[0].parts[0].meta[RUNNING_SUMMARY]["turns"] == 6
    sent = model.requests[0].messages[-1].text
    assert "question 4" in sent
    assert "question 3" not in sent


async def test_tool_steps_are_part_of_the_transcript():
    model = ScriptedModel(["S."])
    turn = answered(2, exchange(1, tool=True))
    await running_summary(model, every=2)(turn)
    sent = model.requests[0].messages[-1].text
    assert '[called lookup({"n": 1})]' in sent
    assert "[result: found 1]" in sent


async def test_a_summary_model_that_says_nothing_fails_the_hook():
    with pytest.raises(ValueError, match="no text"):
        await running_summary(ScriptedModel(["  "]), every=1)(answered(1, []))


async def test_a_turn_without_a_reply_is_refused():
    with pytest.raises(TypeError, match="post"):
        await running_summary(ScriptedModel([]), every=1)(Turn.start("hi"))


def test_it_is_a_durable_background_hook():
    summary = running_summary(ScriptedModel([]))
    assert (summary.name, summary.durable, summary.background) == ("running_summary", True, True)


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        (("gpt-4o-mini",), {}, "model"),
        ((ScriptedModel,), {}, "model"),
        ((ScriptedModel([]),), {"every": 0}, "every"),
        ((ScriptedModel([]),), {"every": True}, "every"),
        ((ScriptedModel([]),), {"every": "3"}, "every"),
    ],
)
def test_bad_options_are_refused_by_name(args, kwargs, option):
    with pytest.raises(ConfigError, match=f"running_summary\\({option}="):
        running_summary(*args, **kwargs)


def test_it_cannot_be_placed_before_the_model():
    with pytest.raises(ConfigError, match="background"):
        Pipeline(model=ScriptedModel([]), pre=[running_summary(ScriptedModel([]))])


# -- running_summary in a session -----------------------------------------------------------


def answers(count: int) -> ScriptedModel:
    return ScriptedModel([f"answer {n}" for n in range(1, count + 1)])


def summary_texts(messages) -> list[tuple[int, str]]:
    return [
        (part.meta[RUNNING_SUMMARY]["turns"], part.text)
        for message in messages
        for part in message.parts
        if RUNNING_SUMMARY in part.meta
    ]


async def test_every_nth_turn_a_summary_joins_the_log_as_its_own_entry():
    summarizer = ScriptedModel(["S after 3.", "S after 6."])
    pipe = Pipeline(model=answers(7), post=[running_summary(summarizer, every=3)])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        for n in range(1, 8):
            await session.send(f"question {n}")
            await anyio.wait_all_tasks_blocked()
    messages = (await log.load("c")).messages
    assert [message.text for message in messages] == [
        *("question 1", "answer 1", "question 2", "answer 2", "question 3", "answer 3"),
        HEADING + "S after 3.",
        *("question 4", "answer 4", "question 5", "answer 5", "question 6", "answer 6"),
        HEADING + "S after 6.",
        *("question 7", "answer 7"),
    ]
    assert summary_texts(messages) == [(3, HEADING + "S after 3."), (6, HEADING + "S after 6.")]
    entries = [entry.turn_ref.endswith(":running_summary") for entry in await log.entries("c")]
    assert entries == [False, False, False, True, False, False, False, True, False]
    second = summarizer.requests[1].messages[-1].text
    assert "S after 3." in second
    assert "question 4" in second
    assert "question 3" not in second


async def test_the_count_survives_the_log_across_sessions():
    summarizer = ScriptedModel(["S after 3."])
    pipe = Pipeline(model=answers(3), post=[running_summary(summarizer, every=3)])
    log = MemoryLog()
    for n in range(1, 4):  # one session per turn: nothing is remembered but the log
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send(f"question {n}")
    assert summary_texts((await log.load("c")).messages) == [(3, HEADING + "S after 3.")]


async def test_turns_continuing_from_tool_results_the_caller_ran_are_counted_with_their_turn():
    """Bug caught: a turn continuing from tool results its caller ran (a tool message, as a
    gateway's client tools send) counted as a turn of its own, though the log reads it as its
    turn's tool step, so every summary came early and folded in the whole conversation again."""
    weather = ToolSpec("get_weather", "The weather.", {"type": "object", "properties": {}})
    replies: list = []
    for n in range(1, 5):
        replies += [[ToolCall(f"c{n}", "get_weather", {})], f"answer {n}"]
    summarizer = ScriptedModel(["S after 2.", "S after 4."])
    pipe = Pipeline(model=ScriptedModel(replies), post=[running_summary(summarizer, every=2)])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        for n in range(1, 5):
            await session.send(f"question {n}", tools=[weather])
            await session.send(Message.tool(ToolResult(f"c{n}", f"sunny {n}")))
            await anyio.wait_all_tasks_blocked()
    assert summary_texts((await log.load("c")).messages) == [
        (2, HEADING + "S after 2."),
        (4, HEADING + "S after 4."),
    ]
    second = summarizer.requests[1].messages[-1].text
    assert ("question 2" in second, "question 3" in second, "answer 4" in second) == (
        False,
        True,
        True,
    )


async def test_in_a_session_a_summary_that_lands_late_is_caught_up_with():
    release = anyio.Event()
    written: list[str] = []

    async def summarize(request):
        written.append(request.messages[-1].text)
        if len(written) == 1:
            await release.wait()  # turn 4 is sent and committed meanwhile
        return f"S{len(written)}."

    pipe = Pipeline(model=answers(6), post=[running_summary(FunctionModel(summarize), every=3)])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        for n in range(1, 5):
            await session.send(f"question {n}")
        release.set()
        await anyio.wait_all_tasks_blocked()
        for n in range(5, 7):
            await session.send(f"question {n}")
            await anyio.wait_all_tasks_blocked()
    texts = [message.text for message in (await log.load("c")).messages]
    assert texts.index(HEADING + "S1.") == texts.index("answer 4") + 1
    assert texts[-1] == HEADING + "S2."
    assert summary_texts((await log.load("c")).messages)[-1][0] == 6
    assert "question 4" in written[1]
    assert "question 3" not in written[1]


async def test_a_late_turn_that_repeats_the_summarized_turn_is_still_caught_up_with():
    """The summary written after turn 3 ("thanks" - "You're welcome!") lands after turns 4
    and 5, and turn 5 repeats turn 3 word for word. The summary was taken to be turn 5's, so
    turn 4 was never summarized and the next summary came two turns late."""
    release = anyio.Event()
    written: list[str] = []

    async def summarize(request):
        written.append(request.messages[-1].text)
        if len(written) == 1:
            await release.wait()  # turns 4 and 5 are sent and committed meanwhile
        return f"S{len(written)}."

    said = ["hello", "what's new?", "thanks", "and the weather?", "thanks", "bye"]
    replies = ["Hi.", "Nothing.", "You're welcome!", "Sunny.", "You're welcome!", "Bye."]
    pipe = Pipeline(
        model=ScriptedModel(replies), post=[running_summary(FunctionModel(summarize), every=3)]
    )
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        for text in said[:5]:
            await session.send(text)
        release.set()
        await anyio.wait_all_tasks_blocked()
        await session.send(said[5])
        await anyio.wait_all_tasks_blocked()
    messages = (await log.load("c")).messages
    assert summary_texts(messages) == [(3, HEADING + "S1."), (6, HEADING + "S2.")]
    assert "and the weather?" in written[1]
    assert "what's new?" not in written[1]


async def test_a_failing_summary_is_reported_and_nothing_of_it_is_committed():
    def down(request):
        raise ConnectionError("summarizer unreachable")

    pipe = Pipeline(model=answers(2), post=[running_summary(FunctionModel(down), every=2)])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("question 1")
        result = await session.send("question 2")
        await anyio.wait_all_tasks_blocked()
    assert result.outcome == "completed"
    failed = [e for e in session.events if isinstance(e, ev.HookFailed)]
    assert [(e.hook, e.enforced, "summarizer unreachable" in e.error) for e in failed] == [
        ("running_summary", False, True)
    ]
    assert [m.text for m in (await log.load("c")).messages] == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
    ]


async def test_a_session_cancelled_while_summarizing_commits_no_summary(autojump_clock):
    async def never(request):
        await anyio.sleep_forever()

    pipe = Pipeline(model=answers(1), post=[running_summary(FunctionModel(never), every=1)])
    log = MemoryLog()
    with anyio.move_on_after(5):
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send("question 1")
            await anyio.sleep_forever()
    assert [m.text for m in (await log.load("c")).messages] == ["question 1", "answer 1"]
    assert [(e.hook, e.enforced) for e in session.events if isinstance(e, ev.HookFailed)] == [
        ("running_summary", False)
    ]


# -- drop_oldest ----------------------------------------------------------------------------


def chars(text: str) -> int:
    return len(text)


def test_a_history_that_fits_is_returned_as_it_is():
    messages = tuple(history(1, 2))
    assert drop_oldest()(messages, 10_000, chars) is messages


def test_the_oldest_whole_turns_go_until_the_history_fits():
    messages = (*exchange(1, tool=True), *exchange(2, tool=True), *exchange(3), *exchange(4))
    target = message_tokens([*exchange(3), *exchange(4)], chars)
    question_3, *rest_3 = exchange(3)
    question_4, *rest_4 = exchange(4)
    assert drop_oldest()(messages, target, chars) == (noted(question_3, 2), *rest_3, *exchange(4))
    assert drop_oldest()(messages, target - 1, chars) == (noted(question_4, 3), *rest_4)


def test_system_messages_the_latest_summary_and_kept_messages_stay():
    old = Message(
        "user",
        (Text("old", meta={RUNNING_SUMMARY: {"turns": 1, "through": "x"}, INJECTED_BY: "s"}),),
    )
    latest = Message(
        "user",
        (Text("new", meta={RUNNING_SUMMARY: {"turns": 2, "through": "y"}, INJECTED_BY: "s"}),),
    )
    pinned = Message.user("my name is Ada", meta={"pinned": True})
    rule = Message.system("Be brief.")
    messages = (
        rule,
        *exchange(1),
        old,
        pinned,
        Message.assistant("noted"),
        *exchange(2),
        latest,
        *exchange(3),
    )
    compact = drop_oldest(keep=lambda message: bool(message.meta.get("pinned")))
    # The summaries here match no turn, so each of the three turns dropped counts as uncovered.
    assert compact(messages, 0, chars) == (noted(rule, 3), pinned, latest)


def test_a_tool_exchange_injected_for_a_turn_goes_with_that_turn():
    injected = {INJECTED_BY: "preferences"}
    pre = [
        Message.assistant(ToolCall("p-2", "prefs", {}, meta=injected)),
        Message.tool(ToolResult("p-2", "short answers", meta=injected)),
    ]
    messages = (*exchange(1), *pre, *exchange(2))
    target = message_tokens([*pre, *exchange(2)], chars)
    assert drop_oldest()(messages, target, chars) == (noted(pre[0], 1), pre[1], *exchange(2))


@st.composite
def histories(draw) -> tuple[Message, ...]:
    messages: list[Message] = []
    summary_turns = 0
    for n in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            call = ToolCall(f"pre-{n}", "prefs", {}, meta={INJECTED_BY: "prefs"})
            messages += [
                Message.assistant(call),
                Message.tool(
                    ToolResult(
                        f"pre-{n}", "x" * draw(st.integers(0, 9)), meta={INJECTED_BY: "prefs"}
                    )
                ),
            ]
        messages.append(Message.user(f"q{n}" + "q" * draw(st.integers(0, 30))))
        for step in range(draw(st.integers(0, 2))):
            messages += [
                Message.assistant(ToolCall(f"c-{n}-{step}", "lookup", {"n": n})),
                Message.tool(ToolResult(f"c-{n}-{step}", "r" * draw(st.integers(0, 20)))),
            ]
        messages.append(Message.assistant(f"a{n}" + "a" * draw(st.integers(0, 30))))
        if draw(st.integers(0, 3)) == 0:
            summary_turns += draw(st.integers(1, 3))
            marker = {RUNNING_SUMMARY: {"turns": summary_turns, "through": "f"}, INJECTED_BY: "s"}
            messages.append(
                Message("user", (Text(f"s{n}" + "s" * draw(st.integers(0, 20)), meta=marker),))
            )
        if draw(st.integers(0, 5)) == 0:
            messages.append(Message.system(f"rule {n}"))
    return tuple(messages)


@settings(max_examples=300)
@given(messages=histories(), target=st.integers(0, 600))
def test_compaction_drops_oldest_turns_only_and_never_splits_a_call_from_its_result(
    messages, target
):
    view = drop_oldest()(messages, target, chars)
    # The first message may carry a note of the turns dropped; otherwise messages are as given.
    kept = (
        [
            attrs.evolve(
                view[0], meta={k: v for k, v in view[0].meta.items() if k != DROPPED_TURNS}
            ),
            *view[1:],
        ]
        if view
        else []
    )
    # What is left is the history with some messages taken out, in order.
    positions = iter(range(len(messages)))
    indexes = [next(i for i in positions if messages[i] == message) for message in kept]
    dropped = [i for i in range(len(messages)) if i not in indexes]
    # Every call keeps its result and every result its call.
    calls = {p.id for m in kept for p in m.parts if isinstance(p, ToolCall)}
    results = {p.call_id for m in kept for p in m.parts if isinstance(p, ToolResult)}
    assert calls == results
    # System messages and the latest summary are never dropped.
    summaries = [
        i for i, m in enumerate(messages) if any(RUNNING_SUMMARY in p.meta for p in m.parts)
    ]
    latest = max(
        summaries,
        key=lambda i: (messages[i].parts[0].meta[RUNNING_SUMMARY]["turns"], i),
        default=None,
    )
    protected = {i for i, m in enumerate(messages) if m.role == "system"} | ({latest} - {None})
    assert protected <= set(indexes)
    # The oldest go first: nothing dropped comes after an unprotected message that stays.
    survivors = [i for i in indexes if i not in protected]
    assert not survivors or not dropped or max(dropped) < min(survivors)
    # It fits, or there was nothing more it could drop.
    assert message_tokens(kept, chars) <= target or not survivors


KEEPS = {
    "tool messages": lambda message: message.role == "tool",
    "call messages": lambda message: any(isinstance(p, ToolCall) for p in message.parts),
    "every other": lambda message: len(message.text) % 2 == 0,
}


@settings(max_examples=200)
@given(messages=histories(), target=st.integers(0, 600), keep=st.sampled_from(sorted(KEEPS)))
def test_a_keep_that_accepts_one_half_of_a_tool_exchange_keeps_the_other(messages, target, keep):
    """`keep` accepting a tool message (or only the message making the call) kept it alone
    in a dropped turn: a result without its call, or a call without its result, which
    providers refuse."""
    view = drop_oldest(keep=KEEPS[keep])(messages, target, chars)
    calls = {p.id for m in view for p in m.parts if isinstance(p, ToolCall)}
    results = {p.call_id for m in view for p in m.parts if isinstance(p, ToolResult)}
    assert calls == results


async def test_in_a_pipeline_keeping_tool_results_sends_each_with_its_call():
    """The model was sent tool messages whose calls compaction had dropped."""
    model = ScriptedModel(["ok"])
    pipe = Pipeline(
        model=model,
        compact=drop_oldest(keep=KEEPS["tool messages"]),
        budget=Budget(context_tokens=60, injection_reserve=10),
    )
    messages = [m for n in (1, 2, 3) for m in exchange(n, tool=True)]

    await pipe.run(Turn.start("question 4", context=Context(messages=messages)))

    sent = model.requests[0].messages
    # Every turn is dropped but for the tool messages kept, each with the call it answers.
    assert [m.role for m in sent] == [*("assistant", "tool") * 3, "user"]
    calls = [p.id for m in sent for p in m.parts if isinstance(p, ToolCall)]
    results = [p.call_id for m in sent for p in m.parts if isinstance(p, ToolResult)]
    assert calls == results == ["call-1", "call-2", "call-3"]


def test_the_first_message_kept_notes_how_many_uncovered_turns_were_dropped():
    messages = tuple(history(1, 2, 3, 4))
    view = drop_oldest()(messages, message_tokens(history(3, 4), chars), chars)
    assert [m.text for m in view] == ["question 3", "answer 3", "question 4", "answer 4"]
    assert view[0].meta == {DROPPED_TURNS: 2}
    assert messages[4].meta == {}  # the history given is not changed


async def test_turns_a_summary_covers_are_not_noted_when_dropped():
    summary = as_logged(
        (await running_summary(ScriptedModel(["S."]), every=2)(answered(2, history(1)))).value
    )
    messages = (*history(1, 2), summary, *history(3, 4))
    view = drop_oldest()(messages, message_tokens([summary, *history(4)], chars), chars)
    assert view == (attrs.evolve(summary, meta={DROPPED_TURNS: 1}), *history(4))


async def test_the_summary_counts_the_turns_compaction_dropped():
    seen = history(3, 4)
    seen[0] = attrs.evolve(seen[0], meta={DROPPED_TURNS: 2})
    model = ScriptedModel(["S."])
    result = await running_summary(model, every=5)(answered(5, seen))
    assert result.value.injections[0].parts[0].meta[RUNNING_SUMMARY]["turns"] == 5


async def test_a_late_turn_is_counted_when_the_turn_before_it_was_compacted_away():
    first = as_logged(
        (await running_summary(ScriptedModel(["S1."]), every=3)(answered(3, history(1, 2)))).value
    )
    full = [*history(1, 2, 3, 4), first, *history(5)]
    view = drop_oldest()(
        tuple(full), message_tokens([*history(4), first, *history(5)], chars), chars
    )
    assert [m.text for m in view] == [
        "question 4",
        "answer 4",
        first.text,
        "question 5",
        "answer 5",
    ]
    model = ScriptedModel(["S2."])
    result = await running_summary(model, every=3)(answered(6, list(view)))
    assert result.value.injections[0].parts[0].meta[RUNNING_SUMMARY]["turns"] == 6
    assert "question 4" in model.requests[0].messages[-1].text


def test_keep_must_be_a_predicate():
    with pytest.raises(ConfigError, match=r"drop_oldest\(keep="):
        drop_oldest(keep="pinned")  # type: ignore[arg-type]


def test_a_keep_that_takes_no_message_is_refused_when_built():
    """Catches: keep=lambda: True accepted, then failing the turn when compaction ran."""
    with pytest.raises(ConfigError, match=r"drop_oldest\(keep=.*1 argument"):
        drop_oldest(keep=lambda: True)  # type: ignore[arg-type]


async def test_in_a_session_the_model_sees_the_summary_and_the_latest_turns_the_log_keeps_all():
    model = answers(7)
    summarizer = ScriptedModel(["Ada asked six questions."])
    pipe = Pipeline(
        model=model,
        post=[running_summary(summarizer, every=6)],
        compact=drop_oldest(),
        budget=Budget(context_tokens=70, injection_reserve=10),
    )
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        for n in range(1, 8):
            await session.send(f"question {n}")
            await anyio.wait_all_tasks_blocked()
    # Turn 7 is answered from the latest turns and the summary; turns 1-3 were dropped.
    assert [message.text for message in model.requests[-1].messages] == [
        *("question 4", "answer 4", "question 5", "answer 5", "question 6", "answer 6"),
        HEADING + "Ada asked six questions.",
        "question 7",
    ]
    assert len((await log.load("c")).messages) == 7 * 2 + 1


async def test_a_compactor_the_pipeline_runs_is_named_drop_oldest():
    pipe = Pipeline(model=ScriptedModel(["ok"]), compact=drop_oldest(), budget=Budget(1000, 100))
    async with pipe.stream(Turn.start("hi", context=Context(messages=history(1)))) as events:
        seen = [event async for event in events]
    assert [(e.hook, e.stage) for e in seen if isinstance(e, ev.HookFinished)] == [
        ("drop_oldest", "compact")
    ]


async def test_a_predicate_that_raises_fails_the_turn():
    def broken(message: Message) -> bool:
        raise KeyError("pinned")

    pipe = Pipeline(
        model=ScriptedModel(["ok"]), compact=drop_oldest(keep=broken), budget=Budget(30, 10)
    )
    with pytest.raises(HookFailed) as info:
        await pipe.run(Turn.start("hi", context=Context(messages=history(1, 2, 3))))
    assert info.value.hook == "drop_oldest"


async def test_an_empty_summary_names_the_model_and_what_to_check():
    """Catches: a failure that does not say which model answered nothing, nor what happens
    to the turns it should have summarized."""
    model = ScriptedModel(["  "])
    with pytest.raises(ValueError, match="no text") as excinfo:
        await running_summary(model, every=1)(answered(1, []))
    assert repr(model) in str(excinfo.value)
    assert "next summary covers these turns" in str(excinfo.value)
