"""The crash test's writer: a process that commits turns in a loop until it is killed.

Run as ``python crash_writer.py KIND WHERE`` (KIND ``sqlite`` or ``postgres``, WHERE the path
or DSN), it is a fork server, so that the crash test can start many writers quickly: each
``fork`` line on stdin forks a writer (``child PID`` on stdout), each ``reap PID`` line waits
for that writer to end (``reaped PID``). A writer commits turn after turn to one conversation
and writes ``ack N`` once turn N's append has returned (``failed``, after a traceback on
stderr, if anything goes wrong). All lines go to the same pipe, so the
acks of a writer always come before its ``reaped`` line.

The turns are a pure function of their number: the test knows what each must hold.
"""

import os
import sys
import traceback

import trio

from pipeline import AuditRecord, HookRecord
from pipeline.logs import PostgresLog, SQLiteLog
from turns import Message, Text, ToolCall, ToolResult

CONVERSATION = "crash"


def turn_messages(number: int) -> tuple[Message, ...]:
    """Turn `number`: 2 to 5 messages, one of them large enough to span several pages."""
    messages = [
        Message.user(
            [Text(f"question {number}", meta={"n": number})], meta={"client": "crash-test"}
        ),
        Message.assistant(
            [
                Text(f"answer {number} " + "x" * (1000 * (number % 7))),
                ToolCall(f"call-{number}", "lookup", {"n": number}),
            ]
        ),
    ]
    messages.extend(
        Message.tool(ToolResult(f"call-{number}", f"result {number}.{extra}"))
        for extra in range(number % 4)
    )
    return tuple(messages)


def turn_audit(number: int) -> AuditRecord:
    return AuditRecord(
        f"turn-{number}",
        "completed",
        hooks=(HookRecord("note", "pre", "1", number / 1000, "cont"),),
    )


def _say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # unbuffered: nothing is left to be written twice


async def _commit_forever(kind: str, where: str) -> None:
    log = SQLiteLog(where) if kind == "sqlite" else PostgresLog(where)
    async with log:
        entries = await log.entries(CONVERSATION)
        number, length = len(entries), sum(len(entry.messages) for entry in entries)
        while True:
            messages = turn_messages(number)
            # With the length it just read: a LogConflict here means the log's own count
            # disagrees with its turns, a torn commit. It fails the test (stderr).
            await log.append(
                CONVERSATION, f"turn-{number}", messages, turn_audit(number), expected_length=length
            )
            _say(f"ack {number}")
            number += 1
            length += len(messages)


def main() -> None:
    kind, where = sys.argv[1], sys.argv[2]
    if kind == "postgres":
        import psycopg  # noqa: F401 - imported once here, not in every writer

    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    trio.run(_commit_forever, kind, where)
                except BaseException:
                    traceback.print_exc()
                    _say("failed")
                finally:
                    sys.stderr.flush()
                    os._exit(1)  # never return into the fork server's loop
            _say(f"child {pid}")
        elif command == "reap":
            os.waitpid(int(argument), 0)
            _say(f"reaped {argument}")


if __name__ == "__main__":
    main()
