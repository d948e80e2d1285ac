"""pipeline.logs: the Log protocol and MemoryLog (load, append, entries, conflicts)."""

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import LogConflict, Pipeline, PipelineError
from pipeline.logs import Log, LogEntry, MemoryLog
from pipeline.testing import ScriptedModel
from turns import Context, Message, Text, ToolCall, ToolResult, Turn

CONVERSATION = "conv-1"


def exchange(question: str, answer: str) -> tuple[Message, ...]:
    return (Message.user(question), Message.assistant(answer))


async def audit_of(text: str):
    """A real audit record: the one a completed turn produces."""
    result = await Pipeline(model=ScriptedModel(["ok"])).run(Turn.start(text))
    return result.audit


# -- the protocol ---------------------------------------------------------------------------


def test_memory_log_is_a_log():
    assert isinstance(MemoryLog(), Log)


def test_an_object_without_append_is_not_a_log():
    class ReadOnly:
        async def load(self, conversation_id):
            return Context()

    assert not isinstance(ReadOnly(), Log)


def test_log_conflict_is_a_pipeline_error():
    assert issubclass(LogConflict, PipelineError)


# -- load -----------------------------------------------------------------------------------


async def test_loading_an_unknown_conversation_gives_an_empty_context():
    assert await MemoryLog().load("never-seen") == Context()


async def test_load_returns_what_was_appended_in_order():
    log = MemoryLog()
    first, second = exchange("hi", "hello"), exchange("how are you?", "fine")

    await log.append(CONVERSATION, "turn-1", first)
    await log.append(CONVERSATION, "turn-2", second)

    assert await log.load(CONVERSATION) == Context(messages=(*first, *second))


async def test_load_keeps_part_and_message_meta():
    log = MemoryLog()
    messages = (
        Message.user(
            [Text("note", meta={"injected_by": "memory"}), Text("hi")], meta={"client": "web"}
        ),
        Message.assistant(
            [
                Text("let me look", meta={"provider": {"signature": "abc"}}),
                ToolCall("call_1", "search", {"q": "tea"}, meta={"cache": True}),
            ]
        ),
        Message.tool(ToolResult("call_1", "found", meta={"source": "db"})),
    )

    await log.append(CONVERSATION, "turn-1", messages)

    loaded = await log.load(CONVERSATION)
    assert loaded.messages == messages
    assert [m.meta for m in loaded.messages] == [{"client": "web"}, {}, {}]
    assert [[p.meta for p in m.parts] for m in loaded.messages] == [
        [{"injected_by": "memory"}, {}],
        [{"provider": {"signature": "abc"}}, {"cache": True}],
        [{"source": "db"}],
    ]


async def test_conversations_are_kept_apart():
    log = MemoryLog()

    await log.append("a", "turn-1", exchange("to a", "from a"))
    await log.append("b", "turn-2", exchange("to b", "from b"))

    assert await log.load("a") == Context(messages=exchange("to a", "from a"))
    assert await log.load("b") == Context(messages=exchange("to b", "from b"))


async def test_append_keeps_its_own_copy_of_the_messages():
    log = MemoryLog()
    messages = list(exchange("hi", "hello"))

    await log.append(CONVERSATION, "turn-1", messages)
    messages.append(Message.user("added later"))

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


# -- idempotency per turn_ref ---------------------------------------------------------------


async def test_appending_the_same_turn_ref_twice_commits_once():
    log = MemoryLog()

    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


async def test_a_repeated_turn_ref_keeps_the_first_commit_whatever_the_second_holds():
    log = MemoryLog()

    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    await log.append(CONVERSATION, "turn-1", exchange("other", "text"))

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


async def test_a_repeated_turn_ref_with_a_stale_expected_length_is_a_no_op_not_a_conflict():
    log = MemoryLog()
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)

    # A retry of a commit that already happened: the length it expected is now stale.
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))


# -- expected_length ------------------------------------------------------------------------


async def test_append_with_the_right_expected_length_commits():
    log = MemoryLog()
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), expected_length=0)

    await log.append(CONVERSATION, "turn-2", exchange("again", "sure"), expected_length=2)

    loaded = await log.load(CONVERSATION)
    assert loaded.messages == (*exchange("hi", "hello"), *exchange("again", "sure"))


@pytest.mark.parametrize("expected_length", [0, 1, 3])
async def test_a_wrong_expected_length_raises_log_conflict_naming_the_conversation(
    expected_length,
):
    log = MemoryLog()
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))

    with pytest.raises(LogConflict) as excinfo:
        await log.append(
            CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=expected_length
        )

    assert CONVERSATION in str(excinfo.value)


async def test_a_conflict_writes_nothing():
    log = MemoryLog()
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    before = await log.entries(CONVERSATION)

    with pytest.raises(LogConflict):
        await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=0)

    assert await log.load(CONVERSATION) == Context(messages=exchange("hi", "hello"))
    assert await log.entries(CONVERSATION) == before


async def test_a_conflicted_turn_ref_can_commit_later_with_the_right_length():
    log = MemoryLog()
    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"))
    with pytest.raises(LogConflict):
        await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=0)

    await log.append(CONVERSATION, "turn-2", exchange("late", "writer"), expected_length=2)

    loaded = await log.load(CONVERSATION)
    assert loaded.messages == (*exchange("hi", "hello"), *exchange("late", "writer"))


async def test_expected_length_zero_on_an_unknown_conversation_commits():
    log = MemoryLog()

    await log.append("fresh", "turn-1", exchange("hi", "hello"), expected_length=0)

    assert await log.load("fresh") == Context(messages=exchange("hi", "hello"))


# -- entries: the audit beside the messages -------------------------------------------------


async def test_entries_keep_each_commit_with_its_audit_record():
    log = MemoryLog()
    audit = await audit_of("hi")

    await log.append(CONVERSATION, "turn-1", exchange("hi", "hello"), audit)
    await log.append(CONVERSATION, "turn-1:summary", (Message.user("summary"),))

    assert await log.entries(CONVERSATION) == (
        LogEntry("turn-1", exchange("hi", "hello"), audit),
        LogEntry("turn-1:summary", (Message.user("summary"),), None),
    )


async def test_entries_of_an_unknown_conversation_are_empty():
    assert await MemoryLog().entries("never-seen") == ()


# -- conversation ids -----------------------------------------------------------------------


BAD_IDS = [pytest.param("", id="empty"), pytest.param(None, id="none"), pytest.param(7, id="int")]


@pytest.mark.parametrize("conversation_id", BAD_IDS)
async def test_load_rejects_a_bad_conversation_id(conversation_id):
    with pytest.raises(ValueError, match="conversation id"):
        await MemoryLog().load(conversation_id)


@pytest.mark.parametrize("conversation_id", BAD_IDS)
async def test_append_rejects_a_bad_conversation_id(conversation_id):
    with pytest.raises(ValueError, match="conversation id"):
        await MemoryLog().append(conversation_id, "turn-1", exchange("hi", "hello"))


@pytest.mark.parametrize("conversation_id", BAD_IDS)
async def test_entries_rejects_a_bad_conversation_id(conversation_id):
    with pytest.raises(ValueError, match="conversation id"):
        await MemoryLog().entries(conversation_id)


# -- the law: the log behaves like a list of commits per conversation -----------------------


appends = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # conversation
        st.sampled_from(["t1", "t2", "t3", "t4", "t5"]),  # turn_ref: repeats are likely
        st.integers(min_value=0, max_value=3),  # how many messages
        st.one_of(st.none(), st.integers(min_value=0, max_value=8)),  # expected_length
    ),
    max_size=25,
)


@settings(max_examples=200)
@given(appends)
def test_any_sequence_of_appends_loads_like_a_simple_model(steps):
    async def main():
        log = MemoryLog()
        model: dict[str, list[tuple[str, tuple[Message, ...]]]] = {"a": [], "b": []}
        for index, (conversation, turn_ref, count, expected) in enumerate(steps):
            messages = tuple(Message.user(f"{turn_ref} #{index}.{n}") for n in range(count))
            commits = model[conversation]
            length = sum(len(m) for _, m in commits)
            if any(ref == turn_ref for ref, _ in commits):
                conflict = False  # already committed: a no-op
            elif expected is not None and expected != length:
                conflict = True
            else:
                conflict = False
                commits.append((turn_ref, messages))
            if conflict:
                with pytest.raises(LogConflict):
                    await log.append(conversation, turn_ref, messages, expected_length=expected)
            else:
                await log.append(conversation, turn_ref, messages, expected_length=expected)
        for conversation, commits in model.items():
            loaded = await log.load(conversation)
            assert loaded == Context(messages=tuple(m for _, ms in commits for m in ms))
            entries = await log.entries(conversation)
            assert [(e.turn_ref, e.messages) for e in entries] == commits

    trio.run(main)
