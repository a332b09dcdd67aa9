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
    """nmse, max_abs, max_ulp, differing element count and argmax agreement (rows = positions).
    Non-finite values (a file's NaN or infinite weights, decision loader.float_values) must stand
    where the expectation has the same one: `nonfinite_mismatch` counts the places where they do
    not (present only when there is a non-finite value); the other figures are over the places
    finite in both."""
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    finite = np.isfinite(got) & np.isfinite(want)
    extra = {}
    if got.shape == want.shape and not finite.all():
        same = (np.isnan(got) & np.isnan(want)) | (np.isinf(got) & (got == want))
        extra["nonfinite_mismatch"] = int(np.count_nonzero(~finite & ~same))
        got_f, want_f = got[finite], want[finite]
    else:
        got_f, want_f = got, want
    err = got_f.astype(np.float64) - want_f.astype(np.float64)
    mse = float(np.mean(err**2)) if err.size else 0.0
    denom = float(np.mean(want_f.astype(np.float64) ** 2)) if want_f.size else 0.0
    out = {
        "nmse": mse / denom if denom > 0 else mse,
        "max_abs": float(np.max(np.abs(err))) if err.size else 0.0,
        "max_ulp": ulp_distance(got_f, want_f),
        "differ": int(np.count_nonzero(~((got == want) | (np.isnan(got) & np.isnan(want))))),
        **extra,
    }
    if got.ndim == 2:
        out["argmax"] = float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
    return out


def embedding_distances(got: np.ndarray, want: np.ndarray) -> dict:
    """distances() of two embeddings plus their cosine similarity, the first differing element and
    the element of the largest error."""
    out = distances(got, want)
    g = np.asarray(got, np.float64).reshape(-1)
    w = np.asarray(want, np.float64).reshape(-1)
    norms = float(np.linalg.norm(g) * np.linalg.norm(w))
    out["cosine"] = float(g @ w / norms) if norms > 0 else float(np.array_equal(g, w))
    diff = np.flatnonzero(np.asarray(got, np.float32).reshape(-1) != np.asarray(want, np.float32).reshape(-1))
    out["first_differ"] = int(diff[0]) if diff.size else -1
    out["worst"] = int(np.argmax(np.abs(g - w))) if g.size else 0
    return out


def tolerance(kind: str) -> dict:
    """The entry ``kind`` of specs/tolerances.yaml; KeyError naming it when it is missing."""
    tol = specs.load("tolerances").get(kind)
    if not isinstance(tol, dict):
        raise KeyError(f"tolerance {kind!r} is not defined in specs/tolerances.yaml")
    return tol


def within(kind: str, d: dict) -> tuple[bool, str]:
    """Whether distances ``d`` pass tolerance ``kind``; the text names each metric over its bound."""
    tol = tolerance(kind)
    over = []
    if d.get("nonfinite_mismatch"):
        over.append(f"{d['nonfinite_mismatch']} non-finite values where the expectation differs")
    for metric in ("nmse", "max_abs", "max_ulp"):
        if metric in tol and not d[metric] <= tol[metric]:
            over.append(f"{metric} {d[metric]:.3g} > {tol[metric]:.3g}")
    if "argmax" in tol and not d.get("argmax", 1.0) >= tol["argmax"]:
        over.append(f"argmax agreement {d['argmax']:.3f} < {tol['argmax']}")
    if "cosine" in tol and not d.get("cosine", 1.0) >= tol["cosine"]:
        over.append(f"cosine {d['cosine']:.9g} < {tol['cosine']}")
    return not over, "; ".join(over)


def byte_distance(want: bytes, got: bytes) -> dict:
    """differ: the bytes that differ (a length difference counts each missing byte); first_diff: the
    first differing byte, or None when they are equal."""
    a, b = np.frombuffer(want, np.uint8), np.frombuffer(got, np.uint8)
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    differ = int(diff.size) + abs(a.size - b.size)
    first = int(diff[0]) if diff.size else (n if a.size != b.size else None)
    return {"differ": differ, "first_diff": first}
