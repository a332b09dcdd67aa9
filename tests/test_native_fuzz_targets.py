"""The libFuzzer targets of backends/native/fuzz build with clang and run clean on the fixtures
and on every input they found before (fuzz/regressions/TARGET: e.g. an .mlt whose encode emitted
no ids, once pointer arithmetic on NULL under UBSan); a few thousand inputs each: a smoke run, the
long campaigns belong to a fuzzing fleet."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from mlconf.backends.native import build

pytestmark = pytest.mark.slow  # libFuzzer builds and campaigns


@pytest.fixture(scope="module")
def corpus(generated, tmp_path_factory):
    out, made = generated
    root = tmp_path_factory.mktemp("corpus")
    for ext in ("mlb", "mlt", "gguf"):
        (root / ext).mkdir()
    for i, f in enumerate(made):
        p = out / f.file
        if p.is_file() and not p.is_symlink():
            shutil.copy(p, root / p.suffix[1:] / f"{i}{p.suffix}")
    return root


@pytest.mark.parametrize("target,ext", [("mlb_check", "mlb"), ("mlt_load", "mlt"), ("gguf_load", "gguf")])
def test_fuzz_target_runs_clean(target, ext, corpus, tmp_path):
    if shutil.which("clang") is None:
        pytest.skip("no clang for the libFuzzer targets")
    try:
        exe = build.build_fuzzer(target, tmp_path / target)
    except build.BuildError as e:
        pytest.skip(f"no libFuzzer build here: {str(e).strip().splitlines()[-1][:200]}")
    work = tmp_path / "new"
    work.mkdir()
    regressions = build.FUZZ / "regressions" / target  # what libFuzzer found before: run first
    dirs = [str(work), str(corpus / ext), *([str(regressions)] if regressions.is_dir() else [])]
    r = subprocess.run(
        [str(exe), f"-dict={build.FUZZ / (ext + '.dict')}", "-runs=3000", "-seed=1", "-max_len=65536", *dirs],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    done = re.search(r"Done (\d+) runs", r.stderr)  # libFuzzer may finish a mutation round past -runs
    assert done and int(done.group(1)) >= 3000, r.stderr[-3000:]
