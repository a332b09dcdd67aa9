"""Reference I2_S (BitNet ternary) math: weight ternarization, the x86 block packing, the GGUF
payload, per-row int8 activation quantization, the integer dot and the float epilogue.

Every rule is the one specs/i2s.yaml states; all float arithmetic is binary32 (one rounding per
operation, in the order written) unless the spec says float64. Vectorized with NumPy.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
BLOCK = 128  # values per block (x86 layout of bitnet.cpp)
BLOCK_BYTES = 32  # packed bytes per block
TAIL = 32  # bytes after the packed data: f32 scale + 28 zero bytes
MEAN_FLOOR = 1e-5  # floor of mean|w|, compared as float64 (BitNet's converter: max(mean, 1e-5))
ACT_FLOOR = 1e-5  # floor of max|x| per row, float64 (quantize_row_i8_s)
# NumPy's pairwise summation (spec `ternarize`, mean): leaves of up to 128 values, and NumPy 1.26
# (bitnet.cpp's pinned version) reduces a contiguous array in chunks of its buffer size.
PAIRWISE_LEAF = 128
NUMPY_BUFSIZE = 8192


class I2SError(ValueError):
    """An input the I2_S reference refuses (shape, dtype, non-finite value, code 3, size)."""


def _weights(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype not in (np.float32, np.float16):
        raise I2SError(f"weights must be float32 or float16, got {w.dtype}")
    if w.ndim == 1:
        w = w.reshape(1, -1)
    if w.ndim != 2:
        raise I2SError(f"weights must be 1-D or 2-D, got shape {w.shape}")
    if w.shape[1] == 0 or w.shape[1] % BLOCK:
        raise I2SError(f"row length {w.shape[1]} is not a positive multiple of {BLOCK}")
    w = w.astype(F32)  # float16 -> float32 is exact
    if not np.isfinite(w).all():
        raise I2SError("non-finite weight")
    return w


def pairwise_sum(a: np.ndarray) -> np.float32:
    """NumPy's float32 pairwise_sum of a 1-D float32 array (numpy/_core/src/umath/loops_utils.h):
    below 8 values a plain loop from 0; up to 128, eight accumulators combined as ((r0 + r1) +
    (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the rest one by one; above, the two halves split
    at a multiple of 8. Every addition is one float32 rounding."""
    n = a.size
    if n < 8:
        s = F32(0)
        for v in a:
            s = F32(s + v)
        return s
    if n <= PAIRWISE_LEAF:
        m = n - n % 8
        r = a[:m].reshape(-1, 8)
        acc = r[0].copy()
        for row in r[1:]:
            acc = (acc + row).astype(F32)
        lo = F32(F32(acc[0] + acc[1]) + F32(acc[2] + acc[3]))
        hi = F32(F32(acc[4] + acc[5]) + F32(acc[6] + acc[7]))
        s = F32(lo + hi)
        for v in a[m:]:
            s = F32(s + v)
        return s
    n2 = n // 2
    n2 -= n2 % 8
    return F32(pairwise_sum(a[:n2]) + pairwise_sum(a[n2:]))


def _pairwise_chunks(a: np.ndarray) -> np.ndarray:
    """pairwise_sum of every row of a (k, 8192) float32 array at once. 8192 halves down to 64
    leaves of 128 (each a multiple of 8), so the tree is perfect: the leaves' eight-accumulator
    sums, then adjacent pairs level by level, the same float32 additions in the same order."""
    leaves = a.reshape(a.shape[0], -1, PAIRWISE_LEAF // 8, 8)  # (k, 64, 16, 8)
    acc = leaves[:, :, 0]
    for i in range(1, leaves.shape[2]):
        acc = (acc + leaves[:, :, i]).astype(F32)
    s = ((acc[..., 0] + acc[..., 1]) + (acc[..., 2] + acc[..., 3])) + (
        (acc[..., 4] + acc[..., 5]) + (acc[..., 6] + acc[..., 7])
    )  # (k, 64), float32 throughout
    while s.shape[1] > 1:
        s = (s[:, 0::2] + s[:, 1::2]).astype(F32)
    return s[:, 0]


def abs_mean(w: np.ndarray) -> np.float32:
    """float32 mean of |w| exactly as NumPy 1.26 computes np.mean(np.abs(w)) on a float32 array
    (spec `ternarize`): from 0, one pairwise_sum per chunk of 8192 values in row-major order,
    added in float32; then the sum divided by n, rounded once to float32 (through float64, which
    for a division gives the correctly rounded float32)."""
    a = np.abs(np.ascontiguousarray(w, dtype=F32).reshape(-1))
    full = a.size // NUMPY_BUFSIZE
    parts = list(_pairwise_chunks(a[: full * NUMPY_BUFSIZE].reshape(full, NUMPY_BUFSIZE))) if full else []
    if a.size % NUMPY_BUFSIZE:
        parts.append(pairwise_sum(a[full * NUMPY_BUFSIZE :]))
    s = F32(0)
    for p in parts:
        s = F32(s + p)
    return F32(np.float64(s) / a.size)


def ternarize(w: np.ndarray) -> tuple[np.ndarray, float]:
    """(q int8 in {-1,0,1} of w's 2-D shape, stored f32 scale d); spec `ternarize`: the rule of
    BitNet's embedding converter (quantize_to_i2_s) under its pinned NumPy 1.26."""
    w = _weights(w)
    m = abs_mean(w)
    d = m if float(m) >= MEAN_FLOOR else F32(MEAN_FLOOR)  # the stored scale: the (floored) mean
    s = F32(F32(1) / d)
    q = np.clip(np.rint(w * s), -1, 1).astype(np.int8)  # rint: half to even, as np.round
    return q, float(d)


def pack(q: np.ndarray) -> np.ndarray:
    """Ternary values (flat, length a multiple of 128) -> packed uint8 (n/4,); spec `layout`."""
    q = np.asarray(q).ravel()
    if q.size % BLOCK:
        raise I2SError(f"{q.size} values is not a multiple of {BLOCK}")
    if q.size and (q.min() < -1 or q.max() > 1):
        raise I2SError("values must be -1, 0 or 1")
    c = (q.astype(np.int16) + 1).astype(np.uint8).reshape(-1, 4, 32)  # [block, group, pos]
    out = (c[:, 0] << 6) | (c[:, 1] << 4) | (c[:, 2] << 2) | c[:, 3]
    return out.reshape(-1).astype(np.uint8)


def codes(packed: np.ndarray, n: int) -> np.ndarray:
    """Packed bytes -> the n 2-bit codes (uint8 0..3) in element order."""
    packed = np.asarray(packed, dtype=np.uint8).ravel()
    if n % BLOCK or packed.size < n // 4:
        raise I2SError(f"{packed.size} bytes cannot hold {n} values in blocks of {BLOCK}")
    b = packed[: n // 4].reshape(-1, 1, 32)
    shifts = np.array([6, 4, 2, 0], dtype=np.uint8).reshape(1, 4, 1)
    return ((b >> shifts) & 3).reshape(-1)


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
    """Packed bytes -> n int8 ternary values; code 3 is malformed (decision i2s.code3)."""
    c = codes(packed, n)
    if (c == 3).any():
        raise I2SError(f"code 3 at element {int(np.flatnonzero(c == 3)[0])}")
    return c.astype(np.int8) - 1


def quantize_tensor(w: np.ndarray) -> tuple[np.ndarray, float]:
    """(packed uint8 (rows*cols/4,), stored f32 scale) of a float weight (rows, cols).

    w: float32 or float16 array (a CPU torch float32 tensor works via np.asarray; convert bfloat16
    to float32 first, which is exact); cols must be a multiple of 128."""
    q, d = ternarize(w)
    return pack(q), d


def payload(w: np.ndarray) -> bytes:
    """The bytes a GGUF I2_S tensor holds: packed data, f32 LE scale, 28 zero bytes (n/4 + 32)."""
    packed, d = quantize_tensor(w)
    return packed.tobytes() + np.array([d], dtype="<f4").tobytes() + bytes(TAIL - 4)


def split_payload(data: bytes, shape: tuple[int, int]) -> tuple[np.ndarray, float]:
    """(packed uint8, scale) of a payload; the length must be exactly rows*cols/4 + 32."""
    rows, cols = shape
    if cols <= 0 or cols % BLOCK or rows <= 0:
        raise I2SError(f"shape {shape}: rows > 0 and cols a positive multiple of {BLOCK} required")
    n = rows * cols
    if len(data) != n // 4 + TAIL:
        raise I2SError(f"payload is {len(data)} bytes, shape {shape} needs {n // 4 + TAIL}")
    packed = np.frombuffer(data, dtype=np.uint8, count=n // 4)
    d = float(np.frombuffer(data, dtype="<f4", count=1, offset=n // 4)[0])
    return packed, d


def dequantize(data: bytes, shape: tuple[int, int]) -> np.ndarray:
    """float32 (rows, cols) = ternary value * scale (one f32 multiply, exact)."""
    packed, d = split_payload(data, shape)
    return unpack(packed, shape[0] * shape[1]).astype(F32).reshape(shape) * F32(d)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 (rows, k) and f32 scales (rows,); spec `activations` (quantize_row_i8_s)."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise I2SError(f"activations must be float32, got {x.dtype}")
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise I2SError(f"activations must be 1-D or 2-D, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise I2SError("non-finite activation")
    amax = np.maximum(np.abs(x.astype(np.float64)).max(axis=1, initial=0.0), ACT_FLOOR)
    s = (127.0 / amax).astype(F32)  # 127 / double, rounded once to float
    t = x * s[:, None]  # float32 product
    r = np.trunc(t.astype(np.float64) + np.copysign(0.5, t))  # C round(): half away from zero
    # t + 0.5 in float64 is exact for |t| < 2^52, so trunc gives round() exactly
    return np.clip(r, -128, 127).astype(np.int8), s


def int_dot(packed: np.ndarray, rows: int, cols: int, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ code·xq  int32 (tokens, rows), Σ xq int32 (tokens,)): the kernel's two integers."""
    c = codes(packed, rows * cols).reshape(rows, cols).astype(np.int32)
    xq = np.asarray(xq, dtype=np.int8).reshape(-1, cols).astype(np.int32)
    return xq @ c.T, xq.sum(axis=1)


def epilogue(sumi: np.ndarray, act_sum: np.ndarray, act_scale: np.ndarray, w_scale: float) -> np.ndarray:
    """y = ((f32)sumi - (f32)act_sum) / act_scale * w_scale, each step one f32 rounding."""
    a = sumi.astype(F32) - act_sum.astype(F32)[:, None]
    return (a / act_scale.astype(F32)[:, None]) * F32(w_scale)


def dot(
    packed: np.ndarray, shape: tuple[int, int], xq: np.ndarray, act_scale: np.ndarray, w_scale: float
) -> np.ndarray:
    """Integer i2 x i8 dot followed by the float epilogue: (tokens, rows) float32."""
    sumi, act_sum = int_dot(packed, shape[0], shape[1], xq)
    return epilogue(sumi, act_sum, np.asarray(act_scale, dtype=F32).reshape(-1), w_scale)


def bitlinear(x: np.ndarray, data: bytes, shape: tuple[int, int]) -> np.ndarray:
    """x (tokens, cols) f32 -> (tokens, rows) f32: int8 activations, i2 x i8 dot, epilogue."""
    packed, d = split_payload(data, shape)
    xq, s = quantize_activations(x)
    if xq.shape[1] != shape[1]:
        raise I2SError(f"activation width {xq.shape[1]} != weight cols {shape[1]}")
    return dot(packed, shape, xq, s, d)
