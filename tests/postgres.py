"""A PostgreSQL server for the tests: where it is, and a fresh schema per test.

The server is named by ``TURNPLUG_TEST_POSTGRES_DSN`` (``.ci/with-postgres`` starts a
throwaway one and sets it; see docs/logs.md). Without it the PostgreSQL tests are skipped,
unless ``TURNPLUG_REQUIRE_POSTGRES=1`` (CI sets it): then they fail, so CI can never skip
them silently.
"""

import contextlib
import os
import secrets
import urllib.parse
from collections.abc import Iterator

import pytest

DSN_VARIABLE = "TURNPLUG_TEST_POSTGRES_DSN"
REQUIRE_VARIABLE = "TURNPLUG_REQUIRE_POSTGRES"


def server_dsn() -> str:
    """The test server's DSN; skips the test (or fails it, when required) without one."""
    dsn = os.environ.get(DSN_VARIABLE, "")
    problem = None
    if not dsn:
        problem = f"{DSN_VARIABLE} is not set (docs/logs.md: run the tests under .ci/with-postgres)"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            problem = "psycopg is not installed (pip install -e '.[dev]')"
    if problem is not None:
        if os.environ.get(REQUIRE_VARIABLE) == "1":
            pytest.fail(f"{REQUIRE_VARIABLE}=1 but {problem}", pytrace=False)
        pytest.skip(f"no PostgreSQL: {problem}")
    return dsn


def with_search_path(dsn: str, schema: str) -> str:
    """`dsn` with its connections' search_path set to `schema`."""
    return with_params(dsn, options=f"-csearch_path={schema}")


def with_params(dsn: str, **params: str) -> str:
    """`dsn` (a URL or a key=value string) with more connection parameters."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(dsn)
        query = [*urllib.parse.parse_qsl(parts.query), *params.items()]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, **params)


@contextlib.contextmanager
def fresh_schema(dsn: str) -> Iterator[str]:
    """A DSN whose connections work in a new, empty schema, dropped afterwards."""
    import psycopg
    from psycopg import sql

    schema = f"turnplug_test_{secrets.token_hex(6)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield with_search_path(dsn, schema)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
