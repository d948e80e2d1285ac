"""A small MCP server (the SDK's server API) that misbehaves on request, for the fault tests.

``python faulty_server.py MODE [STATE_FILE]``:

- ``tools``: ``echo`` answers, ``boom`` raises, ``hang`` never returns, ``crash`` exits the
  process in the middle of the call, ``picture`` returns an image and a resource;
- ``silent``: reads the requests and never answers one (not even ``initialize``);
- ``chatty``: answers every request with a line of plain text on stdout, never with a
  JSON-RPC message (a program that is no MCP server, or logs to stdout);
- ``usage``: reads the first request, prints a usage line on stdout and exits with 2 (a
  program that is no MCP server);
- ``babbling``: written by hand (the SDK's server keeps stdout for the protocol), answers
  ``initialize`` and lists ``babble``, whose calls it answers with a log line on stdout;
- ``duplicate``: written by hand as ``babbling``, lists two different tools both named
  ``echo`` and ``babble`` twice alike (the SDK's server cannot);
- ``schemaless``: written by hand as ``babbling``, lists ``babble`` and ``bare``, which has
  no ``inputSchema`` (MCP requires one; the SDK's server cannot leave it out);
- ``paging``: written by hand as ``babbling``, answers every tools/list with the same
  ``nextCursor``, so that its pages never end;
- ``changing``: offers ``alpha`` on its first start and ``beta`` on later ones (the starts
  are counted in STATE_FILE);
- ``colliding``: offers ``a.b`` and ``a_b``, one name once sanitized;
- ``badref``: offers ``refd``, whose listed input schema has a ``$ref`` that points nowhere;
- ``notifying [STATE_FILE]``: written by hand as ``babbling``, lists ``note``, whose calls it
  answers with a ``notifications/message`` that is no valid one (its level is ``loud``), then
  with the text ``noted``; with STATE_FILE (counting its starts), its first start exits in
  its first call instead;
- ``surrogate``: written by hand as ``babbling``, lists ``cut`` (its description cut too), whose calls it
  answers with a text cut inside a surrogate pair, escaped as JSON allows (``"\\ud83d"``, as JavaScript's
  ``JSON.stringify`` writes it; the SDK's server cannot);
- ``malformed``: written by hand as ``babbling``, lists ``notlist``, whose calls it answers
  with a ``content`` that is a string, not a list, and ``video``, whose calls it answers
  with a content block of a type MCP does not define, ``null``, whose calls it answers with
  ``"result": null``, ``none``, whose calls it answers with a response holding no result,
  ``nodata``, whose calls it answers with an image block with no data, ``textnum``, whose
  calls it answers with a second text block whose text is a number, ``cutstring``,
  whose calls it answers with a result that is a string cut inside a surrogate pair,
  ``twoimages`` and ``twonope``, whose calls it answers with two image blocks with no data
  and two blocks of a type MCP does not define, ``notblock``, whose calls it answers
  with a content block that is a string, and ``manynope``, whose calls it answers with
  2,000 blocks of a type MCP does not define;
- ``mute``: the SDK's low-level server, listing ``mute``, whose calls it answers with an
  error result with no content, and ``refuse``, whose calls it refuses with a JSON-RPC error
  -32602 whose message is empty;
- ``stubborn``: written by hand as ``babbling``, ignores SIGTERM, starts a child that ignores
  it too (logging its pid in STATE_FILE after its own), and outlives its stdin's closing;
- ``sized STATE_FILE``: written by hand as ``babbling``, lists ``sized``, whose calls it
  answers with a message of exactly ``size`` bytes (its newline aside) in one write, and
  appends ``stdin closed`` to STATE_FILE once its stdin ends, before it exits;
- ``http PORT``: the ``tools`` server over streamable HTTP on 127.0.0.1:PORT.

With ``FAULTY_STARTS`` set in its environment, every start appends the process's id to the
file it names, before it serves.
"""

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ListToolsResult,
    PaginatedRequestParams,
    TextResourceContents,
)
from mcp_types import Tool as ListedTool


def tools_server() -> MCPServer:
    server = MCPServer("faulty")

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool()
    def boom() -> str:
        """Fail."""
        raise ToolError("the boom tool always fails")

    @server.tool()
    def hang() -> str:
        """Never answer."""
        while True:
            time.sleep(60)

    @server.tool()
    def crash() -> str:
        """Exit the process mid-call."""
        os._exit(3)

    @server.tool(structured_output=False)
    def big(size: int) -> str:
        """A text of `size` characters."""
        return "x" * size

    @server.tool(structured_output=False)
    def picture() -> list[ImageContent | EmbeddedResource]:
        """An image and a resource."""
        return [
            ImageContent(
                type="image",
                data=base64.b64encode(b"\x89PNG" + bytes(96)).decode(),
                mime_type="image/png",
            ),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="memo://1", mime_type="text/plain", text="a memo"
                ),
            ),
        ]

    return server


def changing_server(state: Path) -> MCPServer:
    starts = int(state.read_text()) + 1 if state.exists() else 1
    state.write_text(str(starts))
    server = MCPServer("changing")
    if starts == 1:

        @server.tool()
        def alpha() -> str:
            """The first start's tool."""
            return "alpha"

    else:

        @server.tool()
        def beta() -> str:
            """The later starts' tool."""
            return "beta"

    return server


def colliding_server() -> MCPServer:
    server = MCPServer("colliding")

    def dotted() -> str:
        return "dotted"

    def underscored() -> str:
        return "underscored"

    server.tool(name="a.b")(dotted)
    server.tool(name="a_b")(underscored)
    return server


class BadRefServer(MCPServer):
    """Lists ``refd`` with an input schema whose ``$ref`` points nowhere."""

    async def list_tools(self) -> list[ListedTool]:
        broken = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
        return [
            tool.model_copy(update={"input_schema": broken}) if tool.name == "refd" else tool
            for tool in await super().list_tools()
        ]


def badref_server() -> MCPServer:
    server = BadRefServer("badref")

    @server.tool()
    def refd(a: int) -> str:
        """Take a number (as the server lists it, an argument it cannot check)."""
        return f"refd got {a}"

    return server


def mute_server() -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        listed = [
            ListedTool(name=name, input_schema={"type": "object"}) for name in ("mute", "refuse")
        ]
        return ListToolsResult(tools=listed)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        if params.name == "refuse":
            raise MCPError(-32602, "")
        return CallToolResult(content=[], is_error=True)

    return Server("mute", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def silent() -> None:
    for _line in sys.stdin:
        pass  # read everything, answer nothing


def chatty() -> None:
    for _line in sys.stdin:
        print("usage: faulty [--port N] (got a request)", flush=True)


def usage() -> None:
    sys.stdin.readline()
    print("usage: faulty MODE [STATE_FILE]", flush=True)
    raise SystemExit(2)


def babbling(listed: list[dict[str, object]] | None = None, cursor: str | None = None) -> None:
    listed = listed or [{"name": "babble", "inputSchema": {"type": "object"}}]
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message:
            continue
        if method == "tools/call":
            print("DEBUG babble: connecting to the backend", flush=True)
            continue
        babbling_answer(message, listed, cursor)


def babbling_answer(
    message: dict[str, Any], listed: list[dict[str, object]], cursor: str | None = None
) -> None:
    """Answer a request other than a call as ``babbling`` does (a notification goes
    unanswered)."""
    method = message.get("method")
    if "id" not in message:
        return
    if method == "initialize":
        version = message["params"]["protocolVersion"]
        info = {"name": "babbling", "version": "1"}
        result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
    elif method == "tools/list":
        result = {"tools": listed}
        if cursor is not None:
            result["nextCursor"] = cursor
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


def notifying(state: Path | None) -> None:
    first = False
    if state is not None:
        starts = int(state.read_text()) + 1 if state.exists() else 1
        state.write_text(str(starts))
        first = starts == 1
    listed = [{"name": "note", "inputSchema": {"type": "object"}}]
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") != "tools/call":
            babbling_answer(message, listed)
            continue
        if first:
            raise SystemExit(3)
        params = {"level": "loud", "data": "a log line"}
        print(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": params}))
        result = {"content": [{"type": "text", "text": "noted"}], "isError": False}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


def surrogate() -> None:
    listed = [{"name": "cut", "description": "Cut \ud83d", "inputSchema": {"type": "object"}}]
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") != "tools/call":
            babbling_answer(message, listed)
            continue
        result = {"content": [{"type": "text", "text": "smile \ud83d"}], "isError": False}
        answer = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        assert "\\ud83d" in answer
        print(answer, flush=True)


MALFORMED = {
    "notlist": {"content": "hello", "isError": False},
    "video": {"content": [{"type": "video", "url": "https://example.com/v.mp4"}]},
    "null": None,
    "none": "(no result)",
    "nodata": {"content": [{"type": "image", "mimeType": "image/png"}]},
    "textnum": {"content": [{"type": "text", "text": "ok"}, {"type": "text", "text": 5}]},
    "cutstring": "cut \ud83d",
    "twoimages": {"content": [{"type": "image", "mimeType": "image/png"}] * 2},
    "twonope": {"content": [{"type": "nope"}] * 2},
    "notblock": {"content": ["hi"]},
    "manynope": {"content": [{"type": "nope", "text": "x"}] * 2000},
}


def malformed() -> None:
    listed = [{"name": name, "inputSchema": {"type": "object"}} for name in MALFORMED]
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") != "tools/call":
            babbling_answer(message, listed)
            continue
        answer = {
            "jsonrpc": "2.0",
            "id": message["id"],
            "result": MALFORMED[message["params"]["name"]],
        }
        if answer["result"] == "(no result)":
            del answer["result"]
        print(json.dumps(answer), flush=True)


def sized(state: Path) -> None:
    schema = {"type": "object", "properties": {"size": {"type": "integer"}}}
    listed = [{"name": "sized", "inputSchema": schema}]
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") != "tools/call":
            babbling_answer(message, listed)
            continue
        empty = {"content": [{"type": "text", "text": ""}], "isError": False}
        base = len(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": empty}))
        text = "x" * (message["params"]["arguments"]["size"] - base)
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        answer = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        data = answer.encode() + b"\n"
        while data:
            data = data[os.write(1, data) :]
    with state.open("a", encoding="utf-8") as log:
        log.write("stdin closed\n")


def stubborn(state: Path) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its child inherits the disposition
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL
    )
    with state.open("a", encoding="utf-8") as log:
        log.write(f"{os.getpid()}\n{child.pid}\n")
    babbling()
    time.sleep(600)  # its stdin is closed: it stays


if __name__ == "__main__":
    mode = sys.argv[1]
    starts = os.environ.get("FAULTY_STARTS")
    if starts:
        with open(starts, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()}\n")
    if mode == "silent":
        silent()
    elif mode == "chatty":
        chatty()
    elif mode == "babbling":
        babbling()
    elif mode == "schemaless":
        babbling(
            [
                {"name": "babble", "inputSchema": {"type": "object"}},
                {"name": "bare", "description": "Takes nothing, says so by listing no schema."},
            ]
        )
    elif mode == "paging":
        babbling(cursor="page-2")
    elif mode == "duplicate":
        babbling(
            [
                {"name": "echo", "description": "Say it back.", "inputSchema": {"type": "object"}},
                {"name": "echo", "description": "Shout it.", "inputSchema": {"type": "object"}},
                {"name": "babble", "inputSchema": {"type": "object"}},
                {"name": "babble", "inputSchema": {"type": "object"}},
            ]
        )
    elif mode == "usage":
        usage()
    elif mode == "tools":
        tools_server().run()
    elif mode == "changing":
        changing_server(Path(sys.argv[2])).run()
    elif mode == "colliding":
        colliding_server().run()
    elif mode == "badref":
        badref_server().run()
    elif mode == "notifying":
        notifying(Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    elif mode == "surrogate":
        surrogate()
    elif mode == "malformed":
        malformed()
    elif mode == "mute":
        anyio.run(serve_stdio, mute_server())
    elif mode == "sized":
        sized(Path(sys.argv[2]))
    elif mode == "stubborn":
        stubborn(Path(sys.argv[2]))
    elif mode == "http":
        tools_server().run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
