"""`turnplug log`, run as a user would: a subprocess reading a real SQLite file or server.

The conversation is written by a real session: a durable note, a transient note, a durable
synthetic tool call, a rejected first attempt, and a background hook's durable summary.
"""

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
import trio

from pipeline import Pipeline, block, cont, hook, regenerate, tool
from pipeline.logs import LogEntry, PostgresLog, SQLiteLog, entry_from_dict
from pipeline.testing import ScriptedModel
from turns import Message, Text, ToolCall, ToolResult

from ..logs import Backend, close, read_only_files
from .cli_support import TURNPLUG, environment, turnplug, write_config

CONVERSATION = "support-42"
COMMIT_TIME = re.compile(r"committed (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$")


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
    lines = done.stdout.splitlines()
    for index in (2, 10):
        lines[index] = COMMIT_TIME.sub("committed <time>", lines[index])
    assert lines == [
        "conversation 'support-42': 2 commits, 5 messages",
        "",
        f"commit 1  {ref}  committed <time>",
        '  assistant  [injected by prefs] -> get_preferences({"user": "ada"})  [call_1]',
        '  tool       [injected by prefs] <- [call_1] {"language": "en"}',
        "  user       [injected by remember_plan] Plan: Pro.",
        "             How fast are refunds?",
        "  assistant  Refunds take 14 days.",
        "             Ask me anything.",
        "",
        f"commit 2  {ref}:summary  committed <time>",
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
        assert [sorted(item) for item in data["entries"]] == [
            ["committed_at", "messages", "turn_ref"]
        ] * 2
        shown = tuple(entry_from_dict({**item, "audit": None}) for item in data["entries"])
        assert shown == tuple(LogEntry(e.turn_ref, e.messages) for e in entries)


def test_log_json_on_an_output_that_is_not_utf8_is_ascii(tmp_path):
    """Bug caught: on a Latin-1 standard output `log --json` wrote "é" as the byte 0xE9,
    which a program reading JSON as UTF-8 (jq) refused."""
    reply = "Caf\u00e9 \u2014 \U0001f600"
    config = write_config(tmp_path, f'[model]\nprovider = "scripted"\nreplies = ["{reply}"]\n')
    where = str(tmp_path / "chat.db")
    assert turnplug("run", config, "hi", "--log", where, "--conversation", "c").returncode == 0

    done = subprocess.run(
        [TURNPLUG, "log", "c", "--log", where, "--json"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
        env=environment(PYTHONIOENCODING="latin-1"),
    )

    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.isascii()
    [entry] = json.loads(done.stdout)["entries"]  # read as UTF-8
    assert entry["messages"][-1]["parts"][0]["text"] == reply


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


async def test_log_shows_control_characters_escaped_not_acted_on(tmp_path):
    """Bug: `turnplug log` wrote what clients and models said as is, so an escape sequence
    stored in a message (or in a conversation's id) reached the reader's terminal, which
    acted on it (clear the screen, set the title or the clipboard), and a carriage return
    drew over the line."""
    path = tmp_path / "log.db"
    pipe = Pipeline(model=ScriptedModel(["fine\rforged answer\x1b]0;pwned\x07"]))
    async with SQLiteLog(path) as log, pipe.session(log=log, conversation_id="c\x1b[2J") as s:
        await s.send("hi\x1b[31m there")

    shown = await anyio.to_thread.run_sync(turnplug, "log", "c\x1b[2J", "--log", str(path))
    listed = await anyio.to_thread.run_sync(turnplug, "log", "--log", str(path))

    assert shown.returncode == listed.returncode == 0
    assert "\x1b" not in shown.stdout + listed.stdout
    assert "\r" not in shown.stdout
    lines = shown.stdout.splitlines()
    assert lines[0] == "conversation 'c\\x1b[2J': 1 commit, 2 messages"
    assert lines[3:] == [
        "  user       hi\\x1b[31m there",
        "  assistant  fine\\rforged answer\\x1b]0;pwned\\x07",
    ]
    assert listed.stdout.splitlines()[2].startswith("  c\\x1b[2J ")


async def test_log_shows_a_message_with_crlf_line_breaks_line_by_line(tmp_path):
    """Bug: a message written with CRLF line breaks (a Windows client, a form) was shown
    with a literal \\r at the end of each of its lines once control characters were shown
    escaped; the break is the line break it is."""
    path = tmp_path / "log.db"
    pipe = Pipeline(model=ScriptedModel(["first\r\nsecond"]))
    async with SQLiteLog(path) as log, pipe.session(log=log, conversation_id="c") as s:
        await s.send("one\r\ntwo")

    shown = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", str(path))

    assert shown.returncode == 0
    assert shown.stdout.splitlines()[3:] == [
        "  user       one",
        "             two",
        "  assistant  first",
        "             second",
    ]


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path):
    path = tmp_path / "nope.db"

    line = one_line_error(turnplug("log", CONVERSATION, "--log", str(path)))

    assert line.startswith("turnplug: error: LogError: no log at")
    assert str(path) in line
    assert not path.exists()


def test_a_directory_is_an_error_that_says_so(tmp_path):
    """Catches: `turnplug log --log DIR` saying the file does not exist when there is a
    directory at that path."""
    path = tmp_path / "logs.db"
    path.mkdir()

    line = one_line_error(turnplug("log", "--log", str(path)))

    assert "is a directory, not an SQLite database file" in line
    assert "does not exist" not in line


def test_a_file_that_is_not_a_log_is_an_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a database " * 100)

    line = one_line_error(turnplug("log", CONVERSATION, "--log", str(path)))

    assert "not an SQLite database" in line
    assert str(path) in line


@pytest.mark.parametrize("listing", [False, True])
def test_a_commit_time_changed_by_hand_is_a_log_error_naming_the_turn(tmp_path, listing):
    """Catches: a committed_at that is no time failing as `ValueError: Invalid isoformat
    string` with exit 1, instead of a LogError (exit 2) as for unreadable messages."""
    path = str(tmp_path / "log.db")
    entries = trio.run(write_conversation, Backend("sqlite", path, lambda: SQLiteLog(path)))
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE turnplug_turns SET committed_at = 'garbage'")

    args = ["log", "--log", path] if listing else ["log", CONVERSATION, "--log", path]
    line = one_line_error(turnplug(*args))

    assert line.startswith("turnplug: error: LogError:")
    assert "'garbage'" in line
    assert repr(CONVERSATION) in line
    if not listing:
        assert repr(entries[0].turn_ref) in line


@pytest.mark.parametrize("listing", [False, True])
@pytest.mark.parametrize("wal", [False, True], ids=["rollback journal", "WAL mode"])
def test_log_refuses_an_sqlite_file_that_is_no_log_and_leaves_it_as_it_was(tmp_path, wal, listing):
    """Catches `turnplug log`, which only reads, turning another program's SQLite database
    (a mistyped --log) into a log, switching it to WAL mode and adding turnplug's tables,
    then reporting "nothing committed" as if all were well; and, for a database in WAL
    mode, leaving ``-shm`` and ``-wal`` files next to it after refusing it."""
    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        if wal:
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE users (id INTEGER)")
        db.commit()
    before = path.read_bytes()

    args = ["log", "--log", str(path)] if listing else ["log", CONVERSATION, "--log", str(path)]
    line = one_line_error(turnplug(*args))

    assert line.startswith(f"turnplug: error: LogError: SQLiteLog({str(path)!r}): no log in")
    assert "without turnplug's tables" in line
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


LEFT_BY_A_DEAD_WRITER = """
import os, sys, trio
from pipeline.logs import SQLiteLog
from turns import Message

async def main():
    log = SQLiteLog(sys.argv[1])
    await log.append("c", "t1", (Message.user("hi"),))
    await log.append("c", "t2", (Message.user("again"),))
    os._exit(0)  # never closed: the commits stay in the -wal file

trio.run(main)
"""


@pytest.mark.parametrize("left", ["closed", "by a dead writer"])
async def test_log_reads_a_read_only_log_and_writes_nothing_beside_it(tmp_path, left):
    """Bug caught: `turnplug log` opened the file for writing, so it failed on a read-only
    mount or for a file the user may only read ("attempt to write a readonly database"), and
    otherwise created ``-wal`` and ``-shm`` files beside it, or folded a ``-wal`` file a dead
    writer left into it.

    Root ignores the permissions; what is asserted (no byte, mtime or file changed) holds
    for any user."""
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "log.db"
    if left == "closed":
        async with SQLiteLog(path) as log:
            await log.append("c", "t1", (Message.user("hi"),))
            await log.append("c", "t2", (Message.user("again"),))
    else:
        writer = [sys.executable, "-c", LEFT_BY_A_DEAD_WRITER, str(path)]
        await anyio.run_process(writer)
        assert (directory / "log.db-wal").exists()
    with read_only_files(directory):
        files = sorted(directory.iterdir())
        # The -shm file is the WAL's index in shared memory, which every reader may update.
        kept = [file for file in files if not file.name.endswith("-shm")]
        before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in kept]
        shown = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", str(path))
        listed = await anyio.to_thread.run_sync(turnplug, "log", "--log", str(path))

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "conversation 'c': 2 commits, 2 messages"
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0] == f"{path}: 1 conversation"
    assert sorted(directory.iterdir()) == files
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in kept] == before
    assert directory.stat().st_mtime_ns == 1_000_000_000


def test_an_empty_file_reads_as_a_log_with_no_conversations_and_is_left_empty(tmp_path):
    """Bug: an empty file (a first run that stopped before committing anything) was refused
    with "pass the path of the log file", which the user had done."""
    path = tmp_path / "chats.db"
    path.write_bytes(b"")

    listed = turnplug("log", "--log", str(path))
    shown = turnplug("log", CONVERSATION, "--log", str(path))
    machine = turnplug("log", CONVERSATION, "--log", str(path), "--json")

    assert (listed.returncode, listed.stdout) == (0, f"{path}: no conversations\n")
    assert (shown.returncode, shown.stdout) == (
        0,
        f"conversation {CONVERSATION!r}: nothing committed\n",
    )
    assert (machine.returncode, json.loads(machine.stdout)) == (
        0,
        {"conversation": CONVERSATION, "entries": []},
    )
    assert path.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.db"]


async def test_log_reads_a_log_whose_path_is_not_utf_8(tmp_path):
    """Bug: a log at a path holding bytes that are not UTF-8 (which the command line gives
    as a string with surrogates) failed with UnicodeEncodeError while checking that the
    file holds a log."""
    path = os.path.join(os.fsencode(tmp_path), b"caf\xe9.db")
    async with SQLiteLog(os.fsdecode(path)) as log:
        await log.append("c", "t1", (Message.user("hi"),))

    shown = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", os.fsdecode(path))

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[3:] == ["  user       hi"]


async def test_log_reads_a_log_whose_path_starts_with_two_slashes(tmp_path):
    """Bug caught: a path starting with "//" (the same file as with one, on POSIX) was read
    as a URI's authority, and the command failed with "invalid uri authority"."""
    path = tmp_path / "chats.db"
    async with SQLiteLog(path) as log:
        await log.append("c", "t1", (Message.user("hi"),))

    shown = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", f"/{path}")

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[3:] == ["  user       hi"]


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


def tables_in(dsn: str) -> list[str]:
    """The tables and functions in the first schema of `dsn`'s search_path."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db:
        rows = db.execute(
            "SELECT table_name::text FROM information_schema.tables"
            " WHERE table_schema = current_schema()"
            " UNION ALL SELECT proname::text FROM pg_proc"
            " WHERE pronamespace = current_schema()::regnamespace"
        ).fetchall()
    return sorted(row[0] for row in rows)


@pytest.mark.parametrize("listing", [False, True])
async def test_log_refuses_a_postgres_database_that_holds_no_log_and_creates_nothing(
    postgres, listing
):
    """Bug caught: `turnplug log --log DSN`, which only reads, created turnplug's tables and
    function in a database (a mistyped DSN, a schema left out) that held no log, then
    reported "nothing committed" as if all were well. (The test server trusts loopback: any
    password is accepted.)"""
    dsn = postgres.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@", 1)
    assert "s3cret-pw" in dsn
    args = ["log", "--log", dsn] if listing else ["log", CONVERSATION, "--log", dsn]

    done = await anyio.to_thread.run_sync(turnplug, *args)

    line = one_line_error(done)
    assert line.startswith("turnplug: error: LogError:")
    assert "holds no turnplug log" in line
    assert postgres.split("?")[0] in line
    assert "s3cret" not in line
    assert await anyio.to_thread.run_sync(tables_in, postgres) == []


@pytest.mark.parametrize("place", ["user part", "password", "sslpassword"])
async def test_the_listing_names_the_log_without_the_dsns_password(postgres, place):
    """Catches `turnplug log --log DSN` printing the DSN, password and all, at the head of
    its list of conversations, where the log's repr and errors leave the password out.
    (The test server trusts loopback: any password is accepted.)"""
    if place == "user part":
        dsn = postgres.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@", 1)
    else:
        dsn = f"{postgres}&{place}=s3cret-pw"
    assert "s3cret-pw" in dsn
    pipe = Pipeline(model=ScriptedModel(["hello"]))
    async with PostgresLog(dsn) as log, pipe.session(log=log, conversation_id="c") as session:
        await session.send("hi")

    done = await anyio.to_thread.run_sync(turnplug, "log", "--log", dsn)

    assert (done.returncode, done.stderr) == (0, "")
    assert "s3cret" not in done.stdout
    assert done.stdout.splitlines()[0] == f"{postgres}: 1 conversation"


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


def test_log_shows_when_each_turn_was_committed(written):
    """Catches: `turnplug log` showing no commit time for a turn."""
    where, _ = written
    before = datetime.now(UTC) - timedelta(minutes=5)

    done = turnplug("log", CONVERSATION, "--log", where)

    commits = [line for line in done.stdout.splitlines() if line.startswith("commit ")]
    times = [COMMIT_TIME.search(line) for line in commits]
    assert len(times) == 2
    assert all(match is not None for match in times), commits
    for match in times:
        assert match is not None
        moment = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        assert before <= moment <= datetime.now(UTC)


async def test_log_without_a_conversation_lists_the_conversations(durable: Backend):
    """Catches: `turnplug log --log PATH` without a conversation being a usage error instead
    of listing the conversations (id, turns, last commit time)."""
    pipe = Pipeline(model=ScriptedModel(["one", "two", "three"]))
    log = durable.open()
    try:
        for conversation, messages in (("older", ["a", "b"]), ("newer", ["c"])):
            async with pipe.session(log=log, conversation_id=conversation) as session:
                for text in messages:
                    await session.send(text)
            await anyio.sleep(0.01)  # distinct commit times, to order by
    finally:
        await close(log)

    done = await anyio.to_thread.run_sync(turnplug, "log", "--log", durable.where)
    machine = await anyio.to_thread.run_sync(turnplug, "log", "--log", durable.where, "--json")

    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0] == f"{durable.where}: 2 conversations"
    assert lines[1] == "  CONVERSATION  TURNS  LAST COMMIT"
    rows = [re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", "<time>", line) for line in lines[2:]]
    assert rows == ["  newer             1  <time>", "  older             2  <time>"]
    listed = json.loads(machine.stdout)["conversations"]
    assert [(c["conversation_id"], c["turns"], c["messages"]) for c in listed] == [
        ("newer", 1, 2),
        ("older", 2, 4),
    ]
    assert listed[0]["last_committed_at"] > listed[1]["last_committed_at"]


async def test_log_audit_shows_the_tool_runs_of_rejected_attempts_too(durable: Backend):
    """Catches: `turnplug log --audit` showing no tool runs, so a rejected attempt's tool
    calls (which never reach the committed messages) were nowhere to be seen."""

    @tool
    def stock(item: str) -> str:
        """How many are in stock."""
        return f"{item}: 3"

    def no_numbers(turn):
        if any(ch.isdigit() for ch in turn.reply.text):
            return regenerate("No numbers.")
        return cont(turn)

    model = ScriptedModel(
        [[ToolCall("c1", "stock", {"item": "mug"})], "3 mugs.", "A few mugs are left."]
    )
    pipe = Pipeline(model=model, tools=[stock], post=[no_numbers])
    log = durable.open()
    try:
        async with pipe.session(log=log, conversation_id=CONVERSATION) as session:
            await session.send("Any mugs?")
    finally:
        await close(log)

    done = await anyio.to_thread.run_sync(
        turnplug, "log", CONVERSATION, "--log", durable.where, "--audit"
    )

    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    attempt 1:"))
    assert lines[start + 1] == '      call 1: -> stock({"item": "mug"})  [c1] / <- [c1] mug: 3'
    assert lines[start + 2].startswith("    attempt 2: 1 model call,")
    assert lines[start].endswith("no_numbers: No numbers.")


async def test_log_says_which_tool_hook_blocked_a_call_or_rewrote_it(tmp_path):
    """Catches: `turnplug log` showing a blocked call's result, a call run with rewritten
    arguments and a rewritten result as if they were the model's call and the tool's own
    answer (the call shows what the model asked: here `/etc`, though the tool read
    `/jail/etc`), with nothing of the hooks that shaped them."""

    @tool
    def rm(path: str) -> str:
        """Remove a file."""
        return "removed"

    @tool
    def read(path: str) -> str:
        """Read a file."""
        return "secret content"

    @hook(match="rm", name="no_rm")
    def no_rm(call, turn):
        return block("never delete")

    @hook(match="read", name="jail")
    def jail(call, turn):
        return cont(call.with_arguments({"path": "/jail" + call.arguments["path"]}))

    @hook(match="read", name="scrub")
    def scrub(call, result, turn):
        return cont(result.with_content("[scrubbed]"))

    calls = [ToolCall("c1", "rm", {"path": "/"}), ToolCall("c2", "read", {"path": "/etc"})]
    pipe = Pipeline(
        model=ScriptedModel([calls, "done"]),
        tools=[rm, read],
        before_tool=[no_rm, jail],
        after_tool=[scrub],
    )
    path = str(tmp_path / "log.db")
    async with SQLiteLog(path) as log, pipe.session(log=log, conversation_id="c") as session:
        await session.send("go")

    done = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", path)

    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[4:] == [
        '  assistant  -> rm({"path": "/"})  [c1]',
        '             -> read({"path": "/etc"})  [c2]',
        "  tool       [blocked by no_rm] <- [c1] error (hook_blocked) never delete",
        '  tool       [ran with {"path": "/jail/etc"}: arguments rewritten by jail]'
        " [result rewritten by scrub] <- [c2] [scrubbed]",
        "  assistant  done",
    ]


async def test_log_shows_a_lone_surrogate_escaped_instead_of_failing(tmp_path):
    """Catches `turnplug log` failing with UnicodeEncodeError (exit 1, after half its output)
    on a turn holding a lone surrogate (a ``\\ud800`` escape in a client's JSON), which every
    log stores and reads back: the readable view shows it escaped, and --json escapes it so
    that it still reads back exactly."""
    text, meta = "a\ud800b", {"k\udc80": "v"}
    path = str(tmp_path / "log.db")
    async with SQLiteLog(path) as log:
        await log.append("c", "t1", [Message.user([Text(text, meta=meta)])])

    shown = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", path)
    machine = await anyio.to_thread.run_sync(turnplug, "log", "c", "--log", path, "--json")

    assert (shown.returncode, shown.stderr) == (0, "")
    assert shown.stdout.splitlines()[-1] == "  user       a\\ud800b"
    assert (machine.returncode, machine.stderr) == (0, "")
    (part,) = json.loads(machine.stdout)["entries"][0]["messages"][0]["parts"]
    assert (part["text"], part["meta"]) == (text, meta)
