"""`citations`: a stream transformer that reports the ``[n]`` markers of a reply.

The text passes through unchanged and at once: only a trailing ``[`` or ``[12`` that may
still become a marker is remembered (not held back), to be completed by the next chunk. So
a marker split across chunks is found, and the transformer adds no latency.
"""

from typing import final

_DIGITS = 6  # the most a marker holds


def _number(text: str) -> bool:
    """Whether `text` is what a marker holds: one to six ASCII digits."""
    return 0 < len(text) <= _DIGITS and text.isascii() and text.isdigit()


@final
class CitationStream:
    """One attempt's markers, in order of appearance (repeats included)."""

    __slots__ = ("_found", "_open")

    def __init__(self) -> None:
        self._open = ""
        self._found: list[int] = []

    def feed(self, text: str) -> str:
        """Note the markers `text` completes; return it unchanged."""
        if self._open:
            seen = self._open + text
        elif "[" not in text:
            return text
        else:
            seen = text
        # String methods rather than a regex: most chunks hold no bracket at all, and those
        # that do are short.
        found = self._found
        start = seen.find("[")
        while start >= 0:
            # A marker closes within `_DIGITS` + 1 characters: looking no further keeps a
            # run of brackets (``[[[[...]``) linear instead of rescanning it per bracket.
            end = start + _DIGITS + 2
            close = seen.find("]", start + 1, end)
            if close < 0:
                if end <= len(seen):  # no marker here, and none can complete it later
                    start = seen.find("[", start + 1)
                    continue
                last = seen.rfind("[")  # only the last can still become a marker
                digits = seen[last + 1 :]
                self._open = seen[last:] if not digits or _number(digits) else ""
                return text
            number = seen[start + 1 : close]
            if _number(number):
                found.append(int(number))
                start = seen.find("[", close + 1)
            else:
                start = seen.find("[", start + 1)
        self._open = ""
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
