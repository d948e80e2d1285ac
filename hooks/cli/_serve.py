"""`turnplug serve`: a config's pipeline as an OpenAI-compatible HTTP gateway.

The gateway (`_gateway.Gateway`, a Starlette application) is served by Hypercorn's asyncio
worker by default, or its trio worker with ``--loop trio``: Starlette and the runtime run on
either through AnyIO (docs/serve.md says why this stack and this default). SIGTERM (or
Ctrl-C) refuses new turns (503 ``shutting_down``), lets the turns in flight finish, then
stops listening and lets the sessions of answered conversation turns close (their
background hooks), all within the drain timeout, and exits 0; what does not stop when
cancelled (a shielded hook) is left to a hard stop shortly after, which exits 1. A turn that raises
KeyboardInterrupt or SystemExit (a hook calling ``sys.exit()``) is answered 503 and stops the
gateway the same way; the command then exits as ``turnplug run`` does for it (130, or 1).
"""

import argparse
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal, TextIO, final

import anyio
import attrs
from anyio.abc import TaskStatus
from hypercorn.config import Config as HypercornConfig

from pipeline import ConfigError, Pipeline
from pipeline.logs import Log, PostgresLog, SQLiteLog

from .._terminal import one_line, printable
from ._failed import failed, single
from ._gateway import (
    MIB,
    Gateway,
    Settings,
    flush_traces,
    instrument_turns,
    request_id,
    scrub_secrets,
)
from ._logs import POSTGRES_SCHEMES

DEFAULT_KEY_ENV = "TURNPLUG_GATEWAY_KEY"


@final
@attrs.frozen(kw_only=True)
class Options:
    """What `turnplug serve` was asked for (its command-line options)."""

    host: str = "127.0.0.1"
    port: int = 8000
    log: str | None = None
    api_key: str | None = None
    max_body: int = MIB
    turn_timeout: float = 300.0
    drain_timeout: float = 30.0
    loop: Literal["asyncio", "trio"] = "asyncio"
    otel: bool = False


LOOPS = ("asyncio", "trio")
DEFAULT_LOOP = "asyncio"
CUT_SECONDS = 2.0
"""How long the turns stopped at the drain timeout have to send their 503 before the server
closes their connections."""
CLOSE_SECONDS = 5.0
"""How long after the drain timeout the server has to close its connections before it is
cancelled."""
HARD_STOP_SECONDS = CLOSE_SECONDS + CUT_SECONDS
"""How long after the drain timeout the command exits (status 1) whatever still runs: a hook
that cannot be cancelled (a sync hook's worker thread, an async hook that shields itself)."""


def gateway_key(no_auth: bool, variable: str, environ: dict[str, str] | Any) -> str | None:
    """The key clients must send, from `variable`; None with ``--no-auth``.

    Surrounding whitespace (a secret file's trailing newline) is not part of the key: a
    client's ``Authorization`` header cannot carry it, so with it no client could ever be
    let in.

    Raises:
        ConfigError: No key and no ``--no-auth``: the gateway refuses to start open. Or a
            key with characters a header cannot carry (named by its variable, not shown);
            spaces inside it are carried.
    """
    if no_auth:
        return None
    key = str(environ.get(variable, "")).strip()
    if not key:
        raise ConfigError(
            f"the gateway needs a key: set {variable} to the bearer key clients must send (or"
            " name another variable with --api-key-env NAME), or pass --no-auth to serve"
            " without authentication on a trusted network"
        )
    # A space inside is carried (``Bearer correct horse``): the token is all after the first.
    if not all(" " <= char <= "~" for char in key):
        raise ConfigError(
            f"the gateway key in {variable} contains characters an HTTP header cannot carry"
            " (control characters or non-ASCII), so no client could send it; it is not shown"
            " here — check the secret for a stray character"
        )
    return key


@asynccontextmanager
async def _open_log(where: str | None) -> AsyncIterator[Log | None]:
    if where is None:
        yield None
        return
    log: SQLiteLog | PostgresLog = (
        PostgresLog(where) if where.startswith(POSTGRES_SCHEMES) else SQLiteLog(where)
    )
    async with log:
        yield log


def listen(host: str, port: int) -> tuple[socket.socket, str]:
    """A listening TCP socket on `host`:`port` (0 picks a free port), and its URL."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"http://{shown}:{bound}"


class Unstopped(RuntimeError):
    """The server could not stop: a turn did not end when cancelled (a hook that does not
    stop when cancelled: a sync hook in a worker thread, an async hook that shields itself)."""


async def serve_app(
    app: Any,
    sock: socket.socket,
    *,
    loop: str,
    drain_timeout: float,
    shutdown: Callable[[], Awaitable[Any]],
) -> None:
    """Serve the ASGI `app` on the listening `sock` with Hypercorn's worker for `loop`, the
    running loop (``"trio"`` or ``"asyncio"``), until `shutdown` returns, then drain.

    Hypercorn takes the socket over (it is closed when serving ends).
    """
    config = HypercornConfig()
    config.bind = [f"fd://{sock.detach()}"]
    config.graceful_timeout = drain_timeout
    config.accesslog = None
    config.errorlog = None
    # One client may stream for as long as its turn takes.
    config.keep_alive_timeout = 75
    if loop == "trio":
        from hypercorn.trio import serve as trio_serve

        await trio_serve(app, config, shutdown_trigger=shutdown)
    else:
        import asyncio

        from hypercorn.asyncio import serve as asyncio_serve

        try:
            await asyncio_serve(app, config, shutdown_trigger=shutdown)
        except asyncio.InvalidStateError as exc:
            # Hypercorn asks its connections' tasks for their exception once it stops
            # waiting for them (past the graceful timeout, or cancelled), where one whose
            # turn would not stop has none yet; its own shutdown is left undone.
            raise Unstopped("the server's connections did not close") from exc


async def serve(
    pipe: Pipeline,
    options: Options,
    *,
    model: str,
    secrets: tuple[str, ...],
    say: Callable[[str], None],
    hard_stop: Callable[[float, Callable[[], str]], None] | None = None,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `pipe` until SIGTERM or SIGINT, then drain and return.

    The pipeline is held (``async with pipe``) for the server's whole life, so every turn
    reuses the provider's pooled connections instead of opening a client per request.

    `hard_stop(seconds, left)`, called at the signal, ends the process that many seconds
    later if it still runs then (`left()` says what was left, and why it may not stop).
    """
    ending: list[str] = []  # what is being closed once the gateway stopped

    def left() -> str:
        if ending:
            # Nothing of the gateway's runs any more: its sessions ended with `running`.
            return (
                f"{ending[-1]}, after the gateway stopped — it took longer than the time"
                " left (an MCP server slow to exit, a log slow to close)"
            )
        return gateway.left()

    async with (
        _closed_as(_open_log(options.log), ending, "closing the conversation log") as log,
        _closed_as(pipe, ending, "closing the pipeline (its MCP servers, its model's client)"),
    ):
        gateway = Gateway(
            pipe,
            Settings(
                model=model,
                api_key=options.api_key,
                log=log,
                max_body=options.max_body,
                turn_timeout=options.turn_timeout,
                secrets=secrets,
                otel=options.otel,
            ),
        )
        sock, address = listen(options.host, options.port)
        stopping = anyio.Event()  # the signal came, or a turn's interrupt
        closing = anyio.Event()  # the server stops listening and closes idle connections
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

            def stop(why: str) -> None:
                if stopping.is_set():
                    return
                gateway.shut_down()
                say(
                    f"turnplug serve: {why}: new turns get 503; finishing"
                    f" {gateway.finishing} turns in flight and {gateway.closing} closing"
                    f" sessions (up to {options.drain_timeout:g} s)"
                )
                stopping.set()

            async def on_signal() -> None:
                async for signum in signals:
                    stop(signal.Signals(signum).name)
                    return

            async def on_interrupt() -> None:
                # A turn's KeyboardInterrupt or SystemExit stops the gateway as a signal
                # does; `gateway.running` raises it once the server stopped.
                stop(f"a turn raised {raised(await gateway.interrupted())}")

            async def until_stopped(scope: anyio.CancelScope) -> None:
                with scope:
                    async with anyio.create_task_group() as watching:
                        watching.start_soon(on_signal)
                        watching.start_soon(on_interrupt)

            async def serving() -> None:
                try:
                    await serve_app(
                        gateway.app,
                        sock,
                        loop=options.loop,
                        drain_timeout=options.drain_timeout,
                        shutdown=closing.wait,
                    )
                except Unstopped:
                    if hard_stop is None:
                        raise
                    hard_stop(0.0, left)  # does not return

            watchers = anyio.CancelScope()
            async with gateway.running():
                async with anyio.create_task_group() as group:
                    group.start_soon(until_stopped, watchers)
                    group.start_soon(serving)
                    offline = (
                        " — the offline scripted model, no provider is called"
                        if model == "scripted"
                        else ""
                    )
                    say(
                        f"turnplug serve: listening on {address} (model {model}{offline};"
                        f" {options.loop})"
                    )
                    say(f"turnplug serve: live page {address}/ ; API {address}/v1")
                    task_status.started(address)
                    await stopping.wait()
                    watchers.cancel()  # the other one's stop would not come
                    if hard_stop is not None:
                        hard_stop(options.drain_timeout + HARD_STOP_SECONDS, left)
                    deadline = anyio.current_time() + options.drain_timeout
                    # Still listening, so that a request sent meanwhile gets a 503 rather
                    # than a refused connection, until the turns in flight are done.
                    with anyio.move_on_after(options.drain_timeout):
                        await gateway.turns_finished()
                    if gateway.in_flight:
                        # Past the drain timeout: the turns left are stopped and answered
                        # 503 shutting_down by the gateway, not cut by the server.
                        gateway.cut_turns()
                        with anyio.move_on_after(CUT_SECONDS):
                            await gateway.turns_finished()
                    # Pages watching the feed would hold the server to its timeout.
                    gateway.feed.close()
                    closing.set()
                    # serve_app returns once the connections are drained; then stop.
                    group.cancel_scope.deadline = deadline + CLOSE_SECONDS
                # The answered turns' sessions may still be committing the output of
                # background hooks: they share the drain timeout; what is left is cancelled.
                if not await gateway.drain(max(0.0, deadline - anyio.current_time())):
                    say(
                        "turnplug serve: sessions still closing at the drain timeout were"
                        " cancelled; their background hooks' output was not committed"
                    )
            say("turnplug serve: stopped")


@asynccontextmanager
async def _closed_as(resource: Any, closing: list[str], what: str) -> AsyncIterator[Any]:
    """``async with resource``, `what` added to `closing` as it starts to close."""
    async with resource as value:
        try:
            yield value
        finally:
            closing.append(what)


def raised(interrupt: BaseException) -> str:
    """How the command names an interrupt a turn raised: ``sys.exit(3)``, ``KeyboardInterrupt``."""
    if isinstance(interrupt, SystemExit):
        return f"sys.exit({interrupt.code!r})"
    return type(interrupt).__name__


def run(args: Any, loaded: Any) -> int:
    """The ``serve`` subcommand (called by `hooks.cli._main` with the loaded config)."""
    key = gateway_key(args.no_auth, args.api_key_env, os.environ)
    spec = loaded.config.model
    # A provider's model by its name, a model of your own by the function that builds it:
    # only a config without one (or `provider = "scripted"`) is the offline scripted model.
    ref = getattr(spec, "ref", None)
    model = str(getattr(spec, "name", None) or (ref.text if ref is not None else "scripted"))
    upstream_env = getattr(spec, "api_key_env", "") or ""
    upstream_key = os.environ.get(upstream_env) if upstream_env else None
    if key is not None and upstream_key is not None and key == upstream_key.strip():
        # Clients send the gateway key: were it the upstream key, every client would hold
        # the key the gateway exists to keep from them.
        raise ConfigError(
            f"the gateway key ({args.api_key_env}) is the upstream model's key ({upstream_env}):"
            " clients send the gateway key, and must never hold the upstream one — give the"
            f" gateway a key of its own in {args.api_key_env} (--api-key-env names the"
            " variable of the key clients send, not the upstream's)"
        )
    secrets = tuple(s for s in (upstream_key, key) if s)
    log_to_stderr(secrets)
    if args.no_auth:
        _say("turnplug serve: note: --no-auth: anyone who can reach this address may use it")
    options = Options(
        host=args.host,
        port=args.port,
        log=args.log,
        api_key=key,
        max_body=args.max_body,
        turn_timeout=args.turn_timeout,
        drain_timeout=args.drain_timeout,
        loop=args.loop,
        otel=args.otel,
    )
    uninstrument = None
    if args.otel:
        uninstrument, provided = instrument_turns()
        if not provided:
            _say(
                "turnplug serve: note: --otel: no OpenTelemetry tracer provider is set, so no"
                " turn is traced (run under opentelemetry-instrument, or set one in a hook"
                " module); see docs/observability.md"
            )
    tune_gc()
    timers: list[threading.Timer] = []

    def hard_stop(seconds: float, left: Callable[[], str]) -> None:
        timers.append(_exit_after(seconds, left))

    try:
        anyio.run(
            partial(
                serve,
                loaded.pipeline,
                options,
                model=model,
                secrets=secrets,
                say=_say,
                hard_stop=hard_stop,
            ),
            backend=options.loop,
        )
    except BaseException as exc:
        # A turn's interrupt: said as `turnplug` says it, with its status, where the
        # interpreter would wait for the abandoned threads once the command returned.
        left = _abandoned_threads()
        if left:
            status = failed(args, single(exc))
            if status is None:  # --debug: the traceback
                traceback.print_exception(exc)
            _leave_threads(1 if status is None else status, left)
        raise
    finally:
        # Serving ended: a command embedded in a program of its own must not end it later.
        for timer in timers:
            timer.cancel()
        if uninstrument is not None:
            uninstrument()
    left = _abandoned_threads()
    if left:
        _leave_threads(0, left)
    return 0


WORKER_THREAD = "AnyIO worker thread"
"""The name of the worker threads sync hooks run in on asyncio (anyio's, not daemon threads:
the interpreter waits for them at exit; trio's are daemon threads)."""


def _abandoned_threads(wait: float = 1.0) -> list[threading.Thread]:
    """The worker threads still running hooks once the loop has ended: a sync hook's the
    gateway abandoned (the turn or drain timeout cut it) or a hook's timeout did. Idle ones,
    stopping, are given `wait` seconds."""
    end = time.monotonic() + wait
    workers = [t for t in threading.enumerate() if t.name == WORKER_THREAD and not t.daemon]
    for thread in workers:
        thread.join(max(0.0, end - time.monotonic()))
    return [t for t in workers if t.is_alive()]


def _leave_threads(status: int, left: list[threading.Thread]) -> None:
    """Exit with `status` without waiting for `left`, worker threads still running hooks
    that a timeout cut (`_abandoned_threads`).

    A thread cannot be interrupted: the interpreter would wait for such a thread at exit,
    for as long as its hook runs. Other threads (a config's own) are waited for first, as
    the interpreter would.
    """
    others = [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.daemon and t.name != WORKER_THREAD
    ]
    for thread in others:
        thread.join()
    _say(
        f"turnplug serve: not waiting for {len(left)} worker threads still running hooks"
        " cancelled at their timeout or the drain timeout"
    )
    _exit_now(status)


def _exit_after(seconds: float, left: Callable[[], str]) -> threading.Timer:
    """End the process with status 1 in `seconds` unless it has exited by then (or the
    timer returned is cancelled).

    The drain cancels what runs past its timeout, but a hook may not stop when cancelled: a
    sync hook's worker thread cannot be interrupted, an async hook may shield itself. The
    loop would wait for it, and the interpreter waits for a worker thread at exit; a server
    being stopped must stop, so a timer thread, which needs neither, ends the process.
    """

    def stop() -> None:
        _claim_exit()  # the timer firing while the command exits already says nothing
        # Whatever saying it raises (a stderr whose reader went away), the process ends.
        try:
            _say(
                f"turnplug serve: error: still running past the drain timeout: {left()};"
                " exiting without waiting for it"
            )
        finally:
            _exit_now(1)

    if seconds <= 0:
        stop()
    timer = threading.Timer(seconds, stop)
    timer.daemon = True  # a process that exits by itself does not wait for it
    timer.start()
    return timer


def _exit_now(status: int) -> None:
    """End the process at once with `status`, what was written on stdout and stderr and
    through the logging handlers flushed first (`os._exit` flushes nothing, and skips the
    handlers registered with `atexit`, where the tracer provider sends its pending spans:
    they are sent here, for up to `FLUSH_SECONDS`, and left if the exporter takes longer).

    Only one thread exits: another calling it meanwhile (the hard stop's timer firing while
    the spans are sent) waits for that exit.
    """
    _claim_exit()
    try:
        # The spans of the turns answered, which a batch span processor may still hold.
        with contextlib.suppress(Exception):
            flush_traces(FLUSH_SECONDS)
        streams = [*logging.getLogger().handlers, *logging.getLogger("turnplug").handlers]
        for stream in (*streams, sys.stdout, sys.stderr):
            # One that cannot flush (closed, or None without a console): exiting matters more.
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
    finally:
        # Even when a Ctrl-C lands while the spans are sent: this exit must happen.
        os._exit(status)


_EXITING = threading.RLock()
"""Held by the thread that ends the process (`_claim_exit`), and never released."""


def _claim_exit() -> None:
    """Make this thread the one that ends the process; in any other thread, wait for that
    end (never return): a second exit would say and flush everything again."""
    _EXITING.acquire()


FLUSH_SECONDS = 2.0
"""How long an exit that skips `atexit` gives the tracer provider to send its spans."""


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""How `turnplug serve` writes the library's warnings on stderr: time, level, logger, text."""
REQUEST_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
"""`LOG_FORMAT` for a record written while a request was served: it names the request, by
the id its response carried (``x-request-id``)."""


@final
class _StderrHandler(logging.StreamHandler[TextIO]):
    """The handler `log_to_stderr` puts on the ``turnplug`` logger (found again by type)."""


CONTINUED = "  | "
"""What starts each line of a warning's traceback on serve's stderr (docs/serve.md)."""


@final
class _Scrubbed(logging.Formatter):
    """`LOG_FORMAT`, with every secret in the whole line (traceback included) replaced.

    The message quotes what hooks, tools, MCP servers and clients wrote (an exception's
    text): it is one line, its control characters escaped, so that it can neither pass for
    a line of its own nor send the terminal a sequence to act on; a traceback keeps its
    lines, with the same characters escaped, each after `CONTINUED`: the exception's text
    it repeats cannot start a line as a record does either.
    """

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__(LOG_FORMAT)
        self.secrets = tuple(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        # The message is one line: every line after it is the traceback's (or the stack's).
        first, *rest = super().format(record).split("\n")
        text = "\n".join([first, *(CONTINUED + line for line in rest)])
        return scrub_secrets(text, self.secrets)

    def formatMessage(self, record: logging.LogRecord) -> str:
        named = request_id()
        if named is None:
            return one_line(super().formatMessage(record))
        # A gateway's line names its turn by the same id (the records say it for whoever
        # else handles them): said once here, before the message.
        message = record.message.replace(f"turn {named}", "the turn")
        fields = {**record.__dict__, "request_id": named, "message": message}
        return one_line(REQUEST_LOG_FORMAT % fields)

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info))


def log_to_stderr(secrets: tuple[str, ...], stream: TextIO | None = None) -> logging.Handler:
    """Write the ``turnplug`` loggers' warnings (and worse) to stderr, for the command line.

    The library only has a `logging.NullHandler` (an application decides where its records
    go); a gateway run as ``turnplug serve`` is its own application, so its operator sees
    hooks failing open, retries and background failures on stderr, each line with its time,
    level and logger, and `secrets` (the upstream and gateway keys) replaced with
    ``[REDACTED]``. The ``turnplug`` records stop at this handler (no propagation), so a root
    handler that a hook module configured does not print them a second time; the root
    logger is not touched. Calling it again replaces the handler rather than adding one.
    """
    logger = logging.getLogger("turnplug")
    for old in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(old)
    handler = _StderrHandler(stream if stream is not None else sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_Scrubbed(secrets))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    logger.propagate = False
    return handler


GC_THRESHOLDS = (50_000, 20, 10)
"""The collector's thresholds in a gateway process (Python's defaults: 700, 10, 10)."""


def tune_gc() -> None:
    """Make the cyclic garbage collector rare in the gateway process (docs/serve.md).

    Everything alive once the config is loaded (modules, the pipeline) lives as long as the
    process: `gc.freeze` keeps it out of every collection. With hundreds of turns in
    flight, the default thresholds collected the young objects of those turns ~20 times a
    second and all of them every few seconds (a pause of ~0.3 s for every stream); nearly
    all of a turn's garbage is freed by reference counting anyway, so collecting after
    50,000 net allocations instead loses nothing but the pauses.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


EXAMPLE = """\
example:
  export TURNPLUG_GATEWAY_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe())')
  turnplug serve assistant.toml --port 8000 --log conversations.db

  then point any OpenAI client at it:
    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY)
    client.chat.completions.create(model="gateway", messages=[{"role": "user", "content": "hi"}])

  and open http://127.0.0.1:8000/ to watch the turns. See docs/serve.md.
"""


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        if not value > 0:  # NaN too: it passes `<= 0`, then fails every turn's deadline
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _port(text: str) -> int:
    # Checked here, as the other options are: a port out of range would otherwise reach the
    # socket as an OverflowError, after the config was loaded.
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected a port from 0 to 65535 (0 picks a free one), got {text!r}"
        )
    return value


def add_parser(
    commands: Any, common: argparse.ArgumentParser, *, handler: Callable[..., int]
) -> None:
    """The ``serve`` subcommand's options, registered on the ``turnplug`` parser."""
    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve a config's pipeline as an OpenAI-compatible API, with a live page",
        description="Serve CONFIG's pipeline as an OpenAI-compatible HTTP API: POST"
        " /v1/chat/completions (streaming and not), GET /v1/models, GET /healthz, and a live"
        " page of turn timelines at /. Each request is one turn; clients send the bearer key"
        f" from {DEFAULT_KEY_ENV} unless --no-auth.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("config", metavar="CONFIG", help="a .toml or .json pipeline config")
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=_port, default=8000, help="the port (default: 8000; 0 picks a free one)"
    )
    serve.add_argument(
        "--log",
        metavar="PATH_OR_DSN",
        help="the conversation log for requests with an X-Conversation-Id header: an SQLite"
        " file or a postgresql:// DSN (several gateways may share one PostgreSQL log)",
    )
    serve.add_argument(
        "--no-auth", action="store_true", help="serve without a key (trusted networks only)"
    )
    serve.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=DEFAULT_KEY_ENV,
        help=f"the environment variable holding the key clients must send (default: {DEFAULT_KEY_ENV})",
    )
    serve.add_argument(
        "--max-body",
        type=_positive(int),
        default=MIB,
        metavar="BYTES",
        help=f"the largest request body accepted (default: {MIB}, 1 MiB); larger gets 413",
    )
    serve.add_argument(
        "--turn-timeout",
        type=_positive(float),
        default=300.0,
        metavar="SECONDS",
        help="the longest one turn may take before the client gets 504 (default: 300)",
    )
    serve.add_argument(
        "--drain-timeout",
        type=_positive(float),
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long turns in flight may take to finish (default: 30)",
    )
    serve.add_argument(
        "--loop",
        choices=LOOPS,
        default=DEFAULT_LOOP,
        help=f"the event loop to serve on (default: {DEFAULT_LOOP}, the faster here; trio"
        " runs the same gateway)",
    )
    serve.add_argument(
        "--otel",
        action="store_true",
        help="trace each turn with OpenTelemetry's global tracer provider (run under"
        " opentelemetry-instrument, with OTEL_* variables), as a child of the client's trace"
        " when the request carries a W3C traceparent header; needs turnplug[otel]",
    )
    serve.set_defaults(handler=handler)
