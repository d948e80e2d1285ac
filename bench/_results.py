"""Tables for the terminal and for ``bench/RESULTS.md``.

RESULTS.md holds one section per benchmark between markers, each saying when and on what it
was measured, so that running one benchmark replaces its own table and keeps the others.
"""

import datetime
import os
import platform
import re

import attrs
import trio

from ._harness import Row, fmt_value

HEADER = """\
# Benchmark results

Written by `python -m bench`; a run replaces the tables of the benchmarks it ran. Medians over
interleaved repetitions after warm-up; spread is the interquartile range over the median;
ratios are medians of per-repetition ratios against a floor written with plain trio and
measured in the same run. Targets are those of the performance issue; what bounds a target
that is not met is in `docs/performance.md`.
"""

_SECTION = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.S)


def machine() -> str:
    """One line naming the interpreter, the library versions and the machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"Python {platform.python_version()} ({platform.python_implementation()}),"
        f" trio {trio.__version__}, attrs {attrs.__version__};"
        f" {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu})"
    )


def _met(row: Row) -> str:
    if row.met is None:
        return ""
    return "✓" if row.met else "✗"


def table(name: str, rows: list[Row]) -> str:
    """A benchmark's rows as a Markdown table under its name."""
    lines = [
        f"## {name}",
        "",
        "| workload | median | spread | floor | ratio | target | met | note |",
        "|---|---:|---:|---:|---:|---|:-:|---|",
    ]
    for row in rows:
        floor = fmt_value(row.floor, row.unit) if row.floor is not None else ""
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else ""
        # A skipped row (no server to measure) has no median.
        median = fmt_value(row.median, row.unit) if row.median is not None else ""
        spread = f"{row.spread:.0%}" if row.spread is not None else ""
        lines.append(
            f"| {row.workload} | {median} | {spread} | {floor}"
            f" | {ratio} | {row.target} | {_met(row)} | {row.note} |"
        )
    return "\n".join(lines)


def merge(
    old: str, tables: dict[str, str], order: list[str], now: datetime.datetime | None = None
) -> str:
    """RESULTS.md with `tables` replacing their sections of `old`, in `order`.

    Sections of `old` for benchmarks not run are kept as they were (with their own date);
    sections for names not in `order` are dropped.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    sections = {match["name"]: match.group(0) for match in _SECTION.finditer(old)}
    stamp = f"Measured {now:%Y-%m-%d %H:%M} UTC on {machine()}."
    for name, text in tables.items():
        sections[name] = f"<!-- bench:{name} -->\n{text}\n\n{stamp}\n<!-- /bench:{name} -->\n"
    body = "\n".join(sections[name] for name in order if name in sections)
    return f"{HEADER}\n{body}"
