"""Result records: one plain JSON-able dict per case run (the "records" of results.json).

A record holds the case id, its area and spec row, the backend, the outcome, the comparison
(status | bit-exact | refused | toleranced | ids), the output kind (OUTPUT_KINDS), a short
``expected`` and ``got`` (status names, or a summary such as "34 bytes" / "within"), the detail
text, the distances to the expectation, the tolerance entry of a toleranced case and the sha256
of the canonical bytes of the backend's output. Records hold no time, no temporary path and no
float formatting of their own (floats are JSON numbers, non-finite ones the strings "NaN",
"Infinity", "-Infinity"), so two runs of the same cases give the same records.

Distances by kind (null when the case did not run to a comparison, or for a refusal):
  statuses         expected, got, reason (the backend's reason string), rule_expected (the rule
                   id that must refuse the file, "" for an accepted one, null if the case names
                   none), rule_got (the backend's rule id; null: it does not report one)
  quantizer bytes, i2s bytes, decoded bytes
                   differ (bytes that differ), first_diff (first differing byte, or null)
  logits           differ (elements), max_abs, max_ulp, nmse, argmax (agreement, rows = positions)
  embeddings       differ, max_abs, max_ulp, nmse, cosine
  ids              first_diff (first differing position, or null), len_expected, len_got
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

OUTCOMES = ("pass", "fail", "unsupported", "error", "crash", "timeout")
COMPARES = ("status", "bit-exact", "refused", "toleranced", "ids")
OUTPUT_KINDS = ("statuses", "quantizer bytes", "logits", "ids", "embeddings", "i2s bytes", "decoded bytes")
FAILING = ("fail", "error", "crash", "timeout")  # what makes a run fail
RAN = ("pass", "fail")  # outcomes that reached a comparison
ARRAY_KEYS = {
    "logits": ("differ", "max_abs", "max_ulp", "nmse", "argmax"),
    "embeddings": ("differ", "max_abs", "max_ulp", "nmse", "cosine"),
}


def failing(
    outcome: str, gate: bool | frozenset[str] = False, capability: str | None = None, claims=()
) -> bool:
    """Whether an outcome fails the run. ``gate``: True (--strict) makes every unsupported case
    fail, a set of capabilities (--require) the unsupported cases needing one of them, or needing
    only variants it names (``claims``: the case's backends.SUB_CAPABILITIES)."""
    if outcome in FAILING:
        return True
    if outcome != "unsupported" or not gate:
        return False
    return gate is True or capability in gate or bool(claims and set(claims) <= gate)


def record_fails(r: dict, gate: bool | frozenset[str]) -> bool:
    """Whether a results.json record fails the run: by its expectation's verdict where an
    expectations file matched it (mlconf.expectations), else by failing()."""
    e = r.get("expectation")
    if e:
        from mlconf.expectations import fails

        return fails(e["verdict"])
    return failing(r["outcome"], gate, r.get("capability"), r.get("claims", ()))


def gate_of(run: dict) -> bool | frozenset[str]:
    """The gate a results.json's run was judged by (files before --require have none)."""
    return True if run["strict"] else frozenset(run.get("required") or ())


def output_kind(case) -> str:
    """The kind of output a case compares, from its area, capability and comparison."""
    if case.compare == "status":
        return "statuses"
    if case.area == "quant":
        return "quantizer bytes"
    if case.area == "forward":
        return "logits"
    if case.capability == "encode":
        return "ids" if case.compare == "ids" else "decoded bytes"
    if case.capability == "embed":
        return "embeddings"
    if case.capability == "i2s":
        return "i2s bytes"
    raise ValueError(f"case {case.id}: no output kind for area {case.area!r}, capability {case.capability!r}")


def canonical_bytes(output: Any) -> bytes | None:
    """The bytes an output is compared by: a status name in UTF-8; bytes (a tuple of them joined);
    an array in little-endian C order of its own dtype; ids as little-endian int64."""
    if output is None:
        return None
    if isinstance(output, str):
        return output.encode()
    if isinstance(output, bytes | bytearray):
        return bytes(output)
    if isinstance(output, tuple):
        return b"".join(canonical_bytes(p) or b"" for p in output)
    if isinstance(output, list):
        return np.asarray(output, dtype="<i8").tobytes()
    a = np.ascontiguousarray(output)
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def sha256(output: Any) -> str | None:
    b = canonical_bytes(output)
    return None if b is None else hashlib.sha256(b).hexdigest()


def json_value(v: Any) -> Any:
    """A JSON value of a metric: numpy scalars as Python ones, non-finite floats as strings."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def short(v: Any) -> Any:
    """A short JSON value of an expectation or an output: strings as they are, else a summary."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bytes | bytearray):
        return f"{len(v)} bytes"
    if isinstance(v, tuple) and all(isinstance(p, bytes | bytearray) for p in v):
        return f"{sum(len(p) for p in v)} bytes"
    if isinstance(v, list):
        return f"{len(v)} ids"
    if isinstance(v, np.ndarray):
        return f"{v.dtype}[{', '.join(str(n) for n in v.shape)}]"
    return str(v)


def distances(result) -> dict | None:
    """The documented distances of a result (see the module doc), or None."""
    m = result.metrics or {}
    kind = result.output_kind
    if kind == "statuses":
        if "got" not in m:
            return None
        return {
            "expected": m["expected"],
            "got": m["got"],
            "reason": m.get("reason", ""),
            "rule_expected": m.get("rule_expected"),
            "rule_got": m.get("rule_got"),
        }
    if result.outcome not in RAN or result.compare == "refused":
        return None
    if kind in ARRAY_KEYS:
        if "max_abs" not in m:
            return None  # wrong dtype or shape: the detail says which
        return {k: json_value(m[k]) for k in ARRAY_KEYS[kind] if k in m}
    if kind == "ids":
        return {k: m.get(k) for k in ("first_diff", "len_expected", "len_got")}
    if "differ" in m:
        return {"differ": m["differ"], "first_diff": m["first_diff"]}
    return None


def record(result) -> dict:
    """The JSON record of a runner.Result."""
    return {
        "case": result.case,
        "area": result.area,
        "spec": result.spec,
        "backend": result.backend,
        "outcome": result.outcome,
        "compare": result.compare,
        "output_kind": result.output_kind,
        "expected": short(result.expected),
        "got": short(result.got),
        "detail": result.detail,
        "distances": distances(result),
        "tolerance": result.tolerance,
        "output_sha256": sha256(result.output),
        "capability": result.capability,
        "claims": list(result.claims),
    }


def records(results) -> list[dict]:
    """The records of results, sorted by (backend, case)."""
    return sorted((record(r) for r in results), key=lambda d: (d["backend"], d["case"]))
