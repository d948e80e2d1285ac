"""Shared test configuration.

Every async test runs on both event loops: a plain ``async def test_...`` is collected once
per loop (``[trio]`` and ``[asyncio]``) and run by AnyIO's pytest plugin, through the
`anyio_backend` fixture below. A test stays on trio alone (run by pytest-trio, with trio's
fixtures) when it needs virtual time or trio itself: when it uses, directly or through its
fixtures, one of `TRIO_ONLY_FIXTURES` (``autojump_clock``, ``mock_clock``, ``nursery``), or
is marked ``@pytest.mark.trio_only`` (a test of trio-specific behaviour; say why next to the
marker) or with pytest-trio's own ``@pytest.mark.trio``.
"""

import inspect
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from pipeline.logs import Log

from .logs import DURABLE_LOGS, LOGS, Backend, close, make_backend
from .postgres import fresh_schema, server_dsn

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Machines here are small and noisy: a per-example deadline would only add flaky failures.
# CI replays a fixed set of examples so that a red run can be reproduced.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# pytest-trio's fixtures that only mean something under trio: virtual time, a trio nursery.
TRIO_ONLY_FIXTURES = frozenset({"autojump_clock", "mock_clock", "nursery"})
LOOPS = ("trio", "asyncio")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> None:
    """Send each async test to its runner: both loops through AnyIO, or trio alone."""
    if not collector.istestfunction(obj, name):
        return
    inner = getattr(obj, "hypothesis", None)
    function = inner.inner_test if inner is not None else obj
    if not inspect.iscoroutinefunction(function):
        return
    if _trio_only(collector, obj):
        pytest.mark.trio(obj)
    else:
        pytest.mark.usefixtures("anyio_backend")(obj)


def _trio_only(collector: pytest.Module | pytest.Class, obj: Any) -> bool:
    marks = [*getattr(obj, "pytestmark", ()), *collector.iter_markers()]
    if any(mark.name in ("trio_only", "trio") for mark in marks):
        return True
    cls = collector.obj if isinstance(collector, pytest.Class) else None
    info = collector.session._fixturemanager.getfixtureinfo(node=collector, func=obj, cls=cls)
    return not TRIO_ONLY_FIXTURES.isdisjoint(info.names_closure)


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The event loop an async test runs on (AnyIO's plugin runs the test on it)."""
    loop: str = request.param
    return loop


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


def _traced(capture_content: bool) -> "Iterator[InMemorySpanExporter]":
    """pipeline.otel instrumented for the test with a real SDK provider; its spans kept."""
    # Imported here: only the tests that trace pay for loading the SDK.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pipeline import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider, capture_content=capture_content)
    yield exporter
    otel.uninstrument()


@pytest.fixture
def spans() -> "Iterator[InMemorySpanExporter]":
    """The spans of the test's turns, traced without content capture."""
    yield from _traced(capture_content=False)


@pytest.fixture
def capturing() -> "Iterator[InMemorySpanExporter]":
    """The spans of the test's turns, traced with content capture on."""
    yield from _traced(capture_content=True)
