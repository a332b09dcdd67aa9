"""tools/convert_bitnet.py on tiny random BitNet embedding checkpoints (tools/bitnet_models.py).

Expectations are written from seed 004 (its name and type tables are restated here) and from
the checkpoint, read back with gguf-py's GGUFReader (with the run-time I2_S registration).
I2_S payloads are compared with backends/reference/i2s.py's payload, which the converter uses
and tests/test_i2s.py checks against an independent PyTorch BitLinear.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from mlconf.backends.reference import i2s  # noqa: E402
from mlconf.tools import bitnet_models  # noqa: E402
from mlconf.tools import convert_bitnet as cb  # noqa: E402
from mlconf.tools.convert import ConvertError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLAVORS = {
    "qwen3": ("qwen3", "lasttoken", gguf.PoolingType.LAST),
    "gemma3_text": ("gemma3", "mean", gguf.PoolingType.MEAN),
}
OUTTYPES = ("f32", "f16", "i2_s")
# Seed 004 section 2, restated: HF name after "layers.{i}." -> GGUF name after "blk.{i}.".
SEED_COMMON = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.q_proj.norm": "attn_q_norm_in",
    "self_attn.k_proj.norm": "attn_k_norm_in",
    "self_attn.v_proj.norm": "attn_v_norm_in",
    "self_attn.o_proj.norm": "attn_output_norm_in",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate_proj.norm": "ffn_gate_norm_in",
    "mlp.up_proj.norm": "ffn_up_norm_in",
    "mlp.down_proj.norm": "ffn_down_norm_in",
}
SEED_ARCH = {
    "qwen3": {"post_attention_layernorm": "ffn_norm"},
    "gemma3_text": {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
}
# Gemma3RMSNorm scales by (1 + w): these GGUF norms hold 1 + w (documented in the converter).
GEMMA_FOLDED = {
    "attn_norm",
    "post_attention_norm",
    "ffn_norm",
    "post_ffw_norm",
    "attn_q_norm",
    "attn_k_norm",
    "output_norm",
}
F32, F16, I2_S = 0, 1, 36


def seed_names(flavor: str, n_layers: int) -> dict[str, str]:
    """GGUF name -> HF name, from the seed's tables."""
    out = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight"}
    for i in range(n_layers):
        for hf, g in {**SEED_COMMON, **SEED_ARCH[flavor]}.items():
            out[f"blk.{i}.{g}.weight"] = f"layers.{i}.{hf}.weight"
    return out


def hidden(outtype: str) -> int:
    return 128 if outtype == "i2_s" else 64  # I2_S rows are whole 128-value blocks


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[tuple[str, int], Path]:
    root = tmp_path_factory.mktemp("bitnet")
    return {
        (f, h): bitnet_models.build(f, root / f"{f}_{h}", seed=3, pooling=FLAVORS[f][1], hidden_size=h)
        for f in FLAVORS
        for h in (64, 128)
    }


@pytest.fixture(scope="module")
def converted(ckpts, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, Path, dict]]:
    out = tmp_path_factory.mktemp("gguf")
    res = {}
    for f in FLAVORS:
        for t in OUTTYPES:
            ck = ckpts[(f, hidden(t))]
            path = out / f"{f}.{t}.gguf"
            res[(f, t)] = (ck, path, cb.convert(ck, path, t))
    return res


def read(path: Path):
    cb.register_i2s()
    return gguf.GGUFReader(path)


def val(r, key: str):
    return r.fields[key].contents()


def expected_type(gname: str, ndim: int, outtype: str) -> int:
    if outtype == "f32":
        return F32
    if outtype == "i2_s" and ndim == 2 and gname != "token_embd.weight":
        return I2_S
    return F16


# ---------------------------------------------------------------- tensors
@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_tensors(converted, flavor: str, outtype: str) -> None:
    ck, path, _ = converted[(flavor, outtype)]
    sd = safetensors_numpy.load_file(str(ck / "model.safetensors"))
    r = read(path)
    names = seed_names(flavor, 2)
    assert {t.name for t in r.tensors} == set(names)  # lm_head would be output.weight: absent
    raw = np.memmap(path, np.uint8, mode="r")
    for t in r.tensors:
        w = sd[names[t.name]]
        assert int(t.tensor_type) == expected_type(t.name, w.ndim, outtype), t.name
        assert tuple(int(d) for d in t.shape) == tuple(reversed(w.shape)), t.name  # ggml order
        base = t.name.split(".")[-2]
        want = np.float32(1) + w if flavor == "gemma3_text" and base in GEMMA_FOLDED else w
        if int(t.tensor_type) == F32:
            np.testing.assert_array_equal(np.asarray(t.data).reshape(w.shape), want, err_msg=t.name)
        elif int(t.tensor_type) == F16:
            got = np.asarray(t.data).reshape(w.shape)
            assert got.dtype == np.float16
            np.testing.assert_array_equal(got, want.astype(np.float16), err_msg=t.name)
        else:
            n = w.size // 4 + 32  # codes + f32 scale + tail
            data = bytes(raw[t.data_offset : t.data_offset + n])
            assert data == i2s.payload(w), t.name


def test_per_projection_norm_shapes(converted) -> None:
    """The seed's table: o_proj norm n_heads * head_dim wide, down_proj norm n_ff."""
    r = read(converted[("qwen3", "f32")][1])
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in r.tensors}
    assert shapes["blk.0.attn_output_norm_in.weight"] == (4 * 32,)
    assert shapes["blk.1.ffn_down_norm_in.weight"] == (128,)
    assert shapes["blk.0.attn_q_norm_in.weight"] == (64,)
    assert shapes["blk.0.attn_q_norm.weight"] == (32,)


# ---------------------------------------------------------------- metadata
@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_hyperparameters(converted, flavor: str, outtype: str) -> None:
    ck, path, summary = converted[(flavor, outtype)]
    arch, _, pooling = FLAVORS[flavor]
    cfg = json.loads((ck / "config.json").read_text(encoding="utf-8"))
    r = read(path)
    assert val(r, "general.architecture") == arch
    want = {
        "context_length": 128,
        "embedding_length": hidden(outtype),
        "block_count": 2,
        "feed_forward_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.key_length": 32,
        "attention.value_length": 32,
        "pooling_type": int(pooling),
    }
    for k, v in want.items():
        assert val(r, f"{arch}.{k}") == v, k
    assert val(r, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6, rel=1e-6)
    if flavor == "qwen3":
        assert val(r, "qwen3.rope.freq_base") == cfg["rope_parameters"]["rope_theta"] == 1e6
        assert "qwen3.attention.query_pre_attn_scalar" not in r.fields
    else:
        rp = cfg["rope_parameters"]
        assert val(r, "gemma3.rope.freq_base") == rp["full_attention"]["rope_theta"]
        assert val(r, "gemma3.rope.freq_base_swa") == rp["sliding_attention"]["rope_theta"]
        assert val(r, "gemma3.attention.sliding_window") == cfg["sliding_window"]
        assert val(r, "gemma3.attention.query_pre_attn_scalar") == cfg["query_pre_attn_scalar"]
        assert val(r, "gemma3.attention.sliding_window_pattern") == [
            k == "sliding_attention" for k in cfg["layer_types"]
        ]
    if outtype != "i2_s":
        assert val(r, "general.file_type") == {"f32": 0, "f16": 1}[outtype]
    assert summary["arch"] == arch and summary["head_dim"] == 32


@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_tokenizer(converted, flavor: str) -> None:
    ck, path, _ = converted[(flavor, "f16")]
    tj = json.loads((ck / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    by_id |= {a["id"]: a["content"] for a in tj["added_tokens"]}
    r = read(path)
    tokens = val(r, "tokenizer.ggml.tokens")
    assert len(tokens) == json.loads((ck / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert all(tokens[i] == t for i, t in by_id.items())
    assert tokens[max(by_id) + 1] == f"[PAD{max(by_id) + 1}]"  # padded to the model's vocab
    types = val(r, "tokenizer.ggml.token_type")
    assert types[0] == gguf.TokenType.CONTROL and types[max(by_id)] == gguf.TokenType.NORMAL
    if flavor == "qwen3":
        assert val(r, "tokenizer.ggml.model") == "gpt2"
        assert len(val(r, "tokenizer.ggml.merges")) == len(tj["model"]["merges"])
    else:  # Gemma 3: a llama (SPM) vocabulary with scores from the merge ranks, no merges
        assert val(r, "tokenizer.ggml.model") == "llama" and "tokenizer.ggml.merges" not in r.fields
        scores = val(r, "tokenizer.ggml.scores")
        first = "".join(tj["model"]["merges"][0])
        assert scores[tokens.index(first)] == 0.0 and types[tokens.index("<0x41>")] == gguf.TokenType.BYTE
        assert scores[tokens.index("".join(tj["model"]["merges"][5]))] <= -5.0
        assert types[tokens.index("<unk>")] == gguf.TokenType.CONTROL  # an added special token first
        assert val(r, "tokenizer.ggml.add_space_prefix") is False
    if flavor == "qwen3":  # the seed: EOS <|endoftext|> and add_eos for last-token pooling
        assert val(r, "tokenizer.ggml.eos_token_id") == by_id_inv(by_id, "<|endoftext|>")
        assert val(r, "tokenizer.ggml.add_eos_token") is True
        assert val(r, "tokenizer.ggml.pre") == "qwen2"
    else:  # from tokenizer_config.json
        assert val(r, "tokenizer.ggml.eos_token_id") == by_id_inv(by_id, "<eos>")
        assert val(r, "tokenizer.ggml.bos_token_id") == by_id_inv(by_id, "<bos>")
        assert "tokenizer.ggml.add_eos_token" not in r.fields or not val(r, "tokenizer.ggml.add_eos_token")


def by_id_inv(by_id: dict[int, str], text: str) -> int:
    return next(i for i, t in by_id.items() if t == text)


@pytest.mark.parametrize(
    "mode,want",
    [
        ("cls", gguf.PoolingType.CLS),
        ("mean", gguf.PoolingType.MEAN),
        ("lasttoken", gguf.PoolingType.LAST),
        (None, gguf.PoolingType.MEAN),
    ],
)
def test_pooling(tmp_path, mode: str | None, want) -> None:
    """sentence-transformers' pooling; without modules.json mean, as BitNet's converter."""
    ck = bitnet_models.build("qwen3", tmp_path / "m", pooling=mode)
    r = read_converted(ck, tmp_path / "o.gguf", "f32")
    assert val(r, "qwen3.pooling_type") == int(want)


def read_converted(ck: Path, out: Path, outtype: str):
    cb.convert(ck, out, outtype)
    return read(out)


def test_i2s_registration_is_idempotent() -> None:
    a, b = cb.register_i2s(), cb.register_i2s()
    assert a is b and int(a) == 36 and a.name == "I2_S"
    assert gguf.GGMLQuantizationType(36) is a and gguf.GGML_QUANT_SIZES[a] == (4, 1)


def test_cli(ckpts, tmp_path) -> None:
    out = tmp_path / "cli.gguf"
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "convert_bitnet.py"),
            str(ckpts[("gemma3_text", 128)]),
            str(out),
            "--outtype",
            "i2_s",
        ],
        capture_output=True,
        encoding="utf-8",
    )
    assert p.returncode == 0, p.stderr
    assert "gemma3" in p.stdout and out.exists()


# ---------------------------------------------------------------- refusals
def _refused(ck: Path, tmp_path: Path, outtype: str, *needles: str) -> None:
    out = tmp_path / "bad.gguf"
    with pytest.raises(ConvertError) as e:
        cb.convert(ck, out, outtype)
    for n in needles:
        assert n in str(e.value)
    assert cb.main([str(ck), str(out), "--outtype", outtype]) == 4
    assert list(tmp_path.glob("bad.gguf*")) == []  # nothing half-written


def test_refuses_other_model_type(tmp_path) -> None:
    ck = tmp_path / "m"
    bitnet_models.build("qwen3", ck)
    cfg = json.loads((ck / "config.json").read_text(encoding="utf-8"))
    (ck / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}), encoding="utf-8")
    _refused(ck, tmp_path, "f16", "model_type 'llama'")


def test_refuses_missing_tensors(tmp_path) -> None:
    ck = bitnet_models.build(
        "gemma3_text",
        tmp_path / "m",
        drop=("layers.1.self_attn.o_proj.norm.weight", "layers.0.post_feedforward_layernorm.weight"),
    )
    _refused(
        ck,
        tmp_path,
        "f32",
        "layers.1.self_attn.o_proj.norm.weight",
        "layers.0.post_feedforward_layernorm.weight",
    )


def test_refuses_shape(tmp_path) -> None:
    import torch

    bad = {"layers.0.mlp.down_proj.norm.weight": torch.ones(64)}
    ck = bitnet_models.build("qwen3", tmp_path / "m", extra=bad)
    _refused(ck, tmp_path, "f16", "layers.0.mlp.down_proj.norm.weight", "[64]", "[128]")


def test_refuses_unexpected_tensor_and_skips_lm_head(tmp_path) -> None:
    import torch

    ck = bitnet_models.build("qwen3", tmp_path / "m", extra={"lm_head.weight": torch.zeros(256, 64)})
    r = read_converted(ck, tmp_path / "ok.gguf", "f16")
    assert "output.weight" not in {t.name for t in r.tensors}
    ck2 = bitnet_models.build("qwen3", tmp_path / "m2", extra={"layers.0.mlp.extra.weight": torch.zeros(4)})
    _refused(ck2, tmp_path, "f16", "layers.0.mlp.extra.weight")


def test_refuses_i2s_partial_blocks(ckpts, tmp_path) -> None:
    _refused(ckpts[("qwen3", 64)], tmp_path, "i2_s", "self_attn.q_proj.weight", "128")


def test_refuses_pooling_config(tmp_path) -> None:
    ck = bitnet_models.build("qwen3", tmp_path / "m", pooling="mean")
    p = ck / "1_Pooling" / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text(encoding="utf-8")), "pooling_mode_cls_token": True}))
    _refused(ck, tmp_path, "f16", "pooling_mode_mean_tokens", "pooling_mode_cls_token")


def test_refuses_rope_scaling(tmp_path) -> None:
    ck = bitnet_models.build("qwen3", tmp_path / "m")
    cfg = json.loads((ck / "config.json").read_text(encoding="utf-8"))
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    (ck / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    _refused(ck, tmp_path, "f32", "rope_type = 'linear'")


def test_refuses_outtype(ckpts, tmp_path) -> None:
    with pytest.raises(ConvertError, match="q8_0"):
        cb.convert(ckpts[("qwen3", 64)], tmp_path / "x.gguf", "q8_0")


def test_failure_while_writing_leaves_no_file(tmp_path) -> None:
    """A NaN found while streaming (after the temporary file exists) still leaves nothing."""
    import torch

    nan = torch.full((64,), float("nan"))
    ck = bitnet_models.build("gemma3_text", tmp_path / "m", extra={"norm.weight": nan})
    _refused(ck, tmp_path, "f16", "norm.weight", "non-finite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_refuses_a_tokenizer_the_vocabulary_cannot_express(tmp_path) -> None:
    """Qwen3's vocabulary is byte-level BPE, Gemma 3's SentencePiece-style (byte fallback, U+2581)."""
    ck = bitnet_models.build("qwen3", tmp_path / "q")
    p = ck / "tokenizer.json"
    doc = {**json.loads(p.read_text(encoding="utf-8")), "pre_tokenizer": {"type": "Metaspace"}}
    p.write_text(json.dumps(doc), encoding="utf-8")
    _refused(ck, tmp_path, "f16", "ByteLevel")
    ck = bitnet_models.build("gemma3_text", tmp_path / "g")
    p = ck / "tokenizer.json"
    doc = json.loads(p.read_text(encoding="utf-8"))
    doc["model"]["byte_fallback"] = False
    p.write_text(json.dumps(doc), encoding="utf-8")
    _refused(ck, tmp_path, "f16", "SentencePiece-style")


def test_model_prefix(tmp_path) -> None:
    """Checkpoints saved from a wrapper hold the same tensors under "model."."""
    ck = bitnet_models.build("qwen3", tmp_path / "m")
    sd = safetensors_numpy.load_file(str(ck / "model.safetensors"))
    safetensors_numpy.save_file({f"model.{k}": v for k, v in sd.items()}, str(ck / "model.safetensors"))
    r = read_converted(ck, tmp_path / "o.gguf", "f32")
    t = next(t for t in r.tensors if t.name == "blk.1.ffn_down_norm_in.weight")
    np.testing.assert_array_equal(t.data, sd["layers.1.mlp.down_proj.norm.weight"])


def test_teacher_checkpoints_convert_and_half_students_are_refused(tmp_path) -> None:
    """A plain Qwen3 / Gemma 3 model (the float teacher) has no per-projection norms and converts
    without them; a checkpoint with some of them is refused, naming one that is missing."""
    for flavor in ("qwen3", "gemma3_text"):
        ck = bitnet_models.build(flavor, tmp_path / flavor, teacher=True)
        r = read_converted(ck, tmp_path / f"{flavor}.gguf", "f16")
        names = [t.name for t in r.tensors]
        assert "blk.0.attn_q.weight" in names and not [n for n in names if "_norm_in" in n]
    ck = bitnet_models.build("qwen3", tmp_path / "half", drop=("layers.1.mlp.down_proj.norm.weight",))
    _refused(ck, tmp_path, "f16", "missing tensor layers.1.mlp.down_proj.norm.weight")


def test_f32_norms_for_stock_llama_cpp(tmp_path) -> None:
    """--f32-norms: every 1-D tensor F32 (Gemma's 1 + w folded in float32), 2-D ones as the outtype
    says; stock llama.cpp cannot multiply by the F16 norms BitNet's converter writes."""
    ck = bitnet_models.build("gemma3_text", tmp_path / "g", teacher=True)
    r = read_converted(ck, tmp_path / "g.gguf", "f16")
    assert cb.main([str(ck), str(tmp_path / "g32.gguf"), "--outtype", "f16", "--f32-norms"]) == 0
    r32 = read(tmp_path / "g32.gguf")
    half = {t.name: t for t in r.tensors}
    for t in r32.tensors:
        if len(t.shape) == 1:
            assert int(t.tensor_type) == F32, t.name
            want = np.asarray(half[t.name].data)
            np.testing.assert_array_equal(np.asarray(t.data).astype(np.float16), want)
        else:
            assert int(t.tensor_type) == int(half[t.name].tensor_type), t.name
            assert t.data.tobytes() == half[t.name].data.tobytes(), t.name
    norm = next(t for t in r32.tensors if t.name == "blk.0.attn_norm.weight")
    w = safetensors_numpy.load_file(str(ck / "model.safetensors"))["layers.0.input_layernorm.weight"]
    np.testing.assert_array_equal(np.asarray(norm.data), np.float32(1.0) + w)
