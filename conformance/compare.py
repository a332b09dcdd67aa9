"""Distances between float arrays, and the pass rule of specs/tolerances.yaml."""

from __future__ import annotations

import numpy as np

from mlconf import specs


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in float32 units in the last place (ordered-integer difference)."""
    def ordered(x: np.ndarray) -> np.ndarray:
        i = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    if a.size == 0:
        return 0
    return int(np.max(np.abs(ordered(a) - ordered(b))))


def distances(got: np.ndarray, want: np.ndarray) -> dict:
    """nmse, max_abs, max_ulp, differing element count and argmax agreement (rows = positions)."""
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    err = got.astype(np.float64) - want.astype(np.float64)
    denom = float(np.mean(want.astype(np.float64) ** 2))
    out = {
        "nmse": float(np.mean(err ** 2) / denom) if denom > 0 else float(np.mean(err ** 2)),
        "max_abs": float(np.max(np.abs(err))) if err.size else 0.0,
        "max_ulp": ulp_distance(got, want),
        "differ": int(np.count_nonzero(got != want)),
    }
    if got.ndim == 2:
        out["argmax"] = float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
    return out


def within(kind: str, d: dict) -> tuple[bool, str]:
    """Whether distances ``d`` pass tolerance ``kind``; the text names each metric over its bound."""
    tol = specs.load("tolerances")[kind]
    over = []
    for metric in ("nmse", "max_abs"):
        if metric in tol and not d[metric] <= tol[metric]:
            over.append(f"{metric} {d[metric]:.3g} > {tol[metric]:.3g}")
    if "argmax" in tol and not d.get("argmax", 1.0) >= tol["argmax"]:
        over.append(f"argmax agreement {d['argmax']:.3f} < {tol['argmax']}")
    return not over, "; ".join(over)
