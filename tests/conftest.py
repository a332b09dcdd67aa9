"""Shared fixtures of the unit tests: a generated fixture set, a scratch folder for hypothesis
examples, a hypothesis strategy of valid MLB v1 headers, and the environments that make NumPy and
OpenBLAS take another host's loops.

The strategy is written from the seed's header table (000_ff09b1667d2ad826.txt), not from the
code under test: every value it draws satisfies every rule the seed states (and the decisions of
specs/mlb_errors.yaml for the fields the seed leaves open).
"""

from __future__ import annotations

import atexit
import math
import os
import platform
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from mlconf import fixtures as mlfixtures

# The fixture cache of `mlconf run` (fixtures.cached()) goes to a new folder of this test session,
# never the user's ~/.cache nor an earlier run's: a test's outcome must not depend on an existing
# cache. Subprocesses of the CLI tests inherit it; it is removed when the session ends.
_CACHE = tempfile.mkdtemp(prefix="mlconf-test-cache-")
os.environ["MLCONF_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


def pytest_configure(config):
    """One C build cache per session (backends/native/build.py, $MLRT_BUILD_CACHE), shared by the
    xdist workers, which inherit the variable from the controller: each C variant (a sanitizer
    build, a driver, the clang build) is compiled once, whichever test asks first. Made fresh
    here, never the user's: an entry is keyed by its inputs' hash, yet a test's outcome must not
    depend on an existing cache."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    cache = tempfile.mkdtemp(prefix="mlconf-test-builds-")
    os.environ["MLRT_BUILD_CACHE"] = cache
    atexit.register(shutil.rmtree, cache, ignore_errors=True)


# Hypothesis: the same examples on every run and host (derandomize: drawn from a seed derived
# from each test, not from the clock), no example database (.hypothesis/ in the working folder
# would be an existing cache that changes what runs), no deadline (a slow machine must not fail a
# test). `pytest --hypothesis-profile=explore` searches with fresh random examples instead.
settings.register_profile("mlconf", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, database=None, deadline=None)
settings.load_profile("mlconf")

U32_MAX = 2**32 - 1
F32_MAX = 3.4028234663852886e38
# Layer-flag bytes the seed allows: bits 0..2 without bits 1+2 together, or bit 3 alone.
VALID_FLAGS = (0, 1, 2, 3, 4, 5, 8)


@pytest.fixture(scope="session")
def asan_libmlrt(tmp_path_factory) -> Path:
    """The native runtime built once per session with AddressSanitizer + UBSan (build.py
    --sanitize), for every test that runs it: through lib:PATH or linked into a test driver."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed for the sanitizer build")
    from mlconf.backends.native import build

    try:
        return build.build(tmp_path_factory.mktemp("asan") / "libmlrt_asan.so", sanitize=True)
    except build.BuildError as e:
        pytest.skip(f"no sanitizer build here: {str(e).strip().splitlines()[-1][:200]}")


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> tuple[Path, list]:
    """Every fixture of mlconf.fixtures.catalog(), written once per session: (folder, fixtures)."""
    out = tmp_path_factory.mktemp("fixtures")
    return out, mlfixtures.generate(out)


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    """A folder for files written by hypothesis examples (function-scoped tmp_path does not
    reset between examples)."""
    return tmp_path_factory.mktemp("scratch")


def _f32(lo: float = 0.0, hi: float = 1e6, exclude_min: bool = False):
    return st.floats(
        min_value=lo, max_value=hi, exclude_min=exclude_min, allow_nan=False, allow_infinity=False, width=32
    )


def _step(n_heads: int) -> int:
    """Smallest even head size h with h * n_heads a multiple of 32."""
    need = 32 // math.gcd(n_heads, 32)
    return need * 2 // math.gcd(need, 2)


@st.composite
def valid_models(draw, max_layers: int = 3, max_q_dim: int = 256) -> tuple[dict, list[int] | None]:
    """(header dict with every field, layer-flag bytes or None) of a small valid model."""
    n_kv = draw(st.integers(1, 4))
    n_heads = n_kv * draw(st.integers(1, 4))
    step = _step(n_heads)
    m = draw(st.integers(1, max(1, max_q_dim // (step * n_heads))))
    head_dim = step * m
    q_dim = head_dim * n_heads
    if draw(st.booleans()):  # head_dim override (Qwen3): dim independent of n_heads
        dim, head_field = 32 * draw(st.integers(1, 4)), head_dim
    else:
        dim, head_field = q_dim, 0
    n_layers = draw(st.integers(1, max_layers))
    wtype = draw(st.sampled_from([1, 2]))
    h = {
        "magic": b"MLB1",
        "version": 1,
        "dim": dim,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "hidden_dim": 32 * draw(st.integers(1, 3)),
        "vocab": draw(st.integers(3, 40)),
        "max_seq": draw(st.integers(1, 2**24)),
        "rope_theta": draw(_f32(0.0, F32_MAX, exclude_min=True)),
        "norm_eps": draw(_f32(0.0, 1.0)),
        "wtype": wtype,
        "shared_classifier": draw(st.sampled_from([0, 1]) | st.integers(0, U32_MAX)),
        "q8_mask": 0 if wtype == 1 else draw(st.integers(0, 127)),
        "qkv_bias": draw(st.integers(0, 1)),
        "head_dim": head_field,
        "qk_norm": draw(st.integers(0, 1)),
        "sliding_window": draw(st.sampled_from([0, 2**24]) | st.integers(0, 2**24)),
        "act": draw(st.integers(0, 1)),
        "post_norms": draw(st.integers(0, 1)),
        "embed_scale": draw(_f32(0.0, 100.0)),
        "attn_scale": draw(_f32(0.0, 10.0)),
        "scale_f16": draw(st.integers(0, 1)),
        "attn_softcap": draw(_f32(0.0, 100.0)),
        "final_softcap": draw(_f32(0.0, 100.0)),
        "rot_dim": 2 * draw(st.integers(0, head_dim // 2)),
        "attn_gate": draw(st.integers(0, 1)),
        "rope_type": 0,
        "rope_factor": 0.0,
        "rope_low_freq_factor": 0.0,
        "rope_high_freq_factor": 0.0,
        "rope_orig_max_seq": 0,
        "rope_attn_factor": 0.0,
        "layer_flags": 0,
        "rope_local_theta": 0.0,
        "lin_k_heads": 0,
        "lin_v_heads": 0,
        "lin_k_dim": 0,
        "lin_v_dim": 0,
        "lin_conv": 0,
    }
    rope = draw(st.integers(0, 3))
    h["rope_type"] = rope
    if rope in (1, 2, 3):
        h["rope_factor"] = draw(_f32(0.0, 64.0, exclude_min=True))
    if rope == 1:  # llama3: lo > 0, hi > lo, orig > 0
        lo = draw(_f32(0.0, 16.0, exclude_min=True))
        h["rope_low_freq_factor"] = lo
        h["rope_high_freq_factor"] = draw(_f32(lo, 64.0, exclude_min=True))
        h["rope_orig_max_seq"] = draw(st.integers(1, U32_MAX))
    elif rope == 3:  # yarn: beta_slow > 0, beta_fast > beta_slow, orig > 0, attn_factor > 0
        slow = draw(_f32(0.0, 16.0, exclude_min=True))
        h["rope_high_freq_factor"] = slow
        h["rope_low_freq_factor"] = draw(_f32(slow, 64.0, exclude_min=True))
        h["rope_orig_max_seq"] = draw(st.integers(1, U32_MAX))
        h["rope_attn_factor"] = draw(_f32(0.0, 4.0, exclude_min=True))
    flags = None
    if draw(st.sampled_from([False, True, True])):
        h["layer_flags"] = 1
        flags = draw(st.lists(st.sampled_from(VALID_FLAGS), min_size=n_layers, max_size=n_layers))
        if draw(st.booleans()):  # make linear-attention layers common
            flags[draw(st.integers(0, n_layers - 1))] = 8
    if flags and any(f & 2 for f in flags):
        h["rope_local_theta"] = draw(_f32(0.0, 1e7, exclude_min=True))
    else:
        h["rope_local_theta"] = draw(_f32(0.0, 1e7))
    if flags and any(f & 8 for f in flags):
        k = draw(st.integers(1, 3))
        v = (4 * k // math.gcd(4, k)) * draw(st.integers(1, 2))
        dv_step = 32 // math.gcd(v, 32)
        h.update(
            lin_k_heads=k,
            lin_v_heads=v,
            lin_k_dim=draw(st.integers(1, 16)),
            lin_v_dim=dv_step * draw(st.integers(1, max(1, 64 // (dv_step * v)))),
            lin_conv=draw(st.integers(1, 5)),
        )
    return h, flags


@pytest.fixture(scope="session")
def valid_model_strategy():
    """A hypothesis strategy of (header, flags) of small valid models (draw it with st.data())."""
    return valid_models()


def pytest_terminal_summary(terminalreporter):
    """Which kernel tables this machine runs, whose tests (each SIMD table against its scalar twin)
    run here, and which are skipped for lack of hardware or run under qemu."""
    from mlconf.backends import BackendError, bitnet, get, native

    lines = []
    for name, isas in (("native", native.ISAS), ("bitnet", bitnet.ISAS)):
        try:
            b = get(name)
        except BackendError:
            continue
        try:
            ran = [i for i in isas if i in b.tables]
            qemu = [i for i in isas if i.startswith("neon") and i not in b.tables]
            skipped = [i for i in isas if i not in b.tables and i not in qemu]
        finally:
            b.close()
        line = (
            f"{name}: this CPU runs {' '.join(ran) or 'none'}; "
            f"their tests skip {' '.join(skipped) or 'none'} (not on this CPU)"
        )
        lines.append(line + (f"; under qemu-aarch64: {' '.join(qemu)}" if qemu else ""))
    if lines:
        terminalreporter.write_sep("-", "kernel tables")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def dispatch_variants() -> list[tuple[str, dict]]:
    """Environments that make this host's NumPy and OpenBLAS take the loops and kernels of other
    hosts: NumPy without its AVX-512 loops, without any beyond its baseline, and OpenBLAS's sgemm
    for older and newer cores than this one (x86 cores this CPU can run). For the tests of an
    output that must not depend on the host."""
    try:  # NumPy 2; NumPy 1.26 names the package numpy.core
        from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
    extra = [f for f in __cpu_dispatch__ if __cpu_features__.get(f) and f not in __cpu_baseline__]
    avx512 = [f for f in extra if f.startswith("AVX512") or f == "X86_V4"]
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    cores = (
        []
        if not x86
        else ["Prescott"]
        + (["Haswell"] if __cpu_features__.get("AVX2") else [])
        + (["SkylakeX"] if __cpu_features__.get("AVX512_SKX") else [])
    )
    out = [(f"OpenBLAS {c}", {"OPENBLAS_CORETYPE": c}) for c in cores]
    if avx512:
        out.append(("NumPy without AVX-512", {"NPY_DISABLE_CPU_FEATURES": " ".join(avx512)}))
    if extra:
        oldest = {"OPENBLAS_CORETYPE": "Prescott"} if x86 else {}
        out.append(
            (
                "NumPy at its baseline, OpenBLAS Prescott",
                {"NPY_DISABLE_CPU_FEATURES": " ".join(extra), **oldest},
            )
        )
    return out
