"""Stage 6: the stream-transformer seam every text chunk passes through.

A transformer entry is a zero-argument factory; each attempt gets fresh instances, so state
held for a match that straddles chunks never leaks into the next attempt or turn. The seam is
synchronous and on the hot path: one call per transformer per chunk, nothing else.
"""

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, final, runtime_checkable

import anyio.lowlevel

from ._describe import describe
from ._errors import ConfigError, HookError, HookFailed, HookReturnError
from ._hooks import callable_name, is_async_callable


@runtime_checkable
class Transformer(Protocol):
    """What a transformer factory returns: text in, text out, held text released on flush.

    ``feed(text)`` returns the text that may be released now (possibly ``""`` while it holds
    a possible match back); ``flush()`` returns everything still held at the end of a model
    call. One instance serves a whole attempt: after a tool step, the next model call feeds
    it again, so ``feed`` must work after ``flush``. An optional ``annotations()`` method
    reports structured findings (read once, at the end of the attempt), which land in
    `Reply.annotations` under the transformer's name.
    """

    def feed(self, text: str) -> str: ...

    def flush(self) -> str: ...


TransformerFactory = Callable[[], Transformer]
"""A zero-argument callable returning a fresh `Transformer`."""

PIECE = 64 * 1024
"""The longest text handed to a transformer in one call.

A longer chunk is fed in pieces of this size with a checkpoint between them, so that one
huge chunk does not hold the event loop (other turns, timeouts, cancellation) while it is
transformed: a transformer must accept any split of its text anyway.
"""


@final
class _PerChunk:
    __slots__ = ("feed",)

    def __init__(self, fn: Callable[[str], str]) -> None:
        self.feed = fn

    def flush(self) -> str:
        return ""


@final
class PerChunk:
    """The factory `per_chunk` returns: a stateless ``str -> str`` function as a transformer."""

    __slots__ = ("fn", "name")

    def __init__(self, fn: Callable[[str], str], name: str) -> None:
        self.fn = fn
        self.name = name

    def __call__(self) -> Transformer:
        return _PerChunk(self.fn)

    def __repr__(self) -> str:
        return f"per_chunk({self.name})"


def per_chunk(fn: Callable[[str], str], *, name: str | None = None) -> PerChunk:
    """Adapt a stateless ``str -> str`` function into a transformer factory.

    Each chunk is transformed on its own, so the function must not need to see across chunk
    boundaries (a pattern that can straddle two chunks needs a stateful transformer such as
    `hooks.redact`).
    """
    if not callable(fn):
        raise ConfigError(f"per_chunk() needs a function str -> str, got {fn!r}")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigError(
            f"per_chunk({callable_name(fn)}, name=...) must be non-empty text (it keys the"
            f" transformer's annotations and names it in errors), got {describe(name)}"
        )
    if is_async_callable(fn):
        raise ConfigError(
            f"per_chunk({callable_name(fn)}) needs a plain function str -> str, got an async"
            " one: the seam is synchronous and on the hot path, so no I/O in transformers —"
            " do the I/O in a hook instead"
        )
    try:
        inspect.signature(fn).bind("")
    except TypeError as exc:
        raise ConfigError(
            f"per_chunk({callable_name(fn)}) cannot be called with one chunk of text: {exc}"
        ) from None
    except ValueError:
        pass  # a signature that cannot be read: the first chunk will tell
    return PerChunk(fn, name or callable_name(fn))


def transformer_name(factory: object) -> str:
    """The name a transformer's annotations and errors go under: ``.name`` or its function's."""
    name = getattr(factory, "name", None)
    return name if isinstance(name, str) and name else callable_name(factory)


@final
class CompiledTransformer:
    """One transformer factory as the pipeline runs it (checked once, named, placed).

    Not a `turns.CompiledTransformer` (a turn's pre/post) nor a hook `Step`: a transformer has no verdict.
    """

    __slots__ = ("factory", "label", "name")

    def __init__(self, factory: TransformerFactory, name: str, position: int) -> None:
        self.factory = factory
        self.name = name
        self.label = f"{name!r} (transformers, position {position})"


def compile_transformers(entries: Iterable[Any]) -> tuple[CompiledTransformer, ...]:
    """Check every transformer factory once, when the pipeline is built.

    The factory is called twice: it must return an object with ``feed`` and ``flush``, and a
    fresh one each time (a shared instance would carry held text from one turn into another).
    """
    compiled: list[CompiledTransformer] = []
    names: dict[str, int] = {}
    for position, factory in enumerate(entries, 1):
        # A class is a factory; an instance of a transformer is not.
        instance = isinstance(factory, Transformer) and not isinstance(factory, type)
        if not callable(factory) or instance:
            hint = (
                " — pass a factory that builds one, e.g. `lambda: MyTransformer()`"
                if instance
                else ""
            )
            raise ConfigError(
                f"transformers, position {position}: expected a zero-argument factory returning"
                f" an object with feed(text) and flush(), got {type(factory).__name__}"
                f" {factory!r}{hint}"
            )
        name = transformer_name(factory)
        if name in names:
            example = (
                "per_chunk(fn, name='shout')"
                if isinstance(factory, PerChunk)
                else "redact(..., name='redact_phone'), or a factory's own `name` attribute"
            )
            raise ConfigError(
                f"transformers, positions {names[name]} and {position}: both are named {name!r},"
                " and a transformer's name keys its annotations in Reply.annotations and names"
                f" it in errors — give one another name (e.g. {example})"
            )
        names[name] = position
        entry = CompiledTransformer(factory, name, position)
        try:
            first, second = factory(), factory()
        except Exception as exc:
            raise ConfigError(
                f"transformer {entry.label}: calling the factory raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(first, Transformer):
            raise ConfigError(
                f"transformer {entry.label}: the factory returned {type(first).__name__}"
                f" {first!r}, which lacks feed(text) -> str and flush() -> str"
            )
        if first is second:
            raise ConfigError(
                f"transformer {entry.label}: the factory returned the same object twice; each"
                " attempt needs a fresh instance (held text must not cross turns) — return a"
                " new object on every call"
            )
        annotations = getattr(first, "annotations", None)
        if annotations is not None and not callable(annotations):
            raise ConfigError(f"transformer {entry.label}: annotations must be a method")
        asynchronous = [
            f"{method}()"
            for method, fn in (
                ("feed", first.feed),
                ("flush", first.flush),
                ("annotations", annotations),
            )
            if fn is not None and is_async_callable(fn)
        ]
        if asynchronous:
            raise ConfigError(
                f"transformer {entry.label}: {' and '.join(asynchronous)}"
                f" {'is' if len(asynchronous) == 1 else 'are'} async; a transformer's methods"
                " must be plain ones: the seam is synchronous and on the hot path, so no I/O in"
                " transformers — do the I/O in a hook instead"
            )
        for method, fn, arguments in (
            ("feed", first.feed, ("",)),
            ("flush", first.flush, ()),
            ("annotations", annotations, ()),
        ):
            problem = None if fn is None else _call_problem(fn, arguments)
            if problem is not None:
                raise ConfigError(
                    f"transformer {entry.label}: {method} {problem} — a transformer's methods"
                    " are feed(text) -> str, flush() -> str and, optionally, annotations()"
                )
        compiled.append(entry)
    return tuple(compiled)


def _call_problem(fn: object, arguments: tuple[str, ...]) -> str | None:
    """Why `fn` cannot be called with `arguments`, or None (as far as its signature tells)."""
    if not callable(fn):
        return f"is {describe(fn)}, not a method"
    try:
        inspect.signature(fn).bind(*arguments)
    except TypeError as exc:
        given = "one chunk of text" if arguments else "no arguments"
        return f"cannot be called with {given}: {exc}"
    except ValueError:
        pass  # a signature that cannot be read: the first call will tell
    return None


@final
class Seam:
    """One attempt's transformer instances, chained in order."""

    __slots__ = ("_compiled", "_feeds", "_instances", "failure", "feed")

    def __init__(self, compiled: tuple[CompiledTransformer, ...]) -> None:
        self.failure: HookError | None = None
        """The error the seam raised, to tell it from one the model raised around it."""
        self._compiled = compiled
        self._instances: list[Transformer] = []
        self._feeds: list[Callable[[str], str]] = []
        for index, entry in enumerate(compiled):
            # Probed when the pipeline was built, a factory may still fail for an attempt.
            try:
                instance = entry.factory()
                self._feeds.append(instance.feed)
            except Exception as exc:
                raise self._failed(index, "its factory", exc) from exc
            self._instances.append(instance)
        self.feed: Callable[[str], str] = self._feed_one if len(compiled) == 1 else self._feed_many
        """Pass a chunk through every transformer; ``""`` when they hold it back."""

    def _feed_one(self, text: str) -> str:
        # `feed` for the common single transformer, without the loop.
        try:
            text = self._feeds[0](text)
        except Exception as exc:
            raise self._failed(0, "feed()", exc) from exc
        if type(text) is not str:
            raise self._wrong(0, "feed()", text)
        return text

    def _feed_many(self, text: str) -> str:
        for index, feed in enumerate(self._feeds):
            try:
                text = feed(text)
            except Exception as exc:
                raise self._failed(index, "feed()", exc) from exc
            if type(text) is not str:
                raise self._wrong(index, "feed()", text)
            if not text:
                break
        return text

    async def feed_pieces(self, text: str) -> str:
        """`feed` for a chunk longer than `PIECE`: in pieces, yielding to the loop between."""
        released: list[str] = []
        for start in range(0, len(text), PIECE):
            released.append(self.feed(text[start : start + PIECE]))
            await anyio.lowlevel.checkpoint()
        return "".join(released)

    def flush(self) -> str:
        """Release everything held, each transformer's tail fed through the ones after it."""
        text = ""
        for index, instance in enumerate(self._instances):
            try:
                if text:
                    text = instance.feed(text)
            except Exception as exc:
                # Its feed, given what the transformers before it released at the end.
                raise self._failed(index, "feed()", exc) from exc
            if type(text) is not str:
                raise self._wrong(index, "feed()", text)
            try:
                tail = instance.flush()
            except Exception as exc:
                raise self._failed(index, "flush()", exc) from exc
            if type(tail) is not str:
                raise self._wrong(index, "flush()", tail)
            text += tail
        return text

    def annotations(self) -> Mapping[str, Any]:
        """What the transformers reported, by transformer name (only those that report)."""
        found: dict[str, Any] = {}
        for entry, instance in zip(self._compiled, self._instances, strict=True):
            report = getattr(instance, "annotations", None)
            if report is None:
                continue
            try:
                found[entry.name] = report()
            except Exception as exc:
                raise self._failed(self._compiled.index(entry), "annotations()", exc) from exc
        return found

    def _wrong(self, index: int, method: str, value: object) -> HookReturnError:
        entry = self._compiled[index]
        if inspect.iscoroutine(value):
            value.close()  # never to be awaited: no "never awaited" warning after the error
        # Its type only: the value is made from the model's text before this transformer
        # (and those after it) changed it, which only the transformed text may show.
        self.failure = HookReturnError(
            f"expected transformer {entry.label} to return str from {method}, got"
            f" {type(value).__name__}",
            hook=entry.name,
            stage="transformers",
        )
        return self.failure

    def _failed(self, index: int, method: str, exc: Exception) -> HookFailed:
        entry = self._compiled[index]
        # Its type only, as in `_wrong`: an exception's message may quote the text it was
        # given (a replacement's KeyError names the match), which the transformer was there
        # to change. The exception itself is the error's __cause__, for the traceback.
        failure = HookFailed(
            f"transformer {entry.label} raised {type(exc).__name__} in {method}; the turn"
            " stops, since its text cannot be released untransformed (its message is left"
            " out, as it may quote that text; the exception is this error's __cause__)",
            hook=entry.name,
            stage="transformers",
        )
        self.failure = failure
        return failure
