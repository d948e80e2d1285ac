"""Durability markers."""

from collections.abc import Callable
from typing import Any

from pipeline import ConfigError, Hook, hook


def durable(fn: Callable[..., Any]) -> Hook:
    """Mark a hook durable: what it injects joins the conversation log on commit."""
    return hook(_marked("durable", fn), durable=True)


def transient(fn: Callable[..., Any]) -> Hook:
    """Mark a hook transient (the default): what it injects is seen this turn only."""
    return hook(_marked("transient", fn), durable=False)


def _marked(marker: str, fn: object) -> Callable[..., Any]:
    # `hook(None, ...)` is the decorator form: a marker given None would return a decorator
    # in place of a hook, accepted by a pipeline and failing only when it runs.
    if fn is None:
        raise ConfigError(
            f"{marker}(fn) marks a hook function, got None — pass the function: {marker}(my_hook)"
        )
    return fn  # type: ignore[return-value]
