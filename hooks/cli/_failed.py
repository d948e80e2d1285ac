"""What an exception that ended a command means on stderr, and the exit status it gives;
and standard output sent nowhere once its reader went away.

Shared by ``turnplug``'s entry point and by ``serve``, which says it before exiting without
waiting for the worker threads it abandoned; a module of its own, so that neither imports
the other.
"""

import argparse
import os
import sys
import traceback
from typing import TextIO

from pipeline import ConfigError, LogError, PipelineError

from .._terminal import one_line


def failed(args: argparse.Namespace, exc: BaseException) -> int | None:
    """Say on stderr what `exc`, raised by the command `args` ran, means, and return the exit
    status it gives; None when it is to be raised again (``--debug``: its traceback).

    Used by `hooks.cli._main.main`, and by ``serve`` before it exits without waiting for the worker threads
    it abandoned (the interpreter would wait for them once `main` returned).
    """
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, PipelineError):
        # A bad config, or a log that cannot be opened, is the caller's to fix (2), said in
        # full; a turn that failed did not complete (1), and its cause is in the traceback.
        fix = isinstance(exc, ConfigError | LogError)
        if args.debug:
            # The traceback, and the status the error gives without --debug (Python's own
            # exit on an uncaught exception, 1, would pass a bad config off as a turn's failure).
            traceback.print_exception(exc)
            return 2 if fix else 1
        # A config error is one line per problem already; any other error is one line.
        text = str(exc) if isinstance(exc, ConfigError) and exc.problems else one_line(str(exc))
        hint = "" if fix else " (run with --debug for the traceback)"
        print(f"turnplug: error: {type(exc).__name__}: {text}{hint}", file=sys.stderr)
        return 2 if fix else 1
    if isinstance(exc, BrokenPipeError):
        # The reader went away (`turnplug demo | head`): stop quietly, as other tools do.
        discard(sys.stdout)
        return 0
    if isinstance(exc, Exception):
        if args.debug:
            return None
        print(
            f"turnplug: error: {type(exc).__name__}: {one_line(str(exc))} (run with --debug for"
            " the traceback)",
            file=sys.stderr,
        )
        return 1
    # Past the parser, turnplug never exits by raising: this came from what the command
    # ran (a hook calling sys.exit(), say). Exiting with its status would pass it off as
    # turnplug's, 0 for a turn that never finished.
    if args.debug:
        if not isinstance(exc, SystemExit):
            return None
        # Python prints no traceback for a SystemExit, and would exit with its status.
        traceback.print_exception(exc)
        return 1
    what = f"sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else one_line(repr(exc))
    # Raised before a turn's commit or after it (by a session's background hook, as the
    # session closes): the words hold for both. Without --log nothing outlives the
    # command (run's log is in memory, serve's stateless turns are never committed).
    kept = (
        ": what was committed to the log before stays there, the rest was not"
        if getattr(args, "log", None)
        else ""
    )
    print(
        f"turnplug: error: {what} in what the command ran (a hook, a tool, a model)"
        f" stopped it{kept} (run with --debug for the traceback)",
        file=sys.stderr,
    )
    return 1


def single(error: BaseException) -> BaseException:
    """The one exception inside `error`, an exception group around one (and so on), or
    `error` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def discard(out: TextIO) -> None:
    """Send whatever is still written to `out` nowhere: its reader went away (``| head``),
    and Python's flush at exit would fail on it again, and say so."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, out.fileno())
    os.close(devnull)


def flush_or_discard(out: TextIO | None) -> None:
    """Flush `out` (standard output) as a command ends, help and version included: when its
    reader went away (``turnplug check CONFIG | head -0``), what is left goes nowhere and the
    command's exit status stands, as for ``run``. Left to Python's flush at exit, output held
    in the buffer of a pipe would fail there, printing "Exception ignored ...
    BrokenPipeError" and exiting 120. A stream a hook closed or detached is left as it is:
    the command's own error already says what went wrong."""
    if out is None:
        return
    try:
        if out.closed:
            return
        out.flush()
    except BrokenPipeError:
        discard(out)
    except ValueError:
        pass
