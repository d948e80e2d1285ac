"""The turn: one user message travelling through a pipeline, and its reply."""

import math
import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Literal, Self, TypeAlias, final

import attrs

from ._context import Context, RequestOptions, Scope, merge_extra, narrow_tools, reply_messages
from ._message import Message, _parts
from ._parts import (
    EMPTY,
    Part,
    Text,
    ToolCall,
    ToolResult,
    _shown,
    exchange_problem,
    part_problem,
)

Stage: TypeAlias = Literal["pre", "post"]

_NO_ANNOTATIONS = EMPTY
_PART_TYPES = (Text, ToolCall, ToolResult)


def _injections(injections: Iterable["Injection"]) -> tuple["Injection", ...]:
    return tuple(injections)


_STAGES = ("pre", "post")


def _check_source(_instance: Any, _attribute: Any, source: Any) -> None:
    if source is not None and not isinstance(source, str):
        raise TypeError(
            f"Injection.source must be the injecting hook's name (a str) or None, got"
            f" {_shown(source)}"
        )


def _check_durable(_instance: Any, _attribute: Any, durable: Any) -> None:
    # As a log reads it back: a bool (or 0 or 1). "yes" was committed as durable, and the
    # audit record holding it could never be read again.
    if not isinstance(durable, int) or durable not in (0, 1):
        raise TypeError(f"Injection.durable must be a bool, got {_shown(durable)}")


def _check_stage(_instance: Any, _attribute: Any, stage: Any) -> None:
    # Any other stage rendered and committed as a pre-stage injection, and the audit record
    # holding it could never be read again.
    if stage is not None and stage not in _STAGES:
        raise ValueError(
            f"Injection.stage must be 'pre', 'post' or None (not stamped yet), got {_shown(stage)}"
        )


def _check_count(instance: Any, attribute: Any, count: Any) -> None:
    # A number, as providers report it (a fractional count is kept, see serde), never a bool
    # or a string: a sum of usages or a committed audit record would fail far from here.
    if type(count) is int and count >= 0:  # the common case, checked first
        return
    if isinstance(count, bool) or not isinstance(count, int | float):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a number of tokens (an int"
            f" or float, 0 or more), got {_shown(count)}"
        )
    if not 0 <= count < math.inf:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be a number of tokens of 0 or"
            f" more (finite), got {_shown(count)}"
        )


@final
@attrs.frozen
class Injection:
    """Content a hook added to a turn.

    A hook creates one with `Turn.inject`; the runtime then stamps it with the hook's name
    (`source`), the hook's durability and the stage. An unstamped injection has
    ``source=None`` and renders as pre-stage content.

    Attributes:
        parts: The injected parts.
        source: The name of the hook that injected them.
        durable: Whether they join the conversation log on commit.
        stage: ``"pre"`` or ``"post"``.
    """

    parts: tuple[Part, ...] = attrs.field(converter=_parts)
    source: str | None = attrs.field(default=None, validator=_check_source)
    durable: bool = attrs.field(default=False, validator=_check_durable)
    stage: Stage | None = attrs.field(default=None, validator=_check_stage)


@final
@attrs.frozen
class Usage:
    """Token counts reported by the model."""

    input_tokens: int = attrs.field(default=0, validator=_check_count)
    output_tokens: int = attrs.field(default=0, validator=_check_count)

    def __add__(self, other: Self) -> Self:
        return type(self)(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )


def _check_reply_message(_instance: Any, _attribute: Any, message: Any) -> None:
    # Checked as the reply is built (a post hook's `attrs.evolve(reply, message=...)`): text
    # in its place failed only when the reply was committed or written, naming another field.
    if type(message) is not Message:
        raise TypeError(
            f"Reply.message must be the final assistant Message, got {_shown(message)} — build"
            ' it with Message.assistant("...")'
        )


@final
@attrs.frozen
class Reply:
    """The model's answer to a turn.

    Attributes:
        message: The final assistant message.
        messages: Everything the model exchange produced in the accepted attempt (assistant
            tool-call messages, tool messages, then `message`).
        attempt: The attempt number, from 1; 0 when a hook's `halt(..., reply=...)` supplied
            the answer and the model was never asked.
        finish_reason: Why the model stopped (``"stop"``, ``"length"``, ``"tool_calls"``, ...),
            or ``"halted"`` for a hook's substitute answer.
        usage: Token counts summed over the attempt's model calls.
        annotations: Findings reported by stream transformers, by transformer name.
        max_attempts: The most attempts the pipeline allows (``max_regenerations + 1``), so
            a guardrail can relax on the last one; None when no bound applies.
    """

    message: Message = attrs.field(validator=_check_reply_message)
    messages: tuple[Message, ...] = attrs.field(default=(), converter=reply_messages)
    attempt: int = 1
    finish_reason: str | None = None
    usage: Usage = Usage()
    annotations: Mapping[str, Any] = _NO_ANNOTATIONS
    max_attempts: int | None = None

    @property
    def last_attempt(self) -> bool:
        """Whether a rejection of this reply would exhaust the pipeline's bound."""
        return self.max_attempts is not None and self.attempt >= self.max_attempts

    @property
    def text(self) -> str:
        """The final message's text."""
        return self.message.text


def _fresh_ref() -> str:
    return os.urandom(16).hex()


@final
@attrs.frozen
class Turn:
    """One conversation turn: what the pipeline threads from hook to hook.

    Attributes:
        context: The conversation so far (or the per-turn view of it a hook set).
        user_message: What the user said this turn; in a turn that continues from tool
            results, the ``tool`` message holding them (see `Turn.start`).
        turn_ref: Correlates every event and the audit record of this turn.
        scope: Ambient state for hooks and tools.
        injections: What hooks added, in order.
        request: Per-turn request shaping.
        reply: The model's reply, once there is one (post stage).
    """

    context: Context
    user_message: Message
    turn_ref: str
    scope: Scope
    injections: tuple[Injection, ...] = attrs.field(default=(), converter=_injections)
    request: RequestOptions = RequestOptions()
    reply: Reply | None = None

    @classmethod
    def start(
        cls,
        message: str | Message,
        *,
        context: Context | None = None,
        scope: Scope | None = None,
        turn_ref: str | None = None,
    ) -> Self:
        """Start a turn from the user's text or message, or from tool results.

        A ``tool`` message (``Message("tool", results)``, one `ToolResult` per call) starts
        a turn that *continues* from tool results: the context's last message is the
        assistant message whose tool calls they answer (the caller ran the tools), and the
        model is asked again with the results. Every call of that message must be answered
        once. Such a turn renders the results right after the history and commits them in
        place of a user message.

        Args:
            message: The user's text, a complete user `Message`, or a tool message.
            context: The conversation so far; empty by default.
            scope: Ambient state; empty by default.
            turn_ref: A correlation id; a fresh random hex id by default.

        Raises:
            ValueError: A message of another role, or tool results that do not answer the
                tool calls of the context's last message.
        """
        if isinstance(message, str):
            message = Message.user(message)
        elif not isinstance(message, Message):
            raise TypeError(
                f"Turn.start expects the user's text or a Message, got {type(message).__name__}"
            )
        elif message.role not in ("user", "tool"):
            raise ValueError(
                f"Turn.start expects a user message (or a tool message continuing from tool"
                f" results), got role {message.role!r}"
            )
        if context is not None and not isinstance(context, Context):
            raise TypeError(
                f"Turn.start(context=...) takes a Context, got {type(context).__name__} — wrap"
                " the history: Context(messages=...)"
            )
        if scope is not None and not isinstance(scope, Scope):
            raise TypeError(
                f"Turn.start(scope=...) takes a Scope, got {type(scope).__name__} — e.g."
                " Scope(current_user=...)"
            )
        if turn_ref is not None and (not isinstance(turn_ref, str) or not turn_ref):
            raise ValueError(f"turn_ref must be a non-empty string, got {turn_ref!r}")
        if message.role == "tool":
            check_results(message, context)
        return cls(
            context=Context() if context is None else context,
            user_message=message,
            turn_ref=_fresh_ref() if turn_ref is None else turn_ref,
            scope=Scope() if scope is None else scope,
        )

    def inject(self, *parts: Part | str) -> Self:
        """Return a turn with one more injection holding `parts` (strings become `Text`).

        The runtime stamps the injection with the injecting hook's name and durability: while
        a hook runs, the runtime's `Stamper` stamps it here, as it is made; outside a hook it
        is left unstamped (``source=None``).
        """
        # A lone Text holding a str and no meta, the commonest, has nothing more to check.
        if (
            len(parts) != 1
            or type(parts[0]) is not Text
            or type(parts[0].text) is not str
            or parts[0].meta is not EMPTY
        ):
            parts = _checked_parts(parts)
        # The new Injection and Turn are built by filling their slots (see the fast builders
        # below): this runs once per injecting hook.
        injection: Injection = _bare(Injection)
        set_parts, set_source, set_durable, set_stage = _INJECTION_SLOTS
        set_parts(injection, parts)
        injections = self.injections
        # Concatenation copies the tuple in C, about twice as fast as unpacking.
        added = injections + (injection,)  # noqa: RUF005
        stamper = _STAMPER.get()
        if stamper is not None and (stamp := stamper.stamp) is not None:
            set_source(injection, stamp[0])
            set_durable(injection, stamp[1])
            set_stage(injection, stamp[2])
            # A chain of injections into the turn the last one returned keeps its start; an
            # injection into any other turn (a branch) starts a new chain.
            made = stamper._made
            chained = made[0] is stamp and made[2] is injections
            stamper._made = (stamp, made[1] if chained else injections, added)
        else:
            set_source(injection, None)
            set_durable(injection, False)
            set_stage(injection, None)
        new: Self = _bare(type(self))
        set_context, set_user, set_ref, set_scope, set_injections, set_request, set_reply = (
            _TURN_SLOTS
        )
        set_context(new, self.context)
        set_user(new, self.user_message)
        set_ref(new, self.turn_ref)
        set_scope(new, self.scope)
        set_injections(new, added)
        set_request(new, self.request)
        set_reply(new, self.reply)
        return new

    def with_request(self, **changes: Any) -> Self:
        """Return a turn with changed `RequestOptions`; each field composes by its own rule.

        ``temperature``, ``max_tokens`` and ``tool_choice``: the last writer wins.
        ``active_tools`` only narrows: it is intersected with the tools currently active (all
        of the context's tools when none were narrowed yet). On a turn whose context has no
        tools yet (the pipeline's ``tools=`` fill it when it runs), the names are kept as
        given, and the pipeline intersects them with its tools. ``extra`` shallow-merges into
        the current mapping: a later hook wins per key, and a key set to ``None`` is removed,
        so two hooks that each add a provider option both take effect.
        """
        unknown = changes.keys() - _REQUEST_FIELDS
        if unknown:
            raise TypeError(
                f"with_request() has no option {', '.join(map(repr, sorted(unknown)))} — the"
                f" options are {', '.join(sorted(_REQUEST_FIELDS))}; a provider's own option"
                " goes in extra={...}"
            )
        if "extra" in changes:
            changes["extra"] = merge_extra(self.request.extra, changes["extra"])
        if "active_tools" in changes and changes["active_tools"] is not None:
            wanted = changes["active_tools"]
            if isinstance(wanted, str):
                raise TypeError("active_tools must be a collection of tool names, not a str")
            current = self.request.active_tools
            if current is None and not self.context.tools:
                # No tools known yet (the pipeline fills them when the turn runs): keep the
                # names, which the pipeline intersects with its tools; intersecting them
                # with none would drop every tool.
                names = tuple(dict.fromkeys(wanted))
                odd = [name for name in names if not isinstance(name, str)]
                if odd:
                    raise TypeError(f"active_tools must be tool names (str), got {odd!r}")
                changes["active_tools"] = names
            else:
                if current is None:
                    current = self.context.tool_names
                changes["active_tools"] = narrow_tools(current, wanted)
        elif "active_tools" in changes and self.request.active_tools is not None:
            raise ValueError(
                "active_tools can only narrow: this turn already narrowed it to "
                f"{list(self.request.active_tools)}, so it cannot be widened back to all tools"
            )
        return attrs.evolve(self, request=attrs.evolve(self.request, **changes))

    def assign(self, **values: Any) -> Self:
        """Return a turn whose scope has `values` assigned (`Scope.assign`)."""
        return attrs.evolve(self, scope=self.scope.assign(**values))


_REQUEST_FIELDS = frozenset(field.name for field in attrs.fields(RequestOptions))


def check_results(message: Message, context: Context | None) -> None:
    """Check that a tool message answers every tool call of the context's last message once.

    Raises:
        ValueError: It does not; the message names the call at fault.
    """
    # Dicts: the calls in their order (for the messages), looked up in constant time, so
    # that a message answering many calls is checked in linear time.
    calls: dict[str, None] = {}
    if context is not None and context.messages:
        last = context.messages[-1]
        if last.role == "assistant":
            calls = dict.fromkeys(part.id for part in last.parts if type(part) is ToolCall)
    if not calls:
        raise ValueError(
            "a turn that continues from tool results needs the tool calls they answer: the"
            " context's last message must be the assistant message with those tool calls"
        )
    answered: set[str] = set()
    for part in message.parts:
        if type(part) is not ToolResult:
            raise ValueError(
                f"a tool message holds only ToolResult parts, got {type(part).__name__}"
            )
        if part.call_id not in calls:
            raise ValueError(
                f"tool result for call {part.call_id!r} answers no tool call of the context's"
                f" last message (its calls are {_some(calls)})"
            )
        if part.call_id in answered:
            raise ValueError(f"tool call {part.call_id!r} is answered twice")
        answered.add(part.call_id)
    missing = [call for call in calls if call not in answered]
    if missing:
        raise ValueError(
            f"tool calls {_some(missing)} have no result: every tool call of the context's last"
            " message needs one (send an error result for a call that could not run)"
        )


def _some(ids: Iterable[str], shown: int = 10) -> str:
    """`ids` as a list for a message, cut after `shown` of them (a message may answer
    thousands of calls)."""
    listed = list(ids)
    more = len(listed) - shown
    return f"{listed[:shown]}" if more <= 0 else f"{listed[:shown]} and {more} more"


# -- fast builders -----------------------------------------------------------------------------
#
# Every injecting hook builds an injection (stamped as it is made, see `Stamper`) and a turn.
# attrs' generated ``__init__`` (and ``attrs.evolve``, which calls it with every field by
# keyword) sets each slot by name through ``object.__setattr__`` and runs the converters;
# `Turn.inject` fills the slots through their descriptors instead, which builds the same
# frozen record (equal, same hash and repr) for about half the cost. The values are already
# converted (tuples). This is the only such builder: the runtime stamps through `Stamper` and
# builds any other injection with `Injection(...)`.

_bare = object.__new__
_TURN_SLOTS = tuple(getattr(Turn, field.name).__set__ for field in attrs.fields(Turn))
_INJECTION_SLOTS = tuple(
    getattr(Injection, field.name).__set__ for field in attrs.fields(Injection)
)
_BUILT = {
    Turn: ["context", "user_message", "turn_ref", "scope", "injections", "request", "reply"],
    Injection: ["parts", "source", "durable", "stage"],
}
for _cls, _names in _BUILT.items():
    if [field.name for field in attrs.fields(_cls)] != _names:  # pragma: no cover
        raise TypeError(
            f"{_cls.__name__}'s fields changed: update the fast builders of turns._turn"
        )


def _checked_parts(parts: tuple[Part | str, ...]) -> tuple[Part, ...]:
    """`Turn.inject`'s parts as a tuple of parts (strings become `Text`), or its error."""
    if not parts:
        raise ValueError(
            "Turn.inject needs at least one part, got none — pass the content to add,"
            ' e.g. turn.inject("The user\'s plan is Pro."); to add nothing, return the'
            " turn as it is"
        )
    checked = tuple(Text(part) if isinstance(part, str) else part for part in parts)
    for part in checked:
        if not isinstance(part, _PART_TYPES):
            raise TypeError(
                "Turn.inject takes Text, ToolCall, ToolResult or str parts, got "
                f"{type(part).__name__}"
            )
        problem = part_problem(part)
        if problem is not None:
            raise TypeError(f"Turn.inject: {problem}")
    problem = exchange_problem(checked)
    if problem is not None:
        raise ValueError(f"Turn.inject: {problem}")
    return checked


# -- stamping as Turn.inject injects -------------------------------------------------------

_Stamp: TypeAlias = tuple[str, bool, Stage]
_Made: TypeAlias = tuple[_Stamp | None, tuple[Injection, ...], tuple[Injection, ...]]
_NOTHING_MADE: _Made = (None, (), ())
_STAMPER: ContextVar["Stamper | None"] = ContextVar("turns.Stamper", default=None)


@final
class Stamper:
    """Stamps what `Turn.inject` adds with the hook that is running, as it is added.

    This is the runtime's side of "the runtime stamps it": a runtime makes a stamper current
    for the task that runs a stage's hooks (``with stamper:``), sets `stamp` to a hook's
    ``(name, durable, stage)`` just before calling the hook and back to None when it
    returns. While `stamp` is set, `Turn.inject` stamps each injection it makes with it.
    `added` then tells, in constant time, whether a turn's injections are exactly another's
    followed by injections made with a given stamp — the common case of a hook that only
    calls `Turn.inject` — so the runtime keeps them as they are instead of checking and
    stamping every injection again. In any other case (a hook that built, rewrote or removed
    injections itself) `added` is False and the runtime stamps the turn's new injections the
    long way; provenance cannot be forged through a stamper of one's own either, since only
    the runtime's stamper answers its `added`.

    Branching stays correct: injecting twice into the same turn gives two independent turns,
    and only the injections on the branch a hook returns count as its own.

    Attributes:
        stamp: ``(source, durable, stage)`` to stamp injections with, or None to leave them
            unstamped. The runtime builds one tuple per hook, once, and sets that same tuple
            each time the hook runs: `added` compares stamps by identity.
    """

    __slots__ = ("_made", "_token", "stamp")

    def __init__(self) -> None:
        self.stamp: _Stamp | None = None
        # The last chain of injections made with a stamp, as one value so that a reader
        # never sees half of an update: (the stamp, the injections the chain started from,
        # where it ends). Whatever wrote it, its end is its start followed by injections
        # made with its stamp.
        self._made: _Made = _NOTHING_MADE
        self._token: Token[Stamper | None] | None = None

    def __enter__(self) -> Self:
        if self._token is not None:
            raise RuntimeError("this Stamper is already current; enter it once at a time")
        self._token = _STAMPER.set(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        self.stamp = None
        assert token is not None
        _STAMPER.reset(token)

    def added(self, stamp: _Stamp, before: Turn, after: Turn) -> bool:
        """Whether `after`'s injections are `before`'s followed by injections made with `stamp`.

        True only when every injection `after` has beyond `before`'s was made by
        `Turn.inject` while this stamper's `stamp` was `stamp` (the same tuple), each
        extending the turn the previous one returned, starting from `before`'s.
        """
        made_with, start, end = self._made
        return made_with is stamp and end is after.injections and start is before.injections
