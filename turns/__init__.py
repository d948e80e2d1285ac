"""The data of a turn: messages and their parts, the context, the turn and its reply.

Every record is frozen and holds tuples; change one with `attrs.evolve` or the helpers named
on it. Nothing here does I/O. Serialization lives in `turns.serde`.
"""

from ._context import Context, RequestOptions, Scope, ToolSpec
from ._message import Message, Role
from ._parts import Part, Text, ToolCall, ToolResult
from ._render import render, split_injections
from ._turn import Injection, Reply, Stage, Stamper, Turn, Usage

__all__ = [
    "Context",
    "Injection",
    "Message",
    "Part",
    "Reply",
    "RequestOptions",
    "Role",
    "Scope",
    "Stage",
    "Stamper",
    "Text",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Turn",
    "Usage",
    "render",
    "split_injections",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("turns."):
        _obj.__module__ = __name__
del _name, _obj
