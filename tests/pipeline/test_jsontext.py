"""Whether JSON's bytes escape a lone surrogate (pipeline/_jsontext.py)."""

import json

import pytest

from pipeline._jsontext import escapes_lone_surrogate

PAIRS = json.dumps({"t": [f"row {i} \U0001f600" for i in range(500)]})


@pytest.mark.parametrize(
    ("text", "lone"),
    [
        (PAIRS, False),
        (r'{"t": "pair \ud83d\ude00, \u00e9"}', False),
        (r'{"t": "PAIR \uD83D\uDE00"}', False),
        (r'{"t": "cut \ud83d"}', True),
        (r'{"t": "\ude00 cut"}', True),
        (r'{"t": "\uDE00 CUT"}', True),
        (r'{"t": "low \ude00, high \ud83d"}', True),
        (r'{"t": "two highs \ud83d\ud83d\ude00"}', True),
        (r'{"t": "\ud83d, a backslash: \\ude00"}', True),
        # An escaped backslash before a pair: no lone surrogate, but "read it to know".
        (r'{"t": "\\\ud83d\ude00"}', True),
    ],
    ids=[
        "pairs",
        "pair",
        "upper-pair",
        "high",
        "low",
        "upper-low",
        "swapped",
        "two-highs",
        "escaped-backslash",
        "backslash-then-pair",
    ],
)
def test_only_the_escape_of_a_lone_surrogate_is_told(text: str, lone: bool) -> None:
    """Bug caught: `turnplug serve` took any surrogate escape, a valid pair too (each emoji
    json.dumps writes), for one that may be alone, and walked the whole request body for it."""
    assert escapes_lone_surrogate(text.encode()) is lone
    if not lone:
        # A no is a promise: the JSON holds no lone surrogate.
        assert json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
