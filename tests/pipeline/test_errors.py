"""The exception tree of `pipeline`: classes, bases, attributes, and the tree in the docs."""

import re

import pytest

import pipeline
from pipeline import (
    BudgetError,
    ConfigError,
    ContextOverflow,
    HookError,
    HookFailed,
    HookReturnError,
    HookTimeout,
    InjectionOverflow,
    LogConflict,
    LogError,
    PipelineError,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
    RateLimited,
    RequestError,
    StepLimitExceeded,
    ToolsetError,
)

# The public tree, LogError and ToolsetError included (docs/decisions.md): every class with its base
# classes, in order.
ERROR_TREE: dict[type, tuple[type, ...]] = {
    PipelineError: (Exception,),
    ConfigError: (PipelineError,),
    HookError: (PipelineError,),
    HookFailed: (HookError,),
    HookTimeout: (HookError,),
    HookReturnError: (HookError, TypeError),
    BudgetError: (PipelineError,),
    InjectionOverflow: (BudgetError,),
    ContextOverflow: (BudgetError,),
    LogConflict: (PipelineError,),
    LogError: (PipelineError,),
    RequestError: (PipelineError,),
    ToolsetError: (PipelineError,),
    StepLimitExceeded: (PipelineError,),
    ProviderError: (PipelineError,),
    ProviderConnectionError: (ProviderError,),
    ProviderTimeout: (ProviderError,),
    ProviderStatusError: (ProviderError,),
    RateLimited: (ProviderStatusError,),
    ProviderProtocolError: (ProviderError,),
}

# One instance of every class, built with the attributes it documents.
EXAMPLES: dict[type, PipelineError] = {
    PipelineError: PipelineError("failed"),
    ConfigError: ConfigError("pre[2].tool: required"),
    HookError: HookError("failed", hook="guard", stage="post"),
    HookFailed: HookFailed("failed", hook="guard", stage="post"),
    HookTimeout: HookTimeout("failed", hook="guard", stage="post", timeout=2.5),
    HookReturnError: HookReturnError("failed", hook="guard", stage="post"),
    BudgetError: BudgetError("too big"),
    InjectionOverflow: InjectionOverflow(
        "too big", hook="search", tokens=120, total=130, reserve=100
    ),
    ContextOverflow: ContextOverflow("too big", tokens=9000, limit=8000),
    LogConflict: LogConflict("grew"),
    LogError: LogError("disk full", log="SQLiteLog('chat.db')"),
    RequestError: RequestError("bad tool_choice"),
    ToolsetError: ToolsetError("MCP server 'memory' did not answer initialize", toolset="memory"),
    StepLimitExceeded: StepLimitExceeded("too many steps"),
    ProviderError: ProviderError("failed", provider="openai", status=500, request_id="req-1"),
    ProviderConnectionError: ProviderConnectionError("failed", provider="openai"),
    ProviderTimeout: ProviderTimeout("failed", provider="openai"),
    ProviderStatusError: ProviderStatusError(
        "failed", provider="openai", status=400, body='{"error": "bad"}', request_id="req-2"
    ),
    RateLimited: RateLimited(
        "failed", provider="anthropic", status=429, body="slow down", retry_after=1.5
    ),
    ProviderProtocolError: ProviderProtocolError("failed", provider="openai"),
}


def subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *subclasses(sub)}
    return found


def docstring_tree() -> dict[str, tuple[str | None, tuple[str, ...], str]]:
    """The tree drawn in the errors module's docstring.

    Returns name -> (parent name, extra bases in parentheses, the rest of the line).
    """
    lines = pipeline._errors.__doc__.splitlines()
    root = next(i for i, line in enumerate(lines) if line.strip() == "PipelineError")
    root_indent = len(lines[root]) - len(lines[root].lstrip())
    tree: dict[str, tuple[str | None, tuple[str, ...], str]] = {"PipelineError": (None, (), "")}
    parents = ["PipelineError"]  # parents[depth] is the last class seen at that depth
    for line in lines[root + 1 :]:
        drawn = re.match(r"^(?P<indent>[\s│]*)[├└]── (?P<name>\w+)(?P<rest>.*)$", line)
        if drawn is None:
            break
        depth = (len(drawn["indent"]) - root_indent) // 4 + 1
        rest = drawn["rest"]
        extra = re.match(r"^\s*\(([\w, ]+)\)", rest)
        bases = tuple(b.strip() for b in extra[1].split(",")) if extra else ()
        del parents[depth:]
        tree[drawn["name"]] = (parents[depth - 1], bases, rest)
        parents.append(drawn["name"])
    return tree


# -- the classes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "bases"), list(ERROR_TREE.items()), ids=[c.__name__ for c in ERROR_TREE]
)
def test_error_class_has_its_documented_bases(cls: type, bases: tuple[type, ...]):
    assert cls.__bases__ == bases


def test_the_tree_holds_no_undocumented_class():
    assert subclasses(PipelineError) == set(ERROR_TREE) - {PipelineError}


def test_hook_return_error_is_also_a_type_error():
    with pytest.raises(TypeError):
        raise EXAMPLES[HookReturnError]


@pytest.mark.parametrize("cls", list(ERROR_TREE), ids=[c.__name__ for c in ERROR_TREE])
def test_every_error_is_importable_from_pipeline(cls: type):
    assert getattr(pipeline, cls.__name__) is cls


# -- the attributes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls", [HookError, HookFailed, HookTimeout, HookReturnError], ids=lambda c: c.__name__
)
def test_hook_errors_carry_hook_and_stage(cls: type):
    error = EXAMPLES[cls]

    assert (error.hook, error.stage) == ("guard", "post")


def test_injection_overflow_carries_hook_tokens_total_and_reserve():
    error = EXAMPLES[InjectionOverflow]

    assert (error.hook, error.tokens, error.total, error.reserve) == ("search", 120, 130, 100)


def test_context_overflow_carries_tokens_and_limit():
    error = EXAMPLES[ContextOverflow]

    assert (error.tokens, error.limit) == (9000, 8000)


def test_log_error_carries_the_log():
    assert EXAMPLES[LogError].log == "SQLiteLog('chat.db')"


def test_provider_error_carries_provider_status_and_request_id():
    error = EXAMPLES[ProviderError]

    assert (error.provider, error.status, error.request_id) == ("openai", 500, "req-1")


@pytest.mark.parametrize(
    "cls",
    [ProviderError, ProviderConnectionError, ProviderTimeout, ProviderProtocolError],
    ids=lambda c: c.__name__,
)
def test_provider_error_status_and_request_id_default_to_unknown(cls: type):
    error = cls("failed", provider="openai")

    assert (error.provider, error.status, error.request_id) == ("openai", None, None)


def test_provider_status_error_carries_body_and_provider_fields():
    error = EXAMPLES[ProviderStatusError]

    assert (error.provider, error.status, error.request_id, error.body) == (
        "openai",
        400,
        "req-2",
        '{"error": "bad"}',
    )


def test_rate_limited_carries_retry_after_and_status_error_fields():
    error = EXAMPLES[RateLimited]

    assert (error.provider, error.status, error.body, error.retry_after) == (
        "anthropic",
        429,
        "slow down",
        1.5,
    )


# -- the tree in the docs --------------------------------------------------------------------


def test_docstring_tree_names_every_error_class():
    assert set(docstring_tree()) == {cls.__name__ for cls in ERROR_TREE}


def test_docstring_tree_matches_the_real_class_hierarchy():
    drawn = {
        name: ((parent,) if parent else ("Exception",)) + extra
        for name, (parent, extra, _) in docstring_tree().items()
    }
    real = {
        name: tuple(base.__name__ for base in getattr(pipeline, name).__bases__) for name in drawn
    }

    assert drawn == real


def test_docstring_tree_names_only_attributes_the_errors_have():
    listed = {
        name: re.findall(r"(?<![\w.])\.(\w+)", rest)
        for name, (_, _, rest) in docstring_tree().items()
    }
    missing = [
        f"{name}.{attribute}"
        for name, attributes in listed.items()
        for attribute in attributes
        if not hasattr(EXAMPLES[getattr(pipeline, name)], attribute)
    ]

    assert sum(map(len, listed.values())) >= 10  # the attribute notes were found at all
    assert missing == []


@pytest.mark.parametrize(
    "cls", sorted(EXAMPLES, key=lambda cls: cls.__name__), ids=lambda c: c.__name__
)
def test_every_error_survives_pickling_with_its_message_and_attributes(cls):
    import pickle

    error = EXAMPLES[cls]
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), vars(copy)) == (str(error), vars(error))
