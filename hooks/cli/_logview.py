"""`turnplug log`: a conversation from a durable log, for people (or, with --json, machines).

Each commit (a turn, or a background hook's output) is shown with its commit time and its
messages: who said what, tool calls and their results, which hook injected which part
(``meta["injected_by"]``), and which tool hooks blocked a call or rewrote its arguments or
result (``meta["tool_hooks"]``). With ``--audit``, each turn's audit record follows: the
injections, transient ones included, every attempt (rejected ones too) with the tool calls it
ran, a halt, and the hooks with their verdicts and timings. Without a conversation, the
log's conversations are listed, the most recently committed first.
"""

import json
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TypeGuard

from pipeline import INJECTED_BY, TOOL_HOOKS, AuditRecord, LogError
from pipeline.logs import ConversationInfo, LogEntry, PostgresLog, SQLiteLog, entry_to_dict
from turns import Message, Text, ToolCall, ToolResult

from .._terminal import json_text, printable
from ._logs import POSTGRES_SCHEMES

Write = Callable[[str], None]

ROLE_WIDTH = 10


def existing_log(where: str) -> SQLiteLog | PostgresLog:
    """The log `where` names: a ``postgresql://`` DSN, or the path of an SQLite file.

    Raises:
        LogError: No SQLite file at that path (it is not created: this only reads), or a
            directory there; a database without turnplug's tables (they are not created
            either) says so when it is opened.
        ConfigError: A malformed DSN, or psycopg is not installed.
    """
    if where.startswith(POSTGRES_SCHEMES):
        # Opening it as a log would create turnplug's tables in a database holding none.
        return PostgresLog(where, max_connections=1, create_tables=False)
    if os.path.isdir(where):
        raise LogError(
            f"no log at {where!r}: it is a directory, not an SQLite database file — pass the"
            " path of the log file (the one --log was given when the turns were run)",
            log=f"SQLiteLog({where!r})",
        )
    if not os.path.isfile(where):
        raise LogError(
            f"no log at {where!r}: the file does not exist — pass the path of an existing"
            " SQLite log, or a postgresql:// DSN",
            log=f"SQLiteLog({where!r})",
        )
    # Read-only: it is never created, migrated or written to, and may be on a read-only
    # mount or a file this user may only read; a database without turnplug's tables is
    # refused when it is opened.
    return SQLiteLog(where, read_only=True)


def _empty_file(where: str) -> bool:
    """Whether `where` names an empty file: a log no turn was ever committed to (a first
    run that stopped before writing), read as one without opening it, which would write."""
    return (
        not where.startswith(POSTGRES_SCHEMES)
        and os.path.isfile(where)
        and os.path.getsize(where) == 0
    )


async def show_log(
    write: Write,
    conversation_id: str | None,
    where: str,
    audit: bool,
    as_json: bool,
    ascii_only: bool = False,
) -> None:
    """Write the conversation's committed turns (and their audit records, if asked), or
    the log's conversations when `conversation_id` is None. `ascii_only`: the JSON escapes
    every non-ASCII character, for a `write` whose output is not UTF-8."""
    conversations: tuple[ConversationInfo, ...] = ()
    entries: tuple[LogEntry, ...] = ()
    if not _empty_file(where):
        async with existing_log(where) as log:
            if conversation_id is None:
                conversations = await log.conversations()
            else:
                entries = await log.entries(conversation_id)
    if conversation_id is None:
        if as_json:
            write(json.dumps({"conversations": [_info(c) for c in conversations]}, indent=2))
        else:
            for line in listing(where, conversations):
                write(printable(line, breaks=False))
        return
    if as_json:
        shown = _as_json(conversation_id, entries, audit)
        write(json_text(shown, indent=2, ascii_only=ascii_only))
        return
    for line in render(conversation_id, entries, audit=audit):
        write(printable(line, breaks=False))


def _as_json(conversation_id: str, entries: tuple[LogEntry, ...], audit: bool) -> Any:
    shown = []
    for entry in entries:
        data = entry_to_dict(entry)
        if not audit:
            del data["audit"]
        shown.append(data)
    return {"conversation": conversation_id, "entries": shown}


def _info(info: ConversationInfo) -> dict[str, Any]:
    return {
        "conversation_id": info.conversation_id,
        "turns": info.turns,
        "messages": info.messages,
        "last_committed_at": info.last_committed_at.isoformat(),
    }


def listing(where: str, conversations: tuple[ConversationInfo, ...]) -> Iterator[str]:
    """The conversations of a log as a table, the most recently committed first."""
    where = without_password(where)
    if not conversations:
        yield f"{where}: no conversations"
        return
    count = len(conversations)
    yield f"{where}: {count} conversation{'s' if count != 1 else ''}"
    width = max(len("CONVERSATION"), *(len(c.conversation_id) for c in conversations))
    yield f"  {'CONVERSATION':<{width}}  TURNS  LAST COMMIT"
    for info in conversations:
        yield f"  {info.conversation_id:<{width}}  {info.turns:>5}  {when(info.last_committed_at)}"


_SECRET_PARAMETERS = frozenset(("password", "sslpassword"))
"""libpq's connection parameters that hold a secret: the password, the client key's."""


def without_password(where: str) -> str:
    """`where` as output may show it: a DSN without its password (in the URL's user
    part or a ``password`` or ``sslpassword`` parameter), as the log's repr and errors show
    it; a path as is.

    Read as libpq reads a URL: the user part is what comes before an ``@`` met ahead of
    any ``/`` (a password may hold ``?`` or ``#``).
    """
    if not where.startswith(POSTGRES_SCHEMES):
        return where
    scheme, _, rest = where.partition("://")
    stop = re.search("[@/]", rest)
    if stop is not None and stop[0] == "@":
        rest = rest[: stop.start()].partition(":")[0] + rest[stop.start() :]
    head, mark, query = rest.partition("?")
    if mark:
        kept = "&".join(
            item
            for item in query.split("&")
            if urllib.parse.unquote(item.partition("=")[0]) not in _SECRET_PARAMETERS
        )
        rest = f"{head}?{kept}" if kept else head
    return f"{scheme}://{rest}"


def when(moment: datetime | None) -> str:
    """A commit time as people read it, in UTC to the second."""
    if moment is None:
        return "time unknown"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(conversation_id: str, entries: tuple[LogEntry, ...], *, audit: bool) -> Iterator[str]:
    """The conversation as lines of text."""
    if not entries:
        yield f"conversation {conversation_id!r}: nothing committed"
        return
    messages = sum(len(entry.messages) for entry in entries)
    commits = f"{len(entries)} commit{'s' if len(entries) != 1 else ''}"
    yield f"conversation {conversation_id!r}: {commits}, {messages} messages"
    for number, entry in enumerate(entries, 1):
        yield ""
        yield f"commit {number}  {entry.turn_ref}  committed {when(entry.committed_at)}"
        for message in entry.messages:
            yield from _message(message)
        if audit:
            yield from _audit(entry.audit)


def _message(message: Message) -> Iterator[str]:
    label: str = message.role
    for part in message.parts:
        for line in _part(part):
            yield f"  {label:<{ROLE_WIDTH}} {line}"
            label = ""
    if not message.parts:
        yield f"  {label:<{ROLE_WIDTH}} (empty)"


_LINE_BREAK = re.compile("\r?\n")
"""A line break, LF or CRLF: a CRLF's CR is part of the break, not a control character to show."""


def _part(part: Text | ToolCall | ToolResult, *, provenance: bool = True) -> list[str]:
    source = part.meta.get(INJECTED_BY) if provenance else None
    prefix = f"[injected by {source}] " if source else ""
    if provenance and isinstance(part, ToolResult):
        prefix += "".join(f"[{note}] " for note in _tool_hooks(part))
    match part:
        case Text(text=text):
            first, *rest = _LINE_BREAK.split(text)
            return [prefix + first, *rest]
        case ToolCall(id=call_id, name=name, arguments=arguments):
            shown = json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True)
            return [f"{prefix}-> {name}({shown})  [{call_id}]"]
        case ToolResult(call_id=call_id, content=content, is_error=is_error):
            error = f" error ({part.error_class or 'unspecified'})" if is_error else ""
            first, *rest = _LINE_BREAK.split(content)
            return [f"{prefix}<- [{call_id}]{error} {first}", *rest]
    raise TypeError(f"unknown part {part!r}")  # pragma: no cover - Part is a closed union


def _tool_hooks(result: ToolResult) -> Iterator[str]:
    """What tool hooks did to the call `result` answers (its ``meta[TOOL_HOOKS]``): the
    committed call shows what the model asked, so a blocked call, the arguments the tool
    really ran with, and a rewritten result are said here. Anything not of the shape the
    runtime writes is left out."""
    hooks = result.meta.get(TOOL_HOOKS)
    if not isinstance(hooks, Mapping):
        return
    blocked_by = hooks.get("blocked_by")
    if isinstance(blocked_by, str):
        yield f"blocked by {blocked_by}"
    rewriters, arguments = hooks.get("arguments_rewritten_by"), hooks.get("arguments")
    if _names(rewriters) and isinstance(arguments, Mapping):
        shown = json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True, default=repr)
        yield f"ran with {shown}: arguments rewritten by {', '.join(rewriters)}"
    rewriters = hooks.get("result_rewritten_by")
    if _names(rewriters):
        yield f"result rewritten by {', '.join(rewriters)}"


def _names(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def _audit(record: AuditRecord | None) -> Iterator[str]:
    pad = " " * 4
    if record is None:
        yield "  audit: none recorded (committed without one, e.g. by a background hook)"
        return
    attempts = len(record.attempts)
    yield f"  audit: {record.outcome}, {attempts} attempt{'s' if attempts != 1 else ''}"
    for injection in record.injections:
        durability = "durable" if injection.durable else "transient"
        text = "; ".join(_one_line(part) for part in injection.parts)
        yield f"{pad}injected by {injection.source} ({injection.stage}, {durability}): {text}"
    rejected = {rejection.attempt: rejection for rejection in record.rejections}
    for attempt in record.attempts:
        usage = attempt.usage
        line = (
            f"{pad}attempt {attempt.attempt}: {attempt.steps} model call"
            f"{'s' if attempt.steps != 1 else ''}, finish {attempt.finish_reason},"
            f" {usage.input_tokens} in / {usage.output_tokens} out tokens"
        )
        if attempt.attempt in rejected:
            rejection = rejected[attempt.attempt]
            line += f"; rejected by {rejection.hook}: {rejection.feedback}"
        yield line
        for run in record.tools:
            if run.attempt == attempt.attempt:
                shown = " / ".join(
                    _part(run.call, provenance=False) + _part(run.result, provenance=False)
                )
                yield f"{pad}  call {run.step}: {shown}"
    if record.halt is not None:
        yield f"{pad}halted by {record.halt.hook}: {record.halt.reason}"
    for hook in record.hooks:
        shadow = " (shadow)" if hook.shadow else ""
        detail = f": {hook.detail}" if hook.detail else ""
        yield (
            f"{pad}hook {hook.hook} ({hook.stage} {hook.position}){shadow} -> {hook.verdict}"
            f"{detail}, {hook.elapsed * 1000:.2f} ms"
        )


def _one_line(part: Text | ToolCall | ToolResult) -> str:
    return " / ".join(_part(part, provenance=False))
