"""Background post hooks behind the gateway: a conversation's answer goes out once its turn
is committed, and the session commits the hooks' durable output after it, on its own."""

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from pipeline import Pipeline, cont, hook
from pipeline.logs import SQLiteLog
from pipeline.providers import OpenAIChat
from pipeline.testing import ScriptedModel
from tests.providers.server import openai_text, running, stream
from turns import Message, Text, Turn

from .serve_support import KEY, served, sse_data, user, watch_feed

UPSTREAM_KEY = "sk-upstream-background-2b7c"


async def test_a_conversation_is_answered_while_its_background_hook_still_runs(
    tmp_path: Path,
) -> None:
    """Catches: the answer of a conversation request held back until the session closes,
    i.e. until every background hook of the turn has finished (a slow summary delaying
    each reply), or the hook's durable output lost once it finishes after the answer; and
    the gateway's own hook for stateless turns written into the conversation's audit."""
    entered = anyio.Event()
    release = anyio.Event()

    async def summarize(turn: Turn) -> Any:
        assert turn.reply is not None
        entered.set()
        await release.wait()
        return cont(turn.inject(f"summary: {turn.reply.text}"))

    async with running(stream(openai_text(["the ", "answer"]))) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        pipe = Pipeline(
            model=model, post=[hook(summarize, name="summarize", background=True, durable=True)]
        )
        async with SQLiteLog(tmp_path / "log.db") as log:
            async with served(pipe, log=log) as gw, gw.http(key=None) as plain:
                # Fails (instead of hanging) if the answer waits for the blocked hook.
                with anyio.fail_after(10):
                    reply = await gw.sdk().chat.completions.create(
                        model="m", messages=user("hi"), extra_headers={"X-Conversation-Id": "c"}
                    )
                assert entered.is_set()
                assert not release.is_set()
                while_blocked = (await log.load("c")).messages
                health = (await plain.get("/healthz")).json()
                release.set()
                assert await gw.gateway.drain(10)
                after = (await plain.get("/healthz")).json()
            stored = await log.load("c")
            entries = await log.entries("c")
    assert reply.choices[0].message.content == "the answer"
    # The turn's commit: no post hook had finished by then (the background one ran after).
    assert [[h.hook for h in e.audit.hooks if h.stage == "post"] for e in entries if e.audit] == [
        []
    ]
    assert [(m.role, m.text) for m in while_blocked] == [
        ("user", "hi"),
        ("assistant", "the answer"),
    ]
    assert (health["closing"], after["closing"]) == (1, 0)
    assert [(m.role, m.text) for m in stored.messages] == [
        ("user", "hi"),
        ("assistant", "the answer"),
        ("user", "summary: the answer"),
    ]


async def test_the_next_turn_waits_for_the_earlier_sessions_background_output(
    tmp_path: Path,
) -> None:
    """Catches: a client's next request, sent as soon as the previous answer arrived,
    racing the previous turn's background commit: a spurious 409 for the client, or the
    background output lost (its commit refused because the conversation grew)."""
    release = anyio.Event()

    async def summarize(turn: Turn) -> Any:
        assert turn.reply is not None
        await release.wait()
        return cont(turn.inject(f"summary: {turn.reply.text}"))

    async with running(stream(openai_text(["first"])), stream(openai_text(["second"]))) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        pipe = Pipeline(
            model=model, post=[hook(summarize, name="summarize", background=True, durable=True)]
        )
        async with SQLiteLog(tmp_path / "log.db") as log:
            async with served(pipe, log=log) as gw:
                sdk = gw.sdk()
                headers = {"X-Conversation-Id": "c"}
                with anyio.fail_after(10):
                    await sdk.chat.completions.create(
                        model="m", messages=user("one"), extra_headers=headers
                    )
                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(
                        lambda: sdk.chat.completions.create(
                            model="m", messages=user("two"), extra_headers=headers
                        )
                    )
                    await anyio.sleep(0.2)
                    release.set()
                assert await gw.gateway.drain(10)
            stored = await log.load("c")
    assert [(m.role, m.text) for m in stored.messages] == [
        ("user", "one"),
        ("assistant", "first"),
        ("user", "summary: first"),
        ("user", "two"),
        ("assistant", "second"),
        ("user", "summary: second"),
    ]
    # The second turn was sent the first one's summary.
    assert "summary: first" in json.dumps(upstream.requests[1].body["messages"])


async def test_a_failing_background_hook_leaves_the_answer_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: a background hook's failure after the answer turning into an error for the
    client, being lost silently (no page event, no warning), or undoing the committed turn."""

    def breaks(turn: Turn) -> Any:
        raise RuntimeError("the summary store is down")

    feed: list[dict[str, Any]] = []
    async with running(stream(openai_text(["fine"]))) as upstream:
        model = OpenAIChat("up", base_url=upstream.url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)
        pipe = Pipeline(
            model=model, post=[hook(breaks, name="breaks", background=True, durable=True)]
        )
        async with SQLiteLog(tmp_path / "log.db") as log:
            async with served(pipe, log=log) as gw:
                async with anyio.create_task_group() as nursery:
                    await nursery.start(watch_feed, gw, feed)
                    with caplog.at_level(logging.WARNING, logger="turnplug"):
                        reply = await gw.sdk().chat.completions.create(
                            model="m", messages=user("hi"), extra_headers={"X-Conversation-Id": "c"}
                        )
                        assert await gw.gateway.drain(10)
                    await anyio.sleep(0.3)  # the feed's last frames reach the watcher
                    nursery.cancel_scope.cancel()
            stored = await log.load("c")
    assert reply.choices[0].message.content == "fine"
    assert reply.choices[0].finish_reason == "stop"
    assert [(m.role, m.text) for m in stored.messages] == [("user", "hi"), ("assistant", "fine")]
    [failed] = [e for e in feed if e["event"] == "HookFailed"]
    assert failed["hook"] == "breaks"
    assert "the summary store is down" in failed["error"]
    assert failed["enforced"] is False
    assert any(
        "breaks" in r.getMessage() and "the summary store is down" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


async def test_a_client_hanging_up_still_cancels_its_conversation_turn(tmp_path: Path) -> None:
    """Catches: a conversation turn, now run in the gateway's own task, going on (and
    committing) after its client hung up, or its session left open."""
    entered = anyio.Event()
    ended: list[str] = []

    async def waits(turn: Turn) -> Any:
        entered.set()
        await anyio.sleep_forever()

    def end(info: Any, reason: str) -> None:
        ended.append(reason)

    pipe = Pipeline(model=ScriptedModel(["never sent"]), pre=[waits], on_session_end=[end])
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with served(pipe, log=log) as gw:
            async with gw.http() as client, anyio.create_task_group() as nursery:
                nursery.start_soon(
                    partial(
                        client.post,
                        "/v1/chat/completions",
                        json={"model": "m", "messages": user("hi")},
                        headers={"X-Conversation-Id": "c"},
                    )
                )
                with anyio.fail_after(10):
                    await entered.wait()
                nursery.cancel_scope.cancel()  # the client hangs up
            assert await gw.gateway.drain(10)
        stored = await log.load("c")
    assert stored.messages == ()
    assert ended == ["cancelled"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_stateless_answer_is_sent_when_background_hooks_outlast_the_timeout(
    streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: a stateless turn's background hook that outlasts ``--turn-timeout`` turning
    the accepted reply into a 504, though its failures cannot change the answer."""

    async def hangs(turn: Turn) -> Any:
        await anyio.sleep_forever()

    def mark(turn: Turn) -> Any:
        assert turn.reply is not None
        message = Message.assistant((Text(turn.reply.text + "!"),))
        reply = attrs.evolve(turn.reply, message=message, messages=(message,))
        return cont(attrs.evolve(turn, reply=reply))

    feed: list[dict[str, Any]] = []
    pipe = Pipeline(
        model=ScriptedModel(["fine"]),
        post=[hook(mark, name="mark"), hook(hangs, name="hangs", background=True)],
    )
    async with served(pipe, turn_timeout=0.5) as gw, anyio.create_task_group() as nursery:
        await nursery.start(watch_feed, gw, feed)
        with caplog.at_level(logging.WARNING, logger="turnplug"):
            if streamed:
                chunks = await gw.sdk_stream(model="m", messages=user("hi"))
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            else:
                reply = await gw.sdk().chat.completions.create(model="m", messages=user("hi"))
                text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        await anyio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert (text, finish) == ("fine!", "stop")
    names = [e["event"] for e in feed]
    assert "GatewayError" not in names
    assert names[-3:] == ["HookFailed", "TurnFinished", "GatewayMessage"]
    failed = feed[-3]
    assert (failed["hook"], failed["enforced"]) == ("hangs", False)
    assert "turn timeout of 0.5 s" in failed["error"]
    assert feed[-2]["outcome"] == "completed"
    assert "gateway_accepted" not in json.dumps(feed)
    assert any(
        "hangs" in r.getMessage() and "turn timeout" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_stateless_answer_is_sent_when_background_hooks_outlast_the_drain_timeout(
    streamed: bool,
) -> None:
    """Bug caught: a stateless turn whose reply was accepted, its background hook still
    running when the gateway stopped past its drain timeout, was answered 503 "nothing of it
    was committed" in place of its answer, and the hook was left started on the page, where
    the turn timeout sends the answer and reports the hook it cuts."""

    running = anyio.Event()

    async def slow(turn: Turn) -> Any:
        running.set()
        await anyio.sleep_forever()

    pipe = Pipeline(
        model=ScriptedModel(["answer"]), post=[hook(slow, name="slow", background=True)]
    )
    feed: list[dict[str, Any]] = []
    answers: list[Any] = []
    body = {"model": "m", "messages": user("hi"), "stream": streamed}
    answered, replied = anyio.Event(), anyio.Event()
    async with served(pipe) as gw, anyio.create_task_group() as nursery:
        await nursery.start(partial(watch_feed, gw, feed, answered=answered))

        async def ask() -> None:
            async with gw.http() as client:
                answers.append(await client.post("/v1/chat/completions", json=body))
            replied.set()

        nursery.start_soon(ask)
        with anyio.fail_after(10):
            await running.wait()  # the reply was accepted: only the hook is left
        gw.gateway.shut_down()
        gw.gateway.cut_turns()
        with anyio.fail_after(10):
            await replied.wait()
            await answered.wait()
        nursery.cancel_scope.cancel()
    [answer] = answers
    assert answer.status_code == 200
    if streamed:
        frames = sse_data(answer.text)
        assert frames[-1] == "[DONE]"
        chunks = [json.loads(frame) for frame in frames[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    else:
        text = answer.json()["choices"][0]["message"]["content"]
    assert text == "answer"
    ends = [(e["event"], e.get("hook")) for e in feed if e["event"] != "HookStarted"]
    assert ends[-3:] == [("HookFailed", "slow"), ("TurnFinished", None), ("GatewayMessage", None)]
    assert "drain timeout" in [e for e in feed if e["event"] == "HookFailed"][-1]["error"]
    assert "GatewayError" not in [e["event"] for e in feed]


async def test_background_hooks_not_yet_seen_starting_at_the_turn_timeout_are_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Catches: a stateless turn cut by ``--turn-timeout`` as its background hooks started
    reporting none of them (the timeout had stopped the reading of the turn's events before
    their ``HookStarted``), and reporting instead an ordinary post hook whose end was unread.
    """

    async def slow(turn: Turn) -> Any:
        # Shielded: the turn timeout stops the gateway's reading of the events while this
        # hook runs, and the turn goes on to its accepted reply and its background hooks.
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.6)
        return cont(turn)

    async def hangs(turn: Turn) -> Any:
        await anyio.sleep_forever()

    feed: list[dict[str, Any]] = []
    pipe = Pipeline(
        model=ScriptedModel(["fine"]),
        post=[
            hook(slow, name="slow"),
            hook(hangs, name="first", background=True),
            hook(hangs, name="second", background=True),
        ],
    )
    answered = anyio.Event()
    async with served(pipe, turn_timeout=0.5) as gw, anyio.create_task_group() as nursery:
        await nursery.start(partial(watch_feed, gw, feed, answered=answered))
        with caplog.at_level(logging.WARNING, logger="turnplug"):
            reply = await gw.sdk().chat.completions.create(model="m", messages=user("hi"))
        with anyio.fail_after(10):
            await answered.wait()
        nursery.cancel_scope.cancel()
    assert reply.choices[0].message.content == "fine"
    failed = [(e["hook"], e["enforced"]) for e in feed if e["event"] == "HookFailed"]
    assert failed == [("first", False), ("second", False)]
    assert all("turn timeout of 0.5 s" in e["error"] for e in feed if e["event"] == "HookFailed")
    warned = [r.getMessage() for r in caplog.records if "turn timeout" in r.getMessage()]
    assert [message.split("'")[1] for message in warned] == ["first", "second"]


async def test_a_background_hook_raising_an_interrupt_after_the_answer_stops_the_gateway(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a background hook's sys.exit() after a conversation turn was answered
    leaving its session's task (the gateway's own group) and stopping the server at once,
    the interrupt lost on trio or printed by asyncio's loop, where it stops the gateway as
    SIGTERM does and is raised when the gateway's lifetime ends."""
    interrupt = SystemExit(3)
    answered = anyio.Event()

    async def leave(turn: Turn) -> Any:
        await answered.wait()
        raise interrupt

    pipe = Pipeline(
        model=ScriptedModel(["the answer", "never"]),
        post=[hook(leave, name="leave", background=True)],
    )
    answers: list[Any] = []

    async def serve_until_stopped(log: SQLiteLog) -> None:
        async with served(pipe, log=log) as gw, gw.http() as client:
            reply = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": user("hi")},
                headers={"X-Conversation-Id": "c"},
            )
            answers.append(reply)
            answered.set()
            with anyio.fail_after(10):
                assert await gw.gateway.interrupted() is interrupt
            answers.append(
                await client.post(
                    "/v1/chat/completions", json={"model": "m", "messages": user("again")}
                )
            )

    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        async with SQLiteLog(tmp_path / "log.db") as log:
            with pytest.raises(SystemExit) as raised:
                await serve_until_stopped(log)
            stored = await log.load("c")
    assert raised.value is interrupt
    first, later = answers
    assert first.status_code == 200
    assert json.loads(first.content)["choices"][0]["message"]["content"] == "the answer"
    assert [m.text for m in stored.messages] == ["hi", "the answer"]  # committed before
    assert later.status_code == 503
    assert any("raised SystemExit" in r.getMessage() for r in caplog.records)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_stateless_turns_background_interrupt_keeps_its_answer_and_stops_the_gateway(
    streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: a stateless turn whose background hook raised SystemExit after its reply
    was accepted answered 503 "nothing of it was committed", where a conversation turn in
    the same place keeps its answer; the gateway still stops."""
    interrupt = SystemExit(4)

    async def leave(turn: Turn) -> Any:
        raise interrupt

    pipe = Pipeline(
        model=ScriptedModel(["the answer", "never"]),
        post=[hook(leave, name="leave", background=True)],
    )
    body = {"model": "m", "messages": user("hi"), "stream": streamed}
    answers: list[Any] = []

    async def serve_until_stopped() -> None:
        async with served(pipe) as gw, gw.http() as client:
            answers.append(await client.post("/v1/chat/completions", json=body))
            answers.append(await client.post("/v1/chat/completions", json=body))

    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        with pytest.raises(SystemExit) as raised:
            await serve_until_stopped()
    assert raised.value is interrupt
    first, later = answers
    assert first.status_code == 200
    if streamed:
        frames = sse_data(first.text)
        assert frames[-1] == "[DONE]"
        chunks = [json.loads(frame) for frame in frames[:-1]]
        assert all("error" not in chunk for chunk in chunks)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    else:
        text = first.json()["choices"][0]["message"]["content"]
    assert text == "the answer"
    assert later.status_code == 503
    assert any("raised SystemExit" in r.getMessage() for r in caplog.records)


async def stateless_feed(pipe: Pipeline) -> tuple[int, list[dict[str, Any]]]:
    """One stateless request to `pipe`, whose background hook stops the gateway: the answer's
    status, and the page's feed of the turn."""
    feed: list[dict[str, Any]] = []
    statuses: list[int] = []

    async def serve_until_stopped() -> None:
        answered = anyio.Event()
        async with served(pipe) as gw, anyio.create_task_group() as nursery:
            await nursery.start(partial(watch_feed, gw, feed, answered=answered))
            async with gw.http() as client:
                answer = await client.post(
                    "/v1/chat/completions", json={"model": "m", "messages": user("hi")}
                )
            statuses.append(answer.status_code)
            with anyio.fail_after(10):
                await answered.wait()
            nursery.cancel_scope.cancel()

    with pytest.raises((SystemExit, KeyboardInterrupt)):
        await serve_until_stopped()
    return statuses[0], feed


@pytest.mark.parametrize("alone", [True, False])
async def test_background_hooks_a_stateless_turns_interrupt_stopped_are_reported_ended(
    alone: bool,
) -> None:
    """Bug caught: a stateless turn's background hook raising SystemExit after the answer left
    it, and the background hooks it cancelled, started and never ended on the page, where
    the turn timeout reports each hook it cuts as failed."""
    started = anyio.Event()

    async def leave(turn: Turn) -> Any:
        if not alone:
            await started.wait()
        raise SystemExit(5)

    async def slow(turn: Turn) -> Any:
        started.set()
        await anyio.sleep_forever()

    hooks = [hook(leave, name="leave", background=True)]
    if not alone:
        hooks.append(hook(slow, name="slow", background=True))
    status, feed = await stateless_feed(Pipeline(model=ScriptedModel(["answer"]), post=hooks))
    assert status == 200
    trace = [
        (e["event"], e["hook"], e.get("error"), e.get("enforced"))
        for e in feed
        if e["event"] in ("HookStarted", "HookFinished", "HookFailed") and e["stage"] == "post"
    ]
    # The hooks start together, in the order the loop runs their tasks.
    starts = sorted(trace[: len(hooks)])
    assert starts == [("HookStarted", name, None, None) for name in sorted(h.name for h in hooks)]
    ends = [("HookFailed", "leave", "SystemExit: 5", True)]
    if not alone:
        cut = (
            "cut short: background hook 'leave' (post, position 1) raised SystemExit, which"
            " stopped the turn"
        )
        ends.append(("HookFailed", "slow", cut, False))
    assert trace[len(hooks) :] == ends
    assert [e["event"] for e in feed[-2:]] == ["TurnFinished", "GatewayMessage"]


@pytest.mark.parametrize(
    ("interrupt", "said"), [("KeyboardInterrupt", "KeyboardInterrupt()"), ("exit", "SystemExit(3)")]
)
async def test_the_warning_of_a_stateless_turns_background_interrupt_names_its_hook(
    interrupt: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug caught: the warning said "a background hook raised KeyboardInterrupt:  after the
    answer was accepted", naming no hook, with a colon before nothing and a double space."""

    async def leave(turn: Turn) -> Any:
        raise KeyboardInterrupt() if interrupt == "KeyboardInterrupt" else SystemExit(3)

    pipe = Pipeline(
        model=ScriptedModel(["answer"]), post=[hook(leave, name="leave", background=True)]
    )
    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        await stateless_feed(pipe)
    warned = [
        r.getMessage().split(": ", 1)[1] for r in caplog.records if "answer" in r.getMessage()
    ]
    assert warned == [
        f"background hook 'leave' raised {said} after the answer was accepted; the answer is"
        " sent and the gateway stops"
    ]


async def test_the_warning_of_background_interrupts_at_one_instant_names_the_raised_ones_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bug caught: of two background hooks interrupted at one instant, the warning named the
    one that ended first ('second', woken first, raising SystemExit) as having raised the
    KeyboardInterrupt that the pipeline raises, the first declared hook's ('first')."""
    interrupting, exiting = anyio.Event(), anyio.Event()

    async def interrupted(turn: Turn) -> Any:
        await interrupting.wait()
        raise KeyboardInterrupt

    async def exits(turn: Turn) -> Any:
        await exiting.wait()
        raise SystemExit(5)

    async def wakes_both(turn: Turn) -> Any:
        exiting.set()
        interrupting.set()
        return cont(turn)

    post = [
        hook(interrupted, name="first", background=True),
        hook(exits, name="second", background=True),
        hook(wakes_both, name="third", background=True),
    ]
    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        status, _ = await stateless_feed(Pipeline(model=ScriptedModel(["answer"]), post=post))
    warned = [
        r.getMessage().split(": ", 1)[1] for r in caplog.records if "answer" in r.getMessage()
    ]
    assert (status, warned) == (
        200,
        [
            "background hook 'first' raised KeyboardInterrupt() after the answer was accepted;"
            " the answer is sent and the gateway stops"
        ],
    )


async def test_a_turn_interrupted_without_a_message_is_warned_of_by_its_type_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bug caught: the 503 warning of a turn whose hook raised ``KeyboardInterrupt()`` ended
    "(HTTP 503): KeyboardInterrupt: ", a colon before nothing."""

    async def stop(turn: Turn) -> Any:
        raise KeyboardInterrupt()

    async def serve_until_stopped() -> None:
        async with served(Pipeline(model=ScriptedModel(["x"]), pre=[stop])) as gw:
            async with gw.http() as client:
                answer = await client.post(
                    "/v1/chat/completions", json={"model": "m", "messages": user("hi")}
                )
        assert answer.status_code == 503

    with caplog.at_level(logging.WARNING, logger="turnplug.serve"):
        with pytest.raises(KeyboardInterrupt):
            await serve_until_stopped()
    warned = [r.getMessage() for r in caplog.records if "(HTTP 503)" in r.getMessage()]
    assert [message.split("(HTTP 503): ")[1] for message in warned] == ["KeyboardInterrupt"]


async def test_a_streamed_answer_being_sent_at_the_drain_timeout_is_sent_whole() -> None:
    """Bug caught: a streamed stateless turn that had returned its answer, whose last frames
    were still going out to a slow client when the gateway stopped past its drain timeout,
    was cut mid-send (no error frame, no ``[DONE]``), where the drain lets an answered turn
    send its answer."""
    pipe = Pipeline(model=ScriptedModel(["answer"]))
    feed: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []
    writing, release = anyio.Event(), anyio.Event()

    async def slow_client(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            writing.set()
            await release.wait()  # the client reads nothing until told
        sent.append(message)

    async def receive() -> dict[str, Any]:
        if not body_read.is_set():
            body_read.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()  # the client stays connected
        raise AssertionError

    body = json.dumps({"model": "m", "messages": user("hi"), "stream": True}).encode()
    body_read = anyio.Event()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {KEY}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    answered = anyio.Event()
    async with served(pipe) as gw, anyio.create_task_group() as nursery:
        await nursery.start(partial(watch_feed, gw, feed, answered=answered))
        asked = anyio.Event()

        async def ask() -> None:
            await gw.gateway.app(scope, receive, slow_client)
            asked.set()

        nursery.start_soon(ask)
        with anyio.fail_after(10):
            await answered.wait()  # the turn returned its answer
            await writing.wait()  # and its frames wait for the client
        gw.gateway.shut_down()
        gw.gateway.cut_turns()
        release.set()
        with anyio.fail_after(10):
            await asked.wait()
        nursery.cancel_scope.cancel()
    text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    frames = sse_data(text.decode())
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "answer"
