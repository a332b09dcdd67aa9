"""The forward cases: logits of a model for tokens fed in one call (prefill) or one at a time
(decode), within a tolerance of the expectation (transformers' golden or the reference's); a
refusal (decision forward.nonfinite) must come at the same call as the expectation's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from mlconf.backends import NumericError
from mlconf.compare import distances, within

if TYPE_CHECKING:
    from mlconf.backends import Backend
    from mlconf.cases import Case
    from mlconf.runner import Result, Workdir


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
    calls = [(tokens, 0)] if mode == "prefill" else [(tokens[i : i + 1], i) for i in range(len(tokens))]
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


def judge(r: Result, tolerance: str, got: np.ndarray | NonFinite, want: np.ndarray | NonFinite) -> None:
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
        r.detail = f"NumericError after {len(g)} logits rows, as expected: {got.reason}" + (
            f"; rows before: {r.detail}" if r.detail else ""
        )


def run(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    if "fixture" in case.params:  # a generated model: its path in this run's fixtures
        case = replace(case, params={**case.params, "model": work.path(case.params["fixture"])})
    want = case.expected if case.expected is not None else work.expected_logits(case)
    judge(r, case.params["tolerance"], run_forward(case, backend), want)
