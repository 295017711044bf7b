"""The layout of the test suite: shared test code lives in the package tests.helpers, and nothing else is imported
across test files. No file under tests/ imports a test module (``tests.<dir>.test_*``, or a top-level ``test_*``), a
conftest.py (``tests.conftest``, ``tests.<dir>.conftest``, a top-level ``conftest``) or any other ``tests.X`` but
``tests.helpers``; conftest.py files hold only fixtures and pytest hooks (no constants, helper functions or classes).
Each check also runs on planted sources, so it is known to fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

TESTS = ROOT / "tests"


def module_of(path: Path) -> str:
    """The dotted module name of a file under the checkout (``tests/a/b.py`` -> ``tests.a.b``; a package's
    ``__init__.py`` -> the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module of ``from <level dots><module> import ...`` written in module ``importer``."""
    if not level:
        return module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[:len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_module_name(name: str) -> bool:
    """A conftest or test module's own name."""
    return name == "conftest" or name.startswith("test_")


def _imports(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[int, list[str]]]:
    """(line, the absolute module names it may import) of every import statement in ``tree``: ``import a.b`` (a.b),
    ``from a import b`` (a and a.b: ``b`` may be a module), relative imports resolved, and
    ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, [alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module, node.level, importer, is_package)
            subs = [f"{base}.{alias.name}" if base else alias.name for alias in node.names if alias.name != "*"]
            # names that are modules by their own name first (``from tests import conftest``), then the base
            modules = [n for n in subs if _is_module_name(n.rsplit(".", 1)[-1])]
            found.append((node.lineno, [*modules, base, *subs]))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, [node.args[0].value]))
    return found


def _forbidden(name: str) -> str:
    """Why importing module ``name`` breaks the layout ("" when it does not)."""
    parts = name.split(".")
    if parts[0] == "conftest" or (parts[0] == "tests" and "conftest" in parts):
        return "imports a conftest module (use the fixture by name; shared code goes to tests.helpers)"
    if parts[0].startswith("test_") or (parts[0] == "tests" and any(p.startswith("test_") for p in parts)):
        return "imports a test module (move what it shares to tests.helpers)"
    if parts[0] == "tests" and len(parts) > 1 and parts[1] != "helpers":
        return "imports a tests module outside tests.helpers"
    return ""


def import_violations(source: str, path: str, module: str, is_package: bool = False) -> list[str]:
    """``path:line: <module>: <why>`` for every import statement of ``source`` (the text of ``path``, module
    ``module``) that breaks the layout, naming the first offending module it imports; in line order."""
    out = []
    for line, names in _imports(ast.parse(source, path), module, is_package):
        for name in names:
            why = _forbidden(name)
            if why:
                out.append((line, f"{path}:{line}: {name}: {why}"))
                break
    return [text for _, text in sorted(out)]


def _is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                isinstance(target, ast.Name) and target.id == "fixture"):
            return True
    return False


def conftest_violations(source: str, path: str) -> list[str]:
    """``path:line: <name>: <why>`` for every top-level definition of a conftest.py that is neither a fixture nor a
    ``pytest_*`` hook: functions, classes, and module constants (assignments)."""
    out = []
    for node in ast.parse(source, path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not (_is_fixture(node) or node.name.startswith("pytest_")):
                out.append(f"{path}:{node.lineno}: {node.name}: a function that is no fixture or hook")
        elif isinstance(node, ast.ClassDef):
            out.append(f"{path}:{node.lineno}: {node.name}: a class")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = ", ".join(ast.unparse(t) for t in targets)
            if names != "pytest_plugins":
                out.append(f"{path}:{node.lineno}: {names}: a module constant")
    return out


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_scan_sees_the_suite() -> None:
    files = {str(p.relative_to(TESTS)) for p in _test_files()}
    assert {"conftest.py", "contract/conftest.py", "helpers/chart.py", "unit/test_test_layout.py"} <= files


def test_no_file_imports_a_test_module_a_conftest_or_tests_outside_helpers() -> None:
    found = []
    for path in _test_files():
        found += import_violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), module_of(path),
                                   is_package=path.name == "__init__.py")
    assert found == [], "\n".join(found)


def test_conftest_files_hold_only_fixtures_and_hooks() -> None:
    found = []
    for path in _test_files():
        if path.name == "conftest.py":
            found += conftest_violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(("planted", "module", "reported"), [
    ("from tests.conftest import ROOT", "tests.unit.test_x", "tests.conftest"),
    ("from tests.contract.conftest import render", "tests.unit.test_x", "tests.contract.conftest"),
    ("import tests.contract.conftest", "tests.unit.test_x", "tests.contract.conftest"),
    ("from tests import conftest", "tests.unit.test_x", "tests.conftest"),
    ("from tests.contract import conftest", "tests.contract.test_x", "tests.contract.conftest"),
    ("from . import conftest", "tests.contract.test_x", "tests.contract.conftest"),
    ("import conftest", "tests.unit.test_x", "conftest"),
    ("from tests.integration.test_adapters import make_lora", "tests.vllm.test_x", "tests.integration.test_adapters"),
    ("from .test_helm_chart import rejected", "tests.contract.test_x", "tests.contract.test_helm_chart"),
    ("from ..integration.test_dialogue import Client", "tests.unit.test_x", "tests.integration.test_dialogue"),
    ("import test_adapters", "tests.unit.test_x", "test_adapters"),
    ("from tests.openai_judge import AGENT_KEYS", "tests.integration.test_x", "tests.openai_judge"),
    ("from tests.helpers.chart import render\nfrom tests.conftest import need", "tests.helpers.x", "tests.conftest"),
    ("def f():\n    import importlib\n    return importlib.import_module('tests.integration.test_runjob')",
     "tests.unit.test_x", "tests.integration.test_runjob"),
], ids=lambda v: v.splitlines()[-1].strip() if "\n" in v else v)
def test_a_planted_import_is_reported_with_its_file_and_line(planted: str, module: str, reported: str) -> None:
    line = planted.count("\n") + 1
    (found,) = import_violations(planted, "tests/planted.py", module)
    assert found.startswith(f"tests/planted.py:{line}: {reported}: "), found


@pytest.mark.parametrize("allowed", [
    "from tests.helpers.chart import render, rejected",
    "from tests.helpers import chart",
    "import tests.helpers.paths",
    "from .helpers import paths",  # in the tests package itself: tests.helpers
    "from unittest import mock",
    "from mascot.core.config import MascotConfig",
    "import pytest\nfrom pytest import fixture",
], ids=lambda v: v.replace("\n", "; "))
def test_imports_of_helpers_and_other_packages_are_allowed(allowed: str) -> None:
    assert import_violations(allowed, "tests/planted.py", "tests.x") == []


def test_a_conftest_with_a_constant_a_helper_or_a_class_is_reported() -> None:
    source = '''
import pytest

ROOT = "/"


def helper():
    return 1


class Server:
    pass


@pytest.fixture
def server():
    return Server()


@pytest.fixture(scope="session")
async def engine():
    yield None


def pytest_configure(config):
    pass
'''
    assert conftest_violations(source, "tests/conftest.py") == [
        "tests/conftest.py:4: ROOT: a module constant",
        "tests/conftest.py:7: helper: a function that is no fixture or hook",
        "tests/conftest.py:11: Server: a class",
    ]
