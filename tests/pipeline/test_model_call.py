"""The model call (stage 4): the request the model is sent, its checks, the reply."""

from contextlib import asynccontextmanager

import attrs
import pytest

from pipeline import (
    HookReturnError,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    Pipeline,
    ProviderError,
    ProviderProtocolError,
    RateLimited,
    RequestError,
    cont,
    per_chunk,
    tool,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Context, Message, RequestOptions, Text, ToolCall, ToolSpec, Turn, Usage, render

SEARCH = ToolSpec("search", "Search the docs.")
WEATHER = ToolSpec("weather", "Today's weather.")
DELETE = ToolSpec("delete_account", "Delete the user's account.")
TOOLS = (SEARCH, WEATHER, DELETE)
HISTORY = (Message.user("earlier question"), Message.assistant("earlier answer"))
CALL = ToolCall(id="call-1", name="search", arguments={"q": "pricing"})


class EventsModel:
    """A model that streams fixed events, whatever it is asked."""

    def __init__(self, *events: object) -> None:
        self.events = events
        self.requests: list[ModelRequest] = []

    @asynccontextmanager
    async def stream(self, request: ModelRequest):
        self.requests.append(request)

        async def events():
            for event in self.events:
                yield event

        stream = events()
        try:
            yield stream
        finally:
            await stream.aclose()


class FailingModel:
    """A model that raises `error`, on entry or after its first chunk."""

    def __init__(self, error: BaseException, *, mid_stream: bool) -> None:
        self.error = error
        self.mid_stream = mid_stream

    @asynccontextmanager
    async def stream(self, request: ModelRequest):
        if not self.mid_stream:
            raise self.error

        async def events():
            yield ModelText("partial ")
            raise self.error

        yield events()


def with_tools(*tools: ToolSpec) -> Turn:
    return Turn.start("hi", context=Context(tools=tools))


def shaping(**changes):
    """A pre hook that shapes the request."""

    def shape(turn: Turn):
        return cont(turn.with_request(**changes))

    return shape


# -- the request -----------------------------------------------------------------------------


async def test_model_is_sent_the_render_of_the_final_turn():
    def trim_and_note(turn: Turn):
        # A per-turn view of the history plus an injection: the final turn renders
        # differently from the turn that entered the pipeline.
        view = attrs.evolve(turn.context, messages=turn.context.messages[-1:])
        return cont(attrs.evolve(turn, context=view).inject("note: be brief"))

    model = ScriptedModel(["ok"])
    turn = Turn.start("hi", context=Context(HISTORY, system="Be helpful."))

    result = await Pipeline(model=model, pre=[trim_and_note]).run(turn)

    assert model.requests[0].messages == render(result.turn)
    assert model.requests[0].messages != render(turn)


async def test_model_is_sent_every_context_tool_when_none_is_narrowed():
    model = ScriptedModel(["ok"])

    await Pipeline(model=model).run(with_tools(*TOOLS))

    assert model.requests[0].tools == TOOLS


async def test_model_is_sent_only_the_active_tools_after_a_pre_hook_narrows_them():
    model = ScriptedModel(["ok"])
    pre = [shaping(active_tools=["search", "delete_account"])]

    await Pipeline(model=model, pre=pre).run(with_tools(*TOOLS))

    assert model.requests[0].tools == (SEARCH, DELETE)


async def test_a_turn_narrowed_before_it_runs_keeps_the_named_pipeline_tools():
    """Catches: `Turn.start(...).with_request(active_tools=["lookup"])` on a turn whose
    context has no tools yet (the pipeline's `tools=` fill it) intersecting the names with
    no tools at all, so the model was silently sent no tools instead of `lookup`."""

    def lookup(query: str) -> str:
        """Look something up."""
        return query

    def clock() -> str:
        """Tell the time."""
        return "noon"

    model = ScriptedModel(["ok"])
    turn = Turn.start("hi").with_request(active_tools=["lookup"])

    await Pipeline(model=model, tools=[tool(lookup), tool(clock)]).run(turn)

    assert [spec.name for spec in model.requests[0].tools] == ["lookup"]


async def test_model_is_sent_no_tools_when_a_pre_hook_narrows_to_none():
    model = ScriptedModel(["ok"])

    await Pipeline(model=model, pre=[shaping(active_tools=[])]).run(with_tools(*TOOLS))

    assert model.requests[0].tools == ()


async def test_model_is_sent_the_final_turns_request_options():
    model = ScriptedModel(["ok"])
    pre = [shaping(temperature=0.2, max_tokens=64, tool_choice="auto", extra={"seed": 7})]

    result = await Pipeline(model=model, pre=pre).run(with_tools(*TOOLS))

    expected = RequestOptions(temperature=0.2, max_tokens=64, tool_choice="auto", extra={"seed": 7})
    assert model.requests[0].options == expected
    assert result.turn.request == expected


async def test_pipeline_system_fills_the_context_when_the_turn_has_none():
    model = ScriptedModel(["ok"])

    result = await Pipeline(model=model, system="You are terse.").run(Turn.start("hi"))

    assert model.requests[0].messages == (Message.system("You are terse."), Message.user("hi"))
    assert result.turn.context.system == "You are terse."


async def test_pipeline_system_does_not_replace_the_turns_own_system():
    model = ScriptedModel(["ok"])
    turn = Turn.start("hi", context=Context(system="You are a pirate."))

    await Pipeline(model=model, system="You are terse.").run(turn)

    assert model.requests[0].messages == (Message.system("You are a pirate."), Message.user("hi"))


# -- local request checks --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("turn", "pre"),
    [
        pytest.param(with_tools(), [shaping(tool_choice="required")], id="no-tools"),
        pytest.param(
            with_tools(*TOOLS),
            [shaping(active_tools=[]), shaping(tool_choice="required")],
            id="narrowed-to-none",
        ),
    ],
)
async def test_required_tool_choice_with_no_active_tool_fails_before_any_model_call(turn, pre):
    model = ScriptedModel(["never sent"])

    with pytest.raises(RequestError, match="required"):
        await Pipeline(model=model, pre=pre).run(turn)

    assert model.requests == []


@pytest.mark.parametrize("choice", ["delete_account", "send_email"], ids=["narrowed", "unknown"])
async def test_tool_choice_naming_an_inactive_tool_fails_listing_the_active_tools(choice):
    model = ScriptedModel(["never sent"])
    pre = [shaping(active_tools=["search", "weather"]), shaping(tool_choice=choice)]

    with pytest.raises(RequestError) as excinfo:
        await Pipeline(model=model, pre=pre).run(with_tools(*TOOLS))

    message = str(excinfo.value)
    assert choice in message
    assert "search" in message
    assert "weather" in message
    assert model.requests == []


@pytest.mark.parametrize("choice", ["auto", "none"])
async def test_auto_and_none_tool_choice_need_no_active_tool(choice):
    model = ScriptedModel(["fine"])

    result = await Pipeline(model=model, pre=[shaping(tool_choice=choice)]).run(with_tools())

    assert result.outcome == "completed"
    assert model.requests[0].options.tool_choice == choice


async def test_required_tool_choice_with_an_active_tool_calls_the_model():
    model = ScriptedModel(["fine"])

    await Pipeline(model=model, pre=[shaping(tool_choice="required")]).run(with_tools(SEARCH))

    assert [r.options.tool_choice for r in model.requests] == ["required"]


async def test_tool_choice_naming_an_active_tool_calls_the_model():
    model = ScriptedModel(["fine"])

    await Pipeline(model=model, pre=[shaping(tool_choice="weather")]).run(with_tools(*TOOLS))

    assert [r.options.tool_choice for r in model.requests] == ["weather"]


# -- the reply -------------------------------------------------------------------------------


async def test_reply_chunks_join_into_one_text_part_of_an_assistant_message():
    result = await Pipeline(model=ScriptedModel([["Hel", "lo, ", "world"]])).run(Turn.start("hi"))

    assert result.reply.message == Message("assistant", (Text("Hello, world"),))


async def test_reply_message_holds_the_joined_text_then_the_tool_calls():
    model = EventsModel(
        ModelText("Let me "),
        ModelText("check."),
        ModelToolCall(CALL),
        ModelFinish("tool_calls", Usage(10, 5)),
    )

    result = await Pipeline(model=model).run(Turn.start("hi"))

    assert result.reply.message == Message("assistant", (Text("Let me check."), CALL))


async def test_reply_messages_is_the_final_message_alone_without_tool_steps():
    result = await Pipeline(model=ScriptedModel(["Hello!"])).run(Turn.start("hi"))

    assert result.reply.messages == (result.reply.message,)


async def test_reply_of_the_first_attempt_is_numbered_one():
    result = await Pipeline(model=ScriptedModel(["Hello!"])).run(Turn.start("hi"))

    assert result.reply.attempt == 1


async def test_reply_takes_finish_reason_and_usage_from_model_finish():
    model = EventsModel(ModelText("cut"), ModelFinish("length", Usage(11, 7)))

    result = await Pipeline(model=model).run(Turn.start("hi"))

    assert (result.reply.finish_reason, result.reply.usage) == ("length", Usage(11, 7))


async def test_final_turn_carries_the_reply():
    result = await Pipeline(model=ScriptedModel(["Hello!"])).run(Turn.start("hi"))

    assert result.turn.reply == result.reply


# -- model failures --------------------------------------------------------------------------


async def test_model_yielding_a_wrong_event_type_is_a_protocol_error():
    model = EventsModel(ModelText("ok"), Text("stray part"), ModelFinish("stop"))

    with pytest.raises(ProviderProtocolError, match="Text"):
        await Pipeline(model=model).run(Turn.start("hi"))


async def test_model_stream_ending_without_model_finish_is_a_truncation_protocol_error():
    model = EventsModel(ModelText("and then"))

    with pytest.raises(ProviderProtocolError, match=r"(?i)truncat"):
        await Pipeline(model=model).run(Turn.start("hi"))


@pytest.mark.parametrize("mid_stream", [False, True], ids=["on-entry", "mid-stream"])
async def test_model_raising_a_foreign_exception_becomes_provider_error_with_cause(mid_stream):
    original = ConnectionResetError("socket closed")

    with pytest.raises(ProviderError) as excinfo:
        await Pipeline(model=FailingModel(original, mid_stream=mid_stream)).run(Turn.start("hi"))

    assert excinfo.value.__cause__ is original


@pytest.mark.parametrize("mid_stream", [False, True], ids=["on-entry", "mid-stream"])
async def test_provider_error_raised_by_the_model_passes_through_unchanged(mid_stream):
    original = RateLimited("slow down", provider="acme", retry_after=3.0, request_id="req-9")

    with pytest.raises(RateLimited) as excinfo:
        await Pipeline(model=FailingModel(original, mid_stream=mid_stream)).run(Turn.start("hi"))

    assert excinfo.value is original


@pytest.mark.parametrize("mid_stream", [False, True], ids=["on-entry", "mid-stream"])
async def test_a_hook_error_raised_by_the_model_is_its_provider_error(mid_stream):
    """Bug: a HookError out of a model (a pipeline it runs failed) was taken for a transformer
    failure: a HookFailed event naming the inner hook, then the error as it was, not the
    model's failure."""
    inner = Pipeline(model=ScriptedModel(["x"]), pre=[lambda turn: None])
    with pytest.raises(HookReturnError) as raised:
        await inner.run(Turn.start("route me"))
    original = raised.value
    pipe = Pipeline(
        model=FailingModel(original, mid_stream=mid_stream), transformers=[per_chunk(str.upper)]
    )

    events: list[ev.Event] = []

    async def consume() -> None:
        async with pipe.stream(Turn.start("hi")) as stream:
            async for event in stream:
                events.append(event)

    with pytest.raises(ProviderError) as excinfo:
        await consume()

    assert excinfo.value.__cause__ is original
    assert [e for e in events if type(e) is ev.HookFailed] == []


@pytest.mark.parametrize(
    "event", [ModelText(None), ModelToolCall("search")], ids=["text-none", "call-str"]
)
async def test_a_malformed_model_event_is_a_protocol_error(event: object) -> None:
    pipe = Pipeline(model=EventsModel(event, ModelFinish("stop")))  # type: ignore[arg-type]
    with pytest.raises(ProviderProtocolError, match="yielded"):
        await pipe.run(Turn.start("hi"))


async def test_a_tool_choice_that_is_not_text_is_rejected_when_set() -> None:
    with pytest.raises(TypeError, match="tool_choice"):
        Turn.start("hi").with_request(tool_choice={"type": "function"})


def pipe_with_pre(*pre, **options):
    return Pipeline(model=ScriptedModel(["ok"]), pre=list(pre), **options)


async def test_model_called_and_the_audit_number_the_first_attempt_one():
    pipe = pipe_with_pre()
    async with pipe.stream(Turn.start("hi")) as events:
        called = [(e.attempt, e.step) async for e in events if isinstance(e, ev.ModelCalled)]
    assert called == [(1, 1)]
    [attempt] = events.result.audit.attempts
    assert (attempt.attempt, attempt.steps, attempt.text) == (1, 1, "ok")
