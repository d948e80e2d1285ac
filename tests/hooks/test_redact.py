"""hooks.redact: stream redaction that adds up to the redaction of the whole text."""

import re
from typing import NamedTuple

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hooks import redact
from pipeline import ConfigError, HookFailed, Pipeline
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from tests.pipeline.support import collect_into
from turns import Turn

from .text_strategies import chunkings, texts

EMAIL = r"[\w.+-]+@[\w-]+\.[\w.-]+"
PHONE = r"\d{3}-\d{4}"
MARK = "[REDACTED]"


def through(factory, chunks) -> str:
    """Stream `chunks` through a fresh instance of `factory`, flush included."""
    stream = factory()
    return "".join(stream.feed(chunk) for chunk in chunks) + stream.flush()


# -- the law: any chunking adds up to the whole-text redaction ------------------------------


class Case(NamedTuple):
    """Patterns, an independent reference regex for them, and what texts are made of."""

    patterns: list
    reference: re.Pattern[str]
    pieces: tuple[str, ...]
    max_match: int = 256


CASES = {
    "email": Case(
        [EMAIL],
        re.compile(EMAIL),
        ("jo", "e", "@", "exa", "mple", ".", "com", "+", "-", "_", " ", ",", "\n", "é", "x@y.io"),
    ),
    "phone": Case(
        [PHONE], re.compile(PHONE), ("5", "55", "555", "-", "1234", "12", " ", "a", "\n")
    ),
    "phone, small window": Case(
        [PHONE],
        re.compile(PHONE),
        ("5", "55", "555", "-", "1234", "12", " ", "a", "\n"),
        max_match=9,
    ),
    "case-insensitive word": Case(
        [re.compile("secret", re.IGNORECASE)],
        re.compile("secret", re.IGNORECASE),
        ("se", "SE", "cR", "Cr", "et", "ET", "s", "e", "t", "\u017f", "x", " ", "\n"),
    ),
    "word boundary": Case(
        [r"\bcat\b"],
        re.compile(r"\bcat\b"),
        ("cat", "ca", "t", "c", "a", "s", "con", " ", "_", "1", ".", "é", "\n"),
    ),
    "word boundary, small window": Case(
        [r"\bcat\b"],
        re.compile(r"\bcat\b"),
        ("cat", "ca", "t", "c", "a", "s", "con", " ", "_", "1", ".", "é", "\n"),
        max_match=4,
    ),
    "lookbehind": Case(
        [r"(?<=id:)\d+"],
        re.compile(r"(?<=id:)\d+"),
        ("id:", "id", "i", "d", ":", "1", "23", " ", "x", "\n"),
    ),
    "lookbehind, small window": Case(
        [r"(?<=id:)\d{2}"],
        re.compile(r"(?<=id:)\d{2}"),
        ("id:", "id", "i", "d", ":", "1", "23", " ", "x", "\n"),
        max_match=3,
    ),
    "dot": Case([r"k.y"], re.compile(r"k.y"), ("k", "y", "ky", "e", "\n", " ", "x", ".")),
    "dotall": Case(
        [r"(?s)<.{1,3}>"],
        re.compile(r"<.{1,3}>", re.DOTALL),
        ("<", ">", "a", "\n", " ", "<a>", "bc"),
    ),
    "dotall, small window": Case(
        [r"(?s)<.{1,3}>"],
        re.compile(r"<.{1,3}>", re.DOTALL),
        ("<", ">", "a", "\n", " ", "<a>", "bc"),
        max_match=6,
    ),
    "negated class": Case(
        [r"[^\s@]+@x\.com"],
        re.compile(r"[^\s@]+@x\.com"),
        ("jo", "@", "x", ".", "com", "@x.com", " ", "\t", "\n", "é", "-"),
    ),
    "end anchor": Case([r"\d+$"], re.compile(r"\d+$"), ("1", "23", "\n", "\n\n", " ", "x")),
    "multiline anchor": Case(
        [re.compile(r"^pw: \w+", re.MULTILINE)],
        re.compile(r"^pw: \w+", re.MULTILINE),
        ("pw: ", "pw", ":", " ", "abc", "\n", "x", "p"),
    ),
    "several, leftmost wins": Case(
        [r"\d{4}", r"\+\d{2}-\d{4}"],
        re.compile(r"\d{4}|\+\d{2}-\d{4}"),
        ("+", "44", "-", "1234", "12", "4", " ", "x"),
    ),
    "several, tie goes to the first": Case(
        [r"\d{3}", PHONE, r"-\d{2}"],
        re.compile(r"\d{3}|\d{3}-\d{4}|-\d{2}"),
        ("5", "555", "-", "1234", "12", " ", "x"),
    ),
    "several, different alphabets": Case(
        [r"[a-z]+@[a-z]+\.com", r"\d{3} \d{4}"],
        re.compile(r"[a-z]+@[a-z]+\.com|\d{3} \d{4}"),
        ("jo", "@", "x", ".com", " ", "555", "1234", "12", "a", "\n", ","),
    ),
    "several, different alphabets, small window": Case(
        [r"[a-z]{1,2}@[a-z]\.com", r"\d{3} \d{4}"],
        re.compile(r"[a-z]{1,2}@[a-z]\.com|\d{3} \d{4}"),
        ("jo", "@", "x", ".com", " ", "555", "1234", "12", "a", "\n", ","),
        max_match=9,
    ),
    "one-character lookarounds": Case(
        [r"(?<![\w-])\d{3}-\d{2}(?![\w-])", r"(?<![\w.])[a-z]+(?!\w)@x"],
        re.compile(r"(?<![\w-])\d{3}-\d{2}(?![\w-])|(?<![\w.])[a-z]+(?!\w)@x"),
        ("123", "-", "45", "x", "-", "1", " ", "\n", "_", "ab", "@", "."),
    ),
    "a longer lookahead": Case(
        [r"\d+(?!\.\d)", r"[a-z]{2}"],
        re.compile(r"\d+(?!\.\d)|[a-z]{2}"),
        ("1", "23", ".", "4", " ", "x", "ab"),
    ),
    # Patterns whose first characters are rare in prose (digits, capitals) are ruled out
    # together by one search for any of them; the e-mail pattern is searched on its own.
    "several, rare first characters": Case(
        [r"\d{3}-\d{4}", r"[A-Z]{2}\d{2}", EMAIL],
        re.compile(rf"\d{{3}}-\d{{4}}|[A-Z]{{2}}\d{{2}}|{EMAIL}"),
        ("555", "-", "1234", "DE", "89", "jo", "@", "x", ".io", " ", "a", "\n", "A"),
    ),
    # Matches running up to and past the end of the stretch a full window decides.
    "short addresses, small window": Case(
        [r"[a-z]{1,3}@[a-z]{1,3}\.[a-z]{2,3}"],
        re.compile(r"[a-z]{1,3}@[a-z]{1,3}\.[a-z]{2,3}"),
        ("jo", "a", "@", "x", ".io", ".", "io", "r", "y@z.eu", " ", "\n"),
        max_match=12,
    ),
    # Matches of no fixed length, ended by an assertion on what follows, with runs longer
    # than the window: the window's release must not take the end of the text that has
    # arrived for the end of the text.
    "run before a word boundary, small window": Case(
        [r"[a-c]+\b", r"ab\d{3}"],
        re.compile(r"[a-c]+\b|ab\d{3}"),
        ("ab", "a", "b", "c", "y", "1", "123", " ", "\n"),
        max_match=6,
    ),
    "run before an end anchor, small window": Case(
        [r"\d+$"], re.compile(r"\d+$"), ("1", "23", "\n", "x", " "), max_match=4
    ),
    "run before a lookahead, small window": Case(
        [r"x+(?!y)", r"x\d{2}"],
        re.compile(r"x+(?!y)|x\d{2}"),
        ("x", "xx", "y", "1", "22", " "),
        max_match=5,
    ),
    "several, mixed case sensitivity": Case(
        [r"#[^a-z\s]+", re.compile("secret", re.IGNORECASE)],
        re.compile(r"#[^a-z\s]+|(?i:secret)"),
        ("#", "A", "B", "b", " ", "se", "CRET", "x", "1"),
    ),
}


CASE_PARAMS = [pytest.param(case, id=name) for name, case in CASES.items()]


@pytest.mark.parametrize("case", CASE_PARAMS)
@settings(max_examples=60)
@given(data=st.data())
def test_any_chunking_adds_up_to_the_whole_text_redaction(case: Case, data):
    """Catches: a window release taking the end of the text so far for the end of the text
    (``[a-c]+\\b`` redacting "ababab" of "abababy"), which texts longer than a small window
    with matches of no fixed length expose.
    """
    factory = redact(case.patterns, max_match=case.max_match)
    text = data.draw(texts(case.pieces), label="text")
    # The law holds when every match of the whole text is shorter than max_match.
    assume(all(len(found.group()) < case.max_match for found in case.reference.finditer(text)))
    chunks = data.draw(chunkings(text), label="chunks")
    assert through(factory, chunks) == factory.redact_text(text)


@pytest.mark.parametrize("case", CASE_PARAMS)
@settings(max_examples=30)
@given(data=st.data())
def test_the_whole_text_redaction_agrees_with_a_reference_substitution(case: Case, data):
    factory = redact(case.patterns, max_match=case.max_match)
    text = data.draw(texts(case.pieces), label="text")
    assert factory.redact_text(text) == case.reference.sub(lambda _: MARK, text)


def test_the_leftmost_match_wins_over_an_earlier_pattern():
    factory = redact([r"\d{4}", r"\+\d{2}-\d{4}"], replacement="#")
    assert factory.redact_text("call +44-1234") == "call #"


def test_on_a_tie_the_pattern_listed_first_wins():
    factory = redact([r"\d{3}", PHONE], replacement="#")
    assert factory.redact_text("555-1234") == "#-#4"


def test_a_case_sensitive_negated_class_next_to_a_case_insensitive_pattern():
    factory = redact([r"#[^a-z\s]+", re.compile("secret", re.IGNORECASE)], replacement="#")
    assert through(factory, ["#A", "B cd"]) == "# cd"


def test_an_ascii_negated_class_is_not_split_at_unicode_spaces():
    # Under re.ASCII, \s is ASCII whitespace only: an em space is part of [^\s@]+.
    factory = redact([re.compile(r"[^\s@]+@x\.com", re.ASCII)], replacement="#")
    assert through(factory, ["a\u2003", "b@x.com"]) == factory.redact_text("a\u2003b@x.com")


def test_a_word_boundary_is_judged_with_the_text_released_before_it():
    factory = redact(r"\bcat\b", replacement="#")
    assert through(factory, ["con", "cat cat"]) == "concat #"


def test_an_end_anchor_is_not_fooled_by_a_newline_at_the_end_of_a_chunk():
    factory = redact(r"\d+$", replacement="#")
    assert through(factory, ["pin 12\n", "x"]) == "pin 12\nx"


def test_an_end_anchor_in_the_fallback_mode_sees_the_real_end():
    # The match "ab" (2 characters) is shorter than max_match (3), so the law applies; the
    # whole text has no match, since "$" only matches before a final newline.
    factory = redact(r"(?s)a.$", replacement="#", max_match=3)
    assert through(factory, ["ab\n", "z"]) == "ab\nz"


# -- validated matches and computed replacements --------------------------------------------

EVEN = r"(?<!\d)\d{2,4}(?!\d)"


def even(match: re.Match[str]) -> bool:
    return int(match.group()) % 2 == 0


def test_a_match_the_validator_refuses_is_left_alone():
    factory = redact(EVEN, replacement="#", validate=even)
    assert factory.redact_text("codes 12 and 13 and 1000") == "codes # and 13 and #"


def test_after_a_refused_match_the_search_goes_on_from_the_next_character():
    # "13" is refused at 0; "31" (at 1) is refused; "12" at 2 is accepted.
    factory = redact(r"\d\d", replacement="#", validate=even)
    assert factory.redact_text("1312") == "13#"


def test_a_refused_match_lets_a_later_listed_pattern_win_the_position():
    # "1235" is refused as four digits; "12", at the same place, is accepted.
    factory = redact([r"\d{4}", r"\d{2}"], replacement="#", validate=even)
    assert factory.redact_text("1235") == "#35"


def test_a_computed_replacement_sees_the_match():
    factory = redact(r"\d+", replacement=lambda match: f"<{len(match.group())} digits>")
    assert through(factory, ["pin 12", "34 ok"]) == "pin <4 digits> ok"


@settings(max_examples=60)
@given(data=st.data())
def test_validated_redaction_obeys_the_chunking_law(data):
    factory = redact(
        [EVEN, r"[a-z]+@[a-z]+"],
        replacement=lambda match: f"<{match.group()[:1]}>",
        validate=lambda match: not match.group().isdigit() or even(match),
    )
    text = data.draw(texts(("1", "22", "333", "4444", " ", "-", "ab", "@", "c", "\n")))
    chunks = data.draw(chunkings(text), label="chunks")
    assert through(factory, chunks) == factory.redact_text(text)


def test_with_different_alphabets_only_the_word_being_written_is_held():
    # The digits pattern may hold spaces, the address pattern letters: each pattern's own
    # separators decide, not only the characters that no pattern may hold.
    stream = redact([r"[a-z]+@[a-z]+\.com", r"\d{3} \d{4}"])()
    assert stream.feed("write to jo") == "write to "
    assert stream.feed("e@x.com or 555 ") == f"{MARK} or"
    assert stream.feed("1234 now") == f" {MARK} "


async def test_a_computed_replacement_that_returns_no_text_fails_the_turn():
    pipe = Pipeline(
        model=ScriptedModel(["pin 1234"]),
        transformers=[redact(r"\d+", replacement=lambda match: None, name="pins")],  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(HookFailed) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.hook == "pins"
    assert "replacement" in str(info.value.__cause__)


async def test_a_replacement_returning_the_match_never_shows_it_in_the_error():
    """Bug caught: a computed replacement returning the `re.Match` had it quoted in the error
    and in the HookFailed event, so the very text redact was to remove was shown whole."""
    pipe = Pipeline(
        model=ScriptedModel(["code TK-4821 sent"]),
        transformers=[redact(r"TK-\d+", replacement=lambda found: found, name="codes")],  # type: ignore[arg-type,return-value]
    )
    seen: list[ev.Event] = []

    with pytest.raises(HookFailed) as info:
        await collect_into(seen, pipe, Turn.start("hi"))
    (failed,) = [event for event in seen if isinstance(event, ev.HookFailed)]
    shown = [str(info.value), str(info.value.__cause__), failed.error]
    assert failed.error == "TypeError"
    assert "Match" in str(info.value.__cause__)
    assert [text for text in shown if "4821" in text] == []


async def test_a_replacement_raising_with_the_match_never_shows_it_in_the_error():
    """Bug caught: a computed replacement raising KeyError(matched text) had the error and
    the HookFailed event quote its message, so the very text redact was to remove was shown."""
    aliases = {"555-1234": "[office]"}
    pipe = Pipeline(
        model=ScriptedModel(["call 555-9876 now"]),
        transformers=[redact(r"\d{3}-\d{4}", replacement=lambda found: aliases[found.group()])],
    )
    seen: list[ev.Event] = []

    with pytest.raises(HookFailed, match=r"'redact'.*raised KeyError in feed\(\)") as info:
        await collect_into(seen, pipe, Turn.start("hi"))
    (failed,) = [event for event in seen if isinstance(event, ev.HookFailed)]
    assert failed.error == "KeyError"
    assert "9876" not in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)  # kept for the caller's traceback


async def test_a_validator_that_raises_fails_the_turn():
    def broken(match: re.Match[str]) -> bool:
        raise ValueError("no")

    pipe = Pipeline(
        model=ScriptedModel(["pin 1234"]), transformers=[redact(r"\d+", validate=broken)]
    )
    with pytest.raises(HookFailed) as info:
        await pipe.run(Turn.start("hi"))
    assert isinstance(info.value.__cause__, ValueError)


# -- prompt release and held text -----------------------------------------------------------


def test_text_that_cannot_be_part_of_a_match_is_released_at_once():
    stream = redact(EMAIL)()
    assert stream.feed("hello ") == "hello "


def test_only_the_word_being_written_is_held_back():
    stream = redact(EMAIL)()
    assert stream.feed("write to jo") == "write to "


@pytest.mark.parametrize(
    ("chunks", "released"),
    [
        (["x,jo", "@y.io ok"], ["x,", f"{MARK} ", "ok"]),
        (["see (jo", "@y.io) ok"], ["see (", f"{MARK}) ", "ok"]),
        (["a jo@y", ".io;b", "c d"], ["a ", f"{MARK};", "bc ", "d"]),
        (["see [2]", " and"], ["see [2]", " ", "and"]),
        (["mail jo@y.io,", " ok"], [f"mail {MARK},", " ", "ok"]),
        (["jo@y", ".io,"], ["", f"{MARK},", ""]),
    ],
)
def test_after_a_separator_that_is_not_a_space_only_the_rest_is_held(chunks, released):
    """Catches: a chunk whose last word is cut by punctuation ("x,jo") held whole, or
    released one character past the punctuation (splitting the address that follows); a
    chunk ending in punctuation released whole while it, or the text held before it, holds
    an address."""
    stream = redact(EMAIL)()
    assert [stream.feed(chunk) for chunk in chunks] + [stream.flush()] == released


def test_held_text_is_decided_when_the_chunk_that_proves_it_arrives():
    stream = redact(EMAIL)()
    outputs = [
        stream.feed("write to jo"),
        stream.feed("e@example.com, thanks"),
        stream.flush(),
    ]
    assert outputs == ["write to ", f"{MARK}, ", "thanks"]


def test_a_phone_number_prefix_is_held_and_the_rest_released():
    stream = redact(PHONE)()
    assert stream.feed("call 555") == "call "


def test_a_negated_class_pattern_releases_at_whitespace():
    stream = redact(r"[^\s@]+@x\.com")()
    assert stream.feed("ask jo\tor an") == "ask jo\tor "


def test_in_the_fallback_mode_at_most_max_match_characters_are_held():
    stream = redact(r"(?s)<.{1,3}>", max_match=6)()
    out = stream.feed("0123456789")
    assert "0123456789".startswith(out)
    assert len("0123456789") - len(out) <= 6


def test_a_run_longer_than_the_window_is_not_redacted_for_a_boundary_at_its_end_so_far():
    """Catches: the window's release taking "ababab", the text so far, for a whole word."""
    factory = redact(r"[a-c]+\b", max_match=5)
    assert through(factory, list("abababy")) == "abababy"


def test_a_false_match_at_the_windows_end_does_not_swallow_a_real_one():
    """Catches: "[a-c]+\\b" matching at the end of the text so far and eating the "ab" of
    "ab123", whose rest then leaked."""
    factory = redact([r"[a-c]+\b", r"ab\d{3}"], max_match=6)
    assert through(factory, list("abababab123")) == "ababab" + MARK


def test_a_match_starting_past_a_full_window_waits_for_the_text_that_may_extend_it():
    """Catches: a window release deciding a match that starts after the stretch it
    decides ("joy@z.eu" before the "r" that makes it "joy@z.eur")."""
    factory = redact(r"[a-z]{1,3}@[a-z]{1,3}\.[a-z]{2,3}", max_match=12)
    assert through(factory, ["jojojojoy@z.eu", "r"]) == "jojojo" + MARK
    assert factory.redact_text("jojojojoy@z.eur") == "jojojo" + MARK


def test_held_text_does_not_exceed_max_match_after_a_separator():
    stream = redact(EMAIL, max_match=5)()
    out = stream.feed("x abcdefghijk")
    # Nothing in it can match (no "@"), so what is not released is held.
    assert "x abcdefghijk".startswith(out)
    assert len("x abcdefghijk") - len(out) <= 5


class Holding(NamedTuple):
    """A pattern with a same-length replacement, so held = fed - released."""

    pattern: str
    replacement: str
    pieces: tuple[str, ...]
    max_match: int


HOLDING = {
    "phone": Holding(PHONE, "#" * 8, ("5", "555", "-", "1234", " ", "a", "12345678"), 9),
    "email, no match possible": Holding(EMAIL, "#", ("jo", "e", ".", "com", " ", "\n", "-"), 7),
    "literal": Holding(r"(?s)<a>", "###", ("<", ">", "a", "\n", " ", "bc"), 5),
    "dotall fallback": Holding(r"(?s)<.>", "###", ("<", ">", "a", "\n", " ", "bc"), 5),
}


@pytest.mark.parametrize(
    "holding", [pytest.param(holding, id=name) for name, holding in HOLDING.items()]
)
@settings(max_examples=60)
@given(data=st.data())
def test_held_text_never_exceeds_max_match(holding: Holding, data):
    factory = redact(holding.pattern, replacement=holding.replacement, max_match=holding.max_match)
    text = data.draw(texts(holding.pieces), label="text")
    chunks = data.draw(chunkings(text), label="chunks")
    stream = factory()
    fed = released = 0
    for chunk in chunks:
        fed += len(chunk)
        released += len(stream.feed(chunk))
        assert fed - released <= holding.max_match


# -- flags and annotations ------------------------------------------------------------------


def test_a_compiled_patterns_flags_are_honoured():
    factory = redact(re.compile("secret", re.IGNORECASE))
    assert through(factory, ["my SeC", "rEt now"]) == f"my {MARK} now"


def test_a_multiline_anchor_matches_after_a_newline_in_an_earlier_chunk():
    factory = redact(re.compile(r"^pw: \w+", re.MULTILINE), replacement="#")
    assert through(factory, ["a\n", "pw: hunter2"]) == "a\n#"


def test_the_replacement_is_literal():
    factory = redact(PHONE, replacement=r"\g<0> \1")
    assert factory.redact_text("call 555-1234") == r"call \g<0> \1"


def test_annotations_count_the_redactions():
    stream = redact(EMAIL)()
    through_chunks = [stream.feed("a@b.co and x@"), stream.feed("y.io. "), stream.flush()]
    assert "".join(through_chunks) == f"{MARK} and {MARK} "
    assert stream.annotations() == {"redactions": 2}


def test_each_instance_counts_its_own_redactions():
    factory = redact(PHONE)
    first, second = factory(), factory()
    first.feed("555-1234 ")
    first.flush()
    assert (first.annotations(), second.annotations()) == ({"redactions": 1}, {"redactions": 0})


def test_the_factory_is_named_for_its_annotations():
    assert redact(PHONE).name == "redact"
    assert redact(PHONE, name="phones").name == "phones"


# -- configuration errors -------------------------------------------------------------------


def test_a_pattern_that_does_not_compile_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        redact([PHONE, r"(unclosed"])
    assert "(unclosed" in str(info.value)


def test_a_pattern_matching_the_empty_string_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        redact([PHONE, r"\d*"])
    assert r"\d*" in str(info.value)


@pytest.mark.parametrize("pattern", [r"\b", "(?=x)", "x?"])
def test_zero_width_patterns_are_refused(pattern):
    with pytest.raises(ConfigError, match=re.escape(repr(pattern))):
        redact(pattern)


@pytest.mark.parametrize(
    ("pattern", "everywhere"), [(r"\b", False), ("(?=x)", False), ("$", False), ("x?", True)]
)
def test_only_a_pattern_matching_at_every_place_is_said_to_redact_between_characters(
    pattern, everywhere
):
    """Bug caught: a pattern matching an empty place in some text only (a word boundary, a
    lookahead) was refused as one that "matches the empty string, so it would redact between
    every character"."""
    with pytest.raises(ConfigError, match="can match zero characters") as info:
        redact(pattern)
    assert ("redact between almost every character" in str(info.value)) is everywhere


def test_a_pattern_matching_at_every_place_of_any_text_but_the_empty_one_is_said_so():
    """Bug caught: a pattern matching at every place of a text but not in an empty text
    (``\\B|\\b``: Python's ``\\B`` matches no empty text) was not said to redact between
    characters, the empty text, with nothing to redact, being one of the texts tried."""
    with pytest.raises(ConfigError, match="redact between almost every character"):
        redact(r"\B|\b")


def test_a_compiled_bytes_pattern_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        redact([PHONE, re.compile(b"secret")])  # type: ignore[arg-type]
    assert "secret" in str(info.value)


def test_a_bytes_pattern_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        redact(b"secret")  # type: ignore[arg-type]
    assert "secret" in str(info.value)


def test_a_pattern_that_is_not_a_string_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        redact([PHONE, 12345])  # type: ignore[list-item]
    assert "12345" in str(info.value)


@pytest.mark.parametrize(
    ("options", "culprit"),
    [
        ({"replacement": lambda: "#"}, "redact(replacement="),
        ({"replacement": lambda match, extra: "#"}, "redact(replacement="),
        ({"validate": lambda: True}, "redact(validate="),
        ({"name": 123}, "redact(name=...) must be non-empty text, got 123"),
        ({"name": ""}, "redact(name=...) must be non-empty text, got ''"),
    ],
)
def test_bad_functions_and_names_are_refused_when_built(options, culprit):
    """Catches: a replacement or validator of the wrong arity accepted, then failing the
    turn at the first match; a name that is not text giving annotations another key."""
    with pytest.raises(ConfigError) as info:
        redact(r"\d{4}", **options)
    assert culprit in str(info.value)


def test_no_patterns_is_refused():
    with pytest.raises(ConfigError, match="pattern"):
        redact([])


@pytest.mark.parametrize("max_match", [0, -1, True, 2.5, "10", None])
def test_a_bad_max_match_is_refused(max_match):
    with pytest.raises(ConfigError) as info:
        redact(PHONE, max_match=max_match)
    assert "max_match" in str(info.value)
    assert repr(max_match) in str(info.value)


@pytest.mark.parametrize("replacement", [None, b"#", 0])
def test_a_bad_replacement_is_refused(replacement):
    with pytest.raises(ConfigError) as info:
        redact(PHONE, replacement=replacement)
    assert "replacement" in str(info.value)
    assert repr(replacement) in str(info.value)


@pytest.mark.parametrize("validate", [True, "even", 0])
def test_a_bad_validator_is_refused(validate):
    with pytest.raises(ConfigError) as info:
        redact(PHONE, validate=validate)
    assert "validate" in str(info.value)
    assert repr(validate) in str(info.value)


# -- in a pipeline --------------------------------------------------------------------------


async def test_a_match_split_across_chunks_is_redacted_in_the_reply_and_every_delta():
    pipe = Pipeline(
        model=ScriptedModel([["mail jo", "e@exa", "mple.com now"]]), transformers=[redact(EMAIL)]
    )
    async with pipe.stream(Turn.start("hi")) as events:
        seen = [event async for event in events]
    result = events.result
    texts_seen = [e.text for e in seen if isinstance(e, ev.TextDelta)]
    assert result.reply is not None
    assert result.reply.text == f"mail {MARK} now"
    assert "".join(texts_seen) == f"mail {MARK} now"
    for fragment in ("jo", "e@", "exa", "mple", "@", ".com"):
        assert all(fragment not in text for text in texts_seen), fragment


async def test_redactions_are_reported_in_the_reply_annotations():
    pipe = Pipeline(
        model=ScriptedModel([["mail jo", "e@exa", "mple.com now"]]),
        transformers=[redact(EMAIL, name="pii")],
    )
    result = await pipe.run(Turn.start("hi"))
    assert result.reply is not None
    assert result.reply.annotations == {"pii": {"redactions": 1}}


def test_redact_without_patterns_shows_how_to_pass_one():
    """Catches: a refusal that does not say what a pattern looks like."""
    with pytest.raises(ConfigError, match=r"redact\(\) needs at least one pattern") as excinfo:
        redact([])
    assert "e.g. redact(" in str(excinfo.value)


def test_the_example_pattern_in_the_refusal_is_written_as_python() -> None:
    """Catches: the example shown with a backslash before each of its quotes (a raw
    string keeps them), which is no Python a user can copy."""
    with pytest.raises(ConfigError) as excinfo:
        redact([])
    assert 'e.g. redact(r"\\d{3}-\\d{4}")' in str(excinfo.value)


@pytest.mark.parametrize("patterns", [3, None], ids=repr)
def test_patterns_that_are_neither_a_pattern_nor_a_list_raise_config_error(patterns) -> None:
    """Catches: ``redact(None)`` or ``redact(3)`` failing with a bare TypeError (``'int'
    object is not iterable``) instead of the ConfigError naming redact every factory's bad
    option gets."""
    with pytest.raises(ConfigError, match=r"redact\(patterns=\.\.\.\) takes a pattern"):
        redact(patterns)


@pytest.mark.parametrize("how", ["redact_text", "one chunk"])
def test_validate_is_asked_once_per_match(how):
    """Catches: a refused match put to the validator twice, and after it every accepted one
    (double the cost, and a user's validator with side effects run twice)."""
    asked: list[str] = []

    def odd_only(match: re.Match[str]) -> bool:
        asked.append(match.group())
        return match.group()[0] in "13579"

    text = "a 1111 2222 1111 3333 4444 b"
    factory = redact(r"\d{4}", validate=odd_only, max_match=8)
    if how == "redact_text":
        out = factory.redact_text(text)
    else:
        stream = factory()
        out = stream.feed(text) + stream.flush()

    assert out == "a [REDACTED] 2222 [REDACTED] [REDACTED] 4444 b"
    assert asked == ["1111", "2222", "1111", "3333", "4444"]
