"""Float math whose bits are the same on every host (decision ``reference.portable_math``).

NumPy picks its loops for exp, log, tanh, sin, cos and pow by the CPU it runs on (AVX-512, AVX2,
SSE, NEON and SVML builds of each), and its matmul, einsum and norm go to BLAS kernels picked the
same way (OpenBLAS's Haswell and SkylakeX sgemm sum in different orders). The reference's outputs
are expectations (`mlconf fixtures` writes them, `mlconf run` compares with them), so they must
not move with the host. Everything here is built from IEEE basic operations only (+ - * / sqrt,
rint, frexp, ldexp, comparisons), each correctly rounded by NumPy on every CPU, in a fixed order,
or from CPython's decimal arithmetic: every function gives the same bits everywhere. exp, log,
tanh, cos and sin work in float64 to a few float64 ulps, far below the float32 their callers
round to; ln and pow (the RoPE frequencies) are correctly rounded; matmul and sum_last add in
float32 in index order, as a plain C loop does.
"""

from __future__ import annotations

import decimal
import functools
import math

import numpy as np

F32, F64 = np.float32, np.float64

# ln 2 and pi/2 split so that n * HI is exact for |n| < 2**20 (Cody and Waite)
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_PIO2 = (1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624879595063154e-21)
_INV_LN2 = 1.0 / math.log(2.0)
_TWO_OVER_PI = 2.0 / math.pi


def _quiet(f):
    """Overflow to inf, underflow to 0 and NaN in, NaN out are the answers here, not warnings."""

    @functools.wraps(f)
    def g(*a):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return f(*a)

    return g


def _horner(x: np.ndarray, coeffs: list[float]) -> np.ndarray:
    """sum(coeffs[i] * x**i), highest power first."""
    acc = np.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


_EXP_C = [1.0 / math.factorial(i) for i in range(15)]  # |r| <= ln2/2: term 15 < 2e-19


@_quiet
def exp64(x) -> np.ndarray:
    """e**x, float64 in and out."""
    x = np.asarray(x, dtype=F64)
    fin = np.isfinite(x)
    xc = np.clip(np.where(fin, x, 0.0), -1100.0, 1100.0)
    n = np.rint(xc * _INV_LN2)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    y = np.ldexp(_horner(r, _EXP_C), n.astype(np.int64))
    return np.where(fin, y, np.where(np.isnan(x), np.nan, np.where(x > 0, np.inf, 0.0)))


# 2 atanh(s) = log((1+s)/(1-s)) for |s| <= 0.1716: the s**25 term is below 1e-20
_ATANH_C = [2.0 / (2 * i + 1) for i in range(12)]


@_quiet
def log64(x) -> np.ndarray:
    """Natural log, float64 in and out (0 -> -inf, negative -> nan)."""
    x = np.asarray(x, dtype=F64)
    ok = np.isfinite(x) & (x > 0)
    m, e = np.frexp(np.where(ok, x, 1.0))  # m in [0.5, 1)
    low = m < math.sqrt(0.5)
    m = np.where(low, m * 2.0, m)  # exact; m in [0.707, 1.414)
    e = (e - low).astype(F64)
    f = m - 1.0  # exact (Sterbenz)
    s = f / (2.0 + f)
    lm = s * _horner(s * s, _ATANH_C)
    y = e * _LN2_HI + (e * _LN2_LO + lm)
    bad = np.where(x == 0, -np.inf, np.where(x == np.inf, np.inf, np.nan))
    return np.where(ok, y, bad)


# ln and pow in decimal arithmetic (CPython's decimal module, pure software): correctly rounded, as
# glibc's pow and log are in all but rare cases. RoPE's frequencies come from them, and with a base
# near 0 (a fuzzed rope_theta of 1e-45) an angle pos * inv of 1e39 turns an error of one ulp in inv
# into another cosine: exp(x * log(b)) in float64 would be hundreds of ulps off there.
_DEC = decimal.Context(prec=50, Emax=10**6, Emin=-(10**6), traps=[])


def ln(v: float) -> float:
    """The natural log of a positive finite float, correctly rounded."""
    return float(_DEC.ln(decimal.Decimal(float(v))))


def pow64(base: float, x) -> np.ndarray:
    """base ** x for a positive finite scalar base and every element of x, each correctly rounded
    (float64). For the few tens of values of a RoPE table: one decimal exp per element."""
    lb = _DEC.ln(decimal.Decimal(float(base)))
    xs = np.asarray(x, dtype=F64)
    out = []
    for v in xs.reshape(-1).tolist():
        t = _DEC.multiply(lb, decimal.Decimal(v))
        out.append(math.inf if t > 710 else 0.0 if t < -746 else float(_DEC.exp(t)))
    return np.array(out, dtype=F64).reshape(xs.shape)


@_quiet
def log1p64(t) -> np.ndarray:
    """log(1 + t) for t >= 0 without losing the small t (Goldberg: log(u) * t / (u - 1))."""
    t = np.asarray(t, dtype=F64)
    u = 1.0 + t
    d = u - 1.0
    return np.where(d == 0, t, log64(u) * (t / np.where(d == 0, 1.0, d)))


# tanh near 0 by its series (|x| < 1/16: the x**13 term is below 2e-17 relative)
_TANH_C = [1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835, -1382.0 / 155925]


@_quiet
def tanh64(x) -> np.ndarray:
    x = np.asarray(x, dtype=F64)
    a = np.abs(x)
    small = a < 0.0625
    t = exp64(-2.0 * np.where(small, 1.0, a))
    big = (1.0 - t) / (1.0 + t)
    ser = a * _horner(a * a, _TANH_C)
    return np.copysign(np.where(small, ser, np.where(np.isnan(a), np.nan, big)), x)


# |r| <= pi/4: the next Taylor terms are below 1e-19
_SIN_C = [(-1.0) ** i / math.factorial(2 * i + 1) for i in range(9)]
_COS_C = [(-1.0) ** i / math.factorial(2 * i) for i in range(10)]


def _pi_bits(n: int) -> int:
    """floor(pi * 2**n), by Machin's formula in integers (pi = 16 atan(1/5) - 4 atan(1/239))."""

    def atan_inv(q: int, one: int) -> int:
        total, term, k, sign = 0, one // q, 1, 1
        while term:
            total += sign * (term // k)
            term //= q * q
            k, sign = k + 2, -sign
        return total

    guard = 64
    one = 1 << (n + guard)
    return (16 * atan_inv(5, one) - 4 * atan_inv(239, one)) >> guard


_TWO_OVER_PI_BITS = 1300  # > 1074 + 53 + 150: every float64's product with 2/pi to 150 bits past the point
_TWO_OVER_PI_INT = (1 << (2 * _TWO_OVER_PI_BITS)) // _pi_bits(_TWO_OVER_PI_BITS) * 2  # 2/pi * 2**N
_BIG = 1.5e6  # below it, the Cody-Waite reduction is exact (k * _PIO2[0] fits 53 bits)


def _reduce_big(v: float) -> tuple[float, float]:
    """(k mod 4, r) with v = k pi/2 + r, |r| <= pi/4, for a large finite v: v * 2/pi in integers
    (Payne and Hanek's idea, with Python's big integers for the bits of 2/pi)."""
    m, e = math.frexp(abs(v))
    mi, sh = int(m * (1 << 53)), _TWO_OVER_PI_BITS + 53 - e  # |v| = mi * 2**(e - 53)
    prod = mi * _TWO_OVER_PI_INT  # |v| * 2/pi * 2**sh
    k = (prod + (1 << (sh - 1))) >> sh  # round to nearest
    frac = prod - (k << sh)  # in [-2**(sh-1), 2**(sh-1)]
    top = max(frac.bit_length() - 60, 0)  # 60 leading bits, then one float rounding
    r = math.ldexp(float(frac >> top) if frac >= 0 else -float((-frac) >> top), top - sh) * (math.pi / 2)
    if v < 0:
        k, r = -k, -r
    return float(k % 4), r


@_quiet
def cos_sin64(x) -> tuple[np.ndarray, np.ndarray]:
    """(cos x, sin x) in float64, for every finite x: Cody and Waite's reduction below 1.5e6, an
    exact one with the bits of 2/pi beyond (as the C library does; the angles of a RoPE base near 0
    reach 1e39)."""
    x = np.asarray(x, dtype=F64)
    fin = np.isfinite(x)
    xf = np.where(fin, x, 0.0)
    big = np.abs(xf) >= _BIG
    small = np.where(big, 0.0, xf)
    k = np.rint(small * _TWO_OVER_PI)
    r = ((small - k * _PIO2[0]) - k * _PIO2[1]) - k * _PIO2[2]
    q = np.mod(k, 4.0)
    if big.any():
        pairs = [_reduce_big(float(v)) for v in xf[big]]
        q[big] = [p[0] for p in pairs]
        r[big] = [p[1] for p in pairs]
    r2 = r * r
    s = r * _horner(r2, _SIN_C)
    c = _horner(r2, _COS_C)
    cos = np.select([q == 0, q == 1, q == 2], [c, -s, -c], s)
    sin = np.select([q == 0, q == 1, q == 2], [s, c, -s], -c)
    sin = np.where(xf == 0, xf, sin)  # sin(-0) = -0
    return np.where(fin, cos, np.nan), np.where(fin, sin, np.nan)


# ---------------------------------------------------------------- float32 faces
@_quiet
def exp(v) -> np.ndarray:
    """e**v of a float32 array, rounded once to float32."""
    return exp64(v).astype(F32)


@_quiet
def tanh(v) -> np.ndarray:
    return tanh64(v).astype(F32)


@_quiet
def softplus(v) -> np.ndarray:
    """log(1 + e**v) = max(v, 0) + log1p(e**-|v|), as np.logaddexp(0, v); float32 out."""
    v = np.asarray(v, dtype=F64)
    return (np.maximum(v, 0.0) + log1p64(exp64(-np.abs(v)))).astype(F32)


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T over the last two axes (x: (..., M, K), w: (..., N, K), leading axes broadcast) in
    float32 as a plain C loop computes it: each product rounded to float32 and added over
    k = 0, 1, ... in that order in float32. (Summing in float64 and rounding once is closer to the
    exact value, but in runtime semantics the attention output is quantized to Q8_0 next, and a sum
    that rounds unlike a float32 runtime's flips quants: qwen2_bias moved 1e-14 -> 1e-5 in nmse
    against the native runtime.)"""
    x = np.asarray(x, dtype=F32)
    w = np.asarray(w, dtype=F32)
    lead = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    acc = np.zeros(lead + (x.shape[-2], w.shape[-2]), dtype=F32)
    for k in range(x.shape[-1]):
        acc += x[..., :, k, None] * w[..., None, :, k]
    return acc


def sum_last(v: np.ndarray) -> np.ndarray:
    """The sum over the last axis, added in index order in the array's dtype (keepdims). NumPy's
    pairwise sum groups a contiguous row by its length, so a row of scores with trailing masked
    zeros (a whole prompt at once) would round otherwise than the same row alone (one token)."""
    acc = np.zeros(v.shape[:-1] + (1,), dtype=v.dtype)
    for j in range(v.shape[-1]):
        acc += v[..., j : j + 1]
    return acc


def norm(v: np.ndarray) -> float:
    """The Euclidean norm of a vector, exactly rounded (math.fsum of exact float64 squares)."""
    v = np.asarray(v, dtype=F64).reshape(-1)
    return math.sqrt(math.fsum((v * v).tolist()))
