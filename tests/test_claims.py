"""Variants a runtime claims one by one (issue 34, item 6): `--require quantize_q4_0.round` gates the
round-rule cases with f32 scales; a case needing f16 scales too is gated only when the claim names
quantize_q4_0.f16 as well, or the whole capability."""

from __future__ import annotations

from mlconf import cases, cli, records
from mlconf.backends import SUB_CAPABILITIES


def test_every_quant_case_claims_its_variants():
    quant = cases.collect(("quant",))
    seen = set()
    for c in quant:
        got = set(cases.claims(c))
        p = c.params
        assert ("quantize_q8_0.f16" in got or "quantize_q4_0.f16" in got) == bool(p["f16"]), c.id
        if c.capability == "quantize_q4_0":
            assert f"quantize_q4_0.{p['rule']}" in got, c.id
            assert ("quantize_q4_0.importance" in got) == (p.get("importance") is not None), c.id
        seen |= got
    assert seen == set(SUB_CAPABILITIES)  # every variant has a case
    assert all(cases.claims(c) == () for c in cases.collect(("loader",)))


def test_an_unsupported_case_fails_only_when_every_variant_it_needs_is_claimed():
    round_f16 = ("quantize_q4_0.round", "quantize_q4_0.f16")
    cap = "quantize_q4_0"
    assert not records.failing("unsupported", frozenset({"quantize_q4_0.round"}), cap, round_f16)
    assert records.failing("unsupported", frozenset(round_f16), cap, round_f16)
    assert records.failing("unsupported", frozenset({cap}), cap, round_f16)
    assert records.failing("unsupported", True, cap, round_f16)
    assert not records.failing("unsupported", frozenset({"load"}), cap, round_f16)
    assert not records.failing("unsupported", frozenset({"quantize_q4_0.round"}), "load", ())
    assert not records.failing("pass", frozenset(round_f16), cap, round_f16)


def test_require_accepts_the_variants_and_names_them_when_wrong(capsys):
    assert (
        cli.main(["run", "-b", "reference", "--area", "quant", "--require", "quantize_q4_0.round", "--list"])
        == 0
    )
    capsys.readouterr()
    assert cli.main(["run", "-b", "reference", "--require", "quantize_q4_0.rnd", "--list"]) == 4
    assert "quantize_q4_0.round" in capsys.readouterr().err
