"""Memory from an MCP server: a fact the model stores in one turn is read back in the next.

The reference memory server (``@modelcontextprotocol/server-memory``, run by Node.js) is a
toolset named ``memory``: the model sees its tools as ``memory_create_entities``,
``memory_read_graph`` and so on. A synthetic tool call injects ``memory_read_graph`` at the
start of every turn, so the model always reads what it remembered; an after-tool hook sees
each call under the same final name. The server is started once, when the session opens,
and stopped when it closes. The scripted model keeps it offline.

Run it: ``python examples/11_mcp_memory.py`` (it uses the server installed in
``.cache/mcp-servers`` by ``.ci/run``, else ``npx``).
"""

import json
import shutil
import tempfile
from pathlib import Path

import trio

from hooks import inject_tool_call
from pipeline import Pipeline, TurnResult, cont, mcp_toolset
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import ToolCall

INSTALLED = (
    Path(__file__).resolve().parent.parent
    / ".cache/mcp-servers/node_modules/.bin/mcp-server-memory"
)


def memory_toolset(memory_file: Path):
    """The memory server, keeping its graph in `memory_file`."""
    env = {"MEMORY_FILE_PATH": str(memory_file)}
    if INSTALLED.exists():
        return mcp_toolset("memory", command=str(INSTALLED), env=env)
    npx = shutil.which("npx") or "npx"
    return mcp_toolset(
        "memory", command=npx, args=["-y", "@modelcontextprotocol/server-memory"], env=env
    )


def show(call, result, turn):
    """An after-tool hook: it sees the final name the model used."""
    print(f"tool     {call.name} -> {' '.join(result.content.split())[:70]}")
    return cont(result)


async def main() -> list[TurnResult]:
    remember = ToolCall(
        "c1",
        "memory_create_entities",
        {"entities": [{"name": "Ada", "entityType": "person", "observations": ["prefers tea"]}]},
    )
    model = ScriptedModel([[remember], "Noted: you prefer tea.", "Tea, as you prefer."])
    with tempfile.TemporaryDirectory() as directory:
        pipe = Pipeline(
            model=model,
            toolsets=[memory_toolset(Path(directory) / "memory.jsonl")],
            pre=[inject_tool_call("memory_read_graph")],
            after_tool=[show],
        )
        results = []
        async with pipe.session(log=MemoryLog(), conversation_id="ada") as session:
            for text in ("Remember that I prefer tea.", "What should I drink?"):
                result = await session.send(text)
                injected = result.turn.injections[0].parts[1].content
                print(f"memory   {json.dumps(json.loads(injected)['entities'])}")
                print(f"reply -> {result.reply.text if result.reply else None}")
                results.append(result)
    return results


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
