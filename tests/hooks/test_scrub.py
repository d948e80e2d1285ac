"""`hooks.scrub_input`, `scrub_tool_results` and `scrub_output`: personal data scrubbed where
it comes in, before the model, the events, the audit record and the log see it."""

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks import (
    SCRUB_BLOCKED,
    pii,
    redact,
    scrub_input,
    scrub_output,
    scrub_tool_results,
)
from hooks.config import load_pipeline
from pipeline import ConfigError, Pipeline, cont, tool
from pipeline import events as ev
from pipeline.logs import MemoryLog, SQLiteLog
from pipeline.testing import ScriptedModel
from turns import Context, Message, Part, Text, ToolCall, ToolResult, Turn

CARD = "4242 4242 4242 4242"
EMAIL = "ada@example.com"


@tool
def lookup_customer(name: str) -> str:
    """A customer's record."""
    return f"{name}: {EMAIL}, plan Pro"


def sent_text(model: ScriptedModel) -> str:
    """Everything the model was sent, as one text (tool results included)."""
    return repr([request.messages for request in model.requests])


async def test_a_card_number_in_the_user_message_reaches_neither_the_model_nor_the_log() -> None:
    """Catches: `pii()` protecting the output only, so a card number the user typed was sent
    to the model and committed to the log."""
    seen: list[str] = []

    def later_hook(turn):
        seen.append(turn.user_message.text)
        return cont(turn)

    model = ScriptedModel(["Thanks."])
    pipe = Pipeline(model=model, pre=[scrub_input(pii()), later_hook])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        result = await session.send(f"My card is {CARD}, charge it")

    assert seen == ["My card is [CARD], charge it"]
    assert CARD not in sent_text(model)
    assert "[CARD]" in sent_text(model)
    assert [m.text for m in (await log.load("c")).messages] == [
        "My card is [CARD], charge it",
        "Thanks.",
    ]
    assert CARD not in repr(result.audit)


async def test_an_email_in_a_tool_result_reaches_neither_model_events_audit_nor_log(
    tmp_path: Path,
) -> None:
    """Catches: an e-mail address a tool returned reaching the model, the events, the audit
    record and the log although the pipeline redacts personal data."""
    model = ScriptedModel([[ToolCall("c1", "lookup_customer", {"name": "Ada"})], "Found her."])
    pipe = Pipeline(model=model, tools=[lookup_customer], after_tool=[scrub_tool_results(pii())])
    async with SQLiteLog(tmp_path / "log.db") as log:
        async with pipe.session(log=log, conversation_id="c") as session:
            async with session.stream("Who is Ada?") as events:
                seen = [event async for event in events]
            result = events.result
        entries = await log.entries("c")

    assert EMAIL not in sent_text(model)
    assert "Ada: [EMAIL], plan Pro" in sent_text(model)
    assert EMAIL not in repr(seen)
    step = next(e for e in seen if isinstance(e, ev.ToolStepFinished))
    assert [r.content for r in step.results] == ["Ada: [EMAIL], plan Pro"]
    assert EMAIL not in repr(result.audit)
    assert EMAIL not in repr(entries)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("redact", "card [CARD], mail [EMAIL]"),
        ("mask", "card ***************4242, mail ***********.com"),
    ],
)
async def test_input_strategies_put_what_they_say_in_place_of_a_match(strategy, expected) -> None:
    """Catches: a strategy option that is accepted but ignored."""
    model = ScriptedModel(["ok"])
    pipe = Pipeline(model=model, pre=[scrub_input(pii(), strategy=strategy)])
    result = await pipe.run(Turn.start(f"card {CARD}, mail {EMAIL}"))
    assert result.turn.user_message.text == expected
    assert model.requests[0].messages[-1].text == expected


async def test_hashing_gives_equal_values_equal_digests_and_names_the_kind() -> None:
    """Catches: a hash that differs between two mentions of one value (the model could no
    longer tell they are the same), or that hides what kind of data it stands for."""
    hook = scrub_input(pii(), strategy="hash")
    signal = hook.fn(Turn.start(f"{EMAIL} or {EMAIL}, not bob@example.com"))
    first, second, third = signal.value.user_message.text.replace(",", "").split(" ")[::2]
    assert first == second != third
    assert first.startswith("[EMAIL:")
    assert EMAIL not in signal.value.user_message.text


async def test_blocking_input_halts_the_turn_and_commits_nothing() -> None:
    """Catches: a blocked message still reaching the model or the log."""
    model = ScriptedModel(["never"])
    pipe = Pipeline(model=model, pre=[scrub_input(pii(), strategy="block")])
    log = MemoryLog()
    async with pipe.session(log=log, conversation_id="c") as session:
        result = await session.send(f"card {CARD}")
    assert result.outcome == "halted"
    assert result.halt.hook == "scrub_input"
    assert "CARD" in result.halt.reason
    assert "Please send it again" in result.reply.text
    assert model.requests == []
    assert (await log.load("c")).messages == ()


async def test_blocking_a_tool_result_gives_the_model_an_error_result_instead() -> None:
    """Catches: a blocked result's content still reaching the model."""
    model = ScriptedModel([[ToolCall("c1", "lookup_customer", {"name": "Ada"})], "Sorry."])
    hook = scrub_tool_results(pii(["email"]), strategy="block")
    pipe = Pipeline(model=model, tools=[lookup_customer], after_tool=[hook])
    result = await pipe.run(Turn.start("Who is Ada?"))
    (record,) = result.audit.tools
    assert (record.result.is_error, record.result.error_class) == (True, SCRUB_BLOCKED)
    assert "personal data (EMAIL)" in record.result.content
    assert EMAIL not in sent_text(model)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("redact", "My card is [CARD], thanks."),
        ("mask", "My card is ***************4242, thanks."),
    ],
)
async def test_a_card_spanning_two_text_parts_is_scrubbed(strategy, expected) -> None:
    """Catches: each text part scrubbed alone, so a card split between two parts reached
    the model and the log whole ("block", reading the parts joined, caught it)."""
    model = ScriptedModel(["Noted."])
    pipe = Pipeline(model=model, pre=[scrub_input(pii(), strategy=strategy)])
    log = MemoryLog()
    message = Message("user", (Text("My card is 4242 4242 "), Text("4242 4242, thanks.")))
    async with pipe.session(log=log, conversation_id="c") as session:
        result = await session.send(message)
    assert result.turn.user_message.text == expected
    assert model.requests[0].messages[-1].text == expected
    assert (await log.load("c")).messages[0].text == expected


async def test_a_text_part_a_match_takes_whole_is_dropped_not_sent_empty() -> None:
    """Catches: a text part wholly inside a match (the rest of an address begun in the part
    before it, or a match replaced by no text) left in the message as an empty text part,
    which providers refuse, instead of being dropped."""
    model = ScriptedModel(["ok", "ok"])
    spanning = Message(
        "user", (Text("mail ada@exa"), Text("mple", meta={"m": 1}), Text(".com or call"))
    )
    wiped = Message("user", (Text("hi "), Text("secret12"), Text(" bye")))
    pipe = Pipeline(model=model, pre=[scrub_input(pii())])
    await pipe.run(Turn.start(spanning))
    pipe = Pipeline(model=model, pre=[scrub_input(redact(r"secret\d+", replacement=""))])
    await pipe.run(Turn.start(wiped))
    assert [request.messages[-1].parts for request in model.requests] == [
        (Text("mail [EMAIL]"), Text(" or call")),
        (Text("hi "), Text(" bye")),
    ]


def test_a_message_a_match_takes_whole_keeps_one_empty_text_part() -> None:
    """Catches: a message a match takes whole left with one empty text part per part it
    had, or, those dropped, with no part at all: the empty message is one empty text part,
    as `Message.user("")` is."""
    hook = scrub_input(redact(r"secret\d+", replacement=""))
    message = Message("user", (Text("secr", meta={"m": 1}), Text("et12")))
    assert hook.fn(Turn.start(message)).value.user_message.parts == (Text("", meta={"m": 1}),)


@given(
    text=st.text(alphabet="ab @.x-4", max_size=40).map(lambda t: f"{t} {EMAIL} {CARD} {t}"),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=6),
    strategy=st.sampled_from(["redact", "mask", "hash"]),
    other=st.booleans(),
)
def test_scrubbed_input_does_not_depend_on_how_the_message_is_split_into_parts(
    text, cuts, strategy, other
):
    """Catches: text parts scrubbed one by one, or one a match takes whole left empty. Law:
    for any split of the text into parts (with other parts between them), the scrubbed
    message's text is the scrubbing of the whole text, the other parts stay where they
    were, and no text part is empty."""
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    parts: list[Part] = []
    for start, end in itertools.pairwise(bounds):
        parts.append(Text(text[start:end]))
        if other:
            parts.append(ToolResult("r1", "not text: left as it is"))
    hook = scrub_input(pii(), strategy=strategy)
    signal = hook.fn(Turn.start(Message("user", tuple(parts))))
    scrubbed = signal.value.user_message
    assert scrubbed.text == scrub_output(pii(), strategy=strategy).redact_text(text)
    assert [part for part in scrubbed.parts if type(part) is not Text] == [
        part for part in parts if type(part) is not Text
    ]
    assert all(part.text for part in scrubbed.parts if type(part) is Text)


@given(
    text=st.text(alphabet="ab @.x-4", max_size=40).map(lambda t: t + f" {EMAIL} {CARD}"),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=6),
    strategy=st.sampled_from(["redact", "mask", "hash"]),
)
def test_scrubbed_output_does_not_depend_on_how_the_stream_was_split(text, cuts, strategy):
    """Catches: a masked or hashed reply that differs when an address straddles chunks.
    Law: for any split, the stream adds up to the scrubbing of the whole text."""
    factory = scrub_output(pii(), strategy=strategy)
    stream = factory()
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    out = "".join(stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    out += stream.flush()
    assert out == factory.redact_text(text)
    assert EMAIL not in out


@pytest.mark.parametrize(
    ("build", "culprit"),
    [
        (lambda: scrub_input(pii(), strategy="wipe"), "strategy must be one of"),
        (lambda: scrub_tool_results("email"), "expected a detector built by hooks.pii"),
        (lambda: scrub_output(pii(), strategy="block"), "reject such a reply with a guardrail"),
        (
            lambda: scrub_input(pii(), strategy="block", reply=123),
            r"scrub_input\(reply=\.\.\.\) must be non-empty text or None, got 123",
        ),
        (lambda: scrub_input(pii(), name=""), r"scrub_input\(name="),
        (lambda: scrub_tool_results(pii(), name=7), r"scrub_tool_results\(name="),
    ],
)
def test_bad_options_are_config_errors_naming_the_culprit(build, culprit) -> None:
    """Catches: a typo in a strategy failing mid-turn, or silently meaning "redact"; a
    blocking reply that is not text accepted and failing the turn it blocks."""
    with pytest.raises(ConfigError, match=culprit):
        build()


def test_patterns_work_as_a_detector_too() -> None:
    """Catches: scrubbing limited to the built-in kinds."""
    hook = scrub_tool_results(redact(r"ACME-\d+", replacement="[ACCOUNT]"))
    signal = hook.fn(ToolCall("c", "t", {}), _result("account ACME-991 ok"), Turn.start("x"))
    assert signal.value.content == "account [ACCOUNT] ok"


def _result(content: str):
    from turns import ToolResult

    return ToolResult("c", content)


async def test_config_scrub_kinds_scrub_input_and_tool_results(tmp_path: Path) -> None:
    """Catches: no config kinds for scrubbing input and tool results."""
    (tmp_path / "crm.py").write_text(
        "def lookup_customer(name: str) -> str:\n"
        "    '''A customer's record.'''\n"
        f"    return name + ': {EMAIL}'\n"
    )
    config = tmp_path / "scrub.toml"
    config.write_text(
        '[model]\nprovider = "scripted"\n'
        'replies = ["done"]\n\n'
        '[[pre]]\nkind = "scrub"\npii = ["card"]\nstrategy = "mask"\n\n'
        '[[tools]]\nkind = "python"\nref = "crm:lookup_customer"\n\n'
        '[[after_tool]]\nkind = "scrub"\npatterns = ["[\\\\w.]+@[\\\\w.]+"]\n'
        'replacement = "[ADDRESS]"\nmatch = "lookup_customer"\n'
    )
    pipe = load_pipeline(config)
    hook_pre, hook_after = pipe.pre[0], pipe.after_tool[0]
    masked = hook_pre.fn(Turn.start(f"card {CARD}")).value.user_message.text
    assert masked == "card ***************4242"
    call = ToolCall("c", "lookup_customer", {"name": "Ada"})
    assert hook_after.fn(call, _result(f"Ada: {EMAIL}"), Turn.start("x")).value.content == (
        "Ada: [ADDRESS]"
    )
    assert hook_after.match == "lookup_customer"


def test_config_scrub_results_may_match_an_mcp_toolsets_tool_as_tool_hooks_may() -> None:
    """Catches: a scrub entry's `match` checked against the declared tools alone, so that
    naming a tool of an MCP toolset (known only once connected) is "no tool named ...",
    while a python after_tool hook with the same `match` is accepted."""
    from hooks.config import pipeline_from_dict

    config = {
        "model": {"provider": "scripted", "replies": ["done"]},
        "toolsets": [{"kind": "mcp", "name": "memory", "url": "http://127.0.0.1:1/mcp"}],
        "after_tool": [
            {"kind": "scrub", "pii": ["email"], "match": "memory_read_graph"},
            {"kind": "scrub", "pii": ["email"], "match": {"regex": "memory_.*"}},
        ],
    }
    pipe = pipeline_from_dict(config)
    exact, pattern = (hook.match for hook in pipe.after_tool)
    assert exact == "memory_read_graph"
    assert pattern.pattern == "memory_.*"
    config["after_tool"] = [{"kind": "scrub", "pii": ["email"], "match": "memroy_read_graph"}]
    with pytest.raises(
        ConfigError, match=r'after_tool\[0\]\.match: no tool named "memroy_read_graph"'
    ):
        pipeline_from_dict(config)


@pytest.mark.parametrize("strategy", ["mask", "hash"])
def test_a_match_that_needs_its_context_is_still_replaced(strategy) -> None:
    """Catches: a hashed or masked match computed from the match alone, which a pattern
    needing its context (a lookbehind) no longer finds, so the raw value went through."""
    detector = redact(r"(?<=pin )\d{4}", replacement="[PIN]")
    stream = scrub_output(detector, strategy=strategy)()
    out = stream.feed("my pin 1234 ok") + stream.flush()
    assert "123" not in out


def continuing_from_a_client_tool(content: str) -> Turn:
    """A turn that continues from the result of a tool its caller ran (a gateway's client)."""
    asked = Message.assistant([ToolCall("c1", "lookup_customer", {"name": "Ada"})])
    history = Context(messages=(Message.user("Who is Ada?"), asked))
    return Turn.start(Message.tool(ToolResult("c1", content)), context=history)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [("redact", "Ada: [EMAIL], plan Pro"), ("mask", "Ada: ***********.com, plan Pro")],
)
async def test_a_result_a_caller_ran_is_scrubbed_like_the_users_text(strategy, expected) -> None:
    """Catches: scrub_input reading only text parts, so an address in a client tool's result
    (which no after-tool hook sees) reached the model, the audit record and the log."""
    model = ScriptedModel(["Ada is on Pro."])
    pipe = Pipeline(model=model, pre=[scrub_input(pii(), strategy=strategy)])
    result = await pipe.run(continuing_from_a_client_tool(f"Ada: {EMAIL}, plan Pro"))
    [sent] = [m for m in model.requests[0].messages if m.role == "tool"]
    assert [part.content for part in sent.parts] == [expected]
    assert EMAIL not in sent_text(model)
    assert EMAIL not in repr(result.turn)
    assert EMAIL not in repr(result.audit)


async def test_blocking_input_halts_on_a_result_a_caller_ran() -> None:
    """Catches: strategy="block" letting personal data through when it came in a client
    tool's result rather than in the user's text."""
    model = ScriptedModel(["never"])
    pipe = Pipeline(model=model, pre=[scrub_input(pii(), strategy="block")])
    result = await pipe.run(continuing_from_a_client_tool(f"Ada: {EMAIL}"))
    assert (result.outcome, result.halt.hook) == ("halted", "scrub_input")
    assert result.halt.reason == "the tool results hold personal data (EMAIL)"
    assert result.reply.text.startswith("The tool results seem to hold personal data (EMAIL).")
    assert model.requests == []
