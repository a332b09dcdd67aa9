"""The quantizer cases: Q8_0 and Q4_0 bytes against the spec's (bit-exact, with the block and
element of the first difference), and the inputs a quantizer must refuse."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mlconf.compare import byte_distance

if TYPE_CHECKING:
    from mlconf.backends import Backend
    from mlconf.cases import Case
    from mlconf.runner import Result, Workdir


def bytes_diff(
    name: str,
    want: bytes,
    got: bytes,
    itemsize: int,
    per_block: int,
    unit: str = "element",
    dtype: str | None = None,
) -> tuple[str, dict]:
    """Where two byte strings of equal meaning differ, in elements of ``itemsize`` bytes, with the
    quantization block of the first difference (``per_block`` items of kind ``unit`` per block).
    ``dtype``: the elements are numbers of that dtype (scales), shown as values with their bits."""
    if len(want) != len(got):
        return f"{name}: {len(got)} bytes, expected {len(want)}", {f"{name}_len": len(got)}
    a = np.frombuffer(want, dtype=np.uint8).reshape(-1, itemsize)
    b = np.frombuffer(got, dtype=np.uint8).reshape(-1, itemsize)
    diff = np.flatnonzero((a != b).any(axis=1))
    if not diff.size:
        return "", {}
    i = int(diff[0])
    where = f"block {i}" if per_block == 1 else f"block {i // per_block}, {unit} {i % per_block}"

    def show(row: np.ndarray) -> str:
        if dtype is None:
            return row.tobytes().hex()
        v = float(np.frombuffer(row.tobytes(), dtype=dtype)[0])
        return f"{v!r} ({float.hex(v)}, bytes {row.tobytes().hex()})"

    return (
        f"{name}: {diff.size} of {len(a)} elements differ, first at {i} ({where}): "
        f"got {show(b[i])} expected {show(a[i])}"
    ), {f"{name}_differ": int(diff.size), f"{name}_first": i}


def _run_quant(case: Case, backend: Backend) -> tuple[bytes, bytes]:
    p = case.params
    x = p["x"]
    if case.capability == "quantize_q8_0":
        q, d = backend.quantize_q8_0(x, f16=p["f16"])
    else:
        q, d = backend.quantize_q4_0(x, rule=p["rule"], f16=p["f16"], importance=p.get("importance"))
    q = np.asarray(q)
    d = np.asarray(d)
    want_q = np.int8 if case.capability == "quantize_q8_0" else np.uint8
    want_d = np.float16 if p["f16"] else np.float32
    if q.dtype != want_q or d.dtype != want_d:
        raise TypeError(
            f"backend returned q {q.dtype} / d {d.dtype}, expected {np.dtype(want_q)} / {np.dtype(want_d)}"
        )
    return q.tobytes(), d.astype(d.dtype.newbyteorder("<")).tobytes()


def refused(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    try:
        out = _run_quant(case, backend)
    except (ValueError, ArithmeticError) as e:
        r.outcome, r.got, r.detail = "pass", "refused", str(e)
    else:
        r.outcome, r.got, r.output = "fail", "accepted", out
        r.detail = "the quantizer accepted an input it must refuse"


def bit_exact(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    q, d = _run_quant(case, backend)
    r.output = (q, d)
    want_q, want_d = case.expected
    # Q8_0: 32 int8 per block; Q4_0: 16 bytes per block (a byte holds elements j and j + 16)
    q8 = case.capability == "quantize_q8_0"
    dq, mq = bytes_diff(
        "quants", want_q, q, 1, 32 if q8 else 16, "element" if q8 else "byte (elements j and j + 16)"
    )
    f16 = case.params["f16"]
    dd, md = bytes_diff("scales", want_d, d, 2 if f16 else 4, 1, dtype="<f2" if f16 else "<f4")
    r.metrics = {**mq, **md, **byte_distance(want_q + want_d, q + d)}
    r.got = "identical" if not (dq or dd) else "differs"
    r.outcome = "pass" if not (dq or dd) else "fail"
    r.detail = "; ".join(s for s in (dq, dd) if s)


def run(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    (refused if case.compare == "refused" else bit_exact)(case, backend, work, r)
