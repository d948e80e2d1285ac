"""Waves of 150 concurrent streams to one upstream: a provider's pool against plain httpx.

A keep-alive HTTP/1.1 server on 127.0.0.1 (`tests.providers.server`, in this process) holds
every request of a wave until all 150 have arrived, so that each wave needs 150 connections
at once, then answers each with a short OpenAI stream. One operation is one wave, after
warm-up waves have opened the connections: what a gateway sees when its clients come in
bursts. Each workload's waves run back to back (see `run`), so the ratios are of medians. The floor is plain httpx as the providers used it before, one `httpx.AsyncClient`
with httpx's default keep-alive cap (100 idle connections), whose 150 streams are read to
their end. The other rows are one client with no cap at all, and `OpenAIChat` held
(``async with model``), which reads and parses the same streams. Times are wall time (the
server shares the process); the note gives the connections the server accepted per wave:
a pool that keeps its connections opens none. (A plain client's wave takes longer than
httpx's keep-alive expiry of 5 s, so some of its connections expire between waves too.)

Target: the provider's wave at most the floor's time (it opens no connection and its pool's
bookkeeping stays small; see docs/providers.md, "Lanes").
"""

import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
import httpx

from pipeline.providers import OpenAIChat
from tests.providers import server as wire

from ._harness import Row, spread
from .providers import REQUEST

LOOPS = ("trio", "asyncio")
WAVE = 150
TARGET = 1.0
REPLY = wire.stream(wire.openai_text(["Hello", " there", "!"]))
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def run(quick: bool, loop: str) -> list[Row]:
    # A quick run only checks that the benchmark runs: a small wave, below every cap.
    size, warmup, repeats = (20, 1, 2) if quick else (WAVE, 2, 9)
    server = wire.ProtocolServer(repeat=REPLY, keep_alive=True)
    arrived = 0
    everyone = anyio.Event()

    async def hold_until_all_arrived(_request: wire.Recorded) -> None:
        nonlocal arrived
        arrived += 1
        if arrived == size:
            everyone.set()
        await everyone.wait()

    server.before_reply = hold_until_all_arrived

    async def wave(call: Callable[[], Awaitable[object]]) -> tuple[float, int]:
        """One wave's wall time and the connections the server accepted meanwhile."""
        nonlocal arrived, everyone
        arrived, everyone = 0, anyio.Event()
        before, start = server.connections, time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(size):
                group.start_soon(call)
        return time.perf_counter() - start, server.connections - before

    async def waves(call: Callable[[], Awaitable[object]]) -> tuple[list[float], list[int]]:
        # One workload's waves run back to back, not interleaved with the others': a wave of
        # the floor can take longer than the provider's keep-alive expiry (5 s), which would
        # then close the connections its next wave was to reuse.
        for _ in range(warmup):
            await wave(call)
        measured = [await wave(call) for _ in range(repeats)]
        return [t for t, _ in measured], [n for _, n in measured]

    def plain(client: httpx.AsyncClient) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            async with client.stream("POST", f"{server.url}/v1/chat/completions", json=BODY) as r:
                async for _ in r.aiter_bytes():
                    pass

        return call

    times: dict[str, list[float]] = {}
    opened: dict[str, list[int]] = {}
    async with anyio.create_task_group() as serving:
        await server.start(serving)
        capped = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))
        uncapped = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)
        )
        model = OpenAIChat("m", base_url=f"{server.url}/v1", api_key="sk-bench-key")

        async def provider_call() -> None:
            async with model.stream(REQUEST) as events:
                async for _ in events:
                    pass

        async with capped, uncapped, model:
            for name, call in (
                ("floor", plain(capped)),
                ("uncapped", plain(uncapped)),
                ("provider", provider_call),
            ):
                times[name], opened[name] = await waves(call)
        serving.cancel_scope.cancel()

    def note(name: str) -> str:
        return f"{statistics.median(opened[name]):g} connections opened per wave"

    floor = statistics.median(times["floor"])
    rows = [
        Row(
            f"floor: one httpx client, default keep-alive cap, a wave of {size} streams",
            floor,
            spread(times["floor"]),
            note=note("floor"),
        )
    ]
    for name, label in (
        ("uncapped", f"one httpx client, no cap, a wave of {size} streams"),
        ("provider", f"OpenAIChat held, a wave of {size} streamed calls"),
    ):
        median = statistics.median(times[name])
        ratio = median / floor
        targeted = name == "provider"
        rows.append(
            Row(
                label,
                median,
                spread(times[name]),
                floor,
                ratio,
                target=f"<= {TARGET:g}x" if targeted else "",
                met=ratio <= TARGET if targeted else None,
                note=note(name),
            )
        )
    return rows
