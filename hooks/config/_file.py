"""The entries of a config file: one frozen record per kind, each with its builder.

An entry record declares the keys its kind accepts (its attrs fields; their types are
checked by `hooks.config` when the file is loaded, and written into the JSON Schema by
`hooks.config._schema`) and `build`s the hook, group or transformer factory it stands for. The
lists of a config accept the kinds of their union (`PreEntry`, `MemberEntry`,
`TransformerEntry`, `PostEntry`); the model table is a union on ``provider``.

Adding a kind is local: one record here (with ``KIND`` and ``build``) and its name in the
union of each list it may stand in. A new list is a field of `Config`, its union in
`TAGGED` and its name in `STAGE_LISTS`. A record whose keys are alternatives names them in
``ONE_OF``, and one whose key needs others names them in ``REQUIRES`` (the schema says both
too); its `build` calls `exactly_one` and `required_with`. A build that finds several
problems raises them together (`raise_all`), so each is reported.
"""

from typing import Any, final

import attrs

from pipeline import (
    Budget,
)

from ._entry import Env, doc
from ._hooks import MemberEntry, PostEntry, PreEntry, SessionEnd, SessionStart, Ttl
from ._models import ModelSpec
from ._scrub import AfterToolEntry
from ._tools import BeforeTool, ToolEntry, ToolsetEntry
from ._transformers import TransformerEntry
from ._types import (
    CompactRef,
    Count,
    Invalid,
    Positive,
    TokenizerRef,
    shown,
)

# -- the whole file ---------------------------------------------------------------------------


@final
@attrs.frozen(kw_only=True)
class BudgetSpec:
    """Token limits (`pipeline.Budget`)."""

    context_tokens: Positive = attrs.field(metadata=doc("The most the request may hold."))
    injection_reserve: Positive = attrs.field(
        metadata=doc("The most all of a turn's injections together may hold.")
    )

    def build(self, env: Env) -> Budget:
        if self.injection_reserve >= self.context_tokens:
            raise Invalid(
                f"must be smaller than context_tokens ({self.context_tokens}), got"
                f" {shown(self.injection_reserve)}: the history needs room too",
                key="injection_reserve",
            )
        return Budget(self.context_tokens, self.injection_reserve)


@final
@attrs.frozen(kw_only=True)
class Config:
    """A pipeline config: the model, the bounds and the lists of entries of each stage."""

    schema: str | None = attrs.field(
        default=None,
        metadata=doc("The JSON Schema this file follows (for editors); ignored.", key="$schema"),
    )
    system: str | None = attrs.field(
        default=None, metadata=doc("The system prompt, used when a turn's context has none.")
    )
    model: ModelSpec | None = attrs.field(
        default=None,
        metadata=doc("The model. Without it, the offline scripted model answers.", tag="provider"),
    )
    max_regenerations: Count = attrs.field(
        default=Count(2), metadata=doc("How many times post hooks may send the model back.")
    )
    hold_until_accepted: bool = attrs.field(
        default=False,
        metadata=doc("Hold each attempt's text until the post hooks accept it."),
    )
    max_steps: Positive = attrs.field(
        default=Positive(8),
        metadata=doc("The most model calls of one attempt (each tool round is one more)."),
    )
    tool_concurrency: Positive = attrs.field(
        default=Positive(4), metadata=doc("The most tool calls of one model call run at once.")
    )
    budget: BudgetSpec | None = attrs.field(default=None, metadata=doc("Token limits."))
    tokenizer: TokenizerRef | None = attrs.field(
        default=None, metadata=doc("Counts tokens: 'module:attribute' of fn(text) -> int.")
    )
    compact: CompactRef | None = attrs.field(
        default=None,
        metadata=doc("Compacts the history before the pre hooks (needs a budget)."),
    )
    pre: tuple[PreEntry, ...] = attrs.field(
        default=(), metadata=doc("Pre-message hooks and parallel groups, in order.")
    )
    tools: tuple[ToolEntry, ...] = attrs.field(
        default=(), metadata=doc("The tools the model may call.")
    )
    toolsets: tuple[ToolsetEntry, ...] = attrs.field(
        default=(),
        metadata=doc("Named groups of tools (MCP servers, local tools), offered as <name>_<tool>."),
    )
    before_tool: tuple[BeforeTool, ...] = attrs.field(
        default=(), metadata=doc("Hooks run before each tool call they match, in order.")
    )
    after_tool: tuple[AfterToolEntry, ...] = attrs.field(
        default=(), metadata=doc("Hooks run after each tool call they match, in order.")
    )
    transformers: tuple[TransformerEntry, ...] = attrs.field(
        default=(), metadata=doc("Stream transformers every text chunk passes through.")
    )
    post: tuple[PostEntry, ...] = attrs.field(
        default=(), metadata=doc("Post-message hooks (guardrails first), in order.")
    )
    on_session_start: tuple[SessionStart, ...] = attrs.field(
        default=(), metadata=doc("Hooks run when a session opens.")
    )
    on_session_end: tuple[SessionEnd, ...] = attrs.field(
        default=(), metadata=doc("Hooks run whenever a session closes.")
    )


TAGGED: tuple[tuple[Any, str], ...] = (
    # A union is configured after the unions its records hold (a judge holds a model).
    (ModelSpec, "provider"),
    (MemberEntry, "kind"),
    (PreEntry, "kind"),
    (Ttl, "kind"),
    (ToolEntry, "kind"),
    (ToolsetEntry, "kind"),
    (BeforeTool, "kind"),
    (AfterToolEntry, "kind"),
    (TransformerEntry, "kind"),
    (PostEntry, "kind"),
    (SessionStart, "kind"),
    (SessionEnd, "kind"),
)
"""Every union of records (or single record) a table is tagged for, and its tag key."""

STAGE_LISTS: tuple[str, ...] = (
    "pre",
    "tools",
    "toolsets",
    "before_tool",
    "after_tool",
    "transformers",
    "post",
    "on_session_start",
    "on_session_end",
)
"""The keys of `Config` that hold entry lists, in the order a turn meets them (the tools
and toolsets are built first, for the entries that name a tool)."""
