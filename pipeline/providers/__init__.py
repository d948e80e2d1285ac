"""Real model providers over HTTP: OpenAI Chat Completions and Anthropic Messages.

Each is a pure core (the request body from a `ModelRequest`; the stream's events into
`ModelText`, `ModelToolCall` and `ModelFinish`) and a thin httpx shell shared by both
(retries before the stream starts, an incremental byte-level SSE decoder, and one seam that
maps httpx's exceptions to the `ProviderError` tree). `model_from_string` builds one from a
``"provider:model"`` string. Decisions the design leaves open are in ``docs/providers.md``.
"""

from .._urls import hide_userinfo
from ._anthropic import AnthropicMessages
from ._convert import decode_arguments
from ._openai import OpenAIChat
from ._strings import model_from_string

__all__ = [
    "AnthropicMessages",
    "OpenAIChat",
    "decode_arguments",
    "hide_userinfo",
    "model_from_string",
]

for _name in __all__:
    _obj = globals()[_name]
    # `hide_userinfo` is defined below the providers, in `pipeline._urls`, which the MCP
    # client shares.
    if getattr(_obj, "__module__", "").startswith(("pipeline.providers._", "pipeline._")):
        _obj.__module__ = __name__
del _name, _obj
