"""`turnplug serve --otel`: each request's turn traced with the real OpenTelemetry SDK, as a
child of the client's trace (its W3C ``traceparent``), the gateway served for real on
loopback and spoken to with the official OpenAI SDK."""

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from hooks.cli._gateway import Gateway, Settings
from pipeline import Pipeline, cont
from pipeline.logs import SQLiteLog
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Turn

from .serve_support import KEY, MODEL, served, user

SCRIPT = Path(sys.executable).parent / "turnplug"


def client_span() -> tuple[int, int, str]:
    """A client's trace id, span id, and the ``traceparent`` header naming them (sampled)."""
    trace_id = int.from_bytes(secrets.token_bytes(16), "big") or 1
    span_id = int.from_bytes(secrets.token_bytes(8), "big") or 1
    return trace_id, span_id, f"00-{trace_id:032x}-{span_id:016x}-01"


async def checked(turn: Turn) -> Any:
    return cont(turn)


async def broken(turn: Turn) -> Any:
    raise ValueError("the store is down")


def pipeline(replies: list[Any]) -> Pipeline:
    return Pipeline(model=ScriptedModel(replies), pre=[checked])


def tree(spans: tuple[ReadableSpan, ...]) -> list[object]:
    """The spans as nested [name, [children]] in start order, from those whose parent is not
    among them (the client's span, or none)."""
    ids = {span.context.span_id for span in spans}
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent else None
        by_parent.setdefault(parent if parent in ids else None, []).append(span)

    def children(span: ReadableSpan | None) -> list[object]:
        kids = by_parent.get(span.context.span_id if span else None, [])
        kids = sorted(kids, key=lambda s: (s.start_time or 0, s.name))
        return [[kid.name, children(kid)] if children(kid) else kid.name for kid in kids]

    return children(None)


def in_client_trace(spans: tuple[ReadableSpan, ...], trace_id: int, span_id: int) -> None:
    """Every span is in the client's trace, and the turn is the child of the client's span."""
    assert {span.context.trace_id for span in spans} == {trace_id}
    (turn,) = [span for span in spans if span.name == "turn"]
    assert turn.parent is not None
    assert turn.parent.span_id == span_id
    assert turn.parent.is_remote


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_stateless_turn_is_a_child_of_the_clients_trace(
    spans: InMemorySpanExporter, streamed: bool
) -> None:
    """Bug caught: the gateway ignored the client's ``traceparent``: each turn was a trace
    of its own, out of the client's."""
    trace_id, span_id, header = client_span()
    async with served(pipeline([["Hel", "lo"]]), otel=True) as gw:
        request: dict[str, Any] = {
            "model": "m",
            "messages": user("hi"),
            "extra_headers": {"traceparent": header},
        }
        if streamed:
            chunks = await gw.sdk_stream(**request)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            named = None
        else:
            reply = await gw.sdk().chat.completions.create(**request)
            assert reply.choices[0].message.content == "Hello"
            named = reply._request_id
    finished = spans.get_finished_spans()
    assert tree(finished) == [["turn", ["checked", "chat ScriptedModel"]]]
    in_client_trace(finished, trace_id, span_id)
    (turn,) = [span for span in finished if span.name == "turn"]
    assert turn.attributes is not None
    assert turn.attributes["turnplug.turn.outcome"] == "completed"
    if named is not None:
        # The response's x-request-id is the turn's turn_ref.
        assert turn.attributes["turnplug.turn_ref"] == named
    # Content capture is off unless asked for.
    assert "gen_ai.output.messages" not in turn.attributes


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_conversation_turn_is_a_child_of_the_clients_trace(
    spans: InMemorySpanExporter, streamed: bool, tmp_path: Path
) -> None:
    """Bug caught: a conversation turn, run in a session task of the gateway's rather than
    the request's, lost the request's trace context (a trace of its own)."""
    trace_id, span_id, header = client_span()
    async with (
        SQLiteLog(tmp_path / "log.db") as log,
        served(pipeline(["one", "two"]), log=log, otel=True) as gw,
    ):
        for text in ("hi", "again"):
            request: dict[str, Any] = {
                "model": "m",
                "messages": user(text),
                "extra_headers": {"traceparent": header, "X-Conversation-Id": "c1"},
            }
            if streamed:
                await gw.sdk_stream(**request)
            else:
                await gw.sdk().chat.completions.create(**request)
    finished = spans.get_finished_spans()
    assert tree(finished) == [["turn", ["checked", "chat ScriptedModel"]]] * 2
    assert {span.context.trace_id for span in finished} == {trace_id}
    turns = [span for span in finished if span.name == "turn"]
    for turn in turns:
        assert turn.parent is not None
        assert turn.parent.span_id == span_id
        assert turn.attributes is not None
        assert turn.attributes["gen_ai.conversation.id"] == "c1"


async def test_without_traceparent_each_turn_is_a_trace_of_its_own(
    spans: InMemorySpanExporter,
) -> None:
    """Bug caught: a request without ``traceparent`` put in the trace of a request served
    before it in the same task (a trace context left attached after its request)."""
    trace_id, _, header = client_span()
    gateway = Gateway(
        pipeline(["one", "two", "three"]), Settings(model=MODEL, api_key=KEY, otel=True)
    )
    # httpx's ASGI transport calls the app in this task: each request is served in the
    # same context, where one left attached would be the next one's.
    transport = httpx.ASGITransport(app=gateway.app)
    async with (
        gateway.running(),
        httpx.AsyncClient(transport=transport, base_url="http://gateway") as client,
    ):
        for text, headers in (("hi", {"traceparent": header}), ("again", {}), ("more", {})):
            answer = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user(text)},
                headers={"authorization": f"Bearer {KEY}", **headers},
            )
            assert answer.status_code == 200, answer.text
    turns = sorted(
        (span for span in spans.get_finished_spans() if span.name == "turn"),
        key=lambda span: span.start_time or 0,
    )
    assert len(turns) == 3
    assert turns[0].context.trace_id == trace_id
    assert [turn.parent for turn in turns[1:]] == [None, None]
    assert len({turn.context.trace_id for turn in turns}) == 3


async def test_a_failed_turn_is_an_error_span_in_the_clients_trace(
    spans: InMemorySpanExporter,
) -> None:
    """Bug caught: a turn answered 500 traced out of the client's trace, or not as an
    error."""
    trace_id, span_id, header = client_span()
    pipe = Pipeline(model=ScriptedModel(["never"]), pre=[broken])
    async with served(pipe, otel=True) as gw:
        with pytest.raises(openai.InternalServerError):
            await gw.sdk().chat.completions.create(
                model="m", messages=user("hi"), extra_headers={"traceparent": header}
            )
    finished = spans.get_finished_spans()
    assert tree(finished) == [["turn", ["broken"]]]
    in_client_trace(finished, trace_id, span_id)
    (turn,) = [span for span in finished if span.name == "turn"]
    assert turn.status.status_code is StatusCode.ERROR
    assert turn.attributes is not None
    assert turn.attributes["error.type"] == "HookFailed"


async def test_a_client_hanging_up_mid_stream_ends_its_turns_spans(
    spans: InMemorySpanExporter,
) -> None:
    """Bug caught: the spans of a turn whose client hung up mid-stream never ended (never
    exported), or ended out of the client's trace."""
    sent = anyio.Event()

    async def stalls(request: Any) -> Any:
        yield "first words "
        sent.set()
        await anyio.sleep_forever()

    trace_id, span_id, header = client_span()

    def hang_up(base: str) -> None:
        # The SDK's sync client, in a worker thread (see `Served.sdk_stream`).
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=30)
        request: dict[str, Any] = {"model": "m", "messages": user("hi")}
        with (
            client,
            client.chat.completions.create(
                stream=True, extra_headers={"traceparent": header}, **request
            ) as stream,
        ):
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    return  # the client hangs up, mid-stream

    async with served(Pipeline(model=FunctionModel(stalls)), otel=True) as gw:
        with anyio.fail_after(10):
            await anyio.to_thread.run_sync(hang_up, gw.base)
            await sent.wait()
            await gw.gateway.turns_finished()
    finished = spans.get_finished_spans()
    assert tree(finished) == [["turn", ["chat FunctionModel"]]]
    in_client_trace(finished, trace_id, span_id)
    (turn,) = [span for span in finished if span.name == "turn"]
    assert turn.attributes is not None
    assert turn.attributes["turnplug.turn.outcome"] == "cancelled"


def write_config(folder: Path) -> Path:
    config = folder / "gateway.toml"
    config.write_text("")  # the offline scripted model
    return config


def test_otel_without_opentelemetry_is_a_usage_error_naming_the_extra(tmp_path: Path) -> None:
    """Bug caught: ``--otel`` without OpenTelemetry installed failing with a bare
    ModuleNotFoundError traceback, or serving untraced without a word."""
    hidden = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        from hooks.cli._main import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", hidden, "serve", str(write_config(tmp_path)), "--otel"],
        capture_output=True,
        text=True,
        env=os.environ | {"TURNPLUG_GATEWAY_KEY": KEY},
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "turnplug[otel]" in done.stderr
    assert "Traceback" not in done.stderr


@contextmanager
def instrumented(config: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``opentelemetry-instrument turnplug serve CONFIG --otel``, spans printed on stdout by
    the console exporter (batched, as the distro sets every exporter up); its URL."""
    environ = {
        "OTEL_SERVICE_NAME": "gateway-under-test",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    auto = str(Path(sys.executable).parent / "opentelemetry-instrument")
    with serving([auto, str(SCRIPT)], config, *extra, environ=environ) as (process, url, said):
        assert "no OpenTelemetry tracer provider" not in said
        yield process, url


@contextmanager
def serving(
    command: list[str], config: Path, *extra: str, environ: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """``COMMAND serve CONFIG --port 0 --otel EXTRA...`` started: the process, its URL and
    what it said on stderr until it listened."""
    process = subprocess.Popen(
        [*command, "serve", str(config), "--port", "0", "--otel", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TURNPLUG_GATEWAY_KEY": KEY} | (environ or {}),
    )
    try:
        assert process.stderr is not None
        url = None
        lines = []
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        assert url is not None, "".join(lines)
        yield process, url, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def exported_turn(out: str, trace_id: int) -> str:
    """The console exporter's ``turn`` span of trace `trace_id`, as it printed it."""
    for found in re.finditer(r'\{\s*"name": "turn",.*?\n\}', out, re.DOTALL):
        if f'"trace_id": "0x{trace_id:032x}"' in found.group():
            return found.group()
    raise AssertionError(f"no turn span of trace {trace_id:032x} in:\n{out}")


def sdk_call(url: str, text: str, header: str) -> Any:
    with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
        return client.chat.completions.create(
            model="m", messages=user(text), extra_headers={"traceparent": header}
        )


def answered_then_stopped_with_a_stuck_thread(
    process: subprocess.Popen[str], url: str, header: str, mark: Path
) -> str:
    """One turn answered in the client's trace, then a request whose sync background hook
    holds its worker thread (it creates `mark`, then sleeps), then SIGTERM: the command must
    exit 0 without waiting for that thread. What it printed on standard output."""
    sdk_call(url, "hi", header)
    stuck = threading.Thread(
        target=lambda: httpx.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": user("stuck")},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=30,
        )
    )
    stuck.start()
    deadline = time.monotonic() + 10
    while not mark.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    stuck.join(30)
    assert process.returncode == 0, err
    assert "not waiting for 1 worker threads" in err, err
    return out


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_under_opentelemetry_instrument_the_turn_joins_the_clients_trace(
    tmp_path: Path, loop: str
) -> None:
    """Bug caught: ``opentelemetry-instrument turnplug serve --otel`` exporting no turn span
    (the global provider not used, or its batched spans not flushed when SIGTERM stops the
    gateway), or one out of the client's trace."""
    trace_id, span_id, header = client_span()
    with instrumented(write_config(tmp_path), "--loop", loop) as (process, url):
        reply = sdk_call(url, "hi", header)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    turn = exported_turn(out, trace_id)
    assert f'"parent_id": "0x{span_id:016x}"' in turn
    assert f'"turnplug.turn_ref": "{reply._request_id}"' in turn
    assert '"service.name": "gateway-under-test"' in turn


def test_spans_are_sent_when_the_command_leaves_an_abandoned_worker_thread(
    tmp_path: Path,
) -> None:
    """Bug caught: a gateway that exits without waiting for a sync hook's abandoned worker
    thread (``os._exit``, which skips the tracer provider's own flush at exit) lost the
    spans of the turns it had answered, still in the batch span processor."""
    mark = tmp_path / "started"
    (tmp_path / "stuck_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import time
            from pipeline import cont

            def bg(turn):
                if turn.user_message.text == "stuck":
                    open({str(mark)!r}, "w").close()
                    time.sleep(60)
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[post]]\nkind = "python"\nref = "stuck_hooks:bg"\nbackground = true\n')
    trace_id, span_id, header = client_span()
    # asyncio: its worker threads are the ones the interpreter would wait for.
    with instrumented(config, "--drain-timeout", "1", "--loop", "asyncio") as (process, url):
        out = answered_then_stopped_with_a_stuck_thread(process, url, header, mark)
    assert f'"parent_id": "0x{span_id:016x}"' in exported_turn(out, trace_id)


def test_spans_of_a_hook_modules_own_provider_are_sent_at_an_exit_skipping_atexit(
    tmp_path: Path,
) -> None:
    """Bug caught: an exit that does not wait for an abandoned worker thread flushed only the
    global tracer provider, so the turns of a hook module that instrumented them with a
    batched provider of its own lost their spans."""
    mark = tmp_path / "started"
    (tmp_path / "own_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            import time
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
            from pipeline import cont, otel

            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
            otel.instrument(tracer_provider=provider)

            def bg(turn):
                if turn.user_message.text == "stuck":
                    open({str(mark)!r}, "w").close()
                    time.sleep(60)
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[post]]\nkind = "python"\nref = "own_hooks:bg"\nbackground = true\n')
    trace_id, span_id, header = client_span()
    # asyncio: its worker threads are the ones the interpreter would wait for.
    with serving([str(SCRIPT)], config, "--drain-timeout", "1", "--loop", "asyncio") as (
        process,
        url,
        _,
    ):
        out = answered_then_stopped_with_a_stuck_thread(process, url, header, mark)
    assert f'"parent_id": "0x{span_id:016x}"' in exported_turn(out, trace_id)


HANGING_EXPORTER = """
import time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

class Hanging(SpanExporter):
    # A collector that takes the connection and never answers.
    def export(self, spans):
        time.sleep(3600)
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Hanging()))
trace.set_tracer_provider(provider)
"""


def test_an_exporter_that_never_answers_does_not_keep_the_command_from_exiting(
    tmp_path: Path,
) -> None:
    """Bug caught: the spans sent before an exit that does not wait for an abandoned worker
    thread were sent by the SDK's force_flush, which ignores its timeout, so an exporter that
    never answered kept the command from ever exiting."""
    mark = tmp_path / "started"
    (tmp_path / "hanging_hooks.py").write_text(
        HANGING_EXPORTER
        + textwrap.dedent(
            f"""
            from pipeline import cont

            def bg(turn):
                if turn.user_message.text == "stuck":
                    open({str(mark)!r}, "w").close()
                    time.sleep(60)
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[post]]\nkind = "python"\nref = "hanging_hooks:bg"\nbackground = true\n')
    # asyncio: its worker threads are the ones the interpreter would wait for.
    with serving([str(SCRIPT)], config, "--drain-timeout", "1", "--loop", "asyncio") as (
        process,
        url,
        _,
    ):
        sdk_call(url, "hi", client_span()[2])  # a span the batch processor holds
        threading.Thread(
            target=lambda: httpx.post(
                url + "/v1/chat/completions",
                json={"model": "m", "messages": user("stuck")},
                headers={"authorization": f"Bearer {KEY}"},
                timeout=60,
            ),
            daemon=True,
        ).start()
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=30)  # about 4 s: drain, threads, flush
        except subprocess.TimeoutExpired:
            pytest.fail("the command never exited: the flush waited for the exporter")
    assert process.returncode == 0, err
    assert "not waiting for 1 worker threads" in err, err


def test_the_hard_stop_says_what_is_left_once_while_spans_are_sent(tmp_path: Path) -> None:
    """Bug caught: on asyncio, the server's hard stop waited up to 2 s for the spans to be
    sent, the hard stop's timer fired meanwhile, and the command said what was left, and
    sent the spans, a second time."""
    mark = tmp_path / "started"
    (tmp_path / "shielded_hooks.py").write_text(
        HANGING_EXPORTER
        + textwrap.dedent(
            f"""
            import anyio
            from pipeline import cont

            trace.get_tracer("test").start_span("pending").end()  # what the flush waits on

            async def bg(turn):
                open({str(mark)!r}, "w").close()
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(60)
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[post]]\nkind = "python"\nref = "shielded_hooks:bg"\nbackground = true\n')
    with serving([str(SCRIPT)], config, "--drain-timeout", "1", "--loop", "asyncio") as (
        process,
        url,
        _,
    ):

        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the process ends, unanswered
                httpx.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": user("hi")},
                    headers={"authorization": f"Bearer {KEY}"},
                    timeout=60,
                )

        threading.Thread(target=send, daemon=True).start()
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert err.count("still running past the drain timeout") == 1, err


def test_propagators_that_do_not_load_are_a_usage_error_at_start(tmp_path: Path) -> None:
    """Bug caught: ``OTEL_PROPAGATORS`` naming a propagator not installed served every
    request a bare 500 (the propagators loaded on the first request), with nothing said."""
    try:
        done = subprocess.run(
            [str(SCRIPT), "serve", str(write_config(tmp_path)), "--port", "0", "--otel"],
            capture_output=True,
            text=True,
            env=os.environ | {"TURNPLUG_GATEWAY_KEY": KEY, "OTEL_PROPAGATORS": "nosuchformat"},
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the command served, with propagators that cannot load")
    assert done.returncode == 2, done.stderr
    assert "OTEL_PROPAGATORS" in done.stderr
    assert "nosuchformat" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_propagator_failing_when_built_is_said_once_without_a_traceback(
    tmp_path: Path,
) -> None:
    """Bug caught: an installed propagator that raised when built (a vendor's, missing its
    setting) made OpenTelemetry print its traceback on stderr before the usage error."""
    (tmp_path / "vendorprop.py").write_text(
        "class Prop:\n    def __init__(self):\n        raise RuntimeError('needs VENDOR_KEY')\n"
    )
    info = tmp_path / "vendorprop-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendorprop\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[opentelemetry_propagator]\nvendor = vendorprop:Prop\n")
    done = subprocess.run(
        [str(SCRIPT), "serve", str(write_config(tmp_path)), "--port", "0", "--otel"],
        capture_output=True,
        text=True,
        env=os.environ
        | {
            "TURNPLUG_GATEWAY_KEY": KEY,
            "OTEL_PROPAGATORS": "tracecontext,vendor",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        },
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("needs VENDOR_KEY") == 1, done.stderr
    assert "OTEL_PROPAGATORS" in done.stderr


def test_settings_otel_without_opentelemetry_names_the_extra() -> None:
    """Bug caught: ``Gateway(Settings(otel=True))`` without OpenTelemetry installed blamed
    ``OTEL_PROPAGATORS`` and the ``--otel`` option the library has not, not the missing
    extra."""
    hidden = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        from hooks.cli._gateway import Gateway, Settings
        from pipeline import ConfigError, Pipeline
        from pipeline.testing import ScriptedModel
        try:
            Gateway(Pipeline(model=ScriptedModel(["x"])), Settings(model="m", api_key=None, otel=True))
        except ConfigError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", hidden], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "turnplug[otel]" in done.stdout
    assert "Settings.otel" in done.stdout
    assert "--otel" not in done.stdout
    assert "OTEL_PROPAGATORS" not in done.stdout


class Raising:
    """A propagator whose extract fails (a bug of its own, or of the headers it reads)."""

    fields: ClassVar[set[str]] = set()

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        raise RuntimeError("propagator bug")

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        pass


@pytest.fixture
def raising_propagator() -> Iterator[None]:
    from opentelemetry import propagate

    kept = propagate.get_global_textmap()
    propagate.set_global_textmap(Raising())  # type: ignore[arg-type]
    yield
    propagate.set_global_textmap(kept)


async def test_a_propagator_that_fails_serves_the_request_and_says_so_once(
    spans: InMemorySpanExporter, raising_propagator: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a propagator whose extract raised failed every request with a bare 500,
    said nothing, and left a turn counted in flight that the drain waited for."""
    _, _, header = client_span()
    async with served(pipeline(["one", "two"]), otel=True) as gw:
        for text in ("hi", "again"):
            reply = await gw.sdk().chat.completions.create(
                model="m", messages=user(text), extra_headers={"traceparent": header}
            )
            assert reply.choices[0].message.content in ("one", "two")
        with anyio.fail_after(10):  # no turn left counted in flight
            await gw.gateway.turns_finished()
    turns = [span for span in spans.get_finished_spans() if span.name == "turn"]
    assert [turn.parent for turn in turns] == [None, None]  # traces of their own
    said = [r.getMessage() for r in caplog.records if r.name == "turnplug.serve"]
    assert len(said) == 1, said
    assert "propagator bug" in said[0]
    assert "trace context" in said[0]


async def test_a_clients_baggage_is_not_taken(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a client's ``baggage`` header became the hooks' current baggage (sent on
    by any instrumented HTTP client to the upstreams), and a malformed one made
    OpenTelemetry log a warning per entry."""
    from opentelemetry import baggage

    seen: list[dict[str, object]] = []

    async def peek(turn: Turn) -> Any:
        seen.append(dict(baggage.get_all()))
        return cont(turn)

    trace_id, span_id, header = client_span()
    pipe = Pipeline(model=ScriptedModel(["one", "two"]), pre=[peek])
    async with served(pipe, otel=True) as gw:
        for sent in ("user=alice,tenant=other", ",".join(["noequals"] * 50)):
            await gw.sdk().chat.completions.create(
                model="m",
                messages=user("hi"),
                extra_headers={"traceparent": header, "baggage": sent},
            )
    assert seen == [{}, {}]
    for turn in [span for span in spans.get_finished_spans() if span.name == "turn"]:
        assert turn.parent is not None
        assert (turn.context.trace_id, turn.parent.span_id) == (trace_id, span_id)
    assert [r for r in caplog.records if r.name.startswith("opentelemetry")] == []


class JaegerBaggage:
    """A propagator reading baggage from ``uberctx-*`` headers, as Jaeger's does."""

    fields: ClassVar[set[str]] = set()

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        from opentelemetry import baggage
        from opentelemetry.propagators.textmap import default_getter

        for key in default_getter.keys(carrier):
            if key.startswith("uberctx-"):
                value = default_getter.get(carrier, key)
                context = baggage.set_baggage(key[len("uberctx-") :], value[0], context)
        return context

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        pass


@pytest.fixture
def jaeger_baggage() -> Iterator[None]:
    from opentelemetry import propagate
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    kept = propagate.get_global_textmap()
    both = [TraceContextTextMapPropagator(), JaegerBaggage()]
    propagate.set_global_textmap(CompositePropagator(both))  # type: ignore[list-item]
    yield
    propagate.set_global_textmap(kept)


async def test_a_clients_baggage_in_any_format_is_not_taken(
    spans: InMemorySpanExporter, jaeger_baggage: None
) -> None:
    """Bug caught: only the W3C ``baggage`` header was kept from the propagator, so a
    propagator reading baggage from headers of its own (Jaeger's ``uberctx-*``) made the
    client's key-value pairs the hooks' baggage."""
    from opentelemetry import baggage

    seen: list[dict[str, object]] = []

    async def peek(turn: Turn) -> Any:
        seen.append(dict(baggage.get_all()))
        return cont(turn)

    trace_id, span_id, header = client_span()
    pipe = Pipeline(model=ScriptedModel(["one"]), pre=[peek])
    async with served(pipe, otel=True) as gw:
        await gw.sdk().chat.completions.create(
            model="m",
            messages=user("hi"),
            extra_headers={"traceparent": header, "uberctx-tenant": "other"},
        )
    assert seen == [{}]
    (turn,) = [span for span in spans.get_finished_spans() if span.name == "turn"]
    assert turn.parent is not None
    assert (turn.context.trace_id, turn.parent.span_id) == (trace_id, span_id)


async def test_the_baggage_current_where_the_gateway_serves_is_kept(
    spans: InMemorySpanExporter,
) -> None:
    """Bug caught: the context read from a request's headers replaced the baggage of the
    application serving the gateway, which its hooks no longer saw."""
    from opentelemetry import baggage, context

    seen: list[dict[str, object]] = []

    async def peek(turn: Turn) -> Any:
        seen.append(dict(baggage.get_all()))
        return cont(turn)

    pipe = Pipeline(model=ScriptedModel(["one"]), pre=[peek])
    token = context.attach(baggage.set_baggage("deployment", "eu-1"))
    try:
        async with served(pipe, otel=True) as gw:
            await gw.sdk().chat.completions.create(
                model="m",
                messages=user("hi"),
                extra_headers={"traceparent": client_span()[2], "baggage": "deployment=other"},
            )
    finally:
        context.detach(token)
    assert seen == [{"deployment": "eu-1"}]


async def test_a_span_already_current_is_kept(spans: InMemorySpanExporter) -> None:
    """Bug caught: the client's ``traceparent`` replacing the span current where the gateway
    serves (an application's, an ASGI instrumentation's server span), which cut the turn out
    of it."""
    from opentelemetry import trace

    app_trace, app_span, _ = client_span()
    _, _, header = client_span()
    current = trace.NonRecordingSpan(
        trace.SpanContext(app_trace, app_span, False, trace.TraceFlags(trace.TraceFlags.SAMPLED))
    )
    with trace.use_span(current):
        async with served(pipeline(["one"]), otel=True) as gw:
            await gw.sdk().chat.completions.create(
                model="m", messages=user("hi"), extra_headers={"traceparent": header}
            )
    (turn,) = [span for span in spans.get_finished_spans() if span.name == "turn"]
    assert turn.parent is not None
    assert (turn.context.trace_id, turn.parent.span_id) == (app_trace, app_span)


def test_without_a_tracer_provider_the_command_says_no_turn_is_traced(tmp_path: Path) -> None:
    """Bug caught: ``--otel`` with no tracer provider set (not under
    opentelemetry-instrument, none set by a hook module) serving untraced without a word."""
    with serving([str(SCRIPT)], write_config(tmp_path)) as (process, _, said):
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert "--otel: no OpenTelemetry tracer provider is set, so no turn is traced" in said


def test_a_hook_module_instrumenting_with_no_provider_set_gets_the_note(tmp_path: Path) -> None:
    """Bug caught: a hook module that called ``otel.instrument()`` (the global provider) with
    no provider set made ``--otel`` skip its note, though no turn was traced."""
    (tmp_path / "plain_hooks.py").write_text(
        "from pipeline import cont, otel\notel.instrument()\n\n\n"
        "def pre(turn):\n    return cont(turn)\n"
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[pre]]\nkind = "python"\nref = "plain_hooks:pre"\n')
    with serving([str(SCRIPT)], config) as (process, _, said):
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert "--otel: no OpenTelemetry tracer provider is set, so no turn is traced" in said


def test_a_hook_modules_own_instrumentation_is_kept(tmp_path: Path) -> None:
    """Bug caught: ``--otel`` replaced the instrumentation a hook module set up itself
    (``otel.instrument(tracer_provider=..., capture_content=True)``) with the global
    provider's, which had none: no turn traced, and a note saying so."""
    (tmp_path / "own_hooks.py").write_text(
        textwrap.dedent(
            """
            import sys
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
            from pipeline import cont, otel

            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
            otel.instrument(tracer_provider=provider, capture_content=True)

            def pre(turn):
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[pre]]\nkind = "python"\nref = "own_hooks:pre"\n')
    trace_id, span_id, header = client_span()
    with serving([str(SCRIPT)], config) as (process, url, said):
        sdk_call(url, "hi", header)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "no OpenTelemetry tracer provider" not in said
    turn = exported_turn(out, trace_id)
    assert f'"parent_id": "0x{span_id:016x}"' in turn  # the client's trace, joined
    assert "gen_ai.output.messages" in turn  # the hook module's content capture
