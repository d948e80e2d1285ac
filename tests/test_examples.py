"""Every example runs offline, as a script, and does what its docstring says."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str) -> ModuleType:
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested() -> None:
    tested = {"01_minimal", "02_halt", "03_parallel_retrieval", "07_openai_compatible"}
    assert {path.stem for path in EXAMPLES.glob("*.py")} == tested


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda path: path.stem)
def test_example_runs_as_a_script(path: Path) -> None:
    # Offline: no key, so an example that needs a real provider explains and exits.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "reply" in done.stdout or "->" in done.stdout


async def test_minimal_injects_its_rule_before_the_user_text() -> None:
    example = _load("01_minimal")
    result = await example.main()
    assert result.outcome == "completed"
    sent = example.PIPE.model.requests[0].messages
    assert [m.role for m in sent] == ["system", "user"]
    assert [part.text for part in sent[-1].parts] == ["Answer in one sentence.", "hi"]


async def test_halt_stops_before_the_model() -> None:
    example = _load("02_halt")
    results = await example.main()
    assert [r.outcome for r in results] == ["halted", "halted", "completed"]
    assert [r.halt.hook if r.halt else None for r in results] == [
        "require_login",
        "refuse_secrets",
        None,
    ]
    assert len(example.MODEL.requests) == 1


async def test_parallel_retrieval_takes_the_slowest_member_in_declaration_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    example = _load("03_parallel_retrieval")
    started = trio.current_time()
    result = await example.main()
    assert trio.current_time() - started == pytest.approx(0.050)
    assert [i.source for i in result.turn.injections] == [
        "search_docs",
        "search_tickets",
        "load_profile",
    ]
    assert result.reply.text == "I was given 3 pieces of context."


async def test_openai_compatible_runs_a_turn_against_a_local_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.providers import server as wire

    async with wire.running(wire.stream(wire.openai_text(["A tube for water."]))) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "dummy")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        monkeypatch.setenv("OPENAI_MODEL", "local-test")
        result = await _load("07_openai_compatible").main()
    assert result is not None
    assert result.reply.text == "A tube for water."
    assert server.requests[0].body["model"] == "local-test"
    assert server.requests[0].headers["authorization"] == "Bearer dummy"
