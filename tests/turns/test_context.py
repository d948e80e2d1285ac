"""ToolSpec, Context, Scope (and `Scope.assign`) and RequestOptions records."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.turns.strategies import (
    identifiers,
    json_values,
    scopes,
)
from turns import Context, Message, RequestOptions, Scope, ToolSpec

assign_values = st.dictionaries(identifiers, json_values, max_size=4)


def test_tool_spec_description_is_empty_by_default() -> None:
    assert ToolSpec("search").description == ""


def test_a_tool_spec_without_a_description_takes_none_as_empty() -> None:
    """Bug caught: ToolSpec(name, None, schema), built from an OpenAI or MCP tool dict whose
    description is absent (`t.get("description")`), was refused with a TypeError."""
    tool = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
    spec = ToolSpec(tool["name"], tool.get("description"), tool["parameters"])
    assert spec == ToolSpec("lookup", "", tool["parameters"])


def test_tool_spec_default_parameters_are_a_json_schema_object() -> None:
    assert ToolSpec("search").parameters["type"] == "object"


def test_tool_spec_keeps_its_parameters_schema() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    assert ToolSpec("search", "Search the docs.", schema).parameters == schema


def test_context_is_empty_by_default() -> None:
    context = Context()

    assert (context.messages, context.system, context.tools) == ((), None, ())


def test_context_keeps_its_messages_in_order() -> None:
    history = (Message.user("hi"), Message.assistant("hello"))

    assert Context(messages=history).messages == history


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"messages": ["hi"]}, r"Context\.messages\[0\] must be a Message, got str 'hi'"),
        (
            {"messages": [Message.user("hi"), {"role": "assistant", "content": "hello"}]},
            r"Context\.messages\[1\] must be a Message, got dict",
        ),
        ({"messages": "hi"}, r"Context\.messages must be an iterable of Message records, got str"),
        ({"tools": ["search"]}, r"Context\.tools\[0\] must be a ToolSpec, got str 'search'"),
        ({"system": 3}, r"Context\.system must be the system prompt's text or None, got int 3"),
    ],
    ids=["str-message", "dict-message", "str-history", "str-tool", "int-system"],
)
def test_a_context_of_the_wrong_pieces_is_refused_naming_the_culprit(fields, problem) -> None:
    """Catches: a history of strings or dicts (or a string taken as a history of its
    characters), a tool given by name and a system prompt that is no text accepted, to fail
    later in the model call, reported as the provider's failure
    (``AttributeError: 'str' object has no attribute 'parts'``)."""
    with pytest.raises(TypeError, match=problem):
        Context(**fields)


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: RequestOptions(extra=[("seed", 7)]), r"RequestOptions\.extra must be a mapping"),
        (lambda: RequestOptions(extra="seed"), r"RequestOptions\.extra must be a mapping"),
        (lambda: RequestOptions(active_tools="search"), "a collection of tool names or None"),
        (lambda: RequestOptions(active_tools=["search", 3]), r"must be tool names \(str\)"),
        (lambda: Scope(assigns=[("plan", "pro")]), r"Scope\.assigns must be a mapping"),
    ],
    ids=["extra-pairs", "extra-str", "tools-str", "tools-int", "assigns-pairs"],
)
def test_request_options_and_scope_of_the_wrong_shape_are_refused(build, problem) -> None:
    """Catches: ``extra`` or ``assigns`` that is no mapping, and ``active_tools`` that is
    a string or holds a non-name, accepted when built directly (only `with_request` checked
    them), to fail in the provider's request (``body.update(extra)``) or a later
    ``assign``, naming neither the record nor the field."""
    with pytest.raises(TypeError, match=problem):
        build()


def test_context_tool_names_are_the_tools_names_in_order() -> None:
    tools = (ToolSpec("search"), ToolSpec("calculator"), ToolSpec("weather"))

    assert Context(tools=tools).tool_names == ("search", "calculator", "weather")


def test_scope_is_empty_by_default() -> None:
    scope = Scope()

    assert (scope.current_user, dict(scope.assigns)) == (None, {})


@given(scopes(), assign_values)
def test_scope_assign_adds_the_values_to_assigns(scope: Scope, values: dict) -> None:
    assert scope.assign(**values).assigns == {**scope.assigns, **values}


def test_scope_assign_replaces_an_existing_value() -> None:
    scope = Scope(assigns={"locale": "en", "plan": "free"})

    assert scope.assign(locale="fr").assigns == {"locale": "fr", "plan": "free"}


@given(scopes(), assign_values)
def test_scope_assign_keeps_the_current_user(scope: Scope, values: dict) -> None:
    assert scope.assign(**values).current_user == scope.current_user


@given(scopes(), assign_values)
def test_scope_assign_leaves_the_original_scope_unchanged(scope: Scope, values: dict) -> None:
    before = dict(scope.assigns)

    scope.assign(**values)

    assert scope.assigns == before


@given(scopes(), assign_values, assign_values)
def test_scope_assign_twice_equals_assign_once_with_the_merged_values(
    scope: Scope, first: dict, second: dict
) -> None:
    assert scope.assign(**first).assign(**second) == scope.assign(**{**first, **second})


def test_scope_assign_with_nothing_keeps_the_assigns() -> None:
    scope = Scope("ada", {"plan": "pro"})

    assert scope.assign() == scope


def test_request_options_leave_everything_to_the_provider_by_default() -> None:
    options = RequestOptions()

    assert (
        options.temperature,
        options.max_tokens,
        options.tool_choice,
        options.active_tools,
        dict(options.extra),
    ) == (None, None, None, None, {})


@pytest.mark.parametrize(
    "record",
    [
        ToolSpec("search"),
        Context(),
        Scope(),
        RequestOptions(),
    ],
    ids=lambda record: type(record).__name__,
)
def test_records_are_frozen(record: object) -> None:
    field = attrs.fields(type(record))[0].name

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(record, field, None)


def test_lists_given_to_a_context_are_stored_as_tuples() -> None:
    context = Context(messages=[Message.user("a")], tools=[ToolSpec("t")])
    assert (type(context.messages), type(context.tools)) == (tuple, tuple)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 7}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"tool_choice": ""}, "tool_choice"),
    ],
)
def test_request_options_reject_impossible_values_naming_the_field(options, field) -> None:
    with pytest.raises((TypeError, ValueError), match=field):
        RequestOptions(**options)


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: ToolSpec(3), r"ToolSpec\.name must be a str, got int 3"),
        (lambda: ToolSpec("search", 3), r"ToolSpec\.description must be a str, got int 3"),
        (
            lambda: ToolSpec("search", parameters=[("q", "string")]),
            r"ToolSpec\.parameters must be a mapping, got list",
        ),
    ],
    ids=["int-name", "int-description", "list-parameters"],
)
def test_a_tool_spec_of_the_wrong_shape_is_refused_naming_the_field(build, problem) -> None:
    """Bug caught: a ToolSpec with an int name or description or a list for its schema was
    accepted into a context, which `to_dict` wrote and `from_dict` then refused to read."""
    with pytest.raises(TypeError, match=problem):
        build()
