"""Token budgets: counting what a turn sends and failing loudly when it does not fit."""

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, final

import attrs

from turns import Message, Part, Text, ToolCall, ToolResult

from ._errors import BudgetError, ConfigError
from ._hooks import callable_name

if TYPE_CHECKING:
    import tiktoken

Tokenizer: TypeAlias = Callable[[str], int]

CHARS_PER_TOKEN = 4
"""The default tokenizer's estimate: one token per four characters, rounded up.

Four characters per token is the usual rule of thumb for English text with OpenAI's and
Anthropic's tokenizers; it overestimates code and underestimates some other scripts. Pass a
real tokenizer (``tokenizer=``) where the budget must be exact.
"""

MESSAGE_OVERHEAD = 4
"""Tokens counted per message for the role and framing the providers add."""


def estimate_tokens(text: str) -> int:
    """The default tokenizer: ``ceil(len(text) / 4)``."""
    return -(-len(text) // CHARS_PER_TOKEN)


def tiktoken_tokenizer(encoding: "str | tiktoken.Encoding" = "o200k_base") -> Tokenizer:
    """A tokenizer that counts with tiktoken: ``pip install 'turnplug[tiktoken]'``.

    Args:
        encoding: An encoding's name (``"o200k_base"``, the GPT-4o family's; ``"cl100k_base"``,
            GPT-4's), or a ``tiktoken.Encoding`` — ``tiktoken.encoding_for_model(name)``
            gives a model's.

    Text is counted as text: a special token's spelling in a message (``<|endoftext|>``)
    counts as the tokens of its characters, never as a special token, and never fails.
    tiktoken downloads a named encoding the first time and caches it; a machine without
    network access needs ``TIKTOKEN_CACHE_DIR`` pointing at a folder that holds it.

    Raises:
        ConfigError: tiktoken is not installed, the encoding is unknown or cannot be loaded.
    """
    try:
        import tiktoken
    except ImportError:
        raise ConfigError(
            "tiktoken_tokenizer needs tiktoken: pip install 'turnplug[tiktoken]'"
        ) from None
    if isinstance(encoding, tiktoken.Encoding):
        loaded = encoding
    elif isinstance(encoding, str):
        known = tiktoken.list_encoding_names()
        if encoding not in known:
            raise ConfigError(
                f"tiktoken_tokenizer: tiktoken has no encoding {encoding!r};"
                f" it has {', '.join(map(repr, known))}"
            )
        try:
            loaded = tiktoken.get_encoding(encoding)
        except Exception as exc:
            raise ConfigError(
                f"tiktoken_tokenizer: tiktoken could not load encoding {encoding!r}:"
                f" {type(exc).__name__}: {exc} — it downloads an encoding once and caches"
                " it; without network access, set TIKTOKEN_CACHE_DIR to a folder that"
                " holds it"
            ) from exc
    else:
        raise ConfigError(
            "tiktoken_tokenizer(encoding=) takes an encoding's name or a tiktoken.Encoding,"
            f" not {type(encoding).__name__}"
        )
    encode = loaded.encode_ordinary

    def count(text: str) -> int:
        return len(encode(text))

    count.__qualname__ = count.__name__ = f"tiktoken_tokenizer({loaded.name!r})"
    return count


def part_tokens(part: Part, tokenizer: Tokenizer) -> int:
    """Tokens in one part: its text, a call's name and JSON arguments, a result's content."""
    if type(part) is Text:
        return tokenizer(part.text)
    if type(part) is ToolCall:
        return tokenizer(part.name) + tokenizer(json_text(part.arguments))
    if type(part) is ToolResult:
        return tokenizer(part.content)
    raise TypeError(f"not a part: {part!r}")


def parts_tokens(parts: Iterable[Part], tokenizer: Tokenizer) -> int:
    """Tokens in several parts."""
    return sum(part_tokens(part, tokenizer) for part in parts)


def message_tokens(messages: Iterable[Message], tokenizer: Tokenizer) -> int:
    """Tokens in messages: their parts plus `MESSAGE_OVERHEAD` per message."""
    return sum(MESSAGE_OVERHEAD + parts_tokens(m.parts, tokenizer) for m in messages)


def checked_tokenizer(tokenizer: object) -> Tokenizer:
    """The pipeline's counting function: `tokenizer`, checked once and guarded, or the default.

    A tokenizer that does not return an int for a probe text is a `ConfigError` when the
    pipeline is built; one that fails on some text later is a `BudgetError` naming it.
    """
    if tokenizer is None:
        return estimate_tokens
    if not callable(tokenizer):
        return estimate_tokens  # left to the pipeline's validator, which names tokenizer=
    name = callable_name(tokenizer)
    try:
        probe = tokenizer("turnplug counts tokens")
    except Exception as exc:
        raise ConfigError(
            f"Pipeline(tokenizer={name}) failed on a probe text: {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 0:
        raise ConfigError(
            f"Pipeline(tokenizer={name}) must count tokens: str -> int, but returned"
            f" {type(probe).__name__} {probe!r} — for tiktoken, pass"
            " lambda text: len(encoding.encode(text))"
        )

    def count(text: str) -> int:
        try:
            tokens = tokenizer(text)
        except Exception as exc:
            raise BudgetError(f"tokenizer {name} failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise BudgetError(f"tokenizer {name} returned {tokens!r}, not a token count")
        return tokens

    return count


def _check_positive(_instance: object, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"Budget.{attribute.name} must be a positive int, got {value!r}")


@final
@attrs.frozen
class Budget:
    """How many tokens a turn may send, and how many of them hooks may inject.

    Attributes:
        context_tokens: The most the rendered request may hold.
        injection_reserve: The most all of a turn's injections together may hold. History
            compaction (``compact=``) targets ``context_tokens - injection_reserve``.
    """

    context_tokens: int = attrs.field(validator=_check_positive)
    injection_reserve: int = attrs.field(validator=_check_positive)

    def __attrs_post_init__(self) -> None:
        if self.injection_reserve >= self.context_tokens:
            raise ConfigError(
                f"Budget.injection_reserve ({self.injection_reserve}) must be smaller than"
                f" context_tokens ({self.context_tokens}): the history needs room too"
            )

    @property
    def history_target(self) -> int:
        """The size compaction aims the history at."""
        return self.context_tokens - self.injection_reserve


def json_text(value: object) -> str:
    """`value` as JSON, read-only mappings included (the records' opaque values)."""
    return json.dumps(value, ensure_ascii=False, default=_plain)


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
