"""The pipeline: a frozen record of stages, validated when it is built."""

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn, final

import attrs
import trio

from turns import Message, Turn

from . import events as ev
from ._budget import Budget, Tokenizer, checked_tokenizer
from ._drive import Drive
from ._errors import ConfigError
from ._hooks import Chain, Hook, Parallel, as_hook, callable_name
from ._model import Model
from ._plan import PreStep, check_arity, compile_pre, normalize_entries
from ._result import TurnResult

Compactor = Callable[[tuple[Message, ...], int, Tokenizer], Any]
"""``compact(history, target_tokens, tokenizer) -> history`` (sync or async)."""


def _pre(entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    return normalize_entries("pre", entries)


def _check_model(_instance: object, _attribute: object, model: Any) -> None:
    if not isinstance(model, Model):
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
        system: The system prompt, used when the turn's context has none.
        budget: Token limits for the rendered request and for injections.
        tokenizer: Counts tokens in text (``str -> int``); defaults to `estimate_tokens`.
        compact: ``(history, target_tokens, tokenizer) -> history``, applied to the
            history before the pre hooks when a budget is set; the log is never rewritten.
    """

    model: Model = attrs.field(kw_only=True, validator=_check_model)
    pre: tuple[Hook | Parallel | Chain, ...] = attrs.field(kw_only=True, default=(), converter=_pre)
    system: str | None = attrs.field(kw_only=True, default=None, validator=_check_system)
    budget: Budget | None = attrs.field(kw_only=True, default=None, validator=_check_budget)
    tokenizer: Tokenizer | None = attrs.field(
        kw_only=True, default=None, validator=_check_callable_or_none
    )
    compact: Compactor | None = attrs.field(
        kw_only=True, default=None, validator=_check_callable_or_none
    )
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

    async def run(self, turn: Turn) -> TurnResult:
        """Run one turn through the pipeline.

        Returns:
            The `TurnResult`: ``"completed"`` or ``"halted"`` (``"exhausted"`` once the post
            stage regenerates).

        Raises:
            PipelineError: A hook failed, timed out or returned the wrong signal; the budget
                overflowed; the request was invalid; the model failed. Raised directly, never
                inside an ExceptionGroup.
        """
        _check_turn(turn)
        return await _unwrapped(Drive(self, None).run(turn))

    @asynccontextmanager
    async def stream(self, turn: Turn) -> AsyncIterator["TurnEvents"]:
        """Run one turn, yielding its events as they happen.

        ``async with pipe.stream(turn) as events: async for event in events: ...``; once the
        events are exhausted, ``events.result`` is the `TurnResult` that `run` would have
        returned. Leaving the block before the end cancels the turn. A failure is raised from
        the iteration, directly, as `run` raises it.
        """
        _check_turn(turn)
        events = TurnEvents()
        error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(events._drive, Drive(self, events._emit), turn)
                try:
                    yield events
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            error = _single(group)
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

    def __init__(self) -> None:
        self._buffer: deque[ev.Event] = deque()
        self._lot = trio.lowlevel.ParkingLot()
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
        return self._buffer.popleft()

    def _emit(self, event: ev.Event) -> None:
        self._buffer.append(event)
        if self._waiting:
            self._lot.unpark_all()

    def _end(self) -> NoReturn:
        self._exhausted = True
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error from self._error.__cause__
        raise StopAsyncIteration

    async def _drive(self, drive: Drive, turn: Turn) -> None:
        try:
            self._result = await _unwrapped(drive.run(turn))
        except Exception as exc:  # delivered to the consumer through the iteration
            self._error = exc
        finally:
            self._done = True
            self._lot.unpark_all()


async def _unwrapped(run: Any) -> TurnResult:
    """Await `run`, raising what an ExceptionGroup from it carries, never the group."""
    try:
        result: TurnResult = await run
    except BaseExceptionGroup as group:
        error = _single(group)
        raise error from error.__cause__
    return result


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception to raise for `group`: its one real failure (others attached as notes),
    or, when it holds only cancellations, one `trio.Cancelled` for the caller's scope."""
    leaves = _leaves(group)
    failures = [exc for exc in leaves if not isinstance(exc, trio.Cancelled)]
    if not failures:
        return leaves[0]
    first = failures[0]
    for other in failures[1:]:
        first.add_note(f"also failed: {type(other).__name__}: {other}")
    return first


def _leaves(group: BaseExceptionGroup[BaseException]) -> Sequence[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves


def _check_turn(turn: object) -> None:
    if not isinstance(turn, Turn):
        raise TypeError(
            f"a pipeline runs a Turn, got {type(turn).__name__} {turn!r} — build one with"
            " Turn.start(text)"
        )
