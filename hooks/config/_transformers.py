"""The entries that build stream transformers."""

import inspect
import json
import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias, final

import attrs

from pipeline import (
    Transformer,
    TransformerFactory,
)

from .._citations import citations
from .._pii import KINDS as PII_KINDS
from .._pii import pii
from .._redact import redact, zero_width
from ._entry import Env, doc, raise_all
from ._types import (
    FactoryRef,
    Invalid,
    PiiKind,
    Positive,
    Text,
)

# -- stream transformers ----------------------------------------------------------------------


@final
class _Named:
    """A transformer factory under the name its config entry gave it."""

    __slots__ = ("factory", "name")

    def __init__(self, factory: Callable[[], Any], name: str) -> None:
        self.factory = factory
        self.name = name

    def __call__(self) -> Any:
        return self.factory()

    def __repr__(self) -> str:
        return f"{self.name}={self.factory!r}"


@final
@attrs.frozen(kw_only=True)
class PythonTransformer:
    """A transformer factory of your own: ``fn()`` returning ``feed``/``flush``."""

    KIND: ClassVar[str] = "python"
    ref: FactoryRef = attrs.field(metadata=doc("The factory, as 'module:attribute'."))
    name: Text | None = attrs.field(
        default=None, metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        factory = self.ref.target
        _check_factory(self.ref.text, factory)
        return _Named(factory, self.name) if self.name is not None else factory


def _check_factory(text: str, factory: Callable[[], Any]) -> None:
    """What `Pipeline` checks of a transformer factory, checked here first so that a problem
    is reported at the entry's ``ref`` (the Pipeline's own error has no config path)."""
    try:
        first, second = factory(), factory()
    except Exception as exc:
        raise Invalid(
            f"calling the factory {json.dumps(text)} raised {type(exc).__name__}: {exc}",
            key="ref",
        ) from exc
    if not isinstance(first, Transformer):
        raise Invalid(
            f"the factory {json.dumps(text)} returned {type(first).__name__} {first!r}, which"
            " lacks feed(text) -> str and flush() -> str: expected a factory fn() returning a"
            " new transformer on each call",
            key="ref",
        )
    if first is second:
        raise Invalid(
            f"the factory {json.dumps(text)} returned the same object twice; each attempt needs"
            " a fresh instance (held text must not cross turns) — return a new object on"
            " every call",
            key="ref",
        )
    annotations = getattr(first, "annotations", None)
    if annotations is not None and not callable(annotations):
        raise Invalid(
            f"the factory {json.dumps(text)} returned a transformer whose annotations is not"
            " a method",
            key="ref",
        )
    asynchronous = [
        f"{method}()"
        for method in ("feed", "flush", "annotations")
        if inspect.iscoroutinefunction(getattr(first, method, None))
    ]
    if asynchronous:
        raise Invalid(
            f"the factory {json.dumps(text)} returned a transformer whose"
            f" {' and '.join(asynchronous)} {'is' if len(asynchronous) == 1 else 'are'} async;"
            " the seam is synchronous and on the hot path, so no I/O in transformers — do the"
            " I/O in a hook instead",
            key="ref",
        )


@final
@attrs.frozen(kw_only=True)
class RedactEntry:
    """Replace every match of the patterns while the reply streams (`hooks.redact`)."""

    KIND: ClassVar[str] = "redact"
    patterns: tuple[re.Pattern[str], ...] = attrs.field(
        metadata=doc("Regular expressions; a match is replaced.", min_items=1)
    )
    replacement: str = attrs.field(
        default="[REDACTED]", metadata=doc("The literal text put in place of each match.")
    )
    max_match: Positive = attrs.field(
        default=Positive(256), metadata=doc("The longest match redacted whatever the chunking.")
    )
    name: Text = attrs.field(
        default=Text("redact"), metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        problems = []
        if not self.patterns:
            problems.append(Invalid("redact needs at least one pattern", key="patterns"))
        for index, pattern in enumerate(self.patterns):
            if (why := zero_width(pattern, deny=False)) is not None:
                problems.append(
                    Invalid(f"{json.dumps(pattern.pattern)} {why}", key=f"patterns[{index}]")
                )
        raise_all(problems)
        return redact(
            self.patterns, replacement=self.replacement, max_match=self.max_match, name=self.name
        )


def _named(factory: Any, name: str) -> TransformerFactory:
    return factory if factory.name == name else _Named(factory, name)


@final
@attrs.frozen(kw_only=True)
class Pii:
    """Redact personal data while the reply streams (`hooks.pii`)."""

    KIND: ClassVar[str] = "pii"
    kinds: tuple[PiiKind, ...] = attrs.field(
        default=tuple(PiiKind(kind) for kind in PII_KINDS),
        metadata=doc("The kinds of personal data to redact; by default all.", min_items=1),
    )
    replacement: str | None = attrs.field(
        default=None,
        metadata=doc(
            "The text put in place of every match; by default one naming the kind ([EMAIL],"
            " [CARD], ...)."
        ),
    )
    name: Text = attrs.field(
        default=Text("pii"), metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        if not self.kinds:
            raise Invalid(f"choose at least one kind among {', '.join(PII_KINDS)}", key="kinds")
        return _named(pii(self.kinds, replacement=self.replacement), self.name)


@final
@attrs.frozen(kw_only=True)
class CitationsEntry:
    """Report the reply's ``[n]`` markers in ``Reply.annotations`` (`hooks.citations`)."""

    KIND: ClassVar[str] = "citations"
    name: Text = attrs.field(
        default=Text("citations"), metadata=doc("The name its annotations and errors go under.")
    )

    def build(self, env: Env) -> TransformerFactory:
        return _named(citations(), self.name)


TransformerEntry: TypeAlias = PythonTransformer | RedactEntry | Pii | CitationsEntry
"""The kinds the ``transformers`` list accepts."""
