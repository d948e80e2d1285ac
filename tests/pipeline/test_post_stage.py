"""The post stage: ordered post hooks judge the reply, background post hooks follow the turn."""

import inspect

import anyio
import attrs
import pytest
import trio

from pipeline import (
    ConfigError,
    Halt,
    HookFailed,
    HookRecord,
    HookReturnError,
    HookTimeout,
    Pipeline,
    TurnResult,
    block,
    chain,
    cont,
    estimate_tokens,
    halt,
    hook,
    parallel,
    parts_tokens,
    regenerate,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog, SQLiteLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Context, Injection, Message, Text, ToolCall, ToolResult, Turn

from .support import collect as streamed
from .support import (
    collect_into,
    exiting_with_a_late_interrupt,
    pairing_problems,
    warnings_of_an_interrupted_run,
)

TURN_REF = "turn-post"


# -- helpers --------------------------------------------------------------------------------


def start(text: str = "hi") -> Turn:
    return Turn.start(text, turn_ref=TURN_REF)


def scripted(*replies: str) -> ScriptedModel:
    return ScriptedModel(list(replies) or ["Hello"])


def tracer(trace: list, label: str, **options):
    """A sync post hook that records `label` and continues unchanged."""

    def record(turn):
        trace.append(label)
        return cont(turn)

    return hook(record, name=label, **options)


def async_tracer(trace: list, label: str, **options):
    """An async post hook that records `label` and continues unchanged."""

    async def record(turn):
        await anyio.lowlevel.checkpoint()
        trace.append(label)
        return cont(turn)

    return hook(record, name=label, **options)


def injector(label: str, *texts: str, **options):
    async def add(turn):
        return cont(turn.inject(*texts))

    return hook(add, name=label, **options)


def halter(label: str, reason: str = "not allowed", reply=None, **options):
    async def stop(turn):
        return halt(reason, reply=reply)

    return hook(stop, name=label, **options)


def rejecter(label: str, feedback: str = "try again", **options):
    async def reject(turn):
        return regenerate(feedback)

    return hook(reject, name=label, **options)


def raiser(label: str, error: Exception, **options):
    async def fail(turn):
        raise error

    return hook(fail, name=label, **options)


def returning(label: str, make, **options):
    """A post hook that returns `make(turn)` (usually something wrong)."""

    async def wrong(turn):
        return make(turn)

    return hook(wrong, name=label, **options)


def sleeper(trace: list, label: str, seconds: float, **options):
    """An async hook that sleeps `seconds`, then records `label` and continues."""

    async def nap(turn):
        await anyio.sleep(seconds)
        trace.append(label)
        return cont(turn)

    return hook(nap, name=label, **options)


def kinds(events) -> list[tuple[str, str | None]]:
    """Events as (type name, hook name or None), for asserting whole traces."""
    return [(type(event).__name__, getattr(event, "hook", None)) for event in events]


def of_type(events, kind) -> list:
    return [event for event in events if type(event) is kind]


def records_of(result: TurnResult, name: str) -> list[HookRecord]:
    return [record for record in result.audit.hooks if record.hook == name]


# -- ordering and threading -----------------------------------------------------------------


async def test_post_hooks_run_in_list_order_after_the_model_replied() -> None:
    trace: list[str] = []

    def answer(request):
        trace.append("model")
        return "Hello"

    pipe = Pipeline(
        model=FunctionModel(answer),
        post=[
            tracer(trace, "one"),
            async_tracer(trace, "two"),
            tracer(trace, "three"),
            async_tracer(trace, "four"),
        ],
    )

    await pipe.run(start())

    assert trace == ["model", "one", "two", "three", "four"]


async def test_every_post_hook_sees_the_reply_and_its_attempt() -> None:
    seen: list[tuple[str, str, int]] = []

    def look(label: str):
        async def check(turn):
            seen.append((label, turn.reply.text, turn.reply.attempt))
            return cont(turn)

        return hook(check, name=label)

    pipe = Pipeline(model=ScriptedModel([["Hello ", "there"]]), post=[look("a"), look("b")])

    await pipe.run(start())

    assert seen == [("a", "Hello there", 1), ("b", "Hello there", 1)]


async def test_a_post_hooks_injection_is_visible_to_the_next_post_hook() -> None:
    seen: list[tuple[Injection, ...]] = []

    async def look(turn):
        seen.append(turn.injections)
        return cont(turn)

    pipe = Pipeline(
        model=scripted(), post=[injector("notes", "checked", durable=True), hook(look, name="look")]
    )

    await pipe.run(start())

    assert seen == [(Injection((Text("checked"),), "notes", True, "post"),)]


async def test_each_post_hook_receives_the_scope_the_previous_one_assigned() -> None:
    seen: list[dict[str, object]] = []

    def assigner(key: str, value: int):
        async def assign(turn):
            seen.append(dict(turn.scope.assigns))
            return cont(turn.assign(**{key: value}))

        return hook(assign, name=key)

    pipe = Pipeline(model=scripted(), post=[assigner("a", 1), assigner("b", 2), assigner("c", 3)])

    result = await pipe.run(start())

    assert (seen, dict(result.turn.scope.assigns)) == (
        [{}, {"a": 1}, {"a": 1, "b": 2}],
        {"a": 1, "b": 2, "c": 3},
    )


async def test_post_hooks_see_the_turn_the_pre_hooks_shaped() -> None:
    seen: list[tuple[Injection, ...]] = []

    async def look(turn):
        seen.append(turn.injections)
        return cont(turn)

    pipe = Pipeline(model=scripted(), pre=[injector("date", "Monday")], post=[look])

    await pipe.run(start())

    assert seen == [(Injection((Text("Monday"),), "date", False, "pre"),)]


async def test_a_post_hook_may_change_the_reply_and_the_result_carries_it() -> None:
    async def polish(turn):
        message = Message.assistant(turn.reply.text.upper())
        return cont(attrs.evolve(turn, reply=attrs.evolve(turn.reply, message=message)))

    pipe = Pipeline(model=scripted("hello"), post=[polish])

    result = await pipe.run(start())

    assert result.reply is not None
    assert result.reply.text == "HELLO"


# -- post injections ------------------------------------------------------------------------


async def test_post_injections_are_stamped_with_their_hook_its_durability_and_stage_post() -> None:
    pipe = Pipeline(
        model=scripted(),
        post=[injector("summary", "s", durable=True), injector("scratch", "t")],
    )

    result = await pipe.run(start())

    assert result.turn.injections == (
        Injection((Text("s"),), "summary", True, "post"),
        Injection((Text("t"),), "scratch", False, "post"),
    )


async def test_a_post_hook_cannot_forge_the_provenance_of_what_it_injects() -> None:
    async def forge(turn):
        fake = Injection((Text("x"),), "someone_else", True, "pre")
        return cont(attrs.evolve(turn, injections=(*turn.injections, fake)))

    pipe = Pipeline(model=scripted(), post=[hook(forge, name="forger")])

    result = await pipe.run(start())

    assert result.turn.injections == (Injection((Text("x"),), "forger", False, "post"),)


async def test_post_injections_are_not_sent_to_the_model() -> None:
    model = scripted()
    pipe = Pipeline(model=model, post=[injector("summary", "s", durable=True)])

    await pipe.run(start())

    assert [request.messages for request in model.requests] == [(Message.user("hi"),)]


async def test_durable_post_injections_join_the_log_after_the_reply() -> None:
    pipe = Pipeline(
        model=scripted("Hello"),
        post=[injector("summary", "s1", "s2", durable=True)],
    )

    result = await pipe.run(start())

    stamp = {"injected_by": "summary"}
    assert result.log_messages == (
        Message.user("hi"),
        Message.assistant("Hello"),
        Message.user([Text("s1", meta=stamp), Text("s2", meta=stamp)]),
    )


async def test_transient_post_injections_stay_out_of_the_log() -> None:
    pipe = Pipeline(model=scripted("Hello"), post=[injector("scratch", "t")])

    result = await pipe.run(start())

    assert result.log_messages == (Message.user("hi"), Message.assistant("Hello"))


async def test_transient_post_injections_are_kept_in_the_audit_record() -> None:
    pipe = Pipeline(model=scripted(), post=[injector("scratch", "t")])

    result = await pipe.run(start())

    assert result.audit.injections == (Injection((Text("t"),), "scratch", False, "post"),)


async def test_a_post_injection_is_announced_with_stage_post() -> None:
    pipe = Pipeline(model=scripted(), post=[injector("summary", "s", durable=True)])

    events, _ = await streamed(pipe, start())

    parts = (Text("s"),)
    assert of_type(events, ev.Injected) == [
        ev.Injected(TURN_REF, "summary", parts, True, parts_tokens(parts, estimate_tokens), "post")
    ]


async def test_a_completed_turn_with_post_hooks_reports_the_whole_event_trace() -> None:
    pipe = Pipeline(
        model=ScriptedModel([["Hel", "lo"]]),
        post=[tracer([], "check"), injector("summary", "s")],
    )

    events, _ = await streamed(pipe, start())

    assert kinds(events) == [
        ("TurnStarted", None),
        ("ModelCalled", None),
        ("TextDelta", None),
        ("TextDelta", None),
        ("ModelFinished", None),
        ("ReplyReady", None),
        ("HookStarted", "check"),
        ("HookFinished", "check"),
        ("HookStarted", "summary"),
        ("HookFinished", "summary"),
        ("Injected", "summary"),
        ("TurnFinished", None),
    ]


# -- halting in the post stage --------------------------------------------------------------


async def test_a_post_halt_gives_outcome_halted() -> None:
    pipe = Pipeline(model=scripted(), post=[halter("guard")])

    result = await pipe.run(start())

    assert result.outcome == "halted"


async def test_a_post_halt_is_stamped_with_the_halting_hook() -> None:
    pipe = Pipeline(model=scripted(), post=[tracer([], "before"), halter("guard", "leak")])

    result = await pipe.run(start())

    assert (result.halt, result.audit.halt) == (
        Halt("leak", None, "guard"),
        Halt("leak", None, "guard"),
    )


async def test_a_post_halt_means_later_post_hooks_do_not_run() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        post=[tracer(trace, "before"), halter("guard"), tracer(trace, "after")],
    )

    await pipe.run(start())

    assert trace == ["before"]


async def test_a_post_halted_turn_has_no_log_messages() -> None:
    pipe = Pipeline(
        model=scripted(),
        pre=[injector("memory", "m", durable=True)],
        post=[injector("summary", "s", durable=True), halter("guard")],
    )

    result = await pipe.run(start())

    assert result.log_messages == ()


async def test_a_post_halt_keeps_what_earlier_post_hooks_injected_in_the_audit_record() -> None:
    # As a pre halt does: the audit record holds every injection, and
    # transient content is kept nowhere else.
    pipe = Pipeline(model=scripted(), post=[injector("scratch", "t"), halter("guard")])

    result = await pipe.run(start())

    assert result.audit.injections == (Injection((Text("t"),), "scratch", False, "post"),)


async def test_a_post_halt_without_a_reply_leaves_the_answer_empty() -> None:
    pipe = Pipeline(model=scripted("secret stuff"), post=[halter("guard")])

    result = await pipe.run(start())

    assert (result.reply, result.turn.reply) == (None, None)


async def test_a_post_halt_with_a_reply_makes_it_the_answer_instead_of_the_models() -> None:
    pipe = Pipeline(model=scripted("secret stuff"), post=[halter("guard", reply="I can't.")])

    result = await pipe.run(start())

    assert result.reply is not None
    assert (result.reply.message, result.reply.finish_reason, result.turn.reply) == (
        Message.assistant("I can't."),
        "halted",
        result.reply,
    )


async def test_a_post_halt_is_not_a_rejection() -> None:
    model = scripted("one", "two")
    pipe = Pipeline(model=model, post=[halter("guard")])

    result = await pipe.run(start())

    assert (len(model.requests), result.rejections) == (1, ())


async def test_a_post_halted_stream_reports_the_whole_event_trace() -> None:
    pipe = Pipeline(model=scripted("Hello"), post=[tracer([], "before"), halter("guard", "leak")])

    events, _ = await streamed(pipe, start())

    assert kinds(events) == [
        ("TurnStarted", None),
        ("ModelCalled", None),
        ("TextDelta", None),
        ("ModelFinished", None),
        ("ReplyReady", None),
        ("HookStarted", "before"),
        ("HookFinished", "before"),
        ("HookStarted", "guard"),
        ("HookFinished", "guard"),
        ("Halted", "guard"),
        ("TurnFinished", None),
    ]
    assert (of_type(events, ev.Halted), events[-1]) == (
        [ev.Halted(TURN_REF, "guard", "leak")],
        ev.TurnFinished(TURN_REF, "halted"),
    )


# -- wrong returns --------------------------------------------------------------------------

WRONG_RETURNS = [
    pytest.param(lambda turn: None, "return cont(turn)", id="none"),
    pytest.param(lambda turn: turn, "cont(turn)", id="bare-turn"),
    pytest.param(lambda turn: block("no"), "before_tool", id="block"),
    pytest.param(lambda turn: cont("hello"), "cont(turn)", id="cont-without-turn"),
    pytest.param(lambda turn: cont(attrs.evolve(turn, reply=None)), "reply", id="reply-removed"),
]


@pytest.mark.parametrize(("make", "fix"), WRONG_RETURNS)
async def test_a_wrong_post_return_raises_hook_return_error_naming_hook_stage_and_position(
    make, fix: str
) -> None:
    pipe = Pipeline(model=scripted(), post=[tracer([], "first"), returning("sloppy", make)])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(post, position 2\)") as raised:
        await pipe.run(start())

    assert (raised.value.hook, raised.value.stage) == ("sloppy", "post")


@pytest.mark.parametrize(("make", "fix"), WRONG_RETURNS)
async def test_a_wrong_post_return_error_suggests_the_fix(make, fix: str) -> None:
    pipe = Pipeline(model=scripted(), post=[returning("sloppy", make)])

    with pytest.raises(HookReturnError) as raised:
        await pipe.run(start())

    assert fix in str(raised.value)


@pytest.mark.parametrize(("make", "fix"), WRONG_RETURNS)
async def test_a_wrong_post_return_is_raised_even_when_the_hook_fails_open(make, fix: str) -> None:
    pipe = Pipeline(model=scripted(), post=[returning("sloppy", make, on_error="skip")])

    with pytest.raises(HookReturnError, match="sloppy"):
        await pipe.run(start())


async def test_a_post_halt_with_a_user_message_reply_is_a_hook_return_error() -> None:
    pipe = Pipeline(
        model=scripted(), post=[returning("sloppy", lambda turn: Halt("no", Message.user("x")))]
    )

    with pytest.raises(HookReturnError, match=r"'sloppy' \(post, position 1\)"):
        await pipe.run(start())


async def test_a_post_hook_replacing_the_history_of_a_turn_continuing_from_results_completes():
    """Bug caught: a post hook that emptied the history of a turn continuing from tool
    results failed the completed turn, after the model was paid, as a split no provider
    accepts, though a post hook's history is never sent."""

    async def forget(turn):
        return cont(attrs.evolve(turn, context=attrs.evolve(turn.context, messages=())))

    history = (Message.user("5?"), Message.assistant([ToolCall("c5", "lookup", {})]))
    own = Message("tool", (ToolResult("c5", "shipped"),))
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=[hook(forget, name="forget")])

    result = await pipe.run(Turn.start(own, context=Context(messages=history)))

    assert (result.outcome, result.reply.text) == ("completed", "ok")


# -- failures -------------------------------------------------------------------------------


async def test_a_raising_post_hook_fails_the_turn_with_hook_failed() -> None:
    error = RuntimeError("kaput")
    pipe = Pipeline(model=scripted(), post=[tracer([], "first"), raiser("boom", error)])

    with pytest.raises(HookFailed, match=r"'boom' \(post, position 2\)") as raised:
        await pipe.run(start())

    assert (raised.value.hook, raised.value.stage, raised.value.__cause__) == (
        "boom",
        "post",
        error,
    )


async def test_a_raising_post_hook_stops_the_post_hooks_after_it() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(), post=[raiser("boom", RuntimeError("kaput")), tracer(trace, "after")]
    )

    with pytest.raises(HookFailed):
        await pipe.run(start())

    assert trace == []


async def test_a_raising_post_hook_that_fails_open_lets_the_turn_go_on() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted("Hello"),
        post=[raiser("boom", RuntimeError("kaput"), on_error="skip"), tracer(trace, "after")],
    )

    result = await pipe.run(start())

    assert (result.outcome, result.reply.text if result.reply else None, trace) == (
        "completed",
        "Hello",
        ["after"],
    )


async def test_a_failed_open_post_hook_is_an_unenforced_hook_failed_event() -> None:
    pipe = Pipeline(model=scripted(), post=[raiser("boom", RuntimeError("kaput"), on_error="skip")])

    events, _ = await streamed(pipe, start())

    assert of_type(events, ev.HookFailed) == [
        ev.HookFailed(TURN_REF, "boom", "post", "RuntimeError: kaput", False)
    ]


async def test_a_failed_open_post_hook_is_audited_as_failed() -> None:
    pipe = Pipeline(model=scripted(), post=[raiser("boom", RuntimeError("kaput"), on_error="skip")])

    result = await pipe.run(start())

    assert [record.verdict for record in records_of(result, "boom")] == ["failed"]


# -- when= ----------------------------------------------------------------------------------


async def test_a_post_hook_whose_when_is_false_does_not_run() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted("Hello"),
        post=[
            tracer(trace, "short", when=lambda turn: len(turn.reply.text) < 3),
            tracer(trace, "long", when=lambda turn: len(turn.reply.text) >= 3),
        ],
    )

    await pipe.run(start())

    assert trace == ["long"]


async def test_a_skipped_post_hook_is_a_hook_skipped_event() -> None:
    pipe = Pipeline(model=scripted(), post=[halter("guard", when=lambda turn: False)])

    events, result = await streamed(pipe, start())

    assert (of_type(events, ev.HookSkipped), result.outcome) == (
        [ev.HookSkipped(TURN_REF, "guard", "post")],
        "completed",
    )


# -- timeouts -------------------------------------------------------------------------------


async def test_a_post_hook_over_its_timeout_raises_hook_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), post=[sleeper([], "slow", 10, timeout=1)])

    with pytest.raises(HookTimeout, match=r"'slow' \(post, position 1\)") as raised:
        await pipe.run(start())

    assert (raised.value.hook, raised.value.stage) == ("slow", "post")


async def test_a_post_hook_timeout_cuts_the_wait_at_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), post=[sleeper([], "slow", 10, timeout=1)])
    began = anyio.current_time()

    with pytest.raises(HookTimeout):
        await pipe.run(start())

    assert anyio.current_time() - began == pytest.approx(1)


async def test_a_post_hook_within_its_timeout_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trace: list[str] = []
    pipe = Pipeline(model=scripted(), post=[sleeper(trace, "slow", 1, timeout=5)])

    result = await pipe.run(start())

    assert (result.outcome, trace) == ("completed", ["slow"])


async def test_a_post_hook_timeout_that_fails_open_lets_the_turn_complete(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), post=[sleeper([], "slow", 10, timeout=1, on_error="skip")])

    result = await pipe.run(start())

    assert result.outcome == "completed"


# -- shadow post hooks ----------------------------------------------------------------------


async def test_a_shadow_post_hooks_regenerate_is_not_enforced() -> None:
    model = scripted("first", "second")
    pipe = Pipeline(model=model, post=[rejecter("strict", "too long", shadow=True)])

    result = await pipe.run(start())

    assert (result.outcome, result.reply.text if result.reply else None) == (
        "completed",
        "first",
    )
    assert (len(model.requests), result.rejections) == (1, ())


async def test_a_shadow_post_hooks_regenerate_is_a_shadow_verdict_event() -> None:
    pipe = Pipeline(model=scripted(), post=[rejecter("strict", "too long", shadow=True)])

    events, _ = await streamed(pipe, start())

    assert of_type(events, ev.ShadowVerdict) == [
        ev.ShadowVerdict(TURN_REF, "strict", "post", "regenerate", "too long")
    ]


async def test_a_shadow_post_hooks_regenerate_is_audited_as_a_shadow_verdict() -> None:
    pipe = Pipeline(model=scripted(), post=[rejecter("strict", "too long", shadow=True)])

    result = await pipe.run(start())

    assert [(r.verdict, r.shadow, r.detail) for r in records_of(result, "strict")] == [
        ("regenerate", True, "too long")
    ]


async def test_a_shadow_post_hooks_halt_is_not_enforced() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(), post=[halter("strict", "leak", shadow=True), tracer(trace, "after")]
    )

    events, result = await streamed(pipe, start())

    assert (result.outcome, result.halt, trace) == ("completed", None, ["after"])
    assert of_type(events, ev.ShadowVerdict) == [
        ev.ShadowVerdict(TURN_REF, "strict", "post", "halt", "leak")
    ]


async def test_a_shadow_post_hooks_changes_are_discarded() -> None:
    pipe = Pipeline(model=scripted(), post=[injector("draft", "note", durable=True, shadow=True)])

    result = await pipe.run(start())

    assert (result.turn.injections, result.log_messages) == (
        (),
        (Message.user("hi"), Message.assistant("Hello")),
    )


async def test_a_shadow_post_hooks_failure_is_not_enforced() -> None:
    pipe = Pipeline(model=scripted(), post=[raiser("strict", RuntimeError("kaput"), shadow=True)])

    events, result = await streamed(pipe, start())

    assert (result.outcome, of_type(events, ev.HookFailed)) == (
        "completed",
        [ev.HookFailed(TURN_REF, "strict", "post", "RuntimeError: kaput", False)],
    )


# -- chains ---------------------------------------------------------------------------------


async def test_a_chain_in_post_runs_its_members_in_order_under_prefixed_names() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        post=[
            tracer(trace, "first"),
            chain(tracer(trace, "a"), async_tracer(trace, "b"), name="checks"),
            tracer(trace, "last"),
        ],
    )

    events, _ = await streamed(pipe, start())

    assert trace == ["first", "a", "b", "last"]
    assert [event.hook for event in of_type(events, ev.HookStarted)] == [
        "first",
        "checks.a",
        "checks.b",
        "last",
    ]


async def test_a_chain_in_post_threads_the_turn_through_its_members() -> None:
    seen: list[tuple[Injection, ...]] = []

    async def look(turn):
        seen.append(turn.injections)
        return cont(turn)

    pipe = Pipeline(
        model=scripted(),
        post=[chain(injector("note", "n"), hook(look, name="look"), name="checks")],
    )

    await pipe.run(start())

    assert seen == [(Injection((Text("n"),), "checks.note", False, "post"),)]


async def test_a_halt_inside_a_post_chain_stops_the_chain_and_the_stage() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        post=[
            chain(tracer(trace, "a"), halter("guard", "leak"), tracer(trace, "b"), name="checks"),
            tracer(trace, "after"),
        ],
    )

    result = await pipe.run(start())

    assert (trace, result.halt) == (["a"], Halt("leak", None, "checks.guard"))


async def test_a_regenerate_inside_a_post_chain_names_the_member() -> None:
    model = scripted("one", "two")
    calls = 0

    async def once(turn):
        nonlocal calls
        calls += 1
        return regenerate("no") if calls == 1 else cont(turn)

    pipe = Pipeline(model=model, post=[chain(tracer([], "a"), hook(once, name="g"), name="checks")])

    result = await pipe.run(start())

    assert [(r.attempt, r.hook, r.feedback) for r in result.rejections] == [(1, "checks.g", "no")]


async def test_a_wrong_return_inside_a_post_chain_names_the_member_and_its_position() -> None:
    pipe = Pipeline(
        model=scripted(),
        post=[
            tracer([], "first"),
            chain(tracer([], "a"), returning("sloppy", lambda turn: None), name="checks"),
        ],
    )

    with pytest.raises(HookReturnError, match=r"'checks\.sloppy' \(post, position 2\.2\)"):
        await pipe.run(start())


# -- build-time checks ----------------------------------------------------------------------


async def _noop(turn):
    return cont(turn)


async def _other(turn):
    return cont(turn)


def test_a_parallel_group_in_post_is_a_config_error_naming_it() -> None:
    group = parallel(_noop, _other, name="lookups")

    with pytest.raises(ConfigError, match="lookups"):
        Pipeline(model=scripted(), post=[group])


def test_a_parallel_group_in_post_is_a_config_error_naming_its_position() -> None:
    group = parallel(_noop, _other, name="lookups")

    with pytest.raises(ConfigError, match=r"post, position 2"):
        Pipeline(model=scripted(), post=[_noop, group])


def test_a_parallel_group_in_a_post_chain_is_a_config_error_naming_it() -> None:
    group = parallel(_noop, _other, name="lookups")

    with pytest.raises(ConfigError, match="lookups"):
        Pipeline(model=scripted(), post=[chain(_noop, group, name="checks")])


@pytest.mark.parametrize("background", [False, True], ids=["ordered", "background"])
def test_match_on_a_post_hook_is_a_config_error_naming_it(background: bool) -> None:
    with pytest.raises(ConfigError, match="'picky'"):
        Pipeline(
            model=scripted(),
            post=[hook(_noop, name="picky", match="search", background=background)],
        )


def test_a_background_hook_inside_a_chain_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"'checks\.later'"):
        Pipeline(
            model=scripted(),
            post=[chain(_noop, hook(_other, name="later", background=True), name="checks")],
        )


def _two_arguments(turn, extra):
    return cont(turn)


@pytest.mark.parametrize("background", [False, True], ids=["ordered", "background"])
def test_a_post_hook_that_cannot_take_the_turn_is_a_config_error_naming_it(
    background: bool,
) -> None:
    with pytest.raises(ConfigError, match="'pairwise'"):
        Pipeline(
            model=scripted(),
            post=[hook(_two_arguments, name="pairwise", background=background)],
        )


def test_a_post_chain_member_that_cannot_take_the_turn_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"'checks\.pairwise'"):
        Pipeline(
            model=scripted(),
            post=[chain(_noop, hook(_two_arguments, name="pairwise"), name="checks")],
        )


# -- background post hooks, without a session -----------------------------------------------


async def test_run_awaits_background_hooks_before_returning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trace: list[str] = []
    pipe = Pipeline(model=scripted(), post=[sleeper(trace, "summary", 5, background=True)])
    began = anyio.current_time()

    await pipe.run(start())

    assert (trace, anyio.current_time() - began >= 5) == (["summary"], True)


async def test_background_hooks_run_after_the_ordered_post_hooks() -> None:
    trace: list[str] = []
    pipe = Pipeline(
        model=scripted(),
        post=[
            async_tracer(trace, "later", background=True),
            tracer(trace, "guard"),
            tracer(trace, "audit"),
        ],
    )

    await pipe.run(start())

    assert trace == ["guard", "audit", "later"]


async def test_a_background_hook_sees_the_accepted_reply() -> None:
    seen: list[str] = []

    async def summarize(turn):
        seen.append(turn.reply.text)
        return cont(turn)

    pipe = Pipeline(
        model=scripted("bad", "good"),
        post=[
            hook(summarize, background=True),
            returning("judge", lambda t: regenerate("no") if t.reply.text == "bad" else cont(t)),
        ],
    )

    await pipe.run(start())

    assert seen == ["good"]


async def test_a_background_hooks_success_is_audited() -> None:
    pipe = Pipeline(model=scripted(), post=[async_tracer([], "summary", background=True)])

    result = await pipe.run(start())

    assert [(r.stage, r.verdict) for r in records_of(result, "summary")] == [("post", "cont")]


async def test_a_failing_background_hook_does_not_fail_the_turn() -> None:
    pipe = Pipeline(
        model=scripted("Hello"),
        post=[raiser("summary", RuntimeError("kaput"), background=True)],
    )

    result = await pipe.run(start())

    assert (result.outcome, result.reply.text if result.reply else None) == ("completed", "Hello")


async def test_a_failing_background_hook_is_an_unenforced_hook_failed_event() -> None:
    pipe = Pipeline(
        model=scripted(), post=[raiser("summary", RuntimeError("kaput"), background=True)]
    )

    events, _ = await streamed(pipe, start())

    assert of_type(events, ev.HookFailed) == [
        ev.HookFailed(TURN_REF, "summary", "post", "RuntimeError: kaput", False)
    ]


async def test_a_shadow_background_hook_is_audited_as_a_shadow_and_injects_nothing() -> None:
    """A shadow background hook used to be audited as an enforced hook and its injection kept
    in the audit record, though a shadow hook's changes are discarded."""

    async def summarize(turn):
        return cont(turn.inject("summary so far"))

    pipe = Pipeline(
        model=scripted(),
        post=[hook(summarize, name="summary", background=True, durable=True, shadow=True)],
    )

    result = await pipe.run(start())

    assert [(r.verdict, r.shadow) for r in records_of(result, "summary")] == [("cont", True)]
    assert result.audit.injections == ()


async def test_a_failing_shadow_background_hook_is_audited_as_a_shadow() -> None:
    """A failing shadow background hook used to be audited as not a shadow."""
    pipe = Pipeline(
        model=scripted(),
        post=[raiser("summary", RuntimeError("kaput"), background=True, shadow=True)],
    )

    result = await pipe.run(start())

    assert [(r.verdict, r.shadow) for r in records_of(result, "summary")] == [("failed", True)]


async def test_a_failing_background_hook_is_audited_as_failed() -> None:
    pipe = Pipeline(
        model=scripted(), post=[raiser("summary", RuntimeError("kaput"), background=True)]
    )

    result = await pipe.run(start())

    assert [record.verdict for record in records_of(result, "summary")] == ["failed"]


async def test_a_background_hook_over_its_timeout_does_not_fail_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipe = Pipeline(model=scripted(), post=[sleeper([], "summary", 10, timeout=1, background=True)])

    result = await pipe.run(start())

    assert (result.outcome, [r.verdict for r in records_of(result, "summary")]) == (
        "completed",
        ["failed"],
    )


SIGNALS_A_BACKGROUND_HOOK_CANNOT_ENFORCE = [
    pytest.param(lambda turn: halt("stop"), id="halt"),
    pytest.param(lambda turn: halt("stop", reply="instead"), id="halt-with-reply"),
    pytest.param(lambda turn: regenerate("again"), id="regenerate"),
    pytest.param(lambda turn: None, id="none"),
]


@pytest.mark.parametrize("make", SIGNALS_A_BACKGROUND_HOOK_CANNOT_ENFORCE)
async def test_a_background_hook_cannot_halt_or_regenerate_the_turn(make) -> None:
    model = scripted("Hello", "again")
    pipe = Pipeline(model=model, post=[returning("summary", make, background=True)])

    result = await pipe.run(start())

    assert (result.outcome, result.halt, result.rejections, len(model.requests)) == (
        "completed",
        None,
        (),
        1,
    )
    assert result.reply is not None
    assert result.reply.text == "Hello"


@pytest.mark.parametrize("make", SIGNALS_A_BACKGROUND_HOOK_CANNOT_ENFORCE)
async def test_a_background_hooks_wrong_signal_is_recorded_as_a_failure(make) -> None:
    pipe = Pipeline(model=scripted(), post=[returning("summary", make, background=True)])

    events, result = await streamed(pipe, start())

    assert [record.verdict for record in records_of(result, "summary")] == ["failed"]
    assert [(e.hook, e.stage, e.enforced) for e in of_type(events, ev.HookFailed)] == [
        ("summary", "post", False)
    ]


async def test_a_background_hook_that_regenerates_is_told_why_without_a_contradicting_hint():
    """Catches: the failure of a background hook returning regenerate() ending with "—
    regenerate() is for post hooks, which see the reply", when the hook is a post hook: the
    error already says a background hook runs after the commit and cannot regenerate."""
    pipe = Pipeline(
        model=scripted(),
        post=[returning("summary", lambda turn: regenerate("again"), background=True)],
    )

    events, _ = await streamed(pipe, start())

    assert [e.error for e in of_type(events, ev.HookFailed)] == [
        "HookReturnError: expected hook 'summary' (post, position 1) to return Cont(turn) — a"
        " background hook runs after the commit, so it cannot halt or regenerate, got"
        " Regenerate Regenerate(feedback='again')"
    ]


async def test_a_background_hooks_when_returning_a_coroutine_is_a_failure_that_closes_it():
    """Catches: a background hook's ``when=`` returning a coroutine recorded as a failure
    but the coroutine left to warn, when collected, that it was never awaited."""
    made = []

    async def allowed(turn):
        return True

    def gate(turn):
        made.append(allowed(turn))
        return made[0]

    pipe = Pipeline(model=scripted(), post=[returning("summary", cont, background=True, when=gate)])

    result = await pipe.run(start())

    assert [record.verdict for record in records_of(result, "summary")] == ["failed"]
    assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED


def _with_injection(injection: object):
    return lambda turn: cont(attrs.evolve(turn, injections=(*turn.injections, injection)))


BAD_BACKGROUND_INJECTIONS = [
    pytest.param(_with_injection("a summary"), "not an Injection", id="not-an-injection"),
    pytest.param(
        _with_injection(Injection((ToolCall("c1", "lookup", {}),))),
        "unpaired tool parts",
        id="lone-tool-call",
    ),
]


@pytest.mark.parametrize(("make", "problem"), BAD_BACKGROUND_INJECTIONS)
async def test_a_background_hooks_bad_injection_is_recorded_as_a_failure(make, problem) -> None:
    """Catches: a background hook adding a bare string to the injections failing `run`
    (and the session) with an AttributeError after the turn completed, and one adding a
    lone tool call having it committed, a history every later request is refused for."""
    log = MemoryLog()
    pipe = Pipeline(
        model=scripted("one", "two"),
        post=[returning("summary", make, background=True, durable=True)],
    )

    result = await pipe.run(start())
    async with pipe.session(log=log, conversation_id="c1") as session:
        await session.send("hi")

    [record] = records_of(result, "summary")
    assert (record.verdict, problem in (record.detail or "")) == ("failed", True)
    assert [message.role for message in (await log.load("c1")).messages] == ["user", "assistant"]


@pytest.mark.parametrize(
    "pipe_kwargs",
    [
        pytest.param({"pre": [halter("gate")]}, id="pre-halt"),
        pytest.param({"post": [halter("guard")]}, id="post-halt"),
        pytest.param({"post": [rejecter("judge")], "max_regenerations": 1}, id="exhausted"),
    ],
)
async def test_background_hooks_do_not_run_when_the_turn_did_not_complete(pipe_kwargs) -> None:
    trace: list[str] = []
    kwargs = dict(pipe_kwargs)
    post = [*kwargs.pop("post", []), async_tracer(trace, "summary", background=True)]
    pipe = Pipeline(model=scripted("one", "two", "three"), post=post, **kwargs)

    result = await pipe.run(start())

    assert (result.outcome != "completed", trace) == (True, [])


# -- a changed reply is what the log holds --------------------------------------------------


def disclaimer(turn):
    """Appends a disclaimer by replacing only the reply's message."""
    message = Message.assistant(turn.reply.text + " (not legal advice)")
    return cont(attrs.evolve(turn, reply=attrs.evolve(turn.reply, message=message)))


def scrub_digits(turn):
    """Replaces every digit of the reply by '#', through the reply's message only."""
    text = "".join("#" if char.isdigit() else char for char in turn.reply.text)
    message = Message.assistant(text)
    return cont(attrs.evolve(turn, reply=attrs.evolve(turn.reply, message=message)))


async def test_a_post_hook_rewriting_only_the_reply_message_rewrites_what_is_logged_too() -> None:
    pipe = Pipeline(model=scripted("You may sue."), post=[disclaimer])

    result = await pipe.run(start())

    new = Message.assistant("You may sue. (not legal advice)")
    assert result.reply is not None
    assert (result.reply.text, result.reply.messages[-1], result.log_messages[-1]) == (
        "You may sue. (not legal advice)",
        new,
        new,
    )


async def test_a_post_hooks_disclaimer_reaches_the_sessions_log() -> None:
    log = MemoryLog()
    pipe = Pipeline(model=scripted("You may sue."), post=[disclaimer])

    async with pipe.session(log=log, conversation_id="c1") as session:
        await session.send("can I sue?")

    assert await log.load("c1") == Context(
        messages=(Message.user("can I sue?"), Message.assistant("You may sue. (not legal advice)"))
    )


async def test_a_post_hooks_scrub_leaves_the_unscrubbed_text_out_of_the_logged_messages() -> None:
    log = MemoryLog()
    pipe = Pipeline(model=scripted("call 555 1234"), post=[scrub_digits])

    async with pipe.session(log=log, conversation_id="c1") as session:
        result = await session.send("number?")

    (entry,) = await log.entries("c1")
    logged = [message.text for message in entry.messages]
    assert logged == ["number?", "call ### ####"]
    assert [message.text for message in result.log_messages] == logged


def reject_if(word: str):
    """A guardrail sending the model back while the reply holds `word`."""

    def check(turn):
        return regenerate("leave it out") if word in turn.reply.text else cont(turn)

    return hook(check, name="guard")


async def test_a_post_hooks_scrub_leaves_the_unscrubbed_text_out_of_the_stored_audit(
    tmp_path,
) -> None:
    """Bug caught: the audit record stored next to the committed turn kept every attempt's
    text (and a rejected attempt's) as the model said it, before a post hook scrubbed it, so
    the SQLite file held the digits the scrub had removed."""
    path = tmp_path / "log.db"
    pipe = Pipeline(
        model=scripted("call 555 1234, boss", "call 555 9876"),
        post=[scrub_digits, reject_if("boss")],
    )

    async with SQLiteLog(path) as log:
        async with pipe.session(log=log, conversation_id="c1") as session:
            result = await session.send("number?")
        stored = b"".join(file.read_bytes() for file in tmp_path.iterdir())
        (entry,) = await log.entries("c1")

    assert (b"555 1234" in stored, b"555 9876" in stored) == (False, False)
    assert stored.count(b"### ####") >= 3  # the audit and the messages reached the files
    assert entry.audit == result.audit
    assert entry.audit is not None
    assert [(a.attempt, a.text) for a in entry.audit.attempts] == [
        (1, "call ### ####, boss"),
        (2, "call ### ####"),
    ]
    assert [(r.attempt, r.hook, r.text) for r in entry.audit.rejections] == [
        (1, "guard", "call ### ####, boss")
    ]


async def test_a_rejection_holds_the_text_as_the_rejecting_hook_saw_it() -> None:
    """Bug caught: a rejected attempt's record held the text before the post hooks ahead of
    the rejecting one rewrote it, where it should hold what that hook judged."""
    pipe = Pipeline(
        model=scripted("call 555 1234, boss", "fine"),
        post=[scrub_digits, reject_if("boss"), disclaimer],
    )

    result = await pipe.run(start())

    assert [(r.attempt, r.text) for r in result.rejections] == [(1, "call ### ####, boss")]
    assert [a.text for a in result.audit.attempts] == [
        "call ### ####, boss",
        "fine (not legal advice)",
    ]


async def test_a_post_stage_halt_audits_the_attempt_as_the_halting_hook_saw_it() -> None:
    """Bug caught: a halted attempt's record held the text before the post hooks ahead of
    the halting one scrubbed it."""
    stop = hook(lambda turn: halt("no numbers at all"), name="stop")
    pipe = Pipeline(model=scripted("call 555 1234"), post=[scrub_digits, stop])

    result = await pipe.run(start())

    assert (result.outcome, [a.text for a in result.audit.attempts]) == (
        "halted",
        ["call ### ####"],
    )


async def test_held_text_is_released_as_a_post_hook_scrubbed_it() -> None:
    """Bug caught: with hold_until_accepted, the released text events carried the reply as
    the model said it, digits a post hook had scrubbed included, beside a ReplyReady that
    carried it scrubbed."""
    pipe = Pipeline(
        model=scripted("call 555 1234 now"), post=[scrub_digits], hold_until_accepted=True
    )

    seen, result = await streamed(pipe, start())

    texts = [(e.text, e.attempt) for e in seen if type(e) is ev.TextDelta]
    ready = [e.reply.text for e in seen if type(e) is ev.ReplyReady]
    assert (texts, ready, result.reply.text) == (
        [("call ### #### now", 1)],
        ["call ### #### now"],
        "call ### #### now",
    )
    assert [type(e) for e in seen].index(ev.TextDelta) < [type(e) for e in seen].index(
        ev.ReplyReady
    )


async def test_a_post_hook_setting_the_user_message_to_text_fails_it_and_commits_nothing() -> None:
    """Bug: a post hook could set turn.user_message to a str; the turn completed and the
    session's commit failed with an AttributeError naming no hook."""
    log = MemoryLog()
    pipe = Pipeline(
        model=scripted(),
        post=[returning("echo", lambda turn: cont(attrs.evolve(turn, user_message="hi")))],
    )

    with pytest.raises(HookReturnError, match=r"'echo' \(post, position 1\).*user_message"):
        async with pipe.session(log=log, conversation_id="c1") as session:
            await session.send("hi")

    assert await log.load("c1") == Context()


async def test_a_post_hook_setting_the_reply_to_text_is_a_hook_return_error_naming_it() -> None:
    pipe = Pipeline(
        model=scripted(),
        post=[returning("sloppy", lambda turn: cont(attrs.evolve(turn, reply="hello")))],
    )

    with pytest.raises(HookReturnError, match=r"'sloppy' \(post, position 1\)") as raised:
        await pipe.run(start())

    assert (raised.value.hook, raised.value.stage) == ("sloppy", "post")
    assert "str" in str(raised.value)
    assert "'hello'" in str(raised.value)


def _both_changed(turn):
    reply = attrs.evolve(
        turn.reply,
        message=Message.assistant("shown"),
        messages=(Message.assistant("logged"),),
    )
    return cont(attrs.evolve(turn, reply=reply))


def _only_messages_changed(turn):
    reply = attrs.evolve(turn.reply, messages=(Message.assistant("logged"),))
    return cont(attrs.evolve(turn, reply=reply))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_both_changed, id="both-changed"),
        pytest.param(_only_messages_changed, id="only-messages-changed"),
    ],
)
async def test_a_reply_whose_last_message_is_not_its_message_is_a_hook_return_error(make) -> None:
    # The log commits reply.messages and the caller reads reply.message: out of step, one of
    # them would say what the other does not.
    pipe = Pipeline(model=scripted("original"), post=[returning("sloppy", make)])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(post, position 1\)") as raised:
        await pipe.run(start())

    assert (raised.value.hook, raised.value.stage) == ("sloppy", "post")


async def test_a_post_hook_returning_the_reply_is_told_to_return_cont_turn() -> None:
    pipe = Pipeline(model=scripted(), post=[returning("sloppy", lambda turn: turn.reply)])

    with pytest.raises(HookReturnError, match=r"'sloppy' \(post, position 1\)") as raised:
        await pipe.run(start())

    assert "cont(turn)" in str(raised.value)


# -- every HookStarted is closed once -------------------------------------------------------


def test_pairing_problems_finds_a_failure_without_a_start_and_an_unclosed_start() -> None:
    events = [
        ev.HookFailed(TURN_REF, "a", "pre", "x", True),
        ev.HookStarted(TURN_REF, "b", "post"),
        ev.HookFailed(TURN_REF, "c", "commit", "x", False),
    ]

    assert pairing_problems(events) == [
        f"HookFailed {(TURN_REF, 'a', 'pre')} closes nothing",
        f"{(TURN_REF, 'b', 'post')} never closed",
    ]


async def streamed_until_raised(
    pipe: Pipeline, turn: Turn
) -> tuple[list[ev.Event], HookFailed | None]:
    """Every event of a streamed turn, and the HookFailed it raised, if it did."""
    seen: list[ev.Event] = []
    try:
        async with pipe.stream(turn) as events:
            async for event in events:
                seen.append(event)
    except HookFailed as error:
        return seen, error
    return seen, None


def _unsure(turn):
    raise KeyError("admin")


WHEN_RAISES = [
    pytest.param(
        "pre",
        "skip",
        [
            ("TurnStarted", None),
            ("HookStarted", "gated"),
            ("HookFailed", "gated"),
            ("ModelCalled", None),
            ("TextDelta", None),
            ("ModelFinished", None),
            ("ReplyReady", None),
            ("TurnFinished", None),
        ],
        id="pre-skip",
    ),
    pytest.param(
        "pre",
        "halt",
        [("TurnStarted", None), ("HookStarted", "gated"), ("HookFailed", "gated")],
        id="pre-halt",
    ),
    pytest.param(
        "post",
        "skip",
        [
            ("TurnStarted", None),
            ("ModelCalled", None),
            ("TextDelta", None),
            ("ModelFinished", None),
            ("ReplyReady", None),
            ("HookStarted", "gated"),
            ("HookFailed", "gated"),
            ("TurnFinished", None),
        ],
        id="post-skip",
    ),
    pytest.param(
        "post",
        "halt",
        [
            ("TurnStarted", None),
            ("ModelCalled", None),
            ("TextDelta", None),
            ("ModelFinished", None),
            ("ReplyReady", None),
            ("HookStarted", "gated"),
            ("HookFailed", "gated"),
        ],
        id="post-halt",
    ),
]


@pytest.mark.parametrize(("stage", "on_error", "expected"), WHEN_RAISES)
async def test_a_raising_when_predicate_opens_a_hook_started_before_its_hook_failed(
    stage: str, on_error: str, expected: list[tuple[str, str | None]]
) -> None:
    gated = tracer([], "gated", when=_unsure, on_error=on_error)
    if stage == "pre":
        pipe = Pipeline(model=scripted(), pre=[gated])
    else:
        pipe = Pipeline(model=scripted(), post=[gated])

    events, raised = await streamed_until_raised(pipe, start())

    assert kinds(events) == expected
    assert pairing_problems(events) == []
    assert (raised is not None) == (on_error == "halt")


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_keyboard_interrupt_out_of_a_background_hook_leaves_no_hook_unrun(loop: str) -> None:
    """Bug caught: a background hook raising KeyboardInterrupt under asyncio let it out of its
    task, which stopped the loop before the other background hooks started: the coroutine
    AnyIO had made for each was never awaited ("coroutine 'run_all_background.<locals>.one'
    was never awaited"). Run from sync code, as an application would, and collected, so
    that a coroutine left unawaited warns inside the test."""

    async def interrupted(turn):
        raise KeyboardInterrupt

    async def sibling(turn):
        return cont(turn)

    post = [
        hook(interrupted, name="interrupted", background=True),
        hook(sibling, name="one", background=True),
        hook(sibling, name="two", background=True),
    ]
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=post)

    async def main() -> None:
        await pipe.run(Turn.start("hi"))

    assert warnings_of_an_interrupted_run(loop, main) == []


async def test_a_system_exit_out_of_a_background_hook_is_not_lost_to_the_callers_cancellation():
    """Bug caught: a background hook cancelling the caller's scope (as a deadline passing at
    that instant would) and raising SystemExit, kept to be raised once the hooks' task group
    closed: the task group raised the cancellation instead, the caller's scope absorbed it,
    and the run returned as if nothing happened."""
    scopes: list[anyio.CancelScope] = []

    async def exiting(turn):
        scopes[0].cancel()
        raise SystemExit(3)

    async def sibling(turn):
        await anyio.sleep(10)
        return cont(turn)

    post = [
        hook(exiting, name="exiting", background=True),
        hook(sibling, name="sibling", background=True),
    ]
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=post)

    async def caller() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await pipe.run(Turn.start("hi"))

    with pytest.raises(SystemExit) as info:
        await caller()
    assert info.value.code == 3


async def test_the_interrupt_that_stopped_the_background_hooks_carries_the_others_as_notes():
    """Bug caught: run without a session, the background hooks raised the first interrupt to
    end, and one another hook raised as they stopped (KeyboardInterrupt in place of its
    cancellation) was dropped without a word, where a parallel group's or a tool batch's
    rides along as a note."""

    pipe = exiting_with_a_late_interrupt()

    with pytest.raises(SystemExit) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.code == 5
    assert info.value.__notes__ == [
        "background hook 'first' (post, position 1) also raised KeyboardInterrupt as the"
        " background hooks stopped"
    ]


def hook_trace(events) -> list[tuple[str, str, str | None, bool | None]]:
    """The hook events of `events`: kind, hook, error (or verdict) and whether enforced."""
    return [
        (
            type(e).__name__,
            e.hook,
            getattr(e, "error", getattr(e, "verdict", None)),
            getattr(e, "enforced", None),
        )
        for e in events
        if type(e) in (ev.HookStarted, ev.HookFinished, ev.HookFailed)
    ]


def leaving_while_slow_runs() -> Pipeline:
    """Background hooks 'slow', which waits forever, and 'leave', which raises SystemExit(5)
    once 'slow' has started."""
    started = anyio.Event()

    async def slow(turn):
        started.set()
        await anyio.sleep_forever()

    async def leave(turn):
        await started.wait()
        raise SystemExit(5)

    post = [hook(slow, name="slow", background=True), hook(leave, name="leave", background=True)]
    return Pipeline(model=ScriptedModel(["ok"]), post=post)


@pytest.mark.parametrize("where", ["pipeline", "session"])
async def test_background_hooks_an_interrupt_stopped_each_end_once_in_the_events(where):
    """Bug caught: a background hook raising SystemExit, and the background hook it cut short
    (without a session), left their HookStarted open in the events, so a timeline showed
    them running forever."""
    pipe = leaving_while_slow_runs()
    seen: list[ev.Event] = []

    async def main() -> None:
        if where == "pipeline":
            await collect_into(seen, pipe, Turn.start("hi"))
            return
        try:
            async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
                await session.send("hi")
                await anyio.sleep_forever()
        finally:
            seen.extend(session.events)

    with pytest.raises(SystemExit):
        await main()
    if where == "session":
        cut = (
            "cut short: background hook 'leave' raised SystemExit, which stopped the session;"
            " nothing of it was committed"
        )
    else:
        cut = (
            "cut short: background hook 'leave' (post, position 2) raised SystemExit, which"
            " stopped the turn"
        )
    trace = hook_trace(seen)
    # The two start together, in the order the loop runs their tasks.
    assert sorted(trace[:2]) == [
        ("HookStarted", "leave", None, None),
        ("HookStarted", "slow", None, None),
    ]
    assert trace[2:] == [
        ("HookFailed", "leave", "SystemExit: 5", True),
        ("HookFailed", "slow", cut, False),
    ]
    assert pairing_problems(seen) == []


async def test_background_hooks_interrupted_at_the_same_instant_raise_the_first_declared():
    """Bug caught: run without a session, background hooks raising KeyboardInterrupt and
    SystemExit at the same instant raised the one the loop happened to run first (at random
    under trio, the later hook under asyncio when it was woken first), not the first in
    declaration order."""
    for _ in range(20):  # trio runs the two in a random order each time
        with pytest.raises(KeyboardInterrupt) as info:
            await pipe_interrupted_twice_at_once().run(Turn.start("hi"))
        assert info.value.__notes__ == [
            "background hook 'second' (post, position 2) also raised SystemExit as the"
            " background hooks stopped"
        ]


def pipe_interrupted_twice_at_once() -> Pipeline:
    """Background hooks 'first' and 'second' raise KeyboardInterrupt and SystemExit, woken at
    one instant by 'third', the later one woken first."""
    interrupting, exiting = anyio.Event(), anyio.Event()

    async def interrupted(turn):
        await interrupting.wait()
        raise KeyboardInterrupt

    async def exits(turn):
        await exiting.wait()
        raise SystemExit(5)

    async def wakes_both(turn):
        exiting.set()
        interrupting.set()
        return cont(turn)

    post = [
        hook(interrupted, name="first", background=True),
        hook(exits, name="second", background=True),
        hook(wakes_both, name="third", background=True),
    ]
    return Pipeline(model=ScriptedModel(["ok"]), post=post)
