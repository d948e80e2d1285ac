"""The ``turnplug`` command: `main(argv)` runs it (the console script calls it through the
top-level `_turnplug` module, which catches a Ctrl-C while this package loads).

One module per command (`_run` for ``run`` and ``chat``, `_demo`, `_check`, `_logview`,
`_serve` with the gateway in `_gateway` and its wire format in `_wire`), the timeline
renderer they share in `_timeline`, and opening a log from ``--log`` in `_logs`. The commands import the pipeline and hooks only through their public names, and
the config through `hooks.config`.
"""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
