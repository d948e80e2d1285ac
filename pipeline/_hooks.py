"""Hooks: plain functions wrapped with the options the runtime applies to them."""

import inspect
import math
import re
from collections.abc import Callable
from typing import Any, Literal, TypeAlias, final, overload

import attrs

from turns import Turn

from ._errors import ConfigError

OnError: TypeAlias = Literal["halt", "skip"]
Matcher: TypeAlias = str | re.Pattern[str] | Callable[[str], bool]
When: TypeAlias = Callable[[Turn], bool]


def callable_name(fn: object) -> str:
    """A readable name for `fn`: its qualified name without ``<locals>`` noise."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):
        inner = getattr(fn, "func", None)  # functools.partial
        if inner is not None and inner is not fn:
            return callable_name(inner)
        name = type(fn).__name__
    return name.replace("<locals>.", "")


def is_async_callable(fn: object) -> bool:
    """Whether calling `fn` returns a coroutine (functions, partials, async __call__)."""
    if inspect.iscoroutinefunction(fn):
        return True
    return callable(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def _check_fn(instance: Any, _attribute: Any, fn: Any) -> None:
    if not callable(fn):
        raise ConfigError(
            f"hook {instance.name!r}: its function must be callable, got {type(fn).__name__} {fn!r}"
        )


def _check_name(instance: Any, _attribute: Any, name: Any) -> None:
    if not isinstance(name, str) or not name:
        owner = callable_name(instance.fn) if instance is not None else "a group or chain"
        raise ConfigError(
            f"the name of the hook for {owner} must be a non-empty string, got {name!r}"
        )


def _check_bool(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not bool:
        raise ConfigError(
            f"hook {instance.name!r}: {attribute.name} must be True or False, got {value!r}"
        )


def _check_timeout(instance: Any, _attribute: Any, timeout: Any) -> None:
    if timeout is None:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigError(
            f"hook {instance.name!r}: timeout must be a positive number of seconds or None,"
            f" got {timeout!r}"
        )


def _check_on_error(instance: Any, _attribute: Any, on_error: Any) -> None:
    if on_error not in ("halt", "skip"):
        raise ConfigError(
            f"hook {instance.name!r}: on_error must be 'halt' (fail closed) or 'skip'"
            f" (fail open), got {on_error!r}"
        )


def _check_when(instance: Any, _attribute: Any, when: Any) -> None:
    if when is not None and not callable(when):
        raise ConfigError(
            f"hook {instance.name!r}: when must be a predicate turn -> bool, got {when!r}"
        )
    if when is not None and is_async_callable(when):
        raise ConfigError(
            f"hook {instance.name!r}: when= must be a plain (sync) predicate turn -> bool;"
            f" {callable_name(when)} is async — do the async work in the hook itself"
        )
    if when is not None:
        _check_predicate(instance, "when", when, "turn")


def _check_match(instance: Any, _attribute: Any, match: Any) -> None:
    if match is None:
        return
    if isinstance(match, str):
        if not match:
            raise ConfigError(
                f"hook {instance.name!r}: match='' names no tool, so the hook would never run"
                " — give the tool's name, a compiled regex or a predicate name -> bool"
            )
        return
    if isinstance(match, re.Pattern):
        if not isinstance(match.pattern, str):
            raise ConfigError(
                f"hook {instance.name!r}: match={match!r} is a bytes regex, which cannot match"
                " a tool's name (text) — compile it from a str"
            )
        return
    if callable(match):
        _check_predicate(instance, "match", match, "name")
        return
    raise ConfigError(
        f"hook {instance.name!r}: match must be a tool name, a compiled regex or a predicate"
        f" name -> bool, got {match!r}"
    )


def _check_predicate(instance: Any, option: str, predicate: Any, argument: str) -> None:
    """Raise unless `predicate` can be called with one positional argument.

    Checked when the hook is built, so that a predicate of the wrong shape is not found
    mid-turn as a failure of the hook. A signature that cannot be read is trusted.
    """
    try:
        signature = inspect.signature(predicate)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        raise ConfigError(
            f"hook {instance.name!r}: {option}= must be a predicate {argument} -> bool, called"
            f" with the {argument} alone; {callable_name(predicate)}({argument}) cannot be"
            f" called: {exc}"
        ) from None


@final
@attrs.frozen
class Hook:
    """A function and the options the runtime applies when it runs.

    Build one with `hook`; plain functions placed in a pipeline are wrapped with the defaults.
    Calling a `Hook` calls its function, so it can be tested alone with ``await h(turn)``.
    """

    fn: Callable[..., Any] = attrs.field(validator=_check_fn)
    name: str = attrs.field(validator=_check_name)
    durable: bool = attrs.field(default=False, validator=_check_bool)
    timeout: float | None = attrs.field(default=None, validator=_check_timeout)
    on_error: OnError = attrs.field(default="halt", validator=_check_on_error)
    shadow: bool = attrs.field(default=False, validator=_check_bool)
    when: When | None = attrs.field(default=None, validator=_check_when)
    match: Matcher | None = attrs.field(default=None, validator=_check_match)
    background: bool = attrs.field(default=False, validator=_check_bool)
    is_async: bool = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(lambda self: is_async_callable(self.fn), takes_self=True),
    )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class _Missing:
    def __repr__(self) -> str:
        return "<default>"


_MISSING: Any = _Missing()


@overload
def hook(
    fn: Callable[..., Any],
    *,
    name: str | None = ...,
    durable: bool = ...,
    timeout: float | None = ...,
    on_error: OnError = ...,
    shadow: bool = ...,
    when: When | None = ...,
    match: Matcher | None = ...,
    background: bool = ...,
) -> Hook: ...
@overload
def hook(
    fn: None = None,
    *,
    name: str | None = ...,
    durable: bool = ...,
    timeout: float | None = ...,
    on_error: OnError = ...,
    shadow: bool = ...,
    when: When | None = ...,
    match: Matcher | None = ...,
    background: bool = ...,
) -> Callable[[Callable[..., Any]], Hook]: ...
def hook(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = _MISSING,
    durable: bool = _MISSING,
    timeout: float | None = _MISSING,
    on_error: OnError = _MISSING,
    shadow: bool = _MISSING,
    when: When | None = _MISSING,
    match: Matcher | None = _MISSING,
    background: bool = _MISSING,
) -> Hook | Callable[[Callable[..., Any]], Hook]:
    """Wrap `fn` into a `Hook`; usable as ``@hook`` or ``@hook(durable=True, ...)``.

    Args:
        fn: The hook function, sync or async. A `Hook` is re-wrapped with the options given.
        name: The name in events, errors and the audit record; defaults to the function's
            qualified name.
        durable: Whether what the hook injects joins the conversation log.
        timeout: Seconds the hook may take; past it the hook fails with `HookTimeout`.
        on_error: ``"halt"`` fails the turn when the hook raises (fail closed); ``"skip"``
            records the failure and goes on without it (fail open, this hook only).
        shadow: Run the hook and record its verdicts without enforcing them.
        when: A predicate on the turn; the hook runs only when it is true.
        match: Tool hooks only: which tool names the hook applies to.
        background: Post stage only: run after the turn is committed, without delaying it.

    Raises:
        ConfigError: An option is invalid; the message names the hook.
    """
    options: dict[str, Any] = {
        key: value
        for key, value in (
            ("name", name),
            ("durable", durable),
            ("timeout", timeout),
            ("on_error", on_error),
            ("shadow", shadow),
            ("when", when),
            ("match", match),
            ("background", background),
        )
        if value is not _MISSING
    }
    if options.get("name", _MISSING) is None:
        del options["name"]

    def wrap(fn: Callable[..., Any]) -> Hook:
        if isinstance(fn, Hook):
            return attrs.evolve(fn, **options)
        given = dict(options)  # the decorator may wrap several functions
        if isinstance(fn, Parallel | Chain):
            raise ConfigError(
                f"hook() wraps one function, got {type(fn).__name__} {fn.name!r}; options"
                " belong on its members"
            )
        name = given.pop("name") if "name" in given else callable_name(fn)
        return Hook(fn=fn, name=name, **given)

    if fn is None:
        return wrap
    return wrap(fn)


def as_hook(entry: object) -> Hook:
    """`entry` as a `Hook`: hooks as they are, plain callables wrapped with the defaults."""
    if isinstance(entry, Hook):
        return entry
    return Hook(fn=entry, name=callable_name(entry))  # type: ignore[arg-type]


@final
@attrs.frozen
class Parallel:
    """Pre-stage hooks that run concurrently and may only append content (see `parallel`)."""

    members: tuple[Hook, ...]
    name: str


def parallel(*hooks: Callable[..., Any], name: str | None = None) -> Parallel:
    """Group append-only hooks that run concurrently on the same turn.

    Each member returns a sequence of parts to inject (or a `Halt`). Their parts are added in
    declaration order, never completion order. Place the group in a pipeline's ``pre`` list.

    Raises:
        ConfigError: No members, or a member that is itself a group or a chain.
    """
    if not hooks:
        raise ConfigError(
            "parallel() needs at least one member hook, got none — pass the hooks to run"
            " concurrently, e.g. parallel(fetch_docs, fetch_profile)"
        )
    members = []
    for position, member in enumerate(hooks, 1):
        if isinstance(member, Parallel | Chain):
            raise ConfigError(
                f"parallel() member {position} is a {type(member).__name__} ({member.name!r});"
                " members must be single hooks — place groups and chains in the pre list"
            )
        members.append(as_hook(member))
    if name is None:
        name = f"parallel({', '.join(member.name for member in members)})"
    _check_name(None, None, name)
    return Parallel(tuple(members), name)


@final
@attrs.frozen
class Chain:
    """An ordered sub-pipeline placed as one hook (see `chain`)."""

    members: tuple["Hook | Parallel | Chain", ...]
    name: str


def chain(*hooks: Callable[..., Any] | Parallel | Chain, name: str | None = None) -> Chain:
    """Package ordered hooks as one reusable hook.

    The members run in order, thread the turn and stop at the first `Halt`, exactly as if
    they stood in the pipeline's list; their names in events are prefixed with the chain's
    (``"chain.member"``).

    Raises:
        ConfigError: No members.
    """
    if not hooks:
        raise ConfigError(
            "chain() needs at least one member hook, got none — pass the hooks to run in"
            " order, e.g. chain(scrub, check)"
        )
    members = tuple(
        member if isinstance(member, Parallel | Chain) else as_hook(member) for member in hooks
    )
    if name is None:
        name = f"chain({', '.join(member.name for member in members)})"
    _check_name(None, None, name)
    return Chain(members, name)
