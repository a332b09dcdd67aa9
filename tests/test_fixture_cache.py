"""The fixture cache of `mlconf run` (mlconf.fixtures.cached, runner.Workdir): generated once per
content hash, reused while every file is intact, regenerated when one was changed, and never used
when a run is given its own folder or the cache is off."""

from __future__ import annotations

import json

import pytest

from mlconf import cases, fixtures, runner
from mlconf.backends.reference import ReferenceBackend


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(fixtures.CACHE_ENV, str(folder))
    return folder


def _first_fixture():
    return next(f for f in fixtures.catalog() if f.kind == "valid" and f.file.endswith(".mlb"))


def test_generated_once_and_reused(cache):
    first = fixtures.cached()
    assert first is not None and first.parent == cache and first.name == fixtures.source_key()[:32]
    hashes = json.loads((first / "hashes.json").read_text(encoding="utf-8"))
    assert set(hashes) == {p for f in fixtures.catalog() for p in (f.file, f.imatrix) if p}
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert fixtures.cached() == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp  # not written again
    assert [p.name for p in cache.iterdir()] == [first.name]  # no leftover temporary folder


def test_a_changed_file_is_regenerated(cache):
    first = fixtures.cached()
    f = _first_fixture()
    good = (first / f.file).read_bytes()
    (first / f.file).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # what a misbehaving runtime might do
    assert fixtures.cached() == first
    assert (first / f.file).read_bytes() == good


def test_workdir_reads_the_cache_and_records_do_not_name_it(cache, tmp_path):
    selected = cases.collect(["loader"], "format.magic")
    assert selected
    work = runner.Workdir()
    try:
        a = runner.run(selected, [ReferenceBackend()], work)
        assert work.fixture_root.parent == cache
    finally:
        work.close()
    own = runner.Workdir(tmp_path / "own")  # a run given its folder writes there
    try:
        b = runner.run(selected, [ReferenceBackend()], own)
        assert own.fixture_root == tmp_path / "own" and (tmp_path / "own" / "manifest.json").is_file()
    finally:
        own.close()
    assert [(r.case, r.outcome, r.detail) for r in a] == [(r.case, r.outcome, r.detail) for r in b]
    assert all(str(cache) not in r.detail for r in a)


def test_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv(fixtures.CACHE_ENV, "off")
    assert fixtures.cached() is None
    work = runner.Workdir()
    try:
        work.path(_first_fixture())
        assert work.fixture_root == work.root and (work.root / "manifest.json").is_file()
    finally:
        work.close()


def test_unwritable_cache_falls_back(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv(fixtures.CACHE_ENV, str(blocker / "sub"))  # cannot be created
    assert fixtures.cached() is None
