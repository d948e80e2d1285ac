"""hooks.inject_text and hooks.retrieve, alone and in a pipeline."""

import threading

import anyio
import pytest

from hooks import inject_text, retrieve
from pipeline import (
    ConfigError,
    Cont,
    Hook,
    HookFailed,
    HookTimeout,
    Pipeline,
    hook,
    parallel,
)
from pipeline import events as ev
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from tests.pipeline.support import collect, live_tasks
from turns import Text, Turn

# -- inject_text ----------------------------------------------------------------------------


async def test_inject_text_adds_one_injection():
    turn = Turn.start("hi")
    result = await inject_text("Today is Monday.")(turn)
    assert isinstance(result, Cont)
    assert [injection.parts for injection in result.value.injections] == [
        (Text("Today is Monday."),)
    ]


def test_inject_text_is_a_hook_carrying_its_durability():
    assert isinstance(inject_text("x"), Hook)
    assert (inject_text("x").name, inject_text("x").durable) == ("inject_text", False)
    assert inject_text("x", durable=True).durable is True


async def test_inject_text_reaches_the_model_next_to_the_user_message():
    model = ScriptedModel(["ok"])
    pipe = Pipeline(model=model, pre=[inject_text("Answer in French.")])
    await pipe.run(Turn.start("hello"))
    assert [(m.role, m.text) for m in model.requests[0].messages] == [
        ("user", "Answer in French.hello")
    ]


@pytest.mark.parametrize("durable", [False, True])
async def test_only_durable_injected_text_joins_the_log(durable):
    log = MemoryLog()
    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[inject_text("Note.", durable=durable)])
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("hello")
    first = (await log.load("c")).messages[0]
    assert [part.text for part in first.parts if isinstance(part, Text)] == (
        ["Note.", "hello"] if durable else ["hello"]
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        (("",), {}, "text"),
        ((None,), {}, "text"),
        ((3,), {}, "text"),
        (("x",), {"durable": "yes"}, "durable"),
    ],
)
def test_inject_text_refuses_bad_options_by_name(args, kwargs, option):
    with pytest.raises(ConfigError, match=f"inject_text\\({option}="):
        inject_text(*args, **kwargs)


# -- retrieve -------------------------------------------------------------------------------

CALLS: list[tuple[str, int]] = []


def search_docs(query: str, k: int) -> list[str]:
    CALLS.append((query, k))
    return ["Refunds take 14 days.", "Returns need a receipt.", "Gift cards are final."][:k]


async def search_memory(query: str, k: int) -> list[Text]:
    await anyio.lowlevel.checkpoint()
    return [Text(f"Ada asked about {query!r} before.")]


async def test_a_sync_search_is_given_the_user_message_and_k():
    CALLS.clear()
    parts = await retrieve(search_docs, k=2)(Turn.start("refund?"))
    assert parts == [Text("Refunds take 14 days."), Text("Returns need a receipt.")]
    assert CALLS == [("refund?", 2)]


async def test_an_async_search_is_awaited_and_its_parts_kept():
    assert await retrieve(search_memory)(Turn.start("refund")) == [
        Text("Ada asked about 'refund' before.")
    ]


async def test_only_the_first_k_passages_are_kept():
    rail = retrieve(lambda query, k: (f"passage {n}" for n in range(10)), k=3)
    assert await rail(Turn.start("q")) == [Text("passage 0"), Text("passage 1"), Text("passage 2")]


def test_retrieve_is_named_after_its_search():
    assert retrieve(search_docs).name == "search_docs"
    assert retrieve(search_docs, durable=True).durable is True


@pytest.mark.parametrize(
    ("returned", "culprit"),
    [("one passage", "str"), (None, "None"), ([b"bytes"], "bytes"), ([1], "int")],
)
async def test_a_search_returning_something_else_fails_naming_it(returned, culprit):
    def sloppy(query: str, k: int) -> object:
        return returned

    with pytest.raises(TypeError) as info:
        await retrieve(sloppy)(Turn.start("q"))  # type: ignore[arg-type]
    assert "sloppy" in str(info.value)
    assert culprit in str(info.value)


async def test_retrieve_placed_as_an_ordered_hook_is_told_to_go_in_a_group():
    """Catches: `retrieve(...)` put straight into ``pre`` (not in ``parallel(...)``) failing
    with advice to `return cont(turn.inject(...))`, a fix for a hook the user wrote, not for
    one the library built."""
    from pipeline import HookReturnError

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[retrieve(search_docs)])
    with pytest.raises(HookReturnError) as info:
        await pipe.run(Turn.start("refund?"))
    message = str(info.value)
    assert "search_docs" in message
    assert "place it inside `parallel(...)`" in message


async def test_in_a_group_passages_join_in_declaration_order(autojump_clock):
    async def slow(query: str, k: int) -> list[str]:
        await anyio.sleep(3)
        return ["slow passage"]

    model = ScriptedModel(["ok"])
    pipe = Pipeline(model=model, pre=[parallel(retrieve(slow), retrieve(search_docs, k=1))])
    result = await pipe.run(Turn.start("refund?"))
    assert [(i.source, i.parts) for i in result.turn.injections] == [
        ("test_in_a_group_passages_join_in_declaration_order.slow", (Text("slow passage"),)),
        ("search_docs", (Text("Refunds take 14 days."),)),
    ]
    assert model.requests[0].messages[-1].text == "slow passageRefunds take 14 days.refund?"


async def test_in_a_group_a_sync_search_runs_in_a_worker_thread():
    threads: list[bool] = []

    def where(query: str, k: int) -> list[str]:
        threads.append(threading.current_thread() is threading.main_thread())
        return ["found"]

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[parallel(retrieve(where))])
    await pipe.run(Turn.start("q"))
    assert threads == [False]


async def test_in_a_group_a_sync_search_returning_an_awaitable_is_awaited():
    """A sync search returning a coroutine (a lambda around an async search) used to fail
    the turn on trio, which refuses a coroutine from a worker thread; asyncio awaited it."""
    around = retrieve(lambda query, k: search_memory(query, k), k=1)
    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[parallel(around)])
    result = await pipe.run(Turn.start("refund"))
    assert [i.parts for i in result.turn.injections] == [
        (Text("Ada asked about 'refund' before."),)
    ]


async def test_a_hanging_sync_search_is_abandoned_when_its_timeout_fires(autojump_clock):
    release = threading.Event()

    def hangs(query: str, k: int) -> list[str]:
        release.wait(10)
        return ["late"]

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[parallel(hook(retrieve(hangs), timeout=2))])
    try:
        with pytest.raises(HookTimeout):
            await pipe.run(Turn.start("q"))
    finally:
        release.set()


async def test_a_failing_search_fails_the_turn_or_is_skipped_when_told():
    def down(query: str, k: int) -> list[str]:
        raise ConnectionError("index unreachable")

    strict = Pipeline(model=ScriptedModel(["ok"]), pre=[parallel(retrieve(down))])
    with pytest.raises(HookFailed) as info:
        await strict.run(Turn.start("q"))
    assert isinstance(info.value.__cause__, ConnectionError)

    lenient = Pipeline(
        model=ScriptedModel(["ok"]),
        pre=[parallel(hook(retrieve(down), on_error="skip"), retrieve(search_docs, k=1))],
    )
    events, result = await collect(lenient, Turn.start("q"))
    assert result.outcome == "completed"
    assert [i.source for i in result.turn.injections] == ["search_docs"]
    assert [(e.hook, e.enforced) for e in events if isinstance(e, ev.HookFailed)] == [
        ("test_a_failing_search_fails_the_turn_or_is_skipped_when_told.down", False)
    ]


async def test_a_cancelled_turn_leaves_no_search_behind(autojump_clock):
    async def never(query: str, k: int) -> list[str]:
        await anyio.sleep_forever()
        return []

    pipe = Pipeline(model=ScriptedModel(["ok"]), pre=[parallel(retrieve(never), retrieve(never))])
    before = live_tasks()
    with anyio.move_on_after(5) as scope:
        await pipe.run(Turn.start("q"))
    assert scope.cancelled_caught
    assert live_tasks() == before


@pytest.mark.parametrize("durable", [False, True])
async def test_only_durable_passages_join_the_log(durable):
    log = MemoryLog()
    pipe = Pipeline(
        model=ScriptedModel(["ok"]), pre=[parallel(retrieve(search_docs, k=1, durable=durable))]
    )
    async with pipe.session(log=log, conversation_id="c") as session:
        await session.send("refund?")
    first = (await log.load("c")).messages[0]
    assert ("Refunds take 14 days." in first.text) is durable


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        (("search",), {}, "search"),
        ((lambda query: [],), {}, "search"),
        ((search_docs,), {"k": 0}, "k"),
        ((search_docs,), {"k": True}, "k"),
        ((search_docs,), {"k": 2.5}, "k"),
        ((search_docs,), {"durable": "no"}, "durable"),
    ],
)
def test_retrieve_refuses_bad_options_by_name(args, kwargs, option):
    with pytest.raises(ConfigError, match=f"retrieve\\({option}="):
        retrieve(*args, **kwargs)
