"""Reference quantizers: Q8_0 (f32 and f16 scales) and Q4_0 (search, round, imatrix weighting).

Every operation is the float32 operation specs/quant.yaml names, vectorized over blocks. Blocks
are the last axis in groups of 32; inputs must be finite float32 (others raise QuantError).
Loops run over the 32 elements of a block or the 13 search candidates, never over blocks, so
that the accumulation order is the one the spec fixes (element 0 first).
"""

from __future__ import annotations

import math

import numpy as np

from mlconf import specs

F32 = np.float32
BLOCK = 32
F16_MAX = 65504.0


class QuantError(ValueError):
    """An input the quantizer must refuse (non-finite value, scale not storable as f16, shape)."""


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise QuantError(f"input must be float32, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % BLOCK:
        raise QuantError(f"last dimension {x.shape[-1] if x.ndim else 0} is not a multiple of {BLOCK}")
    if not np.isfinite(x).all():
        i = int(np.flatnonzero(~np.isfinite(x.ravel()))[0])
        raise QuantError(f"non-finite value {x.ravel()[i]} at flat index {i}")
    return x.reshape(-1, BLOCK)


def _to_f16(d: np.ndarray) -> np.ndarray:
    """Round scales to the nearest f16, refusing any |d| above 65504 (seed: cannot be stored)."""
    big = np.abs(d) > F32(F16_MAX)
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise QuantError(f"block {i}: scale {float(d[i])!r} is above 65504 and cannot be stored as f16")
    return d.astype(np.float16)


def _round_half_away(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """trunc(v + copysign(0.5, x)) in float32, clamped to [-127, 127] (the seed's Q8_0 rounding)."""
    r = np.trunc(v + np.copysign(F32(0.5), x))
    return np.clip(r, -127, 127).astype(np.int8)


def q8_0(x: np.ndarray, f16: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 quants (int8, x's shape) and scales (f32 or f16, one per block)."""
    b = _blocks(x)
    amax = np.max(np.abs(b), axis=1)
    live = amax >= F32(1e-30)  # amax < 1e-30 (as float32, same as against the double 1e-30)
    safe = np.where(live, amax, F32(1))
    d = np.where(live, safe / F32(127), F32(0)).astype(F32)
    if not f16:
        idd = np.where(live, F32(127) / safe, F32(0)).astype(F32)
        q = _round_half_away(b * idd[:, None], b)
        q[~live] = 0
        scales: np.ndarray = d
    else:
        d16 = _to_f16(d)
        dd = d16.astype(F32)
        nz = dd != 0  # an f16 scale that underflowed to 0 stores zero quants (decision q8_0.f16_zero_scale)
        idd = np.where(nz, F32(1) / np.where(nz, dd, F32(1)), F32(0)).astype(F32)
        q = _round_half_away(b * idd[:, None], b)
        q[~nz] = 0
        scales = d16
    return q.reshape(x.shape), scales.reshape(*x.shape[:-1], x.shape[-1] // BLOCK)


def _pack_nibbles(levels: np.ndarray) -> np.ndarray:
    """Levels in [-8, 7] per block of 32 to 16 bytes: element j low nibble, j + 16 high nibble."""
    n = (levels + 8).astype(np.uint8)
    return n[:, :16] | (n[:, 16:] << np.uint8(4))


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes per block back to 32 levels in [-8, 7] (int8)."""
    b = qs.reshape(-1, 16)
    lo = (b & 0x0F).astype(np.int8) - 8
    hi = (b >> 4).astype(np.int8) - 8
    return np.concatenate([lo, hi], axis=1)


def _shape_out(x: np.ndarray, qs: np.ndarray, d: np.ndarray):
    lead = x.shape[:-1]
    return qs.reshape(*lead, x.shape[-1] // 2), d.reshape(*lead, x.shape[-1] // BLOCK)


def q4_0_round(x: np.ndarray, f16: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q4_0 rounding: d = (element of largest magnitude) / -8, levels
    trunc(x * (1/d) + 8.5), at most 15, minus 8. With f16 the stored d is f16(d); the levels use
    the unrounded 1/d, as llama.cpp and gguf-py do (decision q4_0.round_f16)."""
    b = _blocks(x)
    imax = np.argmax(np.abs(b), axis=1)  # first of equal magnitudes, like llama.cpp's strict <
    mx = b[np.arange(len(b)), imax]
    d = (mx / F32(-8)).astype(F32)
    with np.errstate(divide="ignore", over="ignore"):
        idd = F32(1) / d
    # id = 0 when d is 0 or so small (|d| <= 2^-128, |m| about 2^-125) that 1/d overflows: x * inf
    # would give inf and NaN levels; every level is then 0 (decision q4_0.round_id_overflow).
    idd = np.where(np.isfinite(idd), idd, F32(0)).astype(F32)
    n = np.minimum(np.trunc(b * idd[:, None] + F32(8.5)), F32(15)).astype(np.int8)
    qs = _pack_nibbles(n - 8)
    return _shape_out(x, qs, _to_f16(d) if f16 else d)


def search_levels() -> np.ndarray:
    """The 13 candidate levels -6.0, -6.2, ..., -8.4 as float32 (specs/quant.yaml)."""
    return np.array(specs.load("quant")["q4_0_search"]["candidates"], dtype=F32)


def q4_0_search(
    x: np.ndarray, f16: bool = False, importance: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The writer's Q4_0 rule: per block, map the largest-magnitude element to each candidate
    level, fit d by weighted least squares, keep the candidate with the smallest weighted error.

    Weights are x^2, or with ``importance`` (one float32 per column, from :func:`importance`)
    imp * sqrt(s^2 + x^2) with s^2 the mean x^2 of the element's row, as llama.cpp.
    """
    b = _blocks(x)
    cols = x.shape[-1]
    if importance is None:
        w_imp = None
    else:
        imp = np.asarray(importance, dtype=F32)
        if imp.shape != (cols,):
            raise QuantError(f"importance has shape {imp.shape}, expected ({cols},)")
        rows = x.reshape(-1, cols)
        with np.errstate(over="ignore"):  # an overflowing row is refused by the search below
            s2 = row_mean_square(rows)
            w_imp = (imp[None, :] * np.sqrt(s2[:, None] + rows * rows)).reshape(-1, BLOCK)

    n = len(b)
    amax = np.max(np.abs(b), axis=1)
    imax = np.argmax(np.abs(b), axis=1)
    zero = amax == 0
    tiny = (amax < F32(1e-6)) & ~zero
    scale = np.where(tiny, amax, F32(1)).astype(F32)
    xs = np.where(tiny[:, None], b / scale[:, None], b).astype(F32)
    xmax = np.where(zero, F32(1), xs[np.arange(n), imax]).astype(F32)
    # Element-major (32, n): each step of the per-element accumulations reads contiguous memory.
    xt = np.ascontiguousarray(xs.T)

    best_err = np.full(n, np.inf, dtype=F32)
    best_d = np.zeros(n, dtype=F32)
    best_l = np.zeros((BLOCK, n), dtype=F32)
    # Huge blocks overflow the float32 sums (inf, NaN); such a candidate never beats +inf.
    with np.errstate(over="ignore", invalid="ignore"):
        wt = xt * xt if w_imp is None else np.ascontiguousarray(w_imp.T)
        wxt = wt * xt
        for level in search_levels():
            iscale = (level / xmax).astype(F32)
            lv = np.clip(np.rint(xt * iscale), F32(-8), F32(7)).astype(F32)
            sumlx = np.zeros(n, dtype=F32)
            suml2 = np.zeros(n, dtype=F32)
            for j in range(BLOCK):
                sumlx += wxt[j] * lv[j]
                suml2 += wt[j] * (lv[j] * lv[j])
            pos = suml2 > 0
            d = np.where(pos, sumlx / np.where(pos, suml2, F32(1)), F32(0)).astype(F32)
            err = np.zeros(n, dtype=F32)
            for j in range(BLOCK):
                r = xt[j] - d * lv[j]
                err += wt[j] * (r * r)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_d = np.where(better, d, best_d)
            best_l = np.where(better[None, :], lv, best_l)

    # No candidate with a finite error: float32 overflowed (|x| about 2^40 and above, or an imatrix
    # row whose mean square overflows). The rule gives no d; refuse (decision q4_0.search_overflow).
    failed = np.isinf(best_err) & ~zero
    if failed.any():
        i = int(np.flatnonzero(failed)[0])
        raise QuantError(
            f"block {i}: the Q4_0 search overflows float32 (amax {float(amax[i])!r}); "
            "no candidate has a finite error"
        )
    d = (best_d * scale).astype(F32)
    d[zero] = 0
    best_l[:, zero] = 0
    qs = _pack_nibbles(np.ascontiguousarray(best_l.T).astype(np.int8))
    return _shape_out(x, qs, _to_f16(d) if f16 else d)


def row_mean_square(rows: np.ndarray) -> np.ndarray:
    """s^2 per row: sum of x*x accumulated in float32 in column order, divided by the width."""
    acc = np.zeros(rows.shape[0], dtype=F32)
    cols = np.ascontiguousarray(rows.T)
    for c in cols:
        acc += c * c
    return (acc / F32(rows.shape[1])).astype(F32)


def importance(sums: np.ndarray) -> np.ndarray | None:
    """Per-channel importance from MLI1 sums of squares: the channel's mean square over the mean
    of all channels, floored at 0.001 (float64, exactly-rounded mean, then float32). None when
    every sum is zero (no data): the matrix is then quantized without the imatrix."""
    s = np.asarray(sums, dtype=np.float64)
    if s.ndim != 1 or not len(s) or not np.isfinite(s).all() or (s < 0).any():
        raise QuantError("imatrix sums must be a non-empty 1-D array of finite sums of squares (>= 0)")
    try:
        mean = math.fsum(s.tolist()) / len(s)
    except OverflowError:
        raise QuantError("imatrix sums overflow float64") from None
    if not mean > 0:
        return None
    return np.maximum(s / mean, 0.001).astype(F32)


def dequantize(fmt: str, q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """float32 weights of a Q8_0 or Q4_0 matrix (q, d as stored; f16 scales converted exactly)."""
    dd = np.asarray(d).astype(F32).reshape(-1)
    if fmt == "Q8_0":
        levels = np.asarray(q).astype(F32).reshape(-1, BLOCK)
        rows = np.asarray(q).shape[:-1]
        cols = np.asarray(q).shape[-1]
    else:
        levels = unpack_nibbles(np.asarray(q)).astype(F32)
        rows = np.asarray(q).shape[:-1]
        cols = np.asarray(q).shape[-1] * 2
    return (levels * dd[:, None]).reshape(*rows, cols)
