"""The build cache of backends/native/build.py ($MLRT_BUILD_CACHE): the same inputs are compiled
once, and any change to what makes the output (a source, a header beside it, a flag, the
compiler) is a new build, never a stale copy."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mlconf.backends.native import build

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed")

MAIN = '#include "answer.h"\n#include <stdio.h>\nint main(void) { printf("%d\\n", ANSWER); return 0; }\n'


def _program(tmp_path, answer: int):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "main.c").write_text(MAIN, encoding="utf-8")
    (src / "answer.h").write_text(f"#define ANSWER {answer}\n", encoding="utf-8")
    return [(src / "main.c", [])]


def _run(exe) -> str:
    return subprocess.run([str(exe)], capture_output=True, encoding="utf-8", check=True).stdout.strip()


def test_same_inputs_are_built_once_and_any_change_is_rebuilt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv(build.BUILD_CACHE, str(cache))
    srcs = _program(tmp_path, 41)
    flags = ["-O2"]
    first = build.compile_link("gcc", flags, srcs, [], tmp_path / "a" / "prog")
    entries = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
    assert _run(first) == "41" and len(entries) == 1

    # the second build is a copy of the kept file (marked here: nothing was compiled)
    (cache / entries[0]).write_bytes(b"kept")
    second = build.compile_link("gcc", flags, srcs, [], tmp_path / "b" / "prog")
    assert second.read_bytes() == b"kept"
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == entries

    # a header edit, a flag and another compiler command each make a new build
    calls = tmp_path / "calls"
    fake = tmp_path / "gcc-wrapper"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec gcc "$@"\n', encoding="utf-8")
    fake.chmod(0o755)
    (srcs[0][0].parent / "answer.h").write_text("#define ANSWER 42\n", encoding="utf-8")
    assert _run(build.compile_link("gcc", flags, srcs, [], tmp_path / "c" / "prog")) == "42"
    assert _run(build.compile_link("gcc", ["-O1"], srcs, [], tmp_path / "d" / "prog")) == "42"
    assert _run(build.compile_link(str(fake), ["-O1"], srcs, [], tmp_path / "e" / "prog")) == "42"
    assert calls.read_text(encoding="utf-8").count("-c") == 1  # compiled once; --version is the key's
    assert len([p for p in cache.iterdir() if not p.name.endswith(".lock")]) == 4


def test_a_source_edit_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv(build.BUILD_CACHE, str(tmp_path / "cache"))
    srcs = _program(tmp_path, 1)
    assert _run(build.compile_link("gcc", [], srcs, [], tmp_path / "a" / "prog")) == "1"
    srcs[0][0].write_text(MAIN.replace("ANSWER)", "ANSWER + 1)"), encoding="utf-8")
    assert _run(build.compile_link("gcc", [], srcs, [], tmp_path / "b" / "prog")) == "2"


def test_without_the_variable_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.delenv(build.BUILD_CACHE, raising=False)
    srcs = _program(tmp_path, 7)
    out = build.compile_link("gcc", [], srcs, [], tmp_path / "out" / "prog")
    assert _run(out) == "7"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["prog"]


def test_a_failed_build_keeps_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv(build.BUILD_CACHE, str(cache))
    srcs = _program(tmp_path, 1)
    srcs[0][0].write_text("int main(void) { return }\n", encoding="utf-8")
    with pytest.raises(build.BuildError):
        build.compile_link("gcc", [], srcs, [], tmp_path / "out" / "prog")
    assert [p for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    assert not (tmp_path / "out" / "prog").exists()
