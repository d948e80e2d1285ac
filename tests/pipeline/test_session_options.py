"""What a session's turn can be given besides its message: a system prompt, tools the caller
runs, request options and a correlation id (`Session.send`, `Session.stream`), and a tool
message that continues from the results of the calls the conversation ends with."""

import asyncio
from pathlib import Path

import pytest

from pipeline import LogError, Pipeline, Session, cont, hook
from pipeline import events as ev
from pipeline.logs import Log, LogEntry, MemoryLog, SQLiteLog
from pipeline.testing import ScriptedModel
from turns import Context, Message, RequestOptions, ToolCall, ToolResult, ToolSpec, Turn

from .support import AnswerLostLog

WEATHER = ToolSpec("get_weather", "The weather.", {"type": "object", "properties": {}})


async def test_send_passes_system_tools_and_request_options_to_the_turn() -> None:
    """Catches: a session turn that cannot be given the caller's system prompt, tools or
    request options (a gateway then had to commit turns itself), or one whose turn_ref is
    not the one given."""
    seen: list[tuple[str | None, tuple[str, ...], RequestOptions]] = []

    def look(turn: Turn) -> object:
        seen.append((turn.context.system, turn.context.tool_names, turn.request))
        return cont(turn)

    model = ScriptedModel(["Sunny."])
    pipe = Pipeline(model=model, pre=[hook(look, name="look")], system="Default.")
    options = RequestOptions(temperature=0.3, max_tokens=50, tool_choice="auto")
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        result = await session.send(
            "weather?", system="Be terse.", tools=[WEATHER], request=options, turn_ref="ref-1"
        )
    assert seen == [("Be terse.", ("get_weather",), options)]
    [request] = model.requests
    assert request.messages[0] == Message.system("Be terse.")
    assert [t.name for t in request.tools] == ["get_weather"]
    assert (request.options.temperature, request.options.max_tokens) == (0.3, 50)
    assert result.turn.turn_ref == "ref-1"
    assert [(e.turn_ref, len(e.messages)) for e in await log.entries("c")] == [("ref-1", 2)]


async def test_stream_takes_the_same_options_and_a_tool_message_continues_the_turn() -> None:
    """Catches: session.stream without the options send takes, or a session unable to
    continue from the results of tool calls the caller ran (its log then ends with calls
    that are never answered)."""
    call = ToolCall("c1", "get_weather", {})
    model = ScriptedModel([[call], "It is sunny."])
    log = MemoryLog()
    async with Pipeline(model=model).session(log=log, conversation_id="c") as session:
        asked = await session.send("weather?", tools=[WEATHER])
        results = Message("tool", (ToolResult("c1", "sunny"),))
        async with session.stream(
            results, tools=[WEATHER], request=RequestOptions(temperature=0.0)
        ) as events:
            kinds = [type(e).__name__ async for e in events]
    assert asked.reply is not None
    assert asked.reply.message.parts == (call,)
    assert events.result.reply is not None
    assert events.result.reply.text == "It is sunny."
    assert "Committed" in kinds
    assert model.requests[1].options.temperature == 0.0
    assert [m.role for m in model.requests[1].messages] == ["user", "assistant", "tool"]
    stored = await log.load("c")
    assert [m.role for m in stored.messages] == ["user", "assistant", "tool", "assistant"]


async def test_a_tool_message_answering_no_call_of_the_conversation_is_refused() -> None:
    """Catches: results sent to the model for calls the conversation never made."""
    async with Pipeline(model=ScriptedModel(["x"])).session(
        log=MemoryLog(), conversation_id="c"
    ) as session:
        with pytest.raises(ValueError, match="needs the tool calls they answer"):
            await session.send(Message("tool", (ToolResult("c1", "sunny"),)))
        with pytest.raises(TypeError, match=r"request= takes a turns\.RequestOptions, got dict"):
            await session.send("hi", request={"temperature": 0.1})
        assert session.info.turns == 0


async def test_background_output_of_a_turn_given_options_is_committed() -> None:
    """Catches: a turn run with caller options losing its background hooks' durable output."""

    def remember(turn: Turn) -> object:
        return cont(turn.inject("noted"))

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        post=[hook(remember, name="remember", background=True, durable=True)],
    )
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi", system="S.", request=RequestOptions(max_tokens=5))
    stored = await log.load("c")
    assert [(m.role, m.text) for m in stored.messages] == [
        ("user", "hi"),
        ("assistant", "ok"),
        ("user", "noted"),
    ]
    assert [type(e) for e in session.events if type(e) is ev.Committed] == [ev.Committed]


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_turn_ref_the_session_already_committed_is_refused_before_the_turn_runs(
    method: str,
) -> None:
    """Catches: a second turn under a turn_ref the session had committed was answered and
    reported committed, though the log kept only the first; the session's history then
    held messages the log did not, and its next turn failed with a LogConflict."""
    model = ScriptedModel(["Hello.", "Bye."])
    log = MemoryLog()
    async with Pipeline(model=model).session(log=log, conversation_id="c") as session:
        await session.send("hi", turn_ref="ref-1")
        with pytest.raises(ValueError, match="'ref-1'"):
            await again(session, method, "ref-1")
        result = await session.send("bye")
    assert (session.info.turns, len(model.requests)) == (2, 2)
    assert result.outcome == "completed"
    assert session.context == await log.load("c")


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_turn_ref_an_earlier_session_committed_is_refused_before_the_turn_runs(
    method: str, tmp_path: Path
) -> None:
    """Bug caught: a turn under a turn_ref the log already held from an earlier session was
    answered and reported committed while the log ignored it, and the session's next turn
    then failed with a LogConflict blaming another writer."""
    model = ScriptedModel(["Hello.", "Bye."])
    pipe = Pipeline(model=model)
    async with SQLiteLog(str(tmp_path / "chats.db")) as log:
        async with pipe.session(log=log, conversation_id="c") as session:
            await session.send("hi", turn_ref="ref-1")
        async with pipe.session(log=log, conversation_id="c") as session:
            with pytest.raises(ValueError, match="already holds a commit under 'ref-1'"):
                await again(session, method, "ref-1")
            result = await session.send("bye")
        assert (session.info.turns, len(model.requests)) == (1, 2)
        assert result.outcome == "completed"
        assert session.context == await log.load("c")
        assert len(await log.entries("c")) == 2  # the first turn and "bye"


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_a_retry_under_the_turn_ref_of_a_commit_that_failed_unsure_is_refused(
    method: str,
) -> None:
    """Bug caught: the log's turn_refs, read once, were kept past the reload after a commit
    that failed unsure whether it wrote, so a retry under its turn_ref was answered and
    reported committed while the log ignored it, and the next turn failed with a
    LogConflict blaming another writer."""
    log = AnswerLostLog(lose="ref-2")
    model = ScriptedModel(["one", "two", "three"])
    async with Pipeline(model=model).session(log=log, conversation_id="c") as session:
        await session.send("first", turn_ref="ref-1")  # reads the log's turn_refs
        with pytest.raises(LogError, match="the answer was lost"):
            await session.send("second", turn_ref="ref-2")
        with pytest.raises(ValueError, match="already holds a commit under 'ref-2'"):
            await again(session, method, "ref-2")
        result = await session.send("third")
    assert (result.outcome, len(model.requests)) == ("completed", 3)
    assert session.context == await log.load("c")
    assert [e.turn_ref for e in await log.entries("c")] == ["ref-1", "ref-2", result.turn.turn_ref]


class ProtocolLog(Log):
    """A log of one's own subclassing the `Log` protocol with only load and append: it
    inherits the protocol's `entries`, whose stub returns None."""

    def __init__(self) -> None:
        self.log = MemoryLog()

    async def load(self, conversation_id: str) -> Context:
        return await self.log.load(conversation_id)

    async def append(self, *args, **options) -> None:
        await self.log.append(*args, **options)


async def test_a_log_subclassing_the_protocol_with_only_load_and_append_takes_turn_refs() -> None:
    """Bug caught: a log subclassing `Log` with only load and append (all a session needs)
    failed every send given a turn_ref with a bare "TypeError: 'NoneType' object is not
    iterable", from the `entries` stub it inherits."""
    log = ProtocolLog()
    async with Pipeline(model=ScriptedModel(["one", "two"])).session(
        log=log, conversation_id="c"
    ) as session:
        await session.send("first", turn_ref="ref-1")
        with pytest.raises(ValueError, match="already committed 'ref-1'"):
            await session.send("again", turn_ref="ref-1")
        result = await session.send("second", turn_ref="ref-2")
    assert result.outcome == "completed"
    assert session.context == await log.load("c")


class RefsEntries(ProtocolLog):
    """A log whose `entries` returns the turn_refs, not `LogEntry` records."""

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        return ("ref-1",)  # type: ignore[return-value]


async def test_a_log_whose_entries_returns_no_log_entries_is_a_type_error_naming_it() -> None:
    """Bug caught: a log whose entries() returned something other than LogEntry records
    failed a send given a turn_ref with an AttributeError about turn_ref, naming no log."""
    model = ScriptedModel(["one"])
    async with Pipeline(model=model).session(log=RefsEntries(), conversation_id="c") as s:
        with pytest.raises(TypeError) as raised:
            await s.send("first", turn_ref="ref-1")
    assert str(raised.value).startswith(
        "RefsEntries.entries('c') returned tuple ('ref-1',), holding str 'ref-1', not a"
        " sequence of pipeline.logs.LogEntry"
    )
    assert model.requests == []


class StrayCancellingEntries(ProtocolLog):
    """A log whose `entries` raises a CancelledError of its own, as a library awaiting a
    future another task cancelled would, while nothing cancels the caller."""

    def __repr__(self) -> str:
        return "StrayCancellingEntries()"

    async def entries(self, conversation_id: str) -> tuple[LogEntry, ...]:
        raise asyncio.CancelledError()


async def test_a_logs_own_cancelled_error_reading_its_entries_is_a_log_error_naming_it() -> None:
    """Bug caught: a log whose entries() raised a CancelledError of its own (nothing
    cancelling the caller) made a send given a turn_ref a bare cancellation, naming no log,
    where load() raising one is a LogError naming it."""
    model = ScriptedModel(["one"])
    async with Pipeline(model=model).session(
        log=StrayCancellingEntries(), conversation_id="c"
    ) as session:
        with pytest.raises(
            LogError,
            match=r"StrayCancellingEntries\(\) failed reading the entries of conversation 'c'",
        ) as raised:
            await session.send("first", turn_ref="ref-1")
    assert isinstance(raised.value.__cause__, asyncio.CancelledError)
    assert model.requests == []


@pytest.mark.parametrize("method", ["send", "stream"])
@pytest.mark.parametrize(
    "turn_ref", ["ref\x00", "ref\ud800", "r" * 1025], ids=["nul", "lone-surrogate", "too-long"]
)
async def test_a_turn_ref_no_log_can_store_is_refused_before_the_turn_runs(
    method: str, turn_ref: str
) -> None:
    """Catches: a turn_ref holding a NUL or a lone surrogate, or too long for a log, ran the
    whole turn (the model called, its tools run) and only then failed at the commit, which
    every log refuses."""
    model = ScriptedModel(["Hello."])
    log = MemoryLog()
    async with Pipeline(model=model).session(log=log, conversation_id="c") as session:
        with pytest.raises(ValueError, match="turn_ref"):
            await again(session, method, turn_ref)
        assert (session.info.turns, len(model.requests)) == (0, 0)
        result = await session.send("hi")
    assert result.outcome == "completed"
    assert session.context == await log.load("c")


async def test_a_conversation_id_no_log_can_store_is_refused_when_the_session_opens() -> None:
    """Catches: a conversation id too long to store, which a log's load reads (an older log
    may hold one), opening a session whose turns ran (the model called) and only then failed
    at the commit."""
    model = ScriptedModel(["Hello."])
    with pytest.raises(ValueError, match="conversation id must be at most 1024 bytes"):
        async with Pipeline(model=model).session(log=MemoryLog(), conversation_id="c" * 1025):
            pass
    assert model.requests == []


@pytest.mark.parametrize("method", ["send", "stream"])
@pytest.mark.parametrize(
    ("options", "said"),
    [
        pytest.param({"system": 123}, "system= takes", id="system"),
        pytest.param({"tools": ["lookup"]}, "tools= takes turns.ToolSpec", id="tools"),
        pytest.param({"tools": "lookup"}, "got str 'lookup'", id="tools-str"),
    ],
)
async def test_a_malformed_system_or_tools_is_refused_before_the_turn_runs(
    method: str, options: dict, said: str
) -> None:
    """Catches: a system prompt that is not text, or tools that are not ToolSpecs, running
    the pre hooks and failing mid-turn with a TypeError about Text.text or an AttributeError,
    naming neither argument (run() and stream() refuse such a turn before it runs)."""
    trace = []

    def pre(turn: Turn):
        trace.append("pre")
        return cont(turn)

    model = ScriptedModel(["Hello."])
    async with Pipeline(model=model, pre=[pre]).session(
        log=MemoryLog(), conversation_id="c"
    ) as session:
        with pytest.raises(TypeError, match=said):
            await one_turn(session, method, **options)
        assert (trace, session.info.turns, model.requests) == ([], 0, [])


@pytest.mark.parametrize("method", ["send", "stream"])
async def test_tools_none_still_means_no_tools_of_the_callers(method: str) -> None:
    """Catches: the check of tools= refusing None (iterating it), which a session took as no
    tools before the check."""
    model = ScriptedModel(["Hello."])
    async with Pipeline(model=model).session(log=MemoryLog(), conversation_id="c") as session:
        await one_turn(session, method, tools=None)
    assert model.requests[0].tools == ()


async def one_turn(session: Session, method: str, **options: object) -> None:
    """A turn with `options`, sent or streamed to its end."""
    if method == "send":
        await session.send("hi", **options)
        return
    async with session.stream("hi", **options) as events:
        async for _ in events:
            pass


async def again(session: Session, method: str, turn_ref: str) -> None:
    """A turn under `turn_ref`, sent or streamed to its end."""
    if method == "send":
        await session.send("hi again", turn_ref=turn_ref)
        return
    async with session.stream("hi again", turn_ref=turn_ref) as events:
        async for _ in events:
            pass
