"""Contract points a mutation run showed no other test pinned down."""

import anyio
import pytest

from pipeline import (
    Budget,
    ConfigError,
    HookFailed,
    HookReturnError,
    HookTimeout,
    Pipeline,
    ProviderError,
    cont,
    halt,
    hook,
    parallel,
)
from pipeline import events as ev
from pipeline.testing import ScriptedModel
from turns import Text, Turn


def member(name, delay, result, **options):
    async def run(turn):
        await anyio.sleep(delay)
        if isinstance(result, Exception):
            raise result
        return result

    return hook(run, name=name, **options)


def pipe_of(*pre, **options):
    return Pipeline(model=ScriptedModel(["ok"]), pre=list(pre), **options)


async def test_a_shadow_members_halt_does_not_cancel_its_siblings(autojump_clock):
    group = parallel(
        member("slow", 2, [Text("slow")]),
        member("watch", 1, halt("would stop"), shadow=True),
    )
    result = await pipe_of(group).run(Turn.start("hi"))
    assert [i.source for i in result.turn.injections] == ["slow"]


async def test_a_group_members_timeout_applies(autojump_clock):
    group = parallel(member("slow", 60, [Text("late")], timeout=1))
    started = anyio.current_time()
    with pytest.raises(HookTimeout, match="'slow'"):
        await pipe_of(group).run(Turn.start("hi"))
    assert anyio.current_time() - started == 1


async def test_a_group_members_timeout_with_skip_lets_the_others_land(autojump_clock):
    group = parallel(
        member("slow", 60, [Text("late")], timeout=1, on_error="skip"),
        member("fast", 0, [Text("fast")]),
    )
    result = await pipe_of(group).run(Turn.start("hi"))
    assert [i.source for i in result.turn.injections] == ["fast"]


async def test_in_a_group_a_failure_wins_over_a_halt(autojump_clock):
    group = parallel(member("gate", 1, halt("no")), member("broken", 1, ValueError("x")))
    with pytest.raises(HookFailed, match="'broken'"):
        await pipe_of(group).run(Turn.start("hi"))


async def test_a_note_names_the_other_failing_member(autojump_clock):
    group = parallel(
        member("a", 1, ValueError("first")), member("b", 1, KeyError("second")), name="g"
    )
    with pytest.raises(HookFailed) as info:
        await pipe_of(group).run(Turn.start("hi"))
    assert any("'b'" in note and "second" in note for note in info.value.__notes__)


async def test_model_called_and_the_audit_number_the_first_attempt_one():
    pipe = pipe_of()
    async with pipe.stream(Turn.start("hi")) as events:
        called = [(e.attempt, e.step) async for e in events if isinstance(e, ev.ModelCalled)]
    assert called == [(1, 1)]
    [attempt] = events.result.audit.attempts
    assert (attempt.attempt, attempt.steps, attempt.text) == (1, 1, "ok")


async def test_a_member_that_halts_the_group_is_named_in_the_halted_event(autojump_clock):
    pipe = pipe_of(parallel(member("ok", 0, []), member("gate", 1, halt("no entry"))))
    async with pipe.stream(Turn.start("hi")) as events:
        halted = [(e.hook, e.reason) async for e in events if isinstance(e, ev.Halted)]
    assert halted == [("gate", "no entry")]


async def test_a_when_returning_a_non_bool_fails_an_enforced_hook():
    def fn(turn):
        return cont(turn)

    pipe = pipe_of(hook(fn, name="gated", when=lambda turn: "yes"))
    with pytest.raises(HookReturnError, match=r"'gated'.*True or False"):
        await pipe.run(Turn.start("hi"))


async def test_a_scripted_model_out_of_replies_says_it_is_the_scripted_provider():
    pipe = Pipeline(model=ScriptedModel([]))
    with pytest.raises(ProviderError) as info:
        await pipe.run(Turn.start("hi"))
    assert info.value.provider == "scripted"


@pytest.mark.parametrize("context_tokens", [0, -5, True])
def test_budget_rejects_a_context_size_that_is_not_a_positive_int(context_tokens):
    with pytest.raises(ConfigError, match=r"Budget\.context_tokens must be a positive int"):
        Budget(context_tokens, 10)


async def test_shadow_skip_and_failed_open_hooks_audit_alike_in_run_and_stream(autojump_clock):
    def broken(turn):
        raise ValueError("x")

    def stop(turn):
        return halt("would stop")

    pipe = Pipeline(
        model=ScriptedModel(["ok", "ok"]),
        pre=[
            hook(broken, name="broken", on_error="skip"),
            hook(stop, name="watch", shadow=True),
            hook(broken, name="never", when=lambda turn: False),
        ],
    )
    ran = await pipe.run(Turn.start("hi", turn_ref="same"))
    async with pipe.stream(Turn.start("hi", turn_ref="same")) as events:
        async for _ in events:
            pass
    assert events.result.audit == ran.audit
    assert [(r.hook, r.verdict) for r in ran.audit.hooks] == [
        ("broken", "failed"),
        ("watch", "halt"),
        ("never", "skipped"),
    ]
