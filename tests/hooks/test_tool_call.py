"""inject_tool_call: a real tool's call and result injected before the user message."""

import contextvars
import datetime
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import INJECTED_AT, inject_tool_call, transient
from pipeline import INJECTED_BY, ConfigError, Pipeline, chain, hook, tool
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import Message, Scope, ToolCall, ToolResult, Turn

from ..pipeline.support import collect


class Preferences:
    """A tool over data the test changes, counting its runs."""

    def __init__(self) -> None:
        self.language = "en"
        self.runs = 0

    def make(self) -> Any:
        @tool
        def get_preferences(user: str, scope: Scope) -> dict[str, str]:
            """The user's preferences."""
            self.runs += 1
            return {"user": user, "language": self.language}

        return get_preferences


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


# -- alone ------------------------------------------------------------------------------------


async def test_alone_it_injects_the_call_and_the_tools_result_stamped_with_the_time() -> None:
    prefs = Preferences()
    inject = inject_tool_call(prefs.make(), {"user": "ada"}, clock=Clock())

    signal = await inject(Turn.start("hi", turn_ref="t1"))

    [injection] = signal.value.injections
    call, result = injection.parts
    assert call == ToolCall(
        "injected_get_preferences_t1",
        "get_preferences",
        {"user": "ada"},
        {INJECTED_AT: 1_000.0},
    )
    assert result == ToolResult(
        "injected_get_preferences_t1",
        '{"user": "ada", "language": "en"}',
        meta={INJECTED_AT: 1_000.0},
    )


async def test_alone_a_tool_given_by_name_needs_a_running_pipeline() -> None:
    inject = inject_tool_call("get_preferences")

    with pytest.raises(LookupError, match="get_preferences"):
        await inject(Turn.start("hi"))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"frequency": "sometimes"}, "frequency"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -5}, "ttl"),
        ({"ttl": True}, "ttl"),
        ({"ttl": "1h"}, "ttl"),
        ({"clock": 3}, "clock"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(
    changes: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        inject_tool_call(Preferences().make(), {"user": "ada"}, **changes)


@pytest.mark.parametrize(
    "options", [{"frequency": "if_changed"}, {"ttl": 60}], ids=["if_changed", "ttl"]
)
def test_a_transient_pair_that_should_skip_is_refused_when_built(options: dict[str, Any]) -> None:
    """A transient pair never joins the log, so `if_changed` and `ttl` never found it: the
    hook ran the tool and injected every turn, silently."""
    with pytest.raises(ConfigError, match=r"get_preferences.*durable=False"):
        inject_tool_call(Preferences().make(), {"user": "ada"}, durable=False, **options)


@pytest.mark.parametrize(
    "rewrap",
    [transient, lambda fn: hook(fn, durable=False), lambda fn: chain(transient(fn), name="s")],
    ids=["transient", "hook", "chain"],
)
def test_a_pair_that_should_skip_rewrapped_as_transient_is_refused_by_the_pipeline(
    rewrap: Any,
) -> None:
    """Catches: ``transient(inject_tool_call(..., frequency="if_changed"))`` (or
    ``hook(..., durable=False)``) getting around the check above, the hook then running the
    tool and injecting every turn, silently."""
    prefs = Preferences()
    injector = inject_tool_call("get_preferences", {"user": "ada"}, frequency="if_changed")
    with pytest.raises(ConfigError, match=r"inject_get_preferences.*durable"):
        Pipeline(model=ScriptedModel(["ok"]), tools=[prefs.make()], pre=[rewrap(injector)])
    # Always injecting, it may be transient.
    always = inject_tool_call("get_preferences", {"user": "ada"})
    Pipeline(model=ScriptedModel(["ok"]), tools=[prefs.make()], pre=[rewrap(always)])


async def test_a_scripted_clock_is_read_once_per_turn_and_never_when_built() -> None:
    """Catches: the clock read once when the hook was built, to check it, so a scripted
    clock lost its first reading (each turn then saw the next turn's time), and a clock
    that reads a request's time from a context variable failed the build with a bare
    LookupError."""
    prefs = Preferences()
    readings = iter([1_000.0, 1_030.0, 1_100.0])
    pipe = Pipeline(
        model=ScriptedModel(["ok"] * 3),
        tools=[prefs.make()],
        pre=[inject_tool_call("get_preferences", {"user": "ada"}, ttl=60, clock=readings.__next__)],
    )
    injected = []
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        for _ in range(3):
            injected.append(bool((await session.send("hi")).turn.injections))
    assert injected == [True, False, True]

    unset: contextvars.ContextVar[float] = contextvars.ContextVar("request_time")
    inject_tool_call("get_preferences", {"user": "ada"}, clock=unset.get)  # builds


async def test_a_clock_that_stops_reading_seconds_fails_the_hook_open() -> None:
    """Catches: a clock such as `datetime.now` taken, its reading stamped in the pair's
    meta, which made a SQLite or PostgreSQL log refuse the turn (LogError, nothing
    committed) and which the ttl check skipped, so the tool ran every turn. Each turn's
    reading is checked: a wrong one injects nothing and is reported."""
    readings = iter([datetime.datetime(2030, 1, 1)])
    prefs = Preferences()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        tools=[prefs.make()],
        pre=[inject_tool_call("get_preferences", {"user": "ada"}, clock=lambda: next(readings))],
    )

    events, result = await collect(pipe, Turn.start("hi"))

    assert (result.outcome, result.turn.injections, prefs.runs) == ("completed", (), 0)
    [failed] = [e for e in events if isinstance(e, ev.HookFailed)]
    assert "clock() must return seconds" in failed.error


def test_arguments_that_do_not_fit_the_tools_schema_are_refused_when_built() -> None:
    with pytest.raises(ConfigError, match=r"get_preferences.*user: required"):
        inject_tool_call(Preferences().make(), {"name": "ada"})


def test_a_tool_that_is_neither_a_tool_nor_a_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="Tool or a tool's name"):
        inject_tool_call(42)  # type: ignore[arg-type]


def test_a_pipeline_without_the_named_tool_is_refused_when_built() -> None:
    with pytest.raises(ConfigError, match=r"inject_get_preferences.*\['get_preferences'\]"):
        Pipeline(model=ScriptedModel(["ok"]), pre=[inject_tool_call("get_preferences")])


def test_a_timedelta_ttl_is_accepted() -> None:
    hook = inject_tool_call(Preferences().make(), {"user": "ada"}, ttl=datetime.timedelta(hours=1))
    assert hook.fn.ttl == 3600.0


# -- in a pipeline ----------------------------------------------------------------------------


def pipe_for(prefs: Preferences, model: ScriptedModel, **options: Any) -> Pipeline:
    get_preferences = prefs.make()
    return Pipeline(
        model=model,
        tools=[get_preferences],
        pre=[inject_tool_call("get_preferences", {"user": "ada"}, **options)],
    )


async def test_the_pair_is_rendered_just_before_the_user_message() -> None:
    model = ScriptedModel(["ok"])

    await pipe_for(Preferences(), model, clock=Clock()).run(Turn.start("hi", turn_ref="t1"))

    *_, call_message, result_message, user = model.requests[0].messages
    assert call_message.role == "assistant"
    assert [type(p) for p in call_message.parts] == [ToolCall]
    assert result_message == Message.tool(
        ToolResult(
            "injected_get_preferences_t1",
            '{"user": "ada", "language": "en"}',
            meta={INJECTED_AT: 1_000.0},
        )
    )
    assert user == Message.user("hi")


async def test_the_pair_is_durable_by_default_and_carries_its_hook_and_time_into_the_log() -> None:
    log = MemoryLog()
    pipe = pipe_for(Preferences(), ScriptedModel(["ok"]), clock=Clock())

    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi")

    call_message, result_message, *_ = (await log.load("c")).messages
    marks = {INJECTED_BY: "inject_get_preferences", INJECTED_AT: 1_000.0}
    assert call_message.parts[0].meta == marks
    assert result_message.parts[0].meta == marks


async def test_a_transient_pair_stays_out_of_the_log() -> None:
    log = MemoryLog()
    pipe = pipe_for(Preferences(), ScriptedModel(["ok"]), durable=False)

    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi")

    assert [m.role for m in (await log.load("c")).messages] == ["user", "assistant"]


async def test_a_failing_tool_injects_nothing_and_is_reported() -> None:
    @tool
    def get_preferences(user: str) -> str:
        raise OSError("profile service down")

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        tools=[get_preferences],
        pre=[inject_tool_call("get_preferences", {"user": "ada"})],
    )

    events, result = await collect(pipe, Turn.start("hi"))

    assert result.outcome == "completed"
    assert result.turn.injections == ()
    [failed] = [e for e in events if isinstance(e, ev.HookFailed)]
    assert failed.hook == "inject_get_preferences"
    assert "profile service down" in failed.error
    assert failed.enforced is False


async def test_arguments_a_named_tool_refuses_inject_nothing_and_are_reported() -> None:
    prefs = Preferences()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        tools=[prefs.make()],
        pre=[inject_tool_call("get_preferences", {"name": "ada"})],
    )

    events, result = await collect(pipe, Turn.start("hi"))

    assert prefs.runs == 0
    assert result.turn.injections == ()
    [failed] = [e for e in events if isinstance(e, ev.HookFailed)]
    assert "user: required" in failed.error


# -- across turns: ttl and if_changed, with a clock the test moves ------------------------------


async def send_turns(
    pipe: Pipeline, clock: Clock, times: list[float], prefs: Preferences, languages: list[str]
) -> tuple[list[bool], MemoryLog]:
    """Send one turn at each time; whether each turn injected a pair."""
    log = MemoryLog()
    injected = []
    async with pipe.session(log=log, conversation_id="c") as session:
        for at, language in zip(times, languages, strict=True):
            clock.now = at
            prefs.language = language
            result = await session.send("hi")
            injected.append(bool(result.turn.injections))
    return injected, log


async def test_ttl_skips_while_the_last_pair_is_fresher_than_it() -> None:
    prefs, clock = Preferences(), Clock()
    pipe = pipe_for(prefs, ScriptedModel(["ok"] * 4), ttl=60, clock=clock)

    injected, _ = await send_turns(
        pipe, clock, [1_000.0, 1_030.0, 1_059.9, 1_060.0], prefs, ["en"] * 4
    )

    assert injected == [True, False, False, True]
    # A skip does not even run the tool.
    assert prefs.runs == 2


async def test_ttl_does_not_take_a_pair_stamped_in_the_future_as_fresh() -> None:
    """A pair stamped by a clock a day ahead (another worker's) counted as fresh for the
    whole day plus the ttl: `now - at` was negative, hence below the ttl."""
    prefs, clock = Preferences(), Clock()
    pipe = pipe_for(prefs, ScriptedModel(["ok"] * 3), ttl=60, clock=clock)

    injected, _ = await send_turns(
        pipe, clock, [1_000.0 + 86_400, 1_000.0, 1_030.0], prefs, ["en"] * 3
    )

    assert injected == [True, True, False]


async def test_ttl_reads_the_time_from_the_log_so_it_survives_a_new_session() -> None:
    prefs, clock = Preferences(), Clock()
    pipe = pipe_for(prefs, ScriptedModel(["ok"] * 2), ttl=60, clock=clock)
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi")
    clock.now += 30

    async with pipe.session(log=log, conversation_id="c") as session:
        second = await session.send("again")

    assert second.turn.injections == ()


async def test_if_changed_skips_a_pair_whose_result_is_the_same_as_the_last_one() -> None:
    prefs, clock = Preferences(), Clock()
    pipe = pipe_for(prefs, ScriptedModel(["ok"] * 4), frequency="if_changed", clock=clock)

    injected, log = await send_turns(
        pipe, clock, [1.0, 2.0, 3.0, 4.0], prefs, ["en", "en", "fr", "fr"]
    )

    assert injected == [True, False, True, False]
    # The tool runs every turn: only its result tells whether anything changed.
    assert prefs.runs == 4
    contents = [
        part.content
        for message in (await log.load("c")).messages
        for part in message.parts
        if isinstance(part, ToolResult)
    ]
    assert contents == [
        '{"user": "ada", "language": "en"}',
        '{"user": "ada", "language": "fr"}',
    ]


async def test_always_injects_every_turn() -> None:
    prefs, clock = Preferences(), Clock()
    pipe = pipe_for(prefs, ScriptedModel(["ok"] * 3), clock=clock)

    injected, _ = await send_turns(pipe, clock, [1.0, 2.0, 3.0], prefs, ["en"] * 3)

    assert injected == [True, True, True]


async def test_two_hooks_on_one_tool_each_find_their_own_last_pair() -> None:
    prefs, clock = Preferences(), Clock()
    get_preferences = prefs.make()
    pipe = Pipeline(
        model=ScriptedModel(["ok"] * 3),
        tools=[get_preferences],
        pre=[
            inject_tool_call(
                "get_preferences", {"user": "ada"}, ttl=60, name="ada_prefs", clock=clock
            ),
            inject_tool_call("get_preferences", {"user": "bob"}, name="bob_prefs", clock=clock),
        ],
    )

    injected, _ = await send_turns(pipe, clock, [0.0, 50.0, 70.0], prefs, ["en"] * 3)

    # Turn 2: ada's pair is fresh (skipped); bob's hook always injects. Turn 3: ada's own
    # last pair is 70 s old, although bob's (a pair of the same tool) is 20 s old.
    assert injected == [True, True, True]
    assert prefs.runs == 5


@pytest.mark.parametrize(
    "options", [{"frequency": "if_changed"}, {"ttl": 60}], ids=["if_changed", "ttl"]
)
async def test_in_a_chain_the_hook_still_finds_its_own_last_pair(options: dict[str, Any]) -> None:
    """In a chain the runtime stamps the pair with the chain's name before the hook's
    (``setup.inject_get_preferences``); the hook looked for its bare name only, so it never
    found its last pair and `if_changed` and `ttl` injected every turn."""
    prefs, clock = Preferences(), Clock()
    pipe = Pipeline(
        model=ScriptedModel(["ok"] * 3),
        tools=[prefs.make()],
        pre=[
            chain(
                inject_tool_call("get_preferences", {"user": "ada"}, clock=clock, **options),
                name="setup",
            )
        ],
    )

    injected, log = await send_turns(pipe, clock, [0.0, 10.0, 20.0], prefs, ["en"] * 3)

    assert injected == [True, False, False]
    sources = [
        part.meta[INJECTED_BY]
        for message in (await log.load("c")).messages
        for part in message.parts
        if isinstance(part, ToolCall)
    ]
    assert sources == ["setup.inject_get_preferences"]


async def test_a_hook_of_the_same_name_in_a_chain_does_not_take_the_others_pairs() -> None:
    """Catches: a top-level hook reading the pair of a hook of the same name in a chain
    (stamped ``setup.inject_get_preferences``) as its own, though it called the tool for
    another user: ada's new preferences equalled bob's last pair, so ada's change was
    skipped as unchanged and never injected."""
    values = {"ada": "X", "bob": "Y"}

    @tool
    def get_preferences(user: str) -> str:
        """A user's preferences."""
        return values[user]

    def prefs(user: str) -> Any:
        return inject_tool_call("get_preferences", {"user": user}, frequency="if_changed")

    pipe = Pipeline(
        model=ScriptedModel(["ok"] * 2),
        tools=[get_preferences],
        pre=[prefs("ada"), chain(prefs("bob"), name="setup")],
    )
    injected = []
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        for ada in ("X", "Y"):
            values["ada"] = ada
            result = await session.send("hi")
            injected.append([(i.source, i.parts[1].content) for i in result.turn.injections])  # type: ignore[union-attr]
    assert injected == [
        [("inject_get_preferences", "X"), ("setup.inject_get_preferences", "Y")],
        [("inject_get_preferences", "Y")],
    ]


async def test_a_ttl_refresh_that_finds_the_same_value_renews_freshness_across_restarts(
    tmp_path: Path,
) -> None:
    """Catches: after the ttl ran out, a re-fetch finding the value unchanged injected
    nothing and left no trace, so the tool ran again on every later turn (fetched at 0, 100
    and 130 s with a 60 s ttl). Each turn here is a new process's pipeline on a reopened
    SQLite log, so the renewal must come from the log alone."""
    from hooks import RENEWED_AT
    from pipeline.logs import SQLiteLog

    prefs, clock = Preferences(), Clock()
    path = tmp_path / "log.db"
    injected = []
    for at in (0.0, 100.0, 130.0, 159.9, 160.0):
        clock.now = at
        pipe = pipe_for(prefs, ScriptedModel(["ok"]), ttl=60, frequency="if_changed", clock=clock)
        async with SQLiteLog(path) as log, pipe.session(log=log, conversation_id="c") as s:
            result = await s.send("hi")
        injected.append(bool(result.turn.injections))

    # 0: injected. 100: stale, re-fetched, unchanged: renewed. 130 and 159.9: fresh since
    # 100, the tool does not run. 160: stale again, re-fetched, unchanged: renewed.
    assert (injected, prefs.runs) == ([True, False, False, False, False], 3)
    async with SQLiteLog(path) as log:
        users = [m for m in (await log.load("c")).messages if m.role == "user"]
    assert [m.meta.get(RENEWED_AT) for m in users] == [
        None,
        {"inject_get_preferences": 100.0},
        None,
        None,
        {"inject_get_preferences": 160.0},
    ]


async def test_a_renewal_does_not_hide_a_changed_value_once_the_ttl_runs_out() -> None:
    """Catches: a renewal that kept the old value fresh forever, or re-injected it."""
    prefs, clock = Preferences(), Clock()
    pipe = pipe_for(prefs, ScriptedModel(["ok"] * 4), ttl=60, frequency="if_changed", clock=clock)

    injected, _ = await send_turns(
        pipe, clock, [0.0, 100.0, 150.0, 161.0], prefs, ["en", "en", "fr", "fr"]
    )

    # 150: the renewal at 100 is fresh, so the change is not seen yet; 161: stale, changed.
    assert injected == [True, False, False, True]


# -- call ids -------------------------------------------------------------------------------


def call_ids(messages: tuple[Message, ...]) -> list[str]:
    return [part.id for message in messages for part in message.parts if type(part) is ToolCall]


async def test_two_hooks_on_one_tool_inject_pairs_with_ids_of_their_own() -> None:
    """Catches: two hooks on one tool, told apart by name, giving their pairs one id, so
    that the model read one call with two results."""
    prefs = Preferences()
    model = ScriptedModel(["ok"])
    pipe = Pipeline(
        model=model,
        tools=[prefs.make()],
        pre=[
            inject_tool_call("get_preferences", {"user": "ada"}, name="ada_prefs"),
            inject_tool_call("get_preferences", {"user": "bob"}, name="bob_prefs"),
        ],
    )
    await pipe.run(Turn.start("hi"))
    ids = call_ids(model.requests[0].messages)
    assert len(ids) == len(set(ids)) == 2


async def test_a_long_tool_names_pairs_keep_ids_of_their_own_turn() -> None:
    """Catches: an id cut to 64 characters losing the turn_ref, so that every turn's pair
    of a tool with a long name had the same id in the history."""

    @tool(name="crm_customer_preferences_and_account_state_lookup_v2_eu_west")
    def prefs() -> str:
        """Preferences."""
        return "fr"

    model = ScriptedModel(["ok", "ok"])
    pipe = Pipeline(model=model, tools=[prefs], pre=[inject_tool_call(prefs)])
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        await session.send("hi")
        await session.send("again")
    ids = call_ids(model.requests[1].messages)
    assert len(ids) == len(set(ids)) == 2


@settings(max_examples=60)
@given(
    pairs=st.lists(
        st.tuples(
            st.sampled_from(["", "ada", "bob", "a.b", "a_b", "x" * 70]),
            st.sampled_from(["t1", "t2", "t" * 60, "t/1", "t_1"]),
        ),
        min_size=2,
        max_size=6,
        unique=True,
    )
)
def test_every_hook_and_turn_gets_a_valid_id_of_its_own(pairs) -> None:
    """Catches: ids shared between pairs (hook names or turn refs that differ only in the
    characters an id cannot hold, or past its 64th character). Law: distinct (hook, turn)
    give distinct ids, each of letters, digits, '_' and '-', at most 64 long."""
    get_preferences = Preferences().make()

    async def inject(name: str, turn_ref: str) -> str:
        hook = inject_tool_call(get_preferences, {"user": "ada"}, name=name or None)
        signal = await hook(Turn.start("hi", turn_ref=turn_ref))
        [injection] = signal.value.injections
        return injection.parts[0].id

    ids = [anyio.run(inject, name, turn_ref) for name, turn_ref in pairs]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", call_id) for call_id in ids)


def test_a_clock_that_needs_arguments_is_refused_when_built() -> None:
    """Catches: clock=lambda now: 0.0 accepted, then failing (open) on every turn."""
    with pytest.raises(ConfigError, match=r"inject_tool_call\(clock="):
        inject_tool_call(Preferences().make(), {"user": "ada"}, clock=lambda now: 0.0)
