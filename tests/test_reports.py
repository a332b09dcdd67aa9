"""Result records, results.json and its schema, the bit-exactness matrix, summary.md, junit.xml,
`mlconf report` and `mlconf diff` (issue 7 items 1-2)."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from collections import Counter

import jsonschema
import numpy as np
import pytest

from mlconf import cases, cli, records, reports, runner
from mlconf.backends import get
from mlconf.backends.reference import ReferenceBackend

KINDS = set(records.OUTPUT_KINDS)


def mixed(areas=None, per=3) -> list:
    """The first ``per`` cases of every (area, compare, output kind), in suite order."""
    seen: Counter = Counter()
    out = []
    for c in cases.collect(areas):
        key = (c.area, c.compare, records.output_kind(c))
        if seen[key] < per:
            seen[key] += 1
            out.append(c)
    return out


def run_doc(sel, backends, strict=False) -> tuple[list, dict]:
    results = runner.run(sel, backends)
    return results, reports.build(results, backends, list(cases.AREAS), None, strict, 1)


class Wrong(ReferenceBackend):
    """The reference with one quantizer byte flipped (Q8_0 quant 5) and one embedding value off by
    0.5 (element 3)."""

    name = "wrong"

    def quantize_q8_0(self, x, f16):
        q, d = super().quantize_q8_0(x, f16)
        q = q.copy()
        q.reshape(-1)[5] ^= 1
        return q, d

    def open_embedder(self, path):
        e = super().open_embedder(path)
        real = e.embed

        def embed(tokens, pooling=None, normalize=False):
            v = real(tokens, pooling, normalize).copy()
            v[3] += np.float32(0.5)
            return v

        e.embed = embed
        return e


@pytest.fixture(scope="module")
def wrong_run():
    name = cases.bitnet_goldens()[0]
    sel = cases.collect(["quant"], "q8_0/ and not refused") + cases.collect(
        ["bitnet"], f"embed/{name}/0/ and not vs_reference"
    )
    results, doc = run_doc(sel, [ReferenceBackend(), Wrong()])
    return sel, results, doc


def test_records_have_the_documented_fields_and_validate():
    sel = mixed()
    assert {records.output_kind(c) for c in sel} == KINDS
    _, doc = run_doc(sel, [ReferenceBackend(), get("bitnet")])
    jsonschema.Draft202012Validator(reports.schema()).validate(doc)
    reports.validate(doc)
    recs = doc["records"]
    assert recs == sorted(recs, key=lambda r: (r["backend"], r["case"]))
    fields = [
        "case",
        "area",
        "spec",
        "backend",
        "outcome",
        "compare",
        "output_kind",
        "expected",
        "got",
        "detail",
        "distances",
        "tolerance",
        "output_sha256",
        "capability",
        "claims",
    ]
    assert all(list(r) == fields for r in recs)
    ref = [r for r in recs if r["backend"] == "reference"]
    assert {r["output_kind"] for r in ref} == KINDS and all(r["outcome"] == "pass" for r in ref)
    for r in ref:
        d, kind = r["distances"], r["output_kind"]
        if r["compare"] == "refused":
            assert d is None and r["output_sha256"] is None
            continue
        assert len(r["output_sha256"]) == 64
        if kind == "statuses":
            assert d["expected"] == d["got"] == r["expected"] == r["got"] and isinstance(d["reason"], str)
        elif kind in ("quantizer bytes", "i2s bytes", "decoded bytes"):
            assert d == {"differ": 0, "first_diff": None}
        elif kind == "ids":
            n = int(r["expected"].split()[0])  # "N ids"
            assert d["first_diff"] is None and d["len_expected"] == d["len_got"] == n
        elif kind == "logits":
            assert set(d) == {"differ", "max_abs", "max_ulp", "nmse", "argmax"}
            assert r["tolerance"] == "logits_runtime_vs_oracle"
        else:
            assert set(d) == {"differ", "max_abs", "max_ulp", "nmse", "cosine"}
            assert r["tolerance"].startswith("embeddings_")
    unsupported = [r for r in recs if r["backend"] == "bitnet" and r["area"] != "bitnet"]
    assert unsupported and all(r["outcome"] == "unsupported" and r["distances"] is None for r in unsupported)
    assert "$WORK" in next(r["detail"] for r in ref if r["area"] == "header")  # no temporary path


def test_schema_rejects_what_it_does_not_describe(wrong_run):
    _, _, doc = wrong_run
    for mutate in (
        lambda d: d["records"][0].update(outcome="passed"),
        lambda d: d["records"][0].update(output_kind="bytes"),
        lambda d: d["records"][0].pop("distances"),
        lambda d: d["matrix"][0].update(share=1.5),
        lambda d: d["run"].update(wall=1.0),
    ):
        bad = copy.deepcopy(doc)
        mutate(bad)
        with pytest.raises(reports.ResultsError):
            reports.validate(bad)


def test_results_json_is_identical_over_repeated_runs():
    sel = mixed(per=2)
    texts = set()
    for _ in range(3):
        backends = [get(n) for n in ("reference", "native", "bitnet")]
        _, doc = run_doc(sel, backends)
        texts.add(reports.dumps(doc))
    assert len(texts) == 1


def test_matrix_reference_and_bitnet_i2s_bytes_identical():
    sel = cases.collect(["bitnet"], "i2s_ and not vs_reference")
    _, doc = run_doc(sel, [ReferenceBackend(), get("bitnet")])
    row = next(m for m in doc["matrix"] if m["kind"] == "i2s bytes")
    assert (row["a"], row["b"]) == ("reference", "bitnet")
    assert row["compared"] == len(sel) and row["identical"] == row["compared"]
    assert row["share"] == 1.0 and row["worst"] is None
    others = [m for m in doc["matrix"] if m["kind"] != "i2s bytes"]
    assert all(m["compared"] == 0 and m["share"] is None for m in others)


def test_matrix_and_summary_catch_a_wrong_backend(wrong_run):
    sel, results, doc = wrong_run
    out = {(r.backend, r.case): r.output for r in results}
    q8 = [c for c in sel if c.area == "quant"]
    emb = [c for c in sel if c.area == "bitnet"]
    flipped = [c for c in q8 if out[("reference", c.id)][0] != out[("wrong", c.id)][0]]
    assert flipped  # blocks with a sixth quant
    m = {row["kind"]: row for row in doc["matrix"]}
    assert m["quantizer bytes"]["compared"] == len(q8)
    assert m["quantizer bytes"]["identical"] == len(q8) - len(flipped)
    assert m["quantizer bytes"]["worst"] == {
        "differ_cases": len(flipped),
        "max_differ": 1,
        "refusal_mismatch": 0,
    }
    want_abs = max(
        float(abs(np.float64(out[("wrong", c.id)][3]) - np.float64(out[("reference", c.id)][3]))) for c in emb
    )
    w = m["embeddings"]["worst"]
    assert m["embeddings"]["compared"] == len(emb) and m["embeddings"]["identical"] == 0
    assert w["differ_cases"] == len(emb) and w["max_abs"] == want_abs and w["max_ulp"] > 0
    # the records: precise distances; summary.md: one failure row each, with those distances
    recs = {(r["backend"], r["case"]): r for r in doc["records"]}
    for c in flipped:
        assert recs[("wrong", c.id)]["distances"] == {"differ": 1, "first_diff": 5}
        assert recs[("wrong", c.id)]["outcome"] == "fail"
    md = reports.summary_md(doc)
    rows = [line for line in md.splitlines() if line.startswith("| quant ") and "| wrong " in line]
    assert len(rows) == len(flipped) and all("differ 1, first_diff 5" in line for line in rows)
    failing_emb = [recs[("wrong", c.id)] for c in emb if recs[("wrong", c.id)]["outcome"] == "fail"]
    assert failing_emb and all(r["distances"]["max_abs"] >= 0.49 for r in failing_emb)
    for r in failing_emb:
        assert any(
            r["case"] in line and f"max_abs {r['distances']['max_abs']:.6g}" in line
            for line in md.splitlines()
        )
    row = next(
        line.split("|")
        for line in md.splitlines()
        if line.startswith("| reference | wrong") and "| quantizer bytes " in line
    )
    assert [c.strip() for c in row[4:7]] == [
        str(len(q8)),
        str(len(q8) - len(flipped)),
        f"{(len(q8) - len(flipped)) / len(q8):.1%}",
    ]
    assert row[7].strip() == f"differ_cases {len(flipped)}, max_differ 1"


def test_junit_xml_counts(wrong_run, tmp_path):
    _, _, doc = wrong_run
    reports.write(doc, tmp_path)
    root = ET.parse(tmp_path / "junit.xml").getroot()
    recs = doc["records"]
    assert root.tag == "testsuites" and int(root.get("tests")) == len(recs)
    assert int(root.get("failures")) == sum(r["outcome"] == "fail" for r in recs) > 0
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {f"{r['backend']}.{r['area']}" for r in recs}
    for name, s in suites.items():
        backend, area = name.split(".")
        mine = [r for r in recs if (r["backend"], r["area"]) == (backend, area)]
        tcs = s.findall("testcase")
        assert [t.get("name") for t in tcs] == sorted(r["case"] for r in mine)
        assert all(t.get("classname") == area for t in tcs)
        assert (
            int(s.get("failures"))
            == len([t for t in tcs if t.find("failure") is not None])
            == sum(r["outcome"] == "fail" for r in mine)
        )
    assert (tmp_path / "junit.xml").read_bytes() == reports.junit_xml(doc)  # deterministic


def test_junit_strict_makes_unsupported_failures():
    sel = cases.collect(["bitnet"], "i2s_pack")[:3]  # native has no i2s
    _, doc = run_doc(sel, [get("native")])
    root = ET.fromstring(reports.junit_xml(doc))
    assert root.get("skipped") == "3" and root.get("failures") == "0"
    doc["run"]["strict"] = True
    root = ET.fromstring(reports.junit_xml(doc))
    assert root.get("skipped") == "0" and root.get("failures") == "3"


def test_report_rebuilds_summary_from_results(wrong_run, tmp_path, capsys):
    _, _, doc = wrong_run
    reports.write(doc, tmp_path / "a", wall=1.25)
    assert cli.main(["report", str(tmp_path / "a" / "results.json"), "--report", str(tmp_path / "b")]) == 0
    a = (tmp_path / "a" / "summary.md").read_text(encoding="utf-8").splitlines()
    b = (tmp_path / "b" / "summary.md").read_text(encoding="utf-8").splitlines()
    assert a[-1] == "Wall time: 1.25 s." and b[-1].startswith("Wall time: not recorded")
    assert a[:-1] == b[:-1] and len(a) > 20
    assert (tmp_path / "a" / "junit.xml").read_bytes() == (tmp_path / "b" / "junit.xml").read_bytes()
    assert not (tmp_path / "b" / "results.json").exists()


def test_report_refuses_a_file_that_is_not_results(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}), encoding="utf-8")
    (tmp_path / "y.json").write_text("not json", encoding="utf-8")
    for name in ("x.json", "y.json", "missing.json"):
        assert cli.main(["report", str(tmp_path / name), "--report", str(tmp_path / "out")]) == 4
        err = capsys.readouterr().err
        assert f"{tmp_path / name}:" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_diff_finds_a_planted_regression(wrong_run, tmp_path, capsys):
    _, _, doc = wrong_run
    old = tmp_path / "old.json"
    old.write_text(reports.dumps(doc), encoding="utf-8")
    assert cli.main(["diff", str(old), str(old)]) == 0
    assert "Regressed: 0" in capsys.readouterr().out
    new = copy.deepcopy(doc)
    passing = [r for r in new["records"] if r["outcome"] == "pass"]
    failing = [r for r in new["records"] if r["outcome"] == "fail"]
    passing[0].update(outcome="fail", distances={"differ": 3, "first_diff": 7})
    gone = passing[1]
    new["records"].remove(gone)
    lost = passing[2]
    lost.update(outcome="unsupported", detail="libx.so does not export ml_quantize_q4_0")
    failing[0].update(outcome="pass")
    (tmp_path / "new.json").write_text(reports.dumps(new), encoding="utf-8")
    assert cli.main(["diff", str(old), str(tmp_path / "new.json")]) == 1
    text = capsys.readouterr().out
    assert "Regressed: 3" in text and "Fixed: 1" in text
    assert max(map(len, text.splitlines())) <= 110
    lines = text.splitlines()
    i = next(k for k, s in enumerate(lines) if passing[0]["case"] in s and passing[0]["backend"] in s)
    assert "pass -> fail" in lines[i] and "differ 3, first_diff 7" in lines[i + 2]
    assert any(gone["case"] in s and "pass -> absent" in s for s in lines)
    assert any(lost["case"] in s and "pass -> unsupported" in s for s in lines)  # a lost capability
    assert "does not export ml_quantize_q4_0" in text
    assert any(failing[0]["case"] in s and "fail -> pass" in s for s in lines)
    regressed, fixed = reports.diff(doc, new)
    assert [(r["backend"], r["case"]) for r in fixed] == [(failing[0]["backend"], failing[0]["case"])]
    assert cli.main(["diff", str(old), str(tmp_path / "new.json"), "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert len(got["regressed"]) == 3 and got["fixed"][0]["now"] == "pass"


def test_backends_json_and_run_list(capsys):
    assert cli.main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ref = next(b for b in doc["backends"] if b["name"] == "reference")
    assert "quantize_q4_0" in ref["capabilities"] and ref["unsupported"] == {}
    assert cli.main(["run", "--list", "-k", "flags_zero or format.magic"]) == 0
    ids = capsys.readouterr().out.split()
    assert "header/flags_zero" in ids and all("flags_zero" in i or "format.magic" in i for i in ids)
    assert cli.main(["run", "--list", "-k", "no-such-case"]) == 5


def test_html_is_written_when_the_renderer_exists(wrong_run, tmp_path):
    _, _, doc = wrong_run
    written = {p.name for p in reports.write(doc, tmp_path)}
    try:
        import mlconf.report_html  # noqa: F401
    except ImportError:
        assert written == {"results.json", "summary.md", "junit.xml"}
    else:
        assert written == set(reports.FILES)
        page = (tmp_path / "report.html").read_text(encoding="utf-8")
        assert page.lstrip().lower().startswith("<!doctype html")
