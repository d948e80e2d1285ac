"""Connection pooling and the provider's lifetime (pipeline/providers/_http.py `Pool`).

The server is a real HTTP/1.1 keep-alive server on 127.0.0.1 that counts the connections it
accepts. The tests that must hold on both event loops run one body under
``anyio.run(body, backend=...)`` for trio and for asyncio, against a server in a thread.
"""

import asyncio
import contextlib
import gc
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import attrs
import pytest
import trio

from pipeline import ModelFinish, ModelText, Pipeline, ProviderError, _loop
from pipeline.logs import MemoryLog
from pipeline.providers import AnthropicMessages, OpenAIChat
from turns import Turn

from . import server as wire
from .server import ProtocolServer
from .support import KEY, collect, hi, serving_in_thread

BACKENDS = ["trio", "asyncio"]

OPENAI_REPLY = wire.stream(wire.openai_text(["Hello", "!"]))
ANTHROPIC_REPLY = wire.stream(wire.anthropic_text(["Hello", "!"]))


def openai(url: str) -> OpenAIChat:
    return OpenAIChat("gpt-test", base_url=f"{url}/v1", api_key=KEY)


def anthropic(url: str) -> AnthropicMessages:
    return AnthropicMessages("claude-test", base_url=url, api_key=KEY)


PROVIDERS: dict[str, tuple[Callable[[str], Any], wire.Reply]] = {
    "openai": (openai, OPENAI_REPLY),
    "anthropic": (anthropic, ANTHROPIC_REPLY),
}


def texts(events: list[Any]) -> str:
    return "".join(event.text for event in events if isinstance(event, ModelText))


async def wait_closed(server: ProtocolServer) -> None:
    """Until the client has closed every connection (the server sees EOF)."""
    with anyio.fail_after(5):
        # The counter belongs to the server's loop, in another thread: no event to wait on.
        while server.open_connections:  # noqa: ASYNC110
            await anyio.sleep(0.01)


# --- One connection for many calls, on both loops ------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", PROVIDERS)
def test_five_calls_through_an_open_provider_use_one_connection(backend: str, name: str) -> None:
    """Catches: a client (so a TCP and TLS handshake) per model call instead of one pool per
    provider, on either loop."""
    make, reply = PROVIDERS[name]
    with serving_in_thread(repeat=reply) as server:

        async def body() -> list[str]:
            async with make(server.url) as model:
                said = [texts(await collect(model)) for _ in range(5)]
            await wait_closed(server)
            return said

        said = anyio.run(body, backend=backend)
    assert (said, len(server.requests), server.connections) == (["Hello!"] * 5, 5, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unopened_provider_opens_and_closes_a_connection_per_call(backend: str) -> None:
    """Catches: an unheld provider that keeps connections nobody will close (the pool needs a
    lifetime: `async with`, a pipeline or a session)."""
    with serving_in_thread(repeat=OPENAI_REPLY) as server:

        async def body() -> None:
            model = openai(server.url)
            for _ in range(3):
                await collect(model)
            await wait_closed(server)

        anyio.run(body, backend=backend)
    assert (len(server.requests), server.connections) == (3, 3)


# --- Pipelines and sessions hold their model (trio: the runtime's loop) ---------------------


async def test_five_turns_of_a_session_use_one_connection_closed_at_its_end(
    keep_alive_server: ProtocolServer,
) -> None:
    """Catches: a session that does not hold its model's pool, or leaves it open after."""
    server = keep_alive_server
    server.repeat = OPENAI_REPLY
    model = openai(server.url)
    pipe = Pipeline(model=model)
    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        results = [await session.send(f"turn {n}") for n in range(5)]
        assert server.open_connections == 1
    await wait_closed(server)
    assert [r.reply.text for r in results] == ["Hello!"] * 5
    assert (len(server.requests), server.connections, model.closed) == (5, 1, False)


async def test_async_with_pipe_holds_the_model_and_closes_what_it_opened(
    keep_alive_server: ProtocolServer,
) -> None:
    """Catches: `async with pipe:` missing, or closing the provider for good (a later block
    or call must still work, on a fresh connection)."""
    server = keep_alive_server
    server.repeat = ANTHROPIC_REPLY
    model = anthropic(server.url)
    pipe = Pipeline(model=model)
    async with pipe as entered:
        assert entered is pipe
        for n in range(5):
            assert (await pipe.run(Turn.start(f"turn {n}"))).reply.text == "Hello!"
    await wait_closed(server)
    assert (len(server.requests), server.connections) == (5, 1)
    async with pipe:
        await pipe.run(Turn.start("again"))
    await wait_closed(server)
    assert (len(server.requests), server.connections, model.closed) == (6, 2, False)


async def test_exiting_a_pipe_with_no_open_block_is_a_runtime_error_that_closes_nothing(
    keep_alive_server: ProtocolServer,
) -> None:
    """Bug caught: `await pipe.__aexit__(...)` on a pipeline never entered, or exited once
    more than entered, raised a bare IndexError ("pop from empty list")."""
    server = keep_alive_server
    server.repeat = OPENAI_REPLY
    pipe = Pipeline(model=openai(server.url))
    says = r"^exiting a pipeline that has no open `async with pipe:` block \(never entered"

    with pytest.raises(RuntimeError, match=says):
        await pipe.__aexit__(None, None, None)
    async with pipe:
        async with pipe:  # blocks nest
            await pipe.run(Turn.start("inner"))
        await pipe.run(Turn.start("outer"))  # the inner block's end closed nothing
        assert server.connections == 1
    with pytest.raises(RuntimeError, match=says):
        await pipe.__aexit__(None, None, None)
    await wait_closed(server)
    async with pipe:
        assert (await pipe.run(Turn.start("again"))).reply.text == "Hello!"
    assert (len(server.requests), server.connections) == (3, 2)


async def test_a_provider_the_caller_opened_outlives_the_sessions_inside(
    keep_alive_server: ProtocolServer,
) -> None:
    """Catches: a session that closes a pool it did not open."""
    server = keep_alive_server
    server.repeat = OPENAI_REPLY
    async with openai(server.url) as model:
        pipe = Pipeline(model=model)
        for conversation in ("a", "b"):
            async with pipe.session(log=MemoryLog(), conversation_id=conversation) as session:
                await session.send("hi")
        assert server.open_connections == 1
    await wait_closed(server)
    assert (len(server.requests), server.connections, model.closed) == (2, 1, True)


# --- A closed provider, another loop -------------------------------------------------------


@pytest.mark.parametrize("name", PROVIDERS)
async def test_a_closed_provider_is_a_clear_error(
    keep_alive_server: ProtocolServer, name: str
) -> None:
    """Catches: a closed provider that silently reconnects, or fails with httpx's own
    'client has been closed' RuntimeError."""
    make, reply = PROVIDERS[name]
    keep_alive_server.repeat = reply
    async with make(keep_alive_server.url) as model:
        await collect(model)
    for attempt in (lambda: collect(model), model.__aenter__):
        with pytest.raises(ProviderError, match=r"is closed .*create a new one") as caught:
            await attempt()
        assert type(caught.value) is ProviderError
        assert f"{type(model).__name__}(" in str(caught.value)
    assert len(keep_alive_server.requests) == 1
    await model.aclose()  # closing again is harmless


@pytest.mark.parametrize("name", PROVIDERS)
async def test_a_provider_closed_under_a_running_call_fails_it_saying_so(
    keep_alive_server: ProtocolServer, name: str
) -> None:
    """Bug caught: `aclose()` from another task while a call was streaming failed that call
    with "stream ... was cut off or garbled: ReadError" (asyncio) or "another task closed
    this fd" (trio), a ProviderProtocolError that blames the server for what the caller
    did."""
    make, reply = PROVIDERS[name]
    # The text, then silence: no finish, no terminator, until the client hangs up.
    keep_alive_server.repeat = attrs.evolve(reply, pieces=reply.pieces[:-2], stall=True)
    errors: list[BaseException] = []
    async with make(keep_alive_server.url) as model:
        first_text = anyio.Event()

        async def call() -> None:
            try:
                async with model.stream(hi()) as events:
                    async for event in events:
                        if isinstance(event, ModelText):
                            first_text.set()
            except ProviderError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            with anyio.fail_after(5):
                await first_text.wait()
            await model.aclose()

    [error] = errors
    assert type(error) is ProviderError
    message = str(error)
    assert f"{type(model).__name__}(" in message
    assert "was closed while this call was running" in message


@pytest.mark.parametrize("name", PROVIDERS)
async def test_the_callers_own_error_inside_a_call_closed_under_it_stays_its_own(
    keep_alive_server: ProtocolServer, name: str
) -> None:
    """Bug caught: once another task had closed the provider, any exception the caller's own
    code raised inside `async with model.stream(...)` (a transformer's HookError in a turn, a
    bug of the caller's) came out as a ProviderError saying the provider was closed under the
    call, the caller's error hidden as its cause, even after the whole reply was read."""
    make, reply = PROVIDERS[name]
    keep_alive_server.repeat = reply

    async def call(model: Any) -> None:
        async with model.stream(hi()) as events:
            async for _ in events:
                pass
            await model.aclose()
            raise LookupError("the caller's own")

    async with make(keep_alive_server.url) as model:
        with pytest.raises(LookupError, match="the caller's own") as caught:
            await call(model)
    assert not isinstance(caught.value, ProviderError)


async def test_a_closed_provider_fails_the_turn_with_the_same_error(
    keep_alive_server: ProtocolServer,
) -> None:
    """Catches: the runtime wrapping the closed-provider error into a vaguer one."""
    model = openai(keep_alive_server.url)
    await model.aclose()
    with pytest.raises(ProviderError, match="is closed"):
        await Pipeline(model=model).run(Turn.start("hi"))
    assert keep_alive_server.requests == []


def test_a_provider_opened_on_asyncio_and_used_on_trio_is_an_error_not_a_hang() -> None:
    """Catches: a pooled connection of one loop awaited from another (a hang, or an error
    from deep inside the socket layer)."""
    with serving_in_thread(repeat=OPENAI_REPLY) as server:
        model = openai(server.url)
        loop = asyncio.new_event_loop()
        try:

            async def open_and_call() -> None:
                await model.__aenter__()
                await collect(model)

            loop.run_until_complete(open_and_call())

            async def elsewhere() -> None:
                with trio.fail_after(5):
                    await collect(model)

            with pytest.raises(ProviderError) as caught:
                trio.run(elsewhere)
            loop.run_until_complete(model.aclose())
        finally:
            loop.close()
    message = str(caught.value)
    assert "opened on another event loop (asyncio)" in message
    assert "this one (trio)" in message
    assert (len(server.requests), server.connections) == (1, 1)


def test_a_provider_opened_on_trio_and_used_on_asyncio_is_an_error() -> None:
    """Catches: the loop check missing on the asyncio side."""
    model = OpenAIChat("gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY)

    async def hold_open() -> None:
        await model.__aenter__()  # the block never closes it: a mistake, not a crash

    trio.run(hold_open)

    async def use() -> list[Any]:
        return await collect(model)

    with pytest.raises(ProviderError, match=r"another event loop \(trio\).*this one \(asyncio\)"):
        asyncio.run(use())
    asyncio.run(model.aclose())
    assert model.closed


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Until `condition` holds (a counter of the server's thread, or of another loop's)."""
    for _ in range(500):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"still not {what}")


@pytest.mark.parametrize("name", PROVIDERS)
def test_one_pipeline_serves_sessions_on_two_threads_loops_at_once(name: str) -> None:
    """Bug caught: a module-level pipeline used by two threads at once, each running its own
    `asyncio.run` (a thread-pool worker, async code called from sync views), failed the second
    thread's session, and any bare turn of it, with "opened on another event loop" while the
    first thread's session held the model; each loop now holds connections of its own, closed
    when that loop's last hold ends, whatever the other loop still holds."""
    make, reply = PROVIDERS[name]
    both_in = threading.Barrier(2)
    first_out = threading.Event()
    outcomes: dict[int, object] = {}

    async def worker(number: int, pipe: Pipeline, server: ProtocolServer) -> list[str]:
        async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
            first = await session.send("one")
            await anyio.to_thread.run_sync(both_in.wait, 10)  # both sessions hold the model
            bare = await pipe.run(Turn.start("bare"))
            second = await session.send("two")
            if number == 2:  # still holding while the first loop's hold ends
                await anyio.to_thread.run_sync(first_out.wait, 10)
        if number == 1:
            try:  # its connection is closed, the other loop's is still open
                await anyio.to_thread.run_sync(
                    wait_until, lambda: server.open_connections == 1, "closed"
                )
            finally:
                first_out.set()
        return [r.reply.text if r.reply else "" for r in (first, bare, second)]

    def thread(number: int, pipe: Pipeline, server: ProtocolServer) -> None:
        try:
            outcomes[number] = asyncio.run(worker(number, pipe, server))
        except BaseException as exc:  # reported below, not lost in the thread
            both_in.abort()
            first_out.set()
            outcomes[number] = exc

    with serving_in_thread(repeat=reply) as server:
        model = make(server.url)
        pipe = Pipeline(model=model)
        threads = [threading.Thread(target=thread, args=(n, pipe, server)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        wait_until(lambda: server.open_connections == 0, "closed")

    assert outcomes == {1: ["Hello!"] * 3, 2: ["Hello!"] * 3}
    assert len(server.requests) == 6
    # Each loop's turns, the bare one too, shared one connection of that loop.
    assert server.connections == 2
    assert model._pool._loops == {}  # nothing of either loop is kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_with_model_is_refused_while_another_loop_holds_it(backend: str) -> None:
    """Bug caught: `async with model` on one thread's loop was accepted while another
    thread's session held the model on its own loop, and that session's next turn then failed
    with "opened on another event loop"; now the late open is the one refused."""
    holding, tried = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    with serving_in_thread(repeat=OPENAI_REPLY) as server:
        model = openai(server.url)
        pipe = Pipeline(model=model)

        async def session_on_b() -> None:
            async with pipe.session(log=MemoryLog(), conversation_id="b") as session:
                await session.send("one")
                holding.set()
                await anyio.to_thread.run_sync(tried.wait, 10)
                second = await session.send("two")
            outcomes["b"] = second.reply.text if second.reply else ""

        def thread_b() -> None:
            try:
                anyio.run(session_on_b, backend=backend)
            except BaseException as exc:  # reported below, not lost in the thread
                outcomes["b"] = exc
            finally:
                holding.set()

        async def open_on_a() -> None:
            try:
                async with model:
                    outcomes["a"] = "opened"
            except ProviderError as exc:
                outcomes["a"] = exc

        b = threading.Thread(target=thread_b)
        b.start()
        assert holding.wait(10)
        try:
            anyio.run(open_on_a, backend=backend)
        finally:
            tried.set()
            b.join(30)

    refused = outcomes.pop("a")
    assert outcomes == {"b": "Hello!"}
    assert isinstance(refused, ProviderError), refused
    assert f"is held on another event loop ({backend})" in str(refused)
    assert f"on this one ({backend}) alone" in str(refused)
    assert not model.closed


def test_loops_closed_with_a_session_open_leave_no_connections_behind() -> None:
    """Bug caught: each asyncio loop stopped and closed with a session still open (a worker
    thread's loop at shutdown) kept its entry, clients and open sockets in the pool for the
    pipeline's life, one more per loop; the next loop to hold the model now shuts them down."""
    left: list[asyncio.Task[None]] = []  # the abandoned sessions' tasks, dropped at the end

    def loop_closed_in_a_session(pipe: Pipeline) -> None:
        loop = asyncio.new_event_loop()
        sent = loop.create_future()

        async def job() -> None:
            async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
                await session.send("hi")
                sent.set_result(None)
                await asyncio.Event().wait()  # still in the session when the loop ends

        left.append(loop.create_task(job()))
        loop.run_until_complete(sent)
        loop.close()  # stopped, not cancelled: the session's end never runs

    async def session(pipe: Pipeline) -> str:
        async with pipe.session(log=MemoryLog(), conversation_id="c") as held:
            return (await held.send("hi")).reply.text  # type: ignore[union-attr]

    # A transport its closed loop left open closes its socket when collected, with a
    # ResourceWarning that asyncio gives for every such transport.
    with warnings.catch_warnings(), serving_in_thread(repeat=OPENAI_REPLY) as server:
        warnings.simplefilter("ignore", ResourceWarning)
        model = openai(server.url)
        pipe = Pipeline(model=model)
        for _ in range(4):
            loop_closed_in_a_session(pipe)
            # Only the latest loop's connection is still open, and only its entry is kept.
            wait_until(lambda: server.open_connections == 1, "shut down")
            assert len(model._pool._loops) == 1
        said = asyncio.run(session(pipe))
        wait_until(lambda: server.open_connections == 0, "shut down")
        for task in left:  # what the closed loops left goes now, not in a later test
            with contextlib.suppress(RuntimeError):  # its session's end finds no loop
                task.get_coro().close()
        left.clear()
        gc.collect()

    assert said == "Hello!"
    assert (len(server.requests), server.connections) == (5, 5)
    assert model._pool._loops == {}


def test_a_trio_run_that_ended_holding_the_pool_leaves_no_connections_behind() -> None:
    """Bug caught: a trio run that ended with the pool still held on it kept its entry and
    open sockets for the provider's life; the next run to hold the pool shuts them down. (A
    session's hold always ends with its run under trio, so the hold is taken on the pool.)"""
    with serving_in_thread(repeat=OPENAI_REPLY) as server:
        model = openai(server.url)

        async def abandon() -> None:
            model._pool.acquire(model._endpoint(), "the test")  # never released
            await collect(model)

        async def held() -> str:
            async with model.hold():
                return texts(await collect(model))

        for _ in range(3):
            trio.run(abandon)
            wait_until(lambda: server.open_connections == 1, "shut down")
            assert len(model._pool._loops) == 1
        said = trio.run(held)
        wait_until(lambda: server.open_connections == 0, "shut down")

    assert said == "Hello!"
    assert (len(server.requests), server.connections) == (4, 4)
    assert model._pool._loops == {}
    gc.collect()  # the dropped sockets were closed: collecting them warns of none


def test_a_trio_run_that_ended_holding_the_pool_leaves_no_proxied_connections_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug caught: with a proxy in the environment (HTTP_PROXY), the connections of a trio run
    that ended holding the pool were left open: only the client's direct transport was
    looked in, not the proxy's that httpx mounts. The server is the forward proxy here: it
    answers the requests sent to it for the provider's URL."""
    for name in ("ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with serving_in_thread(repeat=OPENAI_REPLY) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        model = OpenAIChat("gpt-test", base_url="http://api.example.invalid/v1", api_key=KEY)

        async def abandon() -> None:
            model._pool.acquire(model._endpoint(), "the test")  # never released
            await collect(model)

        async def held() -> str:
            async with model.hold():
                return texts(await collect(model))

        for _ in range(3):
            trio.run(abandon)
            wait_until(lambda: proxy.open_connections == 1, "shut down")
        said = trio.run(held)
        wait_until(lambda: proxy.open_connections == 0, "shut down")

    assert said == "Hello!"
    assert {request.path for request in proxy.requests} == {
        "http://api.example.invalid/v1/chat/completions"
    }
    assert (len(proxy.requests), proxy.connections) == (4, 4)
    gc.collect()  # the dropped sockets were closed: collecting them warns of none


def test_holds_nested_in_a_held_loop_wake_no_other_threads_trio_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug caught: every hold of the pool (each session inside a held pipeline) asked each
    other thread's live trio run whether it had ended, waking it: a cost per hold that grew
    with the threads; only a loop's first hold asks now."""
    asked = 0

    def counted() -> None:  # runs in the other run's thread, once per question it is asked
        nonlocal asked
        asked += 1

    monkeypatch.setattr(_loop, "_nothing_to_run", counted)
    model = openai("http://127.0.0.1:9")  # no call is made: holds open no connection
    holding, stop = threading.Event(), threading.Event()
    tokens: list[trio.lowlevel.TrioToken] = []

    async def other_thread() -> None:
        async with model.hold():
            tokens.append(trio.lowlevel.current_trio_token())
            holding.set()
            await trio.to_thread.run_sync(stop.wait)

    async def here() -> int:
        async with model.hold():  # this loop's first hold: asks once
            for _ in range(20):
                async with model.hold():
                    pass
        # Callbacks run in order: once this one has, every question asked before it was.
        answered = threading.Event()
        tokens[0].run_sync_soon(answered.set)
        await trio.to_thread.run_sync(answered.wait)
        return asked

    thread = threading.Thread(target=trio.run, args=(other_thread,))
    thread.start()
    try:
        assert holding.wait(5)
        assert trio.run(here) == 1
    finally:
        stop.set()
        thread.join()
    assert model._pool._loops == {}


def test_finish_events_still_arrive_through_a_pooled_connection() -> None:
    """Catches: a pooled response that is not read to its end (the next call on the same
    connection would read its leftovers)."""
    with serving_in_thread(
        wire.stream(wire.openai_text(["one"], usage=(3, 1))),
        wire.stream(wire.openai_text(["two"], usage=(4, 2))),
    ) as server:

        async def body() -> list[list[Any]]:
            async with openai(server.url) as model:
                return [await collect(model), await collect(model)]

        first, second = anyio.run(body, backend="asyncio")
    assert [texts(first), texts(second)] == ["one", "two"]
    assert [type(first[-1]), type(second[-1])] == [ModelFinish, ModelFinish]
    assert server.connections == 1


# --- Above 100 concurrent streams ---------------------------------------------------------------


WAVE = 150


async def test_a_second_wave_of_150_concurrent_turns_reuses_the_first_waves_connections(
    keep_alive_server: ProtocolServer,
) -> None:
    """Catches: a pool that keeps at most 100 idle connections (httpx's
    ``max_keepalive_connections=100``, which httpcore compares with all of its connections,
    busy ones included): above 100 concurrent streams to one upstream, each finished
    stream's connection was closed, and the next wave opened them again."""
    server = keep_alive_server
    server.repeat = OPENAI_REPLY
    arrived = 0
    everyone = anyio.Event()

    async def hold_until_all_arrived(_request: wire.Recorded) -> None:
        # Each request keeps its connection busy until the whole wave is in flight, so the
        # wave really needs `WAVE` connections at once.
        nonlocal arrived, everyone
        arrived += 1
        if arrived == WAVE:
            everyone.set()
        await everyone.wait()

    server.before_reply = hold_until_all_arrived
    pipe = Pipeline(model=openai(server.url))
    replies: list[str] = []

    async def turn(n: int) -> None:
        replies.append((await pipe.run(Turn.start(f"turn {n}"))).reply.text)

    async def wave() -> None:
        nonlocal arrived, everyone
        arrived, everyone = 0, anyio.Event()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for n in range(WAVE):
                    group.start_soon(turn, n)

    async with pipe:
        await wave()
        after_first = server.connections
        await wave()
        after_second = server.connections
    await wait_closed(server)
    assert (len(replies), set(replies), len(server.requests)) == (2 * WAVE, {"Hello!"}, 2 * WAVE)
    assert (after_first, after_second) == (WAVE, WAVE)
