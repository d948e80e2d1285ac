"""Stage 8, the commit rules: what `TurnResult.log_messages` hands the log."""

import pytest

from hooks import redact
from pipeline import INJECTED_BY, Pipeline, cont, halt, hook, parallel, per_chunk, regenerate
from pipeline.testing import ScriptedModel
from turns import Context, Message, Text, ToolCall, ToolResult, Turn

# -- helpers --------------------------------------------------------------------------------


def by(name: str) -> dict[str, str]:
    return {INJECTED_BY: name}


def note(name: str, *parts, durable: bool = False, **options):
    """An ordered hook (pre or post) that injects `parts`."""

    async def inject(turn: Turn):
        return cont(turn.inject(*parts))

    return hook(inject, name=name, durable=durable, **options)


def member(name: str, *texts: str, durable: bool = False):
    """A parallel-group member that contributes `texts`."""

    async def contribute(turn: Turn):
        return [Text(text) for text in texts]

    return hook(contribute, name=name, durable=durable)


def reject_first(feedback: str = "too rude, try again"):
    """A guardrail that rejects attempt 1 and accepts the rest."""

    async def guard(turn: Turn):
        if turn.reply.attempt == 1:
            return regenerate(feedback)
        return cont(turn)

    return hook(guard, name="guard")


async def log_of(pipe: Pipeline, message: str | Message = "hi") -> tuple[Message, ...]:
    result = await pipe.run(Turn.start(message))
    return result.log_messages


def all_text(messages: tuple[Message, ...]) -> str:
    parts = [p for m in messages for p in m.parts]
    return " | ".join(getattr(p, "text", getattr(p, "content", "")) for p in parts)


# -- the order ------------------------------------------------------------------------------


async def test_a_plain_turn_commits_the_user_message_then_the_reply():
    assert await log_of(Pipeline(model=ScriptedModel(["Hello!"]))) == (
        Message.user("hi"),
        Message.assistant("Hello!"),
    )


async def test_commit_order_leaves_out_transient_injections_rejected_attempts_and_feedback():
    pipe = Pipeline(
        model=ScriptedModel(["you fool", "Happy to help."]),
        pre=[
            note("memory", "likes tea", durable=True),
            parallel(member("retrieval", "doc: tea facts")),
            note("date", "today is Monday"),
        ],
        post=[
            reject_first("too rude, try again"),
            note("summary", "asked about tea", durable=True),
        ],
    )

    assert await log_of(pipe) == (
        Message("user", (Text("likes tea", meta=by("memory")), Text("hi"))),
        Message.assistant("Happy to help."),
        Message("user", (Text("asked about tea", meta=by("summary")),)),
    )


async def test_regeneration_feedback_and_rejected_text_never_reach_the_log():
    pipe = Pipeline(
        model=ScriptedModel(["you fool", "second try", "Happy to help."]),
        post=[
            hook(
                lambda turn: (
                    regenerate(f"rejected attempt {turn.reply.attempt}")
                    if turn.reply.attempt < 3
                    else cont(turn)
                ),
                name="guard",
            )
        ],
    )

    messages = await log_of(pipe)

    assert messages == (Message.user("hi"), Message.assistant("Happy to help."))
    assert not any("feedback_for_attempt" in m.meta for m in messages)


async def test_durable_text_injections_head_the_user_message_in_injection_order():
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[
            note("first", "one", durable=True),
            note("noise", "transient"),
            parallel(member("second", "two", "three", durable=True), member("skip", "x")),
            note("third", "four", durable=True),
        ],
    )

    messages = await log_of(pipe)

    assert messages[0] == Message(
        "user",
        (
            Text("one", meta=by("first")),
            Text("two", meta=by("second")),
            Text("three", meta=by("second")),
            Text("four", meta=by("third")),
            Text("hi"),
        ),
    )


async def test_the_user_message_keeps_its_own_meta_when_injections_head_it():
    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[note("memory", "likes tea", durable=True)])

    messages = await log_of(pipe, Message.user("hi", meta={"client": "web"}))

    assert messages[0] == Message(
        "user", (Text("likes tea", meta=by("memory")), Text("hi")), {"client": "web"}
    )


async def test_injected_by_is_added_beside_the_parts_own_meta():
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[note("memory", Text("likes tea", meta={"score": 0.9}), durable=True)],
    )

    messages = await log_of(pipe)

    assert messages[0].parts[0] == Text("likes tea", meta={"score": 0.9, INJECTED_BY: "memory"})


async def test_provenance_in_injected_by_is_the_stamping_hook_not_a_forged_meta():
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[note("memory", Text("likes tea", meta={INJECTED_BY: "someone else"}), durable=True)],
    )

    messages = await log_of(pipe)

    assert messages[0].parts[0].meta[INJECTED_BY] == "memory"


async def test_a_durable_tool_pair_becomes_an_assistant_and_a_tool_message_before_the_user():
    call = ToolCall("call_1", "get_preferences", {"user": "me"})
    result = ToolResult("call_1", "tea, no sugar")
    pipe = Pipeline(
        model=ScriptedModel(["Tea it is."]),
        pre=[note("prefs", call, result, durable=True), note("memory", "likes tea", durable=True)],
    )

    assert await log_of(pipe) == (
        Message("assistant", (ToolCall("call_1", "get_preferences", {"user": "me"}, by("prefs")),)),
        Message("tool", (ToolResult("call_1", "tea, no sugar", meta=by("prefs")),)),
        Message("user", (Text("likes tea", meta=by("memory")), Text("hi"))),
        Message.assistant("Tea it is."),
    )


async def test_a_turn_continuing_from_tool_results_commits_them_in_place_of_a_user_message():
    """Catches: a continuation committing its results after the durable injections (a log
    whose tool message no longer follows its call), or not at all."""
    asked = Message.assistant((ToolCall("c1", "weather", {}),))
    results = Message("tool", (ToolResult("c1", "sunny"),))
    pipe = Pipeline(
        model=ScriptedModel(["Sunny."]),
        pre=[
            note("memory", "likes sun", durable=True),
            note("scratch", "transient"),
        ],
    )
    turn = Turn.start(results, context=Context(messages=(Message.user("q"), asked)))

    assert (await pipe.run(turn)).log_messages == (
        results,
        Message("user", (Text("likes sun", meta=by("memory")),)),
        Message.assistant("Sunny."),
    )


async def test_a_transient_tool_pair_is_not_committed():
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[note("prefs", ToolCall("c1", "lookup", {"q": "tea"}), ToolResult("c1", "found"))],
    )

    assert await log_of(pipe) == (Message.user("hi"), Message.assistant("ok"))


async def test_a_durable_tool_call_without_arguments_is_committed():
    # ToolCall's arguments default to an empty mapping: a call that takes none.
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[note("clock", ToolCall("c1", "now"), ToolResult("c1", "12:00"), durable=True)],
    )

    assert await log_of(pipe) == (
        Message("assistant", (ToolCall("c1", "now", meta=by("clock")),)),
        Message("tool", (ToolResult("c1", "12:00", meta=by("clock")),)),
        Message.user("hi"),
        Message.assistant("ok"),
    )


async def test_durable_post_injections_follow_the_reply_as_one_user_message():
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[
            note("summary", "user said hi", durable=True),
            note("scratch", "not kept"),
            note("mood", "friendly", durable=True),
        ],
    )

    assert await log_of(pipe) == (
        Message.user("hi"),
        Message.assistant("ok"),
        Message(
            "user", (Text("user said hi", meta=by("summary")), Text("friendly", meta=by("mood")))
        ),
    )


async def test_a_durable_post_injection_from_a_rejected_attempt_is_not_committed():
    async def tag(turn: Turn):
        return cont(turn.inject(f"seen attempt {turn.reply.attempt}"))

    pipe = Pipeline(
        model=ScriptedModel(["bad", "good"]),
        post=[hook(tag, name="tag", durable=True), reject_first()],
    )

    assert await log_of(pipe) == (
        Message.user("hi"),
        Message.assistant("good"),
        Message("user", (Text("seen attempt 2", meta=by("tag")),)),
    )


# -- what is never committed ----------------------------------------------------------------


async def test_a_turn_halted_before_the_model_has_no_log_messages():
    pipe = Pipeline(
        model=ScriptedModel(["never"]),
        pre=[note("memory", "likes tea", durable=True), hook(lambda t: halt("off topic"))],
    )

    assert await log_of(pipe) == ()


async def test_a_turn_halted_by_a_post_hook_with_a_substitute_reply_has_no_log_messages():
    pipe = Pipeline(
        model=ScriptedModel(["something bad"]),
        post=[hook(lambda t: halt("unsafe", reply="I cannot help with that."), name="policy")],
    )

    result = await pipe.run(Turn.start("hi"))

    assert (result.outcome, result.reply.text) == ("halted", "I cannot help with that.")
    assert result.log_messages == ()


async def test_an_exhausted_turn_has_no_log_messages():
    pipe = Pipeline(
        model=ScriptedModel(["no", "no", "no"]),
        pre=[note("memory", "likes tea", durable=True)],
        post=[hook(lambda t: regenerate("still no"), name="guard")],
        max_regenerations=2,
    )

    result = await pipe.run(Turn.start("hi"))

    assert result.outcome == "exhausted"
    assert result.log_messages == ()


@pytest.mark.parametrize("stage", ["pre", "post"])
async def test_a_shadow_hooks_durable_injection_is_never_committed(stage):
    shadow = note("candidate", "shadow text", durable=True, shadow=True)
    pipe = Pipeline(model=ScriptedModel(["ok"]), **{stage: [shadow]})

    assert await log_of(pipe) == (Message.user("hi"), Message.assistant("ok"))


# -- the transformed text -------------------------------------------------------------------


async def test_the_log_receives_the_redacted_text_not_the_raw_model_text():
    pipe = Pipeline(
        model=ScriptedModel([["my pin is 12", "34, keep it"]]),
        transformers=[redact([r"\d{4}"])],
    )

    assert await log_of(pipe) == (
        Message.user("hi"),
        Message.assistant("my pin is [REDACTED], keep it"),
    )


async def test_the_log_receives_every_transformers_output_in_order():
    pipe = Pipeline(
        model=ScriptedModel([["secret ", "plan"]]),
        transformers=[
            per_chunk(lambda text: text.replace("secret", "public"), name="declassify"),
            per_chunk(str.upper, name="shout"),
        ],
    )

    messages = await log_of(pipe)

    assert messages[1] == Message.assistant("PUBLIC PLAN")
    assert "secret" not in all_text(messages)
