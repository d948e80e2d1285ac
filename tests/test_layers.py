"""The layers inside `pipeline/` and `hooks/`: no import cycle, no import that climbs a layer.

Every import counts: top-level ones, those under ``if TYPE_CHECKING:`` and those inside a
function. The layers are declared here, bottom first (docs/architecture.md says what each is
for); a module may import its own layer and the layers below it, never one above. Modules a
layer lists that do not exist (yet) are allowed; a module no layer lists is an error, so that
a new module's place is decided when it is added.
"""

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom first. A name ending in ".*" stands for every module of that package.
PIPELINE_LAYERS: dict[str, tuple[str, ...]] = {
    "leaf": (
        "pipeline._audit",
        "pipeline._budget",
        "pipeline._commit",
        "pipeline._describe",
        "pipeline._emit",
        "pipeline._errors",
        "pipeline._excgroups",
        "pipeline._hooks",
        "pipeline._jsontext",
        "pipeline._loop",
        "pipeline._model",
        "pipeline._result",
        "pipeline._seam",
        "pipeline._signals",
        "pipeline._urls",
        "pipeline.events",
    ),
    "tools": ("pipeline._tools", "pipeline._toolsets", "pipeline._mcp"),
    "adapters": ("pipeline.logs.*", "pipeline.providers.*", "pipeline.testing"),
    "plan": ("pipeline._plan",),
    "runner": ("pipeline._runner", "pipeline._observe"),
    "stages": (
        "pipeline._parallel",
        "pipeline._background",
        "pipeline._request",
        "pipeline._tooljudge",
        "pipeline._toolloop",
    ),
    "drive": ("pipeline._drive",),
    "streaming": ("pipeline._stream",),
    "sessions": ("pipeline._session",),
    "facade": ("pipeline._pipeline", "pipeline.otel", "pipeline"),
}
HOOKS_LAYERS: dict[str, tuple[str, ...]] = {
    "catalogue": ("hooks._*", "hooks"),
    "config": ("hooks.config.*",),
    "cli": ("hooks.cli.*",),
}
PACKAGE_LAYERS = {"pipeline": PIPELINE_LAYERS, "hooks": HOOKS_LAYERS}


def module_name(root: Path, path: Path) -> str:
    """``pipeline/logs/_sqlite.py`` -> ``pipeline.logs._sqlite``; a package is its __init__."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules_of(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name."""
    return {
        module_name(root, path): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules among `known` that `name` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name.split(".")
                if not is_package:
                    package = package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, node.module] if node.module else package)
            else:
                base = node.module or ""
            # `from . import events` imports the module `events`, not a name of the package.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # `import pipeline.logs._sqlite` also imports its packages; the nearest known
            # module is the one that counts.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str, layers: Mapping[str, Sequence[str]]) -> int | None:
    """The index of the layer that lists `name`, or None."""
    for index, members in enumerate(layers.values()):
        for member in members:
            if member == name:
                return index
            if member.endswith(".*") and (name == member[:-2] or name.startswith(member[:-1])):
                return index
            # "hooks._*": the package's own private modules, not its subpackages'.
            private = member.endswith("._*") and name.startswith(member[:-1])
            if private and "." not in name[len(member) - 2 :]:
                return index
    return None


def layer_problems(
    root: Path, package_layers: Mapping[str, Mapping[str, Sequence[str]]]
) -> list[str]:
    """Unlisted modules and imports that climb a layer, as readable lines."""
    known = modules_of(root, package_layers)
    problems = []
    for name, path in known.items():
        package = name.split(".")[0]
        layers = package_layers[package]
        names = list(layers)
        own = layer_of(name, layers)
        if own is None:
            problems.append(f"{name} is in no layer: add it to the layers of {package}")
            continue
        for target in sorted(imports_of(name, path, known)):
            if target.split(".")[0] != package:
                continue  # across packages: test_api.py's layering of the three packages
            theirs = layer_of(target, layers)
            if theirs is not None and theirs > own:
                problems.append(
                    f"{name} ({names[own]}) imports {target} ({names[theirs]}), a layer above it"
                )
    return problems


def import_cycles(root: Path, packages: Iterable[str]) -> list[list[str]]:
    """Every import cycle among the modules of `packages`, each as a closed path."""
    known = modules_of(root, packages)
    graph = {name: sorted(imports_of(name, path, known)) for name, path in known.items()}
    cycles: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the current path, "done" once explored
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = "open"
        path.append(name)
        for target in graph[name]:
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return cycles


def test_pipeline_and_hooks_have_no_import_cycle() -> None:
    """Catches: a module importing one that imports it back, even under TYPE_CHECKING or
    inside a function (the old runner <-> pipeline <-> drive circle)."""
    assert import_cycles(ROOT, ("pipeline", "hooks")) == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    """Catches: the runner reaching up into the façade, a provider or a log into the runner,
    the catalogue of hooks into the config loader, the config loader into the CLI."""
    assert layer_problems(ROOT, PACKAGE_LAYERS) == []


def test_providers_and_logs_import_nothing_of_the_runtime() -> None:
    """Catches: a provider or a log borrowing a helper from the runner or a stage."""
    known = modules_of(ROOT, ("pipeline",))
    runtime = {
        name
        for name in known
        if (layer := layer_of(name, PIPELINE_LAYERS)) is not None
        and layer > list(PIPELINE_LAYERS).index("adapters")
    }
    borrowed = {
        name: sorted(imports_of(name, path, known) & runtime)
        for name, path in known.items()
        if name.startswith(("pipeline.providers", "pipeline.logs"))
    }
    assert {name: found for name, found in borrowed.items() if found} == {}


def _write(root: Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checks_catch_a_cycle_a_climb_and_an_unlisted_module(tmp_path: Path) -> None:
    """Catches: checks that pass whatever the code does (a resolver that never finds an
    import, a cycle search that stops early, hidden imports left out)."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/_low.py": "def helper():\n    from ._high import thing\n    return thing\n",
            "pkg/_high.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from . import _low\n"
                "thing = 1\n"
            ),
            "pkg/sub/__init__.py": "from .. import _high\n",
            "pkg/_stray.py": "",
        },
    )
    layers = {"pkg": {"low": ("pkg._low",), "high": ("pkg._high", "pkg.sub.*", "pkg")}}

    assert import_cycles(tmp_path, ["pkg"]) == [["pkg._high", "pkg._low", "pkg._high"]]
    assert layer_problems(tmp_path, layers) == [
        "pkg._low (low) imports pkg._high (high), a layer above it",
        "pkg._stray is in no layer: add it to the layers of pkg",
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pipeline._runner", "runner"),
        ("pipeline.logs._sqlite", "adapters"),
        ("pipeline", "facade"),
        ("hooks._redact", "catalogue"),
        ("hooks.config._load", "config"),
        ("hooks.cli", "cli"),
    ],
)
def test_layer_of_places_modules_and_packages(name: str, expected: str) -> None:
    """Catches: a wildcard that swallows a subpackage (``hooks._*`` taking ``hooks.cli``)."""
    layers = PIPELINE_LAYERS if name.startswith("pipeline") else HOOKS_LAYERS
    index = layer_of(name, layers)
    assert index is not None
    assert list(layers)[index] == expected


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _layer_blocks(text: str, package: str) -> dict[str, str]:
    """The text of each layer's item in the ``## `package/`, bottom first`` section, by the
    layer's name as `PACKAGE_LAYERS` spells it (``façade`` is ``facade``)."""
    section = text.split(f"## `{package}/`, bottom first", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"^\d+\. \*\*", section, flags=re.MULTILINE)[1:]
    return {item.split("**", 1)[0].replace("ç", "c"): item.split("**", 1)[1] for item in items}


def _doc_name(name: str) -> str:
    """How docs/architecture.md names a module in its layer: ``_plan``, ``events``,
    ``pipeline.otel``, ``logs/`` for every module of ``pipeline.logs``, ``hooks/config/`` for
    that package's own ``__init__``."""
    special = {
        "pipeline": "__init__",
        "pipeline.otel": "pipeline.otel",
        "hooks": "hooks/__init__",
        "hooks.config": "hooks/config/",
        "hooks.cli": "hooks/cli/",
    }
    if name in special:
        return special[name]
    parts = name.split(".")
    if parts[0] == "pipeline" and parts[1] in ("logs", "providers"):
        return f"{parts[1]}/"
    return parts[-1]


def architecture_problems(text: str, root: Path) -> list[str]:
    """Modules the architecture page leaves out or places in another layer than
    `PACKAGE_LAYERS`, and module names it gives that no module has, as readable lines."""
    known = modules_of(root, PACKAGE_LAYERS)
    problems = []
    for package, layers in PACKAGE_LAYERS.items():
        blocks = _layer_blocks(text, package)
        if list(blocks) != list(layers):
            problems.append(f"{package}: the page's layers are {list(blocks)}, not {list(layers)}")
            continue
        names = list(layers)
        for name in sorted(known):
            layer = layer_of(name, layers)
            if not name.startswith(package) or layer is None:
                continue
            named = {
                token.split(".py")[0] for token in re.findall(r"`([^`]+)`", blocks[names[layer]])
            }
            if _doc_name(name) not in named:
                problems.append(f"{name} is not named in its layer ({names[layer]}) of the page")
    shorts = {name.rsplit(".", 1)[-1] for name in known}
    for token in sorted(set(re.findall(r"`(_[a-z_]+)[.`]", text))):
        if token not in shorts and token != "__init__":
            problems.append(f"the page names {token}, which no module of the packages is")
    return problems


def test_the_architecture_page_names_every_module_in_its_layer() -> None:
    """Catches: docs/architecture.md leaving out modules (the config's `_entry`, `_file`,
    `_scrub`; the command line's `_main`, `_gateway`, `_wire`, `_logs`), placing one in
    another layer than this test does, or naming a module that is gone."""
    assert architecture_problems(ARCHITECTURE.read_text(encoding="utf-8"), ROOT) == []


def test_the_architecture_check_catches_a_missing_a_misplaced_and_a_stale_module() -> None:
    """Catches: a page check that passes whatever the page says."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = text.replace("`_excgroups`", "excgroups")
    misplaced = text.replace("`_plan`:", "plan:").replace("`_runner`:", "`_runner`, `_plan`:")
    stale = text.replace("`_stream`:", "`_stream`, `_streaming`:")

    assert architecture_problems(missing, ROOT) == [
        "pipeline._excgroups is not named in its layer (leaf) of the page"
    ]
    assert architecture_problems(misplaced, ROOT) == [
        "pipeline._plan is not named in its layer (plan) of the page"
    ]
    assert architecture_problems(stale, ROOT) == [
        "the page names _streaming, which no module of the packages is"
    ]
