"""tools/gguf_export.py: the GGUF holds the .mlb's weights, names and hyperparameters.

Checked with gguf-py's reader and dequantizer (independent of the exporter's block packing), and,
when llama-cpp-python (extra `bench`) is installed, by llama.cpp's own forward pass against the
reference forward in float semantics.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from mlconf import fixtures as mlfixtures  # noqa: E402
from mlconf.backends.reference.forward import Forward  # noqa: E402
from mlconf.tools import gguf_export, mlb  # noqa: E402

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
FIXTURES = ["q8_f16", "q4_round_f16", "q4_mask_b"]  # f16 scales; q4_mask_b mixes Q4_0 and Q8_0
BASE = dict(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    hidden_dim=96,
    vocab=35,
    max_seq=64,
    rope_theta=10000.0,
    norm_eps=1e-5,
    scale_f16=1,
)
GEMMA = dict(act=1, post_norms=1, embed_scale=8.0, sliding_window=8, scale_f16=1)
# Models written here: variants the exporter maps or refuses (header overrides with the layer flags
# as "flags", q4 rule).
CUSTOM = {
    "shared_q4_mask": ({"wtype": 2, "shared_classifier": 1, "q8_mask": 36}, "round"),
    "head_dim": ({"dim": 96, "head_dim": 32, "n_kv_heads": 4}, "search"),
    "rot_dim": ({"rot_dim": 8}, "search"),  # refused: llama.cpp's llama rotates whole heads
    "rope_llama3": (
        {
            "rope_type": 1,
            "rope_factor": 8.0,
            "rope_low_freq_factor": 1.0,
            "rope_high_freq_factor": 4.0,
            "rope_orig_max_seq": 32,
            "rope_theta": 5e5,
        },
        "search",
    ),
    "rope_linear": ({"wtype": 2, "rope_type": 2, "rope_factor": 2.0}, "round"),
    "vocab3": ({"vocab": 3}, "search"),
    "flags_zero": ({"layer_flags": 1}, "round"),  # a flags array, all zero: nothing to export
    "qwen2": ({"qkv_bias": 1}, "round"),
    "qwen3": ({"qk_norm": 1, "dim": 96, "head_dim": 32, "n_kv_heads": 4}, "search"),
    "bias_and_qk_norm": ({"qkv_bias": 1, "qk_norm": 1}, "round"),  # refused: no architecture has both
    # Gemma: what llama.cpp's gemma2 / gemma3 fix (the embedding scale sqrtf(64) = 8, the attention
    # scale 1/sqrt(head_dim), gemma2's caps and shared classifier) and a window on layer 0 only;
    # gemma3's layer 0 turns by the local base unscaled, layer 1 by rope_theta with linear scaling.
    "gemma2": (
        {**GEMMA, "attn_softcap": 50.0, "final_softcap": 30.0, "shared_classifier": 1, "flags": [1, 0]},
        "round",
    ),
    "gemma3": (
        {
            **GEMMA,
            "wtype": 2,
            "qk_norm": 1,
            "final_softcap": 15.0,
            "rope_theta": 1e6,
            "rope_local_theta": 1e4,
            "rope_type": 2,
            "rope_factor": 4.0,
            "flags": [3, 0],
        },
        "round",
    ),
    "gemma3_no_window": ({**GEMMA, "qk_norm": 1, "sliding_window": 0}, "search"),
    "gemma2_no_window": (
        {**GEMMA, "attn_softcap": 20.0, "final_softcap": 10.0, "shared_classifier": 1, "sliding_window": 0},
        "search",
    ),
    # refused: llama.cpp cannot say these
    "gemma_embed_1": ({**GEMMA, "qk_norm": 1, "embed_scale": 1.0}, "round"),
    "gemma_attn_scale": ({**GEMMA, "qk_norm": 1, "attn_scale": 0.2}, "round"),
    "gemma2_uncapped": ({**GEMMA, "attn_softcap": 50.0, "shared_classifier": 1}, "round"),
    "gemma3_capped": ({**GEMMA, "qk_norm": 1, "attn_softcap": 50.0}, "round"),
    "gemma_local_full": ({**GEMMA, "qk_norm": 1, "rope_local_theta": 5e4, "flags": [1, 2]}, "round"),
    "gemma_no_post_norms": ({**GEMMA, "qk_norm": 1, "post_norms": 0}, "round"),
    "gemma_nope": ({**GEMMA, "qk_norm": 1, "flags": [1, 4]}, "round"),
}
REFUSED = (
    "rot_dim",
    "bias_and_qk_norm",
    "gemma_embed_1",
    "gemma_attn_scale",
    "gemma2_uncapped",
    "gemma3_capped",
    "gemma_local_full",
    "gemma_no_post_norms",
    "gemma_nope",
)
EXPORTED = FIXTURES + [n for n in CUSTOM if n not in REFUSED]
ARCH = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_no_window": "gemma3",
    "gemma2_no_window": "gemma2",
}  # the others: llama
# What llama.cpp's qwen2, qwen3 and gemma rotate together are halves (i, i + head_dim / 2) of a head:
# the exporter reorders these arrays' head rows from the .mlb's pairs (2i, 2i + 1) to that order.
NEOX_ROWS = ("wq", "wk", "bq", "bk", "q_norm", "k_norm")


def _write(path: Path, header: dict, q4_rule: str, seed: int = 0) -> Path:
    header = dict(header)
    flags = header.pop("flags", None)
    h = mlb.full_header(
        {
            **BASE,
            "wtype": 1,
            **header,
            "layer_flags": int(flags is not None or bool(header.get("layer_flags"))),
        }
    )
    flags = flags if flags is not None else [0] * h["n_layers"] if h["layer_flags"] else None
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (_fmt, shape) in mlb.expected_arrays(h, None).items():
        sd, mean = (0.1, 1.0) if name.endswith("norm") else (0.05, 0.0)  # norms near 1, biases near 0
        arrays[name] = (mean + rng.normal(0, sd, shape)).astype(np.float32)
    mlb.write(path, h, arrays, q4_rule=q4_rule, flags=flags)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf_export")
    mlfixtures.generate(out, only={f"valid/{n}.mlb" for n in FIXTURES + ["q8_min", "rope_yarn"]})
    paths = {n: out / "valid" / f"{n}.mlb" for n in FIXTURES + ["q8_min", "rope_yarn"]}
    for n, (header, rule) in CUSTOM.items():
        paths[n] = _write(out / f"{n}.mlb", header, rule)
    return paths


@pytest.fixture(scope="module")
def exported(models) -> dict[str, Path]:
    return {n: gguf_export.export(models[n], models[n].with_suffix(".gguf")) for n in EXPORTED}


def _field(r, key: str):
    return r.fields[key].contents()


def _expected_names(m: mlb.Model) -> dict[str, str]:
    """GGUF tensor name -> .mlb array or matrix name, written out from llama.cpp's names."""
    names = {"token_embd.weight": "tok_emb", "output_norm.weight": "final_norm"}
    if not m.header["shared_classifier"]:
        names["output.weight"] = "wcls"
    ours = {
        "attn_norm": "attn_norm",
        "attn_q": "wq",
        "attn_k": "wk",
        "attn_v": "wv",
        "attn_output": "wo",
        "ffn_norm": "ffn_norm",
        "ffn_gate": "w1",
        "ffn_down": "w2",
        "ffn_up": "w3",
    }
    if m.header["qk_norm"]:
        ours |= {"attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}
    if m.header["post_norms"]:
        ours |= {"post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_ffn_norm"}
    for i in range(m.header["n_layers"]):
        names.update({f"blk.{i}.{k}.weight": f"layers.{i}.{v}" for k, v in ours.items()})
        if m.header["qkv_bias"]:
            names.update({f"blk.{i}.attn_{x}.bias": f"layers.{i}.b{x}" for x in "qkv"})
    return names


def _neox_rows(w: np.ndarray, head_dim: int) -> np.ndarray:
    """w's rows, head by head, in the order 0, 2, 4, ..., 1, 3, 5, ..."""
    order = [
        h * head_dim + j
        for h in range(len(w) // head_dim)
        for j in [*range(0, head_dim, 2), *range(1, head_dim, 2)]
    ]
    return w[order]


@pytest.mark.parametrize("name", EXPORTED)
def test_tensors_hold_the_same_weights(models, exported, name):
    m = mlb.read(models[name])
    r = gguf.GGUFReader(exported[name])
    tensors = {t.name: t for t in r.tensors}
    want = _expected_names(m)
    if m.header["rope_type"] == 1:
        want["rope_freqs.weight"] = None
    assert set(tensors) == set(want)
    for gname, ours in want.items():
        if ours is None:
            continue
        t = tensors[gname]
        fmt = next(a.fmt for a in m.table if a.name in (ours, f"{ours}.q"))
        assert t.tensor_type.name == fmt, gname
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(m.weights(ours).shape)
        want_w = m.weights(ours)
        if name in ARCH and ours.rsplit(".", 1)[-1] in NEOX_ROWS:
            want_w = _neox_rows(want_w, m.derived["head_dim"])
        np.testing.assert_array_equal(got, want_w, err_msg=gname)  # llama: no permutation


def test_llama3_rope_freqs(models, exported):
    """rope_freqs divides each pair's frequency: plain base^(-2i/rot) / factor = the scaled one."""
    from mlconf.backends.reference.forward import rope_inv_freq

    m = mlb.read(models["rope_llama3"])
    r = gguf.GGUFReader(exported["rope_llama3"])
    ff = next(t for t in r.tensors if t.name == "rope_freqs.weight").data
    rot = m.derived["rot_dim"]
    plain = 500000.0 ** (-2.0 * np.arange(rot // 2) / rot)
    np.testing.assert_allclose(plain / ff, rope_inv_freq(m.header, rot, False), rtol=1e-6)
    assert ff[0] == 1 and ff[-1] == 8  # high frequencies unscaled, low ones by the factor


@pytest.mark.parametrize("name", EXPORTED)
def test_hyperparameters(models, exported, name):
    m = mlb.read(models[name])
    h, d = m.header, m.derived
    r = gguf.GGUFReader(exported[name])
    arch = ARCH.get(name, "llama")
    assert _field(r, "general.architecture") == arch
    want = {
        "context_length": h["max_seq"],
        "embedding_length": h["dim"],
        "block_count": h["n_layers"],
        "feed_forward_length": h["hidden_dim"],
        "attention.head_count": h["n_heads"],
        "attention.head_count_kv": h["n_kv_heads"],
        "rope.dimension_count": d["rot_dim"],
        "vocab_size": h["vocab"],
    }
    for k, v in want.items():
        assert _field(r, f"{arch}.{k}") == v, k
    assert _field(r, f"{arch}.rope.freq_base") == np.float32(h["rope_theta"])
    assert _field(r, f"{arch}.attention.layer_norm_rms_epsilon") == np.float32(h["norm_eps"])
    if d["head_dim"] * h["n_heads"] != h["dim"]:
        assert _field(r, f"{arch}.attention.key_length") == d["head_dim"]
        assert _field(r, f"{arch}.attention.value_length") == d["head_dim"]
    else:
        assert f"{arch}.attention.key_length" not in r.fields
    if h["rope_type"] == 2:
        assert _field(r, f"{arch}.rope.scaling.type") == "linear"
        assert _field(r, f"{arch}.rope.scaling.factor") == np.float32(h["rope_factor"])
    gemma = {"sliding_window", "sliding_window_pattern", "freq_base_swa", "logit_softcapping"}
    if arch.startswith("gemma"):
        flags = list(m.flags) if m.flags is not None else [0] * h["n_layers"]
        swa = [bool(h["sliding_window"]) and bool(f & 1 or m.flags is None) for f in flags]
        window = h["sliding_window"]
        if arch == "gemma2" and not any(swa):  # every layer through a window no context reaches
            swa, window = [True] * h["n_layers"], h["max_seq"]
        if any(swa):
            assert _field(r, f"{arch}.attention.sliding_window") == window
            assert _field(r, f"{arch}.attention.sliding_window_pattern") == swa
            local = h["rope_local_theta"] if any(f & 2 for f in flags) else h["rope_theta"]
            assert _field(r, f"{arch}.rope.freq_base_swa") == np.float32(local)
        else:
            assert not any(k.endswith(("sliding_window", "freq_base_swa")) for k in r.fields)
        for cap in ("attn", "final"):
            key = f"{arch}.{cap}_logit_softcapping"
            assert (_field(r, key) if key in r.fields else 0) == np.float32(h[f"{cap}_softcap"]), key
    else:
        assert not any(k.split(".")[-1] in gemma for k in r.fields)
    assert _field(r, "general.file_type") == (7 if h["wtype"] == 1 else 2)
    assert _field(r, "tokenizer.ggml.model") == "llama"
    assert len(_field(r, "tokenizer.ggml.tokens")) == h["vocab"]
    assert len(_field(r, "tokenizer.ggml.scores")) == h["vocab"]
    assert _field(r, "tokenizer.ggml.bos_token_id") == 1
    assert _field(r, "tokenizer.ggml.eos_token_id") == 2


def test_f32_scales_exact_in_f16_are_accepted(tmp_path):
    """Q8_0 with f32 scales 2^-12 (every block's largest magnitude 127 x 2^-12) exports as is."""
    h = mlb.full_header({**BASE, "scale_f16": 0, "wtype": 1})
    rng = np.random.default_rng(1)
    arrays = {}
    for name, (fmt, shape) in mlb.expected_arrays(h, None).items():
        if fmt == "F32":
            arrays[name] = np.ones(shape, np.float32)
            continue
        x = rng.integers(-126, 127, shape).astype(np.float32)
        x[..., ::32] = 127
        arrays[name] = x * np.float32(2.0**-12)
    p = tmp_path / "exact.mlb"
    mlb.write(p, h, arrays)
    out = gguf_export.export(p, tmp_path / "exact.gguf")
    m = mlb.read(p)
    t = next(t for t in gguf.GGUFReader(out).tensors if t.name == "blk.1.ffn_down.weight")
    np.testing.assert_array_equal(gguf.quants.dequantize(t.data, t.tensor_type), m.weights("layers.1.w2"))


@pytest.mark.parametrize(
    "name, words",
    [
        ("q8_min", ["scale_f16 = 1", "not exact in f16"]),
        ("bias_and_qk_norm", ["qkv_bias and qk_norm"]),
        ("rope_yarn", ["yarn"]),
        ("rot_dim", ["rot_dim = 8", "16 dims"]),
        ("gemma_embed_1", ["embed_scale = 1.0", "sqrtf(dim) = 8.0"]),
        ("gemma_attn_scale", ["attn_scale = 0.2", "0.25", "head_dim"]),
        ("gemma2_uncapped", ["final_softcap = 0", "gemma2 always caps"]),
        ("gemma3_capped", ["attn_softcap = 50.0", "gemma3 caps no"]),
        ("gemma_local_full", ["layer 1", "base 50000", "full-attention", "freq_base_swa"]),
        ("gemma_no_post_norms", ["post_norms = 0", "GELU"]),
        ("gemma_nope", ["layers [1]", "NoPE"]),
    ],
)
def test_refused(models, tmp_path, name, words):
    out = tmp_path / f"{name}.gguf"
    with pytest.raises(gguf_export.ExportError) as e:
        gguf_export.export(models[name], out)
    assert all(w in str(e.value) for w in words)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_script(models, tmp_path, capsys):
    assert gguf_export.main([str(models["q8_f16"]), str(tmp_path / "a.gguf")]) == 0
    assert (tmp_path / "a.gguf").stat().st_size > 0
    assert gguf_export.main([str(models["q8_min"]), str(tmp_path / "b.gguf")]) == 2
    assert "scale_f16" in capsys.readouterr().err


# ---------------------------------------------------------------- llama.cpp runs the export
def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum((a - b) ** 2) / np.sum(b**2))


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python (extra 'bench') is not installed")
@pytest.mark.parametrize("name", EXPORTED)
def test_llama_cpp_logits_match_reference(models, exported, name):
    """llama.cpp (Q8_0 activations, f16 KV cache) against the reference's float semantics: NMSE
    below 1e-3 (about 1e-4 here; the RoPE test below gives 5e-3 for a wrong pair order), and at
    every position llama.cpp's top token is the reference's or within the row's error of it
    (random tiny models have near ties)."""
    from mlconf.bench import llama_cpp_logits

    m = mlb.read(models[name])
    toks = np.array([1, 5, 9, 20, 34, 3, 7, 11, 0, 2, 30, 17]) % m.header["vocab"]
    ref = Forward(m, float_mode=True).forward(toks, 0)
    got = llama_cpp_logits(exported[name], toks)
    assert got.shape == ref.shape
    assert _nmse(got, ref) < 1e-3, _nmse(got, ref)
    rows = np.arange(len(toks))
    err = np.sqrt(np.mean((got - ref) ** 2, axis=1))
    gap = ref.max(axis=1) - ref[rows, got.argmax(axis=1)]
    assert (gap <= 3 * err).all(), (gap, err)
    assert np.mean(got.argmax(axis=1) == ref.argmax(axis=1)) >= 0.75


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python (extra 'bench') is not installed")
def test_llama_cpp_sees_a_wrong_rope_pair_order(models, tmp_path, monkeypatch):
    """The logits check is tight enough: q and k rows put in rotate-half order fail it."""
    from mlconf.bench import llama_cpp_logits

    blocks = gguf_export.ggml_blocks

    def halves(fmt, q, d, where):
        b = blocks(fmt, q, d, where)
        if where.endswith(("wq", "wk")):
            b = b.reshape(-1, 16, b.shape[1])[:, np.r_[0:16:2, 1:16:2]].reshape(b.shape)
        return b

    monkeypatch.setattr(gguf_export, "ggml_blocks", halves)
    m = mlb.read(models["q4_round_f16"])
    toks = np.array([1, 5, 9, 20, 34, 3, 7, 11, 0, 2, 30, 17])
    got = llama_cpp_logits(gguf_export.export(models["q4_round_f16"], tmp_path / "halves.gguf"), toks)
    assert _nmse(got, Forward(m, float_mode=True).forward(toks, 0)) > 1e-3


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python (extra 'bench') is not installed")
def test_llama_cpp_sees_a_missing_window(models, tmp_path, monkeypatch):
    """The same check fails a gemma2 export whose window pattern is dropped (every layer attending
    to all keys): 24 tokens, where layer 0's window holds 8."""
    from mlconf.bench import llama_cpp_logits

    m = mlb.read(models["gemma2"])
    toks = np.arange(24) * 7 % m.header["vocab"]
    ref = Forward(m, float_mode=True).forward(toks, 0)
    right = llama_cpp_logits(gguf_export.export(models["gemma2"], tmp_path / "right.gguf"), toks)
    assert _nmse(right, ref) < 1e-3
    monkeypatch.setattr(gguf_export, "sliding_layers", lambda m, flags: [False] * m.header["n_layers"])
    got = llama_cpp_logits(gguf_export.export(models["gemma2"], tmp_path / "no_window.gguf"), toks)
    assert _nmse(got, ref) > 1e-3


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python (extra 'bench') is not installed")
def test_llama_cpp_bench_rates(exported):
    from mlconf.bench import llama_cpp_bench, llama_cpp_version

    r = llama_cpp_bench(exported["q8_f16"], prompt=8, decode=4, repeat=1)
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0
    assert r["version"] == llama_cpp_version() is not None


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python (extra `bench`) is not installed")
def test_llama_cpp_quantize_gives_q8_0_weights(tmp_path):
    """bench.llama_cpp_quantize (the bitnet bench's llama.cpp Q8_0 row) writes llama.cpp's own Q8_0
    of an F16 GGUF: every 2-D F16 weight becomes Q8_0, the rest keeps its type, and the names and
    shapes stay."""
    from mlconf.bench import llama_cpp_quantize

    src = Path(__file__).resolve().parents[1] / "golden" / "bitnet" / "qwen3_teacher_f16.gguf"
    out = llama_cpp_quantize(src, tmp_path / "q8.gguf")
    before = {t.name: t for t in gguf.GGUFReader(src).tensors}
    after = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert before.keys() == after.keys()
    for name, t in before.items():
        q = after[name]
        assert list(q.shape) == list(t.shape), name
        want = (
            gguf.GGMLQuantizationType.Q8_0
            if t.tensor_type == gguf.GGMLQuantizationType.F16 and len(t.shape) == 2
            else t.tensor_type
        )
        assert q.tensor_type == want, name
    with pytest.raises(RuntimeError, match="llama_model_quantize"):
        llama_cpp_quantize(tmp_path / "missing.gguf", tmp_path / "x.gguf")
