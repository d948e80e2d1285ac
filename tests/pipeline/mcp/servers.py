"""Where the tests find MCP servers, and how they check none is left running.

The reference servers are real packages: ``mcp-server-time`` (PyPI, a dev dependency) and
``@modelcontextprotocol/server-memory`` (npm). `.ci/run` installs the npm package into
``.cache/mcp-servers`` before the tests; elsewhere a test that needs it installs it there
once, or is skipped with the reason when ``node`` is missing — never under CI.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline import MCPToolset, mcp_toolset

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / ".cache" / "mcp-servers"
MEMORY_BIN = CACHE / "node_modules" / ".bin" / "mcp-server-memory"
FAULTY = Path(__file__).with_name("faulty_server.py")


def time_toolset(name: str = "time", **options: object) -> MCPToolset:
    """The reference time server, answering in UTC."""
    return mcp_toolset(
        name,
        command=sys.executable,
        args=["-m", "mcp_server_time", "--local-timezone", "UTC"],
        **options,  # type: ignore[arg-type]
    )


def faulty_toolset(mode: str, *extra: str, name: str = "faulty", **options: object) -> MCPToolset:
    """This directory's misbehaving server in `mode` (see faulty_server.py)."""
    options.setdefault("connect_timeout", 60.0)
    return mcp_toolset(
        name,
        command=sys.executable,
        args=[str(FAULTY), mode, *extra],
        **options,  # type: ignore[arg-type]
    )


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on (just now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class HttpServer:
    """faulty_server.py's ``tools`` over streamable HTTP, in a process of its own on a free
    port of 127.0.0.1, that a test stops and starts again (a restart forgets every session).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def toolset(self, name: str = "web", **options: object) -> MCPToolset:
        return mcp_toolset(name, url=self.url, **options)  # type: ignore[arg-type]

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self.process = subprocess.Popen(
            [sys.executable, str(FAULTY), "http", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the HTTP MCP server on port {self.port} did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill the server (its sessions die with it)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def memory_server() -> Path:
    """The memory server's program: installed by .ci/run, or here once; a skip without node."""
    if MEMORY_BIN.exists():
        return MEMORY_BIN
    if shutil.which("npm") is None or shutil.which("node") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node and npm are required under CI (.ci/run installs them)")
        pytest.skip("node/npm are not installed: the npm memory server cannot run")
    subprocess.run(
        [
            "npm",
            "install",
            "--silent",
            "--prefix",
            str(CACHE),
            "@modelcontextprotocol/server-memory",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return MEMORY_BIN


def server_processes() -> list[psutil.Process]:
    """This test process's descendants that are still running (servers, npx, node)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive
