"""hooks.redact on patterns of the form ``C+...``: ASCII text is redacted by splitting on a
derived pattern that only tries positions where a run of ``C`` starts. Whatever path a text
takes, the result must be `re.sub` of the pattern over the whole text, for any chunking.
"""

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import redact

from .text_strategies import chunkings, texts

MARK = "[REDACTED]"
EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # the benchmark's pattern


def through(factory, chunks) -> str:
    """Stream `chunks` through a fresh instance of `factory`, flush included."""
    stream = factory()
    return "".join(stream.feed(chunk) for chunk in chunks) + stream.flush()


def reference(pattern: str | re.Pattern[str], text: str) -> str:
    return re.compile(pattern).sub(lambda _: MARK, text)


# Each: a pattern and pieces whose concatenations make dense matches, runs of the leading
# class, matches side by side and matches ending inside a run.
RUN_CASES = {
    "e-mail": (
        EMAIL,
        ("jo", "a", ".", "+", "-", "_", "@", "x@y.z", "b.c", "c+", " ", ",", "\n", "1", "@x.io"),
    ),
    # "1-23-4": the first match ends inside the run "23", the second starts right after it.
    "a match ends inside a run": (r"\d+-\d", ("1", "23", "-", "4", "-5", " ", "x", "12-3")),
    "a literal run": (r"a+ba", ("a", "b", "ab", "aba", "aa", " ", "x")),
    "a negated class": (r"[^ @]+@x", ("a", "@", "x", "@x", " ", "b", "\n", ".")),
    "a possessive run": (r"[a-c]++d", ("a", "b", "c", "d", "abd", " ", "x")),
    "dot in the run": (r"[\w.]+@\w+", ("a", "b", ".", "@", "c@d", " ", "_", "1")),
    "a lookahead after the run": (r"\w+(?=!)", ("ab", "!", " ", "c", "!!", "a!")),
    "a lookahead reading on": (r"[a-z]+(?![a-z]*x)", ("ab", "x", " ", "c", "a")),
    "at least two": (r"[ab]{2,}c", ("a", "b", "c", "abc", "bc", " ", "x")),
    # Shapes the derived pattern must not be used for: the exact search decides them.
    "groups of its own": (r"\w+(\d)@\1", ("ab", "1", "2", "@", "@1", " ", "x")),
    "case-insensitive, a non-ASCII letter folding to an ASCII one": (
        re.compile(r"[\u017fa]+@x", re.IGNORECASE),
        ("s", "S", "a", "A", "@x", "@", "x", " ", "\u017f"),
    ),
    "a Unicode space class": (r"[\w\s]+@x", ("a", "\x1c", "\x1f", " ", "@x", "b", "\t")),
    "a lookbehind before the run": (r"b+(?<=ab)@x", ("a", "b", "@x", " ", "c", "ab")),
    "a word boundary": (r"[a-z]+\b@x", ("ab", "@x", " ", "1", "_", "c")),
    "a lazy run": (r"[a-z]+?x", ("ab", "x", " ", "xa", "c")),
    "a bounded run": (r"[a-z]{1,2}@x", ("abc", "a", "@x", " ", "b")),
}
RUN_PARAMS = [pytest.param(*case, id=name) for name, case in RUN_CASES.items()]


@pytest.mark.parametrize(("pattern", "pieces"), RUN_PARAMS)
@settings(max_examples=80)
@given(data=st.data())
def test_the_whole_text_redaction_is_re_sub(pattern, pieces, data):
    """Catches: the split path finding other matches than the standard engine (a match
    starting inside a run, one right after a match ending inside a run, a shape or flag for
    which the derived pattern is not equivalent), and a wrong redaction count."""
    text = data.draw(texts(pieces, max_pieces=40, max_chars=80), label="text")
    factory = redact(pattern, replacement=MARK)
    assert factory.redact_text(text) == reference(pattern, text)
    stream = factory()
    stream.feed(text)
    stream.flush()
    assert stream.annotations() == {"redactions": len(re.compile(pattern).findall(text))}


@pytest.mark.parametrize(("pattern", "pieces"), RUN_PARAMS)
@settings(max_examples=80)
@given(data=st.data())
def test_any_chunking_gives_re_sub_of_the_whole_text(pattern, pieces, data):
    """Catches: the split path losing the context before a stretch (a run that began in an
    earlier chunk, a lookbehind), or deciding a stretch whose last match runs on."""
    text = data.draw(texts(pieces, max_pieces=40, max_chars=80), label="text")
    chunks = data.draw(chunkings(text), label="chunks")
    assert through(redact(pattern, replacement=MARK), chunks) == reference(pattern, text)


def test_a_match_starting_where_the_last_one_ended_inside_a_run_is_redacted():
    """Catches: skipping a match that starts right after one ending inside a run of the
    leading class ("23": the first match ends after the 2, the next starts at the 3)."""
    factory = redact(r"\d+-\d", replacement=MARK)
    assert factory.redact_text("1-23-4 5") == f"{MARK}{MARK} 5"
    email = redact(EMAIL, replacement=MARK)
    assert email.redact_text("a@b.c+x@y.z, q@r.st.") == f"{MARK}{MARK}, {MARK}."


def test_a_match_inside_a_run_is_not_taken_when_one_starts_earlier_in_it():
    """Catches: a derived pattern that lets a match start inside a run (the engine's own
    leftmost match is the one at the run's start)."""
    assert redact(r"a+ba", replacement=MARK).redact_text("xaaaba aba") == f"x{MARK} {MARK}"


def test_unicode_spaces_in_the_ascii_range_are_read_as_in_unicode_mode():
    """Catches: compiling a pattern with ``\\s`` in ASCII mode, where 0x1C-0x1F are not
    spaces."""
    text = "a\x1cb@x"
    assert redact(r"[\w\s]+@x", replacement=MARK).redact_text(text) == MARK


def test_case_folding_of_a_non_ascii_letter_is_kept_on_ascii_text():
    """Catches: compiling a case-insensitive pattern in ASCII mode, where the long s no
    longer folds to "s"."""
    factory = redact(re.compile(r"[\u017f]+@x", re.IGNORECASE), replacement=MARK)
    assert factory.redact_text("s@x S@x") == f"{MARK} {MARK}"


def test_a_lookbehind_reads_the_text_released_before_the_stretch():
    """Catches: deciding a stretch sliced from the released context a lookbehind needs."""
    assert through(redact(r"b+(?<=ab)@x", replacement=MARK), ["a", "b@x "]) == f"a{MARK} "


def test_non_ascii_text_among_dense_matches_is_redacted_as_re_sub():
    """Catches: the ASCII-mode pattern being used on text with a non-ASCII word character."""
    text = "é@x.io jo@é.io, ñandu+1@correo.es a@b.c "
    assert redact(EMAIL, replacement=MARK).redact_text(text) == reference(EMAIL, text)


def long_text(seed: int, size: int) -> str:
    """`size` characters of words and addresses with no fixed period, some glued together."""
    rng = random.Random(seed)
    pieces = ["the", "refund", "a.b", "x-y", "jo.doe@example.com", "k@x.io", ",", " ", " "]
    out: list[str] = []
    length = 0
    while length < size:
        piece = rng.choice(pieces)
        out.append(piece)
        length += len(piece)
    return "".join(out)[:size]


@pytest.mark.parametrize("seed", range(4))
def test_long_text_is_redacted_a_block_at_a_time_as_re_sub(seed):
    """Catches: a block boundary cutting a match or its surroundings (the text is split a
    64 KiB block at a time, each ending after a space), in one chunk and in 4 KiB chunks."""
    text = long_text(seed, 300_000)
    factory = redact(EMAIL, replacement=MARK)
    expected = reference(EMAIL, text)
    assert factory.redact_text(text) == expected
    chunks = [text[start : start + 4096] for start in range(0, len(text), 4096)]
    assert through(factory, chunks) == expected
    assert through(factory, [text]) == expected


def test_a_long_stretch_without_a_space_is_one_block():
    """Catches: a block cut where there is no space (the blocks end after one only)."""
    text = ("a.b+c@x.io," * 8000) + " " + ("q-r@s.tu," * 9000)
    factory = redact(EMAIL, replacement=MARK)
    assert factory.redact_text(text) == reference(EMAIL, text)


def test_a_match_running_on_from_a_match_in_the_last_block_falls_back_to_the_exact_search():
    """Catches: keeping the blocks already split when a later block needs the exact
    search (its result would miss the match after "a@b.c")."""
    text = long_text(1, 200_000) + " a@b.c+x@y.z "
    factory = redact(EMAIL, replacement=MARK)
    assert factory.redact_text(text) == reference(EMAIL, text)
    assert factory.redact_text(text).endswith(f" {MARK}{MARK} ")
