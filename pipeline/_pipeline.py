"""The pipeline: a frozen record of stages, validated when it is built."""

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn, final

import anyio
import attrs

from turns import Message, Scope, Turn

from . import events as ev
from ._budget import Budget, Tokenizer, checked_tokenizer
from ._drive import Drive
from ._errors import ConfigError
from ._groups import own_error, raise_single
from ._hooks import Chain, Hook, Parallel, as_hook, callable_name
from ._loop import Lot, current_loop, new_lot
from ._model import Model
from ._plan import (
    Group,
    PreStep,
    Step,
    check_arity,
    compile_lifecycle,
    compile_post,
    compile_pre,
    compile_tool_hooks,
    normalize_entries,
)
from ._result import TurnResult
from ._seam import Stage, TransformerFactory, compile_transformers
from ._session import Session, open_session
from ._tools import Tool, tool
from .logs import Log

Compactor = Callable[[tuple[Message, ...], int, Tokenizer], Any]
"""``compact(history, target_tokens, tokenizer) -> history`` (sync or async)."""


def _pre(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("pre", entries)


def _post(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("post", entries)


def _session_start(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("on_session_start", entries)


def _session_end(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("on_session_end", entries)


def _before_tool(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("before_tool", entries)


def _after_tool(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("after_tool", entries)


def _tools(entries: Iterable[Any]) -> tuple[Tool, ...]:
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise ConfigError(f"tools must be a list of tools, got {type(entries).__name__}")
    tools: list[Tool] = []
    seen: set[str] = set()
    for position, entry in enumerate(entries, 1):
        if not isinstance(entry, Tool):
            if not callable(entry):
                raise ConfigError(
                    f"tools, position {position}: expected a tool(...) or a typed function,"
                    f" got {type(entry).__name__} {entry!r}"
                )
            entry = tool(entry)
        if entry.name in seen:
            raise ConfigError(
                f"tools, position {position}: a second tool named {entry.name!r}; the model"
                " calls tools by name — give one another name with tool(fn, name=...)"
            )
        seen.add(entry.name)
        tools.append(entry)
    return tuple(tools)


def _check_positive(_instance: object, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"Pipeline({attribute.name}=...) must be a whole number >= 1, got {value!r}"
        )


def _check_permission(_instance: object, _attribute: object, permission: Any) -> None:
    if permission is None:
        return
    if not callable(permission):
        raise ConfigError(
            f"Pipeline(permission=...) must be a callback (call, question, turn) -> bool, got"
            f" {permission!r}"
        )
    check_arity(
        as_hook(permission),
        f"Pipeline(permission={callable_name(permission)})",
        "call, question, turn",
        3,
    )


def _factories(entries: Iterable[Any]) -> tuple[TransformerFactory, ...]:
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise ConfigError(
            f"transformers must be a list of transformer factories, got {type(entries).__name__}"
        )
    return tuple(entries)


def _check_bound(_instance: object, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"Pipeline({attribute.name}=...) must be a whole number >= 0, got {value!r}"
        )


def _check_flag(_instance: object, attribute: Any, value: Any) -> None:
    if type(value) is not bool:
        raise ConfigError(f"Pipeline({attribute.name}=...) must be True or False, got {value!r}")


def _check_model(_instance: object, _attribute: object, model: Any) -> None:
    if not isinstance(model, Model) or isinstance(model, type):
        raise ConfigError(
            f"Pipeline(model=...) needs a Model — an object with stream(request) — got"
            f" {type(model).__name__} {model!r}; for offline use try"
            " pipeline.testing.ScriptedModel([...])"
        )


def _check_system(_instance: object, _attribute: object, system: Any) -> None:
    if system is not None and not isinstance(system, str):
        raise ConfigError(f"Pipeline(system=...) must be text or None, got {system!r}")


def _check_budget(_instance: object, _attribute: object, budget: Any) -> None:
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigError(
            f"Pipeline(budget=...) must be Budget(context_tokens, injection_reserve) or None,"
            f" got {budget!r}"
        )


def _check_callable_or_none(_instance: object, attribute: Any, value: Any) -> None:
    if value is not None and not callable(value):
        raise ConfigError(f"Pipeline({attribute.name}=...) must be callable or None, got {value!r}")


@final
@attrs.frozen
class Pipeline:
    """The stages one turn flows through. Built once, run many times.

    Every entry is validated when the pipeline is built; a bad one raises `ConfigError`
    naming it. Lists are accepted and stored as tuples; plain functions are wrapped with
    `hook`'s defaults.

    Attributes:
        model: The `Model` that answers.
        pre: Ordered pre-message hooks and parallel groups.
        transformers: Stream-transformer factories; every text chunk passes through them.
        post: Ordered post-message hooks (guardrails first); ``background=True`` ones run
            after the commit.
        on_session_start: ``hook(session_info) -> Cont(scope)``, run when a session opens.
        on_session_end: ``hook(session_info, reason)``, run whenever a session closes.
        system: The system prompt, used when the turn's context has none.
        budget: Token limits for the rendered request and for injections.
        tokenizer: Counts tokens in text (``str -> int``); defaults to `estimate_tokens`.
        compact: ``(history, target_tokens, tokenizer) -> history``, applied to the
            history before the pre hooks when a budget is set; the log is never rewritten.
        tools: The tools the model may call (`tool(fn)`, or typed functions); they fill the
            turn's ``context.tools`` when it has none.
        before_tool: ``hook(call, turn) -> Cont(call) | Block | Ask | Halt``, for each call
            whose tool name the hook's ``match=`` accepts.
        after_tool: ``hook(call, result, turn) -> Cont(result) | Halt``, for each executed
            call.
        permission: ``(call, question, turn) -> bool`` (sync or async), asked when a
            before-tool hook returns ``ask(question)``; without one, such calls are blocked.
        max_steps: The most model calls of one attempt; a model still asking for tools on
            the last one raises `StepLimitExceeded`.
        tool_concurrency: The most tool calls of one model call running at once.
        max_regenerations: How many times post hooks may send the model back; then the
            outcome is ``"exhausted"``.
        hold_until_accepted: Hold each attempt's text events until the post hooks accept
            it, so a stream consumer never sees rejected text.
    """

    model: Model = attrs.field(kw_only=True, validator=_check_model)
    pre: tuple[Hook | Parallel | Chain, ...] = attrs.field(kw_only=True, default=(), converter=_pre)
    transformers: tuple[TransformerFactory, ...] = attrs.field(
        kw_only=True, default=(), converter=_factories
    )
    post: tuple[Hook | Parallel | Chain, ...] = attrs.field(
        kw_only=True, default=(), converter=_post
    )
    on_session_start: tuple[Hook | Parallel | Chain, ...] = attrs.field(
        kw_only=True, default=(), converter=_session_start
    )
    on_session_end: tuple[Hook | Parallel | Chain, ...] = attrs.field(
        kw_only=True, default=(), converter=_session_end
    )
    system: str | None = attrs.field(kw_only=True, default=None, validator=_check_system)
    budget: Budget | None = attrs.field(kw_only=True, default=None, validator=_check_budget)
    tokenizer: Tokenizer | None = attrs.field(
        kw_only=True, default=None, validator=_check_callable_or_none
    )
    compact: Compactor | None = attrs.field(
        kw_only=True, default=None, validator=_check_callable_or_none
    )
    tools: tuple[Tool, ...] = attrs.field(kw_only=True, default=(), converter=_tools)
    before_tool: tuple[Hook | Parallel | Chain, ...] = attrs.field(
        kw_only=True, default=(), converter=_before_tool
    )
    after_tool: tuple[Hook | Parallel | Chain, ...] = attrs.field(
        kw_only=True, default=(), converter=_after_tool
    )
    permission: Callable[..., Any] | None = attrs.field(
        kw_only=True, default=None, validator=_check_permission
    )
    max_steps: int = attrs.field(kw_only=True, default=8, validator=_check_positive)
    tool_concurrency: int = attrs.field(kw_only=True, default=4, validator=_check_positive)
    max_regenerations: int = attrs.field(kw_only=True, default=2, validator=_check_bound)
    hold_until_accepted: bool = attrs.field(kw_only=True, default=False, validator=_check_flag)
    _pre_plan: tuple[PreStep, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: compile_pre(self.pre), takes_self=True),
    )
    _count: Tokenizer = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: checked_tokenizer(self.tokenizer), takes_self=True),
    )
    _compact_hook: Hook | None = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(
            # Not callable: left to the validator, which names `compact=` in its error.
            lambda self: as_hook(self.compact) if callable(self.compact) else None,
            takes_self=True,
        ),
    )

    _transformers: tuple[Stage, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(
            lambda self: compile_transformers(self.transformers), takes_self=True
        ),
    )
    _post_plans: tuple[tuple[Step, ...], tuple[Step, ...]] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: compile_post(self.post), takes_self=True),
    )
    _start_plan: tuple[Step, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(
            lambda self: compile_lifecycle("session_start", self.on_session_start),
            takes_self=True,
        ),
    )
    _end_plan: tuple[Step, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(
            lambda self: compile_lifecycle("session_end", self.on_session_end),
            takes_self=True,
        ),
    )

    _tool_map: dict[str, Tool] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: {t.name: t for t in self.tools}, takes_self=True),
    )
    _before_plan: tuple[Step, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(
            lambda self: compile_tool_hooks("before_tool", self.before_tool), takes_self=True
        ),
    )
    _after_plan: tuple[Step, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(
            lambda self: compile_tool_hooks("after_tool", self.after_tool), takes_self=True
        ),
    )

    @property
    def _post_plan(self) -> tuple[Step, ...]:
        return self._post_plans[0]

    @property
    def _background_plan(self) -> tuple[Step, ...]:
        return self._post_plans[1]

    def __attrs_post_init__(self) -> None:
        if self._compact_hook is not None:
            check_arity(
                self._compact_hook,
                f"Pipeline(compact={self._compact_hook.name})",
                "history, target_tokens, tokenizer",
                3,
            )
        if self.compact is not None and self.budget is None:
            raise ConfigError(
                f"Pipeline(compact={callable_name(self.compact)}) needs a budget: compaction"
                " targets budget.context_tokens - budget.injection_reserve"
            )
        self._check_needed_tools()

    def _check_needed_tools(self) -> None:
        """Every hook that names pipeline tools it runs (``fn.needs_tools``) has them."""
        steps: list[Step] = []
        for step in (*self._pre_plan, *self._post_plan, *self._background_plan):
            steps.extend(step.members if isinstance(step, Group) else (step,))
        for step in steps:
            needed = getattr(step.hook.fn, "needs_tools", ())
            missing = [name for name in needed if name not in self._tool_map]
            if missing:
                raise ConfigError(
                    f"hook {step.label} runs the tools {missing}, which are not among the"
                    f" pipeline's tools {list(self._tool_map)} — add them to tools=[...]"
                )

    async def run(self, turn: Turn) -> TurnResult:
        """Run one turn through the pipeline (no log: nothing is committed).

        Returns:
            The `TurnResult`: ``"completed"``, ``"halted"`` or ``"exhausted"``. Background
            post hooks have finished when it returns.

        Raises:
            PipelineError: A hook failed, timed out or returned the wrong signal; the budget
                overflowed; the request was invalid; the model failed. Raised directly, never
                inside an ExceptionGroup.
        """
        _check_turn(turn)
        try:
            return await Drive(self, None).run(turn)
        except BaseExceptionGroup as group:
            raise_single(group)

    def stream(self, turn: Turn) -> AbstractAsyncContextManager["TurnEvents"]:
        """Run one turn, yielding its events as they happen.

        ``async with pipe.stream(turn) as events: async for event in events: ...``; once the
        events are exhausted, ``events.result`` is the `TurnResult` that `run` would have
        returned. Leaving the block before the end cancels the turn. A failure is raised from
        the iteration, directly, as `run` raises it.
        """
        _check_turn(turn)
        events = TurnEvents()
        return stream_turn(Drive(self, events._emit), turn, events)

    def session(
        self,
        *,
        log: Log,
        conversation_id: str,
        scope: Scope | None = None,
        drain_timeout: float = 10.0,
    ) -> AbstractAsyncContextManager[Session]:
        """Open a conversation: ``async with pipe.session(log=..., conversation_id=...) as s``.

        The session loads the conversation from `log`, runs ``on_session_start`` hooks, and
        commits every completed turn. On exit it waits up to `drain_timeout` seconds for
        background post hooks, then runs ``on_session_end`` hooks, whatever the exit.
        """
        return open_session(self, log, conversation_id, scope, drain_timeout)


@asynccontextmanager
async def stream_turn(
    drive: Drive, turn: Turn, events: "TurnEvents"
) -> AsyncIterator["TurnEvents"]:
    """Drive `turn` in a task of its own while the caller iterates `events`."""
    error: BaseException | None = None
    loop = current_loop("a streamed turn (Pipeline.stream, session.stream)")
    events._lot, events._taken = new_lot(loop), new_lot(loop)
    try:
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(events._drive, drive, turn)
            try:
                yield events
            finally:
                task_group.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        error = own_error(group)
    if error is not None:
        raise error
    if events._error is not None and not events._raised:
        events._raised = True
        raise events._error


@final
class TurnEvents:
    """The async iterator of a streamed turn's events; `result` once it is exhausted.

    Events are buffered without bound (a turn produces a bounded number of them), so a slow
    consumer never slows the turn. Buffered events are handed over without a trip through the
    scheduler; the consumer waits, and so checkpoints, once it has caught up with the turn.
    """

    # Slots: the drive reads `_waiting` once per event, the consumer `_buffer` twice.
    __slots__ = (
        "_buffer",
        "_done",
        "_error",
        "_exhausted",
        "_lot",
        "_raised",
        "_result",
        "_taken",
        "_waiting",
    )

    def __init__(self) -> None:
        self._buffer: deque[ev.Event] = deque()
        # The loop's own wake-ups, set when the turn starts (the loop is known then).
        self._lot: Lot = _NOT_STARTED
        self._taken: Lot = _NOT_STARTED
        self._waiting = False
        self._done = False
        self._result: TurnResult | None = None
        self._error: Exception | None = None
        self._raised = False
        self._exhausted = False

    @property
    def result(self) -> TurnResult:
        """The turn's result; available once every event was consumed."""
        if self._error is not None:
            raise RuntimeError(
                f"the turn failed with {type(self._error).__name__}, so it has no result"
            ) from self._error
        if self._result is None or not self._exhausted:
            raise RuntimeError(
                "the turn has not finished: iterate the events to the end before reading"
                " events.result"
            )
        return self._result

    def __aiter__(self) -> "TurnEvents":
        return self

    async def __anext__(self) -> ev.Event:
        while not self._buffer:
            if self._done:
                self._end()
            self._waiting = True
            try:
                await self._lot.park()
            finally:
                self._waiting = False
        event = self._buffer.popleft()
        if not self._buffer and self._taken:
            self._taken.unpark_all()
        return event

    async def _caught_up(self) -> None:
        """Wait until the consumer has taken every event emitted so far."""
        while self._buffer:
            await self._taken.park()

    def _emit(self, event: ev.Event) -> None:
        self._buffer.append(event)
        if self._waiting:
            # Wake the consumer once; until it runs, later events only join the buffer.
            self._waiting = False
            self._lot.unpark_all()

    def _end(self) -> NoReturn:
        self._exhausted = True
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error from self._error.__cause__
        raise StopAsyncIteration

    async def _drive(self, drive: Drive, turn: Turn) -> None:
        try:
            try:
                self._result = await drive.run(turn)
            except BaseExceptionGroup as group:
                raise_single(group)
        except Exception as exc:  # delivered to the consumer through the iteration
            self._error = exc
        finally:
            self._done = True
            self._lot.unpark_all()


class _NotStarted:
    """The lots of a TurnEvents whose turn has not started: nothing waits, nothing wakes."""

    def __bool__(self) -> bool:
        return False

    async def park(self) -> None:
        raise RuntimeError("a turn's events are read inside `async with pipe.stream(...)`")

    def unpark_all(self) -> None:
        pass


_NOT_STARTED = _NotStarted()


def _check_turn(turn: object) -> None:
    if not isinstance(turn, Turn):
        raise TypeError(
            f"a pipeline runs a Turn, got {type(turn).__name__} {turn!r} — build one with"
            " Turn.start(text)"
        )
