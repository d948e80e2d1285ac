"""SSE decoding throughput: one 64 MB line, and a million small events.

The decoder is fed 64 KiB reads, as httpx hands a streamed body over. Two workloads:

- one ``data:`` line of 64 MB (a huge tool call's arguments, a server that never sends a line
  end): megabytes per second, against ``bytes.split`` of the whole input on line ends (the
  fastest split Python has, C on one buffer) and a target of at least 100 MB/s;
- a million small OpenAI-shaped events: events per second, against a plain Python decoder of
  the whole input at once (split on line ends, decode, keep ``data:`` values, dispatch at the
  blank line), which is what the incremental decoder does plus the bookkeeping of reads.

Decoding is pure Python with no event loop in it: the figures hold on trio and asyncio alike.
"""

import statistics

from pipeline.providers._sse import SSEDecoder

from ._harness import Row, measure, per_rep, spread

READ = 64 * 1024
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" fox"}}]}\n\n'


def _reads(payload: bytes) -> list[bytes]:
    return [payload[start : start + READ] for start in range(0, len(payload), READ)]


def _decode(reads: list[bytes], limit: int) -> int:
    decoder = SSEDecoder(max_line_bytes=limit)
    count = 0
    for read in reads:
        count += len(decoder.feed(read))
    return count


def _plain_events(payload: bytes) -> int:
    """The floor: a whole-input decoder in plain Python, no reads, no state across them."""
    events: list[tuple[str, str]] = []
    data: list[str] = []
    for raw in payload.split(b"\n"):
        line = raw.decode("utf-8", "replace")
        if line.startswith("data:"):
            data.append(line[6:] if line[5:6] == " " else line[5:])
        elif not line and data:
            events.append(("message", "\n".join(data)))
            data = []
    return len(events)


async def run(quick: bool) -> list[Row]:
    megabytes, count, repeats = (4, 50_000, 3) if quick else (64, 1_000_000, 7)
    line = b"data: " + b"x" * (megabytes * 1024 * 1024) + b"\n\n"
    line_reads = _reads(line)
    small = EVENT * count
    small_reads = _reads(small)
    limit = len(line) + 1

    assert _decode(line_reads, limit) == 1
    assert _decode(small_reads, limit) == count == _plain_events(small)

    async def line_ours() -> None:
        _decode(line_reads, limit)

    async def line_floor() -> None:
        line.split(b"\n")

    async def small_ours() -> None:
        _decode(small_reads, limit)

    async def small_floor() -> None:
        _plain_events(small)

    lines = await measure(
        {"floor": line_floor, "ours": line_ours}, repeats=repeats, inner=1, warmup=1
    )
    events = await measure(
        {"floor": small_floor, "ours": small_ours}, repeats=repeats, inner=1, warmup=1
    )
    mb = len(line) / 1e6
    line_rate = [mb / seconds for seconds in lines["ours"].times]
    line_ratio = per_rep(lambda ours, floor: ours / floor, lines["ours"], lines["floor"])
    event_rate = [count / seconds for seconds in events["ours"].times]
    event_ratio = per_rep(lambda ours, floor: ours / floor, events["ours"], events["floor"])
    rate = statistics.median(line_rate)
    event_ratio_median = statistics.median(event_ratio)
    return [
        Row(
            f"one {megabytes} MB data line, 64 KiB reads",
            rate,
            spread(line_rate),
            mb / lines["floor"].median,
            statistics.median(line_ratio),
            note="floor: bytes.split of the whole input; ratio: our time over the floor's",
            target=">= 100 MB/s",
            met=rate >= 100,
            unit="MB/s",
        ),
        Row(
            f"{count:,} small events, 64 KiB reads",
            statistics.median(event_rate),
            spread(event_rate),
            count / events["floor"].median,
            event_ratio_median,
            note="floor: a plain Python decoder of the whole input; ratio: our time over it",
            target="<= 1.5x",
            met=event_ratio_median <= 1.5,
            unit="events/s",
        ),
    ]
