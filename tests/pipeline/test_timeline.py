"""pipeline.events.timeline and the time every event carries."""

import logging

import anyio
import pytest
import trio.testing

from pipeline import Pipeline, cont, halt, regenerate, tool
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import ToolCall, Turn, Usage


@tool
async def lookup(order: str) -> str:
    """An order's state."""
    await anyio.sleep(0.010)
    return "shipped"


async def guard(turn):
    await anyio.sleep(0.005)
    assert turn.reply is not None
    if turn.reply.attempt == 1:
        return regenerate("no ticket numbers")
    return halt("still unsure")


def pipeline() -> Pipeline:
    return Pipeline(
        model=ScriptedModel(
            [[ToolCall("c1", "lookup", {"order": "42"})], ["Ticket RF-1"], ["Sorry"]]
        ),
        tools=[lookup],
        post=[guard],
    )


async def streamed(pipe: Pipeline) -> list[ev.Event]:
    async with pipe.stream(Turn.start("where is 42?", turn_ref="0123456789abcdef")) as events:
        return [event async for event in events]


async def test_the_timeline_of_a_turn_with_a_tool_call_a_rejection_and_a_halt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Catches: a timeline line missing, out of order, at the wrong time or misworded."""
    text = ev.timeline(await streamed(pipeline()))

    assert (
        text
        == (
            "     0.0 ms  turn started                                 turn_ref 01234567\n"
            "     0.0 ms  model called (attempt 1)\n"
            "     0.0 ms    model asks for tool lookup                 {'order': '42'}\n"
            "     0.0 ms    lookup started                             tool\n"
            "    10.0 ms    lookup -> result                           10.0 ms\n"
            "    10.0 ms  model called again (attempt 1, call 2)       with the tool results\n"
            "    10.0 ms    text (attempt 1)                           'Ticket RF-1'\n"
            "    10.0 ms  reply ready                                  stop, 9 tok out\n"  # the attempt's two calls: 6 + 3
            "    10.0 ms    guard started                              post\n"
            "    15.0 ms    guard -> regenerate                        5.0 ms\n"
            "    15.0 ms  attempt 1 rejected by guard                  no ticket numbers\n"
            "    15.0 ms  model called (attempt 2)\n"
            "    15.0 ms    text (attempt 2)                           'Sorry'\n"
            "    15.0 ms  reply ready                                  stop, 2 tok out\n"
            "    15.0 ms    guard started                              post\n"
            "    20.0 ms    guard -> halt                              5.0 ms\n"
            "    20.0 ms  halted by guard                              still unsure\n"
            "    20.0 ms  turn finished                                halted\n"
        )
    )


async def test_every_event_carries_its_time_since_the_turn_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Catches: events without a time, or times that do not follow the turn's clock."""
    events = await streamed(pipeline())

    assert [(type(e).__name__, round(e.at * 1e3, 3)) for e in events] == [
        ("TurnStarted", 0.0),
        ("ModelCalled", 0.0),
        ("ModelFinished", 0.0),
        ("ToolCallRequested", 0.0),
        ("ToolStarted", 0.0),
        ("ToolFinished", 10.0),
        ("ToolStepFinished", 10.0),
        ("ModelCalled", 10.0),
        ("TextDelta", 10.0),
        ("ModelFinished", 10.0),
        ("ReplyReady", 10.0),
        ("HookStarted", 10.0),
        ("HookFinished", 15.0),
        ("AttemptRejected", 15.0),
        ("ModelCalled", 15.0),
        ("TextDelta", 15.0),
        ("ModelFinished", 15.0),
        ("ReplyReady", 15.0),
        ("HookStarted", 15.0),
        ("HookFinished", 20.0),
        ("Halted", 20.0),
        ("TurnFinished", 20.0),
    ]


async def test_the_time_is_not_part_of_an_events_equality() -> None:
    """Catches: two runs of the same turn emitting unequal events because of the clock."""
    assert ev.TurnFinished("t", "completed", at=1.0) == ev.TurnFinished("t", "completed", at=2.0)


def test_an_empty_or_unshown_batch_renders_nothing() -> None:
    """Catches: blank lines for events the timeline does not show."""
    assert ev.timeline([]) == ""
    assert ev.timeline([ev.ModelFinished("t", 1, 1, "stop", Usage())]) == ""


def test_every_event_is_one_line_whatever_its_text_holds() -> None:
    """Bug: a multi-line error, reason or feedback (or a tool name the model wrote with a
    line break or a terminal escape in it) was printed as is, so one event took several
    lines, the later ones looking like events of their own."""
    call = ToolCall("c1", "look\nup\x1b[2J", {})
    events = [
        ev.HookFailed("t", "guard", "pre", "ValueError: one\ntwo", enforced=False),
        ev.AttemptRejected("t", 1, "guard", "first\r\nsecond\u2028third"),
        ev.ToolCallRequested("t", call, 1, 1),
        ev.Halted("t", "guard", "stop\n  99.0 ms  turn finished   completed"),
    ]

    text = ev.timeline(events)

    assert text.count("\n") == len(events)
    assert "ValueError: one\\ntwo" in text
    assert "first\\r\\nsecond\\u2028third" in text
    assert "model asks for tool look\\nup\\x1b[2J" in text
    assert "\x1b" not in text


def test_something_that_is_not_an_event_is_a_type_error_naming_it() -> None:
    """Catches: the timeline of events that are not events (a list of dicts read back from
    JSON, a turn's result) rendering as nothing at all, with nothing said."""
    started = ev.TurnStarted("t")
    with pytest.raises(TypeError) as caught:
        ev.timeline([started, {"type": "TurnFinished", "turn_ref": "t"}])

    assert str(caught.value) == (
        "timeline() renders pipeline.events events; item 2 is a dict:"
        " {'type': 'TurnFinished', 'turn_ref': 't'}"
    )


async def slow_pre(turn: Turn):
    await anyio.sleep(0.005)
    return cont(turn)


async def test_a_hooks_events_are_timed_from_the_turns_start_not_the_clocks_origin(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: a hook's events stamped with the loop's raw clock (or another turn's start)
    instead of the time since their own turn started, with a bare listener and with the
    debug log on (the two ways a watched turn dispatches its events)."""
    pipe = Pipeline(model=ScriptedModel([["ok"], ["ok"]]), pre=[slow_pre, slow_pre])
    await anyio.sleep(100.0)  # the loop's clock is far from zero when the turn starts
    times = []
    for level in (logging.WARNING, logging.DEBUG):
        with caplog.at_level(level, logger="turnplug.pipeline"):
            events = await streamed(pipe)
        times.append(
            [
                (type(e).__name__, round(e.at * 1e3, 3))
                for e in events
                if isinstance(e, ev.HookStarted | ev.HookFinished)
            ]
        )

    assert (
        times
        == [
            [
                ("HookStarted", 0.0),
                ("HookFinished", 5.0),
                ("HookStarted", 5.0),
                ("HookFinished", 10.0),
            ]
        ]
        * 2
    )


def test_a_c1_control_or_a_lone_surrogate_is_shown_escaped() -> None:
    """Bug caught: the timeline escaped C0 control characters but not C1 ones, so U+009B (a
    CSI on its own) in a halt's reason reached the terminal, and a lone surrogate failed the
    printing of the line."""
    text = ev.timeline([ev.Halted("t", "guard", "bad\x9b2J\x9d0;title\x9c and \ud800 here")])

    assert "bad\\x9b2J\\x9d0;title\\x9c and \\ud800 here" in text
    text.encode()  # every character of it can be written
