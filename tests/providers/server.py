"""A local protocol server for the provider tests and the benchmark.

HTTP/1.1 written by hand over a real loopback socket (an AnyIO TCP listener on port 0, so it
runs under trio and asyncio alike), kept apart
from the providers' code so that the two cannot share a misunderstanding. It records every
request it receives and answers each with the next scripted `Reply`: an OpenAI or Anthropic
event stream, or a fault (an error status with retry headers, a stream cut short, bytes one
at a time, a server that goes silent).

By default one request per connection (every answer says ``connection: close``), so each
retry is a fresh connection, as it would be after a failure in the wild. With
``keep_alive=True`` it is an HTTP/1.1 keep-alive server: a connection serves request after
request (each complete answer says ``connection: keep-alive``) until the client closes it, and
`connections` counts the connections it accepted.

Run it alone (the benchmark does): ``python -m tests.providers.server --openai-chunks 2000``
serves the same recorded stream to every request and prints its port.
"""

import argparse
import functools
import json
import socket
import struct
import sys
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

Framing = Literal["chunked", "close", "length"]


@attrs.frozen
class Recorded:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes


@attrs.frozen
class Reply:
    """One scripted answer.

    Attributes:
        status: The HTTP status.
        headers: Response headers besides the framing ones.
        pieces: The body, each piece written with its own send (one chunk when chunked).
        framing: ``"chunked"``, ``"close"`` (the body ends when the socket closes) or
            ``"length"`` (a Content-Length for the whole body, even if `complete` is false).
        complete: False to stop before the body's end: no final chunk, or an early close.
        stall: After the pieces, send nothing more and wait until the client hangs up.
        bytewise: Write the body one byte per send.
        reset: After the pieces, close the connection with a TCP reset (RST), as a crashed
            upstream or a proxy's timeout does.
        pace: Seconds to wait before each piece after the first (a body that trickles).
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = (("content-type", "text/event-stream"),)
    pieces: tuple[bytes, ...] = ()
    framing: Framing = "chunked"
    complete: bool = True
    stall: bool = False
    bytewise: bool = False
    reset: bool = False
    pace: float = 0.0


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Overloaded" if status == 529 else "Unknown"


class ProtocolServer:
    """Plays scripted replies, in order, one per request; records what it received."""

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        repeat: Reply | None = None,
        keep_alive: bool = False,
    ) -> None:
        self.requests: list[Recorded] = []
        self.repeat = repeat
        self.keep_alive = keep_alive
        self.port = 0
        self.hangups = 0
        self.connections = 0
        """Connections accepted so far."""
        self.open_connections = 0
        """Connections accepted and not yet closed by either side."""
        self.before_reply: Callable[[Recorded], Awaitable[None]] | None = None
        """Awaited with each request before its answer is written (the connection stays
        busy meanwhile): a test can hold requests until enough are in flight."""
        self.before_reset: Callable[[], Awaitable[None]] | None = None
        """Awaited before a `Reply.reset` resets the connection: a test can hold the reset
        until the client has read what came before it (a reset discards unread data)."""
        self._replies: deque[Reply] = deque(replies)
        self._hung_up: anyio.Event | None = None  # made in start(), under the running loop

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: Reply) -> None:
        """Queue more replies."""
        self._replies.extend(replies)

    async def start(self, group: anyio.abc.TaskGroup) -> None:
        """Listen on a free loopback port, serving in `group` until it is cancelled."""
        self._hung_up = anyio.Event()
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        group.start_soon(self._serve, listener)

    async def _serve(self, listener: anyio.abc.SocketListener) -> None:
        async with listener:
            await listener.serve(self._connection)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await self._handle(stream)

    async def wait_hangup(self) -> None:
        """Return once a client has hung up before the end of a reply, or on a stalled one."""
        assert self._hung_up is not None, "start() the server first"
        await self._hung_up.wait()

    def _next(self) -> Reply:
        if self._replies:
            return self._replies.popleft()
        if self.repeat is not None:
            return self.repeat
        body = json.dumps({"error": {"type": "test_error", "message": "no scripted reply left"}})
        return Reply(599, (("content-type", "application/json"),), (body.encode(),), "length")

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        self.open_connections += 1
        try:
            while True:
                request = await _read_request(stream)
                if request is None:
                    return
                self.requests.append(request)
                if self.before_reply is not None:
                    await self.before_reply(request)
                if not await self._write(stream, self._next()):
                    return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._hangup()  # the client hung up while we were still writing
        finally:
            self.open_connections -= 1

    def _hangup(self) -> None:
        self.hangups += 1
        if self._hung_up is not None:
            self._hung_up.set()

    async def _write(self, stream: anyio.abc.SocketStream, reply: Reply) -> bool:
        """Write `reply`; whether the connection may serve another request."""
        reuse = self.keep_alive and reply.framing != "close" and reply.complete and not reply.stall
        lines = [f"HTTP/1.1 {reply.status} {_reason(reply.status)}"]
        lines += [f"{name}: {value}" for name, value in reply.headers]
        if reply.framing == "chunked":
            lines.append("transfer-encoding: chunked")
        elif reply.framing == "length":
            lines.append(f"content-length: {sum(len(piece) for piece in reply.pieces)}")
        lines.append("connection: keep-alive" if reuse else "connection: close")
        await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        for number, piece in enumerate(reply.pieces):
            if number and reply.pace:
                await anyio.sleep(reply.pace)
            data = b"%x\r\n%s\r\n" % (len(piece), piece) if reply.framing == "chunked" else piece
            if reply.bytewise:
                for index in range(len(data)):
                    await stream.send(data[index : index + 1])
                    await anyio.lowlevel.checkpoint()
            else:
                await stream.send(data)
        if reply.reset:
            if self.before_reset is not None:
                await self.before_reset()
            # SO_LINGER with a zero timeout: closing sends RST instead of FIN.
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()
            return False
        if reply.complete and not reply.stall and reply.framing == "chunked":
            await stream.send(b"0\r\n\r\n")
        if reply.stall:
            while await _receive(stream):
                pass
            self._hangup()
        return reuse


async def _receive(stream: anyio.abc.SocketStream) -> bytes:
    """The next bytes from the client, or ``b""`` once it has closed its side."""
    try:
        return await stream.receive(65536)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return b""


async def _read_request(stream: anyio.abc.SocketStream) -> Recorded | None:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = await _receive(stream)
        if not data:
            return None
        buffer += data
    head, _, body = buffer.partition(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, path, _version = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        data = await _receive(stream)
        if not data:
            return None
        body += data
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return Recorded(method, path, headers, parsed, body)


@asynccontextmanager
async def running(*replies: Reply, repeat: Reply | None = None) -> AsyncIterator[ProtocolServer]:
    """A server listening for the duration of the block."""
    server = ProtocolServer(replies, repeat=repeat)
    async with anyio.create_task_group() as group:
        await server.start(group)
        yield server
        group.cancel_scope.cancel()


# --- Building replies -------------------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE event; `data` is JSON-encoded unless it is already a string."""
    text = data if isinstance(data, str) else json.dumps(data)
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {text}\n\n".encode()


def stream(pieces: Iterable[bytes], **changes: Any) -> Reply:
    """A 200 event-stream reply made of `pieces`."""
    return Reply(pieces=tuple(pieces), **changes)


def json_error(
    status: int, body: Any, headers: Sequence[tuple[str, str]] = (), **changes: Any
) -> Reply:
    """An error answer with a JSON body."""
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    return Reply(
        status,
        (("content-type", "application/json"), *headers),
        (data,),
        "length",
        **changes,
    )


def compressed(body: bytes, encoding: str = "gzip") -> bytes:
    """`body` in a content coding: ``gzip``, ``deflate`` (zlib's format) or ``raw-deflate``
    (raw deflate, which servers also send as ``deflate``)."""
    wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding]
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return packer.compress(body) + packer.flush()


@functools.cache
def gzip_bomb(mib: int = 1024) -> bytes:
    """A valid gzip body of `mib` MiB of zeros in about a thousandth of that (1 GiB: 1 MB).

    Built in a fraction of a second: after a full flush the compressor starts afresh, so every
    MiB of zeros compresses to the same bytes, and the body is those bytes repeated, then the
    final block and the trailer (the CRC and the size of the whole).
    """
    block = bytes(1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    final_empty_block = b"\x03\x00"
    trailer = struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF)
    return first + again * (mib - 1) + final_empty_block + trailer


def pieces_of(body: bytes, size: int = 64 * 1024) -> tuple[bytes, ...]:
    """`body` cut into pieces of `size` bytes, each written with its own send."""
    return tuple(body[start : start + size] for start in range(0, len(body), size))


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    chunk = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1760000000,
        "model": "test-model",
        "choices": choices,
        "usage": None,
        **extra,
    }
    return sse(chunk)


def openai_text(
    pieces: Iterable[str], *, usage: tuple[int, int] = (9, 2), finish: str = "stop"
) -> tuple[bytes, ...]:
    """An OpenAI text stream: role chunk, content chunks, finish chunk, usage chunk, [DONE]."""
    return (
        _chunk({"role": "assistant", "content": "", "refusal": None}),
        *(_chunk({"content": piece}) for piece in pieces),
        _chunk({}, finish),
        _usage_chunk(usage),
        b"data: [DONE]\n\n",
    )


def _usage_chunk(usage: tuple[int, int]) -> bytes:
    prompt, completion = usage
    totals = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return _chunk(None, usage=totals)


def openai_tool_calls(
    calls: Sequence[tuple[str, str, Sequence[str]]],
    *,
    text: str = "",
    usage: tuple[int, int] = (60, 15),
) -> tuple[bytes, ...]:
    """An OpenAI stream of tool calls: ``(id, name, argument fragments)`` per call, by index."""
    pieces = [_chunk({"role": "assistant", "content": None})]
    if text:
        pieces.append(_chunk({"content": text}))
    for index, (call_id, name, fragments) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function"}
        first["function"] = {"name": name, "arguments": ""}  # type: ignore[assignment]
        pieces.append(_chunk({"tool_calls": [first]}))
        pieces.extend(
            _chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
            for fragment in fragments
        )
    pieces += [_chunk({}, "tool_calls"), _usage_chunk(usage), b"data: [DONE]\n\n"]
    return tuple(pieces)


def ollama_tool_calls(
    calls: Sequence[tuple[str, str, str]], *, usage: tuple[int, int] = (60, 15)
) -> tuple[bytes, ...]:
    """Ollama's stream of tool calls: ``(id, name, arguments)`` per call, each call whole in
    a chunk of its own and every one at index 0, as Ollama's OpenAI-compatible API sends them."""
    pieces = [
        _chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "index": 0,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        )
        for call_id, name, arguments in calls
    ]
    pieces += [_chunk({}, "tool_calls"), _usage_chunk(usage), b"data: [DONE]\n\n"]
    return tuple(pieces)


def _event(name: str, **payload: Any) -> bytes:
    return sse({"type": name, **payload}, name)


def anthropic_start(input_tokens: int = 12) -> bytes:
    """Anthropic's ``message_start``."""
    message = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return _event("message_start", message=message)


def anthropic_text_block(index: int, pieces: Iterable[str]) -> tuple[bytes, ...]:
    """One text content block streamed in `pieces`."""
    return (
        _event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *(
            _event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
            for piece in pieces
        ),
        _event("content_block_stop", index=index),
    )


def anthropic_tool_block(
    index: int, call_id: str, name: str, fragments: Iterable[str]
) -> tuple[bytes, ...]:
    """One tool_use block whose input arrives as ``input_json_delta`` fragments."""
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return (
        _event("content_block_start", index=index, content_block=block),
        *(
            _event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": fragment},
            )
            for fragment in fragments
        ),
        _event("content_block_stop", index=index),
    )


def anthropic_end(stop_reason: str = "end_turn", output_tokens: int = 3) -> tuple[bytes, ...]:
    """``message_delta`` (stop reason, cumulative usage) and ``message_stop``."""
    return (
        _event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        _event("message_stop"),
    )


def anthropic_text(
    pieces: Iterable[str], *, input_tokens: int = 12, output_tokens: int = 3
) -> tuple[bytes, ...]:
    """A whole Anthropic text stream, with a ``ping`` after the start."""
    return (
        anthropic_start(input_tokens),
        sse({"type": "ping"}, "ping"),
        *anthropic_text_block(0, pieces),
        *anthropic_end("end_turn", output_tokens),
    )


def bench_stream(chunks: int) -> tuple[bytes, ...]:
    """The benchmark's recorded OpenAI stream: `chunks` content chunks of a few characters."""
    words = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.")
    return openai_text((words[index % len(words)] for index in range(chunks)), usage=(20, chunks))


def main(argv: list[str] | None = None) -> None:
    """Serve one recorded stream to every request until killed; print the port first."""
    parser = argparse.ArgumentParser(prog="python -m tests.providers.server")
    parser.add_argument("--openai-chunks", type=int, default=2000)
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="serve request after request on a connection, as a real upstream does",
    )
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = ProtocolServer(
            repeat=stream(bench_stream(args.openai_chunks)), keep_alive=args.keep_alive
        )
        async with anyio.create_task_group() as group:
            await server.start(group)
            print(server.port, flush=True)

    anyio.run(serve, backend="trio")


if __name__ == "__main__":
    main(sys.argv[1:])
