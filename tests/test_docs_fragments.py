"""The Python blocks of README.md and docs/: each one compiles and imports only names that
exist, and the fragments that no page test runs (they use a `pipe` or a `model` the page
leaves to the reader) run here, given those names.

README.md's blocks run in tests/test_readme.py, docs/hooks.md's in tests/test_docs_hooks.py,
docs/config.md's in tests/test_docs_config.py and docs/observability.md's timeline in
tests/test_docs_observability.py. What is left runs here when it can run offline; the rest
(an MCP server that `npx` downloads, an OTLP exporter turnplug does not install) is compiled
and its imports of `turns`, `pipeline` and `hooks` resolved.
"""

import ast
import asyncio
import importlib
import inspect
import re
from pathlib import Path
from types import CodeType
from typing import Any

import pytest
import trio

from pipeline import Pipeline
from pipeline.logs import SQLiteLog
from pipeline.testing import ScriptedModel
from turns import Turn

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (page.relative_to(ROOT).as_posix(), number, code)
    for page in PAGES
    for number, code in enumerate(
        re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL), 1
    )
]
OURS = ("turns", "pipeline", "hooks")


def _compiled(where: str, code: str) -> CodeType:
    """`code` compiled as a module whose top level may `await` and `async with`, as a fragment
    shown inside an async function does."""
    return compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _block(page: str, number: int = 1) -> str:
    return next(code for name, n, code in BLOCKS if (name, n) == (page, number))


@pytest.mark.parametrize(
    ("page", "number", "code"), BLOCKS, ids=[f"{page} block {n}" for page, n, _ in BLOCKS]
)
def test_every_python_block_compiles_and_imports_names_that_exist(
    page: str, number: int, code: str
) -> None:
    """Bug caught: a documented snippet that no longer parses, or imports a name turnplug
    renamed or never exported, in a page no other test runs."""
    _compiled(f"{page} block {number}", code)
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OURS:
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if not hasattr(module, alias.name):  # a submodule: `from pipeline import otel`
                    importlib.import_module(f"{node.module}.{alias.name}")
                elif not inspect.ismodule(getattr(module, alias.name)):
                    assert alias.name in getattr(module, "__all__", (alias.name,)), (
                        page,
                        node.module,
                        alias.name,
                    )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    importlib.import_module(alias.name)


def test_the_concurrency_page_runs_one_turn_under_each_loop() -> None:
    """Bug caught: docs/concurrency.md's first snippet (a turn under `asyncio.run`, then under
    `trio.run`) failing as written, given a `pipe` and `Turn`."""
    pipe = Pipeline(model=ScriptedModel(["under asyncio", "under trio"]))
    names: dict[str, Any] = {"asyncio": asyncio, "trio": trio, "pipe": pipe, "Turn": Turn}
    exec(_compiled("docs/concurrency.md", _block("docs/concurrency.md")), names)
    assert names["result"].reply.text == "under trio"


async def test_the_logs_page_commits_a_turn_to_an_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug caught: docs/logs.md's first snippet (a session over `SQLiteLog("chats.db")`)
    failing as written, or committing nothing to the file it names."""
    monkeypatch.chdir(tmp_path)
    pipe = Pipeline(model=ScriptedModel(["About 14 days."]))
    names: dict[str, Any] = {"SQLiteLog": SQLiteLog, "pipe": pipe}
    pending = eval(_compiled("docs/logs.md", _block("docs/logs.md")), names)
    assert inspect.iscoroutine(pending)
    await pending
    async with SQLiteLog(tmp_path / "chats.db") as log:
        context = await log.load("c-42")
    assert [message.text for message in context.messages] == [
        "How fast are refunds?",
        "About 14 days.",
    ]
