"""The gateway's wire builders, as pure functions: laws that hold for any text."""

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks.cli._wire import ChatRequest, Completion, WireError, parse_request, sse
from pipeline.providers import decode_arguments
from turns import ToolCall

# Any text a model may send, surrogates aside (they cannot be encoded as UTF-8 at all).
TEXT = st.text(st.characters(exclude_categories=["Cs"]))


@given(TEXT)
def test_a_templated_text_frame_equals_the_chunk_encoded_whole(text: str) -> None:
    """Catches: the per-response template (the fast path of every streamed delta) encoding
    some character differently from the JSON encoder: quotes, backslashes, control
    characters, U+2028, non-ASCII."""
    completion = Completion("chatcmpl-1", "m", created=1)
    frame = completion.text_frame(text)
    assert frame == sse(completion.text(text))
    assert json.loads(frame.removeprefix(b"data: "))["choices"][0]["delta"]["content"] == text


# Text with at least one lone surrogate (st.text() draws them only rarely).
ODD = st.builds("".join, st.lists(TEXT | st.characters(categories=["Cs"]), min_size=1)).filter(
    lambda text: any("\ud800" <= char <= "\udfff" for char in text)
)


@given(ODD)
def test_any_text_a_model_sends_is_written_as_json_it_means(text: str) -> None:
    """Catches: a reply holding a lone surrogate (valid in a Python string, and in JSON as an
    escape, but with no UTF-8 form) failing the response with UnicodeEncodeError."""
    completion = Completion("chatcmpl-1", "m", created=1)
    frame = completion.text_frame(text)
    assert frame == sse(completion.text(text))
    # JSON escapes are UTF-16 code units: a high and a low surrogate side by side read back
    # as the one character they pair into, as in UTF-16.
    utf16 = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    assert json.loads(frame.removeprefix(b"data: "))["choices"][0]["delta"]["content"] == utf16


# Arguments a client may echo back: any text, and the texts that are no JSON object.
ARGUMENTS = TEXT | st.sampled_from(
    ["", " ", "{", "[1]", '{"a": 1}', '{"x": NaN}', '{"x": -Infinity}', '{"x": 1e400}']
)


@given(ARGUMENTS)
def test_a_clients_tool_call_arguments_are_read_as_a_provider_reads_a_models(raw: str) -> None:
    """Catches: a tool call a client echoes back read otherwise than `decode_arguments` (the
    providers' reader of a model's calls) reads its text: the text changed on its way through
    the body, or the arguments or meta the reader gave changed on their way into the call."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": raw}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
    }
    request = parse_request(json.dumps(body).encode())
    [read] = [p for m in request.history for p in m.parts if isinstance(p, ToolCall)]
    assert (dict(read.arguments), dict(read.meta)) == decode_arguments(raw)


def nested(depth: int, leaf: str) -> bytes:
    """A request whose field ``x`` holds `leaf` inside `depth` arrays."""
    head = '{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": '
    return f"{head}{'[' * depth}{leaf}{']' * depth}}}".encode()


def read(body: bytes) -> ChatRequest | WireError:
    """`body` read by `parse_request`, or its refusal."""
    try:
        return parse_request(body)
    except WireError as error:
        return error


def read_at_the_deepest(leaf: str) -> ChatRequest | WireError:
    """A request holding `leaf` at the deepest nesting `parse_request` reads an integer at,
    read there: the limit is Python's recursion limit less the frames on the stack, so the
    deepest is found, and `leaf` read, from the same frame."""
    low, high = 1, sys.getrecursionlimit() + 100
    while low < high:
        middle = (low + high + 1) // 2
        read_it = isinstance(read(nested(middle, "7")), ChatRequest)
        low, high = (middle, high) if read_it else (low, middle - 1)
    assert "nests too deeply" in str(read(nested(low + 1, "7")))
    return read(nested(low, leaf))


@pytest.mark.parametrize(
    ("leaf", "refused"), [("0.5", None), ("1e-5", None), ("1e400", "Infinity")]
)
def test_a_number_at_the_deepest_nesting_read_is_read_as_an_integer_there_is(
    leaf: str, refused: str | None
) -> None:
    """Bug caught: a float at the deepest nesting the reader takes (an integer there is
    read) was refused as nesting too deeply, the reader's hook for floats needing one more
    frame; so was 1e400 there, which is a 400 naming its place."""
    read = read_at_the_deepest(leaf)
    if refused is None:
        assert isinstance(read, ChatRequest), read
    else:
        assert isinstance(read, WireError)
        assert read.code == "invalid_value", read.message
        assert str(read.param).startswith("x[0][0]")
        assert f"'{read.param}' is {refused}," in read.message
