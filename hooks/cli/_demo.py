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

from hooks import redact
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
from turns import Message, Scope, Text, ToolCall, Turn

from ._timeline import clip, message_lines, part_text

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


def unset_key(spec: str) -> str | None:
    """The environment variable the model `spec` names needs its key from, if it is not
    set; blank counts as not set, as for a config's `api_key_env` (the provider strips a
    key's surrounding whitespace, and would send none)."""
    variable = KEY_VARIABLES.get(spec.partition(":")[0].strip().lower())
    if variable is not None and not os.environ.get(variable, "").strip():
        return variable
    return None


def unset_state(variable: str) -> str:
    """How `variable` (which `unset_key` named) is unset: ``"not set"``, or ``"set but
    blank"`` when it holds whitespace only, which is no key either."""
    return "set but blank" if variable in os.environ else "not set"


def choose_model(spec: str | None, write: Callable[[str], None]) -> Model | None:
    """The model `--model` names, or None (offline) when it needs a key that is not set."""
    if spec is None:
        return None
    model = model_from_string(spec)  # a malformed spec is a ConfigError, shown as usage
    variable = unset_key(spec)
    if variable is not None:
        state = unset_state(variable)
        write(f"note: {variable} is {state}, so the demo stays offline (scripted model)")
        write("")
        return None
    return model


def _show_split_address(write: Callable[[str], None], attempt: int, delivered: list[str]) -> None:
    """The accepted attempt's last two chunks, as the model sent them and as they were
    delivered: the address straddles them, which the timeline alone does not show."""
    sent = (SECOND_ATTEMPT if attempt > 1 else FIRST_ATTEMPT)[-2:]
    write(f"redacted while streaming: an address split across two chunks (attempt {attempt})")
    write("  (redact_email held back only the part that could still become an address)")
    width = max(len(repr(chunk)) for chunk in sent)
    for chunk, out in zip(sent, delivered[-2:], strict=True):
        write(f"  model sent {chunk!r:<{width}}  ->  delivered {out!r}")
    write("")


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
        delivered: dict[int, list[str]] = {}
        async with session.stream(QUESTION) as events:
            async for event in events:
                if isinstance(event, ev.TextDelta):
                    delivered.setdefault(event.attempt, []).append(event.text)
                if line := ev.timeline((event,)):
                    write(line.rstrip("\n"))
        result = events.result
    write("")
    if offline and result.reply is not None:
        _show_split_address(write, result.reply.attempt, delivered.get(result.reply.attempt, []))
    if scripted.requests:
        write(f"what the model was sent on attempt {len(result.audit.attempts)}, last call")
        write("  (history untouched, then this turn's injections at the tail, then the")
        write("  transient regeneration messages and this attempt's tool exchange)")
        for message in scripted.requests[-1].messages:
            for text in message_lines(message):
                write(text)
        write("")
    if result.rejections:
        write("rejected attempts (shown to the model with the feedback; never logged)")
        for rejection in result.rejections:
            write(f"  attempt {rejection.attempt} by {rejection.hook}: {rejection.feedback}")
            write(f"    {clip(rejection.text, 88)}")
        write("")
    committed = (await log.load("demo")).messages[len(HISTORY) :]
    write("committed to the conversation log by this turn")
    for message in committed:
        for text in message_lines(message):
            write(text)
    write("")
    write("stayed transient (this turn only; kept in the audit record)")
    for injection in result.turn.injections:
        if not injection.durable:
            text = " ".join(part_text(part) for part in injection.parts)
            write(f"  {injection.source:<14} {clip(text, 72)}")
    write("")
    write(f"outcome: {result.outcome}")
    if result.reply is not None:
        write(f"reply:   {result.reply.text}")
    return result
