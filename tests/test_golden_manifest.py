"""golden/MANIFEST lists every committed golden with its sha256, oracle, oracle version and the
command that derives it, and nothing else."""

from __future__ import annotations

import hashlib
import re
from importlib import metadata

import pytest

from mlconf.golden import GOLDEN_DIR
from mlconf.tools import golden

MANIFEST = GOLDEN_DIR / "MANIFEST"
NOT_GOLDEN = {"MANIFEST", "__init__.py"}


def manifest_rows() -> list[list[str]]:
    rows = []
    for line in MANIFEST.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            rows.append(line.split())
    return rows


def golden_files() -> set[str]:
    out = set()
    for p in GOLDEN_DIR.rglob("*"):
        rel = p.relative_to(GOLDEN_DIR)
        if p.is_dir() or "__pycache__" in rel.parts:
            continue
        if rel.as_posix() in NOT_GOLDEN or p.name.startswith("README"):
            continue
        out.add(rel.as_posix())
    return out


def test_manifest_format():
    lines = MANIFEST.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("#"), "the first line is a comment header"
    rows = manifest_rows()
    assert rows
    for r in rows:
        assert len(r) >= 5, f"sha256 path oracle oracle_version command...: {r}"
        assert re.fullmatch(r"[0-9a-f]{64}", r[0]), r
    paths = [r[1] for r in rows]
    assert len(paths) == len(set(paths)), "a golden listed twice"


def test_every_golden_listed_and_nothing_else():
    listed = {r[1] for r in manifest_rows()}
    assert golden_files() - listed == set(), "golden files missing from MANIFEST"
    assert listed - golden_files() == set(), "MANIFEST lists files that do not exist"


@pytest.mark.parametrize("row", manifest_rows(), ids=lambda r: r[1])
def test_sha256(row):
    path = GOLDEN_DIR / row[1]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == row[0], f"{row[1]} changed; re-derive it: {' '.join(row[4:])}"


@pytest.mark.oracle
@pytest.mark.parametrize("row", manifest_rows(), ids=lambda r: r[1])
def test_oracle_version_installed(row):
    # oracle_version: the oracle's version, then "+package-version" for what it ran on (torch)
    wanted = {row[2]: row[3].split("+")[0]}
    wanted.update(part.rsplit("-", 1) for part in row[3].split("+")[1:])
    for package, version in wanted.items():
        try:
            installed = metadata.version(package).split("+")[0]
        except metadata.PackageNotFoundError:
            pytest.skip(f"oracle {package} not installed")
        if package == row[2] and golden.PINNED_ORACLES.get(package) == version and installed != version:
            pytest.skip(
                f"{row[1]}: derived under {package} {version}, an upstream system's pinned "
                f"environment (installed: {installed}); re-derive it there"
            )
        assert installed == version, f"{row[1]} was derived with {package} {version}; installed: {installed}"
