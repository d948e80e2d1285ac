"""Load through `turnplug serve`: streaming clients via the gateway vs straight to upstream.

``python -m bench.serve [--quick]`` (not part of ``python -m bench``: it starts three
processes and takes about a minute). A local fake upstream (the protocol server of the
tests, in its own process) streams the same 200-chunk OpenAI completion to every request,
keeping each connection alive for the next request as a hosted model's API does.
A gateway (``turnplug serve``, its own process, a config whose model is that upstream and
whose pipeline has a pre hook and a stream transformer) sits in front of it. The same
clients (trio + httpx, an httpx client each, streaming, reading to ``[DONE]``) then run the
same number of turns straight at the upstream and through the gateway, in the same run, at
1, 50 and 200 concurrent clients. Reported: p50/p99 of the turn latency both ways and the difference
(what the gateway adds), turns/s both ways, and the gateway's peak RSS. Loopback only;
every request has a timeout, every level a bounded count of turns.

Targets: 1 client, the gateway adds <= 2 ms at p50 and <= 5 ms at p99; 200 clients, zero
errors and gateway throughput >= 50% of the upstream's own.
"""

import argparse
import os
import re
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import trio

from .providers import start_server

ROOT = Path(__file__).resolve().parent.parent
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "Tell me about foxes."}],
    "stream": True,
}
TLS = ssl.create_default_context()  # shared: loading the CA store once, not per client
LEVELS = ((1, 60), (50, 250), (200, 400))  # (clients, turns)
QUICK = ((1, 5), (5, 10), (10, 10))


def start_gateway(
    upstream: str, folder: Path, loop: str = "asyncio"
) -> tuple[subprocess.Popen[str], str]:
    config = folder / "bench-gateway.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [model]
            provider = "openai"
            name = "bench"
            base_url = "{upstream}/v1"
            api_key_env = ""

            [[pre]]
            kind = "static"
            text = "Answer briefly."

            [[transformers]]
            kind = "redact"
            patterns = ["sk-[A-Za-z0-9]{{20,}}"]
            """
        )
    )
    script = Path(sys.executable).parent / "turnplug"
    process = subprocess.Popen(
        [str(script), "serve", str(config), "--port", "0", "--no-auth", "--loop", loop],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return process, found.group(1)
        if not line:
            break
    process.kill()
    raise RuntimeError("the gateway did not start")


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def load(url: str, clients: int, turns: int) -> tuple[list[float], int, float]:
    """`turns` streamed turns by `clients` concurrent clients: latencies, errors, seconds."""
    latencies: list[float] = []
    errors = 0
    remaining = turns

    async def client() -> None:
        # An httpx client per simulated client (one keep-alive connection each), as separate
        # users would have. One client shared by all of them re-examines its whole pool on
        # every request and every response close (httpcore checks each connection, with a
        # readability syscall for an idle one, and recounts the pool for each idle one): at
        # 200 connections that took 15 ms of CPU per turn, so this load generator, not the
        # gateway, was the bottleneck (docs/serve.md).
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits, timeout=60, verify=TLS) as http:
            await turns_of(http)

    async def turns_of(http: httpx.AsyncClient) -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            try:
                async with http.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
                    tail = b""
                    async for data in response.aiter_raw():
                        tail = (tail + data)[-32:]
                    if response.status_code != 200 or not tail.endswith(b"data: [DONE]\n\n"):
                        errors += 1
                        continue
            except httpx.HTTPError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    with trio.move_on_after(300):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)
    return latencies, errors + remaining, time.perf_counter() - began


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(
    upstream: str, gateway: str, levels: tuple[tuple[int, int], ...], pid: int
) -> list[str]:
    rows = []
    for clients, turns in levels:
        await load(upstream, clients, min(turns, 10))  # warm-up, both ways
        await load(gateway, clients, min(turns, 10))
        direct, direct_errors, direct_s = await load(upstream, clients, turns)
        through, errors, through_s = await load(gateway, clients, turns)
        d50, d99 = pct(direct, 0.5), pct(direct, 0.99)
        g50, g99 = pct(through, 0.5), pct(through, 0.99)
        rate, direct_rate = len(through) / through_s, len(direct) / direct_s
        checks = []
        if clients == 1:
            checks.append(("p50 added <= 2 ms", (g50 - d50) <= 0.002))
            checks.append(("p99 added <= 5 ms", (g99 - d99) <= 0.005))
        if clients == 200:
            checks.append(("zero errors", errors == 0 and direct_errors == 0))
            checks.append((">= 50% of upstream turns/s", rate >= 0.5 * direct_rate))
        verdict = ", ".join(f"{'✓' if ok else '✗'} {what}" for what, ok in checks)
        rows.append(
            f"| {clients} | {turns} | {d50 * 1e3:.2f} / {d99 * 1e3:.2f} | {g50 * 1e3:.2f} / {g99 * 1e3:.2f}"
            f" | {(g50 - d50) * 1e3:+.2f} / {(g99 - d99) * 1e3:+.2f} | {direct_rate:.0f} | {rate:.0f}"
            f" ({rate / direct_rate:.0%}) | {errors} | {peak_rss(pid) / 2**20:.0f} MiB | {verdict} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few turns: checks it runs")
    parser.add_argument(
        "--loop", choices=("asyncio", "trio"), default="asyncio", help="the gateway's event loop"
    )
    args = parser.parse_args(argv)
    upstream_process, base_url = start_server(200, keep_alive=True)
    upstream = base_url.removesuffix("/v1")
    try:
        with tempfile.TemporaryDirectory() as folder:
            gateway_process, gateway = start_gateway(upstream, Path(folder), args.loop)
            try:
                rows = trio.run(
                    measure, upstream, gateway, QUICK if args.quick else LEVELS, gateway_process.pid
                )
            finally:
                gateway_process.terminate()
                gateway_process.wait(30)
    finally:
        upstream_process.kill()
        upstream_process.wait()
    print(
        f"## serve (gateway on {args.loop}; python {sys.version.split()[0]},"
        f" {os.cpu_count()} cores)\n"
    )
    print(
        "| clients | turns | upstream p50 / p99 (ms) | gateway p50 / p99 (ms) | added p50 / p99 (ms)"
        " | upstream turns/s | gateway turns/s | errors | gateway peak RSS | targets |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
