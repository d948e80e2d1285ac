"""The tool loop: batches of tool calls, before/after tool hooks, bounds, events and the audit."""

import asyncio
import contextlib
import gc
import re
import threading
import warnings

import anyio
import anyio.lowlevel
import attrs
import pytest

from pipeline import (
    TOOL_HOOKS,
    ConfigError,
    HookFailed,
    HookReturnError,
    ModelFinish,
    ModelToolCall,
    Pipeline,
    RequestError,
    StepLimitExceeded,
    ToolRecord,
    ask,
    block,
    chain,
    cont,
    halt,
    hook,
    parallel,
    regenerate,
    tool,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog, SQLiteLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Message, Scope, ToolCall, ToolResult, ToolSpec, Turn, Usage

from .support import collect, collect_into, live_tasks, pairing_problems, run_on

TURN_REF = "turn-tools"
CONVERSATION = "conv-tools"


# -- helpers --------------------------------------------------------------------------------


def start(text: str = "weather?", **options) -> Turn:
    return Turn.start(text, turn_ref=TURN_REF, **options)


def call(call_id: str, city: str, name: str = "lookup") -> ToolCall:
    return ToolCall(call_id, name, {"city": city})


def calls(*cities: str, name: str = "lookup") -> list[ToolCall]:
    """One call per city, with ids c1, c2, ..."""
    return [call(f"c{index}", city, name) for index, city in enumerate(cities, 1)]


def lookup_tool(trace: list | None = None, *, name: str = "lookup", delays=None, result=None):
    """An async tool: records ``name:city`` when it starts, sleeps ``delays[city]``, answers."""

    async def run(city: str) -> str:
        if trace is not None:
            trace.append(f"{name}:{city}")
        if delays:
            await anyio.sleep(delays.get(city, 0))
        return result if result is not None else f"{name}({city})"

    return tool(run, name=name)


def answered(tool_calls: list[ToolCall], *contents: str) -> tuple[Message, ...]:
    """The messages of one tool step: the assistant's calls, then a tool message per result."""
    return (
        Message("assistant", tuple(tool_calls)),
        *(
            Message.tool(ToolResult(c.id, text))
            for c, text in zip(tool_calls, contents, strict=True)
        ),
    )


def results_of(reply_messages) -> list[ToolResult]:
    return [part for message in reply_messages if message.role == "tool" for part in message.parts]


def of_type(events, kind) -> list:
    return [event for event in events if type(event) is kind]


def before(name: str, decide, trace: list | None = None, **options):
    """A before-tool hook named `name` returning `decide(call)`; records the call it saw."""

    def run(call, turn):
        if trace is not None:
            trace.append((name, dict(call.arguments)))
        return decide(call)

    return hook(run, name=name, **options)


def after(name: str, decide, trace: list | None = None, **options):
    """An after-tool hook named `name` returning `decide(result)`; records what it saw."""

    def run(call, result, turn):
        if trace is not None:
            trace.append((name, call.id, result.error_class, result.content))
        return decide(result)

    return hook(run, name=name, **options)


def rewrite(**arguments):
    return lambda c: cont(c.with_arguments({**c.arguments, **arguments}))


def passing(c):
    return cont(c)


def pipe_with(replies, *tools, **options) -> tuple[Pipeline, ScriptedModel]:
    model = ScriptedModel(replies)
    return Pipeline(model=model, tools=list(tools) or [lookup_tool()], **options), model


def shaping(name: str, **changes):
    async def shape(turn):
        return cont(turn.with_request(**changes))

    return hook(shape, name=name)


# -- results go back to the model ------------------------------------------------------------


async def test_results_are_fed_back_in_call_order_even_when_later_calls_finish_first(
    autojump_clock,
) -> None:
    batch = calls("a", "b", "c")
    slow_first = lookup_tool(delays={"a": 3, "b": 2, "c": 1})
    pipe, model = pipe_with([batch, "done"], slow_first, tool_concurrency=3)

    await pipe.run(start())

    assert model.requests[1].messages[-4:] == answered(batch, "lookup(a)", "lookup(b)", "lookup(c)")


async def test_the_second_model_call_is_sent_the_history_then_the_exchange() -> None:
    batch = calls("a")
    pipe, model = pipe_with([batch, "done"])

    await pipe.run(start())

    assert model.requests[1].messages == (Message.user("weather?"), *answered(batch, "lookup(a)"))


async def test_reply_messages_hold_the_whole_exchange_then_the_answer() -> None:
    batch = calls("a", "b")
    pipe, _ = pipe_with([batch, "sunny"])

    result = await pipe.run(start())

    assert result.reply.messages == (
        *answered(batch, "lookup(a)", "lookup(b)"),
        Message.assistant("sunny"),
    )


async def test_reply_message_is_the_final_answer() -> None:
    pipe, _ = pipe_with([calls("a"), "sunny"])

    result = await pipe.run(start())

    assert result.reply.message == Message.assistant("sunny")


async def test_several_tool_steps_form_one_exchange() -> None:
    first, second = calls("a"), [call("c2", "b")]
    pipe, _ = pipe_with([first, second, "sunny"])

    result = await pipe.run(start())

    assert result.reply.messages == (
        *answered(first, "lookup(a)"),
        *answered(second, "lookup(b)"),
        Message.assistant("sunny"),
    )


async def test_the_completed_turn_commits_the_user_message_and_the_exchange() -> None:
    batch = calls("a")
    pipe, _ = pipe_with([batch, "sunny"])

    result = await pipe.run(start())

    assert result.log_messages == (
        Message.user("weather?"),
        *answered(batch, "lookup(a)"),
        Message.assistant("sunny"),
    )


async def test_a_session_commits_the_exchange_to_the_log() -> None:
    batch = calls("a")
    pipe, _ = pipe_with([batch, "sunny"])
    log = MemoryLog()

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send("weather?")

    assert (await log.load(CONVERSATION)).messages == (
        Message.user("weather?"),
        *answered(batch, "lookup(a)"),
        Message.assistant("sunny"),
    )


async def test_a_tool_receives_the_turns_scope() -> None:
    seen: list[Scope] = []

    async def whoami(scope: Scope) -> str:
        seen.append(scope)
        return "you"

    scope = Scope(current_user="ann")
    pipe, _ = pipe_with([[ToolCall("c1", "whoami", {})], "done"], tool(whoami))

    await pipe.run(start(scope=scope))

    assert seen == [scope]


async def test_a_failing_tool_is_the_models_to_handle_and_the_turn_goes_on() -> None:
    async def explode(city: str) -> str:
        raise LookupError(f"no weather for {city}")

    pipe, _ = pipe_with([calls("a", name="explode"), "sorry"], tool(explode))

    result = await pipe.run(start())

    assert (
        result.outcome,
        [(r.error_class, r.is_error) for r in results_of(result.reply.messages)],
    ) == (
        "completed",
        [("tool_error", True)],
    )


async def test_undecodable_arguments_from_the_provider_never_reach_the_tool() -> None:
    trace: list[str] = []
    broken = ToolCall("c1", "lookup", {}, {"invalid_arguments": {"raw": "{", "error": "bad JSON"}})
    pipe, _ = pipe_with([[broken], "sorry"], lookup_tool(trace))

    result = await pipe.run(start())

    assert (trace, [r.error_class for r in results_of(result.reply.messages)]) == (
        [],
        ["invalid_arguments"],
    )


def repaired(call: ToolCall) -> ToolCall:
    """The call with its arguments fixed from the raw text, and the provider's mark dropped."""
    meta = {key: value for key, value in call.meta.items() if key != "invalid_arguments"}
    return attrs.evolve(call, arguments={"city": "a"}, meta=meta)


async def test_a_hook_that_repairs_undecodable_arguments_runs_the_tool_with_them() -> None:
    """A deliberate repair (the fixed arguments, the mark dropped) runs the tool."""
    trace: list[str] = []
    broken = ToolCall(
        "c1", "lookup", {}, {"invalid_arguments": {"raw": '{"city": "a",}', "error": "bad JSON"}}
    )
    repair = before("repair", lambda c: cont(repaired(c)))
    pipe, _ = pipe_with([[broken], "done"], lookup_tool(trace), before_tool=[repair])

    result = await pipe.run(start())

    (answer,) = results_of(result.reply.messages)
    assert (trace, answer.content, answer.is_error) == (["lookup:a"], "lookup(a)", False)


@pytest.mark.parametrize(
    "rewrite",
    [
        pytest.param(lambda c: c.with_arguments({}), id="unchanged"),
        pytest.param(lambda c: c.with_arguments({**c.arguments, "city": "x"}), id="added"),
    ],
)
async def test_a_rewrite_that_keeps_the_mark_of_undecodable_arguments_is_refused(
    rewrite,
) -> None:
    """Catches: any rewrite that changed the arguments clearing the provider's mark, so a
    hook adding an argument to every call (a tenant) ran a cut-off call with defaults for
    the rest, and the model never learned its JSON was broken."""
    trace: list[str] = []
    broken = ToolCall("c1", "lookup", {}, {"invalid_arguments": {"raw": "{", "error": "bad JSON"}})
    keep = before("keep", lambda c: cont(rewrite(c)))
    pipe, _ = pipe_with([[broken], "done"], lookup_tool(trace), before_tool=[keep])

    result = await pipe.run(start())

    assert (trace, [r.error_class for r in results_of(result.reply.messages)]) == (
        [],
        ["invalid_arguments"],
    )


@attrs.frozen
class Order:
    quantity: int = attrs.field(validator=attrs.validators.gt(0))


async def test_an_argument_its_attrs_class_refuses_gives_invalid_arguments() -> None:
    async def buy(order: Order) -> str:
        return "bought"

    pipe, _ = pipe_with([[ToolCall("c1", "buy", {"order": {"quantity": -1}})], "ok"], tool(buy))

    result = await pipe.run(start())

    assert [r.error_class for r in results_of(result.reply.messages)] == ["invalid_arguments"]


def _not_thirteen(instance: object, attribute: object, value: int) -> None:
    if value == 13:
        raise LookupError("no shelf 13")


@attrs.frozen
class Shelf:
    number: int = attrs.field(validator=_not_thirteen)


async def test_an_attrs_class_refusing_with_any_exception_gives_invalid_arguments() -> None:
    """Catches: a validator raising something other than TypeError or ValueError (here a
    LookupError) escaping the tool loop as a bare exception that failed the whole turn."""
    trace: list = []

    async def stock(shelf: Shelf) -> str:
        trace.append(shelf)
        return "stocked"

    pipe, _ = pipe_with([[ToolCall("c1", "stock", {"shelf": {"number": 13}})], "ok"], tool(stock))

    result = await pipe.run(start())

    (refused,) = results_of(result.reply.messages)
    assert (result.outcome, refused.error_class, trace) == ("completed", "invalid_arguments", [])
    assert "shelf: Shelf refused it: LookupError: no shelf 13" in refused.content


async def test_a_pipeline_without_tools_keeps_the_models_calls_in_the_reply() -> None:
    batch = calls("a")
    model = ScriptedModel([["Let me look.", *batch]])

    result = await Pipeline(model=model).run(start())

    assert (result.reply.message.parts[1:], len(model.requests)) == (tuple(batch), 1)


# -- events -------------------------------------------------------------------------------------


async def test_tool_started_is_emitted_only_for_calls_that_run() -> None:
    batch = [
        call("c1", "a"),
        call("c2", "blocked"),
        ToolCall("c3", "lookup", {"city": 3}),
        call("c4", "x", name="missing"),
    ]
    guard = before("guard", lambda c: block("no") if c.arguments["city"] == "blocked" else cont(c))
    pipe, _ = pipe_with([batch, "done"], before_tool=[guard])

    events, _ = await collect(pipe, start())

    assert [event.call.id for event in of_type(events, ev.ToolStarted)] == ["c1"]


async def test_tool_started_carries_the_rewritten_arguments() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[before("fix", rewrite(city="b"))])

    events, _ = await collect(pipe, start())

    assert [event.call for event in of_type(events, ev.ToolStarted)] == [call("c1", "b")]


async def test_tool_call_requested_carries_the_models_original_call() -> None:
    batch = calls("a", "b")
    pipe, _ = pipe_with([batch, "done"], before_tool=[before("fix", rewrite(city="z"))])

    events, _ = await collect(pipe, start())

    assert [
        (event.call, event.attempt, event.step) for event in of_type(events, ev.ToolCallRequested)
    ] == [(batch[0], 1, 1), (batch[1], 1, 1)]


async def test_tool_finished_is_emitted_for_every_call_blocked_invalid_and_unknown_included() -> (
    None
):
    batch = [
        call("c1", "a"),
        call("c2", "blocked"),
        ToolCall("c3", "lookup", {"city": 3}),
        call("c4", "x", name="missing"),
    ]
    guard = before("guard", lambda c: block("no") if c.arguments["city"] == "blocked" else cont(c))
    pipe, _ = pipe_with([batch, "done"], before_tool=[guard])

    events, _ = await collect(pipe, start())

    assert sorted(
        (event.call.id, event.result.error_class) for event in of_type(events, ev.ToolFinished)
    ) == [("c1", None), ("c2", "hook_blocked"), ("c3", "invalid_arguments"), ("c4", "unknown_tool")]


async def test_tool_finished_carries_the_rewritten_result() -> None:
    scrub = after("scrub", lambda r: cont(r.with_content("[hidden]")))
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(result="SECRET-42"), after_tool=[scrub])

    events, _ = await collect(pipe, start())

    assert [event.result.content for event in of_type(events, ev.ToolFinished)] == ["[hidden]"]


async def test_the_raw_result_of_a_rewritten_call_appears_in_no_event() -> None:
    scrub = after("scrub", lambda r: cont(r.with_content("[hidden]")))
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(result="SECRET-42"), after_tool=[scrub])

    events, _ = await collect(pipe, start())

    assert [event for event in events if "SECRET-42" in repr(event)] == []


async def test_the_raw_result_of_a_rewritten_call_is_not_in_the_audit() -> None:
    scrub = after("scrub", lambda r: cont(r.with_content("[hidden]")))
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(result="SECRET-42"), after_tool=[scrub])

    result = await pipe.run(start())

    assert "SECRET-42" not in repr(result.audit)


async def test_every_tool_hook_start_is_closed_once() -> None:
    batch = calls("a", "b", "c")
    hooks = [
        before("fix", lambda c: cont(c) if c.arguments["city"] != "b" else block("no")),
        before("asker", lambda c: ask("may I?") if c.arguments["city"] == "c" else cont(c)),
    ]
    pipe, _ = pipe_with(
        [batch, "done"],
        before_tool=hooks,
        after_tool=[after("scrub", lambda r: cont(r.with_content("x")))],
        permission=lambda c, q, t: False,
    )

    events, _ = await collect(pipe, start())

    assert pairing_problems(events) == []


async def _slow_before(c, turn):
    if c.arguments["city"] == "x":
        await anyio.sleep(10)
    return cont(c)


async def _slow_after(c, result, turn):
    if c.arguments["city"] == "x":
        await anyio.sleep(10)
    return cont(result)


@pytest.mark.parametrize("stage", ["before_tool", "after_tool"])
async def test_a_tool_hook_a_siblings_halt_cancels_is_closed_as_cancelled(
    autojump_clock, stage
) -> None:
    """Bug caught: a tool hook cancelled by a sibling call's halt left its HookStarted open
    and was missing from the audit, where a cancelled parallel member is closed as
    ``"cancelled"``."""
    slow = hook(_slow_before if stage == "before_tool" else _slow_after, name="slow")
    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        before_tool=[stopper(city="a", delay=1), *([slow] if stage == "before_tool" else [])],
        after_tool=[slow] if stage == "after_tool" else [],
        tool_concurrency=2,
    )

    events, result = await collect(pipe, start())

    assert pairing_problems(events) == []
    assert [(r.hook, r.verdict) for r in result.audit.hooks if r.hook == "slow"] == [
        ("slow", "cancelled")
    ]


async def test_an_ask_whose_permission_a_siblings_halt_cancels_is_closed_as_cancelled(
    autojump_clock,
) -> None:
    """Bug caught: a before-tool hook whose ``ask`` was waiting for permission when a sibling
    call halted the batch left its HookStarted open and was missing from the audit."""

    async def slow_permission(c, question, turn):
        await anyio.sleep(10)
        return True

    asker = before("asker", lambda c: ask("may I?") if c.arguments["city"] == "x" else cont(c))
    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        before_tool=[stopper(city="a", delay=1), asker],
        permission=slow_permission,
        tool_concurrency=2,
    )

    events, result = await collect(pipe, start())

    assert pairing_problems(events) == []
    assert [(r.hook, r.verdict) for r in result.audit.hooks if r.hook == "asker"] == [
        ("asker", "cancelled")
    ]


def halt_after(started: anyio.Event):
    """A before-tool hook that halts on city "a" once `started` is set, passing other calls:
    the sibling's hook, tool or permission is then known to be waiting, on either loop."""

    async def run(c, turn):
        if c.arguments["city"] != "a":
            return cont(c)
        await started.wait()
        return halt("stopper stopped a")

    return hook(run, name="stopper")


@pytest.mark.parametrize("stage", ["before_tool", "after_tool", "ask"])
async def test_a_tool_hook_a_siblings_halt_cancels_is_closed_as_cancelled_on_either_loop(
    stage,
) -> None:
    """Bug caught: a tool hook (or an ask's wait for permission) cancelled by a sibling
    call's halt left its HookStarted open and was missing from the audit, checked without a
    virtual clock so that asyncio's cancellation is covered too."""
    started = anyio.Event()

    async def wait_before(c, turn):
        if c.arguments["city"] == "x":
            started.set()
            await anyio.sleep_forever()
        return cont(c)

    async def wait_after(c, result, turn):
        if c.arguments["city"] == "x":
            started.set()
            await anyio.sleep_forever()
        return cont(result)

    async def permission(c, question, turn):
        started.set()
        await anyio.sleep_forever()

    def asker(c, turn):
        return ask("may I?") if c.arguments["city"] == "x" else cont(c)

    waits = {"before_tool": wait_before, "after_tool": wait_after, "ask": asker}
    slow = hook(waits[stage], name="slow")
    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        before_tool=[halt_after(started), *([slow] if stage != "after_tool" else [])],
        after_tool=[slow] if stage == "after_tool" else [],
        permission=permission if stage == "ask" else None,
        tool_concurrency=2,
    )

    events, result = await collect(pipe, start())

    assert pairing_problems(events) == []
    assert result.outcome == "halted"
    assert [(r.hook, r.verdict) for r in result.audit.hooks if r.hook == "slow"] == [
        ("slow", "cancelled")
    ]


async def test_a_failing_after_hook_of_a_cancelled_call_is_not_enforced_on_either_loop() -> None:
    """Bug caught: an after-tool hook failing on a call cancelled by a sibling's halt was
    reported as ``HookFailed(enforced=True)``, checked without a virtual clock so that
    asyncio's cancellation is covered too."""
    started = anyio.Event()

    async def lookup(city: str) -> str:
        if city == "x":
            started.set()
            await anyio.sleep_forever()
        return city

    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        tool(lookup),
        before_tool=[halt_after(started)],
        after_tool=[after("release", _raises)],
        tool_concurrency=2,
    )

    events, result = await collect(pipe, start())

    assert (result.outcome, [(e.hook, e.enforced) for e in of_type(events, ev.HookFailed)]) == (
        "halted",
        [("release", False)],
    )


async def test_a_whole_turn_emits_its_events_in_order() -> None:
    batch = calls("a", "b")
    guard = before("guard", lambda c: block("no") if c.arguments["city"] == "b" else cont(c))
    scrub = after("scrub", lambda r: cont(r.with_content("clean")))
    pipe, _ = pipe_with(
        [batch, "sunny"], before_tool=[guard], after_tool=[scrub], tool_concurrency=1
    )

    events, _ = await collect(pipe, start())

    assert [(type(e).__name__, getattr(e, "hook", None)) for e in events] == [
        ("TurnStarted", None),
        ("ModelCalled", None),
        ("ModelFinished", None),
        ("ToolCallRequested", None),
        ("ToolCallRequested", None),
        ("HookStarted", "guard"),
        ("HookFinished", "guard"),
        ("ToolStarted", None),
        ("HookStarted", "scrub"),
        ("HookFinished", "scrub"),
        ("ToolFinished", None),
        ("HookStarted", "guard"),
        ("HookFinished", "guard"),
        ("ToolBlocked", "guard"),
        ("ToolFinished", None),
        ("ToolStepFinished", None),
        ("ModelCalled", None),
        ("TextDelta", None),
        ("ModelFinished", None),
        ("ReplyReady", None),
        ("TurnFinished", None),
    ]


# -- before-tool hooks: rewrites ----------------------------------------------------------------


async def test_before_tool_rewrites_chain_each_hook_sees_the_previous_rewrite() -> None:
    trace: list = []
    hooks = [
        before("first", rewrite(city="b"), trace),
        before("second", rewrite(unit="c"), trace),
    ]

    async def forecast(city: str, unit: str = "k") -> str:
        return f"{city} {unit}"

    pipe, _ = pipe_with([calls("a", name="forecast"), "done"], tool(forecast), before_tool=hooks)

    await pipe.run(start())

    assert trace == [("first", {"city": "a"}), ("second", {"city": "b"})]


async def test_the_tool_runs_with_the_final_rewritten_arguments() -> None:
    seen: list = []

    async def forecast(city: str, unit: str = "k") -> str:
        seen.append((city, unit))
        return "ok"

    hooks = [before("first", rewrite(city="b")), before("second", rewrite(unit="c"))]
    pipe, _ = pipe_with([calls("a", name="forecast"), "done"], tool(forecast), before_tool=hooks)

    await pipe.run(start())

    assert seen == [("b", "c")]


async def test_a_rewritten_call_is_marked_in_its_results_meta() -> None:
    hooks = [before("first", rewrite(city="b")), before("keep", passing)]
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=hooks)

    result = await pipe.run(start())

    assert results_of(result.reply.messages)[0].meta[TOOL_HOOKS] == {
        "arguments_rewritten_by": ["first"],
        "arguments": {"city": "b"},
    }


async def test_the_reply_keeps_the_call_as_the_model_wrote_it() -> None:
    batch = calls("a")
    pipe, _ = pipe_with([batch, "done"], before_tool=[before("fix", rewrite(city="b"))])

    result = await pipe.run(start())

    assert result.reply.messages[0] == Message("assistant", tuple(batch))


async def test_a_rewrite_to_arguments_the_tool_refuses_gives_invalid_arguments() -> None:
    trace: list[str] = []
    fix = before("fix", lambda c: cont(c.with_arguments({"city": 7})))
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(trace), before_tool=[fix])

    result = await pipe.run(start())

    assert (trace, results_of(result.reply.messages)[0].error_class) == ([], "invalid_arguments")


# -- before-tool hooks: block ------------------------------------------------------------------


async def test_block_gives_the_model_a_hook_blocked_error_with_the_reason() -> None:
    pipe, _ = pipe_with(
        [calls("a"), "done"], before_tool=[before("guard", lambda c: block("not today"))]
    )

    result = await pipe.run(start())

    (blocked,) = results_of(result.reply.messages)
    assert (blocked.call_id, blocked.content, blocked.is_error, blocked.error_class) == (
        "c1",
        "not today",
        True,
        "hook_blocked",
    )


async def test_block_marks_the_result_as_produced_by_the_hook() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[before("guard", lambda c: block("no"))])

    result = await pipe.run(start())

    assert results_of(result.reply.messages)[0].meta[TOOL_HOOKS] == {"blocked_by": "guard"}


async def test_block_emits_tool_blocked_naming_the_hook() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[before("guard", lambda c: block("no"))])

    events, _ = await collect(pipe, start())

    assert of_type(events, ev.ToolBlocked) == [
        ev.ToolBlocked(TURN_REF, call("c1", "a"), "guard", "no")
    ]


async def test_block_stops_the_later_before_hooks() -> None:
    trace: list = []
    hooks = [before("guard", lambda c: block("no"), trace), before("later", passing, trace)]
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=hooks)

    await pipe.run(start())

    assert trace == [("guard", {"city": "a"})]


async def test_a_blocked_call_never_runs() -> None:
    trace: list[str] = []
    pipe, _ = pipe_with(
        [calls("a"), "done"],
        lookup_tool(trace),
        before_tool=[before("guard", lambda c: block("no"))],
    )

    await pipe.run(start())

    assert trace == []


async def test_after_hooks_do_not_run_for_a_blocked_call() -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [calls("a"), "done"],
        before_tool=[before("guard", lambda c: block("no"))],
        after_tool=[after("scrub", cont, trace)],
    )

    await pipe.run(start())

    assert trace == []


# -- before-tool hooks: ask --------------------------------------------------------------------


def asking(question: str = "may I?"):
    return before("asker", lambda c: ask(question))


async def test_an_interrupt_out_of_the_permission_callback_ends_the_asking_hook() -> None:
    """Bug caught: a permission callback raising SystemExit or KeyboardInterrupt (a Ctrl-C
    at its prompt) left the asking hook's HookStarted open, where an interrupt out of the
    hook itself ends it with an enforced HookFailed."""

    def permission(c, question, turn):
        raise SystemExit(3)

    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[asking()], permission=permission)
    seen: list[ev.Event] = []

    with pytest.raises(SystemExit) as info:
        await collect_into(seen, pipe, start())

    assert info.value.code == 3
    assert [(e.hook, e.error, e.enforced) for e in of_type(seen, ev.HookFailed)] == [
        ("asker", "SystemExit: 3", True)
    ]
    assert pairing_problems(seen) == []


async def test_ask_runs_the_call_when_permission_says_yes() -> None:
    trace: list[str] = []
    pipe, _ = pipe_with(
        [calls("a"), "done"],
        lookup_tool(trace),
        before_tool=[asking()],
        permission=lambda c, q, t: True,
    )

    await pipe.run(start())

    assert trace == ["lookup:a"]


async def test_permission_is_asked_with_the_call_the_question_and_the_turn() -> None:
    asked: list = []

    def permission(c, question, turn):
        asked.append((c, question, turn.turn_ref))
        return True

    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[asking("ok?")], permission=permission)

    await pipe.run(start())

    assert asked == [(call("c1", "a"), "ok?", TURN_REF)]


async def test_ask_blocks_the_call_when_permission_says_no() -> None:
    trace: list[str] = []
    pipe, _ = pipe_with(
        [calls("a"), "done"],
        lookup_tool(trace),
        before_tool=[asking("may I?")],
        permission=lambda c, q, t: False,
    )

    result = await pipe.run(start())

    (denied,) = results_of(result.reply.messages)
    assert (trace, denied.error_class, "permission denied" in denied.content) == (
        [],
        "hook_blocked",
        True,
    )


async def test_ask_without_a_permission_callback_blocks_the_call() -> None:
    trace: list[str] = []
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(trace), before_tool=[asking()])

    result = await pipe.run(start())

    assert (trace, results_of(result.reply.messages)[0].error_class) == ([], "hook_blocked")


async def test_ask_refused_emits_tool_blocked_naming_the_asking_hook() -> None:
    pipe, _ = pipe_with(
        [calls("a"), "done"], before_tool=[asking()], permission=lambda c, q, t: False
    )

    events, _ = await collect(pipe, start())

    assert [event.hook for event in of_type(events, ev.ToolBlocked)] == ["asker"]


async def test_an_async_permission_callback_is_awaited() -> None:
    trace: list[str] = []

    async def permission(c, question, turn):
        await anyio.lowlevel.checkpoint()
        return c.arguments["city"] == "a"

    pipe, _ = pipe_with(
        [calls("a", "b"), "done"], lookup_tool(trace), before_tool=[asking()], permission=permission
    )

    await pipe.run(start())

    assert trace == ["lookup:a"]


async def test_a_raising_permission_callback_fails_the_turn_naming_the_asking_hook() -> None:
    def permission(c, question, turn):
        raise RuntimeError("the policy service is down")

    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[asking()], permission=permission)

    with pytest.raises(HookFailed, match="asker") as caught:
        await pipe.run(start())
    assert (caught.value.hook, caught.value.stage) == ("asker", "before_tool")


async def test_a_cancelled_error_the_permission_callback_raises_itself_fails_the_turn() -> None:
    """Catches: a permission callback whose awaited answer was cancelled by someone else (a
    UI's future), nobody cancelling the turn, ending the call's task with no result: a bare
    AssertionError out of run() on asyncio instead of the asking hook's failure."""

    async def permission(c, question, turn):
        raise asyncio.CancelledError()

    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[asking()], permission=permission)

    with pytest.raises(HookFailed, match="raised CancelledError when hook 'asker'") as caught:
        await pipe.run(start())
    assert (caught.value.hook, caught.value.stage) == ("asker", "before_tool")


async def test_a_permission_callback_returning_a_non_bool_is_a_hook_return_error() -> None:
    pipe, _ = pipe_with(
        [calls("a"), "done"], before_tool=[asking()], permission=lambda c, q, t: "yes"
    )

    with pytest.raises(HookReturnError, match="True or False") as caught:
        await pipe.run(start())
    assert caught.value.hook == "asker"


# -- before-tool hooks: halt -------------------------------------------------------------------


def stopper(name: str = "stopper", *, city: str = "a", delay: float = 0, **options):
    """A before-tool hook that halts on `city` (after `delay`) and passes other calls."""

    async def run(c, turn):
        if c.arguments["city"] != city:
            return cont(c)
        if delay:
            await anyio.sleep(delay)
        return halt(f"{name} stopped {city}")

    return hook(run, name=name, **options)


async def test_a_before_tool_halt_halts_the_turn_naming_the_hook() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[stopper()])

    result = await pipe.run(start())

    assert (result.outcome, result.halt.hook, result.halt.reason) == (
        "halted",
        "stopper",
        "stopper stopped a",
    )


async def test_a_before_tool_halt_calls_the_model_no_more() -> None:
    pipe, model = pipe_with([calls("a"), "done"], before_tool=[stopper()])

    await pipe.run(start())

    assert len(model.requests) == 1


async def test_a_before_tool_halt_commits_nothing_through_a_session() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[stopper()])
    log = MemoryLog()

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        await session.send("weather?")

    assert await log.load(CONVERSATION) == Context()


async def tools_run_around_a_halt(halt_on: str, concurrency: int) -> list[list[str]]:
    """The tools each of 20 turns ran, calls ``a, b, c`` in one step, halting on `halt_on`.

    Trio runs the tasks woken together in either order: repeated, so that a call started
    after the halt is caught whichever order the scheduler picks.
    """
    ran: list[list[str]] = []
    for _ in range(20):
        trace: list[str] = []
        pipe, _ = pipe_with(
            [calls("a", "b", "c"), "done"],
            lookup_tool(trace),
            before_tool=[stopper(city=halt_on)],
            tool_concurrency=concurrency,
        )
        result = await pipe.run(start())
        assert (result.outcome, result.halt.reason) == ("halted", f"stopper stopped {halt_on}")
        ran.append(trace)
    return ran


async def test_a_before_tool_halt_drops_the_calls_not_started() -> None:
    assert await tools_run_around_a_halt("a", concurrency=1) == [[]] * 20


async def test_a_before_tool_halt_drops_a_later_call_its_hooks_already_let_through() -> None:
    """Catches: with room for several calls at once, a call after the halting one started
    anyway — its before-tool hooks ran while the halting call's task yielded, and its tool
    executed (a side effect after the policy said stop) before the batch was cancelled."""
    ran = await tools_run_around_a_halt("b", concurrency=4)

    # The call before the halting one may have run; the one after it never does.
    assert [[city for city in trace if city != "lookup:a"] for trace in ran] == [[]] * 20


async def test_a_before_tool_halt_cancels_a_call_in_flight(autojump_clock) -> None:
    trace: list[str] = []

    async def slow(city: str) -> str:
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            trace.append("cancelled")
            raise
        return "late"

    pipe, _ = pipe_with(
        [[call("c1", "x", name="slow"), call("c2", "a")], "done"],
        tool(slow),
        lookup_tool(),
        before_tool=[stopper(city="a", delay=1)],
        tool_concurrency=2,
    )

    await pipe.run(start())

    assert trace == ["cancelled"]


async def test_after_hooks_see_a_cancelled_call(autojump_clock) -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        lookup_tool(delays={"x": 10}),
        before_tool=[stopper(city="a", delay=1)],
        after_tool=[after("release", cont, trace)],
        tool_concurrency=2,
    )

    await pipe.run(start())

    assert [(name, call_id, error) for name, call_id, error, _ in trace] == [
        ("release", "c1", "cancelled")
    ]


def _raises(result):
    raise RuntimeError("release failed")


@pytest.mark.parametrize("decide", [_raises, lambda r: r], ids=["raises", "wrong-return"])
async def test_a_failing_after_hook_of_a_cancelled_call_is_not_said_to_stop_the_turn(
    autojump_clock, decide
) -> None:
    """Bug caught: an after-tool hook failing on a call cancelled by a sibling's halt was
    reported as ``HookFailed(enforced=True)``, a failure that stops the turn, while nothing
    it does is kept and the turn halted."""
    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        lookup_tool(delays={"x": 10}),
        before_tool=[stopper(city="a", delay=1)],
        after_tool=[after("release", decide)],
        tool_concurrency=2,
    )

    events, result = await collect(pipe, start())

    assert (result.outcome, [(e.hook, e.enforced) for e in of_type(events, ev.HookFailed)]) == (
        "halted",
        [("release", False)],
    )


def _fails(value):
    raise RuntimeError("predicate failed")


@pytest.mark.parametrize("option", ["match", "when"])
async def test_a_failing_predicate_of_an_after_hook_of_a_cancelled_call_is_not_enforced(
    autojump_clock, option
) -> None:
    """Bug caught: an after-tool hook whose match= or when= predicate raised on a call
    cancelled by a sibling's halt was reported as ``HookFailed(enforced=True)``, a failure
    that stops the turn, while the hook's own failure there is not enforced."""
    pipe, _ = pipe_with(
        [[call("c1", "x"), call("c2", "a")], "done"],
        lookup_tool(delays={"x": 10}),
        before_tool=[stopper(city="a", delay=1)],
        after_tool=[after("release", lambda r: cont(r), **{option: _fails})],
        tool_concurrency=2,
    )

    events, result = await collect(pipe, start())

    assert (result.outcome, [(e.hook, e.enforced) for e in of_type(events, ev.HookFailed)]) == (
        "halted",
        [("release", False)],
    )
    assert pairing_problems(events) == []


# -- after-tool hooks ---------------------------------------------------------------------------


async def test_after_tool_rewrites_chain() -> None:
    hooks = [
        after("redact", lambda r: cont(r.with_content(r.content.replace("secret", "[x]")))),
        after("truncate", lambda r: cont(r.with_content(r.content[:9]))),
    ]
    pipe, _ = pipe_with(
        [calls("a"), "done"], lookup_tool(result="the secret plan"), after_tool=hooks
    )

    result = await pipe.run(start())

    assert results_of(result.reply.messages)[0].content == "the [x] p"


async def test_a_rewritten_result_is_marked_with_the_rewriting_hooks() -> None:
    hooks = [
        after("redact", lambda r: cont(r.with_content("[x]"))),
        after("keep", cont),
        after("shout", lambda r: cont(r.with_content(r.content.upper()))),
    ]
    pipe, _ = pipe_with([calls("a"), "done"], after_tool=hooks)

    result = await pipe.run(start())

    assert results_of(result.reply.messages)[0].meta[TOOL_HOOKS] == {
        "result_rewritten_by": ["redact", "shout"]
    }


async def test_an_unchanged_result_carries_no_provenance() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], after_tool=[after("keep", cont)])

    result = await pipe.run(start())

    assert results_of(result.reply.messages)[0] == ToolResult("c1", "lookup(a)")


async def test_an_after_tool_halt_halts_the_turn_naming_the_hook() -> None:
    pipe, model = pipe_with(
        [calls("a"), "done"], after_tool=[after("judge", lambda r: halt("leak"))]
    )

    result = await pipe.run(start())

    assert (result.outcome, result.halt.hook, len(model.requests)) == ("halted", "judge", 1)


async def test_after_hooks_run_for_a_tool_error() -> None:
    trace: list = []

    async def explode(city: str) -> str:
        raise LookupError("gone")

    pipe, _ = pipe_with(
        [calls("a", name="explode"), "sorry"],
        tool(explode),
        after_tool=[after("watch", cont, trace)],
    )

    await pipe.run(start())

    assert [(name, error) for name, _, error, _ in trace] == [("watch", "tool_error")]


# -- match= and when= -----------------------------------------------------------------------


async def test_match_by_exact_name_applies_to_that_tool_only() -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [[call("c1", "a", name="get"), call("c2", "b", name="get_weather")], "done"],
        lookup_tool(name="get"),
        lookup_tool(name="get_weather"),
        before_tool=[before("only_get", passing, trace, match="get")],
        tool_concurrency=1,
    )

    await pipe.run(start())

    assert trace == [("only_get", {"city": "a"})]


async def test_match_by_regex_needs_a_full_match() -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [[call("c1", "a", name="get"), call("c2", "b", name="get_weather")], "done"],
        lookup_tool(name="get"),
        lookup_tool(name="get_weather"),
        before_tool=[before("only_get", passing, trace, match=re.compile("get"))],
        tool_concurrency=1,
    )

    await pipe.run(start())

    assert trace == [("only_get", {"city": "a"})]


async def test_match_by_regex_applies_to_every_tool_it_fully_matches() -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [[call("c1", "a", name="get"), call("c2", "b", name="get_weather")], "done"],
        lookup_tool(name="get"),
        lookup_tool(name="get_weather"),
        before_tool=[before("all_gets", passing, trace, match=re.compile("get.*"))],
        tool_concurrency=1,
    )

    await pipe.run(start())

    assert trace == [("all_gets", {"city": "a"}), ("all_gets", {"city": "b"})]


async def test_match_by_predicate_applies_where_it_is_true() -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [[call("c1", "a", name="get"), call("c2", "b", name="get_weather")], "done"],
        lookup_tool(name="get"),
        lookup_tool(name="get_weather"),
        before_tool=[before("weather", passing, trace, match=lambda name: "weather" in name)],
        tool_concurrency=1,
    )

    await pipe.run(start())

    assert trace == [("weather", {"city": "b"})]


async def test_after_tool_match_applies_to_the_matching_tool_only() -> None:
    trace: list = []
    pipe, _ = pipe_with(
        [[call("c1", "a", name="get"), call("c2", "b", name="put")], "done"],
        lookup_tool(name="get"),
        lookup_tool(name="put"),
        after_tool=[after("on_put", cont, trace, match="put")],
        tool_concurrency=1,
    )

    await pipe.run(start())

    assert [(name, call_id) for name, call_id, _, _ in trace] == [("on_put", "c2")]


async def test_a_raising_match_predicate_fails_the_turn_naming_the_hook() -> None:
    def picky(name):
        raise ValueError("cannot decide")

    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[before("picky", passing, match=picky)])

    with pytest.raises(HookFailed, match="picky") as caught:
        await pipe.run(start())
    assert caught.value.stage == "before_tool"


async def test_a_tool_hook_whose_when_is_false_does_not_run() -> None:
    trace: list = []
    guard = before(
        "guard", lambda c: block("no"), trace, when=lambda turn: turn.scope.current_user != "admin"
    )
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[guard])

    result = await pipe.run(start(scope=Scope(current_user="admin")))

    assert (trace, results_of(result.reply.messages)[0].is_error) == ([], False)


async def test_a_tool_hook_whose_when_is_false_is_recorded_as_skipped() -> None:
    guard = before("guard", lambda c: block("no"), when=lambda turn: False)
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[guard])

    events, _ = await collect(pipe, start())

    assert of_type(events, ev.HookSkipped) == [ev.HookSkipped(TURN_REF, "guard", "before_tool")]


async def test_a_chain_of_tool_hooks_runs_its_members_in_order_with_prefixed_names() -> None:
    trace: list = []
    policy = chain(before("first", passing, trace), before("second", passing, trace), name="policy")
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[policy])

    events, _ = await collect(pipe, start())

    assert [event.hook for event in of_type(events, ev.HookStarted)] == [
        "policy.first",
        "policy.second",
    ]


# -- wrong signals and failures --------------------------------------------------------------


async def test_a_before_hook_returning_the_wrong_signal_names_the_hook_and_stage() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[before("sloppy", lambda c: c)])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(before_tool, position 1\)") as caught:
        await pipe.run(start())
    assert (caught.value.hook, caught.value.stage) == ("sloppy", "before_tool")


async def test_an_after_hook_returning_the_wrong_signal_names_the_hook_and_stage() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], after_tool=[after("sloppy", lambda r: block("no"))])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(after_tool, position 1\)") as caught:
        await pipe.run(start())
    assert (caught.value.hook, caught.value.stage) == ("sloppy", "after_tool")


async def test_a_before_hook_returning_none_is_told_to_return_the_call() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[before("sloppy", lambda c: None)])

    with pytest.raises(HookReturnError, match=re.escape("return cont(call)")):
        await pipe.run(start())


async def test_an_after_hook_returning_the_bare_result_is_told_to_wrap_it() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], after_tool=[after("sloppy", lambda r: r)])

    with pytest.raises(HookReturnError, match=re.escape("cont(result)")) as caught:
        await pipe.run(start())
    assert "inject" not in str(caught.value)


@pytest.mark.parametrize(
    ("stage", "returned", "fix"),
    [
        ("before_tool", lambda turn: turn, "return cont(call)"),
        ("after_tool", lambda turn: turn, "return cont(result)"),
        ("before_tool", lambda turn: regenerate("again"), "regenerate() is for post hooks"),
        ("after_tool", lambda turn: block("no"), "block() is for before_tool hooks"),
        ("after_tool", lambda turn: ask("may I?"), "ask() is for before_tool hooks"),
    ],
    ids=["before-turn", "after-turn", "before-regenerate", "after-block", "after-ask"],
)
async def test_a_tool_hook_returning_another_stage_s_value_is_told_the_fix(
    stage: str, returned, fix: str
) -> None:
    """Catches: a tool hook returning the turn (as a pre hook does), a regenerate, or a
    block or ask after the call ran, told only what it returned, without the likely fix."""

    def sloppy(*arguments):
        return returned(arguments[-1])

    pipe, _ = pipe_with([calls("a"), "done"], **{stage: [hook(sloppy, name="sloppy")]})

    with pytest.raises(HookReturnError, match=r"'sloppy' .* — ") as caught:
        await pipe.run(start())
    assert fix in str(caught.value)


async def test_a_before_hook_changing_the_call_id_is_a_hook_return_error() -> None:
    other = before("swap", lambda c: cont(attrs.evolve(c, id="c9")))
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[other])

    with pytest.raises(HookReturnError, match=r"'swap'.*changed the call's id"):
        await pipe.run(start())


async def test_a_before_hook_changing_the_tool_name_is_a_hook_return_error() -> None:
    other = before("swap", lambda c: cont(attrs.evolve(c, name="delete")))
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[other])

    with pytest.raises(HookReturnError, match=r"'swap'.*changed the call's name"):
        await pipe.run(start())


async def test_a_before_hook_rewriting_the_arguments_to_no_mapping_is_a_hook_return_error():
    """Catches: `call.with_arguments([...])` accepted from a before-tool hook, so the turn
    failed later with a bare "cannot convert dictionary update sequence" naming no hook."""
    other = before("rewrite", lambda c: cont(c.with_arguments(["q"])))
    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[other])

    with pytest.raises(HookReturnError, match=r"'rewrite'.*malformed call: ToolCall.arguments"):
        await pipe.run(start())


async def test_an_after_hook_rewriting_the_content_to_no_text_is_a_hook_return_error():
    """Catches: `result.with_content(3)` accepted from an after-tool hook, so the turn failed
    later with a bare TypeError naming no hook."""
    other = after("rewrite", lambda r: cont(r.with_content(3)))
    pipe, _ = pipe_with([calls("a"), "done"], after_tool=[other])

    with pytest.raises(HookReturnError, match=r"'rewrite'.*malformed result: ToolResult.call_id"):
        await pipe.run(start())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"is_error": "yes"}, "ToolResult.is_error must be a bool, got str 'yes'"),
        ({"error_class": 5}, "ToolResult.error_class must be a str or None, got int 5"),
    ],
    ids=["is_error", "error_class"],
)
async def test_an_after_hook_rewriting_a_result_a_log_cannot_read_is_a_hook_return_error(
    tmp_path, change, problem
) -> None:
    """Bug caught: an after-tool hook's result with ``is_error="yes"`` (or a number for its
    ``error_class``) was committed to the SQLite log, which then refused to load the
    conversation ever again."""
    fix = after("fix", lambda r: cont(attrs.evolve(r, **change)))
    pipe, _ = pipe_with([calls("a"), "done"], after_tool=[fix])
    log = SQLiteLog(tmp_path / "log.db")

    with pytest.raises(HookReturnError, match=rf"'fix'.*malformed result: {re.escape(problem)}"):
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            await session.send("weather?")

    assert (await log.load(CONVERSATION)).messages == ()


async def test_a_raising_before_hook_fails_the_turn_by_default() -> None:
    def broken(c, turn):
        raise RuntimeError("policy unavailable")

    pipe, _ = pipe_with([calls("a"), "done"], before_tool=[hook(broken, name="broken")])

    with pytest.raises(HookFailed, match="broken") as caught:
        await pipe.run(start())
    assert isinstance(caught.value.__cause__, RuntimeError)


async def test_a_raising_before_hook_that_fails_open_lets_the_call_run() -> None:
    trace: list[str] = []

    def broken(c, turn):
        raise RuntimeError("policy unavailable")

    pipe, _ = pipe_with(
        [calls("a"), "done"],
        lookup_tool(trace),
        before_tool=[hook(broken, name="broken", on_error="skip")],
    )

    await pipe.run(start())

    assert trace == ["lookup:a"]


async def test_a_raising_before_hook_that_fails_open_is_recorded_as_an_event() -> None:
    def broken(c, turn):
        raise RuntimeError("policy unavailable")

    pipe, _ = pipe_with(
        [calls("a"), "done"], before_tool=[hook(broken, name="broken", on_error="skip")]
    )

    events, _ = await collect(pipe, start())

    assert of_type(events, ev.HookFailed) == [
        ev.HookFailed(TURN_REF, "broken", "before_tool", "RuntimeError: policy unavailable", False)
    ]


async def test_a_shadow_before_hook_that_blocks_does_not_stop_the_call() -> None:
    trace: list[str] = []
    pipe, _ = pipe_with(
        [calls("a"), "done"],
        lookup_tool(trace),
        before_tool=[before("trial", lambda c: block("would block"), shadow=True)],
    )

    await pipe.run(start())

    assert trace == ["lookup:a"]


async def test_a_shadow_before_hooks_block_is_recorded_as_a_shadow_verdict() -> None:
    pipe, _ = pipe_with(
        [calls("a"), "done"],
        before_tool=[before("trial", lambda c: block("would block"), shadow=True)],
    )

    events, _ = await collect(pipe, start())

    assert of_type(events, ev.ShadowVerdict) == [
        ev.ShadowVerdict(TURN_REF, "trial", "before_tool", "block", "would block")
    ]


# -- bounds: max_steps, tool_choice, concurrency, order -----------------------------------------


def always_calling() -> FunctionModel:
    """A model that asks for one more tool call every time it is called."""

    def reply(request):
        return [call(f"c{len(request.messages)}", "a")]

    return FunctionModel(reply)


@pytest.mark.parametrize("max_steps", [1, 2, 3])
async def test_a_model_that_keeps_calling_tools_stops_after_max_steps_model_calls(
    max_steps,
) -> None:
    model = always_calling()
    pipe = Pipeline(model=model, tools=[lookup_tool()], max_steps=max_steps)

    with pytest.raises(StepLimitExceeded):
        await pipe.run(start())
    assert len(model.requests) == max_steps


async def test_step_limit_exceeded_carries_the_attempt_and_max_steps() -> None:
    """Catches: the bound and the attempt it was hit on only in the message text."""
    pipe = Pipeline(model=always_calling(), tools=[lookup_tool()], max_steps=3)

    with pytest.raises(StepLimitExceeded) as excinfo:
        await pipe.run(start())
    assert (excinfo.value.attempt, excinfo.value.max_steps) == (1, 3)


async def test_the_tool_calls_of_the_last_allowed_model_call_do_not_run() -> None:
    trace: list[str] = []
    pipe = Pipeline(model=always_calling(), tools=[lookup_tool(trace)], max_steps=2)

    with pytest.raises(StepLimitExceeded):
        await pipe.run(start())
    assert trace == ["lookup:a"]


async def test_a_final_answer_on_the_last_allowed_model_call_completes() -> None:
    pipe, _ = pipe_with([calls("a"), "done"], max_steps=2)

    result = await pipe.run(start())

    assert result.outcome == "completed"


async def test_tool_choice_required_is_reset_after_the_first_tool_step() -> None:
    pipe, model = pipe_with(
        [calls("a"), calls("b"), "done"], pre=[shaping("force", tool_choice="required")]
    )

    await pipe.run(start())

    assert [request.options.tool_choice for request in model.requests] == ["required", None, None]


async def test_tool_choice_auto_is_kept_after_a_tool_step() -> None:
    pipe, model = pipe_with([calls("a"), "done"], pre=[shaping("auto", tool_choice="auto")])

    await pipe.run(start())

    assert [request.options.tool_choice for request in model.requests] == ["auto", "auto"]


@pytest.mark.parametrize(
    "choice",
    [
        pytest.param("required", id="openai-required"),
        pytest.param({"type": "function", "function": {"name": "lookup"}}, id="openai-function"),
    ],
)
async def test_a_forcing_tool_choice_in_extra_is_dropped_after_the_first_tool_step(choice) -> None:
    """Bug caught: a forcing tool_choice given through extra (in the provider's own form) was
    sent again on every model call after a tool step, forcing a tool call on each until
    max_steps, where the option's own tool_choice is dropped after the first tool step."""
    extra = {"tool_choice": choice, "seed": 7}
    pipe, model = pipe_with([calls("a"), calls("b"), "done"], pre=[shaping("force", extra=extra)])

    await pipe.run(start())

    assert [dict(request.options.extra) for request in model.requests] == [
        extra,
        {"seed": 7},
        {"seed": 7},
    ]


ONLY_LOOKUP = [{"type": "function", "function": {"name": "lookup"}}]


@pytest.mark.parametrize(
    ("choice", "after"),
    [
        pytest.param(
            {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": ONLY_LOOKUP}},
            {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": ONLY_LOOKUP}},
            id="openai-allowed-required",
        ),
        pytest.param(
            {"type": "any", "disable_parallel_tool_use": True},
            {"type": "auto", "disable_parallel_tool_use": True},
            id="anthropic-any-no-parallel",
        ),
        pytest.param(
            {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True},
            {"type": "auto", "disable_parallel_tool_use": True},
            id="anthropic-tool-no-parallel",
        ),
        pytest.param({"type": "any"}, {"type": "auto"}, id="anthropic-any"),
        pytest.param({"type": "tool", "name": "lookup"}, {"type": "auto"}, id="anthropic-tool"),
    ],
)
async def test_a_forcing_tool_choice_in_extra_keeps_its_restrictions_after_a_tool_step(
    choice, after
) -> None:
    """Bug caught: a forcing tool_choice in extra was dropped whole after the first tool step,
    and its restrictions with it: OpenAI's allowed_tools in "required" mode let the later
    steps call any tool of the request, and Anthropic's any or tool lost its
    disable_parallel_tool_use. It is relaxed to the choice that forces nothing instead."""
    extra = {"tool_choice": choice, "seed": 7}
    pipe, model = pipe_with([calls("a"), calls("b"), "done"], pre=[shaping("force", extra=extra)])

    await pipe.run(start())

    relaxed = {"tool_choice": after, "seed": 7}
    assert [dict(request.options.extra) for request in model.requests] == [
        extra,
        relaxed,
        relaxed,
    ]


@pytest.mark.parametrize(
    "choice",
    [
        pytest.param("auto", id="auto"),
        pytest.param("none", id="none"),
        pytest.param({"type": "auto", "disable_parallel_tool_use": True}, id="anthropic-auto"),
        pytest.param(
            {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
            id="openai-allowed-auto",
        ),
    ],
)
async def test_a_tool_choice_in_extra_that_forces_nothing_is_kept_after_a_tool_step(
    choice,
) -> None:
    """Bug caught: dropping every tool_choice in extra after a tool step would also drop
    Anthropic's {"type": "auto", "disable_parallel_tool_use": True}, letting the model call
    tools in parallel from the second step on."""
    extra = {"tool_choice": choice}
    pipe, model = pipe_with([calls("a"), "done"], pre=[shaping("auto", extra=extra)])

    await pipe.run(start())

    assert [dict(request.options.extra) for request in model.requests] == [extra, extra]


async def test_at_most_tool_concurrency_calls_run_at_once(autojump_clock) -> None:
    running = 0
    peak = 0

    async def busy(city: str) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(1)
        running -= 1
        return city

    pipe, _ = pipe_with(
        [calls("a", "b", "c", "d", "e", name="busy"), "done"], tool(busy), tool_concurrency=2
    )

    await pipe.run(start())

    assert peak == 2


@pytest.mark.parametrize("concurrency", [1, 2, 4])
async def test_calls_start_in_call_order(autojump_clock, concurrency) -> None:
    # Trio runs tasks woken together in either order: repeat, so that an order left to the
    # scheduler shows.
    orders: list[list[str]] = []
    for _ in range(10):
        trace: list[str] = []
        pipe, _ = pipe_with(
            [calls("a", "b", "c", "d"), "done"],
            lookup_tool(trace, delays={"a": 4, "b": 3, "c": 2, "d": 1}),
            tool_concurrency=concurrency,
        )
        await pipe.run(start())
        orders.append(trace)

    assert orders == [["lookup:a", "lookup:b", "lookup:c", "lookup:d"]] * 10


async def test_a_call_to_a_tool_not_active_this_turn_gets_unknown_tool_listing_the_active_ones() -> (
    None
):
    trace: list[str] = []
    pipe, _ = pipe_with(
        [[call("c1", "a", name="delete")], "done"],
        lookup_tool(),
        lookup_tool(trace, name="delete"),
        pre=[shaping("narrow", active_tools=["lookup"])],
    )

    result = await pipe.run(start())

    (unknown,) = results_of(result.reply.messages)
    assert (trace, unknown.error_class, "['lookup']" in unknown.content) == (
        [],
        "unknown_tool",
        True,
    )


# -- request shaping ----------------------------------------------------------------------------


async def test_required_tool_choice_with_every_tool_narrowed_away_names_the_narrowing_hook() -> (
    None
):
    pipe, _ = pipe_with(["done"], pre=[shaping("narrow", active_tools=[])])

    with pytest.raises(RequestError, match="'narrow'"):
        await pipe.run(start().with_request(tool_choice="required"))


@pytest.mark.parametrize(
    ("shapers", "choice", "culprit"),
    [
        ([("narrow", {"active_tools": []})], "required", "narrow"),
        ([("choose", {"tool_choice": "missing"})], None, "choose"),
        (
            [("narrow", {"active_tools": []}), ("force", {"tool_choice": "required"})],
            None,
            "narrow",
        ),
        (
            [("narrow", {"active_tools": ["lookup"]}), ("choose", {"tool_choice": "x"})],
            None,
            "choose",
        ),
        ([], "missing", None),
    ],
)
async def test_a_request_error_carries_the_hook_that_shaped_the_request(
    shapers, choice, culprit
) -> None:
    """Catches: RequestError naming its culprit only in the message; blaming the hook that
    set a satisfiable choice when another narrowed every tool away."""
    pipe, _ = pipe_with(["done"], pre=[shaping(name, **options) for name, options in shapers])
    turn = start() if choice is None else start().with_request(tool_choice=choice)

    with pytest.raises(RequestError) as excinfo:
        await pipe.run(turn)
    assert excinfo.value.hook == culprit


async def test_an_impossible_tool_choice_reaches_no_model() -> None:
    pipe, model = pipe_with(["done"], pre=[shaping("narrow", active_tools=[])])

    with pytest.raises(RequestError):
        await pipe.run(start().with_request(tool_choice="required"))
    assert model.requests == []


async def test_a_named_tool_choice_that_is_not_active_names_the_narrowing_hook() -> None:
    pipe, _ = pipe_with(
        ["done"],
        lookup_tool(),
        lookup_tool(name="delete"),
        pre=[shaping("narrow", active_tools=["lookup"])],
    )

    with pytest.raises(RequestError, match=r"'delete'.*'narrow'"):
        await pipe.run(start().with_request(tool_choice="delete"))


async def test_a_context_offering_tools_the_pipeline_cannot_run_is_a_request_error() -> None:
    stranger = ToolSpec("launch", "Launch something.")
    pipe, model = pipe_with(["done"])

    with pytest.raises(RequestError, match="launch"):
        await pipe.run(start(context=Context(tools=[stranger])))
    assert model.requests == []


async def test_the_pipelines_tools_fill_an_empty_context() -> None:
    lookup = lookup_tool()
    pipe, model = pipe_with(["done"], lookup)

    await pipe.run(start())

    assert model.requests[0].tools == (lookup.spec,)


# -- regeneration and holding ------------------------------------------------------------------


def reject_text(text: str):
    async def guard(turn):
        return regenerate("no") if turn.reply.text == text else cont(turn)

    return hook(guard, name="guard")


async def test_a_regeneration_sends_the_rejected_attempts_tool_exchange_back() -> None:
    first = calls("a")
    pipe, model = pipe_with([first, "bad", [call("c2", "b")], "good"], post=[reject_text("bad")])

    await pipe.run(start())

    assert model.requests[2].messages[1:4] == (
        *answered(first, "lookup(a)"),
        Message.assistant("bad"),
    )


async def test_only_the_accepted_attempts_exchange_is_committed() -> None:
    second = [call("c2", "b")]
    pipe, _ = pipe_with([calls("a"), "bad", second, "good"], post=[reject_text("bad")])

    result = await pipe.run(start())

    assert result.log_messages == (
        Message.user("weather?"),
        *answered(second, "lookup(b)"),
        Message.assistant("good"),
    )


async def test_hold_until_accepted_delivers_no_text_of_a_rejected_attempt_that_used_tools() -> None:
    pipe, _ = pipe_with(
        [calls("a"), "bad", [call("c2", "b")], "good"],
        post=[reject_text("bad")],
        hold_until_accepted=True,
    )

    events, _ = await collect(pipe, start())

    assert [event.text for event in of_type(events, ev.TextDelta)] == ["good"]


async def test_hold_until_accepted_with_tools_gives_the_same_result_as_run() -> None:
    def build():
        pipe, _ = pipe_with(
            [calls("a"), "bad", [call("c2", "b")], "good"],
            post=[reject_text("bad")],
            hold_until_accepted=True,
        )
        return pipe

    _, streamed = await collect(build(), start())
    ran = await build().run(start())

    assert (streamed.reply, streamed.log_messages, streamed.audit.tools) == (
        ran.reply,
        ran.log_messages,
        ran.audit.tools,
    )


# -- the audit record ---------------------------------------------------------------------------


async def test_the_audit_holds_every_tool_call_in_call_order(autojump_clock) -> None:
    batch = calls("a", "b")
    pipe, _ = pipe_with(
        [batch, [call("c3", "c")], "done"],
        lookup_tool(delays={"a": 2}),
        before_tool=[
            before(
                "fix", lambda c: cont(c.with_arguments({"city": "B"})) if c.id == "c2" else cont(c)
            )
        ],
    )

    result = await pipe.run(start())

    rewritten = {TOOL_HOOKS: {"arguments_rewritten_by": ["fix"], "arguments": {"city": "B"}}}
    assert result.audit.tools == (
        ToolRecord(1, 1, batch[0], batch[0], ToolResult("c1", "lookup(a)")),
        ToolRecord(1, 1, batch[1], call("c2", "B"), ToolResult("c2", "lookup(B)", meta=rewritten)),
        ToolRecord(1, 2, call("c3", "c"), call("c3", "c"), ToolResult("c3", "lookup(c)")),
    )


async def test_the_audit_records_the_tool_calls_of_a_rejected_attempt() -> None:
    pipe, _ = pipe_with([calls("a"), "bad", [call("c2", "b")], "good"], post=[reject_text("bad")])

    result = await pipe.run(start())

    assert [(record.attempt, record.step, record.call.id) for record in result.audit.tools] == [
        (1, 1, "c1"),
        (2, 1, "c2"),
    ]


async def test_the_audit_keeps_an_attempt_a_tool_hook_halted() -> None:
    """Bug: an attempt halted by a tool hook was missing from ``audit.attempts`` (its model
    calls and their usage lost) while ``audit.tools`` held the calls of its settled step."""
    stop = before("stop", lambda c: halt("no more") if c.id == "c2" else cont(c))
    pipe, _ = pipe_with([calls("a"), [call("c2", "b")], "never"], before_tool=[stop])

    result = await pipe.run(start())

    assert result.outcome == "halted"
    assert [(record.attempt, record.step, record.call.id) for record in result.audit.tools] == [
        (1, 1, "c1"),
    ]
    [attempt] = result.audit.attempts
    assert (attempt.attempt, attempt.steps, attempt.finish_reason) == (1, 2, "tool_calls")
    assert attempt.usage.output_tokens > 0


# -- building -------------------------------------------------------------------------------------


def test_two_tools_with_one_name_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="second tool named 'lookup'"):
        Pipeline(model=ScriptedModel([]), tools=[lookup_tool(), lookup_tool()])


@pytest.mark.parametrize("field", ["max_steps", "tool_concurrency"])
def test_a_bound_of_zero_is_a_config_error(field) -> None:
    with pytest.raises(ConfigError, match=field):
        Pipeline(model=ScriptedModel([]), **{field: 0})


def test_a_parallel_group_in_before_tool_is_a_config_error() -> None:
    group = parallel(before("one", passing), before("two", passing), name="pair")

    with pytest.raises(ConfigError, match=r"before_tool.*'pair'"):
        Pipeline(model=ScriptedModel([]), before_tool=[group])


def test_a_before_tool_hook_of_the_wrong_arity_is_a_config_error_naming_it() -> None:
    def guard(c):
        return cont(c)

    with pytest.raises(ConfigError, match=r"guard' \(before_tool, position 1\) cannot be called"):
        Pipeline(model=ScriptedModel([]), before_tool=[guard])


def test_an_after_tool_hook_of_the_wrong_arity_is_a_config_error_naming_it() -> None:
    def scrub(c, turn):
        return cont(c)

    with pytest.raises(ConfigError, match=r"scrub' \(after_tool, position 1\) cannot be called"):
        Pipeline(model=ScriptedModel([]), after_tool=[scrub])


def test_a_background_tool_hook_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'scrub'.*background"):
        Pipeline(model=ScriptedModel([]), after_tool=[after("scrub", cont, background=True)])


def test_a_permission_callback_of_the_wrong_arity_is_a_config_error() -> None:
    def allow(c):
        return True

    with pytest.raises(ConfigError, match=r"permission=\S*allow\) cannot be called"):
        Pipeline(model=ScriptedModel([]), permission=allow)


# -- cancellation from outside -----------------------------------------------------------------


async def test_cancelling_the_turn_while_a_tool_runs_leaves_no_task_behind(autojump_clock) -> None:
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(delays={"a": 100}))
    before_turn = live_tasks()

    with anyio.move_on_after(5) as scope:
        await pipe.run(start())

    assert (scope.cancelled_caught, live_tasks()) == (True, before_turn)


async def test_cancelling_the_turn_while_a_tool_runs_commits_nothing(autojump_clock) -> None:
    pipe, _ = pipe_with([calls("a"), "done"], lookup_tool(delays={"a": 100}))
    log = MemoryLog()

    async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
        with anyio.move_on_after(5):
            await session.send("weather?")

    assert await log.load(CONVERSATION) == Context()


async def test_a_cancelled_error_a_tool_raises_itself_is_its_tool_error() -> None:
    """Catches: a CancelledError a tool raised itself (a library awaiting a future another
    task cancelled) while nobody cancelled the turn, taken for the call's cancellation: on
    asyncio the batch ended without the call's result and run() failed with a bare
    AssertionError; on trio the CancelledError escaped run()."""

    async def flaky(city: str) -> str:
        raise asyncio.CancelledError()

    pipe, _ = pipe_with([calls("a"), "done"], tool(flaky, name="lookup"))

    result = await pipe.run(start())

    (failed,) = results_of(result.reply.messages)
    assert (result.outcome, failed.error_class) == ("completed", "tool_error")
    assert "CancelledError, raised by the tool itself" in failed.content


@pytest.mark.parametrize("stage", ["before_tool", "after_tool"])
async def test_a_cancelled_error_a_tool_hook_raises_itself_is_its_failure(stage) -> None:
    """Catches: a CancelledError a tool hook raised itself, nobody cancelling the turn, ending
    the call's task with no result (a bare AssertionError out of run() on asyncio) instead
    of being the hook's failure."""

    async def policy(*args):
        raise asyncio.CancelledError()

    pipe, _ = pipe_with([calls("a"), "done"], **{stage: [hook(policy, name="policy")]})

    with pytest.raises(HookFailed, match=r"hook 'policy'.* raised CancelledError itself"):
        await pipe.run(start())


async def test_a_cancellation_reaching_a_tool_still_cancels_the_turn() -> None:
    """Guards the check above: a real cancellation inside a tool is no tool error."""
    with anyio.CancelScope() as scope:

        async def stop(city: str) -> str:
            scope.cancel()
            await anyio.sleep_forever()
            return city

        pipe, _ = pipe_with([calls("a"), "done"], tool(stop, name="lookup"))
        await pipe.run(start())

    assert scope.cancelled_caught


# -- ToolStepFinished: the settled step, atomically -----------------------------------------


async def test_a_settled_step_is_one_event_with_its_results_in_call_order(autojump_clock) -> None:
    """Catches: no single event for a settled tool step, so a consumer that must not show a
    partial batch had to rebuild it from ToolFinished events in completion order."""
    slow_first = lookup_tool(delays={"a": 3, "b": 1, "c": 2})
    pipe, _ = pipe_with(
        [calls("a", "b", "c"), [call("c4", "d")], "done"], slow_first, tool_concurrency=3
    )

    events, _ = await collect(pipe, start())

    finished = [e.call.id for e in of_type(events, ev.ToolFinished)]
    assert finished[:3] == ["c2", "c3", "c1"]  # completion order
    steps = of_type(events, ev.ToolStepFinished)
    assert [(e.attempt, e.step, [(r.call_id, r.content) for r in e.results]) for e in steps] == [
        (1, 1, [("c1", "lookup(a)"), ("c2", "lookup(b)"), ("c3", "lookup(c)")]),
        (1, 2, [("c4", "lookup(d)")]),
    ]
    kinds = [type(e) for e in events]
    first_step = kinds.index(ev.ToolStepFinished)
    assert ev.ToolFinished not in kinds[first_step + 1 : kinds.index(ev.ModelCalled, first_step)]


async def test_a_step_carries_the_effective_results_after_rewrites_and_blocks() -> None:
    """Catches: the step event carrying raw results a hook rewrote, or missing blocked calls."""
    guard = before("guard", lambda c: block("no") if c.arguments["city"] == "b" else cont(c))
    scrub = after("scrub", lambda r: cont(r.with_content("clean")))
    pipe, _ = pipe_with([calls("a", "b"), "ok"], before_tool=[guard], after_tool=[scrub])

    events, _ = await collect(pipe, start())

    (step,) = of_type(events, ev.ToolStepFinished)
    assert [(r.call_id, r.content, r.error_class) for r in step.results] == [
        ("c1", "clean", None),
        ("c2", "no", "hook_blocked"),
    ]


async def test_a_halted_step_emits_no_step_event() -> None:
    """Catches: a ToolStepFinished for a batch that a tool hook halted (nothing of it kept)."""
    stop = after("stop", lambda r: halt("enough") if r.call_id == "c2" else cont(r))
    pipe, _ = pipe_with([calls("a", "b"), "never"], after_tool=[stop])

    events, result = await collect(pipe, start())

    assert result.outcome == "halted"
    assert of_type(events, ev.ToolFinished) != []
    assert of_type(events, ev.ToolStepFinished) == []


# -- interrupts -----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_out_of_a_tool_waits_for_the_running_calls_and_starts_no_more(
    loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a tool raising KeyboardInterrupt under asyncio let it out of its task,
    which stopped the loop at once: the caller got it while a sync tool of the batch still
    ran in its worker thread (left behind, it kept the process from exiting), and the task
    was reported ("Task exception was never retrieved"). Under trio the batch waits for
    the running calls, starts no more, then raises it: asyncio now does the same. Run from
    sync code, as an application would, and collected, so that what is left over shows."""
    release = threading.Event()
    ran: list[str] = []

    @tool
    def slow() -> str:
        """Runs in a worker thread until released."""
        release.wait(10)
        ran.append("slow")
        return "slow"

    @tool
    async def interrupted() -> str:
        """Interrupted while `slow` runs."""
        # Released a moment later: the batch must wait for it, the caller must not.
        threading.Timer(0.05, release.set).start()
        raise KeyboardInterrupt

    @tool
    async def later() -> str:
        """After the interrupted call: must never start."""
        ran.append("later")
        return "later"

    batch = [ToolCall("c1", "slow", {}), ToolCall("c2", "interrupted", {})]
    batch.append(ToolCall("c3", "later", {}))
    pipe = Pipeline(model=ScriptedModel([batch, "never"]), tools=[slow, interrupted, later])

    async def main() -> None:
        await pipe.run(start())

    seen: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run_on(loop, main)
        except KeyboardInterrupt:
            seen = list(ran)
        gc.collect()
    release.set()
    assert seen == ["slow"]
    assert [str(warning.message) for warning in caught] == []
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_a_system_exit_out_of_a_tool_is_not_lost_to_the_callers_cancellation() -> None:
    """Bug caught: a tool cancelling the caller's scope (as a deadline passing at that instant
    would) and raising SystemExit, kept to be raised once the batch's task group closed: the
    task group raised the cancellation instead, the caller's scope absorbed it, and the run
    returned as if nothing happened."""
    scopes: list[anyio.CancelScope] = []

    @tool
    async def exiting() -> str:
        """Exits."""
        scopes[0].cancel()
        raise SystemExit(3)

    @tool
    async def sibling() -> str:
        """Runs until cancelled."""
        await anyio.sleep(10)
        return "never"

    batch = [ToolCall("c1", "exiting", {}), ToolCall("c2", "sibling", {})]
    pipe = Pipeline(model=ScriptedModel([batch, "never"]), tools=[exiting, sibling])

    async def caller() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await pipe.run(start())

    with pytest.raises(SystemExit) as info:
        await caller()
    assert info.value.code == 3


async def test_the_interrupt_that_stopped_the_batch_wins_over_one_raised_as_it_stops() -> None:
    """Bug caught: the batch raised the first interrupt in call order, not the one that
    stopped it: a later call's tool raising SystemExit(5) cancelled an earlier call, whose
    after-tool hook raised KeyboardInterrupt on seeing the cancelled result, and the caller
    got that KeyboardInterrupt, the exit code lost. The later one rides along as a note."""

    @tool
    async def waiting() -> str:
        """Runs until cancelled."""
        await anyio.Event().wait()
        return "never"

    @tool
    async def exiting() -> str:
        """Exits while `waiting` runs."""
        await anyio.lowlevel.checkpoint()
        raise SystemExit(5)

    async def on_cancel(call, result, turn):
        if result.error_class == "cancelled":
            raise KeyboardInterrupt
        return cont(result)

    batch = [ToolCall("c1", "waiting", {}), ToolCall("c2", "exiting", {})]
    pipe = Pipeline(
        model=ScriptedModel([batch, "never"]),
        tools=[waiting, exiting],
        after_tool=[hook(on_cancel, name="on_cancel")],
    )

    async def run() -> None:
        try:
            await pipe.run(start())
        except KeyboardInterrupt:
            pytest.fail("the KeyboardInterrupt raised as the batch stopped replaced SystemExit(5)")

    with pytest.raises(SystemExit) as info:
        await run()
    assert info.value.code == 5
    assert any("c1" in note and "KeyboardInterrupt" in note for note in info.value.__notes__)


async def test_a_repeated_tool_call_id_gets_a_fresh_one_every_consumer_sees(tmp_path) -> None:
    """Bug caught: a model repeating a tool call id (in one reply, a later step or a later
    turn, as a script playing ``[call], [call]`` does) failed the turn with a
    ProviderProtocolError; the call now gets the id with a suffix, and the events, the tool
    hooks, the audit, the log read back and the next request all hold that one."""
    hooked: list[tuple[str, str]] = []

    def note(call: ToolCall, result: ToolResult, turn: Turn):
        hooked.append((call.id, result.call_id))
        return cont(result)

    model = ScriptedModel(
        [
            calls("a"),
            "done",
            # c1_2 is this reply's own: the second c1 must not take it.
            [call("c1", "b"), call("c1", "c"), call("c1_2", "d")],
            calls("e"),
            "done",
        ]
    )
    pipe = Pipeline(model=model, tools=[lookup_tool()], after_tool=[note])
    async with (
        SQLiteLog(tmp_path / "chat.db") as log,
        pipe.session(log=log, conversation_id="c") as session,
    ):
        await session.send("first")
        async with session.stream("again") as stream:
            seen = [event async for event in stream]
        result = stream.result
        messages = (await log.load("c")).messages
        entries = await log.entries("c")

    ids = ["c1_3", "c1_4", "c1_2", "c1_5"]
    cities = dict(zip(ids, "bcde", strict=True))
    assert [e.call.id for e in seen if isinstance(e, ev.ToolCallRequested)] == ids
    assert {e.call.id: e.result.call_id for e in seen if isinstance(e, ev.ToolFinished)} == {
        i: i for i in ids
    }
    assert sorted(hooked[1:]) == sorted((i, i) for i in ids)
    assert [(r.requested.id, r.call.id, r.result.call_id) for r in result.audit.tools] == [
        (i, i, i) for i in ids
    ]
    [_, second] = entries
    assert second.audit is not None
    assert second.audit.tools == result.audit.tools
    logged = [p for m in messages for p in m.parts if isinstance(p, ToolCall | ToolResult)]
    assert [(type(p).__name__, getattr(p, "id", None) or p.call_id) for p in logged] == [
        ("ToolCall", "c1"),
        ("ToolResult", "c1"),
        *[("ToolCall", i) for i in ids[:3]],
        *[("ToolResult", i) for i in ids[:3]],
        ("ToolCall", "c1_5"),
        ("ToolResult", "c1_5"),
    ]
    sent = {
        p.id: p.arguments["city"]
        for m in model.requests[-1].messages
        for p in m.parts
        if isinstance(p, ToolCall)
    }
    assert sent == {"c1": "a", **cities}


async def test_a_regenerated_attempt_repeating_the_rejected_one_s_call_id_completes() -> None:
    """Bug caught: a guardrail retry whose call repeated the id of the rejected attempt's call
    (shown to the model again) failed the turn; it now runs under a fresh id, the one
    committed."""
    pipe, _ = pipe_with(
        [calls("a"), "bad", calls("a"), "good"],
        post=[reject_text("bad")],
        max_regenerations=1,
    )

    result = await pipe.run(start())

    assert result.reply.text == "good"
    committed = [p.id for m in result.log_messages for p in m.parts if isinstance(p, ToolCall)]
    assert committed == ["c1_2"]


async def test_a_repeated_id_of_a_str_subclass_gets_a_fresh_one() -> None:
    """Bug caught: a call whose id is a str subclass (which a Message accepts) repeating an id
    of the conversation kept it, so the log held two calls c1, which Anthropic refuses on
    every later request."""

    class Name(str):
        pass

    model = ScriptedModel([calls("a"), "done", [call(Name("c1"), "b")], "done"])
    pipe = Pipeline(model=model, tools=[lookup_tool()])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("first")
        await session.send("again")
    messages = (await log.load("c")).messages
    ids = [part.id for message in messages for part in message.parts if type(part) is ToolCall]
    assert ids == ["c1", "c1_2"]


async def test_a_tool_call_id_of_another_type_than_str_is_refused_naming_it() -> None:
    """Bug caught: a model's ToolCall with a list for its id failed with "unhashable type:
    'list'" from the id check, where the message's own check names the field and the type."""

    class Model:
        @contextlib.asynccontextmanager
        async def stream(self, request):
            async def events():
                yield ModelToolCall(ToolCall(["x"], "lookup", {"city": "a"}))  # type: ignore[arg-type]
                yield ModelFinish("tool_calls", Usage())

            yield events()

    pipe = Pipeline(model=Model(), tools=[lookup_tool()])

    with pytest.raises(TypeError, match=r"ToolCall.id and .name must be str, got list \['x'\]"):
        await pipe.run(start())
