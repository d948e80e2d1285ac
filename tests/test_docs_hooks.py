"""docs/hooks.md: every recipe runs and prints what the page says it prints."""

import contextlib
import io
import re
from pathlib import Path

import pytest

import hooks

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
RECIPES = re.findall(r"```python\n(.*?)```\n\n```text\n(.*?)```", PAGE, flags=re.DOTALL)


def test_every_python_block_is_followed_by_its_output() -> None:
    assert len(RECIPES) == PAGE.count("```python")


def test_every_hook_of_the_catalogue_has_a_recipe() -> None:
    factories = {name for name in hooks.__all__ if name.islower()} - {"durable", "transient"}
    headings = set(re.findall(r"^## `(\w+)\(", PAGE, flags=re.MULTILINE))
    assert factories - headings == set()


@pytest.mark.parametrize(
    ("code", "output"), RECIPES, ids=[f"recipe {n}" for n in range(1, len(RECIPES) + 1)]
)
def test_the_recipe_prints_what_the_page_shows(code: str, output: str) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/hooks.md", "exec"), {"__name__": "recipe"})
    assert printed.getvalue() == output
