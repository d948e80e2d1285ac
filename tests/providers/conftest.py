"""Fixtures for the provider tests: a local protocol server living as long as the test."""

from collections.abc import AsyncIterator

import anyio
import pytest

from .server import ProtocolServer


async def _serving(served: ProtocolServer) -> AsyncIterator[ProtocolServer]:
    async with anyio.create_task_group() as group:
        await served.start(group)
        yield served
        group.cancel_scope.cancel()


@pytest.fixture
async def server() -> AsyncIterator[ProtocolServer]:
    """A protocol server with an empty script; tests queue replies with `server.script`."""
    async for served in _serving(ProtocolServer()):
        yield served


@pytest.fixture
async def keep_alive_server() -> AsyncIterator[ProtocolServer]:
    """A keep-alive protocol server (connections serve request after request)."""
    async for served in _serving(ProtocolServer(keep_alive=True)):
        yield served
