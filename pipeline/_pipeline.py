"""The pipeline: a frozen record of stages, validated when it is built."""

import functools
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, Self, final

import attrs

from turns import Message, Scope, ToolCall, Turn

from . import events as ev
from ._budget import Budget, Tokenizer
from ._drive import Drive, OpenTools, turn_problem
from ._errors import ConfigError
from ._excgroups import raise_single
from ._hooks import Chain, Hook, Parallel, as_hook, callable_name
from ._model import Model, hold_model
from ._plan import Group, Plan, Step, check_arity, compile_plan, normalize_entries
from ._result import TurnResult
from ._seam import TransformerFactory
from ._session import Session, open_session
from ._stream import OneUse, TurnEvents, stream_turn
from ._tooljudge import ToolVerdict, judge_call
from ._tools import Tool, tool
from ._toolsets import (
    Lifetimes,
    Toolbox,
    Toolset,
    check_toolsets,
    open_toolbox,
    remote_toolsets,
    static_tools,
    turn_tools,
)
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


def _compile(pipe: "Pipeline") -> Plan:
    return compile_plan(
        model=pipe.model,
        pre=pipe.pre,
        post=pipe.post,
        before_tool=pipe.before_tool,
        after_tool=pipe.after_tool,
        on_session_start=pipe.on_session_start,
        on_session_end=pipe.on_session_end,
        transformers=pipe.transformers,
        tools=tuple(static_tools(pipe.tools, pipe.toolsets).values()),
        compact=pipe.compact,
        system=pipe.system,
        budget=pipe.budget,
        tokenizer=pipe.tokenizer,
        permission=pipe.permission,
        max_steps=pipe.max_steps,
        tool_concurrency=pipe.tool_concurrency,
        max_regenerations=pipe.max_regenerations,
        hold_until_accepted=pipe.hold_until_accepted,
    )


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
        toolsets: Named groups of tools (`toolset`, `mcp_toolset`), offered as
            ``<toolset>_<tool>``. MCP servers are connected by ``async with pipe``, by a
            session, or else by each turn for itself.
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
    toolsets: tuple[Toolset, ...] = attrs.field(kw_only=True, default=(), converter=check_toolsets)
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
    _plan: Plan = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: _compile(self), takes_self=True),
    )
    _remote: tuple[Toolset, ...] = attrs.field(
        init=False,
        repr=False,
        eq=False,
        default=attrs.Factory(lambda self: remote_toolsets(self.toolsets), takes_self=True),
    )
    _lifetime: Lifetimes = attrs.field(init=False, repr=False, eq=False, factory=Lifetimes)

    @property
    def _tool_map(self) -> Mapping[str, Tool]:
        """The tools known when the pipeline is built: its own and its local toolsets'."""
        return self._plan.tool_map

    def __attrs_post_init__(self) -> None:
        compact = self._plan.compact
        if compact is not None:
            check_arity(
                compact,
                f"Pipeline(compact={compact.name})",
                "history, target_tokens, tokenizer",
                3,
            )
        if self.compact is not None and self.budget is None:
            raise ConfigError(
                f"Pipeline(compact={callable_name(self.compact)}) needs a budget: compaction"
                " targets budget.context_tokens - budget.injection_reserve"
            )
        self._check_needed_tools()

    def _check_needed_tools(self, tools: Mapping[str, Tool] | None = None) -> None:
        """Every hook that names pipeline tools it runs (``fn.needs_tools``) has them, and
        every hook that reads its injections back from the history (``fn.needs_durable``)
        is durable.

        So does every tool hook whose ``match=`` names one tool, when the pipeline has tools
        (one without tools judges tools its callers run, `judge_tool_call`). With MCP
        toolsets, whose tools are known once connected, the check runs again on the
        connected tools (`tools`); until then a name not yet known is let through.
        """
        plan = self._plan
        if tools is None:
            tools = plan.tool_map
            if self._remote:
                return
        steps: list[Step] = []
        for step in (*plan.pre, *plan.post, *plan.background):
            steps.extend(step.members if isinstance(step, Group) else (step,))
        for step in steps:
            if getattr(step.hook.fn, "needs_durable", False) is True and not step.hook.durable:
                raise ConfigError(
                    f"hook {step.label} reads what it injected back from the conversation's"
                    " history, which a transient hook's injections never join — leave it"
                    " durable (no transient(), no durable=False)"
                )
            needed = getattr(step.hook.fn, "needs_tools", ())
            missing = [name for name in needed if name not in tools]
            if missing:
                raise ConfigError(
                    f"hook {step.label} runs the tools {missing}, which are not among the"
                    f" pipeline's tools {list(tools)} — add them to tools=[...]"
                )
        if not tools:
            return  # no tools of its own: its tool hooks judge its callers' (judge_tool_call)
        # A tool hook matching one tool by name (a server's too, once connected): a typo
        # would make it never run, silently — a tool policy that is not there.
        for step in (*plan.before_tool, *plan.after_tool):
            match = step.hook.match
            if isinstance(match, str) and match not in tools:
                where = " once its MCP servers are connected" if self._remote else ""
                raise ConfigError(
                    f"hook {step.label} matches the tool {match!r}, which is not among the"
                    f" pipeline's tools {list(tools)}{where} — check the name (a toolset's"
                    " tools are named <toolset>_<tool>)"
                )

    async def __aenter__(self) -> Self:
        """Hold the model's connections and connect the MCP servers of the toolsets, for
        every turn and session in the block.

        Every turn run inside reuses the provider's connection pool; the end of the block
        closes what it opened. Blocks may nest and overlap; a provider the caller opened
        itself (``async with model``) stays open.

        Raises:
            ToolsetError: A server could not be started, reached or listed.
        """
        hold = hold_model(self.model)
        await hold.__aenter__()
        try:
            await self._lifetime.enter(self, hold)
        except BaseException:
            await hold.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close what ``async with pipe`` opened (also when the block is cancelled).

        Raises:
            RuntimeError: No block is open on this event loop (the pipeline was never
                entered, exited more often than entered, or entered on another loop), or
                the task exiting it entered no block while another task's block holds MCP
                connections, which only that task can close; nothing is closed.
        """
        await self._lifetime.exit(exc)

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
            return await Drive(self._plan, None, open_tools=self._open_tools()).run(turn)
        except BaseExceptionGroup as group:
            raise_single(group)

    async def judge_tool_call(
        self,
        call: ToolCall,
        turn: Turn,
        *,
        emit: Callable[[ev.Event], None] | None = None,
    ) -> ToolVerdict:
        """Run the pipeline's before-tool hooks on `call`, as a turn's tool loop would.

        For a tool the pipeline does not run itself (a client's tool, a gateway's caller):
        every option applies as in a turn (``match=``, ``when=``, ``timeout=``, ``on_error=``,
        ``shadow=``), an ``ask`` goes to the pipeline's ``permission`` callback, and a hook
        may rewrite the call's arguments. `emit` receives the hooks' events (`HookStarted`,
        `HookFinished`, `ToolBlocked`, ...) as a streamed turn would.

        Returns:
            A `ToolVerdict`: the call as the hooks left it, and whether it may run.

        Raises:
            HookError: An enforced hook (``on_error="halt"``, the default) failed, timed out
                or returned the wrong signal, or the permission callback failed.
        """
        if not isinstance(call, ToolCall):
            raise TypeError(f"judge_tool_call() takes a turns.ToolCall, got {type(call).__name__}")
        _check_turn(turn)
        return await judge_call(self._plan, call, turn, emit)

    def stream(self, turn: Turn) -> AbstractAsyncContextManager["TurnEvents"]:
        """Run one turn, yielding its events as they happen.

        ``async with pipe.stream(turn) as events: async for event in events: ...``; once the
        events are exhausted, ``events.result`` is the `TurnResult` that `run` would have
        returned. Leaving the block before the end cancels the turn. A failure is raised from
        the iteration, directly, as `run` raises it.
        """
        _check_turn(turn)
        events = TurnEvents()

        def drive() -> Drive:
            return Drive(
                self._plan, events._emit, open_tools=self._open_tools(), relay=events._relay
            )

        return OneUse(stream_turn(drive, turn, events), "pipe.stream(turn)")

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
        opened = open_session(
            self._plan, log, conversation_id, scope, drain_timeout, self._open_tools()
        )
        return OneUse(self._held(opened), "pipe.session(...)")

    def _sharing(self, **changes: Any) -> "Pipeline":
        """A copy with `changes` to its hooks or options whose turns use what this pipeline's
        ``async with pipe`` holds open: its MCP connections (the model is the same object, so
        its pool is held already). A copy made by ``attrs.evolve`` has a lifetime of its own
        that no block entered, so each of its turns would start every MCP server anew; the
        gateway derives its pipelines from the one its command holds this way instead.

        Raises:
            ValueError: `changes` name the tools or toolsets, which the connections serve.
        """
        tooling = sorted({"tools", "toolsets"} & changes.keys())
        if tooling:
            raise ValueError(
                f"a pipeline sharing another's MCP connections keeps its tools; got changes"
                f" to {tooling} — use attrs.evolve for a pipeline of its own"
            )
        copy = attrs.evolve(self, **changes)
        object.__setattr__(copy, "_lifetime", self._lifetime)  # frozen: set once, here
        return copy

    def _open_tools(self, toolbox: Toolbox | None = None) -> OpenTools | None:
        """How a turn finds its MCP toolsets' tools: the toolbox of its session or of
        ``async with pipe``, else connections opened for the turn alone. None without MCP."""
        if not self._remote:
            return None
        return functools.partial(turn_tools, self, toolbox)

    @asynccontextmanager
    async def _held(self, opened: AbstractAsyncContextManager[Session]) -> AsyncIterator[Session]:
        # The model's connections, and the MCP servers unless `async with pipe` holds them,
        # live as long as the session: its turns reuse them. Those of `async with pipe` are
        # borrowed by each turn (`turn_tools`): a session does not hold the block open.
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(hold_model(self.model))
            toolbox = None
            if self._remote and self._lifetime.toolbox is None:
                toolbox = await stack.enter_async_context(open_toolbox(self))
            session = await stack.enter_async_context(opened)
            if toolbox is not None:
                session._open_tools = self._open_tools(toolbox)
            yield session


def _check_turn(turn: object) -> None:
    if not isinstance(turn, Turn):
        raise TypeError(
            f"a pipeline runs a Turn, got {type(turn).__name__} {turn!r} — build one with"
            " Turn.start(text)"
        )
    problem = turn_problem(turn)
    if problem is not None:
        what, fix = problem
        raise TypeError(f"a pipeline runs a well-formed Turn, but {what} — {fix}")
    if type(turn.turn_ref) is not str or not turn.turn_ref:
        raise TypeError(
            f"a pipeline runs a well-formed Turn, but its turn_ref is {turn.turn_ref!r}, not"
            " a non-empty string — Turn.start(...) gives a fresh one"
        )
