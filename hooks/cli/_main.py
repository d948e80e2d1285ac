"""The ``turnplug`` command line.

One handler per subcommand, each with its block in `build_parser`. Exit codes: 0 ok; 1 a
turn that halted, exhausted its regenerations or failed; 2 a usage or config error. Errors
are one clear line (a config error lists its problems one per line), never a traceback
unless ``--debug`` is given.
"""

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Sequence

import trio

from pipeline import ConfigError, Pipeline
from pipeline.logs import MAX_ID_BYTES

from .._terminal import encodes_utf8, escaping_unencodable, printable
from ..config import _load as _config
from ._failed import failed, flush_or_discard, single

DEFAULT_CONVERSATION = "default"


def _demo(args: argparse.Namespace) -> int:
    from ._demo import demo

    # A real model behind --model writes what it likes: shown, never acted on.
    result = trio.run(demo, lambda line: print(printable(line)), args.model)
    # As for `run`: a turn that halted or exhausted its regenerations did not complete (a
    # real model behind --model may keep leaking what the guardrail rejects).
    return 0 if result.outcome == "completed" else 1


def _loaded(path: str) -> "_config._Loaded":
    """The config at `path`, with a note when it names no model."""
    loaded = _config._load(path)
    if loaded.config.model is None:
        print(
            f"turnplug: note: {path} has no [model] table, so the offline scripted model answers",
            file=sys.stderr,
        )
    return loaded


def _pipeline(args: argparse.Namespace) -> Pipeline:
    """The config's pipeline, talking to the model `--model` names instead, if given."""
    if args.model is None:
        return _loaded(args.config).pipeline
    from pipeline.providers import model_from_string

    from ._demo import unset_key, unset_state

    model = model_from_string(args.model)  # a malformed spec is a ConfigError: exit 2
    variable = unset_key(args.model)
    if variable is not None:
        raise ConfigError(
            f"--model {args.model} needs its key in {variable}, which is"
            f" {unset_state(variable)} in the environment (the key is read from there only)"
        )
    # The config's own model is not built: its key need not be set, as it is never called.
    return _config._load(args.config, model=model).pipeline


def _run(args: argparse.Namespace) -> int:
    from ._logs import open_log
    from ._run import Console, run_turn

    pipe = _pipeline(args)

    async def turn() -> int:
        async with open_log(args.log) as log:
            return await run_turn(
                pipe,
                args.message,
                log=log,
                conversation=args.conversation,
                as_json=args.json,
                show_events=args.events,
                console=Console(sys.stdout, sys.stderr),
            )

    code: int = trio.run(turn)
    return code


def _chat(args: argparse.Namespace) -> int:
    from ._logs import open_log
    from ._run import Console, chat, read_stdin

    if sys.stdin is None:  # started with standard input closed (`<&-`)
        raise ConfigError(
            "chat reads its messages from standard input, which is closed — give it a"
            " terminal or a pipe (`echo hi | turnplug chat CONFIG`), or use turnplug run"
            " CONFIG MESSAGE"
        )
    pipe = _pipeline(args)
    console = Console(sys.stdout, sys.stderr)
    interactive = sys.stdin.isatty()
    if interactive:
        console.note(
            f"turnplug chat: {args.config} — Ctrl-C cancels a turn, Ctrl-D ends the conversation"
        )

    async def turns() -> int:
        async with open_log(args.log) as log:
            return await chat(
                pipe,
                log=log,
                conversation=args.conversation,
                read_line=read_stdin,
                console=console,
                prompt="> " if interactive else "",
                live=args.live,
            )

    code: int = trio.run(turns)
    return code


def _check(args: argparse.Namespace) -> int:
    from ._check import connected, describe

    loaded = _config._load(args.config, offline=args.offline)
    # The servers are started before anything is printed: "ok" is said only once they were.
    # One that cannot start is a ToolsetError (exit 1, as a provider that fails a turn).
    toolsets = connected(loaded.pipeline, offline=args.offline) if loaded.config.toolsets else []
    for line in [*describe(args.config, loaded.config, loaded.pipeline), *toolsets]:
        print(printable(line, breaks=False))
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(_config.config_schema(), indent=2, ensure_ascii=False))
    return 0


def _log(args: argparse.Namespace) -> int:
    from ._logview import show_log

    ascii_only = not encodes_utf8(sys.stdout)
    trio.run(show_log, print, args.conversation, args.log, args.audit, args.json, ascii_only)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from . import _serve

    return _serve.run(args, _loaded(args.config))


def _conversation_id(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a conversation id must not be empty")
    return text


def _message(text: str) -> str:
    """A message to send: text a model and a log can take. An argument that is not valid
    UTF-8 reaches Python with its bytes as lone surrogates, which no JSON body, log or
    strict terminal carries. A blank one is no message, as a blank line in `chat` is none
    (a provider would refuse a request without one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the message must not be empty — give the text to send: turnplug run CONFIG 'hi'"
        )
    try:
        text.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"the message must be valid UTF-8, got {text!r} — check the terminal's encoding"
        ) from None
    return text


def _new_conversation_id(text: str) -> str:
    """A conversation id turns are committed under: one a log can store (a log reads
    longer ones, which an older log may hold, but `turnplug log` is for those)."""
    _conversation_id(text)
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"a conversation id must be valid UTF-8, got {text!r}"
        ) from None
    if size > MAX_ID_BYTES:
        raise argparse.ArgumentTypeError(
            f"a conversation id must be at most {MAX_ID_BYTES} bytes as UTF-8, got {size} —"
            " use a shorter key, such as a hash"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``turnplug`` command's parser: every command, its options and its help."""
    parser = argparse.ArgumentParser(
        prog="turnplug",
        description="Run one LLM conversation turn as a pipeline of plain functions.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"turnplug {_version()}")
    # `turnplug run ... --debug` works too: each subcommand accepts the flag.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    # Not required: `turnplug` alone prints the whole help (see `main`), not a usage error.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", parents=[common], help="run a full offline turn and show every stage"
    )
    demo.add_argument(
        "--model",
        metavar="PROVIDER:MODEL",
        help="talk to a real model, e.g. openai:gpt-4o-mini, when its API key is set in the"
        " environment (otherwise the demo stays offline)",
    )
    demo.set_defaults(handler=_demo)

    run = commands.add_parser(
        "run", parents=[common], help="send one message through a config's pipeline"
    )
    run.add_argument("config", metavar="CONFIG", help="a .toml or .json pipeline config")
    run.add_argument("message", metavar="MESSAGE", type=_message, help="the user's message")
    _conversation_options(run)
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument(
        "--events",
        action="store_true",
        help="print every event as it happens (as JSON lines with --json)",
    )
    run.set_defaults(handler=_run)

    chat = commands.add_parser(
        "chat",
        parents=[common],
        help="talk to a config's pipeline; Ctrl-C cancels a turn, Ctrl-D exits",
    )
    chat.add_argument("config", metavar="CONFIG", help="a .toml or .json pipeline config")
    _conversation_options(chat)
    chat.add_argument(
        "--live",
        action="store_true",
        help="show text as the model streams it, even an attempt a guardrail then rejects"
        " (by default each answer is shown once the post hooks accepted it)",
    )
    chat.set_defaults(handler=_chat)

    check = commands.add_parser(
        "check",
        parents=[common],
        help="validate a config and print its pipeline, stage by stage",
    )
    check.add_argument("config", metavar="CONFIG", help="a .toml or .json pipeline config")
    check.add_argument(
        "--offline",
        action="store_true",
        help="do not connect to MCP servers, and let a missing API key or environment"
        " variable pass (for CI without secrets)",
    )
    check.set_defaults(handler=_check)

    schema = commands.add_parser(
        "schema", parents=[common], help="print the JSON Schema of the config format"
    )
    schema.set_defaults(handler=_schema)

    log = commands.add_parser(
        "log",
        parents=[common],
        help="show a conversation from a durable log, or list its conversations",
        description="Show a conversation's committed turns with their commit times: roles,"
        " text, tool calls and results, and which hook injected what. An unknown"
        " conversation shows as empty. Without CONVERSATION, list the log's conversations"
        " (id, turns, last commit time), the most recently committed first.",
    )
    log.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id, nargs="?")
    log.add_argument(
        "--log",
        required=True,
        metavar="PATH_OR_DSN",
        help="an SQLite log file, or a postgresql:// DSN",
    )
    log.add_argument("--audit", action="store_true", help="also show each turn's audit record")
    log.add_argument("--json", action="store_true", help="print JSON, for machines")
    log.set_defaults(handler=_log)

    from ._serve import add_parser as add_serve

    add_serve(commands, common, handler=_serve)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("turnplug")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "(not installed)"


def _conversation_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--model",
        metavar="PROVIDER:MODEL",
        help="talk to this model instead of the config's, e.g. openai:gpt-4o-mini (its API key"
        " from the provider's environment variable)",
    )
    command.add_argument(
        "--conversation",
        metavar="ID",
        type=_new_conversation_id,  # checked before the log is opened (and a file created)
        default=DEFAULT_CONVERSATION,
        help=f"the conversation to continue (default: {DEFAULT_CONVERSATION})",
    )
    command.add_argument(
        "--log",
        metavar="PATH_OR_DSN",
        help="the conversation log to load from and commit to: an SQLite file (created when"
        " missing) or a postgresql:// DSN (default: in memory, for this command only)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``turnplug`` console script; returns the exit code."""
    # Before anything is printed, help included: a terminal that is not UTF-8 would fail
    # on the first character it cannot carry (the demo's first ellipsis, a reply's accent).
    # Only until the command ends: a program calling `main` keeps its standard output as it was.
    with escaping_unencodable(sys.stdout):
        try:
            return _command(argv)
        finally:
            # Also as the parser exits (--help, --version): its output is still buffered.
            flush_or_discard(sys.stdout)


def _command(argv: Sequence[str] | None) -> int:
    """Parse `argv` and run its command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # Nothing to do: show what there is to do, on stderr with the usage-error code, so
        # that a script calling `turnplug` with no command still fails.
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = _handle(args)
    except BaseException as exc:
        status = failed(args, exc)
        if status is None:
            raise
        return status
    return code


def _handle(args: argparse.Namespace) -> int:
    """Run the command's handler. An exception group around one exception is raised as that
    exception: a task group (chat's, a turn's) wraps the one that ended it, which `main`
    reports by its type (a `BrokenPipeError` when the reader went away, a `PipelineError`,
    an interrupt), where the group's would say only "ExceptionGroup"."""
    try:
        return int(args.handler(args))
    except BaseExceptionGroup as group:
        error = single(group)
        if error is group:
            raise
    # Raised once the group is no longer being handled: raised inside its handler, the
    # exception's own context (what it was raised while handling, which --debug's traceback
    # shows) would become the group.
    raise error


if __name__ == "__main__":
    sys.exit(main())
