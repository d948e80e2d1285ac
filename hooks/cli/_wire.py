"""The OpenAI Chat Completions wire format, both ways, for `turnplug serve`.

A pure core: `parse_request` reads a request body into a `ChatRequest` (or raises a
`WireError` that names the offending field, as the OpenAI API's own 400s do), and the
builders write a reply as a completion object, as stream chunks, or an error body. No I/O.
"""

import functools
import json
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, final

import attrs

from pipeline.providers import decode_arguments
from turns import (
    Context,
    Message,
    Part,
    Reply,
    RequestOptions,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)

ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_encode_string = json.encoder.encode_basestring
# Words of Python's ValueError for an integer past `sys.get_int_max_str_digits`: besides a
# JSONDecodeError or UnicodeDecodeError, the one ValueError of the JSON reader that is the
# body's fault (any other would be a bug of the gateway's, a 500).
_LONG_INTEGER = "for integer string conversion"
TOOL_CHOICES = ("none", "auto", "required")
OPENAI_META = "openai"
"""The meta key whose fields the OpenAI provider adds to a message on the wire (see
docs/providers.md)."""
INVALID_ARGUMENTS = "invalid_arguments"
"""The meta mark of a tool call whose arguments the model wrote undecodable, ``{"raw",
"error"}``, as the providers set it (see docs/providers.md)."""

# Provider finish reasons that mean the same as an OpenAI one.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


@final
class WireError(Exception):
    """A request the gateway refuses, as an HTTP status and an OpenAI-style error body.

    Attributes:
        status: The HTTP status.
        message: What was wrong and how to fix it.
        type: The error type (``invalid_request_error``, ``turn_halted``, ...).
        param: The request field at fault, when one is.
        code: A short machine-readable code.
        extra: More fields for the error object (a halting hook's substitute reply).
        headers: More response headers (``Retry-After``), as ASGI pairs.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.extra = dict(extra or {})
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code, **self.extra)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None, **extra: Any
) -> dict[str, Any]:
    """An OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code, **extra}}


@final
@attrs.frozen
class ChatRequest:
    """One chat completion request, read and checked.

    Attributes:
        model: The model name the client asked for (the gateway answers with its own).
        history: The messages before the last one.
        system: The leading system (or developer) messages' text, if any.
        message: The turn's message: the last message, the user's, or a tool message holding
            the results of every trailing ``tool`` message (a continuation).
        positions: For a continuation, where each result was in ``messages`` (for errors).
        tools: The tools the client declared; their calls are returned to the client.
        options: temperature, max_tokens and tool_choice as the client set them, and in
            ``extra`` the parameters forwarded to the upstream (`forwarded`).
        stream: Whether the client asked for a stream of chunks.
        include_usage: ``stream_options.include_usage``.
        history_problem: Why the history would be refused upstream (tool calls without
            their results), raised for a stateless turn; a conversation's turn ignores the
            request's history, as the API's own sliding windows of it do.
    """

    model: str
    history: tuple[Message, ...]
    system: str | None
    message: Message
    positions: tuple[int, ...]
    tools: tuple[ToolSpec, ...]
    options: RequestOptions
    stream: bool
    include_usage: bool
    history_problem: "WireError | None" = None

    def context(self) -> Context:
        """The conversation the request carries, as the turn's context."""
        return Context(messages=self.history, system=self.system, tools=self.tools)


def check_continuation(request: ChatRequest, context: Context) -> None:
    """Check that a continuation's results answer the tool calls that end `context`.

    The calls are the ones of the context's last message (the request's own assistant
    message, or the conversation log's): each must get one result, and each result must
    name one of them.

    Raises:
        WireError: 400 naming the tool message (or the field) at fault.
    """
    last = context.messages[-1] if context.messages else None
    calls = {}
    if last is not None and last.role == "assistant":
        calls = {part.id: part.name for part in last.parts if type(part) is ToolCall}
    where = f"messages[{request.positions[0]}]"
    if not calls:
        raise _bad(
            f"'{where}' is a tool result, but the message before it is not an assistant message"
            " with tool calls — send the assistant message (with its 'tool_calls') that the"
            " results answer, then one tool message per call",
            f"{where}.role",
        )
    seen: set[str] = set()
    for position, result in zip(request.positions, request.message.parts, strict=True):
        assert type(result) is ToolResult
        param = f"messages[{position}].tool_call_id"
        if result.call_id not in calls:
            raise _bad(
                f"'{param}' is {result.call_id!r}, which matches no tool call of the assistant"
                f" message before it (its calls: {sorted(calls)}) — answer each call with its"
                " own id",
                param,
            )
        if result.call_id in seen:
            raise _bad(f"tool call {result.call_id!r} is answered twice ('{param}')", param)
        seen.add(result.call_id)
    missing = [f"{call_id} ({name})" for call_id, name in calls.items() if call_id not in seen]
    if missing:
        raise _bad(
            f"tool calls {missing} have no tool message: send one result per call (an error"
            " message as the content for a call that could not run)",
            "messages",
        )


def _bad(message: str, param: str | None, code: str = "invalid_value") -> WireError:
    return WireError(400, message, param=param, code=code)


def parse_request(body: bytes, upstream: "Upstream" = "openai") -> ChatRequest:
    """Read a ``POST /v1/chat/completions`` body.

    The parameters the gateway forwards (`FORWARDED`) go into the options' ``extra``, as
    `upstream` names them (see `forwarded`).

    Raises:
        WireError: 400 for a body that is not a JSON object, or a field of the wrong type or
            value; the error's ``param`` names the field (``messages[2].content``).
    """
    try:
        data, non_finite = _read_json(body)
    except RecursionError:
        # Nested hundreds deep: json recurses once per level, so it is refused, not a 500.
        raise _bad(
            "the request body nests too deeply to read (hundreds of arrays or objects inside"
            " each other) — send a JSON object with 'model' and 'messages'",
            None,
            "invalid_json",
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(
            f"the request body is not valid JSON: {exc} — send a JSON object with 'model' and"
            " 'messages'",
            None,
            "invalid_json",
        )
    except ValueError as exc:
        if _LONG_INTEGER not in str(exc):
            raise
        # Valid JSON, but an integer longer than Python converts from text (a guard against
        # the quadratic cost of the conversion, `sys.get_int_max_str_digits`).
        raise _bad(
            f"the request body holds an integer of more than {sys.get_int_max_str_digits()}"
            " digits, which the gateway does not read — send shorter numbers",
            None,
            "invalid_json",
        )
    if not isinstance(data, dict):
        raise _bad(
            f"the request body must be a JSON object, got {_json_type(data)}",
            None,
            "invalid_json",
        )
    if _may_hold_lone_surrogate(body):
        _check_unicode(data)
    if non_finite:
        # Anywhere in the body (a client tool's schema, tool_choice, a forwarded parameter):
        # no request can carry it on, and the provider would refuse it after the pre hooks
        # ran, naming a field the client never sent.
        _check_finite(data)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(
            "'model' is required and must be a non-empty string",
            "model",
            "missing_required_parameter" if model is None else "invalid_type",
        )
    raw = data.get("messages")
    if raw is None:
        raise _bad(
            "'messages' is required: a non-empty array of {role, content} objects",
            "messages",
            "missing_required_parameter",
        )
    if not isinstance(raw, list) or not raw:
        raise _bad(
            "'messages' must be a non-empty array of message objects", "messages", "invalid_type"
        )
    messages = [_message(item, f"messages[{i}]") for i, item in enumerate(raw)]
    system_parts: list[str] = []
    while messages and messages[0].role == "system" and len(messages) > 1:
        system_parts.append(messages.pop(0).text)
    last = messages[-1]
    # Checked for a stateless turn only: a conversation's turn ignores the request's history.
    try:
        _check_tool_order(messages, len(raw) - len(messages))
        history_problem = None
    except WireError as problem:
        history_problem = problem
    positions: tuple[int, ...] = ()
    if last.role == "tool":
        # The client ran the tool calls the gateway returned and sends their results: the
        # turn continues from them (every trailing tool message), as one tool message.
        first = len(messages)
        while first > 0 and messages[first - 1].role == "tool":
            first -= 1
        results = [part for m in messages[first:] for part in m.parts]
        positions = tuple(range(len(raw) - (len(messages) - first), len(raw)))
        del messages[first:]
        messages.append(Message("tool", results))
        last = messages[-1]
    elif last.role != "user":
        raise _bad(
            f"the last message must be the user's (role 'user') or tool results (role"
            f" 'tool'), got role {last.role!r} — each request is one turn on the user's latest"
            " message, or a continuation from the results of the tool calls it returned",
            f"messages[{len(raw) - 1}].role",
        )
    n = _optional(data, "n", int, 1)
    if n != 1:
        raise _bad(
            "'n' must be 1: the gateway answers one choice per request", "n", "unsupported_value"
        )
    _refuse_unsupported(data)
    stream = _optional(data, "stream", bool, False)
    stream_options = data.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
        if not stream:
            # OpenAI's own 400, in its words: the options would be silently ignored.
            raise _bad(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled —"
                " send 'stream': true with it, or leave it out",
                "stream_options",
            )
        include_usage = _optional(stream_options, "include_usage", bool, False, "stream_options.")
    tools = _tools(data.get("tools"))
    options = _options(data)
    named = options.tool_choice
    if tools and named not in (None, *TOOL_CHOICES) and named not in {t.name for t in tools}:
        # (Without client tools, the name may be one of the pipeline's own: the turn checks.)
        raise _bad(
            f"'tool_choice' names function {named!r}, which is not one of the request's"
            f" 'tools' ({[t.name for t in tools]}) — name one of them, or use 'auto', 'none'"
            " or 'required'",
            "tool_choice",
        )
    return ChatRequest(
        model=model,
        history=tuple(messages[:-1]),
        system="\n\n".join(system_parts) if system_parts else None,
        message=last,
        positions=positions,
        tools=tools,
        options=attrs.evolve(options, extra=forwarded(data, upstream)),
        stream=stream,
        include_usage=include_usage,
        history_problem=history_problem,
    )


def _refuse_unsupported(data: Mapping[str, Any]) -> None:
    """Refuse what the gateway cannot answer as asked: the client would get something else
    than it asked for (no log probabilities, a tool call it declared in a form the answer is
    not written in, audio), so a 400 naming the parameter rather than silence."""
    if _optional(data, "logprobs", bool, False):
        raise _bad(
            "'logprobs' is not supported: the gateway answers with the reply its guardrails"
            " accepted, which hooks may have rewritten, and returns no log probabilities —"
            " leave 'logprobs' out (or false)",
            "logprobs",
            "unsupported_parameter",
        )
    if _optional(data, "top_logprobs", int, 0):
        raise _bad(
            "'top_logprobs' is not supported: the gateway returns no log probabilities —"
            " leave it out",
            "top_logprobs",
            "unsupported_parameter",
        )
    for legacy, current in (("functions", "tools"), ("function_call", "tool_choice")):
        if data.get(legacy) is not None:
            raise _bad(
                f"'{legacy}' (the deprecated form of '{current}') is not supported: send the"
                f' functions as \'tools\' ({{"type": "function", "function": {{...}}}}) and'
                " choose with 'tool_choice'",
                legacy,
                "unsupported_parameter",
            )
    modalities = data.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _bad(
            f"'modalities' must be [\"text\"] (or left out): the gateway answers with text"
            f" only, got {json.dumps(modalities)[:80]}",
            "modalities",
            "unsupported_value",
        )
    if data.get("moderation") is not None:
        raise _bad(
            "'moderation' is not supported: the gateway returns no moderation results, and"
            " its answer is the reply the pipeline's guardrails accepted — leave it out, and"
            " moderate in a hook of the pipeline",
            "moderation",
            "unsupported_parameter",
        )
    if data.get("audio") is not None:
        raise _bad(
            "'audio' is not supported: the gateway answers with text only — leave it out",
            "audio",
            "unsupported_parameter",
        )


def _check_tool_order(messages: Sequence[Message], offset: int) -> None:
    """Refuse a history the API refuses: tool calls not answered by the tool messages right
    after them (each call once), or a tool message that answers no call before it.

    The trailing tool messages of a continuation are left to `check_continuation` (in a
    conversation they answer the log's calls, not the request's). `offset` is the index in
    the request's ``messages`` of ``messages[0]`` (leading system messages were taken off).
    """
    end = len(messages)
    while end > 0 and messages[end - 1].role == "tool":
        end -= 1
    if end == len(messages):
        end -= 1  # the user's message: after the history, below
    calls: dict[str, str] = {}  # the calls still waiting for their results
    asked = ""  # where they were asked
    for index, message in enumerate(messages[:end]):
        where = f"messages[{index + offset}]"
        if message.role == "tool":
            for result in message.parts:
                assert type(result) is ToolResult
                if result.call_id not in calls:
                    waiting = f" (those of '{asked}': {sorted(calls)})" if calls else ""
                    raise _bad(
                        f"'{where}.tool_call_id' is {result.call_id!r}, which answers no tool"
                        f" call waiting for a result{waiting} — tool messages must follow the"
                        " assistant message whose calls they answer, one per call",
                        f"{where}.tool_call_id",
                    )
                del calls[result.call_id]
            continue
        if calls:
            raise _unanswered(calls, asked, where)
        if message.role == "assistant":
            calls = {part.id: part.name for part in message.parts if type(part) is ToolCall}
            asked = where
    if calls and messages[-1].role != "tool":
        raise _unanswered(calls, asked, f"messages[{len(messages) - 1 + offset}]")


def _unanswered(calls: Mapping[str, str], asked: str, where: str) -> WireError:
    missing = [f"{call_id} ({name})" for call_id, name in calls.items()]
    return _bad(
        f"the tool calls {missing} of '{asked}' have no tool message before '{where}': an"
        " assistant message with 'tool_calls' must be followed by one tool message per call"
        " (with an error message as the content for a call that was not run)",
        f"{where}.role",
    )


# A JSON escape of a UTF-16 surrogate, a pair's half too: a cheap gate before the walk, which
# costs less than telling a lone escape from a pair's by pattern on a body of many emoji.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")
"""The first two bytes of a surrogate's UTF-8 form: no UTF-8, but JSON's reader of bytes
takes it (it decodes with ``surrogatepass``, as `json.loads` does)."""


def _may_hold_lone_surrogate(body: bytes) -> bool:
    """Whether `body` may hold a lone surrogate, which `_check_unicode` then finds and names:
    escaped in UTF-8 (``"\\ud800"``), as its UTF-8 form, or anyhow in a body sent as UTF-16
    or UTF-32 (rare: its escapes are no ASCII bytes, and it is looked through whole)."""
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        return True
    return _SURROGATE_ESCAPE.search(body) is not None or _SURROGATE_UTF8.search(body) is not None


def _check_unicode(data: dict[str, Any]) -> None:
    """Refuse a body holding a lone surrogate (``"\\ud800"``): valid JSON, but not text.

    No UTF-8 encoder accepts one, so it could reach neither the model, the log nor the
    client, and would fail the turn wherever it is first encoded.
    """
    for value, place in _walk(data):
        if isinstance(value, str):
            if not _encodable(value):
                where = _path(place)
                raise _bad(
                    f"'{where}' holds a lone surrogate (an escape such as \\ud800, or its bytes"
                    " in the body's encoding), which is not a character — send valid Unicode"
                    " text (a surrogate only as half of a pair)",
                    where,
                )
        elif isinstance(value, dict):
            for key in value:
                if not _encodable(key):
                    where = _path(place)
                    raise _bad(
                        f"a key of '{where or 'the request body'}' holds a lone surrogate (an"
                        " escape such as \\ud800, or its bytes in the body's encoding) — send"
                        " valid Unicode text",
                        where or None,
                    )


_Place = tuple["_Place", str | int] | None
"""Where a value is in the request body: its parent's place and its key or index (``None``
for the body itself)."""

_KEY_SHOWN = 40
"""The most characters of a key an error's path shows (a key may be as long as the body)."""


def _walk(data: Any) -> Iterator[tuple[Any, _Place]]:
    """Every value in `data`, the body, in the body's order, each with its place.

    A stack, not recursion: the body may nest as deep as the JSON reader went. A place is
    its parent's plus one key, and is written out (`_path`) only for a value refused: paths
    written for every value would cost each one its parent's path again, a long key times a
    long list.
    """
    stack: list[tuple[Any, _Place]] = [(data, None)]
    while stack:
        value, place = stack.pop()
        yield value, place
        if isinstance(value, dict):
            stack.extend((item, (place, key)) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((value[i], (place, i)) for i in reversed(range(len(value))))


def _path(place: _Place) -> str:
    """`place` as the error's ``param`` names a field (``messages[2].content``), each key cut
    to `_KEY_SHOWN` characters."""
    steps: list[str] = []
    while place is not None:
        place, step = place
        if isinstance(step, int):
            steps.append(f"[{step}]")
        else:
            key = step if len(step) <= _KEY_SHOWN else step[:_KEY_SHOWN] + "..."
            steps.append(f".{key}" if place is not None else key)
    return "".join(reversed(steps))


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_STRINGS = str | list[str]
"""A field that is a string or an array of strings (`stop`)."""

_KIND_NAMES: Mapping[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    dict: "an object",
    _STRINGS: "a string or an array of strings",
}
"""The kinds a request field may have to be (`_is_kind`), in JSON's words."""


def _is_kind(value: Any, kind: Any) -> bool:
    """Whether `value`, as read from JSON, is of `kind` (a key of `_KIND_NAMES`): an integer
    is a number too, a boolean is not an integer."""
    if kind == _STRINGS:
        return type(value) is str or (
            type(value) is list and all(type(item) is str for item in value)
        )
    return type(value) is kind or (kind is float and type(value) is int)


def _json_type(value: Any) -> str:
    """What `value` is, in JSON's words (a client wrote JSON, not Python)."""
    match value:
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
        case None:
            return "null"
    return type(value).__name__


def _optional(data: Mapping[str, Any], key: str, kind: type, default: Any, prefix: str = "") -> Any:
    value = data.get(key)
    if value is None:
        return default
    if not _is_kind(value, kind):
        raise _bad(
            f"'{prefix}{key}' must be {_KIND_NAMES[kind]}, got {_json_type(value)}",
            prefix + key,
            "invalid_type",
        )
    return value


def _options(data: Mapping[str, Any]) -> RequestOptions:
    temperature = _optional(data, "temperature", float, None)
    if temperature is not None and not 0 <= temperature <= 2:
        raise _bad(f"'temperature' must be between 0 and 2, got {temperature}", "temperature")
    # The newer name wins, as in the API; an error names the field the client sent.
    field = (
        "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _optional(data, field, int, None)
    if max_tokens is not None and max_tokens < 1:
        raise _bad(f"'{field}' must be at least 1, got {max_tokens}", field)
    choice = data.get("tool_choice")
    tool_choice: str | None
    if choice is None or choice in TOOL_CHOICES:
        tool_choice = choice
    elif (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    ):
        tool_choice = choice["function"]["name"]
    else:
        raise _bad(
            "'tool_choice' must be 'none', 'auto', 'required' or"
            ' {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    return RequestOptions(temperature=temperature, max_tokens=max_tokens, tool_choice=tool_choice)


Upstream = Literal["openai", "anthropic"]
"""The API the gateway's model speaks: OpenAI's (a model of one's own receives the same
names), or Anthropic's Messages API."""

FORWARDED: Mapping[str, Any] = {
    "stop": _STRINGS,
    "seed": int,
    "top_p": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "logit_bias": dict,
    "user": str,
    "response_format": dict,
    "parallel_tool_calls": bool,
    "reasoning_effort": str,
    "verbosity": str,
    "web_search_options": dict,
    "safety_identifier": str,
}
"""The request parameters forwarded to the upstream through ``RequestOptions.extra``, each
with the JSON type it must have (`_KIND_NAMES`; the upstream checks the value itself): they
shape the reply the model writes, which the pipeline's hooks then judge like any other
(``user`` and ``safety_identifier``, which replaces it, name the end user it is for).

``store``, ``service_tier``, ``metadata``, ``prediction`` and the ``prompt_cache_*``
parameters are not among them: they set something on the upstream account, not in the reply
(whether the completion is kept in it, its billing tier, what its dashboard shows, what it
pays for speed and caching), and that account is the operator's. A client's are accepted and
left out, as unknown fields are; a pre hook may set them (``turn.with_request(extra=...)``)."""


class _NonFinite(Exception):
    """`_READER` met a number no request can carry on (see `_check_finite`)."""


def _refuse_constant(name: str) -> float:
    raise _NonFinite


def _read_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: digits never read as NaN
        raise _NonFinite
    return value


_READER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_read_float)
"""The request body's reader, made once (`json.loads` given hooks makes a reader per call,
about 15% of reading a typical body). Its hooks stop it at the first ``NaN``,
``Infinity`` or number past a float's range, which Python's reader otherwise takes; each
float costs a call to its hook."""
_PLAIN_READER = json.JSONDecoder()


def _read_json(body: bytes) -> tuple[Any, bool]:
    """`body` read as JSON, as `json.loads` reads bytes, and whether it may hold a number
    no request can carry on (which `_check_finite` then finds and names).

    Raises:
        RecursionError, UnicodeDecodeError, ValueError: As `json.loads`.
    """
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    try:
        return _READER.decode(text), False
    except (_NonFinite, RecursionError):
        # Read again without the hooks: the stop said what, not where; or the body nests as
        # deep as the reader goes, where a float hook's frame was one too many.
        return _PLAIN_READER.decode(text), True


def _check_finite(data: dict[str, Any]) -> None:
    """Refuse a NaN or an infinity anywhere in `data`, the request body.

    Python's JSON reader takes ``NaN``, ``Infinity`` and ``1e400``, but no request can carry
    them on: the provider would refuse the body after the pre hooks ran, naming no field.
    The first one, in the body's order, is named by its path.

    Not the providers' own finder of what JSON cannot encode: that one is private to
    `pipeline.providers`, and it names the value in Python's words (``nan``, ``inf``) inside
    one sentence, where the client wrote JSON and the 400 needs the path as its ``param``.
    """
    for value, place in _walk(data):
        if isinstance(value, float) and not math.isfinite(value):
            where = _path(place)
            raise _bad(
                f"'{where}' is {_non_finite(value)}, which JSON has no number for — send a"
                " finite number",
                where,
            )


def _non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def forwarded(data: Mapping[str, Any], upstream: Upstream) -> dict[str, Any]:
    """The forwarded parameters the request sets (`FORWARDED`), as `upstream` names them.

    To an OpenAI upstream (or a model of one's own) they go as the client sent them. To an
    Anthropic one, ``stop`` goes as ``stop_sequences``, ``user`` (or ``safety_identifier``) as
    ``metadata.user_id`` and ``top_p`` as itself; what changes nothing in the reply (``parallel_tool_calls: true``,
    ``response_format`` of type ``text``) is left out; the rest, which the Messages API has
    no form of, is refused.

    Raises:
        WireError: 400 naming a parameter of the wrong JSON type or one the upstream
            cannot honour. (A NaN or an infinity in `data`, which Python's JSON reader
            takes, was refused as `parse_request` read it.)
    """
    given: dict[str, Any] = {}
    for key, kind in FORWARDED.items():
        value = _optional(data, key, kind, None)
        if value is not None:
            given[key] = value
    if upstream == "openai":
        return given
    extra: dict[str, Any] = {}
    for key, value in given.items():
        if key == "stop":
            extra["stop_sequences"] = [value] if isinstance(value, str) else value
        elif key in ("user", "safety_identifier"):
            # The end user's id; `safety_identifier`, which replaces `user`, comes later in
            # `FORWARDED` and wins when a client sends both.
            extra["metadata"] = {"user_id": value}
        elif key == "top_p":
            extra["top_p"] = value
        elif (key, value) == ("parallel_tool_calls", True) or (
            key == "response_format" and value.get("type") == "text"
        ):
            continue
        else:
            raise _bad(
                f"'{key}' cannot be honoured: this gateway's model is an Anthropic one, and the"
                f" Messages API has no '{key}' the gateway can send — leave it out of the"
                " request",
                key,
                "unsupported_parameter",
            )
    return extra


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("'tools' must be an array of function tools", "tools", "invalid_type")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        function = item.get("function") if isinstance(item, dict) else None
        if (
            not isinstance(item, dict)
            or item.get("type") != "function"
            or not isinstance(function, dict)
        ):
            raise _bad(f'\'{where}\' must be {{"type": "function", "function": {{...}}}}', where)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"'{where}.function.name' is required", f"{where}.function.name")
        if not _TOOL_NAME.fullmatch(name):
            # What both providers accept: refused here, not as the upstream's 400 behind a 502.
            raise _bad(
                f"'{where}.function.name' must be 1 to 64 letters, digits, '_' or '-', got"
                f" {name[:80]!r}",
                f"{where}.function.name",
            )
        if name in seen:
            # A call could not say which of the two it means; providers refuse the request.
            raise _bad(
                f"'{where}.function.name' is {name!r}, the name of an earlier tool — each"
                " tool needs a name of its own",
                f"{where}.function.name",
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise _bad(
                f"'{where}.function.parameters' must be a JSON Schema object",
                f"{where}.function.parameters",
            )
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise _bad(
                f"'{where}.function.description' must be a string", f"{where}.function.description"
            )
        if function.get("strict") is True:
            # The schema is sent without it: the model's arguments would not be held to it.
            raise _bad(
                f"'{where}.function.strict' is not supported: the gateway sends a tool's name,"
                " description and parameters, and cannot ask the upstream to hold the"
                " arguments to the schema — leave 'strict' out (or false) and check the"
                " arguments when the tool runs",
                f"{where}.function.strict",
                "unsupported_parameter",
            )
        seen.add(name)
        specs.append(ToolSpec(name, description, parameters))
    return tuple(specs)


def _message(item: Any, where: str) -> Message:
    if not isinstance(item, dict):
        raise _bad(f"'{where}' must be an object with 'role' and 'content'", where, "invalid_type")
    role = item.get("role")
    if role not in ROLES:
        raise _bad(f"'{where}.role' must be one of {list(ROLES)}, got {role!r}", f"{where}.role")
    text = _content(item.get("content"), f"{where}.content", role)
    if role in ("system", "developer"):
        return Message.system(text)
    meta = _named(item, where)
    if role == "user":
        if not text:
            raise _bad(f"'{where}.content' must not be empty", f"{where}.content")
        return Message.user(text, meta=meta)
    if role == "tool":
        call_id = item.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(
                f"'{where}.tool_call_id' is required for a tool message", f"{where}.tool_call_id"
            )
        return Message.tool(ToolResult(call_id, text))
    if item.get("function_call") is not None:
        raise _bad(
            f"'{where}.function_call' (the deprecated form of 'tool_calls') is not supported:"
            " send the call in 'tool_calls' with an 'id', and its result as a 'tool' message",
            f"{where}.function_call",
            "unsupported_parameter",
        )
    refusal = item.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        raise _bad(
            f"'{where}.refusal' must be a string, got {_json_type(refusal)}",
            f"{where}.refusal",
            "invalid_type",
        )
    # What the model said when it refused: read as its text, as the providers read a
    # model's refusal, so the model sees in the history that it refused.
    text += refusal or ""
    parts: list[Part] = [Text(text)] if text else []
    calls = item.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise _bad(
            f"'{where}.tool_calls' must be an array of function tool calls, got"
            f" {_json_type(calls)}",
            f"{where}.tool_calls",
            "invalid_type",
        )
    ids: set[str] = set()
    for j, call in enumerate(calls or ()):
        part = _tool_call(call, f"{where}.tool_calls[{j}]")
        if part.id in ids:
            # Its tool message could not say which of the two calls it answers.
            raise _bad(
                f"'{where}.tool_calls[{j}].id' is {part.id!r}, the id of an earlier call of the"
                " same message — each tool call needs an id of its own, which its tool"
                " message answers",
                f"{where}.tool_calls[{j}].id",
            )
        ids.add(part.id)
        parts.append(part)
    return Message.assistant(tuple(parts), meta=meta)


def _named(item: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The meta of a message with a ``name`` (a participant of a shared conversation): the
    OpenAI provider sends it as the message's ``name``; other providers have no such field."""
    name = item.get("name")
    if name is None:
        return {}
    if not isinstance(name, str):
        raise _bad(
            f"'{where}.name' must be a string, got {_json_type(name)}",
            f"{where}.name",
            "invalid_type",
        )
    if not name:
        raise _bad(f"'{where}.name' must not be empty (leave it out)", f"{where}.name")
    return {OPENAI_META: {"name": name}}


def _content(content: Any, where: str, role: str) -> str:
    if content is None:
        if role in ("assistant",):
            return ""
        raise _bad(f"'{where}' is required", where, "missing_required_parameter")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            # An assistant's refusal part is read as its text.
            field = "refusal" if role == "assistant" and kind == "refusal" else "text"
            if not isinstance(part, dict) or kind != field:
                raise _bad(
                    f'\'{where}[{k}]\' must be a text part {{"type": "text", "text": ...}};'
                    f" the gateway does not accept {kind!r} parts",
                    f"{where}[{k}]",
                )
            if not isinstance(part.get(field), str):
                raise _bad(
                    f"'{where}[{k}].{field}' must be a string, got {_json_type(part.get(field))}",
                    f"{where}[{k}].{field}",
                    "invalid_type",
                )
            texts.append(part[field])
        return "".join(texts)
    raise _bad(
        f"'{where}' must be a string or an array of text parts, got {_json_type(content)}",
        where,
        "invalid_type",
    )


def _tool_call(call: Any, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise _bad(f"'{where}' must be a function tool call", where)
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments", "")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise _bad(
            f"'{where}' needs a string 'id', 'function.name' and 'function.arguments'", where
        )
    # Read as the providers read a model's calls (the gateway returned the model's text as
    # it was written, and the client echoes it back): undecodable text is marked in the meta.
    parsed, meta = decode_arguments(arguments)
    return ToolCall(call_id, name, parsed, meta)


# -- responses --------------------------------------------------------------------------------


def finish_reason(reply: Reply) -> str:
    """The OpenAI finish reason of a reply (unknown provider reasons pass through)."""
    if any(type(part) is ToolCall for part in reply.message.parts):
        return "tool_calls"
    reason = reply.finish_reason or "stop"
    return _FINISH.get(reason, reason)


def tool_calls(message: Message) -> list[dict[str, Any]]:
    return [
        {
            "id": part.id,
            "type": "function",
            "function": {"name": part.name, "arguments": _arguments(part)},
        }
        for part in message.parts
        if type(part) is ToolCall
    ]


def _arguments(call: ToolCall) -> str:
    mark = call.meta.get(INVALID_ARGUMENTS)
    if isinstance(mark, Mapping) and isinstance(mark.get("raw"), str):
        # The model's own text, as the API returns it: the client's decoding fails and it
        # can answer with an error, instead of running the tool with no arguments ("{}").
        return str(mark["raw"])
    return json.dumps(dict(call.arguments), ensure_ascii=False)


def answer_text(reply: Reply) -> str:
    """The reply's text as the client receives it: every assistant message's, in order.

    A pipeline that runs its own tools answers with several assistant messages (text before
    a tool call, then the answer after the results); a live stream sends each one's text as
    the model writes it, so a whole answer holds all of it too, as the API's whole answer
    holds everything its stream would have sent.
    """
    messages = (*reply.messages[:-1], reply.message) if reply.messages else (reply.message,)
    return "".join(m.text for m in messages if m.role == "assistant")


def usage(reply: Reply) -> dict[str, int]:
    used = reply.usage
    return {
        "prompt_tokens": used.input_tokens,
        "completion_tokens": used.output_tokens,
        "total_tokens": used.input_tokens + used.output_tokens,
    }


@final
@attrs.frozen
class Completion:
    """What the responses of one request share: its id, creation time and model name."""

    id: str
    model: str
    created: int = attrs.field(factory=lambda: int(time.time()))

    def whole(self, reply: Reply) -> dict[str, Any]:
        """The non-streaming response: a ``chat.completion`` object."""
        calls = tool_calls(reply.message)
        text = answer_text(reply)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if not calls or text else None,
        }
        if calls:
            message["tool_calls"] = calls
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason(reply),
                }
            ],
            "usage": usage(reply),
        }

    def chunk(self, delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}
            ],
        }

    def first(self) -> dict[str, Any]:
        return self.chunk({"role": "assistant", "content": ""})

    def text(self, text: str) -> dict[str, Any]:
        return self.chunk({"content": text})

    def text_frame(self, text: str) -> bytes:
        """`sse(self.text(text))`, without encoding the same envelope again for every delta."""
        head, tail = self._text_envelope
        # What json.dumps(text, ensure_ascii=False) returns, without building an encoder per
        # call (dumps does, for any non-default option): the C string encoder itself.
        return head + json_bytes(_encode_string(text)) + tail

    @functools.cached_property
    def _text_envelope(self) -> tuple[bytes, bytes]:
        marker = "\x00text\x00"
        head, _, tail = sse(self.text(marker)).partition(json.dumps(marker).encode())
        return head, tail

    def ending(self, reply: Reply, include_usage: bool) -> Iterator[dict[str, Any]]:
        """The chunks after the text: tool calls, the finish reason, the usage."""
        calls = tool_calls(reply.message)
        if calls:
            yield self.chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]})
        yield self.chunk({}, finish_reason(reply))
        if include_usage:
            yield {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(reply),
            }


def json_bytes(text: str) -> bytes:
    """JSON text (from `json.dumps(..., ensure_ascii=False)`) as UTF-8.

    A lone surrogate (a model or a hook may produce one) has no UTF-8 form; in JSON text it
    can only stand inside a string, where its escape (``\\ud800``) means the same, so that
    is what it is written as instead of failing the response.
    """
    return text.encode("utf-8", "backslashreplace")


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event carrying `data` (JSON-encoded unless already a string)."""
    text = (
        data
        if isinstance(data, str)
        else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    )
    return b"data: " + json_bytes(text) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def split_text(reply_text: str, pieces: Sequence[str]) -> list[str]:
    """The accepted text as chunks: the streamed pieces when they add up to it, else whole."""
    return list(pieces) if "".join(pieces) == reply_text else ([reply_text] if reply_text else [])
