"""`turnplug log`, run as a user would: a subprocess reading a real SQLite file or server.

The conversation is written by a real session: a durable note, a transient note, a durable
synthetic tool call, a rejected first attempt, and a background hook's durable summary.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from pipeline import Pipeline, cont, hook, regenerate
from pipeline.logs import LogEntry, SQLiteLog, entry_from_dict
from pipeline.testing import ScriptedModel
from turns import Text, ToolCall, ToolResult

from ..logs import Backend, close

TURNPLUG = str(Path(sys.executable).with_name("turnplug"))
CONVERSATION = "support-42"


def turnplug(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TURNPLUG, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@hook(durable=True)
def remember_plan(turn):
    return cont(turn.inject(Text("Plan: Pro.")))


def today(turn):
    return cont(turn.inject(Text("Today is Monday.")))


@hook(durable=True)
def prefs(turn):
    return cont(
        turn.inject(
            ToolCall("call_1", "get_preferences", {"user": "ada"}),
            ToolResult("call_1", '{"language": "en"}'),
        )
    )


def guard(turn):
    if "internal" in turn.reply.text:
        return regenerate("No internal references.")
    return cont(turn)


@hook(durable=True, background=True)
def summary(turn):
    return cont(turn.inject(Text("Summary: refunds.")))


async def write_conversation(backend: Backend) -> tuple[LogEntry, ...]:
    pipe = Pipeline(
        model=ScriptedModel(["See internal RF-1.", "Refunds take 14 days.\nAsk me anything."]),
        pre=[remember_plan, today, prefs],
        post=[guard, summary],
    )
    log = backend.open()
    try:
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            await session.send("How fast are refunds?")
        return await log.entries(CONVERSATION)
    finally:
        await close(log)


@pytest.fixture
def written(durable: Backend) -> tuple[str, tuple[LogEntry, ...]]:
    """Where the conversation is (an SQLite path or a DSN), and its entries."""
    return durable.where, trio.run(write_conversation, durable)


def test_log_shows_roles_text_tool_calls_and_who_injected_what(written):
    where, entries = written

    done = turnplug("log", CONVERSATION, "--log", where)

    assert (done.returncode, done.stderr) == (0, "")
    ref = entries[0].turn_ref
    assert done.stdout.splitlines() == [
        "conversation 'support-42': 2 commits, 5 messages",
        "",
        f"commit 1  {ref}",
        '  assistant  [injected by prefs] -> get_preferences({"user": "ada"})  [call_1]',
        '  tool       [injected by prefs] <- [call_1] {"language": "en"}',
        "  user       [injected by remember_plan] Plan: Pro.",
        "             How fast are refunds?",
        "  assistant  Refunds take 14 days.",
        "             Ask me anything.",
        "",
        f"commit 2  {ref}:summary",
        "  user       [injected by summary] Summary: refunds.",
    ]


def test_log_audit_shows_transient_injections_attempts_rejections_and_hooks(written):
    where, _ = written

    done = turnplug("log", CONVERSATION, "--log", where, "--audit")

    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    start = lines.index("             Ask me anything.") + 1
    assert lines[start : start + 4] == [
        "  audit: completed, 2 attempts",
        "    injected by remember_plan (pre, durable): Plan: Pro.",
        "    injected by today (pre, transient): Today is Monday.",
        '    injected by prefs (pre, durable): -> get_preferences({"user": "ada"})  [call_1];'
        ' <- [call_1] {"language": "en"}',
    ]
    attempts = [line for line in lines if line.startswith("    attempt ")]
    assert [line.split(",")[0] for line in attempts] == [
        "    attempt 1: 1 model call",
        "    attempt 2: 1 model call",
    ]
    assert attempts[0].endswith("; rejected by guard: No internal references.")
    hooks = [line.split(" ->")[0] for line in lines if line.startswith("    hook ")]
    assert hooks == [
        "    hook remember_plan (pre 1)",
        "    hook today (pre 2)",
        "    hook prefs (pre 3)",
        "    hook guard (post 1)",
        "    hook guard (post 1)",
    ]
    assert lines[-1] == "  audit: none recorded (committed without one, e.g. by a background hook)"


@pytest.mark.parametrize("audit", [False, True], ids=["messages", "with-audit"])
def test_log_json_is_every_entry_as_entry_to_dict_writes_it(written, audit):
    where, entries = written

    done = turnplug("log", CONVERSATION, "--log", where, "--json", *(["--audit"] * audit))

    assert (done.returncode, done.stderr) == (0, "")
    data = json.loads(done.stdout)
    assert data["conversation"] == CONVERSATION
    if audit:
        assert tuple(entry_from_dict(item) for item in data["entries"]) == entries
    else:
        assert [sorted(item) for item in data["entries"]] == [["messages", "turn_ref"]] * 2
        shown = tuple(entry_from_dict({**item, "audit": None}) for item in data["entries"])
        assert shown == tuple(LogEntry(e.turn_ref, e.messages) for e in entries)


def test_an_unknown_conversation_shows_as_empty(written):
    where, _ = written

    text = turnplug("log", "never-seen", "--log", where)
    machine = turnplug("log", "never-seen", "--log", where, "--json")

    assert (text.returncode, text.stdout) == (0, "conversation 'never-seen': nothing committed\n")
    assert (machine.returncode, json.loads(machine.stdout)) == (
        0,
        {"conversation": "never-seen", "entries": []},
    )


# -- errors: exit code 2, one line naming the culprit, no traceback ---------------------------


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path):
    path = tmp_path / "nope.db"

    line = one_line_error(turnplug("log", CONVERSATION, "--log", str(path)))

    assert line.startswith("turnplug: error: LogError: no log at")
    assert str(path) in line
    assert not path.exists()


def test_a_file_that_is_not_a_log_is_an_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a database " * 100)

    line = one_line_error(turnplug("log", CONVERSATION, "--log", str(path)))

    assert "not an SQLite database" in line
    assert str(path) in line


def test_a_malformed_dsn_is_an_error_that_does_not_echo_the_password():
    line = one_line_error(turnplug("log", CONVERSATION, "--log", "postgresql://ada:s3cret pw@db/x"))

    assert "not a valid connection string" in line
    assert "s3cret" not in line


def test_an_unreachable_server_is_an_error_that_does_not_echo_the_password():
    dsn = "postgresql://ada:s3cret-pw@127.0.0.1:1/chats?connect_timeout=2"

    line = one_line_error(turnplug("log", CONVERSATION, "--log", dsn))

    assert "cannot reach the database" in line
    assert "postgresql://ada@127.0.0.1:1/chats" in line
    assert "s3cret" not in line


def test_an_empty_conversation_id_is_a_usage_error(tmp_path):
    path = tmp_path / "log.db"
    trio.run(_empty_log, path)

    done = turnplug("log", "", "--log", str(path))

    assert done.returncode == 2
    assert "conversation id must not be empty" in done.stderr


def test_log_needs_the_log_option():
    done = turnplug("log", CONVERSATION)

    assert done.returncode == 2
    assert "--log" in done.stderr


async def _empty_log(path: Path) -> None:
    async with SQLiteLog(path):
        pass
