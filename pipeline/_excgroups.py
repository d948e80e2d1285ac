"""Unwrapping what task groups collect: callers see one exception, never a group.

On both loops a task group raises an ExceptionGroup; a cancellation in it is
`trio.Cancelled` under trio and `asyncio.CancelledError` under asyncio.

Also the one rule for several failures at once (group members, a batch's tool calls, a
nursery's tasks): the first wins, the others ride along as notes on it.
"""

from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from ._loop import is_cancellation

E = TypeVar("E", bound=BaseException)


def first_failure(failures: Sequence[E], note: Callable[[E], str]) -> E:
    """The failure that wins — the first — with `note(other)` added to it for each other one."""
    first = failures[0]
    for other in failures[1:]:
        first.add_note(note(other))
    return first


def stopping_interrupt(
    raised: Sequence[tuple[BaseException, bool, str]], stopped: str
) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit that stopped a group of tasks, if any.

    `raised` holds, in the group's order, each interrupt with whether it came while the
    group was being cancelled, and who raised it. One raised before the cancel stopped the
    group (the first in order, among several at the same instant); one raised during it
    wins only when none came before (the group stopped by a failure or a halt). The others
    ride along as notes, as `first_failure`'s do.
    """
    if not raised:
        return None
    ordered = sorted(raised, key=lambda entry: entry[1])  # stable: order kept among equals
    who = {id(interrupt): name for interrupt, _, name in ordered}
    return first_failure(
        [interrupt for interrupt, _, _ in ordered],
        lambda other: f"{who[id(other)]} also raised {type(other).__name__} as {stopped} stopped",
    )


def raise_single(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Raise what `group` carries, never the group: call it in ``except BaseExceptionGroup``.

    An except clause at the call site rather than a wrapper coroutine: a turn's coroutine
    stack is walked at every checkpoint, so each level costs on every chunk.
    """
    reraise(single(group))


def reraise(error: BaseException) -> NoReturn:
    """Raise `error` again as it was first raised: its cause and its own context (what it
    was raised while handling, which a traceback shows) kept, where raising it in an
    ``except`` clause makes the exception handled there (the group) its context.

    The context is put back as the exception leaves, before anyone can catch it.
    """
    context, suppressed = error.__context__, error.__suppress_context__
    try:
        raise error
    finally:
        error.__context__, error.__suppress_context__ = context, suppressed
        del error, context  # no cycle through this frame: the traceback holds it


def single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception to raise for `group`: its one real failure (others attached as notes),
    or, when it holds only cancellations, one cancellation for the caller's scope."""
    leaves = _leaves(group)
    failures = [exc for exc in leaves if not is_cancellation(exc)]
    if not failures:
        return leaves[0]
    return first_failure(failures, lambda other: f"also failed: {type(other).__name__}: {other}")


def own_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a task group around a caller's code collected: the caller's exception, intact.

    A task group wraps the body's exception in a group, with the cancellations of its other
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
        return all(is_cancellation(leaf) for leaf in _leaves(exc))
    return is_cancellation(exc)


def interrupt_in(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit `exc` is, or the first one a group holds (beside
    cancellations or other failures: the program is stopping either way); else None."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for leaf in _leaves(exc):
            if isinstance(leaf, KeyboardInterrupt | SystemExit):
                return leaf
    return None


def _leaves(group: BaseExceptionGroup[BaseException]) -> Sequence[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves
