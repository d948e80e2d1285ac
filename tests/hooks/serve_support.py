"""A gateway served for real on 127.0.0.1 (Hypercorn's worker for the test's loop, trio or
asyncio, on a free port) in the test's own task group, and clients for it: the official
OpenAI SDK and raw httpx."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import attrs
import httpx
import openai
import sniffio

from hooks.cli._gateway import Gateway, Settings
from hooks.cli._serve import listen, serve_app
from pipeline import Pipeline

KEY = "gw-test-key-5c1d0e"
MODEL = "test-model"


@attrs.define
class Served:
    url: str
    gateway: Gateway
    clients: list[openai.AsyncOpenAI] = attrs.Factory(list)

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def sdk(self, key: str = KEY, max_retries: int = 0) -> openai.AsyncOpenAI:
        """An SDK client of the gateway, closed when it stops; it retries nothing unless told."""
        client = openai.AsyncOpenAI(
            base_url=self.base, api_key=key, max_retries=max_retries, timeout=30
        )
        self.clients.append(client)  # closed when the gateway stops
        return client

    async def sdk_stream(self, key: str = KEY, **request: Any) -> list[Any]:
        """A streamed request through the SDK's synchronous client, in a worker thread.

        (The SDK's async streams leave async generators for the garbage collector under
        trio; its sync client consumes the same wire format.)
        """

        def consume() -> list[Any]:
            client = openai.OpenAI(base_url=self.base, api_key=key, max_retries=0, timeout=30)
            with client, client.chat.completions.create(stream=True, **request) as stream:
                return list(stream)

        return await anyio.to_thread.run_sync(consume)

    def http(self, key: str | None = KEY) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)


@asynccontextmanager
async def served(pipe: Pipeline, **settings: Any) -> AsyncIterator[Served]:
    """`pipe` behind a gateway on a free loopback port, for the duration of the block."""
    settings = {"model": MODEL, "api_key": KEY} | settings
    gateway = Gateway(pipe, Settings(**settings))
    sock, url = listen("127.0.0.1", 0)
    stop = anyio.Event()
    async with gateway.running():
        async with anyio.create_task_group() as group:
            group.start_soon(
                partial(
                    serve_app,
                    gateway.app,
                    sock,
                    loop=sniffio.current_async_library(),
                    drain_timeout=5,
                    shutdown=stop.wait,
                )
            )
            result = Served(url, gateway)
            try:
                yield result
            finally:
                for client in result.clients:
                    await client.close()
                stop.set()
        # Sessions of answered conversation turns close, as `turnplug serve` lets them.
        await gateway.drain(5)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def sse_data(body: str) -> list[str]:
    """The ``data:`` payloads of an event stream, in order."""
    return [line[6:] for line in body.split("\n") if line.startswith("data: ")]


async def watch_feed(
    served: Served,
    into: list[dict[str, Any]],
    *,
    task_status: Any,
    answered: anyio.Event | None = None,
) -> None:
    """Collect the page's event feed into `into` (run it in a nursery; cancel to stop);
    `answered` is set when a request's last record (``GatewayMessage``) arrives."""
    async with served.http() as client, client.stream("GET", "/v1/turnplug/events") as response:
        assert response.status_code == 200
        task_status.started()
        buffer = ""
        async for text in response.aiter_text():
            buffer += text
            while "\n\n" in buffer:
                frame, buffer = buffer.split("\n\n", 1)
                for data in sse_data(frame + "\n"):
                    into.append(json.loads(data))
                    if answered is not None and into[-1]["event"] == "GatewayMessage":
                        answered.set()


def openai_error(body: bytes | str) -> dict[str, Any]:
    """The error object of an OpenAI-style error body, checked for its four fields."""
    error = json.loads(body)["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    return error
