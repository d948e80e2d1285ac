"""The public API surface and the layering of the three packages (public names re-exported, sorted `__all__`, one-way layering)."""

import ast
import importlib
import pkgutil
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("turns", "pipeline", "hooks")
PUBLIC_SUBMODULES = {
    "turns": {"serde"},
    "pipeline": {"events", "logs", "otel", "providers", "testing"},
    "hooks": {"cli", "config"},
}
# Third-party imports each package may use (the standard library is always allowed).
ALLOWED_IMPORTS = {
    "turns": {"attrs", "cattrs"},
    "pipeline": {"anyio", "attrs", "sniffio", "trio", "httpx", "turns"},
    "hooks": {"anyio", "attrs", "trio", "turns", "pipeline"},
}
# Modules allowed to import cattrs: serialization stays at the edge (STYLE 5).
CATTRS_MODULES = {"turns/serde.py", "hooks/config/_load.py"}
# Optional dependencies and the one module each may be imported from (lazily: the package
# imports without them).
OPTIONAL_IMPORTS = {
    "psycopg": {"pipeline/logs/_postgres.py"},
    # The mcp extra: the SDK, its types, its HTTP client and its JSON Schema validator.
    "mcp": {"pipeline/_mcp.py"},
    "mcp_types": {"pipeline/_mcp.py"},
    "httpx2": {"pipeline/_mcp.py"},
    "jsonschema": {"pipeline/_mcp.py"},
    # The SDK's own validation error, read to tell a server what its answer lacked.
    "pydantic": {"pipeline/_mcp.py"},
    # pipeline.otel; the gateway reads a request's trace context (`turnplug serve --otel`).
    "opentelemetry": {"pipeline/otel.py", "hooks/cli/_gateway.py"},
    # The tiktoken extra: tiktoken_tokenizer imports it when called.
    "tiktoken": {"pipeline/_budget.py"},
}
# The HTTP stack of `turnplug serve`, kept to the gateway's modules.
OPTIONAL_IMPORTS |= {
    "starlette": {"hooks/cli/_gateway.py"},
    "hypercorn": {"hooks/cli/_serve.py"},
}


def _public_modules(package: str) -> list[str]:
    names = [package]
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__):
        if info.name in PUBLIC_SUBMODULES[package]:
            names.append(f"{package}.{info.name}")
    return names


ALL_PUBLIC = [name for package in PACKAGES for name in _public_modules(package)]


@pytest.mark.parametrize("name", ALL_PUBLIC)
def test_all_is_sorted(name: str) -> None:
    module = importlib.import_module(name)
    assert list(module.__all__) == sorted(module.__all__)


def _defined_names(module: types.ModuleType) -> set[str]:
    """Public names a module's own source defines at top level (TypeVars aside)."""
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "TypeVar":
                continue
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_") and name != "__all__"}


@pytest.mark.parametrize("name", ALL_PUBLIC)
def test_all_is_complete(name: str) -> None:
    module = importlib.import_module(name)
    if module.__file__ and module.__file__.endswith("__init__.py"):
        # A package's __init__ only imports what it exports: every public attribute counts.
        public = {
            attr
            for attr, value in vars(module).items()
            if not attr.startswith("_") and not isinstance(value, types.ModuleType)
        }
    else:
        public = _defined_names(module)
    assert public - set(module.__all__) == set()


@pytest.mark.parametrize("name", ALL_PUBLIC)
def test_every_exported_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    missing = [attr for attr in module.__all__ if not hasattr(module, attr)]
    assert missing == []


@pytest.mark.parametrize("name", ALL_PUBLIC)
def test_public_classes_report_their_public_module(name: str) -> None:
    module = importlib.import_module(name)
    wrong = {
        attr: value.__module__
        for attr in module.__all__
        if isinstance(value := getattr(module, attr), type)
        and value.__module__.startswith(f"{name}._")
    }
    assert wrong == {}


def _imports(path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """(module, imported names, relative level) for every import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, (), 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            found.append((node.module or "", names, node.level))
    return found


def _source_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize(
    "path",
    [path for package in PACKAGES for path in _source_files(package)],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_layering(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    relative = path.relative_to(ROOT).as_posix()
    problems = []
    for module, _names, level in _imports(path):
        if level:
            continue  # inside the package itself
        top = _top(module)
        if top in sys.stdlib_module_names or top == package:
            continue
        if top == "cattrs":
            if relative not in CATTRS_MODULES:
                problems.append(f"{relative} imports cattrs: only {sorted(CATTRS_MODULES)} may")
        elif top in OPTIONAL_IMPORTS:
            if relative not in OPTIONAL_IMPORTS[top]:
                problems.append(f"{relative} imports {top}: only {OPTIONAL_IMPORTS[top]} may")
        elif top not in ALLOWED_IMPORTS[package]:
            problems.append(f"{relative} imports {module}, outside the layering of {package}")
    assert problems == []


@pytest.mark.parametrize("path", _source_files("hooks"), ids=lambda path: path.name)
def test_hooks_use_only_public_names(path: Path) -> None:
    problems = []
    for module, names, level in _imports(path):
        if level or _top(module) not in ("turns", "pipeline"):
            continue
        if any(part.startswith("_") for part in module.split(".")):
            problems.append(f"{path.name} imports private module {module}")
            continue
        exported = set(importlib.import_module(module).__all__)
        exported |= PUBLIC_SUBMODULES.get(module, set())
        problems.extend(
            f"{path.name} imports {module}.{name}, which is not public"
            for name in names
            if name not in exported
        )
    assert problems == []


def test_layering_check_catches_a_violation(tmp_path: Path) -> None:
    # The check above must be able to fail: a `turns` module importing `pipeline` is caught.
    bad = tmp_path / "bad.py"
    bad.write_text("from pipeline import cont\nimport hooks\n")
    tops = {_top(module) for module, _, _ in _imports(bad)}
    assert tops - ALLOWED_IMPORTS["turns"] - set(sys.stdlib_module_names) == {"pipeline", "hooks"}


def test_the_hooks_catalogue_is_importable_from_hooks() -> None:
    # The ready-made hooks are public names of `hooks` itself.
    catalogue = {
        "citations",
        "deny",
        "drop_oldest",
        "durable",
        "guardrail",
        "inject_text",
        "judge",
        "max_length",
        "pii",
        "redact",
        "retrieve",
        "running_summary",
        "transient",
    }
    assert catalogue - set(importlib.import_module("hooks").__all__) == set()
