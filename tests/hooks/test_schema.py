"""The JSON Schema (`config_schema`, `turnplug schema`) agrees with the loader."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hooks import pii
from hooks.config import config_schema
from pipeline import ConfigError
from tests.hooks.config_support import FAULTS, Fault, broken, valid

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "assistant.toml"
Validator = jsonschema.Draft202012Validator


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = config_schema()
    Validator.check_schema(schema)
    return Validator(schema, format_checker=Validator.FORMAT_CHECKER)


def _errors(validator: Any, data: Any) -> list[str]:
    return [error.message for error in validator.iter_errors(data)]


def test_the_config_using_every_key_is_valid(validator: Any) -> None:
    assert _errors(validator, valid()) == []


def test_the_example_is_valid(validator: Any) -> None:
    assert _errors(validator, tomllib.loads(EXAMPLE.read_text())) == []


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.schema], ids=lambda fault: fault.path)
def test_what_the_loader_refuses_the_schema_refuses(validator: Any, fault: Fault) -> None:
    assert _errors(validator, broken(fault)) != []


@pytest.mark.parametrize(
    "model",
    [
        {"provider": "openai", "name": "m", "temperature": 0.5, "max_tokens": 10, "timeout": 3},
        {"provider": "anthropic", "name": "m", "base_url": "http://x", "api_key_env": ""},
        {"provider": "scripted"},
    ],
)
def test_every_provider_is_described(validator: Any, model: dict[str, Any]) -> None:
    assert _errors(validator, {"model": model}) == []


def test_the_catalogues_summary_and_compactor_are_described(validator: Any) -> None:
    """Bug caught: the schema refused `compact = "drop_oldest"` and a running_summary
    entry, which the loader takes, and took what the loader refuses of them."""
    summary = {"kind": "running_summary", "every": 3, "model": {"provider": "scripted"}}
    assert _errors(validator, {"compact": "drop_oldest", "post": [summary]}) == []
    assert _errors(validator, {"compact": "my_hooks:compact"}) == []
    assert _errors(validator, {"compact": "drop_olde"}) != []
    assert _errors(validator, {"post": [{**summary, "every": 0}]}) != []
    assert _errors(validator, {"pre": [{"kind": "running_summary"}]}) != []


def test_a_whole_number_past_a_64_bit_integer_is_refused(validator: Any) -> None:
    """Bug caught: the schema took any integer where loading refuses one past 2**63 - 1."""
    assert _errors(validator, {"max_steps": 2**63 - 1, "max_regenerations": 0}) == []
    assert _errors(validator, {"max_steps": 2**63}) != []
    assert _errors(validator, {"max_regenerations": 2**63}) != []


@pytest.mark.parametrize("key", ["durable", "shadow"])
def test_a_running_summary_takes_durable_and_shadow_only_as_it_runs(
    validator: Any, key: str
) -> None:
    """Bug caught: the schema took `durable = false` and `shadow = true` on a running
    summary, which the loader refuses."""
    summary = {"kind": "running_summary", key: key == "durable"}
    assert _errors(validator, {"post": [summary]}) == []
    assert _errors(validator, {"post": [{**summary, key: key != "durable"}]}) != []
    judge = {"kind": "judge", "model": {"provider": "scripted"}, "instruction": "x"}
    assert _errors(validator, {"post": [{**judge, key: key != "durable"}]}) == []


def test_kinds_are_refused_outside_their_lists(validator: Any) -> None:
    assert _errors(validator, {"post": [{"kind": "static", "text": "x"}]}) != []
    assert _errors(validator, {"pre": [{"kind": "redact", "patterns": ["x"]}]}) != []


def test_every_key_has_a_description_for_editors() -> None:
    schema = config_schema()
    tables = [schema, *schema["$defs"].values()]
    missing = [
        key
        for table in tables
        for key, value in table["properties"].items()
        if "description" not in value and key not in ("kind", "provider")
    ]
    assert missing == []


def test_turnplug_schema_prints_it() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("turnplug")), "schema"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == config_schema()


GUARDRAILS = [
    ({"kind": "guardrail", "deny": ["x"], "feedback": "No."}, True),
    ({"kind": "guardrail", "check": "m:f"}, True),
    # null stands for a key left out, as the loader reads it.
    ({"kind": "guardrail", "deny": None, "check": "m:f"}, True),
    ({"kind": "guardrail", "feedback": "No."}, False),
    ({"kind": "guardrail", "deny": ["x"], "check": "m:f", "feedback": "No."}, False),
    ({"kind": "guardrail", "deny": ["x"]}, False),
    ({"kind": "guardrail", "deny": ["x"], "feedback": None}, False),
]


@pytest.mark.parametrize(("entry", "accepted"), GUARDRAILS)
def test_a_guardrail_takes_deny_with_feedback_or_check(
    validator: Any, entry: dict[str, Any], accepted: bool
) -> None:
    assert (_errors(validator, {"post": [entry]}) == []) is accepted


@pytest.mark.parametrize(
    ("refresh", "accepted"),
    [
        ({"kind": "ttl", "minutes": 60}, True),
        ({"kind": "ttl", "seconds": 1.5}, True),
        ({"kind": "ttl", "hours": 2}, True),
        ({"kind": "ttl"}, False),
        ({"kind": "ttl", "minutes": 1, "seconds": 5}, False),
        ({"kind": "ttl", "minutes": 0}, False),
        ({"kind": "cron", "minutes": 5}, False),
    ],
)
def test_a_refresh_is_a_ttl_in_one_unit(
    validator: Any, refresh: dict[str, Any], accepted: bool
) -> None:
    entry = {"kind": "tool_call", "tool": "t", "refresh": refresh}
    assert (_errors(validator, {"pre": [entry]}) == []) is accepted


@pytest.mark.parametrize(
    ("match", "accepted"),
    [
        ("lookup", True),
        ({"regex": "look.*"}, True),
        ({"regex": "("}, False),
        ({}, False),
        (3, False),
    ],
)
def test_a_tool_hook_matches_a_name_or_a_regex(validator: Any, match: Any, accepted: bool) -> None:
    entry = {"kind": "python", "ref": "m:f", "match": match}
    assert (_errors(validator, {"after_tool": [entry]}) == []) is accepted


def test_the_pii_kinds_are_those_pii_accepts(validator: Any) -> None:
    kinds = ["email", "phone", "card", "ssn", "iban", "ipv4"]
    assert _errors(validator, {"transformers": [{"kind": "pii", "kinds": kinds}]}) == []
    for kind in kinds:
        pii([kind])  # each one builds
    assert _errors(validator, {"transformers": [{"kind": "pii", "kinds": ["passport"]}]}) != []
    with pytest.raises(ConfigError):
        pii(["passport"])


def test_new_kinds_are_refused_outside_their_lists(validator: Any) -> None:
    assert _errors(validator, {"pre": [{"kind": "max_length", "chars": 3}]}) != []
    assert _errors(validator, {"post": [{"kind": "tool_call", "tool": "t"}]}) != []
    retrieve = {"kind": "retrieve", "search": "m:f"}
    assert _errors(validator, {"pre": [retrieve]}) != []
    assert _errors(validator, {"pre": [{"kind": "parallel", "hooks": [retrieve]}]}) == []


def test_the_toml_examples_of_the_config_docs_are_valid(validator: Any) -> None:
    docs = (EXAMPLE.parents[1] / "docs" / "config.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", docs, flags=re.DOTALL)
    assert len(blocks) >= 3
    for block in blocks:
        assert _errors(validator, tomllib.loads(block)) == [], block
