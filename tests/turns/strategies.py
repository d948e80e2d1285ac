"""Hypothesis strategies building every `turns` record, with JSON-valued opaque fields."""

from typing import Any

import attrs
from hypothesis import strategies as st

from turns import (
    Context,
    Injection,
    Message,
    Part,
    Reply,
    RequestOptions,
    Scope,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    Usage,
)

ROLES = ("system", "user", "assistant", "tool")

texts = st.text(max_size=12)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
identifiers = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)

# Floats must survive a JSON round trip, so no NaN or infinities.
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(texts, children, max_size=3),
    ),
    max_leaves=4,
)
json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(texts, json_values, max_size=2)
metas = json_objects


def text_parts() -> st.SearchStrategy[Text]:
    return st.builds(Text, texts, meta=metas)


def tool_calls() -> st.SearchStrategy[ToolCall]:
    return st.builds(ToolCall, texts, names, arguments=json_objects, meta=metas)


def tool_results() -> st.SearchStrategy[ToolResult]:
    return st.builds(
        ToolResult,
        texts,
        texts,
        is_error=st.booleans(),
        error_class=st.none() | names,
        meta=metas,
    )


def parts() -> st.SearchStrategy[Part]:
    return st.one_of(text_parts(), tool_calls(), tool_results())


def _paired(units: list[tuple[Part, ...]]) -> list[Part]:
    """The units' parts in order, each call and its result given an id of their own."""
    out: list[Part] = []
    for index, unit in enumerate(units):
        for part in unit:
            if isinstance(part, ToolCall):
                part = attrs.evolve(part, id=f"call-{index}")
            elif isinstance(part, ToolResult):
                part = attrs.evolve(part, call_id=f"call-{index}")
            out.append(part)
    return out


def injectable_parts(min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[list[Part]]:
    """What `Turn.inject` takes: text, and tool calls each with its one result."""
    unit = st.one_of(
        text_parts().map(lambda part: (part,)), st.tuples(tool_calls(), tool_results())
    )
    return st.lists(unit, min_size=min_size, max_size=max_size).map(_paired)


def messages(roles: tuple[str, ...] = ROLES) -> st.SearchStrategy[Message]:
    return st.builds(
        Message,
        st.sampled_from(roles),
        st.lists(parts(), max_size=3).map(tuple),
        metas,
    )


def user_messages() -> st.SearchStrategy[Message]:
    return messages(roles=("user",))


def tool_specs() -> st.SearchStrategy[ToolSpec]:
    return st.builds(ToolSpec, names, texts, json_objects)


def contexts() -> st.SearchStrategy[Context]:
    return st.builds(
        Context,
        st.lists(messages(), max_size=3).map(tuple),
        st.none() | texts,
        st.lists(tool_specs(), max_size=3, unique_by=lambda spec: spec.name).map(tuple),
    )


def scopes() -> st.SearchStrategy[Scope]:
    return st.builds(Scope, json_values, st.dictionaries(identifiers, json_values, max_size=3))


def request_options() -> st.SearchStrategy[RequestOptions]:
    return st.builds(
        RequestOptions,
        st.none() | st.floats(min_value=0, max_value=2),
        st.none() | st.integers(min_value=1, max_value=100_000),
        st.none() | st.sampled_from(["auto", "none", "required"]) | names,
        st.none() | st.lists(names, max_size=3, unique=True).map(tuple),
        json_objects,
    )


def injections(
    stages: tuple[str | None, ...] = ("pre", "post", None),
) -> st.SearchStrategy[Injection]:
    return st.builds(
        Injection,
        st.lists(parts(), min_size=1, max_size=3).map(tuple),
        st.none() | names,
        st.booleans(),
        st.sampled_from(stages),
    )


def usages() -> st.SearchStrategy[Usage]:
    return st.builds(Usage, st.integers(min_value=0), st.integers(min_value=0))


def replies() -> st.SearchStrategy[Reply]:
    return st.builds(
        Reply,
        messages(roles=("assistant",)),
        st.lists(messages(roles=("assistant", "tool")), max_size=2).map(tuple),
        st.integers(min_value=0, max_value=5),
        st.none() | st.sampled_from(["stop", "length", "tool_calls", "halted"]),
        usages(),
        st.dictionaries(names, json_values, max_size=2),
    )


def turns() -> st.SearchStrategy[Turn]:
    return st.builds(
        Turn,
        contexts(),
        user_messages(),
        st.text(alphabet="0123456789abcdef", min_size=1, max_size=32),
        scopes(),
        st.lists(injections(), max_size=2).map(tuple),
        request_options(),
        st.none() | replies(),
    )


RECORD_STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    Text: text_parts(),
    ToolCall: tool_calls(),
    ToolResult: tool_results(),
    Message: messages(),
    ToolSpec: tool_specs(),
    Context: contexts(),
    Scope: scopes(),
    RequestOptions: request_options(),
    Injection: injections(),
    Usage: usages(),
    Reply: replies(),
    Turn: turns(),
}
"""One strategy per record class; the serde tests round-trip every entry."""
