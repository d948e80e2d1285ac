"""`turnplug demo`: one full offline turn, shown as a timeline a newcomer can read.

The turn: an authenticated user asks about refunds. A parallel group retrieves documents
and memory at the same time; a durable hook notes the account plan and a transient one
today's date; the model looks the user's latest return up with a tool; its first answer
leaks an internal ticket number, so a guardrail rejects it and the model tries again; the
e-mail address in the answer is redacted while it streams, although it arrives split across
chunks; the session commits the turn to a log.
"""

import os
from collections.abc import AsyncIterator, Callable
from datetime import date

import anyio

from pipeline import (
    Cont,
    Halt,
    Model,
    ModelRequest,
    Pipeline,
    Regenerate,
    TurnResult,
    cont,
    halt,
    hook,
    parallel,
    regenerate,
    tool,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.providers import model_from_string
from pipeline.testing import FunctionModel
from turns import Message, Scope, Text, ToolCall, ToolResult, Turn

from ._redact import redact

DOCS = {
    "refund": "Refunds are issued within 14 days of a return.",
    "shipping": "Orders ship from Rotterdam within 2 working days.",
}

QUESTION = "How long do refunds take?"
HISTORY = (Message.user("Hi!"), Message.assistant("Hello, how can I help?"))

# The offline model's two attempts, in chunks as a provider would stream them. The address
# straddles two chunks on purpose.
FIRST_ATTEMPT = (
    "Refunds take 14 days ",
    "(internal ticket RF-2231). ",
    "We will write to ada@exa",
    "mple.com.",
)
SECOND_ATTEMPT = (
    "Refunds are issued ",
    "within 14 days of your return. ",
    "We will confirm at ada@exa",
    "mple.com.",
)

EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
}


def authenticate(turn: Turn) -> Cont[Turn] | Halt:
    """Ordered pre hook: refuses anonymous users, otherwise records the plan."""
    if turn.scope.current_user is None:
        return halt("anonymous user", reply="Please sign in first.")
    return cont(turn.assign(plan="pro"))


async def search_docs(turn: Turn) -> list[Text]:
    """Parallel member: a (pretend) retrieval call of 40 ms."""
    await anyio.sleep(0.040)
    words = turn.user_message.text.lower()
    return [Text(f"[doc] {text}") for key, text in DOCS.items() if key in words]


async def load_memory(turn: Turn) -> list[Text]:
    """Parallel member: a (pretend) memory lookup of 25 ms."""
    await anyio.sleep(0.025)
    user = turn.scope.current_user
    return [Text(f"[memory] {user} prefers short answers; e-mail on file: {user}@example.com")]


async def remember_plan(turn: Turn) -> Cont[Turn]:
    """Durable injection: a fact later turns should keep."""
    return cont(turn.inject(f"[account] plan: {turn.scope.assigns['plan']}"))


def add_today(turn: Turn) -> Cont[Turn]:
    """Transient injection: today's date, useful this turn only."""
    return cont(turn.inject(f"[note] today is {date(2026, 11, 22).isoformat()}"))


def no_internal_refs(turn: Turn) -> Cont[Turn] | Regenerate:
    """Post hook (a guardrail): internal ticket numbers never reach a customer."""
    assert turn.reply is not None
    if "internal ticket" in turn.reply.text:
        return regenerate("Do not mention internal ticket numbers.")
    return cont(turn)


@tool
async def find_return(scope: Scope) -> dict[str, str]:
    """The signed-in user's latest return."""
    await anyio.sleep(0.010)
    return {"user": str(scope.current_user), "order": "1182", "received": "2026-11-20"}


class OfflineModel:
    """The demo's scripted model: the first answer leaks, the second one, told why, does not."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self.model = FunctionModel(self._answer)

    async def _answer(self, request: ModelRequest) -> AsyncIterator[str | ToolCall]:
        self.requests.append(request)
        if request.messages[-1].role != "tool":
            # Each attempt first looks the user's return up, then answers.
            await anyio.sleep(0.005)
            yield ToolCall(f"call_{len(self.requests)}", "find_return", {})
            return
        retried = any(m.meta.get("feedback_for_attempt") for m in request.messages)
        for chunk in SECOND_ATTEMPT if retried else FIRST_ATTEMPT:
            await anyio.sleep(0.005)
            yield chunk


def build(model: Model | None = None) -> Pipeline:
    """The demo pipeline; `model` defaults to an offline scripted model."""
    return Pipeline(
        model=model or OfflineModel().model,
        system="You are a support assistant. Be brief.",
        pre=[
            authenticate,
            parallel(search_docs, load_memory, name="retrieval"),
            hook(remember_plan, durable=True),
            add_today,
        ],
        tools=[find_return],
        transformers=[redact(EMAIL, replacement="[EMAIL]", name="redact_email")],
        post=[no_internal_refs],
    )


def _line(at: float, what: str, detail: str = "") -> str:
    return f"  {at * 1e3:6.1f} ms  {what:<44} {detail}".rstrip()


def _describe(event: ev.Event) -> tuple[str, str] | None:
    match event:
        case ev.TurnStarted():
            return "turn started", f"turn_ref {event.turn_ref[:8]}"
        case ev.HookStarted(hook=name, stage=stage):
            return f"  {name} started", stage
        case ev.HookFinished(hook=name, elapsed=elapsed, verdict=verdict):
            return f"  {name} -> {verdict}", f"{elapsed * 1e3:.1f} ms"
        case ev.HookSkipped(hook=name):
            return f"  {name} skipped", "when= was false"
        case ev.HookFailed(hook=name, error=error):
            return f"  {name} FAILED", error
        case ev.Injected(hook=name, parts=parts, durable=durable, tokens=tokens):
            kind = "durable" if durable else "transient"
            text = " ".join(part.text for part in parts if isinstance(part, Text))
            return f"  {name} injected ({kind}, {tokens} tok)", _clip(text, 44)
        case ev.Halted(hook=name, reason=reason):
            return f"halted by {name}", reason
        case ev.ModelCalled(attempt=attempt, step=1):
            return f"model called (attempt {attempt})", ""
        case ev.ModelCalled(attempt=attempt, step=step):
            return f"model called again (attempt {attempt}, call {step})", "with the tool results"
        case ev.ToolCallRequested(call=call):
            return f"  model asks for tool {call.name}", _clip(repr(dict(call.arguments)), 44)
        case ev.ToolStarted(call=call):
            return f"  {call.name} started", "tool"
        case ev.ToolBlocked(call=call, hook=name, reason=reason):
            return f"  {call.name} blocked by {name}", reason
        case ev.ToolFinished(call=call, elapsed=elapsed):
            return f"  {call.name} -> result", f"{elapsed * 1e3:.1f} ms"
        case ev.TextDelta(text=text, attempt=attempt):
            return f"  text (attempt {attempt})", repr(text)
        case ev.ReplyReady(reply=reply):
            return "reply ready", f"{reply.finish_reason}, {reply.usage.output_tokens} tok out"
        case ev.AttemptRejected(attempt=attempt, hook=name, feedback=feedback):
            return f"attempt {attempt} rejected by {name}", feedback
        case ev.Committed(messages=messages):
            return "committed to the log", f"{len(messages)} messages"
        case ev.TurnFinished(outcome=outcome):
            return "turn finished", outcome
    return None


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _part_text(part: object) -> str:
    if isinstance(part, ToolCall):
        return f"[tool call] {part.name}({dict(part.arguments)})"
    if isinstance(part, ToolResult):
        return f"[tool result] {part.content}"
    return part.text if isinstance(part, Text) else repr(part)


def _message_lines(message: Message, indent: str = "  ") -> list[str]:
    lines = []
    for index, part in enumerate(message.parts):
        role = message.role if index == 0 else ""
        source = part.meta.get("injected_by") if hasattr(part, "meta") else None
        origin = f"  (from {source})" if source else ""
        lines.append(f"{indent}{role:<9} {_clip(_part_text(part), 88)}{origin}")
    return lines


def choose_model(spec: str | None, write: Callable[[str], None]) -> Model | None:
    """The model `--model` names, or None (offline) when it needs a key that is not set."""
    if spec is None:
        return None
    model = model_from_string(spec)  # a malformed spec is a ConfigError, shown as usage
    variable = KEY_VARIABLES.get(spec.partition(":")[0].strip().lower())
    if variable is not None and not os.environ.get(variable):
        write(f"note: {variable} is not set, so the demo stays offline (scripted model)")
        write("")
        return None
    return model


async def demo(write: Callable[[str], None], model_spec: str | None = None) -> TurnResult:
    """Run the demo turn in a session, writing its timeline and what was committed."""
    model = choose_model(model_spec, write)
    offline = model is None
    scripted = OfflineModel()
    pipe = build(scripted.model if model is None else model)
    log = MemoryLog()
    await log.append("demo", "earlier", HISTORY)
    where = "offline (scripted model, no network)" if offline else f"with {model_spec}"
    write(f"turnplug demo: one turn through a pipeline, {where}")
    write("")
    write(f"user: {QUESTION}")
    write("")
    write("timeline")
    async with pipe.session(
        log=log, conversation_id="demo", scope=Scope(current_user="ada")
    ) as session:
        start = anyio.current_time()
        async with session.stream(QUESTION) as events:
            async for event in events:
                described = _describe(event)
                if described is not None:
                    write(_line(anyio.current_time() - start, *described))
        result = events.result
    write("")
    if scripted.requests:
        write(f"what the model was sent on attempt {len(result.audit.attempts)}, last call")
        write("  (history untouched, then this turn's injections at the tail, then the")
        write("  transient regeneration messages and this attempt's tool exchange)")
        for message in scripted.requests[-1].messages:
            for line in _message_lines(message):
                write(line)
        write("")
    if result.rejections:
        write("rejected attempts (shown to the model with the feedback; never logged)")
        for rejection in result.rejections:
            write(f"  attempt {rejection.attempt} by {rejection.hook}: {rejection.feedback}")
            write(f"    {_clip(rejection.text, 88)}")
        write("")
    committed = (await log.load("demo")).messages[len(HISTORY) :]
    write("committed to the conversation log by this turn")
    for message in committed:
        for line in _message_lines(message):
            write(line)
    write("")
    write("stayed transient (this turn only; kept in the audit record)")
    for injection in result.turn.injections:
        if not injection.durable:
            text = " ".join(_part_text(part) for part in injection.parts)
            write(f"  {injection.source:<14} {_clip(text, 72)}")
    write("")
    write(f"outcome: {result.outcome}")
    if result.reply is not None:
        write(f"reply:   {result.reply.text}")
    return result
