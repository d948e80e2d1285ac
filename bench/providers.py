"""Client CPU per stream chunk: `OpenAIChat` against the official ``openai`` SDK.

The same recorded OpenAI stream (2,000 content chunks) is served by the local protocol server,
run in a separate process so that its CPU is not charged to the clients. Each repetition
consumes it once with `OpenAIChat` (under trio) and once with the SDK's streaming client
(asyncio, in a worker thread), interleaved; the CPU time of this process
(``time.process_time``) over the stream, divided by the chunk count, is reported for both.

The SDK is not a dependency of turnplug: when it is not importable, only our figure is
reported. Target: ours at most half the SDK's CPU per chunk.
"""

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from pipeline import ModelRequest, ModelText
from pipeline.providers import OpenAIChat
from turns import Message

from ._harness import Row, spread

ROOT = Path(__file__).resolve().parent.parent
REQUEST = ModelRequest((Message.user("Tell me about foxes."),))


def start_server(chunks: int, keep_alive: bool = False) -> tuple[subprocess.Popen[str], str]:
    """The local protocol server in a process of its own, streaming `chunks` OpenAI chunks."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.providers.server", "--openai-chunks", str(chunks)]
        + (["--keep-alive"] if keep_alive else []),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    port = process.stdout.readline().strip()
    if not port.isdigit():
        process.kill()
        process.wait()
        raise RuntimeError(f"the protocol server did not start (it printed {port!r})")
    return process, f"http://127.0.0.1:{port}/v1"


async def _ours(model: OpenAIChat) -> tuple[float, int]:
    start = time.process_time()
    count = 0
    async with model.stream(REQUEST) as events:
        async for event in events:
            if type(event) is ModelText:
                count += 1
    return time.process_time() - start, count


def _sdk(openai: Any, base_url: str) -> tuple[float, int]:
    async def consume() -> tuple[float, int]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        try:
            start = time.process_time()
            count = 0
            stream = await client.chat.completions.create(
                model="bench",
                messages=[{"role": "user", "content": "Tell me about foxes."}],
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    count += 1
            return time.process_time() - start, count
        finally:
            await client.close()

    return asyncio.run(consume())


async def run(quick: bool) -> list[Row]:
    chunks, repeats = (200, 2) if quick else (2000, 15)
    try:
        import openai
    except ImportError:
        openai = None
        print("(the openai SDK is not installed: `pip install openai` to compare against it)")
    process, base_url = start_server(chunks)
    try:
        model = OpenAIChat("bench", base_url=base_url, api_key="bench")
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(repeats + 1):  # the first round warms up and is dropped
            cpu, count = await _ours(model)
            assert count == chunks, f"OpenAIChat saw {count} chunks, expected {chunks}"
            ours.append(cpu / chunks)
            if openai is not None:
                cpu, count = await trio.to_thread.run_sync(_sdk, openai, base_url)
                assert count == chunks, f"the SDK saw {count} chunks, expected {chunks}"
                theirs.append(cpu / chunks)
    finally:
        process.kill()
        process.wait()
    ours, theirs = ours[1:], theirs[1:]
    rows = [
        Row(
            f"OpenAIChat, CPU per chunk ({chunks} chunks)",
            statistics.median(ours),
            spread(ours),
            note="",
        )
    ]
    if theirs:
        ratios = [mine / sdk for mine, sdk in zip(ours, theirs, strict=True)]
        rows[0] = Row(
            rows[0].workload,
            rows[0].median,
            rows[0].spread,
            statistics.median(theirs),
            statistics.median(ratios),
            f"floor = openai SDK {openai.__version__ if openai else ''}",
            target="<= 0.5x",
            met=statistics.median(ratios) <= 0.5,
        )
        rows.append(
            Row(
                f"openai SDK, CPU per chunk ({chunks} chunks)",
                statistics.median(theirs),
                spread(theirs),
            )
        )
    return rows
