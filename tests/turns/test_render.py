"""render: the placement rule (system, untouched history, injections at the tail, user)."""

import attrs
from hypothesis import given
from hypothesis import strategies as st

from tests.turns.strategies import injections, messages, parts, texts, user_messages
from turns import (
    Context,
    Injection,
    Message,
    Part,
    Scope,
    Text,
    ToolCall,
    ToolResult,
    Turn,
    render,
)

HISTORY = (
    Message.user("What's the weather?"),
    Message.assistant([ToolCall("call-0", "weather", {"city": "Oslo"})]),
    Message.tool(ToolResult("call-0", "rain")),
    Message.assistant("It rains in Oslo."),
)


def turn_with(*injected: Injection, system: str | None = None) -> Turn:
    turn = Turn.start("And tomorrow?", context=Context(messages=HISTORY, system=system))
    return attrs.evolve(turn, injections=injected)


def role_and_parts(message: Message) -> tuple[str, tuple[Part, ...]]:
    return message.role, message.parts


# --- system and history -------------------------------------------------------------------


def test_without_system_or_injections_it_is_the_history_then_the_user_message() -> None:
    turn = turn_with()

    assert render(turn) == (*HISTORY, turn.user_message)


def test_the_system_prompt_comes_first_as_a_system_message() -> None:
    assert render(turn_with(system="Be brief."))[0] == Message.system("Be brief.")


def test_system_then_history_then_user_message() -> None:
    turn = turn_with(system="Be brief.")

    assert render(turn) == (Message.system("Be brief."), *HISTORY, turn.user_message)


def test_an_empty_turn_renders_only_the_user_message() -> None:
    turn = Turn.start("hi")

    assert render(turn) == (turn.user_message,)


@given(
    st.none() | texts,
    st.lists(messages(), max_size=5).map(tuple),
    st.lists(injections(), max_size=4).map(tuple),
    user_messages(),
)
def test_the_system_message_and_history_are_an_untouched_prefix(
    system: str | None,
    history: tuple[Message, ...],
    injected: tuple[Injection, ...],
    user: Message,
) -> None:
    turn = Turn(Context(messages=history, system=system), user, "ref", Scope())
    turn = attrs.evolve(turn, injections=injected)
    head = (Message.system(system),) if system is not None else ()

    assert render(turn)[: len(head) + len(history)] == (*head, *history)


@given(
    st.lists(messages(), max_size=5).map(tuple),
    st.lists(injections(), max_size=4).map(tuple),
    user_messages(),
)
def test_the_last_message_is_a_user_message_ending_with_the_users_own_parts(
    history: tuple[Message, ...], injected: tuple[Injection, ...], user: Message
) -> None:
    turn = attrs.evolve(Turn.start(user, context=Context(messages=history)), injections=injected)

    last = render(turn)[-1]

    assert (last.role, last.parts[len(last.parts) - len(user.parts) :]) == ("user", user.parts)


@given(
    st.lists(messages(), max_size=5).map(tuple),
    st.lists(injections(), max_size=4).map(tuple),
)
def test_post_stage_injections_change_nothing_that_is_rendered(
    history: tuple[Message, ...], injected: tuple[Injection, ...]
) -> None:
    turn = Turn.start("hi", context=Context(messages=history))
    before_post = tuple(injection for injection in injected if injection.stage != "post")

    assert render(attrs.evolve(turn, injections=injected)) == render(
        attrs.evolve(turn, injections=before_post)
    )


@given(st.lists(injections(stages=("pre", None)), max_size=4).map(tuple))
def test_injected_text_parts_lead_the_user_message_in_injection_order(
    injected: tuple[Injection, ...],
) -> None:
    turn = attrs.evolve(Turn.start("hi"), injections=injected)
    injected_text = tuple(
        part for injection in injected for part in injection.parts if isinstance(part, Text)
    )

    assert render(turn)[-1].parts == (*injected_text, Text("hi"))


# --- injected text ------------------------------------------------------------------------


def test_injected_text_goes_before_the_users_parts_in_one_user_message() -> None:
    turn = turn_with(Injection((Text("Today is Monday."),), "add_today", False, "pre"))

    assert render(turn)[len(HISTORY) :] == (
        Message("user", (Text("Today is Monday."), Text("And tomorrow?"))),
    )


def test_several_injections_text_is_placed_in_injection_order() -> None:
    turn = turn_with(
        Injection((Text("first"), Text("second")), "a", False, "pre"),
        Injection((Text("third"),), "b", True, "pre"),
    )

    assert render(turn)[-1].parts == (
        Text("first"),
        Text("second"),
        Text("third"),
        Text("And tomorrow?"),
    )


def test_injected_text_keeps_its_meta() -> None:
    marked = Text("from the docs", {"source": "retrieval"})
    turn = turn_with(Injection((marked,), "search_docs", False, "pre"))

    assert render(turn)[-1].parts[0] == marked


def test_the_user_message_keeps_its_meta_when_text_is_injected() -> None:
    user = Message.user("hi", meta={"client": "web"})
    turn = Turn.start(user).inject("note")

    assert render(turn)[-1].meta == {"client": "web"}


def test_injections_add_only_one_user_message() -> None:
    turn = turn_with(
        Injection((Text("a"),), "x", False, "pre"),
        Injection((Text("b"),), "y", False, "pre"),
    )

    assert [message.role for message in render(turn)[len(HISTORY) :]] == ["user"]


def test_the_turn_user_message_itself_is_not_changed_by_rendering() -> None:
    turn = Turn.start("hi").inject("note")

    render(turn)

    assert turn.user_message == Message.user("hi")


# --- injected tool exchanges --------------------------------------------------------------


CALL = ToolCall("call-1", "get_preferences", {"user": "current"})
RESULT = ToolResult("call-1", '{"units": "metric"}')


def test_an_injected_pair_becomes_a_tool_call_and_a_tool_message_before_the_user() -> None:
    turn = turn_with(Injection((CALL, RESULT), "prefs", True, "pre"))

    assert [role_and_parts(message) for message in render(turn)[len(HISTORY) :]] == [
        ("assistant", (CALL,)),
        ("tool", (RESULT,)),
        ("user", (Text("And tomorrow?"),)),
    ]


def test_an_injected_pair_is_placed_after_the_system_message_and_history() -> None:
    turn = turn_with(Injection((CALL, RESULT), "prefs", True, "pre"), system="Be brief.")

    assert render(turn)[: 1 + len(HISTORY)] == (Message.system("Be brief."), *HISTORY)


def test_pairs_from_several_injections_keep_injection_order() -> None:
    call_2 = ToolCall("call-2", "get_time", {})
    result_2 = ToolResult("call-2", "09:00")
    turn = turn_with(
        Injection((CALL, RESULT), "prefs", True, "pre"),
        Injection((call_2, result_2), "clock", False, "pre"),
    )

    assert [role_and_parts(message) for message in render(turn)[len(HISTORY) :]] == [
        ("assistant", (CALL,)),
        ("tool", (RESULT,)),
        ("assistant", (call_2,)),
        ("tool", (result_2,)),
        ("user", (Text("And tomorrow?"),)),
    ]


def test_text_and_a_pair_in_one_injection_split_between_the_exchange_and_the_user() -> None:
    turn = turn_with(Injection((Text("Preferences:"), CALL, RESULT), "prefs", True, "pre"))

    assert [role_and_parts(message) for message in render(turn)[len(HISTORY) :]] == [
        ("assistant", (CALL,)),
        ("tool", (RESULT,)),
        ("user", (Text("Preferences:"), Text("And tomorrow?"))),
    ]


def test_tool_exchanges_come_before_text_from_an_earlier_injection() -> None:
    turn = turn_with(
        Injection((Text("Today is Monday."),), "add_today", False, "pre"),
        Injection((CALL, RESULT), "prefs", True, "pre"),
    )

    assert [role_and_parts(message) for message in render(turn)[len(HISTORY) :]] == [
        ("assistant", (CALL,)),
        ("tool", (RESULT,)),
        ("user", (Text("Today is Monday."), Text("And tomorrow?"))),
    ]


# --- stages -------------------------------------------------------------------------------


def test_post_stage_text_injections_are_not_rendered() -> None:
    turn = turn_with(Injection((Text("summary so far"),), "write_summary", True, "post"))

    assert render(turn) == (*HISTORY, turn.user_message)


def test_post_stage_tool_pairs_are_not_rendered() -> None:
    turn = turn_with(Injection((CALL, RESULT), "prefs", True, "post"))

    assert render(turn) == (*HISTORY, turn.user_message)


def test_only_the_pre_stage_injections_are_rendered_when_stages_are_mixed() -> None:
    turn = turn_with(
        Injection((Text("pre note"),), "a", False, "pre"),
        Injection((Text("post note"),), "b", False, "post"),
    )

    assert render(turn)[-1].parts == (Text("pre note"), Text("And tomorrow?"))


@given(st.lists(parts(), min_size=1, max_size=4).map(tuple))
def test_an_unstamped_injection_renders_as_a_pre_stage_one(injected: tuple[Part, ...]) -> None:
    turn = turn_with()

    unstamped = attrs.evolve(turn, injections=(Injection(injected),))
    stamped = attrs.evolve(turn, injections=(Injection(injected, "hook", False, "pre"),))

    assert render(unstamped) == render(stamped)


def test_an_injection_made_with_inject_is_rendered() -> None:
    turn = Turn.start("hi").inject("Today is Monday.")

    assert render(turn) == (Message.user([Text("Today is Monday."), Text("hi")]),)


def test_a_turn_continuing_from_tool_results_sends_them_right_after_their_calls() -> None:
    """Catches: injections placed between the tool calls and their results (the provider
    refuses a tool message that does not follow its call), or injected text merged into the
    tool message."""
    calls = Message.assistant((ToolCall("c1", "weather", {}),))
    results = Message("tool", (ToolResult("c1", "sunny"),))
    turn = Turn.start(results, context=Context(messages=(Message.user("q"), calls)))
    pair = (ToolCall("p1", "prefs", {}), ToolResult("p1", "tea"))
    turn = attrs.evolve(
        turn,
        injections=(
            Injection((Text("note"),), "a", False, "pre"),
            Injection(pair, "b", False, "pre"),
            Injection((Text("later"),), "c", False, "post"),
        ),
    )
    assert render(turn) == (
        Message.user("q"),
        calls,
        results,
        Message("assistant", (pair[0],)),
        Message.tool(pair[1]),
        Message("user", (Text("note"),)),
    )
