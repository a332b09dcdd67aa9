"""Run cases on backends and turn each into a result record.

One path for every caller: `mlconf run`, the pytest plugin and the tests all go through
run_case(). Outcomes: pass, fail, unsupported (the backend lacks the capability or the variant),
error (the backend raised or returned something malformed), crash (the worker process of an
isolated backend died: the detail names the signal and the call) and timeout (the call took longer
than the backend's timeout and its worker was killed).

Besides the outcome, run_case keeps the backend's raw output (Result.output: a status string, bytes
or a tuple of them, an ndarray, a list of ids; never serialized) so that the reports can compare
backends with each other (reports.matrix), and the distances to the expectation in Result.metrics
(records.record turns a Result into its JSON record). run(jobs=N) runs the cases in N forked
processes; the results are the same as a serial run's.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mlconf import fixtures, versions
from mlconf.backends import (
    STATUSES,
    Backend,
    InputError,
    NumericError,
    Unsupported,
    WorkerCrash,
    WorkerTimeout,
)
from mlconf.cases import GGUF_F16, GGUF_F32, GGUF_I2_S, I2S_BLOCK, Case, gguf_tensors
from mlconf.compare import distances, embedding_distances, within
from mlconf.records import output_kind

OUTCOMES = ("pass", "fail", "unsupported", "error", "crash", "timeout")


@dataclass
class Result:
    case: str
    area: str
    spec: str
    backend: str
    outcome: str                # one of OUTCOMES
    compare: str                # status | bit-exact | refused | toleranced | ids
    expected: Any = None
    got: Any = None
    detail: str = ""
    metrics: dict = field(default_factory=dict)
    output_kind: str = ""       # records.OUTPUT_KINDS
    tolerance: str | None = None    # the specs/tolerances.yaml entry of a toleranced case
    output: Any = field(default=None, repr=False, compare=False)   # the raw output (not serialized)
    capability: str = ""        # the backend capability the case needs (what --require gates)


class Workdir:
    """The files a run reads: the generated fixtures (without ``root``: the set of the per-user
    cache, fixtures.cached(), generated once per content hash; with ``root``, or without a usable
    cache: written into the folder on first use) and per-run files (converted tokenizers, damaged
    GGUFs) in ``root`` or a temporary folder."""

    def __init__(self, root: str | Path | None = None):
        self._tmp = None
        self._cache = root is None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mlconf-")
            root = self._tmp.name
        self.root = Path(root)
        self.fixture_root = self.root
        self._written = False
        self._expected: dict[str, Any] = {}
        self._damage: dict[str, str] = {}
        self._lock = threading.RLock()  # run(jobs=N): each file and expectation is made once

    def path(self, fixture: fixtures.Fixture) -> Path:
        with self._lock:
            if not self._written:
                cached = fixtures.cached() if self._cache else None
                if cached is None:
                    fixtures.generate(self.root)
                else:
                    self.fixture_root = cached
                self._written = True
        return self.fixture_root / fixture.file

    def tokenizer(self, golden: Path) -> Path:
        """The .mlt of a golden tokenizer.json, converted (tools/convert_tokenizer.py) on first use."""
        from mlconf.tools import convert_tokenizer
        out = self.root / "tokenizer" / "golden" / golden.with_suffix(".mlt").name
        with self._lock:
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                convert_tokenizer.convert(golden, out)
        return out

    def expected_logits(self, case: Case) -> np.ndarray | NonFinite:
        """A cross-backend case's expectation: the reference backend's logits, computed once."""
        return self.expected_from_reference(case, run_forward)

    def expected_from_reference(self, case: Case, compute) -> Any:
        """A cross-backend case's expectation: ``compute(case, reference backend)``, computed once."""
        key = case.id
        with self._lock:
            if key not in self._expected:
                from mlconf.backends.reference import ReferenceBackend
                self._expected[key] = compute(case, ReferenceBackend())
            return self._expected[key]

    def damaged_gguf(self, golden: Path, kind: str) -> tuple[Path, str]:
        """A damaged copy of a golden GGUF and what was damaged (damage_gguf), written on first use."""
        out = self.root / "bitnet" / "damaged" / f"{Path(golden).stem}-{kind}.gguf"
        with self._lock:
            if str(out) not in self._damage:
                out.parent.mkdir(parents=True, exist_ok=True)
                self._damage[str(out)] = damage_gguf(golden, out, kind)
            return out, self._damage[str(out)]

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _bytes_diff(name: str, want: bytes, got: bytes, itemsize: int, per_block: int,
                unit: str = "element") -> tuple[str, dict]:
    """Where two byte strings of equal meaning differ, in elements of ``itemsize`` bytes, with the
    quantization block of the first difference (``per_block`` items of kind ``unit`` per block)."""
    if len(want) != len(got):
        return f"{name}: {len(got)} bytes, expected {len(want)}", {f"{name}_len": len(got)}
    a = np.frombuffer(want, dtype=np.uint8).reshape(-1, itemsize)
    b = np.frombuffer(got, dtype=np.uint8).reshape(-1, itemsize)
    diff = np.flatnonzero((a != b).any(axis=1))
    if not diff.size:
        return "", {}
    i = int(diff[0])
    where = f"block {i}" if per_block == 1 else f"block {i // per_block}, {unit} {i % per_block}"
    return (f"{name}: {diff.size} of {len(a)} elements differ, first at {i} ({where}): "
            f"got {b[i].tobytes().hex()} expected {a[i].tobytes().hex()}"), \
        {f"{name}_differ": int(diff.size), f"{name}_first": i}


def byte_distance(want: bytes, got: bytes) -> dict:
    """differ: the bytes that differ (a length difference counts each missing byte); first_diff: the
    first differing byte, or None when they are equal."""
    a, b = np.frombuffer(want, np.uint8), np.frombuffer(got, np.uint8)
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    differ = int(diff.size) + abs(a.size - b.size)
    first = int(diff[0]) if diff.size else (n if a.size != b.size else None)
    return {"differ": differ, "first_diff": first}


def _joined(v) -> bytes:
    return b"".join(v) if isinstance(v, tuple | list) else bytes(v)


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
        raise TypeError(f"backend returned q {q.dtype} / d {d.dtype}, expected {np.dtype(want_q)} / "
                        f"{np.dtype(want_d)}")
    return q.tobytes(), d.astype(d.dtype.newbyteorder("<")).tobytes()


@dataclass(frozen=True)
class NonFinite:
    """A forward that failed with NumericError (decision forward.nonfinite): the logits of the
    calls before the failing one (none for a prefill) and the backend's reason."""

    logits: np.ndarray
    reason: str


def run_forward(case: Case, backend: Backend) -> np.ndarray | NonFinite:
    """Logits of the case's tokens from position 0: in one call (prefill) or one token at a time."""
    p = case.params
    session = backend.open_model(str(p["model"]), p.get("ctx"))
    try:
        return forward_calls(session, np.asarray(p["tokens"]), p["mode"])
    finally:
        session.close()


def forward_calls(session, tokens: np.ndarray, mode: str) -> np.ndarray | NonFinite:
    """``tokens`` from position 0 on an open session: in one call (prefill) or one at a time."""
    calls = [(tokens, 0)] if mode == "prefill" else [(tokens[i:i + 1], i) for i in range(len(tokens))]
    rows: list[np.ndarray] = []
    for part, pos in calls:
        try:
            rows.append(np.asarray(session.forward(part, pos)))
        except NumericError as e:
            width = rows[0].shape[1] if rows else 0
            return NonFinite(np.concatenate(rows) if rows else np.zeros((0, width), np.float32), str(e))
    return np.concatenate(rows)


def _said(x: np.ndarray | NonFinite) -> str:
    if isinstance(x, NonFinite):
        return f"NumericError after {len(x.logits)} logits rows ({x.reason})"
    return f"{len(x)} logits rows"


def _judge_forward(r: Result, tolerance: str, got: np.ndarray | NonFinite,
                   want: np.ndarray | NonFinite) -> None:
    """Logits within ``tolerance`` of the expectation; a refusal (NonFinite) must come at the same
    call as the expectation's, and the logits before it are compared."""
    g = got.logits if isinstance(got, NonFinite) else got
    w = want.logits if isinstance(want, NonFinite) else want
    r.output = g
    if isinstance(got, NonFinite) != isinstance(want, NonFinite) or len(g) != len(w):
        r.outcome = "fail"
        r.got = "refused" if isinstance(got, NonFinite) else "logits"
        r.detail = f"expected {_said(want)}; got {_said(got)} (decision forward.nonfinite)"
        return
    r.metrics = distances(g, w) if g.size else {}
    ok, over = within(tolerance, r.metrics) if g.size else (True, "")
    r.outcome = "pass" if ok else "fail"
    r.got = "within" if ok else "outside"
    r.detail = over or ", ".join(f"{k} {v:.3g}" for k, v in r.metrics.items())
    if isinstance(got, NonFinite):
        r.got = "refused" if ok else r.got
        r.detail = (f"NumericError after {len(g)} logits rows, as expected: {got.reason}"
                    + (f"; rows before: {r.detail}" if r.detail else ""))


# ---------------------------------------------------------------- bitnet
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
        pick = ([t for t in norms if t["type"] == GGUF_F32] + [t for t in norms if t["type"] == GGUF_F16])
        if not pick:
            raise ValueError(f"{src}: no 1-D F32 or F16 norm tensor to damage")
        t = pick[0]
        nan = np.array([np.nan], dtype="<f4" if t["type"] == GGUF_F32 else "<f2").tobytes()
        data[t["offset"]:t["offset"] + len(nan)] = nan
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
    from mlconf.tools.mlb import atomic_write
    atomic_write(Path(dst), [bytes(data)])
    return what


def _run_i2s(case: Case, backend: Backend):
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
        where = (f"packed byte {i} (block {blk}, byte {j}: elements {els}"
                 + (f" = row {els[0] // cols}, columns {[e % cols for e in els]}" if cols else "")
                 + f"): codes got {codes(b[i])} expected {codes(a[i])}")
    else:
        sw = np.frombuffer(want[n_packed:n_packed + 4], "<f4")[0]
        sg = np.frombuffer(got[n_packed:n_packed + 4], "<f4")[0]
        where = (f"tail byte {i - n_packed}: scale got {float(sg)!r} ({got[n_packed:n_packed + 4].hex()}) "
                 f"expected {float(sw)!r} ({want[n_packed:n_packed + 4].hex()})" if i < n_packed + 4 else
                 f"tail byte {i - n_packed} (padding, must be 0): got {b[i]:#04x}")
    return (f"payload: {diff.size} of {len(want)} bytes differ ({int(np.count_nonzero(diff < n_packed))} "
            f"packed), first at {where}"), metrics


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
    return (f"{name}: {diff.size} of {a.size} elements differ, first at {at}: got {py(b[i])!r} expected "
            f"{py(a[i])!r}"), {f"{name}_differ": int(diff.size), f"{name}_first": i}


def _bitnet_bits(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    p = case.params
    want = (work.expected_from_reference(case, _run_i2s) if p.get("expected_from") else case.expected)
    got = _run_i2s(case, backend)
    if p["op"] == "pack":
        cols = int(np.shape(p["w"])[-1])
        parts = [_payload_diff(want, got, cols)]
    elif p["op"] == "act":
        cols = int(np.shape(p["x"])[-1])
        parts = [_values_diff("q", want[0], got[0], "i1", cols),
                 _values_diff("scale", want[1], got[1], "<f4", 1),
                 _values_diff("sum", want[2], got[2], "<i4", 1)]
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


def _run_embed(case: Case, backend: Backend) -> np.ndarray:
    p = case.params
    session = (backend.open_embedder(str(p["model"]), p["reading"]) if p.get("reading")
               else backend.open_embedder(str(p["model"])))
    try:
        return np.asarray(session.embed(np.asarray(p["tokens"]), p["pooling"], p["normalize"]))
    finally:
        session.close()


def _bitnet_embed(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    p = case.params
    want = case.expected if case.expected is not None else work.expected_from_reference(case, _run_embed)
    got = _run_embed(case, backend)
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
    where = (f"; largest error at element {m['worst']}: got {float(got[m['worst']])!r} expected "
             f"{float(want[m['worst']])!r}" if m["differ"] else "")
    r.detail = ((over + "; " if over else "") + ", ".join(
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items()) + where)


def _bitnet_refused(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    p = case.params
    if p["op"] in ("pack", "act", "matmul"):
        try:
            out = _run_i2s(case, backend)
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
    session = backend.open_embedder(str(p["model"]))      # op embed_call: a bad call on a valid model
    try:
        tokens = np.array([session.vocab if t is None else t for t in p["tokens"]], dtype=np.int64)
        try:
            session.embed(tokens, p["pooling"], False)
        except InputError as e:
            r.outcome, r.got, r.detail = "pass", "refused", str(e)
        else:
            r.outcome, r.got = "fail", "accepted"
            r.detail = (f"embed accepted tokens {tokens.tolist()} with pooling {p['pooling']!r} "
                        f"(vocab {session.vocab})")
    finally:
        session.close()


def _run_bitnet(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    if case.compare == "refused":
        _bitnet_refused(case, backend, work, r)
    elif case.compare == "toleranced":
        _bitnet_embed(case, backend, work, r)
    else:
        _bitnet_bits(case, backend, work, r)


def _first_diff(got: list[int], want: list[int]) -> int | None:
    if got == want:
        return None
    pairs = enumerate(zip(got, want, strict=False))
    return next((k for k, (a, b) in pairs if a != b), min(len(got), len(want)))


def _ids_detail(case: Case, work: Workdir, got: list[int], i: int) -> str:
    """The first differing position, the ids there and the text around it (reference decoder)."""
    want = list(case.expected)
    from mlconf.backends.reference.tokenizer import Encoder
    from mlconf.tools import mlt
    enc = Encoder(mlt.read(work.tokenizer(case.params["golden"])))
    before = enc.decode(want[max(0, i - 8): i])[-24:]
    after = enc.decode(want[i: i + 4])[:24]
    return (f"ids differ first at position {i} of {len(want)} (got {len(got)} ids): expected "
            f"{want[max(0, i - 2): i + 3]}, got {got[max(0, i - 2): i + 3]} (from index {max(0, i - 2)}); "
            f"text there: {before!r} | {after!r}; input {case.params['text'][:60]!r}")


def run_case(case: Case, backend: Backend, work: Workdir) -> Result:
    r = Result(case.id, case.area, case.spec, backend.name, "error", case.compare, case.expected,
               output_kind=output_kind(case), tolerance=case.params.get("tolerance"),
               capability=case.capability)
    if case.params.get("expected_from"):
        r.expected = f"the {case.params['expected_from']} backend's output"
    try:
        _run_case(case, backend, work, r)
    finally:    # no temporary or cache path in a record: records are the same from run to run
        for root in {str(work.fixture_root), str(work.root)}:
            r.detail = r.detail.replace(root, "$WORK")
            if isinstance(r.metrics.get("reason"), str):
                r.metrics["reason"] = r.metrics["reason"].replace(root, "$WORK")
    return r


def _run_case(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    if case.capability not in backend.capabilities:
        why = getattr(backend, "unsupported", {}).get(case.capability)  # e.g. a symbol a lib: lacks
        r.outcome, r.detail = "unsupported", why or f"backend has no {case.capability} capability"
        return
    try:
        if case.area == "bitnet":
            _run_bitnet(case, backend, work, r)
        elif case.compare == "status":
            fx = case.params.get("fixture")
            path = str(work.path(fx)) if fx is not None else str(case.params["path"])
            expected, why = case.expected, ""
            if case.params.get("target_version") is not None:   # what a runtime of that version says
                expected, why = versions.expected(case.expected, fx.rule, versions.read_head(path),
                                                  case.params["target_version"])
                r.expected = expected
            if case.capability == "load_tokenizer":
                vocab = fx.model_vocab if fx is not None else case.params.get("model_vocab")
                got = backend.load_tokenizer(path, model_vocab=vocab)
            else:
                got = backend.load(path)
            r.got = got.status
            r.metrics = {"expected": expected, "got": got.status, "reason": got.reason}
            if got.status not in STATUSES:
                r.detail = f"unknown status {got.status!r}"
                return
            r.output = got.status
            ok = got.status == expected
            r.outcome = "pass" if ok else "fail"
            r.detail = got.reason if ok else f"expected {expected}, got {got.status}: {got.reason}"
            if why:
                r.detail += f" (expected {expected}: {why})"
        elif case.compare == "refused":
            try:
                out = _run_quant(case, backend)
            except (ValueError, ArithmeticError) as e:
                r.outcome, r.got, r.detail = "pass", "refused", str(e)
            else:
                r.outcome, r.got, r.output = "fail", "accepted", out
                r.detail = "the quantizer accepted an input it must refuse"
        elif case.compare == "ids":
            mlt_path = work.tokenizer(case.params["golden"])
            session = backend.open_tokenizer(str(mlt_path))
            try:
                got = [int(i) for i in session.encode(case.params["text"])]
            finally:
                if hasattr(session, "close"):
                    session.close()
            first = _first_diff(got, list(case.expected))
            r.got = got
            r.output = got
            r.outcome = "pass" if first is None else "fail"
            r.detail = f"{len(got)} ids identical" if first is None else _ids_detail(case, work, got, first)
            r.metrics = {"first_diff": first, "len_expected": len(case.expected), "len_got": len(got)}
        elif case.compare == "toleranced":
            if "fixture" in case.params:      # a generated model: its path in this run's fixtures
                case = replace(case, params={**case.params, "model": work.path(case.params["fixture"])})
            want = case.expected if case.expected is not None else work.expected_logits(case)
            _judge_forward(r, case.params["tolerance"], run_forward(case, backend), want)
        else:
            q, d = _run_quant(case, backend)
            r.output = (q, d)
            want_q, want_d = case.expected
            # Q8_0: 32 int8 per block; Q4_0: 16 bytes per block (a byte holds elements j and j + 16)
            q8 = case.capability == "quantize_q8_0"
            dq, mq = _bytes_diff("quants", want_q, q, 1, 32 if q8 else 16,
                                 "element" if q8 else "byte (elements j and j + 16)")
            dd, md = _bytes_diff("scales", want_d, d, 2 if case.params["f16"] else 4, 1)
            r.metrics = {**mq, **md, **byte_distance(want_q + want_d, q + d)}
            r.got = "identical" if not (dq or dd) else "differs"
            r.outcome = "pass" if not (dq or dd) else "fail"
            r.detail = "; ".join(s for s in (dq, dd) if s)
    except Unsupported as e:
        r.outcome, r.detail = "unsupported", str(e) or "unsupported variant"
    except WorkerCrash as e:  # "worker killed by SIGSEGV during load('...')"
        r.outcome, r.detail = "crash", str(e)
    except WorkerTimeout as e:
        r.outcome, r.detail = "timeout", str(e)
    except Exception as e:  # a backend bug is a result, not a crash of the harness
        r.outcome, r.detail = "error", f"{type(e).__name__}: {e}"


def prepare(cases: list[Case], work: Workdir) -> None:
    """Write every file the cases read (fixtures, converted tokenizers) before any thread starts."""
    for c in cases:
        if "fixture" in c.params:
            work.path(c.params["fixture"])
            break
    for golden in sorted({str(c.params["golden"]) for c in cases if "golden" in c.params}):
        work.tokenizer(Path(golden))


def _fresh(b: Backend) -> Backend:
    """In a forked child: a new instance of backend ``b`` (its own worker process, if it has one),
    made by name with the per-call timeout of ``b``; ``b`` itself (the forked copy) when its name
    is not registered, which is right for an in-process backend such as a test's wrapper class."""
    from mlconf.backends import get
    try:
        fresh = get(b.name)
    except Exception:
        return b
    if type(fresh) is not type(b):
        _close(fresh)
        return b
    if getattr(b, "timeout", None) is not None and hasattr(fresh, "timeout"):
        fresh.timeout = b.timeout
    if getattr(b, "target_version", None) is not None:
        fresh.set_target_version(b.target_version)
    return fresh


def _close(b: Backend) -> None:
    close = getattr(b, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            pass


_LEN = __import__("struct").Struct("<Q")


def _child(fd: int, shard: list[tuple[int, Case]], backends: list[Backend], work: Workdir) -> None:
    """A forked child: run its shard of cases on fresh backends, send each (backend index, case
    index, Result) through ``fd`` as a length-prefixed pickle, then (None, None, None)."""
    import pickle
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, len(backends))) as pool:   # their workers start at once
        fresh = list(pool.map(_fresh, backends))
    own = [fb for fb, b in zip(fresh, backends, strict=True) if fb is not b]
    try:
        with os.fdopen(fd, "wb") as out:
            for bi, b in enumerate(backends):
                fb = fresh[bi]
                for ci, c in shard:
                    if c.params.get("expected_from") == b.name:
                        continue
                    res = run_case(c, fb, work)
                    res.backend = b.name
                    blob = pickle.dumps((bi, ci, res), protocol=pickle.HIGHEST_PROTOCOL)
                    out.write(_LEN.pack(len(blob)) + blob)
                    out.flush()
            blob = pickle.dumps((None, None, None))
            out.write(_LEN.pack(len(blob)) + blob)
    finally:
        for fb in own:
            _close(fb)


def _run_forked(cases: list[Case], backends: list[Backend], work: Workdir, jobs: int,
                on_result: Callable[[int, int, Result], bool]) -> None:
    """run(jobs=N): N forked children, each with every backend (fresh instances, see _fresh) and
    every N-th case. ``on_result`` returns True to stop the run (the children are then ended)."""
    import pickle
    import selectors
    import signal
    prepare(cases, work)         # fixtures and tokenizers once, before the fork
    sel = selectors.DefaultSelector()
    kids: dict[int, int] = {}    # read fd -> pid
    bufs: dict[int, bytearray] = {}
    finished: set[int] = set()
    for j in range(jobs):
        shard = list(enumerate(cases))[j::jobs]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:             # the child
            code = 0
            try:
                os.close(r)
                _child(w, shard, backends, work)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        kids[r] = pid
        bufs[r] = bytearray()
        sel.register(r, selectors.EVENT_READ)
    stopped = False
    try:
        while sel.get_map() and not stopped:
            for key, _ in sel.select():
                fd = key.fd
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                buf += chunk
                while len(buf) >= _LEN.size:
                    n = _LEN.unpack_from(buf)[0]
                    if len(buf) < _LEN.size + n:
                        break
                    bi, ci, res = pickle.loads(bytes(buf[_LEN.size:_LEN.size + n]))
                    del buf[:_LEN.size + n]
                    if bi is None:
                        finished.add(fd)
                    elif not stopped and on_result(bi, ci, res):
                        stopped = True
    finally:
        for fd, pid in kids.items():
            if stopped or fd not in finished:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)
            if sel.get_map() and fd in sel.get_map():
                sel.unregister(fd)
            os.close(fd)
        sel.close()
    if not stopped and len(finished) != len(kids):
        raise RuntimeError("a runner process ended before its cases were done (its traceback is above)")


def run(cases: Iterable[Case], backends: Iterable[Backend], work: Workdir | None = None,
        progress: Callable[[Result], None] | None = None, jobs: int = 1,
        stop_on: Callable[[Result], bool] | None = None) -> list[Result]:
    """Every case on every backend; the results in the order backend by backend, case by case.

    ``jobs`` > 1: ``jobs`` forked processes, each running every jobs-th case on its own fresh
    instances of the backends (_fresh: a worker-backed backend gets its own worker process); the
    fixtures are written before the fork. The results, and their order, are those of a serial run.
    ``progress`` is called once per result, in the calling process. ``stop_on``: a predicate on a
    result; when it holds, no further case starts (--fail-fast) and the results so far are returned.
    """
    cases, backends = list(cases), list(backends)
    own = work is None
    work = work or Workdir()
    got: list[tuple[int, int, Result]] = []

    def on_result(bi: int, ci: int, res: Result) -> bool:
        got.append((bi, ci, res))
        if progress:
            progress(res)
        return bool(stop_on and stop_on(res))

    try:
        if jobs > 1 and len(cases) > 1 and hasattr(os, "fork"):
            _run_forked(cases, backends, work, min(jobs, len(cases)), on_result)
        else:
            for bi, b in enumerate(backends):
                for ci, c in enumerate(cases):
                    if c.params.get("expected_from") == b.name:
                        continue  # a backend is not compared with itself
                    if on_result(bi, ci, run_case(c, b, work)):
                        return [r for *_, r in got]
    finally:
        if own:
            work.close()
    return [r for *_, r in sorted(got, key=lambda t: (t[0], t[1]))]
