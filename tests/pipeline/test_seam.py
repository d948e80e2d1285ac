"""Stage 6, the stream-transformer seam: every text chunk passes through it before anyone sees it."""

import inspect
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import anyio
import pytest

from hooks import pii, redact
from pipeline import (
    ConfigError,
    HookFailed,
    HookReturnError,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    Pipeline,
    ProviderConnectionError,
    ProviderError,
    cont,
    per_chunk,
    regenerate,
    tool,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import ToolCall, Turn

from .support import collect, collect_into

TURN_REF = "turn-seam"


def start(text: str = "hi") -> Turn:
    return Turn.start(text, turn_ref=TURN_REF)


def deltas(events: list[ev.Event]) -> list[tuple[str, int]]:
    return [(e.text, e.attempt) for e in events if isinstance(e, ev.TextDelta)]


# -- transformers ---------------------------------------------------------------------------


class Factory:
    """A named transformer factory: ``Factory("name", build)`` calls `build` for each instance."""

    def __init__(self, name: str, build: Callable[[], object]) -> None:
        self.name = name
        self.build = build

    def __call__(self) -> object:
        return self.build()


class Shout:
    """Upper-cases every chunk; holds nothing."""

    def feed(self, text: str) -> str:
        return text.upper()

    def flush(self) -> str:
        return ""


def shout() -> Shout:
    return Shout()


class HoldLast:
    """Holds back the last character it was fed; releases it on flush."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, text: str) -> str:
        text = self.held + text
        self.held = text[-1:]
        return text[:-1]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


class HoldAll:
    """Holds everything back until flush."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, text: str) -> str:
        self.held += text
        return ""

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


class MarkFirst:
    """Marks the first chunk its instance sees: a reused instance would not mark again."""

    def __init__(self) -> None:
        self.started = False

    def feed(self, text: str) -> str:
        if self.started:
            return text
        self.started = True
        return "» " + text

    def flush(self) -> str:
        return ""


class CountChunks:
    """Passes text through and reports how many chunks its instance saw."""

    def __init__(self) -> None:
        self.chunks = 0

    def feed(self, text: str) -> str:
        self.chunks += 1
        return text

    def flush(self) -> str:
        return ""

    def annotations(self) -> dict[str, int]:
        return {"chunks": self.chunks}


def traced(trace: list[str], label: str, transform: Callable[[str], str] = str) -> Factory:
    """A transformer that records every feed and flush under `label`."""

    class Traced:
        def feed(self, text: str) -> str:
            trace.append(f"{label}.feed:{text}")
            return transform(text)

        def flush(self) -> str:
            trace.append(f"{label}.flush")
            return ""

    return Factory(label, Traced)


def failing(name: str, *, in_flush: bool = False) -> Factory:
    class Broken:
        def feed(self, text: str) -> str:
            if not in_flush:
                raise ValueError("feed exploded")
            return text

        def flush(self) -> str:
            if in_flush:
                raise ValueError("flush exploded")
            return ""

    return Factory(name, Broken)


def scrub(text: str) -> str:
    return text


def count_chunks() -> CountChunks:
    return CountChunks()


SHARED = Shout()


def same_shout() -> Shout:
    return SHARED


def broken_factory() -> Shout:
    raise RuntimeError("no configuration")


class FeedOnly:
    def feed(self, text: str) -> str:
        return text


def half_done() -> FeedOnly:
    return FeedOnly()


def reject_first(turn: Turn):
    """A post hook that rejects attempt 1 and accepts the rest."""
    assert turn.reply is not None
    if turn.reply.attempt == 1:
        return regenerate("say it differently")
    return cont(turn)


def pipe_with(*transformers: object, replies=(("hel", "lo world"),), **options) -> Pipeline:
    return Pipeline(
        model=ScriptedModel([list(reply) for reply in replies]),
        transformers=list(transformers),
        **options,
    )


# -- order ----------------------------------------------------------------------------------


async def test_transformers_run_in_list_order_on_every_chunk():
    trace: list[str] = []
    pipe = pipe_with(
        traced(trace, "first", str.upper),
        traced(trace, "second", lambda text: f"[{text}]"),
        replies=[["ab", "cd"]],
    )
    await pipe.run(start())
    assert trace == [
        "first.feed:ab",
        "second.feed:AB",
        "first.feed:cd",
        "second.feed:CD",
        "first.flush",
        "second.flush",
    ]


async def test_the_reply_is_the_chained_output_of_the_transformers():
    pipe = pipe_with(
        per_chunk(str.upper), per_chunk(lambda text: f"[{text}]"), replies=[["ab", "cd"]]
    )
    result = await pipe.run(start())
    assert result.reply is not None
    assert result.reply.text == "[AB][CD]"


# -- the transformed text is the only text anyone sees ----------------------------------------


async def test_text_deltas_carry_the_transformed_text():
    events, _ = await collect(pipe_with(shout), start())
    assert deltas(events) == [("HEL", 1), ("LO WORLD", 1)]


async def test_the_reply_holds_the_transformed_text():
    result = await pipe_with(shout).run(start())
    assert result.reply is not None
    assert result.reply.text == "HELLO WORLD"
    assert result.turn.reply == result.reply


async def test_the_audit_attempts_hold_the_transformed_text():
    pipe = pipe_with(shout, replies=[["first ", "try"], ["second ", "try"]], post=[reject_first])
    result = await pipe.run(start())
    assert [a.text for a in result.audit.attempts] == ["FIRST TRY", "SECOND TRY"]


async def test_the_log_messages_hold_the_transformed_text():
    result = await pipe_with(shout).run(start("hi"))
    assert [(m.role, m.text) for m in result.log_messages] == [
        ("user", "hi"),
        ("assistant", "HELLO WORLD"),
    ]


async def test_the_log_receives_the_transformed_text():
    log = MemoryLog()
    async with pipe_with(shout).session(log=log, conversation_id="c1") as session:
        await session.send("hi")
    (entry,) = await log.entries("c1")
    assert [m.text for m in entry.messages] == ["hi", "HELLO WORLD"]


async def test_a_rejection_records_the_transformed_text():
    pipe = pipe_with(shout, replies=[["first ", "try"], ["second ", "try"]], post=[reject_first])
    result = await pipe.run(start())
    assert [(r.attempt, r.text) for r in result.rejections] == [(1, "FIRST TRY")]
    assert result.audit.rejections == result.rejections


async def test_the_regenerating_model_is_shown_its_transformed_reply():
    model = ScriptedModel([["first ", "try"], ["second ", "try"]])
    pipe = Pipeline(model=model, transformers=[shout], post=[reject_first])
    await pipe.run(start())
    shown = [m.text for m in model.requests[1].messages if m.role == "assistant"]
    assert shown == ["FIRST TRY"]


async def test_a_rejected_attempts_deltas_are_transformed_too():
    pipe = pipe_with(shout, replies=[["first ", "try"], ["second ", "try"]], post=[reject_first])
    events, _ = await collect(pipe, start())
    assert deltas(events) == [("FIRST ", 1), ("TRY", 1), ("SECOND ", 2), ("TRY", 2)]


# -- a fresh instance per attempt -----------------------------------------------------------


async def test_each_attempt_gets_a_fresh_transformer():
    pipe = pipe_with(
        Factory("mark", MarkFirst),
        replies=[["first ", "try"], ["second ", "try"]],
        post=[reject_first],
    )
    result = await pipe.run(start())
    assert [a.text for a in result.audit.attempts] == ["» first try", "» second try"]


async def test_annotations_of_a_rejected_attempt_do_not_leak_into_the_next():
    counter = Factory("counter", CountChunks)
    pipe = pipe_with(
        counter, replies=[["a", "b", "c"], ["d", "e"]], post=[reject_first], max_regenerations=1
    )
    result = await pipe.run(start())
    assert result.reply is not None
    assert result.reply.annotations == {"counter": {"chunks": 2}}


async def test_transformer_state_does_not_cross_turns():
    pipe = pipe_with(Factory("mark", MarkFirst), replies=[["one"], ["two"]])
    first = await pipe.run(start())
    second = await pipe.run(start())
    assert first.reply is not None
    assert second.reply is not None
    assert (first.reply.text, second.reply.text) == ("» one", "» two")


# -- held text and flush --------------------------------------------------------------------


async def test_held_text_is_released_by_flush_as_a_final_text_delta():
    pipe = pipe_with(Factory("hold_last", HoldLast), replies=[["ab", "cd"]])
    events, result = await collect(pipe, start())
    model_events = [
        (type(e).__name__, getattr(e, "text", None))
        for e in events
        if isinstance(e, ev.ModelCalled | ev.TextDelta | ev.ReplyReady)
    ]
    assert model_events == [
        ("ModelCalled", None),
        ("TextDelta", "a"),
        ("TextDelta", "bc"),
        ("TextDelta", "d"),
        ("ReplyReady", None),
    ]
    assert result.reply is not None
    assert result.reply.text == "abcd"


async def test_text_held_until_the_end_reaches_the_reply():
    pipe = pipe_with(Factory("hold_all", HoldAll), replies=[["ab", "cd"]])
    events, result = await collect(pipe, start())
    assert deltas(events) == [("abcd", 1)]
    assert result.reply is not None
    assert result.reply.text == "abcd"


async def test_the_flush_of_one_transformer_is_fed_through_the_next():
    trace: list[str] = []

    class TracedHoldAll(HoldAll):
        def feed(self, text: str) -> str:
            trace.append(f"hold.feed:{text}")
            return super().feed(text)

        def flush(self) -> str:
            trace.append("hold.flush")
            return super().flush()

    pipe = pipe_with(
        Factory("hold", TracedHoldAll),
        traced(trace, "shout", str.upper),
        replies=[["ab", "cd"]],
    )
    result = await pipe.run(start())
    assert trace == [
        "hold.feed:ab",
        "hold.feed:cd",
        "hold.flush",
        "shout.feed:abcd",
        "shout.flush",
    ]
    assert result.reply is not None
    assert result.reply.text == "ABCD"


# -- per_chunk ------------------------------------------------------------------------------


async def test_per_chunk_applies_the_function_to_each_chunk_alone():
    seen: list[str] = []

    def bracket(text: str) -> str:
        seen.append(text)
        return f"[{text}]"

    result = await pipe_with(per_chunk(bracket), replies=[["ab", "cd", "e"]]).run(start())
    assert seen == ["ab", "cd", "e"]
    assert result.reply is not None
    assert result.reply.text == "[ab][cd][e]"


def test_per_chunk_is_named_after_its_function():
    assert per_chunk(scrub).name == "scrub"
    assert per_chunk(scrub, name="cleaner").name == "cleaner"


@pytest.mark.parametrize("name", [3, "", "  ", b"shout"])
def test_per_chunk_refuses_a_name_that_is_not_text(name: object):
    """Bug caught: per_chunk(fn, name=3) was accepted and named the transformer 'PerChunk' in
    errors and annotations, and a blank name fell back to the function's without a word."""
    with pytest.raises(ConfigError, match=r"per_chunk\(.*upper.*name=") as info:
        per_chunk(str.upper, name=name)  # type: ignore[arg-type]
    assert repr(name) in str(info.value)


def test_per_chunk_refuses_what_is_not_a_function():
    with pytest.raises(ConfigError, match="'upper'"):
        per_chunk("upper")  # type: ignore[arg-type]


async def test_a_failing_per_chunk_function_is_named_in_the_failure():
    def scrub(text: str) -> str:
        raise ValueError("bad chunk")

    with pytest.raises(HookFailed) as info:
        await pipe_with(per_chunk(scrub, name="cleaner")).run(start())
    assert (info.value.hook, info.value.stage) == ("cleaner", "transformers")
    assert "'cleaner'" in str(info.value)


# -- annotations ----------------------------------------------------------------------------


async def test_annotations_land_in_the_reply_under_the_factorys_name():
    pipe = pipe_with(Factory("counter", CountChunks), replies=[["a", "b", "c"]])
    result = await pipe.run(start())
    assert result.reply is not None
    assert result.reply.annotations == {"counter": {"chunks": 3}}


async def test_annotations_of_a_plain_factory_go_under_its_function_name():
    result = await pipe_with(count_chunks, replies=[["a", "b"]]).run(start())
    assert result.reply is not None
    assert result.reply.annotations == {"count_chunks": {"chunks": 2}}


async def test_transformers_without_annotations_report_nothing():
    result = await pipe_with(shout, Factory("counter", CountChunks), replies=[["a"]]).run(start())
    assert result.reply is not None
    assert result.reply.annotations == {"counter": {"chunks": 1}}


async def test_redaction_counts_land_in_the_reply():
    pipe = pipe_with(redact(r"\d{3}-\d{4}", name="phones"), replies=[["call 555-", "1234 now"]])
    result = await pipe.run(start())
    assert result.reply is not None
    assert result.reply.annotations == {"phones": {"redactions": 1}}


async def test_a_failing_annotations_method_is_a_hook_failure_naming_it():
    class BadReport(Shout):
        def annotations(self) -> dict[str, int]:
            raise RuntimeError("cannot report")

    with pytest.raises(HookFailed) as info:
        await pipe_with(Factory("reporter", BadReport)).run(start())
    assert (info.value.hook, info.value.stage) == ("reporter", "transformers")
    assert "'reporter'" in str(info.value)


# -- validation when the pipeline is built --------------------------------------------------


def test_an_entry_that_is_not_callable_is_refused_with_its_position():
    with pytest.raises(ConfigError) as info:
        Pipeline(model=ScriptedModel(["ok"]), transformers=[shout, "upper"])
    assert "position 2" in str(info.value)
    assert "'upper'" in str(info.value)


def test_an_instance_instead_of_a_factory_is_refused_with_a_hint():
    with pytest.raises(ConfigError) as info:
        Pipeline(model=ScriptedModel(["ok"]), transformers=[Shout()])
    assert "Shout" in str(info.value)
    assert "factory" in str(info.value)


async def test_a_class_is_a_factory():
    # A class with a no-argument constructor returns a fresh instance per call: a factory.
    result = await pipe_with(Shout).run(start())
    assert result.reply is not None
    assert result.reply.text == "HELLO WORLD"


def test_a_factory_returning_the_same_object_twice_is_refused():
    with pytest.raises(ConfigError, match="'same_shout'"):
        Pipeline(model=ScriptedModel(["ok"]), transformers=[same_shout])


def test_a_factory_that_raises_is_refused_naming_it():
    with pytest.raises(ConfigError) as info:
        Pipeline(model=ScriptedModel(["ok"]), transformers=[broken_factory])
    assert "'broken_factory'" in str(info.value)
    assert "no configuration" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_factory_returning_an_object_without_feed_and_flush_is_refused():
    with pytest.raises(ConfigError) as info:
        Pipeline(model=ScriptedModel(["ok"]), transformers=[half_done])
    assert "'half_done'" in str(info.value)
    assert "flush" in str(info.value)


def test_a_factory_is_validated_when_the_pipeline_is_built():
    built: list[str] = []

    def counted() -> Shout:
        built.append("instance")
        return Shout()

    Pipeline(model=ScriptedModel(["ok"]), transformers=[counted])
    assert built, "the factory was not called when the pipeline was built"


class AsyncFeed(Shout):
    async def feed(self, text: str) -> str:  # type: ignore[override]
        return text.upper()


class AsyncFlush(Shout):
    async def flush(self) -> str:  # type: ignore[override]
        return ""


class AsyncAnnotations(Shout):
    async def annotations(self) -> dict[str, int]:
        return {}


@pytest.mark.parametrize(
    ("build", "method"),
    [(AsyncFeed, "feed()"), (AsyncFlush, "flush()"), (AsyncAnnotations, "annotations()")],
    ids=["feed", "flush", "annotations"],
)
def test_an_async_transformer_method_is_refused_when_the_pipeline_is_built(build, method):
    """Bug: an async feed/flush/annotations passed the build and failed mid-turn, after the
    model call, leaving a coroutine never awaited; the seam is synchronous."""
    with pytest.raises(ConfigError) as info:
        Pipeline(model=ScriptedModel(["ok"]), transformers=[Factory("lookup", build)])
    message = str(info.value)
    assert ("'lookup' (transformers, position 1)" in message, method in message) == (True, True)
    assert "async" in message


def test_per_chunk_refuses_an_async_function():
    """Bug: per_chunk(async_fn) was accepted, and every chunk failed mid-turn with a coroutine
    for text."""

    async def translate(text: str) -> str:
        return text

    with pytest.raises(ConfigError, match=r"per_chunk\(.*translate\).*async"):
        per_chunk(translate)


async def test_a_coroutine_returned_by_feed_is_closed_with_the_return_error():
    """Bug: a feed that looks sync but returns a coroutine failed the turn and left the
    coroutine unclosed (a "never awaited" RuntimeWarning later, an error under -W error)."""
    made: list[object] = []

    async def lookup(text: str) -> str:
        return text

    class Deferred(Shout):
        def feed(self, text: str) -> str:
            coroutine = lookup(text)
            made.append(coroutine)
            return coroutine  # type: ignore[return-value]

    with pytest.raises(HookReturnError, match=r"'deferred'.*coroutine"):
        await pipe_with(Factory("deferred", Deferred)).run(start())
    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED]  # type: ignore[arg-type]


# -- failures during a turn ----------------------------------------------------------------


async def test_a_transformer_raising_in_feed_fails_the_turn_naming_it():
    with pytest.raises(HookFailed) as info:
        await pipe_with(shout, failing("scrubber")).run(start())
    assert (info.value.hook, info.value.stage) == ("scrubber", "transformers")
    assert "'scrubber'" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


async def test_a_transformer_raising_in_flush_fails_the_turn_naming_it():
    with pytest.raises(HookFailed) as info:
        await pipe_with(failing("closer", in_flush=True), shout).run(start())
    assert (info.value.hook, info.value.stage) == ("closer", "transformers")
    assert "'closer'" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def stamp(text: str) -> str:
    """Marks a chunk; refuses a chunk that is already marked."""
    if text.endswith("#"):
        raise ValueError("already stamped")
    return text + "#"


async def test_a_failure_names_the_position_that_raised_when_a_function_is_shared():
    pipe = pipe_with(per_chunk(stamp, name="stamp_once"), per_chunk(stamp, name="stamp_twice"))
    with pytest.raises(HookFailed) as info:
        await pipe.run(start())
    assert info.value.hook == "stamp_twice"
    assert "position 2" in str(info.value)


@pytest.mark.parametrize("in_flush", [False, True], ids=["feed", "flush"])
async def test_a_hook_error_a_transformer_raises_is_its_own_failure(in_flush: bool):
    """Bug: with several transformers, a HookError a transformer's own code raised (from a
    helper it shares with hooks, say) passed as it was, naming that helper's hook instead of
    the transformer, and so was not reported as a transformer failure; a lone transformer's
    was wrapped."""

    def check() -> None:
        raise HookReturnError("the check returned None", hook="check", stage="post")

    class Checker(Shout):
        def feed(self, text: str) -> str:
            if not in_flush:
                check()
            return text

        def flush(self) -> str:
            if in_flush:
                check()
            return ""

    with pytest.raises(HookFailed) as info:
        await pipe_with(shout, Factory("checker", Checker)).run(start())
    assert (info.value.hook, info.value.stage) == ("checker", "transformers")
    assert isinstance(info.value.__cause__, HookReturnError)


async def test_a_transformer_failure_commits_nothing():
    log = MemoryLog()
    pipe = pipe_with(failing("scrubber"))
    async with pipe.session(log=log, conversation_id="c1") as session:
        with pytest.raises(HookFailed):
            await session.send("hi")
    assert await log.entries("c1") == ()


async def test_a_transformer_failure_in_flush_commits_nothing():
    log = MemoryLog()
    pipe = pipe_with(failing("closer", in_flush=True))
    async with pipe.session(log=log, conversation_id="c1") as session:
        with pytest.raises(HookFailed):
            await session.send("hi")
    assert await log.entries("c1") == ()


async def test_a_transformer_failure_is_raised_from_the_stream():
    with pytest.raises(HookFailed, match="'scrubber'"):
        await collect(pipe_with(failing("scrubber")), start())


async def test_feed_returning_something_other_than_text_is_a_return_error():
    class Encoder(Shout):
        def feed(self, text: str) -> str:
            return text.encode()  # type: ignore[return-value]

    with pytest.raises(HookReturnError) as info:
        await pipe_with(Factory("encoder", Encoder)).run(start())
    assert (info.value.hook, info.value.stage) == ("encoder", "transformers")
    assert "'encoder'" in str(info.value)


async def test_a_return_error_never_quotes_the_text_the_transformer_was_fed():
    """Bug caught: a transformer returning bytes had its value quoted in the error and in the
    HookFailed event (which the serve page and `run --events` show), so the model's raw text
    reached them untransformed."""

    class Encoder(Shout):
        def feed(self, text: str) -> str:
            return text.encode()  # type: ignore[return-value]

    pipe = pipe_with(Factory("encoder", Encoder), replies=[["card 4111"]])
    seen: list[ev.Event] = []

    with pytest.raises(HookReturnError) as info:
        await collect_into(seen, pipe, start())
    (failed,) = [event for event in seen if isinstance(event, ev.HookFailed)]
    assert "bytes" in str(info.value)
    assert [text for text in (str(info.value), failed.error) if "4111" in text] == []


async def test_flush_returning_none_is_a_return_error():
    class Forgetful(Shout):
        def flush(self) -> str:
            return None  # type: ignore[return-value]

    with pytest.raises(HookReturnError) as info:
        await pipe_with(Factory("forgetful", Forgetful)).run(start())
    assert (info.value.hook, info.value.stage) == ("forgetful", "transformers")
    assert "'forgetful'" in str(info.value)


async def test_a_feed_failing_on_the_text_released_at_the_end_is_named_as_feed():
    """Bug caught: a transformer whose feed() raised on the text a transformer before it
    released on flush was reported as raising in flush(), a method that never ran."""

    class NoBang(Shout):
        def feed(self, text: str) -> str:
            if "!" in text:
                raise ValueError("no exclamations")
            return text

    class Exclaim(Shout):
        def flush(self) -> str:
            return "!"

    with pytest.raises(HookFailed) as info:
        await pipe_with(Factory("exclaim", Exclaim), Factory("calm", NoBang)).run(start())
    assert info.value.hook == "calm"
    assert "in feed()" in str(info.value)
    assert "flush()" not in str(info.value)


class ReadInTaskGroup:
    """A model whose stream is read by a task of its own, in a task group around the block."""

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        send, receive = anyio.create_memory_object_stream[object](4)

        async def produce() -> None:
            async with send:
                for text in ("hel", "lo"):
                    await send.send(ModelText(text))
                await send.send(ModelFinish("stop"))

        async with anyio.create_task_group() as tasks, receive:
            tasks.start_soon(produce)
            yield receive


async def test_a_transformer_failing_in_a_model_stream_with_a_task_group_is_still_named():
    """Bug caught: a transformer's failure inside a model's stream that runs a task group
    came back wrapped in an ExceptionGroup and was raised as a ProviderError blaming the
    model, with no HookFailed event naming the transformer."""
    pipe = Pipeline(model=ReadInTaskGroup(), transformers=[failing("scrubber")])
    with pytest.raises(HookFailed) as info:
        await collect(pipe, start())
    assert (info.value.hook, info.value.stage) == ("scrubber", "transformers")
    assert isinstance(info.value.__cause__, ValueError)


class Swallowing:
    """A model whose stream catches what the block raises and ends quietly, or then fails
    by itself (``fail``) with a connection error, raised apart from the caught one."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        self.calls += 1

        async def events() -> AsyncIterator[object]:
            yield ModelToolCall(ToolCall("c1", "ping", {}))
            yield ModelFinish("tool_calls")
            yield ModelText("trailing")  # a provider's chunk after the finish

        with suppress(Exception):
            yield events()
        if self.fail:
            raise ProviderConnectionError("connection reset by peer", provider="sloppy")


@tool
def ping() -> str:
    """Ping."""
    return "pong"


async def test_a_transformer_failure_the_model_swallows_still_stops_the_turn_in_that_call():
    """Bug caught: a model stream that swallowed a transformer's failure let the turn go on
    to run the tools and call the model again, which then failed with the stale HookFailed
    of the earlier call whatever the model had done."""
    model = Swallowing()
    pipe = Pipeline(model=model, tools=[ping], transformers=[failing("scrubber")])
    seen: list[ev.Event] = []
    with pytest.raises(HookFailed) as info:
        await collect_into(seen, pipe, start())
    assert (info.value.hook, isinstance(info.value.__cause__, ValueError)) == ("scrubber", True)
    assert model.calls == 1
    assert [type(e) for e in seen] == [ev.TurnStarted, ev.ModelCalled, ev.HookFailed]


async def test_a_model_failing_by_itself_after_swallowing_a_transformer_failure_is_its_own():
    """Bug caught: a model that swallowed a transformer's failure and then failed on its own
    (a connection error) was reported as the transformer's HookFailed, hiding the
    ProviderConnectionError."""
    pipe = Pipeline(model=Swallowing(fail=True), transformers=[failing("scrubber")])
    seen: list[ev.Event] = []
    with pytest.raises(ProviderConnectionError, match="connection reset by peer"):
        await collect_into(seen, pipe, start())
    failed = [e for e in seen if isinstance(e, ev.HookFailed)]
    assert [(e.hook, e.stage) for e in failed] == [("scrubber", "transformers")]


class FailingBeside:
    """A model whose stream's own task fails as the block's failure cancels it."""

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        send, receive = anyio.create_memory_object_stream[object](4)

        async def produce() -> None:
            async with send:
                await send.send(ModelText("hello"))
                try:
                    await anyio.sleep_forever()
                finally:
                    # Closing the connection fails as the task is cancelled.
                    raise ProviderConnectionError("connection reset by peer", provider="x")

        async with anyio.create_task_group() as tasks, receive:
            tasks.start_soon(produce)
            yield receive


async def test_a_model_error_beside_a_transformer_failure_in_one_group_is_not_dropped():
    """Bug caught: an ExceptionGroup holding a transformer's failure and the model's own
    connection error was raised as the transformer's HookFailed, the model's error dropped."""
    pipe = Pipeline(model=FailingBeside(), transformers=[failing("scrubber")])
    seen: list[ev.Event] = []
    with pytest.raises(ProviderError) as info:
        await collect_into(seen, pipe, start())
    group = info.value.__cause__
    assert isinstance(group, BaseExceptionGroup)
    assert group.subgroup(ProviderConnectionError) is not None
    assert group.subgroup(HookFailed) is not None
    assert [(e.hook, e.stage) for e in seen if isinstance(e, ev.HookFailed)] == [
        ("scrubber", "transformers")
    ]


class RaisingFrom:
    """A model whose stream raises an error of its own from what the block raised."""

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        async def events() -> AsyncIterator[object]:
            yield ModelText("hello")
            yield ModelFinish("stop")

        try:
            yield events()
        except Exception as exc:
            raise RuntimeError("the stream was abandoned") from exc


async def test_a_model_error_raised_from_a_transformer_failure_is_the_transformers():
    """A model's error raised from the transformer's failure (its ``__cause__``) is the
    transformer's failure, raised as its HookFailed."""
    pipe = Pipeline(model=RaisingFrom(), transformers=[failing("scrubber")])
    with pytest.raises(HookFailed) as info:
        await collect(pipe, start())
    assert (info.value.hook, info.value.stage) == ("scrubber", "transformers")


class RaisingAfter:
    """A model whose stream cleans up after what the block raised and raises an error of its
    own, not from it: the transformer's failure is only its ``__context__``."""

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        async def events() -> AsyncIterator[object]:
            yield ModelText("hello")
            yield ModelFinish("stop")

        try:
            yield events()
        except Exception:
            raise ProviderError("stream abandoned by the caller", provider="mine")


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "stream"])
async def test_a_model_error_after_a_transformer_failure_names_the_transformer(streamed):
    """Bug caught: a model that raised its own error after a transformer failed in its stream
    (the failure only its __context__) hid which transformer failed from run()'s caller."""
    pipe = Pipeline(model=RaisingAfter(), transformers=[failing("scrubber")])
    seen: list[ev.Event] = []
    with pytest.raises(ProviderError, match="stream abandoned") as info:
        await (collect_into(seen, pipe, start()) if streamed else pipe.run(start()))
    assert info.value.__notes__ == ["after stream transformer 'scrubber' failed: ValueError"]
    assert [(e.hook, e.error) for e in seen if isinstance(e, ev.HookFailed)] == (
        [("scrubber", "ValueError")] if streamed else []
    )


# -- run and stream -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "transformers",
    [
        pytest.param([shout], id="stateless"),
        pytest.param([Factory("hold_last", HoldLast), shout], id="holding"),
        pytest.param([redact(r"[\w.+-]+@[\w-]+\.[\w.]+")], id="redact"),
    ],
)
async def test_run_and_stream_give_the_same_reply_text(transformers):
    replies = [["mail jo", "e@exa", "mple.com now"]]
    ran = await pipe_with(*transformers, replies=replies).run(start())
    events, streamed = await collect(pipe_with(*transformers, replies=replies), start())
    assert ran.reply is not None
    assert streamed.reply is not None
    assert ran.reply.text == streamed.reply.text
    assert "".join(text for text, _ in deltas(events)) == streamed.reply.text


# -- names and arity, checked when built ------------------------------------------------------


def test_two_transformers_with_the_same_name_are_refused_naming_both_positions():
    # Their annotations share Reply.annotations, under the name.
    with pytest.raises(ConfigError) as info:
        Pipeline(
            model=ScriptedModel(["ok"]),
            transformers=[Factory("scrub", Shout), shout, Factory("scrub", HoldLast)],
        )
    message = str(info.value)
    assert "'scrub'" in message
    assert re.search(r"\b1\b", message)
    assert re.search(r"\b3\b", message)


def test_two_per_chunk_lambdas_are_refused_with_per_chunks_own_name_option_as_the_fix():
    """Catches: two `per_chunk(lambda ...)`, both named '<lambda>', refused with the fix
    "redact(..., name='redact_phone')" and the reason that their annotations would overwrite
    each other, when per_chunk has neither redact's options nor annotations."""
    with pytest.raises(ConfigError) as info:
        Pipeline(
            model=ScriptedModel(["ok"]),
            transformers=[per_chunk(lambda text: text.upper()), per_chunk(lambda text: text)],
        )

    message = str(info.value)
    assert message.startswith("transformers, positions 1 and 2: both are named '")
    assert message.endswith(
        ".<lambda>', and a transformer's name keys its annotations in Reply.annotations and"
        " names it in errors — give one another name (e.g. per_chunk(fn, name='shout'))"
    )


class FeedNotAMethod:
    feed = "text"

    def flush(self):
        return ""


class FeedWithoutText:
    def feed(self):
        return ""

    def flush(self):
        return ""


class FlushWithAnArgument:
    def feed(self, text):
        return text

    def flush(self, final):
        return ""


class AnnotationsWithAnArgument:
    def feed(self, text):
        return text

    def flush(self):
        return ""

    def annotations(self, reply):
        return {}


@pytest.mark.parametrize(
    ("factory", "problem"),
    [
        (FeedNotAMethod, "feed is str 'text', not a method"),
        (FeedWithoutText, "feed cannot be called with one chunk of text: too many positional"),
        (FlushWithAnArgument, "flush cannot be called with no arguments: missing a required"),
        (AnnotationsWithAnArgument, "annotations cannot be called with no arguments: missing"),
    ],
)
def test_a_transformer_whose_methods_cannot_be_called_so_is_refused_when_built(factory, problem):
    """Catches: a transformer whose feed, flush or annotations cannot be called as the seam
    calls it accepted by the Pipeline and failing every turn after the model was called."""
    with pytest.raises(ConfigError) as info:
        Pipeline(model=ScriptedModel(["ok"]), transformers=[factory])

    assert str(info.value).startswith(
        f"transformer '{factory.__name__}' (transformers, position 1): {problem}"
    )


@pytest.mark.parametrize(
    "fn",
    [pytest.param(lambda a, b: a, id="two-arguments"), pytest.param(lambda: "", id="none")],
)
def test_per_chunk_refuses_a_function_that_cannot_take_one_chunk(fn):
    with pytest.raises(ConfigError, match="per_chunk"):
        per_chunk(fn)


# -- a failure is an event before it is raised ------------------------------------------------


@pytest.mark.parametrize(
    ("in_flush", "expected"),
    [
        pytest.param(
            False,
            [ev.TurnStarted, ev.ModelCalled, ev.HookFailed],
            id="feed",
        ),
        pytest.param(
            True,
            [ev.TurnStarted, ev.ModelCalled, ev.TextDelta, ev.TextDelta, ev.HookFailed],
            id="flush",
        ),
    ],
)
async def test_a_transformer_failure_is_an_enforced_hook_failed_event_before_it_is_raised(
    in_flush, expected
):
    seen: list[ev.Event] = []
    pipe = pipe_with(failing("scrubber", in_flush=in_flush))

    with pytest.raises(HookFailed, match="'scrubber'"):
        await collect_into(seen, pipe, start())

    assert [type(event) for event in seen] == expected
    assert seen[-1] == ev.HookFailed(TURN_REF, "scrubber", "transformers", "ValueError", True)


async def test_a_factory_failing_for_an_attempt_is_the_transformers_hook_failed():
    """Bug: a factory that passed the build's probe but raised when an attempt made its
    instance (a pool exhausted, say) failed the turn with its bare exception, no
    PipelineError and no HookFailed event naming the transformer."""
    built = []

    def make() -> Shout:
        if built:
            raise RuntimeError("pool exhausted")
        return Shout()

    pipe = pipe_with(Factory("pooled", make))
    built.append(True)  # the build's probes are over
    seen: list[ev.Event] = []

    with pytest.raises(HookFailed, match=r"'pooled'.*its factory") as info:
        await collect_into(seen, pipe, start())

    assert isinstance(info.value.__cause__, RuntimeError)
    assert seen[-1] == ev.HookFailed(TURN_REF, "pooled", "transformers", "RuntimeError", True)


# -- tool steps: one instance per attempt, flushed after every model call --------------------


async def test_each_model_call_of_a_tool_loop_is_redacted_and_flushed_into_its_own_message():
    @tool
    def lookup(name: str) -> str:
        return "found"

    model = ScriptedModel(
        [
            ["Mail ana@exa", "mple.com", ToolCall("c1", "lookup", {"name": "ana"})],
            ["Reply to bo@exam", "ple.org now"],
        ]
    )
    pipe = Pipeline(model=model, tools=[lookup], transformers=[redact([r"\w+@\w+\.\w+"])])

    result = await pipe.run(start())

    first, _, final = result.reply.messages
    assert first.text == "Mail [REDACTED]"
    assert final.text == "Reply to [REDACTED] now"
    # What the model is sent back is the transformed text too.
    assert model.requests[1].messages[-2].text == "Mail [REDACTED]"
    assert result.reply.annotations["redact"] == {"redactions": 2}


# -- a huge chunk ---------------------------------------------------------------------------


async def test_a_huge_chunk_is_transformed_without_holding_the_event_loop():
    """Catches: a 20 MB chunk redacted in one transformer call, which stops every other task
    of the loop (other turns, timeouts, cancellation) for as long as the redaction takes.

    A ticker task sleeps 1 ms at a time while the turn runs; the longest gap between its
    ticks is how long the loop was held. The bound is generous (a loaded machine preempts the
    process now and then); redacting the chunk in one call takes several times as long.
    """
    line = "please write to jo.doe@example.com today, "
    copies = 20_000_000 // len(line)
    pipe = Pipeline(model=ScriptedModel([line * copies]), transformers=[pii()])
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        await anyio.sleep(0.01)
        result = await pipe.run(start())
        group.cancel_scope.cancel()
    assert result.reply.text == "please write to [EMAIL] today, " * copies
    assert result.reply.annotations["pii"] == {"redactions": copies}
    assert len(gaps) > 10
    assert max(gaps) < 0.25, f"the loop was held for {max(gaps):.3f} s"
