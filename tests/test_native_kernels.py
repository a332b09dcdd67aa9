"""The native runtime's SIMD kernels against their scalar twin and the reference quantizer.

The library is built once with backends/native/build.py and loaded with cffi (ABI mode); the
test-only entry point mlrt_test_kernel (src/testhooks.c) runs one kernel of one ISA, so every ISA
runnable on this machine is compared:
- quantize_q8_0: bytes and scale bits identical to mlconf.backends.reference.quant.q8_0 (the
  seed: "Every SIMD implementation is bit-identical to the scalar one") on the spec's edge cases,
  hand-picked blocks (ties, +-0, subnormals, huge, amax below 1e-30, x*id = 0.5 - 2^-25) and
  hypothesis-drawn blocks; non-finite blocks (refused by the API) give the scalar twin's bytes;
- isums_q8_0 / isums_q4_0: exact int32 block sums, against NumPy integer arithmetic;
- dot_q8_0 / dot_q4_0: within a relative tolerance of the exact float64 combination, and
  bit-identical to the scalar twin (all ISAs share one float order; see src/kern_scalar.c);
- dot4_q8_0 / dot4_q4_0 (one weight row, four activation rows): each row bit-identical to the
  single-row dot, on every ISA and against the scalar twin;
- gemm8_q8_0 / gemm8_q4_0 (the packed GEMM of prefill and decode, through mlrt_test_gemm8: the
  rows packed by src/repack.c): every (token, row) bit-identical to the scalar twin's single-row
  dot of the row as stored, for token counts around each table's tile;
- scores_f32 / wsum_f32 (attention's q.k and weighted sum of the values): bit-identical to the
  scalar twin, and near float64, for key counts and head widths around the 8-wide steps;
- softmax_step_f32 and its exp (ml_exp_le0, a polynomial): bit-identical to the scalar twin with
  NaN and infinities among the scores, within 1 ulp of exp and near the float64 softmax.
NEON is checked by cross-compiling tests/neon_main.c with the kernel sources (aarch64-linux-gnu-gcc
-static) and running it under qemu-aarch64 with and without the dot-product extension; the pool
(src/pool.c) by tests/pool_main.c, also under ThreadSanitizer.
"""

from __future__ import annotations

import importlib.util
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlconf import specs
from mlconf.backends.reference import quant

NATIVE = Path(__file__).resolve().parents[1] / "backends" / "native"
SRC = NATIVE / "src"
BLOCK = 32
ML_OK, ML_E_ARG, ML_E_UNSUPPORTED = 0, 4, 6
MACHINE = platform.machine()
X86 = MACHINE in ("x86_64", "AMD64")
ARM = MACHINE in ("aarch64", "arm64")
# The ISAs this machine's build can have; one not runnable on this CPU is skipped with a reason.
ISAS = (
    ["scalar"]
    + (["avx512", "avxvnni", "avx2"] if X86 else [])  # best first (src/dispatch.c)
    + (["neon-dotprod", "neon"] if ARM else [])
)
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
CDEF = """
int mlrt_test_kernel(const char *isa, const char *op, int n, const void *a, const void *b,
                     const float *ad, const float *bd, void *out);
int mlrt_test_gemm8(const char *isa, int fmt, int rows, int cols, int nt, const void *w, const float *wd,
                    int wd_f16, const int8_t *x, const float *xd, float *out);
int mlrt_test_attn(const char *isa, const char *op, int nk, int hd, size_t stride, const float *a,
                   const float *kv, float *out);
const char *ml_isa(void);
int ml_set_isa(const char *isa);
"""
F32_MAX = float.fromhex("0x1.fffffep+127")


def _load_build_module():
    spec = importlib.util.spec_from_file_location("mlrt_native_build", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Kernels:
    """mlrt_test_kernel with NumPy arrays in and out."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    def call(self, isa, op, n, a, b=None, ad=None, bd=None, out_bytes=4):
        out = np.zeros(max(out_bytes, 4), dtype=np.uint8)
        keep = [np.ascontiguousarray(v) if v is not None else None for v in (a, b, ad, bd)]
        ptrs = [self.ffi.NULL if v is None else self.ffi.from_buffer(v) for v in keep]
        rc = self.lib.mlrt_test_kernel(
            isa.encode(),
            op.encode(),
            n,
            ptrs[0],
            ptrs[1],
            self.ffi.cast("const float *", ptrs[2]),
            self.ffi.cast("const float *", ptrs[3]),
            self.ffi.from_buffer(out),
        )
        return rc, out

    def runnable(self, isa):
        rc, _ = self.call(isa, "isums_q8_0", 0, np.zeros(1, np.int8), np.zeros(1, np.int8))
        return rc == ML_OK

    def quantize(self, isa, x):
        x = np.asarray(x, dtype=np.float32).ravel()
        n = x.size
        rc, out = self.call(isa, "quantize_q8_0", n, x, out_bytes=n + 4 * (n // BLOCK))
        assert rc == ML_OK
        return out[:n].view(np.int8).copy(), out[n : n + 4 * (n // BLOCK)].view(np.float32).copy()

    def isums(self, isa, fmt, w, x):
        n = x.size
        rc, out = self.call(isa, f"isums_{fmt}", n, w, x, out_bytes=4 * (n // BLOCK))
        assert rc == ML_OK
        return out[: 4 * (n // BLOCK)].view(np.int32).copy()

    def dot(self, isa, fmt, w, wd, x, xd):
        rc, out = self.call(isa, f"dot_{fmt}", x.size, w, x, wd, xd)
        assert rc == ML_OK
        return out[:4].view(np.float32)[0]

    def gemm8(self, isa, fmt, w, wd, x, xd, wd_f16=False):
        """rows x cols weights as stored (w: rows x bytes, wd: rows x nb) packed (the scales as f16
        with wd_f16), against the nt rows of x (nt x cols int8) and xd (nt x nb): float32 (nt, rows)."""
        rows, nt, cols = wd.shape[0], x.shape[0], x.shape[1]
        out = np.zeros((nt, rows), np.float32)
        keep = [np.ascontiguousarray(v) for v in (w, wd, x, xd)]
        f = self.ffi.from_buffer
        rc = self.lib.mlrt_test_gemm8(
            isa.encode(),
            1 if fmt == "q8_0" else 2,
            rows,
            cols,
            nt,
            f(keep[0]),
            self.ffi.cast("const float *", f(keep[1])),
            int(wd_f16),
            self.ffi.cast("const int8_t *", f(keep[2])),
            self.ffi.cast("const float *", f(keep[3])),
            self.ffi.cast("float *", f(out)),
        )
        assert rc == ML_OK, f"mlrt_test_gemm8 {isa} {fmt}: status {rc}"
        return out

    def dot4(self, isa, fmt, w, wd, x4, xd4):
        """One weight row against the four rows of x4 (4 x n int8) and xd4 (4 x nb float32)."""
        rc, out = self.call(isa, f"dot4_{fmt}", x4.shape[1], w, x4, wd, xd4, out_bytes=16)
        assert rc == ML_OK
        return out[:16].view(np.float32).copy()


@pytest.fixture(scope="session")
def kern(tmp_path_factory) -> Kernels:
    cffi = pytest.importorskip("cffi")
    build = _load_build_module()
    so = build.build(tmp_path_factory.mktemp("mlrt") / "libmlrt.so")  # BuildError fails the tests
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return Kernels(ffi, ffi.dlopen(str(so)))


@pytest.fixture(params=ISAS)
def isa(request, kern) -> str:
    if not kern.runnable(request.param):
        pytest.skip(f"{request.param} kernels are not runnable on this CPU")
    return request.param


def simd_isas(kern) -> list[str]:
    return [i for i in ISAS[1:] if kern.runnable(i)]


# ---------------------------------------------------------------- entry points
def first_choice(runnable) -> str:
    """The table a library starts on: the one MLRT_ISA names when it is runnable (src/cpu.h),
    else the best runnable one."""
    override = os.environ.get("MLRT_ISA", "")
    if override in ISAS and runnable(override):
        return override
    return next(i for i in ISAS[1:] + ["scalar"] if runnable(i))


def test_isa_selection(kern):
    lib = kern.lib
    auto = kern.ffi.string(lib.ml_isa()).decode()
    assert auto == first_choice(kern.runnable), "the first choice is MLRT_ISA's or the best runnable table"
    try:
        assert lib.ml_set_isa(b"scalar") == ML_OK
        assert kern.ffi.string(lib.ml_isa()) == b"scalar"
        assert lib.ml_set_isa(b"no-such-isa") == ML_E_UNSUPPORTED
        assert lib.ml_set_isa(b"neon" if X86 else b"avx2") == ML_E_UNSUPPORTED
        assert lib.ml_set_isa(kern.ffi.NULL) == ML_E_ARG
        assert kern.ffi.string(lib.ml_isa()) == b"scalar", "a refused ml_set_isa changes nothing"
    finally:
        assert lib.ml_set_isa(auto.encode()) == ML_OK


@pytest.mark.skipif(not (X86 and Path("/proc/cpuinfo").exists()), reason="x86 Linux: /proc/cpuinfo")
def test_avx2_detection_agrees_with_the_kernel_s_view(kern):
    """cpu.c's cpuid + xgetbv check against the flags Linux reports (which it clears for
    features the OS does not enable)."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    assert kern.runnable("avx2") == ({"avx2", "fma", "f16c"} <= flags)
    assert kern.runnable("avxvnni") == ({"avx2", "fma", "f16c", "avx_vnni"} <= flags)
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert kern.runnable("avx512") == ({"avx2", "fma", "f16c"} | avx512 <= flags)


ENV_ISA_PROBE = """
import cffi, sys
ffi = cffi.FFI()
ffi.cdef("const char *ml_isa(void);")
print(" ".join(ffi.string(ffi.dlopen(p).ml_isa()).decode() for p in sys.argv[1:]))
"""


@pytest.mark.parametrize("value", ["scalar", "", "no-such-isa", "neon" if X86 else "avx2"])
def test_mlrt_isa_sets_the_first_choice_of_both_libraries(kern, value, tmp_path):
    """MLRT_ISA=scalar starts libmlrt and libmlbitnet on the scalar table (a host without AVX2);
    an empty, unknown or unrunnable name leaves each library's best table (libmlrt's here; the
    bitnet tables' order is tests/test_bitnet_kernels.py's)."""
    build = _load_build_module()
    libs = [build.build(tmp_path / "libmlrt.so"), build.build(tmp_path / "libmlbitnet.so", lib="mlbitnet")]

    def probe(env):
        return subprocess.run(
            [sys.executable, "-c", ENV_ISA_PROBE, *map(str, libs)],
            env=env,
            capture_output=True,
            encoding="utf-8",
            check=True,
        ).stdout.split()

    unset = probe({k: v for k, v in os.environ.items() if k != "MLRT_ISA"})
    assert unset[0] == next(i for i in ISAS[1:] + ["scalar"] if kern.runnable(i))
    assert probe({**os.environ, "MLRT_ISA": value}) == (["scalar"] * 2 if value == "scalar" else unset)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed (apt-get install clang)")
def test_clang_builds_both_libraries_with_the_same_kernels(kern, tmp_path, monkeypatch):
    """CC=clang (the README's other compiler) compiles every source with -Werror (both libraries
    and the static worker executable), and its library's kernels give gcc's bytes on every ISA
    runnable here."""
    cffi = pytest.importorskip("cffi")
    build = _load_build_module()
    monkeypatch.setenv("CC", "clang")
    so = build.build(tmp_path / "libmlrt_clang.so")
    build.build(tmp_path / "libmlbitnet_clang.so", lib="mlbitnet")
    build.build_worker(tmp_path / "mlrt-worker", machine=MACHINE, cc="clang")
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    clang = Kernels(ffi, ffi.dlopen(str(so)))
    x = np.random.default_rng(5).integers(-(2**20), 2**20, (64, BLOCK)) * np.float32(2.0**-12)
    for isa in ISAS:
        assert clang.runnable(isa) == kern.runnable(isa), isa
        if kern.runnable(isa):
            for a, b in zip(clang.quantize(isa, x), kern.quantize(isa, x), strict=True):
                assert a.tobytes() == b.tobytes(), isa


def test_hook_arguments(kern):
    z = np.zeros(64, np.int8)
    assert kern.call("scalar", "isums_q8_0", 33, z, z)[0] == ML_E_ARG
    assert kern.call("scalar", "isums_q8_0", -32, z, z)[0] == ML_E_ARG
    one = np.ones(1, np.float32)
    assert kern.call("scalar", "no_such_op", 32, z, z, one, one)[0] == ML_E_ARG
    assert kern.call("scalar", "isums_q8_0", 32, z, None)[0] == ML_E_ARG
    assert kern.call("scalar", "dot_q8_0", 32, z, z)[0] == ML_E_ARG
    assert kern.call("avx2" if ARM else "neon", "isums_q8_0", 32, z, z)[0] == ML_E_UNSUPPORTED


# ---------------------------------------------------------------- quantize_q8_0: bytes
def assert_quant_matches_reference(kern, isa, x: np.ndarray, what: str = "") -> None:
    x = np.asarray(x, dtype=np.float32).reshape(-1, BLOCK)
    want_q, want_d = quant.q8_0(x)
    want_d = want_d.ravel()
    q, d = kern.quantize(isa, x)
    q = q.reshape(-1, BLOCK)
    bad = [
        i
        for i in range(len(x))
        if q[i].tobytes() != want_q[i].tobytes() or d[i].tobytes() != want_d[i].tobytes()
    ]
    if bad:
        i = bad[0]
        diff = [
            (j, float(x[i, j]).hex(), int(q[i, j]), int(want_q[i, j]))
            for j in range(BLOCK)
            if q[i, j] != want_q[i, j]
        ][:4]
        pytest.fail(
            f"{isa} quantize_q8_0 {what}: {len(bad)} of {len(x)} blocks differ from the reference; "
            f"block {i}: d {float(d[i]).hex()} vs {float(want_d[i]).hex()}, (j, x, q, want) {diff}"
        )


def _hex_block(spec) -> np.ndarray:
    def val(v):
        return float.fromhex(v) if isinstance(v, str) else float(v)

    vals = [val(spec.get("fill", 0))] * BLOCK
    for i, v in (spec.get("at") or {}).items():
        vals[int(i)] = val(v)
    return np.array(vals, dtype=np.float32)


SPEC_Q8 = [e for e in specs.load("quant")["edge_cases"] if e["op"] == "q8_0"]


@pytest.mark.parametrize("case", SPEC_Q8, ids=[e["name"] for e in SPEC_Q8])
def test_quantize_spec_edge_cases(kern, isa, case):
    """specs/quant.yaml's hand-derived q8_0 blocks: the expected bytes, on every ISA."""
    x = _hex_block(case["x"])
    want_q = _hex_block(case["expect"]["q"]).astype(np.int8)
    want_d = np.float32(
        float.fromhex(case["expect"]["d"]) if isinstance(case["expect"]["d"], str) else case["expect"]["d"]
    )
    q, d = kern.quantize(isa, x)
    assert d.tobytes() == want_d.tobytes(), f"d {float(d[0]).hex()} vs {float(want_d).hex()}"
    assert q.tobytes() == want_q.tobytes()


def edge_blocks() -> np.ndarray:
    """Blocks where a wrong operation order, an FMA or a bad amax shows."""
    h = float.fromhex
    z = np.zeros(BLOCK, np.float32)
    out = []

    def put(fill, at=None):
        b = np.full(BLOCK, fill, np.float32)
        for j, v in (at or {}).items():
            b[j] = v
        out.append(b)

    put(0.0)
    put(-0.0, {3: 0.0})
    put(h("0x1p-149"), {5: h("-0x1p-140"), 9: -0.0})  # subnormals only: d = 0
    put(0.0, {3: h("0x1.4484cp-100")})  # amax = float32(1e-30): quantized
    put(0.0, {3: h("-0x1.4484bep-100"), 4: h("0x1p-149")})  # just below 1e-30: zeros
    put(h("0x1.fffffep-2"), {0: 127.0, 1: h("-0x1.fffffep-2")})  # x*id = 0.5 - 2^-25 -> q = 1
    put(0.0, {j: (j - 15.5) * (1 if j % 2 else -1) for j in range(BLOCK)} | {31: 127.0})  # ties, id = 1
    put(F32_MAX, {1: -F32_MAX, 2: 1.0, 3: -0.0})  # huge
    put(0.0, {j: (F32_MAX if j % 2 else -F32_MAX) / (j + 1) for j in range(BLOCK)})
    put(0.0, {j: (-1) ** j * 2.0 ** (j - 16) for j in range(BLOCK)})  # 32 binades in one block
    put(h("0x1p-126"), {7: 3.0, 8: h("-0x1p-149"), 9: -0.0})  # subnormals beside a normal amax
    put(1.0, {9: -1.0})  # every |x| = amax
    # x * id = k + 0.5 exactly, for amax = 127 * 2^e (id a power of two)
    for e in (-60, -1, 0, 3, 40):
        put(
            0.0,
            {j: math.ldexp((j - 15.5) * 4 + 0.5 * (j % 3), e) for j in range(BLOCK)}
            | {0: math.ldexp(127.0, e)},
        )
    out.append(z)
    return np.stack(out)


def test_quantize_edge_blocks(kern, isa):
    assert_quant_matches_reference(kern, isa, edge_blocks(), "edge blocks")


def seeded_blocks(seed: int, n: int = 2048) -> np.ndarray:
    """Several distributions, each block scaled by 2^e with e across the whole float32 range."""
    rng = np.random.default_rng(seed)
    e = rng.integers(-140, 120, size=(n, 1))
    kind = rng.integers(0, 4, size=(n, 1))
    uniform = rng.uniform(-1, 1, (n, BLOCK))
    wide = rng.uniform(-0.5, 0.5, (n, BLOCK)) * np.exp2(-rng.integers(0, 40, (n, BLOCK)))
    halves = rng.integers(-254, 255, (n, BLOCK)) / 2.0  # ties when amax = 127
    bits = rng.integers(0, 2**32, (n, BLOCK), dtype=np.uint64).astype(np.uint32)
    bits = np.where((bits & 0x7F800000) == 0x7F800000, bits & 0xBFFFFFFF, bits).view(np.float32)
    x = np.where(
        kind == 0,
        np.ldexp(uniform, e),
        np.where(kind == 1, np.ldexp(wide, e), np.where(kind == 2, halves, bits.astype(np.float64))),
    )
    with np.errstate(over="ignore"):
        x = x.astype(np.float32)
    return np.where(np.isfinite(x), x, np.float32(F32_MAX)).astype(np.float32)


def near_tie_blocks(seed: int, n: int = 4096) -> np.ndarray:
    """x * id within two ulps of k + 0.5 for random amax (id not a power of two): where a fused
    multiply-add (one rounding instead of two) or a round-half-even changes q."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    amax = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-90, 90, n))).astype(f32)
    idd = (f32(127) / amax).astype(f32)
    k = rng.integers(0, 127, (n, BLOCK)).astype(f32)
    v = ((k + f32(0.5)) / idd[:, None]).astype(f32)
    v = (v.view(np.int32) + rng.integers(-2, 3, (n, BLOCK)).astype(np.int32)).view(f32)
    v = np.minimum(v, amax[:, None]) * np.where(rng.random((n, BLOCK)) < 0.5, f32(-1), f32(1))
    v[:, 0] = amax * np.where(rng.random(n) < 0.5, f32(-1), f32(1))
    return v.astype(f32)


def test_quantize_near_ties(kern, isa):
    assert_quant_matches_reference(kern, isa, near_tie_blocks(3), "near ties")


@pytest.mark.parametrize("seed", [1, 2])
def test_quantize_seeded(kern, isa, seed):
    x = seeded_blocks(seed)
    assert_quant_matches_reference(kern, isa, x, f"seed {seed}")
    # odd lengths: tails and n = 0
    for nb in (0, 1, 3, 5, 9):
        assert_quant_matches_reference(kern, isa, x[:nb], f"seed {seed}, {nb} blocks")


_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
_ELEMENT = st.one_of(
    _F32,
    st.integers(-254, 254).map(lambda i: i / 2.0),
    st.sampled_from(
        [
            0.0,
            -0.0,
            127.0,
            -127.0,
            float.fromhex("0x1.fffffep-2"),
            float.fromhex("0x1p-149"),
            F32_MAX,
            -F32_MAX,
        ]
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    x=hnp.arrays(np.float32, st.integers(1, 6).map(lambda k: BLOCK * k), elements=_ELEMENT),
    scale=st.sampled_from([1.0, 2.0**-100, 2.0**-20, 2.0**30]),
)
def test_quantize_hypothesis(kern, x, scale):
    with np.errstate(over="ignore"):
        x = (x * np.float32(scale)).astype(np.float32)
    assume(np.isfinite(x).all())
    for name in ISAS:
        if kern.runnable(name):
            assert_quant_matches_reference(kern, name, x, "hypothesis")


def test_quantize_nonfinite_same_bytes_every_isa(kern):
    """ml_quantize_q8_0 refuses non-finite input, but an activation can overflow: every ISA gives
    the scalar twin's bytes (NaN never wins amax, a NaN quant is -127)."""
    x = np.tile(np.linspace(-3, 3, BLOCK, dtype=np.float32), (6, 1))
    x[0, 4] = np.nan
    x[1, :] = np.nan
    x[2, 30] = np.inf
    x[3, 0], x[3, 1] = -np.inf, np.nan
    x[4, 7] = -np.inf
    x[5, ::2] = np.nan
    want = kern.quantize("scalar", x)
    assert want[0].reshape(6, BLOCK)[1].tolist() == [0] * BLOCK  # all NaN: amax 0
    for name in simd_isas(kern):
        got = kern.quantize(name, x)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes(), name


# ---------------------------------------------------------------- integer sums and dots
def q4_levels(w4: np.ndarray) -> np.ndarray:
    """Independent unpack: byte j of a block holds element j (low nibble) and j + 16 (high)."""
    b = w4.reshape(-1, 16).astype(np.int64)
    return np.concatenate([(b & 15) - 8, (b >> 4) - 8], axis=1).ravel()


def int_inputs(rng, nb: int):
    w8 = rng.integers(-127, 128, nb * BLOCK).astype(np.int8)
    x = rng.integers(-127, 128, nb * BLOCK).astype(np.int8)
    w4 = rng.integers(0, 256, nb * BLOCK // 2).astype(np.uint8)
    return w8, w4, x


def exact_isums(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (w.astype(np.int64) * x.astype(np.int64)).reshape(-1, BLOCK).sum(axis=1)


NBS = [0, 1, 2, 3, 4, 5, 7, 8, 13, 64, 67]


def test_isums_random_and_extremes(kern, isa):
    rng = np.random.default_rng(7)
    cases = [(f"random nb={nb}", *int_inputs(rng, nb)) for nb in NBS for _ in range(3)]
    for a in (127, -127):
        for c in (127, -127):  # the largest |sum|: 32 * 127 * 127, maddubs pairs at 32258
            w4 = np.full(128, 0x00 if c > 0 else 0xFF, np.uint8)
            cases.append((f"w8={a} x={c}", np.full(256, a, np.int8), w4, np.full(256, c, np.int8)))
    for what, w8, w4, x in cases:
        got8 = kern.isums(isa, "q8_0", w8, x)
        assert got8.tolist() == exact_isums(w8, x).tolist(), f"{isa} isums_q8_0 {what}"
        got4 = kern.isums(isa, "q4_0", w4, x)
        assert got4.tolist() == exact_isums(q4_levels(w4), x).tolist(), f"{isa} isums_q4_0 {what}"


def test_dots(kern, isa):
    """Within 1e-5 of the exact combination (relative to the sum of |terms|: float32 rounding of
    up to a few hundred terms), and bit-identical to the scalar twin (one float order)."""
    rng = np.random.default_rng(11)
    for nb in NBS + [128]:
        for _ in range(4):
            w8, w4, x = int_inputs(rng, nb)
            wd = (rng.uniform(-1, 1, nb) * np.exp2(rng.integers(-14, 6, nb))).astype(np.float32)
            xd = (rng.uniform(0, 1, nb) * np.exp2(rng.integers(-14, 6, nb))).astype(np.float32)
            for fmt, w, lv in (("q8_0", w8, w8), ("q4_0", w4, q4_levels(w4))):
                terms = wd.astype(np.float64) * xd * exact_isums(lv, x)
                got = kern.dot(isa, fmt, w, wd, x, xd)
                what = f"{isa} dot_{fmt} nb={nb}"
                assert abs(float(got) - terms.sum()) <= 1e-5 * np.abs(terms).sum() + 1e-30, what
                want = kern.dot("scalar", fmt, w, wd, x, xd)
                assert np.float32(got).tobytes() == np.float32(want).tobytes(), f"{what} vs scalar"


def test_dot4_equals_single_row_dots(kern, isa):
    """The four-row dots (prefill's matmul) give each row exactly the single-row dot's bits, on
    every ISA and against the scalar twin: batched and one-token-at-a-time forwards agree."""
    rng = np.random.default_rng(13)
    cases = []
    for nb in NBS + [18, 48, 128]:
        for _ in range(3):
            w8, w4, _x = int_inputs(rng, nb)
            x4 = rng.integers(-127, 128, (4, nb * BLOCK)).astype(np.int8)
            wd = (rng.uniform(-1, 1, nb) * np.exp2(rng.integers(-14, 6, nb))).astype(np.float32)
            xd4 = (rng.uniform(0, 1, (4, nb)) * np.exp2(rng.integers(-14, 6, (4, nb)))).astype(np.float32)
            cases.append((f"random nb={nb}", w8, w4, wd, x4, xd4))
    for a in (127, -127):  # the largest sums; Q4_0 nibbles 0 (-8) and 15 (7)
        w4 = np.full(9 * 16, 0x00 if a > 0 else 0xFF, np.uint8)
        x4 = np.stack([np.full(9 * BLOCK, v, np.int8) for v in (127, -127, 127, -127)])
        cases.append(
            (
                f"extremes {a}",
                np.full(9 * BLOCK, a, np.int8),
                w4,
                np.ones(9, np.float32),
                x4,
                np.ones((4, 9), np.float32),
            )
        )
    for what, w8, w4, wd, x4, xd4 in cases:
        for fmt, w in (("q8_0", w8), ("q4_0", w4)):
            got = kern.dot4(isa, fmt, w, wd, x4, xd4)
            for r in range(4):
                one = kern.dot(isa, fmt, w, wd, x4[r], xd4[r])
                want = kern.dot("scalar", fmt, w, wd, x4[r], xd4[r])
                tag = f"{isa} dot4_{fmt} {what} row {r}"
                assert got[r].tobytes() == np.float32(one).tobytes(), f"{tag} vs dot"
                assert got[r].tobytes() == np.float32(want).tobytes(), f"{tag} vs scalar"


def test_gemm8_equals_single_row_dots(kern, isa):
    """The packed GEMM (src/repack.c's layout, kern_*'s gemm8) gives every token and row exactly
    the scalar twin's single-row dot of the row as stored: token counts below, at and around the
    tiles (2 and 4 tokens), block counts around the four running sums, the extreme sums (where
    Q8_0's + 128 and Q4_0's unsigned nibbles reach the largest unsigned operands), and rows whose
    bytes differ so a misplaced row or 4-byte group shows; the scales packed as floats and, where
    they are f16 values (a file with scale_f16), as f16."""
    if isa in ("neon", "neon-dotprod"):
        pytest.skip(f"{isa} has no packed GEMM: forward.c runs dot4 on the rows as stored")
    rng = np.random.default_rng(17)
    cases = []
    for nb, nt, rows in (
        (1, 1, 8),
        (2, 3, 8),
        (3, 4, 16),
        (4, 5, 8),
        (5, 2, 8),
        (6, 3, 16),  # a pair of groups below a full tile: the 8-row path (kern_x86.h PAIRS)
        (7, 9, 24),
        (8, 1, 8),
        (13, 7, 16),
        (18, 64, 8),
        (67, 6, 8),
    ):
        w8 = rng.integers(-127, 128, (rows, nb * BLOCK)).astype(np.int8)
        w4 = rng.integers(0, 256, (rows, nb * BLOCK // 2)).astype(np.uint8)
        x = rng.integers(-127, 128, (nt, nb * BLOCK)).astype(np.int8)
        wd = (rng.uniform(-1, 1, (rows, nb)) * np.exp2(rng.integers(-14, 6, (rows, nb)))).astype(np.float32)
        xd = (rng.uniform(0, 1, (nt, nb)) * np.exp2(rng.integers(-14, 6, (nt, nb)))).astype(np.float32)
        cases.append((f"random nb={nb} nt={nt} rows={rows}", w8, w4, wd, x, xd))
    for a in (127, -127):  # the largest sums; Q4_0 nibbles 0 (-8) and 15 (7)
        x = np.stack([np.full(9 * BLOCK, v, np.int8) for v in (127, -127, 127, -127, 127)])
        cases.append(
            (
                f"extremes {a}",
                np.full((8, 9 * BLOCK), a, np.int8),
                np.full((8, 9 * 16), 0x00 if a > 0 else 0xFF, np.uint8),
                np.ones((8, 9), np.float32),
                x,
                np.ones((5, 9), np.float32),
            )
        )
    for what, w8, w4, wd, x, xd in cases:
        for f16 in (False, True):
            if f16:  # f16 values, subnormals included
                wd = wd.astype(np.float16).astype(np.float32)
            for fmt, w in (("q8_0", w8), ("q4_0", w4)):
                got = kern.gemm8(isa, fmt, w, wd, x, xd, f16)
                for t in range(x.shape[0]):
                    for r in range(wd.shape[0]):
                        want = np.float32(kern.dot("scalar", fmt, w[r], wd[r], x[t], xd[t]))
                        tag = f"{isa} gemm8_{fmt} {what} f16 {f16} t {t} row {r}"
                        assert got[t, r].tobytes() == want.tobytes(), tag


def _attn(kern, isa, op, nk, hd, stride, a, kv, out: int | None = None):
    size = out if out is not None else nk if op != "wsum_f32" else hd
    out = np.zeros(max(size, 1), np.float32)
    f, c = kern.ffi.from_buffer, kern.ffi.cast
    rc = kern.lib.mlrt_test_attn(
        isa.encode(),
        op.encode(),
        nk,
        hd,
        stride,
        c("const float *", f(a)),
        c("const float *", f(kv)),
        c("float *", f(out)),
    )
    assert rc == ML_OK, f"mlrt_test_attn {isa} {op}: status {rc}"
    return out[:size]


def test_attention_kernels_equal_the_scalar_twin(kern, isa):
    """scores_f32 (8 keys at a time on x86) and wsum_f32 (64 outputs at a time, the output rescaled
    by alpha first: the online softmax's step) give the scalar
    twin's bits for key counts and head widths around their steps, keys strided as in the KV cache;
    both stay near the float64 result (a wrong order would move bits, a wrong key or lane far more)."""
    rng = np.random.default_rng(19)
    for nk in (0, 1, 7, 8, 9, 16, 23, 65):
        for hd in (1, 4, 8, 12, 36, 64, 72, 128, 136):
            stride = hd + int(rng.integers(0, 3)) * 8
            q = rng.standard_normal(hd).astype(np.float32)
            kv = rng.standard_normal(max(nk, 1) * stride).astype(np.float32)
            w = rng.uniform(0, 1, max(nk, 1)).astype(np.float32)
            keys = kv[: nk * stride].reshape(nk, stride)[:, :hd].astype(np.float64)
            alpha, o0 = np.float32(rng.uniform(0, 1)), rng.standard_normal(hd).astype(np.float32)
            for op, a, exact in (
                ("scores_f32", q, keys @ q.astype(np.float64)),
                ("wsum_f32", np.concatenate([[alpha], o0, w]).astype(np.float32), alpha * o0 + w[:nk] @ keys),
            ):
                got = _attn(kern, isa, op, nk, hd, stride, a, kv)
                want = _attn(kern, "scalar", op, nk, hd, stride, a, kv)
                tag = f"{isa} {op} nk={nk} hd={hd} stride={stride}"
                assert got.tobytes() == want.tobytes(), tag
                np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4 * (hd + nk), err_msg=tag)


def test_exp_le0_is_within_one_ulp_of_exp(kern):
    """ml_exp_le0 (the softmax's exp, one polynomial on every table) on a dense sweep of [-87, 0]
    and the edges: within 1 ulp of the float64 exp; 0 below -87 and at -inf, 1 at +-0, NaN kept."""
    rng = np.random.default_rng(23)
    x = np.concatenate(
        [
            np.linspace(-87, 0, 200_001, dtype=np.float32),
            -rng.exponential(3, 100_000).astype(np.float32),
            np.float32([-0.0, 0.0, -1e-30, -87.0, -86.99999, -87.00001, -1e4, -np.inf, np.nan]),
        ]
    )
    got = _attn(kern, "scalar", "exp", len(x), 0, 0, x, np.zeros(1, np.float32))
    want = np.exp(x.astype(np.float64))
    live = x >= -87
    ulp = np.spacing(want[live].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[live] - want[live]) / ulp) <= 1.0  # measured: 0.97
    assert np.all(got[(x < -87) & ~np.isnan(x)] == 0)
    assert np.isnan(got[np.isnan(x)]).all() and np.all(got[x == 0] == 1.0)


def test_softmax_step_equals_the_scalar_twin(kern, isa):
    """softmax_step_f32 (8 lanes on x86: one online-softmax step of the tiled attention) gives the
    scalar twin's bits around the 8-wide steps, with NaN, +-inf, -0 and huge scores (the max skips
    NaN on both), from no keys seen (m = -inf) or a running max below or above the tile's; and it
    is the float64 step: weights exp(x - mt), l = l alpha + sum, alpha = exp(m - mt)."""
    rng = np.random.default_rng(29)
    for n in (0, 1, 7, 8, 9, 16, 23, 64, 65, 512, 1031):
        for scale, what in ((0.125, "normal"), (1.0, "wide"), (0.125, "special")):
            x = (rng.standard_normal(n) * (30 if what == "wide" else 3)).astype(np.float32)
            if what == "special" and n:
                spots = rng.integers(0, n, 4)
                x[spots] = np.float32([np.nan, -np.inf, -0.0, 3e38])[: len(spots)]
            for m0, l0 in ((-np.inf, 0.0), (-1.0, 2.5), (9.0, 7.0)):
                kv = np.float32([scale, m0, l0])
                buf = np.concatenate([x, np.zeros(3, np.float32)])
                got = _attn(kern, isa, "softmax_step_f32", n, 0, 0, buf, kv, out=n + 3)
                want = _attn(kern, "scalar", "softmax_step_f32", n, 0, 0, buf, kv, out=n + 3)
                tag = f"{isa} softmax step n={n} {what} m={m0}"
                assert got.tobytes() == want.tobytes(), tag
                if what != "special" and n:
                    z = x.astype(np.float64) * scale
                    mt = max(m0, z.max())
                    alpha = 0.0 if m0 == -np.inf else np.exp(m0 - mt)
                    e = np.exp(z - mt)
                    np.testing.assert_allclose(got[:n], e, rtol=2e-6, atol=1e-30, err_msg=tag)
                    np.testing.assert_allclose(
                        got[n:], [mt, l0 * alpha + e.sum(), alpha], rtol=2e-6, atol=1e-30, err_msg=tag
                    )


def test_gemm8_refuses_rows_not_in_groups(kern):
    """The hook packs whole groups of 8 rows only (forward.c sends the rest through dot)."""
    rc = kern.lib.mlrt_test_gemm8(
        b"scalar",
        1,
        12,
        32,
        1,
        kern.ffi.new("int8_t[]", 12 * 32),
        kern.ffi.new("float[]", 12),
        0,
        kern.ffi.new("int8_t[]", 32),
        kern.ffi.new("float[]", 1),
        kern.ffi.new("float[]", 12),
    )
    assert rc == ML_E_ARG


# ---------------------------------------------------------------- C drivers: NEON under qemu, the pool
def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """A driver run; without MLRT_ISA, which would steer the automatic choice it checks."""
    env = {k: v for k, v in os.environ.items() if k != "MLRT_ISA"}
    return subprocess.run(cmd, capture_output=True, encoding="utf-8", timeout=timeout, env=env)


def _compile(cc: str, out: Path, sources: list[tuple[Path, list[str]]], link: list[str]) -> Path:
    """Compile each source with its own flags (the ISA flags must not leak into the scalar twin)
    and link: build.compile_link, once per session for the same inputs (BuildError fails)."""
    return _load_build_module().compile_link(cc, CFLAGS, sources, link, out)


NEON_SOURCES = [
    (NATIVE / "tests" / "neon_main.c", []),
    (SRC / "kern_scalar.c", []),
    (SRC / "dispatch.c", []),
    (SRC / "cpu.c", []),
    (SRC / "f16.c", []),
    (SRC / "kern_neon.c", []),
    (SRC / "kern_neon_dotprod.c", ["-march=armv8.2-a+dotprod"]),
]


@pytest.fixture(scope="module")
def neon_driver(tmp_path_factory) -> list[str]:
    """The NEON driver and the command prefix that runs it: qemu-aarch64 on other machines."""
    if ARM:
        exe = _compile("gcc", tmp_path_factory.mktemp("neon") / "neon_main", NEON_SOURCES, [])
        return [str(exe)]
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        pytest.skip(
            f"NEON kernels untested: {', '.join(missing)} not found "
            "(apt-get install gcc-aarch64-linux-gnu qemu-user)"
        )
    exe = _compile(
        "aarch64-linux-gnu-gcc", tmp_path_factory.mktemp("neon") / "neon_main", NEON_SOURCES, ["-static"]
    )
    return ["qemu-aarch64", str(exe)]


# (qemu cpu, driver arguments, tables compared): a dotprod CPU picks neon-dotprod and both tables
# are compared; a CPU without dotprod picks neon and must not run the dotprod table; ml_set_isa
# forces plain neon on a dotprod CPU.
NEON_RUNS = [
    ("max", ["--expect", "neon-dotprod"], ["neon", "neon-dotprod"]),
    ("cortex-a57", ["--expect", "neon"], ["neon"]),
    ("max", ["--force", "neon", "--seed", "12345"], ["neon"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("cpu", "args", "tables"), NEON_RUNS, ids=["dotprod", "no-dotprod", "forced-neon"])
def test_neon_kernels(neon_driver, cpu, args, tables):
    cmd = list(neon_driver)
    if cmd[0] == "qemu-aarch64":
        cmd[1:1] = ["-cpu", cpu]
    elif args[0] == "--expect":
        args, tables = [], ["neon"]  # native aarch64: whatever this CPU has
    cmd += ["--rounds", "800", *args]
    r = _run(cmd)
    out = f"{' '.join(cmd)}\n{r.stdout}{r.stderr}"
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), out
    for name in tables:
        assert any(
            line.startswith(f"{name}: quantize") and line.endswith(": 0 mismatches")
            for line in r.stdout.splitlines()
        ), out


@pytest.mark.slow
@pytest.mark.parametrize("table", ["scalar", "neon", "neon-dotprod"])
def test_neon_quantize_matches_reference(neon_driver, table):
    """The aarch64 build (FMA in the base ISA: contraction would show here) against the reference."""
    x = np.concatenate([edge_blocks(), near_tie_blocks(5, 4096), seeded_blocks(9, 2048)])
    cmd = list(neon_driver)
    if cmd[0] == "qemu-aarch64":
        cmd[1:1] = ["-cpu", "max"]
    r = subprocess.run(cmd + ["--quantize", table], input=x.tobytes(), capture_output=True, timeout=120)
    if r.returncode and b"not runnable" in r.stderr:
        pytest.skip(f"{table} is not runnable on this CPU")
    assert r.returncode == 0, r.stderr.decode()
    q = np.frombuffer(r.stdout[: x.size], np.int8)
    d = np.frombuffer(r.stdout[x.size :], np.float32)
    want_q, want_d = quant.q8_0(x)
    assert d.tobytes() == want_d.tobytes(), f"{table}: scales differ from the reference"
    bad = np.flatnonzero((q.reshape(-1, BLOCK) != want_q).any(axis=1))
    assert not len(bad), f"{table}: {len(bad)} of {len(x)} blocks differ from the reference, first {bad[:5]}"


@pytest.mark.slow
@pytest.mark.skipif(not X86, reason="the AVX2 driver build is for x86-64")
def test_avx2_driver_sanitized(tmp_path):
    """The same driver natively against the x86 tables this CPU runs (AVX2, AVX-VNNI, AVX-512),
    under AddressSanitizer + UBSan (loads past a block's end, misaligned accesses, signed overflow
    in the sums). The ISA flags are build.py's."""
    san = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    isa_flags = _load_build_module().ISA_FLAGS
    tables = ("kern_avx2.c", "kern_avxvnni.c", "kern_avx512.c")
    srcs = [
        (NATIVE / "tests" / "neon_main.c", san),
        (SRC / "kern_scalar.c", san),
        (SRC / "dispatch.c", san),
        (SRC / "cpu.c", san),
        (SRC / "f16.c", san),
        *((SRC / t, [*san, *isa_flags[t][1]]) for t in tables),
    ]
    exe = _compile("gcc", tmp_path / "kern_main", srcs, san)
    r = _run([str(exe), "--rounds", "300"])
    if r.returncode and "avx2: not runnable" in r.stdout:
        pytest.skip("this CPU has no AVX2")
    assert r.returncode == 0, r.stdout + r.stderr
    for isa in ("avx2", "avxvnni", "avx512"):
        assert f"{isa}: quantize" in r.stdout or f"{isa}: not runnable here" in r.stdout, r.stdout
    assert "avx2: quantize" in r.stdout and r.stdout.rstrip().endswith("OK")


def _pool_build(tmp_path: Path, flags: list[str]) -> Path:
    srcs = [(NATIVE / "tests" / "pool_main.c", [*flags, "-pthread"]), (SRC / "pool.c", [*flags, "-pthread"])]
    return _compile("gcc", tmp_path / "pool_main", srcs, [*flags, "-pthread"])


def test_pool(tmp_path):
    r = _run([str(_pool_build(tmp_path, []))], timeout=60)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr


@pytest.mark.slow
def test_pool_thread_sanitizer(tmp_path):
    exe = _pool_build(tmp_path, ["-O1", "-g", "-fsanitize=thread"])
    r = _run([str(exe)], timeout=120)
    if r.returncode and "ThreadSanitizer" in r.stderr and "WARNING: ThreadSanitizer" not in r.stderr:
        pytest.skip(f"ThreadSanitizer cannot run here: {r.stderr.strip().splitlines()[0]}")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr
