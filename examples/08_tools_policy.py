"""Tools behind a policy: a blocked tool, a permission prompt, a redacted result.

The model asks for three tool calls in one step. A before-tool hook blocks the dangerous
tool outright and asks permission for anything outside ``docs/``; the permission callback
(here an operator's rule; in a real app, a person clicking "allow") refuses. An after-tool hook
scrubs e-mail addresses from what the tools return, so the model, the events and the log
never see them. Blocked and rewritten results say so in their ``meta``: a replay of the log
can tell a hook's substitution from a real tool result.

Run it: ``python examples/08_tools_policy.py``
"""

import re

import trio

from pipeline import (
    TOOL_HOOKS,
    Ask,
    Block,
    Cont,
    Pipeline,
    TurnResult,
    ask,
    block,
    cont,
    hook,
    tool,
)
from pipeline.events import ToolBlocked, ToolFinished, ToolStarted
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import ToolCall, ToolResult, Turn

FILES = {
    "docs/intro.md": "Welcome! Questions go to help@example.com.",
    "config/secrets.toml": "token = 'abc123'",
}
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


@tool
def read_file(path: str) -> str:
    """Read a file of the project.

    Args:
        path: The file's path, relative to the project root.
    """
    return FILES[path]


@tool
def delete_file(path: str) -> str:
    """Delete a file of the project.

    Args:
        path: The file's path, relative to the project root.
    """
    del FILES[path]
    return f"deleted {path}"


def file_policy(call: ToolCall, turn: Turn) -> Cont[ToolCall] | Block | Ask:
    if call.name == "delete_file":
        return block("deleting files is not allowed from chat")
    # The arguments are as the model sent them: they are checked against the schema after
    # the before-tool hooks. A call without a text path gets invalid_arguments, unrun.
    path = call.arguments.get("path")
    if isinstance(path, str) and not path.startswith("docs/"):
        return ask(f"read {path}?")
    return cont(call)


def scrub_emails(call: ToolCall, result: ToolResult, turn: Turn) -> Cont[ToolResult]:
    return cont(result.with_content(EMAIL.sub("[EMAIL]", result.content)))


async def operator(call: ToolCall, question: str, turn: Turn) -> bool:
    # The rule a person on call would apply; an app would await their answer here.
    return not str(call.arguments.get("path", "")).startswith("config/")


def model() -> ScriptedModel:
    return ScriptedModel(
        [
            [
                "Let me look.",
                ToolCall("c1", "read_file", {"path": "docs/intro.md"}),
                ToolCall("c2", "delete_file", {"path": "docs/intro.md"}),
                ToolCall("c3", "read_file", {"path": "config/secrets.toml"}),
            ],
            "The intro says welcome and gives a help address; I may not delete or read config.",
        ]
    )


async def main() -> TurnResult:
    pipe = Pipeline(
        model=model(),
        tools=[read_file, delete_file],
        before_tool=[file_policy],
        after_tool=[hook(scrub_emails, match="read_file")],
        permission=operator,
        tool_concurrency=1,
    )
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="support-1") as session:
        async with session.stream("Summarise the intro, then clean up.") as events:
            async for event in events:
                if isinstance(event, ToolStarted):
                    print(f"runs     {event.call.name}({dict(event.call.arguments)})")
                elif isinstance(event, ToolBlocked):
                    print(f"blocked  {event.call.name} by {event.hook}: {event.reason}")
                elif isinstance(event, ToolFinished):
                    print(f"result   {event.call.id}: {event.result.content}")
        result = events.result
    print(f"reply -> {result.reply.text if result.reply else None}")
    print("committed:")
    for message in (await log.load("support-1")).messages:
        for part in message.parts:
            marks = part.meta.get(TOOL_HOOKS) if isinstance(part, ToolResult) else None
            print(f"  {message.role:9} {type(part).__name__:10} {marks or ''}")
    print(f"files left: {sorted(FILES)}")
    return result


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
