"""What the providers tell the logs and the traces: retries at WARNING, and never a key."""

import logging
import re
import socket
import traceback
from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline import (
    Pipeline,
    ProviderConnectionError,
    ProviderProtocolError,
    cont,
    otel,
    per_chunk,
    tool,
)
from pipeline import events as ev
from pipeline.providers import AnthropicMessages, OpenAIChat
from turns import Turn

from . import server as wire
from .server import ProtocolServer
from .support import KEY

RATE_LIMITED = {"error": {"message": "Rate limit reached", "type": "requests"}}


def openai(server: ProtocolServer) -> OpenAIChat:
    return OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY)


def anthropic(server: ProtocolServer) -> AnthropicMessages:
    return AnthropicMessages("claude-test", base_url=server.url, api_key=KEY)


async def test_a_retry_is_a_warning_with_status_attempt_and_delay_and_no_key(
    server: ProtocolServer, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: retries invisible to an operator, or a key written to the log."""
    server.script(
        wire.json_error(429, RATE_LIMITED, [("retry-after", "3")]),
        wire.stream(wire.openai_text(["ok"])),
    )
    with caplog.at_level(logging.WARNING, logger="turnplug"):
        result = await Pipeline(model=openai(server)).run(Turn.start("hi"))

    assert result.reply is not None
    assert result.reply.text == "ok"
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("turnplug.providers", "WARNING", "openai: request 1 answered 429; retrying in 3.00 s")
    ]
    assert KEY not in caplog.text


async def test_a_retried_connection_failure_is_a_warning_with_its_delay(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: the retry of a request that reached no server logged without the delay
    before the next attempt, which the retry of an error status logs (docs/observability.md:
    "provider, attempt, status (or the connection error) and delay")."""
    with socket.socket() as probe:  # a loopback port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChat("gpt-test", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    with (
        caplog.at_level(logging.WARNING, logger="turnplug"),
        pytest.raises(ProviderConnectionError),
    ):
        await Pipeline(model=model).run(Turn.start("hi"))

    [record] = caplog.records
    assert (record.name, record.levelname) == ("turnplug.providers", "WARNING")
    # The first backoff: 0.5 s times a jitter factor in (0.75, 1].
    assert re.fullmatch(
        r"openai: request 1 failed \(.+\); retrying in 0\.(3[89]|4\d|50) s", record.getMessage()
    )


async def test_a_traced_provider_turn_names_the_provider_and_never_the_key(
    server: ProtocolServer, capturing: InMemorySpanExporter
) -> None:
    """Catches: the API key reaching a span, even with content capture on."""
    server.script(wire.stream(wire.openai_text(["Hello", " there"], usage=(9, 3))))
    await Pipeline(model=openai(server)).run(Turn.start("hi"))

    spans = capturing.get_finished_spans()
    (chat,) = [span for span in spans if span.name == "chat gpt-test"]
    assert (
        chat.attributes["gen_ai.provider.name"],
        chat.attributes["gen_ai.usage.input_tokens"],
        chat.attributes["gen_ai.usage.output_tokens"],
    ) == ("openai", 9, 3)
    for span in spans:
        assert KEY not in repr(dict(span.attributes)) + repr(span.events) + span.name


async def test_a_malformed_answer_quoting_the_key_stays_out_of_logs_and_tracebacks(
    server: ProtocolServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: the httpx error for an answer httpx cannot parse (an illegal header line that
    quotes the key) logged unscrubbed by the retry, and kept unscrubbed in the final error's
    chain, which every formatted traceback prints."""
    illegal = wire.Reply(401, ((f"Invalid key {KEY}", "x"),), framing="length")
    server.script(illegal, illegal)
    model = OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY, max_retries=1)
    with (
        caplog.at_level(logging.WARNING, logger="turnplug"),
        pytest.raises(ProviderConnectionError) as caught,
    ):
        await Pipeline(model=model).run(Turn.start("hi"))

    assert len(server.requests) == 2
    assert "request 1 failed" in caplog.text
    assert KEY not in caplog.text
    assert KEY not in "".join(traceback.format_exception(caught.value))
    assert "[redacted]" in caplog.text


async def test_a_malformed_streams_error_reaches_a_captured_trace_by_its_type_only(
    server: ProtocolServer, capturing: InMemorySpanExporter
) -> None:
    """Bug caught: with content capture on, a protocol error's message, which quotes the raw
    stream event (model text no transformer had seen), was recorded on the turn and chat
    spans, where a transformer had kept that text out of everything else."""
    broken = b'data: {"choices": [{"index": 0, "delta": {"content": "SECRET-42 and'
    server.script(wire.stream((*wire.openai_text(["SECRET-41 "])[:2], broken + b"\n\n")))
    hide = per_chunk(lambda text: re.sub(r"SECRET-\d+", "[gone]", text))
    with pytest.raises(ProviderProtocolError, match="SECRET-42"):
        await Pipeline(model=openai(server), transformers=[hide]).run(Turn.start("hi"))

    spans = capturing.get_finished_spans()
    failed = [span for span in spans if span.attributes.get("error.type")]
    assert sorted(span.name for span in failed) == ["chat gpt-test", "turn"]
    for span in failed:
        assert span.status.description == "ProviderProtocolError"
        (event,) = [event for event in span.events if event.name == "exception"]
        assert dict(event.attributes) == {"exception.type": "ProviderProtocolError"}
    for span in spans:
        assert "SECRET" not in repr(dict(span.attributes)) + repr(span.events) + repr(span.status)


@tool
def stat_path(path: str) -> str:
    """Describe a path.

    Args:
        path: The path.
    """
    return path


@pytest.mark.parametrize(
    ("provider", "forced"),
    [
        (openai, {"type": "function", "function": {"name": "stat_path"}}),
        (anthropic, {"type": "tool", "name": "stat_path", "disable_parallel_tool_use": True}),
    ],
)
async def test_model_called_and_the_chat_span_report_what_extra_sent(
    server: ProtocolServer, provider: Any, forced: dict[str, Any]
) -> None:
    """Bug caught: ModelCalled ("the request options of this call, as sent") and the chat
    span reported the options' temperature, max_tokens and tool_choice and the provider's
    model while RequestOptions.extra replaced each of them in the body sent, so a trace
    showed a request that was never made."""
    reply = wire.openai_text(["ok"]) if provider is openai else wire.anthropic_text(["ok"])
    server.script(wire.stream(reply))
    extra = {"model": "picked", "temperature": 0.9, "max_tokens": 77, "tool_choice": forced}

    def shape(turn: Turn) -> Any:
        changes = {"temperature": 0.2, "max_tokens": 500, "tool_choice": "auto"}
        return cont(turn.with_request(**changes, extra=extra))

    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    pipe = Pipeline(model=provider(server), tools=[stat_path], pre=[shape])
    seen = []
    otel.instrument(tracer_provider=tracer)
    try:
        async with pipe.stream(Turn.start("hi")) as events:
            async for event in events:
                if isinstance(event, ev.ModelCalled):
                    assert event.options is not None
                    options = event.options
                    seen.append(
                        (event.model, options.temperature, options.max_tokens, options.tool_choice)
                    )
    finally:
        otel.uninstrument()

    body = server.requests[0].body
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("picked", 0.9, 77)
    assert seen == [("picked", 0.9, 77, "stat_path")]
    (chat,) = [span for span in exporter.get_finished_spans() if span.name.startswith("chat")]
    assert {key: chat.attributes[key] for key in SENT_ATTRIBUTES} == {
        "gen_ai.request.model": "picked",
        "gen_ai.request.temperature": 0.9,
        "gen_ai.request.max_tokens": 77,
        "turnplug.request.tool_choice": "stat_path",
    }


SENT_ATTRIBUTES = (
    "gen_ai.request.model",
    "gen_ai.request.temperature",
    "gen_ai.request.max_tokens",
    "turnplug.request.tool_choice",
)
