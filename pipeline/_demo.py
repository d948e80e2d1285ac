"""`turnplug demo`: one full offline turn, shown as a timeline a newcomer can read."""

from collections.abc import AsyncIterator, Callable
from datetime import date

import trio

from turns import Context, Message, Scope, Text, Turn, render

from . import events as ev
from ._hooks import hook, parallel
from ._model import Model, ModelRequest
from ._pipeline import Pipeline
from ._result import TurnResult
from ._signals import Cont, cont, halt
from .testing import FunctionModel

DOCS = {
    "refund": "Refunds are issued within 14 days of a return.",
    "shipping": "Orders ship from Rotterdam within 2 working days.",
}


def authenticate(turn: Turn) -> Cont[Turn] | object:
    """Ordered pre hook: refuses anonymous users, otherwise records who is asking."""
    if turn.scope.current_user is None:
        return halt("anonymous user", reply="Please sign in first.")
    return cont(turn.assign(plan="pro"))


async def search_docs(turn: Turn) -> list[Text]:
    """Parallel member: a (pretend) retrieval call of 40 ms."""
    await trio.sleep(0.040)
    words = turn.user_message.text.lower()
    return [Text(f"[doc] {text}") for key, text in DOCS.items() if key in words]


async def load_memory(turn: Turn) -> list[Text]:
    """Parallel member: a (pretend) memory lookup of 25 ms."""
    await trio.sleep(0.025)
    return [Text(f"[memory] {turn.scope.current_user} prefers short answers.")]


async def remember_plan(turn: Turn) -> Cont[Turn]:
    """Durable injection: a fact later turns should keep."""
    return cont(turn.inject(f"[account] plan: {turn.scope.assigns['plan']}"))


def add_today(turn: Turn) -> Cont[Turn]:
    """Transient injection: today's date, useful this turn only."""
    return cont(turn.inject(f"[note] today is {date(2026, 11, 22).isoformat()}"))


async def _answer(request: ModelRequest) -> AsyncIterator[str]:
    for chunk in ("Refunds are issued ", "within 14 days ", "of your return."):
        await trio.sleep(0.005)
        yield chunk


def build(model: Model | None = None) -> Pipeline:
    """The demo pipeline; `model` defaults to an offline scripted model."""
    return Pipeline(
        model=model or FunctionModel(_answer),
        system="You are a support assistant. Be brief.",
        pre=[
            authenticate,
            parallel(search_docs, load_memory, name="retrieval"),
            hook(remember_plan, durable=True),
            add_today,
        ],
    )


def _line(at: float, what: str, detail: str = "") -> str:
    return f"  {at * 1e3:7.1f} ms  {what:<42} {detail}".rstrip()


def _describe(event: ev.Event) -> tuple[str, str] | None:
    match event:
        case ev.TurnStarted():
            return "turn started", f"turn_ref {event.turn_ref[:8]}"
        case ev.HookStarted(hook=name):
            return f"  {name} started", ""
        case ev.HookFinished(hook=name, elapsed=elapsed, verdict=verdict):
            return f"  {name} -> {verdict}", f"{elapsed * 1e3:.1f} ms"
        case ev.HookSkipped(hook=name):
            return f"  {name} skipped", "when= was false"
        case ev.HookFailed(hook=name, error=error):
            return f"  {name} FAILED", error
        case ev.Injected(hook=name, parts=parts, durable=durable, tokens=tokens):
            kind = "durable" if durable else "transient"
            text = " ".join(part.text for part in parts if isinstance(part, Text))
            return f"  {name} injected ({kind}, {tokens} tok)", _clip(text, 48)
        case ev.Halted(hook=name, reason=reason):
            return f"halted by {name}", reason
        case ev.ModelCalled(attempt=attempt, step=step):
            return "model called", f"attempt {attempt}, step {step}"
        case ev.TextDelta(text=text):
            return "  text", repr(text)
        case ev.ReplyReady(reply=reply):
            return "reply ready", f"{reply.finish_reason}, {reply.usage.output_tokens} tok out"
        case ev.TurnFinished(outcome=outcome):
            return "turn finished", outcome
    return None


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


async def demo(write: Callable[[str], None]) -> TurnResult:
    """Run the demo turn, writing its timeline and what the model saw."""
    pipe = build()
    turn = Turn.start(
        "How long do refunds take?",
        context=Context(
            messages=(Message.user("Hi!"), Message.assistant("Hello, how can I help?"))
        ),
        scope=Scope(current_user="ada"),
    )
    write("turnplug demo: one turn through a pipeline, offline (scripted model, no network)")
    write("")
    write("timeline")
    start = trio.current_time()
    async with pipe.stream(turn) as events:
        async for event in events:
            described = _describe(event)
            if described is not None:
                write(_line(trio.current_time() - start, *described))
    result = events.result
    write("")
    write("what the model was sent (history untouched, injections at the tail)")
    for message in render(result.turn):
        for index, part in enumerate(message.parts):
            role = message.role if index == 0 else ""
            write(f"  {role:<9} {_clip(_part_text(part), 90)}")
    write("")
    write("injections")
    for injection in result.turn.injections:
        kind = "durable  " if injection.durable else "transient"
        text = " ".join(_part_text(part) for part in injection.parts)
        write(f"  {kind}  {injection.source:<14} {_clip(text, 60)}")
    write("")
    write("durable injections are meant for the conversation log; transient ones are this")
    write("turn's scaffolding only and are kept in the audit record.")
    write("")
    assert result.reply is not None
    write(f"outcome: {result.outcome}")
    write(f"reply:   {result.reply.text}")
    return result


def _part_text(part: object) -> str:
    return part.text if isinstance(part, Text) else repr(part)
