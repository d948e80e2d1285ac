"""Parts: Text, ToolCall and ToolResult records and their copy-with helpers."""

import typing

import attrs
import pytest
from hypothesis import given

from tests.turns.strategies import json_objects, parts, texts, tool_calls, tool_results
from turns import Part, Text, ToolCall, ToolResult


def test_part_is_the_union_of_the_three_part_types() -> None:
    assert set(typing.get_args(Part)) == {Text, ToolCall, ToolResult}


def test_text_meta_is_empty_by_default() -> None:
    assert Text("hello").meta == {}


def test_tool_call_meta_is_empty_by_default() -> None:
    assert ToolCall("call-1", "search", {"q": "x"}).meta == {}


def test_tool_result_is_not_an_error_by_default() -> None:
    result = ToolResult("call-1", "42")

    assert (result.is_error, result.error_class) == (False, None)


def test_tool_result_meta_is_empty_by_default() -> None:
    assert ToolResult("call-1", "42").meta == {}


@given(parts())
def test_parts_are_frozen(part: Part) -> None:
    field = attrs.fields(type(part))[0].name

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(part, field, "changed")


@given(tool_calls(), json_objects)
def test_with_arguments_returns_a_copy_with_only_the_arguments_changed(
    call: ToolCall, arguments: dict[str, object]
) -> None:
    assert call.with_arguments(arguments) == ToolCall(call.id, call.name, arguments, call.meta)


@given(tool_calls(), json_objects)
def test_with_arguments_leaves_the_original_call_unchanged(
    call: ToolCall, arguments: dict[str, object]
) -> None:
    before = ToolCall(call.id, call.name, call.arguments, call.meta)

    call.with_arguments(arguments)

    assert call == before


@given(tool_results(), texts)
def test_with_content_returns_a_copy_with_only_the_content_changed(
    result: ToolResult, content: str
) -> None:
    assert result.with_content(content) == ToolResult(
        result.call_id, content, result.is_error, result.error_class, result.meta
    )


@given(tool_results(), texts)
def test_with_content_leaves_the_original_result_unchanged(
    result: ToolResult, content: str
) -> None:
    before = ToolResult(
        result.call_id, result.content, result.is_error, result.error_class, result.meta
    )

    result.with_content(content)

    assert result == before


def test_with_content_keeps_the_error_marking_of_a_blocked_result() -> None:
    blocked = ToolResult("call-1", "blocked", is_error=True, error_class="hook_blocked")

    rewritten = blocked.with_content("blocked by policy")

    assert (rewritten.is_error, rewritten.error_class) == (True, "hook_blocked")


def test_parts_with_equal_fields_are_equal() -> None:
    assert ToolCall("c", "f", {"a": [1]}, {"m": 1}) == ToolCall("c", "f", {"a": [1]}, {"m": 1})


def test_parts_of_different_types_are_not_equal() -> None:
    assert Text("x") != ToolResult("x", "x")


def test_the_shared_default_meta_cannot_be_changed_through_one_record() -> None:
    part = Text("a")
    with pytest.raises(TypeError):
        part.meta["leak"] = True  # type: ignore[index]
    assert Text("b").meta == {}
