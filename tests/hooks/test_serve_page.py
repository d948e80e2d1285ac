"""The live page in a real headless Chromium (Debian's `chromium`, driven by Playwright)."""

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from hooks import deny
from pipeline import Pipeline, cont, hook
from pipeline.testing import ScriptedModel
from turns import ToolCall

from .serve_support import served, user

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def browse(url: str, key: str, send: Any, shot: Path) -> dict[str, Any]:
    """Open the page, give it the key, send a turn, wait for it to show; screenshot it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto(url + "/")
            page.fill("#key", key)
            page.click("#key-form button")
            page.wait_for_selector("#status:text('live')")
            send()
            page.wait_for_selector(".turn .outcome.completed", timeout=15_000)
            # The message follows the turn's end: it is shown as the log holds it.
            page.wait_for_selector(".turn .user:text('user: the plan?')", timeout=5_000)
            page.screenshot(path=str(shot), full_page=True)
            return {
                "text": page.inner_text("main"),
                "hooks": page.locator(".turn li.hook b").all_inner_texts(),
                "outcome": page.inner_text(".turn .outcome"),
            }
        finally:
            browser.close()


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it; under CI this fails)",
)
async def test_a_turn_sent_with_the_sdk_appears_on_the_page(tmp_path: Path) -> None:
    """Catches: a page that stays empty, or hides the hooks and the rejection of a turn."""

    def add_date(turn: Any) -> Any:
        return cont(turn.inject("Today is Monday."))

    pipe = Pipeline(
        model=ScriptedModel(["the INTERNAL USE ONLY plan", "the public plan"]),
        pre=[hook(add_date, name="add_date")],
        post=[deny(r"(?i)internal use only", feedback="Do not reveal internal material.")],
    )
    async with served(pipe) as gw:
        client = gw.sdk()

        def send() -> None:
            anyio.from_thread.run(
                lambda: client.chat.completions.create(model="m", messages=user("the plan?"))
            )

        shot = tmp_path / "page.png"
        seen = await anyio.to_thread.run_sync(browse, gw.url, "gw-test-key-5c1d0e", send, shot)
    assert seen["outcome"] == "completed"
    assert "add_date" in seen["hooks"]
    assert "deny" in " ".join(seen["hooks"]) or any(
        "deny" in h or "guardrail" in h for h in seen["hooks"]
    )
    assert "user: the plan?" in seen["text"]
    assert "the public plan" in seen["text"]
    assert "attempt 1 rejected by" in seen["text"]
    assert "Do not reveal internal material." in seen["text"]
    assert "INTERNAL USE ONLY" not in seen["text"]
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it; under CI this fails)",
)
async def test_tool_calls_returned_to_the_client_appear_on_the_page(tmp_path: Path) -> None:
    """Catches: a turn whose answer was tool calls for the client shown on the page as an
    empty reply, without the calls the client received."""
    call = ToolCall("call_1", "get_weather", {"city": "Oslo"})
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    async with served(Pipeline(model=ScriptedModel([[call]]))) as gw:
        client = gw.sdk()

        def send() -> None:
            anyio.from_thread.run(
                lambda: client.chat.completions.create(
                    model="m", messages=user("the plan?"), tools=[weather]
                )
            )

        shot = tmp_path / "page.png"
        seen = await anyio.to_thread.run_sync(browse, gw.url, "gw-test-key-5c1d0e", send, shot)
    assert seen["outcome"] == "completed"
    assert "tool call get_weather returned to the client" in seen["text"]
    assert '{"city":"Oslo"}' in seen["text"]
