"""The conversation log the command line's ``--log PATH`` names.

One function, so that the commands (`run`, `chat`, and later `log`) agree on what a path
means. Without ``--log`` a command keeps its conversation in a `MemoryLog` for as long as
it runs.
"""

from pipeline import ConfigError
from pipeline.logs import Log, MemoryLog


def open_log(path: str | None) -> Log:
    """The log at `path`, or a fresh in-memory log when `path` is None.

    Raises:
        ConfigError: `path` was given: durable logs on disk are not available yet (this is
            where `SQLiteLog(path)` is returned once it is).
    """
    if path is None:
        return MemoryLog()
    raise ConfigError(
        f"--log {path}: conversation logs on disk are not available in this version —"
        " leave --log out to keep the conversation in memory for this command",
        source=path,
    )
