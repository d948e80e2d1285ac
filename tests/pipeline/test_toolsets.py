"""Toolsets: final names, local toolsets, and tool hooks on toolset tools."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks import inject_tool_call
from pipeline import (
    ConfigError,
    Pipeline,
    block,
    cont,
    hook,
    mcp_toolset,
    tool,
    toolset,
    toolset_tool_name,
)
from pipeline.testing import ScriptedModel
from turns import ToolCall, ToolResult, Turn

PROVIDER_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def forecast(city: str, days: int = 3) -> str:
    """A forecast."""
    return f"{days} sunny days in {city}"


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_a_final_name_is_always_one_every_provider_accepts(toolset_name, tool_name):
    """Catches: characters or lengths a provider refuses slipping into a tool's name."""
    assert PROVIDER_NAME.fullmatch(toolset_tool_name(toolset_name, tool_name))


@given(st.text(min_size=63, max_size=90), st.text(min_size=63, max_size=90))
def test_long_names_that_differ_stay_distinct(first, second):
    """Catches: truncation mapping two different long tools to one name.

    Long means over the 64-character limit once prefixed ("s_" + 63 or more characters):
    shorter names that differ only in characters sanitizing replaces do collide, and that
    is the build-time error tested below, not a truncation.
    """
    if first != second:
        assert toolset_tool_name("s", first) != toolset_tool_name("s", second)


def test_final_names_are_prefixed_sanitized_and_shortened_deterministically():
    """Catches: an unstable hash (the model's history would name tools that vanish)."""
    long = "x" * 70
    assert toolset_tool_name("memory", "read_graph") == "memory_read_graph"
    assert toolset_tool_name("my server", "get.time") == "my_server_get_time"
    shortened = toolset_tool_name("memory", long)
    assert len(shortened) == 64
    assert shortened.startswith("memory_xxx")
    assert shortened == toolset_tool_name("memory", long)
    assert re.fullmatch(r"memory_x{48}_[0-9a-f]{8}", shortened)


@pytest.mark.parametrize(
    ("toolset_name", "tool_name", "culprit"),
    [(3, "lookup", "toolset 3 (int)"), ("shop", None, "tool_name None (NoneType)")],
)
def test_a_final_name_of_something_that_is_not_a_name_is_a_type_error(
    toolset_name, tool_name, culprit
):
    """Catches: toolset_tool_name building a name out of any object's str() ("3_lookup",
    "shop_None"), so that a caller's mistake became a tool name nothing offers."""
    with pytest.raises(TypeError) as caught:
        toolset_tool_name(toolset_name, tool_name)
    assert culprit in str(caught.value)


async def test_a_local_toolset_offers_its_tools_under_final_names():
    """Catches: toolset tools offered or run under their own, unprefixed names."""
    model = ScriptedModel([[ToolCall("c1", "weather_forecast", {"city": "Oslo"})], "done"])
    pipe = Pipeline(model=model, toolsets=[toolset("weather", [weather, forecast])])

    result = await pipe.run(Turn.start("forecast?"))

    assert [spec.name for spec in model.requests[0].tools] == [
        "weather_weather",
        "weather_forecast",
    ]
    assert result.reply.messages[1].parts == (ToolResult("c1", "3 sunny days in Oslo"),)


def test_include_and_exclude_filter_a_toolset():
    """Catches: filters ignored, or a filter naming a missing tool silently doing nothing."""
    kept = Pipeline(
        model=ScriptedModel(["hi"]),
        toolsets=[toolset("w", [weather, forecast], exclude=["weather"])],
    )
    assert list(kept._tool_map) == ["w_forecast"]
    with pytest.raises(ConfigError, match=r"include names tools it does not have: \['wether'\]"):
        toolset("w", [weather], include=["wether"])


def test_two_tools_with_one_final_name_are_an_error_naming_both():
    """Catches: a later tool silently replacing an earlier one of the same final name."""

    @tool(name="a_b")
    def first() -> str:
        return "1"

    @tool(name="b")
    def second() -> str:
        return "2"

    with pytest.raises(ConfigError) as caught:
        Pipeline(
            model=ScriptedModel(["hi"]), toolsets=[toolset("x", [first]), toolset("x_a", [second])]
        )
    assert str(caught.value).startswith(
        "tool 'a_b' of toolset 'x' and tool 'b' of toolset 'x_a' are both offered as 'x_a_b'"
    )


def test_toolsets_must_be_toolsets_with_distinct_names():
    """Catches: a function or a duplicate toolset accepted and failing mid-turn."""
    with pytest.raises(ConfigError, match="expected a toolset"):
        Pipeline(model=ScriptedModel(["hi"]), toolsets=[weather])
    with pytest.raises(ConfigError, match="a second toolset named 'w'"):
        Pipeline(
            model=ScriptedModel(["hi"]),
            toolsets=[toolset("w", [weather]), toolset("w", [forecast])],
        )


async def test_tool_hooks_see_and_match_the_final_name():
    """Catches: hooks matched against the tool's own name instead of the one the model used."""
    seen = []

    def watch(call, turn):
        seen.append(call.name)
        return cont(call)

    def deny(call, turn):
        return block("not today")

    model = ScriptedModel(
        [
            [
                ToolCall("c1", "w_weather", {"city": "Oslo"}),
                ToolCall("c2", "w_forecast", {"city": "Rome"}),
            ],
            "ok",
        ]
    )
    pipe = Pipeline(
        model=model,
        toolsets=[toolset("w", [weather, forecast])],
        before_tool=[watch, hook(deny, match="w_forecast")],
    )

    result = await pipe.run(Turn.start("?"))

    assert seen == ["w_weather", "w_forecast"]
    results = [m.parts[0] for m in result.reply.messages[1:3]]
    assert results[0].content == "sunny in Oslo"
    assert (results[1].content, results[1].error_class) == ("not today", "hook_blocked")


async def test_inject_tool_call_runs_a_toolset_tool_by_its_final_name():
    """Catches: synthetic calls unable to find toolset tools among the pipeline's tools."""
    model = ScriptedModel(["ok"])
    pipe = Pipeline(
        model=model,
        toolsets=[toolset("w", [weather])],
        pre=[inject_tool_call("w_weather", {"city": "Oslo"})],
    )

    await pipe.run(Turn.start("?"))

    sent = model.requests[0].messages
    assert [type(p).__name__ for m in sent for p in m.parts][:2] == ["ToolCall", "ToolResult"]
    assert sent[0].parts[0].name == "w_weather"
    assert sent[1].parts[0].content == "sunny in Oslo"


def test_a_synthetic_call_of_a_tool_no_toolset_has_is_a_build_error():
    """Catches: a typo in a toolset tool's name found only mid-turn."""
    with pytest.raises(ConfigError, match="w_wether"):
        Pipeline(
            model=ScriptedModel(["ok"]),
            toolsets=[toolset("w", [weather])],
            pre=[inject_tool_call("w_wether")],
        )


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "give command .* or url"),
        ({"command": "x", "url": "http://h/mcp"}, "exactly one"),
        ({"url": "ftp://h"}, "must start with http"),
        ({"command": "x", "headers": {"a": "b"}}, "headers are for a url"),
        ({"url": "http://h/mcp", "env": {"a": "b"}}, "for a command, not a url"),
        ({"command": "x", "timeout": 0}, "timeout must be a positive number"),
    ],
)
def test_mcp_toolset_refuses_bad_options(options, expected):
    """Catches: an MCP toolset that cannot connect accepted until the first turn."""
    with pytest.raises(ConfigError, match=expected):
        mcp_toolset("s", **options)


def test_mcp_toolset_refuses_a_header_value_http_cannot_carry_without_showing_it():
    """Bug caught: a header value holding a line break was accepted, and the HTTP client's
    error at the first request quoted the whole value, secret included."""
    with pytest.raises(ConfigError) as caught:
        mcp_toolset(
            "s", url="http://127.0.0.1:1/mcp", headers={"Authorization": "Bearer s3cret\nX-A: 1"}
        )

    assert "the value of 'Authorization' contains characters an HTTP header cannot carry" in (
        str(caught.value)
    )
    assert "s3cret" not in str(caught.value)
    assert [key for key, _ in caught.value.problems] == ["headers"]


def test_mcp_toolset_refuses_a_header_name_that_is_not_an_http_token():
    """Bug caught: a header name with a space was accepted, to fail at the first request
    with the HTTP client's error instead of one naming the header."""
    with pytest.raises(ConfigError, match="'X Token' is not an HTTP header name"):
        mcp_toolset("s", url="http://127.0.0.1:1/mcp", headers={"X Token": "v"})


def test_mcp_toolset_refuses_max_message_bytes_with_a_url():
    """Bug caught: max_message_bytes, which bounds what a stdio server writes, was accepted
    with a url and bounded nothing there, where a command's other options are refused."""
    with pytest.raises(ConfigError, match="max_message_bytes are for a command, not a url"):
        mcp_toolset("s", url="http://h/mcp", max_message_bytes=1000)
    assert mcp_toolset("s", url="http://h/mcp").max_message_bytes is None
    assert mcp_toolset("s", command="x", max_message_bytes=1000).max_message_bytes == 1000


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"command": "serve\x00x"}, "command holds a NUL character"),
        ({"command": "x", "args": ["--a", "b\x00"]}, r"args\[1\] holds a NUL character"),
        ({"command": "x", "cwd": "/srv\x00"}, "cwd holds a NUL character"),
        ({"command": "x", "env": {"TOKEN": "s3cret\x00"}}, "env 'TOKEN' holds a NUL"),
        ({"command": "x", "env": {"A=B": "s3cret"}}, "'A=B', which is no environment"),
        ({"command": "x", "env": {"": "s3cret"}}, "'', which is no environment"),
    ],
)
def test_mcp_toolset_refuses_what_no_process_can_be_given(options, expected):
    """Bug caught: a NUL in a command, an argument, a directory or an environment value, or
    an environment name holding '=', was accepted, to fail when the server started with
    Python's bare "embedded null byte" (a config run exiting 1, not 2); an environment
    value is never shown."""
    with pytest.raises(ConfigError, match=expected) as caught:
        mcp_toolset("s", **options)
    assert "s3cret" not in str(caught.value)


def test_mcp_toolset_keeps_args_given_as_a_generator():
    """Bug caught: args given as a generator were read by the type check and then stored
    empty, so the server started without its arguments."""
    toolset = mcp_toolset("s", command="x", args=(arg for arg in ["--port", "1"]))
    assert toolset.args == ("--port", "1")


def test_mcp_toolset_repr_hides_header_and_env_values():
    """Catches: a secret header or environment value printed in a repr or a log line."""
    made = mcp_toolset(
        "s", url="http://127.0.0.1:1/mcp", headers={"Authorization": "Bearer s3cret"}
    )
    assert "s3cret" not in repr(made)
    assert "Authorization" in repr(made)


@pytest.mark.parametrize(
    "url",
    [
        "https://user:s3cret@host/mcp?api_key=K3Y",
        "ftp://user:s3cret@host/mcp?api_key=K3Y",
        "user:s3cret@host/mcp?api_key=K3Y",
        "http://user:s3cret@[host/mcp?api_key=K3Y",
    ],
    ids=["repr", "bad scheme", "no scheme", "unparsable"],
)
def test_mcp_toolset_shows_its_url_without_userinfo_or_query(url):
    """Bug caught: the toolset's repr and the error refusing its url's scheme quoted the url
    whole, password and key included, where every other message shows it without them."""
    try:
        shown = repr(mcp_toolset("s", url=url))
    except ConfigError as caught:
        shown = str(caught)
        assert "url must start with http:// or https://" in shown
    assert "host" in shown
    assert "/mcp?..." in shown
    assert "s3cret" not in shown
    assert "K3Y" not in shown


@pytest.mark.parametrize("char", ["/", "?", "#"])
@pytest.mark.parametrize("scheme", ["http", "ftp"], ids=["repr", "bad scheme"])
def test_mcp_toolset_hides_a_password_holding_a_raw_slash_question_mark_or_hash(char, scheme):
    """Bug caught: a password holding a raw ``/``, ``?`` or ``#`` was shown (``pa/s3cret``
    whole, ``pa?s3cret`` as ``pa?...``), the userinfo taken to end at that character rather
    than at the url's last ``@`` as the providers hide it."""
    url = f"{scheme}://user:pa{char}s3cret@host/mcp"
    try:
        shown = repr(mcp_toolset("s", url=url))
    except ConfigError as caught:
        shown = str(caught)
        assert "url must start with http:// or https://" in shown
    assert "user" not in shown
    assert "s3cret" not in shown
