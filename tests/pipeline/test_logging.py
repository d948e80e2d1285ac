"""The turnplug loggers: what an operator must know at WARNING, the stages at DEBUG."""

import logging

import pytest

from pipeline import LogConflict, Pipeline, cont, halt, hook
from pipeline.logs import MemoryLog
from pipeline.testing import ScriptedModel
from turns import Message, Turn


def broken(turn):
    raise ValueError("boom")


def refuse(turn):
    return halt("too risky")


def late(turn):
    raise RuntimeError("summary store down")


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    return [(r.name, r.levelname, r.getMessage()) for r in caplog.records]


async def test_a_hook_failing_open_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Catches: a fail-open hook's failure visible only to someone watching events."""
    with caplog.at_level(logging.WARNING, logger="turnplug"):
        await Pipeline(model=ScriptedModel(["ok"]), pre=[hook(broken, on_error="skip")]).run(
            Turn.start("hi")
        )

    assert records(caplog) == [
        (
            "turnplug.pipeline",
            "WARNING",
            "fail-open (on_error='skip') hook 'broken' (pre) failed and was not enforced; the"
            " turn goes on without it (nothing it would have injected was added): ValueError:"
            " boom",
        )
    ]


async def test_a_shadow_refusal_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Catches: a shadow guardrail that would have halted turns going unnoticed."""
    with caplog.at_level(logging.WARNING, logger="turnplug"):
        result = await Pipeline(model=ScriptedModel(["ok"]), pre=[hook(refuse, shadow=True)]).run(
            Turn.start("hi")
        )

    assert result.outcome == "completed"
    assert records(caplog) == [
        (
            "turnplug.pipeline",
            "WARNING",
            "shadow hook 'refuse' (pre) would have refused (halt): too risky — not enforced",
        )
    ]


async def test_a_background_failure_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Catches: a background hook's failure lost after the turn returned."""
    pipe = Pipeline(model=ScriptedModel(["ok"]), post=[hook(late, background=True)])
    with caplog.at_level(logging.WARNING, logger="turnplug"):
        result = await pipe.run(Turn.start("hi", turn_ref="t1"))

    assert result.outcome == "completed"
    assert records(caplog) == [
        (
            "turnplug.pipeline",
            "WARNING",
            "background hook 'late' failed after turn t1: RuntimeError: summary store down",
        )
    ]


async def test_a_log_conflict_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Catches: a refused commit an operator cannot see in the logs."""
    log = MemoryLog()
    with caplog.at_level(logging.WARNING, logger="turnplug"), pytest.raises(LogConflict):
        await log.append("c", "t2", (Message.user("hi"),), expected_length=3)

    assert records(caplog) == [
        (
            "turnplug.logs",
            "WARNING",
            "commit of turn t2 refused: conversation 'c' holds 0 messages, not the 3 it was"
            " answered from (another writer committed first)",
        )
    ]


async def test_debug_reports_the_turns_stages_without_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Catches: DEBUG silent about the stages, or leaking the reply text into the log."""

    async def note(turn):
        return cont(turn.inject("private note"))

    with caplog.at_level(logging.DEBUG, logger="turnplug.pipeline"):
        await Pipeline(model=ScriptedModel([["sec", "ret"]]), pre=[note]).run(
            Turn.start("hi", turn_ref="t3")
        )

    kinds = [r.getMessage().split()[2] for r in caplog.records]
    assert kinds == [
        "TurnStarted",
        "HookStarted",
        "HookFinished",
        "Injected",
        "ModelCalled",
        "ModelFinished",
        "ReplyReady",
        "TurnFinished",
    ]
    assert "secret" not in caplog.text
    assert "private note" not in caplog.text


async def test_with_warnings_silenced_nothing_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Catches: a logger that ignores the level an application sets."""
    logging.getLogger("turnplug").setLevel(logging.ERROR)
    try:
        await Pipeline(model=ScriptedModel(["ok"]), pre=[hook(broken, on_error="skip")]).run(
            Turn.start("hi")
        )
    finally:
        logging.getLogger("turnplug").setLevel(logging.NOTSET)
    assert records(caplog) == []
