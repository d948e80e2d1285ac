"""Toolsets: named groups of tools, local or served by an MCP server.

A tool of toolset ``memory`` named ``read_graph`` is offered to the model as
``memory_read_graph`` (`toolset_tool_name`): every provider accepts
``^[a-zA-Z0-9_-]{1,64}$``, so other characters become ``_`` and a longer name keeps its
first 55 characters, ``_`` and 8 hex digits of a hash of the whole unsanitized name. Two tools
that still end up with one name are a `ConfigError` naming both, when the pipeline is built
(local toolsets) or when the servers are connected (MCP toolsets, whose tools are known only
then).

The tools of a local toolset are fixed when the pipeline is built; those of an MCP toolset
live in a `Toolbox`: the open connections of one owner (``async with pipe``, a session, or
one turn run outside both), each kept by a task of the owner's task group. A
`KeyboardInterrupt` or `SystemExit` that ends a connection cancels that group and is raised by
the owner once the group ended (and by the tasks opening it or calling through it), never a
cancellation or a group in its place.
"""

import hashlib
import logging
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from typing import Any, Protocol, final

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from ._errors import ConfigError, ToolsetError
from ._excgroups import first_failure, own_error, reraise, stopping_interrupt
from ._loop import loop_finished
from ._tools import Tool, tool

logger = logging.getLogger("turnplug.mcp")

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_LIMIT = 64
_HASHED = 8


def toolset_tool_name(toolset: str, tool_name: str) -> str:
    """The name the model calls the tool `tool_name` of the toolset `toolset` by.

    ``f"{toolset}_{tool_name}"`` with every character outside ``[A-Za-z0-9_-]`` replaced by
    ``_``; a result over 64 characters keeps its first 55, then ``_`` and the first 8 hex
    digits of the SHA-256 of the unsanitized name, so long names stay distinct and stable.

    Raises:
        TypeError: `toolset` or `tool_name` is not a string.
    """
    for what, value in (("toolset", toolset), ("tool_name", tool_name)):
        if not isinstance(value, str):
            raise TypeError(
                f"toolset_tool_name() takes two strings; {what} {value!r} ({type(value).__name__})"
                " is not one"
            )
    raw = f"{toolset}_{tool_name}"
    name = _UNSAFE.sub("_", raw)
    if len(name) > _LIMIT:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:_HASHED]
        name = f"{name[: _LIMIT - _HASHED - 1]}_{digest}"
    return name


def _names(value: Any, what: str, owner: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"{owner}: {what} must be a list of tool names, got {value!r}")
    names = tuple(value)
    if not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"{owner}: {what} must be a list of tool names, got {list(names)!r}")
    return names


def check_toolset_name(name: Any, owner: str) -> str:
    """`name`, if it can name a toolset (a non-empty string)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{owner}: the toolset's name must be a non-empty string, got {name!r}")
    return name


def select(
    toolset: str,
    available: Iterable[str],
    include: tuple[str, ...] | None,
    exclude: tuple[str, ...] | None,
) -> list[str]:
    """The tool names `include` / `exclude` keep, in the toolset's order.

    Raises:
        ConfigError: A name in `include` or `exclude` is not one of the toolset's tools.
    """
    names = list(available)
    for what, given in (("include", include), ("exclude", exclude)):
        unknown = [name for name in given or () if name not in names]
        if unknown:
            raise ConfigError(
                f"toolset {toolset!r}: {what} names tools it does not have: {unknown}; its"
                f" tools are {names}"
            )
    if include is not None:
        names = [name for name in names if name in include]
    return [name for name in names if name not in (exclude or ())]


@attrs.frozen
class Toolset:
    """A named group of tools, offered to the model as ``<name>_<tool>``.

    Build one with `toolset` (local tools) or `mcp_toolset` (an MCP server's tools).

    Attributes:
        name: The toolset's name, the prefix of its tools' names.
        include: Only these tools (their own names, without the prefix); all by default.
        exclude: Not these tools.
    """

    name: str
    include: tuple[str, ...] | None = attrs.field(default=None, kw_only=True)
    exclude: tuple[str, ...] | None = attrs.field(default=None, kw_only=True)

    def connection(self) -> "Connection | None":
        """A new, unopened connection to the server of a toolset served by one (None for a
        local toolset, whose tools are fixed when the pipeline is built)."""
        return None


class Connection(Protocol):
    """An open (or dead) connection to a toolset's server, as a `Toolbox` uses it."""

    @property
    def spec(self) -> Toolset: ...
    @property
    def tools(self) -> Mapping[str, Tool]: ...
    @property
    def raw_names(self) -> Mapping[str, str]: ...
    @property
    def dead(self) -> bool: ...
    @property
    def interrupt(self) -> BaseException | None: ...

    async def open(self, group: anyio.abc.TaskGroup) -> None: ...
    async def reconnect(self, group: anyio.abc.TaskGroup) -> None: ...
    def fail(self, reason: str) -> None: ...
    async def close(self) -> None: ...
    def abandon(self) -> None: ...


class ToolOwner(Protocol):
    """What the toolsets need of the pipeline declaring them (`Pipeline` is one)."""

    @property
    def tools(self) -> tuple[Tool, ...]: ...
    @property
    def toolsets(self) -> tuple[Toolset, ...]: ...
    @property
    def _tool_map(self) -> Mapping[str, Tool]: ...
    @property
    def _lifetime(self) -> "Lifetimes": ...
    def _check_needed_tools(self, tools: Mapping[str, Tool] | None = None) -> None: ...


@final
@attrs.frozen
class LocalToolset(Toolset):
    """Local tools grouped under a name (see `toolset`).

    Attributes:
        tools: The tools, under their own names; the pipeline renames them.
    """

    tools: tuple[Tool, ...] = attrs.field(default=(), kw_only=True)

    def final_tools(self) -> list[Tool]:
        """The selected tools under their final names."""
        by_name = {t.name: t for t in self.tools}
        kept = select(self.name, by_name, self.include, self.exclude)
        return [
            attrs.evolve(by_name[name], name=toolset_tool_name(self.name, name)) for name in kept
        ]


def toolset(
    name: str,
    tools: Iterable[Any],
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> LocalToolset:
    """Group local tools under `name`: the model calls them ``<name>_<tool>``.

    Args:
        name: The toolset's name.
        tools: `Tool`s or typed functions (wrapped with `tool`).
        include: Only these tools (by their own names).
        exclude: Not these tools.

    Raises:
        ConfigError: A bad name, a tool that cannot be described, two tools of one name, or
            an `include` / `exclude` naming a tool the group does not have.
    """
    owner = f"toolset({name!r})"
    check_toolset_name(name, owner)
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        raise ConfigError(f"{owner}: tools must be a list of tools, got {tools!r}")
    built: list[Tool] = []
    for entry in tools:
        made = entry if isinstance(entry, Tool) else tool(entry)
        if any(t.name == made.name for t in built):
            raise ConfigError(f"{owner}: a second tool named {made.name!r}")
        built.append(made)
    made_set = LocalToolset(
        name,
        include=_names(include, "include", owner),
        exclude=_names(exclude, "exclude", owner),
        tools=tuple(built),
    )
    made_set.final_tools()  # include / exclude naming tools it lacks: an error now
    return made_set


def check_toolsets(entries: Any) -> tuple[Toolset, ...]:
    """The ``toolsets=`` of a pipeline, checked: toolsets with distinct names."""
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise ConfigError(f"toolsets must be a list of toolsets, got {type(entries).__name__}")
    toolsets = tuple(entries)
    seen: set[str] = set()
    for position, entry in enumerate(toolsets, 1):
        if not isinstance(entry, Toolset):
            raise ConfigError(
                f"toolsets, position {position}: expected a toolset(...) or mcp_toolset(...),"
                f" got {type(entry).__name__} {entry!r}"
            )
        if entry.name in seen:
            raise ConfigError(
                f"toolsets, position {position}: a second toolset named {entry.name!r}; give"
                " one another name"
            )
        seen.add(entry.name)
    return toolsets


Offered = tuple[str, Iterable[tuple[Tool, str | None]]]
"""An owner (``"the tools"``, ``"toolset 'x'"``) and its tools: each under its final name,
with its own name (None when it is the same)."""


def merge(groups: Iterable[Offered]) -> dict[str, Tool]:
    """The tools of every group by final name; two of one name are a `ConfigError` naming
    both."""
    found: dict[str, Tool] = {}
    owners: dict[str, str] = {}
    for owner, tools in groups:
        for made, own in tools:
            label = f"tool {made.name if own is None else own!r} of {owner}"
            if made.name in found:
                raise ConfigError(
                    f"{owners[made.name]} and {label} are both offered as {made.name!r}; the"
                    " model calls tools by name — rename a toolset or exclude one of them"
                    " (exclude = [...])"
                )
            found[made.name] = made
            owners[made.name] = label
    return found


def static_groups(tools: tuple[Tool, ...], toolsets: tuple[Toolset, ...]) -> list[Offered]:
    """The tools a pipeline knows when it is built, by owner: its own, each local toolset's."""
    groups: list[Offered] = [("the pipeline's tools", [(t, None) for t in tools])]
    for each in toolsets:
        if isinstance(each, LocalToolset):
            kept = select(each.name, [t.name for t in each.tools], each.include, each.exclude)
            groups.append((f"toolset {each.name!r}", zip(each.final_tools(), kept, strict=True)))
    return groups


def static_tools(tools: tuple[Tool, ...], toolsets: tuple[Toolset, ...]) -> dict[str, Tool]:
    """The tools a pipeline knows when it is built: its own and its local toolsets'."""
    return merge(static_groups(tools, toolsets))


def remote_toolsets(toolsets: tuple[Toolset, ...]) -> tuple[Toolset, ...]:
    """The toolsets whose tools come from a connection (not local)."""
    return tuple(each for each in toolsets if not isinstance(each, LocalToolset))


# -- open connections -------------------------------------------------------------------------


@final
class Toolbox:
    """The open connections of one owner, and the tools they serve, by final name."""

    def __init__(self, pipe: ToolOwner, group: anyio.abc.TaskGroup) -> None:
        self.pipe = pipe
        self.group = group
        self.connections: list[Connection] = [
            connection for each in pipe.toolsets if (connection := each.connection()) is not None
        ]
        self.tools: Mapping[str, Tool] = pipe._tool_map
        self.closed = False
        # Borrows by task: the turns using this toolbox.
        self._borrows: dict[object, int] = {}
        self._returned = anyio.Event()

    def borrow(self, task: object) -> None:
        self._borrows[task] = self._borrows.get(task, 0) + 1

    def give_back(self, task: object) -> None:
        count = self._borrows.pop(task, 0)
        if count > 1:
            self._borrows[task] = count - 1
        self._returned.set()

    async def returned(self, owner: object) -> None:
        """Wait until no task but `owner` borrows this toolbox."""
        while any(borrower != owner for borrower in self._borrows):
            self._returned = anyio.Event()
            await self._returned.wait()

    async def open(self) -> None:
        """Connect every server (concurrently); the first failure raises `ToolsetError`.

        The first failure stops the other servers' starts at once (`close` ends them): a
        server that failed straight away is not reported only once the slowest of the
        others has started or run out its connect_timeout.
        """
        failures: list[BaseException] = []

        async def connect(connection: Connection, group: anyio.abc.TaskGroup) -> None:
            try:
                await connection.open(self.group)
            except ToolsetError as error:
                failures.append(error)
                group.cancel_scope.cancel()

        await self._each(connect)
        if failures:
            raise first_failure(failures, lambda other: f"also: {other}")
        self.tools = self._merged()
        self.pipe._check_needed_tools(self.tools)

    async def refresh(self) -> Mapping[str, Tool]:
        """This turn's tools: dead servers are reconnected first (a failure stays recorded
        on the connection, whose calls then fail with it)."""
        dead = [connection for connection in self.connections if connection.dead]
        if dead:

            async def reconnect(connection: Connection, _: anyio.abc.TaskGroup) -> None:
                await connection.reconnect(self.group)

            await self._each(reconnect, dead)
            try:
                self.tools = self._merged()
            except ConfigError as error:
                # A server that came back with a clashing tool list: its old list stays.
                logger.warning("reconnecting failed: %s", error)
                for connection in dead:
                    connection.fail(str(error))
        return self.tools

    async def _each(
        self,
        work: Callable[[Connection, anyio.abc.TaskGroup], Awaitable[None]],
        connections: Iterable[Connection] | None = None,
    ) -> None:
        """Run `work` on each connection concurrently (all of them by default), in a task of
        its own; a KeyboardInterrupt or SystemExit out of one stops the others and is raised
        here once they ended, never left to the loop nor lost to a cancellation."""
        interrupts: list[tuple[BaseException, bool, str]] = []

        async def one(connection: Connection, group: anyio.abc.TaskGroup) -> None:
            try:
                await work(connection, group)
            except (KeyboardInterrupt, SystemExit) as exc:
                name = f"MCP toolset {connection.spec.name!r}"
                interrupts.append((exc, group.cancel_scope.cancel_called, name))
                group.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as group:
                for connection in self.connections if connections is None else connections:
                    group.start_soon(one, connection, group)
        except BaseException:
            if not interrupts:
                raise
        interrupt = stopping_interrupt(interrupts, "the connections")
        if interrupt is not None:
            raise interrupt

    @property
    def interrupt(self) -> BaseException | None:
        """The KeyboardInterrupt or SystemExit that ended one of the connections, if any."""
        return next((c.interrupt for c in self.connections if c.interrupt is not None), None)

    def _merged(self) -> dict[str, Tool]:
        # A clash names a local toolset's tool by its toolset, as when the pipeline is built.
        groups = static_groups(self.pipe.tools, self.pipe.toolsets)
        for connection in self.connections:
            named = [(t, connection.raw_names[final]) for final, t in connection.tools.items()]
            groups.append((f"MCP toolset {connection.spec.name!r}", named))
        return merge(groups)

    async def close(self) -> None:
        """Close every connection (shielded, bounded), then stop their tasks."""
        self.closed = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as group:
                for connection in self.connections:
                    group.start_soon(connection.close)
        self.group.cancel_scope.cancel()


@asynccontextmanager
async def open_toolbox(pipe: ToolOwner) -> AsyncIterator[Toolbox]:
    """Connect the pipeline's MCP servers for the time of the block, and close them after.

    A connection ended by a KeyboardInterrupt or SystemExit cancels the group (the block with
    it), and the interrupt is raised once the group ended, in place of the cancellation or of
    what the block raised as it was cancelled.
    """
    box: Toolbox | None = None
    try:
        async with anyio.create_task_group() as group:
            box = Toolbox(pipe, group)
            try:
                await box.open()
                yield box
            finally:
                await box.close()
    except BaseException as caught:
        if box is None or box.interrupt is None:
            if not isinstance(caught, BaseExceptionGroup):
                raise
            # The connections' tasks never fail: what the group holds is the block's own error.
            reraise(own_error(caught))
    if box is not None and box.interrupt is not None:
        raise box.interrupt


@asynccontextmanager
async def turn_tools(pipe: ToolOwner, toolbox: Toolbox | None) -> AsyncIterator[Mapping[str, Tool]]:
    """The tools of one turn: from the toolbox of its session, else from that of ``async with
    pipe`` (in use until the turn ends), else from connections opened for this turn alone."""
    if toolbox is not None and not toolbox.closed:
        yield await toolbox.refresh()
        return
    with pipe._lifetime.borrowed() as box:
        if box is not None:
            yield await box.refresh()
            return
    async with open_toolbox(pipe) as opened:
        yield opened.tools


@final
class Lifetimes:
    """Each event loop's `Lifetime`: what ``async with pipe`` opened on that loop.

    A connection is kept by tasks of the loop that opened it, and only that loop can use or
    close it. So each loop's blocks connect servers of their own, and hold the model there,
    as each loop's holds of a provider keep connections of their own: one pipeline serves
    successive ``asyncio.run`` calls, and several threads each running a loop at once. A
    loop's entry is dropped once it holds nothing. A loop that ended with a block never
    exited (closed by hand, or left by a fixture without its teardown) cannot close what the
    block opened: the next loop to enter a block drops its entry and stops its stdio
    servers' processes (SIGTERM to each one's process group), which is all that can be done
    without that loop; the rest goes with the entry.
    """

    def __init__(self) -> None:
        # Each loop's entry is used by its own thread alone; the guard keeps the table whole
        # when threads' loops add or drop theirs at once.
        self._loops: dict[anyio.lowlevel.EventLoopToken, Lifetime] = {}
        self._guard = threading.Lock()

    def _found(self) -> "tuple[anyio.lowlevel.EventLoopToken, Lifetime | None]":
        loop = anyio.lowlevel.current_token()
        with self._guard:
            return loop, self._loops.get(loop)

    def _made(self) -> "tuple[anyio.lowlevel.EventLoopToken, Lifetime]":
        loop = anyio.lowlevel.current_token()
        with self._guard:
            ended = [other for other in self._loops if other != loop and loop_finished(other)]
            dropped = [self._loops.pop(other) for other in ended]
            life = self._loops.get(loop)
            if life is None:
                life = self._loops[loop] = Lifetime()
        for each in dropped:
            each.abandon()
        return loop, life

    def _drop_idle(self, loop: anyio.lowlevel.EventLoopToken, life: "Lifetime") -> None:
        with self._guard:
            if life.idle and self._loops.get(loop) is life:
                del self._loops[loop]

    @property
    def toolbox(self) -> Toolbox | None:
        """The toolbox this loop's ``async with pipe`` opened, if any."""
        life = self._found()[1]
        return None if life is None else life.toolbox

    async def enter(self, pipe: ToolOwner, hold: AbstractAsyncContextManager[object]) -> None:
        """Enter a block on this loop: connect its MCP servers (see `Lifetime.enter`) and keep
        `hold`, the model's hold the block entered, for its exit to end."""
        loop, life = self._made()
        try:
            await life.enter(pipe)
            life.holds.append(hold)
        finally:
            self._drop_idle(loop, life)

    async def exit(self, exc: BaseException | None) -> None:
        """Exit a block of this loop: close what its owner opened, then end a model hold.

        Raises:
            RuntimeError: No block of this loop is open, or the task exiting entered no block
                while another's holds MCP connections (see `Lifetime.check_exit`); nothing is
                closed.
        """
        loop, life = self._found()
        # Checked first: the lifetime counts its own blocks, and an exit it took as one of
        # them would close the connections under a block still open.
        if life is None or not life.holds:
            raise RuntimeError(
                "exiting a pipeline that has no open `async with pipe:` block (never entered,"
                " exited more often than entered, or entered on another event loop than this"
                " one) — let `async with pipe:` enter and exit it, once each, on one loop"
            )
        life.check_exit()
        try:
            await life.exit(exc)
        finally:
            # Every hold of one model on one loop is alike: ending any one is ending this
            # block's.
            hold = life.holds.pop()
            self._drop_idle(loop, life)
            await hold.__aexit__(None, None, None)

    @contextmanager
    def borrowed(self) -> Iterator[Toolbox | None]:
        """This loop's open toolbox, in use until the block ends (see `Lifetime.borrowed`)."""
        life = self._found()[1]
        if life is None:
            yield None
            return
        with life.borrowed() as box:
            yield box


@final
class Lifetime:
    """What ``async with pipe`` opened: the toolbox, kept while the outermost block runs.

    The first task to enter owns the connections: they are kept by tasks of a task group
    that this task entered, so this task must be the one to close them (AnyIO's rule). Its
    nested blocks count, and blocks of other tasks use the connections while they are open
    (waiting while the owner is still connecting, so that one task opens them, never two).
    Each turn that uses them borrows them until it ends: when the owner's outermost block
    ends normally, its exit waits for the turns in flight, then closes, so a tool call is
    never cut by the close. Nothing borrows them from then on: a turn starting meanwhile (a
    session's or another block's next turn) connects for itself, and a block of another
    task entered meanwhile waits and opens them anew. Sessions and other blocks are not
    waited for: they may be waiting for what the owner does after its block. When the block
    ends with an error or a cancellation, it closes at once: holding the error back until
    other tasks finish could wait for ever, since those tasks are often in the task group
    that the error is to cancel.
    """

    def __init__(self) -> None:
        self.toolbox: Toolbox | None = None
        self._stack: AsyncExitStack | None = None
        self._owner: object = None
        self._depth = 0
        self._opened = anyio.Event()
        self._closing = False
        self._closed = anyio.Event()
        self._waiting = 0  # tasks waiting in `enter` for the owner to connect or close
        # The model's hold of each open block of this loop, whatever its task.
        self.holds: list[AbstractAsyncContextManager[object]] = []
        # Blocks of other tasks than the owner, by task: they exit without closing anything.
        self._guests: dict[object, int] = {}

    @property
    def idle(self) -> bool:
        """Nothing is open, being opened or waited for: the lifetime holds nothing."""
        return (
            self._owner is None
            and self._stack is None
            and not self._waiting
            and not self._guests
            and not self.holds
        )

    async def _wait(self, event: anyio.Event) -> None:
        self._waiting += 1
        try:
            await event.wait()
        finally:
            self._waiting -= 1

    async def enter(self, pipe: ToolOwner) -> None:
        if not remote_toolsets(pipe.toolsets):
            return
        task = anyio.get_current_task().id
        while self._owner is not None:
            if task == self._owner:
                self._depth += 1
                return
            if self._closing:
                await self._wait(self._closed)  # the owner is closing: open them anew after
                continue
            if self._stack is not None:
                # Another task's block: its turns use the open connections.
                self._guests[task] = self._guests.get(task, 0) + 1
                return
            await self._wait(self._opened)  # the owner is connecting; if that fails, try again
        self._owner, self._depth, self._opened = task, 1, anyio.Event()
        self._closing, self._closed = False, anyio.Event()
        stack = AsyncExitStack()
        try:
            self.toolbox = await stack.enter_async_context(open_toolbox(pipe))
            self._stack = stack
        except BaseException:
            self._owner, self._depth = None, 0
            raise
        finally:
            self._opened.set()

    def check_exit(self) -> None:
        """Refuse the exit of a task that entered no block: only the owner can close the
        connections (its task group keeps them), and ignoring its exit would leave them
        open, their servers running, for as long as the loop runs."""
        task = anyio.get_current_task().id
        if self._stack is not None and task != self._owner and task not in self._guests:
            raise RuntimeError(
                "exiting a pipeline's `async with pipe:` block in another task than the one"
                " that entered it: its MCP servers' connections are kept by the entering"
                " task's task group, which only that task can close — enter and exit the"
                " pipeline in one task (one `async with pipe:` block, or an AsyncExitStack"
                " that one task enters and closes)"
            )

    async def exit(self, exc: BaseException | None) -> None:
        task = anyio.get_current_task().id
        if self._stack is None or task != self._owner:
            guest = self._guests.pop(task, 0)
            if guest > 1:
                self._guests[task] = guest - 1
            return  # another task's block (the owner closes), or a pipeline without MCP
        self._depth -= 1
        if self._depth:
            return
        box = self.toolbox
        if exc is None and box is not None:
            self._closing = True
            try:
                await box.returned(task)
            except BaseException as cut:
                await self._close(cut)
                raise
        await self._close(exc)

    @contextmanager
    def borrowed(self) -> Iterator[Toolbox | None]:
        """The open toolbox, in use until the block ends (None when none is open, or when
        its owner is closing it)."""
        box = self.toolbox
        if box is None or self._closing:
            yield None
            return
        task = anyio.get_current_task().id
        box.borrow(task)
        try:
            yield box
        finally:
            box.give_back(task)

    def abandon(self) -> None:
        """Stop the stdio servers of a loop that ended with this lifetime open (see
        `Connection.abandon`): closing them needs that loop, which is gone."""
        if self.toolbox is not None:
            for connection in self.toolbox.connections:
                connection.abandon()

    async def _close(self, exc: BaseException | None) -> None:
        stack, self._stack, self.toolbox, self._owner = self._stack, None, None, None
        # A task entering meanwhile owns the lifetime anew, with events of its own: those
        # waiting for this close wait on this one's.
        closed = self._closed
        try:
            if stack is None:
                return
            if exc is None:
                await stack.aclose()
            else:
                await stack.__aexit__(type(exc), exc, exc.__traceback__)
        finally:
            if self._closed is closed:
                self._closing = False
            closed.set()
