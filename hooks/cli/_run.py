"""`turnplug run` and `turnplug chat`: turns of a config's pipeline from the command line.

Both run their turns in a session over the log ``--log`` names (in memory without it), so
that a conversation continues from what the log holds. `run` sends one message and prints
the answer (or, with ``--json``, the result as JSON; with ``--events``, every event as it
happens). `chat` reads messages line by line and shows each answer once the post hooks
accepted it (with ``--live``, as it streams, rejected attempts included); Ctrl-C cancels the
turn in progress (nothing of it is committed) and Ctrl-D ends the conversation. A scripted
model that runs out of replies ends the chat (exit 1): every later message would fail too.

Standard output carries answers (and JSON); notes about a turn — a rejection, a halt, a
cancellation — go to standard error, so that piping the answers somewhere stays clean.
"""

import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, final

import anyio
import attrs

from pipeline import PipelineError, ProviderError, TurnResult
from pipeline import events as ev
from pipeline.logs import Log
from turns import Text, Usage
from turns.serde import to_dict

from .._terminal import encodes_utf8, json_text, one_line, printable
from ._failed import discard
from ._timeline import plain, rejected_by


@final
class Console:
    """Where a command writes: answers to `out`, notes to `err`, flushed as they come."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err

    def write(self, text: str, end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


# -- run --------------------------------------------------------------------------------------


async def run_turn(
    pipe: Any,
    message: str,
    *,
    log: Log,
    conversation: str,
    as_json: bool,
    show_events: bool,
    console: Console,
) -> int:
    """Send `message` in a session; print the outcome. Returns the exit code.

    Standard output closed by its reader (``| head``) stops the printing, and with it a turn
    still streaming its events (nothing of it is committed, as on Ctrl-C); the exit code
    still says how the turn ended: 0 only for a turn that completed, and a turn that did not
    still gets its note on standard error.
    """
    outcome: ev.Outcome | None = None  # the turn's, once it has finished
    result: TurnResult | None = None
    ascii_only = not encodes_utf8(console.out)
    try:
        async with pipe.session(log=log, conversation_id=conversation) as session:
            if show_events:
                async with session.stream(message) as events:
                    async for event in events:
                        match event:
                            case ev.Committed():  # only a completed turn commits
                                outcome = "completed"
                            case ev.TurnFinished():
                                outcome = event.outcome
                        if as_json:
                            console.write(json_text(event_json(event), ascii_only=ascii_only))
                        elif line := ev.timeline((event,)):
                            console.write(line.rstrip("\n"))
                result = events.result
            else:
                result = await session.send(message)
        outcome = result.outcome
        if as_json:
            console.write(json_text(result_json(result, conversation), ascii_only=ascii_only))
        else:
            if result.reply is not None:
                console.write(printable(result.reply.text))
            explain(result, console)
    except BrokenPipeError:
        discard(console.out)
        if outcome is None:
            with contextlib.suppress(OSError):
                console.note(
                    "turnplug: standard output was closed before the turn finished, which"
                    " stopped it: nothing of it was committed"
                )
            return 1
        if result is not None and not as_json:
            # Standard error may still be open: the note naming who halted the turn is not
            # lost with the answer its reader did not wait for.
            with contextlib.suppress(OSError):
                explain(result, console)
    return 0 if outcome == "completed" else 1


def explain(result: TurnResult, console: Console) -> None:
    """A note on a turn that did not complete: who halted it, or why nothing was accepted."""
    if result.outcome == "halted" and result.halt is not None:
        console.note(
            f"turnplug: turn halted by {result.halt.hook!r}: {one_line(result.halt.reason)}"
        )
    elif result.outcome == "exhausted":
        last = result.rejections[-1]
        rejected = rejected_by(len(result.rejections))
        console.note(
            f"turnplug: no acceptable reply: {rejected} {last.hook!r}: {one_line(last.feedback)}"
        )


def result_json(result: TurnResult, conversation: str) -> dict[str, Any]:
    """The result of a turn as `run --json` prints it."""
    reply = result.reply
    return {
        "outcome": result.outcome,
        "reply": None if reply is None else reply.text,
        "conversation": conversation,
        "turn_ref": result.turn.turn_ref,
        "halt": None
        if result.halt is None
        else {"hook": result.halt.hook, "reason": result.halt.reason},
        "rejections": [
            {"attempt": r.attempt, "hook": r.hook, "feedback": r.feedback, "text": r.text}
            for r in result.rejections
        ],
        "injections": [
            {
                "source": injection.source,
                "stage": injection.stage,
                "durable": injection.durable,
                "text": " ".join(p.text for p in injection.parts if isinstance(p, Text)),
                # Every part as serialized: a synthetic tool call has no text to show.
                "parts": [to_dict(part) for part in injection.parts],
            }
            for injection in result.turn.injections
        ],
        # What the turn cost: every model call, rejected attempts included; an exhausted
        # turn has no reply but spent tokens all the same.
        "usage": to_dict(sum((a.usage for a in result.audit.attempts), Usage())),
        "committed": len(result.log_messages),
    }


def event_json(event: ev.Event) -> dict[str, Any]:
    """An event as one JSON object: its type under ``"event"``, then its fields."""
    return {"event": type(event).__name__} | {
        field.name: plain(getattr(event, field.name)) for field in attrs.fields(type(event))
    }


# -- chat -------------------------------------------------------------------------------------


async def chat(
    pipe: Any,
    *,
    log: Log,
    conversation: str,
    read_line: Callable[[], Awaitable[str]],
    console: Console,
    prompt: str = "",
    live: bool = False,
) -> int:
    """Answer each line `read_line` returns until it returns ``""`` (end of input).

    Text is held until the post hooks accept the reply, so a guardrail's rejected attempt
    is never shown; with `live`, it is shown as it streams and a rejection is noted after
    it. SIGINT (Ctrl-C) cancels the turn in progress; between turns it only reminds how to
    leave. Returns the exit code: 0, as leaving a conversation is not a failure; 1 when a
    scripted model ran out of replies, which ends the conversation.
    """
    if not live and not pipe.hold_until_accepted:
        pipe = attrs.evolve(pipe, hold_until_accepted=True)
    code = 0
    turn: list[anyio.CancelScope] = []  # the scope of the turn in progress, if any

    async def watch(signals: Any) -> None:
        async for _ in signals:
            if turn:
                turn[0].cancel()
            else:
                console.note("\n(Ctrl-D ends the conversation)")
                if prompt:
                    console.write(prompt, end="")

    # The session outside the signal receiver: once the conversation ends (Ctrl-D), the
    # receiver is closed before the session drains its background hooks, so that Ctrl-C
    # then interrupts the command, as it would any other, instead of being swallowed.
    async with pipe.session(log=log, conversation_id=conversation) as session:
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch, signals)
                while True:
                    if prompt:
                        console.write(prompt, end="")
                    try:
                        line = await read_line()
                    except UnicodeDecodeError as exc:
                        console.note(
                            f"turnplug: error: a line that is not valid {exc.encoding} ({exc.reason}"
                            f" at byte {exc.start}): nothing was sent — check the terminal's encoding"
                        )
                        continue
                    if not line:
                        if prompt:
                            console.write("")
                        break
                    message = line.strip()
                    if not message:
                        continue
                    with anyio.CancelScope() as scope:
                        turn.append(scope)
                        try:
                            await _chat_turn(session, message, console)
                        except PipelineError as exc:
                            console.write("")
                            console.note(
                                f"turnplug: error: {type(exc).__name__}: {one_line(str(exc))}"
                            )
                            if isinstance(exc, ProviderError) and exc.provider == "scripted":
                                # Its replies are spent: every later message would fail alike.
                                console.note(
                                    "(the scripted model has no more replies: the conversation"
                                    " ends — give it more replies, or configure a real model)"
                                )
                                code = 1
                        finally:
                            turn.clear()
                    if code:
                        break
                    if scope.cancelled_caught:
                        console.write("")
                        console.note("(turn cancelled: nothing was committed)")
                tasks.cancel_scope.cancel()
    return code


async def _chat_turn(session: Any, message: str, console: Console) -> None:
    shown: dict[int, str] = {}
    # An attempt's text ending in a carriage return: the next delta says whether it is half
    # of a CRLF (a line break) or one of its own (shown escaped), so it waits for it.
    held: dict[int, str] = {}

    def show(text: str, attempt: int) -> None:
        text = held.pop(attempt, "") + text
        if text.endswith("\r"):
            text, held[attempt] = text[:-1], "\r"
        console.write(printable(text), end="")

    async with session.stream(message) as events:
        async for event in events:
            match event:
                case ev.TextDelta(text=text, attempt=attempt):
                    shown[attempt] = shown.get(attempt, "") + text
                    show(text, attempt)
                case ev.AttemptRejected(attempt=attempt, hook=hook, feedback=feedback):
                    if attempt in shown:
                        console.write(printable(held.pop(attempt, "")))
                    console.note(f"(attempt {attempt} rejected by {hook!r}: {one_line(feedback)})")
    for rest in held.values():
        console.write(printable(rest), end="")
    result = events.result
    reply = result.reply
    said = shown.get(reply.attempt, "") if reply is not None else ""
    if said:
        console.write("")
    if reply is not None and reply.text != said:
        # A halt's substitute answer, or a reply a post hook changed after it streamed.
        if said:
            console.note("(the reply was changed after it streamed; as committed:)")
        console.write(printable(reply.text))
    explain(result, console)


async def read_stdin() -> str:
    """One line of standard input, read in a worker thread; ``""`` at end of input.

    Each line is decoded on its own: a line that is not in the terminal's encoding raises
    `UnicodeDecodeError` for that line alone (reading text would fail on the whole chunk
    read ahead, lines before it included, or let its bytes through as lone surrogates).
    """
    line: bytes = await anyio.to_thread.run_sync(sys.stdin.buffer.readline)
    return line.decode(sys.stdin.encoding)
