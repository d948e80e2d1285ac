"""An incremental Server-Sent Events decoder that works on bytes.

It follows the WHATWG "event stream interpretation" rules. Lines are split on the bytes
``\\r\\n``, ``\\r`` and ``\\n`` *before* decoding: a multi-byte UTF-8 character may straddle two
network reads, and ``str.splitlines`` would also split on U+2028/U+2029, which are legal inside
JSON strings and do occur in model output. A ``\\r`` ending one read and a ``\\n`` starting the
next are one line end.

Decoding is linear in the input: the bytes of an unfinished line are kept in one growing
buffer and looked at again only once its line end arrives, so a line arriving in many reads
costs what it would cost in one. A line longer than `max_line_bytes` is refused
(`LineTooLong`) as soon as the buffer passes the cap, and so is an event whose data lines,
joined, pass it (`EventTooLong`): memory stays bounded by the cap whatever the server sends.
"""

import re
from typing import NamedTuple, final

_LINE_END = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff"
_CR = 0x0D
_LF = 0x0A

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
"""16 MiB: far above any event a model sends (a whole tool call's arguments fit in one), far
below what would exhaust a server's memory."""


class LineTooLong(ValueError):
    """A line grew past the decoder's cap before its line end arrived.

    Attributes:
        limit: The cap, in bytes.
        size: How many bytes of the line had arrived when it was refused.
    """

    def __init__(self, limit: int, size: int) -> None:
        super().__init__(
            f"an event-stream line is longer than max_line_bytes={limit} bytes"
            f" ({size} bytes arrived without a line end)"
        )
        self.limit = limit
        self.size = size


class EventTooLong(LineTooLong):
    """An event's data lines, joined, grew past the decoder's cap before the blank line that
    ends the event (many short ``data:`` lines are as unbounded as one long line).

    Attributes:
        limit: The cap, in bytes.
        size: How many bytes of data the event held when it was refused.
    """

    def __init__(self, limit: int, size: int) -> None:
        ValueError.__init__(
            self,
            f"an event-stream event's data is longer than max_line_bytes={limit} bytes"
            f" ({size} bytes of data lines arrived without the blank line that ends it)",
        )
        self.limit = limit
        self.size = size


class ServerSentEvent(NamedTuple):
    """One dispatched event (a named tuple: one is built per event of a model's stream, and
    a tuple is built in a C call, at about a third of an attrs record's cost).

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
    says: `close` reports nothing for it. It is kept, not dispatched, as `unterminated`: a
    provider whose protocol has an unambiguous end marker (``data: [DONE]``) may recognise a
    whole one there, where the body ended before the blank line after it.

    Args:
        max_line_bytes: The longest line accepted, in bytes (line end excluded); a longer
            one raises `LineTooLong`. It also caps an event's data (its ``data:`` lines
            joined, in UTF-8): a larger one raises `EventTooLong`.
    """

    __slots__ = (
        "_counted",
        "_data",
        "_event",
        "_id",
        "_limit",
        "_open",
        "_quarter",
        "_retry",
        "_size",
        "_skip_lf",
        "_started",
        "_tail",
        "unterminated",
    )

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._limit = max_line_bytes
        # Data of at most a quarter of the cap in characters is within it in UTF-8 bytes.
        self._quarter = max_line_bytes // 4
        self._open: list[str] = []  # the open event's data lines, as last measured
        self._counted = 0  # how many of them were measured
        self._size = 0  # their size joined, in bytes
        self._tail = bytearray()  # the unfinished line
        self._skip_lf = False
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._id = ""
        self._retry: int | None = None
        self.unterminated: ServerSentEvent | None = None
        """The event the body ended inside, once `close` was called: its data lines (the
        last one too when no line end followed it), not dispatched."""

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode one read of the body; return the events it completed, in order.

        Raises:
            LineTooLong: A line passed `max_line_bytes` (`EventTooLong`: an event's data).
        """
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:  # the LF of a CRLF whose CR ended the previous read
                chunk = chunk[1:]
                if not chunk:
                    return []
        has_cr = _CR in chunk
        last = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) if has_cr else chunk.rfind(b"\n")
        tail = self._tail
        if last < 0:  # still inside one line: keep it, look at it once its end arrives
            tail += chunk
            if len(tail) > self._limit:
                self._refuse(len(tail))
            return []
        end = last + 1
        rest = chunk[end:] if end < len(chunk) else b""
        if tail:
            # Complete the unfinished line in place: no copy of what arrived before.
            tail += chunk[:end] if rest else chunk
            head: bytes | bytearray = tail
            self._tail = bytearray()
        else:
            head = chunk[:end] if rest else chunk
        if rest:
            self._tail += rest
            if len(self._tail) > self._limit:
                self._refuse(len(self._tail))
        elif chunk[last] == _CR:
            self._skip_lf = True
        # Every line end is ASCII, so decoding the complete lines at once equals decoding
        # them one by one; splitting the text on CR/LF only never touches U+2028/U+2029.
        text = head.decode("utf-8", "replace")
        lines = _LINE_END.split(text) if has_cr else text.split("\n")
        lines.pop()  # the empty string after the last line end
        if len(head) > self._limit:
            longest = max(len(line.encode()) for line in lines)
            if longest > self._limit:
                self._refuse(longest)
        if not self._started:
            self._started = True
            if lines[0].startswith(_BOM):
                lines[0] = lines[0][1:]
        events: list[ServerSentEvent] = []
        emit, new, SSE = events.append, tuple.__new__, ServerSentEvent
        data = self._data
        quarter = self._quarter
        for line in lines:
            if line.startswith("data:"):
                # The hot path: nearly every line of a model's stream is a data line.
                data.append(line[6:] if line[5:6] == " " else line[5:])
            elif not line:
                if data:
                    text = "\n".join(data)
                    if len(text) > quarter:
                        # As for an event still open at the end of a read (below), so that
                        # the cap does not depend on how the body was cut into reads.
                        self._check_event(len(text.encode()))
                    emit(new(SSE, (self._event or "message", text, self._id, self._retry)))
                    data = self._data = []  # `_field` adds a bare "data" line to it
                self._event = ""
            else:
                self._field(line)
        if data:
            # An event still open: its data lines must stay under the cap too, or a server
            # that never sends the blank line would grow them without end.
            self._measure(data)
        return events

    def close(self) -> list[ServerSentEvent]:
        """Mark the end of the stream; an unterminated event is discarded (not dispatched),
        and kept as `unterminated`: its fields, the line the body ended in included.

        Raises:
            EventTooLong: The unterminated event's data, that last line included, passes
                `max_line_bytes`: it is held to the cap of an event the blank line ended.
        """
        if self._tail:  # the body ended inside a line: read it as the event's last line
            line = self._tail.decode("utf-8", "replace")
            if not self._started and line.startswith(_BOM):
                line = line[1:]
            if line:
                self._field(line)
        if self._data:
            text = "\n".join(self._data)
            if len(text) > self._quarter:
                # The same check as at the blank line: the earlier reads measured the data
                # without the line the body ended in, which may take it past the cap.
                self._check_event(len(text.encode()))
            self.unterminated = ServerSentEvent(
                self._event or "message", text, self._id, self._retry
            )
        self._tail = bytearray()
        self._data, self._open = [], []
        return []

    def _refuse(self, size: int) -> None:
        self._tail = bytearray()
        self._data = []
        raise LineTooLong(self._limit, size)

    def _measure(self, data: list[str]) -> None:
        """Add the lines of `data` not measured yet to the open event's size (each line is
        measured once, so an event arriving in many reads costs what it costs in one)."""
        if data is not self._open:  # another event than at the last measure
            self._open, self._counted, self._size = data, 0, -1  # n lines, n - 1 newlines
        size = self._size
        for index in range(self._counted, len(data)):
            line = data[index]
            size += 1 + (len(line) if line.isascii() else len(line.encode()))
        self._counted, self._size = len(data), size
        self._check_event(size)

    def _check_event(self, size: int) -> None:
        if size > self._limit:
            self._tail = bytearray()
            self._data, self._open = [], []
            raise EventTooLong(self._limit, size)

    def _field(self, line: str) -> None:
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
