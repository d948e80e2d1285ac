"""Guardrails: post hooks that accept the reply or send the model back with feedback.

Each factory checks its options when it is built and returns a `Hook`, so it can be
re-wrapped (``hook(guardrail(...), shadow=True)`` to try it out without enforcing it) and
tested alone with ``await rail(turn)``. A rejection is ``regenerate(feedback)``: the model
sees its reply and the feedback, within the pipeline's ``max_regenerations``.
"""

import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from pipeline import ConfigError, Cont, Hook, Model, Regenerate, cont, hook, regenerate
from turns import Turn

from ._ask import ask, check_callable, check_model, check_text, name_of
from ._redact import zero_width

Check: TypeAlias = Callable[[str], bool | str | Awaitable[bool | str]]
"""``check(text) -> bool | str``, sync or async: True accepts, False or feedback rejects."""


def reply_text(turn: Turn, name: str) -> str:
    """The text a guardrail judges; a clear error when it was placed before the model."""
    if not isinstance(turn, Turn):
        raise TypeError(f"guardrail {name!r} expects a Turn, got {type(turn).__name__}")
    if turn.reply is None:
        raise TypeError(
            f"guardrail {name!r} judges the reply, but the turn has none yet — place it in"
            " post=[...], not pre"
        )
    return turn.reply.text


def guardrail(check: Check, *, feedback: str | None = None, name: str | None = None) -> Hook:
    """A post hook that rejects replies `check` refuses.

    Args:
        check: ``check(text) -> bool | str``, sync or async, given the reply's text. True
            accepts; False rejects with `feedback`; a string rejects with that string as the
            feedback. Anything else is an error (the turn fails: a broken check never
            accepts).
        feedback: What the model is told when `check` returns False.
        name: The hook's name in events and rejections; by default the check's name.

    Raises:
        ConfigError: `check` is not a function of one argument, or `feedback` or `name` is
            not text.
    """
    check_callable("guardrail", "check", check, ("",))
    check_text("guardrail", "feedback", feedback)
    check_text("guardrail", "name", name)
    label = name if name is not None else name_of(check)
    fallback = feedback or (
        f"The reply did not pass the {label!r} check. Answer again so that it does."
    )

    async def run(turn: Turn) -> Cont[Turn] | Regenerate:
        verdict: Any = check(reply_text(turn, label))
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is True:
            return cont(turn)
        if verdict is False:
            return regenerate(fallback)
        if isinstance(verdict, str):
            return regenerate(verdict if verdict.strip() else fallback)
        raise TypeError(
            f"guardrail {label!r}: its check must return True, False or feedback text, got"
            f" {type(verdict).__name__} {verdict!r:.60} — did you forget a return?"
        )

    return hook(run, name=label)


def deny(*patterns: str | re.Pattern[str], feedback: str) -> Hook:
    """A guardrail rejecting any reply in which one of `patterns` is found.

    Args:
        patterns: Regular expressions (strings or compiled), searched anywhere in the reply.
        feedback: What the model is told when one is found.

    Raises:
        ConfigError: No pattern, a pattern that does not compile or can match zero
            characters (the empty string, or an empty place such as ``(?=password)``), or
            `feedback` that is not text.
    """
    if not patterns:
        raise ConfigError("deny() needs at least one pattern, e.g. deny(r'(?i)internal only', ...)")
    compiled: list[re.Pattern[str]] = []
    for index, pattern in enumerate(patterns, 1):
        if isinstance(pattern, re.Pattern) and isinstance(pattern.pattern, str):
            regex = pattern
        elif isinstance(pattern, str):
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    f"deny pattern {index} {pattern!r} does not compile: {exc}"
                ) from None
        else:
            raise ConfigError(
                f"deny pattern {index}: expected a string or compiled text regex, got"
                f" {type(pattern).__name__} {pattern!r}"
            )
        if (why := zero_width(regex, deny=True)) is not None:
            raise ConfigError(f"deny pattern {index} {regex.pattern!r} {why}")
        compiled.append(regex)
    check_text("deny", "feedback", feedback, optional=False)

    async def run(turn: Turn) -> Cont[Turn] | Regenerate:
        text = reply_text(turn, "deny")
        if any(regex.search(text) for regex in compiled):
            return regenerate(feedback)
        return cont(turn)

    return hook(run, name="deny")


def max_length(chars: int, *, feedback: str | None = None) -> Hook:
    """A guardrail rejecting replies longer than `chars` characters.

    Args:
        chars: The longest reply accepted, in characters.
        feedback: What the model is told; by default how long the reply was and the limit.

    Raises:
        ConfigError: `chars` is not a positive int, or `feedback` is not text.
    """
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 1:
        raise ConfigError(f"max_length(chars=...) must be a positive int, got {chars!r}")
    check_text("max_length", "feedback", feedback)

    async def run(turn: Turn) -> Cont[Turn] | Regenerate:
        length = len(reply_text(turn, "max_length"))
        if length <= chars:
            return cont(turn)
        return regenerate(
            feedback or f"The reply is {length} characters long; keep it within {chars} characters."
        )

    return hook(run, name="max_length")


_JUDGE_SYSTEM = """\
You review an assistant's reply against one rule:

{instruction}

Answer with exactly one line and nothing else:
PASS
if the reply follows the rule, or
FAIL: <one sentence saying what is wrong>
if it does not."""

_JUDGE_USER = """\
<user_message>
{question}
</user_message>
<assistant_reply>
{reply}
</assistant_reply>"""

_FAIL = re.compile(r"FAIL(?::[ \t]*(?P<reason>.*))?", re.DOTALL)


def read_verdict(text: str) -> tuple[bool, str] | None:
    """A judge's verdict: (passed, reason), or None when it is not in the strict format.

    The format is ``PASS``, or ``FAIL`` optionally followed by ``:`` and a reason, with
    nothing else around it but whitespace. Anything else (``Pass``, ``**PASS**``, a verdict
    followed by commentary) is unreadable, and an unreadable verdict never accepts.
    """
    verdict = text.strip()
    if verdict == "PASS":
        return True, ""
    failed = _FAIL.fullmatch(verdict)
    if failed is None:
        return None
    return False, (failed.group("reason") or "").strip()


def judge(model: Model, instruction: str, *, feedback: str | None = None) -> Hook:
    """An LLM-as-judge guardrail: `model` decides whether the reply follows `instruction`.

    The judge is sent the rule, the user's message and the reply, and must answer ``PASS``
    or ``FAIL: reason`` (see `read_verdict`). It fails closed: a FAIL and an unreadable
    verdict both reject the reply, and a judge model that raises fails the hook (the turn
    stops with `HookFailed`, unless the hook is given ``on_error="skip"``); nothing is
    accepted unless the judge said PASS.

    Args:
        model: The `Model` that judges (usually a small, fast one).
        instruction: The rule the reply must follow.
        feedback: What the main model is told on a rejection; by default the judge's
            reason.

    Raises:
        ConfigError: `model` is not a Model, or `instruction` or `feedback` is not text.
    """
    check_model("judge", model)
    check_text("judge", "instruction", instruction, optional=False)
    check_text("judge", "feedback", feedback)
    system = _JUDGE_SYSTEM.format(instruction=instruction.strip())
    unreadable = feedback or (
        "The reply could not be confirmed to follow this rule: "
        f"{instruction.strip()} Revise it so that it plainly does."
    )

    async def run(turn: Turn) -> Cont[Turn] | Regenerate:
        reply = reply_text(turn, "judge")
        answer = await ask(
            model, system, _JUDGE_USER.format(question=turn.user_message.text, reply=reply)
        )
        verdict = read_verdict(answer)
        if verdict is None:
            return regenerate(unreadable)
        passed, reason = verdict
        if passed:
            return cont(turn)
        return regenerate(
            feedback or (f"A reviewer rejected the reply: {reason}" if reason else unreadable)
        )

    return hook(run, name="judge")
