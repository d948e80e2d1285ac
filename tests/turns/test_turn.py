"""Turn: `start` defaults and errors, `inject`, `with_request` (narrowing), `assign`, and
the `Stamper` that stamps what `inject` adds while a hook runs."""

import re
import string

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.turns.strategies import identifiers, injectable_parts, json_values, names
from turns import (
    Context,
    Injection,
    Message,
    Part,
    Reply,
    RequestOptions,
    Scope,
    Stage,
    Stamper,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    Usage,
)

TOOLS = ("search", "calculator", "weather", "calendar")


def turn_with_tools(*tool_names: str) -> Turn:
    return Turn.start("hi", context=Context(tools=tuple(ToolSpec(name) for name in tool_names)))


# --- Turn.start ---------------------------------------------------------------------------


def test_start_from_a_string_makes_a_user_message() -> None:
    assert Turn.start("hi").user_message == Message.user("hi")


def test_start_from_a_user_message_keeps_that_message() -> None:
    message = Message.user([Text("look at this"), Text("please")], meta={"client": "web"})

    assert Turn.start(message).user_message == message


def test_start_gives_an_empty_context_by_default() -> None:
    assert Turn.start("hi").context == Context()


def test_start_gives_an_empty_scope_by_default() -> None:
    assert Turn.start("hi").scope == Scope()


def test_start_has_no_injections() -> None:
    assert Turn.start("hi").injections == ()


def test_start_has_default_request_options() -> None:
    assert Turn.start("hi").request == RequestOptions()


def test_start_has_no_reply() -> None:
    assert Turn.start("hi").reply is None


def test_start_turn_ref_defaults_to_a_hex_id() -> None:
    turn_ref = Turn.start("hi").turn_ref

    assert turn_ref
    assert set(turn_ref) <= set(string.hexdigits)


def test_start_turn_ref_is_fresh_for_every_turn() -> None:
    refs = {Turn.start("hi").turn_ref for _ in range(50)}

    assert len(refs) == 50


def test_start_keeps_the_given_context_scope_and_turn_ref() -> None:
    context = Context(messages=(Message.user("a"), Message.assistant("b")), system="Be brief.")
    scope = Scope(current_user="ada", assigns={"plan": "pro"})

    turn = Turn.start("hi", context=context, scope=scope, turn_ref="ref-1")

    assert (turn.context, turn.scope, turn.turn_ref) == (context, scope, "ref-1")


@pytest.mark.parametrize(
    "message", [Message.assistant("hello"), Message.system("rules")], ids=["assistant", "system"]
)
def test_start_rejects_a_message_that_is_not_from_the_user_naming_its_role(
    message: Message,
) -> None:
    with pytest.raises(ValueError, match=message.role):
        Turn.start(message)


ASKED = Context(
    messages=(
        Message.user("weather and time?"),
        Message.assistant((ToolCall("c1", "weather", {}), ToolCall("c2", "clock", {}))),
    )
)


def test_start_from_tool_results_continues_from_the_calls_they_answer() -> None:
    """Catches: a turn continuing from tool results refused, or its results reordered."""
    results = Message("tool", (ToolResult("c2", "12:00"), ToolResult("c1", "sunny")))
    turn = Turn.start(results, context=ASKED)
    assert turn.user_message is results
    assert turn.context is ASKED


@pytest.mark.parametrize(
    ("results", "context", "says"),
    [
        ((ToolResult("c1", "x"), ToolResult("c9", "y")), ASKED, "'c9' answers no tool call"),
        ((ToolResult("c1", "x"),), ASKED, "['c2'] have no result"),
        (
            (ToolResult("c1", "x"), ToolResult("c1", "x"), ToolResult("c2", "y")),
            ASKED,
            "'c1' is answered twice",
        ),
        ((ToolResult("c1", "x"), Text("y")), ASKED, "only ToolResult parts, got Text"),
        ((ToolResult("c1", "x"),), None, "needs the tool calls they answer"),
        (
            (ToolResult("c1", "x"),),
            Context(messages=(Message.user("q"), Message.assistant("no calls"))),
            "needs the tool calls they answer",
        ),
    ],
)
def test_start_rejects_tool_results_that_do_not_answer_the_last_calls_naming_the_call(
    results: tuple[Part, ...], context: Context | None, says: str
) -> None:
    """Catches: tool results sent to a model that never asked for them, or leaving a call
    unanswered (the provider refuses both, mid-turn and with a less helpful message)."""
    with pytest.raises(ValueError, match=re.escape(says)):
        Turn.start(Message("tool", results), context=context)


class _CountedId(str):
    """A call id that counts the comparisons made with it: the work of a check, untimed."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_start_checks_many_tool_results_in_linear_time() -> None:
    """Catches: the results of a tool message checked against the calls (and each other)
    with list lookups, quadratic in their number: a client answering 20,000 calls held
    the event loop for about 17 s."""
    count = 400
    calls = [ToolCall(_CountedId(f"c{i}"), "lookup", {}) for i in range(count)]
    context = Context(messages=(Message.user("look them up"), Message.assistant(calls)))
    results = Message("tool", [ToolResult(_CountedId(f"c{i}"), "ok") for i in range(count)])
    _CountedId.compared = 0

    Turn.start(results, context=context)

    assert _CountedId.compared <= 4 * count


def test_a_long_list_of_unanswered_calls_is_cut_in_the_message() -> None:
    """Catches: the error for a tool message leaving calls unanswered listing every one
    of thousands of ids."""
    calls = [ToolCall(f"c{i}", "lookup", {}) for i in range(30)]
    context = Context(messages=(Message.user("look them up"), Message.assistant(calls)))

    with pytest.raises(ValueError, match=re.escape("'c10'] and 19 more have no result")):
        Turn.start(Message("tool", [ToolResult("c0", "ok")]), context=context)


@pytest.mark.parametrize(
    ("value", "type_name"), [(42, "int"), (Text("hi"), "Text"), (None, "NoneType")]
)
def test_start_rejects_what_is_neither_text_nor_a_message_naming_its_type(
    value: object, type_name: str
) -> None:
    with pytest.raises(TypeError, match=type_name):
        Turn.start(value)  # type: ignore[arg-type]


# --- Turn.inject --------------------------------------------------------------------------


def test_inject_turns_strings_into_text_parts() -> None:
    turn = Turn.start("hi").inject("Today is Monday.", "Be kind.")

    assert turn.injections[-1].parts == (Text("Today is Monday."), Text("Be kind."))


@given(injectable_parts())
def test_inject_keeps_the_parts_in_order_as_a_tuple(items: list[Part]) -> None:
    assert Turn.start("hi").inject(*items).injections == (Injection(tuple(items)),)


def test_inject_leaves_the_injection_unstamped() -> None:
    injection = Turn.start("hi").inject("note").injections[0]

    assert (injection.source, injection.durable, injection.stage) == (None, False, None)


def test_inject_mixes_strings_and_parts_in_order() -> None:
    call = ToolCall("call-1", "search", {"q": "x"})
    result = ToolResult("call-1", "found")

    turn = Turn.start("hi").inject("before", call, result, "after")

    assert turn.injections[0].parts == (Text("before"), call, result, Text("after"))


def test_inject_appends_one_injection_per_call_in_order() -> None:
    turn = Turn.start("hi").inject("first").inject("second", "third")

    assert turn.injections == (
        Injection((Text("first"),)),
        Injection((Text("second"), Text("third"))),
    )


def test_inject_leaves_the_original_turn_unchanged() -> None:
    turn = Turn.start("hi")

    turn.inject("note")

    assert turn.injections == ()


def test_inject_changes_nothing_but_the_injections() -> None:
    turn = Turn.start("hi", turn_ref="ref-1").assign(plan="pro")

    injected = turn.inject("note")

    assert attrs.evolve(injected, injections=()) == turn


@pytest.mark.parametrize(
    ("bad", "type_name"),
    [(42, "int"), (Message.user("x"), "Message"), (b"bytes", "bytes"), (["a"], "list")],
    ids=["int", "Message", "bytes", "list"],
)
def test_inject_rejects_what_is_not_a_part_naming_its_type(bad: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=type_name):
        Turn.start("hi").inject("ok", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "part",
    [Text("a", meta=[("k", 1)]), ToolResult("c", "r", meta="provider data")],
    ids=["lone-text", "result"],
)
def test_inject_rejects_a_part_whose_meta_is_no_mapping(part: Part) -> None:
    """Catches: `Turn.inject` checking a part's text and arguments but not its meta, so the
    injection failed only at commit, as a bare TypeError naming no hook."""
    with pytest.raises(TypeError, match=rf"Turn.inject: {type(part).__name__}\.meta must be a"):
        Turn.start("hi").inject(part)


@pytest.mark.parametrize(
    ("items", "says"),
    [
        ((ToolCall("c1", "lookup", {}),), r"tool calls \['c1'\] have no result"),
        (("note", ToolResult("c1", "42")), r"tool results \['c1'\] answer no tool call"),
        (
            (ToolCall("c1", "f", {}), ToolResult("c2", "42")),
            r"tool results \['c2'\] answer no tool call",
        ),
        (
            (ToolCall("c1", "f", {}), ToolResult("c1", "a"), ToolResult("c1", "b")),
            "tool call 'c1' is answered twice",
        ),
        (
            (ToolCall("c1", "f", {}), ToolCall("c1", "g", {}), ToolResult("c1", "a")),
            "two tool calls have the id 'c1'",
        ),
    ],
    ids=["lone-call", "lone-result", "other-id", "answered-twice", "same-id"],
)
def test_inject_rejects_tool_parts_that_do_not_pair_up(items: tuple, says: str) -> None:
    """Catches: an injected ToolCall without its ToolResult (or a result without its call)
    accepted, rendered as an assistant tool-call message no tool message follows — a
    request every provider refuses (reported as the provider's failure), and, from a
    durable hook, committed to the log so that every later turn fails too."""
    with pytest.raises(ValueError, match=f"Turn.inject: {says}"):
        Turn.start("hi").inject(*items)


def test_inject_takes_several_calls_each_with_its_result_in_any_order() -> None:
    """Catches: the pairing check refusing calls whose results come in another order."""
    items = (
        ToolCall("c1", "f", {}),
        ToolCall("c2", "g", {}),
        ToolResult("c2", "b"),
        "note",
        ToolResult("c1", "a"),
    )
    assert Turn.start("hi").inject(*items).injections[0].parts[0] == items[0]


# --- Turn.with_request --------------------------------------------------------------------


def test_with_request_changes_the_named_option() -> None:
    assert Turn.start("hi").with_request(temperature=0.2).request.temperature == 0.2


def test_with_request_keeps_the_other_options() -> None:
    turn = Turn.start("hi").with_request(temperature=0.2, tool_choice="auto")

    assert turn.with_request(max_tokens=50).request == RequestOptions(
        temperature=0.2, max_tokens=50, tool_choice="auto"
    )


def test_with_request_leaves_the_original_turn_unchanged() -> None:
    turn = Turn.start("hi")

    turn.with_request(max_tokens=10)

    assert turn.request == RequestOptions()


def test_with_request_rejects_an_unknown_option_naming_it() -> None:
    with pytest.raises(TypeError, match="temprature"):
        Turn.start("hi").with_request(temprature=0.2)


def test_with_request_rejects_an_unknown_option_listing_the_real_ones() -> None:
    """Catches: a misspelt option reported as attrs' ``RequestOptions.__init__() got an
    unexpected keyword argument``, which names neither the options there are nor where a
    provider's own option (``seed``) goes."""
    with pytest.raises(TypeError, match=r"no option 'seed' — the options are .*temperature"):
        Turn.start("hi").with_request(seed=7)


def test_active_tools_intersects_with_the_context_tools() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=["weather", "search", "unknown"])

    assert set(turn.request.active_tools or ()) == {"search", "weather"}


def test_active_tools_keeps_the_context_order() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=["calendar", "weather", "search"])

    assert turn.request.active_tools == ("search", "weather", "calendar")


def test_active_tools_is_stored_as_a_tuple() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools={"search"})

    assert turn.request.active_tools == ("search",)


def test_active_tools_intersects_with_the_current_narrowing() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=["search", "weather"])

    narrowed = turn.with_request(active_tools=["weather", "calendar"])

    assert narrowed.request.active_tools == ("weather",)


def test_active_tools_cannot_add_back_a_tool_a_narrowing_removed() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=["search"])

    assert turn.with_request(active_tools=TOOLS).request.active_tools == ("search",)


def test_active_tools_naming_no_context_tool_leaves_no_tool_active() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=["unknown"])

    assert turn.request.active_tools == ()


def test_active_tools_rejects_a_str() -> None:
    with pytest.raises(TypeError, match="active_tools"):
        turn_with_tools(*TOOLS).with_request(active_tools="search")


def test_active_tools_cannot_be_widened_back_to_all_tools() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=["search"])

    with pytest.raises(ValueError, match="active_tools"):
        turn.with_request(active_tools=None)


def test_active_tools_none_is_accepted_while_nothing_is_narrowed() -> None:
    turn = turn_with_tools(*TOOLS).with_request(active_tools=None)

    assert turn.request.active_tools is None


tool_sets = st.lists(names, max_size=6, unique=True)


@given(st.lists(names, min_size=1, max_size=6, unique=True), st.lists(names, max_size=6))
def test_active_tools_are_the_context_tools_that_were_asked_for(
    context_tools: list[str], wanted: list[str]
) -> None:
    # A context without tools yet keeps the names: see the test of that case below.
    turn = turn_with_tools(*context_tools).with_request(active_tools=wanted)

    assert turn.request.active_tools == tuple(name for name in context_tools if name in wanted)


@given(tool_sets, st.lists(names, max_size=6), st.lists(names, max_size=6))
def test_narrowing_twice_equals_narrowing_once_with_the_intersection(
    context_tools: list[str], first: list[str], second: list[str]
) -> None:
    turn = turn_with_tools(*context_tools)
    both = [name for name in first if name in second]

    twice = turn.with_request(active_tools=first).with_request(active_tools=second)

    assert twice.request == turn.with_request(active_tools=both).request


# --- Turn.assign --------------------------------------------------------------------------


@given(st.dictionaries(identifiers, json_values, max_size=4))
def test_assign_is_scope_assign_on_the_turn(values: dict) -> None:
    turn = Turn.start("hi", scope=Scope("ada", {"plan": "free"}))

    assert turn.assign(**values).scope == turn.scope.assign(**values)


def test_assign_changes_nothing_but_the_scope() -> None:
    turn = Turn.start("hi", turn_ref="ref-1").inject("note").with_request(max_tokens=5)

    assigned = turn.assign(locale="fr")

    assert attrs.evolve(assigned, scope=turn.scope) == turn


def test_assign_leaves_the_original_turn_unchanged() -> None:
    turn = Turn.start("hi")

    turn.assign(locale="fr")

    assert turn.scope == Scope()


@pytest.mark.parametrize("turn_ref", ["", 42])
def test_start_rejects_a_turn_ref_that_is_not_a_non_empty_string(turn_ref: object) -> None:
    with pytest.raises(ValueError, match="turn_ref"):
        Turn.start("hi", turn_ref=turn_ref)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keyword", "value"), [("context", [Message.user("a")]), ("scope", {"user": "ada"})]
)
def test_start_rejects_a_context_or_scope_of_the_wrong_type(keyword: str, value: object) -> None:
    with pytest.raises(TypeError, match=keyword):
        Turn.start("hi", **{keyword: value})  # type: ignore[arg-type]


# -- request shaping: extra shallow-merges ------------------------------------------------

_EXTRA_KEYS = st.sampled_from(["seed", "top_p", "user", "logprobs"])
_EXTRA_VALUES = st.none() | st.integers() | st.text(max_size=3)


@given(st.lists(st.dictionaries(_EXTRA_KEYS, _EXTRA_VALUES, max_size=4), max_size=6))
def test_extra_merges_per_key_with_the_last_writer_winning_and_none_removing(writes):
    """Catches: `with_request(extra=...)` replacing the whole mapping, so a second hook
    silently dropped the first hook's keys. Law: applying writes one by one leaves, per key,
    the last value written to it, and no key whose last value was None."""
    turn = Turn.start("hi")
    for extra in writes:
        turn = turn.with_request(extra=extra)
    expected: dict = {}
    for extra in writes:
        for key, value in extra.items():
            expected[key] = value
    assert dict(turn.request.extra) == {k: v for k, v in expected.items() if v is not None}


@given(
    st.dictionaries(_EXTRA_KEYS, _EXTRA_VALUES, max_size=4),
    st.dictionaries(_EXTRA_KEYS, _EXTRA_VALUES, max_size=4),
    st.dictionaries(_EXTRA_KEYS, _EXTRA_VALUES, max_size=4),
)
def test_merging_extra_is_associative(a, b, c):
    """Catches: a merge whose result depends on how writes are grouped (e.g. a chain of
    hooks versus the same hooks listed one by one)."""
    one_by_one = Turn.start("hi").with_request(extra=a).with_request(extra=b).with_request(extra=c)
    grouped = Turn.start("hi").with_request(extra=a).with_request(extra={**b, **c})
    assert one_by_one.request.extra == grouped.request.extra


def test_extra_that_is_not_a_mapping_is_a_type_error_saying_what_to_pass():
    """Catches: `extra=["seed"]` being stored as is and failing in the provider."""
    with pytest.raises(TypeError, match=r"extra must be a mapping.*got list"):
        Turn.start("hi").with_request(extra=["seed"])


def test_inject_without_parts_says_what_to_pass() -> None:
    """Catches: a refusal that does not show a call that works, nor how to add nothing."""
    with pytest.raises(ValueError, match=r"Turn\.inject needs at least one part") as excinfo:
        Turn.start("hi").inject()
    assert "e.g. turn.inject(" in str(excinfo.value)
    assert "to add nothing" in str(excinfo.value)


# --- Stamper: stamping as Turn.inject makes an injection ----------------------------------

# One operation on a pool of turns: inject one text into pool[index], with the stamper's stamp
# set to the stamp of a hook ("a" or "b": the same tuple each time, as the runtime sets a step's
# stamp, or a new equal-or-not one when `fresh`) or to None.
operations = st.lists(
    st.tuples(
        st.integers(0, 30), st.sampled_from(["a", "a", "b", None]), st.booleans(), st.booleans()
    ),
    max_size=25,
)


@given(operations)
def test_injecting_into_any_turn_of_a_lineage_gives_exactly_its_parents_injections_and_one_more(
    ops: list[tuple[int, str | None, bool, bool]],
) -> None:
    """Catches: a turn seeing an injection made on another branch of the same lineage, an
    earlier turn changed by a later inject (sharing where a copy was needed), an injection
    stamped with a stamp that was not set when it was made, or `Stamper.added` claiming
    that a turn's injections are another's plus injections of one stamp when they are not."""
    stamper = Stamper()
    pool = [Turn.start("hi")]
    expected: list[list[tuple[str, str | None, bool, str | None]]] = [[]]
    by_letter: dict[str, tuple[str, bool, Stage]] = {}
    stamps: list[tuple[str, bool, Stage]] = []
    with stamper:
        for step, (index, letter, fresh, durable) in enumerate(ops):
            if letter is not None and (fresh or letter not in by_letter):
                by_letter[letter] = (letter, durable, "pre")
                stamps.append(by_letter[letter])
            current = None if letter is None else by_letter[letter]
            stamper.stamp = current
            at = index % len(pool)
            text = f"t{step}"
            pool.append(pool[at].inject(text))
            entry = (text, *current) if current is not None else (text, None, False, None)
            expected.append([*expected[at], entry])
            for stamp in stamps:
                for before, before_expected in zip(pool, expected, strict=True):
                    if stamper.added(stamp, before, pool[-1]):
                        cut = len(before_expected)
                        head, tail = expected[-1][:cut], expected[-1][cut:]
                        assert head == before_expected
                        assert tail
                        assert all(item[1:] == stamp for item in tail)
    observed = [
        [(i.parts[0].text, i.source, i.durable, i.stage) for i in turn.injections] for turn in pool
    ]
    assert observed == expected


@given(st.integers(1, 8), st.booleans())
def test_a_chain_of_injects_under_one_stamp_is_recognised_as_added(
    count: int, durable: bool
) -> None:
    """Catches: `Stamper.added` failing for the common case (a hook that only calls
    `turn.inject`, possibly several times in a row), which would send every injecting hook
    down the runtime's slow path; or vouching for the chain under another stamp."""
    stamper = Stamper()
    before = Turn.start("hi").inject("earlier")
    stamp: tuple[str, bool, Stage] = ("retrieve", durable, "pre")
    with stamper:
        stamper.stamp = stamp
        after = before
        for index in range(count):
            after = after.inject(f"passage {index}")
        stamper.stamp = None
        assert stamper.added(stamp, before, after)
        assert not stamper.added(("retrieve", durable, "pre"), before, after)
        assert not stamper.added(stamp, after, after.inject("later"))
    assert [(i.source, i.durable, i.stage) for i in after.injections] == [
        (None, False, None),
        *[("retrieve", durable, "pre")] * count,
    ]


def test_a_stamper_stamps_only_while_current_and_set() -> None:
    """Catches: a stamper that keeps stamping after its hook returned (stamp back to None),
    after its block was left, or from a task where it was never made current."""
    stamper = Stamper()
    stamper.stamp = ("hook", True, "pre")
    assert Turn.start("hi").inject("x").injections[0].source is None
    with stamper:
        assert Turn.start("hi").inject("x").injections[0].source == "hook"
        stamper.stamp = None
        assert Turn.start("hi").inject("x").injections[0].source is None
        stamper.stamp = ("hook", True, "pre")
    assert stamper.stamp is None
    assert Turn.start("hi").inject("x").injections[0].source is None


def test_a_stamper_cannot_be_made_current_twice_at_once() -> None:
    """Catches: a nested `with stamper:` silently losing the outer token, so leaving the
    inner block would leave the stamper current for the rest of the task."""
    stamper = Stamper()
    with stamper, pytest.raises(RuntimeError, match="already current"):
        stamper.__enter__()
    assert Turn.start("hi").inject("x").injections[0].source is None


def test_active_tools_names_kept_before_the_turn_runs_must_be_names() -> None:
    """Catches: names kept as given on a turn without tools yet, so `[1, None]` became the
    turn's active tools and failed later (in serde, in the tracer) instead of here."""
    with pytest.raises(TypeError, match="tool names"):
        Turn.start("hi").with_request(active_tools=[1, None])


def test_active_tools_on_a_turn_without_tools_yet_keeps_the_names() -> None:
    """Catches: narrowing a turn whose context has no tools yet (the pipeline fills them)
    intersecting the names with nothing, leaving no tool active at all."""
    turn = Turn.start("hi").with_request(active_tools=["search", "weather", "search"])

    assert turn.request.active_tools == ("search", "weather")
    assert turn.with_request(active_tools=["weather"]).request.active_tools == ("weather",)


def test_a_reply_whose_messages_are_not_messages_is_refused_naming_the_culprit() -> None:
    """Catches: `Reply.messages` accepting strings, which fail only when the reply is
    committed or sent back to the model."""
    with pytest.raises(TypeError, match=r"Reply\.messages\[1\] must be a Message, got str"):
        Reply(Message.assistant("hi"), messages=[Message.assistant("hi"), "hi"])


def test_a_reply_whose_message_is_not_a_message_is_refused_naming_the_field() -> None:
    """Bug caught: `Reply("hi")` (or a post hook's `attrs.evolve(reply, message="...")`) was
    accepted, and `to_dict` of it failed with a bare AttributeError ('str' object has no
    attribute 'role')."""
    reply = Reply(Message.assistant("hi"))

    with pytest.raises(TypeError, match=r"Reply\.message must be the final assistant Message"):
        attrs.evolve(reply, message="redacted")


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        (
            {"stage": "middle"},
            ValueError,
            r"Injection\.stage must be 'pre', 'post' or None.*'middle'",
        ),
        ({"stage": "PRE"}, ValueError, r"Injection\.stage .*'PRE'"),
        ({"durable": "yes"}, TypeError, r"Injection\.durable must be a bool, got str 'yes'"),
        ({"durable": 2}, TypeError, r"Injection\.durable must be a bool, got int 2"),
        ({"source": 3}, TypeError, r"Injection\.source must be .* got int 3"),
    ],
)
def test_an_injection_with_a_stage_durability_or_source_of_no_kind_is_refused_naming_it(
    changes: dict, error: type[Exception], says: str
) -> None:
    """Bug caught: `Injection(stage="middle")` (or a durable "yes") was accepted, rendered and
    committed as a pre-stage injection, and the audit record holding it could not be read
    back."""
    with pytest.raises(error, match=says):
        Injection((Text("x"),), **changes)
    with pytest.raises(error, match=says):
        attrs.evolve(Injection((Text("x"),), "notes", False, "pre"), **changes)


def test_an_injection_of_each_stage_and_unstamped_is_accepted() -> None:
    for stage in ("pre", "post", None):
        assert Injection((Text("x"),), "notes", True, stage).stage == stage
    assert Injection((Text("x"),), durable=1).durable == 1  # as a log may read it back


@pytest.mark.parametrize(
    ("counts", "error", "says"),
    [
        (
            ("a",),
            TypeError,
            r"Usage\.input_tokens must be a number of tokens \(an int or float, 0 or more\),"
            r" got str 'a'",
        ),
        ((True, 1), TypeError, r"Usage\.input_tokens .* got bool True"),
        ((1, None), TypeError, r"Usage\.output_tokens .* got NoneType None"),
        (
            (-1, 3),
            ValueError,
            r"Usage\.input_tokens must be a number of tokens of 0 or more \(finite\), got int -1",
        ),
        ((3, float("nan")), ValueError, r"Usage\.output_tokens .* got float nan"),
        ((float("inf"), 3), ValueError, r"Usage\.input_tokens .* got float inf"),
    ],
)
def test_a_usage_that_is_no_token_count_is_refused_naming_the_field(
    counts: tuple, error: type[Exception], says: str
) -> None:
    """Bug caught: `Usage("a")`, `Usage(-1, 3)` or `Usage(True, 1)` was accepted, and failed far
    away (adding usages, or reading back an audit record the log had stored)."""
    with pytest.raises(error, match=says):
        Usage(*counts)


def test_a_usage_of_counts_adds_up() -> None:
    assert Usage(1, 2) + Usage(3, 4) == Usage(4, 6)
    assert Usage(12.5, 0).input_tokens == 12.5  # a fractional count round-trips (see serde)
