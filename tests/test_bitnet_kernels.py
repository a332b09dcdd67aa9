"""The bitnet runtime's I2_S kernels and API (backends/bitnet/src) against the NumPy reference
(mlconf.backends.reference.i2s, specs/i2s.yaml): bit for bit, on every ISA.

The library is built once with backends/native/build.py (lib="mlbitnet") and loaded with cffi
(ABI mode). The test-only entry point mlbitnet_test_kernel (src/testhooks.c) runs one kernel of
one ISA, so every table runnable here (scalar, avx2 on x86-64) is compared with the reference:
- quantize_act: int8 bytes, scale bits and sum equal quantize_activations (round half away from
  zero) on seeded rows of several kinds: exact .5 ties after scaling and their neighbours, t at
  +-127, all-zero rows, huge, tiny and subnormal magnitudes, random bit patterns, any length;
- dot_rows2x8 (two weight rows, eight activation rows: the prefill tile, where the table has it);
- dot, dot4 (one weight row, four activation rows), dot_rows4 (four weight rows, one activation
  row): the exact int32 sums of int_dot on the 2-bit codes, for any bytes (code 3 too) and any
  int8 (-128 too), lengths 128..4096;
- ml_i2s_quantize: the reference payload byte for byte (random tensors, the spec's edge cases,
  +-0.5 / 1.5 ties of w * s, a tensor whose float mean depends on the float64 summation order,
  which NumPy does pairwise); ml_i2s_quantize_act / ml_i2s_matmul: bit-identical to
  quantize_activations / bitlinear, under every ISA (ml_set_isa); the refusals of mlrt.h;
- the prefill's element-wise kernels (epilogue, act_mul, norm_mul) and attention's att_scores,
  att_softmax and att_pv: the header's formulas bit for bit on every ISA (fmaf transcribed exactly
  in float64 with round-to-odd), and the activations' exp / SiLU / GELU against float64;
- the tiled attention (attn.c) against float64 softmax attention, causal and windowed, on every
  ISA with identical bits, across tile boundaries, GQA and head widths that are not a multiple
  of the SIMD tiles.
NEON: backends/bitnet/tests/i2s_main.c cross-compiled for aarch64 (-static) runs the neon and
scalar tables and the API under qemu-aarch64 -cpu max on the same inputs, compared with the
reference here (skipped when aarch64-linux-gnu-gcc or qemu-aarch64 is missing); the same driver
runs natively under AddressSanitizer + UBSan.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlconf import specs
from mlconf.backends.reference import i2s
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import golden

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "backends" / "native"
BITNET = ROOT / "backends" / "bitnet"
SRC = BITNET / "src"
ML_OK, ML_E_FORMAT, ML_E_ARG, ML_E_UNSUPPORTED = 0, 2, 4, 6
MACHINE = platform.machine()
X86 = MACHINE in ("x86_64", "AMD64")
ARM = MACHINE in ("aarch64", "arm64")
X86_TABLES = ["avx2", "avxvnni", "avx512"]  # src/i2s_<name>.c with build.py's flags, worst to best
ISAS = ["scalar"] + (X86_TABLES if X86 else []) + (["neon"] if ARM else [])
F32 = np.float32
F32_MAX = float.fromhex("0x1.fffffep+127")
SPEC = specs.load("i2s")
CDEF = """
int mlbitnet_test_kernel(const char *isa, const char *op, int n, const void *a, const void *b, void *out);
double mlbitnet_bench_matvec(const char *isa, int rows, int cols, int threads, int iters, int cold);
const char *ml_isa(void);
int ml_set_isa(const char *isa);
int ml_i2s_quantize(const void *w, size_t rows, size_t cols, void *payload);
int ml_i2s_quantize_act(const void *x, size_t rows, size_t cols, void *q, void *scale, void *sum);
int ml_i2s_matmul(const void *payload, size_t rows, size_t cols, const void *x, size_t n, void *y);
"""  # the I2_S group of mlrt.h with its pointers as void * (the same ABI): cffi takes from_buffer


def _load_build_module():
    spec = importlib.util.spec_from_file_location("mlrt_native_build", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Lib:
    """The library's entry points with NumPy arrays in and out."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    def _buf(self, a):
        return self.ffi.NULL if a is None else self.ffi.from_buffer(a)

    def kernel(self, isa, op, n, a, b=None, out_bytes=16, fill=0):
        out = np.full(max(out_bytes, 16), fill, np.uint8)
        a = None if a is None else np.ascontiguousarray(a)
        b = None if b is None else np.ascontiguousarray(b)
        rc = self.lib.mlbitnet_test_kernel(
            isa.encode(), op.encode(), n, self._buf(a), self._buf(b), self.ffi.from_buffer(out)
        )
        return rc, out

    def runnable(self, isa):
        return self.kernel(isa, "quantize_act", 1, np.zeros(1, F32))[0] == ML_OK

    def quantize_act(self, isa, x):
        x = np.ascontiguousarray(x, F32)
        n = x.size
        rc, out = self.kernel(isa, "quantize_act", n, x, out_bytes=n + 8)
        assert rc == ML_OK
        scale, total = out[n : n + 4].view(F32)[0], int(out[n + 4 : n + 8].view(np.int32)[0])
        return out[:n].view(np.int8).copy(), scale, total

    def dot(self, isa, op, n, w, x):
        rc, out = self.kernel(isa, op, n, np.ascontiguousarray(w, np.uint8), np.ascontiguousarray(x, np.int8))
        assert rc == ML_OK
        return out[: 4 if op == "dot" else 16].view(np.int32).copy()

    def quantize(self, w):
        """(status, payload bytes) of ml_i2s_quantize on a 2-D float32 array."""
        w = np.ascontiguousarray(w, F32)
        rows, cols = w.shape
        out = np.zeros(max(rows * cols // 4 + 32, 1), np.uint8)
        rc = self.lib.ml_i2s_quantize(self._buf(w), rows, cols, self.ffi.from_buffer(out))
        return rc, out.tobytes()

    def quantize_rows(self, x):
        x = np.ascontiguousarray(x, F32)
        rows, cols = x.shape
        q = np.zeros((rows, cols), np.int8)
        s = np.zeros(max(rows, 1), F32)
        n = np.zeros(max(rows, 1), np.int32)
        rc = self.lib.ml_i2s_quantize_act(
            self._buf(x),
            rows,
            cols,
            self.ffi.from_buffer(q),
            self.ffi.from_buffer(s),
            self.ffi.from_buffer(n),
        )
        return rc, q, s[:rows], n[:rows]

    def matmul(self, payload, rows, cols, x):
        x = np.ascontiguousarray(x, F32)
        y = np.full((max(x.shape[0], 1), max(rows, 1)), np.nan, F32)
        p = np.frombuffer(payload, np.uint8)
        rc = self.lib.ml_i2s_matmul(
            self._buf(p), rows, cols, self._buf(x), x.shape[0], self.ffi.from_buffer(y)
        )
        return rc, y[: x.shape[0], :rows]

    def isa_now(self):
        return self.ffi.string(self.lib.ml_isa()).decode()


@pytest.fixture(scope="session")
def lib(tmp_path_factory) -> Lib:
    cffi = pytest.importorskip("cffi")
    build = _load_build_module()
    # a BuildError fails the tests
    so = build.build(tmp_path_factory.mktemp("mlbitnet") / "libmlbitnet.so", lib="mlbitnet")
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return Lib(ffi, ffi.dlopen(str(so)))


@pytest.fixture(params=ISAS)
def isa(request, lib) -> str:
    if not lib.runnable(request.param):
        pytest.skip(f"{request.param} kernels are not runnable on this CPU")
    return request.param


@pytest.fixture
def using(lib, isa):
    """The API under table `isa` (ml_set_isa), restored afterwards."""
    before = lib.isa_now()
    assert lib.lib.ml_set_isa(isa.encode()) == ML_OK
    yield isa
    assert lib.lib.ml_set_isa(before.encode()) == ML_OK


# ---------------------------------------------------------------- inputs
def _bits_f32(rng, shape) -> np.ndarray:
    """Random finite float32 bit patterns (every exponent, subnormals, +-0)."""
    bits = rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    bits = np.where((bits & 0x7F800000) == 0x7F800000, bits & 0xBFFFFFFF, bits)
    return bits.view(F32)


def activation_rows(seed: int) -> list[np.ndarray]:
    """Rows (any length 1..4096) where a wrong rounding, an FMA or a bad amax shows."""
    rng = np.random.default_rng(seed)
    h = float.fromhex
    rows: list[np.ndarray] = []
    lengths = [1, 7, 31, 33, 128, 131, 256, 640, 1000, 4096]
    for n in lengths:
        rows.append(np.zeros(n, F32))  # all zero: a = 12700000
        rows.append(np.full(n, -0.0, F32))
        rows.append((rng.standard_normal(n) * np.exp2(rng.integers(-20, 20))).astype(F32))
        rows.append(_bits_f32(rng, n))  # huge and tiny at once
        rows.append((rng.integers(-254, 255, n) / 2.0).astype(F32))  # halves; amax 127 -> a = 1
    # t = x * a exactly k + 0.5 (a = 1: amax = 127; a = 2^e: amax = 127 * 2^-e), both signs
    for e in (-60, -3, 0, 5, 40):
        n = 256
        x = (rng.integers(-127, 127, n) + 0.5).astype(F32)
        x[rng.integers(0, n)] = 127.0
        rows.append(np.ldexp(x, -e).astype(F32))
    # t within two ulps of k + 0.5 for random amax (a not a power of two): round() vs t + 0.5
    for _ in range(40):
        n = int(rng.choice([128, 512, 2048]))
        amax = F32(rng.uniform(1, 2) * 2.0 ** int(rng.integers(-100, 100)))
        a = F32(127.0 / float(amax))
        v = ((rng.integers(0, 127, n).astype(F32) + F32(0.5)) / a).astype(F32)
        v = (v.view(np.uint32) + rng.integers(-2, 3, n).astype(np.uint32)).view(F32)
        v = np.minimum(v, amax) * rng.choice([F32(-1), F32(1)], n)
        v[rng.integers(0, n)] = amax * rng.choice([F32(-1), F32(1)])
        rows.append(v.astype(F32))
    # |t| at 127 (x = +-amax, a rounded up: t = 127 * (1 + 2^-24)-ish) and 126.5, 0.5 - 2^-25
    rows.append(
        np.array(
            [127.0, -127.0, 126.5, -126.5, h("0x1.fffffep-2"), -h("0x1.fffffep-2"), 0.5, -0.5] + [0.0] * 120,
            F32,
        )
    )
    for amax in (3.0, 7.0, 1e-3, h("0x1.fffffep+127"), 1e-5, h("0x1.4f8b58p-17"), 9.99e-6, 1e-30):
        n = 128
        x = np.linspace(-amax, amax, n).astype(F32)
        x[0], x[-1] = F32(amax), F32(-amax)
        rows.append(x)
    rows.append(np.full(128, h("0x1p-149"), F32))  # subnormals only
    rows.append(np.full(4096, F32_MAX, F32))
    rows.append((np.array([F32_MAX, -F32_MAX, 1.0, -1.0] * 32)).astype(F32))
    return rows


def ref_act(x: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    q, s = i2s.quantize_activations(np.asarray(x, F32).reshape(1, -1))
    return q[0], s[0], int(q.astype(np.int32).sum())


def ref_int(packed: np.ndarray, rows: int, cols: int, xq: np.ndarray) -> np.ndarray:
    """sum code * x (int32, rows) for one activation row: codes of any byte, code 3 included."""
    sumi, _ = i2s.int_dot(packed, rows, cols, xq)
    return sumi[0]


def dot_inputs(seed: int):
    """(n, packed bytes for 4 rows, 4 int8 rows): random bytes (code 3 too) and extremes."""
    rng = np.random.default_rng(seed)
    for n in (128, 256, 384, 1024, 1152, 4096):
        x = rng.integers(-128, 128, (4, n)).astype(np.int8)
        yield n, rng.integers(0, 256, n, dtype=np.uint8), x
    for wb, xv in ((0xFF, -128), (0xFF, 127), (0xAA, -128), (0x00, 127), (0x55, -128)):
        n = 4096
        yield n, np.full(n, wb, np.uint8), np.full((4, n), xv, np.int8)
    n = 2048  # ternary weights (codes 0..2) and activations as quantize_act makes them
    q = rng.integers(-1, 2, 4 * n).astype(np.int8)
    yield n, i2s.pack(q), rng.integers(-127, 128, (4, n)).astype(np.int8)


# ---------------------------------------------------------------- entry points
def test_isa_selection(lib):
    auto = lib.isa_now()
    override = os.environ.get("MLRT_ISA", "")  # the first choice (native/src/cpu.h) when runnable
    best = [i for i in ISAS if lib.runnable(i)][-1]  # ISAS runs from the scalar twin to the best
    assert auto == (override if override in ISAS and lib.runnable(override) else best), (
        "MLRT_ISA's table, else the best runnable one"
    )
    try:
        assert lib.lib.ml_set_isa(b"scalar") == ML_OK and lib.isa_now() == "scalar"
        assert lib.lib.ml_set_isa(b"no-such-isa") == ML_E_UNSUPPORTED
        assert lib.lib.ml_set_isa(b"neon" if X86 else b"avx2") == ML_E_UNSUPPORTED
        assert lib.lib.ml_set_isa(lib.ffi.NULL) == ML_E_ARG
        assert lib.isa_now() == "scalar", "a refused ml_set_isa changes nothing"
    finally:
        assert lib.lib.ml_set_isa(auto.encode()) == ML_OK


def test_hook_arguments(lib):
    z8, zf = np.zeros(512, np.int8), np.zeros(512, F32)
    assert lib.kernel("scalar", "dot", 130, z8, z8)[0] == ML_E_ARG  # not a multiple of 128
    assert lib.kernel("scalar", "dot", 0, z8, z8)[0] == ML_E_ARG
    assert lib.kernel("scalar", "quantize_act", 0, zf)[0] == ML_E_ARG
    assert lib.kernel("scalar", "dot", 128, z8, None)[0] == ML_E_ARG
    assert lib.kernel("scalar", "no_such_op", 128, z8, z8)[0] == ML_E_ARG
    assert lib.kernel("neon" if X86 else "avx2", "dot", 128, z8, z8)[0] == ML_E_UNSUPPORTED
    assert lib.kernel("scalar", "dot", 128, z8, z8)[0] == ML_OK


# ---------------------------------------------------------------- kernels
def test_quantize_act_spec_cases(lib, isa):
    for case in (c for c in SPEC["edge_cases"] if c["op"] == "activations"):
        x = _vec(case["x"], F32)
        q, a, s = lib.quantize_act(isa, x)
        assert a == case["expect"]["scale"] and s == case["expect"]["act_sum"], case["name"]
        np.testing.assert_array_equal(q, _vec(case["expect"]["xq"], np.int64), err_msg=case["name"])


@pytest.mark.parametrize("seed", [1, 2])
def test_quantize_act_matches_reference(lib, isa, seed):
    rows = activation_rows(seed)
    bad = []
    for i, x in enumerate(rows):
        q, a, s = lib.quantize_act(isa, x)
        wq, wa, ws = ref_act(x)
        if q.tobytes() != wq.tobytes() or a.tobytes() != wa.tobytes() or s != ws:
            j = np.flatnonzero(q != wq)[:3]
            bad.append(
                f"row {i} (n {x.size}): scale {float(a).hex()} vs {float(wa).hex()}, sum {s} vs {ws}, "
                f"(x, q, want) {[(float(x[k]).hex(), int(q[k]), int(wq[k])) for k in j]}"
            )
    assert not bad, f"{isa}: {len(bad)} of {len(rows)} rows differ:\n" + "\n".join(bad[:5])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    x=hnp.arrays(F32, st.integers(1, 700), elements=st.floats(-(2.0**20), 2.0**20, width=32)),
    scale=st.sampled_from([1.0, 2.0**-140, 2.0**100, 127.0]),
)
def test_quantize_act_hypothesis(lib, x, scale):
    x = (x * F32(scale)).astype(F32)
    want = ref_act(x)
    for isa in ISAS:
        if lib.runnable(isa):
            q, a, s = lib.quantize_act(isa, x)
            assert (q.tobytes(), a.tobytes(), s) == (want[0].tobytes(), want[1].tobytes(), want[2]), isa


@pytest.mark.parametrize("seed", [3, 4])
def test_dots_match_reference(lib, isa, seed):
    for n, w, x in dot_inputs(seed):
        row0 = w[: n // 4]
        want = np.stack([ref_int(row0, 1, n, x[t])[0] for t in range(4)])
        assert lib.dot(isa, "dot", n, row0, x[0])[0] == want[0], f"{isa} dot n {n}"
        np.testing.assert_array_equal(lib.dot(isa, "dot4", n, row0, x), want, err_msg=f"{isa} dot4 n {n}")
        want_rows = ref_int(w, 4, n, x[1])
        np.testing.assert_array_equal(
            lib.dot(isa, "dot_rows4", n, w, x[1]), want_rows, err_msg=f"{isa} dot_rows4 n {n}"
        )


def test_prefill_tile_matches_reference(lib, isa):
    """dot_rows2x8 (two weight rows x eight tokens, the prefill tile) gives the exact sums of
    every (row, token) at its place of the strided output (the cells between are left alone), on
    the inputs of the other dots; a table without it says unsupported."""
    for seed in (5, 6):
        for n, w, x in dot_inputs(seed):
            x8 = np.concatenate([x, x[::-1] ^ np.int8(0x55)])  # eight distinct rows
            rc, out = lib.kernel(isa, "dot_rows2x8", n, w[: n // 2], x8, out_bytes=96, fill=0xA5)
            if rc == ML_E_UNSUPPORTED:
                assert isa in ("avx2", "neon"), f"{isa} has no dot_rows2x8"
                return
            assert rc == ML_OK
            pad = np.frombuffer(b"\xa5" * 4, np.int32)[0]
            want = np.array(
                [[ref_int(w[r * n // 4 :], 1, n, x8[t])[0] for r in range(2)] + [pad] for t in range(8)],
                np.int32,
            )
            np.testing.assert_array_equal(
                out[:96].view(np.int32).reshape(8, 3), want, err_msg=f"{isa} dot_rows2x8 n {n}"
            )


def _float_dot(w: np.ndarray, x: np.ndarray) -> np.float32:
    """The table's float dot order (i2s_kernels.h): element k into running sum k % 8, each product
    rounded then added, the sums combined ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))."""
    s = np.zeros(8, F32)
    p = (w.astype(F32) * x.astype(F32)).astype(F32)
    for k in range(0, p.size, 8):
        part = p[k : k + 8]
        s[: part.size] = (s[: part.size] + part).astype(F32)
    return F32(F32(F32(s[0] + s[1]) + F32(s[2] + s[3])) + F32(F32(s[4] + s[5]) + F32(s[6] + s[7])))


@pytest.mark.parametrize("seed", [3, 4])
def test_float_dots_follow_the_table_order(lib, isa, seed):
    """dot_f16 / dot_f32 (the float reading) give the documented order's bits on
    every ISA, for any length (leftovers past the last group of 8) and f16 weights of any finite bits."""
    rng = np.random.default_rng(seed)
    for n in (1, 7, 8, 9, 64, 127, 640, 1000, 4096):
        h = rng.integers(0, 2**16, n, dtype=np.uint32).astype(np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h & 0xBFFF, h).astype(np.uint16)  # finite
        wf = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(F32)
        x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(F32)
        out = np.zeros(4, np.uint8)
        for op, w, want in (
            ("dot_f16", h, _float_dot(h.view(np.float16), x)),
            ("dot_f32", wf, _float_dot(wf, x)),
        ):
            rc = lib.lib.mlbitnet_test_kernel(
                isa.encode(), op.encode(), n, lib._buf(w), lib._buf(x), lib.ffi.from_buffer(out)
            )
            assert rc == ML_OK
            assert out.view(F32)[0].tobytes() == want.tobytes(), f"{isa} {op} n {n}"


# ---------------------------------------------------------------- element-wise kernels
def _kernel_f32(lib, isa, op, a, b=None, count: int | None = None, n: int | None = None) -> np.ndarray:
    """The hook's first count floats (default n) of op on n values (default a.size)."""
    n = a.size if n is None else n
    count = n if count is None else count
    rc, out = lib.kernel(isa, op, n, a, b, out_bytes=4 * count)
    assert rc == ML_OK, f"{isa} {op}"
    return out[: 4 * count].view(F32).copy()


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(F32).view(np.uint32), err_msg=what)


def _header_exp(x: np.ndarray) -> np.ndarray:
    """i2s_exp (i2s_kernels.h) transcribed step for step in float32 NumPy operations."""
    x = np.where(x > F32(-87), x, F32(-87))
    x = np.where(x < F32(88), x, F32(88))
    n = np.floor(x * F32(1.44269504088896341) + F32(0.5))
    r = (x - n * F32(0.693359375)) - n * F32(-2.12194440e-4)
    p = F32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + F32(c)
    p = (p * (r * r) + r) + F32(1)
    return p * np.ldexp(F32(1), n.astype(np.int32)).astype(F32)


def _header_act(gelu: bool, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    z = F32(-1.59576912160573071) * (g + F32(0.044715) * ((g * g) * g)) if gelu else -g
    return g / (F32(1) + _header_exp(z)) * u


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps between same-shaped float32 arrays (across zero too)."""
    ai, bi = (v.view(np.int32).astype(np.int64) for v in (a, b))
    ai, bi = (np.where(v < 0, -(v & 0x7FFFFFFF), v) for v in (ai, bi))
    return np.abs(ai - bi)


def _activation_inputs(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal(50_000) * np.exp2(rng.integers(-30, 12, 50_000))
    edges = [0.0, -0.0, 1e-45, -1e-45, 8e3, -8e3]
    return np.concatenate([np.linspace(-20, 20, 200_001), wide, edges]).astype(F32)


def test_exp_formula_is_within_an_ulp():
    """The one exp formula of the activations (i2s_kernels.h), against float64 exp: measured <= 1
    float32 step at 1.2M points of [-87, 88]."""
    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-87, 88, 1_000_001), rng.uniform(-87, 88, 200_000)]).astype(F32)
    assert _ulps(_header_exp(x), np.exp(x.astype(np.float64)).astype(F32)).max() <= 1


def test_exp_hook_is_the_header_formula(lib):
    x = np.concatenate([np.linspace(-100, 100, 20_001), [0.0, -0.0, 1e-45, 3e38, -3e38]]).astype(F32)
    _same_bits(_kernel_f32(lib, "scalar", "exp", x), _header_exp(x), "exp")


@pytest.mark.parametrize("seed", [6, 7])
def test_elementwise_kernels_follow_the_formulas(lib, isa, seed):
    """epilogue, act_mul and norm_mul give the header's one-element formulas' bits on
    every ISA (here: NumPy float32 transcriptions), for every length (the leftovers after the SIMD
    groups)."""
    rng = np.random.default_rng(seed)
    for n in (1, 7, 8, 9, 31, 64, 1000, 2048):
        sumi = (rng.integers(-(2**31), 2**31, n) >> rng.integers(0, 32, n)).astype(np.int32)
        act_sum = int(rng.integers(-(2**23), 2**23))
        a, d = F32(rng.uniform(0.5, 2) * 2.0 ** rng.integers(-20, 20)), F32(rng.uniform(0.01, 1))
        params = np.concatenate([np.array([act_sum], np.int32).view(F32), [a, d]]).astype(F32)
        _same_bits(
            _kernel_f32(lib, isa, "epilogue", sumi, params),
            ((sumi.astype(F32) - F32(act_sum)) / a) * d,
            f"{isa} epilogue n {n}",
        )
        x = _activation_inputs(seed)[rng.integers(0, 250_000, n)]
        y = (rng.standard_normal(n) * np.exp2(rng.integers(-10, 10, n))).astype(F32)
        for op in ("silu_mul", "gelu_mul"):
            _same_bits(_kernel_f32(lib, isa, op, x, y), _header_act(op[0] == "g", x, y), f"{isa} {op} n {n}")
        r = F32(1 / rng.uniform(0.01, 100))  # RMSNorm's scaling, in place (out = v)
        _same_bits(
            _kernel_f32(lib, isa, "norm_mul", x, np.concatenate([[r], y]).astype(F32)),
            (x * r) * y,
            f"{isa} norm_mul n {n}",
        )


def test_activations_are_as_accurate_as_float32_numpy(lib):
    """act_mul against the float64 SiLU and tanh GELU (the reference's NumPy formulas in float64):
    |error| <= 2.5 * 2^-24 |g| + 2^-149 (a subnormal step) everywhere (measured 1.98 * 2^-24 |g|
    for both; NumPy's float32 formulas: 1.98 and 2.00), and within 16 float32 steps where
    |act(g)| >= 1e-3 |g| (measured 2 and 14; NumPy float32's tanh GELU: 326). Deep in the negative
    tail both are ~0 next to |g|."""
    g = _activation_inputs(8)
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):
        want = {
            "silu_mul": g64 / (1 + np.exp(-g64)),
            "gelu_mul": 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3))),
        }
    for op, ref in want.items():
        got = _kernel_f32(lib, "scalar", op, g, np.ones_like(g))
        assert (np.abs(got - ref) <= 2.5 * 2.0**-24 * np.abs(g64) + 2.0**-149).all(), op
        big = np.abs(ref) >= 1e-3 * np.abs(g64)
        assert _ulps(got[big], ref[big].astype(F32)).max() <= 16, op


def test_saturated_row_spec_case(lib, isa):
    """specs/i2s.yaml saturated_row_sums_exactly on every ISA: exact sums where bitnet.cpp's AVX2
    int16 lanes wrap (decision i2s.int16_wrap)."""
    case = next(c for c in SPEC["edge_cases"] if c["name"] == "saturated_row_sums_exactly")
    n = int(case["cols"])
    packed = i2s.pack(_vec(case["codes"], np.int64, n).astype(np.int8) - 1)
    xq = np.tile(_vec(case["expect"]["xq"], np.int64, n).astype(np.int8), (4, 1))
    want = case["expect"]["sumi"]
    assert lib.dot(isa, "dot", n, packed, xq[0])[0] == want
    assert lib.dot(isa, "dot4", n, packed, xq).tolist() == [want] * 4
    assert lib.dot(isa, "dot_rows4", n, np.tile(packed, 4), xq[0]).tolist() == [want] * 4


def test_dot_extremes_are_exact(lib, isa):
    """Code 3 everywhere against -128 everywhere: the largest |sum| (int16 stages must not saturate)."""
    n = 4096
    w, x = np.full(n // 4, 0xFF, np.uint8), np.full(n, -128, np.int8)
    assert lib.dot(isa, "dot", n, w, x)[0] == 3 * -128 * n
    x4 = np.full((4, n), 127, np.int8)
    np.testing.assert_array_equal(lib.dot(isa, "dot4", n, w, x4), [3 * 127 * n] * 4)


# ---------------------------------------------------------------- ml_i2s_quantize: payload bytes
def _num(v) -> float:
    return float.fromhex(v) if isinstance(v, str) else float(v)


def _vec(spec: dict, dtype, n: int = 128) -> np.ndarray:
    out = np.full(n, _num(spec["fill"]), dtype=dtype)
    for i, v in (spec.get("at") or {}).items():
        out[int(i)] = _num(v)
    return out


def weight_tensors(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for rows, cols in ((1, 128), (3, 256), (7, 384), (16, 1024), (2, 4096), (33, 128)):
        out.append(rng.standard_normal((rows, cols)).astype(F32))
        wide = np.exp2(rng.integers(-40, 40, (rows, cols)))
        out.append((rng.standard_normal((rows, cols)) * wide).astype(F32))
        out.append(_bits_f32(rng, (rows, cols)) * F32(2.0**-20))  # no overflow in the mean
        out.append((rng.integers(-3, 4, (rows, cols)) * 0.5).astype(F32))  # many exact ties
        out.append(np.zeros((rows, cols), F32))
    # +-0.5 and +-1.5 of the scale exactly: values in units u = 2^e whose |sum| is n u (m = u, s = 2^-e)
    for e in (-20, 0, 7):
        n = 1024
        k = rng.choice([0.0, 0.5, -0.5, 1.5, -1.5, 1.0, -1.0], n)
        k[0] = 0.0
        k[0] = n - np.abs(k).sum()  # positive: |k| avg < 1
        out.append(np.ldexp(k, e).astype(F32).reshape(8, 128))
    out.append(np.full((2, 128), F32_MAX / 2**20, F32))
    out.append(np.full((1, 128), float.fromhex("0x1p-149"), F32))  # floored: q = 0, d = 1e-5
    out.append(summation_order_tensor())
    return out


def summation_order_tensor() -> np.ndarray:
    """(3, 8192) weights (seeded float32 bit patterns, 2^-11 .. 1) whose float32 mean tells the
    three summation orders apart: NumPy 1.26's (pairwise per chunk of 8192, the rule), NumPy 2's
    (one pairwise pass) and a plain left-to-right float32 loop each round to another float."""
    bits = np.random.default_rng(2).integers(0x3A000000, 0x3F800000, 3 * 8192, dtype=np.uint32)
    return bits.view(F32).reshape(3, 8192)


def test_summation_order_tensor_discriminates():
    """The tensor above does tell the orders apart, and the reference is NumPy 1.26's order."""
    a = np.abs(summation_order_tensor().ravel())
    numpy2 = F32(np.float64(F32(0) + i2s.pairwise_sum(a)) / a.size)
    plain = F32(0)
    for v in a:
        plain = F32(plain + v)
    plain = F32(np.float64(plain) / a.size)
    chunks = F32(0)
    for i in range(0, a.size, 8192):
        chunks = F32(chunks + i2s.pairwise_sum(a[i : i + 8192]))
    chunks = F32(np.float64(chunks) / a.size)
    assert len({float(numpy2), float(plain), float(chunks)}) == 3
    assert i2s.abs_mean(a) == chunks


def test_quantize_scale_is_numpy_1_26_s_mean(lib, using):
    """ml_i2s_quantize's stored scale on the 55 tensors of golden/i2s_mean_numpy126.npz (one row
    each) is NumPy 1.26.4's own np.mean(np.abs(w)), bit for bit."""
    g = np.load(GOLDEN_DIR / "i2s_mean_numpy126.npz")
    bad = []
    for i, w in enumerate(golden.i2s_mean_inputs()):
        rc, data = lib.quantize(w.reshape(1, -1))
        assert rc == ML_OK
        if np.frombuffer(data, np.uint32, 1, w.size // 4)[0] != g["mean_bits"][i]:
            bad.append(f"tensor {i} ({w.size} values)")
    assert not bad, ", ".join(bad)


def test_quantize_spec_cases(lib, using):
    cases = [c for c in SPEC["edge_cases"] if c["op"] in ("ternarize", "bitlinear")]
    assert cases
    for case in cases:
        rc, data = lib.quantize(_vec(case["w"], F32).reshape(1, 128))
        assert rc == ML_OK
        if "packed" in case["expect"]:
            assert data[:32].hex() == case["expect"]["packed"], case["name"]
            assert data[32:].hex() == case["expect"]["payload_tail"], case["name"]
        assert data == i2s.payload(_vec(case["w"], F32)), case["name"]


@pytest.mark.parametrize("seed", [5, 6])
def test_quantize_matches_reference(lib, using, seed):
    bad = []
    tensors = weight_tensors(seed)
    for i, w in enumerate(tensors):
        rc, data = lib.quantize(w)
        assert rc == ML_OK, f"tensor {i} {w.shape}"
        want = i2s.payload(w)
        if data != want:
            n = w.size // 4
            bad.append(
                f"tensor {i} {w.shape}: scale {data[n : n + 4].hex()} vs {want[n : n + 4].hex()}, "
                f"first packed difference at byte "
                f"{next((k for k in range(n) if data[k] != want[k]), None)}"
            )
    assert not bad, f"{len(bad)} of {len(tensors)} payloads differ:\n" + "\n".join(bad)


# ---------------------------------------------------------------- ml_i2s_quantize_act, ml_i2s_matmul
@pytest.mark.parametrize("seed", [7, 8])
def test_quantize_act_api_matches_reference(lib, using, seed):
    rng = np.random.default_rng(seed)
    rows = [r for r in activation_rows(seed) if r.size % 128 == 0]
    for cols in sorted({r.size for r in rows}):
        x = np.stack([r for r in rows if r.size == cols] + [rng.standard_normal(cols).astype(F32)])
        rc, q, s, n = lib.quantize_rows(x)
        assert rc == ML_OK
        wq, ws = i2s.quantize_activations(x)
        np.testing.assert_array_equal(q, wq, err_msg=f"cols {cols}")
        np.testing.assert_array_equal(s.view(np.uint32), ws.view(np.uint32), err_msg=f"cols {cols}")
        np.testing.assert_array_equal(n, wq.astype(np.int32).sum(axis=1), err_msg=f"cols {cols}")


def matmul_cases(seed: int):
    rng = np.random.default_rng(seed)
    for rows, cols, n in (
        (1, 128, 1),
        (5, 256, 3),
        (8, 512, 4),
        (13, 384, 9),
        (64, 1024, 2),
        (7, 4096, 5),
        (4, 128, 8),
    ):
        w = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-5, 5))).astype(F32)
        x = (rng.standard_normal((n, cols)) * np.exp2(rng.integers(-10, 10, (n, 1)))).astype(F32)
        x[0, : cols // 2] = 0.0
        if n > 2:
            x[2] = 0.0  # an all-zero row: y = 0
        yield w, x
    case = next(c for c in SPEC["edge_cases"] if c["op"] == "bitlinear")
    yield _vec(case["w"], F32).reshape(1, 128), _vec(case["x"], F32).reshape(1, 128)


@pytest.mark.parametrize("seed", [9, 10])
def test_matmul_matches_bitlinear(lib, using, seed):
    for w, x in matmul_cases(seed):
        rows, cols = w.shape
        payload = i2s.payload(w)
        rc, y = lib.matmul(payload, rows, cols, x)
        assert rc == ML_OK, (rows, cols)
        want = i2s.bitlinear(x, payload, (rows, cols))
        np.testing.assert_array_equal(
            y.view(np.uint32), want.view(np.uint32), err_msg=f"{rows}x{cols}, n {len(x)}"
        )


def test_bitlinear_spec_case(lib, using):
    case = next(c for c in SPEC["edge_cases"] if c["op"] == "bitlinear")
    rc, payload = lib.quantize(_vec(case["w"], F32).reshape(1, 128))
    assert rc == ML_OK
    rc, y = lib.matmul(payload, 1, 128, _vec(case["x"], F32).reshape(1, 128))
    assert rc == ML_OK and y[0, 0] == case["expect"]["y"]


def test_refusals(lib):
    rng = np.random.default_rng(11)
    ffi, L = lib.ffi, lib.lib
    w = rng.standard_normal((2, 256)).astype(F32)
    payload = i2s.payload(w)
    x = rng.standard_normal((3, 256)).astype(F32)
    # ml_i2s_quantize: shape, non-finite, NULL
    for cols in (64, 130, 0):
        assert lib.quantize(np.zeros((2, cols), F32))[0] == ML_E_ARG, cols
    assert lib.quantize(np.zeros((0, 128), F32))[0] == ML_E_ARG
    for bad in (np.nan, np.inf, -np.inf):
        v = w.copy()
        v[1, 7] = bad
        assert lib.quantize(v)[0] == ML_E_ARG, bad
    out = np.zeros(256, np.uint8)
    assert L.ml_i2s_quantize(ffi.NULL, 1, 128, ffi.from_buffer(out)) == ML_E_ARG
    assert L.ml_i2s_quantize(ffi.from_buffer(w), 1, 128, ffi.NULL) == ML_E_ARG
    huge = (2**62, 2**61)  # rows * cols overflows
    assert L.ml_i2s_quantize(ffi.from_buffer(w), *huge, ffi.from_buffer(out)) == ML_E_ARG
    # ml_i2s_quantize_act
    for cols in (64, 130):
        assert lib.quantize_rows(np.zeros((2, cols), F32))[0] == ML_E_ARG, cols
    assert lib.quantize_rows(np.zeros((0, 128), F32))[0] == ML_E_ARG
    v = x.copy()
    v[2, 255] = np.nan
    rc, q, _, _ = lib.quantize_rows(v)
    assert rc == ML_E_ARG and not q.any(), "nothing written before the refusal"
    assert L.ml_i2s_quantize_act(ffi.from_buffer(x), 3, 256, ffi.NULL, ffi.NULL, ffi.NULL) == ML_E_ARG
    # ml_i2s_matmul
    assert lib.matmul(payload, 2, 256, x)[0] == ML_OK
    for cols in (64, 130):
        assert lib.matmul(payload, 2, cols, np.zeros((3, cols), F32))[0] == ML_E_ARG, cols
    assert lib.matmul(payload, 0, 256, x)[0] == ML_E_ARG
    assert lib.matmul(payload, 2, 256, np.zeros((0, 256), F32))[0] == ML_E_ARG
    for bad in (np.nan, np.inf):
        v = x.copy()
        v[1, 3] = bad
        rc, y = lib.matmul(payload, 2, 256, v)
        assert rc == ML_E_ARG and np.isnan(y).all(), "nothing written before the refusal"
    y = np.zeros((3, 2), F32)
    assert L.ml_i2s_matmul(ffi.NULL, 2, 256, ffi.from_buffer(x), 3, ffi.from_buffer(y)) == ML_E_ARG
    assert (
        L.ml_i2s_matmul(
            ffi.from_buffer(np.frombuffer(payload, np.uint8)), 2, 256, ffi.NULL, 3, ffi.from_buffer(y)
        )
        == ML_E_ARG
    )
    # code 3 anywhere in the packed data (not in the tail) is ML_E_FORMAT
    n = 2 * 256 // 4
    for pos, field in ((0, 0xC0), (n - 1, 0x03), (77, 0x30), (100, 0x0C)):
        p = bytearray(payload)
        p[pos] |= field  # that 2-bit code := 3
        rc, y = lib.matmul(bytes(p), 2, 256, x)
        assert rc == ML_E_FORMAT and np.isnan(y).all(), (pos, hex(p[pos]))
    tail = bytearray(payload)
    tail[n + 4 :] = b"\xff" * 28  # the tail is not checked
    assert lib.matmul(bytes(tail), 2, 256, x)[0] == ML_OK


def test_bench_matvec(lib):
    for isa in ISAS:
        if lib.runnable(isa):
            assert lib.lib.mlbitnet_bench_matvec(isa.encode(), 256, 1024, 1, 2, 0) > 0, isa
    assert lib.lib.mlbitnet_bench_matvec(b"scalar", 64, 1024, 2, 1, 0) > 0  # threads
    assert lib.lib.mlbitnet_bench_matvec(b"scalar", 64, 1024, 2, 1, 1) > 0  # cold
    assert lib.lib.mlbitnet_bench_matvec(b"scalar", 64, 130, 1, 1, 0) < 0
    assert lib.lib.mlbitnet_bench_matvec(b"no-such-isa", 64, 128, 1, 1, 0) < 0


# ---------------------------------------------------------------- C driver: NEON under qemu, sanitizers
def _run(cmd: list[str], data: bytes = b"", timeout: float = 300) -> subprocess.CompletedProcess:
    """A driver run; without MLRT_ISA, which would steer the automatic choice it checks."""
    env = {k: v for k, v in os.environ.items() if k != "MLRT_ISA"}
    return subprocess.run(cmd, input=data, capture_output=True, timeout=timeout, env=env)


CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
# the sanitized drivers' flags (here and tests/test_gguf_rules.py): any report aborts the run
SANITIZER_FLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
SANITIZER_FLAGS.append("-fno-omit-frame-pointer")


def _compile(cc: str, out: Path, sources: list[tuple[Path, list[str]]], link: list[str]) -> Path:
    """Compile each source with its own flags (the ISA flags must not leak into the scalar twin)
    and link: build.compile_link, once per session for the same inputs (BuildError fails)."""
    return _load_build_module().compile_link(cc, CFLAGS, sources, link, out)


def driver_sources(simd: list[str], extra: list[str]) -> list[tuple[Path, list[str]]]:
    """The driver and the library's sources, the SIMD files ``simd`` (i2s_<name>.c) with the ISA
    flags backends/native/build.py gives them."""
    build = _load_build_module()
    common = [
        BITNET / "tests" / "i2s_main.c",
        SRC / "i2s_scalar.c",
        SRC / "dispatch.c",
        SRC / "i2s_api.c",
        SRC / "embed.c",
        SRC / "attn.c",
        SRC / "gguf.c",
        NATIVE / "src" / "pool.c",
        NATIVE / "src" / "f16.c",
        NATIVE / "src" / "cpu.c",
    ]
    return [(p, extra) for p in common] + [
        (SRC / f"i2s_{t}.c", [*extra, *build.ISA_FLAGS[f"i2s_{t}.c"][1]]) for t in simd
    ]


@pytest.fixture(scope="module")
def neon_driver(tmp_path_factory) -> list[str]:
    """The aarch64 driver and the command prefix that runs it: qemu-aarch64 -cpu max elsewhere."""
    srcs = driver_sources(["neon"], [])
    if ARM:
        return [str(_compile("gcc", tmp_path_factory.mktemp("neon") / "i2s_main", srcs, []))]
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        pytest.skip(
            f"NEON I2_S kernels untested: {', '.join(missing)} not found "
            "(apt-get install gcc-aarch64-linux-gnu qemu-user)"
        )
    exe = _compile("aarch64-linux-gnu-gcc", tmp_path_factory.mktemp("neon") / "i2s_main", srcs, ["-static"])
    return ["qemu-aarch64", "-cpu", "max", str(exe)]


@pytest.fixture(scope="module")
def sanitized_driver(tmp_path_factory) -> list[str]:
    """The same driver built natively with AddressSanitizer + UBSan (x86-64: every x86 table)."""
    if not X86:
        pytest.skip("the sanitized driver build is for x86-64 (aarch64 runs the plain build natively)")
    san = SANITIZER_FLAGS
    srcs = driver_sources(X86_TABLES, san)
    return [str(_compile("gcc", tmp_path_factory.mktemp("san") / "i2s_main", srcs, san))]


def _tables(driver: list[str]) -> list[str]:
    return ["scalar", "neon"] if "qemu-aarch64" in driver[0] or ARM else ["scalar", *X86_TABLES]


def _call(driver: list[str], isa: str, op: str, args: list[int], data: bytes) -> bytes:
    r = _run([*driver, isa, op, *map(str, args)], data)
    if r.returncode == 3 and b"not runnable" in r.stderr:
        pytest.skip(f"{isa} is not runnable here")
    assert r.returncode == 0, f"{isa} {op} {args}: exit {r.returncode}\n{r.stderr.decode()}"
    return r.stdout


def _runnable(driver: list[str]) -> list[str]:
    """The driver's tables this CPU runs (scalar always), best last."""
    out = ["scalar"]
    for t in _tables(driver)[1:]:
        r = _run([*driver, t, "selftest", "0"])
        if not (r.returncode == 3 and b"not runnable" in r.stderr):  # e.g. an x86-64 without AVX-512
            out.append(t)
    return out


def check_driver(driver: list[str]) -> None:
    """Every kernel and API op of the driver's tables that this CPU runs against the reference, bit
    for bit; the tables it cannot run are printed (pytest -rP)."""
    runnable = _runnable(driver)
    print(f"tables run: {runnable}; not runnable here: {sorted(set(_tables(driver)) - set(runnable))}")
    for isa in runnable:
        r = _run([*driver, isa, "selftest", "200"])
        assert r.returncode == 0 and r.stdout.rstrip().endswith(b" 0 mismatches"), r.stdout + r.stderr
        best = runnable[-1]  # dispatch.c's order: the best runnable table is the last of _tables
        assert f"automatic choice: {best}\n".encode() in r.stdout, r.stdout
        # quantize_act on rows of each length
        rows = activation_rows(12)
        for n in sorted({r.size for r in rows}):
            x = np.stack([r for r in rows if r.size == n])
            out = np.frombuffer(_call(driver, isa, "quantize_act", [n], x.tobytes()), np.uint8)
            out = out.reshape(len(x), n + 8)
            wq, ws = i2s.quantize_activations(x)
            np.testing.assert_array_equal(out[:, :n].view(np.int8), wq, err_msg=f"{isa} quantize_act n {n}")
            np.testing.assert_array_equal(
                out[:, n : n + 4].copy().view(np.uint32)[:, 0],
                ws.view(np.uint32),
                err_msg=f"{isa} quantize_act scale n {n}",
            )
            np.testing.assert_array_equal(
                out[:, n + 4 :].copy().view(np.int32)[:, 0], wq.astype(np.int32).sum(axis=1)
            )
        # dots
        for n, w, x in dot_inputs(13):
            row0 = w[: n // 4]
            want = np.stack([ref_int(row0, 1, n, x[t])[0] for t in range(4)])
            got = np.frombuffer(_call(driver, isa, "dot", [n], row0.tobytes() + x[0].tobytes()), np.int32)
            assert got[0] == want[0], f"{isa} dot n {n}"
            got = np.frombuffer(_call(driver, isa, "dot4", [n], row0.tobytes() + x.tobytes()), np.int32)
            np.testing.assert_array_equal(got, want, err_msg=f"{isa} dot4 n {n}")
            got = np.frombuffer(_call(driver, isa, "dot_rows4", [n], w.tobytes() + x[1].tobytes()), np.int32)
            np.testing.assert_array_equal(got, ref_int(w, 4, n, x[1]), err_msg=f"{isa} dot_rows4 n {n}")
        # API: payloads and the matmul
        for w in weight_tensors(14):
            got = _call(driver, isa, "quantize", list(w.shape), w.tobytes())
            assert got == i2s.payload(w), f"{isa} quantize {w.shape}"
        for w, x in matmul_cases(15):
            payload = i2s.payload(w)
            got = np.frombuffer(_call(driver, isa, "matmul", [*w.shape, len(x)], payload + x.tobytes()), F32)
            want = i2s.bitlinear(x, payload, w.shape)
            np.testing.assert_array_equal(
                got.view(np.uint32),
                want.view(np.uint32).ravel(),
                err_msg=f"{isa} matmul {w.shape} n {len(x)}",
            )
        bad = bytearray(i2s.payload(np.ones((1, 128), F32)))
        bad[5] = 0xFF
        r = _run([*driver, isa, "matmul", "1", "128", "1"], bytes(bad) + np.ones(128, F32).tobytes())
        assert r.returncode == 10 + ML_E_FORMAT and not r.stdout, r.stderr


@pytest.mark.slow
def test_neon_under_qemu(neon_driver):
    check_driver(neon_driver)


@pytest.mark.slow
def test_sanitized_driver(sanitized_driver):
    check_driver(sanitized_driver)


# ---------------------------------------------------------------- the embedding path on the driver's tables
GOLDEN_GGUFS = sorted((ROOT / "golden" / "bitnet").glob("*.gguf"))


def _embed_cases():
    for path in GOLDEN_GGUFS:
        toks = np.load(path.with_suffix(".npz"))
        for i in (1, 2):
            for pooling, code in (("mean", 1), ("cls", 2), ("last", 3)):
                yield path, toks[f"tokens_{i}"].astype(np.int32), pooling, code


def check_embed(driver: list[str]) -> None:
    """The whole embedding path (GGUF loader, forward, I2_S kernels) of the driver's build — on
    x86 hosts the aarch64 build with the neon and scalar tables under qemu, or the sanitized
    build — gives the same bits as the library on this machine: the kernels are bit-exact and the
    float code is the same C (no FMA contraction under -std=c11), so a difference is a bug."""
    from mlconf.backends.bitnet import bitnet_backend

    assert GOLDEN_GGUFS, "golden/bitnet has no GGUF"
    # The tables this CPU runs: an x86-64 without AVX-512 (or AVX-VNNI) cannot run those builds,
    # and their kernels are checked wherever it can (check_driver prints which were skipped).
    runnable = _runnable(driver)
    print(f"embed on tables: {runnable}; not runnable here: {sorted(set(_tables(driver)) - set(runnable))}")
    here = bitnet_backend("bitnet")
    try:
        for path, toks, pooling, code in _embed_cases():
            s = here.open_embedder(str(path))
            want = s.embed(toks, pooling, False)
            s.close()
            for isa in runnable:
                r = _run([*driver, isa, "embed", str(path), str(code), "0"], toks.tobytes())
                assert r.returncode == 0, f"{isa} embed {path.name}: exit {r.returncode}\n{r.stderr.decode()}"
                got = np.frombuffer(r.stdout, F32)
                np.testing.assert_array_equal(
                    got.view(np.uint32),
                    want.view(np.uint32),
                    err_msg=f"{isa} {path.name} {len(toks)} tokens {pooling}",
                )
    finally:
        here.close()


@pytest.mark.slow
def test_embed_under_qemu_matches_this_machine(neon_driver):
    check_embed(neon_driver)


@pytest.mark.slow
def test_embed_sanitized_matches_this_machine(sanitized_driver):
    check_embed(sanitized_driver)


# ---------------------------------------------------------------- attention
def _fma32(a, b, c) -> np.ndarray:
    """float32 fmaf(a, b, c), exactly: a * b is exact in float64, their sum's rounding error e by
    TwoSum; the sum rounded to odd in float64 (53 >= 24 + 2 bits) then rounds to float32 once."""
    a, b, c = (np.asarray(v, F32).astype(np.float64) for v in (a, b, c))
    prod = a * b
    t = prod + c
    bb = t - prod
    e = (prod - (t - bb)) + (c - bb)
    even = (t.view(np.int64) & 1) == 0
    t = np.where((e != 0) & even, np.nextafter(t, np.where(e > 0, np.inf, -np.inf)), t)
    return t.astype(F32)


def test_fma32_is_exact():
    """The transcription's fma against exact rationals, on values whose float64 sum rounds."""
    from fractions import Fraction

    rng = np.random.default_rng(11)
    a = (rng.standard_normal(3000) * np.exp2(rng.integers(-30, 30, 3000))).astype(F32)
    b = (rng.standard_normal(3000) * np.exp2(rng.integers(-30, 30, 3000))).astype(F32)
    c = (rng.standard_normal(3000) * np.exp2(rng.integers(-90, 60, 3000))).astype(F32)
    c[:1000] = -(a[:1000].astype(np.float64) * b[:1000]).astype(F32)  # near-cancellations
    got = _fma32(a, b, c)
    for i in range(a.size):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        lo = F32(float(exact))  # a candidate; the nearest float32 is it or a neighbour
        cands = [np.nextafter(lo, F32(-np.inf)), lo, np.nextafter(lo, F32(np.inf))]
        want = min(cands, key=lambda f: (abs(Fraction(float(f)) - exact), int(F32(f).view(np.uint32)) & 1))
        assert got[i].tobytes() == F32(want).tobytes(), (a[i], b[i], c[i])


def _kt_index(hd: int, j: int, d: int) -> int:
    """I2S_ATT_KT: key j's element d in a tile of keys transposed in blocks of 16."""
    return ((j // 16) * hd + d) * 16 + j % 16


def _scores_formula(q: np.ndarray, k: np.ndarray, scale) -> np.ndarray:
    acc = np.zeros((q.shape[0], k.shape[0]), F32)
    for d in range(q.shape[1]):
        acc = _fma32(q[:, d, None], k[None, :, d], acc)
    return (acc * F32(scale)).astype(F32)


def _softmax_formula(s, a, b, m, total):
    """i2s_att_softmax_row for each row: (p, m, l, alpha)."""
    s, m, total = s.copy(), m.copy(), total.copy()
    alpha = np.zeros_like(m)
    nk = s.shape[1]
    for i in range(s.shape[0]):
        mt = m[i]
        for j in range(a[i], b[i]):
            mt = s[i, j] if s[i, j] > mt else mt
        alpha[i] = F32(0) if m[i] == -np.inf else _header_exp(np.array([m[i] - mt], F32))[0]
        inside = (np.arange(nk) >= a[i]) & (np.arange(nk) < b[i])
        p = np.where(inside, _header_exp((s[i] - mt).astype(F32)), F32(0)).astype(F32)
        lanes = np.zeros(8, F32)
        for j in range(nk):
            lanes[j % 8] = F32(lanes[j % 8] + p[j])
        left = F32(F32(lanes[0] + lanes[1]) + F32(lanes[2] + lanes[3]))
        tot = F32(left + F32(F32(lanes[4] + lanes[5]) + F32(lanes[6] + lanes[7])))
        total[i] = F32(F32(total[i] * alpha[i]) + tot)
        m[i], s[i] = mt, p
    return s, m, total, alpha


@pytest.mark.parametrize("seed", [8, 9])
def test_attention_kernels_follow_the_formulas(lib, isa, seed):
    """att_scores, att_softmax and att_pv give the header's definitions' bits on every ISA (one
    fused multiply-add per step, in the documented orders), for query counts and key counts that
    are and are not multiples of the SIMD tiles (4 rows x 16 on AVX2, 8 x 32 on AVX-512, with the
    leftover queries, keys and columns of each), head widths 8 .. 136."""
    rng = np.random.default_rng(seed)
    shapes = (
        (8, 1, 1),
        (32, 3, 7),
        (32, 4, 16),
        (64, 5, 17),
        (128, 16, 64),
        (136, 6, 33),
        (16, 16, 40),
        (136, 11, 45),
        (48, 9, 64),
        (96, 8, 32),
    )
    for hd, nq, nk in shapes:
        q = (rng.standard_normal((nq, hd)) * np.exp2(rng.integers(-6, 6, (nq, hd)))).astype(F32)
        k = (rng.standard_normal((nk, hd)) * np.exp2(rng.integers(-6, 6, (nk, hd)))).astype(F32)
        kt = np.zeros(((nk + 15) // 16) * 16 * hd, F32)
        for j in range(nk):
            for d in range(hd):
                kt[_kt_index(hd, j, d)] = k[j, d]
        scale = F32(1 / np.sqrt(hd))
        b = np.concatenate([np.int32([nq, nk]).view(F32), [scale], q.ravel()]).astype(F32)
        got = _kernel_f32(lib, isa, "att_scores", kt, b, count=nq * nk, n=hd).reshape(nq, nk)
        want = _scores_formula(q, k, scale)
        _same_bits(got, want, f"{isa} att_scores hd {hd} nq {nq} nk {nk}")

        lo = rng.integers(0, nk + 1, nq).astype(np.int32)
        hi = np.minimum(lo + rng.integers(0, nk + 1, nq), nk).astype(np.int32)
        lo[0], hi[0] = 0, nk  # one row with every key; another with none (if there are two)
        if nq > 1:
            hi[1] = lo[1]
        m0 = np.where(rng.random(nq) < 0.5, F32(-np.inf), want.max(axis=1) - F32(1)).astype(F32)
        m0[0] = -np.inf
        l0 = np.where(m0 == -np.inf, F32(0), rng.uniform(1, 5, nq)).astype(F32)
        b = np.concatenate([np.concatenate([[nq], lo, hi]).astype(np.int32).view(F32), m0, l0]).astype(F32)
        got = _kernel_f32(lib, isa, "att_softmax", want, b, count=nq * nk + 3 * nq, n=nk)
        p, m, total, alpha = _softmax_formula(want, lo, hi, m0, l0)
        _same_bits(got[: nq * nk].reshape(nq, nk), p, f"{isa} att_softmax p nk {nk}")
        _same_bits(
            got[nq * nk :], np.concatenate([m, total, alpha]), f"{isa} att_softmax m, l, alpha nk {nk}"
        )

        v = (rng.standard_normal((nk, hd)) * np.exp2(rng.integers(-6, 6, (nk, hd)))).astype(F32)
        o = rng.standard_normal((nq, hd)).astype(F32)
        b = np.concatenate([np.int32([nq, nk]).view(F32), p.ravel(), alpha, o.ravel()]).astype(F32)
        got = _kernel_f32(lib, isa, "att_pv", v, b, count=nq * hd, n=hd).reshape(nq, hd)
        acc = (o * alpha[:, None]).astype(F32)
        for j in range(nk):
            acc = _fma32(p[:, j, None], v[None, j, :], acc)
        _same_bits(got, acc, f"{isa} att_pv hd {hd} nq {nq} nk {nk}")


def _attention(lib, isa, q, k, v, window, scale):
    n, nh, hd = q.shape
    nkv = k.shape[1]
    b = np.concatenate([np.int32([hd, nh, nkv, window]).view(F32), [scale], k.ravel(), v.ravel()]).astype(F32)
    return _kernel_f32(lib, isa, "attention", q, b, count=n * nh * hd, n=n).reshape(n, nh, hd)


def _attention_f64(q, k, v, window, scale):
    n, nh, hd = q.shape
    group = nh // k.shape[1]
    out = np.zeros((n, nh, hd))
    for h in range(nh):
        kk, vv = k[:, h // group].astype(np.float64), v[:, h // group].astype(np.float64)
        sc = q[:, h].astype(np.float64) @ kk.T * float(scale)
        i, j = np.indices((n, n))
        sc[(j > i) | ((window > 0) & (j <= i - window))] = -np.inf
        w = np.exp(sc - sc.max(axis=1, keepdims=True))
        out[:, h] = (w / w.sum(axis=1, keepdims=True)) @ vv
    return out


@pytest.mark.parametrize(
    "n, nh, nkv, hd, window",
    [
        (1, 2, 1, 8, 0),
        (15, 4, 2, 32, 0),
        (64, 2, 2, 16, 0),
        (65, 4, 1, 32, 5),
        (130, 2, 1, 40, 64),
        (200, 3, 3, 24, 17),
        (97, 2, 2, 136, 0),
    ],
)
def test_tiled_attention_is_softmax_attention(lib, n, nh, nkv, hd, window):
    """i2s_attention (query tiles of 16, key tiles of 64, online softmax) against float64 softmax
    attention, causal and windowed, across tile boundaries and GQA: within 2e-6 relative of the
    largest output (float32 sums of ~n terms), and with the same bits on every ISA runnable here.
    A query's output does not depend on the tokens after it (its tiles and their order are the
    same), so a prefix of the sequence gives the prefix of the output, bit for bit."""
    rng = np.random.default_rng(n * 31 + hd)
    q, k, v = (rng.standard_normal((n, c, hd)).astype(F32) for c in (nh, nkv, nkv))
    scale = F32(1 / np.sqrt(hd))
    want = _attention_f64(q, k, v, window, scale)
    got = {isa: _attention(lib, isa, q, k, v, window, scale) for isa in ISAS if lib.runnable(isa)}
    assert np.abs(got["scalar"] - want).max() <= 2e-6 * np.abs(want).max()
    for isa, o in got.items():
        _same_bits(o, got["scalar"], f"{isa} attention")
    cut = n // 2 + 1
    prefix = _attention(lib, "scalar", q[:cut], k[:cut], v[:cut], window, scale)
    _same_bits(prefix, got["scalar"][:cut], "prefix")
