"""`mlconf bench bitnet`'s pieces that need no timing: bitnet.cpp's published table beside a run's
rows, the attention multiply-add count, the machine's peak loops, the student as stock llama.cpp
reads it (convert-bitnet --stock-ternary) and the grid's command-line options."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlconf import bench, bench_output, cli

# the published ratios as docs/bitnet-embeddings-i2s-guide.md prints them (I2_S / F16)
GUIDE_RATIOS = {
    "Qwen3-0.6B": (2.28, 2.21, 1.93, 1.82, 1.61, 1.42),
    "Gemma3-270M": (1.67, 1.74, 1.56, 1.65, 1.44, 1.32),
}


def test_published_figures_give_the_guides_ratios():
    for shape, ratios in GUIDE_RATIOS.items():
        _, pub = bench.BITNET_PUBLISHED[shape]
        assert tuple(pub["F16"]) == tuple(pub["I2_S"]) == bench.PREFILL_SEQS
        got = tuple(round(pub["I2_S"][n] / pub["F16"][n], 2) for n in bench.PREFILL_SEQS)
        assert got == ratios, shape


def _fake_rows() -> list[dict]:
    """bitnet_prefill_bench's rows, made up: both shapes, 1 and 2 threads, 128 and 4096 tokens;
    llama.cpp's F16 at 100 tokens/s, the student at 250 with its ratios (the TQ1_0 one left out
    at 4096 tokens, as if that engine had not run)."""
    rows = []
    for shape in bench.BITNET_SHAPES:
        for th in (1, 2):
            for n in (128, 4096):
                rows.append(
                    {"model": f"{shape} llama.cpp F16 teacher", "threads": th, "tokens": n, "tokens_s": 100.0}
                )
                student = {
                    "model": f"{shape} I2_S student",
                    "threads": th,
                    "tokens": n,
                    "tokens_s": 250.0 * th,
                    "vs_llama.cpp_F16": 2.5 * th,
                    "vs_llama.cpp_Q8_0": 1.5,
                    "vs_llama.cpp_TQ2_0": 1.25,
                }
                if n == 128:
                    student["vs_llama.cpp_TQ1_0"] = 1.125
                rows.append(student)
    return rows


def test_published_table_is_the_guides_form_with_our_figures_beside():
    out = bench.published_table(_fake_rows())
    cols = ["run", "threads", "model", *(f"pp{n}" for n in bench.PREFILL_SEQS)]
    assert all(list(r) == cols for r in out)
    mine = [(r["threads"], r["model"]) for r in out if r["run"] == "this host"]
    lines = ["F16", "I2_S", "I2_S / llama.cpp Q8_0", "I2_S / llama.cpp TQ2_0", "I2_S / llama.cpp TQ1_0"]
    assert mine == [
        (th, f"{label} {line}")
        for th in (1, 2)
        for label in ("0.6B (Qwen3)", "270M (Gemma3)")
        for line in lines
    ]
    by = {(r["run"], r["threads"], r["model"]): r for r in out}
    f16, i2s = by["this host", 2, "0.6B (Qwen3) F16"], by["this host", 2, "0.6B (Qwen3) I2_S"]
    assert f16["pp128"] == "100.0" and f16["pp256"] == "" and f16["pp4096"] == "100.0"
    assert i2s["pp128"] == "500.0 (5.00x; bitnet.cpp 2.28x)"
    assert by["this host", 1, "270M (Gemma3) I2_S"]["pp4096"] == "250.0 (2.50x; bitnet.cpp 1.32x)"
    tq1 = by["this host", 1, "270M (Gemma3) I2_S / llama.cpp TQ1_0"]
    assert tq1["pp128"] == "1.12x" and tq1["pp4096"] == ""
    assert by["this host", 1, "0.6B (Qwen3) I2_S / llama.cpp Q8_0"]["pp4096"] == "1.50x"
    # the published rows last, every length
    assert [r["model"] for r in out if r["run"] == "bitnet.cpp"] == [
        "0.6B (Qwen3) F16",
        "0.6B (Qwen3) I2_S",
        "270M (Gemma3) F16",
        "270M (Gemma3) I2_S",
    ]
    assert by["bitnet.cpp", 8, "0.6B (Qwen3) I2_S"]["pp128"] == "870.90 (2.28x)"
    assert by["bitnet.cpp", 8, "270M (Gemma3) F16"]["pp4096"] == "785.54"
    md = bench_output.markdown(bench_output.document("t", [bench_output.section("p", out)]))
    assert "| run        |   threads | model" in md and "| pp4096 " in md
    assert "bitnet.cpp 2.28x" in bench_output.text(
        bench_output.document("t", [bench_output.section("p", out)])
    )


def test_published_table_without_llama_cpp_shows_the_student_and_the_published_ratio():
    rows = [r for r in _fake_rows() if "llama.cpp" not in r["model"]]
    for r in rows:
        for k in [k for k in r if k.startswith("vs_")]:
            del r[k]
    out = bench.published_table(rows)
    mine = [r for r in out if r["run"] == "this host"]
    assert {r["model"].split(" ", 2)[2] for r in mine} == {"I2_S"}  # no empty F16 or ratio rows
    assert mine[0]["pp128"] == "250.0 (bitnet.cpp 2.28x)"


def _brute_attention(config: dict, seq: int) -> int:
    n = 0
    for kind in config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]:
        for _head in range(config["num_attention_heads"]):
            for i in range(seq):
                for j in range(i + 1):
                    if kind == "sliding_attention" and i - j >= config["sliding_window"]:
                        continue
                    n += 2 * config["head_dim"]  # QK^T and PV
    return n


@pytest.mark.parametrize("seq", [1, 2, 4, 5, 6, 13])
def test_attention_macs_count_each_key_each_query_sees(seq):
    windowed = dict(
        num_hidden_layers=3,
        num_attention_heads=2,
        head_dim=4,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )
    assert bench.attention_macs(windowed, seq) == _brute_attention(windowed, seq)
    plain = dict(num_hidden_layers=2, num_attention_heads=3, head_dim=8)
    assert bench.attention_macs(plain, seq) == _brute_attention(plain, seq)


def test_attention_macs_of_the_real_shapes():
    """Qwen3-0.6B: 28 layers x 16 heads x 2 x 128 x n(n+1)/2; Gemma3-270M's sliding layers stop
    growing at its window of 512 keys."""
    qwen, gemma = bench.BITNET_SHAPES["Qwen3-0.6B"][1], bench.BITNET_SHAPES["Gemma3-270M"][1]
    assert bench.attention_macs(qwen, 4096) == 28 * 16 * 256 * 4096 * 4097 // 2
    per = 4 * 2 * 256
    want = 15 * per * (512 * 513 // 2 + (4096 - 512) * 512) + 3 * per * 4096 * 4097 // 2
    assert bench.attention_macs(gemma, 4096) == want
    assert bench.attention_macs(gemma, 512) == 18 * per * 512 * 513 // 2


def _bitnet_lib():
    from mlconf.backends.bitnet import LIBRARY

    if not LIBRARY.exists():
        pytest.skip("libmlbitnet is not built")
    return bench._bitnet_lib()[1]


def test_peak_loops_measure_a_positive_rate_and_refuse_what_they_lack():
    lib = _bitnet_lib()
    rows = bench.arithmetic_peaks((1, 2), iters=1 << 14)
    if lib.mlbitnet_bench_int8_peak(b"avx2", 1, 16) < 0:
        assert rows == []  # no x86-64 loop runs here
    else:
        assert {(r["peak"], r["threads"]) for r in rows} >= {("int8", 1), ("f32", 2)}
    for r in rows:
        assert (
            math.isfinite(r["GMAC_s"])
            and r["GMAC_s"] > 0
            and r["loop"] == bench.PEAK_LOOPS[r["peak"]][r["isa"]]
        )
    assert set(bench.best_peaks(rows)) == {(r["peak"], r["threads"]) for r in rows}
    for fn in (lib.mlbitnet_bench_int8_peak, lib.mlbitnet_bench_f32_peak):
        for isa in (b"no-such-isa", b"scalar", b""):
            assert fn(isa, 1, 16) == -1.0
        assert fn(bench._bitnet_lib()[0].NULL, 1, 16) == -1.0
    assert lib.mlbitnet_bench_f32_peak(b"avxvnni", 1, 16) == -1.0  # no float loop of its own
    if rows:
        assert lib.mlbitnet_bench_int8_peak(b"avx2", 0, 16) == -1.0
        assert lib.mlbitnet_bench_f32_peak(b"avx2", 1, 0) == -1.0


def test_the_host_line_names_the_peaks():
    peaks = [
        {"peak": "int8", "threads": 2, "GMAC_s": 290.0},
        {"peak": "int8", "threads": 1, "GMAC_s": 150.0},
        {"peak": "f32", "threads": 1, "GMAC_s": 50.0},
    ]
    line = bench_output.host_line(bench_output.document("t", [], peaks=peaks))
    assert line.endswith(
        " Multiply-add peaks (C loops, the best ISA): int8 150.0 GMAC/s on 1 thread, 290.0 GMAC/s on "
        "2 threads; f32 FMA 50.0 GMAC/s on 1 thread."
    )
    assert "peaks" not in bench_output.host_line(bench_output.document("t", []))


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A tiny Qwen3 BitNet student checkpoint (rows of 128 and 256) and its teacher's."""
    pytest.importorskip("torch")
    from mlconf.tools import bitnet_models

    kw = dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        vocab_size=512,
        max_position_embeddings=64,
    )
    tmp = tmp_path_factory.mktemp("student")
    return (
        bitnet_models.build("qwen3", tmp / "student", seed=3, **kw),
        bitnet_models.build("qwen3", tmp / "teacher", seed=3, teacher=True, **kw),
    )


def test_stock_ternary_is_the_teachers_tensor_set_with_the_students_ternary_weights(student, tmp_path):
    """convert(stock_ternary=True): the teacher's tensors (no *_norm_in), each projection ternary x
    the f16 of its I2_S scale (the I2_S file's values, f16-rounded), the rest as the student's."""
    import gguf

    from mlconf.backends.reference import i2s
    from mlconf.tools.convert import Checkpoint
    from mlconf.tools.convert_bitnet import ConvertError, convert, register_i2s

    ck, teacher = student
    convert(ck, tmp_path / "tq.gguf", "f16", f32_norms=True, stock_ternary=True)
    convert(ck, tmp_path / "i2s.gguf", "i2_s")
    convert(teacher, tmp_path / "teacher.gguf", "f16", f32_norms=True)
    register_i2s()
    got = {t.name: t for t in gguf.GGUFReader(tmp_path / "tq.gguf").tensors}
    i2s_file = {t.name: t for t in gguf.GGUFReader(tmp_path / "i2s.gguf").tensors}
    assert not [n for n in got if "_norm_in" in n] and any("_norm_in" in n for n in i2s_file)
    assert set(got) == {t.name for t in gguf.GGUFReader(tmp_path / "teacher.gguf").tensors}
    weights = Checkpoint(ck)
    n_proj = 0
    for name, t in got.items():
        if len(t.shape) != 2 or name == "token_embd.weight":  # norms F32 (f32_norms), the embedding F16
            want = gguf.GGMLQuantizationType.F32 if len(t.shape) == 1 else gguf.GGMLQuantizationType.F16
            assert t.tensor_type == want, name
            continue
        n_proj += 1
        assert t.tensor_type == gguf.GGMLQuantizationType.F16, name
        w = np.asarray(t.data, np.float32)
        q, d = i2s.ternarize(np.asarray(weights.load(_hf_name(name)), np.float32))
        scale = np.float32(np.float16(d))
        assert np.array_equal(w, q.astype(np.float32) * scale), name  # ternary x f16(scale), exactly
        assert set(np.unique(w / scale)) <= {-1.0, 0.0, 1.0}
        rows, cols = w.shape
        data = bytes(i2s_file[name].data) + np.array([d], "<f4").tobytes() + bytes(28)
        assert np.array_equal(w, i2s.dequantize(data, (rows, cols)).astype(np.float16).astype(np.float32))
    assert n_proj == 2 * 7
    with pytest.raises(ConvertError, match="--stock-ternary"):
        convert(ck, tmp_path / "x.gguf", "i2_s", stock_ternary=True)
    assert not (tmp_path / "x.gguf").exists()
    argv = ["convert-bitnet", str(ck), str(tmp_path / "y.gguf"), "--outtype", "f32", "--stock-ternary"]
    assert cli.main(argv) == 0
    assert {t.name for t in gguf.GGUFReader(tmp_path / "y.gguf").tensors} == set(got)


def _hf_name(gguf_name: str) -> str:
    from mlconf.tools.convert_bitnet import ARCHS

    _, i, rest = gguf_name.split(".", 2)
    hf = {g: h for h, g in ARCHS["qwen3"].layer.items()}[rest]
    return f"layers.{i}.{hf}"


@pytest.mark.slow
def test_llama_cpp_reads_the_stock_student_and_quantizes_it_to_tq(student, tmp_path):
    """Stock llama.cpp loads the --stock-ternary student and its own quantizer writes TQ2_0/TQ1_0
    where the rows hold whole 256-value blocks (ffn_down: 256 columns), a fallback elsewhere (rows
    of 128); the ternary weights are the F16 file's exactly."""
    if bench.llama_cpp_version() is None:
        pytest.skip("llama-cpp-python (extra `bench`) is not installed")
    import gguf
    from gguf import quants

    from mlconf.tools.convert_bitnet import convert

    ck, _ = student
    src = tmp_path / "tq_f16.gguf"
    convert(ck, src, "f16", f32_norms=True, stock_ternary=True)
    f16 = {t.name: np.asarray(t.data, np.float32) for t in gguf.GGUFReader(src).tensors}
    for ftype in ("TQ2_0", "TQ1_0"):
        out = bench.llama_cpp_quantize(src, tmp_path / f"{ftype}.gguf", ftype)
        types = bench.tensor_types(out)
        assert "ffn_down" in types[ftype], types
        assert not {"attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"} & set(types[ftype]), types
        tq = {t.name: t for t in gguf.GGUFReader(out).tensors}
        down = tq["blk.0.ffn_down.weight"]
        if hasattr(quants, ftype):  # gguf-py's dequantizer of the type
            back = quants.dequantize(down.data, down.tensor_type)
            assert np.array_equal(
                back.reshape(f16["blk.0.ffn_down.weight"].shape), f16["blk.0.ffn_down.weight"]
            )
        with bench.llama_cpp_prefill(out, 8, 1) as run:
            run()


def test_bench_bitnet_options_choose_a_part_of_the_grid(monkeypatch, tmp_path, capsys):
    got = {}

    def doc(**kw):
        got.update(kw)
        return bench_output.document("mlconf bench: bitnet runtime", [])

    monkeypatch.setattr(bench, "bitnet_doc", doc)
    args = ["bench", "bitnet", "--report", str(tmp_path), "--shapes", "Gemma3-270M"]
    assert cli.main([*args, "--seqs", "512,128,512", "--threads", "2,1"]) == 0
    assert got == {"shapes": ("Gemma3-270M",), "seqs": (512, 128), "threads": (2, 1)}
    assert (tmp_path / "bench-bitnet.md").exists()
    assert cli.main(["bench", "bitnet", "--report", str(tmp_path)]) == 0  # the defaults: the whole grid
    assert got == {"shapes": tuple(bench.BITNET_SHAPES), "seqs": bench.PREFILL_SEQS, "threads": None}
    capsys.readouterr()


def test_the_grids_defaults(monkeypatch):
    import os

    assert bench.PREFILL_SEQS == (128, 256, 512, 1024, 2048, 4096)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert bench.prefill_threads() == (1, 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert bench.prefill_threads() == (1, 2, 8)
    assert [bench.prefill_repeat(n) for n in bench.PREFILL_SEQS] == [3, 3, 2, 1, 1, 1]
