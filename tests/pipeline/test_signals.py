"""Signals: the lower-case constructors build the frozen records hooks return."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import Ask, Block, Cont, Halt, Regenerate, ask, block, cont, halt, regenerate
from turns import Message, Text, ToolResult, Turn

texts = st.text()


@given(st.one_of(st.integers(), texts, st.none(), st.tuples(st.integers())))
def test_cont_carries_its_value_unchanged(value: object) -> None:
    assert cont(value) == Cont(value)


def test_cont_carries_the_very_turn_it_was_given() -> None:
    turn = Turn.start("hi")

    assert cont(turn).value is turn


@given(texts)
def test_halt_without_reply_records_only_the_reason(reason: str) -> None:
    assert halt(reason) == Halt(reason, reply=None, hook=None)


@given(texts, texts)
def test_halt_keeps_a_text_reply(reason: str, reply: str) -> None:
    assert halt(reason, reply=reply) == Halt(reason, reply=reply, hook=None)


def test_halt_keeps_an_assistant_message_reply() -> None:
    message = Message.assistant("I can't help with that.")

    assert halt("policy", reply=message).reply is message


def test_halt_is_not_stamped_with_a_hook_until_the_runtime_does_it() -> None:
    assert halt("policy").hook is None


@pytest.mark.parametrize(
    "message",
    [
        Message.user("pretend I said this"),
        Message.system("new instructions"),
        Message.tool(ToolResult("call-1", "42")),
    ],
    ids=["user", "system", "tool"],
)
def test_halt_rejects_a_reply_message_that_is_not_from_the_assistant(message: Message) -> None:
    with pytest.raises(ValueError, match=message.role):
        halt("policy", reply=message)


@pytest.mark.parametrize("reply", [42, Text("not a message"), ["a", "list"], b"bytes"], ids=repr)
def test_halt_rejects_a_reply_that_is_neither_text_nor_a_message(reply: object) -> None:
    with pytest.raises(TypeError, match=type(reply).__name__):
        halt("policy", reply=reply)  # type: ignore[arg-type]


@given(texts)
def test_regenerate_carries_the_feedback(feedback: str) -> None:
    assert regenerate(feedback) == Regenerate(feedback)


@given(texts)
def test_block_carries_the_reason(reason: str) -> None:
    assert block(reason) == Block(reason)


@given(texts)
def test_ask_carries_the_question(question: str) -> None:
    assert ask(question) == Ask(question)


@pytest.mark.parametrize(
    ("signal", "field"),
    [
        (cont("x"), "value"),
        (halt("r"), "reason"),
        (regenerate("f"), "feedback"),
        (block("r"), "reason"),
        (ask("q"), "question"),
    ],
    ids=["cont", "halt", "regenerate", "block", "ask"],
)
def test_signals_are_frozen(signal: object, field: str) -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(signal, field, "changed")


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: halt(3), "halt(reason) takes text, got int 3"),
        (lambda: halt(None), "halt(reason) takes text, got NoneType"),  # type: ignore[arg-type]
        (lambda: block(None), "block(reason) takes text"),  # type: ignore[arg-type]
        (lambda: ask(3), "ask(question) takes text"),  # type: ignore[arg-type]
        (lambda: regenerate(None), "regenerate(feedback) takes text"),  # type: ignore[arg-type]
    ],
)
def test_a_signal_whose_text_is_not_text_is_refused_when_built(build, says: str) -> None:
    """Catches: halt(3) building a Halt whose reason is not text (the other signals were
    refused only once returned, as 'without a reason'), which the result, events and audit
    record then carry."""
    with pytest.raises(TypeError) as caught:
        build()
    assert says in str(caught.value)
