"""The ``turnplug`` command line."""

import argparse
import os
import sys
from collections.abc import Sequence

import trio

from pipeline import PipelineError


def _demo(args: argparse.Namespace) -> int:
    from ._demo import demo

    trio.run(demo, print, args.model)
    return 0


def _log(args: argparse.Namespace) -> int:
    from ._logview import show_log

    trio.run(show_log, print, args.conversation, args.log, args.audit, args.json)
    return 0


def _conversation_id(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a conversation id must not be empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnplug",
        description="Run one LLM conversation turn as a pipeline of plain functions.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run a full offline turn and show every stage")
    demo.add_argument(
        "--model",
        metavar="PROVIDER:MODEL",
        help="talk to a real model, e.g. openai:gpt-4o-mini, when its API key is set in the"
        " environment (otherwise the demo stays offline)",
    )
    demo.set_defaults(handler=_demo)
    log = commands.add_parser(
        "log",
        help="show a conversation from a durable log",
        description="Show a conversation's committed turns: roles, text, tool calls and"
        " results, and which hook injected what. An unknown conversation shows as empty.",
    )
    log.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    log.add_argument(
        "--log",
        required=True,
        metavar="PATH_OR_DSN",
        help="an SQLite log file, or a postgresql:// DSN",
    )
    log.add_argument("--audit", action="store_true", help="also show each turn's audit record")
    log.add_argument("--json", action="store_true", help="print JSON, for machines")
    log.set_defaults(handler=_log)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``turnplug`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except PipelineError as exc:
        if args.debug:
            raise
        print(f"turnplug: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`turnplug demo | head`): stop quietly, as other tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
