"""The benchmark suite runs (its figures are never checked here: benchmarks are not tests)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick_runs_every_benchmark() -> None:
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
    assert "SQLiteLog.append, 8 sessions" in done.stdout
    assert "## parallel" in done.stdout
    assert "## providers" in done.stdout
    assert "run(), per hook" in done.stdout


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
