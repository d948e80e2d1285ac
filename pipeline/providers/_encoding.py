"""A response body's Content-Encoding, decoded a bounded piece at a time.

httpx decodes each network read whole: one read of 64 KiB of gzip can inflate to 64 MiB
(deflate reaches about 1030:1), and all of it is in memory before a cap of ours sees a byte. A
server or proxy answering with a small, highly compressed body (a "gzip bomb": a gigabyte of
zeros is a megabyte of gzip) would pass every cap. So the shell reads the raw bytes and
decodes them here, where no call inflates more than `PIECE_BYTES`: the reader stops at its own
cap (an error body's 64 KiB, an event's ``max_line_bytes``) with one piece more in memory, and
nothing beyond it is ever inflated.
"""

import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import final

PIECE_BYTES = 64 * 1024
"""The most bytes one step of decoding produces."""

ACCEPT_ENCODING = "gzip, deflate"
"""What requests accept: the codings decoded here, as httpx sends by default (and so the
official SDKs). Brotli and zstd are not asked for even where their packages are installed
(httpx would then add them): they are not decoded here."""

_WBITS = {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}

_REFUSED = frozenset({"br", "zstd", "compress", "x-compress"})
"""Compressions a server may send although requests do not ask for them: refused by name,
rather than passed on compressed. Other unknown codings (a misconfigured ``utf-8``) are
passed on as they are, as httpx does."""


class UnsupportedEncoding(ValueError):
    """The body is compressed in a coding that is not decoded here.

    Attributes:
        encoding: The coding, as the response named it.
    """

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"its content-encoding {encoding!r} is not one decoded here; requests accept"
            f" {ACCEPT_ENCODING}"
        )
        self.encoding = encoding


class UndecodableBody(ValueError):
    """The body does not decode in the coding its response named."""


Decode = Callable[[bytes], Iterable[bytes]]
"""Turns one raw read of the body into its decoded pieces, each at most `PIECE_BYTES`."""


def decoder_for(content_encoding: str) -> Decode:
    """The decoder of a body whose ``Content-Encoding`` header is `content_encoding`.

    Codings listed in the order they were applied are undone in reverse, as HTTP says.

    Raises:
        UnsupportedEncoding: A compression that is not decoded here (``br``, ``zstd``, ...).
    """
    layers: list[Decode] = []
    for value in content_encoding.split(","):
        coding = value.strip().lower()
        if coding in _WBITS:
            layers.append(_Inflate(coding).feed)
        elif coding in _REFUSED:
            raise UnsupportedEncoding(value.strip())
    if not layers:
        return _as_is
    if len(layers) == 1:
        return layers[0]
    layers.reverse()
    return lambda data: _through(layers, data)


def _as_is(data: bytes) -> tuple[bytes]:
    return (data,)


def _through(layers: list[Decode], data: bytes) -> Iterator[bytes]:
    first, *rest = layers
    for piece in first(data):
        if rest:
            yield from _through(rest, piece)
        else:
            yield piece


@final
class _Inflate:
    """One gzip or deflate layer.

    Each piece is taken with zlib's ``max_length``, so a piece is inflated only when its reader
    asks for it; whatever follows the end of the compressed data is ignored, as httpx does.
    """

    __slots__ = ("_coding", "_inflater", "_unchecked")

    def __init__(self, coding: str) -> None:
        self._coding = coding
        self._inflater = zlib.decompressobj(_WBITS[coding])
        # "deflate" is zlib's format, but servers send raw deflate under that name too: until
        # zlib's two-byte header has been checked, the bytes seen are kept to retry as raw.
        self._unchecked: bytes | None = b"" if coding == "deflate" else None

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The pieces `data` decodes to (it may end inside a piece: the rest comes later)."""
        inflater = self._inflater
        while not inflater.eof:
            try:
                piece = inflater.decompress(data, PIECE_BYTES)
            except zlib.error as exc:
                if self._unchecked is None:
                    raise UndecodableBody(
                        f"its {self._coding} body does not decode: {exc}"
                    ) from exc
                data, self._unchecked = self._unchecked + data, None
                self._inflater = inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                continue
            if self._unchecked is not None:
                seen = self._unchecked + data
                self._unchecked = seen if len(seen) < 2 else None
            if piece:
                yield piece
            data = inflater.unconsumed_tail
            # A piece shorter than the most means zlib ran out of input, and holds no output.
            if not data and len(piece) < PIECE_BYTES:
                return
