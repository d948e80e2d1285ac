"""hook(), parallel() and chain(): wrapping functions with options, validated when built."""

import math
import re

import pytest

from pipeline import (
    Chain,
    ConfigError,
    Halt,
    Hook,
    HookFailed,
    HookReturnError,
    Parallel,
    Pipeline,
    PipelineError,
    block,
    chain,
    cont,
    hook,
    parallel,
    tool,
)
from pipeline.testing import ScriptedModel
from turns import Text, Turn


def tag_request(turn):
    return cont(turn)


async def fetch_notes(turn):
    return cont(turn)


# -- hook() as a call and as a decorator ------------------------------------------------------


def test_hook_called_on_a_function_returns_a_hook_holding_it() -> None:
    wrapped = hook(tag_request)

    assert isinstance(wrapped, Hook)
    assert wrapped.fn is tag_request


def test_hook_defaults_match_the_contract() -> None:
    wrapped = hook(tag_request)

    assert (
        wrapped.durable,
        wrapped.timeout,
        wrapped.on_error,
        wrapped.shadow,
        wrapped.when,
        wrapped.match,
        wrapped.background,
    ) == (False, None, "halt", False, None, None, False)


def test_bare_hook_decorator_wraps_the_function() -> None:
    @hook
    def stamp(turn):
        return cont(turn)

    assert isinstance(stamp, Hook)
    assert stamp.name == "test_bare_hook_decorator_wraps_the_function.stamp"


def test_hook_decorator_with_options_applies_them() -> None:
    @hook(name="notes", durable=True, timeout=2.5, on_error="skip")
    async def load_notes(turn):
        return cont(turn)

    assert (load_notes.name, load_notes.durable, load_notes.timeout, load_notes.on_error) == (
        "notes",
        True,
        2.5,
        "skip",
    )


def test_default_name_is_the_module_level_qualified_name() -> None:
    assert hook(fetch_notes).name == "fetch_notes"


def test_default_name_drops_locals_from_the_qualified_name() -> None:
    def inner(turn):
        return cont(turn)

    assert hook(inner).name == "test_default_name_drops_locals_from_the_qualified_name.inner"


def test_default_name_of_a_method_is_class_dot_method() -> None:
    class Guard:
        def check(self, turn):
            return cont(turn)

    assert hook(Guard().check).name == (
        "test_default_name_of_a_method_is_class_dot_method.Guard.check"
    )


def test_explicit_name_none_means_the_default_name() -> None:
    assert hook(fetch_notes, name=None).name == "fetch_notes"


def test_rewrapping_a_hook_keeps_the_options_not_given_again() -> None:
    def when(turn):
        return True

    original = hook(tag_request, name="tagger", durable=True, timeout=3, on_error="skip", when=when)

    rewrapped = hook(original, shadow=True)

    assert rewrapped == Hook(
        fn=tag_request,
        name="tagger",
        durable=True,
        timeout=3,
        on_error="skip",
        shadow=True,
        when=when,
    )


def test_rewrapping_a_hook_overrides_the_options_given_again() -> None:
    original = hook(tag_request, name="tagger", durable=True)

    rewrapped = hook(original, name="renamed", durable=False)

    assert (rewrapped.name, rewrapped.durable) == ("renamed", False)


def test_hook_refuses_to_wrap_a_parallel_group() -> None:
    group = parallel(fetch_notes, name="lookups")

    with pytest.raises(ConfigError, match="lookups"):
        hook(group, durable=True)  # type: ignore[call-overload]


def test_hook_refuses_to_wrap_a_chain() -> None:
    steps = chain(tag_request, name="steps")

    with pytest.raises(ConfigError, match="steps"):
        hook(steps, timeout=1)  # type: ignore[call-overload]


# -- a Hook is a plain callable -------------------------------------------------------------


def test_a_sync_hook_is_callable_and_returns_what_its_function_returns() -> None:
    turn = Turn.start("hi")

    assert hook(tag_request)(turn) == cont(turn)


async def test_an_async_hook_is_awaitable_and_returns_what_its_function_returns() -> None:
    turn = Turn.start("hi")

    assert await hook(fetch_notes)(turn) == cont(turn)


def test_calling_a_hook_passes_every_argument_to_its_function() -> None:
    seen = []

    def before_tool(call, turn):
        seen.append((call, turn))
        return cont(call)

    hook(before_tool)("the call", "the turn")

    assert seen == [("the call", "the turn")]


# -- invalid options raise ConfigError naming the hook --------------------------------------


def test_a_non_callable_function_raises_config_error_naming_the_hook() -> None:
    with pytest.raises(ConfigError, match="guard_input"):
        hook("not a function", name="guard_input")  # type: ignore[call-overload]


def test_a_non_callable_function_raises_config_error_showing_what_was_given() -> None:
    with pytest.raises(ConfigError, match="12345"):
        hook(12345)  # type: ignore[call-overload]


def test_an_empty_name_raises_config_error_naming_the_function() -> None:
    with pytest.raises(ConfigError, match="tag_request"):
        hook(tag_request, name="")


def test_a_non_string_name_raises_config_error() -> None:
    with pytest.raises(ConfigError, match=r"tag_request|42"):
        hook(tag_request, name=42)  # type: ignore[call-overload]


@pytest.mark.parametrize("option", ["durable", "shadow", "background"])
@pytest.mark.parametrize("value", [1, 0, "yes", None], ids=repr)
def test_a_non_bool_flag_raises_config_error_naming_the_hook(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"'tag_request'.*{option}"):
        hook(tag_request, **{option: value})


@pytest.mark.parametrize(
    "timeout", [0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "5"], ids=repr
)
def test_an_invalid_timeout_raises_config_error_naming_the_hook(timeout: object) -> None:
    with pytest.raises(ConfigError, match=r"'tag_request'.*timeout"):
        hook(tag_request, timeout=timeout)  # type: ignore[call-overload]


@pytest.mark.parametrize("timeout", [0.001, 1, 2.5, 3600])
def test_a_positive_finite_timeout_is_accepted(timeout: float) -> None:
    assert hook(tag_request, timeout=timeout).timeout == timeout


@pytest.mark.parametrize("on_error", ["ignore", "HALT", "", None, True], ids=repr)
def test_on_error_other_than_halt_or_skip_raises_config_error_naming_the_hook(
    on_error: object,
) -> None:
    with pytest.raises(ConfigError, match=r"'tag_request'.*on_error"):
        hook(tag_request, on_error=on_error)  # type: ignore[call-overload]


@pytest.mark.parametrize("when", [True, "always", 1], ids=repr)
def test_a_non_callable_when_raises_config_error_naming_the_hook(when: object) -> None:
    with pytest.raises(ConfigError, match=r"'tag_request'.*when"):
        hook(tag_request, when=when)  # type: ignore[call-overload]


@pytest.mark.parametrize("match", [42, b"search", ["search", "fetch"]], ids=repr)
def test_a_match_of_the_wrong_type_raises_config_error_naming_the_hook(match: object) -> None:
    with pytest.raises(ConfigError, match=r"'tag_request'.*match"):
        hook(tag_request, match=match)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "when", [lambda: True, lambda turn, extra: True, math.isclose], ids=["none", "two", "builtin"]
)
def test_a_when_predicate_that_cannot_take_the_turn_raises_config_error(when: object) -> None:
    """Catches: a ``when=`` that cannot be called with the turn alone accepted when the
    hook is built, and found only mid-turn, as a HookFailed of the hook."""
    with pytest.raises(ConfigError, match=r"'tag_request': when= must be a predicate turn"):
        hook(tag_request, when=when)  # type: ignore[call-overload]


def test_a_match_predicate_that_cannot_take_the_name_raises_config_error() -> None:
    """Catches: a ``match=`` predicate that cannot be called with the tool's name alone
    accepted when the hook is built, and found only when a tool is called, as a HookFailed."""
    with pytest.raises(ConfigError, match=r"'tag_request': match= must be a predicate name"):
        hook(tag_request, match=lambda name, turn: True)


@pytest.mark.parametrize("match", ["", re.compile(b"search")], ids=repr)
def test_a_match_that_can_match_no_tool_name_raises_config_error(match: object) -> None:
    """Catches: ``match=""`` (a hook that silently never runs) and a bytes regex (which
    failed with a bare TypeError, naming no hook, at the first tool call) accepted."""
    with pytest.raises(ConfigError, match=r"'tag_request': match="):
        hook(tag_request, match=match)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "match", ["search", re.compile(r"search_\w+"), lambda name: name.startswith("s")], ids=repr
)
def test_a_tool_name_regex_or_predicate_is_a_valid_match(match: object) -> None:
    assert hook(tag_request, match=match).match is match  # type: ignore[call-overload]


def test_rewrapping_a_hook_with_an_invalid_option_raises_config_error_naming_it() -> None:
    original = hook(tag_request, name="tagger")

    with pytest.raises(ConfigError, match="'tagger'"):
        hook(original, timeout=-1)


# -- parallel() -----------------------------------------------------------------------------


def test_parallel_with_no_members_raises_config_error() -> None:
    with pytest.raises(ConfigError, match=r"parallel\(\)"):
        parallel()


def test_parallel_wraps_plain_functions_into_hooks_in_declaration_order() -> None:
    group = parallel(tag_request, fetch_notes)

    assert group.members == (hook(tag_request), hook(fetch_notes))


def test_parallel_keeps_hooks_as_they_are() -> None:
    notes = hook(fetch_notes, durable=True)

    assert parallel(notes).members[0] is notes


def test_parallel_default_name_lists_its_members_in_order() -> None:
    name = parallel(tag_request, fetch_notes).name

    assert "tag_request" in name
    assert "fetch_notes" in name
    assert name.index("tag_request") < name.index("fetch_notes")


def test_parallel_uses_the_name_given() -> None:
    assert parallel(tag_request, name="lookups").name == "lookups"


def test_parallel_with_an_empty_name_raises_config_error() -> None:
    with pytest.raises(ConfigError):
        parallel(tag_request, name="")


def test_parallel_with_a_non_callable_member_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="42"):
        parallel(tag_request, 42)  # type: ignore[arg-type]


def test_parallel_nested_in_parallel_raises_config_error_naming_the_member() -> None:
    inner = parallel(fetch_notes, name="inner_group")

    with pytest.raises(ConfigError, match=r"member 2.*inner_group"):
        parallel(tag_request, inner)  # type: ignore[arg-type]


def test_chain_as_a_parallel_member_raises_config_error_naming_the_member() -> None:
    steps = chain(tag_request, name="steps")

    with pytest.raises(ConfigError, match=r"member 1.*steps"):
        parallel(steps)  # type: ignore[arg-type]


def test_parallel_returns_a_parallel_record() -> None:
    assert isinstance(parallel(tag_request), Parallel)


# -- chain() --------------------------------------------------------------------------------


def test_chain_with_no_members_raises_config_error() -> None:
    with pytest.raises(ConfigError, match=r"chain\(\)"):
        chain()


def test_chain_with_a_non_callable_member_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="'oops'"):
        chain(tag_request, "oops")  # type: ignore[arg-type]


def test_chain_wraps_plain_functions_and_keeps_groups_and_chains_in_order() -> None:
    group = parallel(fetch_notes, name="group")
    inner = chain(tag_request, name="inner")

    steps = chain(tag_request, group, inner)

    assert steps.members == (hook(tag_request), group, inner)


def test_chain_default_name_lists_its_members_in_order() -> None:
    name = chain(fetch_notes, tag_request).name

    assert "fetch_notes" in name
    assert "tag_request" in name
    assert name.index("fetch_notes") < name.index("tag_request")


def test_chain_uses_the_name_given() -> None:
    assert chain(tag_request, name="intake").name == "intake"


def test_chain_with_an_empty_name_raises_config_error() -> None:
    with pytest.raises(ConfigError):
        chain(tag_request, name="")


def test_chain_returns_a_chain_record() -> None:
    assert isinstance(chain(tag_request), Chain)


def test_a_configured_decorator_names_every_function_it_wraps() -> None:
    decorate = hook(name="guard", timeout=1.0)

    def first(turn: Turn) -> object:
        return cont(turn)

    def second(turn: Turn) -> object:
        return cont(turn)

    assert [decorate(first).name, decorate(second).name] == ["guard", "guard"]


def test_an_async_when_predicate_is_rejected_naming_the_hook() -> None:
    async def later(turn: Turn) -> bool:
        return True

    def fn(turn: Turn) -> object:
        return cont(turn)

    with pytest.raises(ConfigError, match=r"'gated'.*async"):
        hook(fn, name="gated", when=later)


def test_public_functions_report_their_public_module() -> None:
    assert {f.__module__ for f in (hook, parallel, chain, cont)} == {"pipeline"}


@pytest.mark.parametrize(("build", "name"), [(parallel, "parallel()"), (chain, "chain()")])
def test_an_empty_group_or_chain_says_what_to_pass(build, name) -> None:
    """Catches: a refusal that says what is wrong but not what to write instead."""
    with pytest.raises(ConfigError, match=re.escape(name)) as excinfo:
        build()
    assert "got none" in str(excinfo.value)
    assert re.search(rf"e\.g\. {re.escape(name[:-2])}\(\w+, \w+\)", str(excinfo.value))


@pytest.mark.parametrize(
    ("returned", "says"),
    [
        (lambda turn: Halt(3), "returned a Halt whose reason is int 3, not text"),
        (lambda turn: cont(turn.inject(Text(None))), "Text.text must be a str, got NoneType"),
    ],
)
async def test_a_pre_hook_returning_malformed_content_fails_naming_it(returned, says):
    """Catches: a hand-built Halt(3) taken as a halt (its reason then carried as data by the
    result, the events and the audit record), and an injected Text(None) failing only when
    the turn renders, as the model provider's failure."""
    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[hook(returned, name="bad")])
    with pytest.raises(PipelineError) as info:
        await pipe.run(Turn.start("hi"))
    assert isinstance(info.value, HookReturnError | HookFailed)
    assert info.value.hook == "bad"
    assert says in str(info.value)


def test_a_tool_hook_matching_a_tool_the_pipeline_lacks_is_a_config_error() -> None:
    """Catches: a before_tool policy whose match= misspells a local tool's name ("delete_fle")
    accepted, so the hook never ran and the tool ran unjudged — as MCP tools already were."""

    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        return path

    policy = hook(lambda call, turn: block("not today"), name="policy", match="delete_fle")
    with pytest.raises(ConfigError, match=r"'delete_fle', which is not among.*'delete_file'"):
        Pipeline(model=ScriptedModel([]), tools=[delete_file], before_tool=[policy])


def test_a_pipeline_without_tools_may_match_any_name() -> None:
    """Catches: the check above refusing the tool policy of a pipeline that judges tools its
    callers run (judge_tool_call, the gateway's client tools), which it cannot know."""
    policy = hook(lambda call, turn: block("not today"), name="policy", match="client_tool")
    assert Pipeline(model=ScriptedModel([]), before_tool=[policy]).before_tool == (policy,)
