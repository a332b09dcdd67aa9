"""ml_quantize_q4_0 (backends/native/src/q4_0.c) against the reference quantizer
(backends/reference/quant.py), through the public ABI with each kernel table forced:
native:scalar (the twin), native:avx2 on x86-64, native:neon under qemu-user (skipped, with the
reason, where the table cannot run). Both rules, f32 and f16 scales, with and without an
importance vector; the search's 8- and 4-block SIMD groups and their leftovers (13 blocks a row);
blocks below 1e-6 and all-zero blocks; exact rint ties; hypothesis blocks; and the refusals
(non-finite input, a search that overflows float32, an f16 scale above 65504, importance with the
round rule), which must raise as the reference does. The spec cases run in `mlconf run`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlconf.backends import Unsupported, get
from mlconf.backends.reference import quant

F32 = np.float32
TABLES = ["native:scalar", "native:avx2", "native:neon"]


@pytest.fixture(scope="module", params=TABLES)
def native(request):
    b = get(request.param)
    if "quantize_q4_0" not in b.capabilities:  # the table cannot run here (ISA, no qemu)
        pytest.skip(f"{request.param}: {b.unsupported.get('quantize_q4_0')}")
    return b


def _want(x, rule, f16, imp=None):
    if rule == "round":
        return quant.q4_0_round(x, f16=f16)
    return quant.q4_0_search(x, f16=f16, importance=imp)


def _same(native, x, rule, f16, imp=None, what=""):
    qs, d = native.quantize_q4_0(x, rule, f16, imp)
    wq, wd = _want(x, rule, f16, imp)
    assert qs.dtype == np.uint8 and d.dtype == wd.dtype and qs.shape == wq.shape and d.shape == wd.shape
    blocks = np.flatnonzero(
        (qs.reshape(-1, 16) != wq.reshape(-1, 16)).any(axis=1)
        | (
            d.reshape(-1).view(np.uint16 if f16 else np.uint32)
            != wd.reshape(-1).view(np.uint16 if f16 else np.uint32)
        )
    )
    assert not blocks.size, (
        f"{native.name} {rule} f16={f16} {what}: {blocks.size} blocks differ, first {int(blocks[0])}: "
        f"d {d.reshape(-1)[blocks[0]]!r} vs {wd.reshape(-1)[blocks[0]]!r}"
    )


def _matrix(seed: int, rows: int = 5, cols: int = 32 * 13) -> np.ndarray:
    """Mixed magnitudes (each block its own power of two), a block below 1e-6, an all-zero block,
    exact ties of rint, and repeated maxima of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(F32)
    x *= np.exp2(rng.integers(-30, 14, (rows, cols // 32))).repeat(32, axis=1).astype(F32)
    if rows >= 4 and cols >= 128:
        x[0, 32:64] *= F32(1e-9)
        x[1, 64:96] = 0
        x[2, 96:128] = np.tile(F32([8, -8, 4, 0.5, -2.5, 1.5, 3, 7]), 4)  # xmax 8: levels hit .5 ties
        x[3, :32] = F32(-1.0)
    return x


@pytest.mark.parametrize("rule", ["round", "search"])
@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matrices_match_the_reference(native, rule, f16, seed):
    _same(native, _matrix(seed), rule, f16, what=f"seed {seed}")


@pytest.mark.parametrize("seed", [4, 5])
def test_importance_matches_the_reference(native, seed):
    x = _matrix(seed)
    rng = np.random.default_rng(seed)
    imp = quant.importance(rng.integers(0, 1000, x.shape[1]).astype(np.float64) ** 2)
    for f16 in (False, True):
        _same(native, x, "search", f16, imp, what=f"importance seed {seed}")


def test_one_row_and_a_leading_shape(native):
    _same(native, _matrix(6, 1, 32)[0], "search", False)
    _same(native, _matrix(7, 6, 64).reshape(2, 3, 64), "search", True)


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.lists(
        st.lists(st.floats(-1e6, 1e6, width=32), min_size=32, max_size=32), min_size=1, max_size=11
    )
)
def test_hypothesis_blocks(native, blocks):
    x = np.array(blocks, F32).reshape(1, -1)
    _same(native, x, "search", False)
    _same(native, x, "round", False)


def _refusal(native, x, rule, f16, imp=None):
    with pytest.raises(ValueError) as ref:
        _want(x, rule, f16, imp)
    with pytest.raises(ValueError) as got:
        native.quantize_q4_0(x, rule, f16, imp)
    assert str(ref.value) in str(got.value)


def test_refusals(native):
    x = _matrix(8, 2, 64)
    nan = x.copy()
    nan[1, 3] = np.nan
    for rule in ("round", "search"):
        _refusal(native, nan, rule, False)
    huge = x.copy()
    huge[0, :32] = F32(2.0**60)
    _refusal(native, huge, "search", False)  # decision q4_0.search_overflow
    big = x.copy()
    big[1, 32:64] = F32(1e6)
    _refusal(native, big, "round", True)  # |d| = 125000 > 65504
    _refusal(native, big, "search", True)
    with pytest.raises(Unsupported):
        native.quantize_q4_0(x, "round", False, np.ones(64, F32))
    with pytest.raises(ValueError):
        native.quantize_q4_0(x, "search", False, np.ones(32, F32))
