"""The status cases (header, loader, and the tokenizer loader): the status a backend's load or
load_tokenizer gives a file, against the catalogue's (or, with --target-version, what a runtime of
that version must say). A backend that reports the rule behind its status (ml_check_rule,
ml_tok_check_rule, the reference, a program's `rule`) must also name the case's rule: the right
status by another rule is a misparse and fails; one that does not is judged by status only."""

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
    rule = fx.rule if fx is not None else case.params.get("rule")  # "" accepted, None: not named
    if case.params.get("target_version") is not None:  # what a runtime of that version says
        expected, rule, why = versions.expectation(
            case.expected, fx.rule, versions.read_head(path), case.params["target_version"]
        )
        r.expected = expected
    if case.capability == "load_tokenizer":
        vocab = fx.model_vocab if fx is not None else case.params.get("model_vocab")
        got = backend.load_tokenizer(path, model_vocab=vocab)
    else:
        got = backend.load(path)
    r.got = got.status
    r.metrics = {
        "expected": expected,
        "got": got.status,
        "reason": got.reason,
        "rule_expected": rule,
        "rule_got": got.rule,
    }
    if got.status not in STATUSES:
        r.detail = f"unknown status {got.status!r}"
        return
    r.output = got.status
    if got.status != expected:
        r.outcome = "fail"
        r.detail = f"expected {expected}, got {got.status}: {got.reason}"
    elif rule is not None and got.rule is not None and got.rule != rule:
        # the right status for the wrong reason: a misparse that tripped another rule
        r.outcome = "fail"
        r.detail = f"{expected} as expected, but by rule {got.rule or '(none)'}, not {rule}: {got.reason}"
    else:
        r.outcome = "pass"
        r.detail = got.reason if rule is None or got.rule is not None else f"{got.reason} (status only)"
    if why:
        r.detail += f" (expected {expected}: {why})"
