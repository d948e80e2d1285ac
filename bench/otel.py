"""Tracing: the reference turn uninstrumented, with a no-op tracer, and with the SDK.

The same turn as `turn` (10 pre hooks, a guardrail, 10 post hooks, 200 chunks). Three ways,
interleaved: not instrumented; instrumented through `pipeline.otel` with the API's no-op
tracer provider (a turn must cost at most 1.3x the uninstrumented one); instrumented with the
SDK's tracer provider exporting to memory through a simple span processor, reported as the
cost per span (the SDK turn minus the uninstrumented one, over the spans of a turn).
"""

import statistics

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider

from pipeline import otel
from pipeline._observe import _tracing, set_tracing

from ._harness import Row, measure, per_rep, spread
from ._reference import reference

TARGET = 1.3


def _factory(provider: object) -> object:
    """The per-turn tracer factory `instrument` installs for `provider`, to switch quickly."""
    otel.instrument(tracer_provider=provider)  # type: ignore[arg-type]
    factory = _tracing[0]
    otel.uninstrument()
    return factory


async def run(quick: bool) -> list[Row]:
    repeats, inner = (3, 5) if quick else (31, 100)
    ref = reference()
    pipe, turn = ref.pipe, ref.turn
    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    noop_factory, sdk_factory = _factory(NoOpTracerProvider()), _factory(sdk)

    set_tracing(sdk_factory)  # type: ignore[arg-type]
    await pipe.run(turn)
    spans = len(exporter.get_finished_spans())
    exporter.clear()

    async def off() -> None:
        set_tracing(None)
        await pipe.run(turn)

    async def noop() -> None:
        set_tracing(noop_factory)  # type: ignore[arg-type]
        await pipe.run(turn)

    async def traced() -> None:
        set_tracing(sdk_factory)  # type: ignore[arg-type]
        await pipe.run(turn)
        exporter.clear()

    try:
        samples = await measure(
            {"off": off, "noop": noop, "sdk": traced}, repeats=repeats, inner=inner
        )
    finally:
        set_tracing(None)
        sdk.shutdown()
    noop_ratios = per_rep(lambda n, o: n / o, samples["noop"], samples["off"])
    per_span = per_rep(lambda s, o: (s - o) / spans, samples["sdk"], samples["off"])
    ratio = statistics.median(noop_ratios)
    return [
        Row("Pipeline.run, not instrumented", samples["off"].median, samples["off"].spread),
        Row(
            "Pipeline.run, instrumented, no-op tracer provider",
            samples["noop"].median,
            samples["noop"].spread,
            samples["off"].median,
            ratio,
            target=f"<= {TARGET:g}x",
            met=ratio <= TARGET,
        ),
        Row(
            "Pipeline.run, instrumented, SDK + in-memory exporter",
            samples["sdk"].median,
            samples["sdk"].spread,
            samples["off"].median,
            statistics.median(per_rep(lambda s, o: s / o, samples["sdk"], samples["off"])),
            note=f"{spans} spans per turn",
        ),
        Row(
            "SDK: cost per span (traced minus not instrumented, / spans)",
            statistics.median(per_span),
            spread(per_span),
            note="simple span processor, in-memory exporter",
        ),
    ]
