"""Pure helpers both providers' cores share."""

import json
import math
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from turns import RequestOptions

from .._errors import ProviderProtocolError, RequestError

# The call's ``arguments`` is then empty; the tool loop answers it with an
# ``invalid_arguments`` error result.
from .._tools import INVALID_ARGUMENTS as INVALID_ARGUMENTS

_QUOTED = 200
"""How much of undecodable arguments the model is shown back (all of it stays in the meta)."""


QUOTE_CAP = 2000
"""The most characters of a provider's own error message an error quotes. Real ones are a
sentence or a few (a long validation error, a few hundred characters); a server that sends a
megabyte of message, mid-stream or in an error body, must not make every log line and
traceback that shows the error that long."""


def quoted(said: str) -> str:
    """What a provider said, as an error quotes it: at most `QUOTE_CAP` characters."""
    if len(said) <= QUOTE_CAP:
        return said
    return f"{said[:QUOTE_CAP]}... ({len(said) - QUOTE_CAP} more characters)"


def decode_json(data: str, *, strict: bool = False) -> Any:
    """`json.loads`, with nesting too deep for the decoder a `ValueError` like any other
    malformed JSON (Python's decoder recurses: 100,000 brackets raise `RecursionError`).

    `strict` refuses ``NaN``, ``Infinity`` and ``-Infinity``, which Python's decoder accepts
    but JSON does not, and a number past a float's range (``1e400``), which JSON allows but
    Python reads as infinity: a value that goes back to the provider must be one it can parse.
    """
    try:
        if strict:
            return json.loads(data, parse_constant=_refuse_constant, parse_float=_finite)
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to decode") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


class _OutOfRange(ValueError):
    """A JSON number Python reads as infinity: valid JSON, but not a value to send back."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"the number {text} is past a float's range (about 1.8e308)")
    return value


def decode_arguments(raw: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Decode a tool call's assembled argument text: (arguments, meta to add).

    An empty text means no arguments. Text that is not a JSON object (a model's mistake,
    output cut by the token limit, nesting too deep to decode, ``NaN`` or ``1e400``, which
    Python reads as numbers JSON cannot write, so that the arguments echoed to the provider in
    the next request could not hold them) is kept in the meta rather than raised: it is the model's error to correct, not a broken stream. The
    error quotes the start of the text, so that the model sees what it sent.

    Public for what reads a model's calls written down elsewhere (``turnplug serve`` reads
    those a client echoes back in its history): one reading, one wording.
    """
    if not raw.strip():
        return {}, {}
    quoted = raw[:_QUOTED] + ("..." if len(raw) > _QUOTED else "")
    try:
        value = decode_json(raw, strict=True)
    except _OutOfRange as exc:
        error = f"out of range: {exc}: {quoted!r}"
        return {}, {INVALID_ARGUMENTS: {"raw": raw, "error": error}}
    except ValueError as exc:
        error = f"not valid JSON ({exc}): {quoted!r}"
        return {}, {INVALID_ARGUMENTS: {"raw": raw, "error": error}}
    if not isinstance(value, dict):
        error = f"expected a JSON object, got {type(value).__name__}: {quoted!r}"
        return {}, {INVALID_ARGUMENTS: {"raw": raw, "error": error}}
    return value, {}


def sendable_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as a request sends them: NaN and infinities as the strings
    ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``.

    The decoder refuses them now, but a conversation may hold them from before (or from a
    hook): JSON has no numbers for them, and an error here would fail every later turn of
    the conversation, which must echo the call. A string reads to the model as what the
    call held; ``null`` would read as no value.
    """
    return {key: _sendable(value) for key, value in arguments.items()}


def _sendable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, Mapping):
        return {key: _sendable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_sendable(item) for item in value]
    return value


HIGH_HALVES = ("\ud800", "\udbff")
"""The first and last high surrogate: the first half of an astral character in UTF-16."""


def rejoin_halves(held: str, text: str) -> tuple[str, str]:
    """Join a character's UTF-16 halves sent in separate deltas: (text to pass on, half held).

    Servers that count UTF-16 code units (JavaScript ones) may end a delta between the two
    halves of an astral character (an emoji), each sent as a ``\\uXXXX`` escape; passed on
    apart, the halves would stay lone surrogates in the reply. A delta's trailing high half
    is held and put before the next delta's text; a parser passes on what it still holds at
    the end of the text (then a lone half, which the request encoder replaces).
    """
    if held:
        if text and "\udc00" <= text[0] <= "\udfff":  # the low half: make the character
            code = 0x10000 + (ord(held) - 0xD800) * 0x400 + (ord(text[0]) - 0xDC00)
            text = chr(code) + text[1:]
        else:
            text = held + text
    if text and HIGH_HALVES[0] <= text[-1] <= HIGH_HALVES[1]:
        return text[:-1], text[-1]
    return text, ""


def synthesize_id() -> str:
    """An id for a tool call the server sent without one (old llama.cpp, old Ollama)."""
    return f"call_{secrets.token_hex(8)}"


def own_id(call_id: str, taken: set[str]) -> str:
    """The id a tool call of one reply keeps: `call_id`, unless it is empty or an earlier
    call of the reply (whose ids are `taken`) already has it; then a fresh ``call_<hex>``.

    Some OpenAI-compatible servers give every call of a reply the same id (``call_0``); kept,
    each tool result would name all of those calls, and the provider refuses the next
    request. The id is added to `taken`.
    """
    while not call_id or call_id in taken:
        call_id = synthesize_id()
    taken.add(call_id)
    return call_id


REFUSED_KEYS: Mapping[str, str] = {
    "messages": "the messages are the turn's conversation (its context, the user message"
    " and what hooks inject)",
    "stream": "every request streams: the provider reads only event streams",
    "tools": "the tools are the pipeline's (Pipeline(tools=...)), the only ones the tool loop"
    " can run: narrow them with turn.with_request(active_tools=...)",
}
"""The request-body keys both providers refuse in `RequestOptions.extra`, each with what to
use instead: they make up the turn itself (its conversation, the tools it can run, the
streaming the parser reads), and replaced, the request is no longer the turn's. Every other
key, those the provider derives from the turn's options included, is merged over the body."""


def check_extra(provider: str, extra: Mapping[str, Any], refused: Mapping[str, str]) -> None:
    """Refuse `RequestOptions.extra` keys that would replace the turn itself (`refused`: each
    key with what to use instead), before anything is sent.

    Merged over the body, such a key would silently replace the conversation, the tools or
    ``stream``, and the request would no longer be the one the turn describes, or one the
    provider can read the answer of. Any other key wins over what the provider derived
    (``model``, ``temperature``, ``tool_choice``, ...): it is how a hook picks the model per
    turn or sends a form the turn's options have no field for.
    """
    clashes = [key for key in extra if key in refused]
    if clashes:
        said = "; ".join(f"{key!r}: {refused[key]}" for key in clashes)
        raise RequestError(
            f"{provider}: RequestOptions.extra sets {', '.join(map(repr, clashes))}, which"
            f" would replace the turn itself — {said}. Every other key (model, temperature,"
            " tool_choice, seed, ...) may be set in extra and wins over the provider's own"
            " value; a later hook removes a key with"
            f" turn.with_request(extra={{{clashes[0]!r}: None}})"
        )


def wire_fields(meta: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The extra wire fields stored under `key` in a part's or message's `meta`."""
    fields = meta.get(key)
    return dict(fields) if isinstance(fields, Mapping) else {}


def load_json(data: str, *, provider: str, request_id: str | None) -> Any:
    """Decode one event's data; malformed JSON is a `ProviderProtocolError` quoting it."""
    try:
        return decode_json(data)
    except ValueError as exc:
        raise ProviderProtocolError(
            f"{provider} sent an event whose data is not valid JSON ({exc}): {data[:200]!r}",
            provider=provider,
            request_id=request_id,
        ) from exc


def protocol_error(provider: str, request_id: str | None, message: str) -> ProviderProtocolError:
    """A `ProviderProtocolError` whose message ends with the request id, when known."""
    if request_id:
        message += f" (request id {request_id})"
    return ProviderProtocolError(message, provider=provider, request_id=request_id)


def tokens(value: Any) -> int:
    """A token count from a usage report; a malformed one is a `TypeError`/`ValueError`,
    which the stream turns into a protocol error. A negative count (a server's -1 for a
    figure it does not know) is 0: a paid reply is not failed over its usage report."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"a token count must be a number, got {value!r}")
    try:
        return max(int(value), 0)
    except OverflowError:  # Infinity, which Python's JSON decoder accepts, or 1e400
        raise ValueError(f"a token count must be finite, got {value!r}") from None


def options_sent(
    options: RequestOptions, limit_key: str, choice_of: Callable[[Any], str | None]
) -> RequestOptions:
    """`options` as the body sent them, where `RequestOptions.extra` replaced one of them.

    ``temperature``, the token limit (under `limit_key`, the field the provider writes it
    to) and ``tool_choice`` in ``extra`` win over the options' values, so `ModelCalled` and
    the chat span show theirs. A value with no form among the options (a temperature out of
    0-2, a tool choice `choice_of` cannot name) shows as ``None``: ``extra`` holds it.
    """
    extra = options.extra
    changes: dict[str, Any] = {}
    if "temperature" in extra:
        value = extra["temperature"]
        fits = type(value) in (int, float) and 0 <= value <= 2
        changes["temperature"] = value if fits else None
    if limit_key in extra:
        value = extra[limit_key]
        changes["max_tokens"] = value if type(value) is int and value >= 1 else None
    if "tool_choice" in extra:
        changes["tool_choice"] = choice_of(extra["tool_choice"])
    return attrs.evolve(options, **changes) if changes else options


def text_choice(choice: Any) -> str | None:
    """A tool choice sent as text (OpenAI's ``"auto"``, ``"required"``, ...), else None."""
    return choice if type(choice) is str and choice else None
