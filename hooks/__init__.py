"""Ready-made hooks, built on the public API of `turns` and `pipeline` only.

Public submodule: `hooks.config` (pipelines declared in TOML or JSON files).
"""

from ._citations import Citations, CitationStream, citations
from ._guardrails import deny, guardrail, judge, max_length
from ._inject import inject_text, retrieve
from ._markers import durable, transient
from ._pii import pii
from ._redact import Redact, RedactStream, redact
from ._scrub import SCRUB_BLOCKED, scrub_input, scrub_output, scrub_tool_results
from ._summary import DROPPED_TURNS, RUNNING_SUMMARY, drop_oldest, running_summary
from ._tool_call import INJECTED_AT, RENEWED_AT, InjectToolCall, inject_tool_call

__all__ = [
    "CitationStream",
    "Citations",
    "DROPPED_TURNS",
    "INJECTED_AT",
    "InjectToolCall",
    "RENEWED_AT",
    "RUNNING_SUMMARY",
    "Redact",
    "RedactStream",
    "SCRUB_BLOCKED",
    "citations",
    "deny",
    "drop_oldest",
    "durable",
    "guardrail",
    "inject_text",
    "inject_tool_call",
    "judge",
    "max_length",
    "pii",
    "redact",
    "retrieve",
    "running_summary",
    "scrub_input",
    "scrub_output",
    "scrub_tool_results",
    "transient",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("hooks._"):
        _obj.__module__ = __name__
del _name, _obj
