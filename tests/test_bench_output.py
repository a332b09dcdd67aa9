"""`mlconf bench --json`: the host, every row, and per figure its spread over the repeats; the
figure itself is the median run (bench_output.Timing)."""

from __future__ import annotations

import json

import pytest

from mlconf import bench_output, cli
from mlconf.bench_output import Timing
from mlconf.tools import exits


def test_timing_spread_is_over_the_runs():
    t = Timing((2.0, 1.0, 4.0))
    assert t.median == 2.0
    assert t.spread(4.0) == {"min": 1.0, "median": 2.0, "max": 4.0, "runs": 3}
    assert bench_output.timed(lambda: None, 3).runs.__len__() == 3


def test_json_is_strict_json():
    doc = bench_output.document("t", [bench_output.section("s", [{"x": float("nan"), "y": float("inf")}])])
    back = json.loads(bench_output.dumps(doc))
    assert back["sections"][0]["rows"] == [{"x": None, "y": None}]
    assert back["schema"] == bench_output.SCHEMA
    assert set(back["host"]) == {"machine", "cpu", "isa_flags", "cores", "last_level_cache"}


def test_bench_quant_json(capsys):
    assert cli.main(["bench", "quant", "--rows", "64", "--cols", "64", "--repeat", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["host"]["cores"] >= 1 and doc["title"] == "mlconf bench quant"
    (sec,) = doc["sections"]
    assert len(sec["rows"]) == 5
    for r in sec["rows"]:
        s = r["spread"]["MB/s"]
        assert s["runs"] == 3 and s["min"] <= s["median"] <= s["max"]
        assert s["median"] == pytest.approx(r["MB/s"])  # the figure is the median run


def test_bench_forward_text_and_json(capsys):
    from mlconf.golden import GOLDEN_DIR

    model = str(GOLDEN_DIR / "logits" / "llama.mlb")
    assert cli.main(["bench", "forward", "--model", model, "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Machine: ") and "decode_tok_s" in out and "(2 runs)" in out
    assert cli.main(["bench", "forward", "--model", model, "--repeat", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sections"][0]["rows"]
    assert {r["mode"] for r in rows} == {"runtime", "float"}
    assert all(r["spread"]["decode_tok_s"]["runs"] == 2 for r in rows)


def test_bench_repeat_must_be_positive(capsys):
    assert cli.main(["bench", "quant", "--repeat", "0"]) == exits.USAGE
    assert "--repeat: 0 is not in 1..1000" in capsys.readouterr().err


def test_compare_sets_each_figure_beside_the_earlier_run(tmp_path, capsys):
    args = ["bench", "quant", "--rows", "64", "--cols", "64", "--repeat", "5", "--json"]
    assert cli.main(args) == 0
    before = tmp_path / "before.json"
    before.write_text(capsys.readouterr().out, encoding="utf-8")
    old = json.loads(before.read_text(encoding="utf-8"))
    old["sections"][0]["rows"][0]["MB/s"] /= 2  # as if that quantizer had been twice slower
    before.write_text(json.dumps(old), encoding="utf-8")
    assert cli.main([*args, "--compare", str(before)]) == 0
    doc = json.loads(capsys.readouterr().out)
    now, vs = doc["sections"]
    assert vs["title"] == f"Reference quantizers: this run against {before}"
    assert [r["op"] for r in vs["rows"]] == [r["op"] for r in now["rows"]]
    first = vs["rows"][0]
    assert first["MB/s_before"] == old["sections"][0]["rows"][0]["MB/s"]
    assert first["MB/s_ratio"] == pytest.approx(first["MB/s"] / first["MB/s_before"])
    assert "spread" not in first


@pytest.mark.parametrize("content,why", [("{}", "not the JSON of `mlconf bench --json`"), ("x", "not JSON")])
def test_compare_refuses_what_is_no_bench_json(tmp_path, capsys, content, why):
    f = tmp_path / "f.json"
    f.write_text(content, encoding="utf-8")
    assert cli.main(["bench", "quant", "--rows", "64", "--cols", "64", "--compare", str(f)]) == exits.USAGE
    assert why in capsys.readouterr().err
    assert cli.main(["bench", "quant", "--compare", str(tmp_path / "none.json")]) == exits.USAGE


@pytest.mark.parametrize(
    "sysfs,want",
    [("32768K", 32 << 20), ("260M", 260 << 20), ("1G", 1 << 30), ("512", 512), ("weird", None), (None, None)],
)
def test_last_cache_bytes_reads_sysfs_units(monkeypatch, sysfs, want):
    monkeypatch.setattr(bench_output, "_l3", lambda: sysfs)
    assert bench_output.last_cache_bytes() == want


def test_bandwidths_are_sized_from_the_last_level_cache(monkeypatch):
    from mlconf import bench
    from mlconf.backends.native import native_available

    if not native_available():
        pytest.skip("libmlrt is not built")
    monkeypatch.setattr(bench, "last_cache_bytes", lambda: 8 << 20)  # an 8 MiB cache
    b = bench.bandwidths()
    assert b["memory_buffer_MiB"] == 512 and b["cache_buffer_MiB"] == 2 and b["threads"] == 2
    assert b["memory_GB_s"] > 0 and b["cache_GB_s"] > 0
    assert bench.evict_mib() == 128
    monkeypatch.setattr(bench, "last_cache_bytes", lambda: 260 << 20)  # the Xeon host's
    assert bench.evict_mib() == 1040
    line = bench_output.host_line(bench_output.document("t", [], bandwidth=b))
    assert "memory " in line and "(512 MiB, beyond the last-level cache), cache " in line


def test_the_tokenizer_bench_times_real_text_cold_and_warm(tmp_path):
    """corpus_text is real text this machine has, the same on every call; every encoder row has a
    cold and a warm figure and says whether its ids are HF's."""
    from mlconf import bench
    from mlconf.golden import GOLDEN_DIR
    from mlconf.tools import convert_tokenizer

    text, what = bench.corpus_text(200_000)
    assert 150_000 < len(text.encode()) < 400_000 and "stdlib" in what
    assert bench.corpus_text(200_000) == (text, what)
    js = GOLDEN_DIR / "tokenizers" / "llama3.json"
    convert_tokenizer.convert(js, tmp_path / "l3.mlt")
    rows = bench.tokenizer_bench(str(tmp_path / "l3.mlt"), str(js), text[:20_000], repeat=2)
    assert rows[0]["impl"] == "reference"
    for r in rows:
        assert r["MB_s_cold"] > 0 and r["MB_s_warm"] > 0 and r["spread"]["MB_s_cold"]["runs"] == 2
    assert all(r["same_ids_as_HF"] for r in rows if r["impl"] in ("reference", "native"))
    assert bench.tiktoken_encoding(str(GOLDEN_DIR / "tokenizers" / "llama2.json")) is None  # SentencePiece


def test_model_bench_rows_per_shape_type_backend_and_prompt(monkeypatch):
    """The row layout of `bench native`'s model section, on tiny stand-ins for the two shapes: the
    worker backends on the small shape only, the in-process runtime on both, the weight bytes a
    decode step reads on every row."""
    from mlconf import bench
    from mlconf.backends.native import native_available

    if not native_available():
        pytest.skip("libmlrt is not built")
    tiny = dict(
        dim=64,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        hidden_dim=64,
        vocab=40000,
        max_seq=64,
        rope_theta=10000.0,
        norm_eps=1e-5,
        shared_classifier=1,
    )
    monkeypatch.setattr(
        bench, "BENCH_SHAPES", {"SmolLM2-135M": (tiny, (4, 8), True), "Llama-3.2-1B": (tiny, (4,), False)}
    )
    rows = bench.model_bench(["native"], ("q8_0",), decode=2)
    got = [(r["model"], r["backend"], r["prompt"]) for r in rows]
    assert got == [
        ("SmolLM2-135M shape q8_0", "native", 4),
        ("SmolLM2-135M shape q8_0", "native in-process, last logits", 4),
        ("SmolLM2-135M shape q8_0", "native", 8),
        ("SmolLM2-135M shape q8_0", "native in-process, last logits", 8),
        ("Llama-3.2-1B shape q8_0", "native in-process, last logits", 4),
    ]
    for r in rows:
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["weight_bytes"] > 40000 * 64


def test_decode_is_set_against_the_bandwidth_measured_before_it():
    """bench._beside pairs each decode run with the bandwidth measured just before it: a slow run
    in a slow minute is as good as a fast run in a fast one (the median of the ratios), and the
    bandwidth's own spread is reported."""
    from mlconf.bench import _beside

    got = _beside([10.0, 20.0, 15.0], Timing((1.0, 0.5, 2.0)), 16)
    assert got["decode_tok_per_memory_GB"] == 16 / 0.5 / 20 == 16 / 1.0 / 10
    assert got["memory_GB_s_beside"] == 15.0
    assert got["spread_beside"]["memory_GB_s"] == {"min": 10.0, "median": 15.0, "max": 20.0, "runs": 3}
    assert _beside([], Timing((1.0,)), 16) == {}


def test_interleaved_runs_take_turns():
    """bench_output.interleaved times one run of each function in turn per round (so the machine's
    drift falls on every engine alike), each with its own runs."""
    calls = []
    got = bench_output.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 3
    assert {k: len(t.runs) for k, t in got.items()} == {"a": 3, "b": 3}


def test_bitnet_prefill_rows(monkeypatch, tmp_path):
    """`bench bitnet`'s prefill section on a tiny Qwen3 stand-in: the F16 teacher and the I2_S
    student on the bitnet runtime (and llama.cpp's four rows with the `bench` extra: F16, its
    Q8_0, TQ2_0 and TQ1_0 of the student), every engine loaded at once and timed in turn, with the
    I2_S ratios and the multiply-adds against the peaks given."""
    pytest.importorskip("torch")
    from mlconf import bench
    from mlconf.backends.bitnet import LIBRARY

    if not LIBRARY.exists():
        pytest.skip("libmlbitnet is not built")
    tiny = (
        "qwen3",
        dict(
            hidden_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            intermediate_size=256,
            vocab_size=512,
            max_position_embeddings=64,
        ),
    )
    monkeypatch.setattr(bench, "BITNET_SHAPES", {"tiny": tiny})
    peaks = {("int8", 1): 100.0, ("f32", 1): 25.0}
    rows, types = bench.bitnet_prefill_bench(10.0, ("tiny",), (8,), (1,), str(tmp_path), peaks)
    labels = [r["model"] for r in rows]
    llama = bench.llama_cpp_version() is not None
    assert labels == ["tiny F16 teacher", "tiny I2_S student"] + (
        [f"tiny llama.cpp {t}" for t in ("F16 teacher", "Q8_0 teacher", "TQ2_0 student", "TQ1_0 student")]
        if llama
        else []
    )
    assert sorted(types) == (["tiny Q8_0", "tiny TQ1_0", "tiny TQ2_0"] if llama else [])
    student = rows[1]
    assert student["tokens_s"] > 0 and student["spread"]["tokens_s"]["runs"] == bench.prefill_repeat(8)
    assert student["vs_F16_teacher"] > 0 and (not llama or student["vs_llama.cpp_TQ1_0"] > 0)
    macs = bench._projection_params("tiny") * 8
    for r in rows:  # the MACs over the row's time, against the peak of its arithmetic
        sec = 8 / r["tokens_s"]
        assert r["proj_GMAC_s"] == pytest.approx(macs / sec / 1e9)
        assert r["attn_GMAC_s"] == pytest.approx(bench.attention_macs(tiny[1], 8) / sec / 1e9)
        assert r["attn_of_f32_peak"] == pytest.approx(r["attn_GMAC_s"] / 25.0)
        if "F16" in r["model"]:
            assert r["proj_of_f32_peak"] == pytest.approx(r["proj_GMAC_s"] / 25.0) and "of_int8_peak" not in r
        else:
            assert (
                r["of_int8_peak"] == pytest.approx(r["proj_GMAC_s"] / 100.0) and "proj_of_f32_peak" not in r
            )


def test_phase_rates_take_turns_with_the_bandwidth_before_each_run():
    """bench.phase_rates (native against llama.cpp in `bench native`): one run of each engine in
    turn per round, the bandwidth measured before each run and paired with that run's decode."""
    from mlconf import bench

    calls = []

    def engine(name, tp, td):
        return lambda: calls.append(name) or (tp, td)

    bws = iter([10.0, 20.0] * 3)
    got = bench.phase_rates(
        {"a": engine("a", 1.0, 2.0), "b": engine("b", 0.5, 4.0)},
        prompt=8,
        decode=4,
        repeat=3,
        beside=lambda: calls.append("bw") or next(bws),
    )
    assert calls == ["bw", "a", "bw", "b"] * 3
    assert got["a"]["prefill_tok_s"] == 8.0 and got["b"]["decode_tok_s"] == 1.0
    assert got["a"]["memory_GB_s_beside"] == 10.0 and got["b"]["memory_GB_s_beside"] == 20.0
    assert got["a"]["decode_tok_per_memory_GB"] == 4 / 2.0 / 10.0


def test_llama_cpp_runs_decode_one_token_per_step(monkeypatch):
    """bench.llama_cpp_inprocess: a run evaluates the prompt, then ``decode`` single tokens (the
    ids native_inprocess gives), however long the prompt; an empty eval would time nothing. Flash
    attention is llama.cpp's best setting, as in the bitnet bench."""
    from mlconf import bench

    calls = []

    class Llama:
        def n_vocab(self):
            return 5

        def eval(self, toks):
            calls.append(list(toks))

        def reset(self):
            calls.append("reset")

        def close(self):
            calls.append("close")

    config = {}
    monkeypatch.setattr(bench, "_llama", lambda *a, **kw: (config.update(kw), Llama())[1])
    with bench.llama_cpp_inprocess("m.gguf", prompt=2, decode=4, warmup=False) as run:
        run()
    assert calls == ["reset", [0, 1], [2], [3], [4], [0], "close"]
    # llama.cpp as its users run it: its default flash attention (`auto`) is on for the CPU
    assert config == {"flash_attn": True} and bench.LLAMA_CPP_FLASH_ATTN is True
