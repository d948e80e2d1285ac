"""Functions the config tests refer to (``tests.hooks.config_support:...``), a valid config
using every key, and a catalogue of faults, each breaking one value of it.

A fault has the path the loader must report it under, so that any combination of faults
can be checked: a config with several mistakes must report exactly those mistakes.
"""

import copy
from collections.abc import Callable
from typing import Any

import attrs

from pipeline import cont
from turns import Text, Turn

HERE = "tests.hooks.config_support"
NOT_CALLABLE = 42
TRACE: list[str] = []
"""What the session hooks saw, in order."""


def hook(turn: Turn) -> Any:
    return cont(turn.inject("from the hook"))


def member(turn: Turn) -> list[Text]:
    return [Text("from the member")]


def two_arguments(turn: Turn, extra: Any) -> Any:
    return cont(turn)


def start(info: Any) -> Any:
    TRACE.append(f"start {info.conversation_id}")
    return cont(info.scope)


def end(info: Any, reason: str) -> None:
    TRACE.append(f"end {info.conversation_id} {reason}")


def count_words(text: str) -> int:
    return len(text.split())


def keep_history(history: Any, target_tokens: int, tokenizer: Any) -> Any:
    return history


class Upper:
    """A transformer: upper-cases every chunk."""

    def feed(self, text: str) -> str:
        return text.upper()

    def flush(self) -> str:
        return ""


def ref(name: str) -> str:
    return f"{HERE}:{name}"


def valid() -> dict[str, Any]:
    """A config that loads, with entries enough for every fault to have its own."""
    return {
        "system": "Be brief.",
        "max_regenerations": 1,
        "hold_until_accepted": False,
        "model": {"provider": "scripted", "replies": ["one", ["t", "wo"]]},
        "budget": {"context_tokens": 4000, "injection_reserve": 400},
        "pre": [
            {"kind": "static", "text": "House rules."},
            {
                "kind": "parallel",
                "hooks": [
                    {"kind": "python", "ref": ref("member")},
                    {"kind": "static", "text": "A note."},
                ],
            },
            {"kind": "python", "ref": ref("hook"), "timeout": 1, "on_error": "skip"},
            {"kind": "python", "ref": ref("hook"), "name": "second"},
        ],
        "transformers": [
            {"kind": "redact", "patterns": [r"\d{4,}"]},
            {"kind": "python", "ref": ref("Upper"), "name": "upper"},
            {"kind": "redact", "patterns": ["secret"], "name": "redact_secret"},
        ],
        "post": [
            {"kind": "python", "ref": ref("hook"), "name": "check"},
            {"kind": "python", "ref": ref("hook"), "name": "later", "background": True},
        ],
        "on_session_start": [{"kind": "python", "ref": ref("start")}],
        "on_session_end": [{"kind": "python", "ref": ref("end")}],
    }


@attrs.frozen
class Fault:
    """One mistake: where the loader must report it, and how to make it.

    Attributes:
        path: The path the problem is reported under.
        change: Makes the mistake in a config dict (in place).
        schema: Whether the JSON Schema can see it (a reference that does not import, or a
            value that only building refuses, needs the loader).
    """

    path: str
    change: Callable[[dict[str, Any]], None] = attrs.field(repr=False)
    schema: bool = True


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        node: Any = config
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return change


def _delete(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        node: Any = config
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]

    return change


FAULTS = (
    Fault("sytem", _set(("sytem",), "Be brief.")),
    Fault("max_regenerations", _set(("max_regenerations",), -1)),
    Fault("hold_until_accepted", _set(("hold_until_accepted",), "yes")),
    Fault("model.replies[1]", _set(("model", "replies", 1), [])),
    Fault("budget.injection_reserve", _set(("budget", "injection_reserve"), 5000), schema=False),
    Fault("pre[0].kind", _set(("pre", 0, "kind"), "statc")),
    Fault("pre[1].hooks[0].ref", _set(("pre", 1, "hooks", 0, "ref"), ref("two_arguments")), False),
    Fault("pre[1].hooks[1].text", _delete(("pre", 1, "hooks", 1, "text"))),
    Fault("pre[2].timeout", _set(("pre", 2, "timeout"), 0)),
    Fault("pre[2].on_error", _set(("pre", 2, "on_error"), "explode")),
    Fault("pre[3].ref", _set(("pre", 3, "ref"), "no_such_module_here:fn"), schema=False),
    Fault("transformers[0].patterns[0]", _set(("transformers", 0, "patterns", 0), "(")),
    Fault("transformers[1].ref", _set(("transformers", 1, "ref"), ref("NOT_CALLABLE")), False),
    # Building refuses a pattern that matches the empty string (`hooks.redact`).
    Fault("transformers[2]", _set(("transformers", 2, "patterns", 0), "y*"), schema=False),
    Fault("post[0].ref", _set(("post", 0, "ref"), ref("missing")), schema=False),
    Fault("post[1].background", _set(("post", 1, "background"), "no")),
    Fault("on_session_start[0].ref", _set(("on_session_start", 0, "ref"), ref("end")), False),
    Fault("on_session_end[0].kind", _set(("on_session_end", 0, "kind"), "pythn")),
    Fault("tokenizer", _set(("tokenizer",), "count_words")),
)


def broken(*faults: Fault) -> dict[str, Any]:
    """The valid config with `faults` made in it."""
    config = copy.deepcopy(valid())
    for fault in faults:
        fault.change(config)
    return config
