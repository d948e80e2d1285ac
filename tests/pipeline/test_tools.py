"""`tool()`: schemas derived from signatures, argument checks, running and encoding results."""

import dataclasses
import enum
import functools
import inspect
import json
import math
import threading
import typing
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal, Optional

import anyio
import attrs
import hypothesis.strategies as st
import jsonschema
import pytest
from hypothesis import given, settings

from pipeline import ConfigError, Tool, tool
from turns import Scope, ToolCall, ToolResult, ToolSpec

# -- helpers --------------------------------------------------------------------------------


@attrs.frozen
class Point:
    x: int
    y: int = 0


@attrs.frozen
class Box:
    corner: Point
    label: str


@attrs.frozen
class Positive:
    amount: int = attrs.field(validator=attrs.validators.gt(0))


def probe_for(annotation: Any, default: Any = inspect.Parameter.empty) -> Tool:
    """A tool named 'probe' taking one argument `value` annotated `annotation` (and
    defaulting to `default`, if given)."""

    def probe(value):
        return value

    probe.__annotations__ = {"value": annotation}
    if default is not inspect.Parameter.empty:
        probe.__defaults__ = (default,)
    return tool(probe)


def call(name: str = "probe", arguments: dict | None = None, **meta: Any) -> ToolCall:
    return ToolCall("call-1", name, arguments or {}, meta)


def property_schema(annotation: Any) -> dict:
    return probe_for(annotation).parameters["properties"]["value"]


def recorder(trace: list):
    """A typed tool that records the arguments it was called with."""

    def lookup(city: str, days: int = 1) -> str:
        trace.append((city, days))
        return f"{city}:{days}"

    return tool(lookup)


# -- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        pytest.param(str, {"type": "string"}, id="str"),
        pytest.param(int, {"type": "integer"}, id="int"),
        pytest.param(float, {"type": "number"}, id="float"),
        pytest.param(bool, {"type": "boolean"}, id="bool"),
        pytest.param(list[int], {"type": "array", "items": {"type": "integer"}}, id="list"),
        pytest.param(
            dict[str, float],
            {"type": "object", "additionalProperties": {"type": "number"}},
            id="dict",
        ),
        pytest.param(
            Literal["celsius", "kelvin"],
            {"type": "string", "enum": ["celsius", "kelvin"]},
            id="literal",
        ),
        pytest.param(int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}, id="optional"),
        pytest.param(tuple[str, ...], {"type": "array", "items": {"type": "string"}}, id="tuple"),
        pytest.param(Sequence[int], {"type": "array", "items": {"type": "integer"}}, id="sequence"),
        pytest.param(
            Literal["a", None],
            {"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]},
            id="literal-or-none",
        ),
        pytest.param(
            list[dict[str, bool]],
            {
                "type": "array",
                "items": {"type": "object", "additionalProperties": {"type": "boolean"}},
            },
            id="nested",
        ),
    ],
)
def test_an_annotation_gives_its_json_schema(annotation, schema) -> None:
    assert property_schema(annotation) == schema


def test_the_parameters_are_an_object_of_required_arguments_without_extras() -> None:
    def weather(city: str, days: int) -> str:
        return city

    assert tool(weather).parameters == {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }


def test_an_argument_with_a_default_is_not_required_and_shows_the_default() -> None:
    def weather(city: str, unit: str = "celsius") -> str:
        return city

    parameters = tool(weather).parameters
    assert (parameters["required"], parameters["properties"]["unit"]) == (
        ["city"],
        {"type": "string", "default": "celsius"},
    )


@pytest.mark.parametrize("default", [math.inf, -math.inf, math.nan], ids=repr)
def test_a_default_json_cannot_hold_is_left_out_of_the_schema(default) -> None:
    """Catches: a default of math.inf written into the schema, which JSON cannot hold: the
    request body offering the tool said ``"default": Infinity`` and no provider parses it."""

    def search(query: str, max_price: float = default) -> str:
        return query

    parameters = tool(search).parameters
    assert parameters["properties"]["max_price"] == {"type": "number"}
    json.dumps(parameters, allow_nan=False)  # strict JSON, as a provider reads it


def test_an_optional_argument_without_a_default_is_required_but_nullable() -> None:
    parameters = probe_for(int | None).parameters
    assert parameters["required"] == ["value"]


def test_an_argument_whose_default_is_none_may_be_null_in_its_schema() -> None:
    """Bug caught: ``limit: int = None`` was shown as ``{"type": "integer", "default":
    null}``, a default its own schema refuses."""

    def search(query: str, limit: int = None) -> str:  # noqa: RUF013 (what is tested)
        return query

    assert tool(search).parameters["properties"]["limit"] == {
        "anyOf": [{"type": "integer"}, {"type": "null"}],
        "default": None,
    }


@attrs.frozen
class Page:
    size: int = None


def search_page(query: str, limit: int = None, page: Page | None = None) -> str:  # noqa: RUF013
    return query


def test_null_for_an_argument_or_field_whose_default_is_none_is_accepted() -> None:
    """Bug caught: a model that sent null for ``limit: int = None`` (or an attrs field so
    declared), the default its schema showed, got invalid_arguments."""
    arguments = {"query": "q", "limit": None, "page": {"size": None}}
    assert tool(search_page).check(call("search_page", arguments)) == {
        "query": "q",
        "limit": None,
        "page": Page(size=None),
    }


def test_an_attrs_class_is_a_nested_object_with_its_required_fields() -> None:
    assert property_schema(Box) == {
        "type": "object",
        "properties": {
            "corner": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
                "required": ["x"],
                "additionalProperties": False,
            },
            "label": {"type": "string"},
        },
        "required": ["corner", "label"],
        "additionalProperties": False,
    }


def test_the_description_is_the_docstring_text_before_its_sections() -> None:
    def forecast(city: str) -> str:
        """Tell the weather.

        Looks a few days ahead.

        Args:
            city: The city.

        Returns:
            The forecast.
        """
        return city

    assert tool(forecast).description == "Tell the weather.\n\nLooks a few days ahead."


def test_a_description_line_ending_in_a_colon_stays_in_the_description() -> None:
    """Catches: any capitalised line ending in a colon ("Supported currencies:") taken for a
    docstring section, so the model was never told the rest of the description."""

    def convert(amount: float, currency: str) -> str:
        """Convert an amount between currencies.

        Supported currencies:
            EUR, USD, GBP

        Args:
            amount: How much.
            currency: The target currency.
        """
        return currency

    made = tool(convert)
    assert made.description == (
        "Convert an amount between currencies.\n\nSupported currencies:\n    EUR, USD, GBP"
    )
    assert made.parameters["properties"]["amount"]["description"] == "How much."


def test_an_unindented_line_after_the_args_ends_the_section() -> None:
    """Catches: a heading that is not a Google-style section ("Usage:") after the Args
    section, and its paragraph, glued onto the last argument's description, so the model
    read the tool's usage note as what the currency argument means."""

    def convert(amount: float, currency: str) -> str:
        """Convert money.

        Args:
            amount: How much.
            currency: The ISO code.
        Usage:
            Call once per amount; results are cached for an hour.
        """
        return currency

    made = tool(convert)
    properties = made.parameters["properties"]
    assert (properties["amount"]["description"], properties["currency"]["description"]) == (
        "How much.",
        "The ISO code.",
    )
    assert made.description == (
        "Convert money.\n\nUsage:\n    Call once per amount; results are cached for an hour."
    )


def test_each_argument_is_described_by_its_note_in_the_args_section() -> None:
    def forecast(city: str, days: int = 3) -> str:
        """Tell the weather.

        Args:
            city: The city to look up.
            days (int): How many days
                to look ahead.

        Returns:
            The forecast.
        """
        return city

    properties = tool(forecast).parameters["properties"]
    assert (properties["city"]["description"], properties["days"]["description"]) == (
        "The city to look up.",
        "How many days to look ahead.",
    )


def test_name_and_description_can_be_given() -> None:
    def forecast(city: str) -> str:
        """Tell the weather."""
        return city

    made = tool(forecast, name="get_weather", description="The weather in a city.")
    assert (made.name, made.description) == ("get_weather", "The weather in a city.")


def test_the_name_defaults_to_the_function_name() -> None:
    def forecast(city: str) -> str:
        return city

    assert tool(forecast).name == "forecast"


def search_index(query: str, index: dict[str, str], limit: int = 3) -> str:
    """Search the index."""
    return ",".join(v for k, v in index.items() if query in k)[: limit * 10]


def test_a_partial_is_named_and_described_by_its_function() -> None:
    """A functools.partial used to be refused: its annotations were not read through it."""
    made = tool(functools.partial(search_index, index={}))
    assert (made.name, made.description) == ("search_index", "Search the index.")


def test_an_argument_a_partial_binds_is_not_shown_to_the_model() -> None:
    """The arguments a partial fixes are not the model's to choose (nor to be described)."""
    parameters = tool(functools.partial(search_index, index={}, limit=1)).parameters
    assert (list(parameters["properties"]), parameters["required"]) == (["query"], ["query"])


class Forecaster:
    """Forecasts for one region."""

    def __init__(self, region: str) -> None:
        self.region = region

    async def __call__(self, city: str, days: int = 1) -> str:
        return f"{self.region}/{city}/{days}"


def test_a_callable_object_is_described_by_its_call_method() -> None:
    """An object with a typed __call__ used to be refused: its annotations were not read."""
    made = tool(Forecaster("eu"), name="forecast")
    assert (made.description, made.parameters["required"], made.is_async) == (
        "Forecasts for one region.",
        ["city"],
        True,
    )


class Converter:
    def __call__(self, amount: float) -> str:
        """Convert an amount to euros.

        Args:
            amount: How much, in dollars.
        """
        return str(amount)


def test_a_callable_object_whose_class_has_no_docstring_is_described_by_its_call() -> None:
    """Bug caught: a callable object documented on its ``__call__`` (where its Args are)
    was offered with an empty description and no argument notes."""
    made = tool(Converter())
    assert (made.description, made.parameters["properties"]["amount"]["description"]) == (
        "Convert an amount to euros.",
        "How much, in dollars.",
    )


@dataclasses.dataclass
class RateConverter:
    rate: float

    def __call__(self, amount: float) -> str:
        """Convert an amount to euros.

        Args:
            amount: How much, in dollars.
        """
        return str(amount * self.rate)


@dataclasses.dataclass
class NotedConverter(RateConverter):
    """Convert at a fixed rate."""


def test_a_dataclass_callable_without_a_docstring_is_described_by_its_call() -> None:
    """Bug caught: the docstring ``@dataclass`` writes for a class without one,
    "RateConverter(rate: float)", was the tool's description, and the Args notes of its
    ``__call__`` were dropped."""
    made = tool(RateConverter(0.9))
    assert (made.description, made.parameters["properties"]["amount"]["description"]) == (
        "Convert an amount to euros.",
        "How much, in dollars.",
    )


def test_a_class_docstring_without_args_leaves_the_notes_to_its_call() -> None:
    """Bug caught: a class docstring describing the tool but noting no argument hid the Args
    notes of its ``__call__``."""
    made = tool(NotedConverter(0.9))
    assert (made.description, made.parameters["properties"]["amount"]["description"]) == (
        "Convert at a fixed rate.",
        "How much, in dollars.",
    )


def test_tool_works_as_a_bare_decorator() -> None:
    @tool
    def forecast(city: str) -> str:
        """Tell the weather."""
        return city

    assert forecast.spec == ToolSpec("forecast", "Tell the weather.", forecast.parameters)


def test_tool_works_as_a_decorator_with_options() -> None:
    @tool(name="get_weather")
    def forecast(city: str) -> str:
        return city

    assert (type(forecast), forecast.name) == (Tool, "get_weather")


def test_a_scope_parameter_is_not_shown_to_the_model() -> None:
    def whoami(greeting: str, scope: Scope) -> str:
        return greeting

    parameters = tool(whoami).parameters
    assert (list(parameters["properties"]), parameters["required"]) == (
        ["greeting"],
        ["greeting"],
    )


# Optional[Scope] is a typing.Union at run time, unlike Scope | None: both must be recognized.
OPTIONAL_SCOPES = [Scope | None, Optional[Scope]]  # noqa: UP045


@pytest.mark.parametrize("annotation", OPTIONAL_SCOPES, ids=["union", "Optional"])
def test_an_optional_scope_parameter_is_not_shown_to_the_model(annotation) -> None:
    """`scope: Scope | None = None` used to be described to the model as an object (and
    refused, since a Scope's assigns are no JSON type), not recognized as the scope."""

    def whoami(greeting: str, scope=None) -> str:
        return greeting

    whoami.__annotations__ = {"greeting": str, "scope": annotation}
    parameters = tool(whoami).parameters
    assert (list(parameters["properties"]), parameters["required"]) == (
        ["greeting"],
        ["greeting"],
    )


def test_a_built_tool_can_be_called_like_its_function() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    assert tool(add)(a=2, b=3) == 5


# -- what cannot be described ----------------------------------------------------------------


def test_a_missing_annotation_is_a_config_error_naming_the_tool_and_argument() -> None:
    def lookup(city):
        return city

    with pytest.raises(ConfigError, match=r"tool 'lookup', argument 'city'.*annotat"):
        tool(lookup)


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param(set[int], id="set"),
        pytest.param(threading.Event, id="plain-class"),
        pytest.param(tuple[int, int], id="tuple"),
        pytest.param(list[set[str]], id="nested-set"),
    ],
)
def test_an_unsupported_annotation_is_a_config_error_naming_the_tool_and_argument(
    annotation,
) -> None:
    with pytest.raises(ConfigError, match=r"tool 'probe', argument 'value'.*cannot describe"):
        probe_for(annotation)


def _numbers(count: int) -> Iterator[int]:
    yield from range(count)


async def _async_numbers(count: int) -> AsyncIterator[int]:
    for number in range(count):
        yield number


@pytest.mark.parametrize("fn", [_numbers, _async_numbers], ids=["sync", "async"])
def test_a_generator_function_is_a_config_error_naming_the_tool(fn) -> None:
    """Catches: a generator function accepted as a tool, whose every call then failed with a
    tool_error quoting a generator object, instead of being refused when it is built."""
    with pytest.raises(ConfigError, match=f"tool '{fn.__name__}' is a generator function"):
        tool(fn)


def test_star_args_are_a_config_error_naming_the_argument() -> None:
    def lookup(*cities: str) -> str:
        return ""

    with pytest.raises(ConfigError, match=r"tool 'lookup', argument 'cities'.*\*args"):
        tool(lookup)


def test_star_star_kwargs_are_a_config_error_naming_the_argument() -> None:
    def lookup(**options: str) -> str:
        return ""

    with pytest.raises(ConfigError, match=r"tool 'lookup', argument 'options'.*\*\*kwargs"):
        tool(lookup)


def test_a_positional_only_argument_is_a_config_error_naming_it() -> None:
    def lookup(city: str, /) -> str:
        return city

    with pytest.raises(ConfigError, match=r"tool 'lookup', argument 'city'.*keyword"):
        tool(lookup)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("get weather", id="space"),
        pytest.param("x" * 65, id="too-long"),
        pytest.param("", id="empty"),
        pytest.param("wetter.heute", id="dot"),
    ],
)
def test_a_name_providers_refuse_is_a_config_error_naming_it(name) -> None:
    def lookup(city: str) -> str:
        return city

    with pytest.raises(ConfigError, match="tool name") as caught:
        tool(lookup, name=name)
    assert repr(name) in str(caught.value)


def test_a_lambda_is_told_to_give_its_tool_a_name() -> None:
    """Bug caught: ``tool(lambda ...)`` was refused for the name '<lambda>' without saying
    that ``name=`` fixes it."""
    with pytest.raises(ConfigError, match="'<lambda>'") as caught:
        tool(lambda: "pong")
    assert 'give the tool one: tool(fn, name="...")' in str(caught.value)


def test_two_scope_parameters_are_a_config_error_naming_the_second() -> None:
    """Catches: a second `Scope` parameter accepted when the tool was built, though only one
    receives the scope, so every call of the tool failed on the missing other."""

    def whoami(scope: Scope, context: Scope | None = None) -> str:
        return "me"

    with pytest.raises(ConfigError) as caught:
        tool(whoami)
    assert str(caught.value).startswith(
        "tool 'whoami', argument 'context': a second Scope parameter (after 'scope')"
    )


def test_a_name_of_64_characters_is_accepted() -> None:
    def lookup(city: str) -> str:
        return city

    assert tool(lookup, name="x" * 64).name == "x" * 64


def test_a_dict_with_non_str_keys_is_a_config_error_naming_the_argument() -> None:
    with pytest.raises(ConfigError, match=r"tool 'probe', argument 'value'.*keys must be str"):
        probe_for(dict[int, str])


@attrs.frozen
class Node:
    value: int
    children: "tuple[Node, ...]" = ()


@attrs.frozen
class Tree:
    root: Node


def test_an_attrs_class_that_holds_itself_is_a_config_error_naming_the_cycle() -> None:
    """Catches: a recursive attrs class (a tree of nodes) described inline for ever, so that
    `tool()` died with a RecursionError naming neither the tool nor the argument."""

    def walk(tree: Tree) -> int:
        return tree.root.value

    with pytest.raises(ConfigError, match=r"tool 'walk', argument 'tree'") as excinfo:
        tool(walk)

    assert "Node -> Node" in str(excinfo.value)


@attrs.frozen
class Unresolved:
    x: "NoSuchName"  # noqa: F821


def test_an_attrs_field_with_an_unresolvable_annotation_is_a_config_error() -> None:
    """Catches: a bare NameError out of `tool()` for an attrs class whose annotation names
    nothing, where a function's own unresolvable annotation is a ConfigError."""

    def use(value: Unresolved) -> str:
        return ""

    with pytest.raises(ConfigError, match=r"tool 'use', argument 'value'.*NoSuchName"):
        tool(use)


# -- checking the model's arguments ----------------------------------------------------------


def test_check_gives_the_arguments_as_the_function_takes_them() -> None:
    assert recorder([]).check(call("lookup", {"city": "Oslo", "days": 2})) == {
        "city": "Oslo",
        "days": 2,
    }


def test_a_missing_required_argument_is_a_problem_naming_it() -> None:
    assert recorder([]).check(call("lookup", {"days": 2})) == "city: required"


def test_an_unexpected_argument_is_a_problem_naming_it_and_the_known_ones() -> None:
    problem = recorder([]).check(call("lookup", {"city": "Oslo", "mood": "sunny"}))
    assert problem == "mood: unexpected argument (expected: city, days)"


def test_the_scope_cannot_be_passed_by_the_model() -> None:
    def whoami(greeting: str, scope: Scope) -> str:
        return greeting

    problem = tool(whoami).check(call("whoami", {"greeting": "hi", "scope": {}}))
    assert str(problem).startswith("scope: unexpected argument")


def test_a_bool_is_not_an_int() -> None:
    assert probe_for(int).check(call(arguments={"value": True})) == (
        "value: expected integer, got boolean true"
    )


def test_a_whole_float_is_accepted_as_an_int() -> None:
    checked = probe_for(int).check(call(arguments={"value": 3.0}))
    assert (checked, type(checked["value"])) == ({"value": 3}, int)


def test_a_fractional_float_is_not_an_int() -> None:
    assert probe_for(int).check(call(arguments={"value": 3.5})) == (
        "value: expected integer, got number 3.5"
    )


def test_an_int_is_accepted_as_a_float() -> None:
    checked = probe_for(float).check(call(arguments={"value": 2}))
    assert (checked, type(checked["value"])) == ({"value": 2.0}, float)


def test_an_int_too_large_for_a_float_is_a_problem_not_a_crash() -> None:
    """Catches: an integer of 400 digits sent for a float argument failing the whole turn with
    a bare OverflowError from its conversion, instead of an invalid_arguments result."""
    problem = probe_for(float).check(call(arguments={"value": 10**400}))
    assert (
        problem
        == "value: expected number, got integer 1000000000000000000000000000000000000...: too large"
    )


def test_a_string_is_not_a_number() -> None:
    assert probe_for(float).check(call(arguments={"value": "2"})) == (
        'value: expected number, got string "2"'
    )


def test_a_problem_in_a_list_names_the_item_index() -> None:
    problem = probe_for(list[int]).check(call(arguments={"value": [1, "two", 3]}))
    assert problem == 'value[1]: expected integer, got string "two"'


def test_a_problem_in_an_attrs_object_names_the_field_path() -> None:
    problem = probe_for(Box).check(call(arguments={"value": {"corner": {"x": "1"}, "label": "a"}}))
    assert problem == 'value.corner.x: expected integer, got string "1"'


@pytest.mark.parametrize(
    ("annotation", "value", "problem"),
    [
        pytest.param(
            Point | None, {"x": "1"}, 'value.x: expected integer, got string "1"', id="attrs"
        ),
        pytest.param(
            list[int] | None, [1, "two"], 'value[1]: expected integer, got string "two"', id="list"
        ),
        pytest.param(
            int | Box | None,
            {"corner": {"x": 1}, "label": 2},
            "value.label: expected string, got integer 2",
            id="union",
        ),
    ],
)
def test_a_problem_inside_an_optional_object_names_its_path(annotation, value, problem) -> None:
    """Catches: a problem inside an optional argument (``Point | None``) reported as
    "expected object or null, got object {...}", without the path of what is wrong in it."""
    assert probe_for(annotation).check(call(arguments={"value": value})) == problem


def test_a_value_of_another_kind_for_an_optional_says_what_was_expected() -> None:
    problem = probe_for(Point | None).check(call(arguments={"value": 3}))
    assert problem == "value: expected object or null, got integer 3"


@pytest.mark.parametrize(
    ("annotation", "value", "problem"),
    [
        pytest.param(
            Point | Box,
            {"corner": {"x": 1}, "label": 2},
            "value: fits none of the 2 objects it may be — as object 1 (value.x: required;"
            " value.corner: unexpected argument (expected: x, y); value.label: unexpected"
            " argument (expected: x, y)); as object 2 (value.label: expected string, got"
            " integer 2)",
            id="objects",
        ),
        pytest.param(
            list[int] | list[str],
            [1, "a"],
            "value: fits none of the 2 arrays it may be — as array 1 (value[1]: expected"
            ' integer, got string "a"); as array 2 (value[0]: expected string, got integer 1)',
            id="arrays",
        ),
    ],
)
def test_a_value_fitting_none_of_several_objects_says_what_is_wrong_for_each(
    annotation, value, problem
) -> None:
    """Bug caught: a value for a union of two objects (or arrays) that fits neither was
    told "expected object or object, got object", naming nothing the model could fix."""
    assert probe_for(annotation).check(call(arguments={"value": value})) == problem


@attrs.frozen
class Circle:
    r: int


@attrs.frozen
class Square:
    side: int


@attrs.frozen
class Group:
    shapes: list[Circle | Square]


@attrs.frozen
class Layer:
    groups: list[Group]


@attrs.frozen
class Scene:
    layers: list[Group | Layer]


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        pytest.param(list[Group | Layer], [{"shapes": [{}] * 25}] * 25, id="two-levels"),
        pytest.param(
            list[Scene | Group], [{"layers": [{"shapes": [{}] * 21}] * 21}] * 21, id="three-levels"
        ),
    ],
)
def test_nested_unions_of_objects_share_the_cap_on_listed_problems(annotation, value) -> None:
    """Bug caught: each option of a union of objects listed up to 20 problems of its own, at
    each level of nesting, so 2.9 KB of wrong items got a 65 KB answer (41 KB, 1.35 MB)."""
    problem = probe_for(annotation).check(call(arguments={"value": value}))
    assert isinstance(problem, str)
    listed = problem.count(": required") + problem.count(": unexpected argument")
    assert 0 < listed <= 20
    assert len(problem) < 2_500 < len(json.dumps(value))
    # Each option's problems bracketed, so that the union inside it reads unambiguously.
    assert problem.startswith("value[0]: fits none of the 2 objects it may be — as object 1 (")
    assert problem.endswith(" more")


def test_an_option_left_no_room_in_the_answer_counts_its_problems() -> None:
    problem = probe_for(list[Point | Box]).check(call(arguments={"value": [{"x": "a"}] * 21}))
    assert isinstance(problem, str)
    assert problem.endswith(
        "value[5]: fits none of the 2 objects it may be — as object 1 (value[5].x: expected"
        ' integer, got string "a"); as object 2 (3 problems not listed); and 15 more'
    )


def test_a_value_of_another_kind_for_a_union_of_objects_names_the_kind_once() -> None:
    """Bug caught: an integer sent for ``Point | Box`` was told "expected object or object"."""
    problem = probe_for(Point | Box).check(call(arguments={"value": 3}))
    assert problem == "value: expected object, got integer 3"


def test_a_problem_in_a_dict_names_the_key() -> None:
    problem = probe_for(dict[str, int]).check(call(arguments={"value": {"a": 1, "b": "2"}}))
    assert problem == 'value.b: expected integer, got string "2"'


def test_every_problem_is_listed() -> None:
    problem = recorder([]).check(call("lookup", {"days": "2", "mood": 1}))
    assert problem == (
        'city: required; days: expected integer, got string "2"; mood: unexpected argument'
        " (expected: city, days)"
    )


def test_a_huge_array_of_wrong_items_gives_a_short_problem_list() -> None:
    """Catches: an `invalid_arguments` message listing every wrong item of a huge array (4.5
    MB for 100,000 items), ten times what the model sent, sent back to it as the result."""
    problem = probe_for(list[int]).check(call(arguments={"value": ["x"] * 1000}))
    listed = [f'value[{i}]: expected integer, got string "x"' for i in range(20)]
    assert problem == "; ".join(listed) + "; and 980 more"


def test_a_huge_unexpected_argument_name_is_shortened_in_the_problem() -> None:
    problem = probe_for(int).check(call(arguments={"value": 1, "k" * 10_000: 1}))
    assert problem == f"{'k' * 37}...: unexpected argument (expected: value)"


def test_a_long_argument_name_the_tool_declares_is_shown_whole() -> None:
    """Catches: the 40-character cut meant for keys the model made up applied to the tool's
    own argument names too, so the model was told of an argument
    "include_archived_messages_from_all_wo..." that does not exist, and could not fix its
    call."""
    name = "include_archived_messages_from_all_workspaces"

    @tool
    def search(
        include_archived_messages_from_all_workspaces: bool, deep: dict[str, int], query: str
    ) -> str:
        return query

    assert search.check(call("search", {name: "yes", "deep": {"d" * 50: "x"}})) == (
        f'query: required; {name}: expected boolean, got string "yes"; deep.{"d" * 37}...:'
        ' expected integer, got string "x"'
    )
    assert search.check(call("search", {"deep": {}, "query": "q"})) == f"{name}: required"


def test_a_literal_accepts_only_its_values() -> None:
    assert probe_for(Literal["celsius", "kelvin"]).check(
        call(arguments={"value": "fahrenheit"})
    ) == ("value: expected one of ['celsius', 'kelvin'], got string \"fahrenheit\"")


def test_a_whole_float_is_accepted_as_an_int_literal_value() -> None:
    """A number literal used to demand the exact JSON spelling (1.0 refused for Literal[1])
    while an int argument accepts 3.0: JSON has one number type."""
    checked = probe_for(Literal[1, 2]).check(call(arguments={"value": 1.0}))
    assert (checked, type(checked["value"])) == ({"value": 1}, int)


def test_an_int_is_accepted_as_a_float_literal_value() -> None:
    checked = probe_for(Literal[0.5, 2.0]).check(call(arguments={"value": 2}))
    assert (checked, type(checked["value"])) == ({"value": 2.0}, float)


def test_a_bool_is_not_a_number_literal_value() -> None:
    assert probe_for(Literal[1, 2]).check(call(arguments={"value": True})) == (
        "value: expected one of [1, 2], got boolean true"
    )


def test_an_optional_accepts_null() -> None:
    assert probe_for(int | None).check(call(arguments={"value": None})) == {"value": None}


def test_a_non_optional_rejects_null() -> None:
    problem = probe_for(str).check(call(arguments={"value": None}))
    assert str(problem).startswith("value: expected string, got null")


def test_an_attrs_argument_is_converted_into_its_class() -> None:
    checked = probe_for(Box).check(call(arguments={"value": {"corner": {"x": 1}, "label": "a"}}))
    assert checked == {"value": Box(Point(1, 0), "a")}


def test_an_attrs_class_missing_a_required_field_is_a_problem_naming_it() -> None:
    problem = probe_for(Point).check(call(arguments={"value": {"y": 1}}))
    assert problem == "value.x: required"


def test_an_attrs_class_whose_validator_refuses_the_value_is_a_problem_not_a_crash() -> None:
    problem = probe_for(Positive).check(call(arguments={"value": {"amount": -1}}))
    assert str(problem).startswith("value")


def test_undecodable_arguments_from_the_provider_are_a_problem() -> None:
    invalid = {"raw": '{"city": "Os', "error": "not valid JSON: unterminated string"}
    problem = recorder([]).check(call("lookup", {}, invalid_arguments=invalid))
    assert problem == "the arguments are not valid JSON: unterminated string"


# -- running ----------------------------------------------------------------------------------


async def test_run_calls_the_tool_with_the_checked_arguments() -> None:
    trace: list = []
    await recorder(trace).run(call("lookup", {"city": "Oslo", "days": 2.0}))
    assert trace == [("Oslo", 2)]


async def test_run_gives_a_result_answering_the_call() -> None:
    result = await recorder([]).run(call("lookup", {"city": "Oslo"}))
    assert result == ToolResult("call-1", "Oslo:1")


async def test_bad_arguments_give_an_invalid_arguments_result_naming_the_problem() -> None:
    result = await recorder([]).run(call("lookup", {"city": 7}))
    assert (
        result.is_error,
        result.error_class,
        result.call_id,
        "city: expected string, got integer 7" in result.content,
    ) == (True, "invalid_arguments", "call-1", True)


async def test_bad_arguments_never_reach_the_tool() -> None:
    trace: list = []
    await recorder(trace).run(call("lookup", {"city": 7}))
    assert trace == []


async def test_undecodable_arguments_give_an_invalid_arguments_result() -> None:
    invalid = {"raw": "{oops", "error": "not valid JSON"}
    result = await recorder([]).run(call("lookup", {}, invalid_arguments=invalid))
    assert (result.is_error, result.error_class) == (True, "invalid_arguments")


async def test_undecodable_arguments_never_reach_the_tool() -> None:
    trace: list = []
    invalid = {"raw": '{"city": "Oslo"', "error": "not valid JSON"}
    await recorder(trace).run(call("lookup", {"city": "Oslo"}, invalid_arguments=invalid))
    assert trace == []


async def test_a_str_return_is_the_content_as_is() -> None:
    @tool
    def quote() -> str:
        return '{"not": "re-encoded"}'

    assert (await quote.run(call("quote"))).content == '{"not": "re-encoded"}'


class Mode(str, enum.Enum):  # noqa: UP042 (the str mixin, not StrEnum, formats as Mode.FAST)
    FAST = "fast"


async def test_a_str_subclass_return_is_the_content_as_plain_text() -> None:
    """Bug caught: a ``str, Enum`` member returned by a tool was kept as the content, so a
    hook's f"{result.content}" read "Mode.FAST" where the model and the log read "fast"."""

    @tool
    def speed() -> str:
        return Mode.FAST

    result = await speed.run(call("speed"))
    assert (type(result.content), f"{result.content}") == (str, "fast")


@pytest.mark.parametrize(
    ("value", "decoded"),
    [
        pytest.param({"temp": 21, "sky": "clear"}, {"temp": 21, "sky": "clear"}, id="dict"),
        pytest.param([1, "two", None], [1, "two", None], id="list"),
        pytest.param(Box(Point(1, 2), "a"), {"corner": {"x": 1, "y": 2}, "label": "a"}, id="attrs"),
        pytest.param(42, 42, id="int"),
    ],
)
async def test_other_returns_are_json_encoded(value, decoded) -> None:
    @tool
    def report() -> Any:
        return value

    assert json.loads((await report.run(call("report"))).content) == decoded


async def test_a_return_that_is_not_json_is_a_tool_error() -> None:
    @tool
    def report() -> Any:
        return threading.Event()

    result = await report.run(call("report"))
    assert (result.is_error, result.error_class) == (True, "tool_error")


async def test_a_raising_tool_gives_a_tool_error_with_the_exception_text() -> None:
    @tool
    def report() -> str:
        raise LookupError("no such city: Atlantis")

    result = await report.run(call("report"))
    assert (
        result.is_error,
        result.error_class,
        result.call_id,
        "LookupError: no such city: Atlantis" in result.content,
    ) == (True, "tool_error", "call-1", True)


async def test_a_raising_async_tool_gives_a_tool_error() -> None:
    @tool
    async def report() -> str:
        raise LookupError("no such city: Atlantis")

    result = await report.run(call("report"))
    assert (result.error_class, "no such city: Atlantis" in result.content) == ("tool_error", True)


async def test_a_sync_tool_raising_stop_iteration_gives_a_tool_error_naming_it() -> None:
    """Bug caught: a sync tool's StopIteration (``next()`` on an empty iterator) came back
    as "RuntimeError: coroutine raised StopIteration", blaming a coroutine it never had."""

    @tool
    def first_match(city: str) -> str:
        return next(name for name in ["Oslo"] if name == city)

    result = await first_match.run(call("first_match", {"city": "Atlantis"}))
    assert (result.error_class, result.content) == (
        "tool_error",
        "tool 'first_match' failed: StopIteration",
    )


async def test_an_async_tool_raising_stop_iteration_gives_a_tool_error_naming_it() -> None:
    """Bug caught: an async tool's StopIteration came back as "RuntimeError: coroutine raised
    StopIteration", Python's wording for it leaving a coroutine, not what the tool raised."""

    @tool
    async def first_match(city: str) -> str:
        return next(name for name in ["Oslo"] if name == city)

    result = await first_match.run(call("first_match", {"city": "Atlantis"}))
    assert (result.error_class, result.content) == (
        "tool_error",
        "tool 'first_match' failed: StopIteration",
    )


async def test_a_sync_tool_runs_in_a_worker_thread() -> None:
    threads: list[int] = []

    @tool
    def where() -> str:
        threads.append(threading.get_ident())
        return "here"

    await where.run(call("where"))
    assert [thread != threading.get_ident() for thread in threads] == [True]


async def test_an_async_tool_is_awaited() -> None:
    @tool
    async def where(city: str) -> dict:
        return {"city": city}

    assert (await where.run(call("where", {"city": "Oslo"}))).content == '{"city": "Oslo"}'


def logged(fn):
    """A decorator unaware of coroutines: its wrapper looks sync and returns fn's result."""

    def wrapper(city: str):
        return fn(city)

    wrapper.__name__ = fn.__name__
    return wrapper


async def test_a_sync_looking_tool_returning_an_awaitable_is_awaited() -> None:
    """A decorated async tool whose wrapper looks sync used to fail with a tool_error, whose
    text even differed by loop (trio refused the coroutine, asyncio could not encode it)."""

    @tool
    @logged
    async def where(city: str) -> dict:
        await anyio.lowlevel.checkpoint()
        return {"city": city}

    result = await where.run(call("where", {"city": "Oslo"}))
    assert (result.content, result.is_error) == ('{"city": "Oslo"}', False)


async def test_a_coroutine_a_sync_looking_tool_returned_is_closed_when_the_call_is_cancelled():
    """Catches: the coroutine a sync-looking tool returned from its worker thread left
    unawaited when the call was cancelled as the thread returned, warning that it was never
    awaited (an error under this suite's filterwarnings) instead of being closed unrun."""
    import gc
    import warnings

    ran: list[str] = []

    async def body() -> str:
        ran.append("body")
        return "late"

    def looks_sync(city: str) -> object:
        anyio.from_thread.run_sync(scope.cancel)  # the call is cancelled while it runs
        return body()

    where = tool(looks_sync)
    with anyio.CancelScope() as scope:
        await where.run(call("looks_sync", {"city": "Oslo"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()

    assert scope.cancelled_caught
    assert ran == []
    assert [w for w in caught if "never awaited" in str(w.message)] == []


async def test_a_scope_parameter_receives_the_scope_given() -> None:
    seen: list[Scope] = []

    @tool
    def whoami(context: Scope) -> str:
        seen.append(context)
        return "me"

    scope = Scope(current_user="ann").assign(team="blue")
    await whoami.run(call("whoami"), scope)
    assert seen == [scope]


async def test_a_scope_parameter_receives_an_empty_scope_when_none_is_given() -> None:
    seen: list[Scope] = []

    @tool
    async def whoami(scope: Scope) -> str:
        seen.append(scope)
        return "me"

    await whoami.run(call("whoami"))
    assert seen == [Scope()]


async def test_an_optional_scope_parameter_receives_the_scope_given() -> None:
    """`scope: Scope | None = None` used to fail the tool's build instead of receiving the
    scope."""
    seen: list[Scope | None] = []

    @tool
    async def whoami(scope: Scope | None = None) -> str:
        seen.append(scope)
        return "me"

    scope = Scope(current_user="ann")
    await whoami.run(call("whoami"), scope)
    await whoami.run(call("whoami"))
    assert seen == [scope, Scope()]


async def test_a_partial_runs_with_what_it_binds_and_the_models_arguments() -> None:
    made = tool(functools.partial(search_index, index={"oslo": "rain", "bergen": "fog"}))
    result = await made.run(call("search_index", {"query": "oslo"}))
    assert (result.content, result.is_error) == ("rain", False)


async def test_a_model_cannot_set_an_argument_a_partial_binds() -> None:
    made = tool(functools.partial(search_index, index={}))
    result = await made.run(call("search_index", {"query": "x", "index": {"a": "b"}}))
    assert (result.error_class, "index: unexpected argument" in result.content) == (
        "invalid_arguments",
        True,
    )


async def test_a_callable_object_runs_as_a_tool() -> None:
    made = tool(Forecaster("eu"), name="forecast")
    result = await made.run(call("forecast", {"city": "Oslo", "days": 2}))
    assert (result.content, result.is_error) == ("eu/Oslo/2", False)


async def test_the_function_receives_the_attrs_instance() -> None:
    seen: list = []

    @tool
    def draw(box: Box) -> str:
        seen.append(box)
        return "drawn"

    await draw.run(call("draw", {"box": {"corner": {"x": 1, "y": 2}, "label": "a"}}))
    assert seen == [Box(Point(1, 2), "a")]


@attrs.frozen
class Tagged:
    name: str
    tags: tuple[str, ...] = ()


async def test_a_tuple_argument_and_an_attrs_field_of_tuples_reach_the_tool_as_tuples() -> None:
    """Catches: `tuple[X, ...]` refused as a parameter, so that an attrs class written the
    way this library writes its records (frozen, tuple fields) could not be a tool's
    argument; the model's arrays now arrive as tuples, as the annotations say."""
    seen: list = []

    @tool
    def label(item: Tagged, extra: tuple[int, ...] = ()) -> str:
        seen.append((item, extra))
        return "ok"

    assert label.parameters["properties"]["extra"] == {
        "type": "array",
        "items": {"type": "integer"},
        "default": [],
    }
    await label.run(call("label", {"item": {"name": "a", "tags": ["x", "y"]}, "extra": [1, 2]}))
    assert seen == [(Tagged("a", ("x", "y")), (1, 2))]
    assert type(seen[0][0].tags) is tuple
    assert type(seen[0][1]) is tuple


async def test_execute_runs_already_checked_arguments() -> None:
    trace: list = []
    result = await recorder(trace).execute(call("lookup"), {"city": "Rome", "days": 4}, None)
    assert (trace, result.content) == ([("Rome", 4)], "Rome:4")


# -- laws ---------------------------------------------------------------------------------------


def strategy_for(annotation: Any) -> st.SearchStrategy:
    """Values that fit `annotation`'s schema, as the model would send them."""
    simple = {
        str: st.text(),
        int: st.integers(),
        float: st.floats(allow_nan=False, allow_infinity=False),
        bool: st.booleans(),
    }
    if annotation in simple:
        return simple[annotation]
    if annotation is Point:
        return st.fixed_dictionaries({"x": st.integers()}, optional={"y": st.integers()})
    origin = getattr(annotation, "__origin__", None)
    arguments = getattr(annotation, "__args__", ())
    if origin in (list, tuple, Sequence):
        return st.lists(strategy_for(arguments[0]), max_size=5)
    if origin is dict:
        return st.dictionaries(st.text(), strategy_for(arguments[1]), max_size=5)
    if origin is Literal:
        return st.sampled_from(arguments)
    if type(None) in arguments:
        (inner,) = (a for a in arguments if a is not type(None))
        return st.none() | strategy_for(inner)
    raise AssertionError(f"no strategy for {annotation!r}")


def expected(annotation: Any, value: Any) -> Any:
    """What `check` gives for `value`: attrs objects built, the rest unchanged."""
    if annotation is Point:
        return Point(**value)
    origin = getattr(annotation, "__origin__", None)
    if origin is list:
        return [expected(annotation.__args__[0], item) for item in value]
    if origin in (tuple, Sequence):
        return tuple(expected(annotation.__args__[0], item) for item in value)
    return value


FITTING = [
    str,
    int,
    float,
    bool,
    list[int],
    dict[str, float],
    Literal["a", "b", "c"],
    str | None,
    list[str | None],
    list[Point],
    tuple[int, ...],
    list[tuple[str, ...]],
    Sequence[Point],
    Literal["a", "b", None],
]


@pytest.mark.parametrize("annotation", FITTING, ids=repr)
@settings(max_examples=50)
@given(data=st.data())
def test_values_that_fit_the_schema_are_accepted_unchanged(annotation, data) -> None:
    value = data.draw(strategy_for(annotation))
    assert probe_for(annotation).check(call(arguments={"value": value})) == {
        "value": expected(annotation, value)
    }


@tool
def everything(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    scores: dict[str, int],
    unit: Literal["c", "k"],
    maybe: Point | None,
    box: Box,
    scope: Scope,
    anything: Any = None,
) -> str:
    return name


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
ARGUMENT_NAMES = st.sampled_from([*everything.parameters["properties"], "scope"]) | st.text()


@settings(max_examples=200)
@given(st.dictionaries(ARGUMENT_NAMES, JSON, max_size=8))
def test_check_never_raises_it_gives_a_problem_or_the_arguments(arguments) -> None:
    checked = everything.check(call("everything", arguments))
    assert isinstance(checked, str | dict)


# JSON as a provider decodes it: finite numbers (a NaN is refused before any check), and
# integers a float can hold (past that, a float argument is refused on purpose).
DECODED = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["x", "y", "corner", "label"]) | st.text(max_size=2), inner
        )
    ),
    max_leaves=8,
)


def near(annotation: Any) -> st.SearchStrategy:
    """Values built as `annotation`'s schema describes, any part of them perhaps any decoded
    JSON instead: the fits and near misses random JSON almost never is (CI's 60 fixed
    examples of `DECODED` alone held no valid `Point | Box` nor a value of a Literal, so a
    check refusing every attrs object passed the law)."""
    if annotation is Any:
        return DECODED
    return _built(annotation) | DECODED


def _built(annotation: Any) -> st.SearchStrategy:
    simple = {
        str: st.text(max_size=3),
        int: st.integers(min_value=-(2**70), max_value=2**70),
        float: st.floats(allow_nan=False, allow_infinity=False),
        bool: st.booleans(),
        type(None): st.none(),
    }
    if annotation in simple:
        return simple[annotation]
    if attrs.has(annotation):
        hints = typing.get_type_hints(annotation)
        fields = attrs.fields(annotation)
        return st.fixed_dictionaries(
            {f.name: near(hints[f.name]) for f in fields if f.default is attrs.NOTHING},
            optional={
                f.name: near(hints[f.name]) for f in fields if f.default is not attrs.NOTHING
            },
        )
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin in (list, tuple, Sequence):
        return st.lists(near(arguments[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=2), near(arguments[1]), max_size=3)
    if origin is Literal:
        return st.sampled_from(arguments)
    return st.one_of([_built(a) for a in arguments])  # a union


@attrs.frozen
class Query:
    text: str
    limit: int = None
    unit: Literal["c", "k"] = "c"
    tags: tuple[str, ...] = ()


SCHEMA_LAW = [
    *((annotation, inspect.Parameter.empty) for annotation in FITTING),
    (Literal[1, "a", True], inspect.Parameter.empty),
    (int | str, inspect.Parameter.empty),
    (float | int, inspect.Parameter.empty),
    (Point | Box, inspect.Parameter.empty),
    (list[int] | list[str], inspect.Parameter.empty),
    (dict[str, int] | Point, inspect.Parameter.empty),
    (list[Box], inspect.Parameter.empty),
    (Any, inspect.Parameter.empty),
    # A default of None: null is allowed too (by the schema and the check alike).
    (int, None),
    (Point, None),
    (Query, inspect.Parameter.empty),
]


@pytest.mark.parametrize(
    ("annotation", "default"),
    SCHEMA_LAW,
    ids=lambda p: "required" if p is inspect.Parameter.empty else repr(p),
)
@settings(max_examples=60)
@given(data=st.data())
def test_check_accepts_exactly_what_the_json_schema_accepts(annotation, default, data) -> None:
    """Bug caught: any drift between the schema the model is shown and the check its
    arguments must pass (arguments the schema allows refused, or the reverse); and a default
    the schema shows that neither accepts (``limit: int = None`` shown as an integer)."""
    probe = probe_for(annotation, default)
    validator = jsonschema.Draft202012Validator(probe.parameters)
    shown = probe.parameters["properties"]["value"]
    if "default" in shown:
        assert validator.is_valid({"value": shown["default"]})
        assert isinstance(probe.check(call(arguments={"value": shown["default"]})), dict)
    value = data.draw(near(annotation), label="value")
    allowed = validator.is_valid({"value": value})
    assert isinstance(probe.check(call(arguments={"value": value})), dict) == allowed


def defaults(a: int = 1, b: float = 0, c: str = None, d: Point | None = None, e: Query = None):  # noqa: RUF013
    return a


@pytest.mark.parametrize(
    ("schema", "shown"),
    [
        pytest.param(tool(defaults).parameters, ["a", "b", "c", "d", "e"], id="tool"),
        pytest.param(property_schema(Query), ["limit", "unit", "tags"], id="attrs"),
    ],
)
def test_every_default_a_schema_shows_is_valid_for_its_argument(schema, shown) -> None:
    """Bug caught: ``c: str = None`` shown as ``{"type": "string", "default": null}``, a
    default its own schema refused (and the check with it)."""
    properties = schema["properties"]
    assert [name for name in properties if "default" in properties[name]] == shown
    for name in shown:
        validator = jsonschema.Draft202012Validator(properties[name])
        assert validator.is_valid(properties[name]["default"]), name
