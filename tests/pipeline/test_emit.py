"""The hottest events built without attrs' __init__: the same records as their constructors."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import events as ev
from pipeline._emit import _slot_setters, hook_finished, hook_started, text_delta

text = st.text(max_size=20)


def same(built: object, constructed: object) -> None:
    assert type(built) is type(constructed)
    assert built == constructed
    assert hash(built) == hash(constructed)
    assert repr(built) == repr(constructed)
    assert attrs.asdict(built) == attrs.asdict(constructed)  # type: ignore[arg-type]


@given(text, text, text)
def test_hook_started_is_the_constructed_record(turn_ref: str, hook: str, stage: str) -> None:
    same(hook_started(turn_ref, hook, stage), ev.HookStarted(turn_ref, hook, stage))


@given(text, text, text, st.floats(allow_nan=False), text)
def test_hook_finished_is_the_constructed_record(
    turn_ref: str, hook: str, stage: str, elapsed: float, verdict: str
) -> None:
    same(
        hook_finished(turn_ref, hook, stage, elapsed, verdict),
        ev.HookFinished(turn_ref, hook, stage, elapsed, verdict),
    )


@given(text, text, st.integers())
def test_text_delta_is_the_constructed_record(turn_ref: str, chunk: str, attempt: int) -> None:
    same(text_delta(turn_ref, chunk, attempt), ev.TextDelta(turn_ref, chunk, attempt))


def test_built_events_stay_frozen() -> None:
    event = hook_finished("t", "h", "pre", 0.5, "cont")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.verdict = "halt"  # type: ignore[misc]


@pytest.mark.parametrize(
    "field",
    [
        attrs.field(default="x"),
        attrs.field(validator=attrs.validators.instance_of(str)),
        attrs.field(converter=str),
    ],
    ids=["default", "validator", "converter"],
)
def test_an_event_with_a_field_that_is_not_plain_is_refused(field: object) -> None:
    # Filling its slots would skip the default, validator or converter.
    event = attrs.make_class("Noted", {"note": field}, bases=(ev.Event,), frozen=True)
    with pytest.raises(TypeError, match=r"Noted\.note is not a plain field"):
        _slot_setters(event)
