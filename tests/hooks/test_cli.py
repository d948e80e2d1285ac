"""The `turnplug` command line, driven as a new user would: a subprocess, stdin closed."""

import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.hooks.cli_support import TURNPLUG, environment, turnplug


@pytest.fixture(scope="module")
def demo_output() -> str:
    done = turnplug("demo")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def _section(out: str, title: str) -> list[str]:
    """The indented lines under a heading of the demo's output."""
    lines = out.split(title, 1)[1].splitlines()[1:]
    taken = []
    for line in lines:
        if not line.startswith("  "):
            break
        taken.append(line)
    return taken


def test_demo_shows_every_stage_of_the_turn(demo_output: str) -> None:
    for expected in (
        "authenticate -> cont",
        "search_docs -> parts",
        "load_memory -> parts",
        "remember_plan injected (durable",
        "add_today injected (transient",
        "model called (attempt 1)",
        "model asks for tool find_return",
        "find_return started",
        "find_return -> result",
        "model called again (attempt 1, call 2)",
        "attempt 1 rejected by no_internal_refs",
        "model called (attempt 2)",
        "no_internal_refs -> cont",
        "committed to the log",
        "turn finished",
        "outcome: completed",
    ):
        assert expected in demo_output, expected


def test_demo_timeline_has_the_retrieval_members_in_parallel(demo_output: str) -> None:
    # Both members start before either finishes: the group does not serialize latency.
    lines = demo_output.splitlines()
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


def test_demo_redacts_the_address_that_arrives_split_across_chunks(demo_output: str) -> None:
    # The scripted model streams "ada@exa" and "mple.com." as two chunks.
    timeline = _section(demo_output, "timeline")
    texts = [line for line in timeline if "text (attempt" in line]
    assert texts, timeline
    assert not any("@" in line or "mple.com" in line for line in texts)
    assert sum("[EMAIL]" in line for line in texts) == 2  # once per attempt
    assert demo_output.rstrip().endswith("We will confirm at [EMAIL].")


def test_demo_shows_the_address_arriving_split_and_what_was_delivered(demo_output: str) -> None:
    """Catches: a demo whose timeline shows only the redacted deltas, so that a reader
    cannot see that the address arrived split across chunks, which is what it demonstrates."""
    shown = _section(demo_output, "redacted while streaming")
    assert shown == [
        "  (redact_email held back only the part that could still become an address)",
        "  model sent 'We will confirm at ada@exa'  ->  delivered 'We will confirm at '",
        "  model sent 'mple.com.'                   ->  delivered '[EMAIL].'",
    ]


def test_demo_logs_the_durable_parts_and_nothing_transient(demo_output: str) -> None:
    committed = "\n".join(_section(demo_output, "committed to the conversation log"))
    assert "[account] plan: pro" in committed
    assert "How long do refunds take?" in committed
    assert "We will confirm at [EMAIL]." in committed
    for transient in ("[doc]", "[memory]", "[note]", "internal ticket", "Do not mention", "@"):
        assert transient not in committed, transient
    stayed = "\n".join(_section(demo_output, "stayed transient"))
    for source in ("search_docs", "load_memory", "add_today"):
        assert source in stayed


def test_demo_shows_the_history_untouched_before_the_injections(demo_output: str) -> None:
    sent = _section(demo_output, "what the model was sent on attempt 2, last call")
    roles = [line.split()[0] for line in sent[2:] if not line.startswith("   ")]
    # System, the history as it was, this turn's user message (injections first), then the
    # rejected attempt's tool exchange, reply and feedback (transient), then this attempt's
    # tool exchange.
    assert roles == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert sent[3].split(None, 1)[1] == "Hi!"


def test_demo_commits_only_the_accepted_attempts_tool_exchange(demo_output: str) -> None:
    committed = _section(demo_output, "committed to the conversation log")
    roles = [line.split()[0] for line in committed if not line.startswith("   ")]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert sum("[tool call] find_return" in line for line in committed) == 1


def test_demo_on_a_terminal_that_is_not_utf8_shows_what_it_cannot_carry_escaped() -> None:
    """Bug caught: on an ASCII standard output (PYTHONIOENCODING=ascii) the demo stopped at
    the timeline's first ellipsis with a UnicodeEncodeError and exit 1."""
    done = turnplug("demo", env=environment(PYTHONIOENCODING="ascii"))
    assert (done.returncode, done.stderr) == (0, "")
    assert "of \\u2026" in done.stdout  # a truncated injection in the timeline
    assert "outcome: completed" in done.stdout


def test_demo_with_a_model_whose_key_is_missing_stays_offline() -> None:
    done = subprocess.run(
        [TURNPLUG, "demo", "--model", "openai:gpt-4o-mini"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"},
    )
    assert done.returncode == 0, done.stderr
    assert "OPENAI_API_KEY is not set" in done.stdout
    assert "outcome: completed" in done.stdout


def test_demo_with_a_model_whose_key_is_blank_says_so_and_stays_offline() -> None:
    """Bug caught: an OPENAI_API_KEY of spaces was noted as "not set", sending the reader to
    check a variable that is set, rather than its value."""
    done = turnplug("demo", "--model", "openai:gpt-4o-mini", env=environment(OPENAI_API_KEY=" "))
    assert done.returncode == 0, done.stderr
    assert "note: OPENAI_API_KEY is set but blank, so the demo stays offline" in done.stdout


def test_demo_with_a_malformed_model_spec_is_a_usage_error() -> None:
    done = turnplug("demo", "--model", "gpt-4o")
    assert done.returncode == 2
    assert "gpt-4o" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["nope"], ["run"]])
def test_usage_errors_exit_2_with_one_clear_line(args: list[str]) -> None:
    done = turnplug(*args)
    assert done.returncode == 2
    assert "usage: turnplug" in done.stderr
    assert "Traceback" not in done.stderr


async def demo_against(server: Any) -> "subprocess.CompletedProcess[bytes]":
    """`turnplug demo --model openai:local-model` against `server`, with a key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env |= {"OPENAI_API_KEY": "sk-local-test", "OPENAI_BASE_URL": f"{server.url}/v1"}
    return await anyio.run_process(
        [TURNPLUG, "demo", "--model", "openai:local-model"],
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )


async def test_demo_with_a_model_and_its_key_talks_to_that_provider() -> None:
    # A real OpenAI-compatible server on loopback plays two attempts: the first leaks an
    # internal reference (the guardrail rejects it), the second an address split in two.
    from tests.providers import server as wire

    first = wire.stream(wire.openai_text(["See internal ticket RF-1."]))
    second = wire.stream(wire.openai_text(["Write to ada@exa", "mple.com."]))
    async with wire.running(first, second) as server:
        done = await demo_against(server)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "with openai:local-model" in out
    assert "attempt 1 rejected by no_internal_refs" in out
    assert out.rstrip().endswith("reply:   Write to [EMAIL].")
    assert [request.body["model"] for request in server.requests] == ["local-model"] * 2
    # The second request carries the rejected reply and the feedback, as transient messages.
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent[-2:]] == ["assistant", "user"]
    assert sent[-1]["content"] == "Do not mention internal ticket numbers."
    assert "sk-local-test" not in out + done.stderr.decode()


async def test_demo_shows_a_model_s_escape_sequences_escaped() -> None:
    """Bug caught: the demo printed what a real model wrote as is (its rejected attempt, the
    messages and the reply), escape sequences and carriage returns included, for the
    terminal to act on."""
    from tests.providers import server as wire

    first = wire.stream(wire.openai_text(["See internal ticket RF-1\x1b]0;pwned\x07"]))
    second = wire.stream(wire.openai_text(["fine\x1b[2J\x9b31m\rdone"]))
    async with wire.running(first, second) as server:
        done = await demo_against(server)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "See internal ticket RF-1\\x1b]0;pwned\\x07" in out
    assert out.rstrip().endswith("reply:   fine\\x1b[2J\\x9b31m\\rdone")
    assert not {"\x1b", "\x07", "\x9b", "\r"} & set(out)


async def test_demo_whose_model_exhausts_the_regenerations_exits_1() -> None:
    """Catches: `turnplug demo --model ...` exiting 0 when the provider's every attempt was
    rejected (outcome "exhausted"), where every other command exits 1 for a turn that did not
    complete."""
    from tests.providers import server as wire

    leak = wire.stream(wire.openai_text(["See internal ticket RF-1."]))
    async with wire.running(repeat=leak) as server:
        done = await demo_against(server)
    out = done.stdout.decode()
    assert (done.returncode, out.rstrip().splitlines()[-1]) == (1, "outcome: exhausted")
    assert len(server.requests) == 3


CONFIG_WITHOUT_MODEL = """
[[transformers]]
kind = "redact"
patterns = ["[\\\\w.+-]+@[\\\\w-]+(?:\\\\.[\\\\w-]+)+"]
replacement = "[EMAIL]"
"""


@pytest.mark.parametrize("command", ["run", "chat"])
async def test_run_and_chat_with_a_model_talk_to_it_instead_of_the_configs(
    tmp_path: Path, command: str
) -> None:
    """Catches: --model accepted by `demo` only (`turnplug run CONFIG MESSAGE --model ...` a
    usage error), or the override losing the config's pipeline (its redaction), or the key
    taken from anywhere but the provider's environment variable."""
    from tests.providers import server as wire

    config = tmp_path / "bare.toml"
    config.write_text(CONFIG_WITHOUT_MODEL)
    reply = wire.stream(wire.openai_text(["Write to ada@exa", "mple.com."]))
    async with wire.running(reply) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env |= {"OPENAI_API_KEY": "sk-local-test", "OPENAI_BASE_URL": f"{server.url}/v1"}
        argv = [TURNPLUG, command, str(config)]
        argv += ["hi"] if command == "run" else []
        done = await anyio.run_process(
            [*argv, "--model", "openai:local-model"],
            input=b"hi\n" if command == "chat" else None,
            stdin=None if command == "chat" else subprocess.DEVNULL,
            env=env,
            check=False,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert "Write to [EMAIL]." in out
    assert "no [model] table" not in err
    assert [request.body["model"] for request in server.requests] == ["local-model"]
    assert server.requests[0].headers["authorization"] == "Bearer sk-local-test"
    assert "sk-local-test" not in out + err


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            "openai:gpt-4o-mini",
            "--model openai:gpt-4o-mini needs its key in OPENAI_API_KEY, which is not set",
        ),
        ("nonsense", "nonsense"),
    ],
)
def test_run_with_a_model_it_cannot_use_is_a_usage_error(
    tmp_path: Path, spec: str, says: str
) -> None:
    """Catches: a --model whose key is not set sent upstream without one (a 401 after the
    pre hooks ran), or a malformed spec failing as a traceback instead of exit 2."""
    config = tmp_path / "bare.toml"
    config.write_text(CONFIG_WITHOUT_MODEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = turnplug("run", config, "hi", "--model", spec, env=env)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_run_with_a_model_whose_key_variable_is_blank_is_a_usage_error(tmp_path: Path) -> None:
    """Bug caught: an OPENAI_API_KEY of spaces passed the --model check (a config's
    api_key_env counts it as not set), and the turn went to the provider with no key."""
    config = tmp_path / "bare.toml"
    config.write_text(CONFIG_WITHOUT_MODEL)
    # Nothing listens there: a request sent would fail as a connection error, exit 1.
    env = environment(OPENAI_API_KEY="  ", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    done = turnplug("run", config, "hi", "--model", "openai:gpt-4o-mini", env=env)
    assert done.returncode == 2, done.stderr
    assert "--model openai:gpt-4o-mini needs its key in OPENAI_API_KEY" in done.stderr


def test_run_with_a_model_whose_key_variable_is_blank_says_it_is_blank(tmp_path: Path) -> None:
    """Bug caught: an OPENAI_API_KEY of spaces was refused as "needs OPENAI_API_KEY set",
    sending the reader to check a variable that is set, rather than its value."""
    config = tmp_path / "bare.toml"
    config.write_text(CONFIG_WITHOUT_MODEL)
    env = environment(OPENAI_API_KEY="  ", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    done = turnplug("run", config, "hi", "--model", "openai:gpt-4o-mini", env=env)
    assert done.returncode == 2, done.stderr
    assert "OPENAI_API_KEY, which is set but blank in the environment" in done.stderr


def test_run_with_a_model_does_not_need_the_configs_model_key(tmp_path: Path) -> None:
    """Catches: --model building the config's own model and throwing it away, so that a
    config whose [model] key is not set fails (exit 2) although that model is never called."""
    config = tmp_path / "oai.toml"
    config.write_text('[model]\nprovider = "openai"\nname = "gpt-4o"\n')
    done = turnplug("run", config, "hi", "--model", "scripted")
    assert done.returncode == 0, done.stderr
    assert "Hello from the offline scripted model" in done.stdout
    assert "OPENAI_API_KEY" not in done.stderr


def test_run_with_a_model_still_checks_the_rest_of_the_config(tmp_path: Path) -> None:
    """Catches: --model skipping the config's checks along with its model (an unknown key
    in the [model] table, or elsewhere, let through)."""
    config = tmp_path / "oai.toml"
    config.write_text('sytem = "x"\n[model]\nprovider = "openai"\nname = "g"\nbogus = 1\n')
    done = turnplug("run", config, "hi", "--model", "scripted")
    assert done.returncode == 2, done.stderr
    assert "sytem: unknown key" in done.stderr
    assert "model.bogus: unknown key" in done.stderr


def test_run_with_a_model_whose_base_url_variable_is_no_url_is_a_usage_error(
    tmp_path: Path,
) -> None:
    """Catches: OPENAI_BASE_URL without a scheme failing as `ValueError` with exit 1, instead
    of a usage error naming the variable."""
    config = tmp_path / "bare.toml"
    config.write_text(CONFIG_WITHOUT_MODEL)
    env = environment(OPENAI_API_KEY="k", OPENAI_BASE_URL="localhost:8000")
    done = turnplug("run", config, "hi", "--model", "openai:gpt-4o", env=env)
    assert done.returncode == 2, done.stderr
    assert "ConfigError" in done.stderr
    assert "OPENAI_BASE_URL" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_whose_reader_goes_away_exits_quietly() -> None:
    # As in `turnplug demo | head -n 1`: the reader takes one line and closes the pipe.
    demo = subprocess.Popen(
        [TURNPLUG, "demo"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None
    assert demo.stderr is not None
    first = demo.stdout.readline()
    demo.stdout.close()
    errors = demo.stderr.read()
    demo.stderr.close()
    code = demo.wait(timeout=60)

    assert first.startswith("turnplug demo")
    assert "Traceback" not in errors
    assert (errors, code) == ("", 0)


@pytest.mark.parametrize(
    "args",
    [
        ["check", "{config}"],
        ["log", "--log", "{log}"],
        ["log", "--log", "{log}", "c1"],
        ["schema"],
        ["--help"],
        ["--version"],
        ["check", "--help"],
        ["serve", "--help"],
        ["run", "{config}", "hi"],
    ],
    ids=lambda args: " ".join(args).replace("{", "").replace("}", ""),
)
def test_a_command_whose_reader_is_gone_exits_0_quietly(tmp_path: Path, args: list[str]) -> None:
    """Bug caught: `turnplug check CONFIG | head -0` (and --help, log, --version), output
    buffered to a pipe whose reader had gone, exited 120 with Python's "Exception ignored
    ... BrokenPipeError" at exit, where run ended quietly with 0."""
    config = tmp_path / "c.toml"
    config.write_text('system = "x"\n')
    log = tmp_path / "c.db"
    env = {k: v for k, v in environment().items() if k != "PYTHONUNBUFFERED"}
    made = turnplug("run", config, "hi", "--log", log, "--conversation", "c1", env=env)
    assert made.returncode == 0, made.stderr
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [TURNPLUG, *(arg.format(config=config, log=log) for arg in args)],
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    finally:
        os.close(write)
    assert "BrokenPipeError" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


# Loaded by the interpreter at start-up (PYTHONPATH): it holds the import of `pipeline` open
# until interrupted, so that Ctrl-C surely arrives while the library is loading.
SLOW_IMPORT = """
import importlib.abc
import sys
import time


class SlowPipeline(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pipeline":
            sys.meta_path.remove(self)
            print("importing pipeline", flush=True)
            time.sleep(30)
        return None


sys.meta_path.insert(0, SlowPipeline())
"""


def test_ctrl_c_while_the_library_loads_exits_130_silently(tmp_path: Path) -> None:
    """Catches: a Ctrl-C in the first second of `turnplug run` (while imports load) printing
    a KeyboardInterrupt traceback instead of exiting 130 like a Ctrl-C later does."""
    import signal

    (tmp_path / "sitecustomize.py").write_text(SLOW_IMPORT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    with subprocess.Popen(
        [TURNPLUG, "run", "missing.toml", "hi"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # As a terminal starts it: a runner that started pytest in the background (SIGINT
        # ignored, inherited by children) must not make the interrupt vanish.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline() == "importing pipeline\n"
        process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        out, err = process.communicate(timeout=30)
    assert (process.returncode, err, out) == (130, "", "")


def test_version_prints_the_installed_version() -> None:
    """Catches: `turnplug --version` being an unknown option."""
    import importlib.metadata

    done = turnplug("--version")
    assert (done.returncode, done.stdout) == (
        0,
        f"turnplug {importlib.metadata.version('turnplug')}\n",
    )


def test_no_arguments_prints_the_whole_help() -> None:
    """Catches: `turnplug` alone answering only "the following arguments are required"."""
    done = turnplug()
    assert done.returncode == 2
    for command in ("demo", "run", "chat", "check", "schema", "log"):
        assert f"\n    {command} " in done.stderr
    assert "--version" in done.stderr
