"""Injection hooks: fixed text, and retrieval for parallel groups."""

import inspect
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any, TypeAlias, final

from pipeline import ConfigError, Cont, Hook, cont, hook
from turns import Part, Text, ToolCall, ToolResult, Turn

from ._ask import check_callable, check_text, name_of

Search: TypeAlias = Callable[[str, int], Iterable[str | Part] | Awaitable[Iterable[str | Part]]]
"""``search(query, k)``, sync or async: up to `k` passages, as strings or parts."""

_PARTS = (Text, ToolCall, ToolResult)


def _check_durable(owner: str, durable: object) -> None:
    if type(durable) is not bool:
        raise ConfigError(f"{owner}(durable=...) must be True or False, got {durable!r}")


def inject_text(text: str, *, durable: bool = False) -> Hook:
    """A pre hook that injects `text` every turn (a date note, a house rule).

    Injected text reaches the model next to the user's message, after the history; it
    joins the conversation log only when `durable`.

    Raises:
        ConfigError: `text` is not non-empty text, or `durable` is not a bool.
    """
    check_text("inject_text", "text", text, optional=False)
    _check_durable("inject_text", durable)
    part = Text(text)

    async def run(turn: Turn) -> Cont[Turn]:
        return cont(turn.inject(part))

    return hook(run, name="inject_text", durable=durable)


def retrieve(search: Search, *, k: int = 4, durable: bool = False) -> Hook:
    """A parallel-group member that injects what `search` finds for the user's message.

    ``search(query, k)`` gets the user message's text and `k`, and returns up to `k`
    passages as strings (injected as text) or parts; only the first `k` are kept. The hook
    is named after `search`. Place it in ``parallel(...)``: members run concurrently, and
    their parts are added in declaration order. A sync `search` stays sync, so the runtime
    runs it in a worker thread (and abandons it when the hook's ``timeout=`` fires).

    Raises:
        ConfigError: `search` cannot be called as ``search(query, k)``, `k` is not a
            positive int, or `durable` is not a bool.
    """
    check_callable("retrieve", "search", search, ("query", 1))
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"retrieve(k=...) must be a positive int, got {k!r}")
    _check_durable("retrieve", durable)
    label = name_of(search)
    if _is_async(search):

        async def run_async(turn: Turn) -> list[Part]:
            found: Any = search(turn.user_message.text, k)
            return _parts(label, await found, k)

        return hook(run_async, name=label, durable=durable)

    def run(turn: Turn) -> Awaitable[list[Part]]:
        found = search(turn.user_message.text, k)
        if inspect.isawaitable(found):
            return _later(label, found, k)
        # An awaitable holding the result, so that `await hook(turn)` works on its own; in a
        # group the runtime, seeing a sync function, has already run this in a thread.
        return _Ready(_parts(label, found, k))

    return hook(run, name=label, durable=durable)


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or (
        callable(fn) and inspect.iscoroutinefunction(type(fn).__call__)
    )


async def _later(label: str, found: Awaitable[Any], k: int) -> list[Part]:
    return _parts(label, await found, k)


@final
class _Ready:
    """An awaitable whose value is already known."""

    __slots__ = ("value",)

    def __init__(self, value: list[Part]) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, list[Part]]:
        yield from ()  # a generator that never suspends: awaiting it returns at once
        return self.value


def _parts(label: str, found: object, k: int) -> list[Part]:
    """What a search returned, as at most `k` parts; a clear error for anything else."""
    if isinstance(found, str | bytes) or not isinstance(found, Iterable):
        raise TypeError(
            f"retrieve: {label} must return a list of passages (strings or parts), got"
            f" {type(found).__name__} {found!r:.60}"
        )
    parts: list[Part] = []
    for item in found:
        if len(parts) == k:
            break
        if isinstance(item, str):
            parts.append(Text(item))
        elif isinstance(item, _PARTS):
            parts.append(item)
        else:
            raise TypeError(
                f"retrieve: {label} returned {type(item).__name__} {item!r:.60} among its"
                " passages; each must be a string or a part (Text, ToolCall, ToolResult)"
            )
    return parts
