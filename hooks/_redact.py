"""`redact`: the canonical stateful stream transformer.

How it knows what to hold back. Every pattern is analysed once, when the factory is built,
for its *alphabet*: the characters a match (or a lookaround inside it) can examine. A
character outside every pattern's alphabet is a *separator*: no match can contain it or look
past it. So when a chunk brings a separator, everything before it can be decided now, with
the standard `re` engine, and released; only the run of alphabet characters after the last
separator is held (for an e-mail pattern, the word being written). When a pattern can match
any character (``.`` with DOTALL, ``[^x]``), there are no separators, and text is released
once ``max_match`` characters follow it; likewise when a run without separators outgrows
``max_match``. Held text never exceeds ``max_match`` characters. Such a release takes only
matches that two characters which have arrived follow, so that an end assertion (``\\b``,
``$``, a lookahead) never reads the end of the text so far as the end of the text; a match
running up to that end is not shorter than ``max_match``, and the law leaves it out.

Lookarounds: a lookbehind looks back into released text, kept as context for it, and a
one-character lookahead examines only the character after a match, which has arrived when
the match is decided; neither widens the alphabet. Several patterns each keep their own
alphabet: text is decided up to the point where every pattern has met one of its own
separators (for a card number, a letter; for an e-mail address, a space), and a match
starting before that point is decided with the text after it, up to its own separator.

A pattern may come with a validator (a match it refuses is passed over) and the replacement
may be computed from the match: both depend only on the match, so the law below still holds.

How a decided stretch is searched: from each pattern's required character (``@``) back to the
start of its word, then with the standard engine (`_Scan`). One pattern of the form ``C+...``
with a fixed replacement and no validator redacts ASCII text instead by one ``split`` of a
derived pattern, in C, that finds the same matches or reports that it cannot
(`_run_splitter`, where the rule is proved).

The law, checked by a property test: for any split of a text into chunks, the output equals
`redact_text` of the whole text, provided every match is shorter than ``max_match``.
"""

import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias, final

from pipeline import ConfigError

from ._ask import check_callable, check_text

# The standard library's own regex parser: the only complete reading of `re`'s syntax. It is
# private (``re._parser`` since 3.11), so it is reached dynamically and used read-only.
sre_parse: Any = importlib.import_module("re._parser")


def matches_empty(regex: "re.Pattern[str]") -> bool:
    """Whether `regex` can match zero characters: the empty string, or an empty place in a
    text (``(?=password)``, ``(?<=key=)\\w*``)."""
    return bool(sre_parse.parse(regex.pattern, regex.flags).getwidth()[0] == 0)


# Texts a pattern that can match zero characters is tried on, to tell whether it matches in
# (almost) every text (``x*``, ``$``) or only in some (``(?=password)``, ``(?m)^$``, ``\\b``).
# Four texts cannot show it matches in every one (``^(?!zzz)``), so what it would do is hedged.
_PROBES = ("", "a", "ab\n cd", "key=password")


def zero_width(regex: "re.Pattern[str]", *, deny: bool) -> str | None:
    """Why `regex` is refused as a deny pattern (`deny`) or a redaction's, or None when it
    cannot match zero characters. What it would do is said only when the probes show it:
    a deny pattern found in each probe would reject almost any reply; a redaction's matching
    at each place of each probe (but the empty one, which has nothing to redact) would redact
    between almost every character."""
    if not matches_empty(regex):
        return None
    if deny:
        everywhere = all(regex.search(text) for text in _PROBES)
        consequence = "reject almost any reply"
    else:
        everywhere = all(
            regex.match(text, place) for text in _PROBES if text for place in range(len(text) + 1)
        )
        consequence = "redact between almost every character"
    return (
        "can match zero characters (an empty place in the text)"
        + (f", so it would {consequence}" if everywhere else "")
        + " — require at least one character"
    )


_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
}

_LOOKBEHIND_CONTEXT = 1
_SPLIT_BLOCK = 1 << 16  # characters `_Compiled._replace_split` hands the engine at a time
_CUT_SCAN = 64  # characters `RedactStream._last_cut` reads one by one before searching
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
                # A lookbehind looks back into text already decided, which is kept as
                # context for it: its characters need not be in the alphabet.
                state["behind"] = max(state["behind"], sub.getwidth()[1])
            elif sub.getwidth()[1] > 1 or _anchored(sub):
                # A longer lookahead can look past a separator; one of a single character
                # examines only the character after it, and a match never runs past a
                # separator, so that character has arrived whenever the match is decided.
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


def _anchored(items: Iterable[tuple[Any, Any]]) -> bool:
    """Whether parsed items hold an anchor (``$``, ``\\b``...), which may look at the end."""
    for op, av in items:
        name = str(op)
        if name == "AT":
            return True
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and _anchored(av[2]):
            return True
        if name == "SUBPATTERN" and _anchored(av[3]):
            return True
        if name == "BRANCH" and any(_anchored(branch) for branch in av[1]):
            return True
        if name in ("ASSERT", "ASSERT_NOT") and _anchored(av[1]):
            return True
        if name == "ATOMIC_GROUP" and _anchored(av):
            return True
        if name == "GROUPREF_EXISTS" and (
            _anchored(av[1]) or (av[2] is not None and _anchored(av[2]))
        ):
            return True
    return False


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
        elif name == "ATOMIC_GROUP":
            items[:0] = list(av)
    return None


Replacement: TypeAlias = str | Callable[[re.Match[str]], str]
"""Literal text, or a function computing the text that replaces a match."""

Validator: TypeAlias = Callable[[re.Match[str]], bool]
"""Decides whether a match is redacted (e.g. a Luhn check on a card number)."""


def _alphabet(pattern: re.Pattern[str], state: dict[str, int]) -> tuple[str, bool]:
    """A regex for one character of `pattern`'s alphabet, and whether `\\w` is in it.

    Raises:
        _Unbounded: The pattern can match any character.
    """
    atoms: set[str] = set()
    state["ignorecase"] = state["words"] = 0
    parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    flags = parsed.state.flags
    _walk(parsed, bool(flags & re.DOTALL), atoms, state)
    # Each pattern's characters are read with its own flags: case-insensitive (anywhere in
    # it: a superset is safe) and ASCII-only classes.
    scoped = ("i" if flags & re.IGNORECASE or state["ignorecase"] else "") + (
        "a" if flags & re.ASCII else ""
    )
    body = "|".join(sorted(atoms))
    # str.isalnum() implies \w only for Unicode \w ("alphanumeric or _").
    words = bool(state["words"]) and not flags & re.ASCII
    return (f"(?{scoped}:{body})" if scoped else f"(?:{body})"), words


def _first_chars(items: Iterable[tuple[Any, Any]]) -> tuple[set[str], bool] | None:
    """The class bodies a match of the parsed items can start with, and whether they can
    match nothing at all; None when that is not easy to see (the search then tries every
    position).
    """
    bodies: set[str] = set()
    for op, av in items:
        name = str(op)
        if name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue  # zero-width: the first character is consumed after it
        if name == "LITERAL":
            bodies.add(_escape(av))
            return bodies, False
        if name == "IN":
            if any(str(item_op) == "NEGATE" for item_op, _ in av):
                return None
            try:
                bodies.add("".join(_class_item(o, a) for o, a in av))
            except _Unbounded:
                return None
            return bodies, False
        if name == "SUBPATTERN":
            if av[1] & re.IGNORECASE or av[2] & re.IGNORECASE:
                return None
            found = _first_chars(av[3])
        elif name == "BRANCH":
            found = bodies, False
            for branch in av[1]:
                inner = _first_chars(branch)
                if inner is None:
                    return None
                bodies |= inner[0]
                found = bodies, found[1] or inner[1]
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            inner = _first_chars(av[2])
            found = None if inner is None else (inner[0], inner[1] or av[0] == 0)
        else:
            return None
        if found is None:
            return None
        bodies |= found[0]
        if not found[1]:
            return bodies, False
    return bodies, True


def _leading_run(items: list[tuple[Any, Any]]) -> str | None:
    """The class `C`, as a regex, when the parsed pattern starts with ``C+`` (greedy or
    possessive, at least once, unbounded): a match then holds the whole rest of the run of
    `C` characters before it, so no leftmost match starts inside a run.
    """
    if not items:
        return None
    op, av = items[0]
    if str(op) not in ("MAX_REPEAT", "POSSESSIVE_REPEAT"):
        return None
    low, high, body = av
    if low < 1 or high != sre_parse.MAXREPEAT or len(body) != 1:
        return None
    item_op, item = body[0]
    name = str(item_op)
    if name == "LITERAL":
        return _escape(item)
    if name == "NOT_LITERAL":
        return f"[^{_escape(item)}]"
    if name == "IN":
        negate = any(str(o) == "NEGATE" for o, _ in item)
        try:
            inner = "".join(_class_item(o, a) for o, a in item if str(o) != "NEGATE")
        except _Unbounded:
            return None
        return f"[{'^' if negate else ''}{inner}]"
    return None


def _context_free(items: Iterable[tuple[Any, Any]]) -> bool:
    """Whether the parsed items read only the text from where a match starts to the end,
    the same way in Unicode and in ASCII mode on ASCII text: no anchor or ``\\b`` and no
    lookbehind (they read before the start), no group reference, no case-insensitive part
    (a non-ASCII letter in the pattern can fold to an ASCII one) and no ``\\s`` or ``\\S``
    (Unicode's ``\\s`` also holds the ASCII characters 0x1C-0x1F).
    """
    for op, av in items:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL", "ANY"):
            continue
        if name == "IN":
            if any(str(a) in ("CATEGORY_SPACE", "CATEGORY_NOT_SPACE") for _, a in av):
                return False
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if not _context_free(av[2]):
                return False
        elif name == "SUBPATTERN":
            if av[1] & re.IGNORECASE or not _context_free(av[3]):
                return False
        elif name == "ATOMIC_GROUP":
            if not _context_free(av):
                return False
        elif name == "BRANCH":
            if not all(_context_free(branch) for branch in av[1]):
                return False
        elif name in ("ASSERT", "ASSERT_NOT"):
            if av[0] < 0 or not _context_free(av[1]):
                return False
        else:  # AT, GROUPREF, GROUPREF_EXISTS, anything new
            return False
    return True


def _run_splitter(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """A pattern whose ``split`` finds `pattern`'s matches in ASCII text, in C, or None.

    For a pattern ``C+R`` (see `_leading_run`) matching at a position inside a run of `C`
    characters, it also matches one character earlier (one more ``C``, the same `R` at the
    same place), so scanning left to right, a leftmost match starts where a run starts:
    ``(?<!C)`` lets the engine leave every other position after one character's test
    instead of trying the pattern there. One case escapes that: a match that ends inside a
    run, where the next match may start at once (``a@b.c+x@y.z``); the trailing group is
    set exactly then (the character before is a `C`, and the pattern matches after it), and
    the caller falls back to the exact search. `_context_free` makes the ASCII-mode
    compilation equivalent on ASCII text, and slicing the text at the search's start
    harmless. None when the pattern has another shape, or groups of its own.
    """
    parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    flags = parsed.state.flags
    if pattern.groups or flags & (re.IGNORECASE | re.VERBOSE):
        return None
    items: list[tuple[Any, Any]] = list(parsed)
    run = _leading_run(items)
    if run is None or not _context_free(items):
        return None
    body = pattern.pattern
    try:
        splitter = re.compile(
            f"(?<!{run})(?:{body})(?:(?={run})((?<={run})(?=(?:{body})))|)",
            (flags & (re.MULTILINE | re.DOTALL)) | re.ASCII,
        )
    except (re.error, RecursionError):
        return None
    return splitter if splitter.groups == 1 else None


_SETTLED_AHEAD = 2  # characters after a match that its end assertions may read
_GLOBAL_FLAGS = re.compile(r"\A(?:\(\?[aiLmsux]+\))+")


def _settled(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """`pattern` matching only where `_SETTLED_AHEAD` characters follow the match, or None.

    Groups keep their numbers and names; leading global flags move to the flags argument.
    """
    body = _GLOBAL_FLAGS.sub("", pattern.pattern)
    end = "\n)" if pattern.flags & re.VERBOSE else ")"  # a trailing comment ends at "\n"
    try:
        return re.compile(f"(?:{body}{end}(?=[\\s\\S]{{{_SETTLED_AHEAD}}})", pattern.flags)
    except (re.error, RecursionError):
        return None


# Characters ordinary prose is made of: a first-character class holding none of them is rare
# enough in text to be worth looking for on its own.
_PROSE = "etaoinsrhldcumfpgwybvk "


@final
class _Scan:
    """How one pattern is searched for, from what its analysis proves.

    A match starts with a character of its first-character class (`first`), contains its
    required character (`required`), and consists of characters of its alphabet, so that no
    match starts before the last character outside the alphabet ahead of the next required
    character (`run_start` finds it, scanning backwards in C). Each shortcut skips only
    positions where the pattern cannot match: the search finds what ``pattern.search``
    finds, in time proportional to the stretches where a match is possible.
    """

    __slots__ = (
        "first",
        "pattern",
        "required",
        "run_start",
        "settled",
        "spaced",
        "splitter",
        "validate",
    )

    def __init__(self, pattern: re.Pattern[str], validate: Validator | None = None) -> None:
        self.pattern = pattern
        self.settled = _settled(pattern)
        self.validate = validate  # None: every match of this pattern is redacted
        self.required: str | None = None
        self.run_start: re.Pattern[str] | None = None
        self.spaced = False  # the space is outside the alphabet: a match never holds one
        required = _required_char(pattern)
        if required is not None:
            try:
                alphabet, _words = _alphabet(pattern, {"behind": 0, "ignorecase": 0, "words": 0})
                self.run_start = re.compile(rf"(?s:.*)(?!{alphabet})(?s:.)")
                self.spaced = re.fullmatch(alphabet, " ") is None
                self.required = required
            except (_Unbounded, re.error, RecursionError):
                pass
        self.first: re.Pattern[str] | None = None
        try:
            self.splitter = _run_splitter(pattern)
        except RecursionError:
            self.splitter = None
        parsed = sre_parse.parse(pattern.pattern, pattern.flags)
        try:
            first = _first_chars(parsed)
        except RecursionError:
            first = None
        if first is not None and first[0] and not first[1]:
            flags = parsed.state.flags & (re.IGNORECASE | re.ASCII)
            try:
                candidate = re.compile(f"[{''.join(sorted(first[0]))}]", flags)
            except re.error:
                candidate = None
            if candidate is not None and candidate.search(_PROSE) is None:
                self.first = candidate

    def next(self, text: str, pos: int, window: int = 0) -> re.Match[str] | None:
        """The leftmost match from `pos` that `validate` accepts, as ``pattern.search``.

        With a `window` (`text` is the start of a text still arriving), the leftmost match
        that later text cannot change instead (see `_settle`): a match whose end could be
        told apart from the end of `text` by what follows (``\\b``, ``$``, a lookahead at
        the end of `text`) is not one.
        """
        validate = self.validate
        pattern = self.pattern
        required = self.required
        first = self.first
        while True:
            start = pos
            if required is not None:
                at = text.find(required, pos)
                if at < 0:
                    return None
                if at > pos:
                    # A match holding the character at `at` starts after the last character
                    # before it that no match can hold (a space, mostly: found fastest).
                    space = text.rfind(" ", pos, at) if self.spaced else -1
                    if space >= 0:
                        start = space + 1
                    else:
                        assert self.run_start is not None
                        run = self.run_start.match(text, pos, at)
                        if run is not None:
                            start = run.end()
            if first is not None:
                candidate = first.search(text, start)
                if candidate is None:
                    return None
                start = candidate.start()
            # With a window, matches are searched in bounded blocks: a search running to the
            # end of `text` from every match would make a long run cost its square.
            found = self._settle(text, start, window) if window else pattern.search(text, start)
            if found is None:
                return None
            if validate is None or validate(found):
                return found
            # Refused matches come one after another in text of look-alikes (IBAN-shaped
            # codes): the next is searched for at once, without the shortcuts above, and each
            # candidate is put to `validate` once.
            while True:
                pos = found.start() + 1
                if required is not None and text.find(required, pos) < 0:
                    return None
                found = pattern.search(text, pos)
                if found is None:
                    return None
                if window and found.end() > len(text) - _SETTLED_AHEAD:
                    found = self._settle(text, found.start(), window)
                    if found is None:
                        return None
                if validate(found):
                    return found

    def _settle(self, text: str, pos: int, window: int) -> re.Match[str] | None:
        """The leftmost match from `pos` that later text cannot change, or one that is not
        shorter than `window` in the whole text either (the chunking law leaves those out).

        `settled` matches only where two characters follow the match, so every end
        assertion reads real text; each search is bounded to the text a match shorter than
        `window` starting in its first `window` positions (and its lookahead) can read, so
        a long run costs time in proportion to its length times `window`, not its square.
        """
        settled = self.settled
        if settled is None:
            return self.pattern.search(text, pos)  # no settled form: the match as found
        size = len(text)
        while pos < size:
            found = settled.search(text, pos, min(size, pos + 2 * window + _SETTLED_AHEAD))
            if found is not None and found.start() < pos + window:
                return found
            pos += window
        return None


@final
class _Compiled:
    """The analysed patterns a `Redact` factory shares with its instances."""

    __slots__ = (
        "alphabets",
        "behind",
        "common",
        "crossing",
        "cuts",
        "full",
        "labels",
        "last_separator",
        "masks",
        "member",
        "patterns",
        "rare",
        "replacement",
        "required",
        "scans",
        "separators",
        "single_required",
        "space",
        "spaced",
        "split",
        "split_literal",
        "substitute",
        "validate",
        "window",
        "words",
    )

    def __init__(
        self,
        patterns: tuple[re.Pattern[str], ...],
        replacement: Replacement,
        window: int,
        validate: Validator | None = None,
        labels: Mapping[re.Pattern[str], str] | None = None,
        checks: Mapping[re.Pattern[str], Validator | None] | None = None,
    ) -> None:
        self.patterns = patterns
        # A literal replacement per pattern, for a computed `replacement` that depends on the
        # pattern alone (`pii`'s labels): looked up rather than called.
        self.labels = labels
        # `checks`: the validator of each pattern, for a `validate` that dispatches on the
        # pattern (`pii`'s): a pattern without one is not called back per match.
        self.scans = tuple(
            _Scan(pattern, validate if checks is None else checks.get(pattern))
            for pattern in patterns
        )
        if labels is not None:  # a settled form's matches (`_Scan.next`) carry its label
            labels = dict(labels)
            for scan in self.scans:
                if scan.settled is not None:
                    labels[scan.settled] = labels[scan.pattern]
            self.labels = labels
        self.spaced = (
            self.scans[0]
            if len(self.scans) == 1 and self.scans[0].spaced and self.scans[0].first is None
            else None
        )
        # One pattern with a fixed replacement and no validator whose matches start where
        # runs start (`_run_splitter`): ASCII text is redacted by one ``split`` and one join.
        scan = self.scans[0]
        literal = (
            replacement
            if isinstance(replacement, str)
            else labels.get(scan.pattern)
            if labels is not None
            else None
        )
        self.split = (
            scan.splitter.split
            if len(self.scans) == 1
            and scan.validate is None
            and scan.splitter is not None
            and literal is not None
            else None
        )
        self.split_literal = literal if self.split is not None else None
        # One class holding every pattern's rare first characters (digits, for pii's
        # numbers): a stretch without any of them rules all those patterns out in one search
        # instead of one each. The patterns whose first characters are not known stay.
        firsts = [scan.first for scan in self.scans if scan.first is not None]
        self.rare: re.Pattern[str] | None = None
        self.common = tuple(scan for scan in self.scans if scan.first is None)
        if len(firsts) > 1 and len({first.flags for first in firsts}) == 1:
            bodies = "".join(first.pattern[1:-1] for first in firsts)
            self.rare = re.compile(f"[{bodies}]", firsts[0].flags)
        # A literal replacement is used as is; a computed one is called per match.
        self.replacement = replacement if isinstance(replacement, str) else None
        self.substitute = None if isinstance(replacement, str) else replacement
        self.validate = validate
        self.window = window
        state = {"behind": _LOOKBEHIND_CONTEXT, "ignorecase": 0, "words": 0}
        alphabets: list[str] = []
        words = False
        try:
            for pattern in patterns:
                alphabet, pattern_words = _alphabet(pattern, state)
                alphabets.append(alphabet)
                words = words or pattern_words
            self.member: re.Pattern[str] | None = re.compile("|".join(alphabets))
        except (_Unbounded, re.error, RecursionError):
            self.member = None
        self.separators: dict[str, bool] | None = {} if self.member is not None else None
        # With one alphabet: matches text up to and including its last separator (the
        # greedy ``.*`` backs off from the end to it), in C; no match when there is none.
        self.last_separator: re.Pattern[str] | None = None
        if self.member is not None and len(set(alphabets)) == 1:
            self.last_separator = re.compile(rf"(?s:.*)(?!{alphabets[0]})(?s:.)")
        self.space = self.separators is not None and self.classify(" ")
        self.words = words and self.member is not None
        self.behind = max(state["behind"], _LOOKBEHIND_CONTEXT)
        # Patterns with different alphabets have their separators in different places: a
        # character one pattern cannot contain (a letter, for a card number) may be part of
        # another's match (an e-mail address). Text is decided up to the point where every
        # pattern has met a separator of its own, so a match may then run past that point
        # (up to its own separator, which has arrived): see `RedactStream._decide`.
        distinct = tuple(dict.fromkeys(alphabets)) if self.member is not None else ()
        self.crossing = len(distinct) > 1
        self.alphabets = tuple(re.compile(alphabet) for alphabet in distinct)
        # Per alphabet: matches text up to and including its last separator, in C.
        self.cuts = tuple(re.compile(rf"(?s:.*)(?!{alphabet})(?s:.)") for alphabet in distinct)
        self.full = (1 << len(distinct)) - 1
        self.masks: dict[str, int] = {}
        # A character every match must contain, per pattern: a stretch without any of them
        # cannot hold a match, and a substring test is much cheaper than a search.
        required = [_required_char(pattern) for pattern in patterns]
        self.required: tuple[str, ...] | None = (
            tuple(c for c in required if c is not None) if None not in required else None
        )
        self.single_required = (
            self.required[0]
            if self.required is not None and len(self.required) == 1 and not self.crossing
            else None
        )

    def classify(self, char: str) -> bool:
        """Whether `char` is a separator of every pattern, remembered (the memo is bounded)."""
        assert self.member is not None
        assert self.separators is not None
        if len(self.separators) >= _MEMO_LIMIT:
            self.separators.clear()
        known = self.separators[char] = self.member.fullmatch(char) is None
        return known

    def mask(self, char: str) -> int:
        """One bit per distinct alphabet holding `char`, remembered (the memo is bounded)."""
        if len(self.masks) >= _MEMO_LIMIT:
            self.masks.clear()
        bits = 0
        for index, alphabet in enumerate(self.alphabets):
            if alphabet.fullmatch(char) is not None:
                bits |= 1 << index
        self.masks[char] = bits
        return bits

    def could_match(self, text: str) -> bool:
        """False when `text` lacks a character every match needs."""
        required = self.required
        if required is None:
            return True
        if len(required) == 1:
            return required[0] in text
        return any(char in text for char in required)

    def replace(self, text: str, pos: int, end: int, window: int = 0) -> tuple[str, int, int]:
        """Redact matches starting in ``text[pos:end]``.

        A `window` says that `text` is the start of a text still arriving: matches are those
        later text cannot change (see `_Scan.next`).

        Returns the output, where it stopped (past `end` when a match ran over it) and the
        number of matches replaced.

        Matches are searched in all of `text` (so lookarounds see their surroundings), but
        only those starting before `end` are decided. The leftmost valid match of any pattern
        wins, and on a tie the first pattern's; a match the validator refuses is passed over
        as if its pattern did not match there.

        Each pattern's next match is remembered until the text redacted so far passes its
        start, so a pattern is searched again only when a match of another one overlapped
        its own, and one that does not match again is never searched again: the time is
        linear in the length of the text, whatever the number of matches.
        """
        if self.split is not None and end == len(text) and text.isascii():
            done = self._replace_split(text, pos, end)
            if done is not None:
                return done
        # One pattern, searched from its required character.
        if self.spaced is not None and not window:
            return self._replace_spaced(self.spaced, text, pos, end, [], 0)
        scans = self.scans
        replacement = self.replacement
        labels = self.labels
        pieces: list[str] = []
        count = 0
        ahead: list[list[Any]] = []
        if len(scans) > 1:
            # [next match, scan] of the patterns that may match again, in pattern order.
            rare = self.rare
            live = self.common if rare is not None and rare.search(text, pos) is None else scans
            ahead = [[scan.next(text, pos, window), scan] for scan in live]
            ahead = [entry for entry in ahead if entry[0] is not None]
        while len(ahead) > 1:
            best: re.Match[str] | None = None
            spent = False
            for entry in ahead:
                found = entry[0]
                if found.start() < pos:
                    # Overlapped by the last match: search again from where it ended.
                    found = entry[0] = entry[1].next(text, pos, window)
                    if found is None:
                        spent = True
                        continue
                # Strictly left of the best: on a tie, the pattern listed first wins.
                if best is None or found.start() < best.start():
                    best = found
            if spent:
                ahead = [entry for entry in ahead if entry[0] is not None]
            if best is None or best.start() >= end:
                ahead = []
                break
            pieces.append(text[pos : best.start()])
            if replacement is not None:
                pieces.append(replacement)
            elif labels is not None:
                pieces.append(labels[best.re])
            else:
                pieces.append(self.computed(best))
            count += 1
            pos = best.end()
            if pos >= end:
                return "".join(pieces), pos, count
        # One pattern left to search (or only one given): the same, without the comparisons.
        scan: _Scan | None = None
        if len(scans) == 1:
            scan = scans[0]
            if scan.spaced and scan.first is None and not window:
                return self._replace_spaced(scan, text, pos, end, pieces, count)
            found = scan.next(text, pos, window)
        elif ahead:
            found, scan = ahead[0]
            assert scan is not None
            if scan.spaced and scan.first is None and not window:
                return self._replace_spaced(scan, text, pos, end, pieces, count)
            if found is not None and found.start() < pos:
                found = scan.next(text, pos, window)
        else:
            found = None
        while found is not None and found.start() < end:
            pieces.append(text[pos : found.start()])
            if replacement is not None:
                pieces.append(replacement)
            elif labels is not None:
                pieces.append(labels[found.re])
            else:
                pieces.append(self.computed(found))
            count += 1
            pos = found.end()
            if pos >= end:
                return "".join(pieces), pos, count
            assert scan is not None
            found = scan.next(text, pos, window)
        if not count:
            return text[pos:end], end, 0
        pieces.append(text[pos:end])
        return "".join(pieces), end, count

    def _replace_split(self, text: str, pos: int, end: int) -> tuple[str, int, int] | None:
        """`replace` to the end of ASCII text by `split` (see `_run_splitter`); None when a
        match ends where the next one starts, which only the exact search gets right.

        Long text is split a block at a time, each ending just after a space when the space
        is a separator (no match holds it or reads past it): the engine's lists stay small.
        """
        split = self.split
        literal = self.split_literal
        assert split is not None
        assert literal is not None
        outs: list[str] = []
        count = 0
        while pos < end:
            cut = end
            if end - pos > _SPLIT_BLOCK and self.space:
                cut = text.rfind(" ", pos, pos + _SPLIT_BLOCK) + 1
                if not cut:
                    cut = text.find(" ", pos + _SPLIT_BLOCK) + 1 or end
            # [text before the first match, its mark, text before the next, ..., the rest]
            parts = split(text[pos:cut] if pos or cut < end else text)
            found = len(parts) >> 1
            if parts.count(None) != found:  # a match ended where the next one starts
                return None
            outs.append(literal.join(parts[::2]))
            count += found
            pos = cut
        return "".join(outs), end, count

    def _replace_spaced(
        self, scan: _Scan, text: str, pos: int, end: int, pieces: list[str], count: int
    ) -> tuple[str, int, int]:
        """The end of `replace` when one pattern is left whose matches hold a required
        character and no space (an e-mail address): `_Scan.next` inlined, since it runs once
        per match. `pieces` and `count` are what `replace` has done so far.

        With a literal replacement (or a label per pattern) the loop keeps only the text
        between matches and joins it with the replacement at the end: one slice and one
        append per match.
        """
        required = scan.required
        assert required is not None
        validate = scan.validate
        literal = self.replacement
        if literal is None and self.labels is not None:
            literal = self.labels[scan.pattern]
        find, rfind, search = text.find, text.rfind, scan.pattern.search
        run_start = scan.run_start
        gaps: list[str] = []  # the text between matches (and, computed, each replacement)
        append = gaps.append
        if literal is not None and validate is None:
            # The common case (one pattern, a fixed replacement), with nothing per match
            # but the search and one slice: every match is taken, so the search goes on
            # where the output has got to.
            while True:
                at = find(required, pos)
                if at < 0:
                    break
                space = rfind(" ", pos, at)
                if space >= 0:
                    start = space + 1
                else:
                    start = pos
                    if at > pos:
                        assert run_start is not None
                        run = run_start.match(text, pos, at)
                        if run is not None:
                            start = run.end()
                found = search(text, start)
                if found is None:
                    break
                begin, stop = found.span()
                if stop >= end:  # the last match of the stretch, or one after it
                    if begin < end:
                        append(text[pos:begin])
                        pos = stop
                    break
                append(text[pos:begin])
                pos = stop
            found_count = len(gaps)
            if not found_count and not count:
                return text[pos:end], end, 0
            append(text[pos:end])  # empty when the last match ran to `end` or past it
            return "".join(pieces) + literal.join(gaps), max(pos, end), count + found_count
        found_count = 0
        cursor = pos  # where the search goes on; `pos`: where the output has got to
        while True:
            at = find(required, cursor)
            if at < 0:
                break
            start = cursor
            if at > cursor:
                space = rfind(" ", cursor, at)
                if space >= 0:
                    start = space + 1
                else:
                    assert run_start is not None
                    run = run_start.match(text, cursor, at)
                    if run is not None:
                        start = run.end()
            found = search(text, start)
            if found is None:
                break
            begin, stop = found.span()
            if begin >= end:
                break
            if validate is not None and not validate(found):
                cursor = begin + 1
                continue
            append(text[pos:begin])
            if literal is None:
                append(self.computed(found))
            found_count += 1
            pos = cursor = stop
            if pos >= end:
                break
        if not found_count and not count:
            return text[pos:end], end, 0
        append(text[pos:end])  # empty when the last match ran to `end` or past it
        body = literal.join(gaps) if literal is not None else "".join(gaps)
        return "".join(pieces) + body, max(pos, end), count + found_count

    def computed(self, found: re.Match[str]) -> str:
        """The text a computed replacement gives for `found`, checked."""
        assert self.substitute is not None
        text: object = self.substitute(found)
        if type(text) is not str:
            # Its type only: what it returned comes from the match (a `re.Match`, its
            # bytes), the text this transformer is there to keep from everyone.
            hint = (
                " (return found.group() or a text made from it)"
                if isinstance(text, re.Match)
                else ""
            )
            raise TypeError(
                f"the redact replacement function returned {type(text).__name__} for a match;"
                f" it must return the text to put in its place{hint}"
            )
        return text


@final
class RedactStream:
    """One attempt's redaction state: released context and the undecided tail."""

    __slots__ = (
        "_behind",
        "_boundary",
        "_compiled",
        "_context",
        "_pending",
        "_quick",
        "_required",
        "_tail_cut",
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
        last_separator = compiled.last_separator
        self._tail_cut = last_separator.match if last_separator is not None else None
        # The required character, when one character of context is all lookbehinds need;
        # otherwise "", which every text holds: no shortcut.
        self._quick = (compiled.single_required or "") if compiled.behind <= 1 else ""
        self._window = compiled.window
        self._behind = compiled.behind
        self._boundary: Callable[[str], int] = (
            self._last_cut if compiled.crossing else self._last_separator
        )
        self.feed: Callable[[str], str] = (
            self._feed_words if compiled.words and compiled.space else self._feed_any
        )
        """Take a chunk; return the text that can be released now."""

    def _feed_words(self, text: str) -> str:
        # `feed` when word characters are in the alphabet and the space is a separator:
        # the commonest chunks (words after a space; words alone) cost a few string methods.
        head, space, tail = text.rpartition(" ")
        if tail and not tail.isalnum():
            if self._tail_cut is None:
                return self._cut(text, self._boundary(text))
            last = self._tail_cut(tail)
            if last is not None:  # a separator after the last space: decide up to it
                cut = len(head) + len(space) + last.end()
                if cut == len(text):  # the chunk ends in it ("[2]", "com,"): all decided
                    decided = self._pending + text
                    if self._quick not in decided:
                        self._pending = ""
                        self._context = decided
                        return decided
                return self._cut(text, cut)
            # Otherwise the tail is made of the alphabet's characters, as a word is.
        if not space:
            # No separator: hold the chunk.
            pending = self._pending = self._pending + text
            if len(pending) <= self._window:
                return ""
            return self._release_window()
        decided = self._pending + head + space
        if len(tail) <= self._window:
            if self._quick not in decided:
                # Nothing up to the space can match: release it as it is. It ends in the
                # space, so it holds the one character of context lookbehinds need
                # (`_quick`); the context is whatever string ends with the last released
                # characters.
                self._pending = tail
                self._context = decided
                return decided
            if self._quick:
                return self._decide_known(decided, tail)
        return self._cut(text, len(head) + 1)

    def _feed_any(self, text: str) -> str:
        if self._compiled.separators is None or not text:
            return self._hold(text)
        return self._cut(text, self._boundary(text))

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
        if len(self._pending) > self._window:
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

    def _last_cut(self, text: str) -> int:
        """Just after the point where every pattern has met a separator of its own, scanning
        `text` back from its end; 0 when some pattern meets none in it.
        """
        compiled = self._compiled
        masks = compiled.masks
        alive = compiled.full  # the alphabets that have not met a separator yet
        # Character by character near the end, where the cut mostly is (after the last
        # word); past that, one backward search per alphabet in C, so that a chunk where
        # some pattern meets no separator (IBAN-like codes) is not read in Python.
        stop = max(-1, len(text) - 1 - _CUT_SCAN)
        for index in range(len(text) - 1, stop, -1):
            char = text[index]
            bits = masks.get(char)
            if bits is None:
                bits = compiled.mask(char)
            alive &= bits
            if not alive:
                return index + 1
        if stop < 0:
            return 0
        cut = stop + 1
        for bit, last in enumerate(compiled.cuts):
            if alive >> bit & 1:
                found = last.match(text, 0, stop + 1)
                if found is None:
                    return 0
                cut = min(cut, found.end())
        return cut

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
        if rest and compiled.crossing:
            return self._decide_across(context, decided, rest)
        self._pending = rest
        if not compiled.could_match(decided):
            self._context = context + decided
            return decided
        text = context + decided
        out, _stop, count = compiled.replace(text, len(context), len(text))
        self.count += count
        self._context = text
        return out

    def _decide_known(self, decided: str, rest: str) -> str:
        """`_decide` when there is one alphabet and `decided` holds the required character."""
        compiled = self._compiled
        self._pending = rest
        if compiled.split is not None and decided.isascii():
            # The split path reads no context: `decided` is redacted on its own (it is not
            # empty, and lookbehinds need one character of context here: see `_quick`).
            done = compiled._replace_split(decided, 0, len(decided))
            if done is not None:
                self.count += done[2]
                self._context = decided
                return done[0]
        context = self._context[-compiled.behind :]
        text = context + decided
        out, _stop, count = compiled.replace(text, len(context), len(text))
        self.count += count
        self._context = text
        return out

    def _decide_across(self, context: str, decided: str, rest: str) -> str:
        """`_decide` when a match starting in `decided` may run on into `rest`.

        Every pattern has met a separator of its own at or after the end of `decided`, so a
        match starting in it ends before that separator, which has arrived: it is decided
        with the text that follows, and what comes after it stays pending.
        """
        compiled = self._compiled
        ahead = decided + rest
        if not compiled.could_match(ahead):
            self._pending = rest
            self._context = context + decided
            return decided
        text = context + ahead
        start = len(context)
        out, stop, count = compiled.replace(text, start, start + len(decided))
        self.count += count
        self._context = text[:stop]
        self._pending = text[stop:]
        return out

    def _release_window(self) -> str:
        """More than a window held: decide the starts followed by ``max_match`` characters.

        A match shorter than ``max_match`` starting there ends at least two characters
        before the text that has arrived so far does, so no end assertion (``\\b``, ``$``,
        which also matches before a final newline, a lookahead) reads past it. A match the
        search finds running up to that end is not one: the text that follows may end it
        elsewhere or undo it, so only matches with two characters after them are taken
        (`_Scan.next`); one reaching further is not shorter than ``max_match``.
        """
        compiled = self._compiled
        context = self._context[-compiled.behind :]
        text = context + self._pending
        start = len(context)
        limit = len(text) - compiled.window
        out, stop, count = compiled.replace(text, start, limit, compiled.window)
        self.count += count
        self._context = text[max(0, stop - compiled.behind) : stop]
        self._pending = text[stop:]
        return out


@final
class Redact:
    """The factory `redact` returns; each call gives a fresh `RedactStream`."""

    __slots__ = ("_compiled", "max_match", "name")

    def __init__(self, compiled: _Compiled, name: str, max_match: int = 256) -> None:
        self._compiled = compiled
        self.name = name
        self.max_match = max_match

    def __call__(self) -> RedactStream:
        return RedactStream(self._compiled)

    def redact_text(self, text: str) -> str:
        """The redaction of a whole text at once: what the stream must add up to."""
        return self._compiled.replace(text, 0, len(text))[0]

    def _replacements(self, text: str) -> list[tuple[int, int, str]]:
        """Where `redact_text` replaces matches in `text`: start, end and the replacement
        of each, in order (for text whose pieces must be scrubbed as one, `scrub_input`).
        """
        compiled = self._compiled
        spans: list[tuple[int, int, str]] = []

        def record(found: re.Match[str]) -> str:
            if compiled.replacement is not None:
                replaced = compiled.replacement
            elif compiled.labels is not None:
                replaced = compiled.labels[found.re]
            else:
                replaced = compiled.computed(found)
            spans.append((found.start(), found.end(), replaced))
            return replaced

        self.with_replacement(record).redact_text(text)
        return spans

    def with_replacement(self, replacement: "Replacement") -> "Redact":
        """A factory finding the same matches (patterns and validator) that puts
        `replacement` in their place: text, or a function ``match -> str``."""
        compiled = self._compiled
        return redact(
            compiled.patterns,
            replacement=replacement,
            max_match=self.max_match,
            name=self.name,
            validate=compiled.validate,
        )

    def __repr__(self) -> str:
        compiled = self._compiled
        shown = ", ".join(repr(p.pattern) for p in compiled.patterns)
        replacement = compiled.replacement
        given = (
            repr(replacement) if replacement is not None else _function_name(compiled.substitute)
        )
        validate = (
            f", validate={_function_name(compiled.validate)}"
            if compiled.validate is not None
            else ""
        )
        return f"redact([{shown}], replacement={given}{validate})"


# What a replacement or validator is called with, for checking that it can be: a match.
_SAMPLE_MATCH = re.match("x", "x")


def _function_name(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name.replace("<locals>.", "") if isinstance(name, str) else type(fn).__name__


def redact(
    patterns: str | re.Pattern[str] | Iterable[str | re.Pattern[str]],
    *,
    replacement: Replacement = "[REDACTED]",
    max_match: int = 256,
    name: str = "redact",
    validate: Validator | None = None,
) -> Redact:
    """A stream transformer factory that replaces every match of `patterns`.

    A match that straddles chunk boundaries is still redacted; text that cannot be part of a
    match is released as soon as the chunk that proves it arrives. Held text never exceeds
    `max_match` characters.

    Args:
        patterns: One pattern or several (strings or compiled regexes). With several, the
            leftmost match wins, and on a tie the pattern listed first.
        replacement: The literal text put in place of each match, or a function
            ``match -> str`` computing it (as `re.sub` accepts).
        max_match: Matches shorter than this are redacted whatever the chunking; held text
            never exceeds it.
        name: The name its annotations and errors go under.
        validate: A function ``match -> bool``; a match it refuses is not redacted, and the
            search goes on from the next character (a card number failing its checksum is
            an order number).

    A computed replacement and a validator must depend on the match's text and groups
    only, not on where it lies in the string they see: that string is the stretch being
    decided, not the whole reply.

    Raises:
        ConfigError: A pattern does not compile, can match zero characters, or an option is
            out of range: a replacement or validator that cannot take a match, a name that
            is not text.
    """
    given: object = patterns  # callers without a type checker pass anything
    if isinstance(given, bytes | bytearray):
        raise ConfigError(
            f"redact pattern {patterns!r} is bytes; redaction works on text — pass a str"
        )
    if isinstance(patterns, str | re.Pattern):
        patterns = (patterns,)
    elif not isinstance(given, Iterable):
        raise ConfigError(
            f"redact(patterns=...) takes a pattern or a list of them (strings or compiled"
            f" regexes), got {type(given).__name__} {given!r}"
        )
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
        if (why := zero_width(regex, deny=False)) is not None:
            raise ConfigError(f"redact pattern {index} {regex.pattern!r} {why}")
        compiled.append(regex)
    if not compiled:
        raise ConfigError(
            "redact() needs at least one pattern, got none — pass the text to hide as"
            r' strings or compiled regexes, e.g. redact(r"\d{3}-\d{4}")'
        )
    if not isinstance(replacement, str) and (
        not callable(replacement) or isinstance(replacement, bytes | bytearray)
    ):
        raise ConfigError(
            f"redact(replacement=...) must be text or a function match -> str, got {replacement!r}"
        )
    if not isinstance(replacement, str):
        check_callable("redact", "replacement", replacement, (_SAMPLE_MATCH,))
    if validate is not None and not callable(validate):
        raise ConfigError(
            f"redact(validate=...) must be a function match -> bool or None, got {validate!r}"
        )
    if validate is not None:
        check_callable("redact", "validate", validate, (_SAMPLE_MATCH,))
    check_text("redact", "name", name, optional=False)
    if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
        raise ConfigError(f"redact(max_match=...) must be a positive int, got {max_match!r}")
    return Redact(_Compiled(tuple(compiled), replacement, max_match, validate), name, max_match)
