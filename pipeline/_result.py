"""What a turn produces."""

from typing import final

import attrs

from turns import Message, Reply, Turn

from ._audit import AuditRecord, Rejection
from ._commit import log_messages
from ._signals import Halt
from .events import Outcome


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

    @property
    def log_messages(self) -> tuple[Message, ...]:
        """What a log receives for this turn: nothing unless it completed.

        The durable pre-stage injections as they were sent, the user message, the accepted
        reply's messages, the durable post-stage injections; each injected part names its
        hook in ``meta["injected_by"]``.
        """
        return log_messages(self.turn) if self.outcome == "completed" else ()
