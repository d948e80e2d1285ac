"""Ready-made hooks, built on the public API of `turns` and `pipeline` only."""

from ._markers import durable, transient
from ._pii import pii
from ._redact import Redact, RedactStream, redact

__all__ = ["Redact", "RedactStream", "durable", "pii", "redact", "transient"]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("hooks._"):
        _obj.__module__ = __name__
del _name, _obj
