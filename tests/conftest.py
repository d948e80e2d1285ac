"""Shared test configuration."""

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from pipeline.logs import Log

from .logs import DURABLE_LOGS, LOGS, Backend, close, make_backend
from .postgres import fresh_schema, server_dsn

# Machines here are small and noisy: a per-example deadline would only add flaky failures.
# CI replays a fixed set of examples so that a red run can be reproduced.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def postgres() -> Iterator[str]:
    """A DSN on the test PostgreSQL server, in a fresh schema (see tests/postgres.py)."""
    with fresh_schema(server_dsn()) as dsn:
        yield dsn


@pytest.fixture(params=LOGS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each kind of log in turn, on storage of its own (tests/logs.py)."""
    return make_backend(request.param, request, tmp_path)


@pytest.fixture(params=DURABLE_LOGS)
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each kind of durable log in turn, on storage of its own."""
    return make_backend(request.param, request, tmp_path)


@pytest.fixture
async def log(backend: Backend) -> AsyncIterator[Log]:
    """An open log of each kind, closed after the test."""
    opened = backend.open()
    try:
        yield opened
    finally:
        await close(opened)
