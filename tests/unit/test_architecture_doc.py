"""docs/architecture.md stays true: every ``mascot...`` / ``mascot_training...`` name it cites imports and resolves
(modules, classes, functions, methods), and its layout block lists exactly the packages of the tree, each path
existing."""

from __future__ import annotations

import importlib
import re

from tests.helpers.paths import ROOT

DOC = ROOT / "docs" / "architecture.md"
#: A dotted name in backticks, e.g. `mascot.gateway.round.RoundRunner.message` (a trailing `()` is allowed).
NAME = re.compile(r"`((?:mascot|mascot_training)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
SOURCE_ROOTS = (ROOT / "services", ROOT / "training-jobs")


def resolve(dotted: str) -> object:
    """Import the longest importable module prefix of ``dotted`` and follow the rest as attributes.

    Raises:
        ImportError / AttributeError: a part of the name does not exist.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def layout_paths(text: str) -> list[str]:
    """The paths of the first fenced block under ``## Layout``: two spaces of indentation per level, the first word
    of a line its name (``name/`` a directory, ``name.py`` a module); other lines continue a description."""
    section = text.split("\n## Layout", 1)[1]
    block = section.split("```", 2)[1].split("\n", 1)[1]
    stack: list[str] = []
    paths = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        if not (name.endswith("/") or name.endswith(".py")):
            continue
        stack = stack[:depth] + [name]
        paths.append("".join(stack))
    return paths


def test_every_cited_name_resolves() -> None:
    names = sorted(set(NAME.findall(DOC.read_text())))
    assert len(names) >= 20, names  # the document walks a message through the code by name
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name}: {e}")
    assert not missing, missing


def test_the_layout_matches_the_tree() -> None:
    listed = layout_paths(DOC.read_text())
    assert not [p for p in listed if not (ROOT / p).exists()], "listed but absent"
    packages = sorted(
        str(init.parent.relative_to(ROOT)) + "/"
        for root in SOURCE_ROOTS for init in root.rglob("__init__.py")
        if "__pycache__" not in init.parts and "versions" not in init.parts
        # the generated per-proto packages are summarised on the api/ line
        and not init.parent.relative_to(ROOT).as_posix().startswith("services/mascot/api/"))
    assert packages, "no packages found"
    assert [p for p in packages if p not in listed] == [], "packages the layout does not list"


def test_the_layout_parser_reads_nesting() -> None:
    text = "x\n## Layout\n\n```\nservices/\n  mascot/\n    core/   shared,\n            more words\n    cli/\n```\n"
    assert layout_paths(text) == ["services/", "services/mascot/", "services/mascot/core/", "services/mascot/cli/"]
