"""Stage 4: the request the model is sent, checked locally, and the streamed reply."""

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from turns import (
    Message,
    Part,
    RequestOptions,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    render,
)

from . import events as ev
from ._budget import json_text, message_tokens
from ._describe import describe, exc_text
from ._emit import DELTA_SETTERS, text_delta
from ._errors import (
    ContextOverflow,
    HookError,
    PipelineError,
    ProviderError,
    ProviderProtocolError,
    RequestError,
)
from ._loop import is_cancellation, spurious_cancellation
from ._model import ModelFinish, ModelRequest, ModelText, ModelToolCall
from ._runner import Runner
from ._seam import PIECE, Seam
from .events import TextDelta

_CHOICE_KEYWORDS = frozenset(("auto", "none", "required"))


def build_request(runner: Runner, turn: Turn, extra: tuple[Message, ...] = ()) -> ModelRequest:
    """Render the turn and check the request before any provider sees it.

    The tools sent are the turn's tools at the start of the turn, narrowed by
    ``active_tools``: tools are fixed per pipeline, and a hook can only narrow them. `extra`
    holds the transient messages of a regeneration (rejected replies and their feedback),
    sent after the user message.
    """
    options = turn.request
    allowed = frozenset(runner.tools)
    if options.active_tools is not None:
        allowed = allowed.intersection(options.active_tools)
    tools = tuple(spec for spec in turn.context.tools if spec.name in allowed)
    choice = options.tool_choice
    if choice is not None:
        _check_choice(choice, [spec.name for spec in tools], runner.shaped_by)
    messages = render(turn) + extra
    check_context(runner, messages, tools, turn=turn, extra=extra)
    return ModelRequest(messages, tools, options)


def check_context(
    runner: Runner,
    messages: tuple[Message, ...],
    tools: tuple[ToolSpec, ...],
    step: tuple[Message, tuple[ToolResult, ...]] | None = None,
    *,
    turn: Turn | None = None,
    extra: tuple[Message, ...] = (),
) -> None:
    """Raise `ContextOverflow` when a request would not fit the budget's context.

    `step` is the model's message of a tool step and the results the step added: the
    error blames the results when the request would fit without them, since compacting the
    history (which runs before the turn) cannot make room for them; else the model's own
    message, its text and call arguments, outgrew the budget. `turn` is the turn the request
    renders, for an attempt's first request: the error names what went over — the system
    prompt, the turn's own message and the tool specs when they outgrow the budget alone
    (no compaction or injection can make room); `extra`, the rejected replies and feedback a
    regeneration sends, when the request fits without them; the history against the target
    of ``compact=`` (or, within it, the parts the target leaves out); else the history and
    the injections.
    """
    budget = runner.plan.budget
    if budget is None:
        return
    count = runner.plan.count
    spec_tokens = _spec_tokens(tools, count)
    tokens = message_tokens(messages, count) + spec_tokens
    if tokens > budget.context_tokens:
        fix = "compact the history (compact=) or inject less"
        if step is not None:
            fix = _step_fix(step, tokens, budget.context_tokens, count)
        elif turn is not None:
            sizes = _fixed_sizes(turn, spec_tokens, count)
            fix = (
                _fixed_fix(sizes, budget.context_tokens)
                or _regeneration_fix(runner, extra, tokens, budget.context_tokens, count)
                or _history_fix(runner, turn, sizes, tokens, count)
                or fix
            )
        raise ContextOverflow(
            f"the rendered request holds {tokens} tokens, over the budget's context_tokens"
            f" of {budget.context_tokens}: {fix}",
            tokens=tokens,
            limit=budget.context_tokens,
        )


def _fixed_sizes(
    turn: Turn, spec_tokens: int, count: Callable[[str], int]
) -> list[tuple[str, int]]:
    # What no history view or smaller injection can shrink: the system prompt, the turn's
    # own message and the tool specs, with their tokens.
    system = turn.context.system
    return [
        (
            "the system prompt",
            message_tokens((Message.system(system),), count) if system is not None else 0,
        ),
        ("the turn's own message", message_tokens((turn.user_message,), count)),
        ("the tool specs", spec_tokens),
    ]


def _listed(sizes: list[tuple[str, int]]) -> str:
    """``a (1), b (2) and c (3)``, leaving out what holds nothing."""
    parts = [f"{what} ({size})" for what, size in sizes if size]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _shorten(sizes: list[tuple[str, int]]) -> str:
    """Shorten the largest of `sizes`: the tool specs can be narrowed for the turn instead."""
    largest = max(sizes, key=lambda item: item[1])[0]
    if largest == "the tool specs":
        return "shorten the tool specs (or narrow them for the turn with active_tools=)"
    return f"shorten {largest}"


def _fixed_fix(sizes: list[tuple[str, int]], limit: int) -> str:
    # Empty when the fixed parts fit and the rest is to blame.
    fixed = sum(size for _, size in sizes)
    if fixed <= limit:
        return ""
    many = sum(1 for _, size in sizes if size) > 1
    return (
        f"{_listed(sizes)} alone {'hold' if many else 'holds'} {fixed} of them, over it even"
        " without any history or injection, so compacting the history or injecting less"
        f" cannot make room — raise context_tokens, or {_shorten(sizes)}"
    )


def _regeneration_fix(
    runner: Runner, extra: tuple[Message, ...], tokens: int, limit: int, count: Callable[[str], int]
) -> str:
    # A regeneration's request: what it adds (the rejected replies and their feedback) is to
    # blame when the request fits without it; no compaction or injection can make room.
    if not extra:
        return ""
    added = message_tokens(extra, count)
    if tokens - added > limit:
        return ""
    hooks = list(dict.fromkeys(rejection.hook for rejection in runner.rejections))
    by = f" of hook {hooks[0]!r}" if len(hooks) == 1 else f" of hooks {hooks}" if hooks else ""
    return (
        f"the rejected replies and the feedback{by} this regeneration shows the model again"
        f" hold {added} of them, and the request fits without them — give shorter feedback,"
        " allow fewer regenerations (max_regenerations=), or raise context_tokens"
    )


def _history_fix(
    runner: Runner,
    turn: Turn,
    sizes: list[tuple[str, int]],
    tokens: int,
    count: Callable[[str], int],
) -> str:
    # The history against the target of compact=. Over it, the compactor's own output is its
    # fault; a history a pre hook replaced after it, or one it failed to compact, is not.
    # Within it, the history still does not fit: the target counts the history alone, not
    # the system prompt, the turn's own message or the tool specs.
    budget, compact = runner.plan.budget, runner.plan.compact
    if budget is None or compact is None:
        return ""
    history = turn.context.messages
    held = message_tokens(history, count)
    target = f"the target of {budget.history_target} given to compact= {compact.name!r}"
    if held <= budget.history_target:
        fixed = sum(size for _, size in sizes)
        rest = tokens - held - fixed
        room = budget.context_tokens - fixed - budget.injection_reserve
        keep = f", or have the compactor keep the history within {room} tokens" if room > 0 else ""
        return (
            f"the history sent holds {held} tokens, within {target}, but that target counts"
            f" the history alone: {_listed(sizes)} add {fixed}"
            + (f" and the injections {rest}" if rest > 0 else "")
            + f" — raise context_tokens, {_shorten(sizes)}{keep}"
        )
    compacted, viewed_by = runner.compacted, runner.viewed_by
    if compacted is None:
        fix = (
            f"the history sent holds {held} tokens, over {target}: the compactor failed"
            " this turn and, failing open (on_error='skip'), left the history as it was given"
        )
        if viewed_by is not None:
            fix += f" to the pre hooks (hook {viewed_by} replaced it)"
        return f"{fix} — the warning it logged says why"
    if history is compacted or history == compacted:
        return (
            f"the history sent holds {held} tokens, over {target} — have it drop or summarize more"
        )
    left = message_tokens(compacted, count)
    by = f"hook {viewed_by}" if viewed_by is not None else "a pre hook"
    return (
        f"the history sent holds {held} tokens, over {target}, which returned {left};"
        f" {by} replaced the history after it — have that hook keep the history within the"
        " target"
    )


def _step_fix(
    step: tuple[Message, tuple[ToolResult, ...]],
    tokens: int,
    limit: int,
    count: Callable[[str], int],
) -> str:
    # What outgrew the budget after a tool step, and what can shrink it.
    message, results = step
    sizes = [(count(result.content), result.call_id) for result in results]
    added = message_tokens(tuple(Message.tool(result) for result in results), count)
    if sizes and tokens - added <= limit:
        largest, call_id = max(sizes)
        return (
            f"the tool results just added hold {sum(size for size, _ in sizes)} of them"
            f" (call {call_id!r} the most, {largest}) — have the tools return less (an"
            " after-tool hook can cut a result down), or raise context_tokens"
        )
    calls = [
        (count(json_text(part.arguments)), part.id)
        for part in message.parts
        if type(part) is ToolCall
    ]
    widest = ""
    if calls:
        most, most_id = max(calls)
        widest = f", call {most_id!r} the most, {most}"
    return (
        f"the model's own message of this tool step holds {message_tokens((message,), count)}"
        f" of them (its text and its tool calls' arguments{widest}) and the tool results just"
        f" added only {added}, so the request does not fit even without them — compact the"
        " history (compact=) or inject less to leave the model room, or raise context_tokens"
    )


def _check_choice(choice: object, names: list[str], shaped_by: Mapping[str, str]) -> None:
    # Which hooks shaped the request, when one did: the likely culprit of an impossible one.
    origin = "".join(
        f"; hook {shaped_by[field]!r} {what}"
        for field, what in (
            ("active_tools", f"narrowed active_tools to {names}"),
            ("tool_choice", f"set tool_choice={choice!r}"),
        )
        if field in shaped_by
    )
    # The hook named as the culprit: the one that set the choice, unless the choice is
    # fine and the narrowing left nothing to choose from.
    hook = shaped_by.get("tool_choice", shaped_by.get("active_tools"))
    if not isinstance(choice, str):
        raise RequestError(
            f"tool_choice must be 'auto', 'none', 'required' or a tool's name, got"
            f" {describe(choice)}{origin}",
            hook=hook,
        )
    if choice == "required" and not names:
        raise RequestError(
            "tool_choice='required' but no tool is active this turn: the model could not"
            f" comply{origin} — add tools, or drop tool_choice",
            hook=shaped_by.get("active_tools", hook),
        )
    if choice not in _CHOICE_KEYWORDS and choice not in names:
        raise RequestError(
            f"tool_choice={choice!r} names a tool that is not active this turn; the active"
            f" tools are {names}{origin} — name one of them, or use 'auto', 'none' or"
            " 'required'",
            hook=hook,
        )


new = object.__new__


async def call_model(
    runner: Runner,
    request: ModelRequest,
    attempt: int,
    call_index: int,
    seam: Seam | None,
    deliver: Callable[[ev.Event], None] | None,
) -> tuple[Message, ModelFinish]:
    """Call the model once and assemble the assistant message it streamed.

    Every text chunk passes through the stream transformers before anyone sees it: the
    events, the reply, and so the log and the audit record. `seam` is the attempt's; it is
    flushed at the end of the call, since each model call writes a message of its own.
    `deliver` receives the text events (the emitter, or a hold for an unaccepted attempt).
    Every model failure is a `ProviderError`.
    """
    model = runner.plan.model
    if runner.emit is not None:
        name, provider = describe_model(model, request.options)
        runner.emit(
            ev.ModelCalled(
                runner.turn_ref,
                attempt,
                call_index,
                model=name,
                provider=provider,
                options=sent_options(model, request.options),
            )
        )
    chunks: list[str] = []
    calls: list[ToolCall] = []
    finish: ModelFinish | None = None
    # A watched turn's text events, unless held, are stamped here and relayed as they are
    # (`Watch`): no stamping call per chunk. Held ones are stamped when they are let out.
    relay = runner.relay if deliver is not None and deliver is runner.emit else None
    if relay is not None:
        deliver = None
        now, start, turn_ref = runner.now, runner.start, runner.turn_ref
        set_at, set_ref, set_text, set_attempt = DELTA_SETTERS
    try:
        async with model.stream(request) as stream:
            async for event in stream:
                kind = type(event)
                if kind is ModelText and type(event.text) is str:  # type: ignore[union-attr]
                    text = event.text  # type: ignore[union-attr]
                    if seam is not None:
                        text = (
                            seam.feed(text) if len(text) <= PIECE else await seam.feed_pieces(text)
                        )
                    if text:
                        chunks.append(text)
                        if relay is not None:
                            # text_delta(), inlined: one event per chunk.
                            delta = new(TextDelta)
                            set_at(delta, now() - start)
                            set_ref(delta, turn_ref)
                            set_text(delta, text)
                            set_attempt(delta, attempt)
                            relay[0](delta)
                        elif deliver is not None:
                            deliver(text_delta(runner.turn_ref, text, attempt))
                elif kind is ModelToolCall and type(event.call) is ToolCall:  # type: ignore[union-attr]
                    calls.append(event.call)  # type: ignore[union-attr]
                elif kind is ModelFinish:
                    finish = event  # type: ignore[assignment]
                else:
                    raise ProviderProtocolError(
                        f"model {model!r} yielded {describe(event)}; a model yields"
                        " ModelText(str), ModelToolCall(ToolCall) and ModelFinish",
                        provider=_model_name(model),
                    )
    except Exception as exc:
        note = None
        if seam is not None and seam.failure is not None:
            failure = seam.failure
            _transformer_failed(runner, failure)
            if exc is failure:
                raise
            if _comes_from(exc, failure):
                # The model handed the seam's failure back wrapped (a stream that reads in
                # a task group of its own raises an ExceptionGroup holding it) or raised an
                # error of its own from it: the transformer's failure.
                raise failure from failure.__cause__
            # Anything else is the model's own failure, raised as any other below, even
            # after a transformer failed in this call: it swallowed the transformer's error
            # and then failed by itself (often with that error only as its __context__), or
            # its task group holds the error of a task of its own beside it (the group, kept
            # as the cause, holds both). A note names the transformer, which a caller with
            # no event listener would otherwise find only in that chain.
            note = f"after stream transformer {failure.hook!r} failed: {_raised(failure)}"
        # A model's PipelineError (a provider's, or a wrapped model's) is raised as it is; a
        # HookError is not one: a pipeline the model ran failed, so the model failed.
        if isinstance(exc, PipelineError) and not isinstance(exc, HookError):
            if note is not None:
                exc.add_note(note)
            raise
        error = ProviderError(
            f"model {model!r} failed: {exc_text(exc)}", provider=_model_name(model)
        )
        if note is not None:
            error.add_note(note)
        raise error from exc
    except BaseException as exc:
        if not spurious_cancellation(exc):
            raise
        # Its own CancelledError (it awaited a future someone cancelled), nothing cancelling
        # the turn: its failure, as any other, not the end of the caller's task.
        raise ProviderError(
            f"model {model!r} failed: it raised {exc_text(exc)} itself (the turn was not"
            " cancelled)",
            provider=_model_name(model),
        ) from exc
    if seam is not None and seam.failure is not None:
        # The model swallowed the seam's failure (its stream caught what the block raised):
        # the turn still stops here, since the failed transformer's held text cannot be
        # released, and the failure ends with this call, never blamed on a later one.
        _transformer_failed(runner, seam.failure)
        raise seam.failure from seam.failure.__cause__
    if finish is None:
        raise ProviderProtocolError(
            f"model {model!r} ended its stream without a ModelFinish: the response is truncated",
            provider=_model_name(model),
        )
    if calls:
        calls = _own_ids(calls, request.messages)
    if seam is not None:
        try:
            tail = seam.flush()
        except HookError as error:
            _transformer_failed(runner, error)
            raise
        if tail:
            chunks.append(tail)
            if relay is not None:
                relay[0](text_delta(runner.turn_ref, tail, attempt, now() - start))
            elif deliver is not None:
                deliver(text_delta(runner.turn_ref, tail, attempt))
    text = "".join(chunks)
    parts: tuple[Part, ...] = (Text(text), *calls) if text or not calls else tuple(calls)
    if runner.emit is not None:
        runner.emit(
            ev.ModelFinished(runner.turn_ref, attempt, call_index, finish.reason, finish.usage)
        )
    return Message("assistant", parts), finish


def _own_ids(calls: list[ToolCall], messages: tuple[Message, ...]) -> list[ToolCall]:
    """`calls`, each with an id no other call has: a call repeating the id of an earlier call
    of the reply, or of a call `messages` hold (the history, injections, the attempt's
    earlier steps, a rejected attempt shown again), gets its id with the first free suffix
    ``_2``, ``_3``, ... instead.

    Kept, the id would name two calls: each tool result would answer both, a provider that
    wants ids unique in a request (Anthropic) would refuse every later request of the
    conversation, and events and audit entries keyed by the id would mix them up. An id of
    another type than str is left for the message to refuse, naming it.
    """
    # Collected once per model call, and only for a reply with calls: a long history is
    # scanned once per tool step, never once per call.
    taken = {
        part.id
        for message in messages
        if message.role == "assistant"
        for part in message.parts
        if type(part) is ToolCall
    }
    # A new id must not take the id a later call of the reply arrives with either.
    reserved = {call.id for call in calls if isinstance(call.id, str)}
    owned: list[ToolCall] = []
    for call in calls:
        call_id = call.id
        if isinstance(call_id, str) and call_id in taken:
            number = 2
            while (fresh := f"{call_id}_{number}") in taken or fresh in reserved:
                number += 1
            call = attrs.evolve(call, id=fresh)
            call_id = fresh
        if isinstance(call_id, str):
            taken.add(call_id)
        owned.append(call)
    return owned


def open_seam(runner: Runner) -> Seam | None:
    """The attempt's transformer instances, or None without transformers."""
    transformers = runner.plan.transformers
    if not transformers:
        return None
    try:
        return Seam(transformers)
    except HookError as error:
        _transformer_failed(runner, error)
        raise


def annotations_of(runner: Runner, seam: Seam | None) -> Mapping[str, Any]:
    """What the attempt's transformers reported, by transformer name."""
    if seam is None:
        return {}
    try:
        return seam.annotations()
    except HookError as error:
        _transformer_failed(runner, error)
        raise


def _transformer_failed(runner: Runner, error: HookError) -> None:
    # A transformer failure fails the turn, loudly; a listener sees which one.
    if runner.emit is not None:
        runner.emit(ev.HookFailed(runner.turn_ref, error.hook, error.stage, _raised(error), True))


def _raised(error: HookError) -> str:
    """What a transformer raised, by its type only (`Seam._failed`): its message may quote
    the text before the transformer changed it. A wrong return's error says it all."""
    cause = error.__cause__
    return type(cause).__name__ if cause is not None else exc_text(error)


def _comes_from(exc: BaseException, failure: HookError) -> bool:
    """Whether `exc` is the seam's `failure`, raised from it (its ``__cause__`` chain), or a
    group holding nothing else, cancellations aside, however deeply.

    Not its ``__context__``: whatever the model's context manager raises as it exits has
    the failure the block raised as its context, its own errors included.
    """
    if isinstance(exc, BaseExceptionGroup):
        held = [inner for inner in exc.exceptions if not is_cancellation(inner)]
        return bool(held) and all(_comes_from(inner, failure) for inner in held)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if link is failure:
            return True
        seen.add(id(link))
        link = link.__cause__
    return False


def _spec_tokens(tools: tuple[ToolSpec, ...], count: Callable[[str], int]) -> int:
    return sum(
        count(spec.name) + count(spec.description) + count(json_text(spec.parameters))
        for spec in tools
    )


def describe_model(model: object, options: RequestOptions | None = None) -> tuple[str, str | None]:
    """A model's name and its provider's, for events and traces.

    A provider's ``model`` attribute (the name sent in requests), or the ``model`` of
    `options`' ``extra`` that replaces it in this request, and ``provider``; a model without
    them (an offline one, a user's own) is named by its class. Only a provider's name (a
    model with a ``model`` and a ``provider``) is replaced by ``extra``'s, the one name a
    request carries: a config's ``[model]`` wrapper names a model that is not a provider
    by its class, and nothing sends ``extra``'s.
    """
    name = getattr(model, "model", None)
    provider = getattr(model, "provider", None)
    picked = options.extra.get("model") if options is not None else None
    if isinstance(name, str) and isinstance(provider, str) and type(picked) is str and picked:
        name = picked
    return (
        name if isinstance(name, str) else type(model).__name__,
        provider if isinstance(provider, str) else None,
    )


def sent_options(model: object, options: RequestOptions) -> RequestOptions:
    """The options `model` sends for `options`: its ``effective_options`` where it has one.

    A model that fills in defaults of its own (a config's ``[model]`` temperature) says so
    there, so that `ModelCalled` and the traces built from it show what is sent.
    """
    effective = getattr(model, "effective_options", None)
    if effective is None:
        return options
    try:
        shown = effective(options)
    except Exception as exc:  # the model's own code: its failure, as any other
        raise ProviderError(
            f"model {model!r} failed: effective_options raised {exc_text(exc)}",
            provider=_model_name(model),
        ) from exc
    return shown if isinstance(shown, RequestOptions) else options


def _model_name(model: object) -> str:
    return str(getattr(model, "provider", type(model).__name__))
