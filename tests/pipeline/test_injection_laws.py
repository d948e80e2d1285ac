"""Laws of injection stamping over generated pre stages, checked against a reference.

Each generated hook does one thing with the turn it gets — injects one or two texts with
`turn.inject`, branches (injects twice into the same turn and returns one branch), injects
into the turn the hook before it received (a stale turn), forges an injection by hand,
injects and shapes the request, or halts after injecting — and is plain (async), guarded
(``when=``), timed (``timeout=``, so a sync one runs in a worker thread), durable or not, a
shadow or not. The reference says what the design promises: every injection a hook adds is
stamped with that hook's name, its durability and the stage, whatever it claims; a later
hook sees the earlier ones stamped; a shadow hook's injections never reach the turn or the
model; a halt keeps the turn as the hooks before it left it; and `run()` and `stream()` agree,
the stream announcing each hook's new injections once, in order.
"""

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import Pipeline, cont, events, halt, hook
from pipeline.testing import ScriptedModel
from turns import Injection, Text, Turn


@attrs.frozen
class Spec:
    action: str  # "inject" | "inject2" | "first" | "second" | "stale" | "forge" | "shape" | "halt"
    path: str  # "plain" | "when" | "timeout" | "sync"
    durable: bool
    shadow: bool


specs = st.builds(
    Spec,
    st.sampled_from(
        ["inject", "inject", "inject2", "first", "second", "stale", "forge", "shape", "halt"]
    ),
    st.sampled_from(["plain", "plain", "when", "timeout", "sync"]),
    st.booleans(),
    st.sampled_from([False, False, False, True]),
)
plans = st.lists(specs, max_size=7)

Entry = tuple[str, str, bool, str]  # (source, text, durable, stage)


@attrs.frozen
class Seen:
    outcome: str
    halted_by: str | None
    injections: tuple[Entry, ...]
    seen: tuple[tuple[Entry, ...], ...]
    sent: tuple[str, ...]


def entries(turn: Turn) -> tuple[Entry, ...]:
    return tuple(
        (str(i.source), i.parts[0].text, i.durable, str(i.stage))  # type: ignore[union-attr]
        for i in turn.injections
    )


def expect(plan: list[Spec]) -> tuple[Seen, list[Entry]]:
    """The reference: the run's outcome, and the announcements a stream makes, in order."""
    current: list[Entry] = []
    seen: list[tuple[Entry, ...]] = []
    announced: list[Entry] = []
    for index, spec in enumerate(plan):
        name = f"h{index}"
        received = list(current)
        seen.append(tuple(received))
        stamp = (spec.durable, "pre")
        if spec.action in ("inject", "first", "forge", "shape", "halt"):
            after = [*received, (name, f"{name}:0", *stamp)]
        elif spec.action == "inject2":
            after = [*received, (name, f"{name}:0", *stamp), (name, f"{name}:1", *stamp)]
        elif spec.action == "second":
            after = [*received, (name, f"{name}:1", *stamp)]
        else:  # stale: the turn the hook before this one received, and one more
            base = list(seen[index - 1]) if index else received
            after = restamped(name, stamp, received, [*base, (name, f"{name}:0", *stamp)])
        if spec.shadow:
            continue
        if spec.action == "halt":
            return Seen("halted", name, tuple(current), tuple(seen), ()), announced
        announced.extend(entry for entry in after if entry not in received)
        current = after
    sent = (*(text for _, text, _, _ in current), "hi")
    return Seen("completed", None, tuple(current), tuple(seen), sent), announced


def restamped(
    name: str, stamp: tuple[bool, str], received: list[Entry], returned: list[Entry]
) -> list[Entry]:
    """What the runtime makes of a turn whose earlier injections a hook changed (a stale turn).

    An injection the turn had before the hook ran stays as it is; one at the position of an
    earlier injection with the same source is a rewrite and keeps that one's durability and
    stage; any other is the hook's and is stamped with it.
    """
    after = []
    for position, entry in enumerate(returned):
        source, text, _, _ = entry
        origin = received[position] if position < len(received) else None
        if entry in received:
            after.append(entry)
        elif origin is not None and source == origin[0] and source != name:
            after.append((source, text, origin[2], origin[3]))
        else:
            after.append((name, text, *stamp))
    return after


def build(plan: list[Spec]) -> tuple[Pipeline, list[tuple[Entry, ...]], ScriptedModel]:
    seen: list[tuple[Entry, ...]] = []
    received: list[Turn] = []
    pre = []
    for index, spec in enumerate(plan):
        body = _body(spec, f"h{index}", seen, received)
        options: dict[str, Any] = {"name": f"h{index}", "durable": spec.durable}
        options["shadow"] = spec.shadow
        if spec.path == "when":
            options["when"] = lambda turn: True
        if spec.path in ("timeout", "sync"):
            options["timeout"] = 30
        if spec.path == "sync":
            pre.append(hook(body, **options))
        else:

            async def run(turn: Turn, body: Any = body) -> Any:
                return body(turn)

            pre.append(hook(run, **options))
    model = ScriptedModel(["ok"])
    return Pipeline(model=model, pre=pre), seen, model


def _body(spec: Spec, name: str, seen: list[tuple[Entry, ...]], received: list[Turn]) -> Any:
    def body(turn: Turn) -> Any:
        seen.append(entries(turn))
        received.append(turn)
        first, second = f"{name}:0", f"{name}:1"
        match spec.action:
            case "inject" | "shape" | "halt":
                injected = turn.inject(first)
                if spec.action == "halt":
                    return halt(f"{name} stops")
                if spec.action == "shape":
                    injected = injected.with_request(temperature=0.5)
                return cont(injected)
            case "inject2":
                return cont(turn.inject(first).inject(Text(second)))
            case "first" | "second":
                one, two = turn.inject(first), turn.inject(second)
                return cont(one if spec.action == "first" else two)
            case "stale":
                base = received[-2] if len(received) > 1 else turn
                return cont(base.inject(first))
            case "forge":
                forged = Injection((Text(first),), "someone_else", not spec.durable, "post")
                return cont(attrs.evolve(turn, injections=(*turn.injections, forged)))
        raise AssertionError(spec.action)

    return body


def seen_in(result: Any, seen: list[tuple[Entry, ...]], model: ScriptedModel) -> Seen:
    """What a law compares of a finished turn: outcome, halting hook, injections, what the
    hooks saw and the text the model was sent last."""
    sent = ()
    if model.requests:
        sent = tuple(part.text for part in model.requests[0].messages[-1].parts)  # type: ignore[union-attr]
    return Seen(
        result.outcome,
        result.halt.hook if result.halt else None,
        entries(result.turn),
        tuple(seen),
        sent,
    )


async def observe_run(plan: list[Spec]) -> Seen:
    pipe, seen, model = build(plan)
    result = await pipe.run(Turn.start("hi", turn_ref="law"))
    assert result.audit.injections == result.turn.injections
    return seen_in(result, seen, model)


async def observe_stream(plan: list[Spec]) -> tuple[Seen, list[Entry]]:
    pipe, seen, model = build(plan)
    announced: list[Entry] = []
    async with pipe.stream(Turn.start("hi", turn_ref="law")) as stream:
        async for event in stream:
            if isinstance(event, events.Injected):
                text = event.parts[0].text  # type: ignore[union-attr]
                announced.append((event.hook, text, event.durable, event.stage))
    return seen_in(stream.result, seen, model), announced


@settings(max_examples=60)
@given(plans)
async def test_run_stamps_every_injection_with_the_hook_that_added_it(plan: list[Spec]) -> None:
    """Catches: an injection stamped with the wrong hook, durability or stage (a stamper left
    open for the previous hook, a forged source kept), a later hook seeing an injection
    unstamped, a branch the hook did not return leaking into the turn, a stale turn's
    injection stamped as a rewrite, a shadow hook's injection reaching the turn or the
    model, or a halting hook's injection kept."""
    expected, _ = expect(plan)
    assert await observe_run(plan) == expected


@settings(max_examples=40)
@given(plans)
async def test_stream_announces_each_new_injection_once_as_run_stamps_it(plan: list[Spec]) -> None:
    """Catches: the listened-to path (which counts and announces injections) departing from
    `run()`'s stamping, or an `Injected` event missing, repeated or misattributed for an
    injection a hook added through the stamper's fast path."""
    expected, announced = expect(plan)
    assert await observe_stream(plan) == (expected, announced)
