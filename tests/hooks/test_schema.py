"""The JSON Schema (`config_schema`, `turnplug schema`) agrees with the loader."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hooks.config import config_schema
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
