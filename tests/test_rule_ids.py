"""The rule behind a status (issue 34): a backend that reports rule ids (ml_check_rule,
ml_tok_check_rule, the reference, a cmd: program's `rule`) fails a case refused with the right status
by another rule; one that does not is judged by status only, and the reports say so."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from mlconf import cases, reports, runner
from mlconf.backends import get
from mlconf.backends.native import qemu

ROOT = Path(__file__).resolve().parents[1]
ONE_MISTAKE = ROOT / "tests" / "data" / "cmd_one_mistake.py"
STATUS_AREAS = ("header", "loader", "tokenizer")


def _status_cases() -> list:
    return [c for c in cases.collect(STATUS_AREAS) if c.compare == "status"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = runner.Workdir()
    yield w
    w.close()


def _doc(results, backends) -> dict:
    return reports.build(results, backends, list(STATUS_AREAS), None, False, 1)


@pytest.mark.parametrize("name", ["native", "reference", "native:neon"])
def test_native_and_reference_name_the_rule_of_every_status_case(name, work):
    if name == "native:neon" and qemu.missing_tools():
        pytest.skip(f"native:neon under qemu untested: {qemu.missing_tools()}")
    b, todo = get(name), _status_cases()
    try:
        results = runner.run(todo, [b], work)
    finally:
        getattr(b, "close", lambda: None)()
    assert results and all(r.outcome == "pass" for r in results), [
        r.detail for r in results if r.outcome != "pass"
    ]
    refused = [r for r in results if r.metrics["rule_expected"]]
    malformed = [c for c in todo if "fixture" in c.params and c.params["fixture"].kind == "malformed"]
    assert len(refused) == len(malformed) > 150  # every malformed .mlb and .mlt fixture names its rule
    assert all(r.metrics["rule_got"] == r.metrics["rule_expected"] for r in results)
    text = reports.summary_md(_doc(results, [b]))
    assert f"- {b.name}: {len(results)} by status and rule id, 0 by status only\n" in text


def _cmd(*mistake: str):
    return get("cmd:" + shlex.join([sys.executable, str(ONE_MISTAKE), *mistake]))


def test_the_right_status_by_the_wrong_rule_fails(work):
    """format.truncated_body and format.q8_minus128 both give ML_E_FORMAT: a runtime whose
    mis-sized layout trips the -128 scan has the right status for the wrong reason."""
    b = _cmd("misrule", "format.truncated_body", "format.q8_minus128")
    try:
        results = runner.run([c for c in _status_cases() if c.area == "loader"], [b], work)
    finally:
        b.close()
    failed = {r.case for r in results if r.outcome == "fail"}
    assert failed == {r.case for r in results if r.case.startswith("loader/format.truncated_body/")}
    assert len(failed) >= 10
    r = next(r for r in results if r.outcome == "fail")
    assert "ML_E_FORMAT as expected, but by rule format.q8_minus128, not format.truncated_body" in r.detail
    assert all(r.metrics["rule_got"] is not None for r in results)


def test_a_backend_without_rules_is_judged_by_status_only(work):
    b = _cmd("rule", "format.magic")  # reports no rules; accepts what format.magic refuses
    try:
        results = runner.run([c for c in _status_cases() if c.area == "loader"], [b], work)
    finally:
        b.close()
    assert {r.case for r in results if r.outcome == "fail"} == {
        r.case for r in results if r.case.startswith("loader/format.magic/")
    }
    passed = [r for r in results if r.outcome == "pass"]
    assert passed and all(r.metrics["rule_got"] is None for r in passed)
    assert all(r.detail.endswith("(status only)") for r in passed if r.metrics["rule_expected"])
    doc = _doc(results, [b])
    reports.validate(doc)
    text = reports.summary_md(doc)
    n_named = sum(1 for r in results if r.metrics["rule_expected"] is not None)
    assert f"- {b.name}: 0 by status and rule id, {n_named} by status only" in text


@pytest.mark.parametrize("name", ["native", "reference"])
def test_at_an_older_krafla_version_the_rule_is_the_one_that_refuses_the_newer_file(name, work):
    b = get(name)
    try:
        assert b.set_target_version((0, 8, 0))
        todo = cases.collect(("header", "loader"), target_version=(0, 8, 0))
        results = runner.run(todo, [b], work)
    finally:
        getattr(b, "close", lambda: None)()
    assert all(r.outcome == "pass" for r in results), [r.detail for r in results if r.outcome != "pass"]
    moved = [r for r in results if r.case.startswith("header/") and r.metrics["rule_expected"]]
    assert moved and all(r.metrics["rule_got"] == r.metrics["rule_expected"] for r in moved)


def test_a_failing_status_case_says_the_rule_the_sentence_the_decision_and_the_field(work):
    b = _cmd("rule", "format.padding")  # accepts the files header.padding's rule refuses
    try:
        results = runner.run(
            [c for c in _status_cases() if c.id.startswith("loader/format.padding/")], [b], work
        )
    finally:
        b.close()
    assert results and all(r.outcome == "fail" for r in results)
    for r in results:
        assert "; the spec: rule format.padding (decision header.padding); the reference: " in r.detail
        assert "header byte " in r.detail and "[format.padding]" in r.detail  # the offset and its value


def test_quant_scales_differ_as_values():
    from mlconf.areas.quant import bytes_diff

    text, _ = bytes_diff("scales", b"\x00\x00\x80\xbf", b"\x00\x00\x00\xbf", 4, 1, dtype="<f4")
    assert "got -0.5 (-0x1.0000000000000p-1, bytes 000000bf) expected -1.0 (-0x1.0000000000000p+0" in text
