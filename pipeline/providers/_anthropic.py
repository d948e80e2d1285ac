"""Anthropic Messages: the request body, the stream parser, and the provider."""

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, final

import attrs
import httpx

from turns import Message, RequestOptions, Text, ToolCall, ToolResult, Usage

from .._errors import ProviderError, RequestError
from .._model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall
from ._convert import (
    HIGH_HALVES,
    INVALID_ARGUMENTS,
    REFUSED_KEYS,
    check_extra,
    decode_arguments,
    decode_json,
    load_json,
    options_sent,
    own_id,
    protocol_error,
    quoted,
    rejoin_halves,
    sendable_arguments,
    text_choice,
    tokens,
    wire_fields,
)
from ._http import (
    DEFAULT_TIMEOUT,
    Endpoint,
    Pool,
    PooledProvider,
    check_line_cap,
    check_model,
    check_retries,
    check_timeout,
    endpoint_for,
    not_json,
    open_model_stream,
    shown_base_url,
    strip_slash,
)
from ._sse import DEFAULT_MAX_LINE_BYTES, ServerSentEvent

META_KEY = "anthropic"
HIGH, LAST_HIGH = HIGH_HALVES

_KNOWN_EVENTS = frozenset(
    {
        "message",
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "error",
    }
)
_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""Meta key holding extra wire fields merged into the block or message (e.g. ``cache_control``)."""

THINKING_KEY = "anthropic_thinking"
"""`ToolCall.meta` key holding the thinking blocks (signatures included) that preceded the
call, after the thinking and server-tool blocks of the paused responses (``pause_turn``) the
calling one continued. Anthropic requires them back, unchanged, in the assistant message
that made the call; they go first in it."""

API_VERSION = "2023-06-01"

STOP_REASONS: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
"""Anthropic's ``stop_reason`` in the vocabulary of `ModelFinish` (OpenAI's); other values
(``pause_turn``, which `AnthropicMessages` continues, future ones) pass through unchanged."""

PAUSE_CONTINUATIONS = 5
"""How many times one model call sends a response that stopped with ``pause_turn`` (a server
tool's long turn, paused) back to be continued before it ends with that stop reason."""

_CHOICES: Mapping[str, dict[str, Any]] = {
    "auto": {"type": "auto"},
    "required": {"type": "any"},
    "none": {"type": "none"},
}


_REFUSED_KEYS: Mapping[str, str] = {
    **REFUSED_KEYS,
    "system": "system messages become it: Pipeline(system=...) or a Message.system(...) in"
    " the context",
}
"""The body keys `RequestOptions.extra` may not set, with what to use instead."""


def build_body(model: str, request: ModelRequest, *, max_tokens: int) -> dict[str, Any]:
    """The JSON body of a streaming Messages request.

    System messages become the top-level ``system``; tool messages become ``tool_result``
    blocks in a user message; consecutive messages of one role are merged, so the results of
    one step sit together in the user message that follows the calls.

    `RequestOptions.extra` is merged over the rest, so its keys win over the ones derived
    from the turn's options (``model``, ``max_tokens``, ``tool_choice``, ...).

    Raises:
        RequestError: `RequestOptions.extra` sets a key that makes up the turn itself
            (``messages``, ``system``, ``stream``, ``tools``), naming it and what to use
            instead; or the last message, a user one, holds nothing the API accepts.
    """
    check_extra("anthropic", request.options.extra, _REFUSED_KEYS)
    system = _system(request.messages)
    messages: list[dict[str, Any]] = []
    dropped = None  # the last message, when it has nothing the API accepts
    for message in request.messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        dropped = None if blocks else message
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role and set(messages[-1]) == {"role", "content"}:
            messages[-1]["content"].extend(blocks)
            messages[-1].update(wire_fields(message.meta, META_KEY))
        else:
            messages.append(
                {"role": role, "content": blocks, **wire_fields(message.meta, META_KEY)}
            )
    unanswerable = not messages or messages[-1]["role"] == "assistant"
    if dropped is not None and dropped.role == "user" and unanswerable:
        # Left out, the request would end with the assistant's last message, which the API
        # continues (a prefill) instead of answering; with no message before it, the API
        # refuses an empty list. (After tool results the request still ends with them.)
        raise RequestError(
            f"anthropic: the last message, a user message, holds no text the Messages API"
            f" accepts ({dropped.text!r}: empty or whitespace only, which it refuses in a text"
            " block) — send some text"
        )
    options = request.options
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": options.max_tokens or max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [
            {
                "name": spec.name,
                **({"description": spec.description} if spec.description else {}),
                "input_schema": dict(spec.parameters),
            }
            for spec in request.tools
        ]
        if options.tool_choice is not None:
            body["tool_choice"] = _CHOICES.get(
                options.tool_choice, {"type": "tool", "name": options.tool_choice}
            )
    if options.temperature is not None:
        body["temperature"] = options.temperature
    body.update(options.extra)
    return body


def _choice_sent(choice: Any) -> str | None:
    """A ``tool_choice`` of ``extra`` as `RequestOptions.tool_choice` would say it."""
    if not isinstance(choice, Mapping):
        return text_choice(choice)
    kind = choice.get("type")
    if kind == "tool":
        name = choice.get("name")
        return name if type(name) is str and name else None
    return _KINDS.get(kind) if type(kind) is str else None


_KINDS = {wire["type"]: choice for choice, wire in _CHOICES.items()}
"""`_CHOICES` read backwards: a wire ``type`` and the `RequestOptions.tool_choice` it is."""


def _system(messages: tuple[Message, ...]) -> str | list[dict[str, Any]]:
    """The top-level ``system``: the system messages' text, or their text blocks when a
    part or message carries fields to echo (``cache_control`` on the system prompt, the
    usual place for it). A system message's own fields go into its last block."""
    blocks: list[dict[str, Any]] = []
    for message in messages:
        if message.role != "system":
            continue
        own = [
            {"type": "text", "text": part.text, **wire_fields(part.meta, META_KEY)}
            for part in message.parts
            if isinstance(part, Text) and part.text.strip()
        ]
        if own:
            own[-1].update(wire_fields(message.meta, META_KEY))
        blocks += own
    if any(len(block) > 2 for block in blocks):
        return blocks
    return "\n\n".join(m.text for m in messages if m.role == "system" and m.text)


def _blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.role == "assistant":
        # Thinking blocks go first, as the model produced them before its text and calls.
        for part in message.parts:
            if isinstance(part, ToolCall):
                thinking = part.meta.get(THINKING_KEY)
                if isinstance(thinking, list | tuple):
                    blocks.extend(dict(block) for block in thinking)
    for part in message.parts:
        if isinstance(part, Text):
            if part.text.strip():  # the API rejects empty and whitespace-only text blocks
                blocks.append(
                    {"type": "text", "text": part.text, **wire_fields(part.meta, META_KEY)}
                )
        elif isinstance(part, ToolCall):
            if message.role != "assistant":
                raise RequestError(
                    f"a {message.role} message holds tool call {part.name!r}: only assistant"
                    " messages may call tools — put the call in Message.assistant(...)"
                )
            blocks.append(
                {
                    "type": "tool_use",
                    "id": part.id,
                    "name": part.name,
                    # Undecodable arguments go out as {} (their raw text stays in the meta).
                    "input": (
                        {} if INVALID_ARGUMENTS in part.meta else sendable_arguments(part.arguments)
                    ),
                    **wire_fields(part.meta, META_KEY),
                }
            )
        else:
            blocks.append(_tool_result(part))
    return blocks


EMPTY_ERROR = "(the tool failed and said nothing)"
"""What an error result with no content is sent as: the API refuses an empty one."""


def _tool_result(result: ToolResult) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.call_id,
        "content": result.content,
    }
    if result.is_error:
        block["is_error"] = True
        if not result.content.strip():
            block["content"] = EMPTY_ERROR
    block.update(wire_fields(result.meta, META_KEY))
    return block


_JOINED_EVERY = 256
"""How many delta strings a block holds before joining them into one."""


@attrs.define
class _Block:
    """A content block being assembled."""

    kind: str
    start: dict[str, Any]
    signature: str = ""
    citations: list[dict[str, Any]] = attrs.Factory(list)
    # What the deltas streamed, joined every `_JOINED_EVERY` pieces: a long answer's delta
    # strings, kept one by one, would take a dozen times the memory of its text.
    _joined: list[str] = attrs.Factory(list)
    _pieces: list[str] = attrs.Factory(list)

    def add(self, piece: str) -> None:
        """Keep `piece`, the next of the streamed text."""
        self._pieces.append(piece)
        if len(self._pieces) == _JOINED_EVERY:
            self._joined.append("".join(self._pieces))
            self._pieces.clear()

    @property
    def streamed(self) -> str:
        """All the deltas streamed, joined."""
        return "".join((*self._joined, *self._pieces))


@final
class AnthropicStreamParser:
    """Turns Messages stream events into model events.

    Events are dispatched on the SSE event name (the JSON ``type`` when a server sends no
    name); ``ping`` and unknown events, blocks and deltas are ignored. Usage is cumulative:
    later figures replace earlier ones.
    """

    def __init__(
        self,
        provider: str = "anthropic",
        request_id: str | None = None,
        earlier: list[dict[str, Any]] | None = None,
    ) -> None:
        """`earlier`: the blocks of the paused responses this one continues that the first
        client call's `THINKING_KEY` carries (thinking and server-tool blocks)."""
        self.provider = provider
        self.request_id = request_id
        self._blocks: dict[int, _Block] = {}
        self._thinking: list[dict[str, Any]] = list(earlier or ())
        self._stop: str | None = None
        self._input = 0
        self._inputs: dict[str, int] = {}
        self._output = 0
        self._held = ""  # the first half of a character split across deltas
        self._said_something = False
        self._done = False
        self._ids: set[str] = set()  # the ids of the calls emitted so far
        self._finished: dict[int, _Block] = {}  # built as sent back only when asked

    @property
    def done(self) -> bool:
        """Whether ``message_stop`` has been seen."""
        return self._done

    @property
    def content(self) -> list[dict[str, Any]]:
        """The response's finished content blocks as the API sends them back: server-tool
        blocks, text with its citations, thinking with its signature, in index order."""
        return [_wire_block(self._finished[index]) for index in sorted(self._finished)]

    @property
    def called(self) -> bool:
        """Whether the response called a client tool."""
        return bool(self._ids)

    def feed(self, event: ServerSentEvent) -> list[ModelEvent]:
        """The model events of one SSE event."""
        name = event.event
        if name == "ping" or name not in _KNOWN_EVENTS:
            return []  # unknown event types are ignored, undecoded
        payload = load_json(event.data, provider=self.provider, request_id=self.request_id)
        if not isinstance(payload, dict):
            raise protocol_error(
                self.provider,
                self.request_id,
                f"{self.provider} sent a {name!r} event whose data is not a JSON object",
            )
        if name == "message":
            name = str(payload.get("type", ""))
        if name == "content_block_delta":
            return self._delta(payload)
        if name == "content_block_start":
            return self._start(payload)
        if name == "content_block_stop":
            return [*self._release(), *self._stop_block(payload.get("index"))]
        if name == "message_start":
            message = payload.get("message")
            if isinstance(message, dict):
                self._count(message.get("usage"))
        elif name == "message_delta":
            delta = payload.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self._stop = str(delta["stop_reason"])
            self._count(payload.get("usage"))
        elif name == "message_stop":
            self._done = True
            events = self._release()
            events += [call for index in sorted(self._blocks) for call in self._stop_block(index)]
            if self._stop is None and not events and not self._said_something:
                # Nothing said and no stop_reason (no message_delta): as OpenAI's [DONE]
                # with nothing before it, an error that would pass for an empty answer.
                raise protocol_error(
                    self.provider,
                    self.request_id,
                    f"{self.provider} sent message_stop without any content or stop_reason:"
                    " an empty message, not a complete answer",
                )
            reason = None if self._stop is None else STOP_REASONS.get(self._stop, self._stop)
            events.append(ModelFinish(reason, Usage(self._input, self._output)))
            return events
        elif name == "error":
            raise self._stream_error(payload.get("error"))
        return []

    def end(self, unterminated: ServerSentEvent | None = None) -> list[ModelEvent]:
        """The body ended without a dispatched ``message_stop``. Whole in `unterminated`,
        the event the body ended inside (its data a complete JSON object, not followed by
        the blank line), it completes the stream, as dispatched; otherwise the stream was
        truncated."""
        if unterminated is not None and _is_stop(unterminated):
            return self.feed(unterminated)
        state = f"stop_reason {self._stop!r}" if self._stop else "no stop_reason"
        raise protocol_error(
            self.provider,
            self.request_id,
            f"{self.provider} stream ended before message_stop ({state}): the response is"
            " truncated",
        )

    def _count(self, usage: Any) -> None:
        # Each figure replaces the running one only when it is present: a message_delta may
        # repeat input_tokens without the cache counts.
        if not isinstance(usage, dict):
            return
        for key in _INPUT_KEYS:
            value = usage.get(key)
            if value is not None:
                self._inputs[key] = tokens(value)
        self._input = sum(self._inputs.values())
        if usage.get("output_tokens") is not None:
            self._output = tokens(usage["output_tokens"])

    def _start(self, payload: dict[str, Any]) -> list[ModelEvent]:
        index, block = payload.get("index"), payload.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            return []
        self._blocks[index] = _Block(str(block.get("type")), block)
        text = block.get("text")
        return (
            self._text(text)
            if block.get("type") == "text" and isinstance(text, str) and text
            else []
        )

    def _text(self, text: str) -> list[ModelEvent]:
        self._said_something = True
        if self._held or HIGH <= text[-1] <= LAST_HIGH:  # a character's half: see rejoin_halves
            text, self._held = rejoin_halves(self._held, text)
        return [ModelText(text)] if text else []

    def _release(self) -> list[ModelEvent]:
        """The half character still held when the text ends (it stays a lone one)."""
        held, self._held = self._held, ""
        return [ModelText(held)] if held else []

    def _delta(self, payload: dict[str, Any]) -> list[ModelEvent]:
        block = self._blocks.get(payload.get("index"))  # type: ignore[arg-type]
        delta = payload.get("delta")
        if block is None or not isinstance(delta, dict):
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if not isinstance(text, str) or not text:
                return []
            block.add(text)
            return self._text(text)
        if kind == "citations_delta":
            citation = delta.get("citation")
            if isinstance(citation, dict):  # sent back, a null would be refused
                block.citations.append(citation)
        elif kind == "input_json_delta":
            block.add(str(delta.get("partial_json") or ""))
        elif kind == "thinking_delta":
            block.add(str(delta.get("thinking") or ""))
        elif kind == "signature_delta":
            block.signature += str(delta.get("signature") or "")
        return []

    def _stop_block(self, index: Any) -> list[ModelEvent]:
        block = self._blocks.pop(index, None) if isinstance(index, int) else None
        if block is None:
            return []
        self._finished[index] = block
        if block.kind == "thinking":
            thinking = str(block.start.get("thinking") or "") + block.streamed
            signature = block.signature or str(block.start.get("signature") or "")
            self._thinking.append(
                {"type": "thinking", "thinking": thinking, "signature": signature}
            )
        elif block.kind == "redacted_thinking":
            self._thinking.append({"type": "redacted_thinking", "data": block.start.get("data")})
        elif block.kind == "tool_use":
            raw = block.streamed
            if not raw.strip() and isinstance(block.start.get("input"), dict):
                # A server that sends the input whole, perhaps followed by an empty
                # input_json_delta: nothing streamed, so the start's input stands, checked
                # as streamed text is (it may hold NaN or 1e400, read as numbers JSON lacks).
                raw = json.dumps(block.start["input"])
            arguments, meta = decode_arguments(raw)
            if self._thinking:
                meta[THINKING_KEY] = self._thinking
                self._thinking = []
            # A server that sends no id (Anthropic always does; servers imitating it may
            # not), or the id of an earlier call of the reply, gets one made up, as on
            # OpenAI's side: "None" (or one id) for every such call would pair each tool
            # result with all of them.
            call_id, name = block.start.get("id"), block.start.get("name")
            self._said_something = True
            call = ToolCall(
                own_id("" if call_id is None else str(call_id), self._ids),
                "" if name is None else str(name),
                arguments,
                meta,
            )
            return [ModelToolCall(call)]
        return []

    def _stream_error(self, error: Any) -> Exception:
        if isinstance(error, dict):
            said = f"{error.get('type')}: {error.get('message')}"
        else:
            said = str(error)
        return protocol_error(
            self.provider,
            self.request_id,
            f"{self.provider} reported an error mid-stream: {quoted(said)}",
        )


def _wire_block(block: _Block) -> dict[str, Any]:
    """A finished content block as it is sent back: its start with what its deltas added."""
    wire = dict(block.start)
    streamed = block.streamed
    if block.kind == "text":
        wire["text"] = str(block.start.get("text") or "") + streamed
        if block.citations:
            wire["citations"] = [*(block.start.get("citations") or ()), *block.citations]
    elif block.kind == "thinking":
        wire["thinking"] = str(block.start.get("thinking") or "") + streamed
        wire["signature"] = block.signature or str(block.start.get("signature") or "")
    elif streamed.strip():  # a tool's input (server tools stream theirs as a client's)
        wire["input"] = decode_arguments(streamed)[0]
    return wire


def continued_body(body: Mapping[str, Any], content: list[dict[str, Any]]) -> dict[str, Any]:
    """`body` sending `content`, a paused response's blocks, back as it came: the end of the
    assistant message the model continues (``pause_turn``)."""
    if not content:
        return dict(body)  # nothing to send back: the API refuses an empty message
    messages = list(body["messages"])
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and set(last) == {"role", "content"}:
        messages[-1] = {"role": "assistant", "content": [*last["content"], *content]}
    else:
        messages.append({"role": "assistant", "content": content})
    return {**body, "messages": messages}


def _is_stop(event: ServerSentEvent) -> bool:
    """Whether `event` is a whole ``message_stop``: named so (or unnamed, its JSON ``type``
    saying so, as `AnthropicStreamParser.feed` reads it) with a complete JSON object as its
    data, which a cut line cannot be."""
    if event.event not in ("message_stop", "message"):
        return False
    try:
        payload = decode_json(event.data)
    except ValueError:
        return False
    if not isinstance(payload, dict):
        return False
    return event.event == "message_stop" or payload.get("type") == "message_stop"


def _check_max_tokens(_instance: object, _attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_tokens must be a positive int, got {value!r}")


@final
@attrs.frozen
class AnthropicMessages(PooledProvider):
    """A model behind the Anthropic Messages API.

    Requests go to ``{base_url}/v1/messages``. The key is read when a request is made:
    `api_key`, else the environment variable `api_key_env`. It never appears in reprs or
    errors.

    Attributes:
        model: The model name sent in each request.
        base_url: The API root, without the version prefix.
        api_key: The key, or ``None`` to read `api_key_env`.
        max_tokens: The output limit when the turn's `RequestOptions` sets none (the API
            requires one).
        timeout: Seconds, an ``httpx.Timeout``, or None for none; its read timeout is the
            longest silence allowed between bytes (a total deadline is the caller's cancel scope).
        max_retries: Retries of a failed request before its stream starts.
        transport: An httpx transport to send requests through; the caller owns it.
        api_key_env: The environment variable holding the key, or ``None``.
        max_line_bytes: The longest event-stream line accepted (16 MiB), and the most data
            an event may hold; more is a `ProviderProtocolError` naming the cap, and memory
            stays bounded by it.
    """

    model: str = attrs.field(validator=check_model)
    base_url: str = attrs.field(
        default="https://api.anthropic.com",
        converter=strip_slash,
        kw_only=True,
        repr=shown_base_url,
    )
    api_key: str | None = attrs.field(default=None, repr=False, kw_only=True)
    max_tokens: int = attrs.field(default=1024, validator=_check_max_tokens, kw_only=True)
    timeout: float | httpx.Timeout | None = attrs.field(
        default=DEFAULT_TIMEOUT, hash=False, validator=check_timeout, kw_only=True
    )
    max_retries: int = attrs.field(default=2, validator=check_retries, kw_only=True)
    transport: httpx.AsyncBaseTransport | None = attrs.field(
        default=None, repr=False, eq=False, kw_only=True
    )
    max_line_bytes: int = attrs.field(
        default=DEFAULT_MAX_LINE_BYTES, validator=check_line_cap, kw_only=True
    )
    api_key_env: str | None = attrs.field(default="ANTHROPIC_API_KEY", kw_only=True)
    _pool: Pool = attrs.field(init=False, factory=Pool, repr=False, eq=False)

    @property
    def provider(self) -> str:
        """The provider's name in errors."""
        return "anthropic"

    def effective_options(self, options: RequestOptions) -> RequestOptions:
        """`options` as sent: ``temperature``, ``max_tokens`` and ``tool_choice`` of
        ``options.extra``, which win over the options' own, in their place.

        The runtime reads it for `ModelCalled.options` and the chat span.
        """
        return options_sent(options, "max_tokens", _choice_sent)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Stream the model's answer to `request` (see `pipeline.Model`).

        A response that stops with ``pause_turn`` is sent back as it came, to be continued,
        up to `PAUSE_CONTINUATIONS` times: the events of every response make one answer,
        with the usage of all of them. A continuation that fails raises what a first
        request would, its message ending "on continuation N of a pause_turn response".
        """
        return self._stream(build_body(self.model, request, max_tokens=self.max_tokens))

    @asynccontextmanager
    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[AsyncIterator[ModelEvent]]:
        # The first request is sent on entering, as every provider's is (a 401 raises there);
        # the continuations as the events of the response before run out.
        async with AsyncExitStack() as first:
            parsers: list[AnthropicStreamParser] = []
            opened = await first.enter_async_context(self._open(body, parsers, []))
            events = self._continued(body, first, opened, parsers)
            try:
                yield events
            finally:
                await events.aclose()

    def _open(
        self,
        body: dict[str, Any],
        parsers: list[AnthropicStreamParser],
        earlier: list[dict[str, Any]],
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        def parser(request_id: str | None) -> AnthropicStreamParser:
            parsers.append(AnthropicStreamParser(self.provider, request_id, earlier))
            return parsers[-1]

        return open_model_stream(self._endpoint(), body, parser, self._pool, self._owner())

    async def _continued(
        self,
        body: dict[str, Any],
        response: AsyncExitStack,
        events: AsyncIterator[ModelEvent],
        parsers: list[AnthropicStreamParser],
    ) -> AsyncGenerator[ModelEvent, None]:
        """The events of the response `response` holds open, then of its continuations."""
        usage = Usage()
        earlier: list[dict[str, Any]] = []  # the paused responses' blocks a call carries
        for continuation in range(PAUSE_CONTINUATIONS + 1):
            finish = ModelFinish()
            try:
                async with response:  # closed once read, before the next is sent
                    if continuation:
                        events = await response.enter_async_context(
                            self._open(body, parsers, earlier)
                        )
                    async for event in events:
                        if isinstance(event, ModelFinish):
                            finish = event
                        else:
                            yield event
            except ProviderError as error:
                if continuation:
                    error.args = (
                        f"{error.args[0]} — on continuation {continuation} of a pause_turn"
                        " response",
                        *error.args[1:],
                    )
                raise
            usage += finish.usage
            parsed = parsers[-1]
            if (
                finish.reason != "pause_turn"
                or parsed.called
                or continuation == PAUSE_CONTINUATIONS
            ):
                yield ModelFinish(finish.reason, usage)
                return
            content = parsed.content
            if unsendable := not_json(content, "content"):
                raise protocol_error(
                    self.provider,
                    parsed.request_id,
                    f"{self.provider} paused a response (pause_turn) that cannot be sent back"
                    f" to be continued: its {unsendable}, which JSON has no form for",
                )
            earlier += [block for block in content if block.get("type") != "text"]
            body = continued_body(body, content)
            response = AsyncExitStack()

    def _endpoint(self) -> Endpoint:
        return endpoint_for(
            self,
            f"{self.base_url}/v1/messages",
            {"anthropic-version": API_VERSION},
            lambda key: {"x-api-key": key},
        )
