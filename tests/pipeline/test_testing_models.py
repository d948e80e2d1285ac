"""The offline models of pipeline.testing: ScriptedModel and FunctionModel."""

import re

import anyio
import pytest

from pipeline import ModelFinish, ModelRequest, ModelText, ModelToolCall, Pipeline, ProviderError
from pipeline.events import TextDelta
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Message, Text, ToolCall, ToolResult, Turn

CALL = ToolCall(id="call-1", name="lookup", arguments={"q": "weather"})


def request(text: str = "hi") -> ModelRequest:
    return ModelRequest((Message.user(text),))


async def play(model, req: ModelRequest | None = None) -> list[object]:
    """Every event of one model call."""
    async with model.stream(req or request()) as events:
        return [event async for event in events]


def content(events: list[object]) -> list[object]:
    """The events before the final ModelFinish, checking that it is there."""
    assert isinstance(events[-1], ModelFinish)
    return events[:-1]


# -- ScriptedModel ---------------------------------------------------------------------------


async def test_scripted_model_plays_replies_in_order():
    model = ScriptedModel(["first", "second", "third"])

    played = [content(await play(model)) for _ in range(3)]

    assert played == [[ModelText("first")], [ModelText("second")], [ModelText("third")]]


async def test_scripted_str_reply_is_one_chunk():
    model = ScriptedModel(["Hello, world. How are you?"])

    assert content(await play(model)) == [ModelText("Hello, world. How are you?")]


async def test_scripted_list_reply_streams_each_chunk_in_order():
    model = ScriptedModel([["Hel", "lo ", "world"]])

    assert content(await play(model)) == [ModelText("Hel"), ModelText("lo "), ModelText("world")]


async def test_scripted_list_reply_streams_tool_call_parts_as_model_tool_calls():
    model = ScriptedModel([["Let me look.", CALL]])

    assert content(await play(model)) == [ModelText("Let me look."), ModelToolCall(CALL)]


async def test_scripted_tuple_reply_is_accepted_like_a_list():
    model = ScriptedModel([("a", "b")])

    assert content(await play(model)) == [ModelText("a"), ModelText("b")]


async def test_scripted_model_records_every_request_in_order():
    model = ScriptedModel(["one", "two"])
    first, second = request("first question"), request("second question")

    await play(model, first)
    await play(model, second)

    assert model.requests == [first, second]


async def test_scripted_model_records_the_request_a_pipeline_sends():
    model = ScriptedModel(["Hello!"])
    turn = Turn.start("hi there")

    await Pipeline(model=model).run(turn)

    assert [r.messages for r in model.requests] == [(Message.user("hi there"),)]


async def test_scripted_model_running_out_raises_provider_error_with_counts():
    model = ScriptedModel(["a", "b", "c"])
    for _ in range(3):
        await play(model)

    with pytest.raises(ProviderError) as excinfo:
        await play(model)

    message = str(excinfo.value)
    assert re.search(r"\b3\b", message), message  # how many replies it holds
    assert re.search(r"\b4\b", message), message  # the call that found none


async def test_scripted_model_running_out_in_a_pipeline_raises_provider_error_directly():
    pipe = Pipeline(model=ScriptedModel(["only one"]))
    await pipe.run(Turn.start("first"))

    with pytest.raises(ProviderError) as excinfo:
        await pipe.run(Turn.start("second"))

    assert type(excinfo.value) is ProviderError


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(42, id="int"),
        pytest.param(None, id="none"),
        pytest.param(CALL, id="bare-tool-call"),
        pytest.param(Text("x"), id="bare-text-part"),
        pytest.param(["ok", 3], id="int-item"),
        pytest.param(["ok", Text("x")], id="text-part-item"),
        pytest.param([ToolResult("call-1", "x")], id="tool-result-item"),
        pytest.param([["nested"]], id="nested-list-item"),
    ],
)
def test_scripted_model_rejects_bad_reply_at_construction_naming_its_index(bad):
    with pytest.raises(TypeError, match=r"reply 2\b"):
        ScriptedModel(["fine", bad, "also fine"])


def test_scripted_model_rejects_a_bare_str_instead_of_a_list():
    with pytest.raises(TypeError):
        ScriptedModel("Hello!")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        pytest.param(ToolCall(3, "lookup"), "ToolCall.id and .name must be str", id="int-id"),  # type: ignore[arg-type]
        pytest.param(
            ToolCall("call-1", "lookup", arguments=["q"]),  # type: ignore[arg-type]
            "ToolCall.arguments must be a mapping",
            id="list-arguments",
        ),
    ],
)
def test_scripted_model_rejects_a_malformed_tool_call_at_construction_naming_its_reply(call, says):
    """Bug caught: a scripted tool call with an int id or list arguments was taken, and the
    turn that played it failed with a bare TypeError naming neither the model nor the reply."""
    with pytest.raises(TypeError, match=rf"^ScriptedModel reply 2: {re.escape(says)}"):
        ScriptedModel(["fine", ["calling", call]])


@pytest.mark.parametrize("script", [42, None], ids=["int", "none"])
def test_scripted_model_rejects_a_script_that_is_no_list_saying_what_to_pass(script):
    """Bug caught: `ScriptedModel(42)` failing with Python's bare "'int' object is not
    iterable", which did not say a list of replies was wanted."""
    with pytest.raises(TypeError, match=r"ScriptedModel takes a list of replies, got"):
        ScriptedModel(script)


# -- FunctionModel ---------------------------------------------------------------------------


async def test_function_model_computes_reply_from_request_with_sync_fn():
    model = FunctionModel(lambda req: req.messages[-1].text.upper())

    assert content(await play(model, request("shout this"))) == [ModelText("SHOUT THIS")]


async def test_function_model_computes_reply_from_request_with_async_fn():
    async def echo(req: ModelRequest) -> str:
        await anyio.lowlevel.checkpoint()
        return f"you said: {req.messages[-1].text}"

    model = FunctionModel(echo)

    assert content(await play(model, request("hello"))) == [ModelText("you said: hello")]


async def test_function_model_reply_may_be_chunks_and_tool_calls():
    async def reply(req: ModelRequest) -> list[str | ToolCall]:
        return [req.messages[-1].text, " then", CALL]

    model = FunctionModel(reply)

    assert content(await play(model, request("look"))) == [
        ModelText("look"),
        ModelText(" then"),
        ModelToolCall(CALL),
    ]


async def test_function_model_answers_each_call_from_its_own_request():
    pipe = Pipeline(model=FunctionModel(lambda req: req.messages[-1].text[::-1]))

    first = await pipe.run(Turn.start("abc"))
    second = await pipe.run(Turn.start("xyz"))

    assert [first.reply.text, second.reply.text] == ["cba", "zyx"]


async def test_function_model_streams_an_async_generator_lazily(autojump_clock):
    async def slowly(req: ModelRequest):
        yield "one "
        await anyio.sleep(1)
        yield "two "
        await anyio.sleep(2)
        yield "three"

    pipe = Pipeline(model=FunctionModel(slowly))
    start = anyio.current_time()
    arrivals: list[tuple[float, str]] = []

    async with pipe.stream(Turn.start("count")) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                arrivals.append((anyio.current_time() - start, event.text))

    assert arrivals == [(0.0, "one "), (1.0, "two "), (3.0, "three")]
    assert events.result.reply.text == "one two three"


async def test_a_scripted_model_out_of_replies_says_it_is_the_scripted_provider():
    pipe = Pipeline(model=ScriptedModel([]))
    with pytest.raises(ProviderError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.provider == "scripted"


async def test_a_function_models_malformed_tool_call_is_a_provider_error_naming_the_function():
    """Bug caught: a reply function returning a tool call with an int id made the turn fail
    with a bare TypeError out of building the reply message, not the ProviderError naming the
    function that every other malformed reply gives."""

    def lookup_with_an_int_id(request: ModelRequest) -> list[object]:
        return [ToolCall(3, "lookup")]  # type: ignore[arg-type]

    pipe = Pipeline(model=FunctionModel(lookup_with_an_int_id))

    with pytest.raises(ProviderError, match=r"lookup_with_an_int_id: ToolCall\.id and \.name must"):
        await pipe.run(Turn.start("hi"))
