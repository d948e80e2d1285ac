"""Sessions at once on every log: many conversations side by side, and writers racing on one.

Optimistic concurrency: a turn commits only if the conversation has not grown
since its context was loaded; the loser of a race gets exactly one `LogConflict` and
commits nothing, so turns never interleave and nothing committed is lost.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio

from pipeline import LogConflict, Pipeline, TurnResult
from pipeline.testing import FunctionModel
from turns import Context, Message

from ..logs import Backend, Rendezvous, close

ROOT = Path(__file__).resolve().parents[2]


def echo(request) -> str:
    """Answers with the question and how much history the answer was given."""
    return f"re: {request.messages[-1].text} after {len(request.messages) - 1}"


def turn_blocks(messages: tuple[Message, ...]) -> list[str]:
    """The questions of a conversation, checked to be whole turns in order, each answered
    from exactly the conversation before it (a turn answered from a stale conversation,
    or two turns interleaved, fail here)."""
    assert len(messages) % 2 == 0, messages
    questions = []
    for index, (question, answer) in enumerate(zip(messages[::2], messages[1::2], strict=True)):
        assert (question.role, answer.role) == ("user", "assistant"), (question, answer)
        assert answer.text == f"re: {question.text} after {2 * index}", (question, answer)
        questions.append(question.text)
    return questions


async def test_sessions_on_separate_conversations_share_one_log_and_lose_nothing(
    backend: Backend,
):
    sessions, turns = 8, 5
    log = backend.open()
    pipe = Pipeline(model=FunctionModel(echo))
    results: dict[str, list[TurnResult]] = {}

    async def converse(index: int) -> None:
        conversation = f"conv-{index}"
        results[conversation] = []
        async with pipe.session(log=log, conversation_id=conversation) as session:
            for turn in range(turns):
                results[conversation].append(await session.send(f"{index}.{turn}"))

    try:
        async with anyio.create_task_group() as nursery:
            for index in range(sessions):
                nursery.start_soon(converse, index)
        stored = {c: await log.load(c) for c in results}
        refs = {c: [e.turn_ref for e in await log.entries(c)] for c in results}
    finally:
        await close(log)

    for index in range(sessions):
        conversation = f"conv-{index}"
        assert turn_blocks(stored[conversation].messages) == [
            f"{index}.{turn}" for turn in range(turns)
        ]
        assert refs[conversation] == [r.turn.turn_ref for r in results[conversation]]


async def test_two_sessions_racing_on_one_conversation_lose_exactly_one_race_each_round(
    backend: Backend,
):
    rounds = 6
    rendezvous = Rendezvous()

    async def answer(request):
        await rendezvous.meet()
        return echo(request)

    pipe = Pipeline(model=FunctionModel(answer))
    # Two workers: each its own handle on the storage (its own connection), as two
    # processes would have.
    logs = [backend.open(), backend.open()]
    outcomes: list[list[str]] = []
    winners: list[TurnResult] = []

    async def race(session, text: str, outcome: list[str]) -> None:
        try:
            winners.append(await session.send(text))
            outcome.append("committed")
        except LogConflict:
            outcome.append("conflict")

    try:
        async with (
            pipe.session(log=logs[0], conversation_id="shared") as a,
            pipe.session(log=logs[1], conversation_id="shared") as b,
        ):
            for round_ in range(rounds):
                rendezvous.reset()
                outcome: list[str] = []
                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(race, a, f"a{round_}", outcome)
                    nursery.start_soon(race, b, f"b{round_}", outcome)
                outcomes.append(sorted(outcome))
            stored = await logs[0].load("shared")
    finally:
        for log in logs:
            await close(log)

    assert outcomes == [["committed", "conflict"]] * rounds
    assert stored == Context(messages=tuple(m for r in winners for m in r.log_messages))
    assert len(turn_blocks(stored.messages)) == rounds


WORKER = textwrap.dedent(
    """
    import sys
    import trio
    from pipeline import LogConflict, Pipeline
    from pipeline.logs import PostgresLog, SQLiteLog
    from pipeline.testing import FunctionModel

    kind, where, name, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    async def main():
        log = SQLiteLog(where) if kind == "sqlite" else PostgresLog(where)
        pipe = Pipeline(
            model=FunctionModel(lambda r: f"re: {r.messages[-1].text} after {len(r.messages) - 1}")
        )
        conflicts = 0
        async with log, pipe.session(log=log, conversation_id="shared") as session:
            for turn in range(turns):
                while True:
                    try:
                        await session.send(f"{name}.{turn}")
                        break
                    except LogConflict:
                        conflicts += 1  # the session reloaded: answer again
        print(conflicts)

    trio.run(main)
    """
)


async def test_worker_processes_sharing_a_conversation_keep_every_turn_whole(durable: Backend):
    turns = 15
    done: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def work(name: str) -> None:
        done[name] = await anyio.run_process(
            [sys.executable, "-c", WORKER, durable.kind, durable.where, name, str(turns)],
            cwd=ROOT,
            check=False,
        )

    with anyio.fail_after(60):
        async with anyio.create_task_group() as nursery:
            for name in ("w1", "w2"):
                nursery.start_soon(work, name)
    for worker in done.values():
        assert worker.returncode == 0, worker.stderr.decode()
        assert worker.stdout.strip().isdigit()

    log = durable.open()
    try:
        stored = await log.load("shared")
    finally:
        await close(log)
    questions = turn_blocks(stored.messages)
    for name in ("w1", "w2"):
        # Every turn of each worker, once, in the order it sent them.
        assert [q for q in questions if q.startswith(f"{name}.")] == [
            f"{name}.{turn}" for turn in range(turns)
        ]
    assert len(questions) == 2 * turns
