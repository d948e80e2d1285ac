"""Offline, deterministic models for examples and tests.

`ScriptedModel` plays replies written in advance; `FunctionModel` computes each reply from
the request. A reply is a `str` (one chunk) or a sequence whose items are `str` chunks and
`ToolCall` parts; `FunctionModel` may also return an async iterable of such items, which is
streamed lazily (so chunks can be spaced out in time).
"""

import inspect
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from contextlib import AbstractAsyncContextManager
from typing import TypeAlias, final

from turns import ToolCall, Usage
from turns._parts import part_problem

from ._budget import CHARS_PER_TOKEN, estimate_tokens, message_tokens, part_tokens
from ._errors import ProviderError
from ._model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall

__all__ = ["FunctionModel", "ReplyFunction", "ScriptItem", "ScriptReply", "ScriptedModel"]

ScriptItem: TypeAlias = str | ToolCall
ScriptReply: TypeAlias = str | Sequence[ScriptItem]


def _check_reply(reply: object, where: str) -> tuple[ScriptItem, ...]:
    if isinstance(reply, str):
        return (reply,)
    if isinstance(reply, list | tuple):
        for item in reply:
            # Plain chunks first: a reply of many chunks is checked once per model call.
            if type(item) is str:
                continue
            if not isinstance(item, str | ToolCall):
                raise TypeError(
                    f"{where}: a reply's items must be str chunks or ToolCall parts, got"
                    f" {type(item).__name__} {item!r}"
                )
            # A tool call with an id that is no str, or arguments that are no mapping,
            # would otherwise fail as the pipeline builds the reply, naming no reply.
            problem = part_problem(item) if isinstance(item, ToolCall) else None
            if problem is not None:
                raise TypeError(f"{where}: {problem}")
        return tuple(reply)
    raise TypeError(
        f"{where}: a reply must be a str or a list of str chunks and ToolCall parts, got"
        f" {type(reply).__name__} {reply!r}"
    )


_new = object.__new__
_set_text = ModelText.text.__set__  # type: ignore[attr-defined]


def _text(chunk: str) -> ModelText:
    """``ModelText(chunk)``, its slot filled directly: built once per chunk of every reply."""
    event = _new(ModelText)
    _set_text(event, chunk)
    return event


@final
class _Events:
    """A reply's events, built once, and what its playback reports at the end."""

    __slots__ = ("called", "events", "output")

    def __init__(self, items: Sequence[ScriptItem]) -> None:
        output = 0
        events: list[ModelEvent] = []
        for item in items:
            if type(item) is str:
                output -= -len(item) // CHARS_PER_TOKEN
                events.append(_text(item))
                continue
            output += _item_tokens(item)
            events.append(ModelToolCall(item) if isinstance(item, ToolCall) else ModelText(item))
        self.events = tuple(events)
        self.output = output
        self.called = any(isinstance(item, ToolCall) for item in items)


async def _replay(events: _Events, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
    # The per-chunk path of a scripted turn: the events were built with the script.
    for event in events.events:
        yield event
    usage = Usage(message_tokens(request.messages, estimate_tokens), events.output)
    yield ModelFinish("tool_calls" if events.called else "stop", usage)


async def _play(
    items: AsyncIterable[ScriptItem] | Sequence[ScriptItem], request: ModelRequest, where: str
) -> AsyncGenerator[ModelEvent, None]:
    # The per-chunk path of every computed offline turn: plain str chunks are counted inline
    # (`estimate_tokens`, unrolled) and their events built inline (`_text`, without the
    # call); the other items take the general path.
    output = 0
    called = False
    new, set_text = _new, _set_text
    if isinstance(items, AsyncIterable):
        async for item in items:
            if type(item) is str:
                output -= -len(item) // CHARS_PER_TOKEN
                event = new(ModelText)
                set_text(event, item)
                yield event
                continue
            _check_reply([item], where)
            output += _item_tokens(item)
            called = called or isinstance(item, ToolCall)
            yield ModelToolCall(item) if isinstance(item, ToolCall) else ModelText(item)
    else:
        for item in items:
            if type(item) is str:
                output -= -len(item) // CHARS_PER_TOKEN
                event = new(ModelText)
                set_text(event, item)
                yield event
                continue
            output += _item_tokens(item)
            called = called or isinstance(item, ToolCall)
            yield ModelToolCall(item) if isinstance(item, ToolCall) else ModelText(item)
    usage = Usage(message_tokens(request.messages, estimate_tokens), output)
    yield ModelFinish("tool_calls" if called else "stop", usage)


@final
class _Playback:
    """What a testing model's ``stream(request)`` returns: one reply played, closed on exit.

    A small class rather than ``@asynccontextmanager``: no generator of its own (the loop
    tracks every async generator) on a path every offline turn takes.
    """

    __slots__ = ("_events", "_request", "_start")

    def __init__(
        self,
        start: Callable[[ModelRequest], Awaitable[AsyncGenerator[ModelEvent, None]]],
        request: ModelRequest,
    ) -> None:
        self._start = start
        self._request = request

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        self._events = await self._start(self._request)
        return self._events

    async def __aexit__(self, *exc_info: object) -> None:
        await self._events.aclose()


_PLAYED = 64  # replies a FunctionModel keeps built
_SEQ = (list, tuple)


def _item_tokens(item: ScriptItem) -> int:
    return estimate_tokens(item) if isinstance(item, str) else part_tokens(item, estimate_tokens)


@final
class ScriptedModel:
    """A model that plays `replies` in order, one per call.

    A script may repeat a tool call (``[call], [call]`` with the same `ToolCall`): a call
    whose id the request's messages or an earlier call of the reply already have runs under
    that id with the first free suffix (``c1_2``), which the events, the hooks, the audit,
    the log and the next request all hold.

    Attributes:
        replies: The script.
        requests: Every `ModelRequest` it was sent, in order.
    """

    def __init__(self, replies: Sequence[ScriptReply]) -> None:
        if isinstance(replies, str):
            raise TypeError("ScriptedModel takes a list of replies; wrap a single reply: [reply]")
        if not isinstance(replies, Iterable):
            raise TypeError(
                f"ScriptedModel takes a list of replies, got {type(replies).__name__}"
                f' {replies!r:.60} — e.g. ScriptedModel(["Hello!"])'
            )
        self.replies: tuple[tuple[ScriptItem, ...], ...] = tuple(
            _check_reply(reply, f"ScriptedModel reply {index}")
            for index, reply in enumerate(replies, 1)
        )
        self.requests: list[ModelRequest] = []
        self._events = tuple(_Events(reply) for reply in self.replies)
        self._script = self.replies  # what `_events` was built from

    def __repr__(self) -> str:
        return f"ScriptedModel({len(self.replies)} replies, {len(self.requests)} played)"

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        return _Playback(self._start, request)

    async def _start(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        self.requests.append(request)
        call = len(self.requests)
        if call > len(self.replies):
            raise ProviderError(
                f"ScriptedModel ran out of replies: it holds {len(self.replies)} and was called"
                f" {call} times — add a reply for each model call (regenerations and tool"
                " steps call the model again)",
                provider="scripted",
            )
        if self.replies is not self._script:  # the script was replaced: build it again
            self.replies = tuple(
                _check_reply(reply, f"ScriptedModel reply {index}")
                for index, reply in enumerate(self.replies, 1)
            )
            self._events = tuple(_Events(reply) for reply in self.replies)
            self._script = self.replies
        return _replay(self._events[call - 1], request)


ReplyFunction: TypeAlias = Callable[
    [ModelRequest],
    ScriptReply | AsyncIterable[ScriptItem] | Awaitable[ScriptReply | AsyncIterable[ScriptItem]],
]


@final
class FunctionModel:
    """A model whose reply `fn(request)` computes (sync or async).

    Attributes:
        fn: The reply function.
        requests: Every `ModelRequest` it was sent, in order.
    """

    def __init__(self, fn: ReplyFunction) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionModel takes a function request -> reply, got {fn!r}")
        self.fn = fn
        self.requests: list[ModelRequest] = []
        # The events of the replies played lately, by their items: a function that returns
        # the same reply again (most do, in tests) replays it without building it again.
        self._played: dict[tuple[ScriptItem, ...], _Events] = {}

    def __repr__(self) -> str:
        return f"FunctionModel({getattr(self.fn, '__qualname__', self.fn)!r})"

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        return _Playback(self._start, request)

    async def _start(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        self.requests.append(request)
        where = f"FunctionModel {getattr(self.fn, '__qualname__', self.fn)}"
        reply = self.fn(request)
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, AsyncIterable):
            return _play(reply, request, where)
        # A reply equal to one played lately was checked then (equal items: same kinds).
        key = (reply,) if type(reply) is str else tuple(reply) if type(reply) in _SEQ else None
        try:
            events = self._played.get(key) if key is not None else None
        except TypeError:  # a tool call with unhashable arguments: built every time
            key = events = None
        if events is None:
            events = _Events(_check_reply(reply, where))
            if key is not None:
                if len(self._played) >= _PLAYED:
                    self._played.clear()
                self._played[key] = events
        return _replay(events, request)
