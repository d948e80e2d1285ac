"""The benchmark suite runs (its figures are never checked here: benchmarks are not tests)."""

import datetime
import subprocess
import sys
from pathlib import Path

from bench._harness import Row
from bench._results import merge, table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"


def test_bench_quick_runs_every_benchmark() -> None:
    before = RESULTS.read_bytes() if RESULTS.exists() else None
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "## dispatch" in done.stdout
    assert "## logs" in done.stdout
    assert "SQLiteLog.append, wall time per turn" in done.stdout
    assert "SQLiteLog.append, CPU time per turn" in done.stdout
    assert "## parallel" in done.stdout
    assert "## providers" in done.stdout
    assert "run(), per hook" in done.stdout
    for name in ("turn", "concurrency", "events", "tools", "inject", "redaction", "playback"):
        assert f"## {name}" in done.stdout
    assert "asyncio: pii, " in done.stdout  # the workloads without the runtime run on both loops
    assert "Pipeline.stream with a consumer: " in done.stdout
    # A quick run's figures mean nothing: it must not replace the recorded results.
    assert (RESULTS.read_bytes() if RESULTS.exists() else None) == before


def test_check_fails_when_a_target_is_missed() -> None:
    """Catches: --check exiting 0 whatever the figures, so a missed target never shows."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--check", "playback"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    missed = "✗" in done.stdout
    assert done.returncode == (1 if missed else 0), done.stdout + done.stderr
    assert ("target(s) missed" in done.stdout) == missed


def test_bench_rejects_an_unknown_benchmark() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert "nope" in done.stderr


def test_a_table_marks_met_and_missed_targets() -> None:
    rows = [
        Row("fast", 1e-6, 0.1, 5e-7, 2.0, target="<= 3x", met=True),
        Row("slow", 4e-6, 0.1, 5e-7, 8.0, target="<= 6x", met=False),
        Row("info", 2e-3, 0.0),
    ]
    lines = table("dispatch", rows).splitlines()
    assert lines[0] == "## dispatch"
    assert lines[4] == "| fast | 1.00 µs | 10% | 500 ns | 2.00x | <= 3x | ✓ |  |"
    assert lines[5] == "| slow | 4.00 µs | 10% | 500 ns | 8.00x | <= 6x | ✗ |  |"
    assert lines[6] == "| info | 2.000 ms | 0% |  |  |  |  |  |"


def test_running_some_benchmarks_keeps_the_other_tables() -> None:
    first = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    later = datetime.datetime(2026, 2, 1, tzinfo=datetime.UTC)
    order = ["dispatch", "turn", "events"]
    old = merge("", {"dispatch": "## dispatch\nold d", "turn": "## turn\nold t"}, order, first)
    new = merge(old, {"events": "## events\nnew e", "dispatch": "## dispatch\nnew d"}, order, later)
    assert new.startswith("# Benchmark results\n")
    body = new[new.index("<!--") :]
    assert [line for line in body.splitlines() if line.startswith("## ")] == [
        "## dispatch",
        "## turn",
        "## events",
    ]
    assert "new d" in body
    assert "old d" not in body
    assert "old t" in body
    assert "new e" in body
    turn = body[body.index("## turn") : body.index("## events")]
    assert "Measured 2026-01-01" in turn
    assert "Measured 2026-02-01" not in turn
    assert body.count("Measured 2026-02-01") == 2


def test_rewriting_results_keeps_the_serve_section() -> None:
    """Catches: `python -m bench` dropping the gateway's load figures, which
    `python -m bench.serve` records apart (its section is not one of the benchmark modules)."""
    from bench.__main__ import SECTIONS

    old = (Path(__file__).resolve().parent.parent / "bench" / "RESULTS.md").read_text()
    new = merge(old, {"sse": "## sse\n\nrewritten"}, SECTIONS)
    serve = old[old.index("<!-- bench:serve -->") : old.index("<!-- /bench:serve -->")]
    assert serve in new
    assert "rewritten" in new
