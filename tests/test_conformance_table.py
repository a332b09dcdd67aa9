"""conformance/conformance_table.py: a backend's conformance table from a results.json, the README
block it rewrites, and the comparison of two renderings (no llama.cpp needed: a run of the
reference and native on a few cases)."""

from __future__ import annotations

import json

import pytest

from mlconf import cli, conformance_table


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("ct")
    cli.main(
        [
            "run",
            "-b",
            "reference",
            "-b",
            "native",
            "--area",
            "quant",
            "-k",
            "q8_0 and not f16",
            "--report",
            str(out),
        ]
    )
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def test_render_counts_and_matrix(doc):
    text = conformance_table.render(doc, "native")
    n = sum(r["backend"] == "native" for r in doc["records"])
    assert text.startswith("`mlconf run -b native`: ") and f"{n} case runs" in text
    passed = sum(r["backend"] == "native" and r["outcome"] == "pass" for r in doc["records"])
    assert f"| quant | {passed} | 0 | 0 | 0 | 0 | 0 |" in text
    assert "| reference | native | quantizer bytes |" in text
    assert text.rstrip().endswith("None.")  # no failing case
    with pytest.raises(conformance_table.TableError, match="'llama.cpp' is not in these results"):
        conformance_table.render(doc, "llama.cpp")


def test_failing_cases_are_listed_with_their_detail(doc):
    bad = json.loads(json.dumps(doc))
    r = next(r for r in bad["records"] if r["backend"] == "native")
    r["outcome"], r["detail"] = "fail", "quants: 1 of 32 elements differ | first at 3" + " x" * 200
    text = conformance_table.render(bad, "native")
    row = next(line for line in text.splitlines() if r["case"] in line)
    assert row.startswith(f"| `{r['case']}` | fail | quants: 1 of 32 elements differ \\| first at 3")
    assert row.endswith("… |") and len(row) < 250


def test_update_rewrites_only_the_block(doc, tmp_path):
    md = tmp_path / "README.md"
    b, e = (m.format(name="native") for m in (conformance_table.BEGIN, conformance_table.END))
    md.write_text(f"# x\n\nbefore\n{b}\nold table\n{e}\nafter\n", encoding="utf-8")
    assert cli.main(["report", _save(doc, tmp_path), "--conformance", "native", "--update", str(md)]) == 0
    text = md.read_text(encoding="utf-8")
    i, j = conformance_table.block(text, "native")
    assert text[i:j] == conformance_table.render(doc, "native")
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{e}\nafter\n") and "old table" not in text
    md.write_text("no markers\n", encoding="utf-8")
    assert cli.main(["report", _save(doc, tmp_path), "--conformance", "native", "--update", str(md)]) == 4
    assert md.read_text(encoding="utf-8") == "no markers\n"


def _save(doc, tmp_path) -> str:
    p = tmp_path / "results.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return str(p)


def test_differences_allow_float_drift_only():
    a = "| x | 3 | nmse 0.000184 > 0.0001 |\n| y | 2 | max_abs 1.3e-2 |\n"
    assert conformance_table.differences(a, a.replace("0.000184", "0.000190"), 0.2) is None
    assert "differ by more than" in conformance_table.differences(a, a.replace("0.000184", "0.00025"), 0.2)
    assert "line 1" in conformance_table.differences(a, a.replace("| 3 |", "| 4 |"), 0.2)  # counts exact
    assert "line 2" in conformance_table.differences(a, a.replace("| y |", "| z |"), 0.2)
    assert "lines" in conformance_table.differences(a, a + "| z |\n", 0.2)


def test_a_source_path_in_a_detail_keeps_only_its_file_and_line():
    """An assertion's __FILE__ names the build's folder (pip's temporary one), which differs from
    build to build: the table keeps the file's name and line, and leaves other paths alone."""
    from mlconf.conformance_table import _cell

    text = "its stderr: /tmp/pip-x1/vendor/llama.cpp/src/llama-model.cpp:1328: GGML_ASSERT(a) failed"
    assert _cell(text) == "its stderr: llama-model.cpp:1328: GGML_ASSERT(a) failed"
    assert _cell("load_gguf('$WORK/gguf/x.gguf')") == "load_gguf('$WORK/gguf/x.gguf')"
