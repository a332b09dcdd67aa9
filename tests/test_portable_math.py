"""backends/reference/portable.py: the reference's float math gives the same bits whatever SIMD
loops NumPy and whatever sgemm kernel OpenBLAS pick on this host, and is accurate against the C
library (an independent oracle, compared with measured bounds)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from mlconf.backends.reference import portable as P


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want) / np.spacing(np.abs(want))))


def _libm(f, x: np.ndarray) -> np.ndarray:
    return np.array([f(float(v)) for v in x])


RNG = np.random.default_rng(20261202)


U = RNG.uniform
CASES = [  # name, ours, the C library's, inputs, bound in float64 ulps
    ("exp", P.exp64, math.exp, np.concatenate([U(-745, 709, 20000), RNG.normal(0, 1, 20000)]), 2),
    ("log", P.log64, math.log, np.concatenate([np.exp(U(-700, 700, 20000)), U(0.5, 2, 9000), [5e-324]]), 4),
    ("tanh", P.tanh64, math.tanh, np.concatenate([RNG.normal(0, 3, 20000), U(-0.07, 0.07, 20000)]), 8),
    ("log1p", P.log1p64, math.log1p, np.concatenate([U(0, 1, 20000), 10.0 ** U(-20, 0, 2000)]), 4),
]


@pytest.mark.parametrize("name, ours, libm, x, bound", CASES, ids=[c[0] for c in CASES])
def test_agrees_with_libm_within_a_few_float64_ulps(name, ours, libm, x, bound):
    # measured on AMD EPYC (glibc 2.36): exp 1, log 3, tanh 5, log1p 2
    assert _ulps(ours(x), _libm(libm, x)) <= bound, name


def test_cos_sin_agree_with_libm():
    # up to 1.5e6 the Cody-Waite reduction, beyond it the exact one (a RoPE base near 0, as a
    # fuzzed rope_local_theta of 1e-45, gives angles of 1e39)
    big = 10.0 ** RNG.uniform(6, 308, 5000)
    x = np.concatenate(
        [
            RNG.uniform(0, 1.5e6, 20000),
            RNG.uniform(-10, 10, 20000),
            np.arange(4096.0) * 0.7,
            big,
            -big,
            [1.5e6, np.nextafter(1.5e6, 0), 1.7976931348623157e308],
        ]
    )
    c, s = P.cos_sin64(x)
    # measured: 2.2e-16 (one ulp of 1) for both
    assert np.max(np.abs(c - _libm(math.cos, x))) <= 4.5e-16
    assert np.max(np.abs(s - _libm(math.sin, x))) <= 4.5e-16


def test_special_values():
    inf, nan = np.inf, np.nan
    with np.errstate(all="raise"):  # no warning leaks to the caller
        e = P.exp64(np.array([nan, inf, -inf, 0.0, 1000.0, -1000.0]))
        t = P.tanh64(np.array([nan, inf, -inf, -0.0, 1e-300, 30.0]))
        lg = P.log64(np.array([0.0, -1.0, inf, nan, 1.0]))
        c, s = P.cos_sin64(np.array([nan, inf, 0.0, -0.0]))
    np.testing.assert_array_equal(e, [nan, inf, 0.0, 1.0, inf, 0.0])
    np.testing.assert_array_equal(t, [nan, 1.0, -1.0, -0.0, 1e-300, 1.0])
    assert np.signbit(t[3])
    np.testing.assert_array_equal(lg, [-inf, nan, inf, nan, 0.0])
    np.testing.assert_array_equal(c, [nan, nan, 1.0, 1.0])
    np.testing.assert_array_equal(s, [nan, nan, 0.0, -0.0])
    assert np.signbit(s[3])
    assert P.exp(np.array([89.0], np.float32))[0] == np.inf  # beyond float32: inf, not a warning
    assert P.norm(np.array([3.0, 4.0], np.float32)) == 5.0


def test_softplus_is_logaddexp():
    v = RNG.normal(0, 10, 20000).astype(np.float32)
    want = np.logaddexp(0.0, v.astype(np.float64)).astype(np.float32)
    assert _ulps(P.softplus(v).astype(np.float64), want.astype(np.float64)) <= 1


def test_matmul_is_the_float32_loop_in_k_order():
    """Each product rounded to float32, added over k in order in float32 (a plain C loop)."""
    x = RNG.normal(size=(2, 5, 70)).astype(np.float32)
    w = RNG.normal(size=(2, 4, 70)).astype(np.float32)
    got = P.matmul(x, w)
    assert got.dtype == np.float32 and got.shape == (2, 5, 4)
    for b, i, j in [(0, 0, 0), (1, 4, 3), (0, 2, 1)]:
        acc = np.float32(0)
        for k in range(70):
            acc = np.float32(acc + np.float32(x[b, i, k] * w[b, j, k]))
        assert got[b, i, j] == acc
    near = np.array(
        [
            [
                [math.fsum((x[b, i].astype(float) * w[b, j].astype(float)).tolist()) for j in range(4)]
                for i in range(5)
            ]
            for b in range(2)
        ]
    )
    assert np.max(np.abs(got - near)) < 1e-5  # and close to the exact sum
    # integers: every partial sum is exact, so the result is too; a broadcast leading axis
    xi = RNG.integers(-100, 100, size=(3, 6, 33)).astype(np.float32)
    wi = RNG.integers(-100, 100, size=(7, 33)).astype(np.float32)
    exact = (xi.astype(np.int64) @ wi.astype(np.int64).T).astype(np.float32)
    np.testing.assert_array_equal(P.matmul(xi, wi), exact)


def test_ln_and_pow_are_correctly_rounded():
    """Against the value computed to 80 decimal digits (an independent context of the same module),
    and equal to glibc's pow on RoPE's exponents, a base near 0 included (angles of 1e39)."""
    import decimal

    ctx = decimal.Context(prec=80, traps=[])
    for base in (10000.0, 1e6, 500000.0, 1.401298464324817e-45, 2.5):
        x = -2.0 * np.arange(64) / 128
        got = P.pow64(base, x)
        want = [float(ctx.exp(ctx.ln(decimal.Decimal(base)) * decimal.Decimal(v))) for v in x.tolist()]
        np.testing.assert_array_equal(got, want)
        assert (got == np.array([math.pow(base, v) for v in x.tolist()])).mean() > 0.95
    for v in (0.1, 2.0, 1e-300, 3e300, 10000.0):
        assert P.ln(v) == float(ctx.ln(decimal.Decimal(v)))
    assert P.pow64(2.0, np.array([2000.0, -2000.0])).tolist() == [math.inf, 0.0]


# ---------------------------------------------------------------- host independence
_DIGEST = """
import hashlib, numpy as np
from mlconf.backends.reference import portable as P

rng = np.random.default_rng(7)
v = rng.normal(0, 4, 4099).astype(np.float32)
a = rng.uniform(0, 3e4, 4099)
x, w = rng.normal(size=(9, 257)).astype(np.float32), rng.normal(size=(31, 257)).astype(np.float32)
h = hashlib.sha256()
if {numpy}:
    parts = [np.exp(v), np.tanh(v), np.cos(a), np.sin(a), np.power(1e4, -a / 3e4), np.log1p(abs(v)), x @ w.T]
else:
    parts = [P.exp(v), P.tanh(v), *P.cos_sin64(a), P.pow64(1e4, -a[:64] / 3e4), P.softplus(v), P.matmul(x, w)]
for p in parts:
    h.update(np.ascontiguousarray(p).tobytes())
print(h.hexdigest())
"""


def _digest_in(env: dict, numpy: bool) -> str:
    r = subprocess.run(
        [sys.executable, "-c", _DIGEST.format(numpy=numpy)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_same_bits_under_every_dispatch_this_host_offers(dispatch_variants):
    variants = dispatch_variants
    print("variants:", [n for n, _ in variants])
    base = _digest_in({}, numpy=False)
    for name, env in variants:
        assert _digest_in(env, numpy=False) == base, name


def test_the_variants_do_move_numpys_own_bits(dispatch_variants):
    """The control: NumPy's own exp, tanh, cos, sin, pow, log1p and sgemm give other bits in some
    variant, so the test above would see a portable function that fell back on them."""
    variants = dispatch_variants
    if not any("NPY_DISABLE_CPU_FEATURES" in env for _, env in variants):
        pytest.skip("NumPy has no loops beyond its baseline on this host")
    base = _digest_in({}, numpy=True)
    assert any(_digest_in(env, numpy=True) != base for _, env in variants)


def test_sum_last_is_the_same_with_trailing_zeros():
    """A row of softmax numerators summed alone (one token) or padded with masked zeros (the whole
    prompt) gives the same bits; NumPy's pairwise sum does not (the control)."""
    row = RNG.uniform(0, 1, 13).astype(np.float32)
    padded = np.concatenate([row, np.zeros(51, np.float32)])
    assert P.sum_last(row[None])[0, 0] == P.sum_last(padded[None])[0, 0]
    want = np.float32(0)
    for v in row:
        want = np.float32(want + v)
    assert P.sum_last(row[None])[0, 0] == want
    rows = RNG.uniform(0, 1, (4000, 13)).astype(np.float32)
    padded = np.concatenate([rows, np.zeros((4000, 51), np.float32)], axis=1)
    assert (rows.sum(axis=1) != padded.sum(axis=1)).any()
