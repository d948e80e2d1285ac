"""hooks.durable / hooks.transient: the durability markers."""

import pytest

from hooks import durable, transient
from pipeline import ConfigError, Hook, Pipeline, cont, hook
from pipeline.testing import ScriptedModel
from turns import Turn


def add_note(turn):
    return cont(turn.inject("note"))


def test_durable_marks_a_plain_function_durable():
    marked = durable(add_note)
    assert isinstance(marked, Hook)
    assert (marked.name, marked.durable) == ("add_note", True)


def test_transient_marks_a_plain_function_transient():
    assert transient(add_note).durable is False


@pytest.mark.parametrize("marker", [durable, transient], ids=["durable", "transient"])
def test_a_marker_given_none_raises_config_error_naming_it(marker):
    """Catches: ``durable(None)`` returning `hook`'s decorator in place of a hook, which a
    pipeline accepts and which fails only when a turn runs it."""
    with pytest.raises(ConfigError, match=rf"{marker.__name__}\(fn\) marks a hook function"):
        marker(None)


def test_markers_keep_the_other_options_of_a_hook():
    base = hook(add_note, name="note", timeout=2.0, on_error="skip")
    assert (durable(base).name, durable(base).timeout, durable(base).on_error) == (
        "note",
        2.0,
        "skip",
    )
    assert transient(durable(base)).durable is False


async def test_injections_carry_the_markers_durability():
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[durable(hook(add_note, name="kept")), transient(hook(add_note, name="dropped"))],
    )
    result = await pipe.run(Turn.start("hi"))
    assert [(i.source, i.durable) for i in result.turn.injections] == [
        ("kept", True),
        ("dropped", False),
    ]
