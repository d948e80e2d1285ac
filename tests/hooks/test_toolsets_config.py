"""[[toolsets]] in a config, `tool_call` with a toolset, and `turnplug check` (--offline)."""

import json
import sys
from pathlib import Path

import pytest

from hooks.config import load_pipeline, pipeline_from_dict
from pipeline import ConfigError
from pipeline.logs import MemoryLog
from tests.hooks.cli_support import environment, turnplug, write_config
from tests.hooks.config_support import ref
from tests.pipeline.mcp.servers import HttpServer, free_port, memory_server, server_processes

TIME = f"""
    [model]
    provider = "openai"
    name = "gpt-4o-mini"

    [[toolsets]]
    kind = "mcp"
    name = "clock"
    command = {json.dumps(sys.executable)}
    args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
    env = {{ CLOCK_TOKEN = "${{CLOCK_TOKEN}}" }}
"""


def test_check_offline_needs_neither_the_api_key_nor_the_servers(tmp_path: Path):
    """Catches: CI without secrets unable to validate a config (issue of `check --offline`)."""
    path = write_config(tmp_path, TIME)

    done = turnplug("check", "--offline", path, env=environment())

    assert (done.returncode, done.stderr) == (0, "")
    assert "  clock  MCP server" in done.stdout
    assert "(offline: MCP servers not connected, their tools not listed)" in done.stdout


def test_check_aligns_the_toolsets_names_as_its_other_lists(tmp_path: Path):
    """Bug caught: check's toolsets list printing each name followed by two spaces, so that
    after names of different lengths what each toolset holds started at a different column
    (the stages' and tools' lists pad their names to one width), in the list of toolsets and
    in the tools each server serves."""
    server = f"""
        kind = "mcp"
        command = {json.dumps(sys.executable)}
        args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
    """
    config = f"""
        [[toolsets]]
        name = "clock"
        {server}

        [[toolsets]]
        name = "utc_clock_two"
        {server}

        [[toolsets]]
        kind = "python"
        name = "shop"
        refs = ["shop_hooks:today"]
    """
    done = turnplug("check", write_config(tmp_path, config), env=environment())

    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.split("toolsets, their tools as the model calls them\n")[1].splitlines()
    assert [line[:18] for line in lines] == [
        "  clock          M",
        "  utc_clock_two  M",
        "  shop           l",
        "  clock:         c",
        "  utc_clock_two: u",
    ]
    assert lines[2].endswith("local: shop_today")
    assert lines[3].endswith(" clock_convert_time, clock_get_current_time")


def test_check_without_offline_reports_the_missing_key_and_variable(tmp_path: Path):
    """Catches: --offline leniency leaking into the normal check."""
    path = write_config(tmp_path, TIME)

    done = turnplug("check", path, env=environment())

    assert done.returncode == 2
    assert "model.api_key_env: the environment variable OPENAI_API_KEY is not set" in done.stderr
    assert "toolsets[0].env: the environment variable CLOCK_TOKEN is not set" in done.stderr


def test_several_unset_variables_are_named_in_one_plural_problem(tmp_path: Path):
    """Bug caught: two unset variables read "the environment variable A, B is not set"."""
    path = write_config(
        tmp_path,
        """
        [[toolsets]]
        kind = "mcp"
        name = "m"
        command = "server"
        env = { A = "${FIRST_UNSET}", B = "x-${SECOND_UNSET}" }
        """,
    )

    done = turnplug("check", path, env=environment())

    assert done.returncode == 2
    assert (
        "toolsets[0].env: the environment variables FIRST_UNSET, SECOND_UNSET are not set"
        " — export them before starting"
    ) in done.stderr


def test_check_connects_and_lists_the_tools_under_their_final_names(tmp_path: Path):
    """Catches: check reporting a config ok without the server ever answering."""
    path = write_config(tmp_path, TIME)

    done = turnplug(
        "check", path, env=environment(OPENAI_API_KEY="sk-test", CLOCK_TOKEN="s3cret-value")
    )

    assert (done.returncode, done.stderr) == (0, "")
    assert "  clock: clock_convert_time, clock_get_current_time" in done.stdout
    assert "s3cret-value" not in done.stdout


def test_a_relative_cwd_is_the_config_files_directory_as_refs_are(tmp_path: Path):
    """Catches: an MCP server's relative `cwd` resolved against wherever turnplug was run
    from, so a config that works from its own folder fails to start its server elsewhere."""
    folder = tmp_path / "config"
    (folder / "servers").mkdir(parents=True)
    (folder / "servers" / "clock.py").write_text(
        "import runpy, sys\n"
        "sys.argv = ['mcp_server_time', '--local-timezone', 'UTC']\n"
        "runpy.run_module('mcp_server_time', run_name='__main__', alter_sys=True)\n"
    )
    path = write_config(
        folder,
        f"""
        [[toolsets]]
        kind = "mcp"
        name = "clock"
        command = {json.dumps(sys.executable)}
        args = ["clock.py"]
        cwd = "servers"
        """,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    done = turnplug("check", path, cwd=elsewhere, env=environment())

    assert (done.returncode, done.stderr) == (0, "")
    assert "  clock: clock_convert_time, clock_get_current_time" in done.stdout


def test_check_fails_naming_a_server_nobody_listens_on(tmp_path: Path):
    """Catches: check printing ok and "(no tools)" for an HTTP server it never reached."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    path = write_config(
        tmp_path,
        f"""
        [model]
        provider = "openai"
        name = "gpt-4o-mini"

        [[toolsets]]
        kind = "mcp"
        name = "tickets"
        url = "{url}"
        """,
    )

    done = turnplug("check", path, env=environment(OPENAI_API_KEY="sk-test"))

    assert done.returncode == 1
    assert f"ToolsetError: MCP server 'tickets' ({url}) could not be reached" in done.stderr
    assert "tickets: (no tools)" not in done.stdout


TICKETS = """
    [[toolsets]]
    kind = "mcp"
    name = "tickets"
    url = "{url}"
    headers = {{ Authorization = "Bearer ${{TICKETS_TOKEN}}" }}
"""


def test_a_header_value_with_a_trailing_newline_is_sent_without_it(tmp_path: Path):
    """Bug caught: a secret with a trailing newline (as a mounted secret file has) failed at
    the first request, "Illegal header value b'Bearer <the whole token>\\n'" on stderr."""
    server = HttpServer()
    server.start()
    try:
        path = write_config(tmp_path, TICKETS.format(url=server.url))
        env = environment(TICKETS_TOKEN="tk-secret-value\n")
        done = turnplug("check", path, env=env)
    finally:
        server.stop()

    assert (done.returncode, done.stderr) == (0, "")
    assert "  tickets: tickets_" in done.stdout
    assert "tk-secret-value" not in done.stdout


def test_a_header_value_a_header_cannot_carry_is_refused_without_showing_it(tmp_path: Path):
    """Bug caught: a header value holding a line break (here from ${VARIABLE}) loaded, and
    the HTTP client's error at the first request showed the whole value, secret included."""
    path = write_config(tmp_path, TICKETS.format(url="http://127.0.0.1:1/mcp"))
    env = environment(TICKETS_TOKEN="tk-secret\r\nX-Injected: 1")
    done = turnplug("check", "--offline", path, env=env)

    assert done.returncode == 2, done.stdout
    assert (
        "toolsets[0].headers: the value of 'Authorization' contains characters an HTTP"
        " header cannot carry"
    ) in done.stderr
    assert "tk-secret" not in done.stderr


def test_check_of_a_server_that_cannot_start_prints_no_ok(tmp_path: Path):
    """Catches: check printing "ok" and the whole pipeline before starting the servers, so
    that a stdio server that cannot start followed an "ok" with a ToolsetError."""
    missing = tmp_path / "no-such-server"
    path = write_config(
        tmp_path, f'[[toolsets]]\nkind = "mcp"\nname = "m"\ncommand = "{missing}"\n'
    )

    done = turnplug("check", path, env=environment())

    assert done.returncode == 1
    assert done.stdout == ""
    assert "ToolsetError: MCP server 'm'" in done.stderr
    assert "could not be started" in done.stderr


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ('kind = "mcp"\nname = "m"', "toolsets[0].command: required: one of command or url"),
        ('kind = "mcp"\nname = "m"\nurl = "ftp://x"', "toolsets[0]: url must start with http"),
        (
            'kind = "mcp"\nname = "m"\ncommand = "x"\ntimeout = -1',
            "toolsets[0].timeout: expected a positive number of seconds",
        ),
        ('kind = "mcp"\nname = "m"\ncommand = "x"\nport = 3', "toolsets[0].port: unknown key"),
        ('kind = "python"\nname = "p"', "toolsets[0].refs: required"),
    ],
)
def test_bad_toolset_entries_are_errors_with_their_paths(tmp_path: Path, entry, expected):
    """Catches: a broken toolset entry reported without saying where it is."""
    path = write_config(tmp_path, "[[toolsets]]\n" + entry + "\n")
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert expected in str(caught.value)


def test_a_python_toolset_ref_the_model_cannot_be_told_about_is_an_error_at_its_ref(
    tmp_path: Path,
):
    """Catches: a python toolset's ref naming a function without type annotations reported
    as a garbled message cut at the first ": " of its text (`toolsets[0]: str`)`), saying
    neither which ref nor what is wrong with it."""
    (tmp_path / "plain.py").write_text(
        "def typed(city: str) -> str:\n    return city\n\ndef join(a, b):\n    return a + b\n"
    )
    path = write_config(
        tmp_path,
        '[[toolsets]]\nkind = "python"\nname = "p"\nrefs = ["plain:typed", "plain:join"]\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)

    assert "toolsets[0].refs[1]: tool 'join', argument 'a' has no type annotation" in str(
        caught.value
    )


def test_a_python_toolsets_repeated_tool_and_unknown_include_are_errors_at_their_keys():
    """Catches: a python toolset's second tool of one name, and an include or exclude naming
    a tool it lacks, reported at the whole entry (`toolsets[0]`), one at a time, not saying
    which ref or key to fix."""
    entry = {
        "kind": "python",
        "name": "shop",
        "refs": [ref("lookup_order"), ref("get_preferences"), ref("lookup_order")],
        "include": ["lookup_order", "refund"],
        "exclude": ["get_prefs"],
    }
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict({"toolsets": [entry]})
    assert [where for where, _ in caught.value.problems] == [
        "toolsets[0].refs[2]",
        "toolsets[0].include",
        "toolsets[0].exclude",
    ]
    messages = [message for _, message in caught.value.problems]
    assert messages[0].startswith("a second tool named 'lookup_order' (refs[0] is the first)")
    assert messages[1] == (
        "names tools it does not have: ['refund']; its tools are ['lookup_order',"
        " 'get_preferences']"
    )


def test_a_toolset_error_is_whole_when_the_toolsets_name_holds_a_colon(tmp_path: Path):
    """Catches: the error of a toolset named "crm: prod" cut at the ": " of its name, so that
    the message began with the rest of the name (`prod'): url must ...`)."""
    path = write_config(
        tmp_path, '[[toolsets]]\nkind = "mcp"\nname = "crm: prod"\nurl = "ftp://x"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)

    assert str(caught.value).endswith(
        "toolsets[0]: url must start with http:// or https://, got 'ftp://x'"
    )


def test_a_tool_call_naming_an_unknown_toolset_is_an_error(tmp_path: Path):
    """Catches: a typo in `toolset` surfacing only as a skipped injection mid-conversation."""
    path = write_config(
        tmp_path, '[[pre]]\nkind = "tool_call"\ntoolset = "memroy"\ntool = "read_graph"\n'
    )
    with pytest.raises(ConfigError, match=r'pre\[0\].toolset: no toolset named "memroy"'):
        load_pipeline(path)


def test_two_toolsets_of_one_name_are_refused_at_the_second(tmp_path: Path):
    """Catches: a second toolset of the same name reported at no path (``""``), as
    "toolsets, position 2", a count from 1 where config paths count from 0."""
    entry = '[[toolsets]]\nkind = "mcp"\nname = "m"\ncommand = "x"\n'
    path = write_config(tmp_path, entry * 2)
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    ((where, message),) = caught.value.problems
    assert where == "toolsets[1].name"
    assert '"m" is also the name of toolsets[0]' in message


def test_a_local_toolset_tool_named_as_a_declared_tool_is_refused_at_the_toolset():
    """Catches: a [[toolsets]] tool whose final name (shop_lookup_order) is also a [[tools]]
    tool's name reported at no path (``""``), with the Pipeline's message only."""
    named = {"kind": "python", "ref": ref("get_preferences"), "name": "shop_lookup_order"}
    data = {
        "tools": [named],
        "toolsets": [{"kind": "python", "name": "shop", "refs": [ref("lookup_order")]}],
    }
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict(data)
    ((where, message),) = caught.value.problems
    assert where == "toolsets[0].name"
    assert '"shop_lookup_order", the name of a tool of tools[0]' in message


async def test_memory_from_the_memory_server_is_injected_at_conversation_start(tmp_path: Path):
    """Catches: tool_call with toolset + tool not running the MCP server's real tool."""
    program = memory_server()
    memory = tmp_path / "memory.jsonl"
    entity = {
        "type": "entity",
        "name": "Ada",
        "entityType": "person",
        "observations": ["likes tea"],
    }
    memory.write_text(json.dumps(entity) + "\n")
    path = write_config(
        tmp_path,
        f"""
        [model]
        provider = "scripted"
        replies = ["Hello Ada."]

        [[toolsets]]
        kind = "mcp"
        name = "memory"
        command = {json.dumps(str(program))}
        env = {{ MEMORY_FILE_PATH = {json.dumps(str(memory))} }}

        [[pre]]
        kind = "tool_call"
        toolset = "memory"
        tool = "read_graph"
        frequency = "always"
        """,
    )
    pipe = load_pipeline(path)

    async with pipe.session(log=MemoryLog(), conversation_id="c") as session:
        result = await session.send("hi")

    call, answer = (part for injection in result.turn.injections for part in injection.parts)
    assert call.name == "memory_read_graph"
    graph = json.loads(answer.content)
    assert graph["entities"][0]["name"] == "Ada"
    assert graph["entities"][0]["observations"] == ["likes tea"]
    assert server_processes() == []


def test_the_schema_accepts_and_refuses_toolsets_as_the_loader_does():
    """Catches: `turnplug schema` missing the toolset entries or their keys."""
    import jsonschema

    from hooks.config import config_schema, pipeline_from_dict

    validator = jsonschema.Draft202012Validator(config_schema())
    good = {
        "toolsets": [{"kind": "mcp", "name": "m", "url": "http://h/mcp", "headers": {"A": "b"}}]
    }
    bad = {"toolsets": [{"kind": "mcp", "name": "m", "command": "x", "env": {"A": 1}}]}
    assert list(validator.iter_errors(good)) == []
    assert list(validator.iter_errors(bad)) != []
    with pytest.raises(ConfigError, match=r"toolsets\[0\].env.A: expected a string"):
        pipeline_from_dict(bad)


def test_check_fails_naming_a_tool_hook_match_no_server_lists(tmp_path: Path):
    """Catches: check (and run) passing a tool hook's `match` that names a server's tool with
    a typo, so that the hook never applied."""
    (tmp_path / "guards.py").write_text(
        "from pipeline import cont\n\ndef allow(call, turn):\n    return cont(call)\n"
    )
    path = write_config(
        tmp_path,
        TIME
        + """
        [[before_tool]]
        kind = "python"
        ref = "guards:allow"
        match = "clock_get_curent_time"
        """,
    )

    done = turnplug(
        "check", path, env=environment(OPENAI_API_KEY="sk-test", CLOCK_TOKEN="s3cret-value")
    )

    assert done.returncode == 2
    assert "matches the tool 'clock_get_curent_time', which is not among" in done.stderr
    assert "'clock_get_current_time'" in done.stderr
