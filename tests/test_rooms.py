"""The repository's rooms (README "Layout"): every module of an installed package is named in the
layout table, and no package hides a room in a large ``__init__.py`` (issue 21)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "conformance", "specs", "tools", "golden")
INIT_MAX_LINES = 60  # a package's face: its imports, __all__ and a docstring


def _modules() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout (the test reads git ls-files)")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *(f"{p}/*.py" for p in PACKAGES)],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return sorted(p for p in out.decode().split("\0") if p)


def _layout_table() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Layout\n")
    head = text.index("\n| folder | installed as | holds |", start)
    rows = []
    for line in text[head + 1 :].splitlines():
        if not line.startswith("|"):
            break
        rows.append(line)
    return "\n".join(rows)


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
