"""The llama.cpp backend (backends/llama_cpp): llama.cpp gated by the suite through `mlconf run`.

Runs where llama-cpp-python (extra `bench`) and gguf-py are installed; skips with the reason
elsewhere. The expressible forward cases must come out pass or fail, never error; a deliberately
wrong export (q and k rows in rotate-half order) must fail them, so a pass is not vacuous.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from mlconf import backends, cli
from mlconf.backends import registry
from mlconf.backends.cmd import CmdBackend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("gguf") is None,
    reason="llama-cpp-python and gguf-py (extra `bench`) are not installed",
)

# Expressible as a GGUF (f16 scales; llama, or qwen3 with its q/k norms), and one that is not
# (the qwen2 fixture: f32 scales)
EXPRESSIBLE = ("q4_round_f16", "q4_mask_b", "q8_f16", "linear_rope_f16", "qwen3_qk_norm_f16")
SELECT = " or ".join((*EXPRESSIBLE, "fixture/valid/qwen2/"))

# A program that exports q and k rows in HF's rotate-half order instead of the .mlb's interleaved
# pairs (the mistake a converter makes when it forgets the permutation), then serves as the real one.
HALVES = """
import sys
import numpy as np
from mlconf.tools import gguf_export, mlb
blocks, export, hd = gguf_export.ggml_blocks, gguf_export.export, [0]
def halves(fmt, q, d, where):
    b = blocks(fmt, q, d, where)
    if where.endswith(("wq", "wk")):
        n = hd[0]
        b = b.reshape(-1, n, b.shape[1])[:, np.r_[0:n:2, 1:n:2]].reshape(b.shape)
    return b
def export_halves(src, dst):
    hd[0] = mlb.read(src).derived["head_dim"]
    return export(src, dst)
gguf_export.ggml_blocks, gguf_export.export = halves, export_halves
from mlconf.backends.llama_cpp import program
sys.exit(program.main())
"""


def _run_area(
    tmp_path, area: str, select: str, backend: str = "llama.cpp", name: str = "out"
) -> dict[str, dict]:
    cli.main(["run", "-b", backend, "--area", area, "-k", select, "--report", str(tmp_path / name)])
    doc = json.loads((tmp_path / name / "results.json").read_text(encoding="utf-8"))
    return {r["case"]: r for r in doc["records"]}


def _run(tmp_path, backend: str, select: str, name: str) -> dict[str, dict]:
    return _run_area(tmp_path, "forward", select, backend, name)


def test_forward_cases_are_pass_fail_or_unsupported(tmp_path):
    """Every expressible case runs to a verdict (never an error) and the tiny llama-style models
    pass within logits_runtime_vs_reference; a model with f32 scales is unsupported, naming why."""
    got = _run(tmp_path, "llama.cpp", SELECT, "llama")
    assert len(got) >= 2 * len(EXPRESSIBLE) + 2
    for case, r in got.items():
        if "qwen2" in case:
            assert r["outcome"] == "unsupported" and "f16" in r["detail"], (case, r["detail"])
        else:
            assert r["outcome"] in ("pass", "fail"), (case, r["outcome"], r["detail"])
    for name in ("q4_round_f16", "q4_mask_b", "linear_rope_f16", "qwen3_qk_norm_f16"):
        passed = [c for c, r in got.items() if name in c and r["outcome"] == "pass"]
        assert passed, (name, {c: r["detail"] for c, r in got.items() if name in c})


def test_a_wrong_rope_layout_fails_the_forward_cases(tmp_path, monkeypatch):
    """The comparison cannot pass vacuously: the same backend with q/k rows swapped to rotate-half
    order fails the fixtures' forward cases that pass with the right export. (Not the golden
    linear_rope_f16: its few positions, divided by the scaling factor, turn the pairs too little
    for the wrong pairing to leave its tolerance.)"""
    script = tmp_path / "halves.py"
    script.write_text(HALVES, encoding="utf-8")
    monkeypatch.setitem(
        registry._FACTORIES, "llama.cpp-halves", lambda name: CmdBackend(name, [sys.executable, str(script)])
    )
    # not the whole-context cases: llama.cpp's f16 activation scales move an argmax there (README
    # "Differences from upstream"), so they fail with the right export too
    select = (
        "(" + " or ".join(("q4_round_f16", "q4_mask_b", "qwen3_qk_norm_f16")) + ") and not long_vs_reference"
    )
    right = _run(tmp_path, "llama.cpp", select, "right")
    wrong = _run(tmp_path, "llama.cpp-halves", select, "wrong")
    assert right.keys() == wrong.keys() and right
    for case in right:
        assert right[case]["outcome"] == "pass", (case, right[case]["detail"])
        assert wrong[case]["outcome"] == "fail", (case, wrong[case]["detail"])


def test_ggml_quantizers_answer_the_quant_cases(tmp_path):
    """ggml's Q8_0 and Q4_0 quantizers run the quant area's f16 cases: each a pass or a fail with
    the differing bytes named; f32 scales (which GGML cannot store) are unsupported."""
    cli.main(["run", "-b", "llama.cpp", "--area", "quant", "--report", str(tmp_path / "q")])
    doc = json.loads((tmp_path / "q" / "results.json").read_text(encoding="utf-8"))
    recs = doc["records"]
    outcomes = {r["outcome"] for r in recs}
    assert "error" not in outcomes and "crash" not in outcomes, [
        r["detail"] for r in recs if r["outcome"] in ("error", "crash")
    ]
    ran = [r for r in recs if r["outcome"] in ("pass", "fail")]
    assert ran and any(r["outcome"] == "pass" for r in ran)
    unsupported = [r["detail"] for r in recs if r["outcome"] == "unsupported"]
    assert unsupported and all("f16 scales" in d or "importance matrix" in d for d in unsupported), (
        unsupported
    )


def test_llama_cpp_dir_must_hold_the_libraries(tmp_path):
    with pytest.raises(backends.BackendError, match="libllama.so"):
        backends.get(f"llama.cpp:{tmp_path}")


def test_forward_positions_follow_the_session(tmp_path):
    """The session feeds positions in order, starts over at 0, and refuses a gap or a token out of
    range as an input error; the logits of a prefill equal the token-by-token ones within f16 KV
    rounding."""
    from mlconf import fixtures

    fixtures.generate(tmp_path, only={"valid/q4_round_f16.mlb"})
    b = backends.get("llama.cpp")
    try:
        s = b.open_model(str(tmp_path / "valid" / "q4_round_f16.mlb"), 16)
        toks = np.array([1, 5, 9, 3])
        pre = s.forward(toks, 0)
        one = np.concatenate([s.forward(toks[i : i + 1], i) for i in range(len(toks))])
        assert pre.shape == one.shape == (4, s.vocab)
        assert np.abs(pre - one).max() < 1e-2
        with pytest.raises(backends.InputError, match="next position"):
            s.forward(toks[:1], 7)
        with pytest.raises(backends.InputError, match="outside"):
            s.forward(np.array([s.vocab]), 0)
        s.close()
    finally:
        b.close()


def test_tokenizer_cases_show_where_llama_cpp_departs(tmp_path):
    """The golden tokenizers as GGUF vocabularies, tokenized by llama.cpp: GPT-2 and the
    SentencePiece Llama 2 give HF's ids on every text; the qwen2 pre-tokenizer does not
    NFC-normalize, so decomposed text fails there (the departure the README lists); what llama.cpp
    cannot express (ignore_merges on the GPT-2 regex, a first-only SentencePiece prefix) is
    unsupported, never an error."""
    got = _run_area(tmp_path, "tokenizer", "encode and (gpt2 or llama2 or qwen2 or mistral or ignore_merges)")
    by = lambda name: {c: r for c, r in got.items() if f"/encode/{name}/" in c}  # noqa: E731
    for name in ("gpt2", "llama2"):
        assert by(name) and all(r["outcome"] == "pass" for r in by(name).values()), name
    assert by("qwen2")["tokenizer/encode/qwen2/nfd_decomposed"]["outcome"] == "fail"
    for name in ("mistral", "ignore_merges"):
        assert by(name) and all(r["outcome"] == "unsupported" for r in by(name).values()), name
    assert all(r["outcome"] in ("pass", "fail", "unsupported") for r in got.values())


# The program with "last" pooling asked of llama.cpp as mean pooling: a plausible slip of a mapping
MEAN_FOR_LAST = """
import sys
from mlconf.backends.llama_cpp import program
program.POOLING["last"] = program.POOLING["mean"]
sys.exit(program.main())
"""


@pytest.mark.slow
def test_embeddings_of_the_teachers(tmp_path, monkeypatch):
    """The F16 teacher GGUFs through llama.cpp's embedding path (norms written as F32, exactly):
    every pooling, normalized or not, within the oracle's and the reference's tolerance; the I2_S
    students and the f16 student (per-projection norms) unsupported, naming why; a NaN norm is
    accepted (llama.cpp checks no weight), which fails its refusal case. With "last" pooled as mean
    the "last" cases of more than one token fail: the comparison sees the pooling."""
    got = _run_area(tmp_path, "bitnet", "embed")
    teacher = {c: r for c, r in got.items() if "teacher" in c and "/refused/" not in c}
    # 2 teachers x 3 sequences x 3 poolings x 2 (normalized or not) x 2 (oracle, reference), the 6
    # cases of the model's own pooling (ML_POOL_MODEL: pooling_type read from the GGUF) and the 6 of
    # the long sequence against the reference (F32 KV cache: program._embedding_context)
    assert len(teacher) == 84 and all(r["outcome"] == "pass" for r in teacher.values()), {
        c: r["detail"] for c, r in teacher.items() if r["outcome"] != "pass"
    }
    for c, r in got.items():
        if "/refused/" not in c and ("i2s" in c or "qwen3_f16" in c):
            assert r["outcome"] == "unsupported", (c, r["detail"])
            assert "type 36" in r["detail"] or "_norm_in" in r["detail"] or "reading" in r["detail"], r[
                "detail"
            ]
    assert got["bitnet/embed/refused/qwen3_teacher_f16/nan_norm"]["outcome"] == "fail"
    assert all(r["outcome"] in ("pass", "fail", "unsupported") for r in got.values())

    script = tmp_path / "mean_for_last.py"
    script.write_text(MEAN_FOR_LAST, encoding="utf-8")
    monkeypatch.setitem(
        registry._FACTORIES, "llama.cpp-mean", lambda name: CmdBackend(name, [sys.executable, str(script)])
    )
    wrong = _run_area(tmp_path, "bitnet", "embed and teacher and last", "llama.cpp-mean", "wrong")
    longer = {
        c: r for c, r in wrong.items() if "/refused/" not in c and "/0/" not in c
    }  # set 0: one token; 16 + the 2 long_150 ones
    assert len(longer) == 18 and all(r["outcome"] == "fail" for r in longer.values()), {
        c: r["outcome"] for c, r in longer.items()
    }


@pytest.mark.slow
def test_readme_conformance_table_is_the_run(tmp_path):
    """The README's "Conformance of llama.cpp" block is `mlconf report --conformance llama.cpp` of a
    run of llama.cpp beside native and the reference, regenerated here. Counts, case ids and bit-exact
    details must be the same characters; floats (toleranced distances) within 20 %: every verdict
    of the run keeps at least 25 % between its distance and its threshold (AMD EPYC: the closest
    pass is at 0.75 of its nmse bound, the closest fail at 1.84 times it), so no host flips one."""
    from pathlib import Path

    from mlconf import conformance_table

    cli.main(["run", "-b", "llama.cpp", "-b", "native", "-b", "reference", "--report", str(tmp_path / "r")])
    doc = json.loads((tmp_path / "r" / "results.json").read_text(encoding="utf-8"))
    got = conformance_table.render(doc, "llama.cpp")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    i, j = conformance_table.block(readme, "llama.cpp")
    why = conformance_table.differences(readme[i:j], got, rtol=0.2)
    assert why is None, (
        f"README.md's llama.cpp table is not this run's ({why}); rewrite it with mlconf "
        "report RESULTS.json --conformance llama.cpp --update README.md"
    )


@pytest.mark.slow
def test_expectations_file_certifies_the_current_list(tmp_path, capsys):
    """backends/llama_cpp/expectations.yaml is in step with llama.cpp on the current must-pass list:
    the certification .ci/run makes is conformant (no unexpected pass or outcome, no unused entry),
    and its package verifies. A case that starts to pass (or to fail otherwise) fails here first."""
    from pathlib import Path

    expect = Path(__file__).resolve().parents[1] / "backends" / "llama_cpp" / "expectations.yaml"
    pkg = tmp_path / "llama.cpp.tar.gz"
    argv = ["certify", "-b", "llama.cpp", "--version", "current", "--expect", str(expect), "-j", "2"]
    rc = cli.main([*argv, "-o", str(pkg)])
    out = capsys.readouterr()
    assert rc == 0, out.out[-3000:] + out.err[-2000:]
    assert cli.main(["verify", str(pkg)]) == 0, capsys.readouterr().err


def test_a_hostile_gguf_is_refused_before_gguf_py_reads_it(generated):
    """The embedding path rewrites the user's GGUF with gguf-py (stock_gguf): a file that breaks a
    container rule (here 10,000 levels of nested arrays, gguf-py's RecursionError) is refused with
    its rule, not an internal error of the program."""
    out, _ = generated
    b = backends.get("llama.cpp")
    try:
        with pytest.raises(backends.InputError, match=r"gguf\.nesting"):
            b.open_embedder(str(out / "gguf/malformed/gguf.nesting/depth_10000.gguf"))
    finally:
        b.close()
