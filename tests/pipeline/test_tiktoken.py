"""tiktoken_tokenizer: a budget counted by tiktoken, with an encoding built here (no download).

The encoding is a real `tiktoken.Encoding` with a small vocabulary: the 256 bytes, then the
merges he, ll, hell, hello. So "hellohellohello" is three tokens (each "hello" merges to one),
where the default estimate (characters / 4) says four; "world" is five (no merge applies).
"""

import pytest
import tiktoken

from pipeline import (
    Budget,
    ConfigError,
    InjectionOverflow,
    Pipeline,
    cont,
    hook,
    tiktoken_tokenizer,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Text, Turn

from .support import collect


@pytest.fixture(scope="module")
def small() -> tiktoken.Encoding:
    ranks = {bytes([byte]): byte for byte in range(256)}
    for rank, merged in enumerate((b"he", b"ll", b"hell", b"hello"), start=256):
        ranks[merged] = rank
    return tiktoken.Encoding(
        "small",
        pat_str=r"\S+|\s+",
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 260},
    )


def injecting(text):
    async def inject(turn):
        return cont(turn.inject(Text(text)))

    return hook(inject, name="inject")


async def test_a_budget_counts_injections_with_the_encoding(small):
    """Bug caught: the budget ignoring tiktoken_tokenizer's count (the estimate says 4 here,
    the encoding 3), or counting bytes or characters instead of tokens."""
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[injecting("hellohellohello")],
        budget=Budget(10_000, 2),
        tokenizer=tiktoken_tokenizer(small),
    )
    with pytest.raises(InjectionOverflow) as info:
        await pipe.run(Turn.start("hi"))
    assert (info.value.hook, info.value.tokens, info.value.reserve) == ("inject", 3, 2)


async def test_a_special_tokens_spelling_in_text_counts_as_its_characters(small):
    """Bug caught: counting with `encode`, which raises on text that spells a special token
    (a user pasting "<|endoftext|>"), failing the turn with a BudgetError."""
    assert small.encode_ordinary("<|endoftext|>") == list(b"<|endoftext|>")
    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[injecting("<|endoftext|> world")],
        budget=Budget(10_000, 100),
        tokenizer=tiktoken_tokenizer(small),
    )
    events, _ = await collect(pipe, Turn.start("hi"))
    # 13 bytes, no merge; one space; "world" in five bytes.
    assert [e.tokens for e in events if isinstance(e, ev.Injected)] == [13 + 1 + 5]


def test_an_unknown_encoding_is_a_config_error_naming_the_known_ones():
    """Bug caught: tiktoken's bare ValueError (or a download attempt) for a misspelt name."""
    with pytest.raises(ConfigError, match=r"no encoding 'o200k'.*'o200k_base'"):
        tiktoken_tokenizer("o200k")


@pytest.mark.parametrize("encoding", [None, 200_000, b"o200k_base"])
def test_an_encoding_of_another_type_is_a_config_error(encoding):
    """Bug caught: a non-name reaching tiktoken, which fails with an unrelated error."""
    with pytest.raises(ConfigError, match=r"an encoding's name or a tiktoken\.Encoding"):
        tiktoken_tokenizer(encoding)


def test_an_encoding_that_cannot_be_downloaded_is_a_config_error_saying_how_to_go_offline(
    tmp_path, monkeypatch
):
    """Bug caught: a raw requests error from deep in tiktoken when the machine has no network
    (here: an empty cache and a proxy that refuses connections), with no hint of the cache."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    with pytest.raises(
        ConfigError, match=r"could not load encoding 'cl100k_base'.*TIKTOKEN_CACHE_DIR"
    ):
        tiktoken_tokenizer("cl100k_base")
