"""The compiled `Plan`: what the runtime runs, built once by `Pipeline` from its fields.

Chains are flattened here, once, when the pipeline is built: a chain behaves exactly like its
members standing in the list, so the drive loop never sees one. Every step knows its
effective name (chain prefixes applied) and its position for error messages.

The runner, the stages, the drive and sessions take a `Plan`, never the `Pipeline`: the
façade sits above them all and nothing below reads its private fields.
"""

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias, final

import attrs

from turns import Message, Stage

from ._budget import Budget, Tokenizer, checked_tokenizer
from ._errors import ConfigError
from ._hooks import Chain, Hook, Parallel, as_hook
from ._model import Model
from ._seam import CompiledTransformer, TransformerFactory, compile_transformers
from ._tools import Tool


@final
@attrs.frozen
class Step:
    """One hook as the drive loop runs it."""

    hook: Hook
    name: str
    stage: str
    position: str
    direct: bool = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(
            lambda self: self.hook.is_async and self.hook.timeout is None, takes_self=True
        ),
    )
    """Whether the drive loop may simply ``await hook.fn(...)``: async, no timeout."""
    plain: bool = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(
            lambda self: self.direct and self.hook.when is None and not self.hook.shadow,
            takes_self=True,
        ),
    )
    """Whether the drive loop may run and judge it inline: direct, enforced, no ``when=``."""
    stamp: tuple[str, bool, Stage] = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(
            lambda self: (self.name, self.hook.durable, "post" if self.stage == "post" else "pre"),
            takes_self=True,
        ),
    )
    """What `Turn.inject` stamps with while this hook runs in an ordered stage (`Stamper`):
    one tuple per step, set each time it runs, since stamps are compared by identity."""

    @property
    def label(self) -> str:
        """``'name' (stage, position N)`` for messages."""
        return f"{self.name!r} ({self.stage}, position {self.position})"


@final
@attrs.frozen
class Group:
    """A parallel group as the drive loop runs it."""

    members: tuple[Step, ...]
    name: str
    stage: str
    position: str


PreStep: TypeAlias = Step | Group


def normalize_entries(stage: str, entries: Iterable[Any]) -> tuple[Hook | Parallel | Chain, ...]:
    """The entries of a stage list as a tuple, plain functions wrapped into hooks."""
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise ConfigError(f"{stage} must be a list of hooks, got {type(entries).__name__}")
    normalized: list[Hook | Parallel | Chain] = []
    for position, entry in enumerate(entries, 1):
        if isinstance(entry, Hook | Parallel | Chain):
            normalized.append(entry)
        elif callable(entry):
            normalized.append(as_hook(entry))
        else:
            raise ConfigError(
                f"{stage}, position {position}: expected a hook function, hook(...),"
                f" parallel(...) or chain(...), got {type(entry).__name__} {entry!r}"
            )
    return tuple(normalized)


def compile_pre(entries: tuple[Hook | Parallel | Chain, ...]) -> tuple[PreStep, ...]:
    """Flatten the pre list into steps, checking each hook's options suit the pre stage."""
    steps: list[PreStep] = []
    for position, entry in enumerate(entries, 1):
        _flatten(entry, str(position), "", steps)
    return tuple(steps)


def _flatten(
    entry: Hook | Parallel | Chain,
    position: str,
    prefix: str,
    out: list[PreStep],
    stage: str = "pre",
) -> None:
    if isinstance(entry, Hook):
        if stage == "pre":
            out.append(_pre_step(entry, prefix + entry.name, position))
        else:
            step = Step(entry, prefix + entry.name, stage, position)
            check_arity(entry, f"hook {step.label}", "turn", 1)
            out.append(step)
    elif isinstance(entry, Parallel):
        members = tuple(
            _pre_step(member, prefix + member.name, f"{position}.{index}")
            for index, member in enumerate(entry.members, 1)
        )
        out.append(Group(members, prefix + entry.name, "pre", position))
    else:
        for index, member in enumerate(entry.members, 1):
            if stage != "pre" and isinstance(member, Parallel):
                raise ConfigError(
                    f"{stage}, position {position}.{index}: parallel group {member.name!r}"
                    f" in chain {entry.name!r} belongs in pre"
                )
            _flatten(member, f"{position}.{index}", f"{prefix}{entry.name}.", out, stage)


def check_arity(hook: Hook, label: str, arguments: str, count: int) -> None:
    """Raise unless `hook`'s function can be called with `count` positional arguments.

    Functions whose signature cannot be read (some builtins) are given the benefit of the
    doubt: the call itself will tell. A generator function is refused: calling it gives a
    generator, never what the stage expects.
    """
    if inspect.isgeneratorfunction(hook.fn) or inspect.isasyncgenfunction(hook.fn):
        raise ConfigError(
            f"{label} is a generator function (it yields): calling it gives a generator, not"
            " what a hook returns — `return` the result once (e.g. `return cont(turn)`)"
            " instead of `yield`"
        )
    try:
        signature = inspect.signature(hook.fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(count))
    except TypeError as exc:
        raise ConfigError(
            f"{label} cannot be called as {hook.name}({arguments}): {exc} — a hook"
            " takes the stage's arguments positionally"
        ) from None


def _pre_step(hook: Hook, name: str, position: str) -> Step:
    step = Step(hook, name, "pre", position)
    check_arity(hook, f"hook {step.label}", "turn", 1)
    if hook.match is not None:
        raise ConfigError(
            f"hook {step.label}: match= is for tool hooks (before_tool, after_tool); a pre"
            " hook runs once per turn — use when= to run it conditionally"
        )
    if hook.background:
        raise ConfigError(
            f"hook {step.label}: background=True is for post hooks, which may run after the"
            " turn is committed; a pre hook must finish before the model is called"
        )
    return step


def compile_post(
    entries: tuple[Hook | Parallel | Chain, ...],
) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """Flatten the post list into its ordered steps and its background steps."""
    ordered: list[PreStep] = []
    background: list[Step] = []
    for position, entry in enumerate(entries, 1):
        if isinstance(entry, Parallel):
            raise ConfigError(
                f"post, position {position}: parallel group {entry.name!r} belongs in pre;"
                " post hooks judge one reply in order (guardrails before side effects)"
            )
        if isinstance(entry, Hook) and entry.background:
            step = Step(entry, entry.name, "post", str(position))
            check_arity(entry, f"hook {step.label}", "turn", 1)
            _check_post(step, chained=False)
            background.append(step)
            continue
        _flatten(entry, str(position), "", ordered, "post")
    steps: list[Step] = []
    for entry_step in ordered:
        assert isinstance(entry_step, Step)
        _check_post(entry_step, chained=True)
        steps.append(entry_step)
    return tuple(steps), tuple(background)


def _check_post(step: Step, *, chained: bool) -> None:
    if step.hook.background and chained:
        raise ConfigError(
            f"hook {step.label}: background=True inside a chain; a background hook runs on its"
            " own after the commit — place it directly in the post list"
        )
    if step.hook.match is not None:
        raise ConfigError(
            f"hook {step.label}: match= is for tool hooks (before_tool, after_tool); use when="
            " to run a post hook conditionally"
        )


def compile_lifecycle(stage: str, entries: tuple[Hook | Parallel | Chain, ...]) -> tuple[Step, ...]:
    """The session hooks of `stage` (``"session_start"`` or ``"session_end"``) as steps."""
    arguments = "session_info" if stage == "session_start" else "session_info, reason"
    steps: list[Step] = []
    for position, entry in enumerate(entries, 1):
        if not isinstance(entry, Hook):
            raise ConfigError(
                f"on_{stage}, position {position}: expected a hook function, got"
                f" {type(entry).__name__}; groups and chains run per turn, not per session"
            )
        step = Step(entry, entry.name, stage, str(position))
        check_arity(entry, f"hook {step.label}", arguments, arguments.count(",") + 1)
        if entry.background or entry.match is not None or entry.when is not None:
            raise ConfigError(
                f"hook {step.label}: background=, match= and when= do not apply to session hooks"
            )
        steps.append(step)
    return tuple(steps)


def compile_tool_hooks(
    stage: str, entries: tuple[Hook | Parallel | Chain, ...]
) -> tuple[Step, ...]:
    """The ``before_tool`` or ``after_tool`` hooks as steps; chains are flattened."""
    arguments = "call, turn" if stage == "before_tool" else "call, result, turn"
    steps: list[Step] = []

    def add(entry: Hook | Parallel | Chain, position: str, prefix: str) -> None:
        if isinstance(entry, Parallel):
            raise ConfigError(
                f"{stage}, position {position}: parallel group {entry.name!r} belongs in pre;"
                " tool hooks run in order for each call (calls themselves run concurrently)"
            )
        if isinstance(entry, Chain):
            for index, member in enumerate(entry.members, 1):
                add(member, f"{position}.{index}", f"{prefix}{entry.name}.")
            return
        step = Step(entry, prefix + entry.name, stage, position)
        check_arity(entry, f"hook {step.label}", arguments, arguments.count(",") + 1)
        if entry.background:
            raise ConfigError(
                f"hook {step.label}: background=True is for post hooks; a tool hook decides"
                " about a call before the model reads its result"
            )
        steps.append(step)

    for position, entry in enumerate(entries, 1):
        add(entry, str(position), "")
    return tuple(steps)


@final
@attrs.frozen
class Plan:
    """A pipeline compiled for running: its stage lists as steps, its tools by name, its limits.

    Built once per `Pipeline` (`compile_plan`); frozen, so every turn shares it.
    """

    model: Model
    pre: tuple[PreStep, ...]
    post: tuple[Step, ...]
    background: tuple[Step, ...]
    before_tool: tuple[Step, ...]
    after_tool: tuple[Step, ...]
    session_start: tuple[Step, ...]
    session_end: tuple[Step, ...]
    transformers: tuple[CompiledTransformer, ...]
    tools: tuple[Tool, ...]
    tool_map: Mapping[str, Tool]
    compact: Hook | None
    system: str | None
    budget: Budget | None
    tokenizer: Tokenizer | None
    """The user's tokenizer, or None: whether counting is asked for even when no one listens."""
    count: Tokenizer
    """How tokens are counted: the tokenizer, checked and guarded, or `estimate_tokens`."""
    permission: Callable[..., Any] | None
    max_steps: int
    tool_concurrency: int
    max_regenerations: int
    hold_until_accepted: bool
    declared: tuple[tuple[str, tuple[Hook | Parallel | Chain, ...]], ...] = ()
    """The hook stages as the pipeline declared them (groups and chains unflattened), for
    observers that describe a hook by where it stands (the tracer); the runtime never reads
    them."""


def compile_plan(
    *,
    model: Model,
    pre: tuple[Hook | Parallel | Chain, ...],
    post: tuple[Hook | Parallel | Chain, ...],
    before_tool: tuple[Hook | Parallel | Chain, ...],
    after_tool: tuple[Hook | Parallel | Chain, ...],
    on_session_start: tuple[Hook | Parallel | Chain, ...],
    on_session_end: tuple[Hook | Parallel | Chain, ...],
    transformers: tuple[TransformerFactory, ...],
    tools: tuple[Tool, ...],
    compact: Callable[[tuple[Message, ...], int, Tokenizer], Any] | None,
    system: str | None,
    budget: Budget | None,
    tokenizer: Tokenizer | None,
    permission: Callable[..., Any] | None,
    max_steps: int,
    tool_concurrency: int,
    max_regenerations: int,
    hold_until_accepted: bool,
) -> Plan:
    """Compile a pipeline's fields, in the order a bad entry is reported: pre first."""
    pre_steps = compile_pre(pre)
    count = checked_tokenizer(tokenizer)
    # Not callable: left to the validator, which names `compact=` in its error.
    compact_hook = as_hook(compact) if callable(compact) else None
    compiled = compile_transformers(transformers)
    post_steps, background = compile_post(post)
    session_start = compile_lifecycle("session_start", on_session_start)
    session_end = compile_lifecycle("session_end", on_session_end)
    tool_map = {t.name: t for t in tools}
    return Plan(
        model=model,
        pre=pre_steps,
        post=post_steps,
        background=background,
        before_tool=compile_tool_hooks("before_tool", before_tool),
        after_tool=compile_tool_hooks("after_tool", after_tool),
        session_start=session_start,
        session_end=session_end,
        transformers=compiled,
        tools=tools,
        tool_map=tool_map,
        compact=compact_hook,
        system=system,
        budget=budget,
        tokenizer=tokenizer,
        count=count,
        permission=permission,
        max_steps=max_steps,
        tool_concurrency=tool_concurrency,
        max_regenerations=max_regenerations,
        hold_until_accepted=hold_until_accepted,
        declared=(
            ("pre", pre),
            ("post", post),
            ("before_tool", before_tool),
            ("after_tool", after_tool),
        ),
    )
