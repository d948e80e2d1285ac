"""Hypothesis strategies shared by the redaction tests: texts made of given pieces, and the
ways of cutting a text into the chunks a model might stream."""

from itertools import pairwise

from hypothesis import strategies as st


@st.composite
def texts(
    draw: st.DrawFn, pieces: tuple[str, ...], *, max_pieces: int = 30, max_chars: int = 60
) -> str:
    """A text of whole `pieces`, or of their characters in any order."""
    alphabet = sorted(set("".join(pieces)))
    return draw(
        st.one_of(
            st.lists(st.sampled_from(pieces), max_size=max_pieces).map("".join),
            st.text(alphabet=alphabet, max_size=max_chars),
        )
    )


@st.composite
def chunkings(draw: st.DrawFn, text: str, *, max_cuts: int = 8) -> list[str]:
    """A split of `text` into chunks (empty chunks included), or one chunk per character."""
    if draw(st.booleans()):
        return list(text)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=max_cuts)))
    return [text[start:end] for start, end in pairwise([0, *cuts, len(text)])]
