"""native:neon and native:neon-dotprod: on a host that is not aarch64, the runtime's aarch64 build
(backends/native/worker_main.c, statically linked) under qemu-user, speaking the binary protocol
of worker_main.c (backends/native/qemu.py). The conformance areas must give what native gives on
x86; a guest segfault and a hang are crash and timeout outcomes; the worker executable is rebuilt
when a source is newer. Skipped only when the cross compiler or qemu-aarch64 is missing.

Under qemu the header, loader, quant, forward and tokenizer cases take a few seconds per backend (the golden
models are small), so the whole set runs."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
import pytest

from mlconf import cases, runner
from mlconf.backends import BackendError, InputError, Unsupported, get
from mlconf.backends.native import qemu
from mlconf.cases import Case
from mlconf.fixtures import Fixture
from mlconf.golden import GOLDEN_DIR

ARM = platform.machine() in ("aarch64", "arm64")
AREAS = ["header", "loader", "quant", "forward", "tokenizer"]
MODEL = GOLDEN_DIR / "logits" / "qwen3_qk_norm_f16.mlb"

pytestmark = [
    pytest.mark.skipif(ARM, reason="on aarch64 native:neon is the library itself, not qemu"),
    pytest.mark.slow,  # the cross build and qemu-user
]


@pytest.fixture(scope="module")
def tools() -> None:
    why = qemu.missing_tools()
    if why:
        pytest.skip(f"native:neon under qemu untested: {why}")


@pytest.fixture(scope="module")
def neon(tools):
    b = get("native:neon")
    assert b.capabilities, b.description
    yield b
    b.close()


def _bad(results) -> list[str]:
    return [
        f"{r.outcome} {r.case}: {r.detail}"
        for r in results
        if not (r.outcome == "pass" or (r.outcome == "unsupported" and "q4_0" in r.case))
    ]


@pytest.mark.parametrize("name", ["native:neon", "native:neon-dotprod"])
def test_conformance_under_qemu(tools, name):
    b = get(name)
    try:
        assert b.isa == name.split(":")[1], b.description  # -cpu max alone would pick neon-dotprod
        assert "qemu-aarch64 -cpu max" in b.description
        t = time.monotonic()
        results = runner.run(cases.collect(AREAS), [b])
        print(f"{name}: {len(results)} cases in {time.monotonic() - t:.1f} s")
    finally:
        b.close()
    bad = _bad(results)
    assert not bad, f"{len(bad)} of {len(results)}:\n" + "\n".join(bad[:40])
    assert {r.area for r in results if r.outcome == "pass"} == set(AREAS)


def _isolation_case(name: str) -> Case:
    """A loader case whose file name makes the worker's test hook segfault or hang."""
    fx = Fixture(file=f"isolation/{name}.mlb", kind="malformed", expected="ML_E_FORMAT", rule="isolation")
    return Case(
        f"loader/isolation/{name}",
        "loader",
        "load",
        "tests/test_native_neon.py",
        "status",
        {"fixture": fx},
        "ML_E_FORMAT",
    )


def test_guest_segfault_and_hang_become_outcomes(tools, monkeypatch, tmp_path):
    monkeypatch.setenv("MLRT_WORKER_TEST_HOOKS", "1")  # qemu passes its environment to the guest
    b = get("native:neon")
    b.timeout = 10  # the hang waits this out; the other cases, under qemu, must finish within it
    loader = cases.collect(["loader"], "format.magic or io.open")
    sel = [loader[0], _isolation_case("crash"), *loader[1:3], _isolation_case("hang"), *loader[3:]]
    work = runner.Workdir(tmp_path / "work")
    try:
        results = runner.run(sel, [b], work)
    finally:
        work.close()
        b.close()
    by = {r.case: r for r in results}
    crash = by.pop("loader/isolation/crash")
    assert crash.outcome == "crash", crash
    assert crash.detail.startswith("worker killed by SIGSEGV during load(") and "crash.mlb" in crash.detail
    assert "uncaught target signal 11" in crash.detail, crash.detail  # qemu's own report, quoted
    hang = by.pop("loader/isolation/hang")
    assert hang.outcome == "timeout" and "after 10 s during load(" in hang.detail, hang
    assert len(by) == len(loader) and {r.outcome for r in by.values()} == {"pass"}
    assert b.epoch == 3  # the first worker, one after the crash, one after the timeout


def test_the_hooks_are_off_without_the_variable(neon, monkeypatch):
    monkeypatch.delenv("MLRT_WORKER_TEST_HOOKS", raising=False)
    assert neon.load("/nonexistent/crash.mlb").status == "ML_E_IO"


def test_missing_tools_make_every_case_unsupported(monkeypatch, tmp_path):
    monkeypatch.setattr(qemu, "QEMU", "qemu-aarch64-not-installed")
    b = get("native:neon")
    assert b.capabilities == frozenset()
    work = runner.Workdir(tmp_path / "work")
    try:
        results = [runner.run_case(c, b, work) for c in cases.collect(AREAS)[::25]]
    finally:
        work.close()
    assert {r.outcome for r in results} == {"unsupported"}
    for r in results:
        assert "ISA neon is not available" in r.detail and platform.machine() in r.detail, r.detail
        assert "qemu-aarch64-not-installed, not found" in r.detail, r.detail


def test_sessions_and_the_operations_beyond_the_suite(neon):
    from mlconf.backends.reference.forward import Forward
    from mlconf.tools import mlb

    toks = np.load(MODEL.with_suffix(".npz"))["tokens"][:20]
    s = neon.open_model(str(MODEL), ctx=32)
    logits = s.forward(toks, 0)
    assert logits.shape == (20, s.vocab) and logits.dtype == np.float32 and np.isfinite(logits).all()
    s.reset()
    again = np.concatenate([s.forward(toks[i : i + 1], i) for i in range(len(toks))])
    np.testing.assert_allclose(again, logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(InputError, match="ML_E_ARG"):
        s.forward(np.array([s.vocab]), 20)  # a token outside the vocabulary
    # neon-dotprod: the same bits (integer block sums; one float order on every ISA)
    dot = get("native:neon-dotprod")
    try:
        d = dot.open_model(str(MODEL), ctx=32)
        assert dot.isa == "neon-dotprod"
        assert d.forward(toks, 0).tobytes() == logits.tobytes()
    finally:
        dot.close()
    # imatrix (not used by the suite yet): the sums of the reference within 1e-5
    ref = Forward(mlb.read(MODEL))
    want = ref.start_imatrix()
    n = len(want.sums)
    assert neon._call("imatrix_get", "imatrix_get", s.handle, n)[0] == 4  # ML_E_ARG before the start
    assert neon._call("imatrix_start", "imatrix_start", s.handle) == 0
    s.reset()
    s.forward(toks, 0)
    ref.forward(toks, 0)
    st, sums, tokens, tokens_cls = neon._call("imatrix_get", "imatrix_get", s.handle, n)
    assert (st, tokens, tokens_cls) == (0, want.tokens, want.tokens_cls)
    rel = np.abs(sums - want.sums) / np.where(want.sums == 0, 1, want.sums)
    assert rel.max() <= 1e-5
    # a request the worker cannot serve is a BackendError, and the worker lives on
    epoch = neon.epoch
    with pytest.raises(BackendError, match="no such model handle"):
        neon._call("forward", "forward", 9999, np.array([1], np.int32), 0)
    with pytest.raises(BackendError, match="no such tokenizer handle"):
        neon._call("tok_encode", "tok_encode", 1, b"abc")
    try:  # tok_check: tok_load, then tok_free
        assert not neon.load_tokenizer(str(MODEL)).ok  # a model is not a tokenizer
    except Unsupported as e:  # no native tokenizer yet: its reason
        assert "tokenizer" in str(e)
    s.close()
    with pytest.raises(BackendError, match="no such model handle"):  # freed in the worker
        neon._call("reset", "reset", s.handle)
    assert neon.epoch == epoch and neon._worker.alive()
    q, d16 = neon.quantize_q8_0(np.linspace(-3, 3, 96, dtype=np.float32), f16=True)
    assert q.shape == (96,) and d16.dtype == np.float16 and d16.shape == (3,)


def test_the_worker_is_rebuilt_when_a_source_is_newer(tools, monkeypatch, tmp_path):
    source = tmp_path / "stand-in.c"  # stands for src/*.c: the real sources are not touched
    source.write_text("", encoding="utf-8")
    monkeypatch.setattr(qemu, "build_dir", lambda: tmp_path / "build")
    monkeypatch.setattr(qemu, "_sources", lambda: [source])
    (tmp_path / "build").mkdir()
    exe = qemu.worker_executable()
    first = exe.stat().st_mtime_ns
    assert qemu.worker_executable() == exe and exe.stat().st_mtime_ns == first  # up to date
    later = time.time() + 10
    os.utime(source, (later, later))
    qemu.worker_executable()
    assert exe.stat().st_mtime_ns != first
    assert not [p for p in exe.parent.iterdir() if p.name not in (exe.name, ".lock")]  # no leftovers
    assert Path(qemu.command(exe)[-1]) == exe
