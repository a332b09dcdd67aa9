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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlconf import fixtures
from mlconf.areas import bitnet, forward, quant, status, tokenizer
from mlconf.areas.bitnet import damage_gguf
from mlconf.areas.forward import NonFinite, run_forward
from mlconf.areas.tokenizer import duplicate_merges
from mlconf.backends import (
    Backend,
    Unsupported,
    WorkerCrash,
    WorkerTimeout,
)
from mlconf.cases import Case, claims
from mlconf.records import output_kind


@dataclass
class Result:
    case: str
    area: str
    spec: str
    backend: str
    outcome: str  # one of OUTCOMES
    compare: str  # status | bit-exact | refused | toleranced | ids
    expected: Any = None
    got: Any = None
    detail: str = ""
    metrics: dict = field(default_factory=dict)
    output_kind: str = ""  # records.OUTPUT_KINDS
    tolerance: str | None = None  # the specs/tolerances.yaml entry of a toleranced case
    output: Any = field(default=None, repr=False, compare=False)  # the raw output (not serialized)
    capability: str = ""  # the backend capability the case needs (what --require gates)
    claims: tuple[str, ...] = ()  # the variants of it the case needs (backends.SUB_CAPABILITIES)


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

    def tokenizer(self, golden: Path, variant: str | None = None) -> Path:
        """The .mlt of a golden tokenizer.json, converted (tools/convert_tokenizer.py) on first use;
        variant "duplicate_merges": that .mlt with its merges listed twice (areas/tokenizer.py)."""
        from mlconf.tools import convert_tokenizer

        out = self.root / "tokenizer" / "golden" / golden.with_suffix(".mlt").name
        with self._lock:
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                convert_tokenizer.convert(golden, out)
            if variant is None:
                return out
            if variant != "duplicate_merges":
                raise ValueError(f"{golden}: no tokenizer variant {variant!r}")
            derived = out.with_suffix(f".{variant}.mlt")
            if not derived.exists():
                duplicate_merges(out, derived)
            return derived

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


def run_case(case: Case, backend: Backend, work: Workdir) -> Result:
    r = Result(
        case.id,
        case.area,
        case.spec,
        backend.name,
        "error",
        case.compare,
        case.expected,
        output_kind=output_kind(case),
        tolerance=case.params.get("tolerance"),
        capability=case.capability,
        claims=claims(case),
    )
    if case.params.get("expected_from"):
        r.expected = f"the {case.params['expected_from']} backend's output"
    try:
        _run_case(case, backend, work, r)
    finally:  # no temporary or cache path in a record: records are the same from run to run
        for root in {str(work.fixture_root), str(work.root)}:
            r.detail = r.detail.replace(root, "$WORK")
            if isinstance(r.metrics.get("reason"), str):
                r.metrics["reason"] = r.metrics["reason"].replace(root, "$WORK")
    return r


def _module(case: Case):
    """The area module that runs the case: the status cases of every area share one."""
    if case.compare == "status":
        return status
    return {"quant": quant, "forward": forward, "tokenizer": tokenizer, "bitnet": bitnet}[case.area]


def _run_case(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    if case.capability not in backend.capabilities:
        why = getattr(backend, "unsupported", {}).get(case.capability)  # e.g. a symbol a lib: lacks
        r.outcome, r.detail = "unsupported", why or f"backend has no {case.capability} capability"
        return
    try:
        _module(case).run(case, backend, work, r)
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
    goldens = {
        (str(c.params["golden"]), c.params.get("variant") or "") for c in cases if "golden" in c.params
    }
    for golden, variant in sorted(goldens):
        work.tokenizer(Path(golden), variant or None)


def run(
    cases: Iterable[Case],
    backends: Iterable[Backend],
    work: Workdir | None = None,
    progress: Callable[[Result], None] | None = None,
    jobs: int = 1,
    stop_on: Callable[[Result], bool] | None = None,
) -> list[Result]:
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
            from mlconf import forked

            forked.run_forked(cases, backends, work, min(jobs, len(cases)), on_result)
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
