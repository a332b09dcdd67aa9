"""The repository's rooms (README "Layout"): every module of an installed package is named in the
layout table, and no package hides a room in a large ``__init__.py`` (issue 21)."""

from __future__ import annotations

import itertools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "conformance", "specs", "tools", "golden")
INIT_MAX_LINES = 60  # a package's face: its imports, __all__ and a docstring


def _modules() -> list[str]:
    """Every .py file of the packages, from the folders themselves (a module that is not committed
    yet must be named too); caches are not modules."""
    found = (p.relative_to(REPO).as_posix() for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))
    return sorted(p for p in found if "__pycache__" not in p)


def _layout_table() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    head = text.index("\n| folder | installed as | holds |", text.index("\n## Layout\n"))
    return "\n".join(itertools.takewhile(lambda line: line.startswith("|"), text[head + 1 :].splitlines()))


def test_no_large_init_files():
    big = {
        p: n
        for p in _modules()
        if p.endswith("/__init__.py")
        and (n := len((REPO / p).read_text(encoding="utf-8").splitlines())) > INIT_MAX_LINES
    }
    assert not big, f"__init__.py over {INIT_MAX_LINES} lines (give each part a module named for it): {big}"


def test_every_module_is_in_the_layout_table():
    table = _layout_table()
    missing = []
    for p in _modules():
        parts = p.split("/")
        if parts[-1] == "__init__.py":
            continue
        # a module counts as named by its file name, or by a folder named as a whole (suite/, fuzz/)
        named = f"`{parts[-1]}`" in table or any(f"`{d}/`" in table for d in parts[1:-1])
        if not named:
            missing.append(p)
    assert not missing, f"README's layout table does not name: {missing}"
