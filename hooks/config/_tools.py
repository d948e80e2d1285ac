"""The entries that build tools and tool hooks."""

from typing import Any, ClassVar, TypeAlias, final

import attrs

from pipeline import (
    ConfigError,
    Hook,
    Tool,
    tool,
)

from ._entry import Env, HookEntry, doc
from ._types import (
    AfterToolRef,
    BeforeToolRef,
    Invalid,
    Text,
    ToolMatch,
    ToolName,
    ToolRef,
)

# -- tools and tool hooks ---------------------------------------------------------------------


@final
@attrs.frozen(kw_only=True)
class PythonTool:
    """A typed function the model may call (`pipeline.tool`)."""

    KIND: ClassVar[str] = "python"
    ref: ToolRef = attrs.field(
        metadata=doc("The function (or a pipeline.Tool), as 'module:attribute'.")
    )
    name: ToolName | None = attrs.field(
        default=None, metadata=doc("The name the model calls it by; the function's by default.")
    )
    description: Text | None = attrs.field(
        default=None, metadata=doc("What it does, for the model; the docstring by default.")
    )

    def build(self, env: Env) -> Tool:
        target = self.ref.target
        try:
            if isinstance(target, Tool):  # already described: rename or redescribe it only
                if self.name is None and self.description is None:
                    return target
                return tool(
                    target.fn,
                    name=self.name or target.name,
                    description=self.description or target.description,
                )
            return tool(target, name=self.name, description=self.description)
        except ConfigError as exc:  # a signature the model cannot be told about
            raise Invalid(str(exc), key="ref") from None


ToolEntry: TypeAlias = PythonTool
"""The kinds the ``tools`` list accepts."""


@attrs.frozen(kw_only=True)
class ToolHookEntry(HookEntry):
    """What the entries of ``before_tool`` and ``after_tool`` share: ``match``."""

    match: ToolMatch | None = attrs.field(
        default=None,
        metadata=doc(
            "The tools it applies to: a tool's name, or { regex = '...' } matching the whole"
            " name; every tool by default."
        ),
    )

    def matched(self, env: Env) -> dict[str, Any]:
        """The ``match=`` option; a tool named must be declared."""
        if self.match is None:
            return {}
        value = self.match.value
        if isinstance(value, str) and value not in env.declared:
            raise env.unknown_tool(value, "match")
        return {"match": value}


@final
@attrs.frozen(kw_only=True)
class BeforeTool(ToolHookEntry):
    """A hook run before each tool call it matches: ``fn(call, turn)``."""

    KIND: ClassVar[str] = "python"
    ref: BeforeToolRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, **self.matched(env))


@final
@attrs.frozen(kw_only=True)
class AfterTool(ToolHookEntry):
    """A hook run after each tool call it matches: ``fn(call, result, turn)``."""

    KIND: ClassVar[str] = "python"
    ref: AfterToolRef = attrs.field(metadata=doc("The function, as 'module:attribute'."))

    def build(self, env: Env) -> Hook:
        return self.wrap(self.ref.target, **self.matched(env))
