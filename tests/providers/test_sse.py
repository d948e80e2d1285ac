"""The byte-level SSE decoder (pipeline/providers/_sse.py)."""

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import ModelFinish, ModelText, ProviderProtocolError
from pipeline.providers import AnthropicMessages, OpenAIChat
from pipeline.providers._sse import EventTooLong, LineTooLong, ServerSentEvent, SSEDecoder
from turns import Usage

from . import server as wire
from .server import ProtocolServer
from .support import KEY, collect


def decode(*reads: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = [event for read in reads for event in decoder.feed(read)]
    return events + decoder.close()


def test_a_data_event_is_dispatched_at_the_blank_line() -> None:
    assert decode(b"data: hello\n\n") == [ServerSentEvent("message", "hello")]


def test_an_event_without_its_blank_line_is_discarded_at_eof() -> None:
    assert decode(b"data: one\n\ndata: two\n") == [ServerSentEvent("message", "one")]


def test_a_utf8_character_split_across_reads_is_reassembled() -> None:
    data = "data: é😀\n\n".encode()
    split = data.index(b"\x9f")  # inside the emoji's four bytes
    assert decode(data[:split], data[split:]) == [ServerSentEvent("message", "é😀")]


def test_crlf_split_between_reads_is_one_line_end() -> None:
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [ServerSentEvent("message", "a\nb")]


def test_lone_cr_ends_lines() -> None:
    assert decode(b"event: x\rdata: y\r\r") == [ServerSentEvent("x", "y")]


def test_u2028_and_u2029_inside_json_do_not_end_the_line() -> None:
    payload = '{"content":"a\u2028b\u2029c\x85d"}'
    assert decode(f"data: {payload}\n\n".encode()) == [ServerSentEvent("message", payload)]


def test_comment_lines_are_ignored() -> None:
    assert decode(b": OPENROUTER PROCESSING\n\ndata: x\n\n") == [ServerSentEvent("message", "x")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert decode(b"data: a\ndata: b\ndata:\n\n") == [ServerSentEvent("message", "a\nb\n")]


def test_only_one_space_after_the_colon_is_removed() -> None:
    assert decode(b"data:  two spaces\ndata:none\n\n")[0].data == " two spaces\nnone"


def test_a_field_with_no_colon_has_an_empty_value() -> None:
    assert decode(b"data\n\n") == [ServerSentEvent("message", "")]


def test_event_id_and_retry_fields_are_kept() -> None:
    assert decode(b"event: ping\nid: 7\nretry: 1500\ndata: {}\n\n") == [
        ServerSentEvent("ping", "{}", "7", 1500)
    ]


def test_the_id_persists_and_the_event_type_resets_between_events() -> None:
    events = decode(b"event: a\nid: 1\ndata: x\n\ndata: y\n\n")
    assert [(e.event, e.id) for e in events] == [("a", "1"), ("message", "1")]


def test_a_non_numeric_retry_and_unknown_fields_are_ignored() -> None:
    assert decode(b"retry: soon\nerror: {}\ndata: x\n\n") == [ServerSentEvent("message", "x")]


def test_an_event_with_no_data_line_is_not_dispatched() -> None:
    assert decode(b"event: lonely\n\ndata: x\n\n") == [ServerSentEvent("message", "x")]


def test_a_leading_bom_is_dropped_even_when_split() -> None:
    assert decode(b"\xef\xbb", b"\xbfdata: x\n\n") == [ServerSentEvent("message", "x")]


STREAM = (
    "\ufeff: keep-alive\r\n"
    'event: message_start\r\ndata: {"t":"é😀 \u2028 \u2029"}\r\n\r\n'
    "data: [1,\rdata: 2]\r\r"
    "id: 9\nretry: 30\ndata:x\n\n"
    "data: cut"
).encode()


@given(st.sets(st.integers(min_value=1, max_value=len(STREAM) - 1)))
def test_any_split_of_the_stream_into_reads_gives_the_same_events(cuts: set[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    reads = [STREAM[start:end] for start, end in itertools.pairwise(bounds)]
    assert decode(*reads) == [
        ServerSentEvent("message_start", '{"t":"é😀 \u2028 \u2029"}'),
        ServerSentEvent("message", "[1,\n2]"),
        ServerSentEvent("message", "x", "9", 30),
    ]


# --- The line cap -----------------------------------------------------------------------------


def test_a_line_longer_than_the_cap_is_refused_naming_the_cap() -> None:
    """Catches: no cap at all (a server that never ends its line grows memory without end)."""
    decoder = SSEDecoder(max_line_bytes=1000)
    with pytest.raises(LineTooLong, match="max_line_bytes=1000"):
        decoder.feed(b"data: " + b"x" * 2000 + b"\n\n")


def test_a_line_at_the_cap_is_accepted() -> None:
    """Catches: an off-by-one that refuses a line of exactly the cap."""
    line = b"data: " + b"x" * 994  # 1000 bytes without its line end
    assert SSEDecoder(max_line_bytes=1000).feed(line + b"\n\n") == [
        ServerSentEvent("message", "x" * 994)
    ]


def test_an_unfinished_line_is_refused_once_it_passes_the_cap() -> None:
    """Catches: memory not bounded by the cap (the line buffered until its end, or until
    the whole body arrived)."""
    decoder = SSEDecoder(max_line_bytes=64 * 1024)
    fed = 0

    def feed_forever() -> None:
        nonlocal fed
        for _ in range(10_000):  # 40 MB if nothing stopped it
            decoder.feed(b"y" * 4096)
            fed += 4096

    with pytest.raises(LineTooLong) as caught:
        feed_forever()
    assert fed <= 64 * 1024 < fed + 4096
    assert caught.value.limit == 64 * 1024


def test_an_event_of_many_short_data_lines_is_refused_once_it_passes_the_cap() -> None:
    """Catches: memory not bounded by the cap for an event made of many short data lines
    without the blank line that ends it (only single lines were capped)."""
    decoder = SSEDecoder(max_line_bytes=64 * 1024)
    fed = 0

    def feed_forever() -> None:
        nonlocal fed
        for _ in range(10_000):  # 40 MB if nothing stopped it
            decoder.feed(b"data: " + b"y" * 4089 + b"\n")  # 4096 bytes a read
            fed += 4090  # the data joined: 4089 bytes and a newline

    with pytest.raises(EventTooLong, match="max_line_bytes=65536") as caught:
        feed_forever()
    assert fed <= 64 * 1024 + 4096 < fed + 2 * 4096
    assert caught.value.limit == 64 * 1024


@pytest.mark.parametrize(
    ("lines", "refused"),
    [
        (["x" * 500, "y" * 499], False),  # 1000 bytes joined: at the cap
        (["x" * 500, "y" * 500], True),
        (["é" * 250, "y" * 499], False),  # counted in UTF-8 bytes, not characters
        (["é" * 251, "y" * 499], True),
    ],
)
def test_an_events_data_is_capped_in_bytes_however_it_is_split(
    lines: list[str], refused: bool
) -> None:
    """Catches: the event cap counted in characters, or applied only to an event still open
    at the end of a read (it would then depend on how the body was cut into reads)."""
    body = "".join(f"data: {line}\n" for line in lines).encode() + b"\n"
    for reads in ([body], [body[:-1], body[-1:]], [body[:1], body[1:]]):
        decoder = SSEDecoder(max_line_bytes=1000)
        if refused:
            with pytest.raises(EventTooLong):
                [event for read in reads for event in decoder.feed(read)]
        else:
            events = [event for read in reads for event in decoder.feed(read)]
            assert events == [ServerSentEvent("message", "\n".join(lines))]


@pytest.mark.parametrize("name", ["openai", "anthropic"])
async def test_a_provider_refuses_an_event_of_many_lines_over_its_cap(
    server: ProtocolServer, name: str
) -> None:
    """Catches: an event of many short data lines (no blank line) accumulated without end."""
    line = b"data: " + b"z" * 100 + b"\n"
    server.script(wire.stream([line * 10] * 100))  # 100 KB of data, never a blank line
    model: Any = (
        OpenAIChat("m", base_url=f"{server.url}/v1", api_key=KEY, max_line_bytes=4096)
        if name == "openai"
        else AnthropicMessages("m", base_url=server.url, api_key=KEY, max_line_bytes=4096)
    )
    with pytest.raises(
        ProviderProtocolError, match=r"data lines are longer than max_line_bytes=4096"
    ):
        await collect(model)


@pytest.mark.parametrize("name", ["openai", "anthropic"])
async def test_a_provider_refuses_a_line_over_its_cap_with_a_protocol_error(
    server: ProtocolServer, name: str
) -> None:
    """Catches: the cap not configurable on the provider, or raised as a bare ValueError."""
    line = b"data: " + b"z" * 5000 + b"\n\n"
    server.script(wire.stream([line[:3000], line[3000:]]))
    model: Any = (
        OpenAIChat("m", base_url=f"{server.url}/v1", api_key=KEY, max_line_bytes=4096)
        if name == "openai"
        else AnthropicMessages("m", base_url=server.url, api_key=KEY, max_line_bytes=4096)
    )
    with pytest.raises(ProviderProtocolError, match=r"max_line_bytes=4096 bytes"):
        await collect(model)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16MiB"])
def test_a_bad_cap_is_refused_when_the_provider_is_built(bad: Any) -> None:
    """Catches: a cap that would refuse every line, or none, accepted silently."""
    with pytest.raises(ValueError, match="max_line_bytes must be a positive int"):
        OpenAIChat("m", max_line_bytes=bad)


# --- The split law on generated streams --------------------------------------------------------

_VALUES = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs",), blacklist_characters="\r\n"
    ),  # é, 😀, U+2028 and friends included
    max_size=12,
)
_LINE = st.one_of(
    st.builds(lambda v: f"data: {v}", _VALUES),
    st.builds(lambda v: f"data:{v}", _VALUES),
    st.builds(lambda v: f"event: {v}", _VALUES),
    st.builds(lambda v: f"id: {v}", _VALUES),
    st.builds(lambda v: f": {v}", _VALUES),
    st.builds(lambda n: f"retry: {n}", st.integers(0, 10**6)),
    st.just(""),
)
_END = st.sampled_from(["\n", "\r", "\r\n"])


@given(
    st.lists(st.tuples(_LINE, _END), max_size=25),
    st.sets(st.integers(min_value=1, max_value=10_000)),
)
def test_decoding_does_not_depend_on_how_the_bytes_are_split(
    lines: list[tuple[str, str]], cuts: set[int]
) -> None:
    """Law: the events are the same however the body is cut into reads — inside a CRLF,
    inside a multi-byte UTF-8 character, anywhere. Catches: state lost between reads."""
    body = "".join(line + end for line, end in lines).encode()
    bounds = [0, *sorted(cut for cut in cuts if cut < len(body)), len(body)]
    reads = [body[start:end] for start, end in itertools.pairwise(bounds)]
    assert decode(*reads) == decode(body) == decode(*(body[i : i + 1] for i in range(len(body))))


# --- The end marker without the blank line after it ---------------------------------------------

_OPENAI_ENDS = [b"data: [DONE]\n", b"data: [DONE]", b"data: [DONE]\r\n", b"data: [DONE]\r"]
_ANTHROPIC_STOP = b'event: message_stop\ndata: {"type":"message_stop"}'
_ANTHROPIC_ENDS = [_ANTHROPIC_STOP, _ANTHROPIC_STOP + b"\n", b'data: {"type":"message_stop"}']


def _ended_with(name: str, last: bytes) -> tuple[bytes, ...]:
    """A whole text stream "Hi", its end marker replaced with `last`."""
    if name == "openai":
        whole = wire.openai_text(["Hi"], usage=(9, 2))
    else:
        whole = wire.anthropic_text(["Hi"], input_tokens=9, output_tokens=2)
    return (*whole[:-1], last)


def _model(server: ProtocolServer, name: str) -> Any:
    if name == "openai":
        return OpenAIChat("m", base_url=f"{server.url}/v1", api_key=KEY)
    return AnthropicMessages("m", base_url=server.url, api_key=KEY)


@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize(
    ("name", "last"),
    [("openai", end) for end in _OPENAI_ENDS] + [("anthropic", end) for end in _ANTHROPIC_ENDS],
)
async def test_a_whole_end_marker_without_the_blank_line_completes_the_stream(
    server: ProtocolServer, name: str, last: bytes, framing: Any
) -> None:
    """Bug caught: a stream whose end marker (`data: [DONE]`, Anthropic's message_stop) was
    whole but not followed by the blank line, the body ending there, was a "truncated"
    ProviderProtocolError and the turn failed, though the marker said the answer was
    complete."""
    server.script(wire.stream(_ended_with(name, last), framing=framing))
    events = await collect(_model(server, name))
    assert events == [ModelText("Hi"), ModelFinish("stop", Usage(9, 2))]


@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize(
    ("name", "last"),
    [
        ("openai", b"data: [DON"),
        ("openai", b"data: [DONE"),
        ("openai", b""),
        ("openai", b'data: {"choices": []}'),
        ("anthropic", b'event: message_stop\ndata: {"type":"message_stop"'),
        ("anthropic", b"event: message_stop\n"),
        ("anthropic", b"event: message_stop"),
        ("anthropic", b'event: message_delta\ndata: {"type":"message_delta","delta":{}}'),
        ("anthropic", b""),
    ],
)
async def test_a_cut_end_marker_or_none_is_still_a_truncated_stream(
    server: ProtocolServer, name: str, last: bytes, framing: Any
) -> None:
    """Bug caught (guard of the fix above): a stream whose end marker was cut (`data: [DON`),
    or that had none, taken as complete: a truncated answer passed for a whole one."""
    server.script(wire.stream(_ended_with(name, last), framing=framing))
    with pytest.raises(ProviderProtocolError, match="truncated"):
        await collect(_model(server, name))


@pytest.mark.parametrize("ending", [b"\n\n", b""])
def test_the_event_the_body_ends_inside_is_held_to_the_cap(ending: bytes) -> None:
    """Bug caught: `close` added the line the body ended in (no line end after it) to the
    open event's data without measuring it, so an event left open at the end held up to
    about twice max_line_bytes, where the same event ended by its blank line was refused."""
    decoder = SSEDecoder(max_line_bytes=1000)
    body = b"data: " + b"x" * 600 + b"\ndata: " + b"y" * 600 + ending

    def read_to_the_end() -> list[ServerSentEvent]:
        return decoder.feed(body) + decoder.close()

    with pytest.raises(EventTooLong, match="max_line_bytes=1000"):
        read_to_the_end()
    assert decoder.unterminated is None


def test_the_event_the_body_ends_inside_is_kept_within_the_cap() -> None:
    """Bug caught (guard of the fix above): an open event at the cap refused at the end, or
    its last line measured twice."""
    decoder = SSEDecoder(max_line_bytes=1000)
    decoder.feed(b"data: " + b"x" * 500 + b"\ndata: " + b"y" * 499)  # 1000 bytes joined
    assert decoder.close() == []
    assert decoder.unterminated == ServerSentEvent("message", "x" * 500 + "\n" + "y" * 499)


@pytest.mark.parametrize("blank_line", [b"\n\n", b""])
async def test_a_message_stop_past_the_cap_is_refused_with_or_without_its_blank_line(
    server: ProtocolServer, blank_line: bytes
) -> None:
    """Bug caught: an Anthropic message_stop whose two data lines, joined, pass
    max_line_bytes was refused when its blank line came, but accepted as the stream's end
    when the body ended right after its last line: the outcome depended on the blank line."""
    stop = (
        b'event: message_stop\ndata: {"type": "message_stop", "a": "'
        + b"x" * 3000
        + b'",\ndata: "b": "'
        + b"y" * 3000
        + b'"}'
    )
    server.script(wire.stream(_ended_with("anthropic", stop + blank_line)))
    model = AnthropicMessages("m", base_url=server.url, api_key=KEY, max_line_bytes=4096)
    with pytest.raises(
        ProviderProtocolError, match=r"data lines are longer than max_line_bytes=4096"
    ):
        await collect(model)
