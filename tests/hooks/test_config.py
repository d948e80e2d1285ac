"""`hooks.config`: loading a config checks every value and reports every problem at once."""

import json
import pickle
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks.config import load_pipeline, pipeline_from_dict
from pipeline import ConfigError, Hook, Parallel
from pipeline.testing import ScriptedModel
from tests.hooks import config_support as support
from tests.hooks.config_support import FAULTS, Fault, broken, ref, valid


def _problems(data: Any, **options: Any) -> tuple[tuple[str, str], ...]:
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict(data, **options)
    return caught.value.problems


def test_the_valid_config_builds_every_entry_in_order() -> None:
    pipe = pipeline_from_dict(valid())
    assert [type(entry).__name__ for entry in pipe.pre] == [
        "Hook",
        "Parallel",
        "Hook",
        "Hook",
        "Hook",
        "Hook",
    ]
    assert [entry.name for entry in pipe.pre] == [
        "static",
        "parallel(member, static, search)",
        "hook",
        "second",
        "inject_get_preferences",
        "last_order",
    ]
    assert [getattr(t, "name", None) for t in pipe.transformers] == [
        "redact",
        "upper",
        "redact_secret",
        "pii",
        "citations",
    ]
    assert [(h.name, h.background) for h in pipe.post] == [
        ("check", False),
        ("later", True),
        ("deny", False),
        ("max_length", False),
        ("judge", False),
        ("no_maybe", False),
    ]
    assert [t.name for t in pipe.tools] == [
        "get_preferences",
        "order_status",
        "shipping_days",
        "lookup_order",
    ]
    assert [(h.name, h.match) for h in pipe.before_tool] == [("no_refunds", re.compile("refund.*"))]
    assert [(h.name, h.match) for h in pipe.after_tool] == [("shout", "get_preferences")]
    assert pipe.on_session_start[0].fn is support.start
    assert pipe.on_session_end[0].fn is support.end
    assert (
        pipe.system,
        pipe.max_regenerations,
        pipe.hold_until_accepted,
        pipe.max_steps,
        pipe.tool_concurrency,
    ) == ("Be brief.", 1, False, 3, 2)
    assert (pipe.budget.context_tokens, pipe.budget.injection_reserve) == (4000, 400)


def test_common_keys_reach_the_hook() -> None:
    data = {
        "pre": [
            {
                "kind": "python",
                "ref": ref("hook"),
                "name": "lookup",
                "timeout": 2.5,
                "on_error": "skip",
                "shadow": True,
                "durable": True,
            }
        ]
    }
    (entry,) = pipeline_from_dict(data).pre
    assert isinstance(entry, Hook)
    assert (entry.name, entry.timeout, entry.on_error, entry.shadow, entry.durable) == (
        "lookup",
        2.5,
        "skip",
        True,
        True,
    )
    assert entry.fn is support.hook


def test_unset_common_keys_keep_the_defaults() -> None:
    (entry,) = pipeline_from_dict({"pre": [{"kind": "python", "ref": ref("hook")}]}).pre
    assert isinstance(entry, Hook)
    assert (entry.name, entry.timeout, entry.on_error, entry.shadow, entry.durable) == (
        "hook",
        None,
        "halt",
        False,
        False,
    )


def test_parallel_members_take_the_common_keys() -> None:
    data = {
        "pre": [
            {
                "kind": "parallel",
                "name": "retrieval",
                "hooks": [
                    {"kind": "python", "ref": ref("member"), "timeout": 3, "durable": True},
                    {"kind": "static", "text": "x", "name": "note", "on_error": "skip"},
                ],
            }
        ]
    }
    (group,) = pipeline_from_dict(data).pre
    assert isinstance(group, Parallel)
    assert group.name == "retrieval"
    assert [(m.name, m.timeout, m.durable, m.on_error) for m in group.members] == [
        ("member", 3.0, True, "halt"),
        ("note", None, False, "skip"),
    ]


def test_without_a_model_table_the_offline_scripted_model_answers() -> None:
    assert isinstance(pipeline_from_dict({}).model, ScriptedModel)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.path)
def test_each_fault_is_reported_under_its_path(fault: Fault) -> None:
    problems = _problems(broken(fault))
    assert [path for path, _ in problems] == [fault.path]


@given(st.sets(st.sampled_from(FAULTS), min_size=1))
def test_any_set_of_faults_is_reported_whole(faults: set[Fault]) -> None:
    # However many mistakes a config holds, each is reported, once, and nothing else is.
    problems = _problems(broken(*faults))
    assert sorted(path for path, _ in problems) == sorted(fault.path for fault in faults)


def test_ten_problems_are_reported_in_one_error_in_file_order() -> None:
    chosen = FAULTS[:10]
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict(broken(*chosen), source="assistant.toml")
    lines = str(caught.value).splitlines()
    assert lines[0] == "assistant.toml: 10 problems"
    # "sytem" is a key added after all the others, so it comes last in the file.
    in_file = [f.path for f in chosen[1:]] + ["sytem"]
    assert chosen[0].path == "sytem"
    assert [line.strip().split(": ", 1)[0] for line in lines[1:]] == in_file
    assert caught.value.source == "assistant.toml"


def test_one_problem_is_one_line_with_the_source_and_the_path() -> None:
    (fault,) = [fault for fault in FAULTS if fault.path == "pre[2].timeout"]
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict(broken(fault), source="assistant.toml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("assistant.toml: pre[2].timeout: ")
    assert "positive number of seconds" in message
    assert "0" in message


def _message(data: Any) -> str:
    (problem,) = _problems(data)
    return problem[1]


def test_a_problem_whose_reason_has_line_breaks_is_still_one_line(tmp_path: Path) -> None:
    """Catches: a model factory raising a two-line error making its problem two lines, the
    second reading as a problem of its own (with no path)."""
    (tmp_path / "two_line_model.py").write_text(
        "def make():\n    raise RuntimeError('no model\\nset MODEL_PATH')\n"
    )
    path = tmp_path / "c.toml"
    path.write_text(
        '[model]\nprovider = "python"\nref = "two_line_model:make"\n'
        '[[pre]]\nkind = "static"\ntext = 3\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert str(caught.value).splitlines()[1:] == [
        "  model.ref: 'two_line_model:make' raised RuntimeError: no model\\nset MODEL_PATH",
        "  pre[0].text: expected a string, got 3 (integer)",
    ]
    # The problems themselves are kept as they were raised.
    assert caught.value.problems[0][1].endswith("no model\nset MODEL_PATH")


def test_a_repeated_json_key_or_a_file_name_with_a_line_break_is_still_one_line(
    tmp_path: Path,
) -> None:
    """Catches: a JSON key given twice, or the config file's own name, holding a line
    break printed as it is, the rest of the problem read as a line of its own (a file
    named so could forge a `turnplug: error:` line)."""
    path = tmp_path / "a\nturnplug: error: forged.json"
    path.write_text('{"pre": [{"kind": "static", "text": "x", "bad\\nkey": 1, "bad\\nkey": 2}]}')
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert len(str(caught.value).splitlines()) == 1
    assert "forged.json" in str(caught.value)
    ((where, _),) = caught.value.problems
    assert where == "pre[0].bad\nkey"  # the problems keep the key as it is


def test_a_key_that_is_not_a_string_is_a_problem_of_its_table() -> None:
    """Catches: `pipeline_from_dict` given a dict built in Python with a non-string key
    (an int, an enum) crashing in difflib with "TypeError: 'int' object is not iterable"
    instead of a ConfigError."""
    data = {1: "x", "pre": [{"kind": "static", "text": "x", 5: 6}]}
    assert _problems(data) == (
        ("", "a key must be a string, got 1 (integer)"),
        ("pre[0]", "a key must be a string, got 5 (integer)"),
    )


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"transformers": [{"kind": "python", "ref": "async_refs:make"}]}, "transformers[0].ref"),
        ({"model": {"provider": "python", "ref": "async_refs:make"}}, "model.ref"),
        ({"tokenizer": "async_refs:count"}, "tokenizer"),
    ],
)
def test_an_async_factory_or_tokenizer_is_a_problem_at_its_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, Any], path: str
) -> None:
    """Catches: an `async def` transformer factory, model factory or tokenizer, which are
    called without being awaited, reported as "returned coroutine ..., not a model" and
    followed by a "coroutine was never awaited" RuntimeWarning after the error line."""
    (tmp_path / "async_refs.py").write_text(
        "async def make():\n    return None\n\n\nasync def count(text):\n    return 1\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    ((where, message),) = _problems(data)
    assert where == path
    assert "is an async function, but is called without being awaited" in message
    assert message.endswith("define it with def, not async def")


def test_an_unknown_key_suggests_the_close_one_and_lists_those_accepted() -> None:
    message = _message({"pre": [{"kind": "python", "ref": ref("hook"), "timout": 1}]})
    assert '"timeout"' in message
    for key in ("name", "timeout", "on_error", "shadow", "durable", "ref"):
        assert key in message


def test_an_unknown_kind_lists_the_kinds_of_that_list() -> None:
    message = _message({"pre": [{"kind": "guardrial"}]})
    assert '"guardrial"' in message
    for kind in ("parallel", "python", "static"):
        assert f'"{kind}"' in message


def test_a_kind_in_the_wrong_list_says_where_it_belongs() -> None:
    message = _message({"post": [{"kind": "redact", "patterns": ["x"]}]})
    assert "transformers" in message


def test_an_entry_without_a_kind_is_reported_at_its_kind() -> None:
    assert _problems({"post": [{"ref": ref("hook")}]})[0][0] == "post[0].kind"


def test_an_entry_that_is_not_a_table_is_reported() -> None:
    ((path, message),) = _problems({"pre": ["hook"]})
    assert path == "pre[0]"
    assert '"hook" (string)' in message


def test_a_string_where_a_list_belongs_is_not_read_as_a_list_of_characters() -> None:
    ((path, message),) = _problems({"transformers": [{"kind": "redact", "patterns": "abc"}]})
    assert path == "transformers[0].patterns"
    assert "list" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("system", 3, "string"),
        ("max_regenerations", "2", "whole number"),
        ("max_regenerations", 1.5, "whole number"),
        ("max_regenerations", True, "whole number"),
        ("hold_until_accepted", 1, "true or false"),
        ("max_steps", 0, "whole number >= 1"),
        ("tool_concurrency", 2.0, "whole number >= 1"),
    ],
)
def test_values_of_the_wrong_type_are_not_converted(key: str, value: Any, expected: str) -> None:
    ((path, message),) = _problems({key: value})
    assert path == key
    assert expected in message


def test_a_bad_regex_is_reported_with_the_regex_compilers_reason() -> None:
    message = _message({"transformers": [{"kind": "redact", "patterns": ["ok", "(unclosed"]}]})
    assert "(unclosed" in message
    assert "missing )" in message


def test_a_module_that_does_not_exist_is_named() -> None:
    message = _message({"pre": [{"kind": "python", "ref": "nowhere_to_be_found:fn"}]})
    assert "nowhere_to_be_found" in message
    assert "no such module" in message


def test_a_module_that_fails_to_import_says_how(tmp_path: Path) -> None:
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "c.toml").write_text('[[pre]]\nkind = "python"\nref = "explodes_on_import:fn"\n')
    with pytest.raises(ConfigError) as caught:
        load_pipeline(tmp_path / "c.toml")
    assert "RuntimeError: boom at import" in str(caught.value)


def test_the_traceback_of_what_a_referenced_module_raised_is_kept(tmp_path: Path) -> None:
    """Bug caught: the exception a module raised as it was imported (or a transformer
    factory, or a judge's or a running summary's model factory, as it was called) was
    dropped, so `turnplug --debug` showed the loader's traceback and not the line of the
    user's code that failed."""
    (tmp_path / "fails_deep_inside.py").write_text(
        "def helper_that_fails():\n    raise RuntimeError('deep')\n\nhelper_that_fails()\n"
    )
    (tmp_path / "raising_factory.py").write_text(
        "def factory():\n    raise LookupError('no transformer today')\n\n"
        "def judge_model():\n    raise KeyError('no judge today')\n\n"
        "def summary_model():\n    raise OSError('no summary today')\n"
    )
    path = tmp_path / "c.toml"
    path.write_text(
        '[[pre]]\nkind = "python"\nref = "fails_deep_inside:fn"\n'
        '[[transformers]]\nkind = "python"\nref = "raising_factory:factory"\n'
        '[[post]]\nkind = "judge"\ninstruction = "Polite?"\n'
        'model = { provider = "python", ref = "raising_factory:judge_model" }\n'
        '[[post]]\nkind = "running_summary"\n'
        'model = { provider = "python", ref = "raising_factory:summary_model" }\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    shown = "".join(traceback.format_exception(caught.value))
    assert "in helper_that_fails" in shown
    assert "raise RuntimeError('deep')" in shown
    assert "raise LookupError('no transformer today')" in shown
    assert "raise KeyError('no judge today')" in shown
    assert "raise OSError('no summary today')" in shown


def test_several_causes_are_noted_with_their_problems_paths_in_file_order(
    tmp_path: Path,
) -> None:
    """Bug caught: what several refs' code raised was the ConfigError's cause as a group of
    unlabelled exceptions, in the order the loader met them, so --debug did not say which
    traceback belonged to which problem."""
    (tmp_path / "noted_factory.py").write_text("def factory():\n    raise LookupError('f')\n")
    (tmp_path / "noted_broken.py").write_text("raise RuntimeError('b')\n")
    path = tmp_path / "c.toml"
    path.write_text(
        '[[transformers]]\nkind = "python"\nref = "noted_factory:factory"\n'
        '[[pre]]\nkind = "python"\nref = "noted_broken:f"\n'
        '[[post]]\nkind = "python"\nref = "noted_broken:g"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    group = caught.value.__cause__
    assert isinstance(group, BaseExceptionGroup)
    assert [(type(exc).__name__, exc.__notes__) for exc in group.exceptions] == [
        ("LookupError", ["the problem at transformers[0].ref"]),
        ("RuntimeError", ["the problem at pre[0].ref", "the problem at post[0].ref"]),
    ]


def test_an_exception_raised_again_in_a_later_load_is_noted_once(tmp_path: Path) -> None:
    """Bug caught: an exception a factory kept and raised in each load gathered one more
    identical note naming its problem's path per load."""
    (tmp_path / "kept_error_factory.py").write_text(
        "ERROR = LookupError('no transformer')\n\ndef factory():\n    raise ERROR\n"
    )
    path = tmp_path / "c.toml"
    path.write_text('[[transformers]]\nkind = "python"\nref = "kept_error_factory:factory"\n')
    for _ in range(2):
        with pytest.raises(ConfigError) as caught:
            load_pipeline(path)
    cause = caught.value.__cause__
    assert cause is not None
    assert cause.__notes__ == ["the problem at transformers[0].ref"]


def test_a_module_that_fails_to_import_is_imported_once_per_load(tmp_path: Path) -> None:
    """Bug caught: Python keeps no module that failed to import, so each ref naming it (and
    the loader's second look at a file with a mistake) ran its code again, side effects
    included: four times for two refs."""
    runs = tmp_path / "runs.txt"
    (tmp_path / "fails_with_a_side_effect.py").write_text(
        f"with open({str(runs)!r}, 'a') as f:\n    f.write('ran\\n')\nraise RuntimeError('no')\n"
    )
    path = tmp_path / "c.toml"
    path.write_text(
        '[[pre]]\nkind = "python"\nref = "fails_with_a_side_effect:one"\n'
        '[[pre]]\nkind = "python"\nref = "fails_with_a_side_effect:two"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert [where for where, _ in caught.value.problems] == ["pre[0].ref", "pre[1].ref"]
    assert all("RuntimeError: no" in message for _, message in caught.value.problems)
    assert runs.read_text() == "ran\n"
    with pytest.raises(ConfigError):
        load_pipeline(path)  # another load imports it anew: it may have been fixed
    assert runs.read_text() == "ran\nran\n"


def test_a_module_that_fails_to_import_is_imported_once_per_load_by_a_module_importing_it(
    tmp_path: Path,
) -> None:
    """Bug caught: a failing module imported by the module one ref names, and named by
    another ref, ran again for the second ref, the load remembering only the module named."""
    runs = tmp_path / "runs.txt"
    (tmp_path / "indirectly_failing.py").write_text(
        f"with open({str(runs)!r}, 'a') as f:\n    f.write('ran\\n')\nraise RuntimeError('no')\n"
    )
    (tmp_path / "imports_the_failing.py").write_text(
        "import indirectly_failing\n\ndef f(turn): ...\n"
    )
    path = tmp_path / "c.toml"
    path.write_text(
        '[[pre]]\nkind = "python"\nref = "imports_the_failing:f"\n'
        '[[pre]]\nkind = "python"\nref = "indirectly_failing:g"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert [where for where, _ in caught.value.problems] == ["pre[0].ref", "pre[1].ref"]
    assert all("RuntimeError: no" in message for _, message in caught.value.problems)
    assert runs.read_text() == "ran\n"


def test_a_package_that_fails_to_import_is_imported_once_per_load_by_its_modules(
    tmp_path: Path,
) -> None:
    """Bug caught: a failing package's `__init__` named through `pkg.sub:g` and `pkg:f` ran
    once per name, as the load remembered the name a ref gave, not the module that failed."""
    runs = tmp_path / "runs.txt"
    package = tmp_path / "once_failing_package"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"with open({str(runs)!r}, 'a') as f:\n    f.write('ran\\n')\nraise RuntimeError('no')\n"
    )
    (package / "sub.py").write_text("def g(turn): ...\n")
    working = tmp_path / "once_working_package"
    working.mkdir()
    (working / "__init__.py").write_text(
        "from pipeline import cont\n\ndef f(turn):\n    return cont(turn)\n"
    )
    (working / "broken_sub.py").write_text("raise LookupError('sub')\n")
    path = tmp_path / "c.toml"
    path.write_text(
        '[[pre]]\nkind = "python"\nref = "once_failing_package.sub:g"\n'
        '[[pre]]\nkind = "python"\nref = "once_failing_package:f"\n'
        '[[pre]]\nkind = "python"\nref = "once_working_package.broken_sub:g"\n'
        '[[pre]]\nkind = "python"\nref = "once_working_package:f"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert caught.value.problems == (
        ("pre[0].ref", "importing 'once_failing_package.sub' failed: RuntimeError: no"),
        ("pre[1].ref", "importing 'once_failing_package' failed: RuntimeError: no"),
        ("pre[2].ref", "importing 'once_working_package.broken_sub' failed: LookupError: sub"),
    )
    assert runs.read_text() == "ran\n"


def test_a_missing_attribute_is_named() -> None:
    message = _message({"pre": [{"kind": "python", "ref": ref("nothing_here")}]})
    assert "nothing_here" in message


def test_a_misspelt_attribute_suggests_the_close_name() -> None:
    """Bug caught: `ref = "mod:hoook"` said only "check the name after the colon", where a
    misspelt key, kind or tool gets "did you mean ...?"."""
    ((path, message),) = _problems({"pre": [{"kind": "python", "ref": ref("hoook")}]})
    assert path == "pre[0].ref"
    assert "has no attribute 'hoook'" in message
    assert "did you mean 'hook'?" in message


@pytest.mark.parametrize("name", ["NOT_CALABLE", "delete"])
def test_a_misspelt_attribute_suggests_no_name_that_could_not_work(name: str) -> None:
    """Bug caught: `ref = "mod:NOT_CALABLE"` suggested 'NOT_CALLABLE', a constant that would
    only fail next as not callable, and `ref = "mod:delete"` the module's private '_delete'."""
    ((path, message),) = _problems({"pre": [{"kind": "python", "ref": ref(name)}]})
    assert path == "pre[0].ref"
    assert message.endswith("— check the name after the colon"), message


def test_a_misspelt_part_of_a_dotted_ref_suggests_what_leads_to_a_callable() -> None:
    """Bug caught: none on the old code; a part before the last names what holds the
    function (a class, a constant with methods), so it may be suggested though not callable."""
    message = _message({"pre": [{"kind": "python", "ref": ref("NOT_CALABLE.bit_length")}]})
    assert "did you mean 'NOT_CALLABLE'?" in message


def test_a_ref_that_is_not_callable_says_what_it_is() -> None:
    message = _message({"pre": [{"kind": "python", "ref": ref("NOT_CALLABLE")}]})
    assert "int 42" in message
    assert "not callable" in message


@pytest.mark.parametrize(
    ("stage", "name", "arguments"),
    [
        ("pre", "two_arguments", "(turn)"),
        ("post", "end", "(turn)"),
        ("on_session_start", "end", "(session_info)"),
        ("on_session_end", "start", "(session_info, reason)"),
        ("transformers", "hook", "fn()"),
        ("before_tool", "shout", "(call, turn)"),
        ("after_tool", "no_refunds", "(call, result, turn)"),
    ],
)
def test_a_ref_is_checked_against_the_arguments_of_its_stage(
    stage: str, name: str, arguments: str
) -> None:
    ((path, message),) = _problems({stage: [{"kind": "python", "ref": ref(name)}]})
    assert path == f"{stage}[0].ref"
    assert arguments in message


@pytest.mark.parametrize("text", ["hooks", "a:b:c", "mod:", ":fn", "mod-x:fn"])
def test_a_ref_must_be_module_colon_attribute(text: str) -> None:
    message = _message({"pre": [{"kind": "python", "ref": text}]})
    assert "module:attribute" in message


def test_two_transformers_of_one_name_are_refused_at_the_second() -> None:
    """Catches the reason given being that their annotations would overwrite each other
    (the pipeline refuses them for their names, which key annotations and errors alike),
    with no word of the `name` key that fixes it."""
    data = {"transformers": [{"kind": "redact", "patterns": ["a"]}] * 2}
    ((path, message),) = _problems(data)
    assert path == "transformers[1].name"
    assert message == (
        '"redact" is also the name of transformers[0]; a transformer\'s name keys its'
        " annotations in Reply.annotations and names it in errors — give one another name"
        ' with its `name` key (name = "...")'
    )


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"pre": [{"kind": "static", "text": "a", "name": ""}]}, "pre[0].name"),
        ({"post": [{"kind": "max_length", "chars": 9, "name": " "}]}, "post[0].name"),
        (
            {"pre": [{"kind": "parallel", "name": "", "hooks": [{"kind": "static", "text": "a"}]}]},
            "pre[0].name",
        ),
        (
            {"pre": [{"kind": "parallel", "hooks": [{"kind": "static", "text": "a", "name": ""}]}]},
            "pre[0].hooks[0].name",
        ),
        ({"transformers": [{"kind": "pii", "name": ""}]}, "transformers[0].name"),
        ({"transformers": [{"kind": "citations", "name": ""}]}, "transformers[0].name"),
        (
            {"transformers": [{"kind": "redact", "patterns": ["a"], "name": ""}]},
            "transformers[0].name",
        ),
    ],
)
def test_an_empty_name_is_a_problem_at_its_key(data: dict[str, Any], path: str) -> None:
    """Bug: an empty ``name`` was reported at the entry, not at ``.name``, with the hook's
    internal qualified name in the message (``the name of the hook for Static.build.static``),
    or was accepted (``pii``, ``citations``: a transformer named ``""``)."""
    assert _problems(data) == ((path, "expected some text, got an empty string"),)


def test_an_empty_parallel_group_is_refused() -> None:
    assert _problems({"pre": [{"kind": "parallel", "hooks": []}]})[0][0] == "pre[0].hooks"


def test_a_bad_model_provider_lists_the_providers() -> None:
    ((path, message),) = _problems({"model": {"provider": "openia", "name": "x"}})
    assert path == "model.provider"
    assert '"openai"' in message
    for provider in ("anthropic", "openai", "python", "scripted"):
        assert provider in message


def test_a_tokenizer_that_does_not_count_is_a_problem_at_tokenizer() -> None:
    """Bug: a tokenizer returning a list (tiktoken's ``encode``) was refused by the Pipeline
    with no config path (``""``), not at ``tokenizer``."""
    ((path, message),) = _problems({"tokenizer": ref("encode")})
    assert path == "tokenizer"
    assert "returned list" in message


def test_a_scripted_model_with_no_replies_is_a_problem() -> None:
    """Bug: ``replies = []`` loaded, and the first turn then failed mid-way with "ran out of
    replies" (ScriptedModel with none) instead of the config being refused."""
    ((path, message),) = _problems({"model": {"provider": "scripted", "replies": []}})
    assert path == "model.replies"
    assert "at least one reply" in message


def test_an_anthropic_temperature_above_one_is_a_problem() -> None:
    """Bug: an Anthropic model's ``temperature`` was checked against OpenAI's range (0-2),
    so 1.5 loaded and every turn then failed with the API's 400 (its range is 0-1)."""
    spec = {"provider": "anthropic", "name": "c", "api_key_env": "", "temperature": 1.5}
    ((path, message),) = _problems({"model": spec})
    assert path == "model.temperature"
    assert message == "expected a number between 0 and 1 (Anthropic's range), got 1.5 (float)"
    pipeline_from_dict({"model": spec | {"temperature": 1}})  # and 1 itself is fine


def test_an_api_key_no_header_can_carry_is_a_problem_naming_its_variable() -> None:
    """Bug: a key with an inner space (a secret pasted badly) loaded, and ``check`` said ok;
    the provider then refused it at the first request, after the turn's pre hooks had run,
    naming "api_key=" rather than the variable the config reads it from."""
    data = {"model": {"provider": "anthropic", "name": "c"}}
    ((path, message),) = _problems(data, environ={"ANTHROPIC_API_KEY": "sk-ant secret"})
    assert path == "model.api_key_env"
    assert "the key in ANTHROPIC_API_KEY contains characters" in message
    assert "secret" not in message.replace("the secret for", "")
    pipeline_from_dict(data, environ={"ANTHROPIC_API_KEY": "sk-ant-secret\n"})  # stripped


def test_a_missing_api_key_names_the_variable() -> None:
    data = {"model": {"provider": "openai", "name": "gpt-4o-mini"}}
    ((path, message),) = _problems(data, environ={})
    assert path == "model.api_key_env"
    assert "OPENAI_API_KEY" in message
    pipeline_from_dict(data, environ={"OPENAI_API_KEY": "sk-test"})  # and with it, it loads


def test_a_blank_api_key_says_its_variable_is_blank() -> None:
    """Bug caught: a key variable set to whitespace only was reported as "not set", sending
    the reader to check the variable's name rather than its value."""
    data = {"model": {"provider": "openai", "name": "gpt-4o-mini"}}
    ((path, message),) = _problems(data, environ={"OPENAI_API_KEY": " \n"})
    assert path == "model.api_key_env"
    assert message.startswith("the environment variable OPENAI_API_KEY is set but blank — ")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_base_url_requests_cannot_go_to_is_a_problem_of_base_url(provider: str) -> None:
    """Catches: a base_url without a scheme escaping the loader as a bare ValueError (the
    CLI's exit 1 and no path) instead of a problem at model.base_url."""
    data = {
        "model": {"provider": provider, "name": "m", "base_url": "localhost:11434/v1"},
        "system": 3,
    }
    problems = dict(_problems(data, environ={"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}))
    assert "system" in problems  # found in the same pass
    assert "'localhost:11434/v1' is not a URL" in problems["model.base_url"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_bad_base_url_from_the_environment_names_the_variable(provider: str) -> None:
    """Catches: a base URL variable holding no URL failing as a bare ValueError, or as a
    problem that does not say where the URL came from."""
    variable = f"{provider.upper()}_BASE_URL"
    environ = {variable: "localhost:8000", "OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
    ((path, message),) = _problems({"model": {"provider": provider, "name": "m"}}, environ=environ)
    assert path == "model.base_url"
    assert variable in message
    assert "'localhost:8000'" in message


def test_compact_without_a_budget_is_a_problem_of_compact() -> None:
    """Catches: compact without budget reported only by Pipeline, as `Pipeline(compact=...)
    needs a budget` with no config path."""
    ((path, message),) = _problems({"compact": ref("keep_history")})
    assert path == "compact"
    assert "needs a budget" in message


def test_compact_with_an_invalid_budget_is_reported_once_at_the_budget() -> None:
    """Catches: an invalid budget reported twice, once as itself and once as missing."""
    problems = _problems({"compact": ref("keep_history"), "budget": {"context_tokens": 0}})
    assert [path for path, _ in problems if not path.startswith("budget")] == []


def make_compactor() -> Any:
    """A factory of compactors, named where a compactor is expected."""
    return support.keep_history


@pytest.mark.parametrize(
    ("data", "path", "expected"),
    [
        ({"compact": "hooks:drop_oldest"}, "compact", 'write compact = "drop_oldest"'),
        (
            {"post": [{"kind": "python", "ref": "hooks:running_summary"}]},
            "post[0].ref",
            'kind = "running_summary"',
        ),
    ],
    ids=["drop_oldest", "running_summary"],
)
def test_a_ref_naming_a_catalogue_factory_says_how_to_declare_it(
    data: dict[str, Any], path: str, expected: str
) -> None:
    """Bug caught: a ref naming the catalogue's factory failed as a bare signature mismatch
    (`drop_oldest`) or loaded and failed every turn (`running_summary(turn)`), never saying
    to call it or declare the catalogue's entry."""
    ((where, message),) = _problems(
        {**data, "budget": {"context_tokens": 9, "injection_reserve": 1}}
    )
    assert where == path
    assert "names the factory hooks." in message
    assert expected in message
    assert "call " in message


def test_a_compactor_factory_named_as_the_compactor_is_told_to_be_called() -> None:
    """Bug caught: a compactor factory named in `compact` failed with a signature mismatch
    that did not say it makes the compactor rather than being one."""
    ((path, message),) = _problems(
        {
            "compact": "tests.hooks.test_config:make_compactor",
            "budget": {"context_tokens": 9, "injection_reserve": 1},
        }
    )
    assert path == "compact"
    assert "if it is a factory, call it in a module of yours" in message


def test_an_unknown_catalogue_compactor_suggests_the_closest_name() -> None:
    """Bug caught: `compact = "drop_olde"` was refused as not a reference, without naming
    the catalogue's compactors."""
    ((path, message),) = _problems(
        {"compact": "drop_olde", "budget": {"context_tokens": 9, "injection_reserve": 1}}
    )
    assert path == "compact"
    assert 'did you mean "drop_oldest"?' in message


def test_a_dotted_compact_reference_is_told_where_the_colon_goes() -> None:
    """Bug caught: `compact = "my_hooks.compact"` lost the reference's example and was
    not told to write "my_hooks:compact"."""
    ((path, message),) = _problems(
        {"compact": "my_hooks.compact", "budget": {"context_tokens": 9, "injection_reserve": 1}}
    )
    assert path == "compact"
    assert 'did you mean "my_hooks:compact"?' in message
    assert "e.g. 'mypkg.hooks:search_docs'" in message


@pytest.mark.parametrize(
    ("text", "guess"),
    [
        ("my.drop_oldest", '"my:drop_oldest" or "drop_oldest"'),
        ("hooks.drop_oldest", '"drop_oldest"'),
    ],
)
def test_a_dotted_compact_reference_close_to_a_catalogue_name_is_told_both(
    text: str, guess: str
) -> None:
    """Bug caught: `compact = "my.drop_oldest"` was told only to write the catalogue's
    "drop_oldest", not "my:drop_oldest", its own module's function it more likely means."""
    ((_path, message),) = _problems(
        {"compact": text, "budget": {"context_tokens": 9, "injection_reserve": 1}}
    )
    assert f"did you mean {guess}?" in message


def test_a_post_kind_named_as_compact_is_told_it_is_a_post_kind() -> None:
    """Bug caught: `compact = "running_summary"` was told only that it is no name of the
    catalogue, not that it is a post kind declared as a [[post]] entry."""
    ((path, message),) = _problems(
        {"compact": "running_summary", "budget": {"context_tokens": 9, "injection_reserve": 1}}
    )
    assert path == "compact"
    assert message.startswith('"running_summary" is a post kind: write a [[post]] entry')


@pytest.mark.parametrize(
    ("data", "path", "expected"),
    [
        (
            {"model": {"provider": "python", "ref": "hooks:drop_oldest"}},
            "model.ref",
            "makes a compactor — expected a model factory",
        ),
        (
            {"tokenizer": "hooks:drop_oldest"},
            "tokenizer",
            "makes a compactor — expected a tokenizer",
        ),
        (
            {"tools": [{"kind": "python", "ref": "hooks:running_summary"}]},
            "tools[0].ref",
            "makes a post hook — expected a typed function",
        ),
    ],
    ids=["model", "tokenizer", "tool"],
)
def test_a_catalogue_factory_where_something_else_is_expected_says_what_is(
    data: dict[str, Any], path: str, expected: str
) -> None:
    """Bug caught: `hooks:drop_oldest` as a model or tokenizer was told it "makes a
    compactor rather than being one", as if a compactor were expected there."""
    ((where, message),) = _problems(data)
    assert where == path
    assert expected in message
    assert "rather than being one" not in message
    assert "is declared as" in message


def test_a_pre_entry_naming_the_running_summary_factory_is_told_it_makes_a_post_hook() -> None:
    """Bug caught: `pre[0].ref = "hooks:running_summary"` was told the factory "makes a post
    hook rather than being one" and to call it and name what it returns, which a pre entry
    does not take either."""
    ((path, message),) = _problems({"pre": [{"kind": "python", "ref": "hooks:running_summary"}]})
    assert path == "pre[0].ref"
    assert "which makes a post hook — expected a pre hook fn(turn)" in message
    assert 'declared as a [[post]] entry of kind = "running_summary"' in message
    assert "rather than being one" not in message


@pytest.mark.parametrize("stage", ["pre", "post"])
def test_a_python_ref_naming_a_post_kind_without_a_colon_is_told_it_is_a_post_kind(
    stage: str,
) -> None:
    """Bug caught: `ref = "running_summary"` in a python entry was told only that it is not
    a reference, where `compact = "running_summary"` was told it is a post kind."""
    ((path, message),) = _problems({stage: [{"kind": "python", "ref": "running_summary"}]})
    assert path == f"{stage}[0].ref"
    assert message.startswith(
        '"running_summary" is not a reference; it is a post kind: write a [[post]] entry of'
        " kind = \"running_summary\" to use it — here, expected 'module:attribute'"
    )


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"every": 0}, [("post[0].every", "expected a whole number >= 1, got 0 (integer)")]),
        ({"every": "3"}, [("post[0].every", 'expected a whole number >= 1, got "3" (string)')]),
        ({"every": True}, [("post[0].every", "expected a whole number >= 1, got true (boolean)")]),
        ({"evry": 3}, [("post[0].evry", 'unknown key (did you mean "every"?)')]),
        ({"durable": False}, [("post[0].durable", "remove durable = false")]),
        ({"background": True}, [("post[0].background", "unknown key")]),
        ({"model": "scripted"}, [("post[0].model", "expected a table with a provider")]),
        (
            {"every": -1, "model": {"provider": "openai", "name": "m", "temperature": 3}},
            [
                ("post[0].every", "expected a whole number >= 1"),
                ("post[0].model.temperature", "expected a number between 0 and 2"),
                ("post[0].model.api_key_env", "OPENAI_API_KEY is not set"),
            ],
        ),
    ],
    ids=["zero", "string", "boolean", "misspelt", "transient", "background", "model", "several"],
)
def test_a_running_summary_entry_reports_each_mistake_at_its_path(
    entry: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    """Bug caught: a config could not declare a running summary; its mistakes (a wrong
    `every`, a transient one, a bad model) had no entry to be reported at."""
    problems = _problems({"post": [{"kind": "running_summary", **entry}]}, environ={})
    assert [path for path, _ in problems] == [path for path, _ in expected]
    for (_, message), (_, wanted) in zip(problems, expected, strict=True):
        assert wanted in message


def test_a_shadow_running_summary_is_refused_at_shadow() -> None:
    """Bug caught: `shadow = true` on a running summary loaded, and its model was called
    every `every` turns for a summary that was never written."""
    ((path, message),) = _problems(
        {"post": [{"kind": "running_summary", "every": 3, "shadow": True}]}
    )
    assert path == "post[0].shadow"
    assert "remove shadow = true" in message


def test_a_second_running_summary_is_refused_at_its_path() -> None:
    """Bug caught: two running_summary entries both ran, writing two summaries of the same
    turns into the log."""
    summary = {"kind": "running_summary", "every": 2}
    ((path, message),) = _problems(
        {"post": [summary, {"kind": "max_length", "chars": 9}, {**summary, "name": "other"}]}
    )
    assert path == "post[2]"
    assert "second running_summary (the first is post[0])" in message


SHARED = support.Upper()


def same_every_time() -> support.Upper:
    return SHARED


def raising_factory() -> support.Upper:
    raise RuntimeError("no transformer today")


class AsyncFeed(support.Upper):
    async def feed(self, text: str) -> str:  # type: ignore[override]
        return text.upper()


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        (ref("days"), "returned int 2, which lacks feed(text)"),
        ("tests.hooks.test_config:same_every_time", "the same object twice"),
        ("tests.hooks.test_config:raising_factory", "RuntimeError: no transformer today"),
        # Catches: an async feed refused by Pipeline only, without the config path.
        ("tests.hooks.test_config:AsyncFeed", "feed() is async"),
    ],
)
def test_a_transformer_factory_that_makes_no_transformer_is_a_problem_of_its_ref(
    factory: str, says: str
) -> None:
    """Catches: a python transformer's factory checked by Pipeline only, reported as
    `transformer 'days' (transformers, position 1): ...` without the config path, counted
    from 1."""
    data = {"transformers": [{"kind": "pii"}, {"kind": "python", "ref": factory}]}
    ((path, message),) = _problems(data)
    assert path == "transformers[1].ref"
    assert says in message
    assert factory in message


def test_the_top_level_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match="top level"):
        pipeline_from_dict([1, 2])  # type: ignore[arg-type]


def test_a_config_error_keeps_its_problems_through_pickling() -> None:
    with pytest.raises(ConfigError) as caught:
        pipeline_from_dict(broken(*FAULTS[:3]), source="c.toml")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (str(copy), copy.source, copy.problems) == (
        str(caught.value),
        "c.toml",
        caught.value.problems,
    )


# -- files ------------------------------------------------------------------------------------


def test_toml_and_json_files_load_alike(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(valid()))
    toml = tmp_path / "c.toml"
    toml.write_text(
        'system = "Be brief."\n[model]\nprovider = "scripted"\nreplies = ["hi"]\n'
        f'[[pre]]\nkind = "python"\nref = "{ref("hook")}"\n'
    )
    assert load_pipeline(tmp_path / "c.json").system == "Be brief."
    assert load_pipeline(toml).pre[0].fn is support.hook


def test_a_json_config_may_name_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"$schema": "./turnplug.schema.json", "system": "x"}))
    assert load_pipeline(path).system == "x"


@pytest.mark.parametrize(
    ("name", "text"), [("c.toml", 'system = "x"\n'), ("c.json", '{"system": "x"}')]
)
def test_a_file_starting_with_a_byte_order_mark_loads(tmp_path: Path, name: str, text: str) -> None:
    """Catches: a UTF-8 byte order mark (Notepad writes one) failing as `Invalid statement
    (at line 1, column 1)`."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_pipeline(path).system == "x"


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        # "café" saved as Latin-1 on the second line: é is the one byte 0xe9.
        ("c.toml", 'system = "x"\nname = "caf\xe9"\n', "line 2, column 12 (byte 24)"),
        ("c.json", '{"system": "x",\n "x": "caf\xe9"}', "line 2, column 11 (byte 26)"),
    ],
)
def test_a_file_that_is_not_utf8_says_where_and_to_save_it_as_utf8(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    """Bug caught: a config saved as Latin-1 (or any encoding but UTF-8) failing as "cannot
    read it: 'utf-8' codec can't decode byte 0xe9 in position 24: invalid continuation
    byte", which said neither that the file must be UTF-8, nor where the byte stands in
    lines and columns, nor what to do."""
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: is not UTF-8 text: the byte 0xe9 at {where} ")
    assert message.endswith("save it as UTF-8")
    assert "codec" not in message


def test_a_file_saved_as_utf16_says_to_save_it_as_utf8(tmp_path: Path) -> None:
    """Bug caught: a config saved as UTF-16 (as Windows tools may) failing as "cannot read it:
    'utf-8' codec can't decode byte 0xff in position 0", naming no encoding and no fix."""
    path = tmp_path / "c.toml"
    path.write_text('system = "x"\n', encoding="utf-16")
    with pytest.raises(ConfigError, match=r"is UTF-16 text .* save it as UTF-8$"):
        load_pipeline(path)


def test_refs_resolve_next_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "beside_the_config_xyz.py").write_text(
        "from pipeline import cont\ndef mine(turn):\n    return cont(turn)\n"
    )
    path = tmp_path / "c.toml"
    path.write_text('[[pre]]\nkind = "python"\nref = "beside_the_config_xyz:mine"\n')
    assert load_pipeline(path).pre[0].name == "mine"


def test_a_module_beside_a_second_config_that_python_would_not_import_is_a_problem(
    tmp_path: Path,
) -> None:
    """Catches: a second config whose directory holds its own module of a name an earlier
    config's directory had silently running the earlier file's functions (a process imports
    a module once), so that its hooks were another config's."""
    for folder, says in (("a", "from a"), ("b", "from b"), ("c", "from a")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "beside_twice.py").write_text(
            f"def pick(turn):\n    return [{says!r}]\n"
        )
        (tmp_path / folder / "c.toml").write_text(
            '[[pre]]\nkind = "parallel"\nhooks = [{ kind = "python", ref = "beside_twice:pick" }]\n'
        )
    load_pipeline(tmp_path / "a" / "c.toml")
    with pytest.raises(ConfigError) as caught:
        load_pipeline(tmp_path / "b" / "c.toml")
    ((where, message),) = caught.value.problems
    assert where == "pre[0].hooks[0].ref"
    assert message.startswith(f"{str(tmp_path / 'b' / 'beside_twice.py')!r} is not what")
    assert f"imported already, from {str(tmp_path / 'a' / 'beside_twice.py')!r}" in message
    # A copy of the same file is the same code: it loads.
    load_pipeline(tmp_path / "c" / "c.toml")


def test_a_package_beside_a_second_config_is_refused_though_its_init_is_the_same(
    tmp_path: Path,
) -> None:
    """Catches: two configs' packages of one name, each with an empty ``__init__.py`` and
    modules that differ, taken for the same code because their ``__init__.py`` files are:
    the second config silently ran the first one's functions."""
    for folder, says in (("a", "from a"), ("b", "from b")):
        package = tmp_path / folder / "beside_pkg"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "hooks.py").write_text(f"def pick(turn):\n    return [{says!r}]\n")
        (tmp_path / folder / "c.toml").write_text(
            '[[pre]]\nkind = "parallel"\nhooks = [{ kind = "python", ref = "beside_pkg.hooks:pick" }]\n'
        )
    load_pipeline(tmp_path / "a" / "c.toml")
    with pytest.raises(ConfigError) as caught:
        load_pipeline(tmp_path / "b" / "c.toml")
    ((where, message),) = caught.value.problems
    assert where == "pre[0].hooks[0].ref"
    assert "imported already" in message


@pytest.mark.parametrize(("code", "shown"), [("", "sys.exit(None)"), ("'bye'", "'bye'")])
def test_a_module_that_exits_when_imported_is_a_problem_of_its_ref(
    tmp_path: Path, code: str, shown: str
) -> None:
    """Catches: sys.exit() at a referenced module's top level escaping the loader as
    SystemExit, which ended `turnplug check` and `run` silently with exit 0."""
    (tmp_path / "exits_on_import_xyz.py").write_text(f"import sys\nsys.exit({code})\n")
    path = tmp_path / "c.toml"
    path.write_text('[[pre]]\nkind = "python"\nref = "exits_on_import_xyz:f"\n')
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    ((where, message),) = caught.value.problems
    assert where == "pre[0].ref"
    assert "'exits_on_import_xyz'" in message
    assert shown in message


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("absent.toml", None, "no such file"),
        ("c.yaml", "system: x", "expected a .toml or .json file"),
        ("c.toml", "system = ", "TOML syntax error"),
        ("c.toml", "[model\n", "line 1"),
        ("c.json", '{"system": }', "JSON syntax error"),
        # Catches: a key given twice silently last-wins (the first pre list dropped).
        (
            "c.json",
            '{"pre": [{"kind": "static", "text": "a"}], "system": "s", "pre": []}',
            'the key "pre" appears twice in one object',
        ),
        (
            "c.json",
            '{"model": {"provider": "scripted", "reply": "x", "reply": "y"}}',
            'the key "reply" appears twice',
        ),
    ],
)
def test_file_problems_name_the_file(
    tmp_path: Path, name: str, content: str | None, expected: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert str(caught.value).startswith(str(path))
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("content", "where", "key"),
    [
        ('{"system": "a", "system": "b"}', "system", "system"),
        (
            '{"pre": [{"kind": "static", "text": "a"}, {"kind": "static", "text": "a", "text": "b"}]}',
            "pre[1].text",
            "text",
        ),
        (
            '{"model": {"provider": "scripted", "replies": ["x"], "replies": ["y"]}}',
            "model.replies",
            "replies",
        ),
    ],
)
def test_a_json_key_given_twice_is_a_problem_at_its_path(
    tmp_path: Path, content: str, where: str, key: str
) -> None:
    """Bug: a JSON key given twice was reported at no path (``""``), so in a long file the
    message ("the key "text" appears twice in one object") did not say which object."""
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    ((found, message),) = caught.value.problems
    assert found == where
    assert message.startswith(f'the key "{key}" appears twice in one object')
    assert str(caught.value).startswith(f"{path}: {where}: ")


def test_half_a_surrogate_pair_in_a_json_config_is_a_problem_at_each_path(tmp_path: Path) -> None:
    """Catches: a JSON string holding half a surrogate pair (an emoji cut in two by the
    program that wrote the file) loading fine, then failing each turn's output on a strict
    UTF-8 terminal with UnicodeEncodeError (exit 1), after the turn was committed."""
    path = tmp_path / "c.json"
    path.write_text(
        '{"system": "fine \\ud83d\\ude00", "pre": [{"kind": "static", "text": "cut \\ud83d"}],'
        ' "model": {"provider": "scripted", "replies": ["\\ude00"]}}'
    )
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert [where for where, _ in caught.value.problems] == ["pre[0].text", "model.replies[0]"]
    assert caught.value.problems[0][1].startswith("\\ud83d is half of a surrogate pair")
    assert str(caught.value).startswith(f"{path}: 2 problems")


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    directory = tmp_path / "c.toml"
    directory.mkdir()
    with pytest.raises(ConfigError, match="directory"):
        load_pipeline(directory)


# -- guardrails -------------------------------------------------------------------------------


def _post_problems(entry: dict[str, Any], **options: Any) -> list[tuple[str, str]]:
    return list(_problems({"post": [{"kind": "python", "ref": ref("hook")}, entry]}, **options))


def test_a_guardrail_needs_deny_or_check() -> None:
    ((path, message),) = _post_problems({"kind": "guardrail", "feedback": "No."})
    assert path == "post[1]"
    assert "required: one of deny or check" in message


def test_a_guardrail_takes_deny_or_check_not_both() -> None:
    entry = {"kind": "guardrail", "deny": ["x"], "check": ref("no_maybe"), "feedback": "No."}
    ((path, message),) = _post_problems(entry)
    assert path == "post[1]"
    assert "deny and check cannot be given together" in message


def test_a_deny_guardrail_needs_feedback() -> None:
    ((path, message),) = _post_problems({"kind": "guardrail", "deny": ["x"]})
    assert path == "post[1].feedback"
    assert "required when deny is given" in message


def test_every_redact_pattern_that_matches_the_empty_string_is_named() -> None:
    """Catches: only the first empty-matching redact pattern reported, at the entry's path
    and counted from 1 (`transformers[0]: redact pattern 1`), where every config problem is
    reported at its own path, counted from 0, as the guardrail's deny patterns are."""
    entry = {"kind": "redact", "patterns": ["ok", "a*", "(x|)"]}
    problems = _problems({"transformers": [entry]})
    assert [path for path, _ in problems] == [
        "transformers[0].patterns[1]",
        "transformers[0].patterns[2]",
    ]
    assert all("can match zero characters" in message for _, message in problems)
    assert "so it would redact between almost every character" in problems[0][1]


def test_every_deny_pattern_that_matches_the_empty_string_is_named() -> None:
    entry = {"kind": "guardrail", "deny": ["ok", "a*", "(x|)"], "feedback": "No."}
    problems = _post_problems(entry)
    assert [path for path, _ in problems] == ["post[1].deny[1]", "post[1].deny[2]"]
    assert (
        '"a*" can match zero characters (an empty place in the text), so it would reject almost'
        in (problems[0][1])
    )


def test_a_pattern_that_matches_only_an_empty_string_between_characters_is_named() -> None:
    """Bug caught: a deny or scrub pattern that matches no empty text but an empty place in
    one (a word boundary, a lookbehind) passed the loader's check and was refused by the
    hook's own, at the entry with a position counted from 1, not at the pattern's path."""
    deny = {"kind": "guardrail", "deny": ["ok", r"\b"], "feedback": "No."}
    ((path, message),) = _post_problems(deny)
    assert path == "post[1].deny[1]"
    assert "can match zero characters" in message
    scrub = {"kind": "scrub", "patterns": ["ok", r"(?<=a)x*"]}
    assert [where for where, _ in _problems({"pre": [scrub], "after_tool": [scrub]})] == [
        "pre[0].patterns[1]",
        "after_tool[0].patterns[1]",
    ]


@pytest.mark.parametrize("pattern", [r"(?=password)", r"(?<=key=)\w*"])
def test_a_pattern_matching_only_an_empty_place_is_not_said_to_match_every_text(
    pattern: str,
) -> None:
    """Bug caught: a deny or scrub pattern matching an empty place in some text only was
    refused as one that "matches the empty string, so it would reject every reply"."""
    deny = {"post": [{"kind": "guardrail", "deny": [pattern], "feedback": "No."}]}
    scrub = {"pre": [{"kind": "scrub", "patterns": [pattern]}]}
    why = "can match zero characters (an empty place in the text) — require at least one character"
    assert _problems(deny) == (("post[0].deny[0]", f"{json.dumps(pattern)} {why}"),)
    assert _problems(scrub) == (("pre[0].patterns[0]", f"{pattern!r} {why}"),)


def test_a_scrub_pattern_matching_at_every_place_says_it_would_redact_between_characters() -> None:
    """Bug caught: a scrub pattern matching the empty string was refused without saying
    what it would do, where a redact transformer's said it would redact between every
    character."""
    ((path, message),) = _problems({"pre": [{"kind": "scrub", "patterns": ["x*"]}]})
    assert path == "pre[0].patterns[0]"
    assert message.endswith(
        ", so it would redact between almost every character — require at least one character"
    )


def test_an_integer_too_large_for_a_float_is_a_problem_saying_what_was_expected() -> None:
    """Bug caught: an integer of more digits than a float holds (TOML and JSON read any) as a
    number of seconds or a temperature was reported as Python's OverflowError, not as the
    number the key expects."""
    huge = 10**400
    data = {
        "model": {"provider": "openai", "name": "m", "api_key_env": "", "temperature": huge},
        "pre": [{"kind": "static", "text": "x", "timeout": huge}],
    }
    problems = dict(_problems(data))
    assert "expected a number between 0 and 2, got an integer" in problems["model.temperature"]
    assert "expected a positive number of seconds, got an integer" in problems["pre[0].timeout"]
    assert "Overflow" not in "".join(problems.values())


def test_an_integer_past_pythons_digit_limit_is_shown_by_its_number_of_digits() -> None:
    """Bug caught: an integer of more than 4300 digits (which pipeline_from_dict takes) was
    shown as Python's "Exceeds the limit (4300 digits)" ValueError, not as what was given."""
    data = {
        "model": {"provider": "openai", "name": "m", "api_key_env": "", "temperature": 10**5000},
        "pre": [{"kind": "static", "text": "x", "timeout": -(10**5000)}],
        "post": [
            {"kind": "max_length", "chars": 10**400 - 1, "feedback": "Shorter."},
            {"kind": "max_length", "chars": 10**400, "feedback": "Shorter."},
        ],
    }
    problems = dict(_problems(data))
    assert problems.pop("post[0].chars").endswith("got an integer of 400 digits")
    assert problems.pop("post[1].chars").endswith("got an integer of 401 digits")
    assert problems == {
        "model.temperature": "expected a number between 0 and 2, got an integer of 5001 digits",
        "pre[0].timeout": (
            "expected a positive number of seconds, got a negative integer of 5001 digits"
        ),
    }


def test_a_list_or_table_holding_an_integer_past_the_digit_limit_is_named_by_its_type() -> None:
    """Bug caught: a list or table holding an integer of more than 4300 digits was shown as
    Python's "Exceeds the limit (4300 digits)" ValueError, not as what was given."""
    data = {
        "max_steps": [10**5000],
        "model": {"provider": "openai", "name": {"x": 10**5000}, "api_key_env": ""},
    }
    problems = dict(_problems(data))
    assert problems["max_steps"].endswith("got a list too long to show")
    assert problems["model.name"].endswith("got a table too long to show")
    assert "Exceeds" not in "".join(problems.values())


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"max_steps": 2**63}, "max_steps"),
        ({"tool_concurrency": 2**63}, "tool_concurrency"),
        ({"max_regenerations": 2**63}, "max_regenerations"),
        ({"post": [{"kind": "max_length", "chars": 2**63}]}, "post[0].chars"),
        ({"budget": {"context_tokens": 10**400, "injection_reserve": 10}}, "budget.context_tokens"),
        (
            {"budget": {"context_tokens": 100, "injection_reserve": 10**5000}},
            "budget.injection_reserve",
        ),
        (
            {"model": {"provider": "openai", "name": "m", "api_key_env": "", "max_tokens": 2**63}},
            "model.max_tokens",
        ),
        (
            {"transformers": [{"kind": "redact", "patterns": ["x"], "max_match": 2**63}]},
            "transformers[0].max_match",
        ),
    ],
)
def test_a_whole_number_past_a_64_bit_integer_is_a_problem_at_its_key(
    data: dict[str, Any], path: str
) -> None:
    """Bug caught: a whole-number key took any integer TOML or JSON reads (10**400 as
    max_tokens, sent to a provider mid-turn), and an injection_reserve of 5001 digits
    escaped pipeline_from_dict as a bare ValueError."""
    ((where, message),) = _problems(data)
    assert where == path
    assert "and at most 2**63 - 1 (9223372036854775807), got " in message


def test_the_largest_whole_number_is_taken() -> None:
    assert pipeline_from_dict({"max_steps": 2**63 - 1}).max_steps == 2**63 - 1


def test_a_deny_guardrail_needs_a_pattern() -> None:
    problems = _post_problems({"kind": "guardrail", "deny": [], "feedback": "No."})
    assert problems == [("post[1].deny", "deny needs at least one pattern")]


def test_a_guardrail_check_is_called_with_the_text() -> None:
    ((path, message),) = _post_problems({"kind": "guardrail", "check": ref("two_arguments")})
    assert path == "post[1].check"
    assert "(text)" in message


@pytest.mark.parametrize(
    ("entry", "path", "expected"),
    [
        ({"kind": "max_length"}, "post[1].chars", "required"),
        ({"kind": "max_length", "chars": 1.5}, "post[1].chars", "whole number >= 1"),
        ({"kind": "max_length", "chars": 9, "feedback": ""}, "post[1].feedback", "some text"),
        (
            {"kind": "judge", "model": {"provider": "scripted"}, "instruction": " "},
            "post[1].instruction",
            "some text",
        ),
        ({"kind": "judge", "instruction": "Be nice."}, "post[1].model", "required"),
        (
            {"kind": "judge", "instruction": "x", "model": {"provider": "gemini"}},
            "post[1].model.provider",
            '"anthropic", "openai", "python", "scripted"',
        ),
    ],
)
def test_guardrail_values_are_checked(entry: dict[str, Any], path: str, expected: str) -> None:
    ((where, message),) = _post_problems(entry)
    assert where == path
    assert expected in message


def test_a_judge_model_without_its_key_names_the_variable_under_the_judge() -> None:
    model = {"provider": "anthropic", "name": "claude-test"}
    entry = {"kind": "judge", "model": model, "instruction": "Be nice."}
    ((path, message),) = _post_problems(entry, environ={})
    assert path == "post[1].model.api_key_env"
    assert "ANTHROPIC_API_KEY" in message


# -- pii and citations ------------------------------------------------------------------------


def test_an_unknown_pii_kind_suggests_the_close_one_and_lists_them() -> None:
    ((path, message),) = _problems({"transformers": [{"kind": "pii", "kinds": ["email", "phon"]}]})
    assert path == "transformers[0].kinds[1]"
    assert 'did you mean "phone"?' in message
    for kind in ("email", "phone", "card", "ssn", "iban", "ipv4"):
        assert f'"{kind}"' in message


def test_pii_needs_a_kind() -> None:
    ((path, _),) = _problems({"transformers": [{"kind": "pii", "kinds": []}]})
    assert path == "transformers[0].kinds"


def test_a_pii_and_a_citations_transformer_may_not_share_a_name() -> None:
    data = {"transformers": [{"kind": "citations", "name": "x"}, {"kind": "pii", "name": "x"}]}
    ((path, message),) = _problems(data)
    assert path == "transformers[1].name"
    assert "transformers[0]" in message


# -- tools, tool calls and tool hooks ---------------------------------------------------------


def _tools(**more: Any) -> dict[str, Any]:
    return {
        "tools": [
            {"kind": "python", "ref": ref("get_preferences")},
            {"kind": "python", "ref": ref("lookup_order")},
        ],
        **more,
    }


_OPENAI = {"provider": "openai", "name": "m"}


@pytest.mark.parametrize(
    ("data", "paths"),
    [
        ({"model": _OPENAI | {"temperature": 9}}, ["model.temperature", "model.api_key_env"]),
        (
            {"post": [{"kind": "guardrail", "deny": ["a*"], "feedback": "No.", "timeout": 0}]},
            ["post[0].deny[0]", "post[0].timeout"],
        ),
        (
            {
                "post": [
                    {
                        "kind": "judge",
                        "instruction": "Be kind.",
                        "model": _OPENAI | {"max_tokens": 0},
                    }
                ]
            },
            ["post[0].model.max_tokens", "post[0].model.api_key_env"],
        ),
        (
            _tools(pre=[{"kind": "tool_call", "tool": "get_preferences", "frequency": "daily"}]),
            ["pre[0].frequency", "pre[0].arguments"],
        ),
    ],
)
def test_a_mistake_in_one_key_does_not_hide_the_problems_of_the_rest_of_its_entry(
    data: dict[str, Any], paths: list[str]
) -> None:
    """Catches: an entry with a wrong value left unbuilt, so that what building it finds
    (the model's API key not set, a pattern matching the empty string, a tool's missing
    argument) was reported only once the first mistake was fixed."""
    assert [path for path, _ in _problems(data, environ={})] == paths


@pytest.mark.parametrize(
    ("data", "path"),
    [
        # The key meant may be the misspelt one: the default key variable is not checked.
        ({"model": _OPENAI | {"api_key_en": "MY_KEY"}}, "model.api_key_en"),
        # Without its toolset, the tool would be looked for among the plain tools.
        ({"pre": [{"kind": "tool_call", "toolset": 3, "tool": "read_graph"}]}, "pre[0].toolset"),
        # Without its name, the transformer would clash with the first one's default name.
        (
            {"transformers": [{"kind": "pii"}, {"kind": "pii", "name": 7}]},
            "transformers[1].name",
        ),
        # Without its exclude, the toolset would offer the tool whose name the exclude
        # kept from clashing with a plain tool's.
        (
            {
                "tools": [
                    {"kind": "python", "ref": ref("get_preferences"), "name": "shop_lookup_order"}
                ],
                "toolsets": [
                    {
                        "kind": "python",
                        "name": "shop",
                        "refs": [ref("lookup_order"), ref("get_preferences")],
                        "exclude": ["lookup_order", 5],
                    }
                ],
            },
            "toolsets[0].exclude[1]",
        ),
        # Without its unit, a refresh has none; that is the same mistake.
        (
            _tools(
                pre=[
                    {
                        "kind": "tool_call",
                        "tool": "get_preferences",
                        "arguments": {"user": "a"},
                        "refresh": {"kind": "ttl", "minutes": 0},
                    }
                ]
            ),
            "pre[0].refresh.minutes",
        ),
    ],
)
def test_what_a_mistake_leaves_unknown_is_not_reported_as_another_problem(
    data: dict[str, Any], path: str
) -> None:
    """Catches: the rest of an entry checked without a key whose value was wrong, where
    that key changes what the rest means, reporting problems the user does not have."""
    assert [where for where, _ in _problems(data, environ={"MY_KEY": "k"})] == [path]


def test_a_wrong_value_that_cannot_be_copied_is_still_a_problem() -> None:
    """Catches: a dict built in Python holding a wrong value that cannot be copied (a
    module, a generator) crashing the loader with a bare TypeError ("cannot pickle") while
    it looked for the entry's other problems, instead of reporting the value."""
    problems = _problems(
        {"post": [{"kind": "guardrail", "deny": (p for p in ["a"]), "feedback": "No."}]}
    )
    assert [path for path, _ in problems] == ["post[0].deny"]
    assert [path for path, _ in _problems({"pre": [{"kind": "python", "ref": json}]})] == [
        "pre[0].ref"
    ]


def test_a_tool_call_naming_no_declared_tool_lists_the_tools() -> None:
    data = _tools(pre=[{"kind": "tool_call", "tool": "get_preference"}])
    ((path, message),) = _problems(data)
    assert path == "pre[0].tool"
    assert 'no tool named "get_preference"' in message
    assert 'did you mean "get_preferences"?' in message
    assert "get_preferences, lookup_order" in message


def test_a_tool_call_without_tools_says_none_are_declared() -> None:
    ((path, message),) = _problems({"pre": [{"kind": "tool_call", "tool": "clock"}]})
    assert path == "pre[0].tool"
    assert "[[tools]] and [[toolsets]]: none" in message


def test_a_tool_call_naming_a_tool_its_local_toolset_lacks_names_the_tool() -> None:
    """Bug: ``toolset = "shop"`` with a ``tool`` the toolset does not have was reported at
    ``.toolset`` as "no toolset named "shop"", though the toolset is declared."""
    shop = {"kind": "python", "name": "shop", "refs": [ref("get_preferences")]}
    data = {"toolsets": [shop], "pre": [{"kind": "tool_call", "toolset": "shop", "tool": "prefs"}]}
    ((path, message),) = _problems(data)
    assert path == "pre[0].tool"
    assert message == 'toolset "shop" has no tool named "prefs"; its tools: get_preferences'


def test_tool_call_arguments_are_checked_against_the_tools_schema() -> None:
    data = _tools(
        pre=[{"kind": "tool_call", "tool": "get_preferences", "arguments": {"detail": "yes"}}]
    )
    ((path, message),) = _problems(data)
    assert path == "pre[0].arguments"
    assert "user: required" in message
    assert "detail: expected boolean" in message


def test_tool_call_arguments_must_be_a_table() -> None:
    data = _tools(pre=[{"kind": "tool_call", "tool": "get_preferences", "arguments": ["ada"]}])
    ((path, message),) = _problems(data)
    assert path == "pre[0].arguments"
    assert "table of arguments" in message


@pytest.mark.parametrize(
    ("name", "arguments", "path", "expected"),
    [
        ("c.toml", "{ facts = { when = 1979-05-27T07:32:00Z } }", "facts.when", "datetime"),
        ("c.toml", "{ facts = { day = 1979-05-27 } }", "facts.day", "date"),
        ("c.toml", "{ facts = { at = [1, 07:32:00] } }", "facts.at[1]", "time"),
        ("c.toml", "{ facts = { n = nan } }", "facts.n", "finite number"),
        ("c.json", '{"facts": {"n": [Infinity]}}', "facts.n[0]", "finite number"),
    ],
)
def test_tool_call_arguments_json_cannot_carry_are_a_problem_at_their_path(
    tmp_path: Path, name: str, arguments: str, path: str, expected: str
) -> None:
    """Catches: a TOML date (or a NaN) in a tool_call's arguments for a tool taking a table
    loading fine, then failing every turn with "datetime is not JSON serializable", blamed
    on the model, since a tool call's arguments travel as JSON."""
    (tmp_path / "json_only_tools.py").write_text(
        'def remember(facts: dict) -> str:\n    """Remembers facts."""\n    return "ok"\n'
    )
    config = tmp_path / name
    tool = {"kind": "python", "ref": "json_only_tools:remember"}
    if name.endswith(".toml"):
        config.write_text(
            '[[tools]]\nkind = "python"\nref = "json_only_tools:remember"\n'
            f'[[pre]]\nkind = "tool_call"\ntool = "remember"\narguments = {arguments}\n'
        )
    else:
        entry = '{"kind": "tool_call", "tool": "remember", "arguments": ' + arguments + "}"
        config.write_text(f'{{"tools": [{json.dumps(tool)}], "pre": [{entry}]}}')
    with pytest.raises(ConfigError) as caught:
        load_pipeline(config)
    ((where, message),) = caught.value.problems
    assert where == f"pre[0].arguments.{path}"
    assert expected in message


@pytest.mark.parametrize(
    ("changes", "path", "expected"),
    [
        ({"frequency": "daily"}, "pre[0].frequency", '"always", "if_changed"'),
        ({"refresh": {"kind": "ttl"}}, "pre[0].refresh", "one of seconds, minutes or hours"),
        (
            {"refresh": {"kind": "ttl", "minutes": 5, "hours": 1}},
            "pre[0].refresh",
            "minutes and hours cannot be given together",
        ),
        (
            {"refresh": {"kind": "ttl", "minutes": 0}},
            "pre[0].refresh.minutes",
            "positive number of minutes",
        ),
        (
            {"refresh": {"kind": "ttl", "hours": -1}},
            "pre[0].refresh.hours",
            "positive number of hours",
        ),
        ({"refresh": {"kind": "ttl", "days": 1}}, "pre[0].refresh.days", "unknown key"),
        ({"refresh": {"minutes": 5}}, "pre[0].refresh.kind", 'one of "ttl"'),
        ({"refresh": 60}, "pre[0].refresh", "60 (integer)"),
    ],
)
def test_tool_call_options_are_checked(changes: dict[str, Any], path: str, expected: str) -> None:
    entry = {"kind": "tool_call", "tool": "get_preferences", "arguments": {"user": "a"}}
    ((where, message),) = _problems(_tools(pre=[entry | changes]))
    assert where == path
    assert expected in message


def test_a_refresh_too_long_to_count_in_seconds_is_a_problem_of_its_unit() -> None:
    """Bug caught: hours or minutes whose seconds overflow a float (1e306 hours) were
    reported at the entry's arguments, as inject_tool_call's refusal of an infinite ttl."""
    entry = {"kind": "tool_call", "tool": "get_preferences", "arguments": {"user": "a"}}
    ((where, message),) = _problems(
        _tools(pre=[entry | {"refresh": {"kind": "ttl", "hours": 1e306}}])
    )
    assert where == "pre[0].refresh.hours"
    assert "seconds a float can hold, got 1e+306" in message


def test_an_unknown_refresh_kind_is_not_sent_to_another_list() -> None:
    entry = {"kind": "tool_call", "tool": "get_preferences", "refresh": {"kind": "static"}}
    ((path, message),) = _problems(_tools(pre=[entry | {"arguments": {"user": "a"}}]))
    assert path == "pre[0].refresh.kind"
    assert 'unknown kind "static"' in message
    assert "goes in" not in message


def test_a_tool_whose_signature_cannot_be_described_is_reported_at_its_ref() -> None:
    ((path, message),) = _problems({"tools": [{"kind": "python", "ref": ref("member")}]})
    assert path == "tools[0].ref"
    assert "'turn'" in message
    assert "Turn" in message or "annotation" in message


def test_a_tool_that_fails_is_reported_once_not_again_by_the_entries_naming_it() -> None:
    data = _tools(
        pre=[{"kind": "tool_call", "tool": "get_preferences", "arguments": {"user": "a"}}],
        after_tool=[{"kind": "python", "ref": ref("shout"), "match": "get_preferences"}],
    )
    data["tools"][0]["ref"] = ref("Untyped.get_preferences")
    ((path, message),) = _problems(data)
    assert path == "tools[0].ref"
    assert "'user' has no type annotation" in message


def test_two_tools_of_one_name_are_refused_at_the_second() -> None:
    data = _tools()
    data["tools"][1]["name"] = "get_preferences"
    ((path, message),) = _problems(data)
    assert path == "tools[1].name"
    assert "tools[0]" in message
    assert "by name" in message


def test_a_tool_name_providers_refuse_is_reported() -> None:
    ((path, message),) = _problems(
        {"tools": [{"kind": "python", "ref": ref("lookup_order"), "name": "look up"}]}
    )
    assert path == "tools[0].name"
    assert "letters, digits" in message


@pytest.mark.parametrize(
    ("match", "path", "expected"),
    [
        ({"regex": "look(up"}, "before_tool[0].match.regex", "missing )"),
        ({"regexp": "x"}, "before_tool[0].match.regex", "required"),
        ({"regex": "x", "flags": "i"}, "before_tool[0].match.flags", "unknown key"),
        (["lookup_order"], "before_tool[0].match", "tool's name or a table with a regex"),
        ("lookup", "before_tool[0].match", 'did you mean "lookup_order"?'),
    ],
)
def test_a_tool_hook_match_is_checked_when_loaded(match: Any, path: str, expected: str) -> None:
    data = _tools(before_tool=[{"kind": "python", "ref": ref("no_refunds"), "match": match}])
    ((where, message),) = _problems(data)
    assert where == path
    assert expected in message


@pytest.mark.parametrize(
    ("stage", "kind", "expected"),
    [
        ("pre", "retrieve", "parallel group"),
        ("pre", "guardrail", "goes in post"),
        ("post", "tool_call", "goes in pre"),
        ("transformers", "judge", "goes in post"),
        ("pre", "pii", "goes in transformers"),
    ],
)
def test_a_new_kind_in_the_wrong_list_says_where_it_belongs(
    stage: str, kind: str, expected: str
) -> None:
    ((path, message),) = _problems({stage: [{"kind": kind}]})
    assert path == f"{stage}[0].kind"
    assert expected in message


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("deep.json", '{"system": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("deep.toml", "system = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        (
            "deep_arguments.toml",
            '[[pre]]\nkind = "tool_call"\ntool = "t"\narguments = '
            + "{ a = " * 2_000
            + "1"
            + " }" * 2_000
            + "\n",
        ),
    ],
)
def test_a_config_nested_too_deeply_is_a_config_error_naming_the_file(
    tmp_path: Path, name: str, content: str
) -> None:
    """Catches: a config nested 100,000 deep escaping as a raw RecursionError (exit 1)."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert str(caught.value).startswith(f"{path}: nested too deeply")
    assert caught.value.problems


def test_a_python_model_is_built_by_the_function_its_ref_names(tmp_path: Path) -> None:
    """Catches: no way to declare a model that holds a whole conversation offline (a
    `FunctionModel`) in a config: only scripted replies, which run out."""
    (tmp_path / "my_models.py").write_text(
        "from pipeline.testing import FunctionModel\n\n\n"
        "def echo():\n    return FunctionModel(lambda request: request.messages[-1].text)\n\n\n"
        "def broken():\n    return 42\n"
    )
    good = tmp_path / "good.toml"
    good.write_text('[model]\nprovider = "python"\nref = "my_models:echo"\n')
    pipe = load_pipeline(good)
    from pipeline.testing import FunctionModel

    assert isinstance(pipe.model, FunctionModel)
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nprovider = "python"\nref = "my_models:broken"\n')
    with pytest.raises(ConfigError) as caught:
        load_pipeline(bad)
    assert "model.ref: 'my_models:broken' returned int 42, not a model" in str(caught.value)
