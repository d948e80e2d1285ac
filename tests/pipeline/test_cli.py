"""The `turnplug` command line, driven as a new user would: a subprocess, stdin closed."""

import subprocess
import sys
from pathlib import Path

import pytest

# The console script installed next to this interpreter, as a user would run it.
TURNPLUG = str(Path(sys.executable).with_name("turnplug"))


def _turnplug(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TURNPLUG, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_demo_shows_every_pre_stage_step_and_the_reply() -> None:
    done = _turnplug("demo")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in (
        "authenticate -> cont",
        "search_docs -> parts",
        "load_memory -> parts",
        "remember_plan injected (durable",
        "add_today injected (transient",
        "model called",
        "turn finished",
        "outcome: completed",
        "reply:   Refunds are issued within 14 days of your return.",
    ):
        assert expected in out, expected


def test_demo_timeline_has_the_retrieval_members_in_parallel() -> None:
    # Both members start before either finishes: the group does not serialize latency.
    lines = _turnplug("demo").stdout.splitlines()
    index = {
        key: next(i for i, line in enumerate(lines) if key in line)
        for key in (
            "search_docs started",
            "load_memory started",
            "load_memory -> parts",
            "search_docs -> parts",
        )
    }
    assert max(index["search_docs started"], index["load_memory started"]) < min(
        index["load_memory -> parts"], index["search_docs -> parts"]
    )


def test_demo_shows_the_history_untouched_before_the_injections() -> None:
    out = _turnplug("demo").stdout
    sent = out.split("what the model was sent")[1].split("injections\n")[0].splitlines()[1:]
    roles = [
        line.split()[0] for line in sent if line.startswith("  ") and not line.startswith("   ")
    ]
    assert roles == ["system", "user", "assistant", "user"]


@pytest.mark.parametrize("args", [[], ["nope"]])
def test_usage_errors_exit_2_with_one_clear_line(args: list[str]) -> None:
    done = _turnplug(*args)
    assert done.returncode == 2
    assert "usage: turnplug" in done.stderr
    assert "Traceback" not in done.stderr
