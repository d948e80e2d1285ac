"""The events and records built most often, built without attrs' generated ``__init__``.

A listened-to turn builds a `HookStarted` and a `HookFinished` for every hook and a
`TextDelta` for every chunk. attrs' ``__init__`` for a frozen slotted record looks each
field's slot up by name through ``object.__setattr__``; these builders fill the slots through
their descriptors, which builds the same record (equal, same hash and repr) for about two
thirds of the cost. They are only for events whose fields are all plain (no default,
validator or converter): `_slot_setters` refuses any other, so a field given a validator
later cannot be skipped silently. The one exception is `Event.at`, which the builders take
as an argument: the drive's hot path stamps it from the clock read that times the hook, and
hands the event on with the watch's `post`; elsewhere it is left at 0.0 for the watch's
``emit`` (`_observe.py`) to stamp.
"""

from collections.abc import Callable
from typing import Any

import attrs

from .events import Event, HookFinished, HookStarted, TextDelta

_bare = object.__new__
_set_at = Event.at.__set__  # type: ignore[attr-defined]


def _slot_setters(cls: type) -> tuple[Callable[[object, Any], None], ...]:
    """The slot setters of `cls`'s fields, in field order."""
    setters = []
    for field in attrs.fields(cls):
        if field.name == "at":
            continue
        if (
            field.validator is not None
            or field.converter is not None
            or field.default is not attrs.NOTHING
            or not field.init
        ):
            raise TypeError(
                f"{cls.__name__}.{field.name} is not a plain field: its events must be built"
                " with the class's own constructor"
            )
        setters.append(getattr(cls, field.name).__set__)
    return tuple(setters)


_started = _slot_setters(HookStarted)
_finished = _slot_setters(HookFinished)
_delta = _slot_setters(TextDelta)

DELTA_SETTERS: tuple[Callable[[object, Any], None], ...] = (_set_at, *_delta)
"""`TextDelta`'s slot setters: ``at``, ``turn_ref``, ``text``, ``attempt``.

For the model step's loop, which builds one event per chunk inline (``object.__new__`` and
these) rather than through `text_delta`: a call less on every chunk."""


def hook_started(turn_ref: str, hook: str, stage: str, at: float = 0.0) -> HookStarted:
    """``HookStarted(turn_ref, hook, stage, at=at)``."""
    event = _bare(HookStarted)
    _set_at(event, at)
    set_ref, set_hook, set_stage = _started
    set_ref(event, turn_ref)
    set_hook(event, hook)
    set_stage(event, stage)
    return event


def hook_finished(
    turn_ref: str, hook: str, stage: str, elapsed: float, verdict: str, at: float = 0.0
) -> HookFinished:
    """``HookFinished(turn_ref, hook, stage, elapsed, verdict, at=at)``."""
    event = _bare(HookFinished)
    _set_at(event, at)
    set_ref, set_hook, set_stage, set_elapsed, set_verdict = _finished
    set_ref(event, turn_ref)
    set_hook(event, hook)
    set_stage(event, stage)
    set_elapsed(event, elapsed)
    set_verdict(event, verdict)
    return event


def text_delta(turn_ref: str, text: str, attempt: int, at: float = 0.0) -> TextDelta:
    """``TextDelta(turn_ref, text, attempt, at=at)``."""
    event = _bare(TextDelta)
    _set_at(event, at)
    set_ref, set_text, set_attempt = _delta
    set_ref(event, turn_ref)
    set_text(event, text)
    set_attempt(event, attempt)
    return event
