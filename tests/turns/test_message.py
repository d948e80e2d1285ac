"""Message: the role check, the named constructors and the joined `.text`."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.turns.strategies import messages, parts, text_parts, texts, tool_results
from turns import Message, Part, Text, ToolCall, ToolResult


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_message_accepts_each_of_the_four_roles(role: str) -> None:
    assert Message(role).role == role  # type: ignore[arg-type]


def test_message_rejects_an_unknown_role_naming_it() -> None:
    with pytest.raises(ValueError, match="robot"):
        Message("robot")  # type: ignore[arg-type]


def test_message_meta_is_empty_by_default() -> None:
    assert Message("user").meta == {}


@given(messages())
def test_messages_are_frozen(message: Message) -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        message.role = "user"  # type: ignore[misc]


@given(texts)
def test_user_from_a_string_holds_one_text_part(text: str) -> None:
    assert Message.user(text) == Message("user", (Text(text),))


@given(parts())
def test_user_from_a_single_part_holds_that_part(part: Part) -> None:
    assert Message.user(part).parts == (part,)


@given(st.lists(parts(), max_size=4))
def test_user_from_a_list_of_parts_holds_them_in_order_as_a_tuple(items: list[Part]) -> None:
    assert Message.user(items).parts == tuple(items)


def test_user_from_a_generator_of_parts_holds_them_in_order() -> None:
    message = Message.user(Text(word) for word in ("a", "b", "c"))

    assert message.parts == (Text("a"), Text("b"), Text("c"))


def test_user_keeps_the_meta_it_is_given() -> None:
    assert Message.user("hi", meta={"origin": "web"}).meta == {"origin": "web"}


@pytest.mark.parametrize(
    "constructor", [Message.user, Message.assistant], ids=["user", "assistant"]
)
def test_constructor_rejects_a_non_part_in_the_list_naming_its_type(constructor) -> None:
    with pytest.raises(TypeError, match="int"):
        constructor([Text("ok"), 42])


def test_assistant_from_a_string_holds_one_text_part() -> None:
    assert Message.assistant("Hello!") == Message("assistant", (Text("Hello!"),))


def test_assistant_from_text_and_tool_calls_keeps_them_in_order() -> None:
    call = ToolCall("call-1", "search", {"q": "docs"})

    assert Message.assistant([Text("Let me look."), call]).parts == (Text("Let me look."), call)


def test_system_holds_one_text_part() -> None:
    assert Message.system("Be brief.") == Message("system", (Text("Be brief."),))


@given(tool_results())
def test_tool_holds_the_one_result(result: ToolResult) -> None:
    assert Message.tool(result) == Message("tool", (result,))


@given(st.lists(text_parts(), max_size=4))
def test_text_joins_the_text_parts_in_order(items: list[Text]) -> None:
    assert Message.user(items).text == "".join(part.text for part in items)


@given(st.lists(parts(), max_size=5))
def test_text_leaves_out_tool_calls_and_results(items: list[Part]) -> None:
    expected = "".join(part.text for part in items if isinstance(part, Text))

    assert Message.assistant(items).text == expected


@pytest.mark.parametrize(
    "given",
    [Text("42"), "42", ToolCall("call-1", "f", {}), [ToolResult("call-1", "42")]],
    ids=["text", "str", "tool-call", "list"],
)
def test_tool_refuses_anything_but_one_result(given: object) -> None:
    """Catches: `Message.tool` building a tool message from a Text (or a ToolCall, or a list
    of results), which no provider can send, instead of refusing it where it was made."""
    with pytest.raises(
        TypeError, match=f"Message.tool takes one ToolResult, got {type(given).__name__}"
    ):
        Message.tool(given)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: Message.user("hi", meta=[("k", 1)]), "Message.meta must be a mapping, got list"),
        (lambda: Message("user", (Text("hi"),), None), "Message.meta must be a mapping"),
        (lambda: Message.user([Text("hi", meta=[1])]), "Text.meta must be a mapping, got list"),
        (
            lambda: Message.assistant([ToolCall("1", "f", {}, meta="x")]),
            "ToolCall.meta must be a mapping, got str",
        ),
    ],
    ids=["message", "message-none", "text", "tool-call"],
)
def test_a_meta_that_is_no_mapping_is_refused_where_it_is_built(build, says: str) -> None:
    """Catches: a message or part whose meta is a list accepted, to fail only when the turn
    is committed, after the model was paid for, as a bare "'list' object is not a mapping"
    (or an AttributeError in `turns.serde.to_dict`) naming neither the record nor the hook."""
    with pytest.raises(TypeError, match=says):
        build()


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (
            lambda: Message.user("hi", meta={("a", "b"): 1}),
            r"Message\.meta has the key tuple \('a', 'b'\): meta keys must be strings",
        ),
        (
            lambda: Message.user([Text("hi", meta={"ok": 1, 7: 2})]),
            r"Text\.meta has the key int 7: meta keys must be strings",
        ),
        (
            lambda: Message.assistant([ToolCall("1", "f", {}, meta={None: "x"})]),
            r"ToolCall\.meta has the key NoneType None",
        ),
    ],
    ids=["message", "text", "tool-call"],
)
def test_a_meta_key_that_is_no_string_is_refused_where_it_is_built(build, says: str) -> None:
    """Bug caught: a meta with a tuple key was accepted, and failed only when the turn was
    committed (after the model call) or written, where `to_dict` said only "unhashable type:
    'list'"."""
    with pytest.raises(TypeError, match=says):
        build()


def test_a_meta_with_string_keys_of_a_str_subclass_is_accepted() -> None:
    import enum

    class Kind(enum.StrEnum):
        NOTE = "note"

    assert Message.user([Text("hi", meta={Kind.NOTE: 1})], meta={Kind.NOTE: 2}).meta == {"note": 2}


def test_text_of_a_tool_message_is_empty() -> None:
    assert Message.tool(ToolResult("call-1", "42")).text == ""


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: Message("user", "abc"), "not a str ('abc')"),
        (lambda: Message("user", ("raw",)), "got str 'raw' — wrap plain strings in Text"),
        (lambda: Message("user", (Text(3),)), "Text.text must be a str, got int 3"),
        (lambda: Message("tool", (ToolResult("1", 5),)), "got str '1', int 5"),
        (
            lambda: Message("assistant", (ToolCall("1", "f", [1, 2]),)),
            "ToolCall.arguments must be a mapping",
        ),
        (lambda: Message("user", 5), "an iterable of parts, got int 5"),
        (lambda: Message.user(3), "text, a part or parts, got int 3"),
        (lambda: Message.user([Text(None)]), "Text.text must be a str, got NoneType None"),
    ],
)
def test_a_malformed_message_is_refused_where_it_is_built(build, says: str) -> None:
    """Catches: Message("user", "abc") split into the parts 'a', 'b', 'c'; parts of the wrong
    type or with fields of the wrong type accepted, to fail only when the turn renders them
    (reported as the model provider's failure), or a bare "object is not iterable"."""
    with pytest.raises(TypeError) as caught:
        build()
    assert says in str(caught.value)
