"""The BitNet cases: I2_S payloads, activations and matmuls bit for bit (the packed byte, block
and codes of the first difference), embeddings within a tolerance, and what must be refused
(bad I2_S inputs, damaged GGUFs, bad embed calls)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mlconf import fixtures
from mlconf.backends import InputError
from mlconf.cases import GGUF_F16, GGUF_F32, GGUF_I2_S, I2S_BLOCK, gguf_tensors
from mlconf.compare import byte_distance, embedding_distances, within

if TYPE_CHECKING:
    from mlconf.backends import Backend
    from mlconf.cases import Case
    from mlconf.runner import Result, Workdir


def _joined(v) -> bytes:
    return b"".join(v) if isinstance(v, tuple | list) else bytes(v)


def damage_gguf(src: str | Path, dst: str | Path, kind: str) -> str:
    """Write a copy of GGUF ``src`` that a loader must refuse; returns what was damaged.
    nan_norm: a quiet NaN as element 0 of the first 1-D F32 norm (F16 if there is none);
    truncated: the file cut in the middle of its last tensor's data; code3: code 3 as element 7
    of the first I2_S tensor (bits 7..6 of its packed byte 7); a fixtures.SPECIAL_PATHS kind:
    that instead of a file (a FIFO, a symlink to /dev/null, ...)."""
    if kind in fixtures.SPECIAL_PATHS:
        fixtures.make_special(Path(dst), kind)
        return fixtures.SPECIAL_PATHS[kind]
    data = bytearray(Path(src).read_bytes())
    tensors = gguf_tensors(src)
    if kind == "nan_norm":
        norms = [t for t in tensors if len(t["shape"]) == 1 and "norm" in t["name"]]
        pick = [t for t in norms if t["type"] == GGUF_F32] + [t for t in norms if t["type"] == GGUF_F16]
        if not pick:
            raise ValueError(f"{src}: no 1-D F32 or F16 norm tensor to damage")
        t = pick[0]
        nan = np.array([np.nan], dtype="<f4" if t["type"] == GGUF_F32 else "<f2").tobytes()
        data[t["offset"] : t["offset"] + len(nan)] = nan
        what = f"NaN at element 0 of {t['name']}"
    elif kind == "truncated":
        last = max(tensors, key=lambda t: t["offset"])
        cut = last["offset"] + max(1, (last["nbytes"] or 2) // 2)
        del data[cut:]
        what = f"cut at byte {cut}, in the data of {last['name']}"
    elif kind == "code3":
        i2 = [t for t in tensors if t["type"] == GGUF_I2_S]
        if not i2:
            raise ValueError(f"{src}: no I2_S tensor to damage")
        t = i2[0]
        data[t["offset"] + 7] |= 0xC0
        what = f"code 3 at element 7 of {t['name']}"
    else:
        raise ValueError(f"unknown GGUF damage {kind!r}")
    from mlconf.tools.files import atomic_write

    atomic_write(Path(dst), [bytes(data)])
    return what


def run_i2s(case: Case, backend: Backend):
    """The case's I2_S call: pack -> payload bytes; act -> (q, scale, sum) bytes; matmul -> y bytes."""
    p = case.params
    if p["op"] == "pack":
        payload = backend.i2s_quantize(p["w"])
        if isinstance(payload, np.ndarray) and payload.dtype == np.uint8:
            return payload.tobytes()
        if not isinstance(payload, bytes | bytearray):
            raise TypeError(f"i2s_quantize returned {type(payload).__name__}, expected bytes")
        return bytes(payload)
    if p["op"] == "act":
        q, scale, total = (np.asarray(a) for a in backend.i2s_quantize_act(p["x"]))
        for a, dt, what in ((q, np.int8, "q"), (scale, np.float32, "scale"), (total, np.int32, "sum")):
            if a.dtype != dt:
                raise TypeError(f"i2s_quantize_act returned {what} {a.dtype}, expected {np.dtype(dt)}")
        return q.tobytes(), scale.astype("<f4").tobytes(), total.astype("<i4").tobytes()
    y = np.asarray(backend.i2s_matmul(p["payload"], p["shape"], p["x"]))
    if y.dtype != np.float32:
        raise TypeError(f"i2s_matmul returned {y.dtype}, expected float32")
    want = (*np.shape(p["x"])[:-1], p["shape"][0])
    if y.shape != want:
        raise TypeError(f"i2s_matmul returned shape {y.shape}, expected {want}")
    return y.astype("<f4").tobytes()


def _payload_diff(want: bytes, got: bytes, cols: int) -> tuple[str, dict]:
    """Where two I2_S payloads differ: the packed byte (block, the four elements it holds and
    their codes) or the tail (the scale)."""
    if len(want) != len(got):
        return f"payload: {len(got)} bytes, expected {len(want)}", {"payload_len": len(got)}
    a, b = np.frombuffer(want, np.uint8), np.frombuffer(got, np.uint8)
    diff = np.flatnonzero(a != b)
    if not diff.size:
        return "", {}
    i, n_packed = int(diff[0]), len(want) - 32
    metrics = {"payload_differ": int(diff.size), "payload_first": i}
    if i < n_packed:
        blk, j = divmod(i, 32)
        els = [blk * I2S_BLOCK + j + 32 * g for g in range(4)]
        codes = lambda v: [(int(v) >> s) & 3 for s in (6, 4, 2, 0)]  # noqa: E731
        where = (
            f"packed byte {i} (block {blk}, byte {j}: elements {els}"
            + (f" = row {els[0] // cols}, columns {[e % cols for e in els]}" if cols else "")
            + f"): codes got {codes(b[i])} expected {codes(a[i])}"
        )
    else:
        sw = np.frombuffer(want[n_packed : n_packed + 4], "<f4")[0]
        sg = np.frombuffer(got[n_packed : n_packed + 4], "<f4")[0]
        where = (
            f"tail byte {i - n_packed}: scale got {float(sg)!r} ({got[n_packed : n_packed + 4].hex()}) "
            f"expected {float(sw)!r} ({want[n_packed : n_packed + 4].hex()})"
            if i < n_packed + 4
            else f"tail byte {i - n_packed} (padding, must be 0): got {b[i]:#04x}"
        )
    return (
        f"payload: {diff.size} of {len(want)} bytes differ ({int(np.count_nonzero(diff < n_packed))} "
        f"packed), first at {where}"
    ), metrics


def _values_diff(name: str, want: bytes, got: bytes, dtype: str, width: int) -> tuple[str, dict]:
    """Where two arrays stored as bytes differ: the first element as (row, column) and both values."""
    if len(want) != len(got):
        return f"{name}: {len(got)} bytes, expected {len(want)}", {f"{name}_len": len(got)}
    a, b = np.frombuffer(want, dtype), np.frombuffer(got, dtype)
    if not a.size:
        return "", {}
    size = a.dtype.itemsize
    ab, bb = a.view(np.uint8).reshape(-1, size), b.view(np.uint8).reshape(-1, size)
    diff = np.flatnonzero((ab != bb).any(axis=1))
    if not diff.size:
        return "", {}
    i = int(diff[0])
    at = f"[{i // width}, {i % width}]" if width > 1 else f"[{i}]"
    py = float if a.dtype.kind == "f" else int
    return (
        f"{name}: {diff.size} of {a.size} elements differ, first at {at}: got {py(b[i])!r} expected "
        f"{py(a[i])!r}"
    ), {f"{name}_differ": int(diff.size), f"{name}_first": i}


def _bits(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    p = case.params
    want = work.expected_from_reference(case, run_i2s) if p.get("expected_from") else case.expected
    got = run_i2s(case, backend)
    if p["op"] == "pack":
        cols = int(np.shape(p["w"])[-1])
        parts = [_payload_diff(want, got, cols)]
    elif p["op"] == "act":
        cols = int(np.shape(p["x"])[-1])
        parts = [
            _values_diff("q", want[0], got[0], "i1", cols),
            _values_diff("scale", want[1], got[1], "<f4", 1),
            _values_diff("sum", want[2], got[2], "<i4", 1),
        ]
    else:
        parts = [_values_diff("y", want, got, "<f4", int(p["shape"][0]))]
    texts = [t for t, _ in parts if t]
    r.output = got
    r.metrics = {k: v for _, m in parts for k, v in m.items()}
    r.metrics.update(byte_distance(_joined(want), _joined(got)))
    ok = not texts
    if texts and "note" in p:
        texts.append(f"(the spec's integers: {p['note']})")
    r.got = "identical" if ok else "differs"
    r.outcome = "pass" if ok else "fail"
    r.detail = "bit-identical" if ok else "; ".join(texts)


def run_embed(case: Case, backend: Backend) -> np.ndarray:
    p = case.params
    session = (
        backend.open_embedder(str(p["model"]), p["reading"])
        if p.get("reading")
        else backend.open_embedder(str(p["model"]))
    )
    try:
        return np.asarray(session.embed(np.asarray(p["tokens"]), p["pooling"], p["normalize"]))
    finally:
        session.close()


def _embed(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    p = case.params
    want = case.expected if case.expected is not None else work.expected_from_reference(case, run_embed)
    got = run_embed(case, backend)
    r.output = got
    if got.dtype != np.float32 or got.shape != np.shape(want):
        r.outcome, r.got = "fail", f"{got.dtype}{list(got.shape)}"
        r.detail = f"embedding is {got.dtype}{list(got.shape)}, expected float32{list(np.shape(want))}"
        return
    r.metrics = embedding_distances(got, want)
    ok, over = within(p["tolerance"], r.metrics)
    r.outcome = "pass" if ok else "fail"
    r.got = "within" if ok else "outside"
    m = r.metrics
    where = (
        f"; largest error at element {m['worst']}: got {float(got[m['worst']])!r} expected "
        f"{float(want[m['worst']])!r}"
        if m["differ"]
        else ""
    )
    r.detail = (
        (over + "; " if over else "")
        + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
        + where
    )


def _refused(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    p = case.params
    if p["op"] in ("pack", "act", "matmul"):
        try:
            out = run_i2s(case, backend)
        except (ValueError, ArithmeticError) as e:
            r.outcome, r.got, r.detail = "pass", "refused", str(e)
        else:
            r.outcome, r.got, r.output = "fail", "accepted", out
            r.detail = f"i2s {p['op']} accepted an input it must refuse ({case.spec})"
        return
    if p["op"] == "open":
        path, what = work.damaged_gguf(p["model"], p["damage"])
        try:
            session = backend.open_embedder(str(path))
        except InputError as e:
            r.outcome, r.got, r.detail = "pass", "refused", f"{p['damage']} ({what}): {e}"
            return
        session.close()
        r.outcome, r.got = "fail", "accepted"
        r.detail = f"open_embedder accepted {path.name}, a copy of {Path(p['model']).name} with {what}"
        return
    session = backend.open_embedder(str(p["model"]))  # op embed_call: a bad call on a valid model
    try:
        tokens = np.array([session.vocab if t is None else t for t in p["tokens"]], dtype=np.int64)
        try:
            session.embed(tokens, p["pooling"], False)
        except InputError as e:
            r.outcome, r.got, r.detail = "pass", "refused", str(e)
        else:
            r.outcome, r.got = "fail", "accepted"
            r.detail = (
                f"embed accepted tokens {tokens.tolist()} with pooling {p['pooling']!r} "
                f"(vocab {session.vocab})"
            )
    finally:
        session.close()


def run(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    if case.compare == "refused":
        _refused(case, backend, work, r)
    elif case.compare == "toleranced":
        _embed(case, backend, work, r)
    else:
        _bits(case, backend, work, r)
