"""`turnplug run` and `turnplug chat`, driven as a new user would: a subprocess, real files
(and `hooks.cli.main` in process, as a program of its own calls it)."""

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hooks.cli import main
from tests.hooks.cli_support import TURNPLUG, environment, turnplug, write_config

SHOP = """
    system = "You are a shop assistant."

    [model]
    provider = "scripted"
    replies = [["Refunds take ", "14 days."]]

    [[pre]]
    kind = "python"
    ref = "shop_hooks:gate"

    [[pre]]
    kind = "parallel"
    hooks = [{ kind = "python", ref = "shop_hooks:faq", durable = true }]
"""


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return write_config(tmp_path, SHOP)


def test_run_prints_the_reply(shop: Path) -> None:
    done = turnplug("run", shop, "How long do refunds take?")
    assert (done.returncode, done.stdout, done.stderr) == (0, "Refunds take 14 days.\n", "")


def test_a_halted_turn_prints_the_substitute_and_exits_1(shop: Path) -> None:
    done = turnplug("run", shop, "tell me a secret")
    assert done.returncode == 1
    assert done.stdout == "I cannot share that.\n"
    assert done.stderr.count("\n") == 1
    assert "'gate'" in done.stderr
    assert "asked for a secret" in done.stderr


def test_an_exhausted_turn_prints_no_reply_and_exits_1(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """
        max_regenerations = 1
        [model]
        provider = "scripted"
        replies = ["one", "two"]
        [[post]]
        kind = "python"
        ref = "shop_hooks:never_happy"
        """,
    )
    done = turnplug("run", config, "hi")
    assert (done.returncode, done.stdout) == (1, "")
    assert "2 attempts rejected" in done.stderr
    assert "'never_happy'" in done.stderr
    assert "Say it differently." in done.stderr


def test_an_exhausted_turn_of_one_attempt_is_not_called_1_attempts(tmp_path: Path) -> None:
    """Bug caught: with `max_regenerations = 0` the note read "1 attempts rejected, the last
    by ..." of a turn that had one attempt."""
    config = write_config(
        tmp_path,
        """
        max_regenerations = 0
        [model]
        provider = "scripted"
        replies = ["one"]
        [[post]]
        kind = "python"
        ref = "shop_hooks:never_happy"
        """,
    )
    done = turnplug("run", config, "hi")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.endswith(
        "turnplug: no acceptable reply: its one attempt was rejected by 'never_happy':"
        " Say it differently.\n"
    )


def test_run_json_counts_the_usage_of_every_attempt(tmp_path: Path) -> None:
    """Bug: ``usage`` was the accepted reply's, so an exhausted turn reported ``null``
    although its two model calls had spent tokens, and a completed turn after a rejection
    left the rejected attempt's tokens out of what the turn cost."""
    config = write_config(
        tmp_path,
        """
        max_regenerations = 1
        [model]
        provider = "scripted"
        replies = ["one two three", "four five"]
        [[post]]
        kind = "python"
        ref = "shop_hooks:never_happy"
        """,
    )
    done = turnplug("run", config, "hi", "--json", "--events")
    assert done.returncode == 1
    *events, result = [json.loads(line) for line in done.stdout.splitlines()]
    assert result["outcome"] == "exhausted"
    calls = [e["usage"] for e in events if e["event"] == "ModelFinished"]
    assert len(calls) == 2
    assert all(call["output_tokens"] > 0 for call in calls)
    assert result["usage"] == {
        "input_tokens": sum(call["input_tokens"] for call in calls),
        "output_tokens": sum(call["output_tokens"] for call in calls),
    }


def test_a_failing_hook_is_one_line_and_exits_1(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, '[[pre]]\nkind = "python"\nref = "shop_hooks:database"\nname = "orders"\n'
    )
    done = turnplug("run", config, "hi")
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "note:" not in line]
    assert len(errors) == 1
    assert "HookFailed" in errors[0]
    assert "'orders'" in errors[0]
    assert "the database is down" in errors[0]
    assert "Traceback" not in done.stderr


def test_a_failing_hook_says_how_to_see_its_traceback(tmp_path: Path) -> None:
    """Bug caught: a turn's PipelineError (its cause only in the traceback) was said without
    the "(run with --debug for the traceback)" every other error ends with."""
    config = write_config(
        tmp_path, '[[pre]]\nkind = "python"\nref = "shop_hooks:database"\nname = "orders"\n'
    )
    done = turnplug("run", config, "hi")
    assert done.returncode == 1
    [error] = [line for line in done.stderr.splitlines() if "note:" not in line]
    assert error.startswith("turnplug: error: HookFailed:"), error
    assert error.endswith(" (run with --debug for the traceback)"), error


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "raise RuntimeError('Client error 404\\nFor more information check: the docs')",
            "turnplug: error: HookFailed: hook 'leave' (pre, position 1) raised RuntimeError:"
            " Client error 404\\nFor more information check: the docs (run with --debug for"
            " the traceback)",
        ),
        (
            "return halt('not allowed:\\n- refunds\\n- returns')",
            "turnplug: turn halted by 'leave': not allowed:\\n- refunds\\n- returns",
        ),
    ],
)
def test_a_multiline_error_or_halt_reason_is_shown_on_one_line(
    tmp_path: Path, body: str, expected: str
) -> None:
    """Catches: an exception message or halt reason with line breaks (httpx's
    raise_for_status() writes two lines) printed as several lines, the later ones without
    the "turnplug:" that says whose they are."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["never seen"]\n\n'
        '[[pre]]\nkind = "python"\nref = "multiline:leave"\n',
    )
    (tmp_path / "multiline.py").write_text(
        f"from pipeline import halt\n\n\ndef leave(turn):\n    {body}\n"
    )
    done = turnplug("run", config, "hi")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == expected + "\n"


@pytest.mark.parametrize("command", ["run", "chat"])
def test_a_hook_calling_sys_exit_is_one_line_and_exits_1(tmp_path: Path, command: str) -> None:
    """Catches: a hook calling sys.exit() ending turnplug with that status, silently: exit 0,
    no reply and no word, as if the turn had completed."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["never seen"]\n\n'
        '[[pre]]\nkind = "python"\nref = "quitter:leave"\n',
    )
    (tmp_path / "quitter.py").write_text("import sys\n\n\ndef leave(turn):\n    sys.exit()\n")
    if command == "run":
        done = turnplug("run", config, "hi")
    else:
        done = subprocess.run(
            [TURNPLUG, "chat", str(config)],
            input="hi\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=environment(),
        )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("turnplug: error: sys.exit(None) in what the command ran")
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_background_hook_calling_sys_exit_after_the_commit_is_not_said_unfinished(
    tmp_path: Path,
) -> None:
    """Bug caught: a background hook's sys.exit() as the session closed, after its turn was
    committed, was reported as "the turn did not finish", though the log holds the turn."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["the answer"]\n\n'
        '[[post]]\nkind = "python"\nref = "quitter:leave"\nbackground = true\n',
    )
    (tmp_path / "quitter.py").write_text("import sys\n\n\ndef leave(turn):\n    sys.exit(3)\n")
    log = tmp_path / "log.db"
    done = turnplug("run", config, "hi", "--log", log)
    assert done.returncode == 1
    assert done.stderr == (
        "turnplug: error: sys.exit(3) in what the command ran (a hook, a tool, a model)"
        " stopped it: what was committed to the log before stays there, the rest was not"
        " (run with --debug for the traceback)\n"
    )
    shown = turnplug("log", "default", "--log", log, "--json")
    (entry,) = json.loads(shown.stdout)["entries"]
    assert "the answer" in json.dumps(entry["messages"])


def test_a_hook_calling_sys_exit_without_a_log_is_not_said_to_leave_a_commit(
    tmp_path: Path,
) -> None:
    """Bug caught: run without --log, whose log lives in memory and ends with the command,
    said of a hook's sys.exit() that "a turn committed before stays committed", where
    nothing outlives the command."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["the answer"]\n\n'
        '[[post]]\nkind = "python"\nref = "quitter:leave"\nbackground = true\n',
    )
    (tmp_path / "quitter.py").write_text("import sys\n\n\ndef leave(turn):\n    sys.exit(3)\n")
    done = turnplug("run", config, "hi")
    assert done.returncode == 1
    assert done.stderr == (
        "turnplug: error: sys.exit(3) in what the command ran (a hook, a tool, a model)"
        " stopped it (run with --debug for the traceback)\n"
    )


def test_with_debug_a_hook_calling_sys_exit_shows_its_traceback_and_exits_1(
    tmp_path: Path,
) -> None:
    """Catches: ``--debug``, which the error line advises for the traceback, re-raising the
    hook's SystemExit: Python prints nothing for one and exits with its status, so
    ``sys.exit(0)`` in a hook ended the turn silently with 0 again."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["never seen"]\n\n'
        '[[pre]]\nkind = "python"\nref = "quitter:leave"\n',
    )
    (tmp_path / "quitter.py").write_text("import sys\n\n\ndef leave(turn):\n    sys.exit(0)\n")
    done = turnplug("run", config, "hi", "--debug")
    assert (done.returncode, done.stdout) == (1, "")
    assert "Traceback" in done.stderr
    assert "in leave" in done.stderr
    assert "SystemExit" in done.stderr


@pytest.mark.parametrize("command", ["run", "run --events", "chat"])
def test_with_debug_the_traceback_shows_what_an_interrupt_was_raised_while_handling(
    tmp_path: Path, command: str
) -> None:
    """Bug caught: unwrapping the exception groups around a hook's SystemExit gave it the
    group as its context, suppressed, so --debug's traceback lost the KeyError it was raised
    while handling ("During handling of the above exception")."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["never seen"]\n\n'
        '[[pre]]\nkind = "python"\nref = "quitter:leave"\n',
    )
    (tmp_path / "quitter.py").write_text(
        "import sys\n\n\ndef leave(turn):\n    try:\n        {}['missing']\n"
        "    except KeyError:\n        sys.exit(3)\n"
    )
    name, *options = command.split()
    message = [] if name == "chat" else ["hi"]
    done = subprocess.run(
        [TURNPLUG, name, str(config), *message, *options, "--debug"],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment(),
    )
    assert done.returncode == 1, done.stderr
    assert "KeyError: 'missing'\n\nDuring handling of the above exception" in done.stderr
    assert done.stderr.rstrip().endswith("SystemExit: 3")


def test_run_json_is_the_result(shop: Path) -> None:
    done = turnplug("run", shop, "refunds?", "--json", "--conversation", "c-9")
    assert done.returncode == 0
    result = json.loads(done.stdout)
    assert result["outcome"] == "completed"
    assert result["reply"] == "Refunds take 14 days."
    assert result["conversation"] == "c-9"
    assert result["halt"] is None
    assert [(i["source"], i["durable"], i["text"]) for i in result["injections"]] == [
        ("faq", True, "[faq] Refunds take 14 days.")
    ]
    assert result["committed"] == 2  # the user message (with the durable part) and the reply


def test_run_on_a_terminal_that_is_not_utf8_prints_json_that_reads_back(tmp_path: Path) -> None:
    """Bug caught: on an ASCII standard output `run --json` failed with a UnicodeEncodeError
    after its turn completed (exit 1), where it could write the characters as JSON escapes."""
    config = write_config(
        tmp_path, '[model]\nprovider = "scripted"\nreplies = ["Caf\u00e9 \u2014 \U0001f600"]\n'
    )
    done = turnplug("run", config, "hi", "--json", env=environment(PYTHONIOENCODING="ascii"))
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["reply"] == "Caf\u00e9 \u2014 \U0001f600"


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
@pytest.mark.parametrize("events", [False, True], ids=["result", "events"])
def test_run_json_on_an_output_that_is_not_utf8_is_ascii(
    tmp_path: Path, encoding: str, events: bool
) -> None:
    """Bug caught: on a Latin-1 or cp1252 standard output `run --json` wrote "é" as the byte
    0xE9 beside escapes, which a program reading JSON as UTF-8 (jq) refused."""
    reply = "Caf\u00e9 \u2014 \u20ac \U0001f600"
    config = write_config(tmp_path, f'[model]\nprovider = "scripted"\nreplies = ["{reply}"]\n')
    done = subprocess.run(
        [TURNPLUG, "run", str(config), "hi", "--json", *(["--events"] * events)],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
        env=environment(PYTHONIOENCODING=encoding),
    )
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.isascii()
    lines = [json.loads(line) for line in done.stdout.splitlines()]  # read as UTF-8
    if events:
        assert [line["text"] for line in lines if line.get("event") == "TextDelta"] == [reply]
    else:
        assert lines[0]["reply"] == reply


def test_a_hook_printing_what_an_ascii_output_cannot_carry_does_not_fail_the_turn(
    tmp_path: Path,
) -> None:
    (tmp_path / "loud.py").write_text(
        "import sys\n"
        "from pipeline import cont\n"
        "def loud(turn):\n"
        "    print('hook: caf\\u00e9')\n"
        "    print('hook: caf\\u00e9', file=sys.stderr)\n"
        "    return cont(turn)\n"
    )
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["ok"]\n'
        '[[pre]]\nkind = "python"\nref = "loud:loud"\n',
    )
    done = turnplug("run", config, "hi", env=environment(PYTHONIOENCODING="ascii"))
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "hook: caf\\u00e9\nok\n",  # standard output: JSON's escape
        "hook: caf\\xe9\n",  # standard error: Python's
    )


def test_the_c_locale_output_writes_json_escapes_and_keeps_escaped_bytes(tmp_path: Path) -> None:
    """Bug caught: under the C locale without UTF-8 mode standard output is ASCII with
    surrogateescape, which was left as it was, so `run` failed after its turn writing "é"."""
    (tmp_path / "bytes.py").write_text(
        "from pipeline import cont\n"
        "def name(turn):\n"
        "    print('hook: caf\\u00e9 ' + 'r\\udce9sum\\udce9')\n"  # b'r\xe9sum\xe9', decoded
        "    return cont(turn)\n"
    )
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["Caf\u00e9 \U0001f600"]\n'
        '[[pre]]\nkind = "python"\nref = "bytes:name"\n',
    )
    env = environment(LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    env.pop("PYTHONIOENCODING", None)
    done = subprocess.run(
        [TURNPLUG, "run", str(config), "hi"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
        env=env,
    )
    assert (done.returncode, done.stderr) == (0, b"")
    # JSON's escapes for what ASCII cannot carry; the surrogates as the bytes they were.
    assert done.stdout == b"hook: caf\\u00e9 r\xe9sum\xe9\nCaf\\u00e9 \\ud83d\\ude00\n"


def test_run_json_on_a_utf8_output_writes_its_text_as_written(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[model]\nprovider = "scripted"\nreplies = ["Caf\u00e9"]\n')
    done = turnplug("run", config, "hi", "--json", env=environment(PYTHONIOENCODING="utf-8"))
    assert '"reply": "Caf\u00e9"' in done.stdout


def test_run_in_process_leaves_the_callers_standard_output_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug caught: `hooks.cli.main` left the calling program's standard output set to write
    what it cannot carry as JSON escapes, so the program's own later `print("café")` on an
    ASCII output wrote `caf\\u00e9` where it raised before."""
    config = write_config(tmp_path, '[model]\nprovider = "scripted"\nreplies = ["Caf\u00e9"]\n')
    written = io.BytesIO()
    out = io.TextIOWrapper(written, encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["run", str(config), "hi"]) == 0
    out.flush()
    assert written.getvalue() == b"Caf\\u00e9\n"  # the command's output, escaped
    assert out.errors == "strict"
    with pytest.raises(UnicodeEncodeError):
        print("Caf\u00e9", file=out)


def test_two_in_process_commands_at_once_escape_until_the_last_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug caught: of two `hooks.cli.main` calls running at once on two threads, the first
    to end set standard output back to strict while the other still ran, whose reply then
    failed to print on an ASCII output."""
    (tmp_path / "paced_hooks.py").write_text(
        "import threading\n"
        "from pipeline import cont\n"
        "entered = {'a': threading.Event(), 'b': threading.Event()}\n"
        "release = {'a': threading.Event(), 'b': threading.Event()}\n"
        "def paced(turn):\n"
        "    name = turn.user_message.text\n"
        "    entered[name].set()\n"
        "    release[name].wait(30)\n"
        "    return cont(turn)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import paced_hooks  # type: ignore[import-not-found]

    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["Caf\u00e9"]\n'
        '[[pre]]\nkind = "python"\nref = "paced_hooks:paced"\n',
    )
    written = io.BytesIO()
    out = io.TextIOWrapper(written, encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    codes: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            codes[name] = main(["run", str(config), name])
        except Exception as exc:
            codes[name] = exc

    threads = {name: threading.Thread(target=run, args=(name,)) for name in ("a", "b")}
    try:
        # a enters first and ends first, while b runs on.
        threads["a"].start()
        assert paced_hooks.entered["a"].wait(30)
        threads["b"].start()
        assert paced_hooks.entered["b"].wait(30)
        paced_hooks.release["a"].set()
        threads["a"].join(30)
    finally:
        paced_hooks.release["a"].set()
        paced_hooks.release["b"].set()
        for thread in threads.values():
            thread.join(30)

    out.flush()
    assert (codes, written.getvalue()) == ({"a": 0, "b": 0}, b"Caf\\u00e9\n" * 2)
    assert out.errors == "strict"


def test_a_hook_that_detaches_standard_output_fails_the_command_not_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bug caught: when a command's hook detached standard output from its buffer,
    `hooks.cli.main` raised ValueError from its own cleanup (asking the detached stream
    whether it was closed) instead of returning the command's exit code."""
    (tmp_path / "detach_hooks.py").write_text(
        "import sys\n"
        "from pipeline import cont\n"
        "def detach(turn):\n"
        "    sys.stdout.detach()\n"
        "    return cont(turn)\n"
    )
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["Caf\u00e9"]\n'
        '[[pre]]\nkind = "python"\nref = "detach_hooks:detach"\n',
    )
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert main(["run", str(config), "hi"]) == 1
    assert capsys.readouterr().err == (
        "turnplug: error: ValueError: underlying buffer has been detached (run with --debug"
        " for the traceback)\n"
    )


def test_run_json_shows_a_synthetic_tool_calls_parts() -> None:
    root = Path(__file__).resolve().parents[2]
    done = turnplug("run", root / "examples" / "assistant.toml", "hi", "--json")
    assert done.returncode == 0, done.stderr
    injections = json.loads(done.stdout)["injections"]
    kinds = [[part["type"] for part in i["parts"]] for i in injections]
    assert ["tool_call", "tool_result"] in kinds


def test_run_json_of_a_halted_turn_names_the_hook(shop: Path) -> None:
    done = turnplug("run", shop, "a secret please", "--json")
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert (result["outcome"], result["halt"]) == (
        "halted",
        {"hook": "gate", "reason": "asked for a secret"},
    )
    assert result["committed"] == 0


def test_run_events_shows_the_timeline_then_the_reply(shop: Path) -> None:
    done = turnplug("run", shop, "refunds?", "--events")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    order = ["turn started", "gate -> cont", "faq -> parts", "model called (attempt 1)"]
    order += ["committed to the log", "turn finished"]
    positions = [next(i for i, line in enumerate(lines) if key in line) for key in order]
    assert positions == sorted(positions)
    assert lines[-1] == "Refunds take 14 days."


def test_run_events_json_is_one_object_per_line(shop: Path) -> None:
    done = turnplug("run", shop, "refunds?", "--events", "--json")
    assert done.returncode == 0
    *events, result = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[0]["event"] == "TurnStarted"
    assert events[0]["at"] == 0.0
    # Every event carries its time since the turn started, in order.
    times = [event.pop("at") for event in events]
    assert times == sorted(times)
    assert events[-1] == {
        "event": "TurnFinished",
        "turn_ref": events[0]["turn_ref"],
        "outcome": "completed",
    }
    deltas = [event["text"] for event in events if event["event"] == "TextDelta"]
    assert deltas == ["Refunds take ", "14 days."]
    injected = [event for event in events if event["event"] == "Injected"]
    assert injected[0]["parts"] == [
        {"type": "text", "text": "[faq] Refunds take 14 days.", "meta": {}}
    ]
    assert result["turn_ref"] == events[0]["turn_ref"]


def test_without_a_model_the_scripted_model_answers_and_says_so(tmp_path: Path) -> None:
    config = write_config(tmp_path, 'system = "x"\n')
    done = turnplug("run", config, "hi")
    assert done.returncode == 0
    assert done.stdout.strip()
    assert "no [model]" in done.stderr
    assert "scripted" in done.stderr


def _reader_gone(*args: str | Path, lines: str = "") -> subprocess.CompletedProcess[str]:
    """``turnplug ARGS`` writing to a pipe whose reader has already gone, as after
    ``turnplug ... | head -n 1``: every write to standard output fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [TURNPLUG, *map(str, args)],
            input=lines,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            env=environment(),
        )
    finally:
        os.close(write)


def test_a_halted_turn_whose_reader_goes_away_still_exits_1(shop: Path) -> None:
    """Bug caught: `run ... | head` of a halted turn exited 0, as if it had completed, because
    the failed write of its substitute answer was taken for a quiet end."""
    done = _reader_gone("run", shop, "tell me a secret")
    assert "Traceback" not in done.stderr
    assert done.returncode == 1, done.stderr


def test_a_halted_turn_whose_reader_goes_away_still_names_its_hook(shop: Path) -> None:
    """Bug caught: `run ... | head` of a halted turn wrote nothing on standard error, open all
    along, because the failed write of its substitute answer skipped the note naming the hook."""
    done = _reader_gone("run", shop, "tell me a secret")
    assert done.returncode == 1, done.stderr
    assert done.stderr == "turnplug: turn halted by 'gate': asked for a secret\n"


def test_a_completed_turn_whose_reader_goes_away_exits_0_quietly(shop: Path) -> None:
    """Bug caught: none on the old code; no test pinned that `run ... | head` of a completed
    turn exits 0 with nothing on standard error, which a halted turn's note must not change."""
    done = _reader_gone("run", shop, "How long do refunds take?")
    assert (done.returncode, done.stderr) == (0, "")


def test_run_events_whose_reader_goes_away_stops_the_turn_and_exits_1(shop: Path) -> None:
    """Bug caught: `run --events ... | head` stopped the turn at its first event, committing
    nothing, and exited 0 silently, as if the turn had completed."""
    log = shop.with_name("c.db")
    done = _reader_gone("run", shop, "How long do refunds take?", "--events", "--log", log)
    assert done.returncode == 1, done.stderr
    assert "closed before the turn finished" in done.stderr
    assert "Traceback" not in done.stderr
    shown = turnplug("log", "default", "--log", log, "--json")
    assert json.loads(shown.stdout)["entries"] == []


def test_a_log_path_keeps_the_conversation_across_runs(shop: Path) -> None:
    log = shop.with_name("conversations.db")
    for message in ("How long do refunds take?", "And for returns?"):
        done = turnplug("run", shop, message, "--log", log, "--conversation", "c1")
        assert (done.returncode, done.stderr) == (0, "")

    shown = turnplug("log", "c1", "--log", log, "--json")

    assert shown.returncode == 0, shown.stderr
    turns = json.loads(shown.stdout)["entries"]
    users = [m for t in turns for m in t["messages"] if m["role"] == "user"]
    assert len(turns) == 2
    assert "And for returns?" in json.dumps(users[-1])


def test_a_log_path_in_a_missing_directory_is_one_line_and_exit_2(shop: Path) -> None:
    done = turnplug("run", shop, "hi", "--log", shop.with_name("no") / "such" / "c.db")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("message", ["", "  \n"])
def test_a_blank_message_is_a_usage_error_before_the_log_is_created(
    shop: Path, message: str
) -> None:
    """Catches: `run CONFIG ""` running a turn on an empty user message (which chat never
    sends: a blank line is no turn), committing it, or failing at a provider that refuses a
    request without one, after the pre hooks ran."""
    log = shop.with_name("c.db")
    done = turnplug("run", shop, message, "--log", log)
    assert (done.returncode, done.stdout) == (2, "")
    assert "the message must not be empty" in done.stderr
    assert not log.exists()


@pytest.mark.parametrize("encoding", ["utf-8:strict", "utf-8:surrogateescape"])
def test_a_message_that_is_not_utf8_is_a_usage_error_before_the_log_is_created(
    shop: Path, encoding: str
) -> None:
    """Catches: `run CONFIG $'caf\\xff' --log c.db` running and committing the turn, then
    failing to print it (UnicodeEncodeError, exit 1) on a strict UTF-8 terminal, or sending
    the bytes on as lone surrogates where the terminal lets them through."""
    log = shop.with_name("c.db")
    message = os.fsdecode(b"caf\xff")  # as Python reads that argument
    done = turnplug("run", shop, message, "--log", log, env=environment(PYTHONIOENCODING=encoding))
    assert (done.returncode, done.stdout) == (2, "")
    assert "the message must be valid UTF-8" in done.stderr
    assert not log.exists()


def test_run_runs_the_example_from_the_repository_root() -> None:
    root = Path(__file__).resolve().parents[2]
    done = turnplug("run", "examples/assistant.toml", "How long do refunds take?", cwd=root)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "Refunds are issued within 14 days of a return. Questions? Write to [EMAIL].\n"
    )


# -- chat -------------------------------------------------------------------------------------

CHAT = """
    [model]
    provider = "scripted"
    replies = ["first answer", "second answer"]

    [[pre]]
    kind = "python"
    ref = "shop_hooks:history"

    [[pre]]
    kind = "python"
    ref = "shop_hooks:maybe_slow"
"""


def _chat(
    config: Path,
    lines: str,
    *options: str,
    stderr: int = subprocess.STDOUT,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TURNPLUG, "chat", str(config), *options],
        input=lines,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=cwd,
    )


def test_chat_whose_reader_goes_away_ends_quietly(tmp_path: Path) -> None:
    """Bug caught: chat's task group wrapped the BrokenPipeError, so instead of ending quietly
    it printed "turnplug: error: ExceptionGroup: Exceptions from Trio nursery" and exited 1."""
    done = _reader_gone("chat", write_config(tmp_path, CHAT), lines="hello\nand then?\n")
    assert "error" not in done.stderr
    assert done.returncode == 0, done.stderr


def test_chat_answers_each_line_in_one_conversation_and_ends_at_eof(tmp_path: Path) -> None:
    done = _chat(write_config(tmp_path, CHAT), "hello\n\nand then?\n")
    assert done.returncode == 0
    # The second turn sees the first exchange: the session commits each turn. The empty
    # line is no turn.
    assert done.stdout.splitlines() == ["history=0", "first answer", "history=2", "second answer"]


@pytest.mark.parametrize("encoding", ["utf-8:strict", "utf-8:surrogateescape"])
def test_a_chat_line_that_is_not_utf8_is_reported_and_the_chat_goes_on(
    tmp_path: Path, encoding: str
) -> None:
    """Catches: one line of bytes that are not UTF-8 ending the chat with "ExceptionGroup:
    Exceptions from Trio nursery" before even the lines before it were answered (a strict
    terminal), or sent to the model as lone surrogates (a lenient one)."""
    done = subprocess.run(
        [TURNPLUG, "chat", str(write_config(tmp_path, CHAT))],
        input=b"hello\n\xff\xfe\nand then?\n",
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(PYTHONIOENCODING=encoding),
    )
    assert done.returncode == 0, done.stderr
    out, err = done.stdout.decode(), done.stderr.decode()
    assert out.splitlines() == ["first answer", "second answer"]
    # The hook's trace: two turns, the second after the first.
    assert [line for line in err.splitlines() if line.startswith("history=")] == [
        "history=0",
        "history=2",
    ]
    assert "a line that is not valid utf-8" in err
    assert "nothing was sent" in err


def test_chat_with_input_closed_exits_at_once(tmp_path: Path) -> None:
    done = _chat(write_config(tmp_path, CHAT), "")
    assert (done.returncode, done.stdout) == (0, "")


@pytest.mark.parametrize("command", ["run", "chat"])
def test_an_empty_conversation_id_is_refused_before_the_log_is_created(
    tmp_path: Path, command: str
) -> None:
    """Catches: `run --conversation "" --log e.db` creating e.db, then rejecting the id."""
    config = write_config(tmp_path, CHAT)
    message = ["hi"] if command == "run" else []
    log = tmp_path / "e.db"
    done = turnplug(command, config, *message, "--conversation", "", "--log", log)
    assert done.returncode == 2, done.stderr
    assert "conversation id must not be empty" in done.stderr
    assert not log.exists()


@pytest.mark.parametrize("command", ["run", "chat"])
def test_a_conversation_id_too_long_for_a_log_is_refused_before_the_log_is_created(
    tmp_path: Path, command: str
) -> None:
    """Catches: `run --conversation <over 1024 bytes> --log e.db` creating e.db, then failing
    with the log's ValueError, where an empty id is a usage error before the log opens."""
    config = write_config(tmp_path, CHAT)
    message = ["hi"] if command == "run" else []
    log = tmp_path / "e.db"
    done = turnplug(command, config, *message, "--conversation", "c" * 1025, "--log", log)
    assert done.returncode == 2, done.stderr
    assert "at most 1024 bytes" in done.stderr
    assert not log.exists()


def test_chat_without_a_standard_input_is_a_usage_error(tmp_path: Path) -> None:
    """Catches: `turnplug chat CONFIG <&-` (file descriptor 0 closed, so sys.stdin is None)
    failing with AttributeError: 'NoneType' object has no attribute 'isatty', exit 1."""
    done = subprocess.run(
        [TURNPLUG, "chat", str(write_config(tmp_path, CHAT))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment(),
        preexec_fn=lambda: os.close(0),  # as `<&-` does
    )
    assert done.returncode == 2, done.stderr
    assert "standard input, which is closed" in done.stderr
    assert "AttributeError" not in done.stderr


def test_a_failed_turn_in_chat_is_reported_and_the_chat_goes_on(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = ["first", "second"]\n\n[[pre]]\n'
        'kind = "python"\nref = "shop_hooks:maybe_broken"\n',
    )
    (tmp_path / "shop_hooks.py").write_text(
        "from pipeline import cont\n\n\ndef maybe_broken(turn):\n"
        "    if 'break' in turn.user_message.text:\n"
        "        raise RuntimeError('the database is down')\n"
        "    return cont(turn)\n"
    )
    done = _chat(config, "one\nbreak\ntwo\n")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == "first"
    assert "the database is down" in done.stdout
    assert lines[-1] == "second"
    assert "Traceback" not in done.stdout


def test_a_scripted_model_that_runs_out_in_chat_says_so_once_and_ends_it(tmp_path: Path) -> None:
    """Catches: a scripted model that ran out failing every later message of the chat, one
    error each, and the chat still exiting 0."""
    config = write_config(tmp_path, '[model]\nprovider = "scripted"\nreplies = ["only one"]\n')
    done = _chat(config, "one\ntwo\nthree\nfour\n", stderr=subprocess.PIPE)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["only one", ""]
    assert done.stderr.count("ran out of replies") == 1
    assert "the conversation ends" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_example_config_holds_a_whole_conversation_offline() -> None:
    """Catches: `turnplug chat examples/assistant.toml` (the README's suggestion) failing
    on the second message with "ScriptedModel ran out of replies"."""
    root = Path(__file__).resolve().parents[2]
    questions = "How long do refunds take?\nWhen are you open?\nDo gift cards expire?\nhi\n"
    done = _chat(Path("examples/assistant.toml"), questions, stderr=subprocess.PIPE, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Refunds are issued within 14 days of a return. Questions? Write to [EMAIL].",
        "Our Main Street shop is open Monday to Saturday, 9:00 to 18:00.",
        "Gift cards never expire. Questions? Write to [EMAIL].",
        "I can tell you about refunds, shipping, gift cards and our opening hours."
        " What would you like to know?",
    ]
    assert "error" not in done.stderr


GUARDED = """
    [model]
    provider = "scripted"
    replies = ["We guarantee it!", "Refunds take 14 days."]

    [[post]]
    kind = "guardrail"
    name = "no_guarantees"
    deny = ["(?i)guarantee"]
    feedback = "No guarantees."
"""


def test_chat_shows_only_accepted_text_by_default(tmp_path: Path) -> None:
    """Catches: `chat` printing "We guarantee it!" and then "(attempt 1 rejected...)": a
    guardrail's rejected text reached the user."""
    done = _chat(write_config(tmp_path, GUARDED), "refund?\n", stderr=subprocess.PIPE)
    assert (done.returncode, done.stdout) == (0, "Refunds take 14 days.\n")
    assert "attempt 1 rejected by 'no_guarantees'" in done.stderr


def test_chat_live_shows_text_as_it_streams_rejected_attempts_included(tmp_path: Path) -> None:
    """Catches: `--live` missing, or not streaming the attempts as they come."""
    done = _chat(write_config(tmp_path, GUARDED), "refund?\n", "--live", stderr=subprocess.PIPE)
    assert (done.returncode, done.stdout) == (0, "We guarantee it!\nRefunds take 14 days.\n")


def test_ctrl_c_cancels_the_turn_in_progress_and_commits_nothing(tmp_path: Path) -> None:
    chat = subprocess.Popen(
        [TURNPLUG, "chat", str(write_config(tmp_path, CHAT))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )
    assert chat.stdin is not None
    assert chat.stdout is not None
    try:
        chat.stdin.write("please be slow\n")
        chat.stdin.flush()
        assert chat.stdout.readline() == "history=0\n"
        assert chat.stdout.readline() == "slow hook started\n"
        chat.send_signal(signal.SIGINT)  # what Ctrl-C sends
        cancelled = [chat.stdout.readline(), chat.stdout.readline()]
        assert cancelled[0] == "\n"
        assert "cancelled" in cancelled[1]
        chat.stdin.write("hello\n")
        chat.stdin.close()  # Ctrl-D
        rest = chat.stdout.read()
        code = chat.wait(timeout=60)
    finally:
        chat.kill()
        chat.stdout.close()
    # Nothing of the cancelled turn reached the conversation, and the model was not used.
    assert rest.splitlines() == ["history=0", "first answer"]
    assert code == 0


def test_ctrl_c_between_turns_does_not_end_the_chat(tmp_path: Path) -> None:
    chat = subprocess.Popen(
        [TURNPLUG, "chat", str(write_config(tmp_path, CHAT))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )
    assert chat.stdin is not None
    assert chat.stdout is not None
    try:
        chat.stdin.write("hello\n")
        chat.stdin.flush()
        assert chat.stdout.readline() == "history=0\n"
        assert chat.stdout.readline() == "first answer\n"
        chat.send_signal(signal.SIGINT)
        assert "Ctrl-D" in chat.stdout.readline() + chat.stdout.readline()
        chat.stdin.write("again\n")
        chat.stdin.close()
        rest = chat.stdout.read()
        code = chat.wait(timeout=60)
    finally:
        chat.kill()
        chat.stdout.close()
    assert rest.splitlines() == ["history=2", "second answer"]
    assert code == 0


LINGERING = """
    [model]
    provider = "scripted"
    replies = ["the answer"]

    [[post]]
    kind = "python"
    ref = "lingering:summary"
    background = true

    [[on_session_end]]
    kind = "python"
    ref = "lingering:farewell"
"""
LINGERING_HOOKS = """
import math
import sys

import anyio

from pipeline import cont


async def summary(turn):
    print("summary started", file=sys.stderr, flush=True)
    await anyio.sleep(math.inf)
    return cont(turn)


def farewell(info, reason):
    print("end hook:", reason, file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("presses", [1, 3])
def test_ctrl_c_after_ctrl_d_interrupts_the_closing_chat(tmp_path: Path, presses: int) -> None:
    """Bug caught: once Ctrl-D ended the conversation, chat's SIGINT receiver stayed open
    while the session drained its background hooks, so Ctrl-C did nothing until the drain
    timeout had passed and the end hooks had been told "closed"."""
    config = write_config(tmp_path, LINGERING)
    (tmp_path / "lingering.py").write_text(LINGERING_HOOKS)
    chat = subprocess.Popen(
        [TURNPLUG, "chat", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=environment(),
        # As a terminal starts it: a runner that started the tests in the background (SIGINT
        # ignored) must not pass that on.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert chat.stdin is not None
    assert chat.stdout is not None
    assert chat.stderr is not None
    try:
        chat.stdin.write("hi\n")
        chat.stdin.flush()
        assert chat.stdout.readline() == "the answer\n"
        assert chat.stderr.readline() == "summary started\n"
        chat.stdin.close()  # Ctrl-D: the session drains the hook, which never ends
        time.sleep(0.3)  # into the drain
        code = None
        for _ in range(120):  # Ctrl-C, `presses` times at once, until the command stops
            for _ in range(presses):
                chat.send_signal(signal.SIGINT)
            try:
                code = chat.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
        out, err = chat.stdout.read(), chat.stderr.read()
    finally:
        chat.kill()
        chat.stdout.close()
        chat.stderr.close()
    # Interrupted, not killed by the signal (-2), and quietly: no traceback.
    assert (code, out, err) == (130, "", "end hook: cancelled\n")


# -- what a terminal would act on -------------------------------------------------------------

HOSTILE = """
    [model]
    provider = "scripted"
    replies = [["Hi\\u001b]0;pwned\\u0007 \\u001b[2J", "there\\u009b31m\\r\\nline two\\tend\\rover"]]

    [[post]]
    kind = "python"
    ref = "hostile_hooks:note"
"""
HOSTILE_HOOKS = """
from pipeline import cont, halt


def note(turn):
    if "stop" in turn.user_message.text:
        return halt("bad\\u009b2J\\u001b]52;c;cHduZWQ=\\u0007 request")
    return cont(turn)
"""
SHOWN = b"Hi\\x1b]0;pwned\\x07 \\x1b[2Jthere\\x9b31m\r\nline two\tend\\rover\n"
"""The reply as printed: tab and CRLF kept, every other control character escaped."""


def _hostile(tmp_path: Path) -> Path:
    (tmp_path / "hostile_hooks.py").write_text(HOSTILE_HOOKS)
    return write_config(tmp_path, HOSTILE)


def test_run_prints_a_reply_s_escape_sequences_escaped(tmp_path: Path) -> None:
    """Bug caught: `run` printed the model's reply as is, so an escape sequence in it (a
    title change, a screen clear, a C1 CSI) and a carriage return reached the terminal,
    which acted on them."""
    done = subprocess.run(
        [TURNPLUG, "run", str(_hostile(tmp_path)), "hi"],
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, SHOWN, b"")


@pytest.mark.parametrize("live", [[], ["--live"]])
def test_chat_prints_a_reply_s_escape_sequences_escaped(tmp_path: Path, live: list[str]) -> None:
    """Bug caught: `chat` wrote the model's text as it streamed, escape sequences and
    carriage returns included, for the terminal to act on."""
    done = subprocess.run(
        [TURNPLUG, "chat", str(_hostile(tmp_path)), *live],
        input=b"hi\n",
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, SHOWN, b"")


@pytest.mark.parametrize("live", [[], ["--live"]])
def test_chat_shows_a_crlf_split_across_chunks_as_a_line_break(
    tmp_path: Path, live: list[str]
) -> None:
    """Bug caught: `chat` escaped each streamed chunk on its own, so a CRLF split across two
    chunks was shown as a literal ``\\r`` before the line break."""
    config = write_config(
        tmp_path,
        '[model]\nprovider = "scripted"\nreplies = [["one\\r", "\\ntwo\\r", "three\\r"]]\n',
    )
    done = subprocess.run(
        [TURNPLUG, "chat", str(config), *live],
        input=b"hi\n",
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"one\r\ntwo\\rthree\\r\n", b"")


def test_a_halt_reason_s_c1_control_is_shown_escaped(tmp_path: Path) -> None:
    """Bug caught: a note escaped C0 control characters but not C1 ones, so U+009B (a CSI
    on its own, which a terminal may act on) in a halt's reason reached the terminal."""
    done = subprocess.run(
        [TURNPLUG, "run", str(_hostile(tmp_path)), "stop"],
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr == (
        b"turnplug: turn halted by 'note': bad\\x9b2J\\x1b]52;c;cHduZWQ=\\x07 request\n"
    )


def test_a_reply_holding_a_lone_surrogate_is_printed_escaped(tmp_path: Path) -> None:
    """Bug caught: a reply holding a lone surrogate (a ``\\ud800`` escape in a model's JSON answer)
    failed the command with a UnicodeEncodeError (exit 1) after its turn completed, with and
    without ``--json``."""
    (tmp_path / "lone_model.py").write_text(
        "from pipeline.testing import FunctionModel\n\n\n"
        "def answerer():\n"
        "    return FunctionModel(lambda request: 'a\\ud800b')\n"
    )
    config = write_config(tmp_path, '[model]\nprovider = "python"\nref = "lone_model:answerer"\n')
    done = subprocess.run(
        [TURNPLUG, "run", str(config), "hi"],
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (0, b"a\\ud800b\n")
    as_json = subprocess.run(
        [TURNPLUG, "run", str(config), "hi", "--json"],
        capture_output=True,
        timeout=60,
        check=False,
        env=environment(),
        cwd=tmp_path,
    )
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["reply"] == "a\ud800b"
