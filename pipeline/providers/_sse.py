"""An incremental Server-Sent Events decoder that works on bytes.

It follows the WHATWG "event stream interpretation" rules. Lines are split on the bytes
``\\r\\n``, ``\\r`` and ``\\n`` *before* decoding: a multi-byte UTF-8 character may straddle two
network reads, and ``str.splitlines`` would also split on U+2028/U+2029, which are legal inside
JSON strings and do occur in model output. A ``\\r`` ending one read and a ``\\n`` starting the
next are one line end.
"""

import re
from typing import final

import attrs

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff"


@final
@attrs.frozen
class ServerSentEvent:
    """One dispatched event.

    Attributes:
        event: The event type (``"message"`` unless an ``event:`` field named one).
        data: The ``data:`` lines joined with ``\\n``.
        id: The last event id seen (it persists across events, as the spec says).
        retry: The reconnection time in milliseconds, if a ``retry:`` field set one.
    """

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


@final
class SSEDecoder:
    """Feed it the body's bytes as they arrive; it returns the events completed so far.

    An event still open (no blank line yet) when the stream ends is discarded, as the spec
    says: `close` reports nothing for it.
    """

    __slots__ = ("_data", "_event", "_id", "_retry", "_skip_lf", "_started", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._skip_lf = False
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode one read of the body; return the events it completed, in order."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:  # the LF of a CRLF whose CR ended the previous read
                chunk = chunk[1:]
        buffer = self._tail + chunk if self._tail else chunk
        if b"\r" in buffer:
            lines = _LINE_END.split(buffer)
            self._skip_lf = buffer.endswith(b"\r")
        else:
            lines = buffer.split(b"\n")
        self._tail = lines.pop()
        events: list[ServerSentEvent] = []
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if not self._started:
                self._started = True
                if line.startswith(_BOM):
                    line = line[1:]
            self._line(line, events)
        return events

    def close(self) -> list[ServerSentEvent]:
        """Mark the end of the stream; an unterminated event is discarded."""
        self._tail = b""
        self._data = []
        return []

    def _line(self, line: str, events: list[ServerSentEvent]) -> None:
        if not line:
            if self._data:
                events.append(
                    ServerSentEvent(
                        self._event or "message", "\n".join(self._data), self._id, self._retry
                    )
                )
            self._data = []
            self._event = ""
            return
        if line[0] == ":":
            return  # a comment: keep-alives such as ": OPENROUTER PROCESSING"
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        # Any other field name is ignored, as the spec requires.
