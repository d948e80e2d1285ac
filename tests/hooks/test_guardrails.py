"""hooks guardrails: guardrail, deny, max_length and judge, alone and in a pipeline."""

import re

import anyio
import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import deny, guardrail, judge, max_length
from pipeline import (
    ConfigError,
    Cont,
    Hook,
    HookFailed,
    HookTimeout,
    Pipeline,
    ProviderError,
    Regenerate,
    hook,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from tests.pipeline.support import collect, live_tasks
from turns import Message, Reply, Turn


def replied(text: str, question: str = "Can I get a refund?") -> Turn:
    turn = Turn.start(question)
    return attrs.evolve(turn, reply=Reply(Message.assistant(text), (Message.assistant(text),)))


def no_secrets(text: str) -> bool:
    return "secret" not in text


# -- guardrail ------------------------------------------------------------------------------


async def test_an_accepted_reply_continues_unchanged():
    turn = replied("Refunds take 14 days.")
    assert await guardrail(no_secrets)(turn) == Cont(turn)


async def test_a_false_check_rejects_with_the_feedback():
    rail = guardrail(no_secrets, feedback="Never reveal secrets.")
    assert await rail(replied("the secret is 42")) == Regenerate("Never reveal secrets.")


async def test_without_feedback_the_rejection_names_the_check():
    verdict = await guardrail(no_secrets)(replied("a secret"))
    assert isinstance(verdict, Regenerate)
    assert "no_secrets" in verdict.feedback


async def test_a_string_from_the_check_is_the_feedback():
    rail = guardrail(lambda text: "Too short." if len(text) < 5 else True, feedback="unused")
    assert await rail(replied("Hi")) == Regenerate("Too short.")


async def test_an_empty_string_from_the_check_rejects_with_the_default_feedback():
    rail = guardrail(lambda text: "  ", feedback="Say more.")
    assert await rail(replied("Hi")) == Regenerate("Say more.")


async def test_an_async_check_is_awaited():
    async def slow_check(text: str) -> bool | str:
        await anyio.lowlevel.checkpoint()
        return "Be polite." if "stupid" in text else True

    rail = guardrail(slow_check)
    assert await rail(replied("a stupid question")) == Regenerate("Be polite.")
    assert isinstance(await rail(replied("a fine question")), Cont)


@pytest.mark.parametrize("returned", [None, 1, 0, b"yes", [False]])
async def test_a_check_returning_anything_else_fails_rather_than_accepts(returned):
    rail = guardrail(lambda text: returned, name="sloppy")
    with pytest.raises(TypeError, match="sloppy") as info:
        await rail(replied("anything"))
    assert "True, False or feedback text" in str(info.value)


async def test_a_guardrail_placed_before_the_model_says_where_it_belongs():
    with pytest.raises(TypeError, match="post"):
        await guardrail(no_secrets)(Turn.start("hi"))


def test_the_hook_is_named_after_the_check_or_as_told():
    assert guardrail(no_secrets).name == "no_secrets"
    assert guardrail(no_secrets, name="secrets").name == "secrets"
    assert isinstance(guardrail(no_secrets), Hook)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"check": "no secrets"}, "check"),
        ({"check": lambda text, extra: True}, "check"),
        ({"check": no_secrets, "feedback": ""}, "feedback"),
        ({"check": no_secrets, "feedback": 3}, "feedback"),
        ({"check": no_secrets, "name": ""}, "name"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, option):
    with pytest.raises(ConfigError, match=f"guardrail\\({option}="):
        guardrail(**kwargs)


async def test_in_a_pipeline_a_rejected_reply_is_asked_again_with_the_feedback():
    model = ScriptedModel(["The secret code is 42.", "I cannot share codes."])
    pipe = Pipeline(model=model, post=[guardrail(no_secrets, feedback="No secrets.")])
    result = await pipe.run(Turn.start("What is the code?"))
    assert result.outcome == "completed"
    assert result.reply is not None
    assert result.reply.text == "I cannot share codes."
    assert [(r.attempt, r.hook, r.feedback, r.text) for r in result.rejections] == [
        (1, "no_secrets", "No secrets.", "The secret code is 42.")
    ]
    assert [m.text for m in model.requests[1].messages[-2:]] == [
        "The secret code is 42.",
        "No secrets.",
    ]


async def test_in_shadow_mode_the_verdict_is_recorded_but_not_enforced():
    pipe = Pipeline(
        model=ScriptedModel(["The secret code is 42."]),
        post=[hook(guardrail(no_secrets, feedback="No secrets."), shadow=True)],
    )
    events, result = await collect(pipe, Turn.start("code?"))
    assert result.outcome == "completed"
    assert result.reply is not None
    assert result.reply.text == "The secret code is 42."
    assert [e for e in events if isinstance(e, ev.ShadowVerdict)] == [
        ev.ShadowVerdict(result.turn.turn_ref, "no_secrets", "post", "regenerate", "No secrets.")
    ]


async def test_a_check_that_raises_fails_the_turn_and_nothing_is_committed():
    def broken(text: str) -> bool:
        raise RuntimeError("classifier down")

    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["fine"]), post=[guardrail(broken)])
    async with pipe.session(log=log, conversation_id="c") as session:
        with pytest.raises(HookFailed) as info:
            await session.send("hi")
    assert info.value.hook.endswith("broken")
    assert (await log.load("c")).messages == ()


async def test_a_reply_that_never_passes_exhausts_the_bound():
    pipe = Pipeline(
        model=ScriptedModel(["secret"] * 3), post=[guardrail(no_secrets)], max_regenerations=2
    )
    result = await pipe.run(Turn.start("code?"))
    assert (result.outcome, result.reply, len(result.rejections)) == ("exhausted", None, 3)


# -- deny -----------------------------------------------------------------------------------


async def test_deny_rejects_a_reply_in_which_a_pattern_is_found():
    rail = deny(r"(?i)internal use only", re.compile(r"\bAKIA[0-9A-Z]{16}\b"), feedback="No.")
    assert await rail(replied("This is INTERNAL USE ONLY.")) == Regenerate("No.")
    assert await rail(replied("key AKIAABCDEFGHIJKLMNOP")) == Regenerate("No.")
    assert isinstance(await rail(replied("Refunds take 14 days.")), Cont)
    assert rail.name == "deny"


@pytest.mark.parametrize(
    ("patterns", "culprit"),
    [
        ((), "at least one pattern"),
        (("(unclosed",), "(unclosed"),
        ((r"x*",), "x*"),
        ((b"x",), "b'x'"),
    ],
)
def test_deny_refuses_bad_patterns_by_name(patterns, culprit):
    with pytest.raises(ConfigError) as info:
        deny(*patterns, feedback="No.")
    assert culprit in str(info.value)


@pytest.mark.parametrize("pattern", [r"\b", r"(?=\w)", r"(?s)(?=.)", r"(?<=.)", r"x|\B"])
def test_deny_refuses_a_zero_width_pattern_by_name(pattern):
    """Catches: zero-width patterns (empty only next to some text, so search("") missed
    them) accepted, then rejecting every reply."""
    with pytest.raises(ConfigError, match="can match zero characters") as info:
        deny(pattern, feedback="No.")
    assert "every reply" not in str(info.value)
    assert repr(pattern) in str(info.value)


def test_a_deny_pattern_found_in_each_text_tried_is_said_to_reject_almost_any_reply():
    """Bug caught: a pattern found in each of the few texts it was tried on, but not in all
    (``^(?!zzz)`` misses a reply starting "zzz"), was said to reject every reply."""
    with pytest.raises(ConfigError, match="would reject almost any reply") as info:
        deny(r"^(?!zzz)", feedback="No.")
    assert "every reply" not in str(info.value)


@pytest.mark.parametrize("feedback", ["", "  ", None, 7])
def test_deny_needs_feedback_text(feedback):
    with pytest.raises(ConfigError, match=r"deny\(feedback="):
        deny("x", feedback=feedback)


async def test_deny_in_a_pipeline():
    pipe = Pipeline(
        model=ScriptedModel(["For internal use only: 42", "It is 42."]),
        post=[deny("(?i)internal use", feedback="Leave out internal notes.")],
    )
    result = await pipe.run(Turn.start("answer?"))
    assert result.reply is not None
    assert (result.reply.text, result.rejections[0].hook) == ("It is 42.", "deny")


# -- max_length -----------------------------------------------------------------------------


async def test_max_length_accepts_up_to_the_limit_and_says_how_long_otherwise():
    rail = max_length(5)
    assert isinstance(await rail(replied("12345")), Cont)
    verdict = await rail(replied("123456"))
    assert isinstance(verdict, Regenerate)
    assert "6 characters" in verdict.feedback
    assert "5" in verdict.feedback


async def test_max_length_uses_the_feedback_given():
    assert await max_length(3, feedback="Shorter.")(replied("long")) == Regenerate("Shorter.")


@pytest.mark.parametrize("chars", [0, -1, True, 2.5, "10", None])
def test_max_length_refuses_a_bad_limit(chars):
    with pytest.raises(ConfigError) as info:
        max_length(chars)
    assert "chars" in str(info.value)
    assert repr(chars) in str(info.value)


async def test_max_length_in_a_pipeline():
    pipe = Pipeline(model=ScriptedModel(["x" * 50, "short"]), post=[max_length(10)])
    result = await pipe.run(Turn.start("answer?"))
    assert result.reply is not None
    assert (result.reply.text, result.rejections[0].hook) == ("short", "max_length")


# -- judge ----------------------------------------------------------------------------------

RULE = "Never promise a refund."


async def test_the_judge_accepts_on_pass_and_sees_the_rule_the_question_and_the_reply():
    model = ScriptedModel(["PASS"])
    turn = replied("Refunds are reviewed within 14 days.")
    assert await judge(model, RULE)(turn) == Cont(turn)
    system, user = model.requests[0].messages
    assert RULE in system.text
    assert "Can I get a refund?" in user.text
    assert "Refunds are reviewed within 14 days." in user.text


async def test_the_judge_rejects_on_fail_with_its_reason():
    verdict = await judge(ScriptedModel(["FAIL: it promises a refund"]), RULE)(replied("Yes!"))
    assert verdict == Regenerate("A reviewer rejected the reply: it promises a refund")


async def test_the_feedback_given_replaces_the_judges_reason():
    rail = judge(ScriptedModel(["FAIL: promises"]), RULE, feedback="Do not promise refunds.")
    assert await rail(replied("Yes!")) == Regenerate("Do not promise refunds.")


@pytest.mark.parametrize(
    "answer",
    ["Pass", "**PASS**", "PASS. It is fine.", "I think it passes", "", "FAILED", "PASS\nFAIL"],
)
async def test_an_unreadable_verdict_rejects(answer):
    verdict = await judge(ScriptedModel([answer]), RULE)(replied("Yes!"))
    assert isinstance(verdict, Regenerate)
    assert RULE in verdict.feedback


@settings(max_examples=100)
@given(answer=st.text(max_size=30))
def test_nothing_but_pass_is_ever_accepted(answer):
    verdict = trio.run(judge(ScriptedModel([answer]), RULE), replied("Yes!"))
    assert isinstance(verdict, Cont) == (answer.strip() == "PASS")


async def test_a_judge_model_that_raises_fails_the_hook():
    def down(request):
        raise ConnectionError("judge unreachable")

    with pytest.raises(ConnectionError):
        await judge(FunctionModel(down), RULE)(replied("Yes!"))


async def test_in_a_pipeline_a_failing_judge_stops_the_turn_and_nothing_is_committed():
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["Yes!"]), post=[judge(ScriptedModel([]), RULE)])
    async with pipe.session(log=log, conversation_id="c") as session:
        with pytest.raises(HookFailed) as info:
            await session.send("refund?")
    assert info.value.hook == "judge"
    assert isinstance(info.value.__cause__, ProviderError)
    assert (await log.load("c")).messages == ()


async def test_in_a_pipeline_the_judge_sends_the_model_back():
    judge_model = ScriptedModel(["FAIL: it promises a refund", "PASS"])
    pipe = Pipeline(
        model=ScriptedModel(["Yes, full refund!", "We review every request."]),
        post=[judge(judge_model, RULE)],
    )
    result = await pipe.run(Turn.start("refund?"))
    assert result.reply is not None
    assert result.reply.text == "We review every request."
    assert [(r.hook, r.feedback) for r in result.rejections] == [
        ("judge", "A reviewer rejected the reply: it promises a refund")
    ]


async def test_a_shadow_judge_records_its_verdict_without_enforcing_it():
    pipe = Pipeline(
        model=ScriptedModel(["Yes, full refund!"]),
        post=[hook(judge(ScriptedModel(["FAIL: promises"]), RULE), shadow=True)],
    )
    events, result = await collect(pipe, Turn.start("refund?"))
    assert result.reply is not None
    assert result.reply.text == "Yes, full refund!"
    shadow = [e for e in events if isinstance(e, ev.ShadowVerdict)]
    assert [(e.hook, e.verdict, e.reason) for e in shadow] == [
        ("judge", "regenerate", "A reviewer rejected the reply: promises")
    ]


async def test_a_slow_judge_times_out(autojump_clock):
    async def never(request):
        await anyio.sleep_forever()

    pipe = Pipeline(
        model=ScriptedModel(["Yes!"]), post=[hook(judge(FunctionModel(never), RULE), timeout=5)]
    )
    with pytest.raises(HookTimeout):
        await pipe.run(Turn.start("refund?"))


async def test_a_cancelled_turn_leaves_no_judge_behind(autojump_clock):
    async def never(request):
        await anyio.sleep_forever()

    pipe = Pipeline(model=ScriptedModel(["Yes!"]), post=[judge(FunctionModel(never), RULE)])
    before = live_tasks()
    with anyio.move_on_after(5) as scope:
        await pipe.run(Turn.start("refund?"))
    assert scope.cancelled_caught
    assert live_tasks() == before


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        (("gpt", RULE), {}, "model"),
        ((ScriptedModel, RULE), {}, "model"),
        ((ScriptedModel([]), ""), {}, "instruction"),
        ((ScriptedModel([]), None), {}, "instruction"),
        ((ScriptedModel([]), RULE), {"feedback": ""}, "feedback"),
    ],
)
def test_judge_refuses_bad_options_by_name(args, kwargs, option):
    with pytest.raises(ConfigError, match=f"judge\\({option}="):
        judge(*args, **kwargs)
