"""Token budgets: Budget, token counting, InjectionOverflow, ContextOverflow and compact=."""

import inspect
import math

import anyio
import attrs
import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given, settings

from pipeline import (
    Budget,
    BudgetError,
    ConfigError,
    ContextOverflow,
    HookFailed,
    HookReturnError,
    InjectionOverflow,
    Pipeline,
    cont,
    estimate_tokens,
    hook,
    message_tokens,
    parallel,
    regenerate,
    tool,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Context, Message, Text, ToolCall, ToolResult, Turn

from .support import collect

BIG = 10_000
"""A context limit no test's request comes near, for tests about the injection reserve."""


def words(text):
    """A tokenizer that counts whitespace-separated words."""
    return len(text.split())


def injecting(name, text, **options):
    """An ordered hook that injects `text`."""

    async def run(turn):
        return cont(turn.inject(Text(text)))

    return hook(run, name=name, **options)


def member(name, text, *, delay=0):
    """A parallel member that adds `text` after `delay` seconds."""

    async def run(turn):
        await anyio.sleep(delay)
        return [Text(text)]

    return hook(run, name=name)


def tokens_of(n):
    """Text the default tokenizer counts as exactly `n` tokens."""
    return "x" * (4 * n)


def build(*pre, budget, model=None, **options):
    return Pipeline(model=model or ScriptedModel(["ok"]), pre=list(pre), budget=budget, **options)


# -- Budget ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("context_tokens", "injection_reserve", "field"),
    [
        pytest.param(0, 10, "context_tokens", id="context-zero"),
        pytest.param(-100, 10, "context_tokens", id="context-negative"),
        pytest.param(True, 10, "context_tokens", id="context-bool"),
        pytest.param(100.0, 10, "context_tokens", id="context-float"),
        pytest.param(100, 0, "injection_reserve", id="reserve-zero"),
        pytest.param(100, -1, "injection_reserve", id="reserve-negative"),
        pytest.param(100, True, "injection_reserve", id="reserve-bool"),
        pytest.param(100, "10", "injection_reserve", id="reserve-str"),
    ],
)
def test_budget_rejects_a_value_that_is_not_a_positive_int(
    context_tokens, injection_reserve, field
):
    with pytest.raises(ConfigError, match=field):
        Budget(context_tokens, injection_reserve)


@pytest.mark.parametrize(("context_tokens", "injection_reserve"), [(100, 100), (100, 150)])
def test_budget_rejects_a_reserve_that_leaves_no_room_for_the_history(
    context_tokens, injection_reserve
):
    with pytest.raises(ConfigError, match="injection_reserve"):
        Budget(context_tokens, injection_reserve)


# -- counting ----------------------------------------------------------------------------------


@given(st.text())
def test_estimate_tokens_is_characters_over_four_rounded_up(text):
    assert estimate_tokens(text) == math.ceil(len(text) / 4)


@given(st.lists(st.lists(st.text(alphabet="ab \n", max_size=12), max_size=4), max_size=5))
def test_message_tokens_adds_four_per_message(texts):
    messages = [Message.user([Text(t) for t in parts]) for parts in texts]
    expected = sum(4 + sum(words(t) for t in parts) for parts in texts)
    assert message_tokens(messages, words) == expected


@pytest.mark.parametrize(
    ("tokenizer", "expected"),
    [pytest.param(None, 3, id="default"), pytest.param(words, 4, id="words")],
)
async def test_injected_event_counts_tokens_with_the_pipelines_tokenizer(tokenizer, expected):
    # "ab cd ef gh" is 11 characters (3 estimated tokens) and 4 words.
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), pre=[injecting("note", "ab cd ef gh")], tokenizer=tokenizer
    )
    events, _ = await collect(pipe, Turn.start("hi"))
    assert [e.tokens for e in events if isinstance(e, ev.Injected)] == [expected]


# -- InjectionOverflow -------------------------------------------------------------------------


async def test_injection_overflow_carries_the_hook_its_tokens_and_the_reserve():
    pipe = build(injecting("big", tokens_of(12)), budget=Budget(BIG, 10))
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert (info.value.hook, info.value.tokens, info.value.reserve) == ("big", 12, 10)


async def test_injection_overflow_names_the_first_hook_pushing_the_total_over():
    pipe = build(
        injecting("a", tokens_of(8)),
        injecting("b", tokens_of(8)),
        injecting("c", tokens_of(8)),
        budget=Budget(BIG, 10),
    )
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "b"


async def test_injection_overflow_tokens_are_the_hooks_own_and_total_is_the_turns():
    pipe = build(injecting("a", tokens_of(8)), injecting("b", tokens_of(5)), budget=Budget(BIG, 10))
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert (info.value.hook, info.value.tokens, info.value.total) == ("b", 5, 13)


async def test_one_hooks_several_injections_are_charged_together():
    async def twice(turn):
        return cont(turn.inject(tokens_of(6)).inject(tokens_of(6)))

    pipe = build(hook(twice, name="twice"), budget=Budget(BIG, 10))
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert (info.value.hook, info.value.tokens, info.value.total) == ("twice", 12, 12)


async def test_injection_overflow_message_names_the_hook():
    pipe = build(injecting("a", tokens_of(8)), injecting("b", tokens_of(8)), budget=Budget(BIG, 10))
    with pytest.raises(InjectionOverflow, match=r"'b' \(pre, position 2\)"):
        await pipe.run(Turn.start("hi"))


async def test_injection_overflow_reaches_no_model():
    model = ScriptedModel(["ok"])
    pipe = build(injecting("big", tokens_of(12)), budget=Budget(BIG, 10), model=model)
    with pytest.raises(InjectionOverflow):
        await pipe.run(Turn.start("hi"))
    assert model.requests == []


async def test_injections_exactly_at_the_reserve_are_allowed():
    pipe = build(injecting("a", tokens_of(4)), injecting("b", tokens_of(6)), budget=Budget(BIG, 10))
    result = await pipe.run(Turn.start("hi"))
    assert result.outcome == "completed"


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.integers(1, 60))
def test_overflow_names_the_first_hook_whose_injection_crosses_the_reserve(sizes, reserve):
    names = [f"h{i}" for i in range(len(sizes))]
    pipe = build(
        *(injecting(n, tokens_of(s)) for n, s in zip(names, sizes, strict=True)),
        budget=Budget(BIG, reserve),
    )
    totals = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    culprit = next((n for n, total in zip(names, totals, strict=True) if total > reserve), None)

    async def main():
        try:
            await pipe.run(Turn.start("hi"))
        except InjectionOverflow as exc:
            return (exc.hook, exc.reserve)
        return None

    assert trio.run(main) == (None if culprit is None else (culprit, reserve))


@pytest.mark.parametrize(
    ("reserve", "culprit"),
    [
        pytest.param(7, "a", id="first"),
        pytest.param(10, "b", id="second"),
        pytest.param(20, "c", id="third"),
    ],
)
async def test_overflow_in_a_group_names_the_member_by_declaration_order(
    autojump_clock, reserve, culprit
):
    # The members finish in reverse declaration order; each adds 8 tokens.
    group = parallel(
        member("a", tokens_of(8), delay=3),
        member("b", tokens_of(8), delay=2),
        member("c", tokens_of(8), delay=1),
    )
    pipe = build(group, budget=Budget(BIG, reserve))
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == culprit


async def test_overflow_in_a_group_message_names_the_member(autojump_clock):
    group = parallel(member("a", tokens_of(8), delay=2), member("b", tokens_of(8), delay=1))
    pipe = build(group, budget=Budget(BIG, 10))
    with pytest.raises(InjectionOverflow, match=r"'b' \(pre, position 1\.2\)"):
        await pipe.run(Turn.start("hi"))


async def test_overflow_in_a_group_reaches_no_model(autojump_clock):
    model = ScriptedModel(["ok"])
    group = parallel(member("a", tokens_of(8)), member("b", tokens_of(8)))
    pipe = build(group, budget=Budget(BIG, 10), model=model)
    with pytest.raises(InjectionOverflow):
        await pipe.run(Turn.start("hi"))
    assert model.requests == []


async def test_injection_reserve_is_counted_with_a_custom_tokenizer():
    # 6 words but 11 characters: the default estimate (3 tokens) would fit the reserve.
    pipe = build(injecting("note", "a b c d e f"), budget=Budget(BIG, 5), tokenizer=words)
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert (info.value.hook, info.value.tokens) == ("note", 6)


# -- ContextOverflow ---------------------------------------------------------------------------


HISTORY_OF_3 = tuple(Message.user("x" * 100) for _ in range(3))
"""Three messages of 29 tokens each."""


def long_history_turn():
    # History: 100 characters (25 tokens + 4); user message "hi" (1 token + 4): 34 in all.
    return Turn.start("hi", context=Context(messages=(Message.user("x" * 100),)))


async def test_context_overflow_carries_the_tokens_and_the_limit():
    pipe = build(budget=Budget(20, 5))
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(long_history_turn())
    assert (info.value.tokens, info.value.limit) == (34, 20)


async def test_context_overflow_reaches_no_model():
    model = ScriptedModel(["ok"])
    pipe = build(budget=Budget(20, 5), model=model)
    with pytest.raises(ContextOverflow):
        await pipe.run(long_history_turn())
    assert model.requests == []


async def test_request_exactly_at_context_tokens_is_sent():
    model = ScriptedModel(["ok"])
    pipe = build(budget=Budget(34, 5), model=model)
    result = await pipe.run(long_history_turn())
    assert (result.outcome, len(model.requests)) == ("completed", 1)


async def test_context_check_counts_the_system_prompt_and_the_injections():
    # System "y" * 8 (2 + 4); user message with 15 injected tokens and "hi" (15 + 1 + 4): 26.
    pipe = build(injecting("note", tokens_of(15)), budget=Budget(20, 15), system="y" * 8)
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.tokens == 26


async def test_context_check_counts_with_a_custom_tokenizer():
    # 10 words (+4) but 19 characters: the default estimate (5 + 4) would fit the limit.
    pipe = build(budget=Budget(12, 1), tokenizer=words)
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("a b c d e f g h i j"))
    assert info.value.tokens == 14


async def test_a_system_prompt_over_the_budget_alone_is_named_not_blamed_on_the_history():
    """Bug caught: a system prompt larger than context_tokens on its own was told to compact
    the history or inject less, though the turn had neither and nothing could make room."""
    # System "y" * 400 (100 + 4); user message "hi" (1 + 4): 109, over 50 with no history.
    pipe = build(budget=Budget(50, 5), system="y" * 400, compact=lambda h, target, count: h)
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi"))
    message = str(info.value)
    assert "the system prompt (104) and the turn's own message (5) alone hold 109" in message
    assert message.endswith("raise context_tokens, or shorten the system prompt")


async def test_a_message_over_the_budget_alone_is_named():
    """Bug caught: a user message larger than context_tokens on its own was told to compact
    the history or inject less, which cannot make room for it."""
    pipe = build(budget=Budget(50, 5))
    with pytest.raises(ContextOverflow, match=r"shorten the turn's own message$") as info:
        await pipe.run(Turn.start("x" * 400))
    assert "the turn's own message (104) alone holds 104 of them" in str(info.value)


async def test_a_history_over_the_budget_is_still_told_to_compact():
    pipe = build(budget=Budget(20, 5))
    with pytest.raises(ContextOverflow, match=r"compact the history \(compact=\) or inject less$"):
        await pipe.run(long_history_turn())


async def test_a_compactor_leaving_the_history_over_its_target_is_named():
    """Bug caught: a compact= that left the history over its target was told to compact the
    history (compact=), naming neither the compactor nor how far over its target it was."""

    def keep_all(history, target, tokenizer):
        return history

    pipe = build(budget=Budget(20, 5), compact=keep_all)
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(long_history_turn())
    assert str(info.value).endswith(
        "the history sent holds 29 tokens, over the target of 15 given to compact="
        " 'test_a_compactor_leaving_the_history_over_its_target_is_named.keep_all' — have it"
        " drop or summarize more"
    )


async def test_a_history_a_pre_hook_put_back_after_the_compactor_names_the_hook():
    """Bug caught: a pre hook that widened the history again after compact= met its target
    was not named, and the compactor was told to drop or summarize more."""
    given = tuple(Message.user("x" * 100) for _ in range(3))  # 29 tokens each

    def keep_last(history, target, tokenizer):
        return history[-1:]

    async def recall(turn):
        view = attrs.evolve(turn.context, messages=given + turn.context.messages)
        return cont(attrs.evolve(turn, context=view))

    pipe = build(hook(recall, name="recall"), budget=Budget(100, 5), compact=keep_last)
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi", context=Context(messages=given)))
    message = str(info.value)
    assert "the history sent holds 116 tokens, over the target of 95" in message
    assert "which returned 29; hook 'recall' (pre, position 1) replaced the history" in message
    assert "drop or summarize more" not in message


async def test_a_compactor_that_failed_open_is_said_to_have_failed():
    """Bug caught: a compact= with on_error="skip" that raised was told to drop or summarize
    more, as if the uncompacted history sent were its own."""

    def failing(history, target, tokenizer):
        raise RuntimeError("summarizer down")

    pipe = build(budget=Budget(20, 5), compact=hook(failing, on_error="skip"))
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(long_history_turn())
    message = str(info.value)
    assert "the compactor failed this turn and, failing open (on_error='skip')" in message
    assert "over the target of 15 given to compact= 'test_a_compactor_that_failed" in message
    assert "drop or summarize more" not in message


async def test_a_history_within_the_compact_target_says_what_the_target_leaves_out():
    """Bug caught: a request over context_tokens with the history within the target of
    compact= was told to compact the history or inject less, though the system prompt the
    target does not count was what went over."""

    def keep_last(history, target, tokenizer):
        return history[-1:]

    # System "s" * 280 (70 + 4), own message "hi" (1 + 4), history kept 29: 108 over 100.
    pipe = build(budget=Budget(100, 5), system="s" * 280, compact=keep_last)
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi", context=Context(messages=HISTORY_OF_3)))
    message = str(info.value)
    assert "the history sent holds 29 tokens, within the target of 95" in message
    assert "the system prompt (74) and the turn's own message (5) add 79" in message
    assert "shorten the system prompt" in message
    assert "compact the history (compact=) or inject less" not in message


async def test_a_regeneration_over_the_budget_names_the_rejected_reply_and_feedback():
    """Bug caught: a regeneration whose rejected reply and feedback pushed the request over
    context_tokens blamed the compactor or the injections, which cannot make room for them."""
    judged = []

    async def judge(turn):
        judged.append(turn.reply.text)
        return regenerate("too long, " + "please shorten " * 10) if len(judged) == 1 else cont(turn)

    for reserve in (5, 15):  # the history within its target of 35; over its target of 25
        judged.clear()
        model = ScriptedModel(["y" * 40, "ok"])
        pipe = Pipeline(
            model=model,
            post=[hook(judge, name="judge")],
            budget=Budget(40, reserve),
            compact=lambda h, target, count: h,
        )
        with pytest.raises(ContextOverflow) as info:
            await pipe.run(long_history_turn())
        message = str(info.value)
        assert "the feedback of hook 'judge' this regeneration shows" in message
        assert "compact" not in message


async def test_a_context_overflow_after_a_tool_step_names_the_tool_results() -> None:
    """Bug caught: a tool step whose results outgrew context_tokens was told to compact the
    history or inject less, which cannot make room for them, and named no tool result."""

    async def lookup(city: str) -> str:
        return tokens_of(1) if city == "a" else tokens_of(500)

    batch = [ToolCall("c1", "lookup", {"city": "a"}), ToolCall("c2", "lookup", {"city": "b"})]
    pipe = build(budget=Budget(400, 5), model=ScriptedModel([batch, "ok"]), tools=[tool(lookup)])

    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi"))

    message = str(info.value)
    assert "the tool results just added hold 501 of them (call 'c2' the most, 500)" in message
    assert "compact" not in message


async def test_a_context_overflow_after_a_tool_step_names_the_models_own_message() -> None:
    """Bug caught: a request that outgrew context_tokens with the model's own long call
    arguments was blamed on a 1-token tool result, advising tools to return less."""

    async def lookup(city: str) -> str:
        return tokens_of(1)

    batch = [ToolCall("c1", "lookup", {"city": tokens_of(500)})]
    pipe = build(budget=Budget(400, 5), model=ScriptedModel([batch, "ok"]), tools=[tool(lookup)])

    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi"))

    message = str(info.value)
    assert "the model's own message of this tool step holds" in message
    assert "call 'c1' the most" in message
    assert "have the tools return less" not in message


# -- compact= ----------------------------------------------------------------------------------

HISTORY = (Message.user("an old question"), Message.assistant("an old answer"))
SUMMARY = (Message.user("summary of earlier talk"),)


def compactor(result, calls, *, is_async):
    """A compact callable (sync or async) that records its arguments and returns `result`."""
    if is_async:

        async def shrink_async(history, target, tokenizer):
            calls.append((history, target, tokenizer))
            return result

        return shrink_async

    def shrink(history, target, tokenizer):
        calls.append((history, target, tokenizer))
        return result

    return shrink


def history_turn():
    return Turn.start("hi", context=Context(messages=HISTORY))


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_compact_receives_the_history_the_target_and_the_tokenizer(is_async):
    calls = []
    pipe = build(
        budget=Budget(100, 30),
        tokenizer=words,
        compact=compactor(SUMMARY, calls, is_async=is_async),
    )
    await pipe.run(history_turn())
    assert calls == [(HISTORY, 70, words)]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_model_sees_the_compacted_history(is_async):
    model = ScriptedModel(["ok"])
    pipe = build(
        budget=Budget(100, 30), compact=compactor(SUMMARY, [], is_async=is_async), model=model
    )
    await pipe.run(history_turn())
    assert model.requests[0].messages == (*SUMMARY, Message.user("hi"))


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_result_turn_context_holds_the_compacted_view(is_async):
    pipe = build(budget=Budget(100, 30), compact=compactor(SUMMARY, [], is_async=is_async))
    result = await pipe.run(history_turn())
    assert result.turn.context.messages == SUMMARY


async def test_compact_runs_before_the_pre_hooks():
    seen = []

    async def look(turn):
        seen.append(turn.context.messages)
        return cont(turn)

    pipe = build(
        hook(look, name="look"),
        budget=Budget(100, 30),
        compact=compactor(SUMMARY, [], is_async=False),
    )
    await pipe.run(history_turn())
    assert seen == [SUMMARY]


async def test_context_check_counts_the_compacted_history():
    # The uncompacted request (34 tokens, see long_history_turn) would overflow 20.
    pipe = build(budget=Budget(20, 5), compact=compactor(SUMMARY, [], is_async=False))
    result = await pipe.run(long_history_turn())
    assert result.outcome == "completed"


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param("a summary", id="str"),
        pytest.param(None, id="none"),
        pytest.param(Message.user("a summary"), id="single-message"),
        pytest.param(["a summary"], id="list-of-str"),
        pytest.param((SUMMARY[0], Text("loose part")), id="message-and-part"),
    ],
)
async def test_compact_returning_a_wrong_type_fails_naming_it(wrong):
    pipe = build(budget=Budget(100, 30), compact=compactor(wrong, [], is_async=False))
    with pytest.raises(HookReturnError, match="shrink"):
        await pipe.run(history_turn())


async def test_compact_returning_a_coroutine_it_forgot_to_await_is_told_to_await_it():
    """Bug: an async compact= that returned a summarizer's coroutine without awaiting it got
    no hint, and the coroutine was left to warn "never awaited" after the error."""
    made = []

    async def summarize(history):
        return SUMMARY

    async def shrink(history, target, tokenizer):
        coroutine = summarize(history)
        made.append(coroutine)
        return coroutine

    pipe = build(budget=Budget(100, 30), compact=shrink)
    with pytest.raises(HookReturnError, match=r"\.shrink' \(compact.*forget `await`"):
        await pipe.run(history_turn())
    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED]


async def test_compact_that_raises_fails_with_the_original_as_cause():
    original = RuntimeError("summarizer down")

    def shrink(history, target, tokenizer):
        raise original

    model = ScriptedModel(["ok"])
    pipe = build(budget=Budget(100, 30), compact=shrink, model=model)
    with pytest.raises(HookFailed, match="shrink") as info:
        await pipe.run(history_turn())
    assert (info.value.__cause__, model.requests) == (original, [])


EXCHANGE = (
    Message.user("where is order 42?"),
    Message.assistant([ToolCall("c1", "lookup", {"order": "42"})]),
    Message.tool(ToolResult("c1", "shipped")),
    Message.assistant("It shipped."),
)


@pytest.mark.parametrize(
    ("kept", "culprit"),
    [
        pytest.param(EXCHANGE[2:], "holds a result for call 'c1'", id="result-without-call"),
        pytest.param(EXCHANGE[:2], r"tool calls \['c1'\] .* get no result", id="call-alone"),
    ],
)
async def test_compact_that_parts_a_tool_call_from_its_result_fails_naming_it(kept, culprit):
    """Bug caught: a compact= that dropped a tool call but kept its result (or the reverse)
    was sent as a request every provider refuses, failing as a provider error naming no hook."""

    def shrink(history, target, tokenizer):
        return kept

    model = ScriptedModel(["ok"])
    pipe = build(budget=Budget(1000, 100), compact=shrink, model=model)
    turn = Turn.start("and order 43?", context=Context(messages=EXCHANGE))
    with pytest.raises(HookReturnError, match=rf"\.shrink' \(compact.*{culprit}") as info:
        await pipe.run(turn)
    assert (info.value.stage, model.requests) == ("compact", [])


async def test_compact_dropping_the_call_the_turns_own_message_answers_says_to_keep_it():
    """Bug caught: a compact= that dropped the call the turn's own tool message answers was
    told to keep or drop the exchange together, though the turn's message cannot be dropped."""

    def summarize(history, target, tokenizer):
        return (Message.user("summary: the user asked about order 5"),)

    history = (Message.user("5?"), Message.assistant([ToolCall("c5", "lookup", {})]))
    own = Message("tool", (ToolResult("c5", "shipped"),))
    pipe = build(budget=Budget(1000, 10), compact=summarize)
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start(own, context=Context(messages=history)))
    message = str(info.value)
    assert "the turn's own message holds a result for call 'c5'" in message
    assert message.endswith(
        "keep the last assistant message with its tool calls, which the turn's own message answers"
    )


async def test_tool_specs_over_the_budget_alone_point_to_active_tools():
    """Bug caught: tool specs over context_tokens on their own were only told to be
    shortened, though active_tools= narrows them for the turn."""

    def lookup(order: str) -> str:
        """Look an order up."""
        return order

    lookup.__doc__ = "Look an order up. " * 100
    pipe = build(budget=Budget(100, 5), tools=[tool(lookup)])
    with pytest.raises(ContextOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert str(info.value).endswith(
        "shorten the tool specs (or narrow them for the turn with active_tools=)"
    )


WINDOWED = (Message.tool(ToolResult("c0", "stale")), *EXCHANGE)
"""A log cut to its last messages: it starts with a result whose call was cut off."""

RESULTS_IN_A_USER_MESSAGE = (
    Message.user("where is order 41?"),
    Message.assistant([ToolCall("c0", "lookup", {"order": "41"})]),
    Message("user", (ToolResult("c0", "shipped"),)),
    *EXCHANGE,
)
"""Anthropic's shape: the results of a call sit in the user message after it."""


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(WINDOWED, id="windowed"),
        pytest.param(RESULTS_IN_A_USER_MESSAGE, id="results-in-a-user-message"),
    ],
)
async def test_compact_splitting_an_exchange_of_a_history_split_or_shaped_elsewhere_fails(given):
    """Bug caught: a history that began with a stray result, or carried results in a user
    message, turned the check off, so a compact= dropping call c1 but keeping its result was
    sent as a request every provider refuses."""

    def drop_call(history, target, tokenizer):
        return tuple(m for m in history if EXCHANGE[1] != m)

    model = ScriptedModel(["ok"])
    pipe = build(budget=Budget(1000, 100), compact=drop_call, model=model)
    turn = Turn.start("and order 43?", context=Context(messages=given))
    with pytest.raises(HookReturnError, match=r"drop_call' \(compact.*result for call 'c1'"):
        await pipe.run(turn)
    assert model.requests == []


async def test_compact_keeping_whole_exchanges_and_a_broken_history_it_was_given_pass():
    """A compactor is blamed only for a split it made: a stray result it was handed and keeps
    is let through. Bug caught: its compactor dropped the stray result, so a check refusing
    every split, handed or made, passed it."""

    def drop_first_question(history, target, tokenizer):
        first = next(i for i, m in enumerate(history) if m.role == "user")
        return history[:first] + history[first + 1 :]

    model = ScriptedModel(["ok", "ok"])
    pipe = build(budget=Budget(1000, 100), compact=drop_first_question, model=model)
    await pipe.run(Turn.start("next", context=Context(messages=EXCHANGE)))
    await pipe.run(Turn.start("next", context=Context(messages=WINDOWED)))
    assert [len(request.messages) for request in model.requests] == [4, 5]
    assert model.requests[1].messages[0] == WINDOWED[0]


async def test_compact_returning_a_split_history_as_it_was_given_passes():
    """Bug caught: a compactor returning the very history it was handed (the common "already
    under target" branch) on a log cut to its last messages was refused as having split it,
    though every broken call in it was the history's own."""

    def unchanged(history, target, tokenizer):
        return history

    model = ScriptedModel(["ok"])
    pipe = build(budget=Budget(1000, 100), compact=unchanged, model=model)
    await pipe.run(Turn.start("next", context=Context(messages=WINDOWED)))
    assert model.requests[0].messages[: len(WINDOWED)] == WINDOWED


# -- the tokenizer ------------------------------------------------------------------------------


def test_a_tokenizer_that_does_not_return_a_count_is_rejected_when_built():
    def encode(text):
        return text.split()  # a token list, as tiktoken's encode returns

    with pytest.raises(ConfigError, match=r"tokenizer=\S*encode\).*str -> int.*list"):
        Pipeline(model=ScriptedModel(["ok"]), tokenizer=encode)


async def test_a_tokenizer_that_fails_mid_turn_is_a_budget_error_naming_it():
    def picky(text):
        if "boom" in text:
            raise ValueError("cannot count this")
        return len(text)

    pipe = build(injecting("loud", "boom"), budget=Budget(BIG, 100), tokenizer=picky)
    with pytest.raises(BudgetError, match=r"tokenizer .*picky.*ValueError: cannot count this"):
        await pipe.run(Turn.start("hi"))


async def test_compaction_is_recorded_in_the_audit_and_the_events(autojump_clock):
    async def keep_last(history, target, tokenizer):
        await anyio.sleep(2)
        return history[-1:]

    pipe = build(budget=Budget(1000, 10), compact=keep_last)
    turn = Turn.start("hi", context=Context(messages=HISTORY))
    events, result = await collect(pipe, turn)
    assert [
        (r.hook.rsplit(".")[-1], r.stage, r.verdict, r.elapsed) for r in result.audit.hooks
    ] == [("keep_last", "compact", "cont", 2)]
    assert [(type(e).__name__, e.stage) for e in events if hasattr(e, "stage")][:2] == [
        ("HookStarted", "compact"),
        ("HookFinished", "compact"),
    ]


async def drive(mode, pipe, turn):
    """Run `turn` with ``pipe.run`` or ``pipe.stream``, as `mode` says."""
    if mode == "run":
        return await pipe.run(turn)
    return await collect(pipe, turn)


@pytest.mark.parametrize("mode", ["run", "stream"])
async def test_a_tokenizer_failing_on_injected_text_fails_run_and_stream_alike(mode):
    # No budget and no listener in run(): the tokenizer still counts what was injected, so
    # a turn fails or succeeds the same way whichever way it is driven.
    def picky(text):
        if "secret" in text:
            raise ValueError("cannot count this")
        return len(text)

    pipe = Pipeline(
        model=ScriptedModel(["ok"]), pre=[injecting("note", "a secret note")], tokenizer=picky
    )
    with pytest.raises(BudgetError, match="picky"):
        await drive(mode, pipe, Turn.start("hi"))


@pytest.mark.parametrize("context_tokens", [0, -5, True])
def test_budget_rejects_a_context_size_that_is_not_a_positive_int(context_tokens):
    with pytest.raises(ConfigError, match=r"Budget\.context_tokens must be a positive int"):
        Budget(context_tokens, 10)
