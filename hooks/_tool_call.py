"""Synthetic tool calls: a pre hook runs a real tool and injects the call with its result.

The model then reads fresh data (preferences, an account's state) as if it had asked for it,
in the form it understands best, without spending a model call. The pair is rendered as an
assistant tool-call message and its tool message right before the user message, and is
durable by default, so later turns can read it from the log. The time of the injection
rides in the pair's ``meta``, so the ``ttl`` and ``if_changed`` checks work on the log alone.
So does a renewal: when the ``ttl`` has run out and a re-fetch finds the value unchanged
(``if_changed``), nothing is injected, and the time of that check is recorded in the user
message's ``meta`` (`RENEWED_AT`), which the log keeps; the pair counts as fresh from then.
"""

import datetime
import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from pipeline import (
    INJECTED_BY,
    ConfigError,
    Cont,
    Hook,
    Tool,
    cont,
    current_tools,
    hook,
)
from turns import Message, ToolCall, ToolResult, Turn

from ._ask import check_callable

INJECTED_AT = "injected_at"
"""The `meta` key of a synthetic tool call and its result: when it was injected, in seconds
since the epoch (the hook's clock)."""

RENEWED_AT = "renewed_at"
"""The `meta` key of a user message recording renewals: a mapping from an `inject_tool_call`
hook's name to when it re-fetched its tool after the ``ttl`` ran out and found the result
unchanged (seconds since the epoch, the hook's clock). The hook's last pair counts as fresh
from the latest such time, so the tool is not run again until the ``ttl`` runs out anew."""

Frequency = Literal["always", "if_changed"]


class InjectToolCall:
    """The function behind `inject_tool_call`: configured once, called once per turn."""

    def __init__(
        self,
        tool: Tool | str,
        arguments: Mapping[str, Any],
        frequency: Frequency,
        ttl: float | None,
        name: str,
        clock: Callable[[], float],
    ) -> None:
        self.tool = tool
        self.tool_name = tool.name if isinstance(tool, Tool) else tool
        self.arguments = dict(arguments)
        self.frequency = frequency
        self.ttl = ttl
        self.name = name
        self.clock = clock
        # A tool named, not given, must be among the pipeline's tools: checked when built.
        self.needs_tools: tuple[str, ...] = () if isinstance(tool, Tool) else (tool,)
        # if_changed and ttl find the last pair in the history: a pipeline refuses the hook
        # re-wrapped as transient (transient(), hook(..., durable=False)).
        self.needs_durable = _reads_its_pairs(frequency, ttl)
        self.__qualname__ = self.__name__ = name

    def __repr__(self) -> str:
        return f"inject_tool_call({self.tool_name!r}, {self.arguments!r})"

    async def __call__(self, turn: Turn) -> Cont[Turn]:
        tool = self.tool if isinstance(self.tool, Tool) else current_tools().get(self.tool)
        if tool is None:
            raise LookupError(
                f"no tool named {self.tool_name!r} is running this turn; outside a pipeline,"
                " pass the Tool itself: inject_tool_call(my_tool)"
            )
        now = _seconds(self.clock(), f"inject_tool_call({self.tool_name!r})")
        last = self._last_pair(turn.context.messages)
        if self.ttl is not None and last is not None:
            at = last[2]
            # A time later than now (a worker whose clock ran ahead wrote it) is no proof
            # of freshness: taken as fresh, it would hold the refresh back by the skew.
            if isinstance(at, int | float) and 0 <= now - at < self.ttl:
                return cont(turn)
        call_id = _call_id(self.name, self.tool_name, turn.turn_ref)
        call = ToolCall(call_id, tool.name, self.arguments)
        result = await tool.run(call, turn.scope)
        if result.is_error:
            raise RuntimeError(f"tool {tool.name!r} failed, nothing injected: {result.content}")
        unchanged = last is not None and last[1] is not None and last[1].content == result.content
        if self.frequency == "if_changed" and unchanged:
            return cont(self._renewed(turn, now) if self.ttl is not None else turn)
        stamp = {INJECTED_AT: now}
        return cont(
            turn.inject(
                ToolCall(call.id, call.name, call.arguments, stamp),
                ToolResult(result.call_id, result.content, meta=stamp),
            )
        )

    def _last_pair(
        self, history: tuple[Message, ...]
    ) -> tuple[ToolCall, ToolResult | None, object] | None:
        """The last call this hook injected in `history`, its result, and since when it is
        fresh: its latest renewal after it, else its injection time."""
        renewed: object = None
        for index in range(len(history) - 1, -1, -1):
            message = history[index]
            if renewed is None:
                renewals = message.meta.get(RENEWED_AT)
                if isinstance(renewals, Mapping):
                    renewed = renewals.get(self.name)
            for part in message.parts:
                if (
                    type(part) is ToolCall
                    and part.name == self.tool_name
                    and self._injected_it(part.meta.get(INJECTED_BY))
                    and part.arguments == self.arguments
                ):
                    fresh_since = renewed if renewed is not None else part.meta.get(INJECTED_AT)
                    return part, _result_of(part.id, history[index + 1 :]), fresh_since
        return None

    def _injected_it(self, source: object) -> bool:
        """Whether a pair stamped as injected by `source` is this hook's.

        In a `chain`, the runtime stamps a member's pairs with its name prefixed by the
        chain's (``setup.inject_get_preferences``): the hook is still the one that wrote them.
        A hook of that name elsewhere (at the top level, in another chain) reads the same
        tool's pairs only when they were called with its arguments too: the same call.
        """
        return isinstance(source, str) and (source == self.name or source.endswith("." + self.name))

    def _renewed(self, turn: Turn, now: float) -> Turn:
        """`turn` with this renewal recorded in its user message's meta (committed with it)."""
        message = turn.user_message
        renewals = message.meta.get(RENEWED_AT)
        recorded = {**(renewals if isinstance(renewals, Mapping) else {}), self.name: now}
        meta = {**message.meta, RENEWED_AT: recorded}
        return attrs.evolve(turn, user_message=attrs.evolve(message, meta=meta))


def _reads_its_pairs(frequency: str, ttl: float | None) -> bool:
    """Whether the hook reads its last pair back from the history (``if_changed``, a ttl),
    which a transient pair never joins."""
    return frequency == "if_changed" or ttl is not None


def _result_of(call_id: str, messages: tuple[Message, ...]) -> ToolResult | None:
    for message in messages:
        for part in message.parts:
            if type(part) is ToolResult and part.call_id == call_id:
                return part
    return None


def _seconds(now: object, owner: str) -> float:
    """A clock's reading, which must be seconds: it is stamped in the pair's ``meta``, which
    a log stores as JSON, and compared with the ``ttl``."""
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise TypeError(
            f"{owner}: clock() must return seconds since the epoch as a finite number (as"
            f" time.time does), got {type(now).__name__} {now!r:.60}"
        )
    return now


_ID_CHARS = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what providers accept (Anthropic checks)


def _call_id(hook_name: str, tool_name: str, turn_ref: str) -> str:
    """The id of the pair a hook injects in a turn: unique per hook and per turn.

    A hook with its default name (one per tool) reads ``injected_<tool>_<turn_ref>`` when
    that is a valid id in full; any other gets a digest of its name, its tool and the turn,
    so that two hooks on one tool, told apart by name, or a long tool name cut short, never
    share an id.
    """
    readable = f"injected_{tool_name}_{turn_ref}"
    if hook_name == f"inject_{tool_name}" and _ID_CHARS.fullmatch(readable):
        return readable
    key = "\0".join((hook_name, tool_name, turn_ref)).encode("utf-8", "surrogatepass")
    return f"injected_{hashlib.sha256(key).hexdigest()[:40]}"


def inject_tool_call(
    tool: Tool | str,
    arguments: Mapping[str, Any] | None = None,
    *,
    frequency: Frequency = "always",
    ttl: float | datetime.timedelta | None = None,
    durable: bool = True,
    name: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Hook:
    """A pre hook that runs a real tool and injects the call and its result.

    Args:
        tool: A `Tool`, or the name of one of the pipeline's tools (checked when the
            pipeline is built).
        arguments: The tool's arguments; checked against its schema now when `tool` is a
            `Tool`, else on every run.
        frequency: ``"always"``, or ``"if_changed"``: skip when the last pair this hook
            injected (found in the history) carries the same result.
        ttl: Seconds (or a timedelta): skip while the last pair is fresher than this. With
            ``frequency="if_changed"``, a re-fetch after it ran out that finds the same
            result renews the pair: the time is recorded in the user message's ``meta``
            (`RENEWED_AT`), and the hook skips again until the ttl runs out anew.
        durable: Whether the pair joins the log (the default; ``ttl`` and ``if_changed``
            read the log, so they need it: with ``durable=False`` they are refused).
        name: The hook's name; ``inject_<tool>`` by default. The pair's parts carry it in
            ``meta["injected_by"]`` (prefixed by a `chain`'s name when it runs in one),
            which is how the hook finds its own last pair. Give it here: re-wrapping with
            ``hook(..., name=...)`` renames the events, not the pairs the hook looks for.
        clock: Seconds since the epoch; `time.time` by default. It is read once per
            turn, and a reading that is not a finite number fails the hook (open: nothing
            is injected, and a `HookFailed` event says why).

    A failing tool injects nothing: the hook fails open (``on_error="skip"``), which a
    `HookFailed` event records.
    """
    if not isinstance(tool, Tool) and (not isinstance(tool, str) or not tool):
        raise ConfigError(f"inject_tool_call: tool must be a Tool or a tool's name, got {tool!r}")
    tool_name = tool.name if isinstance(tool, Tool) else tool
    if arguments is not None and not isinstance(arguments, Mapping):
        raise ConfigError(
            f"inject_tool_call({tool_name!r}): arguments must be a mapping, got {arguments!r}"
        )
    arguments = dict(arguments or {})
    if isinstance(tool, Tool):
        checked = tool.check(ToolCall("check", tool.name, arguments))
        if isinstance(checked, str):
            raise ConfigError(f"inject_tool_call({tool_name!r}): invalid arguments: {checked}")
    if frequency not in ("always", "if_changed"):
        raise ConfigError(
            f"inject_tool_call({tool_name!r}): frequency must be 'always' or 'if_changed',"
            f" got {frequency!r}"
        )
    seconds = ttl.total_seconds() if isinstance(ttl, datetime.timedelta) else ttl
    if seconds is not None and (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigError(
            f"inject_tool_call({tool_name!r}): ttl must be a positive number of seconds or a"
            f" timedelta, got {ttl!r}"
        )
    if durable is False and _reads_its_pairs(frequency, seconds):
        raise ConfigError(
            f"inject_tool_call({tool_name!r}): frequency='if_changed' and ttl look for the"
            " hook's last pair in the history, which a transient pair (durable=False) never"
            " joins, so they would never skip — leave the pair durable, or drop them"
        )
    if not callable(clock):
        raise ConfigError(f"inject_tool_call({tool_name!r}): clock must be callable")
    # Not read here: a scripted clock would lose a reading, and one that reads the time of
    # a request (a context variable) has none yet. Each turn checks its reading.
    check_callable("inject_tool_call", "clock", clock, ())
    label = name if name is not None else f"inject_{tool_name}"
    fn = InjectToolCall(tool, arguments, frequency, seconds, label, clock)
    return hook(fn, name=label, durable=durable, on_error="skip")
