"""pipeline.otel: each turn is one trace, checked with the real OpenTelemetry SDK."""

import contextlib
import itertools
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator

import anyio
import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, StatusCode

from hooks import redact
from pipeline import (
    ConfigError,
    HookFailed,
    Pipeline,
    ToolsetError,
    block,
    chain,
    cont,
    halt,
    hook,
    mcp_toolset,
    otel,
    parallel,
    regenerate,
    tool,
)
from pipeline.logs import MemoryLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Message, Text, ToolCall, Turn

SECRET_REPLY = "the launch code is 7Hx9-Qw2Z-Lp4K, keep it"


def tree(spans: tuple[ReadableSpan, ...]) -> list[object]:
    """The spans as nested [name, [children]], children in start order (a parallel group's
    members, which start together, by name)."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        by_parent.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def children(span: ReadableSpan | None) -> list[object]:
        kids = by_parent.get(span.context.span_id if span else None, [])
        if span is not None and span.attributes.get("turnplug.hook.kind") == "parallel":
            kids = sorted(kids, key=lambda s: s.name)
        else:
            kids = sorted(kids, key=lambda s: (s.start_time, s.name))
        return [[kid.name, children(kid)] if children(kid) else kid.name for kid in kids]

    return children(None)


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def everything(spans: tuple[ReadableSpan, ...]) -> str:
    """Every name, attribute value and event attribute of `spans`, as one text."""
    out = []
    for span in spans:
        out.append(span.name)
        out.append(span.status.description or "")
        out.extend(f"{key}={value}" for key, value in span.attributes.items())
        for event in span.events:
            out.append(event.name)
            out.extend(f"{key}={value}" for key, value in (event.attributes or {}).items())
    return "\n".join(out)


@tool
def lookup(order: str) -> str:
    """An order's state."""
    return f"order {order} shipped"


def refuse_deletes(call, turn):
    return block("deletes need a human") if call.arguments.get("order") == "delete" else cont(call)


async def note(turn):
    return cont(turn.inject("a note").with_request(temperature=0.2, max_tokens=64))


async def docs(turn):
    return [Text("doc")]


async def memory(turn):
    return [Text("memory")]


async def first(turn):
    return cont(turn)


async def second(turn):
    return cont(turn)


def broken(turn):
    raise ValueError("boom")


def stop(turn):
    return halt("not today")


async def slow_member(turn):
    return [Text("x")]


def strict(turn):
    return regenerate("be brief") if turn.reply.attempt == 1 else cont(turn)


def full_pipeline() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(
            [
                [
                    ToolCall("c1", "lookup", {"order": "42"}),
                    ToolCall("c2", "lookup", {"order": "delete"}),
                ],
                ["too ", "long"],
                ["short"],
            ]
        ),
        pre=[note, parallel(docs, memory, name="retrieval"), chain(first, second, name="policy")],
        tools=[lookup],
        before_tool=[refuse_deletes],
        post=[strict],
    )


EXPECTED_TREE = [
    [
        "turn",
        [
            "note",
            ["retrieval", ["docs", "memory"]],
            ["policy", ["policy.first", "policy.second"]],
            "chat ScriptedModel",
            ["execute_tool lookup", ["refuse_deletes"]],
            ["execute_tool lookup", ["refuse_deletes"]],
            "chat ScriptedModel",
            "strict",
            "chat ScriptedModel",
            "strict",
        ],
    ]
]


async def test_a_turn_is_one_trace_of_hook_chat_and_tool_spans(spans) -> None:
    """Catches: spans missing, misnamed, or hung under the wrong parent (a group's members
    not under the group, a chain's not under the chain, tool hooks not under their call)."""
    await full_pipeline().run(Turn.start("where is my order?"))

    finished = spans.get_finished_spans()
    # Both tool calls start at once: order their spans by call id before comparing.
    assert tree(finished) == EXPECTED_TREE
    assert len({span.context.trace_id for span in finished}) == 1


async def test_run_and_stream_produce_the_same_spans(spans) -> None:
    """Catches: the traced path depending on whether someone listens to the events."""
    await full_pipeline().run(Turn.start("hi"))
    by_run = spans.get_finished_spans()
    spans.clear()
    async with full_pipeline().stream(Turn.start("hi")) as events:
        async for _ in events:
            pass
    by_stream = spans.get_finished_spans()

    def shape(finished):
        return sorted(
            (
                span.name,
                sorted((k, str(v)) for k, v in span.attributes.items() if k != "turnplug.turn_ref"),
            )
            for span in finished
        )

    assert tree(by_run) == tree(by_stream) == EXPECTED_TREE
    assert shape(by_run) == shape(by_stream)


async def test_hook_spans_carry_stage_verdict_durability_and_shadow(spans) -> None:
    """Catches: hook attributes missing or wrong (a parallel member's parts not a cont)."""
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[hook(note, durable=True), hook(first, shadow=True), parallel(docs, name="g")],
        post=[strict],
    )
    pipe = Pipeline(model=ScriptedModel(["no", "ok"]), pre=pipe.pre, post=[strict])
    await pipe.run(Turn.start("hi"))

    finished = spans.get_finished_spans()
    described = {
        (span.name, span.attributes["turnplug.hook.verdict"]): (
            span.attributes["turnplug.hook.stage"],
            span.attributes["turnplug.hook.durable"],
            span.attributes["turnplug.hook.shadow"],
        )
        for span in finished
        if "turnplug.hook.verdict" in span.attributes
    }
    assert described == {
        ("note", "cont"): ("pre", True, False),
        ("first", "cont"): ("pre", False, True),
        ("docs", "cont"): ("pre", False, False),
        ("strict", "regenerate"): ("post", False, False),
        ("strict", "cont"): ("post", False, False),
    }


async def test_chat_spans_follow_the_genai_conventions(spans) -> None:
    """Catches: a chat span without the model, the options that were set, the finish
    reason or the usage."""
    await full_pipeline().run(Turn.start("hi"))

    first_call, *_ = sorted(
        named(spans.get_finished_spans(), "chat ScriptedModel"), key=lambda s: s.start_time
    )
    attributes = dict(first_call.attributes)
    assert attributes["gen_ai.usage.input_tokens"] > 0
    del attributes["gen_ai.usage.input_tokens"]
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "ScriptedModel",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.max_tokens": 64,
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.output_tokens": attributes["gen_ai.usage.output_tokens"],
        "turnplug.attempt": 1,
        "turnplug.step": 1,
    }


async def test_a_provider_model_names_its_provider(spans) -> None:
    """Catches: gen_ai.provider.name / gen_ai.system missing for a real provider."""
    from pipeline.providers import OpenAIChat

    class Named:
        model = "gpt-4o-mini"
        provider = "openai"

        def __init__(self):
            self.inner = ScriptedModel(["hi"])

        def stream(self, request):
            return self.inner.stream(request)

    assert OpenAIChat("gpt-4o-mini", api_key="sk-x").provider == "openai"
    await Pipeline(model=Named()).run(Turn.start("hi"))

    (chat,) = named(spans.get_finished_spans(), "chat gpt-4o-mini")
    assert (chat.attributes["gen_ai.provider.name"], chat.attributes["gen_ai.system"]) == (
        "openai",
        "openai",
    )


async def test_tool_spans_and_a_blocked_call(spans) -> None:
    """Catches: a blocked call traced as executed, or without its blocking hook and reason."""
    ran = []

    @tool
    def lookup(order: str) -> str:
        """An order's state."""
        ran.append(order)
        return "shipped"

    pipe = Pipeline(
        model=ScriptedModel(
            [
                [
                    ToolCall("c1", "lookup", {"order": "42"}),
                    ToolCall("c2", "lookup", {"order": "delete"}),
                ],
                "done",
            ]
        ),
        tools=[lookup],
        before_tool=[refuse_deletes],
    )
    await pipe.run(Turn.start("hi"))

    tools = {
        span.attributes["gen_ai.tool.call.id"]: span
        for span in named(spans.get_finished_spans(), "execute_tool lookup")
    }
    assert ran == ["42"]
    assert dict(tools["c1"].attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "turnplug.tool.executed": True,
    }
    assert dict(tools["c2"].attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "c2",
        "gen_ai.tool.type": "function",
        "turnplug.tool.executed": False,
        "turnplug.tool.blocked_by": "refuse_deletes",
        "turnplug.tool.block_reason": "deletes need a human",
    }
    assert [(e.name, dict(e.attributes)) for e in tools["c2"].events] == [
        (
            "turnplug.block",
            {
                "turnplug.hook.name": "refuse_deletes",
                "turnplug.block.reason": "deletes need a human",
            },
        )
    ]


async def test_rejections_injections_and_the_commit_are_span_events(spans) -> None:
    """Catches: turn-level happenings lost from the trace."""
    pipe = Pipeline(
        model=ScriptedModel(["no", "ok"]), pre=[hook(note, durable=True)], post=[strict]
    )
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        await session.send("hi")

    (turn,) = named(spans.get_finished_spans(), "turn")
    assert [(e.name, dict(e.attributes)) for e in turn.events] == [
        (
            "turnplug.injection",
            {
                "turnplug.hook.name": "note",
                "turnplug.injection.durable": True,
                "turnplug.injection.tokens": 2,
                "turnplug.injection.stage": "pre",
            },
        ),
        (
            "turnplug.rejection",
            {
                "turnplug.attempt": 1,
                "turnplug.hook.name": "strict",
                "turnplug.rejection.feedback": "be brief",
            },
        ),
        ("turnplug.commit", {"gen_ai.conversation.id": "c", "turnplug.commit.messages": 2}),
    ]
    assert turn.attributes["turnplug.turn.outcome"] == "completed"
    assert turn.attributes["gen_ai.conversation.id"] == "c"


async def test_a_halt_is_an_event_and_not_an_error(spans) -> None:
    """Catches: a halt (an outcome) reported as a failure, or the model traced though it
    was never called."""
    pipe = Pipeline(model=ScriptedModel([]), pre=[stop])
    result = await pipe.run(Turn.start("hi"))

    finished = spans.get_finished_spans()
    (turn,) = named(finished, "turn")
    assert result.outcome == "halted"
    assert tree(finished) == [["turn", ["stop"]]]
    assert turn.status.status_code is StatusCode.UNSET
    assert turn.attributes["turnplug.turn.outcome"] == "halted"
    assert [(e.name, dict(e.attributes)) for e in turn.events] == [
        ("turnplug.halt", {"turnplug.hook.name": "stop", "turnplug.halt.reason": "not today"})
    ]


async def test_a_failing_hook_sets_error_status_with_the_exception_type(spans) -> None:
    """Catches: a failure traced as a success, or without the exception type."""

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[broken])
    with pytest.raises(Exception, match="boom"):
        await pipe.run(Turn.start("hi"))

    finished = spans.get_finished_spans()
    (turn,) = named(finished, "turn")
    (span,) = named(finished, "broken")
    assert (span.status.status_code, span.attributes["error.type"]) == (
        StatusCode.ERROR,
        "ValueError",
    )
    assert (turn.status.status_code, turn.attributes["error.type"]) == (
        StatusCode.ERROR,
        "HookFailed",
    )
    assert turn.attributes["turnplug.turn.outcome"] == "failed"
    assert all(span.end_time is not None for span in finished)


async def test_a_fail_open_hook_is_an_error_span_in_a_successful_turn(spans) -> None:
    """Catches: a hook failing open hidden from the trace, or failing the whole turn span."""

    await Pipeline(model=ScriptedModel(["ok"]), pre=[hook(broken, on_error="skip")]).run(
        Turn.start("hi")
    )

    finished = spans.get_finished_spans()
    (span,) = named(finished, "broken")
    (turn,) = named(finished, "turn")
    assert (
        span.attributes["turnplug.hook.verdict"],
        span.attributes["turnplug.hook.enforced"],
    ) == ("fail", False)
    assert span.status.status_code is StatusCode.ERROR
    assert turn.status.status_code is StatusCode.UNSET


def refusing_gate(turn):
    raise ValueError("the gate broke")


@pytest.mark.parametrize(
    ("when", "kind"), [(refusing_gate, "ValueError"), (lambda turn: "yes", "HookReturnError")]
)
async def test_a_background_hooks_failing_when_is_traced_with_its_exception_type(
    spans, when, kind
) -> None:
    """Bug caught: a background hook whose ``when=`` predicate raised (or returned no bool)
    was traced with ``error.type = "when= predicate"``, the start of its failure's text,
    where an ordered hook's is the exception's type."""
    await Pipeline(model=ScriptedModel(["ok"]), post=[hook(first, background=True, when=when)]).run(
        Turn.start("hi")
    )

    (span,) = named(spans.get_finished_spans(), "first")
    assert (span.status.status_code, span.status.description, span.attributes["error.type"]) == (
        StatusCode.ERROR,
        kind,
        kind,
    )


def silent_gate(turn):
    raise ValueError()


async def test_a_background_hooks_when_raising_no_message_is_traced_with_its_type(
    capturing,
) -> None:
    """Bug caught: a background hook's ``when=`` predicate raising an exception with no
    message was recorded as "ValueError (raised by its when= predicate)", with no colon, so
    its span's ``error.type`` was that whole sentence."""
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), post=[hook(first, background=True, when=silent_gate)]
    )
    await pipe.run(Turn.start("hi"))

    (span,) = named(capturing.get_finished_spans(), "first")
    assert span.attributes["error.type"] == "ValueError"
    assert span.status.description == "ValueError: raised by its when= predicate"


async def test_a_provider_failure_fails_the_chat_span(spans) -> None:
    """Catches: the chat span left open or reported fine when the model fails."""
    await_ = ScriptedModel([])  # runs out at once: a ProviderError
    with pytest.raises(Exception, match="ran out"):
        await Pipeline(model=await_).run(Turn.start("hi"))

    (chat,) = named(spans.get_finished_spans(), "chat ScriptedModel")
    assert (chat.status.status_code, chat.attributes["error.type"]) == (
        StatusCode.ERROR,
        "ProviderError",
    )


async def test_a_cancelled_turn_ends_every_span(spans) -> None:
    """Catches: spans of a cancelled turn never ended (never exported)."""
    started = anyio.Event()

    async def hang(request):
        started.set()
        await anyio.sleep_forever()
        yield "never"

    pipe = Pipeline(model=FunctionModel(hang), pre=[parallel(slow_member, name="g")])
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await pipe.run(Turn.start("hi"))

            group.start_soon(run)
            await started.wait()
            group.cancel_scope.cancel()

    finished = spans.get_finished_spans()
    assert sorted(span.name for span in finished) == [
        "chat FunctionModel",
        "g",
        "slow_member",
        "turn",
    ]
    (turn,) = named(finished, "turn")
    assert turn.attributes["turnplug.turn.outcome"] == "cancelled"
    assert turn.status.status_code is StatusCode.UNSET


async def test_a_tools_own_spans_are_children_of_its_execute_tool_span(spans) -> None:
    """Catches: the execute_tool span not current while its tool runs, so that the spans a
    tool opens (its own, an instrumented HTTP client's) left the turn's trace as roots of
    their own — for a sync tool in its worker thread and for an async tool alike."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    app = provider.get_tracer("app")

    @tool
    def fetch(url: str) -> str:
        """A sync tool: runs in a worker thread."""
        with app.start_as_current_span("GET"):
            return "page"

    @tool
    async def search(query: str) -> str:
        """An async tool."""
        with app.start_as_current_span("query"):
            return "hits"

    pipe = Pipeline(
        model=ScriptedModel(
            [
                [ToolCall("c1", "fetch", {"url": "u"}), ToolCall("c2", "search", {"query": "q"})],
                "ok",
            ]
        ),
        tools=[fetch, search],
    )
    await pipe.run(Turn.start("hi"))

    assert tree(exporter.get_finished_spans()) == [
        [
            "turn",
            [
                "chat ScriptedModel",
                ["execute_tool fetch", ["GET"]],
                ["execute_tool search", ["query"]],
                "chat ScriptedModel",
            ],
        ]
    ]


class FailingProcessor(SimpleSpanProcessor):
    """A span processor that raises when a span named `name` starts or ends."""

    def __init__(self, name: str, when: str) -> None:
        super().__init__(InMemorySpanExporter())
        self.name = name
        self.when = when

    def on_start(self, span, parent_context=None) -> None:
        if self.when == "start" and span.name == self.name:
            raise RuntimeError(f"processor broke on {span.name}")

    def on_end(self, span) -> None:
        if self.when == "end" and span.name == self.name:
            raise RuntimeError(f"processor broke on {span.name}")


@pytest.fixture
def failing() -> Iterator[Callable[[str, str], None]]:
    """Instrument with a `FailingProcessor`; uninstrument after the test."""

    def instrument(name: str, when: str) -> None:
        provider = TracerProvider()
        provider.add_span_processor(FailingProcessor(name, when))
        otel.instrument(tracer_provider=provider)

    yield instrument
    otel.uninstrument()


@pytest.mark.parametrize(
    ("name", "when"), [("turn", "start"), ("note", "start"), ("chat ScriptedModel", "end")]
)
async def test_a_failing_tracer_leaves_the_turn_to_finish_untraced(
    failing, caplog, name, when
) -> None:
    """Catches: a span processor (or exporter) that raised failing the turn it traced with
    its own RuntimeError — when the turn's span started, a hook's, or a model call's ended."""
    failing(name, when)
    pipe = Pipeline(model=ScriptedModel(["fine"]), pre=[note])
    with caplog.at_level(logging.WARNING, logger="turnplug"):
        result = await pipe.run(Turn.start("hi"))

    assert (result.outcome, result.reply.text) == ("completed", "fine")
    (record,) = caplog.records
    assert (record.name, record.levelname) == ("turnplug.pipeline", "WARNING")
    assert f"the tracer failed (RuntimeError: processor broke on {name})" in record.getMessage()


async def test_a_failing_tracer_never_replaces_the_turns_own_error(failing) -> None:
    """Catches: a span processor that raised while the trace of a failed turn was ended
    raising its RuntimeError in place of the turn's HookFailed."""
    failing("turn", "end")
    with pytest.raises(HookFailed, match="boom"):
        await Pipeline(model=ScriptedModel(["ok"]), pre=[broken]).run(Turn.start("hi"))


async def test_the_callers_current_span_is_the_turns_parent(spans) -> None:
    """Catches: each turn starting a trace of its own inside an application's request span."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        await Pipeline(model=ScriptedModel(["a"])).run(Turn.start("hi"))
        async with Pipeline(model=ScriptedModel(["b"])).stream(Turn.start("hi")) as events:
            async for _ in events:
                pass

    finished = exporter.get_finished_spans()
    turns = named(finished, "turn")
    assert len(turns) == 2
    assert all(turn.parent.span_id == request.get_span_context().span_id for turn in turns)
    assert {span.context.trace_id for span in finished} == {request.get_span_context().trace_id}


class Started(SimpleSpanProcessor):
    """Records the name of every span started."""

    def __init__(self) -> None:
        super().__init__(InMemorySpanExporter())
        self.started: list[str] = []

    def on_start(self, span, parent_context=None) -> None:
        self.started.append(span.name)


async def test_a_stream_never_entered_starts_no_span() -> None:
    """Catches: `pipe.stream(turn)` starting the turn's span when called, so that a stream
    built and then dropped unentered (an error between the two, say) left a span started
    and never ended: never exported, shown as in progress for ever by a backend that
    shows spans as they start."""
    started = Started()
    provider = TracerProvider()
    provider.add_span_processor(started)
    otel.instrument(tracer_provider=provider)
    try:
        pipe = Pipeline(model=ScriptedModel(["a"]))
        dropped = pipe.stream(Turn.start("hi"))
        assert started.started == []
        del dropped
        async with pipe.stream(Turn.start("hi")) as events:
            async for _ in events:
                pass
    finally:
        otel.uninstrument()

    assert started.started == ["turn", "chat ScriptedModel"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_turn_whose_mcp_server_cannot_start_ends_its_span(streamed) -> None:
    """Bug caught: a turn that failed while its MCP toolsets connected (a server that could
    not be started) left its `turn` span started and never ended, so never exported."""
    started = Started()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(started)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    pipe = Pipeline(
        model=ScriptedModel(["never"]),
        toolsets=[mcp_toolset("gone", command=sys.executable + "-missing")],
    )

    async def run() -> None:
        if streamed:
            async with pipe.stream(Turn.start("hi")) as events:
                async for _ in events:
                    pass
        else:
            await pipe.run(Turn.start("hi"))

    try:
        with pytest.raises(ToolsetError, match="could not be started"):
            await run()
    finally:
        otel.uninstrument()

    (turn,) = exporter.get_finished_spans()
    assert started.started == ["turn"]
    assert (turn.status.status_code, turn.attributes["error.type"]) == (
        StatusCode.ERROR,
        "ToolsetError",
    )
    assert turn.attributes["turnplug.turn.outcome"] == "failed"


async def test_a_thousand_concurrent_turns_are_a_thousand_separate_traces(spans) -> None:
    """Catches: spans of concurrent turns crossing into each other's traces."""
    pipe = Pipeline(
        model=ScriptedModel(["a"] * 1000),
        pre=[note, parallel(docs, memory, name="retrieval")],
        post=[first],
    )

    async with anyio.create_task_group() as group:
        for _ in range(1000):
            group.start_soon(pipe.run, Turn.start("hi"))

    traces: dict[int, list[ReadableSpan]] = {}
    for span in spans.get_finished_spans():
        traces.setdefault(span.context.trace_id, []).append(span)
    assert len(traces) == 1000
    for trace_spans in traces.values():
        assert tree(tuple(trace_spans)) == [
            ["turn", ["note", ["retrieval", ["docs", "memory"]], "chat ScriptedModel", "first"]]
        ]


async def test_without_capture_no_content_is_traced(spans) -> None:
    """Catches: message text, tool arguments or tool results leaking into spans by default."""
    await full_pipeline().run(Turn.start("where is my order?"))

    finished = spans.get_finished_spans()
    # The turn was traced whole: the check below looked at every span there is to look at.
    assert tree(finished) == EXPECTED_TREE
    text = everything(finished)
    for content in ("where is my order", "too long", "shipped", '"42"', "a note", 'memory"'):
        assert content not in text


async def test_with_capture_the_transformed_content_is_traced(capturing) -> None:
    """Catches: capture_content=True recording nothing, or the raw text."""
    pipe = Pipeline(
        model=ScriptedModel([["mail ada@", "example.com"]]), transformers=[redact(r"\S+@\S+")]
    )
    await pipe.run(Turn.start("hi"))

    (chat,) = named(capturing.get_finished_spans(), "chat ScriptedModel")
    assert json.loads(chat.attributes["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "mail [REDACTED]"}],
            "finish_reason": "stop",
        }
    ]


@settings(max_examples=40)
@given(
    secret=st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=12, max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=8),
)
def test_a_redacted_secret_never_reaches_a_span(secret: str, cuts: list[int]) -> None:
    """Catches: raw model text (before the redaction) recorded with capture on, at any
    chunk boundaries."""
    text = f"my key is SECRET-{secret}-END, and a tool said RESULT-{secret}-END"
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    @tool
    def fetch() -> str:
        """Fetch."""
        return f"RESULT-{secret}-END"

    def scrub(call, result, turn):
        return cont(result.with_content("[scrubbed]"))

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider, capture_content=True)
    try:
        pipe = Pipeline(
            model=ScriptedModel([[ToolCall("c1", "fetch", {})], chunks]),
            tools=[fetch],
            after_tool=[scrub],
            transformers=[redact(r"(SECRET|RESULT)-[A-Z0-9]+-END")],
        )
        trio.run(pipe.run, Turn.start("go"))
    finally:
        otel.uninstrument()

    traced = everything(exporter.get_finished_spans())
    assert "[REDACTED]" in traced
    assert "[scrubbed]" in traced
    for start in range(len(secret) - 5):
        assert secret[start : start + 6] not in traced


async def test_instrument_rejects_what_is_not_a_tracer_provider() -> None:
    """Catches: a wrong argument accepted and failing later, mid-turn."""
    with pytest.raises(ConfigError, match=r"TracerProvider.*got str"):
        otel.instrument(tracer_provider="console")
    with pytest.raises(ConfigError, match="capture_content"):
        otel.instrument(capture_content="yes")


async def test_uninstrument_stops_tracing(spans) -> None:
    """Catches: uninstrument() leaving the tracer in place."""
    otel.uninstrument()
    await Pipeline(model=ScriptedModel(["a"])).run(Turn.start("hi"))
    assert spans.get_finished_spans() == ()


def test_instrumented_is_the_provider_turns_go_to() -> None:
    """Bug caught: ``instrumented()`` said only that ``instrument()`` had been called, so
    code instrumenting on an application's behalf could neither flush the provider a hook
    module gave it nor tell that turns went to no provider at all."""
    from opentelemetry import trace

    own = TracerProvider()
    assert otel.instrumented() is None
    otel.instrument(tracer_provider=own)
    try:
        assert otel.instrumented() is own
        otel.instrument()  # the global provider, as it is when asked
        assert otel.instrumented() is trace.get_tracer_provider()
    finally:
        otel.uninstrument()
    assert otel.instrumented() is None


async def test_a_no_op_provider_builds_no_trace() -> None:
    """Catches: the instrumented path failing with the API's no-op provider."""
    otel.instrument(tracer_provider=NoOpTracerProvider())
    try:
        result = await Pipeline(model=ScriptedModel(["a"]), pre=[note]).run(Turn.start("hi"))
    finally:
        otel.uninstrument()
    assert result.reply.text == "a"


def test_the_capture_variable_turns_capture_on(monkeypatch) -> None:
    """Catches: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT ignored."""
    monkeypatch.setenv(otel.CAPTURE_CONTENT_ENV, "true")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    try:
        trio.run(Pipeline(model=ScriptedModel(["visible"])).run, Turn.start("hi"))
    finally:
        otel.uninstrument()
    assert "visible" in everything(exporter.get_finished_spans())


def test_importing_pipeline_does_not_import_opentelemetry() -> None:
    """Catches: the optional dependency becoming a required one."""
    code = "import sys, pipeline, pipeline.events; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_without_opentelemetry_importing_otel_names_the_extra_to_install() -> None:
    """Bug caught: without the otel extra, importing pipeline.otel failed with a bare "No module named 'opentelemetry'" that named no install to fix it."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if it were not installed\n"
        "try:\n"
        "    import pipeline.otel\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("ModuleNotFoundError pipeline.otel needs opentelemetry-api")
    assert "pip install 'turnplug[otel]'" in done.stdout


# -- content capture records only what survived the turn ---------------------------------------


def scrub(turn: Turn):
    """A post hook that rewrites a card number out of the reply."""
    assert turn.reply is not None
    text = turn.reply.text.replace("4111-SECRET", "[scrubbed]")
    return cont(attrs.evolve(turn, reply=attrs.evolve(turn.reply, message=Message.assistant(text))))


async def test_with_capture_a_reply_a_post_hook_rewrote_is_traced_rewritten(capturing) -> None:
    """Catches: the trace holding the reply as the model gave it (the turn span's output
    taken from ReplyReady, before the post hooks; the chat span's from the deltas) after a
    post hook scrubbed a value out of it, which the log never holds."""
    pipe = Pipeline(model=ScriptedModel([["your code is ", "4111-SECRET"]]), post=[scrub])

    result = await pipe.run(Turn.start("hi"))

    spans = capturing.get_finished_spans()
    assert result.reply is not None
    assert result.reply.text == "your code is [scrubbed]"
    assert "4111-SECRET" not in everything(spans)
    (turn,) = named(spans, "turn")
    assert json.loads(turn.attributes["gen_ai.output.messages"])[0]["parts"] == [
        {"type": "text", "content": "your code is [scrubbed]"}
    ]


async def test_with_capture_an_injection_a_later_hook_removed_keeps_no_content(capturing) -> None:
    """Catches: an injection's content recorded as it was made, when a later pre hook took
    it off the turn (the model, the log and the audit never see it)."""

    def load_profile(turn: Turn):
        return cont(turn.inject("ssn 123-45-6789"))

    def drop_sensitive(turn: Turn):
        kept = tuple(i for i in turn.injections if "ssn" not in i.parts[0].text)
        return cont(attrs.evolve(turn, injections=kept))

    def keep(turn: Turn):
        return cont(turn.inject("plan: pro"))

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[
            hook(load_profile, durable=True, name="load_profile"),
            drop_sensitive,
            hook(keep, name="keep"),
        ],
    )

    await pipe.run(Turn.start("hi"))

    spans = capturing.get_finished_spans()
    assert "123-45-6789" not in everything(spans)
    (turn,) = named(spans, "turn")
    injections = [dict(e.attributes) for e in turn.events if e.name == "turnplug.injection"]
    assert [(i["turnplug.hook.name"], "turnplug.injection.content" in i) for i in injections] == [
        ("load_profile", False),
        ("keep", True),
    ]


async def test_with_capture_a_rejected_attempts_text_is_not_traced(capturing) -> None:
    """Catches: the text of an attempt a guardrail rejected recorded on its chat span; the
    log never holds it, and the accepted attempt's text is recorded."""

    def guard(turn: Turn):
        assert turn.reply is not None
        return regenerate("no internal notes") if "INTERNAL" in turn.reply.text else cont(turn)

    pipe = Pipeline(model=ScriptedModel(["INTERNAL-NOTE 7", "all good"]), post=[guard])

    await pipe.run(Turn.start("hi"))

    spans = capturing.get_finished_spans()
    assert "INTERNAL-NOTE" not in everything(spans)
    chats = named(spans, "chat ScriptedModel")
    assert ["gen_ai.output.messages" in chat.attributes for chat in chats] == [False, True]


async def test_a_call_that_never_ran_is_traced_as_not_executed(spans) -> None:
    """Catches: ``turnplug.tool.executed`` missing, rather than False, on the span of a call
    with invalid arguments or of an unknown tool."""

    def lookup(order: str) -> str:
        return "found"

    model = ScriptedModel(
        [[ToolCall("c1", "lookup", {"order": 5}), ToolCall("c2", "ghost", {})], "done"]
    )
    pipe = Pipeline(model=model, tools=[tool(lookup)])

    await pipe.run(Turn.start("hi"))

    executed = {
        span.name: span.attributes.get("turnplug.tool.executed")
        for span in spans.get_finished_spans()
        if span.name.startswith("execute_tool")
    }
    assert executed == {"execute_tool lookup": False, "execute_tool ghost": False}


@tool
def vault(key: str) -> str:
    """A secret's value."""
    return f"VAULT-VALUE of {key}"


def to_safe_key(call, turn):
    return cont(attrs.evolve(call, arguments={"key": "public"}))


def shorten(call, result, turn):
    return cont(result.with_content(result.content.upper()))


def tool_calls_then(*replies: str) -> ScriptedModel:
    return ScriptedModel([[ToolCall("c1", "vault", {"key": "VAULT-KEY"})], *replies])


async def test_with_capture_a_tool_calls_arguments_and_result_are_traced_as_rewritten(
    capturing,
) -> None:
    """Catches: tool content missing from the execute_tool span of a completed turn, or
    recorded before the before-tool and after-tool rewrites."""
    pipe = Pipeline(
        model=tool_calls_then("done"),
        tools=[vault],
        before_tool=[to_safe_key],
        after_tool=[shorten],
    )
    await pipe.run(Turn.start("hi"))

    (span,) = named(capturing.get_finished_spans(), "execute_tool vault")
    assert (
        span.attributes["gen_ai.tool.call.arguments"],
        span.attributes["gen_ai.tool.call.result"],
    ) == ('{"key": "public"}', "VAULT-VALUE OF PUBLIC")


def reject_first(turn):
    return regenerate("again") if turn.reply.attempt == 1 else cont(turn)


def hide_tool_results(turn):
    messages = tuple(
        attrs.evolve(
            message, parts=[attrs.evolve(part, content="[hidden]") for part in message.parts]
        )
        if message.role == "tool"
        else message
        for message in turn.reply.messages
    )
    return cont(attrs.evolve(turn, reply=attrs.evolve(turn.reply, messages=messages)))


@pytest.mark.parametrize(
    ("replies", "post", "absent"),
    [
        (["done"], [broken], ["VAULT-KEY", "VAULT-VALUE"]),  # the turn failed
        (["done"], [stop], ["VAULT-KEY", "VAULT-VALUE"]),  # the turn halted
        # The call belonged to a rejected attempt.
        (["long", "short"], [reject_first], ["VAULT-KEY", "VAULT-VALUE"]),
        # A post hook rewrote the result (the log holds the call's arguments).
        (["done"], [hide_tool_results], ["VAULT-VALUE"]),
    ],
    ids=["failed", "halted", "rejected", "rewritten-by-post-hook"],
)
async def test_with_capture_tool_content_the_log_never_holds_is_not_traced(
    capturing, replies, post, absent
) -> None:
    """Catches: a tool call's arguments and raw result recorded on its execute_tool span as
    soon as it finished, though the log never holds them: of a turn that failed or halted,
    of an attempt a guardrail rejected, or a result a post hook rewrote."""
    pipe = Pipeline(model=tool_calls_then(*replies), tools=[vault], post=post)
    with contextlib.suppress(HookFailed):
        await pipe.run(Turn.start("hi"))

    spans = capturing.get_finished_spans()
    assert named(spans, "execute_tool vault")
    assert [secret for secret in absent if secret in everything(spans)] == []
