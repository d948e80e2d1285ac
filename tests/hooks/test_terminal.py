"""`hooks._terminal.escaping_unencodable` on a stream that blocks on several threads hold.

`hooks.cli.main` may run on several threads at once, each escaping standard output for as
long as it runs: these hold one ASCII stream from many threads, blocks nested in blocks.
"""

import gc
import io
import random
import sys
import threading
import weakref
from collections.abc import Iterator

import pytest

from hooks._terminal import escaping_unencodable

THREADS = 8
BLOCKS = 150


@pytest.fixture
def switching_often() -> Iterator[None]:
    """Threads that take turns every microsecond rather than every 5 ms, in which one
    thread would run all its blocks before the next started."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("switching_often")
@pytest.mark.parametrize("own", ["strict", "surrogateescape"])
def test_blocks_on_many_threads_escape_every_write_and_put_the_handler_back(own: str) -> None:
    """Bug caught: a block that ended put the stream's own error handler back while other
    blocks (an outer one on its thread, or one on another thread) still held it, and their
    next write of what ASCII cannot carry failed."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors=own)
    barrier = threading.Barrier(THREADS)
    failed: list[str] = []
    nested = [0] * THREADS

    def write(i: int) -> None:
        rng = random.Random(i)
        barrier.wait()
        for _ in range(BLOCKS):
            try:
                with escaping_unencodable(stream):
                    if rng.random() < 0.3:
                        nested[i] += 1
                        with escaping_unencodable(stream):
                            stream.write("\udc80\n")
                    stream.write("caf\u00e9\n")
            except Exception as exc:
                failed.append(repr(exc))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stream.flush()

    assert failed == []
    assert stream.errors == own
    with pytest.raises(UnicodeEncodeError):
        stream.write("\u00e9")
    lines = raw.getvalue().splitlines()
    assert lines.count(b"caf\\u00e9") == THREADS * BLOCKS
    # With surrogateescape a lone surrogate in U+DC80..U+DCFF is still the byte it stands for.
    surrogate = b"\x80" if own == "surrogateescape" else b"\\udc80"
    assert lines.count(surrogate) == sum(nested)
    assert len(lines) == THREADS * BLOCKS + sum(nested)


class ReaderGoneOnce(io.BytesIO):
    """A pipe whose first write fails as one whose reader has gone, and later ones pass."""

    gone = True

    def write(self, data: bytes) -> int:
        if self.gone:
            self.gone = False
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(data)


def test_a_block_whose_stream_could_not_be_switched_leaves_the_next_to_switch_it() -> None:
    """Bug caught: a block whose stream failed to switch handlers as it began (reconfiguring
    flushes, and the flush failed) left the stream noted as held, so the next block did not
    switch it and its write of what ASCII cannot carry failed."""
    raw = ReaderGoneOnce()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    stream.write("pending ")
    with pytest.raises(BrokenPipeError), escaping_unencodable(stream):
        pass
    assert stream.errors == "strict"

    with escaping_unencodable(stream):
        stream.write("caf\u00e9\n")
    stream.flush()

    assert raw.getvalue().endswith(b"caf\\u00e9\n")
    assert stream.errors == "strict"


def test_a_block_on_a_closed_stream_keeps_no_hold_of_it() -> None:
    """Bug caught: a block on a closed stream (which cannot switch handlers) left the stream
    noted as held, for the process's life."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    stream.close()
    with pytest.raises(ValueError, match="closed file"), escaping_unencodable(stream):
        pass

    kept = weakref.ref(stream)
    del stream
    gc.collect()
    assert kept() is None
