"""The ordered pre-hook runner, driven through Pipeline.run and Pipeline.stream."""

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any

import anyio
import attrs
import pytest
import trio

from pipeline import (
    Halt,
    HookFailed,
    HookRecord,
    HookReturnError,
    HookTimeout,
    Pipeline,
    block,
    chain,
    cont,
    halt,
    hook,
    parallel,
    regenerate,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Context, Injection, Message, Text, ToolCall, ToolResult, Turn

from .support import collect_into, live_tasks

# -- helpers --------------------------------------------------------------------------------


def scripted(*replies: str) -> ScriptedModel:
    return ScriptedModel(list(replies) or ["Hello"])


def tracer(trace: list[str], label: str, **options):
    """A sync pre hook that records `label` and continues unchanged."""

    def record(turn):
        trace.append(label)
        return cont(turn)

    return hook(record, name=label, **options)


def async_tracer(trace: list[str], label: str, **options):
    """An async pre hook that records `label` and continues unchanged."""

    async def record(turn):
        await anyio.lowlevel.checkpoint()
        trace.append(label)
        return cont(turn)

    return hook(record, name=label, **options)


def halter(label: str, reason: str = "not allowed", reply=None, **options):
    def stop(turn):
        return halt(reason, reply=reply)

    return hook(stop, name=label, **options)


def injector(label: str, *texts: str, **options):
    def add(turn):
        return cont(turn.inject(*texts))

    return hook(add, name=label, **options)


def raiser(label: str, error: Exception, **options):
    def fail(turn):
        raise error

    return hook(fail, name=label, **options)


def returning(label: str, make, **options):
    """A pre hook that returns `make(turn)` (usually something wrong)."""

    def wrong(turn):
        return make(turn)

    return hook(wrong, name=label, **options)


async def streamed(pipe: Pipeline, turn: Turn):
    """Every event of a streamed turn, and its result."""
    async with pipe.stream(turn) as events:
        seen = [event async for event in events]
    return seen, events.result


async def streamed_until(pipe: Pipeline, turn: Turn, error: type[BaseException]):
    """The events a streamed turn produced before it raised `error`, and the error."""
    seen = []

    with pytest.raises(error) as raised:
        await collect_into(seen, pipe, turn)
    return seen, raised.value


def kinds(events) -> list[tuple[str, str | None]]:
    """Events as (type name, hook name or None), for asserting whole traces."""
    return [(type(event).__name__, getattr(event, "hook", None)) for event in events]


def of_type(events, kind):
    return [event for event in events if type(event) is kind]


def all_tasks() -> set[object]:
    return live_tasks()


# -- ordering and threading -----------------------------------------------------------------


async def test_sync_and_async_pre_hooks_run_in_list_order() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[
            tracer(trace, "one"),
            async_tracer(trace, "two"),
            tracer(trace, "three"),
            async_tracer(trace, "four"),
        ],
    )

    await pipe.run(Turn.start("hi"))

    assert trace == ["one", "two", "three", "four"]


async def test_each_pre_hook_receives_the_turn_the_previous_one_returned() -> None:
    seen: list[dict[str, object]] = []

    def assigner(key: str, value: int, *, is_async: bool):
        if is_async:

            async def assign(turn):
                seen.append(dict(turn.scope.assigns))
                return cont(turn.assign(**{key: value}))

        else:

            def assign(turn):
                seen.append(dict(turn.scope.assigns))
                return cont(turn.assign(**{key: value}))

        return hook(assign, name=key)

    pipe = Pipeline(
        model=scripted(),
        pre=[
            assigner("a", 1, is_async=False),
            assigner("b", 2, is_async=True),
            assigner("c", 3, is_async=False),
        ],
    )

    await pipe.run(Turn.start("hi"))

    assert seen == [{}, {"a": 1}, {"a": 1, "b": 2}]


async def test_the_result_turn_is_the_turn_the_last_pre_hook_returned() -> None:
    def first(turn):
        return cont(turn.assign(user="ada"))

    async def second(turn):
        return cont(turn.assign(plan="pro"))

    pipe = Pipeline(model=scripted(), pre=[first, second])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.scope.assigns == {"user": "ada", "plan": "pro"}


async def test_the_model_is_sent_the_request_the_pre_hooks_shaped() -> None:
    def cool(turn):
        return cont(turn.with_request(temperature=0.2))

    def limit(turn):
        return cont(turn.with_request(max_tokens=64))

    model = scripted()
    pipe = Pipeline(model=model, pre=[cool, limit])

    await pipe.run(Turn.start("hi"))

    options = model.requests[0].options
    assert (options.temperature, options.max_tokens) == (0.2, 64)


async def test_a_pre_hook_sees_the_pipeline_system_prompt_in_the_context() -> None:
    seen: list[str | None] = []

    def look(turn):
        seen.append(turn.context.system)
        return cont(turn)

    pipe = Pipeline(model=scripted(), pre=[look], system="Be brief.")

    await pipe.run(Turn.start("hi"))

    assert seen == ["Be brief."]


# -- halting --------------------------------------------------------------------------------


async def test_a_halt_means_the_model_is_not_called() -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[halter("guard")])

    await pipe.run(Turn.start("hi"))

    assert model.requests == []


async def test_a_halt_means_later_pre_hooks_do_not_run() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[tracer(trace, "before"), halter("guard"), tracer(trace, "after")],
    )

    await pipe.run(Turn.start("hi"))

    assert trace == ["before"]


async def test_a_halted_turn_has_outcome_halted() -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("guard")])

    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "halted"


async def test_the_result_halt_is_stamped_with_the_halting_hook() -> None:
    pipe = Pipeline(model=scripted(), pre=[tracer([], "before"), halter("guard", "no PII")])

    result = await pipe.run(Turn.start("hi"))

    assert result.halt == Halt("no PII", reply=None, hook="guard")


async def test_a_hook_cannot_forge_the_halting_hook_name() -> None:
    def sneaky(turn):
        return Halt("no", hook="someone_else")

    pipe = Pipeline(model=scripted(), pre=[hook(sneaky, name="sneaky")])

    result = await pipe.run(Turn.start("hi"))

    assert result.halt is not None
    assert result.halt.hook == "sneaky"


async def test_a_halted_stream_reports_the_whole_event_trace() -> None:
    pipe = Pipeline(model=scripted(), pre=[tracer([], "before"), halter("guard")])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert kinds(events) == [
        ("TurnStarted", None),
        ("HookStarted", "before"),
        ("HookFinished", "before"),
        ("HookStarted", "guard"),
        ("HookFinished", "guard"),
        ("Halted", "guard"),
        ("TurnFinished", None),
    ]


async def test_the_halted_event_names_the_hook_and_the_reason() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(model=scripted(), pre=[halter("guard", "off topic")])

    events, _ = await streamed(pipe, turn)

    assert of_type(events, ev.Halted) == [ev.Halted(turn.turn_ref, "guard", "off topic")]


async def test_a_halted_stream_finishes_with_outcome_halted() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(model=scripted(), pre=[halter("guard")])

    events, _ = await streamed(pipe, turn)

    assert events[-1] == ev.TurnFinished(turn.turn_ref, "halted")


async def test_a_halt_without_reply_leaves_the_result_reply_empty() -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("guard")])

    result = await pipe.run(Turn.start("hi"))

    assert result.reply is None


async def test_a_halt_with_a_text_reply_makes_it_the_answer() -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("guard", reply="I can't help with that.")])

    result = await pipe.run(Turn.start("hi"))

    assert result.reply is not None
    assert (
        result.reply.message,
        result.reply.attempt,
        result.reply.finish_reason,
    ) == (Message.assistant("I can't help with that."), 0, "halted")


async def test_a_halt_with_an_assistant_message_reply_makes_it_the_answer() -> None:
    answer = Message.assistant("Ask a human.", meta={"canned": True})
    pipe = Pipeline(model=scripted(), pre=[halter("guard", reply=answer)])

    result = await pipe.run(Turn.start("hi"))

    assert result.reply is not None
    assert (result.reply.message, result.reply.attempt, result.reply.finish_reason) == (
        answer,
        0,
        "halted",
    )


async def test_run_and_stream_give_the_same_halted_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def pipe() -> Pipeline:
        return Pipeline(model=scripted(), pre=[injector("notes", "n"), halter("guard", "r")])

    turn = Turn.start("hi")

    ran = await pipe().run(turn)
    _, streamed_result = await streamed(pipe(), turn)

    assert streamed_result == ran


# -- wrong returns --------------------------------------------------------------------------

WRONG_RETURNS = [
    pytest.param(lambda turn: None, "None", "return cont(turn)", id="none"),
    pytest.param(lambda turn: turn, "Turn", "cont(turn)", id="bare-turn"),
    pytest.param(lambda turn: cont("hello"), "Cont", "cont(turn)", id="cont-of-str"),
    pytest.param(lambda turn: regenerate("again"), "Regenerate", "post", id="regenerate"),
    pytest.param(lambda turn: block("no"), "Block", "before_tool", id="block"),
    pytest.param(lambda turn: "some text", "str", "cont(", id="str"),
]


@pytest.mark.parametrize(("make", "returned", "fix"), WRONG_RETURNS)
async def test_a_wrong_return_raises_hook_return_error_naming_hook_stage_and_position(
    make, returned: str, fix: str
) -> None:
    pipe = Pipeline(model=scripted(), pre=[tracer([], "first"), returning("sloppy", make)])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(pre, position 2\)"):
        await pipe.run(Turn.start("hi"))


@pytest.mark.parametrize(("make", "returned", "fix"), WRONG_RETURNS)
async def test_a_wrong_return_error_says_what_the_hook_returned(
    make, returned: str, fix: str
) -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("sloppy", make)])

    with pytest.raises(HookReturnError) as raised:
        await pipe.run(Turn.start("hi"))

    assert f"got {returned}" in str(raised.value)


@pytest.mark.parametrize(("make", "returned", "fix"), WRONG_RETURNS)
async def test_a_wrong_return_error_suggests_the_fix(make, returned: str, fix: str) -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("sloppy", make)])

    with pytest.raises(HookReturnError) as raised:
        await pipe.run(Turn.start("hi"))

    # The fix follows the description of what was returned.
    assert fix in str(raised.value).split(f"got {returned}", 1)[1]


async def test_a_wrong_return_error_carries_the_hook_and_stage() -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("sloppy", lambda turn: None)])

    with pytest.raises(HookReturnError) as raised:
        await pipe.run(Turn.start("hi"))

    assert (raised.value.hook, raised.value.stage) == ("sloppy", "pre")


async def test_a_hand_built_injection_with_a_lone_tool_result_fails_naming_the_hook() -> None:
    """Catches: an injection a hook built itself (not through `Turn.inject`) holding a
    ToolResult with no ToolCall accepted and sent as a tool message answering no call,
    which the provider refuses, as if the provider had failed."""

    def lone(turn: Turn) -> Turn:
        added = Injection((ToolResult("c1", "42"),))
        return cont(attrs.evolve(turn, injections=(*turn.injections, added)))

    model = scripted()
    pipe = Pipeline(model=model, pre=[hook(lone, name="lone")])

    with pytest.raises(HookReturnError, match=r"'lone' \(pre, position 1\) added an injection"):
        await pipe.run(Turn.start("hi"))
    assert model.requests == []


async def test_a_wrong_return_error_is_a_type_error() -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("sloppy", lambda turn: None)])

    with pytest.raises(TypeError):
        await pipe.run(Turn.start("hi"))


async def test_a_wrong_return_means_the_model_is_not_called() -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[returning("sloppy", lambda turn: None)])

    with pytest.raises(HookReturnError):
        await pipe.run(Turn.start("hi"))

    assert model.requests == []


async def test_a_wrong_return_is_enforced_even_when_the_hook_fails_open() -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("sloppy", lambda turn: None, on_error="skip")])

    with pytest.raises(HookReturnError, match="'sloppy'"):
        await pipe.run(Turn.start("hi"))


async def test_a_wrong_return_is_raised_directly_from_a_stream() -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("sloppy", lambda turn: None)])

    _, error = await streamed_until(pipe, Turn.start("hi"), HookReturnError)

    assert error.hook == "sloppy"


async def test_an_async_hook_that_returns_none_raises_hook_return_error() -> None:
    async def forgetful(turn):
        turn.assign(seen=True)

    pipe = Pipeline(model=scripted(), pre=[hook(forgetful, name="forgetful")])

    with pytest.raises(HookReturnError, match=r"'forgetful' \(pre, position 1\).*None"):
        await pipe.run(Turn.start("hi"))


def with_context(turn: Turn, **changes) -> Turn:
    return attrs.evolve(turn, context=attrs.evolve(turn.context, **changes))


# What a hook might set on the turn by hand, and a word of the error naming it.
MALFORMED_TURNS = {
    "context": (lambda turn: attrs.evolve(turn, context=None), "turn.context"),
    "history": (lambda turn: with_context(turn, messages=("earlier",)), "messages"),
    "system": (lambda turn: with_context(turn, system=["be brief"]), "system"),
    # Catches: tools set to names failing as an AttributeError while the error about a
    # changed tool set was being worded.
    "tools": (lambda turn: with_context(turn, tools=("lookup",)), "Context.tools"),
    "user_message": (lambda turn: attrs.evolve(turn, user_message="hi"), "user_message"),
    "scope": (lambda turn: attrs.evolve(turn, scope=None), "turn.scope"),
    "request": (lambda turn: attrs.evolve(turn, request={"temperature": 0}), "request"),
    "injection": (
        lambda turn: attrs.evolve(turn, injections=(*turn.injections, "note")),
        "injections",
    ),
}


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("field", list(MALFORMED_TURNS))
async def test_a_turn_with_a_malformed_field_fails_naming_the_hook(
    field: str, is_async: bool
) -> None:
    """Bug: attrs.evolve lets a hook put anything in a turn's field; the turn went on and failed
    later as an AttributeError naming no hook, or as a ProviderError blaming the model. (A
    Context refuses a bad history or system prompt as it is built: that hook fails with a
    HookFailed; the turn's own fields are checked when it returns: a HookReturnError.)"""
    make, word = MALFORMED_TURNS[field]

    async def careless_async(turn):
        return cont(make(turn))

    def careless(turn):
        return cont(make(turn))

    model = scripted()
    pipe = Pipeline(
        model=model, pre=[hook(careless_async if is_async else careless, name="careless")]
    )

    expected = HookFailed if field in ("history", "system", "tools") else HookReturnError
    with pytest.raises(expected) as raised:
        await pipe.run(Turn.start("hi"))

    error = raised.value
    assert (error.hook, error.stage, model.requests) == ("careless", "pre", [])
    assert "'careless' (pre, position 1)" in str(error)
    assert word in str(error)


async def test_a_hook_returning_a_coroutine_it_forgot_to_await_is_told_to_await_it() -> None:
    """Bug: an async hook that returned another hook's coroutine without awaiting it got no
    hint, and the coroutine was left to warn "never awaited" after the error."""
    made: list[Coroutine[Any, Any, object]] = []

    async def check(turn):
        return cont(turn)

    async def sloppy(turn):
        coroutine = check(turn)
        made.append(coroutine)
        return coroutine

    pipe = Pipeline(model=scripted(), pre=[hook(sloppy, name="sloppy")])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(pre, position 1\).*forget `await`"):
        await pipe.run(Turn.start("hi"))

    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED]


# -- failures: fail closed by default, fail open with on_error="skip" ------------------------


async def test_a_raising_hook_fails_the_turn_with_hook_failed_caused_by_the_original() -> None:
    original = RuntimeError("database down")
    pipe = Pipeline(model=scripted(), pre=[raiser("load_profile", original)])

    with pytest.raises(HookFailed) as raised:
        await pipe.run(Turn.start("hi"))

    assert raised.value.__cause__ is original


async def test_hook_failed_names_the_hook_and_its_position() -> None:
    pipe = Pipeline(
        model=scripted(), pre=[tracer([], "first"), raiser("load_profile", RuntimeError("x"))]
    )

    with pytest.raises(HookFailed, match=r"'load_profile' \(pre, position 2\)"):
        await pipe.run(Turn.start("hi"))


async def test_hook_failed_carries_the_hook_and_stage() -> None:
    pipe = Pipeline(model=scripted(), pre=[raiser("load_profile", RuntimeError("x"))])

    with pytest.raises(HookFailed) as raised:
        await pipe.run(Turn.start("hi"))

    assert (raised.value.hook, raised.value.stage) == ("load_profile", "pre")


async def test_a_raising_hook_means_nothing_is_sent_to_the_model() -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[raiser("load_profile", RuntimeError("x"))])

    with pytest.raises(HookFailed):
        await pipe.run(Turn.start("hi"))

    assert model.requests == []


async def test_a_raising_hook_means_later_hooks_do_not_run() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[raiser("load_profile", RuntimeError("x")), tracer(trace, "after")],
    )

    with pytest.raises(HookFailed):
        await pipe.run(Turn.start("hi"))

    assert trace == []


async def test_an_async_raising_hook_fails_closed_too() -> None:
    original = ValueError("bad data")

    async def parse(turn):
        await anyio.lowlevel.checkpoint()
        raise original

    pipe = Pipeline(model=scripted(), pre=[hook(parse, name="parse")])

    with pytest.raises(HookFailed, match="'parse'") as raised:
        await pipe.run(Turn.start("hi"))

    assert raised.value.__cause__ is original


def first_rule(turn):
    return next(rule for rule in () if rule)  # StopIteration: no rule


async def first_rule_async(turn):
    await anyio.lowlevel.checkpoint()
    return first_rule(turn)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(hook(first_rule), id="sync"),
        pytest.param(hook(first_rule, timeout=5), id="sync-in-a-thread"),
        pytest.param(parallel(hook(first_rule), hook(first_rule, name="other")), id="group"),
        pytest.param(hook(first_rule_async, name="first_rule"), id="async"),
    ],
)
async def test_a_hook_raising_stop_iteration_fails_naming_it(entry) -> None:
    """Bug caught: a hook's StopIteration (``next()`` on an empty iterator) failed the turn
    as "raised RuntimeError: coroutine raised StopIteration", blaming a coroutine the hook
    (a sync one at least) never had."""
    pipe = Pipeline(model=scripted(), pre=[entry])

    with pytest.raises(HookFailed, match=r"'first_rule' \(pre, position 1[.1]*\)") as raised:
        await pipe.run(Turn.start("hi"))
    assert str(raised.value).endswith(" raised StopIteration")
    assert type(raised.value.__cause__) is StopIteration


@pytest.mark.parametrize("stage", ["pre", "post"])
async def test_a_cancelled_error_a_hook_raises_itself_is_its_failure(stage: str) -> None:
    """Catches: a CancelledError a plain hook raised itself (a library awaiting a future
    another task cancelled), while nothing cancelled the turn, escaping run() as a bare
    cancellation — on asyncio the caller's task taken for cancelled — instead of being the
    hook's HookFailed, as it already was for hooks with a timeout= and for tool hooks."""

    async def lookup(turn):
        raise asyncio.CancelledError()

    pipe = Pipeline(model=scripted("one", "two"), **{stage: [hook(lookup, name="lookup")]})

    with pytest.raises(HookFailed, match=r"'lookup'.* raised CancelledError itself") as raised:
        await pipe.run(Turn.start("hi"))
    assert (raised.value.hook, raised.value.stage) == ("lookup", stage)
    assert isinstance(raised.value.__cause__, asyncio.CancelledError)

    _, error = await streamed_until(pipe, Turn.start("hi"), HookFailed)
    assert error.hook == "lookup"


async def test_a_cancelled_error_a_fail_open_hook_raises_itself_is_skipped() -> None:
    """Catches: a fail-open hook's own CancelledError ending the turn instead of being
    recorded as its failure, the turn going on without it."""

    async def lookup(turn):
        raise asyncio.CancelledError()

    pipe = Pipeline(model=scripted("Hello"), pre=[hook(lookup, name="lookup", on_error="skip")])

    result = await pipe.run(Turn.start("hi"))
    assert result.outcome == "completed"
    [record] = result.audit.hooks
    assert (record.hook, record.verdict) == ("lookup", "failed")


async def test_a_cancellation_reaching_a_plain_hook_still_cancels_the_turn() -> None:
    """Guards the two tests above: a real cancellation of the turn inside a plain hook is
    no failure of the hook, and the turn stops."""
    with anyio.CancelScope() as scope:

        async def waits(turn):
            scope.cancel()
            await anyio.sleep_forever()

        await Pipeline(model=scripted(), pre=[hook(waits, name="waits")]).run(Turn.start("hi"))
        pytest.fail("the turn went on after its cancellation")
    assert scope.cancelled_caught


async def test_a_hook_building_a_history_of_strings_fails_naming_the_hook() -> None:
    """Catches: a hook that set the history to plain strings passing, the model then
    failing on them (``'str' object has no attribute 'parts'``), reported as a
    ProviderError, as if the provider had failed."""

    def recall(turn):
        context = attrs.evolve(turn.context, messages=["earlier question", "earlier answer"])
        return cont(attrs.evolve(turn, context=context))

    model = scripted()
    pipe = Pipeline(model=model, pre=[hook(recall, name="recall")])

    with pytest.raises(HookFailed, match=r"'recall' .*Context\.messages\[0\]") as raised:
        await pipe.run(Turn.start("hi"))
    assert (raised.value.hook, model.requests) == ("recall", [])


async def test_a_hook_trimming_the_history_between_a_call_and_its_result_fails_naming_it() -> None:
    """Bug caught: a pre hook whose history view kept a tool result but dropped the call it
    answers was sent as a request every provider refuses, failing as a provider error."""
    history = (
        Message.user("where is order 42?"),
        Message.assistant([ToolCall("c1", "lookup", {"order": "42"})]),
        Message.tool(ToolResult("c1", "shipped")),
        Message.assistant("It shipped."),
    )

    def last_two(turn):
        view = attrs.evolve(turn.context, messages=turn.context.messages[-2:])
        return cont(attrs.evolve(turn, context=view))

    model = scripted()
    pipe = Pipeline(model=model, pre=[hook(last_two, name="last_two")])

    with pytest.raises(HookReturnError, match=r"hook 'last_two' \(pre.*result for call 'c1'"):
        await pipe.run(Turn.start("and 43?", context=Context(messages=history)))
    assert model.requests == []


async def test_a_hook_injecting_a_meta_key_that_is_no_string_fails_naming_the_hook() -> None:
    """Bug caught: a part injected with the meta key ``("source", 1)`` went to the model and
    failed only at commit (a LogError naming no hook, after the model call), or in `to_dict`
    as a bare "unhashable type: 'list'"."""

    def recall(turn):
        return cont(turn.inject(Text("likes tea", meta={("source", 1): "crm"})))

    model = scripted()
    pipe = Pipeline(model=model, pre=[hook(recall, name="recall")])

    with pytest.raises(HookFailed, match=r"'recall' .*Text\.meta has the key tuple") as raised:
        await pipe.run(Turn.start("hi"))
    assert (raised.value.hook, model.requests) == ("recall", [])


async def test_a_fail_closed_stream_reports_an_enforced_hook_failed_event() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(model=scripted(), pre=[raiser("load_profile", RuntimeError("down"))])

    events, _ = await streamed_until(pipe, turn, HookFailed)

    [failed] = of_type(events, ev.HookFailed)
    assert (failed.hook, failed.stage, failed.enforced) == ("load_profile", "pre", True)


async def test_a_failing_open_hook_lets_the_turn_complete() -> None:
    model = scripted("fine")
    pipe = Pipeline(model=model, pre=[raiser("enrich", RuntimeError("down"), on_error="skip")])

    result = await pipe.run(Turn.start("hi"))

    assert (result.outcome, result.reply.text if result.reply else None, len(model.requests)) == (
        "completed",
        "fine",
        1,
    )


async def test_a_failing_open_hook_reports_an_unenforced_hook_failed_event() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(
        model=scripted(), pre=[raiser("enrich", RuntimeError("service down"), on_error="skip")]
    )

    events, _ = await streamed(pipe, turn)

    [failed] = of_type(events, ev.HookFailed)
    assert (failed.hook, failed.stage, failed.enforced, "service down" in failed.error) == (
        "enrich",
        "pre",
        False,
        True,
    )


async def test_the_hook_after_a_failing_open_hook_receives_the_turn_from_before_it() -> None:
    received: list[Turn] = []

    def enrich(turn):
        turn.assign(enriched=True)
        raise RuntimeError("down")

    def after(turn):
        received.append(turn)
        return cont(turn)

    def before(turn):
        return cont(turn.assign(before=True))

    pipe = Pipeline(
        model=scripted(),
        pre=[before, hook(enrich, on_error="skip"), after],
    )

    result = await pipe.run(Turn.start("hi"))

    assert [turn.scope.assigns for turn in received] == [{"before": True}]
    assert result.turn.scope.assigns == {"before": True}


async def test_a_failing_open_hook_runs_the_later_hooks() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[
            tracer(trace, "before"),
            raiser("enrich", RuntimeError("x"), on_error="skip"),
            tracer(trace, "after"),
        ],
    )

    await pipe.run(Turn.start("hi"))

    assert trace == ["before", "after"]


def runs_a_pipeline(label: str, inner: Pipeline, *, is_async: bool, **options):
    """A pre hook that runs a turn through a pipeline of its own (a triage, a sub-agent)."""

    async def triage(turn):
        await inner.run(Turn.start(turn.user_message.text))
        return cont(turn)

    def triage_sync(turn):
        anyio.from_thread.run(inner.run, Turn.start(turn.user_message.text))
        return cont(turn)

    return hook(triage if is_async else triage_sync, name=label, **options)


def sloppy_pipeline() -> Pipeline:
    """A pipeline whose pre hook forgets to return: running it raises a HookReturnError."""
    return Pipeline(model=scripted(), pre=[returning("sloppy", lambda turn: None)])


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
async def test_a_hook_error_from_a_pipeline_a_hook_runs_is_that_hooks_failure(
    is_async: bool,
) -> None:
    """Bug: a HookError raised out of a hook (by a pipeline it ran) was re-raised as it was,
    naming the inner pipeline's hook, as if this pipeline's own verdict on it."""
    options = {} if is_async else {"timeout": 60}  # sync: in a worker thread
    pipe = Pipeline(
        model=scripted(),
        pre=[runs_a_pipeline("triage", sloppy_pipeline(), is_async=is_async, **options)],
    )

    with pytest.raises(HookFailed) as raised:
        await pipe.run(Turn.start("hi"))

    error, cause = raised.value, raised.value.__cause__
    assert (error.hook, error.stage, "'triage' (pre, position 1)" in str(error)) == (
        "triage",
        "pre",
        True,
    )
    assert isinstance(cause, HookReturnError)
    assert cause.hook == "sloppy"


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
async def test_a_failing_open_hook_fails_open_on_a_hook_error_of_a_pipeline_it_runs(
    is_async: bool,
) -> None:
    """Bug: a hook with on_error="skip" whose inner pipeline raised a HookReturnError failed
    the turn: the error was taken for a wrong return of the hook itself, always enforced."""
    options = {} if is_async else {"timeout": 60}
    pipe = Pipeline(
        model=scripted("fine"),
        pre=[
            runs_a_pipeline(
                "triage", sloppy_pipeline(), is_async=is_async, on_error="skip", **options
            )
        ],
    )

    events, result = await streamed(pipe, Turn.start("hi"))

    [failed] = of_type(events, ev.HookFailed)
    assert (result.outcome, failed.hook, failed.enforced) == ("completed", "triage", False)
    assert "'sloppy'" in failed.error


async def test_a_when_predicate_raising_a_hook_error_fails_its_hook_open_when_skipping() -> None:
    """Bug: a when= predicate that raised a HookError (a pipeline it ran failed) had it passed
    on as it was: the hook's on_error="skip" did not apply to a HookReturnError."""
    inner = sloppy_pipeline()

    def when(turn):
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(inner.run, Turn.start("probe"))
        return True

    async def check(turn):
        return cont(turn)

    pipe = Pipeline(
        model=scripted("fine"), pre=[hook(check, name="check", when=when, on_error="skip")]
    )

    events, result = await streamed(pipe, Turn.start("hi"))

    [failed] = of_type(events, ev.HookFailed)
    assert (result.outcome, failed.hook, failed.enforced) == ("completed", "check", False)
    assert "'sloppy'" in failed.error


# -- shadow hooks ---------------------------------------------------------------------------


async def test_a_halting_shadow_hook_does_not_stop_the_turn() -> None:
    model = scripted("answer")
    trace: list[str] = []
    pipe = Pipeline(
        model=model, pre=[halter("new_guard", "too risky", shadow=True), tracer(trace, "after")]
    )

    result = await pipe.run(Turn.start("hi"))

    assert (result.outcome, result.halt, trace, len(model.requests)) == (
        "completed",
        None,
        ["after"],
        1,
    )


async def test_a_shadow_hooks_verdict_is_a_shadow_verdict_event() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(model=scripted(), pre=[halter("new_guard", "too risky", shadow=True)])

    events, _ = await streamed(pipe, turn)

    assert of_type(events, ev.ShadowVerdict) == [
        ev.ShadowVerdict(turn.turn_ref, "new_guard", "pre", "halt", "too risky")
    ]


async def test_a_halting_shadow_hook_emits_no_halted_event() -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("new_guard", shadow=True)])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert of_type(events, ev.Halted) == []


async def test_a_shadow_hooks_verdict_is_in_the_audit_record(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("new_guard", "too risky", shadow=True)])

    result = await pipe.run(Turn.start("hi"))

    assert result.audit.hooks == (
        HookRecord("new_guard", "pre", "1", 0.0, "halt", True, "too risky"),
    )


async def test_a_shadow_hooks_injections_are_discarded() -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[injector("trial_notes", "secret note", shadow=True)])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == ()
    assert model.requests[0].messages == (Message.user("hi"),)


async def test_a_shadow_hooks_injections_emit_no_injected_event() -> None:
    pipe = Pipeline(model=scripted(), pre=[injector("trial_notes", "secret note", shadow=True)])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert of_type(events, ev.Injected) == []


async def test_the_hook_after_a_shadow_hook_receives_the_turn_from_before_it() -> None:
    received: list[dict[str, object]] = []

    def trial(turn):
        return cont(turn.assign(trial=True).with_request(temperature=0.0))

    def after(turn):
        received.append(dict(turn.scope.assigns))
        return cont(turn)

    pipe = Pipeline(model=scripted(), pre=[hook(trial, shadow=True), after])

    result = await pipe.run(Turn.start("hi"))

    assert received == [{}]
    assert result.turn.request.temperature is None


async def test_a_raising_shadow_hook_does_not_stop_the_turn() -> None:
    pipe = Pipeline(model=scripted(), pre=[raiser("trial", RuntimeError("bug"), shadow=True)])

    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "completed"


async def test_a_raising_shadow_hook_reports_an_unenforced_hook_failed_event() -> None:
    pipe = Pipeline(model=scripted(), pre=[raiser("trial", RuntimeError("bug"), shadow=True)])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert [(e.hook, e.enforced) for e in of_type(events, ev.HookFailed)] == [("trial", False)]


async def test_a_shadow_hooks_wrong_return_is_not_enforced() -> None:
    pipe = Pipeline(model=scripted(), pre=[returning("trial", lambda turn: None, shadow=True)])

    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "completed"


# -- when ------------------------------------------------------------------------------------


async def test_a_hook_whose_when_is_false_does_not_run() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[
            tracer(trace, "first"),
            tracer(trace, "gated", when=lambda turn: False),
            tracer(trace, "last"),
        ],
    )

    await pipe.run(Turn.start("hi"))

    assert trace == ["first", "last"]


async def test_a_skipped_hook_is_reported_as_hook_skipped() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(model=scripted(), pre=[tracer([], "gated", when=lambda turn: False)])

    events, _ = await streamed(pipe, turn)

    assert kinds(events)[:3] == [
        ("TurnStarted", None),
        ("HookSkipped", "gated"),
        ("ModelCalled", None),
    ]
    assert of_type(events, ev.HookSkipped) == [ev.HookSkipped(turn.turn_ref, "gated", "pre")]


async def test_a_skipped_hook_is_in_the_audit_record_as_skipped() -> None:
    pipe = Pipeline(model=scripted(), pre=[tracer([], "gated", when=lambda turn: False)])

    result = await pipe.run(Turn.start("hi"))

    assert [(r.hook, r.verdict) for r in result.audit.hooks] == [("gated", "skipped")]


async def test_when_sees_the_turn_the_previous_hook_returned() -> None:
    trace: list[str] = []

    def flag(turn):
        return cont(turn.assign(admin=True))

    pipe = Pipeline(
        model=scripted(),
        pre=[flag, tracer(trace, "admin_only", when=lambda turn: turn.scope.assigns["admin"])],
    )

    await pipe.run(Turn.start("hi"))

    assert trace == ["admin_only"]


async def test_a_when_predicate_that_raises_is_hook_failed_naming_the_hook() -> None:
    original = KeyError("admin")

    def predicate(turn):
        raise original

    pipe = Pipeline(model=scripted(), pre=[tracer([], "admin_only", when=predicate)])

    with pytest.raises(HookFailed, match=r"'admin_only' \(pre, position 1\)") as raised:
        await pipe.run(Turn.start("hi"))

    assert raised.value.__cause__ is original


# -- timeouts -------------------------------------------------------------------------------


def sleeper(label: str, seconds: float, **options):
    async def nap(turn):
        await anyio.sleep(seconds)
        return cont(turn)

    return hook(nap, name=label, **options)


async def test_a_hook_past_its_timeout_raises_hook_timeout_naming_hook_and_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow_search", 60, timeout=1.5)])

    with pytest.raises(HookTimeout, match=r"'slow_search' \(pre, position 1\).*1\.5") as raised:
        await pipe.run(Turn.start("hi"))

    assert (raised.value.hook, raised.value.stage, raised.value.timeout) == (
        "slow_search",
        "pre",
        1.5,
    )


async def test_a_hook_is_stopped_when_its_timeout_expires(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow_search", 60, timeout=1.5)])
    started = anyio.current_time()

    with pytest.raises(HookTimeout):
        await pipe.run(Turn.start("hi"))

    assert anyio.current_time() - started == 1.5


async def test_a_timed_out_hook_means_the_model_is_not_called(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[sleeper("slow_search", 60, timeout=1)])

    with pytest.raises(HookTimeout):
        await pipe.run(Turn.start("hi"))

    assert model.requests == []


async def test_a_hook_that_finishes_within_its_timeout_passes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("search", 0.5, timeout=1)])

    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "completed"


async def test_a_sync_hook_with_a_timeout_that_finishes_in_time_passes() -> None:
    # The real clock: the hook runs in a worker thread, and a MockClock would jump past the
    # timeout while the thread runs. The hook returns at once, so nothing sleeps.
    pipe = Pipeline(model=scripted(), pre=[injector("notes", "n", timeout=5)])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (Injection((Text("n"),), "notes", False, "pre"),)


async def test_a_blocking_sync_hook_with_a_timeout_is_abandoned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = threading.Event()

    def blocking(turn):
        release.wait()
        return cont(turn)

    pipe = Pipeline(model=scripted(), pre=[hook(blocking, name="blocking", timeout=2)])
    try:
        with pytest.raises(HookTimeout, match="'blocking'"):
            await pipe.run(Turn.start("hi"))
    finally:
        release.set()


async def test_a_timed_out_hook_that_fails_open_lets_the_turn_complete(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("search", 60, timeout=1, on_error="skip")])

    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "completed"


async def test_a_hook_that_catches_its_timeouts_cancellation_still_times_out() -> None:
    """Bug: a hook that caught the cancellation of its timeout and returned had its late
    verdict used, as if it had finished in time; exceeding the timeout is a HookTimeout."""

    async def stubborn(turn):
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return cont(turn.inject("late news"))
        raise AssertionError("sleep_forever returned")

    model = scripted()
    pipe = Pipeline(model=model, pre=[hook(stubborn, name="stubborn", timeout=0.05)])

    with pytest.raises(HookTimeout, match="'stubborn'"):
        await pipe.run(Turn.start("hi"))

    assert model.requests == []


async def test_a_hook_shielded_from_its_timeout_times_out_when_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Bug: a hook that shielded its work from cancellation ran past its timeout and had its
    late verdict used, as if it had finished in time."""

    async def shielded(turn):
        with anyio.CancelScope(shield=True):
            await anyio.sleep(60)
        return halt("too late to decide")

    pipe = Pipeline(model=scripted(), pre=[hook(shielded, name="shielded", timeout=1)])

    with pytest.raises(HookTimeout, match="'shielded'"):
        await pipe.run(Turn.start("hi"))


# -- chains ---------------------------------------------------------------------------------


async def test_chain_members_run_in_order_in_place_of_the_chain() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[
            tracer(trace, "before"),
            chain(tracer(trace, "a"), async_tracer(trace, "b"), tracer(trace, "c"), name="ch"),
            tracer(trace, "after"),
        ],
    )

    await pipe.run(Turn.start("hi"))

    assert trace == ["before", "a", "b", "c", "after"]


async def test_chain_members_thread_the_turn() -> None:
    seen: list[dict[str, object]] = []

    def step(key: str):
        def assign(turn):
            seen.append(dict(turn.scope.assigns))
            return cont(turn.assign(**{key: True}))

        return hook(assign, name=key)

    pipe = Pipeline(model=scripted(), pre=[step("x"), chain(step("y"), step("z")), step("w")])

    result = await pipe.run(Turn.start("hi"))

    assert seen == [{}, {"x": True}, {"x": True, "y": True}, {"x": True, "y": True, "z": True}]
    assert result.turn.scope.assigns == {"x": True, "y": True, "z": True, "w": True}


async def test_a_chain_stops_at_its_first_halt() -> None:
    trace: list[str] = []
    model = scripted()
    pipe = Pipeline(
        model=model,
        pre=[
            chain(tracer(trace, "a"), halter("b", "stop here"), tracer(trace, "c"), name="ch"),
            tracer(trace, "after"),
        ],
    )

    result = await pipe.run(Turn.start("hi"))

    assert (trace, result.outcome, result.halt, model.requests) == (
        ["a"],
        "halted",
        Halt("stop here", hook="ch.b"),
        [],
    )


async def test_chain_member_events_are_prefixed_with_the_chain_name() -> None:
    pipe = Pipeline(
        model=scripted(),
        pre=[tracer([], "first"), chain(tracer([], "a"), tracer([], "b"), name="intake")],
    )

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert [e.hook for e in of_type(events, ev.HookStarted)] == ["first", "intake.a", "intake.b"]


async def test_nested_chains_prefix_every_level() -> None:
    trace: list[str] = []
    inner = chain(tracer(trace, "a"), tracer(trace, "b"), name="inner")
    outer = chain(tracer(trace, "first"), inner, tracer(trace, "last"), name="outer")
    pipe = Pipeline(model=scripted(), pre=[outer])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert trace == ["first", "a", "b", "last"]
    assert [e.hook for e in of_type(events, ev.HookStarted)] == [
        "outer.first",
        "outer.inner.a",
        "outer.inner.b",
        "outer.last",
    ]


async def test_a_halting_nested_chain_member_is_stamped_with_the_full_name() -> None:
    inner = chain(halter("guard"), name="inner")
    pipe = Pipeline(model=scripted(), pre=[chain(tracer([], "first"), inner, name="outer")])

    result = await pipe.run(Turn.start("hi"))

    assert result.halt is not None
    assert result.halt.hook == "outer.inner.guard"


async def test_a_chain_members_wrong_return_names_it_with_prefix_and_dotted_position() -> None:
    pipe = Pipeline(
        model=scripted(),
        pre=[
            tracer([], "first"),
            chain(tracer([], "a"), returning("sloppy", lambda turn: None), name="intake"),
        ],
    )

    with pytest.raises(HookReturnError, match=r"'intake.sloppy' \(pre, position 2\.2\)"):
        await pipe.run(Turn.start("hi"))


async def test_a_nested_chain_members_failure_names_its_nested_position() -> None:
    inner = chain(tracer([], "a"), raiser("boom", RuntimeError("x")), name="inner")
    pipe = Pipeline(model=scripted(), pre=[chain(inner, name="outer")])

    with pytest.raises(HookFailed, match=r"'outer.inner.boom' \(pre, position 1\.1\.2\)"):
        await pipe.run(Turn.start("hi"))


async def test_a_failing_open_chain_member_lets_the_chain_go_on() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        pre=[
            chain(
                raiser("flaky", RuntimeError("x"), on_error="skip"),
                tracer(trace, "next"),
                name="ch",
            )
        ],
    )

    result = await pipe.run(Turn.start("hi"))

    assert (result.outcome, trace) == ("completed", ["next"])


# -- injections and their provenance --------------------------------------------------------


async def test_an_injection_is_stamped_with_the_hook_name_durability_and_stage_pre() -> None:
    pipe = Pipeline(model=scripted(), pre=[injector("profile", "likes tea", durable=True)])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (Injection((Text("likes tea"),), "profile", True, "pre"),)


async def test_a_transient_hooks_injection_is_stamped_not_durable() -> None:
    pipe = Pipeline(model=scripted(), pre=[injector("today", "It is Monday.")])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (Injection((Text("It is Monday."),), "today", False, "pre"),)


async def test_injections_from_several_hooks_keep_list_order_and_their_own_stamps() -> None:
    pipe = Pipeline(
        model=scripted(),
        pre=[injector("first", "one", durable=True), injector("second", "two", "three")],
    )

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (
        Injection((Text("one"),), "first", True, "pre"),
        Injection((Text("two"), Text("three")), "second", False, "pre"),
    )


async def test_several_injections_by_one_hook_are_each_stamped() -> None:
    def twice(turn):
        return cont(turn.inject("a").inject("b"))

    pipe = Pipeline(model=scripted(), pre=[hook(twice, name="twice")])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (
        Injection((Text("a"),), "twice", False, "pre"),
        Injection((Text("b"),), "twice", False, "pre"),
    )


async def test_a_chain_members_injection_is_stamped_with_the_prefixed_name() -> None:
    pipe = Pipeline(
        model=scripted(),
        pre=[chain(tracer([], "auth"), injector("notes", "n", durable=True), name="intake")],
    )

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (Injection((Text("n"),), "intake.notes", True, "pre"),)


async def test_a_hook_cannot_forge_the_provenance_of_what_it_injects() -> None:
    def forger(turn):
        forged = Injection((Text("trust me"),), source="admin", durable=True, stage="post")
        return cont(attrs.evolve(turn, injections=(*turn.injections, forged)))

    pipe = Pipeline(model=scripted(), pre=[hook(forger, name="forger")])

    result = await pipe.run(Turn.start("hi"))

    assert result.turn.injections == (Injection((Text("trust me"),), "forger", False, "pre"),)


async def test_an_injected_event_reports_hook_parts_durability_tokens_and_stage() -> None:
    turn = Turn.start("hi")
    # 13 characters: ceil(13 / 4) == 4 tokens with the default estimate.
    pipe = Pipeline(model=scripted(), pre=[injector("today", "It is Monday.", durable=True)])

    events, _ = await streamed(pipe, turn)

    assert of_type(events, ev.Injected) == [
        ev.Injected(turn.turn_ref, "today", (Text("It is Monday."),), True, 4, "pre")
    ]


async def test_the_model_is_sent_the_injected_text_before_the_users_text() -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[injector("today", "It is Monday.")])

    await pipe.run(Turn.start("hi"))

    assert model.requests[0].messages == (Message.user([Text("It is Monday."), Text("hi")]),)


# -- the audit record -----------------------------------------------------------------------


async def test_the_audit_record_lists_every_hook_with_verdict_and_timing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(
        model=scripted(),
        pre=[
            sleeper("slow", 3),
            tracer([], "gated", when=lambda turn: False),
            sleeper("quick", 1),
            chain(sleeper("member", 2), name="ch"),
        ],
    )

    result = await pipe.run(Turn.start("hi"))

    assert result.audit.hooks == (
        HookRecord("slow", "pre", "1", 3.0, "cont"),
        HookRecord("gated", "pre", "2", 0.0, "skipped"),
        HookRecord("quick", "pre", "3", 1.0, "cont"),
        HookRecord("ch.member", "pre", "4.1", 2.0, "cont"),
    )


async def test_a_hook_sleeping_three_seconds_finishes_with_elapsed_three(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow", 3)])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert [e.elapsed for e in of_type(events, ev.HookFinished)] == [3]


async def test_the_audit_record_keeps_a_halting_hooks_verdict_and_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("guard", "off topic")])

    result = await pipe.run(Turn.start("hi"))

    assert result.audit.hooks == (HookRecord("guard", "pre", "1", 0.0, "halt", False, "off topic"),)


async def test_the_audit_record_keeps_the_halt() -> None:
    pipe = Pipeline(model=scripted(), pre=[halter("guard", "off topic")])

    result = await pipe.run(Turn.start("hi"))

    assert (result.audit.outcome, result.audit.halt) == ("halted", result.halt)


async def test_the_audit_record_keeps_a_failed_open_hook_with_its_error() -> None:
    pipe = Pipeline(
        model=scripted(), pre=[raiser("enrich", RuntimeError("service down"), on_error="skip")]
    )

    result = await pipe.run(Turn.start("hi"))

    [record] = result.audit.hooks
    assert (
        record.hook,
        record.position,
        record.verdict,
        "service down" in (record.detail or ""),
    ) == (
        "enrich",
        "1",
        "failed",
        True,
    )


async def test_the_audit_record_keeps_every_stamped_injection_of_a_halted_turn() -> None:
    turn = Turn.start("hi")
    pipe = Pipeline(model=scripted(), pre=[injector("notes", "n"), halter("guard")])

    result = await pipe.run(turn)

    assert (result.audit.turn_ref, result.audit.injections) == (
        turn.turn_ref,
        (Injection((Text("n"),), "notes", False, "pre"),),
    )


# -- the event trace ------------------------------------------------------------------------


async def test_a_two_hook_turn_reports_the_whole_event_trace_in_order() -> None:
    pipe = Pipeline(
        model=scripted("Hello"), pre=[injector("today", "It is Monday."), tracer([], "auth")]
    )

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert kinds(events) == [
        ("TurnStarted", None),
        ("HookStarted", "today"),
        ("HookFinished", "today"),
        ("Injected", "today"),
        ("HookStarted", "auth"),
        ("HookFinished", "auth"),
        ("ModelCalled", None),
        ("TextDelta", None),
        ("ModelFinished", None),
        ("ReplyReady", None),
        ("TurnFinished", None),
    ]


async def test_every_event_of_a_turn_carries_its_turn_ref() -> None:
    turn = Turn.start("hi", turn_ref="ref-123")
    pipe = Pipeline(model=scripted(), pre=[injector("today", "x"), tracer([], "auth")])

    events, _ = await streamed(pipe, turn)

    assert {event.turn_ref for event in events} == {"ref-123"}


async def test_hook_finished_events_report_the_cont_verdict() -> None:
    pipe = Pipeline(model=scripted(), pre=[tracer([], "a"), injector("b", "x")])

    events, _ = await streamed(pipe, Turn.start("hi"))

    assert [(e.hook, e.stage, e.verdict) for e in of_type(events, ev.HookFinished)] == [
        ("a", "pre", "cont"),
        ("b", "pre", "cont"),
    ]


# -- cancellation ---------------------------------------------------------------------------


async def test_cancelling_the_scope_around_run_while_a_pre_hook_sleeps_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow", 60)])

    with anyio.move_on_after(5) as scope:
        await pipe.run(Turn.start("hi"))

    assert scope.cancelled_caught


async def test_cancelling_run_during_a_pre_hook_leaves_no_task_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow", 60, timeout=30)])
    before = all_tasks()

    with anyio.move_on_after(5):
        await pipe.run(Turn.start("hi"))

    assert all_tasks() == before


async def test_cancelling_run_during_a_pre_hook_means_the_model_is_not_called(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = scripted()
    pipe = Pipeline(model=model, pre=[sleeper("slow", 60)])

    with anyio.move_on_after(5):
        await pipe.run(Turn.start("hi"))

    assert model.requests == []


async def test_cancelling_a_stream_while_a_pre_hook_sleeps_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow", 60)])

    with anyio.move_on_after(5) as scope:
        async with pipe.stream(Turn.start("hi")) as events:
            async for _ in events:
                pass

    assert scope.cancelled_caught


async def test_cancelling_a_stream_during_a_pre_hook_leaves_no_task_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), pre=[sleeper("slow", 60)])
    before = all_tasks()

    with anyio.move_on_after(5):
        async with pipe.stream(Turn.start("hi")) as events:
            async for _ in events:
                pass

    assert all_tasks() == before


async def test_cancelling_run_while_a_sync_hook_blocks_in_a_thread_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = threading.Event()

    def blocking(turn):
        release.wait()
        return cont(turn)

    pipe = Pipeline(model=scripted(), pre=[hook(blocking, name="blocking", timeout=600)])
    try:
        with anyio.move_on_after(5) as scope:
            await pipe.run(Turn.start("hi"))
    finally:
        release.set()

    assert scope.cancelled_caught


async def test_two_hooks_shaping_extra_both_reach_the_model_request():
    """Catches: the second hook's `with_request(extra=...)` dropping the first hook's keys."""

    def seeded(turn):
        return cont(turn.with_request(extra={"seed": 7, "user": "ada"}))

    def nucleus(turn):
        return cont(turn.with_request(extra={"top_p": 0.5, "user": None}))

    model = ScriptedModel(["ok"])
    await Pipeline(model=model, pre=[seeded, nucleus]).run(Turn.start("hi"))
    assert dict(model.requests[0].options.extra) == {"seed": 7, "top_p": 0.5}


def pipe_with_pre(*pre, **options):
    return Pipeline(model=ScriptedModel(["ok"]), pre=list(pre), **options)


async def test_a_when_returning_a_coroutine_is_told_it_is_not_awaited():
    """Catches: a ``when=`` that returns a coroutine (a lambda around an async check)
    reported only as a non-bool, without the fix, and the coroutine left to warn that it
    was never awaited."""
    made = []

    async def allowed(turn):
        return True

    def gate(turn):
        made.append(allowed(turn))
        return made[0]

    pipe = pipe_with_pre(hook(lambda turn: cont(turn), name="gated", when=gate))

    with pytest.raises(HookReturnError, match=r"'gated'.*got coroutine.*called without await"):
        await pipe.run(Turn.start("hi"))
    assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED


async def test_a_when_returning_a_non_bool_fails_an_enforced_hook():
    def fn(turn):
        return cont(turn)

    pipe = pipe_with_pre(hook(fn, name="gated", when=lambda turn: "yes"))
    with pytest.raises(HookReturnError, match=r"'gated'.*True or False"):
        await pipe.run(Turn.start("hi"))
