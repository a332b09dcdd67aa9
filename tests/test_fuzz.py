"""`mlconf fuzz` (conformance/fuzz.py): seeded mutants in the fixtures' own mutation vocabulary,
the same sequence for the same seed; native agrees with the reference on every mutant; a broken
runtime (examples/crash: a loader that checks the magic only) is caught, each failure shrunk to
the fewest mutations, written as a reproducer and reported as records; a cmd: runtime with one
wrong loader rule, or one wrong RoPE variant (tests/data/cmd_one_mistake.py), is found through the
line protocol, and only that mistake."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlconf import cli, fuzz, reports
from mlconf.backends import LoadResult, get
from mlconf.backends.reference import ReferenceBackend
from mlconf.tools import exits

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_seed_fixes_the_mutants():
    for area in ("loader", "tokenizer", "gguf"):
        a, b = fuzz.mutants(area, 7), fuzz.mutants(area, 7)
        first = [a() for _ in range(50)]
        assert [(x.name, ops) for x, ops in first] == [(x.name, ops) for x, ops in (b() for _ in range(50))]
        assert first != [fuzz.mutants(area, 8)() for _ in range(50)]
        kinds = {next(iter(op)) for _, ops in first for op in ops}
        assert kinds <= {"raw", "truncate_to", "append"}  # the fixtures' own mutations


def assert_clean(name: str, area: str, seed: int, count: int) -> None:
    """A campaign on backend ``name`` in which every input gives the reference's answer."""
    b = get(name)
    try:
        c = fuzz.run(b, area, seed=seed, count=count)
    finally:
        b.close()
    assert c.mutants == c.agreed == count, [(r.spec, r.detail) for r in c.failures[:3]]


@pytest.mark.parametrize("area", ["loader", "tokenizer"])
def test_native_agrees_with_the_reference(area):
    assert_clean("native", area, seed=11, count=400)


def test_bitnet_agrees_with_the_reference_on_gguf():
    assert_clean("bitnet", "gguf", seed=11, count=1500)


class NoLayoutCheck(ReferenceBackend):
    """A GGUF reader that forgets ggml's layout rule: overlapping or misplaced tensors load."""

    name = "reference-no-layout"

    def load_gguf(self, path):
        r = super().load_gguf(path)
        return LoadResult("ML_OK", f"{path}: accepted", "") if r.rule == "gguf.tensor.layout" else r


def test_a_gguf_reader_without_the_layout_rule_is_found_with_its_rule():
    c = fuzz.run(NoLayoutCheck(), "gguf", seed=5, count=1500)
    assert c.failures and c.agreed + len(c.failures) == c.mutants
    ref = ReferenceBackend()
    for r in c.reproducers:
        assert r["expected"] == "ML_E_FORMAT" and r["got"] == "ML_OK" and "gguf.tensor.layout" in r["detail"]
        bases = {b.name: b for b in fuzz.bases("gguf")}
        data = fuzz.apply(bases[r["base"]].data, r["mutate"])
        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(data)
            f.flush()
            assert ref.load_gguf(f.name).rule == "gguf.tensor.layout"


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build examples/crash")
    so = tmp_path_factory.mktemp("broken") / "crash.so"
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-shared",
            "-fPIC",
            "-I",
            str(ROOT / "backends/native/include"),
            str(ROOT / "examples/crash/crash.c"),
            "-o",
            str(so),
        ],
        check=True,
    )
    return so


def test_a_broken_loader_is_found_shrunk_and_reported(broken, tmp_path, capsys):
    corpus, report = tmp_path / "corpus", tmp_path / "report"
    rc = cli.main(
        [
            "fuzz",
            "-b",
            f"lib:{broken}",
            "--area",
            "loader",
            "--count",
            "150",
            "--seed",
            "3",
            "--corpus",
            str(corpus),
            "--report",
            str(report),
        ]
    )
    assert rc == exits.FAILED
    doc = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))
    found = doc["reproducers"]
    assert len(found) > 20 and all(1 <= len(r["mutate"]) <= 3 for r in found)
    assert sum(len(r["mutate"]) == 1 for r in found) > len(found) // 2  # shrunk
    bases = {b.name: b for b in fuzz.bases("loader")}
    ref = ReferenceBackend()
    for r in found:  # each reproducer is its file, and the reference says what the manifest says
        data = (corpus / r["file"]).read_bytes()
        assert fuzz.apply(bases[r["base"]].data, r["mutate"]) == data
        assert ref.load(str(corpus / r["file"])).status == r["expected"] != r["got"]
    results = reports.load(report / "results.json")
    failing = [x for x in results["records"] if x["outcome"] == "fail"]
    assert len(failing) == len(found) + 1  # each reproducer, and the campaign's record
    regressed, fixed = reports.diff(results, results)
    assert regressed == [] and fixed == []
    assert "failing" in capsys.readouterr().out


ONE_MISTAKE = ROOT / "tests" / "data" / "cmd_one_mistake.py"


def one_mistake(*mistake: str):
    return get("cmd:" + shlex.join([sys.executable, str(ONE_MISTAKE), *mistake]))


def test_one_wrong_rule_of_a_cmd_runtime_is_found_and_nothing_else(tmp_path):
    """A cmd: runtime that is the reference but for one loader rule: every failure the campaign
    reports is a file that rule refuses, shrunk to one mutation."""
    rule = "format.rope_attn_factor_without_yarn"
    b = one_mistake("rule", rule)
    try:
        c = fuzz.run(b, "loader", seed=3, count=300, corpus=tmp_path)
    finally:
        b.close()
    assert c.failures and c.mutants - c.agreed == len(c.reproducers) == len(c.failures)
    ref = ReferenceBackend()
    for e in c.reproducers:
        got = ref.load(str(tmp_path / e["file"]))
        assert got.rule == rule and e["got"] == "ML_OK" and len(e["mutate"]) == 1, (e, got)


def test_one_wrong_rope_variant_of_a_cmd_runtime_is_found_and_shrunk(tmp_path):
    b = one_mistake("yarn")
    try:
        c = fuzz.run(b, "forward", seed=2, count=40, corpus=tmp_path)
    finally:
        b.close()
    assert c.failures and len(c.reproducers) == c.mutants - c.agreed
    for r in c.reproducers:
        h = r["header"]
        assert h["rope_type"] == 3 and h["rope_attn_factor"] != 1.0 and h["n_layers"] == 1, h


def test_fuzz_usage(tmp_path, capsys):
    assert cli.main(["fuzz", "-b", "bitnet", "--area", "loader", "--report", str(tmp_path)]) == exits.USAGE
    assert "no load capability" in capsys.readouterr().err
    both = ["fuzz", "-b", "native", "--count", "5", "--time", "1", "--report", str(tmp_path)]
    assert cli.main(both) == exits.USAGE


def test_jobs_give_the_serial_campaign(broken):
    """-j 2: the same mutants, failures and reproducers as one process (mutant i is the same)."""
    b = get(f"lib:{broken}")
    try:
        serial = fuzz.run(b, "loader", seed=5, count=60)
        par = fuzz.run_parallel(b, "loader", seed=5, count=60, seconds=None, corpus=None, jobs=2)
    finally:
        b.close()
    assert (par.mutants, par.agreed) == (serial.mutants, serial.agreed) == (60, serial.agreed)
    assert par.reproducers == serial.reproducers and serial.reproducers
    assert [r.case for r in par.failures] == [r.case for r in serial.failures]


class WrongYarn(ReferenceBackend):
    """A runtime with one wrong RoPE variant: yarn's attn_factor ignored."""

    name = "wrong-yarn"

    def open_model(self, path, ctx=None):
        from mlconf.backends.reference.forward import Forward
        from mlconf.tools import mlb

        m = mlb.read(path)
        if m.header["rope_type"] == 3:
            m.header["rope_attn_factor"] = 1.0
        return Forward(m, ctx=ctx)


def test_forward_fuzz(tmp_path):
    """Random valid models: native matches the reference; a wrong yarn is found and shrunk to a
    model that keeps yarn and drops what does not matter."""
    assert_clean("native", "forward", seed=2, count=60)
    bad = fuzz.run(WrongYarn(), "forward", seed=2, count=60, corpus=tmp_path)
    assert bad.failures and len(bad.failures) == len(bad.reproducers) == bad.mutants - bad.agreed
    for r in bad.reproducers:
        h = r["header"]
        assert h["rope_type"] == 3 and h["rope_attn_factor"] != 1.0 and h["n_layers"] == 1, h
        assert not (h["qkv_bias"] or h["qk_norm"] or h["attn_softcap"] or h["sliding_window"]), h
        assert ReferenceBackend().load(str(tmp_path / r["file"])).ok


class OffByOneUlp(ReferenceBackend):
    """A runtime whose I2_S activation scale is one float32 ulp off."""

    name = "off-by-one-ulp"

    def i2s_quantize_act(self, x):
        import numpy as np

        q, scale, total = super().i2s_quantize_act(x)
        return q, np.nextafter(scale, np.float32(np.inf)).astype(np.float32), total


def test_i2s_fuzz():
    assert_clean("bitnet", "i2s", seed=4, count=300)
    bad = fuzz.run(OffByOneUlp(), "i2s", seed=4, count=60)
    assert bad.failures and all(r["op"] == "act" for r in bad.reproducers)
    assert any("scale" in r.detail for r in bad.failures)
