"""Tracing: one turn as an OpenTelemetry trace, printed by the SDK's console exporter.

Every turn becomes a ``turn`` span holding a span per hook (a parallel group's members under
the group), a ``chat {model}`` span per model call and an ``execute_tool {name}`` span per tool
call. To send the traces to a collector instead, swap the console exporter for
``OTLPSpanExporter`` (package ``opentelemetry-exporter-otlp``); docs/observability.md shows
how.

Run it: ``python examples/10_tracing.py`` (needs ``pip install 'turnplug[otel]'
opentelemetry-sdk``)
"""

import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter

from pipeline import Pipeline, TurnResult, cont, otel, parallel, tool
from pipeline.testing import ScriptedModel
from turns import Text, ToolCall, Turn


async def search_docs(turn: Turn) -> list[Text]:
    return [Text("Refunds are issued within 14 days.")]


async def load_memory(turn: Turn) -> list[Text]:
    return [Text("The user prefers short answers.")]


def add_today(turn: Turn):  # type: ignore[no-untyped-def]
    return cont(turn.inject("Today is 2026-11-22.").with_request(temperature=0.2))


@tool
def order_status(order: str) -> str:
    """The state of an order."""
    return f"order {order}: refund sent"


def build() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(
            [[ToolCall("call_1", "order_status", {"order": "1182"})], ["Your refund was sent."]]
        ),
        pre=[parallel(search_docs, load_memory, name="retrieval"), add_today],
        tools=[order_status],
    )


async def traced_turn(exporter: SpanExporter) -> TurnResult:
    """Run one turn with every span going to `exporter`."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    try:
        return await build().run(Turn.start("Where is my refund for order 1182?"))
    finally:
        otel.uninstrument()
        provider.shutdown()


async def main() -> None:
    result = await traced_turn(ConsoleSpanExporter())
    assert result.reply is not None
    print(f"reply: {result.reply.text}")


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
