"""Pipeline(...) validates every entry when it is built, and normalizes lists and functions."""

import re

import pytest

from pipeline import Budget, ConfigError, Hook, Pipeline, chain, cont, hook, parallel
from pipeline.testing import ScriptedModel


def model() -> ScriptedModel:
    return ScriptedModel(["ok"])


def greet(turn):
    return cont(turn)


async def lookup(turn):
    return [turn.user_message.text]


def keep_history(history, target, tokenizer):
    return history


# -- the model ------------------------------------------------------------------------------


class NotAModel:
    def complete(self, request):
        return "text"


@pytest.mark.parametrize("bad", [NotAModel(), "openai:gpt-4o-mini", None], ids=repr)
def test_a_model_without_stream_raises_config_error_naming_it(bad: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(type(bad).__name__)):
        Pipeline(model=bad)  # type: ignore[arg-type]


def test_a_model_is_required() -> None:
    with pytest.raises(TypeError, match="model"):
        Pipeline()  # type: ignore[call-arg]


def test_an_object_with_stream_is_accepted_as_a_model() -> None:
    scripted = model()

    assert Pipeline(model=scripted).model is scripted


# -- the pre list ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pre", "position"),
    [([42], 1), ([greet, "lookup"], 2), ([greet, lookup, None], 3)],
    ids=["int-at-1", "str-at-2", "none-at-3"],
)
def test_a_non_callable_pre_entry_raises_config_error_naming_its_position(
    pre: list[object], position: int
) -> None:
    with pytest.raises(ConfigError, match=rf"pre, position {position}\b"):
        Pipeline(model=model(), pre=pre)


def test_a_non_callable_pre_entry_error_shows_what_was_given() -> None:
    with pytest.raises(ConfigError, match="'not a hook'"):
        Pipeline(model=model(), pre=[greet, "not a hook"])


@pytest.mark.parametrize("pre", ["greet", 42, greet], ids=["str", "int", "bare-function"])
def test_a_pre_that_is_not_a_list_raises_config_error(pre: object) -> None:
    with pytest.raises(ConfigError, match="pre"):
        Pipeline(model=model(), pre=pre)  # type: ignore[arg-type]


def test_match_on_a_pre_hook_raises_config_error_naming_the_hook_and_position() -> None:
    matched = hook(greet, name="matched", match="search")

    with pytest.raises(ConfigError, match=r"'matched' \(pre, position 2\).*match"):
        Pipeline(model=model(), pre=[lookup, matched])


def test_background_on_a_pre_hook_raises_config_error_naming_the_hook_and_position() -> None:
    late = hook(greet, name="late", background=True)

    with pytest.raises(ConfigError, match=r"'late' \(pre, position 1\).*background"):
        Pipeline(model=model(), pre=[late])


def test_match_on_a_chain_member_raises_config_error_naming_it_with_the_chain_prefix() -> None:
    matched = hook(greet, name="matched", match="search")

    with pytest.raises(ConfigError, match=r"'intake.matched' \(pre, position 2.2\)"):
        Pipeline(model=model(), pre=[lookup, chain(greet, matched, name="intake")])


def test_background_on_a_parallel_member_raises_config_error_naming_its_position() -> None:
    late = hook(lookup, name="late", background=True)

    with pytest.raises(ConfigError, match=r"'late' \(pre, position 1.2\)"):
        Pipeline(model=model(), pre=[parallel(lookup, late)])


# -- compact, system, budget, tokenizer -----------------------------------------------------


def test_compact_without_a_budget_raises_config_error_naming_the_compactor() -> None:
    with pytest.raises(ConfigError, match=r"keep_history.*budget"):
        Pipeline(model=model(), compact=keep_history)


def test_compact_with_a_budget_is_accepted() -> None:
    pipe = Pipeline(model=model(), compact=keep_history, budget=Budget(1000, 200))

    assert pipe.compact is keep_history


@pytest.mark.parametrize("compact", ["summarize", 42], ids=repr)
def test_a_non_callable_compact_raises_config_error(compact: object) -> None:
    with pytest.raises(ConfigError, match="compact"):
        Pipeline(model=model(), compact=compact, budget=Budget(1000, 200))  # type: ignore[arg-type]


@pytest.mark.parametrize("system", [42, ["be brief"], b"be brief"], ids=repr)
def test_a_system_prompt_that_is_not_text_raises_config_error(system: object) -> None:
    with pytest.raises(ConfigError, match="system"):
        Pipeline(model=model(), system=system)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "budget", [4096, (4096, 512), {"context_tokens": 4096, "injection_reserve": 512}], ids=repr
)
def test_a_budget_that_is_not_a_budget_raises_config_error(budget: object) -> None:
    with pytest.raises(ConfigError, match="budget"):
        Pipeline(model=model(), budget=budget)  # type: ignore[arg-type]


@pytest.mark.parametrize("tokenizer", ["cl100k_base", 4], ids=repr)
def test_a_non_callable_tokenizer_raises_config_error(tokenizer: object) -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        Pipeline(model=model(), tokenizer=tokenizer)  # type: ignore[arg-type]


def test_a_callable_tokenizer_is_accepted() -> None:
    def count(text):
        return len(text.split())

    assert Pipeline(model=model(), tokenizer=count).tokenizer is count


def test_optional_fields_default_to_none_and_an_empty_pre() -> None:
    pipe = Pipeline(model=model())

    assert (pipe.pre, pipe.system, pipe.budget, pipe.tokenizer, pipe.compact) == (
        (),
        None,
        None,
        None,
        None,
    )


# -- normalization --------------------------------------------------------------------------


def test_a_pre_list_is_stored_as_a_tuple() -> None:
    pipe = Pipeline(model=model(), pre=[greet, lookup])

    assert type(pipe.pre) is tuple


def test_a_pre_generator_is_stored_as_a_tuple_in_order() -> None:
    pipe = Pipeline(model=model(), pre=(fn for fn in [lookup, greet]))

    assert [entry.name for entry in pipe.pre] == ["lookup", "greet"]


def test_plain_functions_in_pre_are_wrapped_into_hooks_with_the_defaults() -> None:
    pipe = Pipeline(model=model(), pre=[greet, lookup])

    assert pipe.pre == (hook(greet), hook(lookup))
    assert all(type(entry) is Hook for entry in pipe.pre)


def test_hooks_groups_and_chains_in_pre_are_kept_as_given() -> None:
    configured = hook(greet, name="configured", durable=True)
    group = parallel(lookup, name="group")
    steps = chain(greet, name="steps")

    pipe = Pipeline(model=model(), pre=[configured, group, steps])

    assert pipe.pre[0] is configured
    assert pipe.pre[1] is group
    assert pipe.pre[2] is steps


def test_a_pipeline_can_be_built_once_and_compared_by_value() -> None:
    scripted = model()

    assert Pipeline(model=scripted, pre=[greet], system="be brief") == Pipeline(
        model=scripted, pre=(greet,), system="be brief"
    )


def _takes_nothing():
    return None


def _takes_two(turn, extra):
    return cont(turn)


@pytest.mark.parametrize(
    ("entry", "label"),
    [
        (_takes_nothing, r"'_takes_nothing' \(pre, position 1\)"),
        (parallel(_takes_two), r"'_takes_two' \(pre, position 1\.1\)"),
    ],
)
def test_a_pre_hook_that_cannot_take_the_turn_is_rejected_when_built(entry, label):
    with pytest.raises(ConfigError, match=rf"{label} cannot be called as \w+\(turn\)"):
        Pipeline(model=ScriptedModel(["ok"]), pre=[entry])


def test_a_compact_that_cannot_take_its_three_arguments_is_rejected_when_built():
    def squash(history):
        return history

    with pytest.raises(ConfigError, match=r"compact=.*squash\(history, target_tokens, tokenizer\)"):
        Pipeline(model=ScriptedModel(["ok"]), budget=Budget(100, 10), compact=squash)


def _yields(turn):
    yield cont(turn)


async def _yields_async(turn):
    yield cont(turn)


@pytest.mark.parametrize(
    ("stage", "entry", "label"),
    [
        ("pre", _yields, r"'_yields' \(pre, position 1\)"),
        ("pre", parallel(_yields), r"'_yields' \(pre, position 1\.1\)"),
        ("post", _yields_async, r"'_yields_async' \(post, position 1\)"),
        (
            "before_tool",
            hook(lambda call, turn: (yield), name="gen"),
            r"'gen' \(before_tool, position 1\)",
        ),
    ],
    ids=["pre", "parallel-member", "post-async", "before-tool"],
)
def test_a_generator_function_hook_is_rejected_when_built(stage, entry, label):
    """Catches: a hook written with `yield` accepted when the pipeline is built, then failing
    every turn with a HookReturnError that says a generator came back but not why."""
    with pytest.raises(ConfigError, match=rf"{label} is a generator function .*instead of `yield`"):
        Pipeline(model=ScriptedModel(["ok"]), **{stage: [entry]})


def test_hooks_taking_the_turn_through_defaults_or_partials_are_accepted():
    import functools

    pipe = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[functools.partial(_takes_two, extra=1), lambda turn, more=None: cont(turn)],
    )
    assert len(pipe.pre) == 2


def test_a_model_class_instead_of_an_instance_raises_config_error_naming_it() -> None:
    # The class has a stream attribute too, but calling it would not stream a reply.
    with pytest.raises(ConfigError, match="ScriptedModel"):
        Pipeline(model=ScriptedModel)  # type: ignore[arg-type]
