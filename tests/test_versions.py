"""Version-targeted conformance (`mlconf run --target-version`, conformance/versions.py, decision
version.older_runtime): the expectations of a Krafla V runtime are derived from the spec tables
(each feature's `since`, the rule order), and the loaders' version switches (the reference's, and
libmlrt's ml_set_target_version, in-process and under qemu) must give exactly them."""

from __future__ import annotations

import json
import struct
from collections import Counter

import pytest

from mlconf import cases, cli, runner, specs, versions
from mlconf.backends import get
from mlconf.backends.native import qemu
from mlconf.backends.reference import ReferenceBackend, loader
from mlconf.tools import exits

TARGETS = [(0, 7, 0), (0, 8, 0), (0, 8, 65535), (0, 9, 0), (1, 0, 0)]


def _head(layer_flags: list[int] | None = None, **fields) -> bytes:
    """A header (and its flag bytes) with the given u32 fields; the rest of q8_min's shape."""
    h = bytearray(256)
    offsets = {f["name"]: f["offset"] for f in specs.load("mlb_header")["fields"]}
    fields.setdefault("n_layers", len(layer_flags) if layer_flags else 2)
    if layer_flags is not None:
        fields["layer_flags"] = 1
    for k, v in fields.items():
        struct.pack_into("<I", h, offsets[k], v)
    return bytes(h) + bytes(layer_flags or [])


# ---------------------------------------------------------------- the derivation itself
def test_parse_version():
    assert specs.parse_version("0.8.0") == (0, 8, 0) == specs.parse_version(" 0.8 ")
    for bad in ("", "0", "0.x.0", "1.2.3.4", "-1.0.0", "0.8.0-rc1", None, 0.8):
        with pytest.raises(ValueError):
            specs.parse_version(bad)
    assert specs.format_version((0, 9, 0)) == "0.9.0"


def test_the_seed_sentence_is_in_the_spec_table():
    fv = specs.feature_versions()
    assert fv["layer_flag_bits"] == {4: (0, 8, 0), 8: (0, 9, 0)}
    assert sorted(off for off, _ in fv["fields"].values()) == list(range(132, 160, 4))
    assert {v for _, v in fv["fields"].values()} == {(0, 9, 0)}
    assert versions.boundaries() == [(0, 8, 0), (0, 9, 0)]
    assert versions.older((0, 9, 0)) == (0, 8, 65535) and versions.older((1, 0, 0)) == (0, 65535, 65535)


def test_features_of_a_header():
    assert versions.file_version(_head()) is None
    assert versions.file_version(_head(rot_dim=4)) == (0, 9, 0)
    assert versions.file_version(_head([0, 4])) == (0, 8, 0)
    assert versions.file_version(_head([8, 4])) == (0, 9, 0)
    assert versions.file_version(_head([0, 4])[:257]) is None  # flag bytes cut: not read
    assert versions.file_version(_head(layer_flags=None, n_layers=2) + bytes([4, 4])) is None
    assert versions.file_version(b"MLB1") is None


def test_expected_status_follows_the_rule_order():
    f16 = _head(rot_dim=4)
    assert versions.expected("ML_OK", "", f16, None) == ("ML_OK", "")
    assert versions.expected("ML_OK", "", f16, (0, 9, 0)) == ("ML_OK", "")
    st, why = versions.expected("ML_OK", "", f16, (0, 8, 0))
    assert st == "ML_E_FORMAT" and "rot_dim needs Krafla 0.9.0" in why and "format.padding" in why
    # a rule before format.padding still decides; a shape rule after it does not
    assert versions.expected("ML_E_FORMAT", "format.magic", f16, (0, 8, 0))[0] == "ML_E_FORMAT"
    assert versions.expected("ML_E_SHAPE", "shape.zero.dim", f16, (0, 8, 0))[0] == "ML_E_FORMAT"
    # flag bit 2 is refused by format.layer.unknown_bits: the header's shape rules come first
    nope = _head([0, 4])
    st, why = versions.expected("ML_E_SHAPE", "shape.zero.dim", nope, (0, 7, 0))
    assert st == "ML_E_SHAPE" and "comes first" in why
    assert versions.expected("ML_E_SHAPE", "shape.linear.k_heads", nope, (0, 7, 0))[0] == "ML_E_FORMAT"
    assert versions.expected("ML_E_SHAPE", "shape.zero.dim", nope, (0, 8, 0)) == ("ML_E_SHAPE", "")


# ---------------------------------------------------------------- the backends' switches
def _load_cases(target):
    return [
        c
        for c in cases.collect(["header", "loader", "forward"], target_version=target)
        if c.capability == "load"
    ]


def _check(backend, target):
    results = runner.run(_load_cases(target), [backend])
    bad = [f"{r.case}: {r.detail}" for r in results if r.outcome != "pass"]
    assert not bad, f"{backend.name} at {target}: {bad[:5]}"
    return results


@pytest.mark.parametrize("target", TARGETS, ids=specs.format_version)
def test_reference_switch_gives_the_derived_statuses(target):
    ref = ReferenceBackend()
    assert ref.set_target_version(target)
    results = _check(ref, target)
    changed = [r for r in results if "needs Krafla" in r.detail]
    assert bool(changed) == (target < (0, 9, 0))


@pytest.mark.parametrize("name", ["native", "native:scalar"])
@pytest.mark.parametrize("target", TARGETS, ids=specs.format_version)
def test_native_switch_gives_the_derived_statuses(name, target):
    b = get(name)
    try:
        assert b.set_target_version(target)
        _check(b, target)
        b.close()  # a fresh worker gets the version again (worker.Worker.setup)
        _check(b, target)
    finally:
        b.close()


def test_a_runtime_without_a_switch_fails_exactly_on_the_newer_files(generated):
    """The newest reference gated as 0.8.0: fails on the fixtures whose older status differs, and
    (it reports rules) on those a 0.8.0 runtime refuses with the same status by another rule."""
    out, _ = generated
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))

    def older_rule(f: dict) -> str:
        return versions.expectation(
            f["expected"], f.get("rule", ""), versions.read_head(out / f["file"]), (0, 8, 0)
        )[1]

    newer = [
        f
        for f in manifest["fixtures"]
        if f["min_version"] and specs.parse_version(f["min_version"]) > (0, 8, 0)
    ]
    differ = {
        f["file"] for f in newer if f["expected_older"] != f["expected"] or older_rule(f) != f.get("rule", "")
    }
    assert any(f["expected_older"] == f["expected"] for f in newer if f["file"] in differ)  # a rule moved
    selected = [c for c in _load_cases((0, 8, 0)) if c.area != "forward"]
    results = runner.run(selected, [ReferenceBackend()])
    failed = {c.params["fixture"].file for c, r in zip(selected, results, strict=True) if r.outcome == "fail"}
    assert Counter(r.outcome for r in results)["fail"] == len(differ) > 10
    assert failed == differ


def test_manifest_min_versions(generated):
    out, _ = generated
    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    manifest = {f["file"]: f for f in doc["fixtures"]}
    assert manifest["valid/q8_min.mlb"]["min_version"] is None
    assert manifest["valid/smollm3.mlb"]["min_version"] == "0.8.0"
    assert manifest["valid/qwen35.mlb"]["min_version"] == "0.9.0"
    # each file's statuses by the reference switched to min_version and to just before it
    for f in manifest.values():
        if not f["min_version"]:
            continue
        v = specs.parse_version(f["min_version"])
        assert loader.load(out / f["file"], v).status == f["expected"], f["file"]
        assert loader.load(out / f["file"], versions.older(v)).status == f["expected_older"], f["file"]


def test_golden_models_needing_a_newer_version_become_refusals():
    ids = {c.id: c for c in cases.collect(["forward"], target_version=(0, 8, 0))}
    refused = sorted(i for i in ids if i.endswith("/refused_by_older"))
    assert refused == ["forward/qwen35_linear/refused_by_older", "forward/qwen35_q4_mask/refused_by_older"]
    assert all(ids[i].expected == "ML_E_FORMAT" for i in refused)
    assert "forward/smollm3_nope/prefill" in ids and "forward/qwen35_linear/prefill" not in ids
    older = {c.id for c in cases.collect(["forward"], target_version=(0, 7, 0))}
    assert "forward/smollm3_nope/refused_by_older" in older
    assert {c.id for c in cases.collect(["forward"], target_version=(0, 9, 0))} == {
        c.id for c in cases.collect(["forward"])
    }


def test_neon_worker_switch(tmp_path):
    if qemu.missing_tools():
        pytest.skip(f"native:neon under qemu untested: {qemu.missing_tools()}")
    b = get("native:neon")
    try:
        assert b.set_target_version((0, 8, 0))
        qwen35 = str(cases.GOLDEN_DIR / "logits" / "qwen35_linear.mlb")
        smollm3 = str(cases.GOLDEN_DIR / "logits" / "smollm3_nope.mlb")
        assert b.load(qwen35).status == "ML_E_FORMAT" and b.load(smollm3).status == "ML_OK"
        b.set_target_version(None)
        assert b.load(qwen35).status == "ML_OK"
    finally:
        b.close()


def test_native_refuses_a_bad_version():
    b = get("native")
    try:
        with pytest.raises(Exception, match="ML_E_ARG"):
            b.set_target_version((0, 70000, 0))
    finally:
        b.close()


# ---------------------------------------------------------------- the command line
def test_cli_target_version_in_parallel(tmp_path, capsys):
    rc = cli.main(
        [
            "run",
            "-b",
            "reference",
            "-b",
            "native",
            "--area",
            "header",
            "--area",
            "loader",
            "-k",
            "qwen35 or smollm3 or q8_min",
            "-j",
            "2",
            "--target-version",
            "0.8.0",
            "--report",
            str(tmp_path),
        ]
    )
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert rc == exits.OK, [r for r in doc["records"] if r["outcome"] != "pass"][:3]
    assert doc["run"]["target_version"] == "0.8.0"
    assert [b["version_switch"] for b in doc["run"]["backends"]] == [True, True]
    refused = [r for r in doc["records"] if r["case"] == "header/qwen35"]
    assert len(refused) == 2 and all(r["expected"] == "ML_E_FORMAT" for r in refused)
    assert "--target-version 0.8.0" in (tmp_path / "summary.md").read_text(encoding="utf-8")


def test_cli_bad_target_version(tmp_path, capsys):
    rc = cli.main(["run", "--area", "header", "--target-version", "0.x", "--report", str(tmp_path)])
    assert rc == exits.USAGE
    assert "--target-version" in capsys.readouterr().err
