"""The status cases (header, loader, the GGUF loader and the tokenizer loader): the status a
backend's load, load_gguf or load_tokenizer gives a file, against the catalogue's (or, with
--target-version, what a runtime of that version must say of an .mlb). A backend that reports the
rule behind its status (ml_check_rule, ml_tok_check_rule, ml_embed_check_rule, the reference, a
program's `rule`) must also name the case's rule: the right status by another rule is a misparse
and fails; one that does not is judged by status only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlconf import specs, versions
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
    elif case.capability == "load_gguf":
        got = backend.load_gguf(path)
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
        r.detail = f"expected {expected}, got {got.status}: {got.reason}{_the_rule(case, rule, path, work)}"
    elif rule is not None and got.rule is not None and got.rule != rule:
        # the right status for the wrong reason: a misparse that tripped another rule
        r.outcome = "fail"
        r.detail = (
            f"{expected} as expected, but by rule {got.rule or '(none)'}, not {rule}: {got.reason}"
            f"{_the_rule(case, rule, path, work)}"
        )
    else:
        r.outcome = "pass"
        r.detail = got.reason if rule is None or got.rule is not None else f"{got.reason} (status only)"
    if why:
        r.detail += f" (expected {expected}: {why})"


def _rule_text(capability: str, rule: str) -> str:
    """The spec's sentence of a rule id (mlb_errors.yaml `seed`, mlt.yaml `meaning`) and its
    decision id, as one clause."""
    doc = specs.load({"load_tokenizer": "mlt", "load_gguf": "gguf"}.get(capability, "mlb_errors"))
    r = next((r for r in doc["rules"] if r["id"] == rule), None)
    if r is None:
        return ""
    said = r.get("seed") or r.get("meaning") or ""
    return (f' "{said}"' if said else "") + (f" (decision {r['decision']})" if r.get("decision") else "")


def _the_rule(case: Case, rule: str | None, path: str, work: Workdir) -> str:
    """What a failing status case must say, for the runtime author: the rule, the spec's sentence,
    the decision, and the reference's reason (which names the field, its offset and its value)."""
    fx = case.params.get("fixture")
    if rule is None:
        return ""
    if fx is None:  # a golden refused by an older version: no fixture, the rule says it all
        return f"; the spec: rule {rule}{_rule_text(case.capability, rule)}" if rule else ""
    from mlconf.backends.reference import loader, mlt

    if case.capability == "load_tokenizer":
        ref = mlt.load(path, fx.model_vocab)
    elif case.capability == "load_gguf":
        from mlconf.backends.reference import gguf_model

        ref = gguf_model.load(path)
    else:
        ref = loader.load(path, case.params.get("target_version"))
    if not rule:
        return f"; the spec accepts the file (the reference: {ref.reason})"
    return f"; the spec: rule {rule}{_rule_text(case.capability, rule)}; the reference: {ref.reason}"
