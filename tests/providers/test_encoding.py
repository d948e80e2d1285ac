"""Content-Encoding decoded a bounded piece at a time (pipeline/providers/_encoding.py)."""

import itertools
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.providers._encoding import (
    PIECE_BYTES,
    UndecodableBody,
    UnsupportedEncoding,
    decoder_for,
)

from .server import compressed, gzip_bomb

HEADER = {"gzip": "gzip", "deflate": "deflate", "raw-deflate": "deflate"}
WBITS = {"gzip": 31, "deflate": 15, "raw-deflate": -15}


def decode(header: str, *reads: bytes) -> list[bytes]:
    decoder = decoder_for(header)
    return [piece for read in reads for piece in decoder(read)]


@given(
    text=st.binary(max_size=200),
    repeat=st.integers(1, 2000),
    encoding=st.sampled_from(sorted(HEADER)),
    data=st.data(),
)
def test_decoding_does_not_depend_on_how_the_body_is_cut_into_reads(
    text: bytes, repeat: int, encoding: str, data: st.DataObject
) -> None:
    """Law: for any cut of a compressed body into reads, the pieces join to the body.
    Catches: a raw deflate body whose first read is a single byte refused (httpx tries the
    raw format only when the first read fails)."""
    body = text * repeat
    packed = compressed(body, encoding)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(packed) - 1, 1)), max_size=8)))
    reads = [packed[a:b] for a, b in itertools.pairwise([0, *cuts, len(packed)])]
    assert b"".join(decode(HEADER[encoding], *reads)) == body


@pytest.mark.parametrize("encoding", sorted(HEADER))
def test_each_read_is_passed_on_whole_at_once(encoding: str) -> None:
    """Catches: output left inside zlib when a read ends within a long run of zeros that
    crosses a piece's end (zlib has taken all the input, not given all the output): in a
    stream, the events it holds would wait for the next read."""
    body = bytes(256 * 1024)
    packed = compressed(body, encoding)
    for cut in range(1, len(packed)):
        unbounded = zlib.decompressobj(WBITS[encoding]).decompress(packed[:cut])
        passed_on = b"".join(decode(HEADER[encoding], packed[:cut]))
        assert (cut, len(passed_on)) == (cut, len(unbounded))  # zeros, both


def test_a_gzip_bomb_inflates_one_bounded_piece_at_a_time() -> None:
    """Catches: a read of a gzip bomb inflated whole (64 KiB of it is 64 MiB of zeros)."""
    read = gzip_bomb(128)[: 64 * 1024]
    pieces = decoder_for("gzip")(read)
    sizes = [len(piece) for piece in pieces]
    assert max(sizes) == PIECE_BYTES
    assert sum(sizes) > 1000 * len(read)  # the read did hold a bomb


def test_codings_are_undone_in_the_reverse_of_the_order_they_were_applied() -> None:
    """Catches: a body compressed twice ("deflate, gzip") decoded in the wrong order."""
    body = b"hello " * 1000
    packed = compressed(compressed(body, "deflate"), "gzip")
    assert b"".join(decode("deflate, gzip", packed[:10], packed[10:])) == body


@pytest.mark.parametrize("header", ["", "identity", "utf-8"])
def test_identity_and_unknown_codings_pass_the_bytes_as_they_are(header: str) -> None:
    """Catches: a misconfigured server's ``Content-Encoding: utf-8`` refused, where httpx
    passes the bytes on."""
    assert decode(header, b"data: a\n", b"\n") == [b"data: a\n", b"\n"]


@pytest.mark.parametrize(("header", "named"), [("br", "br"), ("ZSTD", "ZSTD"), ("gzip, br", "br")])
def test_a_compression_that_is_not_decoded_is_refused_by_name(header: str, named: str) -> None:
    """Catches: a brotli or zstd body passed on compressed, or decoded whole."""
    with pytest.raises(UnsupportedEncoding, match=f"content-encoding '{named}'"):
        decoder_for(header)


def test_a_body_that_does_not_decode_is_an_error_naming_its_coding() -> None:
    """Catches: a corrupt body raised as a bare zlib error that names no coding."""
    with pytest.raises(UndecodableBody, match="its gzip body does not decode"):
        decode("gzip", b"this is not gzip at all")


def test_bytes_after_the_end_of_the_compressed_data_are_ignored() -> None:
    """Catches: what a server sends after the end of the gzip data kept without end."""
    body = b"the body"
    assert b"".join(decode("gzip", compressed(body) + b"junk", b"more junk" * 1000)) == body
