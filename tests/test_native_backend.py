"""The native and lib:PATH backends: worker isolation (a segfault and a hang become outcomes and the
run goes on), capabilities from the exported symbols, the cffi declarations against mlrt.h, and
the native runtime against the spec on the header, loader and quant cases."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlconf import cases, runner
from mlconf.backends import BackendError, InputError, WorkerCrash, builtin_names, get
from mlconf.backends.native import LIBRARY, abi
from mlconf.cases import Case
from mlconf.fixtures import Fixture
from mlconf.golden import GOLDEN_DIR

ROOT = Path(__file__).resolve().parents[1]
CRASH_C = ROOT / "examples" / "crash" / "crash.c"
HEADER = ROOT / "backends" / "native" / "include" / "mlrt.h"
X86 = platform.machine() in ("x86_64", "AMD64")


def _compile(out: Path, *defines: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test library")
    cmd = [
        "gcc",
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-shared",
        "-fPIC",
        *defines,
        "-I",
        str(HEADER.parent),
        str(CRASH_C),
        "-o",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("libs")
    return {
        "crash": _compile(d / "libbroken.so"),
        "tok": _compile(d / "libbroken_tok.so", "-DWITH_TOKENIZER"),
    }


def _isolation_case(name: str) -> Case:
    """A loader case whose file name makes examples/crash/crash.c segfault or hang."""
    fx = Fixture(file=f"isolation/{name}.mlb", kind="malformed", expected="ML_E_FORMAT", rule="isolation")
    return Case(
        f"loader/isolation/{name}",
        "loader",
        "load",
        "tests/test_native_backend.py",
        "status",
        {"fixture": fx},
        "ML_E_FORMAT",
    )


def test_crash_and_hang_become_outcomes_and_the_run_goes_on(libs, tmp_path):
    b = get(f"lib:{libs['crash']}")
    b.timeout = 10  # the hang waits this out; the other cases must finish within it on a loaded machine
    loader = cases.collect(["loader", "header"], "format.magic or io.open or format.version or q8_min")
    sel = [loader[0], _isolation_case("crash"), *loader[1:4], _isolation_case("hang"), *loader[4:]]
    work = runner.Workdir(tmp_path / "work")
    try:
        results = runner.run(sel, [b], work)
    finally:
        work.close()
    by = {r.case: r for r in results}
    crash = by.pop("loader/isolation/crash")
    assert crash.outcome == "crash", crash
    assert crash.detail.startswith("worker killed by SIGSEGV during load(") and "crash.mlb" in crash.detail
    hang = by.pop("loader/isolation/hang")
    assert hang.outcome == "timeout" and "after 10 s during load(" in hang.detail, hang
    # crash.c checks the magic only: the magic, missing-file and valid cases pass, a bad version fails.
    assert len(by) == len(loader) and {r.outcome for r in by.values()} == {"pass", "fail"}
    for r in by.values():
        if "format.magic" in r.case or "io.open" in r.case or r.area == "header":
            assert r.outcome == "pass", r
        if "format.version" in r.case:
            assert r.outcome == "fail" and r.got == "ML_OK", r
    assert b.epoch == 3  # the first worker, one after the crash, one after the timeout
    from mlconf.cli import summary_table

    assert summary_table(results).splitlines()[0].split()[-3:] == ["crash", "timeout", "total"]


def test_capabilities_follow_the_exported_symbols(libs, tmp_path):
    b = get(f"lib:{libs['crash']}")
    assert b.capabilities == {"load"}
    t = get(f"lib:{libs['tok']}")
    assert t.capabilities == {"load", "load_tokenizer"}
    work = runner.Workdir(tmp_path / "work")
    try:
        q8 = next(c for c in cases.collect(["quant"]) if c.capability == "quantize_q8_0")
        r = runner.run_case(q8, b, work)
        assert r.outcome == "unsupported" and "does not export ml_quantize_q8_0" in r.detail
        fwd = cases.collect(["forward"])[0]
        r = runner.run_case(fwd, t, work)
        assert r.outcome == "unsupported" and "ml_load" in r.detail
        tok = next(c for c in cases.collect(["tokenizer"]) if c.capability == "load_tokenizer")
        r = runner.run_case(tok, t, work)  # ml_tok_load returns ML_E_UNSUPPORTED with a reason
        assert r.outcome == "unsupported" and "has no tokenizer" in r.detail, r
    finally:
        work.close()


def test_lib_paths_are_relative_to_cwd_and_checked(libs, monkeypatch):
    monkeypatch.chdir(libs["crash"].parent)
    assert get(f"lib:./{libs['crash'].name}").capabilities == {"load"}
    with pytest.raises(BackendError, match="not a file"):
        get("lib:./no-such-library.so")
    with pytest.raises(BackendError, match="cannot load the library"):
        get(f"lib:{CRASH_C}")  # not a shared object


def test_file_paths_are_relative_to_the_callers_cwd(tmp_path, monkeypatch):
    """The worker starts in one directory and the caller moves on (a spare worker, a chdir): a
    relative path still names the caller's file, and the reason names it as it was given."""
    b = get("native")
    try:
        b.load(str(GOLDEN_DIR / "logits" / "llama.mlb"))  # the worker is up, in this cwd
        shutil.copy(GOLDEN_DIR / "logits" / "llama.mlb", tmp_path / "m.mlb")
        (tmp_path / "e.mlb").write_bytes(b"")
        monkeypatch.chdir(tmp_path)
        assert b.load("m.mlb").ok
        assert b.open_model("m.mlb").forward(np.array([1]), 0).shape[0] == 1
        got = b.load("e.mlb")
        assert got.status == "ML_E_FORMAT" and got.reason.startswith("e.mlb:"), got
    finally:
        b.close()


def test_the_tables_this_machine_runs_can_be_forced():
    """`mlconf backends` names the kernel tables the library runs here (the worker asks ml_set_isa);
    native:ISA runs on exactly that one."""
    b = get("native")
    try:
        assert "scalar" in b.tables and b.isa in b.tables, b.tables
        assert "runs " + " ".join(b.tables) in b.description
    finally:
        b.close()
    for isa in b.tables:
        forced = get(f"native:{isa}")
        try:
            assert forced.isa == isa and forced.capabilities, (isa, forced.description)
        finally:
            forced.close()


def test_timeout_setting(libs, monkeypatch):
    monkeypatch.setenv("MLCONF_WORKER_TIMEOUT", "7.5")
    assert get(f"lib:{libs['crash']}").timeout == 7.5
    monkeypatch.setenv("MLCONF_WORKER_TIMEOUT", "soon")
    with pytest.raises(BackendError, match="MLCONF_WORKER_TIMEOUT"):
        get(f"lib:{libs['crash']}")


def _prototypes(text: str) -> set[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = " ".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    found = re.findall(r"[A-Za-z_][\w \*]*?\bml_\w+\s*\([^;{}]*\)\s*;", text)
    return {re.sub(r"\s+", " ", p).replace("( ", "(").replace(" *", " *").strip() for p in found}


def test_cdef_declares_the_header():
    header, cdef = _prototypes(HEADER.read_text(encoding="utf-8")), _prototypes(abi.CDEF)
    assert header == cdef, f"only in mlrt.h: {header - cdef}; only in abi.CDEF: {cdef - header}"
    names = {re.search(r"\b(ml_\w+)\s*\(", p).group(1) for p in header}
    assert names == set(abi.FUNCTIONS)
    for code, name in abi.STATUS_NAMES.items():
        assert re.search(rf"#define {name} {code}\b", HEADER.read_text(encoding="utf-8")), name


# ---------------------------------------------------------------- the native runtime itself
@pytest.fixture(scope="module")
def native():
    if not LIBRARY.exists():
        pytest.fail(
            f"{LIBRARY} is not built: pip install . builds it; python backends/native/build.py rebuilds it"
        )
    return get("native")


def test_native_is_built_in_and_listed(native):
    assert "native" in builtin_names()
    assert {"load", "quantize_q8_0", "forward"} <= native.capabilities
    r = subprocess.run(
        [sys.executable, "-m", "mlconf.cli", "backends"], capture_output=True, encoding="utf-8", timeout=120
    )
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("native "))
    assert row.split()[1:3] == ["yes", "yes"]  # load, quantize_q8_0
    assert f"ISA {native.isa}" in r.stdout


@pytest.mark.parametrize("which", ["native", "lib"])
def test_native_passes_header_loader_quant_like_the_reference(native, which):
    b = native if which == "native" else get(f"lib:{LIBRARY}")
    results = runner.run(cases.collect(["header", "loader", "quant"]), [b])
    bad = [
        f"{r.outcome} {r.case}: {r.detail}"
        for r in results
        if not (r.outcome == "pass" or (r.outcome == "unsupported" and "q4_0" in r.case))
    ]
    assert not bad, f"{len(bad)} of {len(results)}:\n" + "\n".join(bad[:40])


def test_every_runnable_isa_quantizes_bit_exactly():
    for isa in ("scalar", "avx2"):
        b = get(f"native:{isa}")
        if not b.capabilities:
            assert not X86 or isa != "scalar", b.description
            continue
        assert b.isa == isa
        results = runner.run(cases.collect(["quant"], "q8_0"), [b])
        bad = [r for r in results if r.outcome != "pass"]
        assert results and not bad, bad


@pytest.mark.skipif(not X86, reason="neon runs natively on aarch64")
def test_neon_is_unsupported_on_x86_with_the_reason(tmp_path, monkeypatch):
    # native:neon runs under qemu-user (tests/test_native_neon.py); without qemu it is unsupported
    monkeypatch.setattr("mlconf.backends.native.qemu.QEMU", "qemu-aarch64-not-installed")
    b = get("native:neon")
    assert b.capabilities == frozenset()
    work = runner.Workdir(tmp_path / "work")
    try:
        r = runner.run_case(cases.collect(["loader"])[0], b, work)
    finally:
        work.close()
    assert r.outcome == "unsupported"
    assert "ISA neon is not available" in r.detail and platform.machine() in r.detail, r.detail


def test_model_sessions(native):
    model = GOLDEN_DIR / "logits" / "qwen2_bias.mlb"
    with pytest.raises(InputError, match="ML_E_IO"):
        native.open_model(str(model.with_name("absent.mlb")))
    s = native.open_model(str(model), ctx=8)
    logits = s.forward(np.array([1, 2, 3]), 0)
    assert logits.shape == (3, s.vocab) and logits.dtype == np.float32 and np.isfinite(logits).all()
    s.reset()
    again = np.concatenate([s.forward(np.array([t]), i) for i, t in enumerate([1, 2, 3])])
    np.testing.assert_allclose(again, logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(InputError, match="ML_E_ARG"):
        s.forward(np.array([s.vocab]), 3)  # a token outside the vocabulary
    with pytest.raises(InputError, match="ML_E_ARG"):
        s.forward(np.array([1] * 6), 3)  # beyond ctx 8
    native.close()  # the worker ends: the session is gone
    with pytest.raises(BackendError, match="worker that held it has ended"):
        s.forward(np.array([1]), 3)
    s.close()  # never raises, even then
    assert native.load(str(model)).ok  # a fresh worker


def test_quantizer_refusals_name_the_problem(native):
    x = np.zeros(32, dtype=np.float32)
    x[3] = np.nan
    with pytest.raises(ValueError, match="non-finite value nan at flat index 3"):
        native.quantize_q8_0(x, f16=False)
    with pytest.raises(ValueError, match="above 65504"):
        native.quantize_q8_0(np.full(32, 1e7, dtype=np.float32), f16=True)
    q, d = native.quantize_q8_0(np.ones((2, 64), dtype=np.float32), f16=True)
    assert q.shape == (2, 64) and q.dtype == np.int8 and d.shape == (2, 2) and d.dtype == np.float16


def test_worker_crash_is_a_distinct_exception(libs):
    b = get(f"lib:{libs['crash']}")
    with pytest.raises(WorkerCrash, match="SIGSEGV"):
        b.load("/nonexistent/crash.mlb")
    assert b.load("/nonexistent/x.mlb").status == "ML_E_IO"  # the next call starts a fresh worker


@pytest.mark.slow
def test_a_sanitized_library_reports_the_sanitizer_summary(tmp_path):
    """build.py --sanitize output runs under lib:PATH: the worker preloads the ASan runtime."""
    try:
        lib = _compile(tmp_path / "libbroken_asan.so", "-O1", "-g", "-fsanitize=address,undefined")
    except AssertionError as e:
        pytest.skip(f"no sanitizer runtime: {e}")
    b = get(f"lib:{lib}")
    assert b.load("/nonexistent/x.mlb").status == "ML_E_IO"
    with pytest.raises(WorkerCrash, match=r"SUMMARY: AddressSanitizer: SEGV .*crash\.c:\d+ in ml_check"):
        b.load("/nonexistent/crash.mlb")
