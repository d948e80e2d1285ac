"""The byte-level SSE decoder (pipeline/providers/_sse.py)."""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from pipeline.providers._sse import ServerSentEvent, SSEDecoder


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
