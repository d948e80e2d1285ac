"""Helpers the pipeline tests share."""

from pipeline import events as ev

# Failures that are not a hook run: nothing opened them.
NEVER_STARTED = {"transformers", "commit"}


def pairing_problems(events) -> list[str]:
    """What breaks "every HookStarted is closed exactly once" in a whole event list.

    A HookStarted is closed by the next HookFinished or HookFailed of the same turn, hook and
    stage; a second close, a close that nothing opened, or a start left open is a problem.
    """
    problems: list[str] = []
    opened: set[tuple[str, str, str]] = set()
    for event in events:
        if type(event) not in (ev.HookStarted, ev.HookFinished, ev.HookFailed):
            continue
        key = (event.turn_ref, event.hook, event.stage)
        if type(event) is ev.HookStarted:
            if key in opened:
                problems.append(f"{key} started again before it was closed")
            opened.add(key)
        elif key in opened:
            opened.remove(key)
        elif event.stage not in NEVER_STARTED:
            problems.append(f"{type(event).__name__} {key} closes nothing")
    problems.extend(f"{key} never closed" for key in sorted(opened))
    return problems
