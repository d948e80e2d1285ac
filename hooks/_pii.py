"""`pii`: redaction of personal data with built-in patterns, on top of `redact`.

Each kind is one or two regular expressions and, where the format has one, a checksum: a
card number must pass the Luhn check and an IBAN its mod-97 check, so that an order number
or a product code of the same shape is left alone. Matches are anchored on both sides
(an address inside a longer run of digits or letters is not one), and every lookaround that
examines a letter looks at one character only, so a letter ends any possible number and
`redact` holds back no more than the word or number being written.
"""

import re
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Final

from pipeline import ConfigError

from ._redact import Redact, _Compiled

_MAX_MATCH = 256  # redact's default: every kind's matches are shorter

# File names such as "logo@2x.png" look like addresses; these endings are not domains.
_FILE_ENDINGS = ("png", "jpg", "jpeg", "gif", "svg", "webp", "pdf")


def _not_a_file(endings: tuple[str, ...]) -> str:
    """Lookbehinds refusing a match that ends in ``.`` and one of `endings`, in any case.

    Endings of one length share a lookbehind (it must have a fixed width).
    """
    widths = sorted({len(ending) for ending in endings})
    return "".join(
        rf"(?<!\.(?i:{'|'.join(e for e in endings if len(e) == width)}))" for width in widths
    )


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"


def _card_number(separator: str) -> str:
    """13 to 19 digits starting as the card networks do (2 to 6), together or in groups of
    four (Amex and Diners: 4-6-5, 4-6-4), with `separator` (a class) between groups.
    """
    between = f"{separator}?"
    return (
        rf"(?:[2-6][0-9]{{3}}(?:{between}[0-9]{{4}}){{2}}{between}[0-9]{{1,7}}"
        rf"|3[0-9]{{3}}{between}[0-9]{{6}}{between}[0-9]{{4,5}})"
    )


# The patterns of each kind, in the order ties between kinds are settled (the first wins).
_PATTERNS: Final = MappingProxyType(
    {
        "email": (
            # The address as the engine first finds it, in an atomic group so that when its
            # ending is a file's, no shorter match is tried in its place: the search goes on
            # at the next character, as it does after a match a check refuses.
            rf"(?>(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{{1,64}}@{_LABEL}(?:\.{_LABEL})*"
            rf"\.[A-Za-z]{{2,24}}(?![\w-])){_not_a_file(_FILE_ENDINGS)}",
        ),
        "phone": (
            # International, written with its "+": +44 20 7946 0958, +1 (555) 010-0199.
            r"(?<![\w+])\+[1-9][0-9]{0,2}(?:[ .-]?(?:\([0-9]{1,4}\)|[0-9]{1,4})){2,6}(?![\w-])",
            # North American: 555-010-0199, (555) 010-0199, 555.010.0199, and with the
            # country code as it is dialled there: 1-555-010-0199, 1 (555) 010-0199.
            r"(?<![\w.+-])(?:1[ .-]?)?(?:\([0-9]{3}\)[ .-]?|[0-9]{3}[ .-])[0-9]{3}[ .-][0-9]{4}"
            r"(?![\w-])",
        ),
        "card": (
            # A dash next to a card separates it from what is around it ("ref-", "3-",
            # "-exp"), except around a card written with dashes, where it joins the card's
            # groups to more digits: "1234-4111-1111-1111-1111" is one longer number. After
            # an IBAN-shaped prefix the digits are a card like any other: a valid IBAN
            # starts first and is redacted whole, and one failing its check is no IBAN.
            rf"(?<!\w)(?:{_card_number(' ')}(?!\w)"
            rf"|(?<![0-9]-){_card_number('[ -]')}(?!\w)(?!-[0-9]))",
        ),
        "ssn": (
            # US social security numbers, dashed, without the ranges never issued.
            r"(?<![\w-])(?!000|666|9[0-9]{2})[0-9]{3}-(?!00)[0-9]{2}-(?!0000)[0-9]{4}(?![\w-])",
        ),
        "iban": (
            r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}"
            r"(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,3})?)(?![A-Za-z0-9])",
        ),
        "ipv4": (rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w-])(?!\.[0-9])",),
    }
)

KINDS: Final = tuple(_PATTERNS)
"""The kinds `pii` knows, in the order it settles ties between them."""


def luhn(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (payment card numbers)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


# Each character as its ISO 13616 number (A = 10 ... Z = 35), looked up in C: the check runs
# once per IBAN-shaped candidate, and text of repeated codes ("GB82 GB82 ...") is nothing
# but candidates.
_IBAN_DIGITS: Final = {
    **{digit: digit for digit in "0123456789"},
    **{chr(code + offset): str(code - 55) for code in range(65, 91) for offset in (0, 32)},
}


def iban_checksum(code: str) -> bool:
    """Whether an IBAN (spaces removed) passes its ISO 13616 mod-97 check."""
    if not 15 <= len(code) <= 34:
        return False
    try:
        moved = "".join(map(_IBAN_DIGITS.__getitem__, code[4:] + code[:4]))
    except KeyError:
        return False
    return int(moved) % 97 == 1


def _card(text: str) -> bool:
    digits = text.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and luhn(digits)


def _phone(text: str) -> bool:
    return 7 <= sum(char.isdigit() for char in text) <= 15


_CHECKS: Final[dict[str, Callable[[str], bool]]] = {
    "phone": _phone,
    "card": _card,
    "iban": lambda text: iban_checksum(text.replace(" ", "")),
}


_IBAN_MEMO = 1024  # IBAN checks a factory remembers


def _iban_match() -> Callable[[re.Match[str]], bool]:
    """The IBAN check of a match, with a memo of its own: it runs once per IBAN-shaped
    candidate, and text of repeated codes ("GB82 GB82 ...", "AB12 CD34 ...") is nothing
    but candidates, the same few over and over.
    """
    seen: dict[str, bool] = {}

    def check(match: re.Match[str]) -> bool:
        text = match.group()
        known = seen.get(text)
        if known is None:
            if len(seen) >= _IBAN_MEMO:
                seen.clear()
            known = seen[text] = iban_checksum(text.replace(" ", ""))
        return known

    return check


def pii(
    kinds: str | Iterable[str] = KINDS,
    *,
    replacement: str | None = None,
) -> Redact:
    """A stream transformer factory that redacts personal data of the given kinds.

    Kinds: ``"email"``; ``"phone"`` (international numbers written with ``+``, and North
    American ones such as 555-010-0199); ``"card"`` (payment cards, Luhn-checked);
    ``"ssn"`` (US, dashed); ``"iban"`` (mod-97-checked); ``"ipv4"``. Built on `redact`, so
    a number split across chunks is still caught, and the redactions are counted in
    ``Reply.annotations["pii"]``.

    Args:
        kinds: The kinds to redact (one name, or several); by default all of them.
        replacement: The text put in place of every match; by default one naming the kind
            (``[EMAIL]``, ``[PHONE]``, ``[CARD]``, ``[SSN]``, ``[IBAN]``, ``[IPV4]``).

    Raises:
        ConfigError: An unknown or empty list of kinds, or a replacement that is not text.
    """
    chosen = _kinds(kinds)
    if replacement is not None and not isinstance(replacement, str):
        raise ConfigError(f"pii(replacement=...) must be text or None, got {replacement!r}")
    kind_of: dict[re.Pattern[str], str] = {}
    for kind in KINDS:  # the canonical order, whatever order the kinds were given in
        if kind in chosen:
            for pattern in _PATTERNS[kind]:
                kind_of[re.compile(pattern)] = kind
    checks = {pattern: _CHECKS.get(kind) for pattern, kind in kind_of.items()}
    labels = {pattern: f"[{kind.upper()}]" for pattern, kind in kind_of.items()}
    # Per pattern, so that a kind without a check (e-mail, SSN, IPv4) is not called per match.
    match_checks = {
        pattern: _iban_match() if kind == "iban" else _on_text(checks[pattern])
        for pattern, kind in kind_of.items()
    }

    def valid(match: re.Match[str]) -> bool:
        check = checks[match.re]
        return check is None or check(match.group())

    def label(match: re.Match[str]) -> str:
        return labels[match.re]

    if replacement is None:
        # The label depends on the pattern alone: `redact` looks it up instead of calling.
        compiled = _Compiled(tuple(kind_of), label, _MAX_MATCH, valid, labels, match_checks)
    else:
        compiled = _Compiled(tuple(kind_of), replacement, _MAX_MATCH, valid, checks=match_checks)
    return Redact(compiled, "pii")


def _on_text(check: Callable[[str], bool] | None) -> Callable[[re.Match[str]], bool] | None:
    """`check` applied to a match's text (None stays None)."""
    if check is None:
        return None
    return lambda match: check(match.group())


def _kinds(kinds: object) -> frozenset[str]:
    if isinstance(kinds, str):
        kinds = (kinds,)
    # Bytes iterate as ints: b"email" would be refused as "unknown kind 101".
    if not isinstance(kinds, Iterable) or isinstance(kinds, bytes | bytearray):
        raise ConfigError(
            f"pii(kinds=...) must be kind names among {', '.join(KINDS)}, got {kinds!r}"
        )
    chosen = tuple(kinds)
    # Checked as text first: an unhashable kind (a list) cannot be looked up.
    unknown = [kind for kind in chosen if not isinstance(kind, str) or kind not in _PATTERNS]
    if unknown:
        raise ConfigError(
            f"pii(kinds=...): unknown kind {unknown[0]!r}; the kinds are {', '.join(KINDS)}"
        )
    if not chosen:
        raise ConfigError(f"pii(kinds=...) is empty; choose among {', '.join(KINDS)}")
    return frozenset(chosen)
