"""docs/config.md: its examples load, the errors it quotes are the loader's, and its command
synopsis is what the parser takes (serve.md's too)."""

import argparse
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hooks.cli import build_parser
from hooks.config import config_schema, load_pipeline
from pipeline import ConfigError, Pipeline
from tests.hooks.cli_support import turnplug

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
SERVE = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
TOML_BLOCKS = re.findall(r"```toml\n(.*?)```", PAGE, flags=re.DOTALL) + re.findall(
    r"```toml\n(.*?)```", README, flags=re.DOTALL
)

# The modules the page's examples name, written as a reader following the page would.
MY_HOOKS = """
from pipeline import cont
from turns import Text


def search_docs(turn):
    return [Text("[doc] Refunds take 14 days.")]


def load_memory(turn):
    return [Text("[memory] Ada prefers short answers.")]


def get_preferences(user: str) -> str:
    '''A user's preferences.'''
    return f"{user}: short answers"


def no_guarantees(turn):
    return cont(turn)


def search(turn, k):
    return []


def no_refunds(call, turn):
    return cont(call)


def truncate(call, result, turn):
    return cont(result)
"""
MY_TOOLS = """
def order_status(order_id: str) -> str:
    '''Where an order is.'''
    return f"order {order_id}: shipped"


def refund(order_id: str) -> str:
    '''Refund an order.'''
    return "refunded"
"""
# What the examples read from the environment: a key, ${HOME} and ${TICKETS_TOKEN}.
ENVIRON = {"OPENAI_API_KEY": "sk-docs-test-key", "HOME": "/home/ada", "TICKETS_TOKEN": "t0ken"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every config of this module: a process imports `my_hooks` once."""
    path = tmp_path_factory.mktemp("config_docs")
    (path / "my_hooks.py").write_text(MY_HOOKS, encoding="utf-8")
    (path / "my_tools.py").write_text(MY_TOOLS, encoding="utf-8")
    return path


def _problems(folder: Path, name: str, text: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The message of the `ConfigError` that loading `text` as `name` raises."""
    (folder / name).write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.chdir(folder)
    with pytest.raises(ConfigError) as raised:
        load_pipeline(name, environ={})
    return str(raised.value)


def _fits(shown: str, actual: str) -> bool:
    """Whether a line the page shows is the actual line, `...` standing for the rest."""
    if shown.endswith("..."):
        return actual.startswith(shown.removesuffix("...").rstrip())
    return actual == shown


def test_the_python_block_loads_the_example_and_the_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Catches: the page's first example naming a function `hooks.config` does not export,
    or loading `examples/assistant.toml` and a dict into something other than a Pipeline."""
    (block,) = re.findall(r"```python\n(.*?)```", PAGE, flags=re.DOTALL)
    monkeypatch.chdir(ROOT)
    names: dict[str, Any] = {"__name__": "config_docs"}
    exec(compile(block, "docs/config.md", "exec"), names)
    assert isinstance(names["pipe"], Pipeline)
    assert names["schema"] == config_schema()


@pytest.mark.parametrize(
    "block", TOML_BLOCKS, ids=[f"toml block {n}" for n in range(1, len(TOML_BLOCKS) + 1)]
)
def test_every_toml_block_loads(folder: Path, block: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches: an example the schema accepts but the loader refuses (a `tool_call` naming an
    undeclared tool, a `match` naming no tool, a ref whose signature does not fit its stage,
    a key or value the loader does not take)."""
    (folder / "example.toml").write_text(block, encoding="utf-8")
    monkeypatch.chdir(folder)
    assert isinstance(load_pipeline("example.toml", environ=ENVIRON), Pipeline)


def test_the_errors_the_page_shows_are_what_the_loader_reports(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: the page's example of a config with three mistakes drifting from the loader's
    message: its header, a problem's path, or its wording up to the `...`."""
    shown = PAGE.split("says what was expected:", 1)[1]
    block = re.search(r"```text\n(.*?)```", shown, flags=re.DOTALL)
    assert block is not None
    message = _problems(
        folder,
        "shop.toml",
        """
        sytem = "Be brief."

        [[pre]]
        kind = "statc"
        text = "Answer in English."

        [[pre]]
        kind = "parallel"
        hooks = [{ kind = "python", ref = "my_hooks:search" }]
        """,
        monkeypatch,
    )
    lines = message.splitlines()
    expected = block.group(1).splitlines()
    assert len(lines) == len(expected), message
    for shown_line, line in zip(expected, lines, strict=True):
        assert _fits(shown_line, line), (shown_line, line)


# Problems the page quotes in its prose, each with a config that has that one mistake.
QUOTED = [
    (
        "shop.toml: pre[2].timeout: expected a positive number of seconds, got 0 (integer)",
        "shop.toml",
        """
        [[pre]]
        kind = "static"
        text = "one"
        [[pre]]
        kind = "static"
        text = "two"
        [[pre]]
        kind = "static"
        text = "three"
        timeout = 0
        """,
    ),
    (
        "model.api_key_env: the environment variable OPENAI_API_KEY is not set ...",
        "model.toml",
        """
        [model]
        provider = "openai"
        name = "gpt-4o-mini"
        """,
    ),
    (
        "toolsets[0].command: required: one of command or url",
        "toolsets.toml",
        """
        [[toolsets]]
        kind = "mcp"
        name = "memory"
        """,
    ),
    (
        'kind "redact" cannot stand here ...; it goes in transformers',
        "placed.toml",
        """
        [[pre]]
        kind = "redact"
        patterns = ['secret']
        """,
    ),
]


@pytest.mark.parametrize(("quote", "name", "text"), QUOTED, ids=[q[1] for q in QUOTED])
def test_a_problem_the_page_quotes_is_the_loaders(
    folder: Path, quote: str, name: str, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: a problem quoted in the page's prose that the loader words otherwise, or
    reports at another path."""
    assert f"`{quote}`" in " ".join(PAGE.split())
    message = _problems(folder, name, text, monkeypatch)
    pattern = ".*".join(re.escape(piece) for piece in quote.split("..."))
    assert re.search(pattern, message), (quote, message)


def _commands() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return dict(subparsers.choices)


def _options(command: argparse.ArgumentParser) -> dict[str, str | None]:
    """A command's options (`--debug` and `--help` aside), each with its value's name."""
    return {
        action.option_strings[-1]: None if action.nargs == 0 else (action.metavar or action.dest)
        for action in command._actions
        if action.option_strings and action.dest not in {"help", "debug"}
    }


def _synopsis(line: str) -> dict[str, str | None]:
    """The options a synopsis line writes, each with the value's name it shows."""
    return {
        option: value or None
        for option, value in re.findall(r"(--[a-z-]+)(?: ([A-Z][A-Z_:]*))?", line)
    }


def test_the_command_synopsis_lists_each_commands_options() -> None:
    """Catches: a synopsis line that lists an option a command does not take, leaves one out,
    or names its value otherwise than `--help` (`--log PATH` where the command reads a path
    or a DSN)."""
    section = PAGE.split("## The command line", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    commands = _commands()
    shown = {line.split()[1]: line for line in block.group(1).splitlines()}
    assert set(shown) == set(commands)
    for name, line in shown.items():
        options = _options(commands[name])
        written = _synopsis(line)
        if "..." in line:  # serve: the rest is in docs/serve.md
            assert set(written) <= set(options), line
        else:
            assert written == options, line


def test_serve_md_synopsis_and_defaults_are_the_parsers() -> None:
    """Catches: docs/serve.md listing other options than `turnplug serve` takes, or stating
    defaults (address, port, body limit, timeouts, key variable) that are not the parser's."""
    serve = _commands()["serve"]
    block = re.search(r"```bash\n(.*?)```", SERVE, flags=re.DOTALL)
    assert block is not None
    written = set(re.findall(r"\[(--[a-z-]+)", block.group(1)))
    assert written == set(_options(serve))
    defaults = {action.dest: action.default for action in serve._actions}
    stated = {
        "host": ("[--host 127.0.0.1]", "127.0.0.1"),
        "port": ("[--port 8000]", 8000),
        "max_body": ("over `--max-body` (default 1 MiB)", 1024 * 1024),
        "turn_timeout": ("`--turn-timeout` (default 300 s)", 300),
        "drain_timeout": ("`--drain-timeout` (default 30 s)", 30),
        "api_key_env": (
            "from `TURNPLUG_GATEWAY_KEY`, or from the variable",
            "TURNPLUG_GATEWAY_KEY",
        ),
        "loop": ("**asyncio is the default**", "asyncio"),
    }
    for dest, (phrase, value) in stated.items():
        assert phrase in " ".join(SERVE.split()), phrase
        assert defaults[dest] == value, dest


def test_the_conversation_default_the_page_states_is_the_parsers() -> None:
    """Catches: `--conversation`'s default drifting from the `default` the page states."""
    assert "`--conversation` names the conversation (default `default`" in PAGE
    for name in ("run", "chat"):
        defaults = {action.dest: action.default for action in _commands()[name]._actions}
        assert defaults["conversation"] == "default"


def test_a_log_that_cannot_be_opened_exits_with_the_code_the_page_gives(tmp_path: Path) -> None:
    """Catches: the page's exit codes leaving out that a `--log` the command cannot open (a
    LogError) exits 2, as a usage error does, where a reader would expect 1, a failed turn."""
    codes = " ".join(PAGE.split("Exit codes:", 1)[1].split())
    usage = re.search(r"\*\*2\*\* (.*?)\.", codes)
    assert usage is not None
    assert "a `--log` that cannot be opened" in usage.group(1)
    log = tmp_path / "no such folder" / "chats.db"
    done = turnplug("run", ROOT / "examples" / "assistant.toml", "hi", "--log", log)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("turnplug: error: LogError: ")
    assert str(log) in done.stderr
