"""The kinds of config entries: what each one builds does what its kind says, in a turn."""

from typing import Any

import pytest

from hooks.config import pipeline_from_dict
from pipeline import cont
from pipeline import events as ev
from pipeline.logs import MemoryLog
from tests.hooks import config_support as support
from tests.hooks.config_support import ref
from tests.providers import server as wire
from turns import Turn


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
                    "temperature": 1.5,
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
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("claude-test", 99, 1.5)


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
