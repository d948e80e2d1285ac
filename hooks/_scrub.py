"""Scrubbing personal data where it comes in: the user's message and tool results.

`redact` and `pii` are stream transformers: they protect what the model writes. The same
detectors (a `Redact` factory, which `redact(...)` and `pii(...)` return) also scrub what
reaches the model from elsewhere:

- `scrub_input` is a pre hook that rewrites the user's message before anything else reads
  it: the later hooks, the model, the events, the audit record and the log all see the
  scrubbed text (put it first in ``pre``).
- `scrub_tool_results` is an after-tool hook that rewrites each result before the model,
  the events, the audit record and the log see it (after-tool rewrites are all they see).
- `scrub_output` gives the stream transformer for the model's own text with the same
  strategies.

A strategy says what happens to a match: ``"redact"`` puts the detector's replacement in
its place (``[EMAIL]``); ``"mask"`` keeps its last four characters (``************4242``);
``"hash"`` puts a stable digest in its place (``[EMAIL:5f1e0c2a9b]``: equal values give
equal digests, so a conversation can still tell two addresses apart); ``"block"`` refuses
the whole message (the turn halts, nothing is committed) or the whole tool result (the
model reads an error result instead).
"""

import hashlib
import re
from collections.abc import Callable
from typing import Literal

import attrs

from pipeline import ConfigError, Cont, Halt, Hook, cont, halt, hook
from turns import Part, Text, ToolCall, ToolResult, Turn

from ._ask import check_text
from ._redact import Redact

Strategy = Literal["redact", "mask", "hash", "block"]
_STRATEGIES: tuple[Strategy, ...] = ("redact", "mask", "hash", "block")

SCRUB_BLOCKED = "blocked_personal_data"
"""The ``error_class`` of a tool result withheld by ``scrub_tool_results(strategy="block")``."""


def _label(detector: Redact, found: str) -> str:
    """What the detector calls a match: its replacement without brackets (``EMAIL``)."""
    replaced = detector.redact_text(found)
    if replaced == found:  # a pattern that only matches in context: name the detector
        return detector.name.upper()
    return replaced.strip("[]<>") or detector.name.upper()


def _mask(found: re.Match[str]) -> str:
    text = found.group()
    shown = 4 if len(text) > 8 else 0
    return "*" * (len(text) - shown) + text[len(text) - shown :]


def _digest(detector: Redact) -> Callable[[re.Match[str]], str]:
    def digest(found: re.Match[str]) -> str:
        text = found.group()
        code = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        return f"[{_label(detector, text)}:{code}]"

    return digest


def _replacer(detector: Redact, strategy: str) -> Redact:
    """The detector with the replacement of a strategy other than ``"block"``."""
    if strategy == "redact":
        return detector
    if strategy == "mask":
        return detector.with_replacement(_mask)
    return detector.with_replacement(_digest(detector))


def _scrub_parts(replacer: Redact, parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """`parts` with their text scrubbed as one text (``Message.text``, the text parts
    joined), so that what spans two parts is found: a replacement goes in the part where
    its match starts, and the rest of the match leaves the parts it runs on into.

    A text part the scrubbing empties (a match ran over all of it, or was replaced by no
    text) is dropped, meta and all: providers refuse empty text parts. A message it would
    leave without any part keeps the first of them, empty, as ``Message.user("")`` is.
    """
    whole = "".join([part.text for part in parts if type(part) is Text])
    spans = replacer._replacements(whole)
    if not spans:
        return parts
    scrubbed: list[Part] = []
    emptied: list[Text] = []
    start = 0  # where the part starts in `whole`
    done = 0  # how far `whole` has been written (past `start` when a match runs on)
    index = 0
    for part in parts:
        if type(part) is not Text:
            scrubbed.append(part)
            continue
        end = start + len(part.text)
        pieces: list[str] = []
        pos = max(done, start)
        while index < len(spans) and spans[index][0] < end:
            begin, stop, replaced = spans[index]
            pieces += (whole[pos:begin], replaced)
            pos = stop
            index += 1
        pieces.append(whole[pos:end])
        done = max(pos, end)
        text = "".join(pieces)
        if text or not part.text:
            scrubbed.append(part if text == part.text else attrs.evolve(part, text=text))
        else:
            emptied.append(attrs.evolve(part, text=""))
        start = end
    if not scrubbed:
        return (emptied[0],)
    return tuple(scrubbed)


def _check(where: str, detector: object, strategy: object) -> None:
    if not isinstance(detector, Redact):
        raise ConfigError(
            f"{where}: expected a detector built by hooks.pii(...) or hooks.redact(...), got"
            f" {type(detector).__name__} {detector!r}"
        )
    if strategy not in _STRATEGIES:
        raise ConfigError(
            f"{where}: strategy must be one of {', '.join(map(repr, _STRATEGIES))}, got"
            f" {strategy!r}"
        )


def _found(detector: Redact, text: str) -> list[str]:
    """The names of what the detector finds in `text`, each once, in order of appearance."""
    names: list[str] = []

    def note(found: re.Match[str]) -> str:
        name = _label(detector, found.group())
        if name not in names:
            names.append(name)
        return ""

    detector.with_replacement(note).redact_text(text)
    return names


def scrub_input(
    detector: Redact,
    *,
    strategy: Strategy = "redact",
    reply: str | None = None,
    name: str | None = None,
) -> Hook:
    """A pre hook that scrubs the user's message with `detector` before anything reads it.

    Put it first in ``pre``: the hooks after it, the model, the events, the audit record and
    the log see only the scrubbed message. A turn that continues from tool results its
    caller ran (a tool message, such as a gateway's client tools send) has each result's
    content scrubbed: they come in with the turn, and no after-tool hook sees them.

    Args:
        detector: What to look for: ``pii(...)`` or ``redact(...)``.
        strategy: ``"redact"``, ``"mask"``, ``"hash"``, or ``"block"``: halt the turn
            (nothing is committed) when the message holds anything the detector finds.
        reply: With ``"block"``, the answer the user gets; by default one saying what was
            found and asking to send the message again without it.
        name: The hook's name; ``scrub_input`` by default.

    Raises:
        ConfigError: `detector` is not a `Redact`, or the strategy is unknown.
    """
    _check("scrub_input", detector, strategy)
    check_text("scrub_input", "reply", reply)
    check_text("scrub_input", "name", name)
    replacer = None if strategy == "block" else _replacer(detector, strategy)

    def scrub_message(turn: Turn) -> Cont[Turn] | Halt:
        message = turn.user_message
        if replacer is None:
            found = _found(detector, message.text)
            for part in message.parts:
                if type(part) is ToolResult:
                    found += [kind for kind in _found(detector, part.content) if kind not in found]
            if not found:
                return cont(turn)
            kinds = ", ".join(found)
            if message.role == "tool":
                # A turn continuing from tool results its caller ran: those are what hold it.
                reason = f"the tool results hold personal data ({kinds})"
                answer = (
                    f"The tool results seem to hold personal data ({kinds}). Please send"
                    " them again without it."
                )
            else:
                reason = f"the message holds personal data ({kinds})"
                answer = (
                    f"Your message seems to hold personal data ({kinds}). Please send it"
                    " again without it."
                )
            return halt(reason, reply=reply if reply is not None else answer)
        parts = _scrub_results(replacer, _scrub_parts(replacer, message.parts))
        if parts == message.parts:
            return cont(turn)
        return cont(attrs.evolve(turn, user_message=attrs.evolve(message, parts=parts)))

    return hook(scrub_message, name=name if name is not None else "scrub_input")


def _scrub_results(replacer: Redact, parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """`parts` with the content of each tool result scrubbed, on its own."""
    if not any(type(part) is ToolResult for part in parts):
        return parts
    scrubbed: list[Part] = []
    for part in parts:
        if type(part) is ToolResult:
            content = replacer.redact_text(part.content)
            if content != part.content:
                part = part.with_content(content)
        scrubbed.append(part)
    return tuple(scrubbed)


def scrub_tool_results(
    detector: Redact,
    *,
    strategy: Strategy = "redact",
    match: str | re.Pattern[str] | Callable[[str], bool] | None = None,
    name: str | None = None,
) -> Hook:
    """An after-tool hook that scrubs each tool result with `detector`.

    The model, the events (`ToolFinished`, `ToolStepFinished`), the audit record and the log
    see only the scrubbed result. Error results are scrubbed too.

    Args:
        detector: What to look for: ``pii(...)`` or ``redact(...)``.
        strategy: ``"redact"``, ``"mask"``, ``"hash"``, or ``"block"``: the model gets an
            error result (``error_class="blocked_personal_data"``) saying what was found
            instead of the result.
        match: The tools it applies to (as `pipeline.hook`'s ``match``); every tool by
            default.
        name: The hook's name; ``scrub_tool_results`` by default.

    Raises:
        ConfigError: `detector` is not a `Redact`, or the strategy is unknown.
    """
    _check("scrub_tool_results", detector, strategy)
    check_text("scrub_tool_results", "name", name)
    scrub = None if strategy == "block" else _replacer(detector, strategy).redact_text

    def scrub_result(call: ToolCall, result: ToolResult, turn: Turn) -> Cont[ToolResult]:
        if scrub is not None:
            content = scrub(result.content)
            return cont(result if content == result.content else result.with_content(content))
        found = _found(detector, result.content)
        if not found:
            return cont(result)
        return cont(
            ToolResult(
                result.call_id,
                f"the result of {call.name} was withheld: it holds personal data"
                f" ({', '.join(found)})",
                is_error=True,
                error_class=SCRUB_BLOCKED,
                meta=result.meta,
            )
        )

    return hook(scrub_result, name=name if name is not None else "scrub_tool_results", match=match)


def scrub_output(detector: Redact, *, strategy: Strategy = "redact") -> Redact:
    """The stream transformer factory scrubbing the model's text with a strategy.

    ``"redact"`` returns `detector` itself; ``"mask"`` and ``"hash"`` the same detector
    with that replacement. ``"block"`` is not a transformer's to decide: a reply that holds
    personal data should be regenerated, with ``guardrail(lambda text:
    detector.redact_text(text) == text, feedback=...)``.

    Raises:
        ConfigError: `detector` is not a `Redact`, or the strategy is ``"block"`` or unknown.
    """
    _check("scrub_output", detector, strategy)
    if strategy == "block":
        raise ConfigError(
            "scrub_output: 'block' cannot apply to text already streaming — reject such a"
            " reply with a guardrail instead: guardrail(lambda text: detector.redact_text(text)"
            " == text, feedback='Do not repeat personal data.')"
        )
    return _replacer(detector, strategy)
