"""The readable timeline of a turn's events, shared by `turnplug demo`, `run --events` and
`chat`: one line per event worth showing, with the time since the turn started."""

from pipeline import events as ev
from turns import Message, Text, ToolCall, ToolResult


def row(at: float, what: str, detail: str = "") -> str:
    return f"  {at * 1e3:6.1f} ms  {what:<44} {detail}".rstrip()


def describe(event: ev.Event) -> tuple[str, str] | None:
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
            return f"  {name} injected ({kind}, {tokens} tok)", clip(text, 44)
        case ev.Halted(hook=name, reason=reason):
            return f"halted by {name}", reason
        case ev.ModelCalled(attempt=attempt, step=1):
            return f"model called (attempt {attempt})", ""
        case ev.ModelCalled(attempt=attempt, step=step):
            return f"model called again (attempt {attempt}, call {step})", "with the tool results"
        case ev.ToolCallRequested(call=call):
            return f"  model asks for tool {call.name}", clip(repr(dict(call.arguments)), 44)
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


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def part_text(part: object) -> str:
    if isinstance(part, ToolCall):
        return f"[tool call] {part.name}({dict(part.arguments)})"
    if isinstance(part, ToolResult):
        return f"[tool result] {part.content}"
    return part.text if isinstance(part, Text) else repr(part)


def message_lines(message: Message, indent: str = "  ") -> list[str]:
    lines = []
    for index, part in enumerate(message.parts):
        role = message.role if index == 0 else ""
        source = part.meta.get("injected_by") if hasattr(part, "meta") else None
        origin = f"  (from {source})" if source else ""
        lines.append(f"{indent}{role:<9} {clip(part_text(part), 88)}{origin}")
    return lines
