"""Functions the config tests refer to (``tests.hooks.config_support:...``), a valid config
using every key, and a catalogue of faults, each breaking one value of it.

A fault has the path the loader must report it under, so that any combination of faults
can be checked: a config with several mistakes must report exactly those mistakes.
"""

import copy
from collections.abc import Callable
from typing import Any

import anyio
import attrs

from pipeline import block, cont, tool
from turns import Text, ToolCall, ToolResult, Turn

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


def encode(text: str) -> list[int]:
    """A tokenizer written as tiktoken's ``encode``: it returns the tokens, not their count."""
    return [ord(char) for char in text]


def keep_history(history: Any, target_tokens: int, tokenizer: Any) -> Any:
    return history


def no_maybe(text: str) -> bool | str:
    """A guardrail's check: feedback text rejects."""
    return "Say it plainly." if "maybe" in text.lower() else True


def search(query: str, k: int) -> list[str]:
    """A retrieval search: the query, then numbered passages."""
    return [f"passage about {query!r}", *(f"passage {n}" for n in range(2, 10))][:k]


def get_preferences(user: str, detail: bool = False) -> dict[str, str]:
    """The user's preferences (a tool).

    Args:
        user: Whose preferences.
        detail: Whether to add more.
    """
    return {"user": user, "language": "en"}


def lookup_order(order: str) -> str:
    """An order's status (a tool)."""
    return f"order {order}: shipped, sent to help@example.com"


@tool(name="shipping_days", description="Days until an order ships.")
def days() -> int:
    return 2


def failing_lookup(user: str) -> str:
    """A tool whose backend is down."""
    raise RuntimeError("the preferences service is down")


async def hanging_lookup(user: str) -> str:
    """A tool that never answers."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def broken_check(text: str) -> bool:
    """A guardrail's check that raises."""
    raise ValueError("the classifier is not loaded")


class Gauge:
    """A tool measuring how many of its calls run at once."""

    running = 0
    most = 0

    @classmethod
    def reset(cls) -> None:
        cls.running = cls.most = 0

    @staticmethod
    async def measure(n: int) -> int:
        Gauge.running += 1
        Gauge.most = max(Gauge.most, Gauge.running)
        await anyio.sleep(1)
        Gauge.running -= 1
        return n


class Untyped:
    """Functions no model can be told about: no annotations."""

    @staticmethod
    def get_preferences(user):  # type: ignore[no-untyped-def]
        return user


def no_refunds(call: ToolCall, turn: Turn) -> Any:
    """Before-tool hook: blocks every call it is matched to."""
    return block(f"{call.name} is not allowed here")


def shout(call: ToolCall, result: ToolResult, turn: Turn) -> Any:
    """After-tool hook: the result, upper-cased."""
    return cont(result.with_content(result.content.upper()))


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
                    {"kind": "retrieve", "search": ref("search"), "k": 2},
                ],
            },
            {"kind": "python", "ref": ref("hook"), "timeout": 1, "on_error": "skip"},
            {"kind": "python", "ref": ref("hook"), "name": "second"},
            {
                "kind": "tool_call",
                "tool": "get_preferences",
                "arguments": {"user": "ada"},
                "frequency": "if_changed",
                "refresh": {"kind": "ttl", "minutes": 30},
            },
            {
                "kind": "tool_call",
                "tool": "lookup_order",
                "arguments": {"order": "A7"},
                "name": "last_order",
                "durable": False,
            },
        ],
        "max_steps": 3,
        "tool_concurrency": 2,
        "tools": [
            {"kind": "python", "ref": ref("get_preferences")},
            {"kind": "python", "ref": ref("lookup_order"), "name": "order_status"},
            {"kind": "python", "ref": ref("days")},
            {"kind": "python", "ref": ref("lookup_order")},
        ],
        "before_tool": [
            {"kind": "python", "ref": ref("no_refunds"), "match": {"regex": "refund.*"}},
        ],
        "after_tool": [
            {"kind": "python", "ref": ref("shout"), "match": "get_preferences"},
        ],
        "transformers": [
            {"kind": "redact", "patterns": [r"\d{4,}"]},
            {"kind": "python", "ref": ref("Upper"), "name": "upper"},
            {"kind": "redact", "patterns": ["secret"], "name": "redact_secret"},
            {"kind": "pii", "kinds": ["email", "card"], "replacement": "[PII]"},
            {"kind": "citations"},
        ],
        "post": [
            {"kind": "python", "ref": ref("hook"), "name": "check"},
            {"kind": "python", "ref": ref("hook"), "name": "later", "background": True},
            {"kind": "guardrail", "deny": ["(?i)internal only"], "feedback": "No internals."},
            {"kind": "max_length", "chars": 500},
            {
                "kind": "judge",
                "model": {"provider": "scripted", "replies": ["PASS"]},
                "instruction": "Be polite.",
            },
            {"kind": "guardrail", "check": ref("no_maybe"), "feedback": "Be plain."},
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
    Fault(
        "transformers[2].patterns[0]",
        _set(("transformers", 2, "patterns", 0), "y*"),
        schema=False,
    ),
    Fault("post[0].ref", _set(("post", 0, "ref"), ref("missing")), schema=False),
    Fault("post[1].background", _set(("post", 1, "background"), "no")),
    Fault("on_session_start[0].ref", _set(("on_session_start", 0, "ref"), ref("end")), False),
    Fault("on_session_end[0].kind", _set(("on_session_end", 0, "kind"), "pythn")),
    Fault("tokenizer", _set(("tokenizer",), "count_words")),
    Fault("max_steps", _set(("max_steps",), 0)),
    Fault("tool_concurrency", _set(("tool_concurrency",), "4")),
    Fault("pre[1].hooks[2].k", _set(("pre", 1, "hooks", 2, "k"), 0)),
    Fault("pre[1].hooks[2].search", _set(("pre", 1, "hooks", 2, "search"), ref("hook")), False),
    # A tool_call's arguments are checked against the tool it names (which has no fault).
    Fault("pre[5].arguments", _set(("pre", 5, "arguments"), {"order": 7}), schema=False),
    Fault("pre[4].refresh", _set(("pre", 4, "refresh"), {"kind": "ttl"})),
    # A tool that does not build is reported once: the tool_call naming it says nothing more.
    Fault("tools[0].ref", _set(("tools", 0, "ref"), ref("Untyped.get_preferences")), False),
    Fault("tools[1].name", _set(("tools", 1, "name"), "order status")),
    Fault("tools[2].kind", _set(("tools", 2, "kind"), "mcp")),
    Fault("before_tool[0].match.regex", _set(("before_tool", 0, "match", "regex"), "refund(")),
    Fault("before_tool[0].ref", _set(("before_tool", 0, "ref"), ref("shout")), schema=False),
    Fault("after_tool[0].match", _set(("after_tool", 0, "match"), "get_prefs"), schema=False),
    Fault("transformers[3].kinds[1]", _set(("transformers", 3, "kinds", 1), "credit_card")),
    Fault("transformers[4].nmae", _set(("transformers", 4, "nmae"), "cites")),
    Fault("post[2].deny[0]", _set(("post", 2, "deny", 0), "(?i)x?"), schema=False),
    Fault("post[2].feedback", _delete(("post", 2, "feedback"))),
    Fault("post[3].chars", _set(("post", 3, "chars"), 0)),
    Fault(
        "post[4].model.api_key_env",
        _set(("post", 4, "model"), {"provider": "openai", "name": "m", "api_key_env": "NO_KEY_X"}),
        schema=False,
    ),
    Fault("post[5]", _set(("post", 5, "deny"), ["maybe"])),
    # Beside the build faults of their entries: a wrong value hides nothing else.
    Fault("post[4].timeout", _set(("post", 4, "timeout"), 0)),
    Fault("post[2].on_error", _set(("post", 2, "on_error"), "explode")),
    Fault("pre[5].durable", _set(("pre", 5, "durable"), "no")),
)


def broken(*faults: Fault) -> dict[str, Any]:
    """The valid config with `faults` made in it."""
    config = copy.deepcopy(valid())
    for fault in faults:
        fault.change(config)
    return config
