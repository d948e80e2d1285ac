"""A session over a conversation log: durable notes stay, transient scaffolding does not.

Each ``session.send`` runs one turn on the conversation so far and commits it. A durable
pre hook's note joins the log; a transient retrieval result is seen by the model this turn
only. The second turn's request shows the first turn's committed messages as history.

Run it: ``python examples/06_session_log.py``
"""

import trio

from hooks import durable
from pipeline import Cont, Pipeline, SessionInfo, cont
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import Message, Scope, Text, Turn


@durable
def note_language(turn: Turn) -> Cont[Turn]:
    return cont(turn.inject(f"[profile] answer in {turn.scope.assigns['language']}"))


def retrieve(turn: Turn) -> Cont[Turn]:
    return cont(turn.inject(Text("[doc] Refunds are issued within 14 days.")))


def load_profile(info: SessionInfo) -> Cont[Scope]:
    return cont(info.scope.assign(language="English"))


closed: list[str] = []


def on_end(info: SessionInfo, reason: str) -> None:
    closed.append(f"{info.conversation_id} closed ({reason}) after {info.turns} turns")


MODEL = ScriptedModel(["Within 14 days.", "Yes, for any item."])
PIPE = Pipeline(
    model=MODEL,
    pre=[note_language, retrieve],
    on_session_start=[load_profile],
    on_session_end=[on_end],
)


async def main() -> tuple[Message, ...]:
    log = MemoryLog()
    async with PIPE.session(log=log, conversation_id="c-42") as session:
        for text in ("How fast are refunds?", "Does that hold for sale items?"):
            result = await session.send(text)
            assert result.reply is not None
            print(f"user: {text} -> reply: {result.reply.text}")
    print(closed[-1])
    committed = (await log.load("c-42")).messages
    print("the log holds:")
    for message in committed:
        print(f"  {message.role:<9} {' | '.join(getattr(p, 'text', '?') for p in message.parts)}")
    second = MODEL.requests[1].messages
    print(f"the second turn was sent {len(second)} messages, history first")
    return committed


if __name__ == "__main__":
    trio.run(main)  # or asyncio.run(main()): the example runs on either loop
