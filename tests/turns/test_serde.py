"""turns.serde: exact round trips of every record, the part tags, and path-naming errors."""

import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.turns.strategies import RECORD_STRATEGIES
from turns import (
    Context,
    Injection,
    Message,
    Part,
    RequestOptions,
    Text,
    ToolCall,
    ToolResult,
    Turn,
    Usage,
    serde,
)
from turns.serde import from_dict, from_json, to_dict, to_json

RECORDS = list(RECORD_STRATEGIES.items())
RECORD_IDS = [cls.__name__ for cls, _ in RECORDS]

round_trip = pytest.mark.parametrize(("cls", "strategy"), RECORDS, ids=RECORD_IDS)


# --- round trips --------------------------------------------------------------------------


@round_trip
@given(data=st.data())
def test_to_dict_then_from_dict_gives_back_the_record(cls: type, strategy, data) -> None:
    obj = data.draw(strategy)

    assert from_dict(cls, to_dict(obj)) == obj


@round_trip
@given(data=st.data())
def test_to_json_then_from_json_gives_back_the_record(cls: type, strategy, data) -> None:
    obj = data.draw(strategy)

    assert from_json(cls, to_json(obj)) == obj


@round_trip
@given(data=st.data())
def test_from_dict_then_to_dict_gives_back_the_data(cls: type, strategy, data) -> None:
    d = json.loads(to_json(data.draw(strategy)))

    assert to_dict(from_dict(cls, d)) == d


@round_trip
@given(data=st.data())
def test_to_dict_is_plain_json_data(cls: type, strategy, data) -> None:
    d = to_dict(data.draw(strategy))

    assert json.loads(json.dumps(d)) == d
    assert_json_shaped(d)


@round_trip
@given(data=st.data())
def test_to_json_is_the_json_encoding_of_to_dict(cls: type, strategy, data) -> None:
    obj = data.draw(strategy)

    assert json.loads(to_json(obj)) == to_dict(obj)


def assert_json_shaped(value: Any) -> None:
    """Only dicts with str keys, lists and JSON scalars: no tuples, no records."""
    if isinstance(value, dict):
        assert all(isinstance(key, str) for key in value)
        for item in value.values():
            assert_json_shaped(item)
    elif isinstance(value, list):
        for item in value:
            assert_json_shaped(item)
    else:
        assert value is None or isinstance(value, str | int | float | bool), value


def test_from_dict_builds_tuples_not_lists() -> None:
    turn = Turn.start(Message.user([Text("a"), Text("b")]), turn_ref="r").inject("note")
    turn = turn.with_request(active_tools=[])

    back = from_dict(Turn, json.loads(to_json(turn)))

    assert [
        type(back.user_message.parts),
        type(back.injections),
        type(back.injections[0].parts),
        type(back.context.messages),
        type(back.request.active_tools),
    ] == [tuple, tuple, tuple, tuple, tuple]


def test_to_json_keeps_non_ascii_text_exact() -> None:
    message = Message.user("naïve café — 東京 🚀")

    assert from_json(Message, to_json(message)) == message


# --- the part tags ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "tag"),
    [
        (Text("hi"), "text"),
        (ToolCall("call-1", "search", {"q": "x"}), "tool_call"),
        (ToolResult("call-1", "found"), "tool_result"),
    ],
    ids=["text", "tool_call", "tool_result"],
)
def test_a_part_in_a_message_is_tagged_with_its_type(part: Any, tag: str) -> None:
    assert to_dict(Message.assistant([part]))["parts"][0]["type"] == tag


def test_parts_are_read_back_by_their_tag() -> None:
    data = {
        "role": "assistant",
        "parts": [
            {"type": "tool_result", "call_id": "c", "content": "r"},
            {"type": "text", "text": "t"},
            {"type": "tool_call", "id": "c", "name": "f", "arguments": {"a": 1}},
        ],
    }

    assert from_dict(Message, data).parts == (
        ToolResult("c", "r"),
        Text("t"),
        ToolCall("c", "f", {"a": 1}),
    )


def test_injection_parts_are_tagged_too() -> None:
    injection = Injection((ToolCall("c", "f", {}), ToolResult("c", "r")), "hook", True, "pre")

    assert [part["type"] for part in to_dict(injection)["parts"]] == ["tool_call", "tool_result"]


# --- errors -------------------------------------------------------------------------------


def message_data(**changes: Any) -> dict[str, Any]:
    return {**to_dict(Message.user([Text("hi"), ToolResult("c", "r")])), **changes}


def test_an_unknown_top_level_key_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="colour"):
        from_dict(Message, message_data(colour="red"))


def test_an_unknown_key_in_a_part_is_rejected_naming_its_path() -> None:
    data = message_data()
    data["parts"][1]["bogus"] = 1

    with pytest.raises(ValueError, match=r"parts\[1\]") as excinfo:
        from_dict(Message, data)

    assert "bogus" in str(excinfo.value)


def test_an_unknown_key_deep_in_a_turn_is_rejected_naming_its_path() -> None:
    data = to_dict(Turn.start("hi", turn_ref="r").inject("a").inject("b", "c"))
    data["injections"][1]["parts"][1]["oops"] = True

    with pytest.raises(ValueError, match=r"injections\[1\]\.parts\[1\]") as excinfo:
        from_dict(Turn, data)

    assert "oops" in str(excinfo.value)


def test_an_unknown_key_in_request_options_is_rejected_naming_it() -> None:
    data = {**to_dict(RequestOptions()), "temprature": 0.2}

    with pytest.raises(ValueError, match="temprature"):
        from_dict(RequestOptions, data)


def test_a_wrong_role_is_rejected_naming_the_role_path() -> None:
    with pytest.raises(ValueError, match="role"):
        from_dict(Message, message_data(role="robot"))


def test_a_wrong_role_in_the_history_is_rejected_naming_its_path() -> None:
    data = to_dict(Context(messages=(Message.user("a"), Message.assistant("b"))))
    data["messages"][1]["role"] = "robot"

    with pytest.raises(ValueError, match=r"messages\[1\]\.role"):
        from_dict(Context, data)


def test_an_unknown_part_tag_is_rejected_naming_its_path() -> None:
    data = message_data()
    data["parts"][0]["type"] = "image"

    with pytest.raises(ValueError, match=r"parts\[0\]"):
        from_dict(Message, data)


def test_an_unknown_part_tag_is_rejected_naming_the_tag() -> None:
    data = message_data()
    data["parts"][0]["type"] = "image"

    with pytest.raises(ValueError, match="image"):
        from_dict(Message, data)


def test_a_missing_required_key_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="content"):
        from_dict(ToolResult, {"call_id": "c"})


def test_a_value_of_the_wrong_type_is_rejected_naming_its_path() -> None:
    with pytest.raises(ValueError, match="input_tokens"):
        from_dict(Usage, {"input_tokens": "many", "output_tokens": 1})


def test_from_json_rejects_an_unknown_key_with_value_error() -> None:
    with pytest.raises(ValueError, match="colour"):
        from_json(Text, '{"text": "hi", "meta": {}, "colour": "red"}')


@pytest.mark.parametrize(
    ("part", "tag"),
    [
        (Text("a"), "text"),
        (ToolCall("c", "f", {}), "tool_call"),
        (ToolResult("c", "ok"), "tool_result"),
    ],
)
def test_a_part_on_its_own_carries_its_tag_and_reads_back_as_a_part(part, tag) -> None:
    data = to_dict(part)
    assert data["type"] == tag
    assert from_dict(Part, data) == part
    assert from_dict(type(part), data) == part


def test_a_tagged_part_read_as_another_part_class_is_rejected_naming_both_tags() -> None:
    with pytest.raises(ValueError, match=r"'text'.*'tool_call'"):
        from_dict(ToolCall, to_dict(Text("a")))


@round_trip
@given(data=st.data())
def test_to_dict_builds_what_cattrs_generated_hooks_build(cls: type, strategy, data) -> None:
    """Catches: the hand-written hooks for messages and parts (built for the logs' commit
    path) drifting from the generated ones — a field added to a part and not written, a
    key out of order, an opaque value not unstructured."""
    obj = data.draw(strategy)
    generated = serde._make_converter()
    expected = (
        generated.unstructure(obj, Part) if type(obj) in serde._TAGS else generated.unstructure(obj)
    )

    assert json.dumps(to_dict(obj)) == json.dumps(expected)


def test_what_a_record_may_have_been_written_with_reads_back() -> None:
    """Catches: the strict reader refusing values the records themselves accept and the
    logs write (``is_error=0``, a model's ``Usage(12.5, 3)``, a `StrEnum` error class), so
    that a conversation committed with one could never be loaded again."""
    import enum

    class Failure(enum.StrEnum):
        TIMEOUT = "timeout"

    result = ToolResult("c", "r", is_error=0, error_class=Failure.TIMEOUT)  # type: ignore[arg-type]
    assert from_dict(ToolResult, json.loads(json.dumps(to_dict(result)))) == ToolResult(
        "c", "r", is_error=False, error_class="timeout"
    )
    assert from_dict(Usage, {"input_tokens": 12.0, "output_tokens": 3}) == Usage(12, 3)


def test_a_fractional_count_round_trips_exactly() -> None:
    """Catches: a count written as a fraction (a model's ``Usage(12.5, 3)``, which the
    record accepts) read back cut to ``Usage(12, 3)``, so the record did not round-trip."""
    usage = Usage(12.5, 3)  # type: ignore[arg-type]

    assert from_dict(Usage, to_dict(usage)) == usage
    assert from_json(Usage, to_json(usage)) == usage


@pytest.mark.parametrize(
    ("cls", "data", "path"),
    [
        (ToolResult, {"call_id": "c", "content": "r", "is_error": "false"}, "is_error"),
        (Injection, {"parts": [{"type": "text", "text": "a"}], "durable": 2}, "durable"),
        (Text, {"text": 3}, "text"),
        (Turn, {**to_dict(Turn.start("hi", turn_ref="r")), "turn_ref": 5}, "turn_ref"),
        (Usage, {"input_tokens": "12"}, "input_tokens"),
        (RequestOptions, {"temperature": True}, "temperature"),
    ],
    ids=[
        "bool-from-str",
        "bool-from-2",
        "str-from-int",
        "ref-from-int",
        "int-from-str",
        "float-from-bool",
    ],
)
def test_a_scalar_of_the_wrong_type_is_rejected_not_converted(cls, data, path) -> None:
    """Catches: `from_dict` calling the field's type on the value, so that
    ``"is_error": "false"`` read back as True, ``3`` as ``"3"`` and ``3.7`` tokens as 3,
    instead of refusing data of the wrong type as its docstring says."""
    with pytest.raises(ValueError, match=rf"expected \w+, got .* @ {cls.__name__}\.{path}$"):
        from_dict(cls, data)


def test_a_number_where_a_float_is_meant_is_read() -> None:
    """Catches: the strict reading refusing ``1`` for a float field, which JSON encoders
    other than Python's write for ``1.0``."""
    assert from_dict(RequestOptions, {"temperature": 1}) == RequestOptions(temperature=1.0)


@pytest.mark.parametrize(
    ("cls", "data", "path"),
    [
        (RequestOptions, {"active_tools": "search"}, r"RequestOptions\.active_tools"),
        (Message, {"role": "user", "parts": "hi"}, r"Message\.parts"),
        (Message, {"role": "user", "parts": {"type": "text", "text": "hi"}}, r"Message\.parts"),
    ],
    ids=["names-from-str", "parts-from-str", "parts-from-object"],
)
def test_a_list_field_given_no_list_is_rejected(cls, data, path) -> None:
    """Catches: a string (or an object) where a list belongs being iterated, so that
    ``"active_tools": "search"`` read back as the tools ``s``, ``e``, ``a``, ... and a
    string of parts failed with cattrs' ``'str' object has no attribute 'copy'``."""
    with pytest.raises(ValueError, match=rf"expected a list, got \w+ .* @ {path}$"):
        from_dict(cls, data)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"text": "a", "meta": {}}, "unknown part type none"),
        ({"type": "image"}, "unknown part type 'image'"),
        ("a", "a part must be an object"),
    ],
    ids=["untagged", "unknown-tag", "not-an-object"],
)
def test_bad_data_read_as_a_part_is_a_value_error(data: Any, problem: str) -> None:
    """Catches: `from_dict(Part, ...)` failing with AttributeError (the union `Part` has no
    ``__name__``, and a non-object reached cattrs' ``.copy()``) instead of the ValueError
    naming the problem."""
    with pytest.raises(ValueError, match=f"cannot read a Part from this data: .*{problem}"):
        from_dict(Part, data)


@pytest.mark.parametrize(
    ("cls", "data", "problem"),
    [
        (Message, [], r"Message: expected an object with the fields of a Message, got list \[\]"),
        (Turn, "hi", "Turn: expected an object with the fields of a Turn, got str 'hi'"),
        (Usage, None, "Usage: expected an object with the fields of a Usage, got NoneType None"),
        (
            Context,
            {"messages": [["user", "hi"]]},
            r"expected an object with the fields of a Message, got list .* @ Context\.messages\[0\]",
        ),
    ],
    ids=["list", "str", "none", "nested-list"],
)
def test_a_record_read_from_data_that_is_no_object_is_a_value_error(cls, data, problem) -> None:
    """Catches: a record read from a list or a string failing with a bare AttributeError
    (``'list' object has no attribute 'keys'``) instead of the ValueError `from_dict`
    documents, and ``None`` or a nested list reported as ``argument of type 'NoneType' is
    not iterable`` or an "unknown error", naming neither the record nor what was found."""
    with pytest.raises(ValueError, match=f"cannot read a {cls.__name__} from this data: {problem}"):
        from_dict(cls, data)


@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [
        (datetime.date(2026, 1, 2), TypeError, r"date datetime\.date\(2026, 1, 2\)"),
        ({"b", "a"}, TypeError, "set"),
        (math.nan, ValueError, "float nan"),
    ],
    ids=["date", "set", "nan"],
)
def test_to_json_names_the_path_of_a_value_json_cannot_hold(value, error, shown) -> None:
    """Catches: `to_json` of a record whose meta holds a date, a set or NaN failing with
    json's bare "Object of type date is not JSON serializable" (or "Out of range float
    values"), naming neither the record nor where the value is."""
    message = Message.user([Text("hi"), Text("note", meta={"seen": [1, value]})])

    with pytest.raises(
        error,
        match=rf"cannot write a Message as JSON: Message\.parts\[1\]\.meta\.seen\[1\] holds {shown}",
    ):
        to_json(message)


def test_a_part_without_its_tag_in_a_message_names_the_missing_tag() -> None:
    with pytest.raises(ValueError, match=r"unknown part type none, .* @ Message\.parts\[0\]$"):
        from_dict(Message, {"role": "user", "parts": [{"text": "a", "meta": {}}]})


@pytest.mark.parametrize(
    ("cls", "data", "problem"),
    [
        (
            RequestOptions,
            {"temperature": 5},
            r"RequestOptions\.temperature must be between 0 and 2, got 5\.0 @ RequestOptions$",
        ),
        (
            RequestOptions,
            {"max_tokens": 0},
            r"RequestOptions\.max_tokens must be a positive int or None, got 0 @ RequestOptions$",
        ),
        (
            Turn,
            {**to_dict(Turn.start("hi", turn_ref="r")), "request": {"temperature": -1}},
            r"RequestOptions\.temperature must be between 0 and 2, got -1\.0 @ Turn\.request$",
        ),
    ],
    ids=["temperature", "max-tokens", "nested"],
)
def test_a_value_a_record_refuses_is_named_with_the_records_own_message(cls, data, problem) -> None:
    """Bug caught: a value of the right type that the record's own check refuses (a
    temperature of 5, ``max_tokens`` 0) reported by `from_dict` as a bare "invalid value
    @ RequestOptions", naming neither the field nor the value, where the record says
    which field, what it got and what it takes."""
    with pytest.raises(ValueError, match=f"cannot read a {cls.__name__} from this data: {problem}"):
        from_dict(cls, data)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_json_nested_too_deeply_is_a_value_error_naming_the_record() -> None:
    """Bug caught: `from_json` of text nesting lists 100,000 levels deep (hostile or broken
    input) raising json's bare RecursionError instead of the ValueError it documents."""
    text = '{"text": "a", "meta": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}"

    with pytest.raises(ValueError, match=r"cannot read a Text from this data: .*nested too deeply"):
        from_json(Text, text)


@pytest.mark.parametrize("write", [to_dict, to_json], ids=["to_dict", "to_json"])
def test_a_value_nested_too_deeply_to_write_is_a_value_error_naming_the_record(write) -> None:
    """Bug caught: writing a tool call whose arguments nest a few hundred levels deep (a
    model's output, which JSON reads) failing with a RecursionError out of cattrs, naming
    neither the record nor the problem."""
    call = ToolCall("c1", "search", {"filter": _nested(5_000)})

    with pytest.raises(ValueError, match=r"cannot write a ToolCall: .*nested too deeply"):
        write(call)


def test_a_value_that_holds_itself_is_a_value_error_naming_the_record() -> None:
    """Bug caught: a meta mapping that holds itself making `to_dict` fail with a bare
    RecursionError."""
    meta: dict[str, Any] = {}
    meta["self"] = meta

    with pytest.raises(ValueError, match=r"cannot write a Message: .*holds itself"):
        to_dict(Message.user("hi", meta=meta))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"text": "a", "meta": {"x": NaN}}', "NaN is not a JSON value"),
        ('{"text": "a", "meta": {"x": -Infinity}}', "-Infinity is not a JSON value"),
        ('{"text": "a", "meta": {"x": 1e400}}', "the number 1e400 is out of a float's range"),
    ],
    ids=["nan", "infinity", "past-float-range"],
)
def test_from_json_refuses_a_number_to_json_could_not_write_back(text: str, shown: str) -> None:
    """Bug caught: `from_json` reading NaN, Infinity (not JSON) and 1e400 (read as
    infinity) into a record that `to_json` then refuses to write, so that reading and
    writing back a record failed on the write, far from the bad input."""
    with pytest.raises(ValueError, match=f"cannot read a Text from this data: {shown}"):
        from_json(Text, text)


# Keys a Python mapping may hold that JSON writes as text: 1 as "1", True as "true".
_keys = st.one_of(
    st.text(max_size=3), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)
)


@given(st.dictionaries(_keys, st.integers(), max_size=4))
def test_to_json_gives_back_the_record_or_refuses_a_key_that_is_no_string(
    meta: dict[Any, int],
) -> None:
    """Bug caught: `to_json` writing the meta key 1 as "1" (and True as "true", two keys 1
    and "1" as one), so that `from_json` gave back another record than was written."""
    text = Text("a", meta=meta)

    if all(type(key) is str for key in meta):
        assert from_json(Text, to_json(text)) == text
    else:
        with pytest.raises(
            TypeError, match=r"cannot write a Text as JSON: Text\.meta holds the key"
        ):
            to_json(text)


def test_a_key_that_is_no_string_deep_in_a_value_is_named_with_its_path() -> None:
    """Bug caught: `to_json` writing a nested key 7 as "7" without a word, which read back
    as another record."""
    call = ToolCall("c1", "search", {"filters": [{"tag": "a"}, {7: "b"}]})

    with pytest.raises(
        TypeError, match=r"ToolCall\.arguments\.filters\[1\] holds the key int 7, and JSON keys"
    ):
        to_json(call)


@pytest.mark.parametrize("write", [to_dict, to_json])
def test_a_tuple_key_deep_in_a_value_is_named_with_its_path(write: Any) -> None:
    """Bug caught: `to_dict` and `to_json` of a record whose meta or arguments hold a tuple
    key failed with a bare "unhashable type: 'list'", naming neither the record nor the key."""
    message = Message.user("hi", meta={"routing": {("eu", 1): "a"}})
    call = ToolCall("c1", "search", {"filters": [{("tag",): "a"}]})

    with pytest.raises(
        TypeError, match=r"cannot write a Message.*Message\.meta\.routing holds the key tuple"
    ):
        write(message)
    with pytest.raises(
        TypeError, match=r"ToolCall\.arguments\.filters\[0\] holds the key tuple \('tag',\)"
    ):
        write(call)


def test_an_int_too_long_for_python_to_write_is_named_with_its_path() -> None:
    """Bug caught: `to_json` of a count of 5,000 digits failing with Python's bare "Exceeds
    the limit (4300 digits)", naming neither the record nor the field."""
    with pytest.raises(
        ValueError, match=r"cannot write a Usage as JSON: Usage\.input_tokens holds an int of"
    ):
        to_json(Usage(10**5000))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"input_tokens": ' + "9" * 5000 + ', "output_tokens": 0}', "Exceeds the limit"),
        (b'{"input_tokens": 1, "output_tokens": \xff}', "can't decode byte 0xff"),
    ],
    ids=["int-too-long", "not-utf-8"],
)
def test_from_json_names_the_record_of_text_python_cannot_read(text: str | bytes, shown) -> None:
    """Bug caught: `from_json` of an int of 5,000 digits, or of bytes that are not UTF-8,
    raising json's bare error, which named no record."""
    with pytest.raises(ValueError, match=f"cannot read a Usage from this data: .*{shown}"):
        from_json(Usage, text)
