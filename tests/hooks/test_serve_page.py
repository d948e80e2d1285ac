"""The live page in a real headless Chromium (Debian's `chromium`, driven by Playwright)."""

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from hooks import deny
from hooks.cli._gateway import page_policy
from pipeline import Pipeline, cont, halt, hook
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


RECORD_VIOLATIONS = """window.violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.violations.push(e.effectiveDirective + " " + e.blockedURI);
});"""
"""Run before the page's own script: every resource the page's policy refused, in
`window.violations`."""


def browse(url: str, key: str, send: Any, shot: Path) -> dict[str, Any]:
    """Open the page, give it the key, send a turn, wait for it to show; screenshot it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.add_init_script(RECORD_VIOLATIONS)
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
                "ref": page.inner_text(".turn h2 .ref"),
                "ref_title": page.get_attribute(".turn h2 .ref", "title"),
                "violations": page.evaluate("window.violations"),
            }
        finally:
            browser.close()


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it; under CI this fails)",
)
async def test_a_turn_sent_with_the_sdk_appears_on_the_page(tmp_path: Path) -> None:
    """Catches: a page that stays empty, or hides the hooks and the rejection of a turn; or
    heads the turn with too little of its request id to find it by (``req_`` and 8 hex
    digits, and the whole id nowhere)."""

    def add_date(turn: Any) -> Any:
        return cont(turn.inject("Today is Monday."))

    pipe = Pipeline(
        model=ScriptedModel(["the INTERNAL USE ONLY plan", "the public plan"]),
        pre=[hook(add_date, name="add_date")],
        post=[deny(r"(?i)internal use only", feedback="Do not reveal internal material.")],
    )
    replies = []
    async with served(pipe) as gw:
        client = gw.sdk()

        def send() -> None:
            replies.append(
                anyio.from_thread.run(
                    lambda: client.chat.completions.create(model="m", messages=user("the plan?"))
                )
            )

        shot = tmp_path / "page.png"
        seen = await anyio.to_thread.run_sync(browse, gw.url, "gw-test-key-5c1d0e", send, shot)
    assert seen["outcome"] == "completed"
    # Enough of the request id to find the turn in the gateway's log lines, all of it on hover.
    assert (seen["ref"], seen["ref_title"]) == (replies[0]._request_id[:16], replies[0]._request_id)
    assert seen["violations"] == []  # the page's own script and style all ran
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


TWO_BLOCKS = """<!doctype html><html><head>
<style>body { color: rgb(1, 2, 3) }</style>
<style media="all">p { color: rgb(4, 5, 6) }</style>
</head><body><p>text</p>
<script>window.first = 1</script>
<script type="module">window.second = 2</script>
</body></html>"""
"""A page with two blocks of each kind, a tag with attributes among them."""


def policed(html: str, policy: str) -> dict[str, Any]:
    """Open `html` served with `policy`; what its blocks did and what the policy refused."""
    from playwright.sync_api import Route, sync_playwright

    def fulfill(route: Route) -> None:
        route.fulfill(
            body=html,
            content_type="text/html",
            headers={"content-security-policy": policy},
        )

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.add_init_script(RECORD_VIOLATIONS)
            page.route("http://page.invalid/", fulfill)
            page.goto("http://page.invalid/")
            page.wait_for_load_state("load")  # every block has run (or was refused) by then
            return {
                "ran": page.evaluate("[window.first, window.second]"),
                "violations": page.evaluate("window.violations"),
                "colors": page.evaluate(
                    "[document.body, document.querySelector('p')]"
                    ".map((e) => getComputedStyle(e).color)"
                ),
            }
        finally:
            browser.close()


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it; under CI this fails)",
)
def test_the_page_policy_lets_every_script_and_style_block_of_the_page_run() -> None:
    """Bug caught: the page's policy hashed only its first script and first style block
    (and no tag with attributes), so any other was refused without a word."""
    seen = policed(TWO_BLOCKS, page_policy(TWO_BLOCKS))
    assert seen == {
        "ran": [1, 2],
        "violations": [],
        "colors": ["rgb(1, 2, 3)", "rgb(4, 5, 6)"],
    }


PAYLOAD = (
    "<img src=x onerror=\"window.pwned=1;document.title='pwned'\">"
    "</script><script>window.pwned=2</script>"
    '<a href="javascript:window.pwned=3">link</a>'
)
"""Markup a client, a model, a hook or a tool may write: the page must show it, not run it."""


SLIP_IN = """new Promise((resolve) => {
  document.addEventListener("securitypolicyviolation", (e) => {
    if (e.effectiveDirective.startsWith("script-src")) resolve(e.effectiveDirective);
  });
  document.body.insertAdjacentHTML("beforeend", '<img src=x onerror="window.slipped=1">');
  setTimeout(() => resolve("nothing refused it"), 10000);
})"""
"""Markup put into the page as if it had slipped through: resolves with the directive that
refused to run its handler (or, without a policy, says so rather than wait for ever)."""


def browse_hostile(url: str, key: str, send: Any) -> dict[str, Any]:
    """Open the page, send the hostile turns, wait for both to finish; what the page ran."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(url + "/")
            page.fill("#key", key)
            page.click("#key-form button")
            page.wait_for_selector("#status:text('live')")
            send()
            page.wait_for_selector(".turn .outcome.completed", timeout=15_000)
            page.wait_for_selector(".turn .outcome.error", timeout=15_000)  # halted: 422
            page.wait_for_selector(".turn .user:text('user: <img')", timeout=5_000)
            return {
                "text": page.inner_text("main"),
                "pwned": page.evaluate("window.pwned"),
                "title": page.title(),
                "elements": page.evaluate(
                    "document.querySelectorAll('main img, main script, main a').length"
                ),
                "errors": errors,
                "reply": page.inner_text(".turn .reply"),
            }
        finally:
            browser.close()


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it; under CI this fails)",
)
async def test_markup_in_what_a_turn_carries_is_shown_as_text_never_run(tmp_path: Path) -> None:
    """Catches: a user message, a reply, a hook's name, an injection, a halt's reason, a
    hook's error or a conversation id put on the page as markup, where a
    client or a model could run script in the page of whoever watches the gateway."""
    import openai

    from pipeline.logs import SQLiteLog

    def inject(turn: Any) -> Any:
        if "stop" in turn.user_message.text:
            return halt(PAYLOAD)
        return cont(turn.inject(PAYLOAD))

    def fails(turn: Any) -> Any:
        raise RuntimeError(PAYLOAD)

    pipe = Pipeline(
        model=ScriptedModel([PAYLOAD]),
        pre=[hook(fails, name=PAYLOAD + "fails", on_error="skip"), hook(inject, name=PAYLOAD)],
    )
    async with SQLiteLog(tmp_path / "log.db") as log, served(pipe, log=log) as gw:
        client = gw.sdk()

        async def turns() -> None:
            await client.chat.completions.create(
                model="m",
                messages=user(PAYLOAD),
                extra_headers={"X-Conversation-Id": PAYLOAD},
            )
            with pytest.raises(openai.UnprocessableEntityError):  # the halted turn: 422
                await client.chat.completions.create(model="m", messages=user("stop " + PAYLOAD))

        def send() -> None:
            anyio.from_thread.run(turns)

        seen = await anyio.to_thread.run_sync(browse_hostile, gw.url, "gw-test-key-5c1d0e", send)
    assert seen["pwned"] is None
    assert seen["title"] == "turnplug gateway — live turns"
    assert seen["elements"] == 0
    assert seen["errors"] == []
    text = seen["text"]
    assert f"user: {PAYLOAD} (conversation {PAYLOAD})" in text
    assert f"{PAYLOAD}fails failed RuntimeError: {PAYLOAD}" in text
    assert f"{PAYLOAD} injected (transient" in text
    assert seen["reply"] == PAYLOAD
    assert f"committed to conversation {PAYLOAD}" in text
    assert f"halted by {PAYLOAD} {PAYLOAD}" in text


def slip_in(url: str) -> dict[str, Any]:
    """Open the page and put markup into it as if it had slipped through; what ran."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(url + "/")
            page.wait_for_selector("#status:text('live')")
            refused = page.evaluate(SLIP_IN)
            return {"refused": refused, "slipped": page.evaluate("window.slipped")}
        finally:
            browser.close()


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it; under CI this fails)",
)
async def test_the_page_s_policy_runs_no_script_but_its_own() -> None:
    """Bug caught: the page had no Content-Security-Policy, so markup that slipped into it
    (an ``onerror`` handler) would have run as the page's own script."""
    async with served(Pipeline(model=ScriptedModel(["hi"])), api_key=None) as gw:
        seen = await anyio.to_thread.run_sync(slip_in, gw.url)
    assert seen == {"refused": "script-src-attr", "slipped": None}
