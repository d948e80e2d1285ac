"""hooks.citations: [n] markers reported as annotations, whatever the chunking."""

import re
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import CitationStream, citations
from pipeline import Pipeline, cont, regenerate
from pipeline.testing import ScriptedModel
from turns import Turn

MARKER = re.compile(r"\[([0-9]{1,6})\]")  # the documented marker, as an oracle


def fed(chunks) -> tuple[str, tuple[int, ...]]:
    stream = citations()()
    out = "".join(stream.feed(chunk) for chunk in chunks) + stream.flush()
    return out, stream.annotations()


def test_markers_are_reported_in_order_of_appearance_with_repeats():
    assert fed(["See [2] and [1], then [2] again."])[1] == (2, 1, 2)


def test_things_that_are_not_markers_are_not_reported():
    text = "[a] [1,2] [ 1 ] [] [1234567] x[0] [\u0661] [12]"  # an Arabic-Indic one
    assert fed([text])[1] == (0, 12)


def test_a_marker_split_across_chunks_is_found():
    assert fed(["refunds take 14 days[", "1", "2", "]. See [", "3]."])[1] == (12, 3)


def test_the_text_is_released_unchanged_and_at_once():
    stream = citations()()
    assert [stream.feed(chunk) for chunk in ["a [", "1", "] b"]] == ["a [", "1", "] b"]
    assert stream.flush() == ""


def test_an_unfinished_marker_is_forgotten_at_the_end_of_a_model_call():
    stream = citations()()
    stream.feed("see [1")
    stream.flush()
    stream.feed("]")
    assert stream.annotations() == ()


def test_each_call_of_the_factory_is_a_fresh_stream_named_citations():
    factory = citations()
    first, second = factory(), factory()
    first.feed("[1]")
    assert isinstance(first, CitationStream)
    assert (factory.name, first.annotations(), second.annotations()) == ("citations", (1,), ())


@st.composite
def split(draw) -> tuple[str, list[str]]:
    pieces = ("[", "]", "1", "23", "456", "x", " ", "[1]", "[12]", "1234567", "[[", "a")
    text = "".join(draw(st.lists(st.sampled_from(pieces), max_size=30)))
    if draw(st.booleans()):
        return text, list(text)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    return text, [text[start:end] for start, end in pairwise([0, *cuts, len(text)])]


@settings(max_examples=200)
@given(case=split())
def test_any_chunking_reports_the_markers_of_the_whole_text(case):
    text, chunks = case
    out, found = fed(chunks)
    assert out == text
    assert found == tuple(int(number) for number in MARKER.findall(text))


async def test_the_markers_land_in_the_reply_annotations():
    pipe = Pipeline(
        model=ScriptedModel([["Refunds take 14 days [", "1]; see [2", "] and [1]."]]),
        transformers=[citations()],
    )
    result = await pipe.run(Turn.start("refunds?"))
    assert result.reply is not None
    assert result.reply.annotations == {"citations": (1, 2, 1)}
    assert result.reply.text == "Refunds take 14 days [1]; see [2] and [1]."


async def test_a_rejected_attempts_markers_do_not_reach_the_accepted_reply():
    def no_three(turn):
        if 3 in turn.reply.annotations["citations"]:
            return regenerate("Source 3 is withdrawn; do not cite it.")
        return cont(turn)

    pipe = Pipeline(
        model=ScriptedModel([["See [3", "]."], "See [1]."]),
        transformers=[citations()],
        post=[no_three],
    )
    result = await pipe.run(Turn.start("sources?"))
    assert result.reply is not None
    assert result.reply.annotations == {"citations": (1,)}
    assert [rejection.text for rejection in result.rejections] == ["See [3]."]


class _ScannedText(str):
    """Text that counts the characters its searches look through: the work, untimed."""

    scanned = 0

    def find(self, sub, start=None, end=None):  # type: ignore[override]
        found = str.find(self, sub, start, end)
        first = 0 if start is None else start
        last = (len(self) if end is None else min(end, len(self))) if found < 0 else found + 1
        _ScannedText.scanned += max(0, last - first)
        return found


def test_a_run_of_brackets_is_read_in_linear_time():
    """Catches: each `[` of a chunk searched for its `]` up to the end of the chunk, so a
    reply of many brackets before one `]` cost the square of its length (a megabyte of
    them would hold the loop for tens of seconds)."""
    count = 2000
    _ScannedText.scanned = 0

    stream = citations()()
    stream.feed(_ScannedText("[" * count + "[7]"))

    assert (stream.annotations(), _ScannedText.scanned <= 20 * count) == ((7,), True)
