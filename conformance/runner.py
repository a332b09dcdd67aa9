"""Run cases on backends and turn each into a result record.

One path for every caller: `mlconf run`, the pytest plugin and the tests all go through
run_case(). Outcomes: pass, fail, unsupported (the backend lacks the capability or the variant),
error (the backend raised or returned something malformed), crash (the worker process of an
isolated backend died: the detail names the signal and the call) and timeout (the call took longer
than the backend's timeout and its worker was killed).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlconf import fixtures
from mlconf.backends import STATUSES, Backend, Unsupported, WorkerCrash, WorkerTimeout
from mlconf.cases import Case
from mlconf.compare import distances, within

OUTCOMES = ("pass", "fail", "unsupported", "error", "crash", "timeout")


@dataclass
class Result:
    case: str
    area: str
    spec: str
    backend: str
    outcome: str                # one of OUTCOMES
    compare: str                # status | bit-exact | refused
    expected: Any = None
    got: Any = None
    detail: str = ""
    metrics: dict = field(default_factory=dict)


class Workdir:
    """The generated fixture files of a run, written once, on first use."""

    def __init__(self, root: str | Path | None = None):
        self._tmp = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mlconf-")
            root = self._tmp.name
        self.root = Path(root)
        self._written = False
        self._expected: dict[str, np.ndarray] = {}

    def path(self, fixture: fixtures.Fixture) -> Path:
        if not self._written:
            fixtures.generate(self.root)
            self._written = True
        return self.root / fixture.file

    def tokenizer(self, golden: Path) -> Path:
        """The .mlt of a golden tokenizer.json, converted (tools/convert_tokenizer.py) on first use."""
        from mlconf.tools import convert_tokenizer
        out = self.root / "tokenizer" / "golden" / golden.with_suffix(".mlt").name
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            convert_tokenizer.convert(golden, out)
        return out

    def expected_logits(self, case: Case) -> np.ndarray:
        """A cross-backend case's expectation: the reference backend's logits, computed once."""
        key = case.id
        if key not in self._expected:
            from mlconf.backends.reference import ReferenceBackend
            self._expected[key] = _run_forward(case, ReferenceBackend())
        return self._expected[key]

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _bytes_diff(name: str, want: bytes, got: bytes, itemsize: int) -> tuple[str, dict]:
    """Where two byte strings of equal meaning differ, in elements of ``itemsize`` bytes."""
    if len(want) != len(got):
        return f"{name}: {len(got)} bytes, expected {len(want)}", {f"{name}_len": len(got)}
    a = np.frombuffer(want, dtype=np.uint8).reshape(-1, itemsize)
    b = np.frombuffer(got, dtype=np.uint8).reshape(-1, itemsize)
    diff = np.flatnonzero((a != b).any(axis=1))
    if not diff.size:
        return "", {}
    i = int(diff[0])
    return (f"{name}: {diff.size} of {len(a)} elements differ, first at {i}: "
            f"got {b[i].tobytes().hex()} expected {a[i].tobytes().hex()}"), {f"{name}_differ": int(diff.size),
                                                                             f"{name}_first": i}


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


def _run_forward(case: Case, backend: Backend) -> np.ndarray:
    """Logits of the case's tokens from position 0: in one call (prefill) or one token at a time."""
    p = case.params
    session = backend.open_model(str(p["model"]))
    try:
        toks = np.asarray(p["tokens"])
        if p["mode"] == "prefill":
            return np.asarray(session.forward(toks, 0))
        return np.concatenate([np.asarray(session.forward(toks[i:i + 1], i)) for i in range(len(toks))])
    finally:
        session.close()


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
    r = Result(case.id, case.area, case.spec, backend.name, "error", case.compare, case.expected)
    if case.capability not in backend.capabilities:
        why = getattr(backend, "unsupported", {}).get(case.capability)  # e.g. a symbol a lib: lacks
        r.outcome, r.detail = "unsupported", why or f"backend has no {case.capability} capability"
        return r
    try:
        if case.compare == "status":
            fx = case.params["fixture"]
            path = str(work.path(fx))
            if case.capability == "load_tokenizer":
                got = backend.load_tokenizer(path, model_vocab=fx.model_vocab)
            else:
                got = backend.load(path)
            r.got = got.status
            if got.status not in STATUSES:
                r.detail = f"unknown status {got.status!r}"
                return r
            ok = got.status == case.expected
            r.outcome = "pass" if ok else "fail"
            r.detail = got.reason if ok else f"expected {case.expected}, got {got.status}: {got.reason}"
        elif case.compare == "refused":
            try:
                _run_quant(case, backend)
            except (ValueError, ArithmeticError) as e:
                r.outcome, r.got, r.detail = "pass", "refused", str(e)
            else:
                r.outcome, r.got = "fail", "accepted"
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
            r.outcome = "pass" if first is None else "fail"
            r.detail = f"{len(got)} ids identical" if first is None else _ids_detail(case, work, got, first)
            if first is not None:
                r.metrics = {"first_diff": first}
        elif case.compare == "toleranced":
            want = case.expected if case.expected is not None else work.expected_logits(case)
            r.metrics = distances(_run_forward(case, backend), want)
            ok, over = within(case.params["tolerance"], r.metrics)
            r.outcome = "pass" if ok else "fail"
            r.got = "within" if ok else "outside"
            r.detail = over or ", ".join(f"{k} {v:.3g}" for k, v in r.metrics.items())
        else:
            q, d = _run_quant(case, backend)
            want_q, want_d = case.expected
            dq, mq = _bytes_diff("quants", want_q, q, 1)
            dd, md = _bytes_diff("scales", want_d, d, 2 if case.params["f16"] else 4)
            r.metrics = {**mq, **md}
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
    return r


def run(cases: Iterable[Case], backends: Iterable[Backend], work: Workdir | None = None,
        progress=None) -> list[Result]:
    own = work is None
    work = work or Workdir()
    results = []
    try:
        for b in backends:
            for c in cases:
                if c.params.get("expected_from") == b.name:
                    continue  # a backend is not compared with itself
                res = run_case(c, b, work)
                results.append(res)
                if progress:
                    progress(res)
    finally:
        if own:
            work.close()
    return results
