"""`turnplug check`: a config's pipeline as it was resolved, stage by stage.

Every stage a turn meets, in order, and in it every hook with the path of its config entry,
its kind, its durability, timeout and error policy (and `shadow` or `background` when set,
what it runs and, for a tool hook, the tools it matches): what a reviewer needs to see
before a config goes live. The tools are listed with the arguments they require.
"""

import json
import os
from collections.abc import Iterator
from typing import Any

import attrs
import trio

from pipeline import (
    Halt,
    Hook,
    LocalToolset,
    MCPToolset,
    Parallel,
    Pipeline,
    Tool,
    current_tools,
    halt,
    hook,
    toolset_tool_name,
)
from pipeline.providers import hide_userinfo
from turns import Turn

from .._terminal import one_line
from ..config._file import Config
from ..config._hooks import (
    Guardrail,
    Judge,
    MaxLength,
    ParallelGroup,
    Retrieve,
    RunningSummary,
    ToolCallEntry,
)
from ..config._models import (
    AnthropicSpec,
    ModelSpec,
    OpenAISpec,
    PythonModelSpec,
    ScriptedSpec,
    base_url_of,
)
from ..config._scrub import ScrubInput, ScrubResults
from ..config._tools import PythonTool, ToolHookEntry
from ..config._transformers import Pii, RedactEntry
from ..config._types import Ref

Row = tuple[str, str, str, str, str, str, str]
"""path, name, kind, durability, timeout, error policy, extra."""


def describe(source: str, config: Config, pipe: Any) -> list[str]:
    """The lines `turnplug check` prints for a config and the pipeline it built."""
    lines = [f"{source}: ok", ""]
    if config.system is not None:
        lines.append(f"system   {_clip(config.system, 70)!r}")
    lines.append(
        f"bounds   max_regenerations {config.max_regenerations},"
        f" hold_until_accepted {str(config.hold_until_accepted).lower()}"
    )
    if config.tokenizer is not None:
        lines.append(f"tokens   counted by {config.tokenizer.text}")
    lines.append("")
    post = list(_hooks("post", config.post, pipe.post))
    sections: list[tuple[str, list[Row] | str]] = []
    if config.compact is not None:
        sections.append(
            ("compaction of the history, before the pre hooks", f"compact  {config.compact.text}")
        )
    sections.append(("pre hooks, in order", list(_hooks("pre", config.pre, pipe.pre))))
    if config.budget is not None:
        sections.append(
            (
                "budget check",
                f"budget   context_tokens {config.budget.context_tokens},"
                f" injection_reserve {config.budget.injection_reserve}",
            )
        )
    sections.append(("model call", f"model    {one_line(_model(config.model))}"))
    if config.tools or config.before_tool or config.after_tool:
        sections += [
            (
                f"tools the model may call: at most {config.max_steps} model calls per attempt,"
                f" {config.tool_concurrency} tool calls at a time",
                _tools(config.tools, pipe.tools),
            ),
            (
                "before each tool call, in order",
                list(_hooks("before_tool", config.before_tool, pipe.before_tool)),
            ),
            (
                "after each tool call, in order",
                list(_hooks("after_tool", config.after_tool, pipe.after_tool)),
            ),
        ]
    sections += [
        (
            "stream transformers, every chunk through each in order",
            [
                (
                    f"transformers[{i}]",
                    _name(factory),
                    entry.KIND,
                    "",
                    "",
                    "",
                    ", ".join(_details(entry)),
                )
                for i, (entry, factory) in enumerate(
                    zip(config.transformers, pipe.transformers, strict=True)
                )
            ],
        ),
        ("post hooks, in order", [row for row in post if "background" not in row[6]]),
        ("background post hooks, after the commit", [r for r in post if "background" in r[6]]),
        (
            "on session start",
            list(_hooks("on_session_start", config.on_session_start, pipe.on_session_start)),
        ),
        (
            "on session end",
            list(_hooks("on_session_end", config.on_session_end, pipe.on_session_end)),
        ),
    ]
    # A name may hold a line break: escaped, it cannot start a line of its own (a forged
    # stage or hook a reviewer would read as real).
    sections = [
        (title, [_escaped(row) for row in body] if isinstance(body, list) else body)
        for title, body in sections
    ]
    rows = [row for _, body in sections if isinstance(body, list) for row in body]
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(7)]
    for number, (title, body) in enumerate(sections, 1):
        lines.append(f"{number}. {title}")
        if isinstance(body, str):
            lines.extend(f"  {line}" for line in body.splitlines())
        elif not body:
            lines.append("  (none)")
        for row in body if isinstance(body, list) else ():
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def _escaped(row: Row) -> Row:
    path, name, kind, durability, timeout, policy, extra = map(one_line, row)
    return path, name, kind, durability, timeout, policy, extra


def _hooks(stage: str, entries: tuple[Any, ...], built: tuple[Any, ...]) -> Iterator[Row]:
    for index, (entry, item) in enumerate(zip(entries, built, strict=True)):
        path = f"{stage}[{index}]"
        if isinstance(entry, ParallelGroup) and isinstance(item, Parallel):
            yield path, item.name, "parallel", "", "", "", "members run concurrently"
            for position, (member, hook) in enumerate(zip(entry.hooks, item.members, strict=True)):
                yield _row(f"{path}.hooks[{position}]", member, hook, "  ")
        else:
            yield _row(path, entry, item, "")


def _row(path: str, entry: Any, hook: Hook, indent: str) -> Row:
    extra = list(_details(entry))
    if hook.shadow:
        extra.append("shadow (verdicts recorded, not enforced)")
    if hook.background:
        extra.append("background")
    timeout = "no timeout" if hook.timeout is None else f"timeout {hook.timeout:g}s"
    return (
        path,
        indent + hook.name,
        entry.KIND,
        "durable" if hook.durable else "transient",
        timeout,
        f"on_error {hook.on_error}",
        ", ".join(extra),
    )


def _details(entry: Any) -> Iterator[str]:
    """What an entry runs, beyond its name: its functions, its rule, its tool."""
    for field in attrs.fields(type(entry)):
        value = getattr(entry, field.name)
        if isinstance(value, Ref):
            yield value.text
    match entry:
        case Guardrail(deny=patterns) if patterns is not None:
            yield "deny " + " ".join(_clip(_regex(p.pattern), 40) for p in patterns)
        case RedactEntry(patterns=patterns):
            yield " ".join(_clip(_regex(p.pattern), 40) for p in patterns)
        case Pii(kinds=kinds):
            yield " ".join(kinds)
        case MaxLength(chars=chars):
            yield f"at most {chars} characters"
        case Judge(model=model):
            yield f"judged by {_model(model)}"
        case RunningSummary(every=every, model=model):
            yield f"every {every} turns"
            yield "summarized by " + ("the turn's model" if model is None else _model(model))
        case Retrieve(k=k):
            yield f"k {k}"
        case ToolCallEntry(tool=name, frequency=frequency, refresh=refresh):
            yield f"runs tool {name}, {frequency}"
            if refresh is not None:
                unit = next(unit for unit in refresh.ONE_OF if getattr(refresh, unit) is not None)
                yield f"fresh for {getattr(refresh, unit):g} {unit}"
        case ToolHookEntry(match=match):
            yield "every tool" if match is None else f"match {match.shown}"
        case ScrubInput() | ScrubResults():
            found = entry.pii or [_clip(_regex(p.pattern), 40) for p in entry.patterns or ()]
            yield f"{entry.strategy} {' '.join(found)}"
            if isinstance(entry, ScrubResults):
                yield "every tool" if entry.match is None else f"match {entry.match.shown}"


def _tools(entries: tuple[PythonTool, ...], tools: tuple[Tool, ...]) -> str:
    """One line per tool: its name, the arguments the model must give, its function."""
    rows = []
    for index, (entry, made) in enumerate(zip(entries, tools, strict=True)):
        required = made.parameters.get("required") or ()
        needs = f"requires {', '.join(required)}" if required else "no required arguments"
        rows.append((f"tools[{index}]", made.name, needs, entry.ref.text))
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines) or "(none)"


def _name(factory: Any) -> str:
    name = getattr(factory, "name", None)
    return name if isinstance(name, str) else getattr(factory, "__name__", type(factory).__name__)


def _model(spec: ModelSpec | None) -> str:
    if spec is None:
        return "scripted (offline; no [model] table, so a fixed greeting answers)"
    if isinstance(spec, ScriptedSpec):
        if spec.replies is None:
            return "scripted (offline): a fixed greeting for every call"
        if len(spec.replies) == 1:  # not "1 replies, one per model call"
            return "scripted (offline): 1 reply, for the first model call only"
        return f"scripted (offline): {len(spec.replies)} replies, one per model call"
    if isinstance(spec, PythonModelSpec):
        return f"python: the model {spec.ref.text} builds"
    assert isinstance(spec, OpenAISpec | AnthropicSpec)
    # Where the requests go, also when the environment moved them off the default host.
    base_url, variable = base_url_of(spec, os.environ)
    where = f"at {hide_userinfo(base_url.rstrip('/'))}"
    details = [f"{spec.PROVIDER} {spec.name}", where + (f" (from {variable})" if variable else "")]
    details.append(f"key from {spec.api_key_env}" if spec.api_key_env else "no key")
    if spec.max_tokens is not None:
        details.append(f"max_tokens {spec.max_tokens}")
    if spec.temperature is not None:
        details.append(f"temperature {spec.temperature:g}")
    return ", ".join(details)


def _regex(pattern: str) -> str:
    """A regex as a config writes it: in TOML's single quotes, which keep backslashes as they
    are (a Python repr doubled each one), else as a JSON string."""
    if "'" not in pattern and pattern.isprintable():
        return f"'{pattern}'"
    return json.dumps(pattern, ensure_ascii=False)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def connected(pipe: Pipeline, *, offline: bool) -> list[str]:
    """The toolsets' tools under their final names: MCP servers are connected (and closed)
    to list theirs, unless `offline`."""
    lines = ["", "toolsets, their tools as the model calls them"]
    # Names padded to one width, as the other lists are; escaped first, so that a name
    # holding a line break is measured as it is shown.
    width = max((len(one_line(each.name)) for each in pipe.toolsets), default=0)
    for each in pipe.toolsets:
        name = one_line(each.name).ljust(width)
        if isinstance(each, LocalToolset):
            names = [t.name for t in each.final_tools()]
            lines.append(one_line(f"  {name}  local: {', '.join(names) or '(none)'}"))
        elif isinstance(each, MCPToolset):
            lines.append(one_line(f"  {name}  MCP server {each.where}"))
    if offline or not any(isinstance(each, MCPToolset) for each in pipe.toolsets):
        if offline:
            lines.append("  (offline: MCP servers not connected, their tools not listed)")
        return lines
    listed = trio.run(_list_remote, pipe)
    width = max(len(one_line(name)) for name, _ in listed)
    for name, tools in listed:
        label = f"{one_line(name)}:".ljust(width + 1)
        lines.append(one_line(f"  {label} {', '.join(tools) or '(no tools)'}"))
    return lines


async def _list_remote(pipe: Pipeline) -> list[tuple[str, list[str]]]:
    """Connect every MCP server once (a turn that stops at its first hook), list the tools
    each serves under their final names, and close them."""
    seen: dict[str, Tool] = {}

    def grab(turn: Turn) -> Halt:
        seen.update(current_tools())
        return halt("listing the tools only")

    probe = Pipeline(
        model=pipe.model, tools=pipe.tools, toolsets=pipe.toolsets, pre=[hook(grab, name="list")]
    )
    await probe.run(Turn.start("list the tools"))
    pipe._check_needed_tools(seen)  # what names a server's tool, checked as a turn would
    local = {t.name for t in pipe.tools} | {
        t.name
        for each in pipe.toolsets
        if isinstance(each, LocalToolset)
        for t in each.final_tools()
    }
    remote = sorted(set(seen) - local)
    return [
        (
            each.name,
            [n for n in remote if n.startswith(toolset_tool_name(each.name, ""))],
        )
        for each in pipe.toolsets
        if isinstance(each, MCPToolset)
    ]
