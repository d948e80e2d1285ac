"""`redact`: the canonical stateful stream transformer.

How it knows what to hold back. Every pattern is analysed once, when the factory is built,
for its *alphabet*: the characters a match (or a lookaround inside it) can examine. A
character outside every pattern's alphabet is a *separator*: no match can contain it or look
past it. So when a chunk brings a separator, everything before it can be decided now, with
the standard `re` engine, and released; only the run of alphabet characters after the last
separator is held (for an e-mail pattern, the word being written). When a pattern can match
any character (``.`` with DOTALL, ``[^x]``), there are no separators, and text is released
once ``max_match`` characters follow it; likewise when a run without separators outgrows
``max_match``. Held text never exceeds ``max_match`` characters.

The law, checked by a property test: for any split of a text into chunks, the output equals
`redact_text` of the whole text, provided every match is shorter than ``max_match``.
"""

import importlib
import re
from collections.abc import Callable, Iterable
from typing import Any, final

from pipeline import ConfigError

# The standard library's own regex parser: the only complete reading of `re`'s syntax. It is
# private (``re._parser`` since 3.11), so it is reached dynamically and used read-only.
sre_parse: Any = importlib.import_module("re._parser")

_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
}

_LOOKBEHIND_CONTEXT = 1
_MEMO_LIMIT = 4096  # \b and \B look one character back


class _Unbounded(Exception):
    """The pattern can match any character: it has no separators."""


def _escape(code: int) -> str:
    return re.escape(chr(code))


def _class_item(op: Any, av: Any) -> str:
    name = str(op)
    if name == "LITERAL":
        return _escape(av)
    if name == "RANGE":
        return f"{_escape(av[0])}-{_escape(av[1])}"
    if name == "CATEGORY" and str(av) in _CATEGORIES:
        return _CATEGORIES[str(av)]
    raise _Unbounded


def _walk(
    items: Iterable[tuple[Any, Any]], dotall: bool, atoms: set[str], state: dict[str, int]
) -> None:
    """Collect a character class for every character the parsed pattern can examine."""
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            atoms.add(_escape(av))
        elif name == "NOT_LITERAL":
            atoms.add(f"[^{_escape(av)}]")
        elif name == "ANY":
            if dotall:
                raise _Unbounded
            atoms.add(r"[^\n]")
        elif name == "IN":
            negate = any(str(item_op) == "NEGATE" for item_op, _ in av)
            body = "".join(_class_item(o, a) for o, a in av if str(o) != "NEGATE")
            atoms.add(f"[{'^' if negate else ''}{body}]")
            if not negate and any(str(a) == "CATEGORY_WORD" for o, a in av if str(o) == "CATEGORY"):
                state["words"] = 1
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _walk(av[2], dotall, atoms, state)
        elif name == "SUBPATTERN":
            _group, add, remove, sub = av
            if add & re.IGNORECASE:
                state["ignorecase"] = 1
            scoped = (dotall or bool(add & re.DOTALL)) and not (remove & re.DOTALL)
            _walk(sub, scoped, atoms, state)
        elif name == "ATOMIC_GROUP":
            _walk(av, dotall, atoms, state)
        elif name == "BRANCH":
            for branch in av[1]:
                _walk(branch, dotall, atoms, state)
        elif name in ("ASSERT", "ASSERT_NOT"):
            direction, sub = av
            if direction < 0:
                state["behind"] = max(state["behind"], sub.getwidth()[1])
            _walk(sub, dotall, atoms, state)
        elif name == "GROUPREF_EXISTS":
            _cond, yes, no = av
            _walk(yes, dotall, atoms, state)
            if no is not None:
                _walk(no, dotall, atoms, state)
        elif name == "AT":
            # `$` also matches before a final newline: make the newline part of the alphabet,
            # so that a decided stretch never ends in one it could mistake for the end.
            if str(av) == "AT_END":
                atoms.add(r"\n")
        elif name == "GROUPREF":
            pass  # a backreference repeats characters already in the alphabet
        else:
            raise _Unbounded


def _required_char(pattern: re.Pattern[str]) -> str | None:
    """A character every match of `pattern` contains, if one is easy to see."""
    parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    if parsed.state.flags & re.IGNORECASE:
        return None
    items: list[tuple[Any, Any]] = list(parsed)
    while items:
        op, av = items.pop(0)
        name = str(op)
        if name == "LITERAL":
            return chr(av)
        if name == "SUBPATTERN" and not av[1] & re.IGNORECASE:
            items[:0] = list(av[3])
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and av[0] >= 1:
            items[:0] = list(av[2])
    return None


@final
class _Compiled:
    """The analysed patterns a `Redact` factory shares with its instances."""

    __slots__ = (
        "behind",
        "member",
        "patterns",
        "replacement",
        "required",
        "separators",
        "single_required",
        "space",
        "window",
        "words",
    )

    def __init__(
        self, patterns: tuple[re.Pattern[str], ...], replacement: str, window: int
    ) -> None:
        self.patterns = patterns
        self.replacement = replacement
        self.window = window
        state = {"behind": _LOOKBEHIND_CONTEXT, "ignorecase": 0, "words": 0}
        members: list[str] = []
        words = False
        try:
            for pattern in patterns:
                atoms: set[str] = set()
                state["ignorecase"] = state["words"] = 0
                parsed = sre_parse.parse(pattern.pattern, pattern.flags)
                flags = parsed.state.flags
                _walk(parsed, bool(flags & re.DOTALL), atoms, state)
                # Each pattern's characters are read with its own flags: case-insensitive
                # (anywhere in it: a superset is safe) and ASCII-only classes.
                scoped = ("i" if flags & re.IGNORECASE or state["ignorecase"] else "") + (
                    "a" if flags & re.ASCII else ""
                )
                members.append(
                    f"(?{scoped}:{'|'.join(sorted(atoms))})"
                    if scoped
                    else f"(?:{'|'.join(sorted(atoms))})"
                )
                # str.isalnum() implies \w only for Unicode \w ("alphanumeric or _").
                words = words or (bool(state["words"]) and not flags & re.ASCII)
            self.member: re.Pattern[str] | None = re.compile("|".join(members))
        except (_Unbounded, re.error, RecursionError):
            self.member = None
        self.separators: dict[str, bool] | None = {} if self.member is not None else None
        self.space = self.separators is not None and self.classify(" ")
        self.words = words and self.member is not None
        self.behind = max(state["behind"], _LOOKBEHIND_CONTEXT)
        # A character every match must contain, per pattern: a stretch without any of them
        # cannot hold a match, and a substring test is much cheaper than a search.
        required = [_required_char(pattern) for pattern in patterns]
        self.required: tuple[str, ...] | None = (
            tuple(c for c in required if c is not None) if None not in required else None
        )
        self.single_required = (
            self.required[0] if self.required is not None and len(self.required) == 1 else None
        )

    def classify(self, char: str) -> bool:
        """Whether `char` is a separator, remembered (the memo is bounded)."""
        assert self.member is not None
        assert self.separators is not None
        if len(self.separators) >= _MEMO_LIMIT:
            self.separators.clear()
        known = self.separators[char] = self.member.fullmatch(char) is None
        return known

    def could_match(self, text: str) -> bool:
        """False when `text` lacks a character every match needs."""
        required = self.required
        if required is None:
            return True
        return any(char in text for char in required)

    def search(self, text: str, pos: int) -> re.Match[str] | None:
        """The leftmost match of any pattern from `pos`; on a tie, the first pattern's."""
        patterns = self.patterns
        if len(patterns) == 1:
            return patterns[0].search(text, pos)
        best: re.Match[str] | None = None
        for pattern in patterns:
            found = pattern.search(text, pos)
            if found is not None and (best is None or found.start() < best.start()):
                best = found
        return best

    def replace(self, text: str, pos: int, end: int) -> tuple[str, int, int]:
        """Redact matches starting in ``text[pos:end]``.

        Returns the output, where it stopped (past `end` when a match ran over it) and the
        number of matches replaced.

        Matches are searched in all of `text` (so lookarounds see their surroundings), but
        only those starting before `end` are decided.
        """
        found = self.search(text, pos)
        if found is None or found.start() >= end:
            return text[pos:end], end, 0
        pieces: list[str] = []
        replacement = self.replacement
        count = 0
        while found is not None and found.start() < end:
            pieces.append(text[pos : found.start()])
            pieces.append(replacement)
            count += 1
            pos = found.end()
            if pos >= end:
                return "".join(pieces), pos, count
            found = self.search(text, pos)
        pieces.append(text[pos:end])
        return "".join(pieces), end, count


@final
class RedactStream:
    """One attempt's redaction state: released context and the undecided tail."""

    __slots__ = (
        "_behind",
        "_compiled",
        "_context",
        "_pending",
        "_required",
        "_window",
        "count",
        "feed",
    )

    def __init__(self, compiled: _Compiled) -> None:
        self._compiled = compiled
        self._context = ""  # the last released characters, for lookbehind and \b
        self._pending = ""  # text not decided yet (no separator in it)
        self.count = 0
        # Copied from the compiled patterns: read on every chunk.
        self._required = compiled.single_required
        self._window = compiled.window
        self._behind = compiled.behind
        self.feed: Callable[[str], str] = (
            self._feed_words if compiled.words and compiled.space else self._feed_any
        )
        """Take a chunk; return the text that can be released now."""

    def _feed_words(self, text: str) -> str:
        # `feed` when word characters are in the alphabet and the space is a separator:
        # the commonest chunks (words after a space; words alone) cost a few string methods.
        head, space, tail = text.rpartition(" ")
        if not tail or tail.isalnum():
            if not space:
                # Word characters alone: no separator, hold them.
                pending = self._pending = self._pending + text
                if len(pending) <= self._window:
                    return ""
                return self._release_window()
            decided = self._pending + head + space
            required = self._required
            if (
                required is not None
                and required not in decided
                and len(decided) >= self._behind
                and len(tail) <= self._window
            ):
                # Nothing up to the space can match: release it as it is. The context is
                # whatever string ends with the last released characters.
                self._pending = tail
                self._context = decided
                return decided
            return self._cut(text, len(head) + 1)
        return self._cut(text, self._last_separator(text))

    def _feed_any(self, text: str) -> str:
        if self._compiled.separators is None or not text:
            return self._hold(text)
        return self._cut(text, self._last_separator(text))

    def _cut(self, text: str, cut: int) -> str:
        """Decide the text up to `cut` in `text` (just after its last separator)."""
        if not cut:
            return self._hold(text)
        if cut == len(text):
            decided, rest = (self._pending + text if self._pending else text), ""
        else:
            decided, rest = self._pending + text[:cut], text[cut:]
        required = self._required
        if required is not None and required not in decided:
            # No match can be in it: release it as it is.
            self._pending = rest
            if len(decided) >= self._behind:
                self._context = decided
            else:
                self._context = (self._context + decided)[-self._behind :]
            out = decided
        else:
            out = self._decide(decided, rest)  # the slow path: a match is possible
        if len(rest) > self._window:
            return out + self._release_window()
        return out

    def _last_separator(self, text: str) -> int:
        """Just after the last separator in `text`; 0 when it has none."""
        compiled = self._compiled
        separators = compiled.separators
        assert separators is not None
        for index in range(len(text) - 1, -1, -1):
            char = text[index]
            known = separators.get(char)
            if known is None:
                known = compiled.classify(char)
            if known:
                return index + 1
        return 0

    def _hold(self, text: str) -> str:
        pending = self._pending = self._pending + text
        if len(pending) <= self._compiled.window:
            return ""
        return self._release_window()

    def flush(self) -> str:
        out = self._decide(self._pending, "") if self._pending else ""
        self._context = ""
        return out

    def annotations(self) -> dict[str, int]:
        return {"redactions": self.count}

    def _decide(self, decided: str, rest: str) -> str:
        """Redact `decided` (it ends at a separator, or at the end of the text) in full."""
        compiled = self._compiled
        context = self._context[-compiled.behind :]
        self._pending = rest
        if not compiled.could_match(decided):
            self._context = context + decided
            return decided
        text = context + decided
        out, _stop, count = compiled.replace(text, len(context), len(text))
        self.count += count
        self._context = text
        return out

    def _release_window(self) -> str:
        """More than a window held: decide the starts followed by ``max_match`` characters.

        A match shorter than ``max_match`` starting there ends at least two characters
        before the text that has arrived so far does, so no end anchor (``$`` also matches
        before a final newline) can mistake that for the end of the text.
        """
        compiled = self._compiled
        context = self._context[-compiled.behind :]
        text = context + self._pending
        start = len(context)
        limit = len(text) - compiled.window
        out, stop, count = compiled.replace(text, start, limit)
        self.count += count
        self._context = text[max(0, stop - compiled.behind) : stop]
        self._pending = text[stop:]
        return out


@final
class Redact:
    """The factory `redact` returns; each call gives a fresh `RedactStream`."""

    __slots__ = ("_compiled", "name")

    def __init__(self, compiled: _Compiled, name: str) -> None:
        self._compiled = compiled
        self.name = name

    def __call__(self) -> RedactStream:
        return RedactStream(self._compiled)

    def redact_text(self, text: str) -> str:
        """The redaction of a whole text at once: what the stream must add up to."""
        return self._compiled.replace(text, 0, len(text))[0]

    def __repr__(self) -> str:
        shown = ", ".join(repr(p.pattern) for p in self._compiled.patterns)
        return f"redact([{shown}], replacement={self._compiled.replacement!r})"


def redact(
    patterns: str | re.Pattern[str] | Iterable[str | re.Pattern[str]],
    *,
    replacement: str = "[REDACTED]",
    max_match: int = 256,
    name: str = "redact",
) -> Redact:
    """A stream transformer factory that replaces every match of `patterns`.

    A match that straddles chunk boundaries is still redacted; text that cannot be part of a
    match is released as soon as the chunk that proves it arrives. Held text never exceeds
    `max_match` characters.

    Args:
        patterns: One pattern or several (strings or compiled regexes). With several, the
            leftmost match wins, and on a tie the pattern listed first.
        replacement: The literal text put in place of each match.
        max_match: Matches shorter than this are redacted whatever the chunking; held text
            never exceeds it.
        name: The name its annotations and errors go under.

    Raises:
        ConfigError: A pattern does not compile, can match the empty string, or an option is
            out of range.
    """
    given: object = patterns  # callers without a type checker pass anything
    if isinstance(given, bytes | bytearray):
        raise ConfigError(
            f"redact pattern {patterns!r} is bytes; redaction works on text — pass a str"
        )
    if isinstance(patterns, str | re.Pattern):
        patterns = (patterns,)
    compiled: list[re.Pattern[str]] = []
    for index, pattern in enumerate(patterns, 1):
        if isinstance(pattern, re.Pattern):
            if not isinstance(pattern.pattern, str):
                raise ConfigError(
                    f"redact pattern {index} {pattern.pattern!r} is a bytes pattern; redaction"
                    " works on text — compile it from a str"
                )
            regex = pattern
        elif isinstance(pattern, str):
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    f"redact pattern {index} {pattern!r} does not compile: {exc}"
                ) from None
        else:
            raise ConfigError(
                f"redact pattern {index}: expected a string or compiled regex, got"
                f" {type(pattern).__name__} {pattern!r}"
            )
        if sre_parse.parse(regex.pattern, regex.flags).getwidth()[0] == 0:
            raise ConfigError(
                f"redact pattern {index} {regex.pattern!r} matches the empty string, so it"
                " would redact between every character — require at least one character"
            )
        compiled.append(regex)
    if not compiled:
        raise ConfigError("redact() needs at least one pattern")
    if not isinstance(replacement, str):
        raise ConfigError(f"redact(replacement=...) must be text, got {replacement!r}")
    if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
        raise ConfigError(f"redact(max_match=...) must be a positive int, got {max_match!r}")
    return Redact(_Compiled(tuple(compiled), replacement, max_match), name)
