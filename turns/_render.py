"""What the model is sent: the placement rule."""

from collections.abc import Iterable

from ._message import Message
from ._parts import Part, ToolCall, ToolResult
from ._turn import Injection, Turn


def render(turn: Turn) -> tuple[Message, ...]:
    """The messages the model is sent for `turn`.

    The placement rule: the system message, then the history untouched, then the pre-stage
    injections, then the user message. Injected text goes at the tail, as parts before the
    user's own parts in one user message; injected tool-call/result pairs become an assistant
    tool-call message and its tool messages just before the user message. Nothing is placed
    before or inside the history, so the provider's prompt-cache prefix stays intact.
    Injections not yet stamped by the runtime render as pre-stage; post-stage injections are
    not sent. A turn that continues from tool results sends them right after the history
    (after the tool calls they answer), then the injected exchanges, then the injected text
    as one user message.
    """
    head: list[Message] = []
    if turn.context.system is not None:
        head.append(Message.system(turn.context.system))
    head.extend(turn.context.messages)
    if not turn.injections:
        head.append(turn.user_message)
        return tuple(head)
    exchanges, texts = split_injections(inj for inj in turn.injections if inj.stage != "post")
    head.extend(place(turn.user_message, exchanges, texts))
    return tuple(head)


def place(
    user: Message, exchanges: tuple[Message, ...], texts: tuple[Part, ...]
) -> tuple[Message, ...]:
    """The turn's own message with injected exchanges and text placed around it.

    A user message gets the exchanges before it and the text at its head. A tool message
    (a turn continuing from tool results) must follow the tool calls it answers, so the
    exchanges come after it and the text follows as one user message.
    """
    if user.role == "tool":
        return (user, *exchanges, *((Message("user", texts),) if texts else ()))
    if texts:
        user = Message(user.role, (*texts, *user.parts), user.meta)
    return (*exchanges, user)


def split_injections(
    injections: Iterable[Injection],
) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
    """Split injections into tool exchanges (messages) and loose parts (text), in order.

    Each injection's tool calls become one assistant message, followed by one tool message per
    result. Everything else is returned as parts for the user message's head.
    """
    exchanges: list[Message] = []
    texts: list[Part] = []
    for injection in injections:
        calls: list[Part] = []
        results: list[Message] = []
        for part in injection.parts:
            if type(part) is ToolCall:
                calls.append(part)
            elif type(part) is ToolResult:
                results.append(Message.tool(part))
            else:
                texts.append(part)
        if calls:
            exchanges.append(Message("assistant", tuple(calls)))
        exchanges.extend(results)
    return tuple(exchanges), tuple(texts)
