"""Offline model playback: `ScriptedModel` and `FunctionModel` against a plain async generator.

Every offline turn (tests, examples, these benchmarks) pays for the playback of its reply:
200 chunks, consumed with ``async for``. The floor is a plain async generator yielding the
same 200 strings, consumed the same way. Per chunk; the models' fixed cost per call (recording
the request, the usage, the finish) is included.
"""

import statistics

from pipeline import ModelRequest
from pipeline.testing import FunctionModel, ScriptedModel
from turns import Message

from ._harness import Row, measure, per_rep, spread
from ._reference import CHUNKS, make_chunks

LOOPS = ("trio", "asyncio")
TARGET = 1.5


async def run(quick: bool, loop: str) -> list[Row]:
    repeats, inner = (3, 20) if quick else (31, 200)
    warmup = 2
    chunks = make_chunks()
    request = ModelRequest((Message.user("Can I get my money back?"),))
    scripted = ScriptedModel([chunks] * ((warmup + repeats) * inner))
    function = FunctionModel(lambda request: chunks)

    async def plain():  # type: ignore[no-untyped-def]
        for chunk in chunks:
            yield chunk

    async def floor() -> None:
        async for _ in plain():
            pass

    async def play_scripted() -> None:
        async with scripted.stream(request) as events:
            async for _ in events:
                pass

    async def play_function() -> None:
        async with function.stream(request) as events:
            async for _ in events:
                pass

    samples = await measure(
        {"floor": floor, "ScriptedModel": play_scripted, "FunctionModel": play_function},
        repeats=repeats,
        inner=inner,
        warmup=warmup,
    )
    rows = [
        Row(
            f"floor: plain async generator, per chunk ({CHUNKS} chunks)",
            samples["floor"].median / CHUNKS,
            samples["floor"].spread,
        )
    ]
    for name in ("ScriptedModel", "FunctionModel"):
        ratios = per_rep(lambda m, f: m / f, samples[name], samples["floor"])
        ratio = statistics.median(ratios)
        rows.append(
            Row(
                f"{name} playback, per chunk",
                samples[name].median / CHUNKS,
                spread(ratios),
                samples["floor"].median / CHUNKS,
                ratio,
                target=f"<= {TARGET:g}x",
                met=ratio <= TARGET,
            )
        )
    return rows
