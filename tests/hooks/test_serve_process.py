"""`turnplug serve` as a real process: the console script on a free loopback port."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipeline.logs import PostgresLog
from tests.providers import server as wire
from tests.providers.support import serving_in_thread

from .serve_support import openai_error

KEY = "proc-gateway-key-77aa"
UPSTREAM_KEY = "sk-never-shown-31337"
SCRIPT = Path(sys.executable).parent / "turnplug"


def write_config(folder: Path, *, slow: float = 0.0) -> Path:
    """A config with a pre hook that takes `slow` seconds (to hold a turn in flight)."""
    (folder / "slow_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import anyio
            from pipeline import cont

            async def pause(turn):
                await anyio.sleep({slow})
                return cont(turn)
            """
        )
    )
    config = folder / "gateway.toml"
    config.write_text(
        textwrap.dedent(
            """
            [[pre]]
            kind = "python"
            ref = "slow_hooks:pause"
            """
        )
    )
    return config


@contextmanager
def gateway(
    config: Path, *extra: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    environ = (
        os.environ | {"TURNPLUG_GATEWAY_KEY": KEY, "OPENAI_API_KEY": UPSTREAM_KEY} | (env or {})
    )
    process = subprocess.Popen(
        [str(SCRIPT), "serve", str(config), "--port", "0", *extra],
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    assert process.stderr is not None
    url = None
    lines = []
    deadline = time.monotonic() + 30
    while url is None and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            url = found.group(1)
    assert url is not None, "".join(lines)
    try:
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        process.stderr.close()


def post(url: str, text: str, conversation: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}"}
    if conversation:
        headers["x-conversation-id"] = conversation
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        headers=headers,
        timeout=30,
    )


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_sigterm_finishes_the_turn_in_flight_and_exits_0(tmp_path: Path, loop: str) -> None:
    """Catches: SIGTERM dropping a turn in flight, or the process exiting non-zero, on
    either loop the gateway serves on (``--loop``)."""
    config = write_config(tmp_path, slow=1.5)
    with gateway(config, "--loop", loop) as (process, url):
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(post(url, "hi")))
        sender.start()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/healthz").json()["in_flight"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        sender.join(20)
        code = process.wait(20)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 0
    assert [a.status_code for a in answers] == [200]
    assert answers[0].json()["choices"][0]["message"]["content"]
    assert "new turns get 503; finishing 1 turns in flight" in said
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz")


@pytest.mark.parametrize(
    ("raised", "status", "last"),
    [
        ("SystemExit(3)", 1, "turnplug: error: sys.exit(3) in what the command ran"),
        # As for Ctrl-C: status 130 and no error line after the gateway's own.
        ("KeyboardInterrupt()", 130, "turnplug serve: a turn raised KeyboardInterrupt: new"),
    ],
)
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_turn_raising_an_interrupt_stops_the_gateway_as_sigterm_does(
    tmp_path: Path, loop: str, raised: str, status: int, last: str
) -> None:
    """Bug caught: a hook's sys.exit() or KeyboardInterrupt lost in the server's request task
    (a bare 500 and the gateway serving on), where it should drain the turn in flight and
    exit with the interrupt's status, on either loop."""
    (tmp_path / "stop_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import anyio
            from pipeline import cont

            async def stop_or_pause(turn):
                if turn.user_message.text == "stop":
                    raise {raised}
                await anyio.sleep(1.5)
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[pre]]\nkind = "python"\nref = "stop_hooks:stop_or_pause"\n')
    with gateway(config, "--loop", loop) as (process, url):
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(post(url, "slow one")))
        sender.start()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/healthz").json()["in_flight"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stopped = post(url, "stop")
        sender.join(20)
        code = process.wait(20)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == status, said
    assert stopped.status_code == 503
    assert openai_error(stopped.content)["code"] == "shutting_down"
    assert [a.status_code for a in answers] == [200]  # the turn in flight was drained
    name = raised.replace("SystemExit(3)", "sys.exit(3)").removesuffix("()")
    assert f"a turn raised {name}: new turns get 503" in said
    assert said.splitlines()[-1].startswith(last), said
    assert "Traceback" not in said
    assert "Unhandled exception" not in said


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_the_stop_message_counts_the_turns_it_waits_for_not_the_one_that_raised(
    tmp_path: Path, loop: str
) -> None:
    """Bug caught: a turn's interrupt stopped the gateway saying "finishing 1 turns in
    flight" with no other turn running: it counted the turn that raised, already answered."""
    (tmp_path / "stop_hooks.py").write_text("def stop(turn):\n    raise KeyboardInterrupt\n")
    config = tmp_path / "gateway.toml"
    config.write_text('[[pre]]\nkind = "python"\nref = "stop_hooks:stop"\n')
    with gateway(config, "--loop", loop) as (process, url):
        stopped = post(url, "stop")
        code = process.wait(20)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 130, said
    assert stopped.status_code == 503
    assert "a turn raised KeyboardInterrupt: new turns get 503; finishing 0 turns in flight" in said


@pytest.mark.parametrize("conversation", [None, "c"], ids=["stateless", "conversation"])
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_the_stop_message_counts_an_answered_turn_whose_background_hook_raised(
    tmp_path: Path, loop: str, conversation: str | None
) -> None:
    """Bug caught: a turn whose background hook raised KeyboardInterrupt after its reply was
    accepted, still to be answered 200 and waited for by the drain, was left out of the stop
    message's count ("finishing 0 turns in flight")."""
    (tmp_path / "late_hooks.py").write_text(
        textwrap.dedent(
            """
            from pipeline.testing import FunctionModel

            def answerer():
                # Larger than the socket's buffers: the answer is in flight until it is read.
                return FunctionModel(lambda request: "x" * 16_000_000)

            def stop(turn):
                raise KeyboardInterrupt
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[model]\nprovider = "python"\nref = "late_hooks:answerer"\n'
        '[[post]]\nkind = "python"\nref = "late_hooks:stop"\nbackground = true\n'
    )
    log = ("--log", str(tmp_path / "log.db")) if conversation else ()
    header = f"x-conversation-id: {conversation}\r\n" if conversation else ""
    with gateway(config, "--loop", loop, *log) as (process, url):
        assert process.stderr is not None
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(
                (
                    f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
                    f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
                    f"{header}content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}"
                ).encode()
            )
            stop = ""  # what it says while the answer waits to be read
            while "new turns get 503" not in stop and (line := process.stderr.readline()):
                stop += line
            answer = b"".join(iter(lambda: client.recv(1 << 20), b""))
        code = process.wait(20)
        said = stop + process.stderr.read()
    assert code == 130, said
    assert answer.startswith(b"HTTP/1.1 200")
    assert "a turn raised KeyboardInterrupt: new turns get 503; finishing 1 turns in flight" in stop


def serve_until_exit(args: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`turnplug serve ARGS` run to its exit (one that refuses to start), its output captured."""
    return subprocess.run(
        [str(SCRIPT), "serve", *args], capture_output=True, text=True, env=environ, timeout=30
    )


def test_the_gateway_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    """Catches: a gateway that silently serves open when its key variable is unset."""
    config = write_config(tmp_path)
    environ = {k: v for k, v in os.environ.items() if k != "TURNPLUG_GATEWAY_KEY"}
    done = serve_until_exit([str(config), "--port", "0"], environ)
    assert done.returncode == 2
    assert "TURNPLUG_GATEWAY_KEY" in done.stderr
    assert "--no-auth" in done.stderr


def test_a_gateway_key_with_a_trailing_newline_lets_clients_in(tmp_path: Path) -> None:
    """Bug: a key read with its secret file's trailing newline was compared as it was, and a
    client's Authorization header cannot carry a newline: every request got 401."""
    with gateway(write_config(tmp_path), env={"TURNPLUG_GATEWAY_KEY": KEY + "\n"}) as (_, url):
        answer = post(url, "hi")
    assert answer.status_code == 200, answer.text


def test_a_gateway_key_with_inner_spaces_lets_clients_in(tmp_path: Path) -> None:
    """Bug: a key with spaces inside it (a passphrase) was refused at the start as one no
    header can carry, though ``Authorization: Bearer correct horse`` carries it and the
    gateway let such a client in before the check."""
    passphrase = "correct horse battery staple"
    with gateway(write_config(tmp_path), env={"TURNPLUG_GATEWAY_KEY": passphrase}) as (_, url):
        answer = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {passphrase}"},
            timeout=30,
        )
        refused = post(url, "hi")
    assert answer.status_code == 200, answer.text
    assert refused.status_code == 401


def test_a_gateway_key_no_header_can_carry_is_refused_without_showing_it(tmp_path: Path) -> None:
    """Bug: a key with a control character or a non-ASCII character started a gateway no
    client could ever authenticate to (every request 401), instead of a usage error."""
    config = write_config(tmp_path)
    environ = os.environ | {"TURNPLUG_GATEWAY_KEY": "sekrit\tkey-é"}
    done = serve_until_exit([str(config), "--port", "0"], environ)
    assert done.returncode == 2, done.stderr
    assert "TURNPLUG_GATEWAY_KEY contains characters an HTTP header cannot carry" in done.stderr
    assert "sekrit" not in done.stderr


@pytest.mark.parametrize("gateway_variable", ["TURNPLUG_GATEWAY_KEY", "UPSTREAM_KEY_X"])
def test_the_upstream_key_as_the_gateway_key_stops_the_start(
    tmp_path: Path, gateway_variable: str
) -> None:
    """Catches: a gateway started with the upstream key as its own key (``--api-key-env``
    naming the upstream key's variable, or both variables holding one key): every client
    had to send, and so hold, the upstream key that the gateway exists to keep from them."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        textwrap.dedent(
            """
            [model]
            provider = "openai"
            name = "up"
            base_url = "http://127.0.0.1:9/v1"
            api_key_env = "UPSTREAM_KEY_X"
            """
        )
    )
    environ = os.environ | {"UPSTREAM_KEY_X": UPSTREAM_KEY, "TURNPLUG_GATEWAY_KEY": UPSTREAM_KEY}
    done = serve_until_exit(
        [str(config), "--port", "0", "--api-key-env", gateway_variable], environ
    )
    assert done.returncode == 2, done.stderr
    assert f"the gateway key ({gateway_variable}) is the upstream model's key" in done.stderr
    assert "(UPSTREAM_KEY_X)" in done.stderr
    assert UPSTREAM_KEY not in done.stderr


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, port: str) -> None:
    """Catches: --port 99999 or -1 accepted by the parser and failing at the socket as an
    OverflowError with exit 1, instead of a usage error (exit 2) naming the option."""
    config = write_config(tmp_path)
    environ = os.environ | {"TURNPLUG_GATEWAY_KEY": "k" * 32}
    done = serve_until_exit([str(config), "--port", port], environ)
    assert done.returncode == 2, done.stderr
    assert "argument --port" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("option", ["--turn-timeout", "--drain-timeout"])
def test_a_nan_timeout_is_a_usage_error(tmp_path: Path, option: str) -> None:
    """Catches: --turn-timeout nan (or --drain-timeout nan) accepted by the parser, as NaN
    is not <= 0: then every turn failed with HTTP 500 ("deadline must not be NaN"), or the
    shutdown with an ExceptionGroup, instead of a usage error (exit 2) naming the option."""
    config = write_config(tmp_path)
    environ = os.environ | {"TURNPLUG_GATEWAY_KEY": "k" * 32}
    done = serve_until_exit([str(config), "--port", "0", option, "nan"], environ)
    assert done.returncode == 2, done.stderr
    assert f"argument {option}: expected a positive number, got 'nan'" in done.stderr


def test_a_python_model_is_named_by_its_ref_not_called_the_scripted_model(
    tmp_path: Path,
) -> None:
    """Catches: a config whose model is a function of the user's (`provider = "python"`,
    as in examples/assistant.toml) announced at start-up as "the offline scripted model, no
    provider is called", and named "scripted" in /v1/models and in every response."""
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            from pipeline.testing import FunctionModel

            def answerer():
                return FunctionModel(lambda request: "from my model")
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[model]\nprovider = "python"\nref = "my_models:answerer"\n')
    environ = os.environ | {"TURNPLUG_GATEWAY_KEY": KEY}
    process = subprocess.Popen(
        [str(SCRIPT), "serve", str(config), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    assert process.stderr is not None
    try:
        line = process.stderr.readline()
        found = re.search(r"listening on (http://\S+) \(model ([^;]+);", line)
        assert found is not None, line
        url, announced = found.groups()
        headers = {"authorization": f"Bearer {KEY}"}
        models = httpx.get(url + "/v1/models", headers=headers, timeout=30).json()
        answer = post(url, "hi").json()
    finally:
        process.kill()
        process.wait(10)
        process.stderr.close()
    assert announced == "my_models:answerer"
    assert [m["id"] for m in models["data"]] == ["my_models:answerer"]
    assert answer["model"] == "my_models:answerer"
    assert answer["choices"][0]["message"]["content"] == "from my model"


def test_the_upstream_key_appears_nowhere_a_client_can_see(tmp_path: Path) -> None:
    """Catches: the upstream or gateway key echoed in a response, the page, its feed or stderr
    (the library's warnings included, which the command writes there)."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        textwrap.dedent(
            """
            [model]
            provider = "openai"
            name = "up"
            base_url = "http://127.0.0.1:9/v1"

            [[post]]
            kind = "guardrail"
            deny = ["never matches this"]
            feedback = "no"
            """
        )
    )
    seen: list[str] = []
    with gateway(config, "--turn-timeout", "20") as (process, url):
        headers = {"authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            for response in (
                client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                ),
                client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": "x"}],
                        "stream": True,
                    },
                ),
                client.post("/v1/chat/completions", content=b"{bad"),
                client.get("/v1/models"),
                client.get("/"),
                client.get("/healthz"),
                httpx.post(
                    url + "/v1/chat/completions", json={}, headers={"authorization": "Bearer wrong"}
                ),
            ):
                seen.append(f"{response.status_code} {response.headers} {response.text}")
            with client.stream("GET", "/v1/turnplug/events") as feed:
                buffered = ""
                for text in feed.iter_text():
                    buffered += text
                    if buffered.count("GatewayError") >= 2:
                        break
            seen.append(buffered)
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        assert process.stderr is not None
        seen.append(process.stderr.read())
    everything = "\n".join(seen)
    assert "502" in everything  # the upstream (nothing listens on port 9) failed
    # The failures are on stderr too (retries, the 5xx answers), with the keys replaced.
    assert re.search(r"WARNING turnplug\.providers \[req_\w+\]: openai: request 1 failed", seen[-1])
    assert re.search(r"WARNING turnplug\.serve \[req_\w+\]: the turn ", seen[-1])
    assert UPSTREAM_KEY not in everything
    assert KEY not in everything


def test_two_gateways_share_one_postgres_conversation(tmp_path: Path, postgres: str) -> None:
    """Catches: turns lost or doubled across gateway processes, or a race both commit."""
    fast = write_config(tmp_path)
    slow_dir = tmp_path / "slow"
    slow_dir.mkdir()
    slow = write_config(slow_dir, slow=1.0)
    acknowledged: list[str] = []
    with (
        gateway(fast, "--log", postgres) as (_, first),
        gateway(fast, "--log", postgres) as (_, second),
    ):
        for index in range(6):
            url = (first, second)[index % 2]
            response = post(url, f"turn {index}", conversation="shared")
            assert response.status_code == 200, response.text
            acknowledged.append(f"turn {index}")
    with (
        gateway(slow, "--log", postgres) as (_, first),
        gateway(slow, "--log", postgres) as (_, second),
    ):
        statuses: list[int] = []
        threads = [
            threading.Thread(
                target=lambda u=u, t=t: statuses.append(
                    post(u, t, conversation="shared").status_code
                )
            )
            for u, t in ((first, "race a"), (second, "race b"))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sorted(statuses) == [200, 409]

    import trio

    async def load() -> Any:
        async with PostgresLog(postgres) as log:
            return await log.load("shared")

    stored = trio.run(load)
    users = [m.text for m in stored.messages if m.role == "user"]
    assert users[:6] == acknowledged
    assert len(users) == 7
    assert users[6] in ("race a", "race b")
    assert len(stored.messages) == 14


def write_background_config(folder: Path, *, slow: float) -> Path:
    """A config whose durable background post hook takes `slow` seconds, then notes the reply."""
    (folder / "later_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import anyio
            from pipeline import cont

            async def note(turn):
                await anyio.sleep({slow})
                return cont(turn.inject("noted: " + turn.reply.text))
            """
        )
    )
    config = folder / "gateway.toml"
    config.write_text(
        textwrap.dedent(
            """
            [[post]]
            kind = "python"
            ref = "later_hooks:note"
            background = true
            durable = true
            """
        )
    )
    return config


def stored_texts(path: Path, conversation: str) -> list[str]:
    import trio

    from pipeline.logs import SQLiteLog

    async def load() -> list[str]:
        async with SQLiteLog(path) as log:
            return [m.text for m in (await log.load(conversation)).messages]

    return trio.run(load)


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_sigterm_drains_a_session_closing_after_its_answer(tmp_path: Path, loop: str) -> None:
    """Catches: shutdown dropping the background hooks of an already answered conversation
    turn (their durable output never committed), or exiting non-zero while they run."""
    config = write_background_config(tmp_path, slow=3)
    log = tmp_path / "log.db"
    with gateway(config, "--loop", loop, "--log", str(log)) as (process, url):
        answer = post(url, "hi", conversation="c")
        # Answered, and the background hook still runs: its session is closing.
        assert httpx.get(url + "/healthz").json()["closing"] == 1
        process.send_signal(signal.SIGTERM)
        code = process.wait(20)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 0, said
    assert answer.status_code == 200
    reply = answer.json()["choices"][0]["message"]["content"]
    assert "1 closing sessions" in said
    assert stored_texts(log, "c") == ["hi", reply, f"noted: {reply}"]


def test_sigterm_cancels_a_session_still_closing_at_the_drain_timeout(tmp_path: Path) -> None:
    """Catches: a background hook that never ends holding the process past --drain-timeout,
    or its cancellation going unreported (or committing half its work)."""
    config = write_background_config(tmp_path, slow=600)
    log = tmp_path / "log.db"
    with gateway(config, "--log", str(log), "--drain-timeout", "1") as (process, url):
        answer = post(url, "hi", conversation="c")
        process.send_signal(signal.SIGTERM)
        code = process.wait(20)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 0, said
    assert answer.status_code == 200
    reply = answer.json()["choices"][0]["message"]["content"]
    assert "were cancelled" in said
    assert stored_texts(log, "c") == ["hi", reply]


# -- the library's warnings on the command's stderr ------------------------------------------

LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<logger>turnplug[.\w]*)"
    r"(?: \[(?P<request>req_[0-9a-f]{32})\])?: (?P<text>.*)$"
)


def write_failing_open_config(folder: Path, upstream: str, *, configure_root: bool) -> Path:
    """A config whose pre hook fails open with an error quoting both keys (`on_error =
    "skip"`), in front of the loopback upstream; its module may configure the root logger,
    as an application's modules do."""
    (folder / "leaky_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import logging
            import os

            if {configure_root}:
                logging.basicConfig(level=logging.INFO)

            def leaky(turn):
                raise RuntimeError(
                    "cannot check with " + os.environ["OPENAI_API_KEY"]
                    + " or " + os.environ["TURNPLUG_GATEWAY_KEY"]
                )
            """
        )
    )
    config = folder / "gateway.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [model]
            provider = "openai"
            name = "up"
            base_url = "{upstream}/v1"

            [[pre]]
            kind = "python"
            ref = "leaky_hooks:leaky"
            on_error = "skip"
            """
        )
    )
    return config


def warnings_of_one_turn(tmp_path: Path, *, configure_root: bool) -> tuple[Any, list[str]]:
    """Run the console script on the failing-open config, one turn whose first upstream
    answer is a 503 (retried), through the official SDK; its reply (a ``ChatCompletion``)
    and the lines on stderr."""
    import openai

    overloaded = wire.json_error(503, {"error": {"message": "overloaded"}})
    with serving_in_thread(overloaded, wire.stream(wire.openai_text(["fine"]))) as upstream:
        config = write_failing_open_config(tmp_path, upstream.url, configure_root=configure_root)
        path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
        with gateway(config, env={"PYTHONPATH": path}) as (process, url):
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)
            with client:
                reply = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == 0
            assert process.stderr is not None
            said = process.stderr.read()
    return reply, said.splitlines()


def test_turnplug_serve_writes_the_librarys_warnings_on_stderr_without_the_keys(
    tmp_path: Path,
) -> None:
    """Catches: the ``turnplug`` loggers' warnings (a hook failing open, a retried upstream
    request) never reaching the command's stderr (the library's NullHandler was all there
    was), lines without time, level or logger, or a key quoted in them."""
    reply, lines = warnings_of_one_turn(tmp_path, configure_root=False)
    assert reply.choices[0].message.content == "fine"
    logged = [m.groupdict() for line in lines if (m := LOG_LINE.match(line))]
    assert [(r["level"], r["logger"]) for r in logged] == [
        ("WARNING", "turnplug.pipeline"),
        ("WARNING", "turnplug.providers"),
    ]
    assert logged[0]["text"].startswith("fail-open (on_error='skip') hook 'leaky' (pre) failed")
    assert "cannot check with [REDACTED] or [REDACTED]" in logged[0]["text"]
    assert logged[1]["text"].startswith("openai: request 1 answered 503; retrying")
    everything = "\n".join(lines)
    assert UPSTREAM_KEY not in everything
    assert KEY not in everything


def test_a_root_logger_configured_by_a_hook_module_does_not_print_them_twice(
    tmp_path: Path,
) -> None:
    """Catches: each warning printed twice (once by the command's handler, once by a root
    handler the application's own module configured), or unscrubbed by the root's."""
    reply, lines = warnings_of_one_turn(tmp_path, configure_root=True)
    assert reply.choices[0].message.content == "fine"
    mentions = [line for line in lines if "turnplug.pipeline" in line]
    assert len(mentions) == 1, lines
    assert LOG_LINE.match(mentions[0])
    assert len([line for line in lines if "turnplug.providers" in line]) == 1, lines
    assert UPSTREAM_KEY not in "\n".join(lines)


def test_a_requests_warnings_on_stderr_name_the_request_id_its_response_carried(
    tmp_path: Path,
) -> None:
    """Bug caught: responses carried no ``x-request-id`` (the SDK's ``_request_id`` was
    None), so a user's bug report could not be matched with the gateway's warning lines."""
    reply, lines = warnings_of_one_turn(tmp_path, configure_root=False)
    assert re.fullmatch(r"req_[0-9a-f]{32}", reply._request_id or "")
    logged = [m.groupdict() for line in lines if (m := LOG_LINE.match(line))]
    assert [(r["logger"], r["request"]) for r in logged] == [
        ("turnplug.pipeline", reply._request_id),
        ("turnplug.providers", reply._request_id),
    ]


def stderr_of_one_answered_turn(tmp_path: Path, hook_options: str = "") -> str:
    """What a gateway whose pre hook is `hostile_hooks:hostile` (a module in `tmp_path`)
    wrote on stderr for one turn it answered 200, then stopped by SIGTERM (exit 0)."""
    config = tmp_path / "gateway.toml"
    config.write_text(f'[[pre]]\nkind = "python"\nref = "hostile_hooks:hostile"\n{hook_options}')
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    with gateway(config, env={"PYTHONPATH": path}) as (process, url):
        answered = httpx.post(
            url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {KEY}"},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert process.stderr is not None
        said = process.stderr.read()
    assert answered.status_code == 200
    return said


def test_a_warning_quoting_escape_sequences_and_line_breaks_stays_one_escaped_line(
    tmp_path: Path,
) -> None:
    """Bug caught: a warning quoting an exception's text (a hook failing open) was written
    to stderr as is, so an escape sequence in it reached the operator's terminal and a line
    break in it wrote a forged warning line of its own."""
    (tmp_path / "hostile_hooks.py").write_text(
        textwrap.dedent(
            """
            def hostile(turn):
                raise RuntimeError(
                    "boom\\x1b]0;pwned\\x07\\x9b2J\\n"
                    "2026-01-01 00:00:00,000 WARNING turnplug.serve: forged"
                )
            """
        )
    )
    said = stderr_of_one_answered_turn(tmp_path, 'on_error = "skip"\n')
    warned = [line for line in said.splitlines() if "hostile" in line]
    assert len(warned) == 1, said
    assert LOG_LINE.match(warned[0])
    assert "boom\\x1b]0;pwned\\x07\\x9b2J\\n2026-01-01 00:00:00,000 WARNING" in warned[0]
    assert "forged" not in said.replace(warned[0], "")
    assert not {"\x1b", "\x07", "\x9b"} & set(said)


def test_a_warning_s_traceback_cannot_forge_a_warning_line(tmp_path: Path) -> None:
    """Bug caught: a warning's traceback repeated the exception's text with its line breaks,
    so a line break in it still wrote a line that passed for a warning of its own."""
    (tmp_path / "hostile_hooks.py").write_text(
        textwrap.dedent(
            """
            import logging

            from pipeline import cont

            def hostile(turn):
                try:
                    raise RuntimeError(
                        "boom\\n2026-01-01 00:00:00,000 WARNING turnplug.serve: forged"
                    )
                except RuntimeError:
                    logging.getLogger("turnplug.hostile").warning("hostile", exc_info=True)
                return cont(turn)
            """
        )
    )
    said = stderr_of_one_answered_turn(tmp_path)
    lines = said.splitlines()
    start = next(i for i, line in enumerate(lines) if " turnplug.hostile " in line)
    matched = LOG_LINE.match(lines[start])
    assert matched is not None, lines[start]
    assert matched["text"] == "hostile"
    assert "  | 2026-01-01 00:00:00,000 WARNING turnplug.serve: forged" in lines, said
    assert not [line for line in lines if line.startswith("2026-01-01")], said


# -- refusing new turns while draining -------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_during_the_drain_a_new_turn_gets_503_shutting_down_and_the_turn_in_flight_completes(
    tmp_path: Path, loop: str
) -> None:
    """Catches: a SIGTERM drain that refuses new requests with a bare connection error (the
    gateway stopped listening at once) or not at all (a new turn started while draining), a
    503 without its OpenAI-style body or its Retry-After, a health check still "ok" while
    draining, or the upstream turn in flight cut short or the exit status non-zero."""
    import openai

    arrived, release = threading.Event(), threading.Event()

    async def hold_the_answer(_request: wire.Recorded) -> None:
        import anyio

        arrived.set()
        await anyio.to_thread.run_sync(release.wait)

    with serving_in_thread(wire.stream(wire.openai_text(["slow ", "answer"]))) as upstream:
        upstream.before_reply = hold_the_answer
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[model]\nprovider = "openai"\nname = "up"\nbase_url = "{upstream.url}/v1"\n'
        )
        with gateway(config, "--loop", loop) as (process, url):
            answers: list[httpx.Response] = []
            sender = threading.Thread(target=lambda: answers.append(post(url, "slow one")))
            sender.start()
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)
            try:
                assert [m.id for m in client.models.list()] == ["up"]  # a kept-alive connection
                assert arrived.wait(10)  # the turn is in flight, upstream
                process.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 10
                while (health := httpx.get(url + "/healthz")).status_code == 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                with pytest.raises(openai.APIStatusError) as refused:
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "new one"}]
                    )
                fresh = post(url, "on a new connection")
            finally:
                release.set()
                client.close()
            sender.join(20)
            code = process.wait(20)
            assert process.stderr is not None
            said = process.stderr.read()
    assert code == 0, said
    assert (health.status_code, health.json()) == (
        503,
        {"status": "shutting_down", "in_flight": 1, "closing": 0},
    )
    for response in (refused.value.response, fresh):
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.headers["connection"] == "close"
        error = openai_error(response.content)
        assert (error["type"], error["code"], error["param"]) == (
            "server_error",
            "shutting_down",
            None,
        )
        assert "send it again" in error["message"]
    assert [a.status_code for a in answers] == [200]
    assert answers[0].json()["choices"][0]["message"]["content"] == "slow answer"
    # Only the turn in flight reached the upstream.
    assert [r.body["messages"][-1]["content"] for r in upstream.requests] == ["slow one"]
    assert "new turns get 503; finishing 1 turns in flight" in said
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz")


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_an_open_live_page_does_not_hold_the_shutdown_to_the_drain_timeout(
    tmp_path: Path, loop: str
) -> None:
    """Catches: the page's event feed (a response that never ends by itself) keeping the
    process alive until --drain-timeout after SIGTERM, then cut with a traceback on stderr,
    when there is nothing left to drain."""
    config = write_config(tmp_path)
    with gateway(config, "--loop", loop, "--drain-timeout", "60") as (process, url):
        headers = {"authorization": f"Bearer {KEY}"}
        received = ""
        with (
            httpx.Client(base_url=url, headers=headers, timeout=10) as client,
            client.stream("GET", "/v1/turnplug/events") as feed,
        ):
            for text in feed.iter_text():
                received += text
                if "turnplug events" in received:
                    process.send_signal(signal.SIGTERM)
            # The loop ends when the gateway ends the feed (a timeout or an error otherwise).
        code = process.wait(10)  # not the 60 s of the drain timeout
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 0, said
    assert "Traceback" not in said
    assert "turnplug serve: stopped" in said


def answer_held_past_the_drain_timeout(
    tmp_path: Path, *extra: str, conversation: str | None = None
) -> tuple[httpx.Response, float, int, str]:
    """One turn whose upstream never answers, then SIGTERM with a 1 s drain timeout: the
    turn's answer, how long the process took to exit, its exit code and its stderr."""
    arrived = threading.Event()
    never = threading.Event()

    async def hold_forever(_request: wire.Recorded) -> None:
        import anyio

        arrived.set()
        await anyio.to_thread.run_sync(never.wait, abandon_on_cancel=True)

    with serving_in_thread(wire.stream(wire.openai_text(["never"]))) as upstream:
        upstream.before_reply = hold_forever
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[model]\nprovider = "openai"\nname = "up"\nbase_url = "{upstream.url}/v1"\n'
        )
        with gateway(config, "--drain-timeout", "1", *extra) as (process, url):
            answers: list[httpx.Response] = []
            sender = threading.Thread(
                target=lambda: answers.append(post(url, "stuck", conversation))
            )
            sender.start()
            assert arrived.wait(10)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(20)
            took = time.monotonic() - signalled
            sender.join(20)
            assert process.stderr is not None
            said = process.stderr.read()
        never.set()
    [answer] = answers
    return answer, took, code, said


def assert_cut_short(answer: httpx.Response) -> None:
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "shutting_down")
    assert "nothing of it was committed" in error["message"]


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_turn_still_running_at_the_drain_timeout_is_answered_503_and_the_process_exits_0(
    tmp_path: Path, loop: str
) -> None:
    """Catches: a drain that waits for the turns in flight without bound (the gateway keeps
    listening while they run): a turn whose upstream never answers holding the process past
    --drain-timeout, or the process exiting non-zero; and such a turn cut by the server
    (Hypercorn's 500 with an empty body, a CancelledError traceback on stderr) instead of
    answered by the gateway with its documented 503 shutting_down."""
    answer, took, code, said = answer_held_past_the_drain_timeout(tmp_path, "--loop", loop)
    assert code == 0, said
    assert took < 5, said  # the drain timeout (1 s) and the answers' grace, not 20
    assert "finishing 1 turns in flight" in said
    assert "Traceback" not in said, said
    assert_cut_short(answer)


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_conversation_turn_still_running_at_the_drain_timeout_commits_nothing(
    tmp_path: Path, loop: str
) -> None:
    """Catches: a conversation turn (X-Conversation-Id, --log) held by its upstream past the
    drain timeout left to the server's cut (a 500), or answered 503 while its session still
    commits it afterwards: the 503 says nothing was committed, and the log must agree."""
    log = tmp_path / "log.db"
    answer, _took, code, said = answer_held_past_the_drain_timeout(
        tmp_path, "--log", str(log), "--loop", loop, conversation="c-held"
    )
    assert code == 0, said
    assert "Traceback" not in said, said
    assert_cut_short(answer)
    assert stored_texts(log, "c-held") == []


@pytest.mark.parametrize("conversation", [None, "c-held"])
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_turn_cut_at_the_drain_timeout_is_logged_as_a_5xx(
    tmp_path: Path, loop: str, conversation: str | None
) -> None:
    """Catches: a stateless turn cut at the drain timeout answered 503 without the warning
    every other 5xx answer (a conversation turn's cut included) leaves on stderr."""
    answer, _took, code, said = answer_held_past_the_drain_timeout(
        tmp_path, "--log", str(tmp_path / "log.db"), "--loop", loop, conversation=conversation
    )
    assert code == 0, said
    assert_cut_short(answer)
    logged = r"WARNING turnplug\.serve \[req_[0-9a-f]+\]: the turn failed \(HTTP 503\)"
    assert re.search(logged, said), said


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_stream_still_running_at_the_drain_timeout_ends_with_a_shutting_down_frame(
    tmp_path: Path, loop: str
) -> None:
    """Catches: a streamed turn whose upstream stalls mid-reply being cut at the drain
    timeout without a word (the client sees its stream stop, with no error and no [DONE],
    and cannot tell a cut from a slow model), or the process not exiting 0."""
    # The role chunk and two content chunks, then silence: no finish, no [DONE].
    stalled = wire.stream(wire.openai_text(["Half an ", "answer"])[:3], stall=True)
    with serving_in_thread(stalled) as upstream:
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[model]\nprovider = "openai"\nname = "up"\nbase_url = "{upstream.url}/v1"\n'
        )
        with gateway(config, "--drain-timeout", "1", "--loop", loop) as (process, url):
            lines: list[str] = []
            begun = threading.Event()

            def read_stream() -> None:
                with httpx.stream(
                    "POST",
                    url + "/v1/chat/completions",
                    json={
                        "model": "m",
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                    headers={"authorization": f"Bearer {KEY}"},
                    timeout=30,
                ) as response:
                    for line in response.iter_lines():
                        lines.append(line)
                        if "Half an " in line:
                            begun.set()

            reader = threading.Thread(target=read_stream)
            reader.start()
            assert begun.wait(10)
            process.send_signal(signal.SIGTERM)
            code = process.wait(20)
            reader.join(20)
            assert process.stderr is not None
            said = process.stderr.read()
    assert code == 0, said
    assert "Traceback" not in said, said
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert "[DONE]" not in data
    error = json.loads(data[-1])["error"]
    assert (error["type"], error["code"]) == ("server_error", "shutting_down")
    texts = [
        chunk["choices"][0]["delta"].get("content")
        for chunk in map(json.loads, data[:-1])
        if chunk.get("choices")
    ]
    assert "Half an " in texts


def background_hook_past_the_drain_timeout(
    tmp_path: Path, loop: str, body: str
) -> tuple[httpx.Response | Exception, int, str]:
    """A stateless turn whose background hook (`body`, after it marks that it started) runs
    past a 1 s drain timeout: the turn's answer (or what the client raised), the exit code and
    the stderr of the process."""
    mark = tmp_path / "started"
    (tmp_path / "stuck_hooks.py").write_text(
        f"import time\nimport anyio\nfrom pipeline import cont\nMARK = {str(mark)!r}\n"
        + textwrap.dedent(body)
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[post]]\nkind = "python"\nref = "stuck_hooks:bg"\nbackground = true\n')
    with gateway(config, "--drain-timeout", "1", "--loop", loop) as (process, url):
        answers: list[httpx.Response | Exception] = []

        def send() -> None:
            try:
                answers.append(post(url, "hi"))
            except httpx.HTTPError as exc:
                answers.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        code = process.wait(20)
        sender.join(20)
        assert process.stderr is not None
        said = process.stderr.read()
    [answer] = answers
    return answer, code, said


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_sync_background_hook_past_the_drain_timeout_is_abandoned_and_the_turn_answered(
    tmp_path: Path, loop: str
) -> None:
    """Bug caught: a stateless turn's sync background hook without a timeout, running in a
    worker thread past --drain-timeout, was waited for: the turn got a bare 500 or no
    answer, and the process did not exit."""
    body = """
        def bg(turn):
            open(MARK, "w").close()
            time.sleep(60)
            return cont(turn)
        """
    answer, code, said = background_hook_past_the_drain_timeout(tmp_path, loop, body)
    assert code == 0, said
    assert isinstance(answer, httpx.Response), said
    assert answer.status_code == 200, said
    assert "background hook 'bg' of the turn" in said
    assert "was still running when the gateway stopped" in said
    assert "Traceback" not in said, said


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_hook_that_shields_itself_from_cancellation_cannot_hold_the_process(
    tmp_path: Path, loop: str
) -> None:
    """Bug caught: a background hook shielded from cancellation held the drain without
    bound (trio: the process never exited) or stopped it with a bare "InvalidStateError:
    Exception is not set" from the server (asyncio), instead of the command ending itself
    and saying what was left."""
    body = """
        async def bg(turn):
            open(MARK, "w").close()
            with anyio.CancelScope(shield=True):
                await anyio.sleep(60)
            return cont(turn)
        """
    _answer, code, said = background_hook_past_the_drain_timeout(tmp_path, loop, body)
    assert code == 1, said
    assert "turnplug serve: error: still running past the drain timeout: turn " in said
    assert "(in flight)" in said
    assert "InvalidStateError" not in said, said
    assert "Traceback" not in said, said


@pytest.mark.parametrize(("raised", "status"), [("KeyboardInterrupt", 130), ("SystemExit(3)", 1)])
def test_an_interrupt_with_an_abandoned_worker_thread_exits_with_its_status(
    tmp_path: Path, raised: str, status: int
) -> None:
    """Bug caught: on asyncio, a turn's interrupt while a sync background hook's abandoned
    worker thread still ran skipped leaving the thread, so the process waited for it until
    the hard stop ended it with status 1 and "still running past the drain timeout"."""
    mark = tmp_path / "started"
    (tmp_path / "stuck_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import time
            from pipeline import cont

            def bg(turn):
                if turn.user_message.text == "stuck":
                    open({str(mark)!r}, "w").close()
                    time.sleep(60)
                return cont(turn)

            def pre(turn):
                if turn.user_message.text == "stop":
                    raise {raised}
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[pre]]\nkind = "python"\nref = "stuck_hooks:pre"\n'
        '[[post]]\nkind = "python"\nref = "stuck_hooks:bg"\nbackground = true\n'
    )
    with gateway(config, "--drain-timeout", "1", "--loop", "asyncio") as (process, url):
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(post(url, "stuck")))
        sender.start()
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stopped = post(url, "stop")
        code = process.wait(30)
        sender.join(20)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == status, said
    assert stopped.status_code == 503
    assert [a.status_code for a in answers] == [200], said
    assert "still running past the drain timeout" not in said, said
    last = "turnplug serve: not waiting for 1 worker threads still running hooks"
    assert said.splitlines()[-1].startswith(last), said
    if status == 1:
        assert "turnplug: error: sys.exit(3) in what the command ran" in said, said
    assert "Traceback" not in said, said


def test_a_thread_of_the_configs_own_is_waited_for_at_exit(tmp_path: Path) -> None:
    """Bug caught: the command exited 0 one second after serving ended without waiting for
    any non-daemon thread still running, a config's own (one finishing its last write)
    too, and blamed hooks cancelled at the drain timeout though none was."""
    written = tmp_path / "flushed"
    (tmp_path / "own_thread.py").write_text(
        textwrap.dedent(
            f"""
            import threading
            import time
            from pipeline import cont

            def flush():
                time.sleep(3)
                open({str(written)!r}, "w").write("done")

            threading.Thread(target=flush).start()

            def pre(turn):
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[pre]]\nkind = "python"\nref = "own_thread:pre"\n')
    with gateway(config) as (process, _url):
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 0, said
    assert written.read_text() == "done", said
    assert "not waiting for" not in said, said


def test_serve_called_in_process_does_not_end_its_caller_later(tmp_path: Path) -> None:
    """Bug caught: the hard stop armed at the signal was never cancelled, so a program that
    called ``hooks.cli.main(["serve", ...])`` and went on after it returned 0 was ended with
    status 1 seven seconds after the drain timeout."""
    config = tmp_path / "gateway.toml"
    config.write_text("")
    host = textwrap.dedent(
        f"""
        import os, signal, sys, threading, time
        from hooks.cli import main

        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        code = main(["serve", {str(config)!r}, "--port", "0", "--drain-timeout", "0.1"])
        print("returned", code, flush=True)
        time.sleep(8)  # past the hard stop, due 0.1 + 7 s after the signal
        print("still here", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", host],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"TURNPLUG_GATEWAY_KEY": KEY},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["returned 0", "still here"], done.stderr
    assert "still running past the drain timeout" not in done.stderr


def test_the_hard_stop_ends_the_process_when_stderr_is_gone(tmp_path: Path) -> None:
    """Bug caught: the hard stop said what was left before ending the process, so a stderr
    whose reader had gone away (the write raising BrokenPipeError) killed its timer thread
    and a shielded hook held the process past the hard stop."""
    mark = tmp_path / "started"
    (tmp_path / "stuck_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import anyio
            from pipeline import cont

            async def bg(turn):
                open({str(mark)!r}, "w").close()
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(60)
                return cont(turn)
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[[post]]\nkind = "python"\nref = "stuck_hooks:bg"\nbackground = true\n')
    with gateway(config, "--drain-timeout", "1", "--loop", "trio") as (process, url):

        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):
                post(url, "hi")

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.stderr is not None
        while "new turns get 503" not in process.stderr.readline():
            pass
        process.stderr.close()  # the reader goes away
        code = process.wait(30)  # the hook holds it for 60 s
    assert code == 1


def test_the_hard_stop_names_a_pipeline_slow_to_close_not_a_hook(tmp_path: Path) -> None:
    """Bug caught: when closing the pipeline (an MCP server slow to exit) outlasted the hard
    stop after the gateway had stopped, the command blamed "a hook that does not stop when
    cancelled (a worker thread)" instead of saying what it was closing."""
    (tmp_path / "slow_model.py").write_text(
        textwrap.dedent(
            """
            import contextlib
            import anyio
            from pipeline.testing import FunctionModel

            class SlowToClose(FunctionModel):
                @contextlib.asynccontextmanager
                async def hold(self):
                    try:
                        yield self
                    finally:
                        with anyio.CancelScope(shield=True):
                            await anyio.sleep(60)

            def model():
                return SlowToClose(lambda request: "ok")
            """
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text('[model]\nprovider = "python"\nref = "slow_model:model"\n')
    with gateway(config, "--drain-timeout", "0.1") as (process, _url):
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)  # closing holds it for 60 s
        assert process.stderr is not None
        said = process.stderr.read()
    assert code == 1, said
    assert (
        "still running past the drain timeout: closing the pipeline (its MCP servers, its"
        " model's client), after the gateway stopped"
    ) in said, said
    assert "a hook that does not stop" not in said, said
