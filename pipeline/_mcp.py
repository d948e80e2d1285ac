"""MCP toolsets: the tools of a Model Context Protocol server, through the official SDK.

A `Connection` is one server's connection. A task of its owner's task group keeps it: that
task enters the SDK's transport and `ClientSession` (async context managers that must be
entered and exited by one task), initializes, lists the tools, and then waits until the
connection is closed; the turns' tool calls go through the session from their own tasks.
Every wait on the server is bounded by the toolset's ``timeout``: a server that hangs,
crashes or disconnects gives that call a ``tool_error`` naming the server, marks the
connection dead, and the next turn connects again. Closing stops the server process (its
stdin is closed, then its process group terminated and killed: `_stop_server`), also when
the owner is cancelled; a connection closed while it is still starting stops its start
at once instead of waiting for its ``connect_timeout``.

A `KeyboardInterrupt` or `SystemExit` raised in the connection's tasks (the task keeping it,
the session's task handing it what the server wrote) is caught there, as a tool call's is:
it ends the connection, cancels the owner's task group, and is raised by the tasks awaiting
the connection (its opener, a call waiting for an answer, the owner once its group ended),
never left to the loop (asyncio would stop at once) nor lost to a cancellation.

The SDK (extra ``turnplug[mcp]``) is imported when a server is first connected. What the SDK
logs in a connection's tasks goes to the ``turnplug.mcp`` logger, one line with no traceback
(`SDKRecords`): a warning as a warning, anything else (a traceback for a response it could
not parse, say, beside the error the call gets) at DEBUG; what it logs in the application's
own tasks is left alone.
"""

import contextvars
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, TextIO, final

import anyio
import anyio.abc
import attrs

from ._describe import exc_text
from ._errors import ConfigError, ToolsetError
from ._excgroups import interrupt_in
from ._jsontext import escapes_lone_surrogate
from ._tools import Tool, ToolFailure, schema_tool
from ._toolsets import Toolset, _names, check_toolset_name, select, toolset_tool_name
from ._urls import shown_url

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

logger = logging.getLogger("turnplug.mcp")

DEFAULT_TIMEOUT = 30.0
"""Seconds an MCP server gets to answer one call."""
DEFAULT_CONNECT_TIMEOUT = 60.0
"""Seconds an MCP server gets to start, initialize and list its tools (``npx`` may first
download the server)."""

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message a stdio server may send (a line of JSON-RPC), in bytes."""

_STDERR_TAIL = 800
# The label and the url (None for a stdio server) of the connection whose task runs: set in
# its keeper (inherited by the SDK's tasks) and around a call.
_CONNECTION: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "turnplug_mcp_connection", default=None
)
# What the SDK's HTTP transport makes of a refusal (an HTTP error status) whose body holds no
# JSON-RPC error: a stand-in that does not say the status.
_HTTP_STAND_INS = frozenset(("Server returned an error response", "Not Found"))
_STATUS_HINTS = {
    401: " — check the credentials in its headers",
    403: " — check the credentials in its headers",
    404: " — check its url",
}
_SECRET_MIN = 4
_SESSION_HEADER = "mcp-session-id"


def _hidden(values: Mapping[str, str] | None) -> str:
    # Headers and environment values may hold secrets: a repr shows their names only.
    return "None" if values is None else "{" + ", ".join(f"{k!r}: '***'" for k in values) + "}"


def _url_repr(url: object) -> str:
    # A url may hold a password or a key: a repr shows it as messages do.
    return repr(shown_url(url, mark="") if isinstance(url, str) else url)


@final
@attrs.frozen
class MCPToolset(Toolset):
    """The tools of an MCP server, offered as ``<name>_<tool>`` (see `mcp_toolset`).

    Attributes:
        command: The program that runs the server over stdio (with `args`, `env`, `cwd`).
        args: Its arguments.
        env: Environment variables added to the server's (values are never shown).
        cwd: The server's working directory.
        url: The server's streamable HTTP endpoint (instead of a command).
        headers: HTTP headers sent with every request (values are never shown).
        timeout: Seconds the server gets to answer each call.
        connect_timeout: Seconds it gets to start, initialize and list its tools.
        max_message_bytes: The largest message a stdio server may send, in bytes (None:
            `DEFAULT_MAX_MESSAGE_BYTES`).
    """

    command: str | None = attrs.field(default=None, kw_only=True)
    args: tuple[str, ...] = attrs.field(default=(), kw_only=True)
    env: Mapping[str, str] | None = attrs.field(default=None, kw_only=True, repr=_hidden)
    cwd: str | None = attrs.field(default=None, kw_only=True)
    url: str | None = attrs.field(default=None, kw_only=True, repr=_url_repr)
    headers: Mapping[str, str] | None = attrs.field(default=None, kw_only=True, repr=_hidden)
    timeout: float = attrs.field(default=DEFAULT_TIMEOUT, kw_only=True)
    connect_timeout: float = attrs.field(default=DEFAULT_CONNECT_TIMEOUT, kw_only=True)
    max_message_bytes: int | None = attrs.field(default=None, kw_only=True)

    def connection(self) -> "Connection":
        """A new connection to this server, opened by the `Toolbox` that holds it."""
        return Connection(self)

    @property
    def where(self) -> str:
        """How the server is reached, for messages (no secrets: no env, no headers, and of
        the url neither its user and password nor its query, which may hold a key:
        ``https://host/mcp?...``)."""
        if self.command is not None:
            return "`" + " ".join([self.command, *self.args]) + "`"
        return shown_url(str(self.url), mark="")


def _strings(value: Any, what: str, owner: str) -> Mapping[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{owner}: {what} must map names to strings")
    return dict(value)


def _environment(value: Any, owner: str) -> Mapping[str, str] | None:
    """A server's environment variables as a process can be given them: a name that is
    empty or holds ``=`` or a NUL, or a value holding a NUL, is refused naming the variable,
    never showing a value (it may be a secret)."""
    env = _strings(value, "env", owner)
    for name, text in (env or {}).items():
        if not name or "=" in name or "\x00" in name:
            raise ConfigError(f"{owner}: env has {name!r}, which is no environment variable name")
        if "\x00" in text:
            raise ConfigError(
                f"{owner}: the value of env {name!r} holds a NUL character, which a process"
                " cannot be given"
            )
    return env


# RFC 9110: a field name is a token; a value is visible ASCII, spaces and tabs (a line
# break or another control character would end the header, or start another).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def _headers(value: Any, owner: str) -> Mapping[str, str] | None:
    """HTTP headers as they can be sent: surrounding whitespace (a secret file's trailing
    newline) dropped, as HTTP ignores it; a name or a value a header cannot carry refused
    now, naming the header but never showing a value (the HTTP client's own error, at the
    first request, quoted the whole value, secret included). Every bad header is a problem
    at ``headers`` of the `ConfigError`, for a config to place."""
    headers = _strings(value, "headers", owner)
    if headers is None:
        return None
    problems: list[str] = []
    sent: dict[str, str] = {}
    for name, text in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            problems.append(
                f"{name!r} is not an HTTP header name: letters, digits and"
                ' !#$%&\'*+-.^_`|~ only, no spaces (e.g. "Authorization")'
            )
        sent[name] = text.strip(" \t\r\n")
        if not _HEADER_VALUE.fullmatch(sent[name]):
            problems.append(
                f"the value of {name!r} contains characters an HTTP header cannot carry (a line"
                " break, another control character, or non-ASCII); it is not shown here —"
                " check where it comes from (a secret, an environment variable)"
            )
    if problems:
        raise ConfigError(
            f"{owner}: headers: " + "; ".join(problems),
            problems=tuple(("headers", problem) for problem in problems),
        )
    return sent


def mcp_toolset(
    name: str,
    *,
    command: str | None = None,
    args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    max_message_bytes: int | None = None,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> MCPToolset:
    """An MCP server's tools as a toolset: the model calls them ``<name>_<tool>``.

    Give `command` (a server started as a subprocess, spoken to over stdio) or `url` (a
    streamable HTTP endpoint). The server is connected when the pipeline's toolsets are
    opened (``async with pipe``, a session, or a turn outside both) and its tools listed
    once per connection; `include` / `exclude` filter them by their own names.

    Args:
        name: The toolset's name, the prefix of its tools' names.
        command: The server's program (with `args`, `env` added to a minimal environment,
            and `cwd`).
        args: The program's arguments.
        env: Environment variables for the server (never shown in reprs or messages).
        cwd: The server's working directory.
        url: The server's streamable HTTP endpoint.
        headers: HTTP headers for every request, such as an authorization (never shown);
            each value is sent without its surrounding whitespace.
        timeout: Seconds for each call; a call still unanswered then is a ``tool_error``.
        connect_timeout: Seconds for starting the server, initializing and listing.
        max_message_bytes: The largest message (a call's result, say) a stdio server may
            send, 16 MiB when None: a larger one fails its call with a ``tool_error`` saying
            its size, as soon as that much has arrived, and the server is connected again on
            the next turn.
        include: Only these tools.
        exclude: Not these tools.

    Raises:
        ConfigError: Neither or both of `command` and `url`, options of the other
            transport, a bad timeout or max_message_bytes, a header name or value HTTP
            cannot carry (each such header is in ``.problems`` at ``headers``; no value is
            shown), or the ``mcp`` package missing.
    """
    owner = f"mcp_toolset({name!r})"
    check_toolset_name(name, owner)
    if (command is None) == (url is None):
        raise ConfigError(
            f"{owner}: give command (a server run as a subprocess) or url (a streamable HTTP"
            " server), exactly one of them"
        )
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"{owner}: command must be a program's name or path, got {command!r}")
        if headers is not None:
            raise ConfigError(f"{owner}: headers are for a url; a command gets env instead")
    if isinstance(args, str) or not isinstance(args, Iterable):
        raise ConfigError(f"{owner}: args must be a list of strings, got {args!r}")
    args = tuple(args)  # read once: a generator would be empty the second time
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"{owner}: url must start with http:// or https://, got {_url_repr(url)}"
            )
        if args or env is not None or cwd is not None or max_message_bytes is not None:
            raise ConfigError(
                f"{owner}: args, env, cwd and max_message_bytes are for a command, not a url"
            )
    if not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{owner}: args must be a list of strings, got {list(args)!r}")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{owner}: cwd must be a directory's path, got {cwd!r}")
    # What the operating system cannot pass to a process: refused here, not as Python's
    # "embedded null byte" when the server is started.
    for what, text in (
        ("command", command),
        ("cwd", cwd),
        *((f"args[{i}]", arg) for i, arg in enumerate(args)),
    ):
        if isinstance(text, str) and "\x00" in text:
            raise ConfigError(
                f"{owner}: {what} holds a NUL character, which a process cannot be given"
            )
    for key, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout)):
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ConfigError(
                f"{owner}: {key} must be a positive number of seconds, got {seconds!r}"
            )
    if max_message_bytes is not None and (
        isinstance(max_message_bytes, bool)
        or not isinstance(max_message_bytes, int)
        or max_message_bytes <= 0
    ):
        raise ConfigError(
            f"{owner}: max_message_bytes must be a positive number of bytes, got"
            f" {max_message_bytes!r}"
        )
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{owner}: MCP toolsets need the mcp package — pip install 'turnplug[mcp]'"
        ) from None
    return MCPToolset(
        name,
        include=_names(include, "include", owner),
        exclude=_names(exclude, "exclude", owner),
        command=command,
        args=args,
        env=_environment(env, owner),
        cwd=cwd,
        url=url,
        headers=_headers(headers, owner),
        timeout=float(timeout),
        connect_timeout=float(connect_timeout),
        max_message_bytes=max_message_bytes,
    )


# -- results ----------------------------------------------------------------------------------


def render_result(result: Any) -> str:
    """A `CallToolResult` as the model reads it.

    Text blocks are joined with newlines; structured content is JSON-encoded when the server
    sent no text (the protocol asks servers that return structured content to send it as
    text too, so the text is what the model reads); an image, an audio clip, a resource or a
    link is described by a line in brackets, never dropped.
    """
    parts: list[str] = []
    texts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", type(block).__name__)
        if kind == "text":
            texts.append(block.text)
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4
            parts.append(f"[{kind}: {block.mime_type}, about {size} bytes, not shown]")
        elif kind == "resource":
            resource = block.resource
            mime = f", {resource.mime_type}" if resource.mime_type else ""
            text = getattr(resource, "text", None)
            if text is not None:
                parts.append(f"[resource {resource.uri}{mime}]\n{text}")
            else:
                size = len(resource.blob) * 3 // 4
                parts.append(f"[resource {resource.uri}{mime}: about {size} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}: {block.name}]")
        else:
            parts.append(f"[{kind} content, not shown]")
    structured = result.structured_content
    if structured is not None and not texts:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _validator(
    schema: Mapping[str, Any],
) -> tuple[Callable[[Any], list[str]], Callable[[Any], str | None]]:
    """What is wrong with arguments for a tool of this input schema (jsonschema), and why
    the schema itself cannot check them (None when it can).

    A schema can be well-formed and still fail while it checks a value (a ``$ref`` that
    points nowhere): that is the server's fault, not the arguments', so `problems` lists
    only what it found before the failure, and the second function names the failure,
    which the call reports as a ``tool_error`` instead of sending unchecked arguments.
    """
    import jsonschema  # type: ignore[import-untyped]

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        validator = cls(schema)
    except Exception:
        # A schema the validator cannot read: the server has the last word on arguments.
        return (lambda value: [] if isinstance(value, dict) else ["expected an object"]), (
            lambda value: None
        )

    def evaluated(value: Any) -> tuple[list[Any], Exception | None]:
        # The errors found in `value`, and what stopped the schema before it finished.
        errors: list[Any] = []
        try:
            errors.extend(validator.iter_errors(value))  # keeps those found before a failure
        except Exception as exc:
            return errors, exc
        return errors, None

    def problems(value: Any) -> list[str]:
        found = []
        for error in sorted(evaluated(value)[0], key=lambda e: list(e.path)):
            path = ".".join(str(p) for p in error.path)
            found.append(f"{path}: {error.message}" if path else error.message)
        return found

    def fault(value: Any) -> str | None:
        failure = evaluated(value)[1]
        if failure is None:
            return None
        text = str(failure) or type(failure).__name__
        return text if len(text) <= 200 else text[:197] + "..."

    return problems, fault


# -- the connection ---------------------------------------------------------------------------


class _Startup(Exception):
    pass


@final
class Connection:
    """One MCP server's connection, kept by a task of its owner's task group."""

    def __init__(self, spec: MCPToolset) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.tools: dict[str, Tool] = {}
        self.raw_names: dict[str, str] = {}
        self.dead = True
        self.error: str | None = None
        self.connects = 0
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        self._stopped.set()
        self._starting = anyio.CancelScope()
        self._ready = anyio.Event()
        self._lock = anyio.Lock()
        self._session_lost = False
        self._http_status: int | None = None
        # The last thing the server wrote that is no JSON-RPC message, and how many so far.
        self._garbage: str | None = None
        self._garbage_count = 0
        # The size of a message from a stdio server over `max_message_bytes`, once one came.
        self._oversized: int | None = None
        # The KeyboardInterrupt or SystemExit that ended the connection, raised by its awaiters.
        self.interrupt: BaseException | None = None
        self._group: anyio.abc.TaskGroup | None = None
        # A stdio server's process while it runs: `abandon` stops it without its loop.
        self._process: anyio.abc.Process | None = None
        # The context of the toolbox's opener (made with it), where the keeper task starts:
        # a turn that reconnects the server would otherwise lend it its own context vars for
        # good (`turnplug serve`'s request id, naming that request in the connection's later
        # warnings).
        self._context = contextvars.copy_context()

    @property
    def label(self) -> str:
        return f"MCP server {self.spec.name!r} ({self.spec.where})"

    def abandon(self) -> None:
        """Stop a stdio server whose loop ended before its connection was closed: SIGTERM its
        process group, the one step of `_stop_server` that needs no loop (nothing else is
        closed, and nothing waits for it to exit; its pipes go with the objects)."""
        process = self._process
        # An exit already seen reaped the process: its pid may belong to another one now.
        if process is not None and process.returncode is None:
            _signal_group(process, kill=False)

    async def open(self, group: anyio.abc.TaskGroup) -> None:
        """Connect, initialize and list the tools; `ToolsetError` when that fails.

        Cancelled while the server is still starting, the start goes on in the owner's task
        group until `close` (or `_halt`) stops it.
        """
        ready = anyio.Event()
        failure: list[str] = []
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        # Created here, before the task runs, so that a close that comes first still stops it.
        self._starting = anyio.CancelScope()
        self._ready = ready
        self._session_lost = False
        self._http_status = None
        self._garbage = None
        self._oversized = None
        self._group = group
        self._context.run(group.start_soon, self._keep, ready, failure, self._starting)
        await ready.wait()
        if self.interrupt is not None:
            raise self.interrupt
        if failure:
            self.fail(failure[0])
            raise ToolsetError(failure[0], toolset=self.spec.name)
        self.dead = False
        self.error = None
        self.connects += 1

    async def reconnect(self, group: anyio.abc.TaskGroup) -> None:
        """Connect again after the connection died; a failure is kept in `error`."""
        async with self._lock:
            if not self.dead:
                return  # another turn reconnected it
            await self._halt()
            try:
                await self.open(group)
            except ToolsetError as error:
                logger.warning("reconnecting failed: %s", error)

    def fail(self, why: str) -> None:
        """Mark the connection dead; its calls fail with `why` until it reconnects."""
        self.dead = True
        self.error = why
        self._stop.set()

    def _interrupted(self, interrupt: BaseException) -> None:
        """Keep `interrupt` for the connection's awaiters, end the connection and cancel the
        owner's task group, as a task of it that raised would."""
        if self.interrupt is None:
            self.interrupt = interrupt
        self.fail(f"it was interrupted ({type(interrupt).__name__})")
        if self._group is not None:
            self._group.cancel_scope.cancel()

    async def close(self) -> None:
        self.error = "the toolsets were closed"
        self.dead = True
        await self._halt()

    async def _halt(self) -> None:
        self._stop.set()
        if not self._ready.is_set():
            # Still starting (it only sees `_stop` once ready): a server that hangs would be
            # waited for until its connect_timeout. Its transport closes all the same (the
            # SDK's stdio shutdown is shielded).
            self._starting.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.spec.connect_timeout + 10):
            await self._stopped.wait()

    async def _keep(
        self, ready: anyio.Event, failure: list[str], starting: anyio.CancelScope
    ) -> None:
        """The task that owns the connection: open it, report, hold it until stopped.

        `starting` is cancelled when the connection is closed before it is ready.
        """
        _CONNECTION.set((self.label, self.spec.url))
        with starting:
            await self._hold(ready, failure)

    async def _hold(self, ready: anyio.Event, failure: list[str]) -> None:
        """Open the connection, report on `ready` (a failure in `failure`), hold it until
        `_stop`."""
        # The server's stderr, kept to explain a failed start (closed in `finally`).
        errlog: TextIO = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", errors="replace"
        )
        stage = "start"
        try:
            async with AsyncExitStack() as stack:
                try:
                    SDKRecords.install()
                    read, write = await self._transport(stack, errlog)
                    from mcp.client.session import ClientSession

                    session = await stack.enter_async_context(
                        ClientSession(read, write, message_handler=self._received)
                    )
                    with anyio.move_on_after(self.spec.connect_timeout) as scope:
                        stage = "initialize"
                        await session.initialize()
                        stage = "tools/list"
                        listed = await _list_tools(session)
                    if scope.cancelled_caught:
                        raise _Startup(
                            f"did not answer {stage} within its connect_timeout of"
                            f" {self.spec.connect_timeout:g} s{self._garbage_note()}"
                        )
                    self._adopt(session, listed)
                except Exception as exc:
                    # Reported before the transport closes: closing it can take long (an
                    # HTTP server that stopped answering), and the opener waits for this.
                    failure.append(self._startup_failure(stage, exc, errlog))
                    ready.set()
                    return
                ready.set()
                await self._stop.wait()
        except Exception as exc:
            # A transport's own task can fail (an HTTP server that cannot be reached): it
            # cancels this body, and its error comes out of the stack, maybe in a group.
            if not ready.is_set():
                failure.append(self._startup_failure(stage, exc, errlog))
            elif failure:
                logger.debug("closing %s after its failed start: %s", self.label, exc_text(exc))
            elif not self._stop.is_set():
                self.fail(f"its connection broke: {exc_text(_leaf(exc))}")
            else:
                # Closing the transport of a server that crashed can fail: nothing is left.
                logger.debug("closing %s: %s", self.label, exc_text(exc))
        except BaseException as exc:
            # A KeyboardInterrupt or SystemExit here or in a task of the SDK's (carried out of
            # its task groups in a group): kept for the awaiters, never out of this task.
            interrupt = interrupt_in(exc)
            if interrupt is None:
                raise
            self._interrupted(interrupt)
        finally:
            self.session = None
            if not ready.is_set() and not failure:
                failure.append(f"{self.label} was stopped while it was being connected")
            errlog.close()
            ready.set()
            self._stopped.set()

    async def _transport(self, stack: AsyncExitStack, errlog: TextIO) -> tuple[Any, Any]:
        spec = self.spec
        if spec.command is not None:
            return await stack.enter_async_context(self._stdio(errlog))
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert spec.url is not None

        async def answered(response: httpx2.Response) -> None:
            # The SDK hands a call only the JSON-RPC error; the status says what it means.
            # Only a call's (a POST's): a server may answer the optional GET stream with 404.
            request = response.request
            if request.method == "POST" and response.status_code >= 400:
                self._http_status = response.status_code
            if (
                response.status_code == 404
                and request.method == "POST"
                and _SESSION_HEADER in request.headers
            ):
                self._session_lost = True

        client = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=dict(spec.headers or {}),
                timeout=httpx2.Timeout(spec.timeout, read=max(spec.timeout, 300.0)),
                event_hooks={"response": [answered, _repairing]},
            )
        )
        read, write = await stack.enter_async_context(
            streamable_http_client(spec.url, http_client=client)
        )
        return read, write

    @asynccontextmanager
    async def _stdio(self, errlog: TextIO) -> AsyncIterator[tuple[Any, Any]]:
        """The server as a subprocess, spoken to over its stdin and stdout.

        What the SDK's `stdio_client` does, on public APIs only (the SDK's transport is
        built on helpers of its own that any 2.x release may change), and with a reader of
        its own: the SDK's joins each chunk of a line to the whole line read so far (a 20 MB
        result took 10 s to read, and a call's timeout ran out meanwhile, reported as no
        answer), holds no bound on a line's size, and once interrupted waits for the server
        to close its stdout. This one keeps a line in one buffer, ends the connection as
        soon as a line passes `max_message_bytes` (then, as once the session is gone, it
        reads and drops what the server still writes: a server left blocked on a full pipe
        would never see its stdin close), and hands a KeyboardInterrupt or SystemExit to the
        connection's awaiters.
        """
        from mcp.shared.message import SessionMessage
        from mcp_types import jsonrpc_message_adapter

        spec = self.spec
        limit = _message_limit(spec)
        process = self._process = await _start_server(spec, errlog)
        stdout, stdin = process.stdout, process.stdin
        assert stdout is not None
        assert stdin is not None
        received, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write, sent = anyio.create_memory_object_stream[SessionMessage](0)

        async def reader() -> None:
            try:
                async with received:
                    await deliver()
                # The session is gone (or the server sent too much): what the server still
                # writes is read and dropped, so that a server blocked writing to a full
                # pipe goes on to see its stdin close and exits, instead of being killed.
                await drain()
            except (KeyboardInterrupt, SystemExit) as exc:
                self._interrupted(exc)

        async def deliver() -> None:
            buffer = bytearray()
            try:
                while True:
                    try:
                        chunk = await stdout.receive()
                    except _ENDED:
                        return
                    scanned = len(buffer)
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", scanned)) >= 0:
                        if end - start > limit:
                            # A whole line within one read is refused too: the bound holds
                            # to the byte, however the pipe cut what the server wrote.
                            self._oversized = end - start
                            return
                        line = bytes(buffer[start:end])
                        start = scanned = end + 1
                        if line.strip():
                            await received.send(parsed(line))
                    del buffer[:start]
                    if len(buffer) > limit:
                        # The session sees the connection close; the call says why.
                        self._oversized = len(buffer)
                        return
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is gone

        async def drain() -> None:
            while True:
                try:
                    await stdout.receive()
                except _ENDED:
                    return

        def parsed(line: bytes) -> SessionMessage | Exception:
            try:
                return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
            except ValueError as exc:
                repaired = _surrogates_replaced(line) if b"\\u" in line else None
                if repaired is not None:
                    with suppress(ValueError):
                        message = jsonrpc_message_adapter.validate_json(repaired, by_name=False)
                        return SessionMessage(message)
                # The repaired line: what it quotes of the result reaches the model, which a
                # lone surrogate would fail to encode.
                resultless = _resultless(repaired or line)
                if resultless is not None:
                    # Handed over as a parse error, it would leave its request unanswered
                    # until the timeout: it answers that request with the error instead.
                    return SessionMessage(resultless)
                return exc  # what the SDK hands the session: its message_handler keeps it

        async def writer() -> None:
            try:
                async with sent:
                    async for message in sent:
                        text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        await stdin.send((text + "\n").encode())
            except _CLOSED:
                await received.aclose()  # the session sees the connection end
            except (KeyboardInterrupt, SystemExit) as exc:
                self._interrupted(exc)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            tasks.start_soon(writer)
            try:
                yield read, write
            finally:
                with anyio.CancelScope(shield=True):
                    read.close()
                    write.close()
                    await _stop_server(process)
                    self._process = None
                    for stream in (read, write, received, sent):
                        await stream.aclose()
                tasks.cancel_scope.cancel()

    def _startup_failure(self, stage: str, exc: BaseException, errlog: TextIO) -> str:
        cause = _leaf(exc)
        if isinstance(cause, _Startup | ConfigError):
            why = str(cause)
        elif _closed(cause):
            why = f"closed the connection during {stage} (did it exit?){self._garbage_note()}"
        elif _unreachable(cause):
            why = f"could not be reached: {exc_text(cause)} (is it running at that url?)"
        elif stage == "start":
            why = f"could not be started: {exc_text(cause)}"
        elif (refused := self._http_refusal(cause)) is not None:
            why = f"failed during {stage}: {refused}"
        elif (problem := _invalid(cause)) is not None:
            # The SDK refuses the whole answer: no tool of a list it refused can be offered.
            why = f"answered {stage} with what the MCP SDK refuses: {problem}"
            if problem.split(":", 1)[0].endswith(".inputSchema"):
                why += (
                    ' — MCP requires an inputSchema of every tool ({"type": "object"} for'
                    " one that takes no arguments): the server needs fixing (exclude cannot leave"
                    " the tool out: the SDK refuses the whole list)"
                )
        else:
            why = f"failed during {stage}: {exc_text(cause)}"
        errlog.flush()
        errlog.seek(0)
        stderr = self._masked(errlog.read())[-_STDERR_TAIL:].strip()
        tail = f"; its stderr ends with: {stderr}" if stderr else ""
        return f"{self.label} {why}{tail}"

    async def _received(self, message: Any) -> None:
        """The session's `message_handler`: keeps the last line a stdio server wrote that
        is no JSON-RPC message (the transport hands it over as the error parsing it), which
        says more than a timeout when a request then goes unanswered."""
        try:
            if isinstance(message, Exception) and self.spec.command is not None:
                errors = getattr(message, "errors", None)
                line = errors()[0].get("input") if callable(errors) and errors() else None
                if isinstance(line, bytes):
                    line = line.decode("utf-8", "replace")
                text = line if isinstance(line, str) else exc_text(message)
                self._garbage = self._masked(text.strip())
                self._garbage_count += 1
            await anyio.lowlevel.checkpoint()
        except (KeyboardInterrupt, SystemExit) as exc:
            # This runs in a task of the SDK's session: out of it, asyncio would stop its loop.
            self._interrupted(exc)

    def _garbage_note(self) -> str:
        if self._garbage is None:
            return ""
        shown = self._garbage if len(self._garbage) <= 200 else self._garbage[:197] + "..."
        return (
            f"; it wrote on its stdout what is not a JSON-RPC message: {shown!r} (a server"
            " writes only protocol messages there, its logs go to stderr)"
        )

    def _http_refusal(self, exc: BaseException) -> str | None:
        """The HTTP status behind the SDK's stand-in for a refusal whose body held no
        JSON-RPC error, with what to check; None for any other error."""
        from mcp.shared.exceptions import MCPError

        status = self._http_status
        if status is None or not isinstance(exc, MCPError):
            return None
        if exc.error.message not in _HTTP_STAND_INS:
            return None
        return f"it answered HTTP {status}{_STATUS_HINTS.get(status, '')}"

    def _masked(self, text: str) -> str:
        """`text` (what the server wrote) with the values of its `env` and `headers` hidden:
        a server that rejects its key may well print it."""
        secrets: set[str] = set()
        for values in (self.spec.env, self.spec.headers):
            for value in (values or {}).values():
                # A header's token alone ("Bearer <token>") too; values this short hide
                # nothing and hiding them would garble the text.
                secrets.update(s for s in (value, *value.split()) if len(s) >= _SECRET_MIN)
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def _adopt(self, session: "ClientSession", listed: list[Any]) -> None:
        by_name: dict[str, Any] = {}
        twice: set[str] = set()
        for item in listed:
            if item.name in by_name and item != by_name[item.name]:
                twice.add(item.name)
            by_name.setdefault(item.name, item)
        kept = select(self.spec.name, by_name, self.spec.include, self.spec.exclude)
        for own in kept:
            if own in twice:
                # Which of the two would a call of that name run? Only the server knows. (A
                # tool listed twice alike, or one the toolset leaves out, does no harm.)
                raise ConfigError(
                    f"toolset {self.spec.name!r}: the server lists two different tools named"
                    f" {own!r}; a tool's name must be unique on its server (exclude = [...]"
                    " leaves it out)"
                )
        tools: dict[str, Tool] = {}
        raw: dict[str, str] = {}
        for own in kept:
            item = by_name[own]
            final = toolset_tool_name(self.spec.name, own)
            if final in tools:
                raise ConfigError(
                    f"toolset {self.spec.name!r}: tools {raw[final]!r} and {own!r} are both"
                    f" offered as {final!r}; exclude one of them (exclude = [...])"
                )
            schema = dict(item.input_schema or {"type": "object"})
            problems, fault = _validator(schema)
            tools[final] = schema_tool(
                self._caller(own, fault),
                final,
                item.description or item.title or "",
                schema,
                problems,
            )
            raw[final] = own
        self.session = session
        self.tools = tools
        self.raw_names = raw

    def _caller(self, own: str, fault: Callable[[Any], str | None]) -> Callable[..., Any]:
        async def call(**arguments: Any) -> str:
            where = _unencodable(arguments)
            if where is not None:
                # Sent, it would fail the transport's encoding and end the connection.
                raise ToolFailure(
                    f"MCP server {self.spec.name!r} was not sent the call: its arguments hold"
                    " text that UTF-8 cannot encode (a lone surrogate, such as JSON's"
                    f' "\\ud800", in {where})'
                )
            why = fault(arguments)
            if why is not None:
                raise ToolFailure(
                    f"MCP server {self.spec.name!r} lists an input schema for {own!r} that"
                    f" cannot check these arguments ({why}); the call was not sent — the"
                    " server's schema needs fixing"
                )
            return await self.call(own, arguments)

        call.__name__ = call.__qualname__ = toolset_tool_name(self.spec.name, own)
        return call

    async def call(self, own: str, arguments: dict[str, Any]) -> str:
        """Call the server's tool `own`; its result as text, or `ToolFailure`."""
        session = self.session
        name = self.spec.name
        if session is None or self.dead:
            raise ToolFailure(
                f"MCP server {name!r} is not connected ({self.error}); it is connected again"
                " on the next turn"
            )
        garbage = self._garbage_count
        # Built here, not raised here: the failure carries no traceback, where the caught
        # exception's, kept past this block, would hold this frame in a reference cycle.
        failure: ToolFailure | None = None
        # The SDK handles a request in its sender's context: what it logs there is diverted.
        token = _CONNECTION.set((self.label, self.spec.url))
        try:
            with anyio.move_on_after(self.spec.timeout) as scope:
                result = await session.call_tool(own, arguments)
        except Exception as exc:
            failure = None if self.interrupt is not None else self._failure(own, exc)
        finally:
            _CONNECTION.reset(token)
        if self.interrupt is not None:
            # The interrupt that ended the connection under the call, whatever the call then
            # saw: the call awaited the connection, so its task raises it, as the owner's does.
            raise self.interrupt
        if failure is not None:
            raise failure
        if scope.cancelled_caught:
            note = self._garbage_note() if self._garbage_count > garbage else ""
            raise ToolFailure(
                f"MCP server {name!r} did not answer within its timeout of"
                f" {self.spec.timeout:g} s{note}"
            )
        text = render_result(result)
        if result.is_error:
            said = text if text.strip() else "(it said nothing about it)"
            raise ToolFailure(f"MCP server {name!r} reported an error: {said}")
        return text

    def _failure(self, own: str, exc: Exception) -> ToolFailure:
        """What a call of `own` that raised `exc` fails with; a connection it ended is
        marked failed, to be connected again on the next turn."""
        from mcp.shared.exceptions import MCPError

        name = self.spec.name
        if (problem := _invalid(exc)) is not None:
            # The SDK's text is one paragraph per member of each union it tried: kilobytes
            # the model would read instead of what was wrong. It is logged for the server's
            # author, when anyone listens, and clipped: 10,000 bad blocks made it 23 MB.
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s: the MCP SDK refused the result of a call of %r: %s",
                    self.label,
                    own,
                    _clipped(exc_text(exc), _DEBUG_MAX),
                )
            return ToolFailure(
                f"MCP server {name!r} answered the call of {own!r} with a result that is no"
                f" valid tools/call result: {problem}"
            )
        if isinstance(exc, MCPError):
            if self._session_lost:
                # A 404 for the session: the server forgot it (it restarted, say), and the
                # protocol's answer is a new session.
                self.fail(f"it no longer knew its session during a call of {own!r}")
                return ToolFailure(
                    f"MCP server {name!r} no longer knows this connection's session (HTTP"
                    " 404: was it restarted?); it is connected again on the next turn"
                )
            if exc.error.data == _RESULTLESS:
                return ToolFailure(
                    f"MCP server {name!r} answered the call of {own!r} with {exc.error.message},"
                    " where a tools/call result is an object"
                )
            if self._oversized is not None:
                self.fail(f"it sent a message over max_message_bytes during a call of {own!r}")
                return ToolFailure(
                    f"MCP server {name!r} sent a message of more than"
                    f" {_size(self._oversized)} (its max_message_bytes is"
                    f" {_size(_message_limit(self.spec))}): the connection was closed; it is"
                    " connected again on the next turn"
                )
            if _closed(exc):
                self.fail(f"it closed the connection during a call of {own!r}")
                return ToolFailure(
                    f"MCP server {name!r} closed the connection during the call (did it"
                    " crash?); it is connected again on the next turn"
                )
            if exc.error.message.startswith(_SDK_UNREAD):
                # The SDK's message quotes its pydantic error whole (about 1 KB); that is
                # logged at DEBUG (`SDKRecords`), and the server refused nothing.
                return ToolFailure(
                    f"MCP server {name!r} answered the call of {own!r} with what the MCP SDK"
                    f" cannot read as a JSON-RPC response: {_unread(exc.error.message)}"
                )
            refused = (
                self._http_refusal(exc)
                or (exc.error.message if exc.error.message.strip() else None)
                or f"JSON-RPC error {exc.code}, with no message"
            )
            return ToolFailure(f"MCP server {name!r} refused the call: {refused}")
        if isinstance(
            exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream
        ):
            self.fail(f"its connection broke during a call of {own!r}")
            return ToolFailure(
                f"MCP server {name!r}'s connection broke during the call; it is connected"
                " again on the next turn"
            )
        return ToolFailure(f"MCP server {name!r}: {exc_text(exc)}")


async def _list_tools(session: "ClientSession") -> list[Any]:
    """Every page of the server's tool list."""
    from mcp_types import PaginatedRequestParams

    listed = await session.list_tools()
    tools = list(listed.tools)
    cursors: set[str] = set()
    while listed.next_cursor:
        cursor = listed.next_cursor
        if cursor in cursors:
            # Asked again, it would answer again: the pages would go round until the
            # connect_timeout, reported as no answer at all.
            raise _Startup(
                f"answered tools/list with the cursor {cursor!r} it had already given: its"
                " pages never end"
            )
        cursors.add(cursor)
        listed = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        tools.extend(listed.tools)
    return tools


@final
class SDKRecords(logging.Filter):
    """The filter on the SDK's loggers that sends what they log in an MCP connection's tasks
    (and in its calls) to ``turnplug.mcp``, one line with the exception's text and no
    traceback, the server's url in it shown as messages show it (`shown_url`): a warning as a warning (a notification it could not read, a process it left
    running: nothing else says so), anything else at DEBUG (an error repeats what the call's
    or the open's own error already says). Records logged elsewhere (an application using
    the SDK itself) pass untouched.

    Installed, once, on the loggers of the ``mcp`` package (and the SDK session's logger,
    named ``client``) when a server is first connected, and on those created since when
    another is; `uninstall` removes it.
    """

    installed: "SDKRecords | None" = None
    off = False
    # Servers may be connected from several threads (an event loop each) at once.
    _lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        connection = _CONNECTION.get()
        if connection is None:
            return True
        label, url = connection
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text}: {exc_text(record.exc_info[1])}"
        if url:
            # The SDK quotes the url as given ("Connecting to StreamableHTTP endpoint: ..."),
            # its password and its query's key with it.
            text = text.replace(url, shown_url(url, mark=""))
        level = logging.WARNING if record.levelno == logging.WARNING else logging.DEBUG
        logger.log(
            level,
            "%s: the MCP SDK logged (%s, %s): %s",
            label,
            record.name,
            record.levelname,
            " ".join(text.split()),  # one line: a validation error's text has several
        )
        return False

    @classmethod
    def loggers(cls) -> list[logging.Logger]:
        """The SDK's loggers that exist now."""
        # A copy (made at once, under the GIL): another thread may meanwhile create a logger,
        # importing a module, and a dict that changes size fails the loop going through it.
        names = [
            name
            for name in logging.Logger.manager.loggerDict.copy()
            if name in ("mcp", "client") or name.startswith("mcp.")
        ]
        return [logging.getLogger(name) for name in names]

    @classmethod
    def install(cls) -> None:
        """Put the filter on the SDK's loggers that exist now. It runs whenever a server is
        connected: a logger that a module of the SDK imported later creates gets it then."""
        import mcp.client.session
        import mcp.client.stdio
        import mcp.client.streamable_http  # noqa: F401

        with cls._lock:
            if cls.off:
                return
            if cls.installed is None:
                cls.installed = cls()
            for each in cls.loggers():
                each.addFilter(cls.installed)  # which adds it once

    @classmethod
    def uninstall(cls) -> None:
        """Take the filter off the SDK's loggers, for good: their records go where the SDK
        sends them."""
        with cls._lock:
            if cls.installed is not None:
                for each in cls.loggers():
                    each.removeFilter(cls.installed)
            cls.installed = None
            cls.off = True


# Stopping a stdio server: the seconds it gets to exit once its stdin is closed, those its
# process group gets between SIGTERM and SIGKILL, and those a SIGKILL gets to be seen.
_EXIT_GRACE = 2.0
_TERM_GRACE = 2.0
_KILL_GRACE = 2.0
_POLL = 0.01


async def _start_server(spec: MCPToolset, errlog: TextIO) -> anyio.abc.Process:
    """A stdio server's process, leading a session (so a process group) of its own: stopping
    it signals the group, which holds the processes it started too. Its environment is the
    SDK's few safe variables (`PATH`, `HOME`...) under the toolset's `env`."""
    from mcp.client.stdio import get_default_environment

    assert spec.command is not None
    command, flags = spec.command, 0
    if sys.platform == "win32":
        # CreateProcess looks for `npx.exe` only, not `npx.cmd`; and no console window opens.
        command = shutil.which(command) or command
        flags = subprocess.CREATE_NO_WINDOW
    return await anyio.open_process(
        [command, *spec.args],
        env=get_default_environment() | dict(spec.env or {}),
        stderr=errlog,
        cwd=spec.cwd,
        start_new_session=True,
        creationflags=flags,
    )


async def _stop_server(process: anyio.abc.Process) -> None:
    """Stop a stdio server as the MCP spec's shutdown says: close its stdin and let it exit,
    then SIGTERM its process group and SIGKILL what is left. Every wait is bounded: a process
    that survives the kill is left running, with a warning."""
    assert process.stdin is not None
    assert process.stdout is not None

    def exited() -> bool:
        return process.returncode is not None

    await _close(process.stdin)
    if not await _within(_EXIT_GRACE, exited):
        _signal_group(process, kill=False)
        if not await _within(_TERM_GRACE, lambda: _group_gone(process)):
            _signal_group(process, kill=True)
            # SIGKILL cannot be ignored: only the server's exit is awaited, not the reaping
            # of the processes it started (their zombies are init's to reap).
            await _within(_KILL_GRACE, exited)
    if not exited():
        logger.warning("MCP server process %d survived SIGKILL; it is left running", process.pid)
        await _close(process.stdout)  # ends the reader, whatever the process does
        return
    # Releases its pipes (and asyncio's transport, which warns when collected open). Bounded:
    # before anyio 4.14.1 this waits for the stdout pipe to close on asyncio, which a process
    # that left the group (a daemon) may hold; when it runs out, anyio closes the transport.
    with anyio.move_on_after(_KILL_GRACE), suppress(*_CLOSED):
        await process.aclose()


_CLOSED = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)

# What reading a server's stdout raises once it has ended or been closed.
_ENDED = (OSError, anyio.EndOfStream, anyio.ClosedResourceError)


async def _close(stream: anyio.abc.AsyncResource) -> None:
    """Close one of a server's pipes, which the server may have closed or broken first."""
    with suppress(*_CLOSED):
        await stream.aclose()


async def _within(seconds: float, done: Callable[[], bool]) -> bool:
    """Whether `done()` holds within `seconds`, polled: a process's exit is not awaited,
    because an awaited exit (asyncio's, on older anyio) also waits for its pipes to close."""
    deadline = anyio.current_time() + seconds
    while not done():
        if anyio.current_time() >= deadline:
            return False
        await anyio.sleep(_POLL)
    return True


def _signal_group(process: anyio.abc.Process, *, kill: bool) -> None:
    """SIGTERM (or SIGKILL) every process of the server's group: its pid, as it leads it.
    Windows has no process groups: the server alone is killed."""
    if sys.platform == "win32":
        with suppress(OSError):
            process.kill()
        return
    # ESRCH: the whole group is gone. EPERM: a member that is not ours to signal (or, on
    # macOS, a zombie); the others were signalled.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL if kill else signal.SIGTERM)


def _group_gone(process: anyio.abc.Process) -> bool:
    """Whether no process of the server's group is left, not even an unreaped one."""
    # Reads the exit status first: under trio that reaps the server, whose zombie would keep
    # the group in existence.
    if process.returncode is None:
        return False
    if sys.platform == "win32":
        return True
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # a member we may not signal is a member still
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point: in text read from JSON, one that was escaped alone."""


def _surrogates_replaced(line: bytes) -> bytes | None:
    """A stdio server's JSON `line` with each lone surrogate it escapes (``"\\ud83d"``, which
    JavaScript's ``JSON.stringify`` writes for a string cut inside a pair, and JSON allows)
    read as U+FFFD, which the SDK's parser accepts (it refuses the whole message); None when
    the line is no JSON at all.
    """
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    # The reading joined every pair: a surrogate left in the text is alone.
    # Compact, as servers write it: spaces after every comma would grow a line near the SDK's
    # 1 MiB event limit past it.
    text = _SURROGATE.sub("\ufffd", json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return text.encode("utf-8")


_RESULTLESS = "turnplug: a response with no result object"
"""The data of the error `_resultless` makes, which tells it from a server's own."""


def _resultless(line: bytes) -> Any:
    """The JSON-RPC error that answers in its place a stdio server's response (`line`) whose
    ``result`` is missing or no object (``"result": null``), which the SDK cannot parse nor
    so much as match to its request; None when `line` is no such response."""
    from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError

    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or "method" in value or "error" in value:
        return None
    ident = value.get("id")
    if isinstance(ident, bool) or not isinstance(ident, int | str):
        return None
    if "result" not in value:
        what = "a response holding no result"
    elif isinstance(value["result"], dict):
        return None
    else:
        shown = _clipped(json.dumps(value["result"], ensure_ascii=False), 60)
        what = f"a response whose result is {shown}"
    error = ErrorData(code=INTERNAL_ERROR, message=what, data=_RESULTLESS)
    return JSONRPCError(jsonrpc="2.0", id=ident, error=error)


async def _repairing(response: Any) -> None:
    """The response hook of an HTTP server's connection: a JSON body or an event stream is
    read through `_mending`, which reads a lone surrogate a server's JSON escapes as U+FFFD,
    as the stdio reader does. A compressed body is left as it is.

    A hook, not a transport of ours: the HTTP client reads the proxy environment
    (``HTTP_PROXY``, ``NO_PROXY``...) only when it builds its own transports; and the
    response stays the one the server sent, every header of it (each ``Set-Cookie``) kept.
    """
    if response.headers.get("content-encoding", "identity") != "identity":
        return
    kind = response.headers.get("content-type", "").lower()
    if kind.startswith("application/json"):
        response.stream = _mending(response.stream, lines=False)
    elif kind.startswith("text/event-stream"):
        response.stream = _mending(response.stream, lines=True)


def _mending(inner: Any, *, lines: bool) -> Any:
    """The body `inner` with its lone surrogates mended: read whole and mended once (a JSON
    body), or line by line as it comes (an event stream: the SDK's servers write each
    event's JSON on one ``data:`` line). A mended body's ``content-length`` is left as the
    server sent it: the body is read to its end, never by that count."""
    import httpx2

    class Mending(httpx2.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            # Its iterator is closed here, as httpx2 closes those it walks: left to the
            # garbage collector, trio warns it was collected unfinished.
            chunks = inner.__aiter__()
            try:
                if not lines:
                    yield _mended(b"".join([chunk async for chunk in chunks]))
                    return
                # A line's chunks are joined once, when its end arrives: joining each chunk to
                # what came before would cost a long line (a large result) quadratic time. A
                # line longer than `_LINE_BOUND` is handed on as it comes, unmended: the SDK
                # refuses its event at once, where holding it until its end held as much as the
                # server sent (a 200 MB line took 844 MB before the SDK saw a byte of it).
                pending: list[bytes] = []
                held = 0
                passing = False
                async for chunk in chunks:
                    end = chunk.find(b"\n") + 1 if passing else chunk.rfind(b"\n") + 1
                    if passing:
                        if not end:
                            yield chunk
                            continue
                        passing = False
                        yield chunk[:end]
                        chunk = chunk[end:]
                        if not chunk:
                            continue
                        end = chunk.rfind(b"\n") + 1
                    if not end:
                        pending.append(chunk)
                        held += len(chunk)
                        if held > _LINE_BOUND:
                            yield b"".join(pending)
                            pending, held, passing = [], 0, True
                        continue
                    joined = b"".join([*pending, chunk[:end]])
                    pending = [chunk[end:]] if end < len(chunk) else []
                    held = len(chunk) - end
                    yield b"".join(_mended_line(ln) for ln in joined.splitlines(keepends=True))
                if pending:
                    yield _mended_line(b"".join(pending))
            finally:
                if isinstance(chunks, AsyncGenerator):
                    await chunks.aclose()

        @property
        def elapsed(self) -> Any:
            # The client's own stream times the response; `Response.elapsed` asks its stream.
            return getattr(inner, "elapsed", None)

        async def aclose(self) -> None:
            await inner.aclose()

    return Mending()


_LINE_BOUND = 4 * 1024 * 1024
"""The longest event-stream line mended, in bytes: four times the largest event the SDK
reads (1 MiB), a margin for a line that mending makes shorter (an escape such as
``\\u00e9`` is read as the two bytes of its character); a longer line is handed on as it is,
even one its escapes would have shrunk under the SDK's limit."""


def _mended(text: bytes) -> bytes:
    """`text` (a JSON message) with each lone surrogate it escapes as U+FFFD; as it was when
    it escapes none, or is no JSON."""
    if not escapes_lone_surrogate(text):
        return text
    return _surrogates_replaced(text) or text


def _mended_line(line: bytes) -> bytes:
    if not line.startswith(b"data:") or not escapes_lone_surrogate(line):
        return line
    body = line[5:].rstrip(b"\r\n")
    data = body.strip()
    return b"data: " + (_surrogates_replaced(data) or data) + line[5 + len(body) :]


def _message_limit(spec: MCPToolset) -> int:
    """The largest message the toolset's stdio server may send, in bytes."""
    if spec.max_message_bytes is None:
        return DEFAULT_MAX_MESSAGE_BYTES
    return spec.max_message_bytes


def _unencodable(arguments: Any) -> str | None:
    """Where `arguments` (a call's) hold a text that UTF-8 cannot encode, a lone surrogate
    that a model's JSON may carry as an escape; None when nowhere.

    A stack, not recursion (arguments may nest as deep as the JSON reader went), and a
    place is written out only for the text found: a path written for every value would
    cost each one its parent's path again, a long key times a long list.
    """
    stack: list[tuple[Any, Any]] = [(arguments, None)]
    while stack:
        value, place = stack.pop()
        if isinstance(value, str):
            if not _encodes(value):
                return _place(place) if place is not None else "the arguments"
            continue
        if isinstance(value, Mapping):
            for key in value:
                if isinstance(key, str) and not _encodes(key):
                    return f"the name {_place((place, key))}"
            stack.extend((item, (place, key)) for key, item in reversed(list(value.items())))
        elif isinstance(value, list | tuple):
            stack.extend((value[i], (place, i)) for i in reversed(range(len(value))))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _place(place: Any) -> str:
    """A place in the arguments (``items[2].text``), each name cut to 40 characters and
    escaped, so that the message naming it can be encoded."""
    steps: list[str] = []
    while place is not None:
        place, step = place
        if isinstance(step, int):
            steps.append(f"[{step}]")
            continue
        name = str(step)
        name = name if len(name) <= 40 else name[:40] + "..."
        name = name.encode("utf-8", "backslashreplace").decode("utf-8")
        steps.append(f".{name}" if place is not None else name)
    return "".join(reversed(steps))


_PROBLEM_MAX = 300
_DEBUG_MAX = 64 * 1024


def _invalid(exc: BaseException) -> str | None:
    """What the SDK found wrong in a server's answer (a pydantic `ValidationError`): the
    first problem's place, message and input, and how many more there are, in at most
    `_PROBLEM_MAX` characters; None for any other exception.

    A union's errors (a content block's) are placed under each member's class name
    (``content.0.TextContent.text``), one for every member it tried: a block's problems are
    told by `_problems`, placed without the class names.
    """
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return None
    problems = _problems(exc.errors(include_url=False))
    if not problems:
        return _clipped(str(exc), _PROBLEM_MAX)
    first = problems[0]
    place = ".".join(str(step) for step in first["loc"] if not _member(step))
    text = f"{place}: {first['msg']}" if place else first["msg"]
    text += f" (got {_clipped(repr(first.get('input')), 80)})"
    if len(problems) > 1:
        text += f", and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''}"
    return _clipped(text, _PROBLEM_MAX)


def _problems(errors: Iterable[Any]) -> list[Any]:
    """A pydantic error's errors as the problems they are: each error outside a union, and
    each value a union refused (a content block) told by `_refused`, where pydantic gives
    that value one error for every member it tried, each of its members' problems."""
    told: dict[Any, list[Any]] = {}
    for n, error in enumerate(errors):
        loc = tuple(error["loc"])
        members = next((i for i, step in enumerate(loc) if _member(step)), None)
        key = (n,) if members is None else (loc[:members], members)
        told.setdefault(key, []).append(error)
    problems: list[Any] = []
    for key, here in told.items():
        problems += here if len(key) == 1 else _refused(here, key[1])
    return problems


def _refused(here: list[Any], members: int) -> list[Any]:
    """The problems of a value a union refused, given its errors (`here`), each under the
    class name of a member it tried (at `members` in its place): those of the members whose
    ``type`` the value has (an image block's, for an image with no ``data``), themselves
    told by `_problems` (a member may hold a union); one when every member refused its
    ``type`` (that type is what was wrong), or the value is no object at all."""
    union = tuple(here[0]["loc"][:members])
    if all(len(e["loc"]) == members + 1 for e in here):
        if all(e["type"] == "model_type" for e in here):
            # pydantic's message names each member's class ("instance of TextContent").
            return [{**here[0], "loc": union, "msg": "Input should be an object"}]
        return [{**here[0], "loc": union}]
    refused = {
        e["loc"][members]
        for e in here
        if tuple(e["loc"][members + 1 :]) == ("type",) and e["type"] == "literal_error"
    }
    matched = [e for e in here if e["loc"][members] not in refused]
    if matched:
        return _problems(
            {**e, "loc": (*e["loc"][:members], *e["loc"][members + 1 :])} for e in matched
        )
    # The block itself is the input of a field's error one step in (a missing one's).
    kind = next(e["input"] for e in here if e["type"] == "literal_error")
    block = next(
        (e["input"] for e in here if len(e["loc"]) == members + 2 and isinstance(e["input"], dict)),
        kind,
    )
    return [
        {
            **here[0],
            "loc": union,
            "msg": f"its type {kind!r} is none that MCP defines here",
            "input": block,
        }
    ]


def _member(step: Any) -> bool:
    """Whether a step of an error's place is a union member's class name (``TextContent``):
    the SDK's fields and MCP's names all begin in lower case."""
    return isinstance(step, str) and step[:1].isupper()


def _clipped(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _size(count: int) -> str:
    return f"{count} bytes" if count < 1024 * 1024 else f"{count / 1024 / 1024:.1f} MiB"


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


# The messages of the errors the SDK itself gives a call whose connection closed (or whose
# HTTP response stream broke), with the code CONNECTION_CLOSED.
_SDK_CLOSED = ("Connection closed", "SSE stream ")


# The messages of the errors the SDK's HTTP transport gives a call whose answer (a JSON body,
# an event's data) it could not parse, followed by the parser's whole error.
_SDK_UNREAD = ("Failed to parse JSON response", "Failed to parse SSE message")
_INVALID_JSON = re.compile(r"Invalid JSON: ([^\[\n]*)")
_INPUT_VALUE = re.compile(r"input_value=(.*?), input_type=", re.DOTALL)


def _unread(message: str) -> str:
    """The SDK's message for an answer it could not parse (`_SDK_UNREAD`), short: what it
    says, and the JSON's fault or the value it read (a JSON-RPC response whose result is
    null, say), where it quotes pydantic's error whole."""
    said = next(prefix for prefix in _SDK_UNREAD if message.startswith(prefix))
    if (bad := _INVALID_JSON.search(message)) is not None:
        detail = f"invalid JSON: {bad.group(1).strip()}"
    elif (value := _INPUT_VALUE.search(message)) is not None:
        detail = f"got {_clipped(value.group(1), 120)}"
    else:
        return _clipped(said, _PROBLEM_MAX)
    return _clipped(f"{said} ({detail})", _PROBLEM_MAX)


def _closed(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        # CONNECTION_CLOSED is -32000, the first code JSON-RPC leaves to servers for their
        # own errors: a server's refusal may carry it too, and is told apart by its message.
        return exc.code == CONNECTION_CLOSED and (
            exc.error.message == _SDK_CLOSED[0] or exc.error.message.startswith(_SDK_CLOSED[1])
        )
    return isinstance(
        exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream
    )


def _unreachable(exc: BaseException) -> bool:
    import httpx2

    return isinstance(exc, httpx2.ConnectError)
