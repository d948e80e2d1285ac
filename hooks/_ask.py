"""Asking a `Model` for text, for hooks that consult a model of their own."""

import inspect
from collections.abc import Callable
from typing import Any

from pipeline import ConfigError, Model, ModelRequest, ModelText, hook
from turns import Message


async def ask(model: Model, system: str, user: str) -> str:
    """The text of `model`'s answer to one system and one user message.

    Failures of the model are raised as they are: the hook that asks fails with them, and
    the runtime reports it (`HookFailed`) under the hook's ``on_error``.
    """
    request = ModelRequest((Message.system(system), Message.user(user)))
    pieces: list[str] = []
    async with model.stream(request) as events:
        async for event in events:
            if isinstance(event, ModelText):
                pieces.append(event.text)
    return "".join(pieces)


def check_model(owner: str, model: object) -> None:
    """Raise unless `model` is a `Model` instance."""
    if not isinstance(model, Model) or isinstance(model, type):
        raise ConfigError(
            f"{owner}(model=...) needs a Model — an object with stream(request) — got"
            f" {type(model).__name__} {model!r}; offline, try pipeline.testing.ScriptedModel"
        )


def name_of(fn: Callable[..., Any]) -> str:
    """The name `hook` would give `fn`: its qualified name, or a hook's own name."""
    return hook(fn).name


def check_callable(owner: str, option: str, fn: object, arguments: tuple[Any, ...]) -> None:
    """Raise unless `fn` is callable with `arguments` (when its signature can be read)."""
    if not callable(fn):
        raise ConfigError(f"{owner}({option}=...) must be a function, got {fn!r}")
    try:
        inspect.signature(fn).bind(*arguments)
    except TypeError as exc:
        raise ConfigError(
            f"{owner}({option}={name_of(fn)}) cannot be called with {len(arguments)}"
            f" argument(s) as the hook calls it: {exc}"
        ) from None
    except ValueError:
        pass  # a signature that cannot be read: the first call will tell


def check_text(owner: str, option: str, value: object, *, optional: bool = True) -> None:
    """Raise unless `value` is non-empty text (or None, when `optional`)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        allowed = "non-empty text or None" if optional else "non-empty text"
        raise ConfigError(f"{owner}({option}=...) must be {allowed}, got {value!r}")
