"""report.html (conformance/report_html.py): self-contained, escaped, deterministic, and it opens in
headless Chromium without a JavaScript error, with the matrix, the bit-exactness tables and the
error plot in the DOM the script leaves behind."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from mlconf import report_html

BACKENDS = ("reference", "native", "bitnet")


def _record(case: str, spec: str, backend: str, outcome: str, **kw) -> dict:
    rec = {
        "case": case,
        "area": case.split("/")[0],
        "spec": spec,
        "backend": backend,
        "outcome": outcome,
        "compare": "status",
        "output_kind": "statuses",
        "expected": "OK",
        "got": "OK",
        "detail": "",
        "distances": {},
        "tolerance": None,
        "output_sha256": None,
    }
    rec.update(kw)
    return rec


def example(n_cases: int = 12, failures: bool = True, unsafe: str = "") -> dict:
    """A results dict of the documented shape: statuses, quantizer bytes, ids, logits and
    embeddings on three backends, with a pass, unsupported, and (optionally) failing records."""
    records = []
    for i in range(n_cases):
        for b in BACKENDS:
            # header: everyone loads; quant: bitnet lacks the capability; forward: toleranced
            records.append(
                _record(
                    f"header/f{i % 5}/{i}",
                    f"mlb_header.yaml#field{i % 5}",
                    b,
                    "pass",
                    detail=f"status OK {unsafe}",
                )
            )
            q_out = "unsupported" if b == "bitnet" else "pass"
            records.append(
                _record(
                    f"quant/q8_0/c{i}",
                    f"quant.yaml#q8_{i % 3}",
                    b,
                    q_out,
                    compare="bit-exact",
                    output_kind="quantizer bytes",
                    expected="34 bytes",
                    got="34 bytes" if q_out == "pass" else None,
                    distances={"differ": 0, "first_diff": None} if q_out == "pass" else None,
                    detail="" if q_out == "pass" else "backend has no quantize capability",
                )
            )
            records.append(
                _record(
                    f"tokenizer/bpe/t{i}",
                    f"tokenizer_texts.yaml#t{i % 4}",
                    b,
                    "pass",
                    compare="ids",
                    output_kind="ids",
                    expected=[1, 2, 3],
                    got=[1, 2, 3],
                    distances={"first_diff": None, "len_expected": 3, "len_got": 3},
                )
            )
            if b != "reference":
                nmse = 0.0 if i % 4 == 0 else 10.0 ** (-14 + i % 9)
                records.append(
                    _record(
                        f"forward/m{i}/vs_reference",
                        "forward.yaml#models",
                        b,
                        "pass",
                        compare="toleranced",
                        output_kind="logits",
                        expected="float32[4, 64]",
                        got="within",
                        tolerance="logits_runtime_vs_reference",
                        distances={"differ": 3, "max_abs": 1e-6, "max_ulp": 12, "nmse": nmse, "argmax": 1.0},
                    )
                )
            records.append(
                _record(
                    f"bitnet/embed/e{i}",
                    "i2s.yaml#embed",
                    b,
                    "pass" if b == "bitnet" else "unsupported",
                    compare="toleranced",
                    output_kind="embeddings",
                    expected="float32[128]",
                    got="within" if b == "bitnet" else None,
                    tolerance="embeddings_vs_oracle",
                    distances={"nmse": 7e-15, "max_abs": 3.6e-7, "cosine": 1.0} if b == "bitnet" else {},
                )
            )
    if failures:
        records.append(
            _record(
                "loader/bad_magic",
                "mlb_errors.yaml#FORMAT.magic",
                "native",
                "error",
                detail="RuntimeError: worker said no",
            )
        )
        records.append(
            _record(
                "loader/trunc",
                "mlb_errors.yaml#FORMAT.truncated",
                "native",
                "crash",
                detail="worker killed by SIGSEGV during load('x.mlb')",
            )
        )
        records.append(
            _record(
                "forward/m99/vs_reference",
                "forward.yaml#models",
                "native",
                "fail",
                compare="toleranced",
                output_kind="logits",
                expected="float32[4, 64]",
                got="outside",
                tolerance="logits_runtime_vs_reference",
                detail="nmse 3.1e-2 > 1e-4; argmax 0.5 < 1",
                distances={
                    "differ": 250,
                    "max_abs": 0.7,
                    "max_ulp": 9_000_000,
                    "nmse": 3.1e-2,
                    "argmax": 0.5,
                },
            )
        )
        records.append(
            _record(
                "loader/hang",
                "mlb_errors.yaml#FORMAT.truncated",
                "native",
                "timeout",
                detail="load took longer than 10 s",
            )
        )
        records.append(
            _record(
                "forward/m98/vs_reference",
                "forward.yaml#models",
                "bitnet",
                "fail",
                compare="toleranced",
                output_kind="logits",
                tolerance="logits_runtime_vs_reference",
                detail="nan in logits",
                distances={"nmse": "NaN", "max_abs": "Infinity"},
            )
        )
    counts = Counter((r["backend"], r["area"], r["outcome"]) for r in records)
    summary = []
    for b in BACKENDS:
        for area in ("header", "quant", "tokenizer", "forward", "bitnet", "loader"):
            row = {o: counts[(b, area, o)] for o in report_html.OUTCOMES}
            summary.append({"backend": b, "area": area, **row, "total": sum(row.values())})
    return {
        "schema": "mlconf-results/1",
        "mlconf_version": "0.1.0",
        "run": {
            "backends": [
                {
                    "name": "reference",
                    "description": "NumPy reference " + unsafe,
                    "capabilities": ["load", "forward", "quantize_q8_0"],
                },
                {"name": "native", "description": "C runtime (avx2)", "capabilities": ["load", "forward"]},
                {"name": "bitnet", "description": "I2_S path", "capabilities": ["embed", "load"]},
            ],
            "areas": ["header", "loader", "quant", "tokenizer", "forward", "bitnet"],
            "k": None,
            "strict": False,
            "jobs": 1,
        },
        "records": records,
        "matrix": [
            {
                "a": "native",
                "b": "reference",
                "kind": "logits",
                "compared": 26,
                "identical": 20,
                "share": 20 / 26,
                "worst": {"max_ulp": 12, "max_abs": 1e-6, "nmse": 1e-14},
            },
            {
                "a": "native",
                "b": "reference",
                "kind": "quantizer bytes",
                "compared": 53,
                "identical": 53,
                "share": 1.0,
                "worst": {},
            },
            {
                "a": "bitnet",
                "b": "reference",
                "kind": "embeddings",
                "compared": 0,
                "identical": 0,
                "share": None,
                "worst": None,
            },
        ],
        "summary": summary,
    }


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert m, "no embedded data block"
    return json.loads(m.group(1))


def _column(data: dict, key: str) -> list:
    """A column of the embedded records, decoded as the page's script does."""
    c = data["cols"][key]
    return c if isinstance(c, list) else [c["v"][i] for i in c["i"]]


# ---- without a browser ---------------------------------------------------------------------------


def test_no_network_references():
    page = report_html.render(example())
    for needle in ("http://", "https://", "//cdn", "@import", "url("):
        assert needle not in page, needle
    assert not re.search(r"\bsrc\s*=", page), "an element loads something by URL"
    assert not re.search(r"<link\b", page)
    # and the page forbids any fetch itself
    assert "default-src 'none'" in page


def test_deterministic():
    a = report_html.render(example())
    b = report_html.render(json.loads(json.dumps(example())))
    assert a == b
    assert not re.search(r"20\d\d-\d\d-\d\d", a), "no dates or timestamps"


def test_escaping_keeps_injected_markup_inert():
    evil = "</script><b>bold</b><img src=x onerror=alert(1)>&amp;"
    res = example(unsafe=evil)
    res["records"][0]["case"] = "header/" + evil
    res["records"][0]["spec"] = "mlb_header.yaml#" + evil
    page = report_html.render(res)
    assert "<b>bold</b>" not in page
    assert "<img" not in page
    # exactly the two script blocks of the page: the data and the code
    assert page.count("</script>") == 2
    assert "&lt;b&gt;bold&lt;/b&gt;" in page  # in the matrix row and the backends table, escaped
    data = _data(page)
    assert _column(data, "case")[0] == "header/" + evil  # the JSON still round-trips the text


def test_cell_colours():
    c = report_html.cell_class
    assert c(Counter()) == "none"
    assert c(Counter({"pass": 3})) == "ok"
    assert c(Counter({"unsupported": 2})) == "unsup"
    assert c(Counter({"pass": 2, "unsupported": 1})) == "mixed"
    for bad in ("fail", "error", "crash", "timeout", "something-new"):
        assert c(Counter({"pass": 5, "unsupported": 1, bad: 1})) == "bad", bad
    page = report_html.render(example())
    # quant on bitnet is unsupported only; header passes everywhere; the loader row failed on native
    row = re.search(r"<tr><th class=feat><span class=file>quant.yaml#</span>q8_0</th>(.*?)</tr>", page)
    assert row, "no quant.yaml#q8_0 row"
    assert re.findall(r'<td class="(\w+)"', row.group(1)) == ["ok", "ok", "unsup"]
    row = re.search(
        r"<tr><th class=feat><span class=file>mlb_errors.yaml#</span>FORMAT.truncated</th>"
        r"(.*?)</tr>",
        page,
    )
    assert re.findall(r'<td class="?(\w+)"?', row.group(1)) == ["none", "bad", "none"]
    row = re.search(r"<tr><th class=feat><span class=file>i2s.yaml#</span>embed</th>(.*?)</tr>", page)
    assert re.findall(r'<td class="(\w+)"', row.group(1)) == ["unsup", "unsup", "ok"]


def test_mixed_cell_and_counts():
    res = example(failures=False)
    res["records"].append(
        _record(
            "quant/q8_0/extra",
            "quant.yaml#q8_0",
            "bitnet",
            "pass",
            compare="bit-exact",
            output_kind="quantizer bytes",
        )
    )
    page = report_html.render(res)
    row = re.search(r"<tr><th class=feat><span class=file>quant.yaml#</span>q8_0</th>(.*?)</tr>", page)
    cells = re.findall(r'<td class="(\w+)" title="([^"]*)"><a href="#c\d+\.\d+">([^<]*)</a>', row.group(1))
    assert cells[2] == ("mixed", "1 pass, 4 unsupported", "1\u2713 4\u2013")


def test_failures_listed_first_most_useful_first():
    page = report_html.render(example())
    assert page.index('id="failures"') < page.index('id="matrix"')
    fails = re.search(r'<section id="failures">(.*?)</section>', page, re.S).group(1)
    outcomes = re.findall(r'<span class="badge o-(\w+)">', fails)
    assert outcomes == ["fail", "fail", "crash", "timeout", "error"]
    # each links to its record's detail
    data = _data(page)
    cases = _column(data, "case")
    for idx, case in re.findall(r'<a href="#r(\d+)">.*?<code>([^<]*)</code>', fails):
        assert cases[int(idx)] == case
    assert "nmse 0.031" in fails  # the distances are in the list
    assert 'id="failures"' not in report_html.render(example(failures=False))


def test_sections_and_plot():
    res = example()
    page = report_html.render(res)
    for section in ('id="matrix"', 'id="bitexact"', 'id="errors"'):
        assert section in page
    bx = re.search(r'<section id="bitexact">(.*?)</section>', page, re.S).group(1)
    assert "<h3>logits <small>(toleranced)</small></h3>" in bx and "<h3>quantizer bytes</h3>" in bx
    assert "No case of embeddings ran on two backends" in bx  # compared 0: no table
    assert "hsl(120,65%,78%)" in bx  # 100 % of a bit-exact kind: green
    assert "hsl(210,70%," in bx  # a toleranced kind: the blue scale, whatever its share
    assert "77%<small>20/26</small>" in bx and "100%<small>53/53</small>" in bx
    assert "worst otherwise: max_ulp 12, max_abs 1e-06, nmse 1e-14" in bx
    errors = re.search(r'<section id="errors">(.*?)</section>', page, re.S).group(1)
    svgs = re.findall(r"<svg.*?</svg>", errors, re.S)
    assert len(svgs) == 2  # logits, embeddings
    logits = svgs[0]
    n_logit_records = sum(1 for r in res["records"] if r["output_kind"] == "logits")
    assert logits.count("<circle") == n_logit_records
    assert "logits_runtime_vs_reference \u2264 0.0001" in logits  # the threshold line, from the spec
    assert "inf/nan" in logits and ">identical<" in logits


def test_robust_to_missing_optional_keys():
    minimal = {"records": [{"case": "a/b", "backend": "x", "outcome": "pass"}]}
    page = report_html.render(minimal)
    assert 'id="matrix"' in page and 'id="bitexact"' in page and 'id="errors"' in page
    empty = report_html.render({})
    assert 'id="matrix"' in empty and "No cross-backend comparison" in empty


def test_odd_values_do_not_break_the_page():
    nan = float("nan")
    recs = [
        _record(
            "forward/x/nan",
            "forward.yaml#x",
            "native",
            "fail",
            compare="toleranced",
            output_kind="logits",
            distances={"nmse": nan, "max_abs": float("inf")},
            tolerance="no-such",
        ),
        _record(
            "quant/big",
            None,
            "native",
            "weird-new-outcome",
            expected=list(range(5000)),
            got=b"\x00\xff",
            distances=["not", "a", "dict"],
        ),
    ]
    page = report_html.render(
        {"records": recs, "matrix": [{"a": "native", "b": "x", "kind": "ids", "compared": 3, "identical": 1}]}
    )
    data = _data(page)
    assert _column(data, "distances")[0] == {"nmse": "nan", "max_abs": "inf"}
    assert _column(data, "got")[1] == "00ff"
    assert _column(data, "expected")[1].endswith("characters, see results.json)")
    assert "weird-new-outcome" in re.search(r'<section id="failures">(.*?)</section>', page, re.S).group(1)
    assert "33%<small>1/3</small>" in page


def test_size_of_a_3000_record_page():
    res = example(n_cases=215)
    assert len(res["records"]) > 2900
    page = report_html.render(res)
    assert len(page.encode()) < 2_000_000


# ---- in headless Chromium ------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run installs it)"
)


def _dump_dom(path: Path, profile: Path) -> tuple[str, list[str]]:
    """The DOM after the page's script ran, and the console lines Chromium logged."""
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=2000",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Console messages, uncaught exceptions and CSP refusals all appear as ":CONSOLE" lines;
    # the page logs nothing on its own, so any such line is an error.
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return proc.stdout, console


def _check_dom(dom: str, res: dict) -> None:
    assert re.search(r'<body[^>]*data-ready="1"', dom), "the page's script did not finish"
    matrix = re.search(r'<table id="matrix".*?</table>', dom, re.S)
    assert matrix, "no matrix table in the DOM"
    features = {r["spec"] for r in res["records"]}
    backends = {r["backend"] for r in res["records"]}
    rows = re.findall(r'<tr><th class="feat">.*?</tr>', matrix.group(0), re.S)
    assert len(rows) == len(features)
    for row in rows:
        assert len(re.findall(r"<td\b", row)) == len(backends)
    pairs = {(r["spec"], r["backend"]) for r in res["records"]}
    assert len(re.findall(r'<a href="#c\d+\.\d+">', matrix.group(0))) == len(pairs)
    assert 'id="bitexact"' in dom and 'id="errors"' in dom


@needs_chromium
def test_chromium_renders_without_errors(tmp_path):
    res = example()
    page = tmp_path / "report.html"
    page.write_text(report_html.render(res), encoding="utf-8")
    dom, console = _dump_dom(page, tmp_path / "profile")
    assert console == []
    _check_dom(dom, res)


@needs_chromium
def test_chromium_detail_view(tmp_path):
    """Opening the page at a record's anchor builds its detail panel from the embedded JSON."""
    res = example(unsafe="</script><b>x</b>")
    page = tmp_path / "report.html"
    html = report_html.render(res)
    i = next(i for i, r in enumerate(res["records"]) if r["outcome"] == "fail")
    # --dump-dom takes no fragment; a copy of the page that sets it first stands in for a click
    page.write_text(html.replace("<script>", f'<script>location.hash="#r{i}";', 1), encoding="utf-8")
    dom, console = _dump_dom(page, tmp_path / "profile")
    assert console == []
    panel = re.search(r'<aside id="detail"(.*?)</aside>', dom, re.S)
    assert panel and "hidden" not in panel.group(0)[:40]
    text = panel.group(1)
    assert "forward/m99/vs_reference" in text and "logits_runtime_vs_reference" in text
    assert "<th>threshold</th>" in text and "0.031" in text and 'class="over"' in text
    # the cell of a (feature, backend) lists its cases, escaped text included
    j = next(i for i, r in enumerate(res["records"]) if r["backend"] == "reference")
    f, b = _column(_data(html), "f")[j], _column(_data(html), "b")[j]
    page.write_text(html.replace("<script>", f'<script>location.hash="#c{f}.{b}";', 1), encoding="utf-8")
    dom, console = _dump_dom(page, tmp_path / "profile")
    assert console == []
    text = re.search(r'<aside id="detail"(.*?)</aside>', dom, re.S).group(1)
    assert res["records"][j]["case"] in text
    assert "<b>x</b>" not in dom and "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in text


@needs_chromium
def test_chromium_console_check_catches_a_script_error(tmp_path):
    """The check above is not vacuous: a page whose script throws is caught."""
    page = tmp_path / "report.html"
    html = report_html.render(example())
    page.write_text(html.replace("<script>", "<script>undefinedFunctionOfThisTest();", 1), encoding="utf-8")
    dom, console = _dump_dom(page, tmp_path / "profile")
    assert any("Uncaught ReferenceError" in line for line in console), console
    assert 'data-ready="1"' not in dom


def _real_report(tmp_path: Path) -> tuple[Path, dict]:
    """report.html and results.json of a real `mlconf run` (two quick areas, built-in backends)."""
    reports = pytest.importorskip("mlconf.reports")
    from mlconf import cli

    out = tmp_path / "reports"
    cli.main(["run", "--area", "quant", "--area", "forward", "--report", str(out)])
    assert (out / "report.html").exists(), "mlconf run wrote no report.html"
    return out / "report.html", reports.load(out / "results.json")


def test_real_run_report_is_self_contained(tmp_path):
    html, res = _real_report(tmp_path)
    page = html.read_text(encoding="utf-8")
    assert page == report_html.render(res)  # `mlconf report` rebuilds the same page
    assert "http://" not in page and "https://" not in page and not re.search(r"\bsrc\s*=", page)


@needs_chromium
def test_chromium_renders_a_real_run(tmp_path):
    html, res = _real_report(tmp_path)
    dom, console = _dump_dom(html, tmp_path / "profile")
    assert console == []
    _check_dom(dom, res)


@needs_chromium
def test_chromium_console_check_catches_a_fetch(tmp_path):
    """A resource by URL slipped into the page is refused by its Content-Security-Policy, and the
    refusal is a console line the checks above fail on."""
    page = tmp_path / "report.html"
    html = report_html.render(example())
    page.write_text(
        html.replace("<body>", '<body><img src="http://example.invalid/x.png">', 1), encoding="utf-8"
    )
    _, console = _dump_dom(page, tmp_path / "profile")
    assert any("Content Security Policy" in line and "example.invalid" in line for line in console), console


@needs_chromium
def test_chromium_folding_and_bitexact_click(tmp_path):
    page = tmp_path / "report.html"
    html = report_html.render(example())
    clicks = (
        '<script>document.getElementById("fold-all").click();'
        'document.querySelector("#bitexact td.share").click();</script></body>'
    )
    page.write_text(html.replace("</body>", clicks, 1), encoding="utf-8")
    dom, console = _dump_dom(page, tmp_path / "profile")
    assert console == []
    bodies = re.findall(r'<tbody class="([^"]*)" data-area=', dom)
    assert bodies and all("collapsed" in b for b in bodies)
    assert re.search(r'<p class="worst" id="worst-out">reference vs native, logits: 20 of 26', dom)
