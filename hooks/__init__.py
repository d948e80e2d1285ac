"""Ready-made hooks, built on the public API of `turns` and `pipeline` only.

Public submodule: `hooks.config` (pipelines declared in TOML or JSON files).
"""

from ._markers import durable, transient
from ._redact import Redact, RedactStream, redact
from ._tool_call import INJECTED_AT, InjectToolCall, inject_tool_call

__all__ = [
    "INJECTED_AT",
    "InjectToolCall",
    "Redact",
    "RedactStream",
    "durable",
    "inject_tool_call",
    "redact",
    "transient",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("hooks._"):
        _obj.__module__ = __name__
del _name, _obj
