"""Sessions: one conversation, its log, its lifecycle hooks and its background work."""

import asyncio
import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Literal, TypeAlias, TypeVar, final

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import sniffio
import trio

from turns import Context, Message, RequestOptions, Scope, ToolSpec, Turn

from . import events as ev
from ._audit import HookRecord
from ._background import run_background
from ._commit import injection_messages
from ._describe import describe, exc_text
from ._drive import Drive, OpenTools, TurnHost
from ._errors import ConfigError, HookReturnError, LogConflict, LogError
from ._excgroups import interrupt_in, only_cancelled, own_error, raise_single, reraise
from ._hooks import is_async_callable
from ._loop import current_loop, is_cancellation, spurious_cancellation, to_the_end
from ._plan import Plan, Step
from ._result import TurnResult
from ._runner import Emit, Runner, failure_detail
from ._signals import Cont
from ._stream import OneUse, TurnEvents, stream_turn
from .logs import Log, LogEntry
from .logs._protocol import check_id, check_turn_ref

Reason: TypeAlias = Literal["closed", "error", "cancelled"]


@final
@attrs.frozen
class SessionInfo:
    """What session hooks are told about their session.

    Attributes:
        conversation_id: The conversation.
        scope: The session's scope (as enriched by the start hooks so far).
        turns: How many turns were sent in this session.
    """

    conversation_id: str
    scope: Scope
    turns: int = 0


@final
class Session:
    """One open conversation. Get one from `Pipeline.session`; do not build it directly.

    Turns run one at a time; each completed turn is committed to the log before the next
    starts. Background post hooks run in the session's task group, and their durable output is
    committed when they finish.
    """

    def __init__(
        self,
        plan: Plan,
        log: Log,
        conversation_id: str,
        scope: Scope,
        context: Context,
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self._plan = plan
        self._log = log
        self._conversation_id = conversation_id
        self._scope = scope
        self._context = context
        # The length the log holds as far as this session knows: its own commits included,
        # so a commit by anyone else since the load is a LogConflict.
        self._length = len(context.messages)
        self._turns = 0
        # The turn_refs this session committed, its background hooks' ``turn_ref:hook``
        # entries included: the log keeps the first commit of a turn_ref and ignores the
        # next, so a second commit under one of them would be lost.
        self._committed: set[str] = set()
        # The turn_refs the log held from before this session, read once, when a caller
        # first gives a turn_ref (`_refuse_held`); None until then.
        self._held: frozenset[str] | None = None
        # Whether a commit ended unsure (asyncio's own cancellation, or a LogError, raised
        # out of an append that may have written: a PostgresLog commit whose answer was
        # lost): the log alone knows, so the next commit or turn reloads.
        self._unsure = False
        self._task_group = task_group
        self._lock = _TurnLock()
        self._running = 0  # background hooks still running
        # The worker threads of sync background hooks, abandoned when the hooks are cut
        # (`_cut`: the drain timeout, a cancellation during the drain, an interrupt).
        self._threads: set[anyio.CancelScope] = set()
        # A background hook's KeyboardInterrupt or SystemExit, raised when the block is left.
        self._interrupt: BaseException | None = None
        self._cut_short = "cut short: the session was cancelled; nothing of it was committed"
        self._closed = False
        self._idle = anyio.Event()
        self._idle.set()
        self._events: list[ev.Event] = []
        self._turn_started = 0.0  # when the latest turn started, on the loop's clock
        # Where the turns find MCP toolsets' tools (None: the plan's own tools).
        self._open_tools: OpenTools | None = None

    def __repr__(self) -> str:
        return f"<Session {self._conversation_id!r}, {self._turns} turns>"

    @property
    def info(self) -> SessionInfo:
        """The conversation id, the scope and the number of turns sent."""
        return SessionInfo(self._conversation_id, self._scope, self._turns)

    @property
    def context(self) -> Context:
        """The conversation as the next turn will see it (history from the log).

        After a turn cancelled by asyncio's own cancellation while its commit was written,
        or whose commit failed with `LogError` (one whose answer was lost may have been
        written), the next turn reloads it first: until then, it may lack that turn.
        """
        return self._context

    @property
    def events(self) -> tuple[ev.Event, ...]:
        """Events from outside any turn: background hooks and session hooks, in order."""
        return tuple(self._events)

    async def send(
        self,
        message: str | Message,
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (),
        request: RequestOptions | None = None,
        turn_ref: str | None = None,
    ) -> TurnResult:
        """Run one turn on the conversation so far and commit it when it completes.

        Args:
            message: The user's text or message, or a ``tool`` message continuing from the
                results of the tool calls the conversation ends with (see `Turn.start`).
            system: This turn's system prompt, in place of the conversation's.
            tools: Tools this turn offers that the caller runs itself (a pipeline without
                tools of its own returns their calls in the reply).
            request: This turn's request options (temperature, max_tokens, tool_choice,
                ...), as the pre hooks then find them on ``turn.request``.
            turn_ref: The turn's correlation id; a fresh one by default. One this session
                already committed, or one the log holds from before (read from its
                entries), is a ValueError: the log would keep only the first.
        """
        self._check_open("send")
        async with self._lock:
            self._check_closed("send")  # closed while this send waited for the turn before
            await self._settle()
            await self._refuse_held(turn_ref)
            turn = self._turn(message, system, tools, request, turn_ref)
            try:
                return await self._drive(None).run(turn)
            except BaseExceptionGroup as group:
                raise_single(group)

    def stream(
        self,
        message: str | Message,
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (),
        request: RequestOptions | None = None,
        turn_ref: str | None = None,
    ) -> AbstractAsyncContextManager["TurnEvents"]:
        """`send`, streamed: ``async with session.stream(text) as events``; the same
        arguments."""
        streamed = self._stream(message, system, tools, request, turn_ref)
        return OneUse(streamed, "session.stream(...)")

    @asynccontextmanager
    async def _stream(
        self,
        message: str | Message,
        system: str | None,
        tools: Sequence[ToolSpec],
        request: RequestOptions | None,
        turn_ref: str | None,
    ) -> AsyncIterator["TurnEvents"]:
        self._check_open("stream")
        async with self._lock:
            self._check_closed("stream")
            await self._settle()
            await self._refuse_held(turn_ref)
            events = TurnEvents()
            turn = self._turn(message, system, tools, request, turn_ref)
            drive = self._drive(events._emit, events._caught_up, events._relay)
            async with stream_turn(lambda: drive, turn, events) as stream:
                yield stream

    def _check_open(self, method: str) -> None:
        self._check_closed(method)
        owner = self._lock.owner
        if owner is not None and owner is _current_task():
            raise RuntimeError(
                f"session {self._conversation_id!r} runs one turn at a time: this task is"
                f" still inside a turn of it (a session.stream block, or an async generator"
                f" over one that was not closed: close it with contextlib.aclosing); {method}"
                " after it ends"
            )

    def _check_closed(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(
                f"session {self._conversation_id!r} is closed; open a new one with"
                f" pipe.session(...) to {method} more turns"
            )

    # -- turns --------------------------------------------------------------------------------

    async def _refuse_held(self, turn_ref: str | None) -> None:
        """Refuse a caller's `turn_ref` the log already holds, before the turn runs.

        The log would ignore the turn's commit (it keeps the first commit of a turn_ref):
        the turn would be answered, reported committed and lost. `_turn` refuses those this
        session committed without asking the log; those committed before it opened (by an
        earlier session or another process) are read from the log's entries once, the first
        time a caller gives a turn_ref, so a turn does not read the whole conversation.
        """
        if turn_ref is None:
            return  # a fresh one
        check_turn_ref(turn_ref)  # as `_turn` would: a bad one is refused before the read
        if turn_ref in self._committed:
            return  # `_turn` refuses it
        if self._held is None:
            self._held = await held_turn_refs(self._log, self._conversation_id)
        if turn_ref in self._held:
            raise ValueError(
                f"conversation {self._conversation_id!r} already holds a commit under"
                f" {turn_ref!r} (made by an earlier session, another process, or a commit of"
                " this session that failed unsure whether it wrote), and a log keeps one commit"
                " per turn_ref: this turn would be answered and then lost — give each turn its"
                " own turn_ref (or none, for a fresh one)"
            )

    def _turn(
        self,
        message: str | Message,
        system: str | None,
        tools: Sequence[ToolSpec],
        request: RequestOptions | None,
        turn_ref: str | None,
    ) -> Turn:
        if turn_ref is not None:
            # As the log will check it at the commit: refused now, before the turn runs.
            check_turn_ref(turn_ref)
        if turn_ref in self._committed:
            raise ValueError(
                f"session {self._conversation_id!r} already committed {turn_ref!r} (a turn, or"
                " a background hook's output under turn_ref:hook), and a log keeps one commit"
                " per turn_ref: this turn would be answered and then lost — give each turn its"
                " own turn_ref (or none, for a fresh one)"
            )
        # As run() checks a turn's context: refused now, naming the argument, not when the
        # turn is rendered after its pre hooks ran.
        if system is not None and not isinstance(system, str):
            raise TypeError(
                f"system= takes this turn's system prompt as text, got {describe(system)}"
            )
        given: object = tools  # a str is a sequence too, of one-letter strs; None is none
        odd = (
            [given]
            if isinstance(given, str)
            else [t for t in tools or () if type(t) is not ToolSpec]
        )
        if odd:
            raise TypeError(
                f"tools= takes turns.ToolSpec records, got {describe(odd[0])} — e.g."
                " ToolSpec(name, description, parameters)"
            )
        context = self._context
        if system is not None or tools:
            context = attrs.evolve(
                context,
                system=context.system if system is None else system,
                tools=tools or context.tools,
            )
        turn = Turn.start(message, context=context, scope=self._scope, turn_ref=turn_ref)
        # Its background hooks' events are stamped against it (`_since`).
        self._turn_started = anyio.current_time()
        if request is not None:
            if not isinstance(request, RequestOptions):
                raise TypeError(
                    f"request= takes a turns.RequestOptions, got {type(request).__name__} —"
                    " e.g. RequestOptions(temperature=0.2)"
                )
            turn = attrs.evolve(turn, request=request)
        self._turns += 1
        return turn

    def _drive(
        self,
        emit: Emit | None,
        caught_up: Callable[[], Awaitable[None]] | None = None,
        relay: list[Emit] | None = None,
    ) -> Drive:
        host = TurnHost(self._commit, self._spawn)
        return Drive(self._plan, emit, host, caught_up, self._open_tools, relay)

    async def _commit(self, result: TurnResult) -> tuple[str, tuple[Message, ...]]:
        if self._closed:
            # A turn sent from a task outside the session's block, still running when the
            # block was left: its end hooks have run and its task group is closing.
            raise RuntimeError(
                f"session {self._conversation_id!r} was closed while turn"
                f" {result.turn.turn_ref!r} ran, so nothing of the turn was committed —"
                " finish a session's turns inside its async with block"
            )
        messages = result.log_messages
        await self._append(result.turn.turn_ref, messages, result)
        return self._conversation_id, messages

    async def _append(
        self, turn_ref: str, messages: tuple[Message, ...], result: TurnResult | None
    ) -> None:
        await self._settle()
        try:
            await self._log.append(
                self._conversation_id,
                turn_ref,
                messages,
                result.audit if result is not None else None,
                expected_length=self._length,
            )
        except LogConflict:
            # Someone else wrote: the next turn answers from the conversation as it is. Unsure
            # until reloaded: a reload that fails (or is cancelled) is made again by the next.
            self._unsure = True
            await self._reload()
            raise
        except LogError:
            # A commit whose answer was lost (a PostgresLog connection given up on) may
            # have been written, as may one of any log whose connection broke: only the log
            # knows, and the next commit must not be made on a conversation that lacks it.
            self._unsure = True
            raise
        except BaseException as exc:
            if not is_cancellation(exc):
                raise
            # A cancel scope's cancellation never leaves an append that wrote (it comes at the
            # next checkpoint), but asyncio's own does, once the write ended (logs.md,
            # "Cancellation"), and so may a log's own CancelledError: whether this one
            # wrote, only the log knows.
            self._unsure = True
            if spurious_cancellation(exc):
                what = f"committing turn {turn_ref!r} of conversation {self._conversation_id!r}"
                then = (
                    "; whether it wrote the turn only the log knows, so the session reloads"
                    " the conversation before its next commit"
                )
                raise cancelled_itself(self._log, what, exc, then) from exc
            raise
        # No checkpoint between the append and this bookkeeping: they stay in step.
        self._length += len(messages)
        self._context = attrs.evolve(self._context, messages=(*self._context.messages, *messages))
        self._committed.add(turn_ref)

    async def _settle(self) -> None:
        """Reload the conversation if a commit ended unsure whether it wrote."""
        if self._unsure:
            await self._reload()

    async def _reload(self) -> None:
        self._context = await load(self._log, self._conversation_id)
        self._length = len(self._context.messages)
        self._unsure = False
        # The log may hold turn_refs it did not at the first read: another writer's, or
        # this session's own, from a commit that failed unsure whether it wrote.
        self._held = None

    # -- background hooks ---------------------------------------------------------------------

    def _spawn(self, turn: Turn) -> None:
        if self._closed:
            # The session closed while the turn's commit was being written: the commit
            # stands, but the task group that would run the hooks is gone.
            emit = _since(self._events, self._turn_started)
            for step in self._plan.background:
                why = "not started: the session closed while its turn was being committed"
                emit(ev.HookFailed(turn.turn_ref, step.name, step.stage, why, False))
            return
        for step in self._plan.background:
            self._running += 1
            if self._idle.is_set():
                self._idle = anyio.Event()
            self._task_group.start_soon(self._background, step, turn, self._turn_started)

    async def _background(self, step: Step, turn: Turn, started: float) -> None:
        returned = False
        emit = _since(self._events, started)
        try:
            runner = _runner(self._plan, emit, turn.turn_ref)
            runner.threads = self._threads
            fresh = await run_background(runner, step, turn, [])
            returned = True
            messages = injection_messages(fresh)
            if messages:
                entry = f"{turn.turn_ref}:{step.name}"
                try:
                    async with self._lock:
                        if entry in self._committed:
                            raise ValueError(
                                f"a turn of the session was committed under {entry!r}, the"
                                " entry this output goes under, and a log keeps one commit"
                                " per turn_ref"
                            )
                        await self._append(entry, messages, None)
                    emit(ev.Committed(turn.turn_ref, self._conversation_id, messages))
                except Exception as exc:
                    # The hook itself finished (its HookFinished is out); the failure is the
                    # commit's, reported under that stage.
                    emit(
                        ev.HookFailed(
                            turn.turn_ref,
                            step.name,
                            "commit",
                            f"committing its output failed: {exc_text(exc)}",
                            False,
                        )
                    )
        except anyio.get_cancelled_exc_class():
            # Reported here, by the task itself, whatever cancelled it: the session's own
            # cancellation can reach this task before the session's exit path runs.
            emit(
                ev.HookFailed(
                    turn.turn_ref,
                    step.name,
                    "commit" if returned else step.stage,
                    self._cut_short,
                    False,
                )
            )
            raise
        except (KeyboardInterrupt, SystemExit) as exc:
            # Raised by the session's block, as a parallel member's is by its group: out of a
            # task, asyncio would stop its loop before the other hooks' tasks even started.
            # The session stops: its turn and other background hooks are cancelled.
            if self._interrupt is None:
                self._interrupt = exc
                # The program is stopping, as at an interrupt ending the body.
                self._cut(
                    f"cut short: background hook {step.name!r} raised {type(exc).__name__},"
                    " which stopped the session; nothing of it was committed"
                )
            else:
                # One raised later (as it was cut short, say) rides along, as a parallel
                # group's does (`stopping_interrupt`).
                self._interrupt.add_note(
                    f"background hook {step.label} also raised {type(exc).__name__} as the"
                    " session stopped"
                )
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def _drain(self, timeout: float) -> None:
        """Wait up to `timeout` for background hooks; cancel and report what is left.

        A cancellation arriving meanwhile, whatever delivers it (a cancel scope, asyncio's own
        ``Task.cancel`` or ``asyncio.timeout``, asyncio.run's Ctrl-C), ends the wait at once
        and cancels the hooks still running, as a cancel scope's reaches them anyway: they
        sit inside it.
        """
        try:
            with anyio.move_on_after(timeout):
                await self._idle.wait()
        except BaseException as exc:
            # A background hook's interrupt has cut them already, with its own reason.
            if self._running and self._interrupt is None:
                why = self._cut_short  # the session was cancelled
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    # Trio's Ctrl-C (asyncio's is a cancellation of the session's task).
                    why = (
                        f"cut short: the session was interrupted ({type(exc).__name__}) while"
                        " it drained its background hooks; nothing of it was committed"
                    )
                # Threads too, as at the timeout: a cancellation once the body returned
                # (the gateway's drain timeout, say) is not held back by a thread.
                self._cut(why)
            raise
        if self._running:
            self._cut(
                f"did not finish within the session's drain timeout of {timeout} s and was"
                " cancelled; nothing of it was committed"
            )

    def _cut(self, why: str) -> None:
        """Cancel the background hooks still running, each reporting `why`, and abandon their
        worker threads.

        A thread cannot be interrupted: abandoned, as at a hook's own timeout, it runs on and
        what it returns is dropped; the session does not wait for it.
        """
        self._cut_short = why
        self._task_group.cancel_scope.cancel()
        for scope in self._threads:
            scope.cancel()

    # -- lifecycle ----------------------------------------------------------------------------

    async def _start(self) -> None:
        runner = _runner(self._plan, self._events.append, "")
        for step in self._plan.session_start:
            called = await runner.timed(step, self.info)
            if called is None:
                continue
            result, elapsed = called
            if inspect.iscoroutine(result):
                # An await forgotten: said so, and the coroutine closed, as for a turn's hooks.
                runner.fail(
                    step, runner.wrong_return(step, result, "Cont(scope)", group=False), elapsed
                )
                continue
            if type(result) is not Cont or not isinstance(result.value, Scope):
                error = HookReturnError(
                    f"expected hook {step.label} to return Cont(scope), got"
                    f" {describe(result)} — return cont(info.scope) to leave it as it is",
                    hook=step.name,
                    stage=step.stage,
                )
                runner.fail(step, error, elapsed)
                continue
            if step.hook.shadow:
                # Recorded, never enforced: the session keeps the scope it had.
                runner.shadow_verdict(step, elapsed, "cont", result)
                continue
            runner.finished(step, elapsed, "cont")
            self._scope = result.value

    async def _end(self, reason: Reason, drain_timeout: float) -> None:
        """Run every end hook, shielded from cancellation; failures become events.

        Shielded so that a cancelled session still cleans up, also from asyncio's own
        cancellation arriving while they run (raised once they have all run); a hook's own
        ``timeout=`` bounds it (give one to any end hook that does I/O). A KeyboardInterrupt
        or SystemExit out of one is raised once the later ones have run, within
        `drain_timeout` all told (`_end_hooks`).
        """
        await to_the_end(lambda: self._end_hooks(reason, drain_timeout))

    async def _end_hooks(self, reason: Reason, drain_timeout: float) -> None:
        runner = _runner(self._plan, self._events.append, "")
        interrupt: BaseException | None = None
        interrupted = ""  # the end hook that raised it
        deadline = math.inf
        for step in self._plan.session_end:
            with anyio.CancelScope(deadline=deadline) as bound:
                try:
                    await self._end_hook(runner, step, reason)
                except (KeyboardInterrupt, SystemExit) as exc:
                    # The later end hooks still run ("always"), told the same reason: the
                    # session ended as it did, the interrupt came as it was cleaned up. They
                    # get the drain timeout all told, so that the interrupt is not held back
                    # by one that never returns.
                    if interrupt is None:
                        interrupt, interrupted = exc, step.label
                        deadline = anyio.current_time() + drain_timeout
                    else:
                        interrupt.add_note(
                            f"end hook {step.label} also raised {type(exc).__name__} as the"
                            " session ended"
                        )
            if bound.cancelled_caught:
                assert interrupt is not None
                cut = (
                    f"cut short: end hook {interrupted} raised {type(interrupt).__name__}, and"
                    " the end hooks after it did not finish within the session's drain timeout"
                    f" of {drain_timeout} s"
                )
                self._events.append(ev.HookFailed("", step.name, step.stage, cut, False))
        if interrupt is not None:
            raise interrupt

    async def _end_hook(self, runner: Runner, step: Step, reason: Reason) -> None:
        called = await runner.timed(step, self.info, reason, failed=self._end_failed)
        if called is None:
            return
        result, elapsed = called
        if inspect.iscoroutine(result):
            # Its value is ignored, but a coroutine is work that never ran (an await
            # forgotten): reported, and closed rather than left to warn.
            expected = "once its work is done (its value is ignored)"
            error = runner.wrong_return(step, result, expected, group=False)
            self._end_failed(step, error, elapsed, None)
            return
        runner.finished(step, elapsed, "ok")

    def _end_failed(
        self, step: Step, exc: Exception, _elapsed: float, _records: list[HookRecord] | None
    ) -> None:
        """An end hook's failure: an event, never raised (the session is closing anyway)."""
        self._events.append(ev.HookFailed("", step.name, step.stage, failure_detail(exc), False))


_T = TypeVar("_T")


async def _read(log: Log, what: str, read: Callable[[], Awaitable[_T]]) -> _T:
    """What `read` of `log` returns; a cancellation the log raised of itself, not one from
    outside, is reported as the log's (`what` it was doing)."""
    try:
        return await read()
    except BaseException as exc:
        if spurious_cancellation(exc):
            raise cancelled_itself(log, what, exc) from exc
        raise


async def load(log: Log, conversation_id: str) -> Context:
    """The conversation as `log` holds it, checked: a log of one's own may return anything."""
    what = f"loading conversation {conversation_id!r}"
    context: object = await _read(log, what, lambda: log.load(conversation_id))
    if type(context) is not Context:
        raise TypeError(
            f"{type(log).__name__}.load({conversation_id!r}) returned {describe(context)}, not a"
            " turns.Context — a Log's load returns the conversation as a Context (an empty"
            " Context() when it does not exist)"
        )
    return context


async def held_turn_refs(log: Log, conversation_id: str) -> frozenset[str]:
    """The turn_refs `log` holds for the conversation, read from its entries, checked.

    A log of one's own needs only load and append: one without `entries`, or whose
    `entries` returns None (the `Log` protocol's stub, which a class subclassing it inherits),
    cannot tell, and is taken at its word (none held).
    """
    if not is_async_callable(getattr(log, "entries", None)):
        return frozenset()
    what = f"reading the entries of conversation {conversation_id!r}"
    entries: object = await _read(log, what, lambda: log.entries(conversation_id))
    if entries is None:
        return frozenset()
    returned = describe(entries)
    if isinstance(entries, Sequence) and not isinstance(entries, str | bytes):
        odd = [entry for entry in entries if type(entry) is not LogEntry]
        if not odd:
            return frozenset(entry.turn_ref for entry in entries)
        returned += f", holding {describe(odd[0])}"
    raise TypeError(
        f"{type(log).__name__}.entries({conversation_id!r}) returned {returned}, not a"
        " sequence of pipeline.logs.LogEntry — a Log's entries returns the conversation's"
        " commits (an empty tuple when it does not exist), or None when it cannot tell"
    )


def cancelled_itself(log: Log, what: str, exc: BaseException, then: str = "") -> LogError:
    """The failure of a log whose call raised a `CancelledError` of its own while nothing
    cancelled the turn (`spurious_cancellation`: a library it awaits, say, awaited a future
    another task cancelled). Let through, it would end the turn as if cancelled, or, under
    asyncio, be taken for the cancellation of the caller's task."""
    return LogError(
        f"log {log!r} failed {what}: it raised {exc_text(exc)} itself (nothing cancelled the"
        f" caller) — a failure of the log's own code or of a library it awaits{then}",
        log=repr(log),
    )


_set_at = ev.Event.at.__set__  # type: ignore[attr-defined]


def _since(events: list[ev.Event], started: float) -> Emit:
    """What records a background hook's events, each stamped with the seconds since its
    turn started (`started`, on the loop's clock)."""

    def emit(event: ev.Event) -> None:
        _set_at(event, anyio.current_time() - started)
        events.append(event)

    return emit


def _current_task() -> object:
    if sniffio.current_async_library() == "trio":
        return trio.lowlevel.current_task()
    return asyncio.current_task()


@final
class _TurnLock:
    """The lock that runs a session's turns (and commits) one at a time, which any task may
    release.

    A lock (AnyIO's, the loop's) is released by the task that acquired it. A `session.stream`
    block inside an async generator that was never closed is left later by the loop's
    finaliser, in a task of its own (see `TurnEvents._abandoned`): held until then by a task
    that may have ended, the lock would never be released, and every later turn of the
    session would wait for ever. The acquiring task is kept for `_check_open`, which refuses
    a turn its owner starts inside its own.
    """

    __slots__ = ("_slot", "owner")

    def __init__(self) -> None:
        self._slot = anyio.Semaphore(1, max_value=1)  # a second release is an error
        self.owner: object = None

    async def __aenter__(self) -> None:
        await self._slot.acquire()
        self.owner = _current_task()

    async def __aexit__(self, *_: object) -> None:
        self.owner = None
        self._slot.release()


def _runner(plan: Plan, emit: Emit, turn_ref: str) -> Runner:
    runner = Runner(plan, emit)
    runner.turn_ref = turn_ref
    runner.now = anyio.current_time
    return runner


def open_session(
    plan: Plan,
    log: Log,
    conversation_id: str,
    scope: Scope | None,
    drain_timeout: float,
    open_tools: OpenTools | None = None,
) -> AbstractAsyncContextManager[Session]:
    """Check the session's arguments now, then open it on ``async with``.

    `open_tools` opens each turn's tools where they are connected (the MCP toolsets of the
    pipeline, whose connections its caller holds); None runs the plan's own tools.
    """
    # A session needs only load and append (the protocol's `entries` is for inspection).
    if isinstance(log, type) or not (
        is_async_callable(getattr(log, "load", None))
        and is_async_callable(getattr(log, "append", None))
    ):
        raise ConfigError(
            f"session(log=...) needs a Log instance with async load() and append(), got"
            f" {log!r} — try pipeline.logs.MemoryLog()"
        )
    if not isinstance(conversation_id, str) or not conversation_id:
        raise ConfigError(
            f"session(conversation_id=...) must be a non-empty string, got {conversation_id!r}"
        )
    if scope is not None and not isinstance(scope, Scope):
        raise ConfigError(f"session(scope=...) must be a Scope or None, got {scope!r}")
    if (
        isinstance(drain_timeout, bool)
        or not isinstance(drain_timeout, int | float)
        or math.isnan(drain_timeout)
        or drain_timeout < 0
    ):
        raise ConfigError(
            f"session(drain_timeout=...) must be a number of seconds >= 0, got {drain_timeout!r}"
        )
    return _session(plan, log, conversation_id, scope or Scope(), drain_timeout, open_tools)


@asynccontextmanager
async def _session(
    plan: Plan,
    log: Log,
    conversation_id: str,
    scope: Scope,
    drain_timeout: float,
    open_tools: OpenTools | None,
) -> AsyncIterator[Session]:
    current_loop("pipe.session(...)")
    # A log reads a conversation under any id it may hold, but stores none that is too long:
    # refused now, before any turn runs, not at its commit.
    check_id(conversation_id)
    context = await load(log, conversation_id)
    reason: Reason = "error"
    session: Session | None = None
    try:
        try:
            async with anyio.create_task_group() as task_group:
                session = Session(plan, log, conversation_id, scope, context, task_group)
                session._open_tools = open_tools
                await session._start()
                interrupt: BaseException | None = None
                try:
                    yield session
                except BaseException as exc:
                    # Ctrl-C ending the body (trio's KeyboardInterrupt, or a SystemExit) ends
                    # the session as asyncio's does (a cancellation of its task).
                    interrupt = interrupt_in(exc)
                    cancelled = interrupt is not None or only_cancelled(exc)
                    reason = "cancelled" if cancelled else "error"
                    raise
                else:
                    reason = "closed"
                finally:
                    # From here on no turn commits: one still running in a task outside the
                    # block would otherwise commit after the end hooks ran.
                    session._closed = True
                    if interrupt is not None:
                        # Not held back by the drain timeout, nor by a thread: the program
                        # is stopping, as when the interrupt comes during the drain.
                        session._cut(
                            f"cut short: the session was interrupted"
                            f" ({type(interrupt).__name__}); nothing of it was committed"
                        )
                    elif reason == "cancelled":
                        task_group.cancel_scope.cancel()
                    else:
                        try:
                            await session._drain(drain_timeout)
                        except (KeyboardInterrupt, SystemExit):
                            # Trio's Ctrl-C during the drain ends the session as asyncio's
                            # does (a cancellation of its task): its end hooks are told so.
                            reason = "cancelled"
                            raise
                        if reason == "closed":
                            # A cancellation that arrived as the drain ended ends the session
                            # cancelled, whatever the task group's exit delivers. After the
                            # body raised, the drain timeout's own cancellation would replace
                            # the body's exception here, and the task group absorb it.
                            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            # The block cancelled by a background hook's interrupt (or the caller's scope
            # cancelled at that moment): the interrupt wins, never lost to the cancellation.
            if session is None or session._interrupt is None:
                raise
        if session is not None and session._interrupt is not None:
            # The task group absorbs the cancellation it made, and the block's with it.
            reason = "error"
            raise session._interrupt
    except BaseException as exc:
        # Also a cancellation that arrives after the body returned (during the drain).
        if only_cancelled(exc):
            reason = "cancelled"
        if isinstance(exc, BaseExceptionGroup):
            reraise(own_error(exc))
        raise
    finally:
        if session is not None:
            session._closed = True
            await session._end(reason, drain_timeout)
