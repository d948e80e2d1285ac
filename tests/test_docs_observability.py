"""docs/observability.md: its timeline example prints what the page shows."""

import contextlib
import io
import re
import textwrap
from pathlib import Path
from typing import Any

import anyio
import trio.testing

from pipeline import Pipeline, halt, regenerate, tool
from pipeline.testing import ScriptedModel
from turns import ToolCall, Turn

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "observability.md").read_text(
    encoding="utf-8"
)


@tool
async def lookup(order: str) -> str:
    """An order's state."""
    await anyio.sleep(0.010)
    return "shipped"


async def guard(turn: Turn) -> Any:
    await anyio.sleep(0.005)
    assert turn.reply is not None
    if turn.reply.attempt == 1:
        return regenerate("no ticket numbers")
    return halt("still unsure")


async def test_the_timeline_example_prints_what_the_page_shows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Catches: the page's timeline drifting from what `timeline` prints for the turn it
    describes (a tool that takes 10 ms, a guard that takes 5 ms, rejects, then halts): a line
    worded, timed or ordered otherwise, or the page's code no longer running."""
    code, shown = re.findall(r"```python\n(.*?)```\n\n```\n(.*?)```", PAGE, flags=re.DOTALL)[0]
    names: dict[str, Any] = {}
    exec("async def example(pipe, turn):\n" + textwrap.indent(code, "    "), names)
    pipe = Pipeline(
        model=ScriptedModel([[ToolCall("c1", "lookup", {"order": "42"})], "Ticket RF-1", "Sorry"]),
        tools=[lookup],
        post=[guard],
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await names["example"](pipe, Turn.start("where is 42?", turn_ref="0123456789abcdef"))
    head, tail = shown.split("    ...\n")
    assert printed.getvalue().startswith(head)
    assert printed.getvalue().endswith(tail)
