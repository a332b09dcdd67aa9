"""The atheris targets of the reference loaders (backends/reference/fuzz/): their invariants hold
on every fixture, a planted bug breaks them, and each target runs a few thousand coverage-guided
inputs seeded with the fixtures without a finding."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlconf.backends import LoadResult
from mlconf.backends.reference import gguf_model, loader
from mlconf.backends.reference import mlt as mlt_loader

pytest.importorskip("atheris", reason="atheris is not installed (the test extra installs it on x86-64 Linux)")

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "backends" / "reference" / "fuzz"
TARGETS = {
    "fuzz_mlb_load": ".mlb",
    "fuzz_mlt_load": ".mlt",
    "fuzz_gguf_load": ".gguf",
}  # -> the files it reads
DICTS = ROOT / "backends" / "native" / "fuzz"  # mlb.dict, mlt.dict, gguf.dict: shared


@pytest.fixture(scope="module")
def targets(monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(FUZZ))
    return {name: importlib.import_module(name) for name in TARGETS}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def seeds(generated, suffix: str) -> list[Path]:
    out, _ = generated
    return sorted(p for p in out.rglob(f"*{suffix}") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("name", TARGETS)
def test_the_invariants_hold_on_every_fixture(targets, generated, name):
    files = seeds(generated, TARGETS[name])
    assert len(files) > 30
    for p in files:
        targets[name].test_one_input(p.read_bytes())


def test_a_planted_bug_is_a_finding(targets, generated, monkeypatch):
    """A loader that answers a status outside STATUSES, or a refusal without its rule's status,
    breaks the target's invariants: the target raises, which atheris reports as a crash."""
    data = next(p for p in seeds(generated, ".mlb") if "valid" in p.parts).read_bytes()
    monkeypatch.setattr(loader, "load", lambda path, version=None: LoadResult("ML_E_WHATEVER"))
    with pytest.raises(AssertionError):
        targets["fuzz_mlb_load"].test_one_input(data)
    monkeypatch.setattr(mlt_loader, "check", lambda data, *a, **k: LoadResult("ML_OK?"))
    with pytest.raises(AssertionError):
        targets["fuzz_mlt_load"].test_one_input(b"MLT1")
    # a GGUF reader that recursed once per nesting level (gguf-py's RecursionError class)
    deep = next(p for p in seeds(generated, ".gguf") if p.name == "depth_10000.gguf").read_bytes()
    monkeypatch.setattr(gguf_model, "check_bytes", lambda data: _recurse(10**6))
    with pytest.raises(RecursionError):
        targets["fuzz_gguf_load"].test_one_input(deep)


def _recurse(n: int) -> int:
    return n if n <= 0 else 1 + _recurse(n - 1)


@pytest.mark.parametrize("name", TARGETS)
def test_a_short_campaign_finds_nothing(generated, tmp_path, name):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, p in enumerate(seeds(generated, TARGETS[name])):
        shutil.copy(p, corpus / f"{i}{TARGETS[name]}")
    dictionary = DICTS / f"{TARGETS[name][1:]}.dict"
    r = subprocess.run(
        [
            sys.executable,
            str(FUZZ / f"{name}.py"),
            f"-dict={dictionary}",
            "-runs=2000",
            "-seed=1",
            "-max_len=65536",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    done = re.search(r"Done (\d+) runs", r.stderr)  # libFuzzer may finish a mutation round past -runs
    assert done and int(done.group(1)) >= 2000, r.stderr[-3000:]  # seen: "Done 2155 runs"
    assert not list(tmp_path.glob("crash-*")), r.stderr[-3000:]
