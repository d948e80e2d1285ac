"""README.md: its setup commands come first and its Python example runs."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_starts_with_the_demo_and_the_test_commands() -> None:
    first_block = README.split("```")[1].splitlines()[1:]
    commands = [line for line in first_block if line.strip()]
    assert len(commands) == 2
    assert commands[0].endswith("turnplug demo")
    assert "pytest" in commands[1]


def test_readme_python_example_runs(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert blocks, "README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip().splitlines() == [
        # The asyncio example on the first screen.
        "Hello from asyncio!",
        "completed Hello!",
        # The second example: one rejection, the address redacted although it was split.
        "completed Mail [EMAIL] for a refund. ['Never promise a guarantee.']",
        "['Can I get a refund?', 'Mail [EMAIL] for a refund.']",
        # The third: the refund was blocked before it ran.
        "[('order A7: shipped', None), ('refunds need a person', 'hook_blocked')]",
    ]


def test_readme_config_command_prints_what_the_readme_shows() -> None:
    section = README.split("## Declaring a pipeline in a file", 1)[1]
    command = re.search(r"```sh\n(.*?)\n```", section, flags=re.DOTALL)
    shown = re.search(r"```text\n(.*?)```", section, flags=re.DOTALL)
    assert command is not None
    assert shown is not None
    program, *args = shlex.split(command.group(1))
    assert program == ".venv/bin/turnplug"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("turnplug")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=ROOT,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == shown.group(1)


def test_the_docs_stand_on_their_own_and_the_license_is_shipped() -> None:
    """Catches: docs citing "DESIGN §N" (a document that is not in the repository), no
    LICENSE file although pyproject.toml declares MIT, a README silent on how long the tests
    take and on what `python -m bench` rewrites, and no word on type-checking an app
    against an editable install."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "DESIGN" not in text, page.name
        assert "shared/" not in text, page.name
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = "MIT"' in pyproject
    assert 'license-files = ["LICENSE"]' in pyproject
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License\n")
    assert "the turnplug authors" in license_text
    intro = README.split("turnplug runs one LLM conversation turn", 1)[0]
    assert re.search(r"take about [\w ]+ minutes", intro)
    assert "python -m bench` runs them" in intro
    assert "rewrites `bench/RESULTS.md`" in intro
    assert "editable_mode=strict" in README
    assert "py.typed" in README
