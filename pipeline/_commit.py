"""Stage 8: what a completed turn hands the conversation log (nothing of any other turn)."""

from collections.abc import Iterable

import attrs

from turns import Injection, Message, Part, Turn, split_injections

INJECTED_BY = "injected_by"
"""The `meta` key naming the hook that injected a committed part."""


def log_messages(turn: Turn) -> tuple[Message, ...]:
    """The messages a completed `turn` commits, in order.

    The durable pre-stage injections (rendered as they were sent: tool exchanges before the
    user message, text at the head of the user message; after the tool message of a turn
    continuing from tool results), the user message, the accepted
    reply's messages, then the durable post-stage injections. Rejected attempts, transient
    injections and regeneration feedback are never part of it. Every injected part carries
    the injecting hook's name in ``meta["injected_by"]``.
    """
    reply = turn.reply
    if reply is None:
        return ()
    pre = [i for i in turn.injections if i.durable and i.stage != "post"]
    post = [i for i in turn.injections if i.durable and i.stage == "post"]
    exchanges, texts = split_injections(_stamped(pre))
    user = turn.user_message
    if user.role == "tool":
        # Continuing from tool results: they follow the calls they answer, as sent.
        messages = [user, *exchanges, *((Message("user", texts),) if texts else ())]
    else:
        if texts:
            user = Message(user.role, (*texts, *user.parts), user.meta)
        messages = [*exchanges, user]
    messages.extend(reply.messages)
    if post:
        post_exchanges, post_texts = split_injections(_stamped(post))
        messages.extend(post_exchanges)
        if post_texts:
            messages.append(Message("user", post_texts))
    return tuple(messages)


def injection_messages(injections: Iterable[Injection]) -> tuple[Message, ...]:
    """Durable post-stage injections (a background hook's) as the messages a log receives."""
    exchanges, texts = split_injections(_stamped(i for i in injections if i.durable))
    return (*exchanges, Message("user", texts)) if texts else exchanges


def _stamped(injections: Iterable[Injection]) -> list[Injection]:
    return [
        attrs.evolve(injection, parts=tuple(_mark(p, injection) for p in injection.parts))
        for injection in injections
    ]


def _mark(part: Part, injection: Injection) -> Part:
    return attrs.evolve(part, meta={**part.meta, INJECTED_BY: injection.source})
