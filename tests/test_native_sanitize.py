"""The native runtime built with AddressSanitizer + UndefinedBehaviorSanitizer (build.py
--sanitize), run through the lib:PATH backend on the loader, header and forward areas: every
malformed and valid fixture, every golden model prefilled, decoded and compared with the
reference. A sanitizer report aborts the worker, which the harness records as a crash: zero
crashes, zero failures means zero reports."""

from __future__ import annotations

import pytest

from mlconf import cases, runner
from mlconf.backends import get

pytestmark = pytest.mark.slow  # the runtime under ASan/UBSan

SMOKE_MUTANTS = 20000  # per loader: 105 s (loader) and 24 s (tokenizer) on the Xeon host


@pytest.fixture(scope="module")
def sanitized(asan_libmlrt):
    return asan_libmlrt


def test_loader_and_forward_under_sanitizers(sanitized, tmp_path, monkeypatch):
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
    monkeypatch.setenv("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    backend = get(f"lib:{sanitized}")
    sel = cases.collect(["header", "loader", "forward"])
    work = runner.Workdir(tmp_path / "work")
    try:
        results = runner.run(sel, [backend], work)
    finally:
        work.close()
    bad = [(r.case, r.outcome, r.detail[:300]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) == len([c for c in sel if c.params.get("expected_from") != backend.name])


@pytest.mark.parametrize("area", ["loader", "tokenizer"])
def test_fuzz_smoke_under_sanitizers(sanitized, monkeypatch, area):
    """A bounded fuzz campaign (issue 17's CI smoke run: 20,000 mutants per loader, a fixed seed)
    against the sanitized library: a sanitizer report aborts the worker, a crash outcome; every
    mutant must give the reference's status, and every accepted .mlb its two-token forward."""
    from mlconf import fuzz

    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
    monkeypatch.setenv("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    backend = get(f"lib:{sanitized}")
    try:
        c = fuzz.run(backend, area, seed=20261201, count=SMOKE_MUTANTS)
    finally:
        backend.close()
    assert c.agreed == c.mutants == SMOKE_MUTANTS, [
        (r.outcome, r.spec, r.detail[:200]) for r in c.failures[:3]
    ]
