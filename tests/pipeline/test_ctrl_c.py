"""Ctrl-C reaching a session, in a real process: SIGINT, as a terminal sends it.

Under trio it is a KeyboardInterrupt raised in the main task; under ``asyncio.run`` it
cancels the main task, and asyncio.run raises KeyboardInterrupt once the task has ended.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGINT")

# The scripts' shared parts. Each runs `main` on the loop named by its first argument, with
# a background hook `slow` that never ends, then prints what the session reported.
SLOW_HOOK = """
import math, sys
import anyio
from pipeline import Pipeline, cont, hook
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel

loop = sys.argv[1]

async def slow(turn):
    await anyio.sleep(math.inf)
    return cont(turn)
"""

RUN_ON_THE_LOOP = """
try:
    if loop == "asyncio":
        import asyncio
        asyncio.run(main())
    else:
        import trio
        trio.run(main)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
for event in sessions[0].events:
    if isinstance(event, ev.HookFailed):
        print("HookFailed:", event.hook, event.error, flush=True)
"""

DRAINING = (
    SLOW_HOOK
    + """
pipe = Pipeline(
    model=ScriptedModel(["ok"]),
    post=[hook(slow, name="slow", background=True)],
    on_session_end=[lambda info, reason: print("end hook:", reason, flush=True)],
)
sessions = []

async def main():
    async with pipe.session(
        log=MemoryLog(), conversation_id="c", drain_timeout=math.inf
    ) as session:
        sessions.append(session)
        await session.send("hi")
        print("draining", flush=True)
"""
    + RUN_ON_THE_LOOP
)


def ctrl_c_while_draining(tmp_path: Path, loop: str) -> list[str]:
    """What a session draining a background hook that never ends prints when Ctrl-C comes."""
    # Once the body has returned and the session waits for the hook, not as it returns
    # (a Ctrl-C that stops the body is another matter).
    return ctrl_c(tmp_path, DRAINING, [loop], "draining\n")


def ctrl_c(tmp_path: Path, source: str, args: list[str], ready: str) -> list[str]:
    """What the script `source` prints when Ctrl-C comes a moment after it printed `ready`."""
    script = tmp_path / "script.py"
    script.write_text(source)
    child = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        # As a terminal starts it: a runner that started the tests in the background (SIGINT
        # ignored) must not pass that on.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == ready
        time.sleep(0.3)  # into the await that follows
        child.send_signal(signal.SIGINT)  # what Ctrl-C sends
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
        child.stdout.close()
    return out.splitlines()


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_ctrl_c_during_the_drain_says_the_session_was_interrupted(
    tmp_path: Path, loop: str
) -> None:
    """Bug caught: a background hook cut by Ctrl-C during the drain was reported as not
    finishing "within the session's drain timeout", though no timeout fired."""
    lines = ctrl_c_while_draining(tmp_path, loop)

    assert "KeyboardInterrupt" in lines
    [failed] = [line for line in lines if line.startswith("HookFailed:")]
    assert "drain timeout" not in failed
    why = {
        "trio": "the session was interrupted (KeyboardInterrupt) while it drained its"
        " background hooks",
        "asyncio": "the session was cancelled",
    }[loop]
    assert failed == f"HookFailed: slow cut short: {why}; nothing of it was committed"


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_ctrl_c_during_the_drain_tells_end_hooks_cancelled(tmp_path: Path, loop: str) -> None:
    """Bug caught: under trio, a Ctrl-C while a session drained told its end hooks "closed",
    where asyncio's (a cancellation of the task) told them "cancelled"."""
    lines = ctrl_c_while_draining(tmp_path, loop)

    assert [line for line in lines if line.startswith("end hook:")] == ["end hook: cancelled"]
    assert "KeyboardInterrupt" in lines


INTERRUPTED = (
    SLOW_HOOK
    + """
when = sys.argv[2]

pre_calls = []

async def stuck(turn):
    pre_calls.append(turn)
    if len(pre_calls) == 2:  # the second turn never gets past its pre hook
        print("in the turn", flush=True)
        await anyio.sleep(math.inf)
    return cont(turn)

log = MemoryLog()
pipe = Pipeline(
    model=ScriptedModel(["ok", "never"]),
    pre=[hook(stuck, name="stuck")],
    post=[hook(slow, name="slow", background=True)],
    on_session_end=[lambda info, reason: print("end hook:", reason, flush=True)],
)
sessions = []

async def main():
    async with pipe.session(log=log, conversation_id="c", drain_timeout=math.inf) as session:
        sessions.append(session)
        await session.send("hi")
        if when == "mid-turn":
            await session.send("again")
        else:
            print("between turns", flush=True)
            await anyio.sleep(math.inf)
"""
    + RUN_ON_THE_LOOP
    + """print("committed:", len(anyio.run(log.entries, "c")), flush=True)
"""
)


@pytest.mark.parametrize("when", ["mid-turn", "between turns"])
@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_ctrl_c_in_the_body_cuts_background_hooks_and_tells_end_hooks_cancelled(
    tmp_path: Path, loop: str, when: str
) -> None:
    """Bug caught: under trio, a Ctrl-C while a session's body ran told its end hooks "error"
    and waited out the drain timeout for its background hooks (for ever with math.inf), where
    asyncio's (a cancellation of the task) cut them at once and told the end hooks
    "cancelled"."""
    ready = "in the turn\n" if when == "mid-turn" else "between turns\n"
    lines = ctrl_c(tmp_path, INTERRUPTED, [loop, when], ready)

    assert [line for line in lines if line.startswith("end hook:")] == ["end hook: cancelled"]
    assert "KeyboardInterrupt" in lines
    why = {
        "trio": "the session was interrupted (KeyboardInterrupt)",
        "asyncio": "the session was cancelled",
    }[loop]
    assert [line for line in lines if line.startswith("HookFailed:")] == [
        f"HookFailed: slow cut short: {why}; nothing of it was committed"
    ]
    assert lines[-1] == "committed: 1"  # the first turn; nothing of the second
