"""The status cases (header, loader, and the tokenizer loader): the status a backend's load or
load_tokenizer gives a file, against the catalogue's (or, with --target-version, what a runtime of
that version must say)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlconf import versions
from mlconf.backends import STATUSES

if TYPE_CHECKING:
    from mlconf.backends import Backend
    from mlconf.cases import Case
    from mlconf.runner import Result, Workdir


def run(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    fx = case.params.get("fixture")
    path = str(work.path(fx)) if fx is not None else str(case.params["path"])
    expected, why = case.expected, ""
    if case.params.get("target_version") is not None:  # what a runtime of that version says
        expected, why = versions.expected(
            case.expected, fx.rule, versions.read_head(path), case.params["target_version"]
        )
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
