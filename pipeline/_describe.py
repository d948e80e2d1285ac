"""Describing values and exceptions for error messages, and the hints of a wrong return.

A leaf: every layer that words an error (tools, the runner, the stages, sessions) uses these, so they import nothing of the runtime.
"""

import inspect
from collections.abc import Iterator

from turns import Reply, Text, ToolCall, ToolResult, Turn

from ._signals import Ask, Block, Cont, Regenerate

PART_TYPES = (Text, ToolCall, ToolResult)

# What a tool hook continues with, by stage: for the likely fix in a wrong-return message.
_TOOL_HINTS: dict[str, tuple[str, type]] = {
    "before_tool": ("call", ToolCall),
    "after_tool": ("result", ToolResult),
}


def exc_text(exc: BaseException | None) -> str:
    """``Type: message`` for an exception."""
    if exc is None:
        return ""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_PEP_479 = frozenset(("coroutine raised StopIteration", "generator raised StopIteration"))


def as_raised(exc: Exception) -> Exception:
    """The exception a function raised: the `StopIteration` (``next()`` on an empty
    iterator) that Python turned into "RuntimeError: coroutine raised StopIteration" on its
    way out of a coroutine (PEP 479), ours or the function's own, or else `exc` itself."""
    cause = exc.__cause__
    if type(exc) is RuntimeError and type(cause) is StopIteration and str(exc) in _PEP_479:
        return cause
    return exc


def describe(value: object) -> str:
    """A short description of a value for error messages: its type and a clipped repr."""
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return text if isinstance(value, type) else f"{type(value).__name__} {text}"


def wrong_return_hint(result: object, *, group: bool, stage: str = "pre") -> str:
    """The likely fix for a hook that returned `result`, or "" when none is obvious."""
    if inspect.iscoroutine(result):
        return " — did you forget `await`? (the hook returned a coroutine without awaiting it)"
    if stage in _TOOL_HINTS:
        return _tool_hint(result, stage)
    if group and (result is None or type(result) in (Turn, Cont)):
        return (
            " — parallel members are append-only: return the parts to add, e.g."
            " `return [Text(...)]`, or [] to add nothing"
        )
    if result is None:
        return " — did you forget `return cont(turn)`?"
    if type(result) is Turn:
        return " — wrap it: `return cont(turn)`"
    if type(result) is Reply:
        return " — return the turn, not its reply: `return cont(turn)`"
    if type(result) is Cont:
        return " — Cont must carry the Turn: `return cont(turn)`"
    if type(result) is Regenerate:
        # A post hook that may not regenerate is a background one, told why by its caller.
        return "" if stage == "post" else " — regenerate() is for post hooks, which see the reply"
    if type(result) in (Block, Ask):
        return f" — {type(result).__name__.lower()}() is for before_tool hooks"
    if (
        not group
        and isinstance(result, list | tuple)
        and result
        and all(type(item) in PART_TYPES for item in result)
    ):
        return (
            " — parts are what a parallel member returns: if it is one (`retrieve(...)`"
            " is), place it inside `parallel(...)`; else inject them:"
            " `return cont(turn.inject(*parts))`"
        )
    if group and isinstance(result, Iterator):
        # A generator expression or map(...) over search results: the parts are there,
        # but lazily.
        return (
            " — return a list, not an iterator: `return [Text(doc) for doc in docs]` or"
            " `return list(...)`"
        )
    if isinstance(result, str | list) or type(result) in PART_TYPES:
        if group:
            return " — return a list of parts: `return [Text(...)]`"
        return " — to add content, inject it: `return cont(turn.inject(...))`"
    return ""


def _tool_hint(result: object, stage: str) -> str:
    value, kind = _TOOL_HINTS[stage]
    if result is None:
        return f" — did you forget `return cont({value})`?"
    if type(result) is kind:
        return f" — wrap it: `return cont({value})`"
    if type(result) is Cont:
        return f" — Cont must carry the {kind.__name__}: `return cont({value})`"
    if type(result) is Turn:
        return f" — {stage} hooks continue with the {kind.__name__}: `return cont({value})`"
    if type(result) is Regenerate:
        return " — regenerate() is for post hooks, which see the reply"
    if type(result) in (Block, Ask) and stage == "after_tool":
        return (
            f" — {type(result).__name__.lower()}() is for before_tool hooks; the call has run:"
            " rewrite its result (`return cont(result.with_content(...))`) or halt"
        )
    return ""
