"""The bitnet backend (libmlbitnet.so through the native backend's LibraryBackend and worker) against
the reference backend on the same inputs: I2_S packing, int8 activations and the BitLinear matmul
bit for bit on every ISA this machine runs, refusals, BitNet GGUF embeddings within
specs/tolerances.yaml, and the worker isolation (a crash or a timeout is an outcome, the next call
starts a fresh worker). Also the reference backend's own I2_S and embed methods."""

from __future__ import annotations

import os
import platform
import signal
from pathlib import Path

import numpy as np
import pytest

from mlconf import cases, runner
from mlconf.areas.bitnet import damage_gguf
from mlconf.backends import BackendError, InputError, WorkerCrash, WorkerTimeout, builtin_names, get, native
from mlconf.backends.bitnet import LIBRARY, bitnet_backend
from mlconf.backends.native import abi, stale_sources
from mlconf.backends.reference import ReferenceBackend
from mlconf.compare import embedding_distances, within

X86 = platform.machine() in ("x86_64", "AMD64")
REF = ReferenceBackend()
BITNET = cases.BITNET_DIR


def _open(name: str):
    if not LIBRARY.exists():
        pytest.fail(f"{LIBRARY} is not built: `python backends/native/build.py --all` builds it")
    return get(name)


@pytest.fixture(scope="module")
def bitnet():
    b = _open("bitnet")
    yield b
    b.close()


def _isa_backends() -> list[str]:
    simd = [f"bitnet:{i}" for i in ("avx2", "avxvnni", "avx512")] if X86 else []
    return ["bitnet", "bitnet:scalar", *simd]


@pytest.fixture(scope="module", params=_isa_backends())
def each_isa(request):
    b = _open(request.param)
    if not b.capabilities:
        pytest.skip(f"{request.param}: {b.description}")
    yield b
    b.close()


# ---------------------------------------------------------------- capabilities and names
def test_capabilities_come_from_the_exported_symbols(bitnet):
    have = ("i2s", "embed", "load_gguf")
    assert bitnet.capabilities == set(have), {c: bitnet.unsupported.get(c) for c in have}
    assert {s for c in have for s in abi.CAPABILITY_SYMBOLS[c]} | {"ml_embed_check_rule"} <= bitnet.symbols
    for c in ("load", "forward", "encode", "quantize_q8_0"):
        assert "does not export" in bitnet.unsupported[c]
    assert bitnet.version.startswith("mlbitnet")
    assert bitnet.isa in ("scalar", "avx2", "avxvnni", "avx512", "neon")


def test_names_and_registry(bitnet):
    assert "bitnet" in builtin_names()
    with pytest.raises(BackendError, match="unknown backend 'bitnet:neon2'"):
        get("bitnet:neon2")
    with pytest.raises(BackendError, match="unknown ISA 'neon2'"):
        bitnet_backend("bitnet:neon2")
    scalar = _open("bitnet:scalar")
    try:
        assert scalar.isa == "scalar" and "i2s" in scalar.capabilities
    finally:
        scalar.close()


@pytest.mark.skipif(
    not (Path(native.HERE).parents[1] / "pyproject.toml").exists(),
    reason="an installed package: stale_sources checks source trees only",
)
def test_stale_sources_takes_a_library(tmp_path):
    lib, src = tmp_path / "lib.so", tmp_path / "a.c"
    src.write_text("", encoding="utf-8")
    lib.write_bytes(b"")
    os.utime(src, (1e9, 1e9))
    assert stale_sources(lib, [src]) == []
    os.utime(src, (4e9, 4e9))
    assert stale_sources(lib, [src, tmp_path / "gone.c"]) == ["a.c"]


# ---------------------------------------------------------------- I2_S against the reference
SHAPES = [(1, 128, 1), (2, 256, 3), (7, 384, 4), (31, 640, 2), (64, 1024, 5), (3, 4096, 1)]


@pytest.mark.parametrize("rows, cols, n", SHAPES)
def test_i2s_bit_exact_against_the_reference(each_isa, rows, cols, n):
    rng = np.random.default_rng(rows * 7 + cols)
    w = (rng.standard_normal((rows, cols)) * 0.3).astype(np.float32)
    w[rng.random((rows, cols)) < 0.1] = 0.0
    x = (rng.standard_normal((n, cols)) * 4).astype(np.float32)
    x[0, :8] = [127, 2.5, -2.5, 0.5, -0.5, 126.5, 1.5, -127]  # amax 127, scale 1: ties away from zero
    x[-1, 3:6] = [0.0, 1e-30, -3e38] if n > 1 else x[-1, 3:6]  # an amax that dwarfs the rest
    payload = each_isa.i2s_quantize(w)
    assert isinstance(payload, bytes) and payload == REF.i2s_quantize(w)
    for got, want in zip(each_isa.i2s_quantize_act(x), REF.i2s_quantize_act(x), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
    y = each_isa.i2s_matmul(payload, (rows, cols), x)
    assert y.dtype == np.float32 and y.shape == (n, rows)
    assert y.tobytes() == REF.i2s_matmul(payload, (rows, cols), x).tobytes()


def test_i2s_one_row_float16_and_zero_rows(bitnet):
    w16 = np.linspace(-2, 2, 256).astype(np.float16)
    assert bitnet.i2s_quantize(w16) == REF.i2s_quantize(w16) == REF.i2s_quantize(w16.astype(np.float32))
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    q, s, total = bitnet.i2s_quantize_act(x)
    assert q.shape == (256,) and s.shape == () and total.shape == ()
    assert bitnet.i2s_matmul(bitnet.i2s_quantize(w16), (1, 256), x).shape == (1,)
    z = np.zeros((4, 128), dtype=np.float32)
    p = bitnet.i2s_quantize(z)
    assert p[:128] == b"\x55" * 128  # all code 1
    assert p[128:] == np.float32(1e-5).tobytes() + bytes(28)  # d = the mean's floor
    assert not bitnet.i2s_matmul(p, (4, 128), z[:2]).any()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda b: b.i2s_quantize(np.ones((1, 64), np.float32)), "row length 64"),
        (lambda b: b.i2s_quantize(np.ones((2, 130), np.float32)), "row length 130"),
        (lambda b: b.i2s_quantize(np.ones((0, 128), np.float32)), "rows"),
        (lambda b: b.i2s_quantize(np.ones((1, 128), np.float64)), "float32 or float16"),
        (lambda b: b.i2s_quantize(np.ones((1, 1, 128), np.float32)), "1-D or 2-D"),
        (
            lambda b: b.i2s_quantize(
                np.where(np.arange(256) == 200, np.inf, 1).astype(np.float32).reshape(2, 128)
            ),
            "row 1, column 72",
        ),
        (lambda b: b.i2s_quantize_act(np.full((1, 128), np.nan, np.float32)), "non-finite"),
        (lambda b: b.i2s_quantize_act(np.ones((1, 100), np.float32)), "row length 100"),
        (lambda b: b.i2s_quantize_act(np.ones((1, 128), np.float64)), "float32"),
        (lambda b: b.i2s_matmul(bytes(63), (1, 128), np.ones((1, 128), np.float32)), "payload is 63 bytes"),
        (lambda b: b.i2s_matmul(bytes(64), (1, 128), np.ones((1, 256), np.float32)), "width 256"),
    ],
)
def test_i2s_refusals_name_the_problem(bitnet, call, match):
    with pytest.raises(ValueError, match=match):
        call(bitnet)
    with pytest.raises(ValueError):
        call(REF)


def test_i2s_code3_is_refused_with_its_place(bitnet):
    payload = bytearray(REF.i2s_quantize(np.ones((2, 256), np.float32)))
    payload[33] |= 0x0C  # byte 33 = block 0 byte 1... element 1 + 64 of block 1
    x = np.ones((1, 256), np.float32)
    with pytest.raises(ValueError, match=r"ML_E_FORMAT.*code 3 at element 193 \(row 0, column 193"):
        bitnet.i2s_matmul(bytes(payload), (2, 256), x)
    with pytest.raises(ValueError, match="code 3 at element 193"):
        REF.i2s_matmul(bytes(payload), (2, 256), x)


# ---------------------------------------------------------------- the suite's bitnet area
def test_bitnet_area_passes_on_the_i2s_cases(bitnet, tmp_path):
    sel = [c for c in cases.collect(["bitnet"]) if c.capability == "i2s"]
    work = runner.Workdir(tmp_path / "work")
    try:
        results = runner.run(sel, [bitnet], work)
    finally:
        work.close()
    bad = [(r.case, r.outcome, r.detail) for r in results if r.outcome != "pass"]
    assert not bad
    assert len(results) == len(sel)  # nothing skipped: the reference is not this backend


def test_bit_exact_failures_say_where(tmp_path):
    class Off(ReferenceBackend):
        name = "off"

        def i2s_quantize(self, w):
            p = bytearray(super().i2s_quantize(w))
            p[1] ^= 0x30  # element 33: bits 5..4 of byte 1
            return bytes(p)

        def i2s_quantize_act(self, x):
            q, s, t = super().i2s_quantize_act(x)
            return q, s * np.float32(2), t

        def i2s_matmul(self, payload, shape, x):
            y = super().i2s_matmul(payload, shape, x).copy()
            y.reshape(-1)[-1] += 1
            return y

    sel = {c.id: c for c in cases.collect(["bitnet"], "element_positions or activation_zero_row or one_row")}
    work = runner.Workdir(tmp_path / "w")
    try:
        by = {r.case: r for r in runner.run(list(sel.values()), [Off()], work)}
    finally:
        work.close()
    r = by["bitnet/i2s_pack/element_positions"]
    assert r.outcome == "fail"
    assert "first at packed byte 1 (block 0, byte 1: elements [1, 33, 65, 97]" in r.detail
    assert "codes got [1, 1, 1, 1] expected [1, 2, 1, 1]" in r.detail, r.detail
    r = by["bitnet/i2s_act/activation_zero_row"]
    assert r.outcome == "fail"
    want = "scale: 1 of 1 elements differ, first at [0]: got 25400000.0 expected 12700000.0"
    assert r.detail.startswith(want), r.detail
    r = by["bitnet/i2s_matmul/bitlinear_one_row"]
    assert r.outcome == "fail" and "y: 1 of 1 elements differ" in r.detail and "sumi 147" in r.detail


# ---------------------------------------------------------------- embeddings
GOLDENS = cases.bitnet_goldens()


def test_the_embedding_goldens_are_there():
    assert GOLDENS, "golden/bitnet has no NAME.gguf with NAME.npz (tools/golden_bitnet.py writes them)"


@pytest.mark.parametrize("name", GOLDENS)
def test_embed_against_the_reference(bitnet, name):
    path = str(BITNET / f"{name}.gguf")
    g = np.load(BITNET / f"{name}.npz")
    ours, ref = bitnet.open_embedder(path), REF.open_embedder(path)
    try:
        assert (ours.dim, ours.vocab) == (ref.dim, ref.vocab)
        for i in range(3):
            toks = g[f"tokens_{i}"]
            for pooling in (None, "mean", "cls", "last"):
                for normalize in (False, True):
                    got = ours.embed(toks, pooling, normalize)
                    assert got.dtype == np.float32 and got.shape == (ours.dim,)
                    d = embedding_distances(got, ref.embed(toks, pooling, normalize))
                    ok, over = within("embeddings_runtime_vs_reference", d)
                    assert ok, (name, i, pooling, normalize, over)
        for bad, pooling in (([], "mean"), ([0, ours.vocab], "mean"), ([-1], "cls"), ([1], "max")):
            with pytest.raises(InputError):
                ours.embed(np.array(bad, dtype=np.int64), pooling, False)
        with pytest.raises(InputError, match=f"token {ours.vocab} at index 1 is outside"):
            ours.embed(np.array([0, ours.vocab]), "mean", False)
    finally:
        ours.close()
    with pytest.raises(BackendError, match="used after close"):
        ours.embed(np.array([1]), None, False)


def test_embed_refuses_damaged_files(bitnet, tmp_path):
    src = BITNET / f"{GOLDENS[0]}.gguf"
    for kind in cases.GGUF_DAMAGE:
        dst = tmp_path / f"{kind}.gguf"
        try:
            damage_gguf(src, dst, kind)
        except ValueError:
            continue  # e.g. no I2_S tensor for code3
        with pytest.raises(InputError, match="ml_embed_load returned ML_E_"):
            bitnet.open_embedder(str(dst))
        with pytest.raises(InputError):
            REF.open_embedder(str(dst))
    with pytest.raises(InputError, match="ML_E_IO"):
        bitnet.open_embedder(str(tmp_path / "missing.gguf"))


# ---------------------------------------------------------------- isolation
def test_crash_and_timeout_are_outcomes_and_the_next_call_works(tmp_path):
    b = _open("bitnet")
    try:
        epoch = b.epoch
        x = np.ones((1, 128), np.float32)
        with pytest.raises(WorkerCrash, match=r"worker killed by SIGSEGV during i2s_matmul\(lying"):
            _lying_matmul(b)
        assert b.i2s_quantize(x) == REF.i2s_quantize(x) and b.epoch == epoch + 1
        session = b.open_embedder(str(BITNET / f"{GOLDENS[0]}.gguf"))
        b.timeout = 0.5
        os.kill(b._worker.proc.pid, signal.SIGSTOP)  # a hang
        with pytest.raises(WorkerTimeout, match=r"worker timed out after 0.5 s during i2s_matmul\(payload"):
            b.i2s_matmul(REF.i2s_quantize(x), x.shape, x)
        b.timeout = 60
        assert b.i2s_quantize(x) == REF.i2s_quantize(x) and b.epoch == epoch + 2
        with pytest.raises(BackendError, match="worker that held it has ended"):
            session.embed(np.array([1, 2]), None, False)
        session.close()  # nothing to free in a dead worker: no error
        os.kill(b._worker.proc.pid, signal.SIGKILL)
        b._worker.proc.wait()
        assert b.i2s_quantize(x) == REF.i2s_quantize(x) and b.epoch == epoch + 3
    finally:
        b.close()


def _lying_matmul(b):
    """ml_i2s_matmul told of 2^24 rows of a one-row payload: it reads the scale 512 MiB past the
    buffer, so the worker dies of SIGSEGV."""
    payload = np.frombuffer(REF.i2s_quantize(np.ones((1, 128), np.float32)), dtype=np.uint8)
    return b._call(
        "i2s_matmul(lying about rows)", "i2s_matmul", payload, 1 << 24, 128, np.ones((1, 128), np.float32), 1
    )


def test_a_crash_in_the_suite_is_a_crash_outcome(tmp_path, monkeypatch):
    b = _open("bitnet")
    case = next(c for c in cases.collect(["bitnet"]) if c.id == "bitnet/i2s_matmul/bitlinear_one_row")
    real = b._call

    def lying(desc, op, *args):
        if op == "i2s_matmul":
            args = (args[0], 1 << 24, *args[2:])
        return real(desc, op, *args)

    monkeypatch.setattr(b, "_call", lying)
    work = runner.Workdir(tmp_path / "w")
    try:
        r = runner.run_case(case, b, work)
        assert r.outcome == "crash" and "SIGSEGV during i2s_matmul(payload[64], (1, 128)" in r.detail, r
        monkeypatch.setattr(b, "_call", real)
        assert runner.run_case(case, b, work).outcome == "pass"
    finally:
        work.close()
        b.close()


# ---------------------------------------------------------------- the reference backend's own methods
def test_reference_i2s_shapes_and_refusals():
    x = np.linspace(-3, 3, 3 * 256, dtype=np.float32).reshape(3, 256)
    q, s, total = REF.i2s_quantize_act(x)
    assert (q.shape, s.shape, total.shape) == ((3, 256), (3,), (3,))
    assert (q.dtype, s.dtype, total.dtype) == (np.int8, np.float32, np.int32)
    assert np.array_equal(total, q.astype(np.int64).sum(axis=1))
    with pytest.raises(ValueError, match="payload is 95 bytes"):
        REF.i2s_matmul(bytes(95), (1, 256), x)


def test_reference_embedder_refusals(tmp_path):
    with pytest.raises(InputError, match="missing.gguf"):
        REF.open_embedder(str(tmp_path / "missing.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(10))
    with pytest.raises(InputError, match="junk.gguf"):
        REF.open_embedder(str(tmp_path / "junk.gguf"))
