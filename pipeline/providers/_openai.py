"""OpenAI Chat Completions: the request body, the stream parser, and the provider.

The same wire format is spoken by OpenRouter, vLLM, Ollama and llama.cpp's server, with
small differences the parser tolerates: tool calls delivered whole or in fragments, ids
repeated or missing, usage in its own chunk or in the finish chunk, error payloads mid-stream.
"""

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, final
from urllib.parse import urlsplit

import attrs
import httpx

from turns import Message, RequestOptions, Text, ToolCall, ToolResult, Usage

from .._errors import RequestError
from .._model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall
from ._convert import (
    HIGH_HALVES,
    INVALID_ARGUMENTS,
    REFUSED_KEYS,
    check_extra,
    decode_arguments,
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

META_KEY = "openai"
"""Meta key holding extra wire fields: merged into the message or tool call they belong to,
and filled from unknown fields of streamed tool calls (e.g. a gateway's signatures)."""

MaxTokensField = Literal["max_tokens", "max_completion_tokens"]
_TOOL_CALL_KEYS = frozenset({"index", "id", "type", "function"})
_KEYWORD_CHOICES = frozenset({"auto", "none", "required"})
HIGH, LAST_HIGH = HIGH_HALVES


def max_tokens_field_for(base_url: str) -> MaxTokensField:
    """OpenAI itself wants ``max_completion_tokens`` (its reasoning models reject
    ``max_tokens``); the compatible servers (Ollama, older llama.cpp) only know
    ``max_tokens``."""
    host = urlsplit(base_url).hostname or ""
    return "max_completion_tokens" if host.endswith("api.openai.com") else "max_tokens"


def build_body(
    model: str, request: ModelRequest, *, max_tokens_field: MaxTokensField = "max_tokens"
) -> dict[str, Any]:
    """The JSON body of a streaming Chat Completions request.

    `RequestOptions.extra` is merged over the rest, so its keys win over the ones derived
    from the turn's options (``model``, ``temperature``, ``tool_choice``, ...). A
    ``stream_options`` dict is merged over the provider's ``{"include_usage": true}``: usage
    is still asked for unless it sets ``include_usage`` itself.

    Raises:
        RequestError: `RequestOptions.extra` sets a key that makes up the turn itself
            (``messages``, ``stream``, ``tools``), naming it and what to use instead.
    """
    check_extra("openai", request.options.extra, REFUSED_KEYS)
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        messages.extend(_messages(message))
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    options = request.options
    if request.tools:
        body["tools"] = [
            _tool(spec.name, spec.description, spec.parameters) for spec in request.tools
        ]
        if options.tool_choice is not None:
            body["tool_choice"] = _tool_choice(options.tool_choice)
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.max_tokens is not None:
        body[max_tokens_field] = options.max_tokens
    body.update(options.extra)
    asked = options.extra.get("stream_options")
    if isinstance(asked, Mapping):
        # Added to (vLLM's continuous_usage_stats), not replaced: the parser reads the usage.
        body["stream_options"] = {"include_usage": True, **asked}
    return body


def _tool(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": dict(parameters)}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in _KEYWORD_CHOICES:
        return choice
    return {"type": "function", "function": {"name": choice}}


def _choice_sent(choice: Any) -> str | None:
    """A ``tool_choice`` of ``extra`` as `RequestOptions.tool_choice` would say it."""
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        return name if type(name) is str and name else None
    return text_choice(choice)


def _messages(message: Message) -> list[dict[str, Any]]:
    """One message on the wire, or several: each tool result is its own ``tool`` message."""
    results = [part for part in message.parts if isinstance(part, ToolResult)]
    tool_messages = [_tool_message(result) for result in results]
    if message.role == "tool":
        return tool_messages
    texts = [part for part in message.parts if isinstance(part, Text)]
    calls = [part for part in message.parts if isinstance(part, ToolCall)]
    if calls and message.role != "assistant":
        raise RequestError(
            f"a {message.role} message holds tool call {calls[0].name!r}: only assistant"
            " messages may call tools — put the call in Message.assistant(...)"
        )
    wire: dict[str, Any] = {"role": message.role}
    if message.role == "assistant":
        text = "".join(part.text for part in texts)
        if text or not calls:
            wire["content"] = text
        if calls:
            wire["tool_calls"] = [_tool_call(call) for call in calls]
    elif len(texts) == 1 and not texts[0].meta.get(META_KEY):
        wire["content"] = texts[0].text
    else:
        wire["content"] = [
            {"type": "text", "text": part.text, **wire_fields(part.meta, META_KEY)}
            for part in texts
        ]
    wire.update(wire_fields(message.meta, META_KEY))
    if message.role == "assistant" or texts:
        return [*tool_messages, wire]
    return tool_messages


def _tool_call(call: ToolCall) -> dict[str, Any]:
    if isinstance(call.meta.get(INVALID_ARGUMENTS), Mapping):
        # Never echo undecodable text: a gateway translating to another API (Anthropic's
        # wants an object) rejects the whole request. The raw text stays in the meta, and the
        # model reads it in its invalid_arguments result.
        arguments = "{}"
    else:
        try:
            arguments = json.dumps(
                sendable_arguments(call.arguments),
                ensure_ascii=False,
                separators=(",", ":"),
                allow_nan=False,
            )
        except (TypeError, ValueError) as exc:
            where = not_json(dict(call.arguments), "arguments")
            raise RequestError(
                f"openai: tool call {call.name!r} ({call.id}) cannot be sent: {where} ({exc}) —"
                " tool-call arguments may hold only JSON values: str, finite numbers, bool,"
                " None, lists and dicts with string keys"
            ) from None
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
        **wire_fields(call.meta, META_KEY),
    }


def _tool_message(result: ToolResult) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": result.call_id,
        "content": result.content,
        **wire_fields(result.meta, META_KEY),
    }


@attrs.define
class _Call:
    """A streamed tool call being assembled."""

    index: int
    id: str
    name: str
    arguments: list[str] = attrs.Factory(list)
    extra: dict[str, Any] = attrs.Factory(dict)


@final
class OpenAIStreamParser:
    """Turns Chat Completions stream chunks into model events.

    Text is passed on as it arrives; tool calls are assembled per index and emitted, decoded,
    when the finish reason arrives (or at ``[DONE]``), in the order the server began them;
    `ModelFinish` comes at ``[DONE]``, after the usage-only chunk. Only choice 0 is read
    (``n`` > 1 is not supported).

    OpenAI sends a call's id and name on its first fragment only, and the fragments that
    follow at its index carry arguments alone. Ollama sends each call whole in one fragment,
    every one at index 0 with an id of its own: a fragment whose id differs from that of the
    call open at its index begins a new call there.
    """

    def __init__(self, provider: str = "openai", request_id: str | None = None) -> None:
        self.provider = provider
        self.request_id = request_id
        self._calls: list[_Call] = []  # in the order the server began them
        self._open: dict[int, _Call] = {}  # the call each index's fragments continue
        self._ids: set[str] = set()  # the ids of the calls emitted so far
        self._finish: str | None = None
        self._usage = Usage()
        self._said_something = False
        self._held = ""  # the first half of a character split across deltas
        self._done = False

    @property
    def done(self) -> bool:
        """Whether ``[DONE]`` has been seen."""
        return self._done

    def feed(self, event: ServerSentEvent) -> list[ModelEvent]:
        """The model events of one ``data:`` event."""
        data = event.data
        if data.startswith("[DONE]"):
            self._done = True
            return self._close()
        chunk = load_json(data, provider=self.provider, request_id=self.request_id)
        if not isinstance(chunk, dict):
            raise protocol_error(
                self.provider,
                self.request_id,
                f"{self.provider} sent a chunk that is not a JSON object: {data[:200]!r}",
            )
        error = chunk.get("error")
        if error:
            raise self._stream_error(error)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = Usage(
                tokens(usage.get("prompt_tokens") or 0), tokens(usage.get("completion_tokens") or 0)
            )
        events: list[ModelEvent] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                if type(content) is list:
                    content = _texts_of(content)
                if isinstance(content, str) and content:
                    self._said_something = True
                    if self._held or HIGH <= content[-1] <= LAST_HIGH:  # a character's half
                        content, self._held = rejoin_halves(self._held, content)
                    if content:
                        events.append(ModelText(content))
                # A refusal is what the model said: it reaches the reply (and the guardrails)
                # rather than leaving an empty answer that looks like success.
                refusal = delta.get("refusal")
                if isinstance(refusal, str) and refusal:
                    self._said_something = True
                    if self._held or HIGH <= refusal[-1] <= LAST_HIGH:
                        refusal, self._held = rejoin_halves(self._held, refusal)
                    if refusal:
                        events.append(ModelText(refusal))
                for fragment in delta.get("tool_calls") or ():
                    if isinstance(fragment, dict):
                        self._add_fragment(fragment)
            reason = choice.get("finish_reason")
            if reason is not None:
                if reason == "error":
                    raise self._stream_error(error or {"message": "finish_reason 'error'"})
                self._finish = str(reason)
                events.extend(self._release())
                events.extend(self._flush_calls())
        return events

    def end(self, unterminated: ServerSentEvent | None = None) -> list[ModelEvent]:
        """The body ended without a dispatched ``[DONE]``. Whole in `unterminated`, the
        event the body ended inside (``data: [DONE]`` not followed by the blank line), it
        completes the stream, as dispatched; otherwise the stream was truncated."""
        if unterminated is not None and unterminated.data == "[DONE]":
            return self.feed(unterminated)
        state = f"finish_reason {self._finish!r}" if self._finish else "no finish_reason"
        raise protocol_error(
            self.provider,
            self.request_id,
            f"{self.provider} stream ended before [DONE] ({state}): the response is truncated",
        )

    def _add_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        call_id = fragment.get("id") or ""
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        call = None
        if isinstance(index, int):
            call = self._open.get(index)
        else:
            # Gateways that leave the index out: match by id, else continue the last call.
            by_id = [c for c in self._calls if call_id and c.id == call_id]
            if by_id:
                call = by_id[0]
            elif self._calls and not call_id:
                call = self._open[max(self._open)]
            index = call.index if call is not None else max(self._open, default=-1) + 1
        if call is None or (call_id and call.id and call_id != call.id):
            call = _Call(index, call_id, function.get("name") or "")
            self._calls.append(call)
            self._open[index] = call
        else:
            # Some gateways repeat id and name on every fragment: keep the first, never append.
            call.id = call.id or call_id
            call.name = call.name or function.get("name") or ""
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):
            call.arguments.append(json.dumps(arguments))
        for key, value in fragment.items():
            if key not in _TOOL_CALL_KEYS:
                call.extra[key] = value

    def _flush_calls(self) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        for call in self._calls:
            arguments, meta = decode_arguments("".join(call.arguments))
            if call.extra:
                meta[META_KEY] = call.extra
            self._said_something = True
            events.append(
                ModelToolCall(ToolCall(own_id(call.id, self._ids), call.name, arguments, meta))
            )
        self._calls.clear()
        self._open.clear()
        return events

    def _release(self) -> list[ModelEvent]:
        """The half character still held when the text ends (it stays a lone one)."""
        held, self._held = self._held, ""
        return [ModelText(held)] if held else []

    def _close(self) -> list[ModelEvent]:
        events = [*self._release(), *self._flush_calls()]
        if self._finish is None and not self._said_something:
            raise protocol_error(
                self.provider,
                self.request_id,
                f"{self.provider} sent [DONE] without any content or finish_reason: an empty"
                " completion (some servers report errors this way, outside the data lines)",
            )
        events.append(ModelFinish(self._finish, self._usage))
        return events

    def _stream_error(self, error: Any) -> Exception:
        if isinstance(error, dict):
            kind = error.get("type") or error.get("code")
            message = error.get("message")
        else:
            kind, message = None, error
        said = quoted(f"{kind}: {message}" if kind else str(message))
        return protocol_error(
            self.provider, self.request_id, f"{self.provider} reported an error mid-stream: {said}"
        )


@final
@attrs.frozen
class OpenAIChat(PooledProvider):
    """A model behind the OpenAI Chat Completions API (OpenAI, OpenRouter, vLLM, Ollama,
    llama.cpp).

    Requests go to ``{base_url}/chat/completions``; as in the official SDK, `base_url`
    includes the version prefix. The key is read when a request is made: `api_key`, else the
    environment variable `api_key_env`; with neither, no ``Authorization`` header is sent
    (local servers need none). The key never appears in reprs or errors.

    Attributes:
        model: The model name sent in each request.
        base_url: The API root, version included.
        api_key: The key, or ``None`` to read `api_key_env`.
        timeout: Seconds, an ``httpx.Timeout``, or None for none; its read timeout is the
            longest silence allowed between bytes (a total deadline is the caller's cancel scope).
        max_retries: Retries of a failed request before its stream starts.
        transport: An httpx transport to send requests through (tests, proxies); the caller
            owns it.
        api_key_env: The environment variable holding the key, or ``None``.
        max_line_bytes: The longest event-stream line accepted (16 MiB), and the most data
            an event may hold; more is a `ProviderProtocolError` naming the cap, and memory
            stays bounded by it.
        max_tokens_field: The body field `RequestOptions.max_tokens` goes to; ``None`` picks
            ``max_completion_tokens`` for api.openai.com and ``max_tokens`` elsewhere.
    """

    model: str = attrs.field(validator=check_model)
    base_url: str = attrs.field(
        default="https://api.openai.com/v1",
        converter=strip_slash,
        kw_only=True,
        repr=shown_base_url,
    )
    api_key: str | None = attrs.field(default=None, repr=False, kw_only=True)
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
    api_key_env: str | None = attrs.field(default="OPENAI_API_KEY", kw_only=True)
    max_tokens_field: MaxTokensField | None = attrs.field(default=None, kw_only=True)
    _pool: Pool = attrs.field(init=False, factory=Pool, repr=False, eq=False)
    # The field the token limit goes to, read from `base_url` once rather than on every call.
    _tokens_field: MaxTokensField = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda self: self.max_tokens_field or max_tokens_field_for(self.base_url),
            takes_self=True,
        ),
        repr=False,
        eq=False,
    )

    @property
    def provider(self) -> str:
        """The provider's name in errors."""
        return "openai"

    def effective_options(self, options: RequestOptions) -> RequestOptions:
        """`options` as sent: ``temperature``, the token limit and ``tool_choice`` of
        ``options.extra``, which win over the options' own, in their place.

        The runtime reads it for `ModelCalled.options` and the chat span.
        """
        return options_sent(options, self._tokens_field, _choice_sent)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Stream the model's answer to `request` (see `pipeline.Model`)."""
        body = build_body(self.model, request, max_tokens_field=self._tokens_field)
        return open_model_stream(
            self._endpoint(),
            body,
            lambda request_id: OpenAIStreamParser(self.provider, request_id),
            self._pool,
            self._owner(),
        )

    def _endpoint(self) -> Endpoint:
        return endpoint_for(
            self,
            f"{self.base_url}/chat/completions",
            {},
            lambda key: {"authorization": f"Bearer {key}"},
        )


def _texts_of(parts: list[Any]) -> str:
    """The text of a ``delta.content`` sent as a list of parts (Mistral's thinking models):
    its ``text`` parts joined. A ``thinking`` part is the model's reasoning, not its answer,
    and is left out, as the ``reasoning_content`` of other servers is."""
    return "".join(
        part["text"]
        for part in parts
        if isinstance(part, dict)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )
