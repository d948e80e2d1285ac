"""The exceptions turnplug raises.

Halts, blocks, rejections and an exhausted regeneration bound are outcomes (data on the
`TurnResult`); everything below is a failure, and a failed turn commits nothing::

    PipelineError
    ├── ConfigError                      bad pipeline definition or config file; .source, .problems
    ├── HookError                        .hook, .stage
    │   ├── HookFailed                   the hook raised; __cause__ is the original exception
    │   ├── HookTimeout
    │   └── HookReturnError (TypeError)  wrong signal for the stage
    ├── BudgetError
    │   ├── InjectionOverflow            .hook, .tokens, .total, .reserve
    │   └── ContextOverflow              .tokens, .limit
    ├── LogConflict                      the conversation grew since the load; .conversation_id, .expected, .actual
    ├── LogError                         the log's storage failed (sqlite3, psycopg); .log
    ├── RequestError                     invalid request caught locally (tool_choice vs active tools); .hook
    ├── StepLimitExceeded                the tool loop reached max_steps model calls; .attempt, .max_steps
    ├── ToolsetError                     a toolset's server could not be reached; .toolset
    └── ProviderError                    .provider, .status, .request_id where known
        ├── ProviderConnectionError
        ├── ProviderTimeout
        ├── ProviderStatusError          non-2xx; .body
        │   └── RateLimited              .retry_after
        └── ProviderProtocolError        malformed or truncated stream

`run`, `stream` and `session.send` raise these directly, never wrapped in an
`ExceptionGroup`.
"""

from typing import Any, final


class PipelineError(Exception):
    """Base of every turnplug failure."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The subclasses take keyword-only context (.hook, .status, ...), which the default
        # pickling (cls(*args)) cannot pass: rebuild from the message and the attributes, so
        # errors cross process boundaries (worker pools, multiprocessing) intact.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(
    cls: type[PipelineError], args: tuple[Any, ...], state: dict[str, Any]
) -> PipelineError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


@final
class ConfigError(PipelineError):
    """A pipeline definition or config file is invalid; the message names the culprit.

    Attributes:
        source: The config file (or other source) at fault, when there is one.
        problems: Every problem found in it, as ``(path, message)`` pairs with paths like
            ``pre[2].ref`` (``""`` for the whole file); empty when the error is not about
            values in a config.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        problems: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.source = source
        self.problems = problems


class HookError(PipelineError):
    """A hook failed.

    Attributes:
        hook: The hook's name.
        stage: The stage it ran in (``"pre"``, ``"post"``, ...).
    """

    def __init__(self, message: str, *, hook: str, stage: str) -> None:
        super().__init__(message)
        self.hook = hook
        self.stage = stage


@final
class HookFailed(HookError):
    """The hook raised; the original exception is ``__cause__``."""


@final
class HookTimeout(HookError):
    """The hook ran past its ``timeout``.

    Attributes:
        timeout: The limit, in seconds.
    """

    def __init__(self, message: str, *, hook: str, stage: str, timeout: float) -> None:
        super().__init__(message, hook=hook, stage=stage)
        self.timeout = timeout


@final
class HookReturnError(HookError, TypeError):
    """The hook returned something its stage does not allow."""


class BudgetError(PipelineError):
    """The turn does not fit its token budget."""


@final
class InjectionOverflow(BudgetError):
    """A hook's injections pushed the turn's injected tokens over the reserve.

    Attributes:
        hook: The hook whose injections crossed the reserve.
        tokens: What that hook injected, in tokens.
        total: The turn's injected tokens, that hook's included.
        reserve: The budget's ``injection_reserve``.
    """

    def __init__(self, message: str, *, hook: str, tokens: int, total: int, reserve: int) -> None:
        super().__init__(message)
        self.hook = hook
        self.tokens = tokens
        self.total = total
        self.reserve = reserve


@final
class ContextOverflow(BudgetError):
    """The rendered request is larger than the budget's ``context_tokens``.

    Attributes:
        tokens: The rendered request's size.
        limit: The budget's ``context_tokens``.
    """

    def __init__(self, message: str, *, tokens: int, limit: int) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.limit = limit


@final
class LogConflict(PipelineError):
    """The conversation grew since this turn loaded it; nothing was committed.

    Attributes:
        conversation_id: The conversation, when known.
        expected: How many messages the writer expected the log to hold.
        actual: How many it held.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.expected = expected
        self.actual = actual


@final
class LogError(PipelineError):
    """A durable log's storage failed: the database could not be opened, read or written.

    The driver's own exception (`sqlite3.Error`, `psycopg.Error`) is ``__cause__``, or is
    in its chain. A commit that fails this way wrote nothing, unless the message says it
    may have reached the server (a PostgreSQL connection given up on before its answer
    came): a session reloads the conversation before its next turn either way.

    Attributes:
        log: Which log, as its repr shows it (a path, or a DSN without its password).
    """

    def __init__(self, message: str, *, log: str) -> None:
        super().__init__(message)
        self.log = log


@final
class ToolsetError(PipelineError):
    """A toolset's server (an MCP server) could not be started, reached or listed.

    Raised when the toolsets are opened (``async with pipe``, a session, a turn outside
    both); a server failing during a turn gives that call a ``tool_error`` result instead.

    Attributes:
        toolset: The toolset's name.
    """

    def __init__(self, message: str, *, toolset: str) -> None:
        super().__init__(message)
        self.toolset = toolset


@final
class RequestError(PipelineError):
    """The request is invalid and was caught before any provider call.

    Attributes:
        hook: The hook that shaped the request (set ``tool_choice`` or narrowed
            ``active_tools``) when one did; None when the request is as the turn built it.
    """

    def __init__(self, message: str, *, hook: str | None = None) -> None:
        super().__init__(message)
        self.hook = hook


@final
class StepLimitExceeded(PipelineError):
    """The tool loop reached ``max_steps`` model calls without a final answer.

    Attributes:
        attempt: The attempt (1 for the first answer, more after regenerations).
        max_steps: The pipeline's bound on model calls per attempt.
    """

    def __init__(
        self, message: str, *, attempt: int | None = None, max_steps: int | None = None
    ) -> None:
        super().__init__(message)
        self.attempt = attempt
        self.max_steps = max_steps


class ProviderError(PipelineError):
    """The model provider failed.

    Attributes:
        provider: The provider's name (``"openai"``, ``"anthropic"``, ``"scripted"``, ...).
        status: The HTTP status, where there was one.
        request_id: The provider's request id, where it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.request_id = request_id


@final
class ProviderConnectionError(ProviderError):
    """The provider could not be reached, or dropped the connection."""


@final
class ProviderTimeout(ProviderError):
    """The provider did not answer in time."""


class ProviderStatusError(ProviderError):
    """The provider answered with a non-2xx status.

    Attributes:
        body: The response body, as text.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int,
        body: str = "",
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status=status, request_id=request_id)
        self.body = body


@final
class RateLimited(ProviderStatusError):
    """The provider rate-limited the request.

    Attributes:
        retry_after: Seconds the provider asked to wait, where it said.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int = 429,
        body: str = "",
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            message, provider=provider, status=status, body=body, request_id=request_id
        )
        self.retry_after = retry_after


@final
class ProviderProtocolError(ProviderError):
    """The provider's stream was malformed or truncated, or carried an error event."""
