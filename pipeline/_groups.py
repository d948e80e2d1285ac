"""Unwrapping what trio's nurseries collect: callers see one exception, never a group."""

from collections.abc import Awaitable, Sequence
from typing import TypeVar

import trio

T = TypeVar("T")


async def unwrapped(run: Awaitable[T]) -> T:
    """Await `run`, raising what an ExceptionGroup from it carries, never the group."""
    try:
        return await run
    except BaseExceptionGroup as group:
        error = single(group)
        raise error from error.__cause__


def single(group: BaseExceptionGroup[BaseException]) -> BaseException:
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


def own_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a nursery around a caller's code collected: the caller's exception, intact.

    A nursery wraps the body's exception in a group, with the cancellations of its other
    tasks beside it. The body's own exception (a user's ExceptionGroup included) is
    returned as it was raised; only cancellations are set aside.
    """
    real = [exc for exc in group.exceptions if not only_cancelled(exc)]
    if len(real) == 1:
        return real[0]
    return single(group)


def only_cancelled(exc: BaseException) -> bool:
    """Whether `exc` is a cancellation, or a group of nothing but cancellations."""
    if isinstance(exc, BaseExceptionGroup):
        return all(isinstance(leaf, trio.Cancelled) for leaf in _leaves(exc))
    return isinstance(exc, trio.Cancelled)


def _leaves(group: BaseExceptionGroup[BaseException]) -> Sequence[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves
