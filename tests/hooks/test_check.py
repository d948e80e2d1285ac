"""`turnplug check`: the resolved pipeline, and every way a config can be wrong, as a user
meets it on the command line (exit 2, one clear line, no traceback)."""

from pathlib import Path

import pytest

from tests.hooks.cli_support import environment, turnplug, write_config

ROOT = Path(__file__).resolve().parents[2]

FULL = """
    system = "You are a shop assistant."
    max_regenerations = 3
    hold_until_accepted = true

    [model]
    provider = "openai"
    name = "gpt-4o-mini"
    temperature = 0.2

    [budget]
    context_tokens = 8000
    injection_reserve = 1000

    [[pre]]
    kind = "static"
    name = "rules"
    text = "Answer in English."

    [[pre]]
    kind = "parallel"
    name = "retrieval"
    hooks = [
      { kind = "python", ref = "shop_hooks:faq", timeout = 1.5, on_error = "skip" },
      { kind = "static", text = "[note]", durable = true, name = "note" },
    ]

    [[transformers]]
    kind = "redact"
    name = "redact_digits"
    patterns = ['\\d{6,}']

    [[post]]
    kind = "python"
    ref = "shop_hooks:never_happy"
    shadow = true

    [[post]]
    kind = "python"
    ref = "shop_hooks:gate"
    name = "summary"
    background = true
"""


def _check(path: Path) -> list[str]:
    done = turnplug("check", path, env=environment(OPENAI_API_KEY="sk-test"))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout.splitlines()


def _row(lines: list[str], path: str) -> list[str]:
    (line,) = [line for line in lines if line.split() and line.split()[0] == path]
    return line.split()


def test_check_lists_every_stage_in_the_order_a_turn_meets_them(tmp_path: Path) -> None:
    lines = _check(write_config(tmp_path, FULL))
    titles = [line.split(". ", 1)[1] for line in lines if line[:1].isdigit()]
    assert [title.split(",")[0] for title in titles] == [
        "pre hooks",
        "budget check",
        "model call",
        "stream transformers",
        "post hooks",
        "background post hooks",
        "on session start",
        "on session end",
    ]


def test_check_shows_each_hook_with_its_durability_timeout_and_error_policy(
    tmp_path: Path,
) -> None:
    lines = _check(write_config(tmp_path, FULL))
    assert _row(lines, "pre[0]") == [
        "pre[0]",
        "rules",
        "static",
        "transient",
        "no",
        "timeout",
        "on_error",
        "halt",
    ]
    faq = _row(lines, "pre[1].hooks[0]")
    assert faq[1:7] == ["faq", "python", "transient", "timeout", "1.5s", "on_error"]
    assert faq[7:] == ["skip", "shop_hooks:faq"]
    note = _row(lines, "pre[1].hooks[1]")
    assert note[1:4] == ["note", "static", "durable"]
    assert "shadow" in " ".join(_row(lines, "post[0]"))
    background = _row(lines, "post[1]")
    assert background[1] == "summary"
    assert "background" in background

    # The background hook is listed after the commit, apart from the ordered post hooks.
    def where(start: str) -> int:
        (index,) = [i for i, line in enumerate(lines) if line.split()[:1] == [start]]
        return index

    ordered = next(i for i, line in enumerate(lines) if "post hooks, in order" in line)
    after = next(i for i, line in enumerate(lines) if "background post hooks" in line)
    assert ordered < where("post[0]") < after < where("post[1]")


def test_check_shows_the_model_and_the_bounds(tmp_path: Path) -> None:
    text = "\n".join(_check(write_config(tmp_path, FULL)))
    assert "openai gpt-4o-mini" in text
    assert "key from OPENAI_API_KEY" in text
    assert "temperature 0.2" in text
    assert "max_regenerations 3" in text
    assert "hold_until_accepted true" in text
    assert "context_tokens 8000, injection_reserve 1000" in text
    assert "sk-test" not in text


@pytest.mark.parametrize(
    ("replies", "shown"),
    [
        ('["ok"]', "scripted (offline): 1 reply, for the first model call only"),
        ('["ok", "again"]', "scripted (offline): 2 replies, one per model call"),
    ],
)
def test_check_counts_a_scripted_model_s_replies_in_words(
    tmp_path: Path, replies: str, shown: str
) -> None:
    """Bug caught: a scripted model of one reply was shown as "1 replies, one per model
    call"."""
    config = write_config(tmp_path, f'[model]\nprovider = "scripted"\nreplies = {replies}\n')
    assert f"  model    {shown}" in _check(config)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_check_hides_the_credentials_in_a_base_url(tmp_path: Path, provider: str) -> None:
    """Catches: check printing a model's base_url with the user and password written into it
    (`https://user:s3cret@proxy.example/v1`), which the providers hide (***@) in their repr
    and errors, on a screen or in a CI log a reviewer reads."""
    config = f"""
        [model]
        provider = "{provider}"
        name = "m"
        api_key_env = "OPENAI_API_KEY"
        base_url = "https://user:s3cret@proxy.example/v1"
    """
    text = "\n".join(_check(write_config(tmp_path, config)))
    assert f"{provider} m, at https://***@proxy.example/v1," in text
    assert "s3cret" not in text


def test_check_shows_the_base_url_the_environment_gives_and_where_it_came_from(
    tmp_path: Path,
) -> None:
    """Bug caught: check naming a model's URL only when the file sets `base_url`, so a model
    (or a judge's) that OPENAI_BASE_URL or ANTHROPIC_BASE_URL sends to another host read as
    if it went to the provider's default one; the URL shown hides its credentials."""
    config = """
        [model]
        provider = "openai"
        name = "gpt-4o-mini"

        [[post]]
        kind = "judge"
        instruction = "No prices."
        model = { provider = "anthropic", name = "claude", api_key_env = "" }
    """
    env = environment(
        OPENAI_API_KEY="sk-test",
        OPENAI_BASE_URL="https://user:s3cret@proxy.example/v1/",
        ANTHROPIC_BASE_URL="http://localhost:8089",
    )
    done = turnplug("check", write_config(tmp_path, config), env=env)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert (
        "model    openai gpt-4o-mini, at https://***@proxy.example/v1 (from OPENAI_BASE_URL),"
        in done.stdout
    )
    assert "judged by anthropic claude, at http://localhost:8089 (from ANTHROPIC_BASE_URL)," in (
        done.stdout
    )
    assert "s3cret" not in done.stdout
    # Without the variables, the provider's default host, which the docs name.
    done = turnplug("check", write_config(tmp_path, config), env=environment(OPENAI_API_KEY="k"))
    assert "openai gpt-4o-mini, at https://api.openai.com/v1, key from" in done.stdout
    assert "anthropic claude, at https://api.anthropic.com, no key" in done.stdout


TOOLS = """
    max_steps = 5
    tool_concurrency = 2

    [[tools]]
    kind = "python"
    ref = "shop_hooks:order_status"

    [[tools]]
    kind = "python"
    ref = "shop_hooks:today"
    name = "clock"

    [[pre]]
    kind = "tool_call"
    tool = "clock"
    frequency = "if_changed"
    refresh = { kind = "ttl", minutes = 30 }

    [[pre]]
    kind = "parallel"
    hooks = [{ kind = "retrieve", search = "shop_hooks:search", k = 3 }]

    [[before_tool]]
    kind = "python"
    ref = "shop_hooks:no_refunds"
    match = { regex = 'refund_.*' }

    [[after_tool]]
    kind = "python"
    ref = "shop_hooks:trim"
    match = "order_status"

    [[after_tool]]
    kind = "python"
    ref = "shop_hooks:trim"
    name = "trim_all"

    [[transformers]]
    kind = "pii"
    kinds = ["email", "card"]

    [[transformers]]
    kind = "citations"

    [[post]]
    kind = "guardrail"
    deny = ['(?i)internal only']
    feedback = "No internals."

    [[post]]
    kind = "guardrail"
    check = "shop_hooks:polite"
    on_error = "skip"

    [[post]]
    kind = "max_length"
    chars = 400

    [[post]]
    kind = "judge"
    instruction = "No prices."
    model = { provider = "openai", name = "gpt-4o-mini", api_key_env = "JUDGE_KEY" }
"""


def test_check_lists_the_tools_with_their_required_arguments_and_the_tool_hooks(
    tmp_path: Path,
) -> None:
    done = turnplug("check", write_config(tmp_path, TOOLS), env=environment(JUDGE_KEY="sk-j"))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    lines = done.stdout.splitlines()
    titles = [line.split(". ", 1)[1] for line in lines if line[:1].isdigit()]
    assert titles[1:5] == [
        "model call",
        "tools the model may call: at most 5 model calls per attempt, 2 tool calls at a time",
        "before each tool call, in order",
        "after each tool call, in order",
    ]
    assert _row(lines, "tools[0]") == [
        "tools[0]",
        "order_status",
        "requires",
        "order",
        "shop_hooks:order_status",
    ]
    assert _row(lines, "tools[1]") == [
        "tools[1]",
        "clock",
        "no",
        "required",
        "arguments",
        "shop_hooks:today",
    ]
    assert _row(lines, "before_tool[0]")[1:3] == ["no_refunds", "python"]
    assert _row(lines, "before_tool[0]")[-3:] == ["shop_hooks:no_refunds,", "match", "/refund_.*/"]
    assert _row(lines, "after_tool[0]")[-3:] == ["shop_hooks:trim,", "match", '"order_status"']
    assert _row(lines, "after_tool[1]")[1] == "trim_all"
    assert _row(lines, "after_tool[1]")[-2:] == ["every", "tool"]


def test_check_shows_what_each_new_kind_runs(tmp_path: Path) -> None:
    done = turnplug("check", write_config(tmp_path, TOOLS), env=environment(JUDGE_KEY="sk-j"))
    lines = done.stdout.splitlines()
    clock = " ".join(_row(lines, "pre[0]"))
    assert clock.startswith("pre[0] inject_clock tool_call durable no timeout on_error skip")
    assert clock.endswith("runs tool clock, if_changed, fresh for 30 minutes")
    assert " ".join(_row(lines, "pre[1].hooks[0]")).endswith("shop_hooks:search, k 3")
    assert _row(lines, "transformers[0]") == ["transformers[0]", "pii", "pii", "email", "card"]
    assert _row(lines, "transformers[1]") == ["transformers[1]", "citations", "citations"]
    assert " ".join(_row(lines, "post[0]")).endswith("deny '(?i)internal only'")
    polite = " ".join(_row(lines, "post[1]"))
    assert polite.startswith("post[1] polite guardrail transient no timeout on_error skip")
    assert polite.endswith("shop_hooks:polite")
    assert " ".join(_row(lines, "post[2]")).endswith("at most 400 characters")
    judge = " ".join(_row(lines, "post[3]"))
    assert judge.endswith(
        "judged by openai gpt-4o-mini, at https://api.openai.com/v1, key from JUDGE_KEY"
    )
    assert "sk-j" not in done.stdout


@pytest.mark.parametrize(
    ("entry", "row"),
    [
        (
            "every = 5",
            "post[0] running_summary running_summary durable no timeout on_error halt"
            " every 5 turns, summarized by the turn's model, background",
        ),
        (
            'name = "cheap_summary"\n'
            'model = { provider = "openai", name = "gpt-4o-mini", api_key_env = "SUMMARY_KEY" }',
            "post[0] cheap_summary running_summary durable no timeout on_error halt every 10"
            " turns, summarized by openai gpt-4o-mini, at https://api.openai.com/v1, key from"
            " SUMMARY_KEY, background",
        ),
    ],
    ids=["turn_model", "own_model"],
)
def test_check_shows_the_catalogues_summary_and_compactor(
    tmp_path: Path, entry: str, row: str
) -> None:
    """Bug caught: a config could not declare the catalogue's running summary or its
    compactor, so `check` had neither to show."""
    config = write_config(
        tmp_path,
        """
        compact = "drop_oldest"
        budget = { context_tokens = 4000, injection_reserve = 400 }

        [[post]]
        kind = "running_summary"
        """
        + entry,
    )
    done = turnplug("check", config, env=environment(SUMMARY_KEY="sk-s"))
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert "  compact  drop_oldest" in lines
    after = next(i for i, line in enumerate(lines) if "background post hooks" in line)
    assert lines[after + 1].split()[0] == "post[0]"
    assert " ".join(_row(lines, "post[0]")) == row
    assert "sk-s" not in done.stdout


def test_check_of_the_example_passes() -> None:
    done = turnplug("check", "examples/assistant.toml", cwd=ROOT)
    assert done.returncode == 0
    assert "assistant_hooks:opening_hours" in done.stdout
    assert "no_guarantees" in done.stdout


def test_check_shows_regexes_as_the_config_writes_them(tmp_path: Path) -> None:
    """Catches: patterns shown as Python reprs, every backslash doubled (the example's
    '(?i)\\bguarantee' as '(?i)\\\\bguarantee', another regex if copied back into the file)."""
    config = write_config(
        tmp_path,
        """
        [[transformers]]
        kind = "redact"
        patterns = ['\\d{4,}', "it's\\tme"]

        [[post]]
        kind = "guardrail"
        deny = ['(?i)\\bguarantee']
        feedback = "No guarantees."
        """,
    )
    done = turnplug("check", config)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert _row(lines, "transformers[0]")[-2:] == ["'\\d{4,}'", '"it\'s\\tme"']
    assert " ".join(_row(lines, "post[0]")).endswith("deny '(?i)\\bguarantee'")


def test_check_shows_a_name_with_a_line_break_on_its_own_row(tmp_path: Path) -> None:
    """Catches: a hook, transformer or toolset name holding a line break printed as is, so
    that its second half stood as a line of its own: a forged stage (`2. model call`) that a
    reviewer of the config would read as real."""
    config = write_config(
        tmp_path,
        """
        [[pre]]
        kind = "static"
        name = "rules\\n2. model call"
        text = "Be brief."

        [[transformers]]
        kind = "pii"
        name = "pii\\r\\nnone"

        [[toolsets]]
        kind = "python"
        name = "shop\\nx"
        refs = ["shop_hooks:today"]
        """,
    )
    done = turnplug("check", config)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("2. ")] == ["2. model call"]
    assert _row(lines, "pre[0]")[1] == "rules\\n2."
    assert _row(lines, "transformers[0]")[1] == "pii\\r\\nnone"
    assert "  shop\\nx  local: shop_x_today" in lines


def test_check_shows_a_name_s_c1_control_escaped(tmp_path: Path) -> None:
    """Bug caught: `check` escaped C0 control characters in names but not C1 ones, so
    U+009B (a CSI on its own, which a terminal may act on) in a hook's name reached it."""
    config = write_config(
        tmp_path,
        """
        [[pre]]
        kind = "static"
        name = "rules\\u009b2J"
        text = "Be brief."
        """,
    )
    done = turnplug("check", config)
    assert done.returncode == 0, done.stderr
    assert _row(done.stdout.splitlines(), "pre[0]")[1] == "rules\\x9b2J"
    assert "\x9b" not in done.stdout


def test_check_shows_what_a_scrub_entry_scrubs_and_the_tools_it_matches(tmp_path: Path) -> None:
    """Catches: scrub entries shown with no detail, so that a scrub of one tool's results
    (`match`) read as a scrub of every tool's, and neither said what it finds or does."""
    config = write_config(
        tmp_path,
        """
        [[pre]]
        kind = "scrub"
        pii = ["email", "card"]
        strategy = "block"

        [[tools]]
        kind = "python"
        ref = "shop_hooks:order_status"

        [[after_tool]]
        kind = "scrub"
        patterns = ['\\bA\\d+']
        strategy = "hash"
        match = "order_status"

        [[after_tool]]
        kind = "scrub"
        pii = ["phone"]
        """,
    )
    done = turnplug("check", config)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert " ".join(_row(lines, "pre[0]")).endswith("on_error halt block email card")
    first = " ".join(_row(lines, "after_tool[0]"))
    assert first.endswith("hash '\\bA\\d+', match \"order_status\"")
    assert " ".join(_row(lines, "after_tool[1]")).endswith("redact phone, every tool")


# -- every way a config can be wrong ----------------------------------------------------------

ERRORS = {
    "TOML syntax error": ("system = \n", "", "TOML syntax error"),
    "unknown key": ('sytem = "x"\n', "sytem", '"system"'),
    "wrong type": ('[[pre]]\nkind = "static"\ntext = 3\n', "pre[0].text", "string"),
    "bad regex": (
        '[[transformers]]\nkind = "redact"\npatterns = ["a(b"]\n',
        "transformers[0].patterns[0]",
        "a(b",
    ),
    "unimportable ref": (
        '[[pre]]\nkind = "python"\nref = "shop_hookz:faq"\n',
        "pre[0].ref",
        "shop_hookz",
    ),
    "ref not callable": (
        '[[post]]\nkind = "python"\nref = "shop_hooks:NOT_CALLABLE"\n',
        "post[0].ref",
        "not callable",
    ),
    "ref with wrong arity": (
        '[[pre]]\nkind = "python"\nref = "shop_hooks:two_arguments"\n',
        "pre[0].ref",
        "(turn, extra)",
    ),
    "unknown kind": ('[[pre]]\nkind = "guardrial"\n', "pre[0].kind", "guardrial"),
    "bad model provider": ('[model]\nprovider = "gemini"\n', "model.provider", "gemini"),
    "missing API key": (
        '[model]\nprovider = "openai"\nname = "gpt-4o-mini"\n',
        "model.api_key_env",
        "OPENAI_API_KEY",
    ),
    "tool_call of an undeclared tool": (
        '[[tools]]\nkind = "python"\nref = "shop_hooks:today"\n'
        '[[pre]]\nkind = "tool_call"\ntool = "todya"\n',
        "pre[0].tool",
        '"today"',
    ),
    "guardrail without a rule": (
        '[[post]]\nkind = "guardrail"\nfeedback = "No."\n',
        "post[0]",
        "deny or check",
    ),
}


# Every command loads its config the same way: all cases through check and run, a few
# through chat.
COMMAND_CASES = [
    *((command, case) for case in sorted(ERRORS) for command in ("check", "run")),
    ("chat", "unknown kind"),
    ("chat", "missing API key"),
]


@pytest.mark.parametrize(("command", "case"), COMMAND_CASES)
def test_a_bad_config_is_one_clear_line_and_exit_2(tmp_path: Path, command: str, case: str) -> None:
    text, path, culprit = ERRORS[case]
    config = write_config(tmp_path, text)
    args = ["run", config, "hi"] if command == "run" else [command, config]
    done = turnplug(*args)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"turnplug: error: ConfigError: {config}: {path}")
    assert culprit in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_missing_file_is_one_clear_line_and_exit_2(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "absent.toml"
    done = turnplug(*(["run", missing, "hi"] if command == "run" else [command, missing]))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"turnplug: error: ConfigError: {missing}: no such file\n"


def test_a_config_with_ten_errors_reports_all_ten(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """
        sytem = "x"
        max_regenerations = -1
        hold_until_accepted = "yes"

        [model]
        provider = "openai"
        name = "gpt-4o-mini"
        api_key_env = ""
        temperature = 9

        [[pre]]
        kind = "statc"
        text = "x"

        [[pre]]
        kind = "python"
        ref = "shop_hooks:two_arguments"
        timeout = 0

        [[transformers]]
        kind = "redact"
        patterns = ["("]

        [[post]]
        kind = "python"
        ref = "shop_hooks:NOT_CALLABLE"
        on_error = "ignore"
        """,
    )
    done = turnplug("check", config)
    assert done.returncode == 2
    header, *problems = done.stderr.splitlines()
    assert header == f"turnplug: error: ConfigError: {config}: 10 problems"
    assert [line.split(":")[0].strip() for line in problems] == [
        "sytem",
        "max_regenerations",
        "hold_until_accepted",
        "model.temperature",
        "pre[0].kind",
        "pre[1].ref",
        "pre[1].timeout",
        "transformers[0].patterns[0]",
        "post[0].ref",
        "post[0].on_error",
    ]


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = turnplug("check", tmp_path / "absent.toml", "--debug")
    assert done.returncode == 2
    assert "Traceback" in done.stderr
    assert "ConfigError" in done.stderr


def test_check_of_a_deeply_nested_config_exits_2_naming_the_file(tmp_path: Path) -> None:
    """Catches: `turnplug check` on a config nested 100,000 deep printing a RecursionError
    and exiting 1 instead of a config error (exit 2)."""
    path = tmp_path / "deep.json"
    path.write_text('{"system": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = turnplug("check", path)
    assert done.returncode == 2, done.stderr
    assert f"{path}: nested too deeply" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("long.toml", "max_steps = 1" + "0" * 5_000 + "\n"),
        ("long.json", '{"max_steps": 1' + "0" * 5_000 + "}"),
    ],
)
def test_check_of_a_number_too_long_to_read_exits_2_naming_the_file(
    tmp_path: Path, name: str, text: str
) -> None:
    """Catches: a 5,001-digit number (more than Python reads) escaping the TOML and JSON
    parsers as a bare ValueError, shown as an unexpected error with exit 1, naming no file."""
    path = tmp_path / name
    path.write_text(text)
    done = turnplug("check", path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"turnplug: error: ConfigError: {path}: a number in it is too")
    assert done.stderr.count("\n") == 1, done.stderr


def test_check_of_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    """Catches: `turnplug check DIR` answering "unknown config format '(no extension)'"."""
    done = turnplug("check", tmp_path)
    assert done.returncode == 2
    assert f"{tmp_path}: is a directory, not a config file" in done.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_with_debug_a_config_error_shows_its_traceback_and_still_exits_2(
    tmp_path: Path, where: str
) -> None:
    """Bug caught: --debug re-raised a config error for Python to print, which exits 1, the
    status of a turn that failed, where the same config without --debug exits 2."""
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('broken here')\n")
    config = write_config(tmp_path, '[[pre]]\nkind = "python"\nref = "broken_on_import:f"\n')
    args = ["--debug", "check", config] if where == "before" else ["check", config, "--debug"]
    done = turnplug(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" in done.stderr
    lines = done.stderr.splitlines()
    # The module's own traceback, as the cause, then the config error's: the error's last
    # line names the RuntimeError too, so only lines the cause alone prints tell it is kept.
    assert "    raise RuntimeError('broken here')" in lines
    assert "RuntimeError: broken here" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[-1].startswith("pipeline.ConfigError: "), lines[-1]
