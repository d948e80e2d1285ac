"""Redaction throughput: `pii()` and `redact` on a long reply with a match every ~40 characters.

The reply is prose with an e-mail address every ~40 characters, 10 MB long, fed through a
fresh transformer in 4 KiB chunks and in one chunk, and 1 MB long in 4 KiB chunks (10 MB must
take no more than 11x what 1 MB takes: linear). `redact` has one e-mail pattern; `pii()` all
six kinds (only the e-mail one finds anything here, the others must cost little). The floor
column is ``re.sub`` of the same e-mail pattern over the whole text at once: what the
standard engine alone does. CPU time; the work is synchronous, the same on either loop.

The longest call: a transformer runs on the loop's thread, and the seam hands it a long chunk
in pieces of 64 KiB with a checkpoint between, so one call on a piece is how long the loop is
held. Timed in wall time, per piece, over 2 MB of the e-mail prose and of text that is all
IBAN-shaped codes (every code a candidate the IBAN check must refuse); target <= 50 ms.
"""

import re
import statistics
import time
from collections.abc import Callable

from hooks import pii, redact
from pipeline import Transformer
from pipeline._seam import PIECE

from ._harness import Row, Sample, measure, per_rep, spread

LOOPS = ("trio", "asyncio")
EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
CHUNK = 4096
TARGETS = {"pii": 20.0, "redact": 50.0}
LINEAR = 11.0
HOLD = 0.050
"""The longest one call on a piece may hold the loop."""
HOLD_SIZE = 2_000_000
CODES = "GB82 WEST AB12 CD34 "
"""IBAN-shaped codes that fail the IBAN check: each one is a candidate to refuse."""
SMALL_TIMES = 10
"""The 1 MB text is fed this many times per sample: one pass takes ~20 ms, where the
process's CPU-time clock and the machine's noise would move a single reading by 10%, and
the linearity ratio with it."""
WORDS = [
    "the",
    "refund",
    "is",
    "issued",
    "within",
    "fourteen",
    "days",
    "of",
    "the",
    "return",
    "to",
    "our",
    "warehouse",
]
NAMES = ("jo.doe", "ann.lee", "support", "max_b", "billing", "r.ortiz", "kim")


def make_text(size: int) -> str:
    """`size` characters of prose with an e-mail address every ~40 characters."""
    pieces, length, index = [], 0, 0
    while length < size:
        words = " ".join(WORDS[(index + k) % len(WORDS)] for k in range(3))
        piece = f"{words} {NAMES[index % len(NAMES)]}@example.com, "
        pieces.append(piece)
        length += len(piece)
        index += 1
    return "".join(pieces)[:size]


def longest_call(factory: Callable[[], Transformer], text: str) -> float:
    """The longest `feed` of one seam piece while `text` streams through a fresh transformer."""
    stream = factory()
    worst = 0.0
    for start in range(0, len(text), PIECE):
        began = time.perf_counter()
        stream.feed(text[start : start + PIECE])
        worst = max(worst, time.perf_counter() - began)
    stream.flush()
    return worst


def feed(factory: Callable[[], Transformer], text: str, chunk: int) -> int:
    """Stream `text` through a fresh transformer in chunks of `chunk`; the length released."""
    stream = factory()
    released = 0
    for start in range(0, len(text), chunk):
        released += len(stream.feed(text[start : start + chunk]))
    return released + len(stream.flush())


async def run(quick: bool, loop: str) -> list[Row]:
    big, small = (200_000, 20_000) if quick else (10_000_000, 1_000_000)
    repeats = 2 if quick else 3
    texts = {"big": make_text(big), "small": make_text(small)}
    factories: dict[str, Callable[[], Transformer]] = {
        "pii": pii(),
        "redact": redact(EMAIL, replacement="[EMAIL]"),
    }
    pattern = re.compile(EMAIL)

    async def floor() -> None:
        pattern.sub("[EMAIL]", texts["big"])

    # Each transformer is measured on its own, with the floor: run right after another
    # transformer's workloads (redact after pii), a pass read up to 15% slower than the
    # same pass alone, which made the linearity row a reading of the order of workloads.
    samples: dict[str, Sample] = {}
    for name, factory in factories.items():
        operations = {"floor": floor}
        for label, text, chunk in (
            ("big chunked", texts["big"], CHUNK),
            ("big whole", texts["big"], len(texts["big"])),
            ("small chunked", texts["small"], CHUNK),
        ):

            async def operation(
                factory: Callable[[], Transformer] = factory,
                text: str = text,
                chunk: int = chunk,
                times: int = SMALL_TIMES if text is texts["small"] else 1,
            ) -> None:
                for _ in range(times):
                    feed(factory, text, chunk)

            operations[f"{name} {label}"] = operation
        measured = await measure(
            operations, repeats=repeats, inner=1, warmup=0, clock=time.process_time
        )
        samples.setdefault("floor", measured.pop("floor"))
        samples.update(measured)
    mb = {"big": big / 1e6, "small": small / 1e6}
    # The small text is fed SMALL_TIMES times per sample: its time is the mean of those.
    for name in factories:
        key = f"{name} small chunked"
        samples[key] = Sample(key, tuple(t / SMALL_TIMES for t in samples[key].times))
    floor_rate = [mb["big"] / t for t in samples["floor"].times]
    rows = [
        Row(
            f"floor: re.sub of the e-mail pattern, {mb['big']:g} MB at once",
            statistics.median(floor_rate),
            spread(floor_rate),
            unit="MB/s",
        )
    ]
    for name in factories:
        target = TARGETS[name]
        for label, size, how in (
            ("big chunked", "big", "in 4 KiB chunks"),
            ("big whole", "big", "in one chunk"),
            ("small chunked", "small", "in 4 KiB chunks"),
        ):
            rates = [mb[size] / t for t in samples[f"{name} {label}"].times]
            rate = statistics.median(rates)
            ratios = [r / f for r, f in zip(rates, floor_rate, strict=True)]
            rows.append(
                Row(
                    f"{name}, {mb[size]:g} MB {how}",
                    rate,
                    spread(rates),
                    statistics.median(floor_rate),
                    statistics.median(ratios),
                    unit="MB/s",
                    target=f">= {target:g} MB/s" if size == "big" else "",
                    met=rate >= target if size == "big" else None,
                )
            )
        growth = per_rep(
            lambda b, s: b / s, samples[f"{name} big chunked"], samples[f"{name} small chunked"]
        )
        ratio = statistics.median(growth)
        rows.append(
            Row(
                f"{name}: time of {mb['big']:g} MB over {mb['small']:g} MB (4 KiB chunks)",
                samples[f"{name} big chunked"].median,
                spread(growth),
                samples[f"{name} small chunked"].median,
                ratio,
                note="linear is 10x",
                target=f"<= {LINEAR:g}x",
                met=ratio <= LINEAR,
            )
        )
    size = HOLD_SIZE // 10 if quick else HOLD_SIZE
    held = {
        "e-mail prose": make_text(size),
        "IBAN-shaped codes": (CODES * (size // len(CODES) + 1))[:size],
    }
    for name, factory in factories.items():
        for label, text in held.items():
            calls = [longest_call(factory, text) for _ in range(repeats)]
            worst = max(calls)
            rows.append(
                Row(
                    f"{name}, longest call on a {PIECE // 1024} KiB piece, {label}",
                    worst,
                    spread(calls),
                    note=f"the worst of {repeats} passes over {size / 1e6:g} MB",
                    target=f"<= {HOLD * 1000:g} ms",
                    met=worst <= HOLD,
                )
            )
    return rows
