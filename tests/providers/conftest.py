"""Fixtures for the provider tests: a local protocol server living in the test's nursery."""

import pytest
import trio

from .server import ProtocolServer


@pytest.fixture
async def server(nursery: trio.Nursery) -> ProtocolServer:
    """A protocol server with an empty script; tests queue replies with `server.script`."""
    served = ProtocolServer()
    await served.start(nursery)
    return served


@pytest.fixture
async def keep_alive_server(nursery: trio.Nursery) -> ProtocolServer:
    """A keep-alive protocol server (connections serve request after request)."""
    served = ProtocolServer(keep_alive=True)
    await served.start(nursery)
    return served
