"""What the ``turnplug`` commands print of text they did not write, in one place.

Models, tools, hooks, MCP servers and clients write text that reaches a terminal: a reply,
a halt's reason, an error's message, a conversation id. It is printed as written, except
what a terminal would act on rather than show, which is printed escaped, as Python writes
it in a string (``\\x1b``, ``\\x9b``, ``\\r``):

- control characters: C0 (ESC starts the sequences that clear the screen, set the title or
  the clipboard, or make a link), DEL, and C1 (U+009B is a CSI on its own, U+0085 a line
  break); a carriage return would draw over the line. Tab and line feed are kept in text of
  many lines (a reply), and a CRLF as the line break it is.
- lone surrogates (a ``\\ud800`` escape a client's JSON held), which UTF-8 cannot carry:
  writing one fails.

Format characters (a bidi override, a zero-width space) are printed as they are: a terminal
acts on none, and right-to-left text needs them; a line break ends what an override
reorders. `one_line` also escapes tab and Unicode's line separators, for what must stay one
line (an error, a table's cell). `pipeline.events.timeline` escapes as `one_line` does.
`json_text` writes JSON for programs, which may hold a lone surrogate only as an escape.

A standard output whose encoding cannot carry a character (``PYTHONIOENCODING=ascii``, a
Latin-1 terminal) shows it escaped as JSON writes it (``\\u2026``) while `escaping_unencodable`
holds it so, where writing it failed the command: an escape both a reader and a JSON parser read.
One that writes with ``surrogateescape`` (the C locale without UTF-8 mode) does so too, and
still writes a lone surrogate in U+DC80..U+DCFF as the byte it stands for.
"""

import codecs
import contextlib
import io
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

_OTHER_CONTROLS = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff"

_IN_TEXT = re.compile(f"[{_OTHER_CONTROLS}]|\r(?!\n)")
_IN_LINE = re.compile(f"[{_OTHER_CONTROLS}\n\r]")
_BREAKING = re.compile(f"[{_OTHER_CONTROLS}\t\n\r\u2028\u2029]")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(found: re.Match[str]) -> str:
    return found[0].encode("unicode_escape").decode("ascii")


def printable(text: str, *, breaks: bool = True) -> str:
    """`text` as a terminal may be sent it: with its tabs and line breaks (none with
    `breaks` false, for one line of a listing), every other control character and lone
    surrogate escaped."""
    pattern = _IN_TEXT if breaks else _IN_LINE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def one_line(text: str) -> str:
    """`text` with its line breaks, tabs, other control characters and lone surrogates
    escaped (``\\n``): a problem, or an error, is one line and cannot pass for others."""
    if _BREAKING.search(text) is None:
        return text
    return _BREAKING.sub(_escape, text)


def _json_escape(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: each character the encoding cannot carry as its JSON escape,
    UTF-16 code units (``\\u00e9``, ``\\ud83d\\ude00``), which JSON reads back, where
    Python's ``backslashreplace`` writes ``\\xe9``, which JSON does not."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    units = error.object[error.start : error.end].encode("utf-16-be", "surrogatepass")
    escaped = "".join(
        f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)
    )
    return escaped, error.end


def _json_escape_keeping_bytes(error: UnicodeError) -> tuple[str | bytes, int]:
    """`_json_escape` for an output that writes with ``surrogateescape``: a lone surrogate
    in U+DC80..U+DCFF is the byte it was decoded from (a file name, an argument in a
    locale's encoding) and is written as that byte, as ``surrogateescape`` writes it."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text, start = error.object, error.start
    end = start
    while end < error.end and "\udc80" <= text[end] <= "\udcff":
        end += 1
    if end > start:
        return bytes(ord(c) - 0xDC00 for c in text[start:end]), end
    while end < error.end and not "\udc80" <= text[end] <= "\udcff":
        end += 1
    return _json_escape(UnicodeEncodeError(error.encoding, text, start, end, error.reason))


_JSON_ESCAPE = "turnplug.json_escape"
_JSON_ESCAPE_KEEPING_BYTES = "turnplug.json_escape_keeping_bytes"
# Registered once, for the process: a codec looks its error handler up by name at each write.
codecs.register_error(_JSON_ESCAPE, _json_escape)
codecs.register_error(_JSON_ESCAPE_KEEPING_BYTES, _json_escape_keeping_bytes)
# The handlers that fail, each with the one `escaping_unencodable` sets in its place.
_TAKEN_OVER = {"strict": _JSON_ESCAPE, "surrogateescape": _JSON_ESCAPE_KEEPING_BYTES}


# The streams `escaping_unencodable` set to escape, each with how many blocks hold it so
# and the error handler it had: `hooks.cli.main` may run on several threads at once, and
# the first to end would otherwise set the stream back while the others still write to it.
_ESCAPING: dict[io.TextIOWrapper, tuple[int, str]] = {}
_ESCAPING_LOCK = threading.Lock()


@contextlib.contextmanager
def escaping_unencodable(stream: object) -> Iterator[None]:
    """Within the block, `stream` (standard output) writes what its encoding cannot carry
    escaped as JSON escapes it, rather than fail: text and JSON alike stay readable, and JSON
    valid. Its own error handler is back when the last block holding it ends (blocks on
    several threads may hold it at once): `hooks.cli.main` runs in a program of its own too,
    whose later output is that program's to encode."""
    if not isinstance(stream, io.TextIOWrapper):
        yield
        return
    with _ESCAPING_LOCK:
        count, own = _ESCAPING.get(stream, (0, str(stream.errors)))
        held = own in _TAKEN_OVER
        if held:
            if not count:
                stream.reconfigure(errors=_TAKEN_OVER[own])
            _ESCAPING[stream] = (count + 1, own)
    if not held:
        yield
        return
    try:
        yield
    finally:
        with _ESCAPING_LOCK:
            count, own = _ESCAPING[stream]
            if count > 1:
                _ESCAPING[stream] = (count - 1, own)
            else:
                del _ESCAPING[stream]
                # Reconfiguring flushes first. A stream that cannot flush (closed, its
                # reader gone) is left as it is: Python's own flush at exit then says so, as
                # it did before. One detached from its buffer (a hook that wrapped the
                # buffer anew) cannot even say whether it is closed.
                with contextlib.suppress(OSError, ValueError):
                    if not stream.closed and stream.errors == _TAKEN_OVER[own]:
                        stream.reconfigure(errors=own)


def encodes_utf8(stream: object) -> bool:
    """Whether `stream` writes UTF-8 (one that names no encoding is taken to)."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str):
        return True
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return True


def json_text(value: Any, *, indent: int | None = None, ascii_only: bool = False) -> str:
    """`value` as JSON, its text as written (JSON escapes the C0 controls), or with every
    non-ASCII character escaped when it holds a lone surrogate: UTF-8 cannot carry one,
    and its escape (``\\ud800``) still reads back as it was.

    `ascii_only` escapes every non-ASCII character, for an output that is not UTF-8 (a
    Latin-1 terminal): there the text as written would be bytes such as 0xE9, which a
    program reading JSON as UTF-8 (``jq``, ``json.loads`` on the bytes) refuses, where
    ASCII reads back the same in any of them."""
    if ascii_only:
        return json.dumps(value, indent=indent)
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    if _LONE_SURROGATE.search(text) is None:
        return text
    return json.dumps(value, indent=indent)
