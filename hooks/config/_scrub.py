"""The ``scrub`` entries: personal data scrubbed from the user's message (``pre``) and from
tool results (``after_tool``) with `hooks.scrub_input` and `hooks.scrub_tool_results`."""

import re
from collections.abc import Mapping
from typing import ClassVar, Literal, TypeAlias, final

import attrs

from pipeline import Hook

from .._pii import KINDS as PII_KINDS
from .._pii import pii
from .._redact import Redact, redact, zero_width
from .._scrub import scrub_input, scrub_tool_results
from ._entry import Env, HookEntry, doc, exactly_one, raise_all
from ._tools import AfterTool, match_option
from ._types import Invalid, PiiKind, ToolMatch


@attrs.frozen(kw_only=True)
class _ScrubKeys(HookEntry):
    """What to find (``pii`` kinds or ``patterns``) and what to do with it (``strategy``)."""

    ONE_OF: ClassVar[tuple[str, ...]] = ("pii", "patterns")
    REQUIRES: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    pii: tuple[PiiKind, ...] | None = attrs.field(
        default=None,
        metadata=doc(f"Kinds of personal data to find, among {', '.join(PII_KINDS)}.", min_items=1),
    )
    patterns: tuple[re.Pattern[str], ...] | None = attrs.field(
        default=None, metadata=doc("Or regular expressions to find.", min_items=1)
    )
    strategy: Literal["redact", "mask", "hash", "block"] = attrs.field(
        default="redact",
        metadata=doc(
            "'redact' replaces a match, 'mask' keeps its last 4 characters, 'hash' puts a"
            " stable digest in its place, 'block' refuses the whole message or result."
        ),
    )
    replacement: str | None = attrs.field(
        default=None,
        metadata=doc(
            "With 'redact': the text put in place of a match; by default [EMAIL], [CARD], ..."
            " for pii, [REDACTED] for patterns."
        ),
    )

    def detector(self) -> Redact:
        problems: list[Invalid] = []
        try:
            exactly_one(self)
        except Invalid as exc:
            problems.append(exc)
        if self.pii is not None and not self.pii:
            problems.append(Invalid("choose at least one kind", key="pii"))
        if self.patterns is not None and not self.patterns:
            problems.append(Invalid("give at least one pattern", key="patterns"))
        for index, pattern in enumerate(self.patterns or ()):
            if (why := zero_width(pattern, deny=False)) is not None:
                problems.append(Invalid(f"{pattern.pattern!r} {why}", key=f"patterns[{index}]"))
        raise_all(problems)
        if self.pii is not None:
            return pii(self.pii, replacement=self.replacement)
        assert self.patterns is not None
        return redact(self.patterns, replacement=self.replacement or "[REDACTED]", name="scrub")


@final
@attrs.frozen(kw_only=True)
class ScrubInput(_ScrubKeys):
    """Scrub the user's message before anything reads it (`hooks.scrub_input`); put it first."""

    KIND: ClassVar[str] = "scrub"
    reply: str | None = attrs.field(
        default=None,
        metadata=doc("With 'block': the answer the user gets instead."),
    )

    def build(self, env: Env) -> Hook:
        built = scrub_input(self.detector(), strategy=self.strategy, reply=self.reply)
        return self.wrap(built.fn, name=built.name)


@final
@attrs.frozen(kw_only=True)
class ScrubResults(_ScrubKeys):
    """Scrub each tool result before the model, events, audit and log see it
    (`hooks.scrub_tool_results`)."""

    KIND: ClassVar[str] = "scrub"
    match: ToolMatch | None = attrs.field(
        default=None,
        metadata=doc(
            "The tools it applies to: a tool's name, or { regex = '...' } matching the whole"
            " name; every tool by default."
        ),
    )

    def build(self, env: Env) -> Hook:
        built = scrub_tool_results(self.detector(), strategy=self.strategy)
        return self.wrap(built.fn, name=built.name, **match_option(self.match, env))


AfterToolEntry: TypeAlias = AfterTool | ScrubResults
"""The kinds the ``after_tool`` list accepts."""
