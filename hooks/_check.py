"""`turnplug check`: a config's pipeline as it was resolved, stage by stage.

Every stage a turn meets, in order, and in it every hook with the path of its config entry,
its kind, its durability, timeout and error policy (and `shadow` or `background` when set):
what a reviewer needs to see before a config goes live.
"""

from collections.abc import Iterator
from typing import Any

from pipeline import Hook, Parallel

from ._kinds import (
    AnthropicSpec,
    Config,
    OpenAISpec,
    ParallelGroup,
    ScriptedSpec,
)

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
    sections += [
        ("model call", f"model    {_model(config)}"),
        (
            "stream transformers, every chunk through each in order",
            [
                (f"transformers[{i}]", _name(factory), entry.KIND, "", "", "", "")
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
    rows = [row for _, body in sections if isinstance(body, list) for row in body]
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(7)]
    for number, (title, body) in enumerate(sections, 1):
        lines.append(f"{number}. {title}")
        if isinstance(body, str):
            lines.append(f"  {body}")
        elif not body:
            lines.append("  (none)")
        for row in body if isinstance(body, list) else ():
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


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
    extra = []
    ref = getattr(entry, "ref", None)
    if ref is not None:
        extra.append(ref.text)
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


def _name(factory: Any) -> str:
    name = getattr(factory, "name", None)
    return name if isinstance(name, str) else getattr(factory, "__name__", type(factory).__name__)


def _model(config: Config) -> str:
    spec = config.model
    if spec is None:
        return "scripted (offline; no [model] table, so a fixed greeting answers)"
    if isinstance(spec, ScriptedSpec):
        if spec.replies is None:
            return "scripted (offline): a fixed greeting for every call"
        return f"scripted (offline): {len(spec.replies)} replies, one per model call"
    assert isinstance(spec, OpenAISpec | AnthropicSpec)
    details = [f"{spec.PROVIDER} {spec.name}"]
    if spec.base_url:
        details.append(f"at {spec.base_url}")
    details.append(f"key from {spec.api_key_env}" if spec.api_key_env else "no key")
    if spec.max_tokens is not None:
        details.append(f"max_tokens {spec.max_tokens}")
    if spec.temperature is not None:
        details.append(f"temperature {spec.temperature:g}")
    return ", ".join(details)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
