"""What a turn produces."""

from typing import final

import attrs

from turns import Reply, Turn

from ._audit import AuditRecord
from ._signals import Halt
from .events import Outcome


@final
@attrs.frozen
class Rejection:
    """An attempt a post hook rejected.

    Attributes:
        attempt: The rejected attempt's number.
        hook: The rejecting hook.
        feedback: What the hook told the model.
        text: The rejected reply's text.
    """

    attempt: int
    hook: str
    feedback: str
    text: str


@final
@attrs.frozen
class TurnResult:
    """The outcome of one turn.

    Attributes:
        outcome: ``"completed"``, ``"halted"`` or ``"exhausted"``.
        turn: The final turn (injections, request, reply).
        reply: The answer: the model's accepted reply, or a halting hook's substitute; None
            when halted without one or exhausted.
        halt: The stamped `Halt` when halted.
        rejections: One record per rejected attempt.
        audit: Everything that shaped the turn.
    """

    outcome: Outcome
    turn: Turn
    reply: Reply | None
    halt: Halt | None
    rejections: tuple[Rejection, ...]
    audit: AuditRecord
