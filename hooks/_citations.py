"""`citations`: a stream transformer that reports the ``[n]`` markers of a reply.

The text passes through unchanged and at once: only a trailing ``[`` or ``[12`` that may
still become a marker is remembered (not held back), to be completed by the next chunk. So
a marker split across chunks is found, and the transformer adds no latency.
"""

import re
from typing import final

_MARKER = re.compile(r"\[([0-9]{1,6})\]")
# The start of a marker whose end has not arrived yet.
_OPEN = re.compile(r"\[[0-9]{0,6}")


@final
class CitationStream:
    """One attempt's markers, in order of appearance (repeats included)."""

    __slots__ = ("_found", "_open")

    def __init__(self) -> None:
        self._open = ""
        self._found: list[int] = []

    def feed(self, text: str) -> str:
        """Note the markers `text` completes; return it unchanged."""
        seen = self._open + text if self._open else text
        start = seen.rfind("[")
        if start < 0:
            self._open = ""
            return text
        self._found.extend(int(number) for number in _MARKER.findall(seen))
        tail = seen[start:]
        self._open = tail if _OPEN.fullmatch(tail) else ""
        return text

    def flush(self) -> str:
        """Forget an unfinished marker: the model call has ended."""
        self._open = ""
        return ""

    def annotations(self) -> tuple[int, ...]:
        return tuple(self._found)


@final
class Citations:
    """The factory `citations` returns; each call gives a fresh `CitationStream`."""

    __slots__ = ("name",)

    def __init__(self) -> None:
        self.name = "citations"

    def __call__(self) -> CitationStream:
        return CitationStream()

    def __repr__(self) -> str:
        return "citations()"


def citations() -> Citations:
    """A stream transformer factory reporting the reply's ``[n]`` citation markers.

    The markers land in ``Reply.annotations["citations"]`` as a tuple of ints in order of
    appearance, a marker cited twice appearing twice (``dict.fromkeys`` gives the distinct
    ones). A marker is ``[`` and one to six ASCII digits and ``]``, found even when the
    model's chunks split it. The text itself is not changed.
    """
    return Citations()
