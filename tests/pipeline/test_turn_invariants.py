"""What an ordered pre hook may not change, how provenance and halts are checked, and which
turns a pipeline refuses to run."""

import re

import attrs
import pytest

from pipeline import (
    Budget,
    Halt,
    HookReturnError,
    InjectionOverflow,
    Pipeline,
    cont,
    hook,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Context, Injection, Message, Text, ToolCall, ToolSpec, Turn

TOOLS = (ToolSpec("a"), ToolSpec("b"))


def returning(name, make, **options):
    async def run(turn):
        return make(turn)

    return hook(run, name=name, **options)


def pipe_of(*pre, model=None, **options):
    return Pipeline(model=model or ScriptedModel(["ok"]), pre=list(pre), **options)


def turn_with_tools():
    return Turn.start("hi", context=Context(tools=TOOLS))


async def test_a_hook_that_changes_the_turn_ref_fails_naming_it():
    pipe = pipe_of(returning("relabel", lambda t: cont(attrs.evolve(t, turn_ref="other"))))
    with pytest.raises(HookReturnError, match=r"'relabel' \(pre, position 1\).*turn_ref"):
        await pipe.run(Turn.start("hi", turn_ref="mine"))


async def test_a_hook_that_adds_a_tool_fails_and_the_model_is_never_called():
    model = ScriptedModel(["ok"])
    widen = returning(
        "widen",
        lambda t: cont(
            attrs.evolve(t, context=attrs.evolve(t.context, tools=(*TOOLS, ToolSpec("evil"))))
        ),
    )
    with pytest.raises(HookReturnError, match=r"'widen'.*tools are fixed"):
        await pipe_of(widen, model=model).run(turn_with_tools())
    assert model.requests == []


async def test_a_hook_that_widens_active_tools_back_fails():
    narrow = returning("narrow", lambda t: cont(t.with_request(active_tools=["a"])))
    reset = returning(
        "reset", lambda t: cont(attrs.evolve(t, request=attrs.evolve(t.request, active_tools=None)))
    )
    with pytest.raises(HookReturnError, match=r"'reset'.*widened active_tools"):
        await pipe_of(narrow, reset).run(turn_with_tools())


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"context": None}, "turn.context is None, not a Context"),
        ({"scope": {"plan": "pro"}}, "turn.scope is dict .*, not a Scope"),
        ({"request": {"temperature": 0}}, "turn.request is dict .*, not a RequestOptions"),
        ({"injections": ("a note",)}, "put str 'a note' among turn.injections, not an Injection"),
        ({"reply": "an answer"}, "turn.reply is str 'an answer', not a Reply"),
        ({"user_message": "hi again"}, "turn.user_message is str 'hi again', not a Message"),
        (
            {"user_message": Message.assistant("hi")},
            "turn.user_message is a 'assistant' message, not the turn's 'user' one",
        ),
    ],
    ids=["context", "scope", "request", "injections", "reply", "user-str", "user-role"],
)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_hook_returning_a_turn_with_a_field_of_the_wrong_kind_fails_naming_it(
    changes, problem, sync
):
    """Catches: a turn whose fields a hook replaced with the wrong kind of value accepted,
    to fail later as a bare AttributeError naming no hook, as the provider's failure, or
    not at all (an assistant message committed as what the user said)."""
    model = ScriptedModel(["ok"])

    def mangle(turn):
        return cont(attrs.evolve(turn, **changes))

    async def mangle_async(turn):
        return mangle(turn)

    pipe = pipe_of(hook(mangle if sync else mangle_async, name="mangle"), model=model)

    with pytest.raises(HookReturnError, match=rf"'mangle' \(pre, position 1\) .*{problem}"):
        await pipe.run(Turn.start("hi"))
    assert model.requests == []


async def test_narrowing_tools_and_replacing_the_history_view_are_allowed():
    model = ScriptedModel(["ok"])
    view = returning(
        "view",
        lambda t: cont(
            attrs.evolve(t, context=attrs.evolve(t.context, messages=(Message.user("old"),)))
        ),
    )
    narrow = returning("narrow", lambda t: cont(t.with_request(active_tools=["b"])))
    result = await pipe_of(view, narrow, model=model).run(turn_with_tools())
    assert result.outcome == "completed"
    assert [spec.name for spec in model.requests[0].tools] == ["b"]


async def test_a_hook_rewriting_an_earlier_injection_keeps_its_provenance():
    add = hook(returning("add", lambda t: cont(t.inject("secret 123"))), durable=True)
    scrub = returning(
        "scrub",
        lambda t: cont(
            attrs.evolve(
                t,
                injections=(attrs.evolve(t.injections[0], parts=(Text("secret [x]"),)),),
            )
        ),
    )
    result = await pipe_of(add, scrub).run(Turn.start("hi"))
    [injection] = result.turn.injections
    assert (injection.source, injection.durable, injection.parts) == (
        "add",
        True,
        (Text("secret [x]"),),
    )


async def test_a_hooks_own_injection_is_never_taken_for_a_rewrite_of_a_namesakes():
    """Catches: an injection `Turn.inject` stamped while the hook ran being treated as a
    rewrite of an earlier hook's injection at the same position because both hooks have the
    same name, so it would keep the earlier one's durability instead of its own hook's."""
    received = []

    def remember(turn):
        received.append(turn)
        return turn

    first = returning("same", lambda t: cont(remember(t).inject("first")), durable=False)
    # Injects into the turn the first hook received: its injection replaces the first's.
    second = returning("same", lambda t: cont(received[0].inject("second")), durable=True)
    result = await pipe_of(first, second).run(Turn.start("hi"))
    assert [(i.source, i.durable, i.parts) for i in result.turn.injections] == [
        ("same", True, (Text("second"),))
    ]


async def test_a_hook_running_a_pipeline_of_its_own_stamps_what_that_pipeline_added():
    """Catches: the inner pipeline's stamper left current after it returns (the outer hook's
    later injections stamped with an inner hook's name), or the outer runtime keeping the
    inner hooks' stamps on injections that are, for the outer stage, its hook's."""
    inner = pipe_of(returning("inner", lambda t: cont(t.inject("from inner")), durable=True))

    async def outer(turn):
        result = await inner.run(turn)
        return cont(result.turn.inject("from outer"))

    result = await pipe_of(hook(outer, name="outer")).run(Turn.start("hi"))
    assert [(i.source, i.durable, i.parts[0].text) for i in result.turn.injections] == [
        ("outer", False, "from inner"),
        ("outer", False, "from outer"),
    ]


async def test_a_rewritten_injection_is_not_charged_twice():
    # 8 tokens injected, then rewritten to 8 tokens: 8 in all, within a reserve of 10.
    add = returning("add", lambda t: cont(t.inject("x" * 32)))
    rewrite = returning(
        "rewrite",
        lambda t: cont(
            attrs.evolve(t, injections=(attrs.evolve(t.injections[0], parts=(Text("y" * 32),)),))
        ),
    )
    result = await pipe_of(add, rewrite, budget=Budget(10_000, 10)).run(Turn.start("hi"))
    assert result.outcome == "completed"


async def test_a_removed_injection_frees_its_tokens():
    add = returning("add", lambda t: cont(t.inject("x" * 32)))
    drop = returning("drop", lambda t: cont(attrs.evolve(t, injections=())))
    again = returning("again", lambda t: cont(t.inject("z" * 32)))
    result = await pipe_of(add, drop, again, budget=Budget(10_000, 10)).run(Turn.start("hi"))
    assert [i.source for i in result.turn.injections] == ["again"]


async def test_the_budget_still_catches_a_rewrite_that_grows():
    add = returning("add", lambda t: cont(t.inject("x" * 8)))
    grow = returning(
        "grow",
        lambda t: cont(
            attrs.evolve(t, injections=(attrs.evolve(t.injections[0], parts=(Text("y" * 80),)),))
        ),
    )
    with pytest.raises(InjectionOverflow) as info:
        await pipe_of(add, grow, budget=Budget(10_000, 10)).run(Turn.start("hi"))
    assert (info.value.hook, info.value.total) == ("grow", 20)


@pytest.mark.parametrize(
    ("reply", "complaint"),
    [(Message.user("hi"), "assistant message"), (42, "text or a Message")],
)
async def test_a_halt_built_directly_with_a_bad_reply_fails_naming_the_hook(reply, complaint):
    pipe = pipe_of(returning("gate", lambda t: Halt("no", reply)))
    with pytest.raises(HookReturnError, match=rf"'gate'.*{complaint}"):
        await pipe.run(Turn.start("hi"))


async def test_a_halt_with_a_reply_puts_it_on_the_result_turn_too():
    pipe = pipe_of(returning("gate", lambda t: Halt("no", "Sign in first.")))
    result = await pipe.run(Turn.start("hi"))
    assert result.turn.reply == result.reply
    assert result.reply is not None
    assert result.reply.text == "Sign in first."


async def test_a_shadow_hook_whose_when_returns_a_non_bool_does_not_stop_the_turn():
    shadow = returning("watch", lambda t: cont(t), shadow=True, when=lambda t: "yes")
    async with pipe_of(shadow).stream(Turn.start("hi")) as events:
        failed = [e async for e in events if isinstance(e, ev.HookFailed)]
    assert events.result.outcome == "completed"
    assert [(e.hook, e.enforced) for e in failed] == [("watch", False)]


async def test_every_hook_started_event_is_closed_once():
    pipe = pipe_of(
        returning("plain", cont),
        returning("watch", lambda t: Halt("would stop"), shadow=True),
    )
    async with pipe.stream(Turn.start("hi")) as events:
        seen = [e async for e in events]
    opened = [e.hook for e in seen if isinstance(e, ev.HookStarted)]
    closed = [e.hook for e in seen if isinstance(e, ev.HookFinished | ev.HookFailed)]
    assert opened == closed == ["plain", "watch"]


# -- the turn a pipeline is given -----------------------------------------------------------

# Turns built by hand or with attrs.evolve, which check nothing, and the word naming the field
# (a Context checks its own fields, so a history holding text is refused as it is built).
MALFORMED_TURNS = {
    "history": (
        lambda: Turn.start("hi", context=Context(messages=("earlier",))),
        "Context.messages",
    ),
    "context": (lambda: attrs.evolve(Turn.start("hi"), context=None), "turn.context"),
    # Catches: tools offered as names failing in the tool setup with an AttributeError.
    "tools": (lambda: Turn.start("hi", context=Context(tools=["lookup"])), "Context.tools"),
    "user_message": (lambda: attrs.evolve(Turn.start("hi"), user_message="hi"), "user_message"),
    "scope": (lambda: attrs.evolve(Turn.start("hi"), scope={"user": "ada"}), "turn.scope"),
    "injections": (lambda: attrs.evolve(Turn.start("hi"), injections=["note"]), "injections"),
    "turn_ref": (lambda: attrs.evolve(Turn.start("hi"), turn_ref=""), "turn_ref"),
    # Bug caught: an assistant message in the user's place was sent as the user's turn.
    "user_message-role": (
        lambda: attrs.evolve(Turn.start("hi"), user_message=Message.assistant("hi")),
        "turn.user_message is a 'assistant' message",
    ),
    # Bug caught: a tool call injected by hand without its result was sent to the model as
    # an assistant tool-call message no provider accepts.
    "injection-unpaired": (
        lambda: attrs.evolve(
            Turn.start("hi"), injections=(Injection((ToolCall("c1", "lookup", {}),)),)
        ),
        "turn.injections[0] is malformed: tool calls ['c1'] have no result",
    ),
}


@pytest.mark.parametrize("field", list(MALFORMED_TURNS))
async def test_run_refuses_a_malformed_turn_naming_the_field(field: str) -> None:
    """Bug: a turn with a malformed field (a history holding text, say) was run, and failed
    mid-turn as an AttributeError or as a ProviderError blaming the model."""
    make, word = MALFORMED_TURNS[field]
    model = ScriptedModel(["ok"])

    with pytest.raises(TypeError, match=re.escape(word)):
        await Pipeline(model=model).run(make())

    assert model.requests == []


@pytest.mark.parametrize("field", list(MALFORMED_TURNS))
def test_stream_refuses_a_malformed_turn_naming_the_field(field: str) -> None:
    """Bug: as for run(): a streamed malformed turn failed mid-turn, blaming the model."""
    make, word = MALFORMED_TURNS[field]

    with pytest.raises(TypeError, match=re.escape(word)):
        Pipeline(model=ScriptedModel(["ok"])).stream(make())
