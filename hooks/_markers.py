"""Durability markers."""

from collections.abc import Callable
from typing import Any

from pipeline import Hook, hook


def durable(fn: Callable[..., Any]) -> Hook:
    """Mark a hook durable: what it injects joins the conversation log on commit."""
    return hook(fn, durable=True)


def transient(fn: Callable[..., Any]) -> Hook:
    """Mark a hook transient (the default): what it injects is seen this turn only."""
    return hook(fn, durable=False)
