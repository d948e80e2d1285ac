"""The runtime: signals, hooks, the pipeline and its drive loop, models, errors.

Public submodules: `pipeline.events` (what a streamed turn reports), `pipeline.logs`
(conversation logs), `pipeline.providers` (real models over HTTP: OpenAI Chat Completions,
Anthropic Messages, `model_from_string`), `pipeline.testing` (offline models) and
`pipeline.otel` (OpenTelemetry tracing; needs the ``turnplug[otel]`` extra, so `pipeline` does
not import it). Everything else public is importable from here.
"""

from ._audit import AttemptRecord, AuditRecord, HookRecord, Rejection, ToolRecord
from ._budget import (
    CHARS_PER_TOKEN,
    MESSAGE_OVERHEAD,
    Budget,
    Tokenizer,
    estimate_tokens,
    message_tokens,
    part_tokens,
    parts_tokens,
    tiktoken_tokenizer,
)
from ._commit import INJECTED_BY
from ._errors import (
    BudgetError,
    ConfigError,
    ContextOverflow,
    HookError,
    HookFailed,
    HookReturnError,
    HookTimeout,
    InjectionOverflow,
    LogConflict,
    LogError,
    PipelineError,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
    RateLimited,
    RequestError,
    StepLimitExceeded,
    ToolsetError,
)
from ._hooks import Chain, Hook, OnError, Parallel, chain, hook, parallel
from ._mcp import MCPToolset, mcp_toolset
from ._model import Model, ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall
from ._pipeline import Compactor, Pipeline
from ._result import TurnResult
from ._seam import PerChunk, Transformer, TransformerFactory, per_chunk
from ._session import Session, SessionInfo
from ._signals import Ask, Block, Cont, Halt, Regenerate, Signal, ask, block, cont, halt, regenerate
from ._stream import TurnEvents
from ._tooljudge import ToolVerdict
from ._toolloop import TOOL_HOOKS
from ._tools import Tool, current_tools, tool
from ._toolsets import LocalToolset, Toolset, toolset, toolset_tool_name

__all__ = [
    "Ask",
    "AttemptRecord",
    "AuditRecord",
    "Block",
    "Budget",
    "BudgetError",
    "CHARS_PER_TOKEN",
    "Chain",
    "Compactor",
    "ConfigError",
    "Cont",
    "ContextOverflow",
    "Halt",
    "Hook",
    "HookError",
    "HookFailed",
    "HookRecord",
    "HookReturnError",
    "HookTimeout",
    "INJECTED_BY",
    "InjectionOverflow",
    "LocalToolset",
    "LogConflict",
    "LogError",
    "MCPToolset",
    "MESSAGE_OVERHEAD",
    "Model",
    "ModelEvent",
    "ModelFinish",
    "ModelRequest",
    "ModelText",
    "ModelToolCall",
    "OnError",
    "Parallel",
    "PerChunk",
    "Pipeline",
    "PipelineError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderProtocolError",
    "ProviderStatusError",
    "ProviderTimeout",
    "RateLimited",
    "Regenerate",
    "Rejection",
    "RequestError",
    "Session",
    "SessionInfo",
    "Signal",
    "StepLimitExceeded",
    "TOOL_HOOKS",
    "Tokenizer",
    "Tool",
    "ToolRecord",
    "ToolVerdict",
    "Toolset",
    "ToolsetError",
    "Transformer",
    "TransformerFactory",
    "TurnEvents",
    "TurnResult",
    "ask",
    "block",
    "chain",
    "cont",
    "current_tools",
    "estimate_tokens",
    "halt",
    "hook",
    "mcp_toolset",
    "message_tokens",
    "parallel",
    "part_tokens",
    "parts_tokens",
    "per_chunk",
    "regenerate",
    "tiktoken_tokenizer",
    "tool",
    "toolset",
    "toolset_tool_name",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("pipeline._"):
        _obj.__module__ = __name__
del _name, _obj
