"""A running summary in the log, and history compaction that keeps it.

`running_summary` is a durable background post hook: every `every` turns, after the turn is
committed, it asks a model to fold the turns since the last summary into it, and its text
joins the log as its own entry. `drop_oldest` is a ``compact=`` function for the pipeline:
it drops the oldest turns from the history the model is sent until it fits, keeping the
latest summary and system messages.

How a summary knows where it stands. Its text part carries, under the `RUNNING_SUMMARY` meta
key, how many turns it covers and a fingerprint of the last one. In a session, the next turn
may start before a summary is committed (background hooks do not delay anything), so a
summary can land in the log after a turn it does not cover; the fingerprint tells which
turns before it are covered, so such a turn is neither lost from the next summary nor
counted twice. Compaction drops turns from the history a turn is answered from; when
`drop_oldest` drops turns no summary covers, it notes how many on the first message it keeps
(`DROPPED_TURNS` in that message's ``meta``, in the view only), and the count goes on.
"""

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import attrs

from pipeline import (
    INJECTED_BY,
    ConfigError,
    Cont,
    Hook,
    Model,
    Tokenizer,
    cont,
    hook,
    message_tokens,
)
from turns import Message, Part, Text, ToolCall, ToolResult, Turn

from ._ask import ask, check_callable, check_model

RUNNING_SUMMARY = "running_summary"
"""The `meta` key marking a running summary's text part.

Its value is ``{"turns": n, "through": fingerprint, "span": m, "segment": fingerprint}``:
the number of turns the summary covers, a fingerprint of the last of them, and how many
turns it folded in with a fingerprint of that run (which tells the last turn from a later
one repeating it word for word; markers without them are still read).
"""

_NEEDS_LOG = "_turnplug_needs_log"
"""The attribute marking a hook function that does nothing useful without a conversation
log (`needs_log`)."""

DROPPED_TURNS = "dropped_turns"
"""The message `meta` key where `drop_oldest` notes how many uncovered turns it dropped.

It is set on the first message of the compacted history (a per-turn view; the log is never
changed), so that `running_summary` still counts the turns it can no longer see. A custom
``compact=`` function that drops turns may set it too.
"""

_HEADING = "Summary of the conversation so far:\n"

_SYSTEM = """\
You keep a running summary of a conversation between a user and an assistant. You are given
the summary so far (it may be empty) and the turns since. Write the updated summary: who the
user is and what they want, facts and numbers established, decisions made, and what is
still open. Be brief and factual; keep what still matters from the summary so far. Answer
with the summary only."""


def running_summary(model: Model, *, every: int = 10) -> Hook:
    """A durable background post hook that writes a running summary into the log.

    After every `every`-th turn of a conversation is committed, `model` is asked to fold the
    turns since the last summary into it; the new summary joins the log as a user message
    headed "Summary of the conversation so far:", its text part marked with
    `RUNNING_SUMMARY`. Turns are counted from the history the turn was answered from, so
    the count survives the log; a turn continuing from tool results its caller ran is
    counted with the turn that made the calls. A summary that fails (the model raises or
    says nothing) is reported as a `HookFailed` event and nothing is committed; the next
    try comes `every` turns later. Pair it with ``compact=drop_oldest()``, which keeps the latest summary
    while it drops the turns it covers.

    Raises:
        ConfigError: `model` is not a Model, or `every` is not a positive int.
    """
    check_model("running_summary", model)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"running_summary(every=...) must be a positive int, got {every!r}")

    async def run(turn: Turn) -> Cont[Turn]:
        reply = turn.reply
        if reply is None:
            raise TypeError(
                "running_summary summarizes answered turns: place it in post=[...], not pre"
            )
        history = turn.context.messages
        latest, covered, uncovered = _coverage(history)
        # A turn continuing from tool results its caller ran (a tool message) finishes the
        # turn that made the calls: in the log it reads as that turn's tool step, so it is
        # counted with it, and a turn waiting for such results is summarized once they came.
        asked = _asked(turn.user_message)
        if not asked and not uncovered:
            return cont(turn)
        count = covered + _noted(history) + len(uncovered) + int(asked)
        if count % every or _awaits_results(reply.messages):
            return cont(turn)
        previous = history[latest].text.removeprefix(_HEADING) if latest is not None else ""
        pending = [m for start, end in uncovered for m in history[start:end] if _marker(m) is None]
        transcript = "\n".join(
            _line(message) for message in [*pending, turn.user_message, *reply.messages]
        )
        summary = (
            await ask(
                model,
                _SYSTEM,
                f"<summary_so_far>\n{previous}\n</summary_so_far>\n"
                f"<new_turns>\n{transcript}\n</new_turns>",
            )
        ).strip()
        if not summary:
            raise ValueError(
                f"the summary model {model!r} answered with no text; nothing was written and"
                " the next summary covers these turns too — check that the model answers the"
                " summary prompt (its system prompt and max tokens)"
            )
        folded = [  # every uncovered turn has a fingerprint: `_coverage` keeps only those
            fingerprint
            for start, end in uncovered
            if (fingerprint := _turn_fingerprint(history, start, end)) is not None
        ]
        if asked:
            through = _fingerprint(turn.user_message, reply.messages)
            folded.append(through)
        else:  # the fingerprint the turn it finishes will have in the log
            start, end = uncovered[-1]
            whole = (*history[start:end], turn.user_message, *reply.messages)
            through = folded[-1] = _turn_fingerprint(whole, 0, len(whole)) or folded[-1]
        marker = {
            "turns": count,
            "through": through,
            "span": len(folded),
            "segment": _segment(folded),
        }
        return cont(turn.inject(Text(_HEADING + summary, meta={RUNNING_SUMMARY: marker})))

    setattr(run, _NEEDS_LOG, True)
    return hook(run, name="running_summary", durable=True, background=True)


def needs_log(entry: object) -> bool:
    """Whether `entry` is a hook that only works in a conversation with a log: a running
    summary, whose output only later turns read from the log. A stateless turn (no log,
    the caller keeps the history) would wait for its model call, then throw the summary
    away, and re-summarize the caller's whole history every `every` turns."""
    return isinstance(entry, Hook) and getattr(entry.fn, _NEEDS_LOG, False) is True


def drop_oldest(
    *, keep: Callable[[Message], bool] | None = None
) -> Callable[[tuple[Message, ...], int, Tokenizer], tuple[Message, ...]]:
    """A ``compact=`` function: drop the oldest turns until the history fits its target.

    Whole turns are dropped, oldest first: a user message with everything up to the next
    one (its reply, tool calls with their results, what hooks added to it), so a tool call
    is never separated from its result. System messages, the latest running summary and
    messages `keep` accepts are never dropped; nor is the other half of a tool call or
    result a kept message holds. If the history cannot be brought under the
    target that way, what is left is returned and the budget check reports the overflow.
    The log is never changed: this is the view one turn sends.

    Args:
        keep: A predicate ``message -> bool`` for more messages to keep.

    Raises:
        ConfigError: `keep` is not callable.
    """
    if keep is not None and not callable(keep):
        raise ConfigError(
            f"drop_oldest(keep=...) must be a predicate message -> bool, got {keep!r}"
        )
    if keep is not None:
        check_callable("drop_oldest", "keep", keep, (Message.user(""),))

    def compact(
        history: tuple[Message, ...], target_tokens: int, tokenizer: Tokenizer
    ) -> tuple[Message, ...]:
        total = message_tokens(history, tokenizer)
        if total <= target_tokens:
            return history
        latest, _covered, uncovered_turns = _coverage(history)
        uncovered = set(uncovered_turns)
        kept = {
            index
            for index, message in enumerate(history)
            if message.role == "system" or index == latest or (keep is not None and keep(message))
        }
        units = _units(history)
        if keep is not None:
            kept = _with_partners(history, kept, units)
        dropped: set[int] = set()
        unseen = _noted(history)  # uncovered turns dropped, by this and earlier compaction
        for start, end in units:
            if total <= target_tokens:
                break
            gone = [index for index in range(start, end) if index not in kept]
            total -= message_tokens([history[index] for index in gone], tokenizer)
            dropped.update(gone)
            unseen += (start, end) in uncovered and any(_asked(history[i]) for i in gone)
        view = [message for index, message in enumerate(history) if index not in dropped]
        if view and unseen:
            view[0] = attrs.evolve(view[0], meta={**view[0].meta, DROPPED_TURNS: unseen})
        return tuple(view)

    compact.__name__ = compact.__qualname__ = "drop_oldest"
    return compact


# -- reading the history --------------------------------------------------------------------


def _injected(part: Part) -> bool:
    return INJECTED_BY in part.meta


def _own_text(message: Message) -> str:
    """The text of a message's parts no hook injected."""
    return "".join(p.text for p in message.parts if type(p) is Text and not _injected(p))


def _asked(message: Message) -> bool:
    """Whether `message` is what a user said (it starts a turn)."""
    return message.role == "user" and any(not _injected(part) for part in message.parts)


def _marker(message: Message) -> Mapping[str, Any] | None:
    """A running summary's marker, when `message` is one."""
    if message.role != "user":
        return None
    for part in message.parts:
        marker = part.meta.get(RUNNING_SUMMARY) if type(part) is Text else None
        if (
            isinstance(marker, Mapping)
            and type(marker.get("turns")) is int
            and isinstance(marker.get("through"), str)
        ):
            return marker
    return None


def _latest_summary(history: Sequence[Message]) -> int | None:
    """The index of the summary covering the most turns (the later one on a tie)."""
    best: int | None = None
    best_turns = -1
    for index, message in enumerate(history):
        marker = _marker(message)
        if marker is not None and marker["turns"] >= best_turns:
            best, best_turns = index, marker["turns"]
    return best


def _units(history: Sequence[Message]) -> list[tuple[int, int]]:
    """The history cut into turns, as (start, end) index ranges, oldest first.

    A turn starts at what the user said, or at the tool exchange hooks injected right before
    it (which was sent with it); anything before the first turn is a unit of its own.
    """
    starts = []
    for index, message in enumerate(history):
        if _asked(message):
            start = index
            while start > 0 and _injected_exchange(history[start - 1]):
                start -= 1
            starts.append(start)
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    bounds = [*starts, len(history)]
    return [(start, end) for start, end in pairwise(bounds) if end > start]


def _with_partners(
    history: Sequence[Message], kept: set[int], units: Sequence[tuple[int, int]]
) -> set[int]:
    """`kept` with, in each turn, the messages holding the other half of every tool call or
    result a kept message holds: `keep` accepting a tool message alone must not leave a
    result without its call (or a call without its result), which providers refuse.

    Pairs are looked for within a turn only: some providers reuse call ids across turns.
    """
    closed = set(kept)
    for start, end in units:
        pending = [index for index in range(start, end) if index in closed]
        if not pending:
            continue
        holders: dict[str, list[int]] = {}
        for index in range(start, end):
            for key in _call_ids(history[index]):
                holders.setdefault(key, []).append(index)
        while pending:
            for key in _call_ids(history[pending.pop()]):
                for other in holders[key]:
                    if other not in closed:
                        closed.add(other)
                        pending.append(other)
    return closed


def _call_ids(message: Message) -> list[str]:
    """The ids of the tool calls `message` makes or answers."""
    return [
        part.id if type(part) is ToolCall else part.call_id
        for part in message.parts
        if type(part) is ToolCall or type(part) is ToolResult
    ]


def _awaits_results(reply: Sequence[Message]) -> bool:
    """Whether a reply ends with tool calls for its caller to run (a turn continues it)."""
    return bool(reply) and any(type(part) is ToolCall for part in reply[-1].parts)


def _injected_exchange(message: Message) -> bool:
    return (
        message.role in ("assistant", "tool")
        and bool(message.parts)
        and all(_injected(part) for part in message.parts)
    )


def _fingerprint(asked: Message, reply: Sequence[Message]) -> str:
    """Identifies a turn by what the user said and what the assistant answered."""
    texts = [_own_text(asked), *(m.text for m in reply if m.role == "assistant")]
    return hashlib.sha256("\x1f".join(texts).encode()).hexdigest()[:16]


def _turn_fingerprint(history: Sequence[Message], start: int, end: int) -> str | None:
    """The fingerprint of the turn in ``history[start:end]``, if it is one."""
    messages = history[start:end]
    asked = next((message for message in messages if _asked(message)), None)
    if asked is None:
        return None
    after = messages[messages.index(asked) + 1 :]
    answers = [
        message
        for message in after
        if message.role == "assistant" and not all(_injected(part) for part in message.parts)
    ]
    return _fingerprint(asked, answers)


def _coverage(history: Sequence[Message]) -> tuple[int | None, int, list[tuple[int, int]]]:
    """Where the latest summary is, how many turns it covers, and the turns it does not.

    The uncovered turns are those after it, and those before it that came after the turn it
    was written for (sent while it was being written). When that turn is no longer in view
    (compaction drops the oldest turns first), every turn before it in view came after it.
    A turn sent meanwhile may repeat that turn word for word ("thanks" - "You're welcome!"):
    of the turns carrying its fingerprint, the one it was written for is the one ending the
    run of turns it folded in (`_segment`), when those are still in view.
    """
    turns: list[tuple[int, int]] = []
    fingerprints: list[str] = []
    for start, end in _units(history):
        fingerprint = _turn_fingerprint(history, start, end)
        if fingerprint is not None:
            turns.append((start, end))
            fingerprints.append(fingerprint)
    latest = _latest_summary(history)
    if latest is None:
        return None, 0, turns
    marker = _marker(history[latest])
    assert marker is not None
    before = sum(1 for start, _end in turns if start < latest)
    candidates = [i for i in reversed(range(before)) if fingerprints[i] == marker["through"]]
    last = next(
        (i for i in candidates if _folded(fingerprints[: i + 1], marker)),
        candidates[0] if candidates else -1,
    )
    return latest, marker["turns"], turns[last + 1 :]


def _segment(fingerprints: Sequence[str]) -> str:
    """Identifies a run of turns, by their fingerprints in order."""
    return hashlib.sha256("\x1e".join(fingerprints).encode()).hexdigest()[:16]


def _folded(fingerprints: Sequence[str], marker: Mapping[str, Any]) -> bool:
    """Whether the turns ending with the last of `fingerprints` are the run a summary folded
    in; true when that cannot be told (a summary written without the run's fingerprint, or
    turns compaction has dropped from view since).
    """
    span, segment = marker.get("span"), marker.get("segment")
    if type(span) is not int or span < 1 or not isinstance(segment, str):
        return True
    if len(fingerprints) < span:
        return True
    return _segment(fingerprints[-span:]) == segment


def _noted(history: Sequence[Message]) -> int:
    """The uncovered turns a compaction dropped from this view (see `DROPPED_TURNS`)."""
    noted = history[0].meta.get(DROPPED_TURNS, 0) if history else 0
    return noted if type(noted) is int and noted > 0 else 0


def _line(message: Message) -> str:
    """One message of the transcript the summary model reads."""
    pieces = []
    for part in message.parts:
        if type(part) is Text:
            pieces.append(part.text)
        elif type(part) is ToolCall:
            pieces.append(f"[called {part.name}({json.dumps(dict(part.arguments), default=str)})]")
        elif type(part) is ToolResult:
            pieces.append(f"[result: {part.content}]")
    return f"{message.role}: {' '.join(pieces)}"
