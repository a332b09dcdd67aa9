"""What the library backend checks before a call crosses the C ABI (int32 ranges, array shapes),
and why an input was refused: the ABI returns a status and no reason, so the reason is found here."""

from __future__ import annotations

import numpy as np

from ..base import BackendError, InputError, Unsupported, token_array
from . import abi

INT32 = (-(2**31), 2**31 - 1)
I2S_BLOCK, I2S_TAIL = 128, 32  # specs/i2s.yaml block, tail_bytes
POOLING_CODES = {None: -1, "mean": 1, "cls": 2, "last": 3}  # ML_POOL_MODEL, ML_POOL_MEAN, ...


def int32(v: int, what: str) -> int:
    v = int(v)
    if not INT32[0] <= v <= INT32[1]:
        raise InputError(f"{what} {v} does not fit the ABI's int32_t")
    return v


def tokens32(tokens) -> np.ndarray:
    """Token ids as the ABI's int32_t array (InputError for what does not fit); unchanged values."""
    t = token_array(tokens)
    if t.size and (t.min() < INT32[0] or t.max() > INT32[1]):
        raise InputError("a token id does not fit the ABI's int32_t")
    if t.size > INT32[1]:
        raise InputError(f"{t.size} tokens do not fit the ABI's int32_t count")
    return t


def i2s_problem(x: np.ndarray, payload: np.ndarray | None = None, rows: int = 0, cols: int = 0) -> str:
    """What an I2_S function of the ABI must refuse in this input (the ABI returns only a status)."""
    r, c = x.shape
    if r == 0 or (payload is not None and rows == 0):
        return f"no rows ({(rows, cols) if payload is not None else x.shape})"
    if c == 0 or c % I2S_BLOCK:
        return f"row length {c} is not a positive multiple of {I2S_BLOCK}"
    flat = x.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        i = int(bad[0])
        return f"non-finite value {flat[i]} at row {i // c}, column {i % c}"
    if payload is not None:
        b = payload[: rows * cols // 4].reshape(-1, 32)
        codes = np.stack([(b >> s) & 3 for s in (6, 4, 2, 0)], axis=1).reshape(-1)  # element order
        three = np.flatnonzero(codes == 3)
        if three.size:
            k = int(three[0])
            return (
                f"code 3 at element {k} (row {k // cols}, column {k % cols}; packed byte "
                f"{(k // 128) * 32 + k % 32})"
            )
    return "no rule of specs/i2s.yaml refuses this input"


def quantizer_status(fn: str, st: int, problem, d: np.ndarray, f16: bool) -> np.ndarray:
    """The scales of a quantizer call that returned st, or the error it stands for (problem():
    why the input is refused, since the ABI returns a status and no reason)."""
    if st == abi.ML_E_ARG:
        raise ValueError(f"{fn} refused the input (ML_E_ARG): {problem()}")
    if st == abi.ML_E_UNSUPPORTED:
        raise Unsupported(f"{fn} returned ML_E_UNSUPPORTED")
    if st != abi.ML_OK:
        raise BackendError(f"{fn} returned {abi.status_name(st)}")
    return d.view(np.float16) if f16 else d


def q8_problem(x: np.ndarray, f16: bool) -> str:
    """What in the input the quantizer must refuse (the ABI returns a status, not a reason)."""
    flat = x.reshape(-1)
    if flat.size % 32:
        return f"{flat.size} values is not a multiple of 32"
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        return f"non-finite value {flat[bad[0]]} at flat index {int(bad[0])}"
    if f16:
        d = np.abs(flat.reshape(-1, 32)).max(axis=1) / np.float32(127)
        big = np.flatnonzero(d > np.float32(65504))
        if big.size:
            i = int(big[0])
            return f"block {i}: scale {float(d[i])!r} is above 65504 and cannot be stored as f16"
    return "no rule of specs/quant.yaml refuses this input"


def q4_problem(x: np.ndarray, rule: str, f16: bool, imp: np.ndarray | None) -> str:
    """Why the reference refuses the input too (the ABI returns a status, not a reason)."""
    from mlconf.backends.reference import quant

    try:
        if rule == "round":
            quant.q4_0_round(x, f16=f16)
        else:
            quant.q4_0_search(x, f16=f16, importance=imp)
    except quant.QuantError as e:
        return str(e)
    return "no rule of specs/quant.yaml refuses this input"
