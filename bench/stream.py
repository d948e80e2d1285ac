"""The stream seam: 100,000 chunks of 1-8 characters through three transformers.

Stages: identity, `hooks.redact` with an e-mail pattern, and `hooks.citations` (reports
``[n]`` markers, remembering one split across chunks). Each is timed in the seam the
pipeline runs (``pipeline._seam.Seam``) and, as the floor, in a plain generator function doing
the same work on the same kind of object. Reported per chunk. A last row times the whole turn
path: `Pipeline.run` with a model streaming the chunks, with and without the three stages.
`hooks.pii` (all six kinds) is timed on its own the same way, and against `redact` with the
one e-mail pattern.
"""

import random
import statistics
from collections.abc import Callable, Iterable, Iterator

from hooks import citations, pii, redact
from pipeline import Pipeline
from pipeline._seam import Seam, Transformer, compile_transformers
from pipeline.testing import FunctionModel
from turns import Turn

from ._harness import Row, measure, per_rep, spread

STAGE_TARGET = 1.5
REDACT_TARGET = 4.0
EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
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
    "see",
    "[1]",
    "and",
    "[2]",
    "for",
    "the",
    "policy",
    "write",
    "to",
    "support@example.com",
    "with",
    "your",
    "order",
    "number",
    "please",
]


def make_chunks(count: int, seed: int = 7) -> list[str]:
    """`count` chunks of 1-8 characters cut from prose with citations and an address."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(count * 2))
    chunks, index = [], 0
    while len(chunks) < count:
        size = rng.randint(1, 8)
        chunks.append(text[index : index + size])
        index += size
    return chunks


class Identity:
    def feed(self, text: str) -> str:
        return text

    def flush(self) -> str:
        return ""


STAGES: dict[str, Callable[[], Transformer]] = {
    "identity": Identity,
    "redact": redact(EMAIL, replacement="[EMAIL]"),
    "citations": citations(),
}


def _plain(source: Iterable[str], transformer: Transformer) -> Iterator[str]:
    for chunk in source:
        out = transformer.feed(chunk)
        if out:
            yield out
    tail = transformer.flush()
    if tail:
        yield tail


def _floor(chunks: list[str], factories: list[Callable[[], Transformer]]) -> int:
    stream: Iterable[str] = chunks
    for factory in factories:
        stream = _plain(stream, factory())
    return sum(1 for _ in stream)


def _seam(chunks: list[str], factories: list[Callable[[], Transformer]]) -> int:
    seam = Seam(compile_transformers(factories))
    feed = seam.feed
    released = 0
    for chunk in chunks:
        if feed(chunk):
            released += 1
    return released + bool(seam.flush())


async def run(quick: bool) -> list[Row]:
    count = 2_000 if quick else 100_000
    repeats = 2 if quick else 11
    chunks = make_chunks(count)
    operations = {}
    for name, factory in STAGES.items():

        async def floor(factory: Callable[[], Transformer] = factory) -> None:
            _floor(chunks, [factory])

        async def seam(factory: Callable[[], Transformer] = factory) -> None:
            _seam(chunks, [factory])

        operations[f"floor {name}"] = floor
        operations[f"seam {name}"] = seam
    everything = list(STAGES.values())

    async def floor_all() -> None:
        _floor(chunks, everything)

    async def seam_all() -> None:
        _seam(chunks, everything)

    operations["floor all"] = floor_all
    personal = pii()

    async def floor_pii() -> None:
        _floor(chunks, [personal])

    async def seam_pii() -> None:
        _seam(chunks, [personal])

    operations["floor pii"] = floor_pii
    operations["seam pii"] = seam_pii
    operations["seam all"] = seam_all

    def reply(request: object) -> list[str]:
        return chunks

    bare = Pipeline(model=FunctionModel(reply))
    staged = Pipeline(model=FunctionModel(reply), transformers=everything)
    turn = Turn.start("hi", turn_ref="bench")

    async def run_bare() -> None:
        await bare.run(turn)

    async def run_staged() -> None:
        await staged.run(turn)

    operations["run, no transformer"] = run_bare
    operations["run, three transformers"] = run_staged
    samples = await measure(operations, repeats=repeats, inner=1, warmup=1)

    def per_chunk(seconds: float) -> float:
        return seconds / count

    rows = []
    for name in [*STAGES, "all"]:
        seam, floor = samples[f"seam {name}"], samples[f"floor {name}"]
        ratio = statistics.median(per_rep(lambda s, f: s / f, seam, floor))
        staged = name != "all"
        rows.append(
            Row(
                f"{name}: seam, per chunk",
                per_chunk(seam.median),
                seam.spread,
                per_chunk(floor.median),
                ratio,
                "floor: plain generators" if staged else "all three chained",
                target=f"<= {STAGE_TARGET:g}x" if staged else "",
                met=ratio <= STAGE_TARGET if staged else None,
            )
        )
    redact_vs_identity = per_rep(
        lambda r, i: r / i, samples["seam redact"], samples["seam identity"]
    )
    rows.append(
        Row(
            "redact vs identity, per chunk in the seam",
            per_chunk(samples["seam redact"].median),
            spread(redact_vs_identity),
            per_chunk(samples["seam identity"].median),
            statistics.median(redact_vs_identity),
            "chunks of 1-8 characters",
            target=f"<= {REDACT_TARGET:g}x",
            met=statistics.median(redact_vs_identity) <= REDACT_TARGET,
        )
    )
    pii_ratios = per_rep(lambda s, f: s / f, samples["seam pii"], samples["floor pii"])
    rows.append(
        Row(
            "pii: seam, per chunk",
            per_chunk(samples["seam pii"].median),
            samples["seam pii"].spread,
            per_chunk(samples["floor pii"].median),
            statistics.median(pii_ratios),
            "target <= 1.5x the plain generator; six kinds, checksums on candidates",
        )
    )
    pii_vs_redact = per_rep(lambda p, r: p / r, samples["seam pii"], samples["seam redact"])
    rows.append(
        Row(
            "pii vs redact (one e-mail pattern), per chunk in the seam",
            per_chunk(samples["seam pii"].median),
            spread(pii_vs_redact),
            per_chunk(samples["seam redact"].median),
            statistics.median(pii_vs_redact),
            "what the five other kinds cost",
        )
    )
    marginal = per_rep(
        lambda s, b: (s - b) / count,
        samples["run, three transformers"],
        samples["run, no transformer"],
    )
    rows.append(
        Row(
            "Pipeline.run: added cost of the three stages, per chunk",
            statistics.median(marginal),
            spread(marginal),
            per_chunk(samples["run, no transformer"].median),
            None,
            "floor column: the whole turn path per chunk without transformers",
        )
    )
    return rows
