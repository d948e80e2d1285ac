"""The kinds of config entries: what each one builds does what its kind says, in a turn."""

from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from hooks.config import pipeline_from_dict
from hooks.config._models import Shaped
from pipeline import ConfigError, Pipeline, ProviderError, StepLimitExceeded, cont
from pipeline import events as ev
from pipeline.logs import MemoryLog, SQLiteLog
from pipeline.testing import ScriptedModel
from tests.hooks import config_support as support
from tests.hooks.config_support import ref
from tests.providers import server as wire
from turns import Context, Message, ToolCall, Turn

from ..pipeline.support import collect


def _sent_texts(pipe: Any) -> list[list[str]]:
    """The text parts of each message the scripted model was sent on its first call."""
    return [[part.text for part in m.parts] for m in pipe.model.requests[0].messages]


async def test_static_injects_its_text_before_the_user_message() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ok"]},
            "pre": [{"kind": "static", "text": "Answer in English.", "name": "rules"}],
        }
    )
    result = await pipe.run(Turn.start("hallo"))
    assert _sent_texts(pipe) == [["Answer in English.", "hallo"]]
    (injection,) = result.turn.injections
    assert (injection.source, injection.durable, injection.stage) == ("rules", False, "pre")


async def test_a_durable_static_joins_the_log() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ok"]},
            "pre": [{"kind": "static", "text": "[plan] pro", "durable": True}],
        }
    )
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi")
    logged = (await log.load("c")).messages
    assert [[part.text for part in m.parts] for m in logged] == [["[plan] pro", "hi"], ["ok"]]


async def test_parallel_members_inject_in_declaration_order() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ok"]},
            "pre": [
                {
                    "kind": "parallel",
                    "hooks": [
                        {"kind": "static", "text": "first", "name": "a"},
                        {"kind": "python", "ref": ref("member")},
                        {"kind": "static", "text": "third", "name": "c"},
                    ],
                }
            ],
        }
    )
    result = await pipe.run(Turn.start("q"))
    assert [i.source for i in result.turn.injections] == ["a", "member", "c"]
    assert _sent_texts(pipe) == [["first", "from the member", "third", "q"]]


async def test_python_hooks_run_in_pre_and_post() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ok"]},
            "pre": [{"kind": "python", "ref": ref("hook")}],
            "post": [{"kind": "python", "ref": ref("hook"), "name": "after", "durable": True}],
        }
    )
    result = await pipe.run(Turn.start("q"))
    assert [(i.source, i.stage, i.durable) for i in result.turn.injections] == [
        ("hook", "pre", False),
        ("after", "post", True),
    ]


async def test_redact_and_python_transformers_apply_in_order() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": [["card 4111 1111 ", "1111 1111 ok"]]},
            "transformers": [
                {"kind": "redact", "patterns": [r"\d{4}(?: \d{4}){3}"], "replacement": "[CARD]"},
                {"kind": "python", "ref": ref("Upper")},
            ],
        }
    )
    result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    assert result.reply.text == "CARD [CARD] OK"


async def test_scripted_replies_stream_in_their_chunks() -> None:
    pipe = pipeline_from_dict({"model": {"provider": "scripted", "replies": [["a", "b", "c"]]}})
    async with pipe.stream(Turn.start("q")) as events:
        deltas = [event.text async for event in events if isinstance(event, ev.TextDelta)]
    assert deltas == ["a", "b", "c"]


async def test_a_scripted_model_without_replies_answers_every_call() -> None:
    pipe = pipeline_from_dict({"model": {"provider": "scripted"}})
    texts = [(await pipe.run(Turn.start("q"))).reply.text for _ in range(3)]  # type: ignore[union-attr]
    assert len(set(texts)) == 1
    assert texts[0]


async def test_session_hooks_run_when_a_session_opens_and_closes() -> None:
    pipe = pipeline_from_dict(
        {
            "on_session_start": [{"kind": "python", "ref": ref("start"), "name": "opened"}],
            "on_session_end": [{"kind": "python", "ref": ref("end"), "name": "closed"}],
        }
    )
    support.TRACE.clear()
    async with pipe.session(log=MemoryLog(), conversation_id="c-7") as session:
        support.TRACE.append("turn")
        await session.send("hi")
    assert support.TRACE == ["start c-7", "turn", "end c-7 closed"]


async def test_max_regenerations_and_hold_until_accepted_reach_the_pipeline() -> None:
    pipe = pipeline_from_dict(
        {
            "max_regenerations": 0,
            "hold_until_accepted": True,
            "model": {"provider": "scripted", "replies": ["bad"]},
            "post": [{"kind": "python", "ref": "tests.hooks.test_kinds:reject"}],
        }
    )
    async with pipe.stream(Turn.start("q")) as events:
        seen = [type(event).__name__ async for event in events]
    assert events.result.outcome == "exhausted"
    assert "TextDelta" not in seen  # held, then dropped with the rejected attempt


def reject(turn: Turn) -> Any:
    from pipeline import regenerate

    return regenerate("no")


async def test_the_tokenizer_counts_injections() -> None:
    pipe = pipeline_from_dict(
        {
            "tokenizer": ref("count_words"),
            "pre": [{"kind": "static", "text": "three short words", "name": "note"}],
        }
    )
    async with pipe.stream(Turn.start("q")) as events:
        injected = [e for e in [event async for event in events] if isinstance(e, ev.Injected)]
    assert [(e.hook, e.tokens) for e in injected] == [("note", 3)]


# -- real providers, over a loopback socket ---------------------------------------------------


async def test_an_openai_model_sends_its_name_defaults_and_key() -> None:
    async with wire.running(wire.stream(wire.openai_text(["Hi."]))) as server:
        pipe = pipeline_from_dict(
            {
                "model": {
                    "provider": "openai",
                    "name": "local-model",
                    "base_url": f"{server.url}/v1",
                    "api_key_env": "MY_KEY",
                    "max_tokens": 64,
                    "temperature": 0.25,
                }
            },
            environ={"MY_KEY": "sk-local"},
        )
        result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    assert result.reply.text == "Hi."
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-local"
    body = request.body
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("local-model", 64, 0.25)
    assert "sk-local" not in repr(pipe)


async def test_a_turn_that_shapes_its_request_wins_over_the_model_defaults() -> None:
    async with wire.running(wire.stream(wire.openai_text(["Hi."]))) as server:
        pipe = pipeline_from_dict(
            {
                "model": {
                    "provider": "openai",
                    "name": "m",
                    "base_url": f"{server.url}/v1",
                    "api_key_env": "",
                    "temperature": 0.25,
                },
                "pre": [{"kind": "python", "ref": "tests.hooks.test_kinds:cool"}],
            },
            environ={},
        )
        await pipe.run(Turn.start("q"))
    (request,) = server.requests
    assert request.body["temperature"] == 0
    assert "max_tokens" not in request.body
    assert "authorization" not in request.headers  # api_key_env = "": no key sent


def cool(turn: Turn) -> Any:
    return cont(turn.with_request(temperature=0))


def hot_by_extra(turn: Turn) -> Any:
    return cont(turn.with_request(extra={"temperature": 0.9}))


async def test_a_model_with_defaults_is_still_held_and_named_as_its_provider() -> None:
    """Bug: ``temperature`` or ``max_tokens`` in ``[model]`` wrapped the provider in a model
    that had no ``hold()``, so a session (and the CLI, and ``serve``) opened a connection per
    model call instead of keeping one; and events named the model ``Shaped`` with no
    provider."""
    reply = wire.stream(wire.openai_text(["Hi."]))
    server = wire.ProtocolServer([reply] * 3, keep_alive=True)
    async with anyio.create_task_group() as group:
        await server.start(group)
        pipe = pipeline_from_dict(
            {
                "model": {
                    "provider": "openai",
                    "name": "local-model",
                    "base_url": f"{server.url}/v1",
                    "api_key_env": "",
                    "temperature": 0.25,
                }
            },
            environ={},
        )
        async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
            await session.send("one")
            await session.send("two")
            async with session.stream("three") as events:
                called = [e async for e in events if isinstance(e, ev.ModelCalled)]
        group.cancel_scope.cancel()
    assert [request.body["temperature"] for request in server.requests] == [0.25] * 3
    assert server.connections == 1
    assert [(e.model, e.provider) for e in called] == [("local-model", "openai")]


@pytest.mark.parametrize(
    ("pre", "sent"),
    [
        ([], (0.25, 64)),
        ([{"kind": "python", "ref": f"{__name__}:cool"}], (0, 64)),
        ([{"kind": "python", "ref": f"{__name__}:hot_by_extra"}], (0.9, 64)),
    ],
)
async def test_model_called_shows_the_options_sent_with_the_model_defaults(
    pre: list[dict[str, Any]], sent: tuple[float, int]
) -> None:
    """Bug: ``ModelCalled.options`` was the turn's options without the ``[model]`` table's
    defaults, so a configured temperature was sent but never shown: the event said none, and
    the OpenTelemetry chat span had no ``gen_ai.request.temperature``. And (hot_by_extra) it
    showed the configured temperature where the turn's ``extra`` replaced it in the body."""
    async with wire.running(wire.stream(wire.openai_text(["Hi."]))) as server:
        pipe = pipeline_from_dict(
            {
                "model": {
                    "provider": "openai",
                    "name": "m",
                    "base_url": f"{server.url}/v1",
                    "api_key_env": "",
                    "temperature": 0.25,
                    "max_tokens": 64,
                },
                "pre": pre,
            },
            environ={},
        )
        async with pipe.stream(Turn.start("q")) as events:
            called = [e async for e in events if isinstance(e, ev.ModelCalled)]
    (request,) = server.requests
    assert (request.body["temperature"], request.body["max_tokens"]) == sent
    (event,) = called
    assert event.options is not None
    assert (event.options.temperature, event.options.max_tokens) == sent


async def test_a_wrapped_model_with_no_name_of_its_own_is_not_named_by_extras_model() -> None:
    """Bug caught: a config's ``[model]`` wrapper (`Shaped`) around a model with no ``model``
    of its own (a user's) answered its class name as the model's ``model``, so
    ``RequestOptions.extra``'s ``model`` replaced it in ``ModelCalled.model`` (and the chat
    span's name) though nothing sent it; the bare model kept its class name."""
    names = []
    for model in (ScriptedModel(["hi"]), Shaped(ScriptedModel(["hi"]), {"temperature": 0.2})):
        pipe = Pipeline(model=model)
        turn = Turn.start("x").with_request(extra={"model": "gpt-4o"})
        async with pipe.stream(turn) as events:
            (called,) = [e async for e in events if isinstance(e, ev.ModelCalled)]
        names.append(called.model)

    assert names == ["ScriptedModel", "ScriptedModel"]


async def test_a_model_whose_effective_options_raises_fails_as_the_model() -> None:
    """Catches: a model's ``effective_options`` raising out of the turn as itself (a bare
    KeyError) when the turn is watched, where every model failure is a ProviderError."""

    class Picky(ScriptedModel):
        def effective_options(self, options: Any) -> Any:
            raise KeyError("temperature")

    pipe = Pipeline(model=Picky(["never"]))
    with pytest.raises(ProviderError, match="effective_options raised KeyError"):
        await collect(pipe, Turn.start("q"))


async def test_an_openai_base_url_defaults_to_the_environment() -> None:
    async with wire.running(wire.stream(wire.openai_text(["Hi."]))) as server:
        pipe = pipeline_from_dict(
            {"model": {"provider": "openai", "name": "m"}},
            environ={"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": f"{server.url}/v1"},
        )
        await pipe.run(Turn.start("q"))
    assert [r.path for r in server.requests] == ["/v1/chat/completions"]


async def test_an_anthropic_model_sends_its_name_limits_and_key() -> None:
    async with wire.running(wire.stream(wire.anthropic_text(["Hi."]))) as server:
        pipe = pipeline_from_dict(
            {
                "model": {
                    "provider": "anthropic",
                    "name": "claude-test",
                    "base_url": server.url,
                    "max_tokens": 99,
                    "temperature": 0.5,
                }
            },
            environ={"ANTHROPIC_API_KEY": "sk-ant-local"},
        )
        result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    assert result.reply.text == "Hi."
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-local"
    body = request.body
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("claude-test", 99, 0.5)


@pytest.mark.parametrize(
    ("key", "value"),
    [("temperature", 2.5), ("max_tokens", 0), ("timeout", -1), ("name", "")],
)
def test_model_values_are_checked(key: str, value: Any) -> None:
    from pipeline import ConfigError

    model = {"provider": "openai", "name": "m", key: value}
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict({"model": model}, environ={"OPENAI_API_KEY": "k"})
    assert [path for path, _ in caught.value.problems] == [f"model.{key}"]


# -- post: guardrails -------------------------------------------------------------------------


def _post(*entries: Any, replies: list[Any], environ: dict[str, str] | None = None) -> Any:
    return pipeline_from_dict(
        {"model": {"provider": "scripted", "replies": replies}, "post": list(entries)},
        environ=environ,
    )


async def test_a_deny_guardrail_sends_back_a_reply_a_pattern_is_found_in() -> None:
    pipe = _post(
        {"kind": "guardrail", "deny": ["(?i)internal only"], "feedback": "No internals."},
        replies=["This is INTERNAL ONLY: 42.", "It is 42."],
    )
    result = await pipe.run(Turn.start("q"))
    assert [(r.attempt, r.hook, r.feedback) for r in result.rejections] == [
        (1, "deny", "No internals.")
    ]
    assert result.reply is not None
    assert result.reply.text == "It is 42."


async def test_a_check_guardrail_rejects_with_the_feedback_its_check_returns() -> None:
    pipe = _post(
        {"kind": "guardrail", "check": ref("no_maybe"), "name": "plain"},
        replies=["Maybe tomorrow.", "Tomorrow."],
    )
    result = await pipe.run(Turn.start("q"))
    assert [(r.hook, r.feedback, r.text) for r in result.rejections] == [
        ("plain", "Say it plainly.", "Maybe tomorrow.")
    ]
    # The model was sent back with its rejected reply and the feedback.
    assert [m.text for m in pipe.model.requests[1].messages[-2:]] == [
        "Maybe tomorrow.",
        "Say it plainly.",
    ]


async def test_a_shadow_guardrail_records_its_verdict_without_enforcing_it() -> None:
    pipe = _post(
        {"kind": "guardrail", "deny": ["x"], "feedback": "No x.", "shadow": True},
        replies=["x marks the spot"],
    )
    events, result = await collect(pipe, Turn.start("q"))
    assert (result.outcome, result.rejections) == ("completed", ())
    assert [e for e in events if isinstance(e, ev.ShadowVerdict)] == [
        ev.ShadowVerdict(result.turn.turn_ref, "deny", "post", "regenerate", "No x.")
    ]


async def test_max_length_rejects_a_longer_reply_saying_how_long_it_was() -> None:
    pipe = _post({"kind": "max_length", "chars": 10}, replies=["far too long a reply", "short"])
    result = await pipe.run(Turn.start("q"))
    ((rejection),) = result.rejections
    assert rejection.hook == "max_length"
    assert "20 characters" in rejection.feedback
    assert "10" in rejection.feedback
    assert result.reply is not None
    assert result.reply.text == "short"


async def test_a_judge_asks_its_own_model_and_rejects_with_its_reason() -> None:
    pipe = _post(
        {
            "kind": "judge",
            "instruction": "Never name a price.",
            "model": {"provider": "scripted", "replies": ["FAIL: it names a price", "PASS"]},
        },
        replies=["It costs 5 euros.", "Ask the shop."],
    )
    result = await pipe.run(Turn.start("how much?"))
    assert [(r.hook, r.feedback) for r in result.rejections] == [
        ("judge", "A reviewer rejected the reply: it names a price")
    ]
    assert result.reply is not None
    assert result.reply.text == "Ask the shop."


async def test_a_judge_model_is_declared_like_the_model_table() -> None:
    # The same keys as [model]: here an OpenAI-compatible server, over a loopback socket.
    async with wire.running(wire.stream(wire.openai_text(["PASS"]))) as server:
        pipe = _post(
            {
                "kind": "judge",
                "instruction": "Be polite.",
                "model": {
                    "provider": "openai",
                    "name": "judge-model",
                    "base_url": f"{server.url}/v1",
                    "api_key_env": "JUDGE_KEY",
                    "temperature": 0,
                },
            },
            replies=["Hello."],
            environ={"JUDGE_KEY": "sk-judge"},
        )
        result = await pipe.run(Turn.start("hi"))
    assert result.outcome == "completed"
    (request,) = server.requests
    assert (request.body["model"], request.body["temperature"]) == ("judge-model", 0)
    assert request.headers["authorization"] == "Bearer sk-judge"
    assert "Be polite." in request.body["messages"][0]["content"]


# -- the running summary and the compactor of the catalogue -----------------------------------

SUMMARY = "Summary of the conversation so far:\n"


async def _logged(pipe: Pipeline, path: Path, messages: list[str]) -> list[str]:
    """The texts of the log, an SQLite file, after a session sends `messages`."""
    async with SQLiteLog(path) as log, pipe.session(log=log, conversation_id="ada") as session:
        for text in messages:
            await session.send(text)
    async with SQLiteLog(path) as log:
        return [message.text for message in (await log.load("ada")).messages]


async def test_a_running_summary_is_written_into_the_log_after_every_n_turns(
    tmp_path: Path,
) -> None:
    """Bug caught: a config could not declare the catalogue's running summary (no post
    kind built `hooks.running_summary`)."""
    pipe = _post(
        {
            "kind": "running_summary",
            "every": 3,
            "model": {"provider": "scripted", "replies": ["Ada asked about refunds (14 days)."]},
        },
        replies=["Hi Ada.", "14 days.", "You're welcome.", "Bye."],
    )
    texts = await _logged(
        pipe, tmp_path / "chats.db", ["I'm Ada.", "Refunds take 14 days?", "Thanks!", "Bye!"]
    )
    # Written once, after the third turn (before or after the fourth, which does not wait
    # for it); the summarizing model is the entry's own.
    summaries = [text for text in texts if text.startswith(SUMMARY)]
    assert summaries == [SUMMARY + "Ada asked about refunds (14 days)."]
    assert [text for text in texts if text not in summaries] == [
        "I'm Ada.",
        "Hi Ada.",
        "Refunds take 14 days?",
        "14 days.",
        "Thanks!",
        "You're welcome.",
        "Bye!",
        "Bye.",
    ]
    assert texts.index(summaries[0]) > texts.index("You're welcome.")


async def test_a_running_summary_without_a_model_asks_the_turns_model(tmp_path: Path) -> None:
    """Bug caught: a config could not declare a running summary made by the turn's own
    model (the `[model]` table)."""
    pipe = _post(
        {"kind": "running_summary", "every": 2},
        replies=["Hi Ada.", "14 days.", "Ada asked about refunds."],
    )
    texts = await _logged(pipe, tmp_path / "chats.db", ["I'm Ada.", "Refunds?"])
    assert texts == [
        "I'm Ada.",
        "Hi Ada.",
        "Refunds?",
        "14 days.",
        SUMMARY + "Ada asked about refunds.",
    ]


async def test_compact_drop_oldest_drops_the_oldest_turns_the_model_is_sent() -> None:
    """Bug caught: a config could not declare the catalogue's compactor (`compact =
    "hooks:drop_oldest"` names its factory, and no name stood for the compactor)."""
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ok"]},
            "budget": {"context_tokens": 60, "injection_reserve": 20},
            "compact": "drop_oldest",
        }
    )
    history = [Message.system("Be brief.")]
    for n in range(1, 6):
        history += [Message.user(f"question {n}"), Message.assistant(f"answer {n}")]
    await pipe.run(Turn.start("question 6", context=Context(messages=history)))
    assert [m.text for m in pipe.model.requests[0].messages] == [
        "Be brief.",
        "question 4",
        "answer 4",
        "question 5",
        "answer 5",
        "question 6",
    ]


# -- transformers: pii and citations ----------------------------------------------------------


async def test_pii_redacts_the_kinds_it_is_given_even_split_across_chunks() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {
                "provider": "scripted",
                "replies": [["Mail ada@exa", "mple.com or call +44 20 7946 0958."]],
            },
            "transformers": [{"kind": "pii", "kinds": ["email"]}],
        }
    )
    result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    assert result.reply.text == "Mail [EMAIL] or call +44 20 7946 0958."
    assert result.reply.annotations == {"pii": {"redactions": 1}}


async def test_pii_by_default_redacts_every_kind_with_the_replacement_given() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ada@example.com, 4111 1111 1111 1111"]},
            "transformers": [{"kind": "pii", "replacement": "***", "name": "personal"}],
        }
    )
    result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    assert result.reply.text == "***, ***"
    assert result.reply.annotations == {"personal": {"redactions": 2}}


async def test_citations_reports_the_markers_under_its_name() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": [["See [1] and [", "12], then [1]."]]},
            "transformers": [{"kind": "citations"}, {"kind": "citations", "name": "refs"}],
        }
    )
    result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    assert result.reply.text == "See [1] and [12], then [1]."
    assert result.reply.annotations == {"citations": (1, 12, 1), "refs": (1, 12, 1)}


# -- pre: retrieval and synthetic tool calls --------------------------------------------------


async def test_a_retrieve_member_injects_what_its_search_finds_up_to_k() -> None:
    pipe = pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["ok"]},
            "pre": [
                {
                    "kind": "parallel",
                    "hooks": [
                        {"kind": "retrieve", "search": ref("search"), "k": 2},
                        {"kind": "static", "text": "note", "name": "note"},
                    ],
                }
            ],
        }
    )
    result = await pipe.run(Turn.start("refunds"))
    assert [(i.source, i.durable) for i in result.turn.injections] == [
        ("search", False),
        ("note", False),
    ]
    assert _sent_texts(pipe) == [["passage about 'refunds'", "passage 2", "note", "refunds"]]


def _with_tool_call(**entry: Any) -> dict[str, Any]:
    return {
        "model": {"provider": "scripted", "replies": ["one", "two"]},
        "tools": [{"kind": "python", "ref": ref("get_preferences"), "name": "prefs"}],
        "pre": [{"kind": "tool_call", "tool": "prefs", "arguments": {"user": "ada"}, **entry}],
    }


async def test_a_tool_call_injects_the_call_and_result_before_the_user_message() -> None:
    pipe = pipeline_from_dict(_with_tool_call())
    result = await pipe.run(Turn.start("hi"))
    (injection,) = result.turn.injections
    assert (injection.source, injection.durable) == ("inject_prefs", True)
    sent = pipe.model.requests[0].messages
    assert [m.role for m in sent] == ["assistant", "tool", "user"]
    (call,) = sent[0].parts
    (answer,) = sent[1].parts
    assert (call.name, call.arguments) == ("prefs", {"user": "ada"})
    assert answer.content == '{"user": "ada", "language": "en"}'


async def test_a_tool_call_is_durable_unless_told_and_always_injects_by_default() -> None:
    log = MemoryLog()
    pipe = pipeline_from_dict(_with_tool_call(name="prefs_now"))
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi")
        second = await session.send("again")
    assert [i.source for i in second.turn.injections] == ["prefs_now"]
    roles = [m.role for m in (await log.load("c")).messages]
    assert roles == ["assistant", "tool", "user", "assistant"] * 2

    transient = pipeline_from_dict(_with_tool_call(durable=False))
    async with transient.session(log=(other := MemoryLog()), conversation_id="c") as session:
        await session.send("hi")
    assert [m.role for m in (await other.load("c")).messages] == ["user", "assistant"]


@pytest.mark.parametrize(
    "entry",
    [
        {"frequency": "if_changed"},
        {"refresh": {"kind": "ttl", "minutes": 30}},
        {"refresh": {"kind": "ttl", "seconds": 600}},
        {"refresh": {"kind": "ttl", "hours": 0.5}},
    ],
    ids=["if_changed", "minutes", "seconds", "hours"],
)
async def test_a_tool_call_skips_a_second_injection_it_does_not_need(
    entry: dict[str, Any],
) -> None:
    # The preferences have not changed, and the last pair is seconds old.
    pipe = pipeline_from_dict(_with_tool_call(**entry))
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        first = await session.send("hi")
        second = await session.send("again")
    assert [i.source for i in first.turn.injections] == ["inject_prefs"]
    assert second.turn.injections == ()


@pytest.mark.parametrize(
    "entry",
    [{"frequency": "if_changed"}, {"refresh": {"kind": "ttl", "minutes": 30}}],
    ids=["if_changed", "refresh"],
)
def test_a_transient_tool_call_that_should_skip_is_refused_at_durable(
    entry: dict[str, Any],
) -> None:
    """A transient pair never joins the log, so `if_changed` and `refresh` never found it and
    the entry ran the tool and injected every turn, silently."""
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict(_with_tool_call(durable=False, **entry))
    [(path, message)] = caught.value.problems
    assert path == "pre[0].durable"
    assert "durable = false" in message


def _failing_tool_call(function: str, **entry: Any) -> Any:
    return pipeline_from_dict(
        {
            "model": {"provider": "scripted", "replies": ["answered anyway"]},
            "tools": [{"kind": "python", "ref": ref(function), "name": "prefs"}],
            "pre": [{"kind": "tool_call", "tool": "prefs", "arguments": {"user": "ada"}, **entry}],
        }
    )


async def test_a_tool_call_whose_tool_fails_injects_nothing_and_the_turn_goes_on() -> None:
    events, result = await collect(_failing_tool_call("failing_lookup"), Turn.start("hi"))
    assert (result.outcome, result.turn.injections) == ("completed", ())
    failed = [e for e in events if isinstance(e, ev.HookFailed)]
    assert [(e.hook, e.enforced) for e in failed] == [("inject_prefs", False)]
    assert "the preferences service is down" in failed[0].error


async def test_a_tool_call_told_to_halt_on_error_fails_the_turn() -> None:
    from pipeline import HookFailed

    with pytest.raises(HookFailed, match="inject_prefs"):
        await _failing_tool_call("failing_lookup", on_error="halt").run(Turn.start("hi"))


async def test_a_tool_call_timeout_bounds_a_tool_that_never_answers(autojump_clock: Any) -> None:
    pipe = _failing_tool_call("hanging_lookup", timeout=2)
    start = anyio.current_time()
    events, result = await collect(pipe, Turn.start("hi"))
    assert anyio.current_time() - start == pytest.approx(2)
    assert (result.outcome, result.turn.injections) == ("completed", ())
    assert [e.error.split(":")[0] for e in events if isinstance(e, ev.HookFailed)] == [
        "HookTimeout"
    ]


async def test_a_turn_cancelled_while_its_tool_call_runs_commits_nothing(
    autojump_clock: Any,
) -> None:
    log = MemoryLog()
    pipe = _failing_tool_call("hanging_lookup")
    async with pipe.session(log=log, conversation_id="c") as session:
        with anyio.move_on_after(5) as scope:
            await session.send("hi")
    assert scope.cancelled_caught
    assert (await log.load("c")).messages == ()


async def test_a_guardrail_whose_check_raises_fails_the_turn_unless_told_to_skip() -> None:
    from pipeline import HookFailed

    rail = {"kind": "guardrail", "check": ref("broken_check")}
    with pytest.raises(HookFailed, match="the classifier is not loaded"):
        await _post(rail, replies=["hello"]).run(Turn.start("q"))
    skipping = _post(rail | {"on_error": "skip"}, replies=["hello"])
    result = await skipping.run(Turn.start("q"))
    assert result.outcome == "completed"


def test_a_refresh_in_minutes_or_hours_is_a_ttl_in_seconds() -> None:
    for unit, amount in (("seconds", 90), ("minutes", 1.5), ("hours", 0.025)):
        pipe = pipeline_from_dict(_with_tool_call(refresh={"kind": "ttl", unit: amount}))
        assert pipe.pre[0].fn.ttl == 90


# -- tools and tool hooks ---------------------------------------------------------------------


def _tools_config(**more: Any) -> dict[str, Any]:
    return {
        "tools": [
            {"kind": "python", "ref": ref("get_preferences")},
            {"kind": "python", "ref": ref("lookup_order"), "name": "order_status"},
            {"kind": "python", "ref": ref("lookup_order"), "name": "refund_order"},
        ],
        **more,
    }


def _calling(pipe: Any, *calls: ToolCall, answer: str = "done") -> Any:
    """`pipe` with a model that asks for `calls` at once, then answers."""
    return attrs.evolve(pipe, model=ScriptedModel([list(calls), answer]))


def test_tools_are_described_to_the_model_from_their_signatures() -> None:
    pipe = pipeline_from_dict(
        _tools_config()
        | {"tools": [{"kind": "python", "ref": ref("get_preferences"), "description": "Prefs."}]}
    )
    (spec,) = [t.spec for t in pipe.tools]
    assert (spec.name, spec.description) == ("get_preferences", "Prefs.")
    assert spec.parameters["required"] == ["user"]
    assert spec.parameters["properties"]["detail"] == {
        "type": "boolean",
        "description": "Whether to add more.",
        "default": False,
    }


def test_a_ref_to_a_tool_is_used_as_it_is_or_renamed() -> None:
    pipe = pipeline_from_dict({"tools": [{"kind": "python", "ref": ref("days")}]})
    assert pipe.tools == (support.days,)
    renamed = pipeline_from_dict(
        {"tools": [{"kind": "python", "ref": ref("days"), "name": "ship_days"}]}
    )
    (made,) = renamed.tools
    assert (made.name, made.description, made.fn) == (
        "ship_days",
        "Days until an order ships.",
        support.days.fn,
    )


async def test_the_model_calls_a_declared_tool_and_reads_its_result() -> None:
    pipe = _calling(
        pipeline_from_dict(_tools_config()), ToolCall("c1", "order_status", {"order": "A7"})
    )
    result = await pipe.run(Turn.start("where is A7?"))
    assert result.reply is not None
    assert [m.role for m in result.reply.messages] == ["assistant", "tool", "assistant"]
    assert result.reply.messages[1].parts[0].content == (
        "order A7: shipped, sent to help@example.com"
    )
    assert [t.name for t in pipe.model.requests[0].tools] == [
        "get_preferences",
        "order_status",
        "refund_order",
    ]


async def test_tool_hooks_run_for_the_tools_their_match_names() -> None:
    pipe = _calling(
        pipeline_from_dict(
            _tools_config(
                before_tool=[
                    {"kind": "python", "ref": ref("no_refunds"), "match": {"regex": "refund_.*"}}
                ],
                after_tool=[{"kind": "python", "ref": ref("shout"), "match": "order_status"}],
            )
        ),
        ToolCall("c1", "order_status", {"order": "A7"}),
        ToolCall("c2", "refund_order", {"order": "A7"}),
        ToolCall("c3", "get_preferences", {"user": "ada"}),
    )
    async with pipe.stream(Turn.start("refund A7")) as events:
        blocked = [(e.hook, e.call.id) async for e in events if isinstance(e, ev.ToolBlocked)]
    results = [m.parts[0] for m in events.result.reply.messages if m.role == "tool"]
    assert [(r.call_id, r.content, r.error_class) for r in results] == [
        ("c1", "ORDER A7: SHIPPED, SENT TO HELP@EXAMPLE.COM", None),
        ("c2", "refund_order is not allowed here", "hook_blocked"),
        ("c3", '{"user": "ada", "language": "en"}', None),
    ]
    assert blocked == [("no_refunds", "c2")]


async def test_a_tool_hook_regex_must_match_the_whole_name() -> None:
    # "order" is found inside "order_status" and "refund_order", but matches neither whole.
    pipe = _calling(
        pipeline_from_dict(
            _tools_config(
                before_tool=[
                    {"kind": "python", "ref": ref("no_refunds"), "match": {"regex": "order"}}
                ]
            )
        ),
        ToolCall("c1", "order_status", {"order": "A7"}),
    )
    result = await pipe.run(Turn.start("where is A7?"))
    assert result.reply is not None
    assert result.reply.messages[1].parts[0].error_class is None


async def test_a_tool_hook_without_match_runs_for_every_tool() -> None:
    pipe = _calling(
        pipeline_from_dict(_tools_config(after_tool=[{"kind": "python", "ref": ref("shout")}])),
        ToolCall("c1", "order_status", {"order": "b1"}),
        ToolCall("c2", "get_preferences", {"user": "ada"}),
    )
    result = await pipe.run(Turn.start("q"))
    assert result.reply is not None
    contents = [m.parts[0].content for m in result.reply.messages if m.role == "tool"]
    assert contents == [
        "ORDER B1: SHIPPED, SENT TO HELP@EXAMPLE.COM",
        '{"USER": "ADA", "LANGUAGE": "EN"}',
    ]


async def test_max_steps_bounds_the_model_calls_of_an_attempt() -> None:
    call = ToolCall("c1", "order_status", {"order": "A7"})
    pipe = attrs.evolve(
        pipeline_from_dict(_tools_config(max_steps=2)),
        model=ScriptedModel([[call], [call], "never reached"]),
    )
    with pytest.raises(StepLimitExceeded):
        await pipe.run(Turn.start("q"))
    assert len(pipe.model.requests) == 2


async def test_tool_concurrency_bounds_the_calls_running_at_once(autojump_clock: Any) -> None:
    pipe = pipeline_from_dict(
        {
            "tools": [{"kind": "python", "ref": ref("Gauge.measure")}],
            "tool_concurrency": 2,
        }
    )
    calls = [ToolCall(f"c{n}", "measure", {"n": n}) for n in range(5)]
    support.Gauge.reset()
    result = await _calling(pipe, *calls).run(Turn.start("q"))
    assert result.outcome == "completed"
    assert support.Gauge.most == 2
