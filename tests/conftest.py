"""Shared test configuration."""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

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
