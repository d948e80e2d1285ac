"""What the providers tell the logs and the traces: retries at WARNING, and never a key."""

import logging
import re
import socket
import traceback

import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline import Pipeline, ProviderConnectionError, otel
from pipeline.providers import OpenAIChat
from turns import Turn

from . import server as wire
from .server import ProtocolServer
from .support import KEY

RATE_LIMITED = {"error": {"message": "Rate limit reached", "type": "requests"}}


def openai(server: ProtocolServer) -> OpenAIChat:
    return OpenAIChat("gpt-test", base_url=f"{server.url}/v1", api_key=KEY)


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
    server: ProtocolServer,
) -> None:
    """Catches: the API key reaching a span, even with content capture on."""
    server.script(wire.stream(wire.openai_text(["Hello", " there"], usage=(9, 3))))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider, capture_content=True)
    try:
        await Pipeline(model=openai(server)).run(Turn.start("hi"))
    finally:
        otel.uninstrument()

    spans = exporter.get_finished_spans()
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
