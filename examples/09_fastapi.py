"""An asyncio web app: each turn streams to the browser as server-sent events and is committed.

``POST /chat/{conversation_id}`` with ``{"message": "..."}`` runs one turn of that
conversation in a session over a `SQLiteLog` and streams it as server-sent events: ``delta``
events carry the reply's text as it arrives, ``retract`` says a rejected attempt's text is to
be cleared, and ``done`` carries the outcome and the committed reply, or ``error`` says the
turn failed and what failed (a hook by name, the model, the log), never the exception's
message, which may quote what the log does not hold; the server logs the traceback. ``GET
/conversations/{conversation_id}`` returns what the log holds. A client that disconnects
mid-turn cancels the turn: nothing of it is committed, and the server keeps serving.

The app is Starlette, served by uvicorn. FastAPI is Starlette underneath (its
``StreamingResponse`` is Starlette's) and would add request validation and an OpenAPI page,
which two routes do not need; the same endpoint works unchanged as a FastAPI route. The model
is offline (a `FunctionModel` that streams an echo word by word with ``asyncio.sleep`` between
words); put ``model_from_string("openai:...")`` in its place for a real one.

Run it (after ``pip install -e '.[examples]'``): ``python examples/09_fastapi.py`` serves on a
free port of 127.0.0.1, talks to itself over HTTP for two turns, prints what it got and what
the log holds, and stops.
``python examples/09_fastapi.py --serve`` keeps serving on http://127.0.0.1:8000; try
``curl -N -X POST localhost:8000/chat/c1 -d '{"message": "hello"}'``.
"""

import asyncio
import contextlib
import json
import logging
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline import HookError, LogConflict, Pipeline, PipelineError, ProviderError, cont, hook
from pipeline import events as ev
from pipeline.logs import SQLiteLog
from pipeline.testing import FunctionModel
from turns import Turn


async def echo(request) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    """The offline model: an echo of the user's last message, one word at a time."""
    said = request.messages[-1].parts[-1].text
    for index, word in enumerate(f"You said: {said}".split(" ")):
        await asyncio.sleep(0.01)  # an asyncio call inside the turn, like a real client's
        yield word if index == 0 else " " + word


def polite(turn: Turn):  # type: ignore[no-untyped-def]
    return cont(turn.inject("[style] be brief"))


def build_pipeline() -> Pipeline:
    return Pipeline(model=FunctionModel(echo), pre=[hook(polite, name="polite")])


def sse(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def failure(error: PipelineError) -> str:
    """What to tell the client of a turn that failed: what failed, never the error's message,
    which may quote the conversation (what a hook raised, a provider's answer) where the log
    holds nothing of the failed turn."""
    if isinstance(error, LogConflict):
        return "the conversation changed meanwhile; send again"
    if isinstance(error, HookError):
        what = f"hook {error.hook!r} ({error.stage}) failed"
    elif isinstance(error, ProviderError):
        what = "the model failed"
    else:
        what = f"the turn failed ({type(error).__name__})"
    return f"{what}; nothing of the turn was committed"


def create_app(log_path: str | Path, pipe: Pipeline | None = None) -> Starlette:
    """The app: a pipeline and a SQLite log, opened and closed with the app."""
    pipeline = pipe or build_pipeline()
    log = SQLiteLog(log_path)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with log:
            yield

    async def chat(request: Request) -> Response:
        conversation = request.path_params["conversation_id"]
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep for the
            body = None  # parser ("[" * 100000): the client's mistake, not a crash
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message:
            return JSONResponse({"error": 'send {"message": "some text"}'}, status_code=400)

        async def stream() -> AsyncIterator[str]:
            # A client that disconnects cancels this generator: the turn is cancelled inside
            # the session, and a cancelled turn commits nothing. (One that Starlette drops
            # unclosed is closed later by the loop: see "Streams inside async generators" in
            # docs/concurrency.md.)
            try:
                async with (
                    pipeline.session(log=log, conversation_id=conversation) as session,
                    session.stream(message) as events,
                ):
                    async for event in events:
                        if isinstance(event, ev.TextDelta):
                            yield sse("delta", event.text)
                        elif isinstance(event, ev.AttemptRejected):
                            yield sse("retract", event.attempt)
                result = events.result
            except PipelineError as error:
                if not isinstance(error, LogConflict):
                    logging.getLogger(__name__).exception("a turn of %r failed", conversation)
                yield sse("error", failure(error))
                return
            reply = result.reply.text if result.reply is not None else None
            yield sse("done", {"outcome": result.outcome, "reply": reply})

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def history(request: Request) -> Response:
        context = await log.load(request.path_params["conversation_id"])
        return JSONResponse(
            [
                {"role": m.role, "text": " ".join(getattr(p, "text", "") for p in m.parts)}
                for m in context.messages
            ]
        )

    return Starlette(
        routes=[
            Route("/chat/{conversation_id}", chat, methods=["POST"]),
            Route("/conversations/{conversation_id}", history, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def server(app: Starlette, port: int = 0) -> uvicorn.Server:
    """A uvicorn server for `app` on 127.0.0.1 (port 0: a free one), quiet but for errors."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", ws="none"
    )
    return uvicorn.Server(config)


def port_of(running: uvicorn.Server) -> int:
    port: int = running.servers[0].sockets[0].getsockname()[1]
    return port


async def read_turn(client: httpx.AsyncClient, conversation: str, message: str) -> dict:  # type: ignore[type-arg]
    """Send one message; the streamed text of the accepted attempt and the final ``done``
    event, or what failed under ``error``."""
    text = ""
    done: dict = {}  # type: ignore[type-arg]
    async with client.stream("POST", f"/chat/{conversation}", json={"message": message}) as sent:
        event = ""
        async for line in sent.aiter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                if event == "delta":
                    text += data
                elif event == "retract":  # a guardrail rejected what streamed so far
                    text = ""
                elif event == "done":
                    done = data
                elif event == "error":  # the turn failed: nothing of it was committed
                    done = {"error": data}
    return {"streamed": text, **done}


async def main() -> list[dict]:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as folder:
        running = server(create_app(Path(folder) / "chat.db"))
        serving = asyncio.create_task(running.serve())
        while not running.started:  # noqa: ASYNC110 (uvicorn sets a flag, not an event)
            await asyncio.sleep(0.01)
        try:
            base = f"http://127.0.0.1:{port_of(running)}"
            async with httpx.AsyncClient(base_url=base) as client:
                turns = [await read_turn(client, "c1", text) for text in ("hello", "bye")]
                logged = (await client.get("/conversations/c1")).json()
        finally:
            running.should_exit = True
            await serving
    for turn in turns:
        answer = f"error: {turn['error']}" if "error" in turn else f"reply: {turn['reply']!r}"
        print(f"streamed: {turn['streamed'].strip()!r} -> {answer}")
    print("the log holds:")
    for message in logged:
        print(f"  {message['role']:<9} {message['text']}")
    return logged


if __name__ == "__main__":
    if "--serve" in sys.argv[1:]:
        uvicorn.run(create_app("chat.db"), host="127.0.0.1", port=8000)
    else:
        asyncio.run(main())
