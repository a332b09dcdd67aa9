"""tools/convert.py on tiny random transformers models of every architecture (tools/hf_models.py).

The expectations are written from transformers, not from the converter: header fields from the
config and from the instantiated HF modules (which layers transformers windows, its yarn
attention_scaling, its inverse frequencies), weights from the HF state dict with the documented
transforms written out here again (rotate-half -> interleaved permutation, (1 + w) fold, the
query/gate split of Qwen3.5). Logits of the reference forward pass (float semantics) on the
converted file are compared with transformers on weights that Q8_0 represents exactly.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from mlconf.backends.reference import loader, quant  # noqa: E402
from mlconf.tools import convert as conv  # noqa: E402
from mlconf.tools import hf_models, mlb  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
F32 = np.float32
# Architectures whose RMSNorm scales by (1 + w) (Gemma2RMSNorm, Gemma3RMSNorm, Qwen3_5RMSNorm).
ONE_CENTERED = {"gemma2", "gemma3_text", "qwen3_5_text"}
NAMES = hf_models.names()


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def hf(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """name -> (checkpoint folder, the torch model), every model of hf_models, seed 0."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name in NAMES:
        model = hf_models.make(name, seed=0)
        out[name] = (hf_models.save(model, root / name), model)
    return out


@pytest.fixture(scope="session")
def converted(hf, tmp_path_factory) -> dict[str, Path]:
    """name -> .mlb converted with the default options."""
    root = tmp_path_factory.mktemp("mlb")
    out = {}
    for name, (folder, _) in hf.items():
        out[name] = root / f"{name}.mlb"
        conv.convert(folder, out[name])
    return out


def text_parts(model):
    """(text config, text model) of a causal LM or a multimodal wrapper."""
    inner = model.model
    tm = getattr(inner, "language_model", inner)
    return model.config.get_text_config(), tm


def model_type(model) -> str:
    return text_parts(model)[0].model_type


# ---------------------------------------------------------------- expected header
ROPE_IDS = {"default": 0, "llama3": 1, "linear": 2, "yarn": 3}


def expected_header(model) -> tuple[dict, list[int] | None]:
    """The header fields and flag bytes the HF model implies (non-zero fields; others zero)."""
    cfg, tm = text_parts(model)
    dim, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or dim // nh
    e: dict = dict(
        dim=dim,
        n_layers=cfg.num_hidden_layers,
        n_heads=nh,
        n_kv_heads=cfg.num_key_value_heads,
        hidden_dim=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        max_seq=cfg.max_position_embeddings,
        norm_eps=float(F32(cfg.rms_norm_eps)),
        shared_classifier=int(bool(model.config.tie_word_embeddings)),
        head_dim=0 if hd == dim // nh else hd,
        wtype=1,
    )
    rot = tm.rotary_emb
    local_types = hasattr(rot, "sliding_attention_inv_freq")  # Gemma 3: RoPE per layer type
    inv = rot.full_attention_inv_freq if local_types else rot.inv_freq
    rp = cfg.rope_parameters["full_attention"] if local_types else cfg.rope_parameters
    rot_dim = 2 * len(inv)
    e["rot_dim"] = 0 if rot_dim == hd else rot_dim
    e["rope_theta"] = float(F32(rp["rope_theta"]))
    e["rope_type"] = ROPE_IDS[rp["rope_type"]]
    if rp["rope_type"] in ("linear", "llama3", "yarn"):
        e["rope_factor"] = float(F32(rp["factor"]))
    if rp["rope_type"] == "llama3":
        e.update(
            rope_low_freq_factor=rp["low_freq_factor"],
            rope_high_freq_factor=rp["high_freq_factor"],
            rope_orig_max_seq=rp["original_max_position_embeddings"],
        )
    if rp["rope_type"] == "yarn":
        scaling = rot.full_attention_attention_scaling if local_types else rot.attention_scaling
        e.update(
            rope_low_freq_factor=rp.get("beta_fast") or 32,
            rope_high_freq_factor=rp.get("beta_slow") or 1,
            rope_orig_max_seq=rp["original_max_position_embeddings"],
            rope_attn_factor=float(F32(scaling)),
        )
    act = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
    e["act"] = {"silu": 0, "gelu_pytorch_tanh": 1}[act]
    layers = list(tm.layers)
    attn = [la.self_attn for la in layers if hasattr(la, "self_attn")]
    sa = attn[0]
    e["qkv_bias"] = int(sa.q_proj.bias is not None)
    e["qk_norm"] = int(hasattr(sa, "q_norm"))
    e["attn_gate"] = int(sa.q_proj.out_features == 2 * nh * hd)
    e["post_norms"] = int(hasattr(layers[0], "post_feedforward_layernorm"))
    if hasattr(tm.embed_tokens, "scalar_embed_scale"):
        e["embed_scale"] = float(F32(tm.embed_tokens.scalar_embed_scale))
    e["attn_scale"] = 0.0 if math.isclose(sa.scaling, hd**-0.5) else float(F32(sa.scaling))
    e["attn_softcap"] = float(getattr(cfg, "attn_logit_softcapping", None) or 0)
    e["final_softcap"] = float(getattr(cfg, "final_logit_softcapping", None) or 0)
    flags, window = [], 0
    for la in layers:
        f = 0
        if hasattr(la, "linear_attn"):
            lin = la.linear_attn
            e.update(
                lin_k_heads=lin.num_k_heads,
                lin_v_heads=lin.num_v_heads,
                lin_k_dim=lin.head_k_dim,
                lin_v_dim=lin.head_v_dim,
                lin_conv=lin.conv_kernel_size,
            )
            flags.append(8)
            continue
        a = la.self_attn
        w = a.sliding_window if hasattr(a, "sliding_window") else getattr(cfg, "sliding_window", None)
        if w is not None and w < cfg.max_position_embeddings:  # a wider window is dropped (decision)
            f |= 1
            window = w
        if local_types and a.layer_type == "sliding_attention":
            f |= 2
            e["rope_local_theta"] = float(F32(cfg.rope_parameters["sliding_attention"]["rope_theta"]))
        if not getattr(a, "use_rope", True):
            f |= 4
        flags.append(f)
    e["sliding_window"] = window
    uniform = all(f == flags[0] for f in flags) and flags[0] in (0, 1)
    e["layer_flags"] = int(not uniform)
    return e, None if uniform else flags


@pytest.mark.parametrize("name", NAMES)
def test_header(name, hf, converted):
    _, model = hf[name]
    res = loader.load(converted[name])
    assert res.ok, res.reason
    m = mlb.read(converted[name])
    want, flags = expected_header(model)
    got = {k: m.header[k] for k in want}
    assert got == pytest.approx(want, rel=1e-7), name
    zero = set(m.header) - set(want) - {"magic", "version", "padding"}
    assert {k: m.header[k] for k in zero} == {k: 0 for k in zero}
    assert (list(m.flags) if m.flags is not None else None) == flags


def test_header_literals(converted):
    """A few expectations written out by hand from hf_models.MODELS."""
    flags = {
        n: (lambda m: list(m.flags) if m.flags is not None else None)(mlb.read(p))
        for n, p in converted.items()
    }
    assert flags["gemma2"] == [1, 0, 1, 0]  # sliding, full, ...
    assert flags["gemma3_text"] == [3, 3, 0, 3]  # window + local RoPE base; layer 2 global
    assert flags["smollm3"] == [0, 0, 0, 5]  # layer 3: no RoPE, and windowed
    assert flags["qwen3_5_text"] == [8, 8, 8, 0]
    assert flags["mistral"] is None and flags["llama"] is None
    h = {n: mlb.read(p).header for n, p in converted.items()}
    assert h["mistral"]["sliding_window"] == 8
    assert h["mistral_wide_window"]["sliding_window"] == 0  # 4096 >= max_position_embeddings 128
    assert h["gemma2"]["attn_scale"] == pytest.approx(24**-0.5)
    assert h["gemma3_text"]["attn_scale"] == 0  # query_pre_attn_scalar == head_dim
    assert h["gemma3_text"]["rope_type"] == 2 and h["gemma3_text"]["rope_factor"] == 8
    assert h["gemma3_text"]["rope_theta"] == 1e6 and h["gemma3_text"]["rope_local_theta"] == 1e4
    assert h["qwen3_5_text"]["rot_dim"] == 8 and h["qwen3_5_text"]["head_dim"] == 32
    assert h["llama_yarn"]["rope_attn_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    assert h["llama_yarn_mscale"]["rope_attn_factor"] == pytest.approx(
        (0.1 * 1.0 * math.log(4) + 1) / (0.1 * 0.5 * math.log(4) + 1)
    )
    assert h["llama_yarn_factor"]["rope_attn_factor"] == 1.25
    assert h["gemma2"]["embed_scale"] == pytest.approx(8.0) and h["gemma2"]["final_softcap"] == 30


# ---------------------------------------------------------------- expected weights
def interleave_rows(w: np.ndarray, head_dim: int, rot: int) -> np.ndarray:
    """HF rotate-half rows -> the format's interleaved pairs: per head, row 2i is HF row i and
    row 2i+1 is HF row i + rot/2, for i < rot/2; the rest stay."""
    out = w.copy()
    for h0 in range(0, w.shape[0], head_dim):
        for i in range(rot // 2):
            out[h0 + 2 * i] = w[h0 + i]
            out[h0 + 2 * i + 1] = w[h0 + i + rot // 2]
    return out


def expected_arrays(model, h: dict) -> dict[str, np.ndarray]:
    """Format array name -> float32 values from the HF state dict."""
    cfg, tm = text_parts(model)
    sd = {k: v.detach().float().numpy() for k, v in tm.state_dict().items()}
    mt = cfg.model_type
    hd = h["head_dim"] or h["dim"] // h["n_heads"]
    rot = h["rot_dim"] or hd
    norm = (lambda w: F32(1) + w) if mt in ONE_CENTERED else (lambda w: w)
    rope = lambda w: interleave_rows(w, hd, rot)
    out = {"tok_emb": sd["embed_tokens.weight"], "final_norm": norm(sd["norm.weight"])}
    if not h["shared_classifier"]:
        out["wcls"] = model.lm_head.weight.detach().float().numpy()
    gemma = mt.startswith("gemma")
    for i in range(h["n_layers"]):
        p, o = f"layers.{i}.", f"layers.{i}."
        out[o + "attn_norm"] = norm(sd[p + "input_layernorm.weight"])
        if p + "linear_attn.A_log" in sd:
            la = p + "linear_attn."
            out.update(
                {
                    o + "lqkv": sd[la + "in_proj_qkv.weight"],
                    o + "lz": sd[la + "in_proj_z.weight"],
                    o + "lb": sd[la + "in_proj_b.weight"],
                    o + "la": sd[la + "in_proj_a.weight"],
                    o + "lconv": sd[la + "conv1d.weight"][:, 0, :],
                    o + "dt_bias": sd[la + "dt_bias"],
                    o + "A_log": sd[la + "A_log"],
                    o + "lnorm": sd[la + "norm.weight"],  # plain w
                    o + "lout": sd[la + "out_proj.weight"],
                }
            )
        else:
            a = p + "self_attn."
            wq = sd[a + "q_proj.weight"]
            if h["attn_gate"]:  # per head: head_dim query rows, then head_dim gate rows
                heads = [wq[j : j + 2 * hd] for j in range(0, len(wq), 2 * hd)]
                out[o + "wg"] = np.concatenate([x[hd:] for x in heads])
                wq = np.concatenate([x[:hd] for x in heads])
            out[o + "wq"] = rope(wq)
            out[o + "wk"] = rope(sd[a + "k_proj.weight"])
            out[o + "wv"], out[o + "wo"] = sd[a + "v_proj.weight"], sd[a + "o_proj.weight"]
            if h["qkv_bias"]:
                out[o + "bq"] = rope(sd[a + "q_proj.bias"])
                out[o + "bk"] = rope(sd[a + "k_proj.bias"])
                out[o + "bv"] = sd[a + "v_proj.bias"]
            if h["qk_norm"]:
                out[o + "q_norm"] = rope(norm(sd[a + "q_norm.weight"]))
                out[o + "k_norm"] = rope(norm(sd[a + "k_norm.weight"]))
        out[o + "w1"], out[o + "w2"] = sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.down_proj.weight"]
        out[o + "w3"] = sd[p + "mlp.up_proj.weight"]
        if gemma:
            out[o + "ffn_norm"] = norm(sd[p + "pre_feedforward_layernorm.weight"])
            out[o + "post_attn_norm"] = norm(sd[p + "post_attention_layernorm.weight"])
            out[o + "post_ffn_norm"] = norm(sd[p + "post_feedforward_layernorm.weight"])
        else:
            out[o + "ffn_norm"] = norm(sd[p + "post_attention_layernorm.weight"])
    return out


def assert_q8_close(m: mlb.Model, name: str, want: np.ndarray) -> None:
    """Dequantized Q8_0 within half a step d/2 of the block (plus float32 slack)."""
    fmt, _, d = m.matrix(name)
    assert fmt == "Q8_0"
    got = m.weights(name)
    assert got.shape == want.shape, name
    step = np.repeat(np.abs(np.asarray(d, dtype=np.float64)), 32, axis=1)
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= step / 2 * (1 + 1e-5) + 1e-7 * np.abs(want)).all(), name


@pytest.mark.parametrize("name", NAMES)
def test_weights(name, hf, converted):
    _, model = hf[name]
    m = mlb.read(converted[name])
    want = expected_arrays(model, m.header)
    assert set(want) == set(mlb.expected_arrays(m.header, m.flags))
    for k, w in want.items():
        if k in m.arrays:  # F32: bit-exact
            np.testing.assert_array_equal(m.weights(k), w, err_msg=k)
        else:
            assert_q8_close(m, k, w)


def test_norms_are_random(hf):
    """The fold test means something only if the norm weights are neither 0 nor 1."""
    for _, model in hf.values():
        norms = [v for k, v in model.state_dict().items() if k.endswith("norm.weight")]
        assert norms and all(float(v.float().std()) > 0.01 for v in norms)


# ---------------------------------------------------------------- logits against transformers
@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name, tmp_path):
    forward = pytest.importorskip("mlconf.backends.reference.forward")
    model = hf_models.round_to_q8_0(hf_models.make(name, seed=1))
    hf_models.save(model, tmp_path / "hf")
    conv.convert(tmp_path / "hf", tmp_path / "m.mlb")
    tokens = np.random.default_rng(7).integers(0, 256, 40)  # longer than every window (8)
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens)[None]).logits[0].numpy()
    got = forward.Forward(mlb.read(tmp_path / "m.mlb"), float_mode=True).forward(tokens, 0)
    # float32 reassociation only: ~2e-7 here; a wrong permutation or RoPE scaling gives >1e-3
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- options
def test_q4_with_q8_mask_and_note(hf, tmp_path, capsys):
    folder, _ = hf["qwen3_5_text"]
    out = tmp_path / "m.mlb"
    assert conv.main([str(folder), str(out), "--wtype", "q4_0", "--q8-mask", "wq,w2"]) == 0
    err = capsys.readouterr().err
    assert "note: --q8-mask wq" in err and "wk" in err and "wg" in err and "lqkv" in err
    m = mlb.read(out)
    assert m.header["wtype"] == 2 and m.header["q8_mask"] == 4 | 64
    fmts = {a.matrix: a.fmt for a in m.table if a.part == "q"}
    assert fmts["layers.3.wq"] == fmts["layers.3.wk"] == fmts["layers.3.wg"] == "Q8_0"
    assert fmts["layers.0.lqkv"] == fmts["layers.0.w2"] == "Q8_0"
    assert fmts["layers.0.lb"] == "Q8_0"  # always
    assert fmts["layers.0.w1"] == fmts["layers.3.wo"] == fmts["tok_emb"] == "Q4_0"


@pytest.mark.parametrize("name, rule", [("gemma3_text", "round"), ("gemma3", "round"), ("llama", "search")])
def test_q4_default_rule(name, rule, hf, tmp_path):
    folder, model = hf[name]
    out = tmp_path / "m.mlb"
    conv.convert(folder, out, wtype="q4_0", f16_scales=True)
    m = mlb.read(out)
    assert m.header["scale_f16"] == 1
    w = expected_arrays(model, m.header)["layers.0.w1"]
    q, d = (quant.q4_0_round if rule == "round" else quant.q4_0_search)(w, f16=True)
    _, gq, gd = m.matrix("layers.0.w1")
    assert gd.dtype == np.dtype("<f2")
    np.testing.assert_array_equal(gq, q)
    np.testing.assert_array_equal(gd, d)


def test_imatrix(hf, tmp_path):
    folder, model = hf["llama"]
    rng = np.random.default_rng(3)
    im = mlb.Imatrix(2, 64, 128, 0, 10, 10, np.empty(0))
    im.sums = rng.uniform(0.1, 5, im.expected_len())
    mlb.write_imatrix(tmp_path / "im.mli", im)
    out = tmp_path / "m.mlb"
    assert conv.main([str(folder), str(out), "--wtype", "q4_0", "--imatrix", str(tmp_path / "im.mli")]) == 0
    m = mlb.read(out)
    w = expected_arrays(model, m.header)["layers.1.w2"]
    q, d = quant.q4_0_search(w, importance=quant.importance(im.channels(1, "w2")))
    _, gq, gd = m.matrix("layers.1.w2")
    np.testing.assert_array_equal(gq, q)
    np.testing.assert_array_equal(gd, d)
    # Gemma 3 defaults to the round rule, which takes no imatrix
    out2 = tmp_path / "g.mlb"
    assert (
        conv.main(
            [str(hf["gemma3_text"][0]), str(out2), "--wtype", "q4_0", "--imatrix", str(tmp_path / "im.mli")]
        )
        == 4
    )
    assert not out2.exists()


def test_bf16_and_sharded(hf, tmp_path, converted):
    _, model = hf["qwen3"]
    hf_models.save(model, tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    conv.convert(tmp_path / "sharded", tmp_path / "s.mlb")
    assert (tmp_path / "s.mlb").read_bytes() == converted["qwen3"].read_bytes()
    hf_models.save(model, tmp_path / "bf16", dtype="bfloat16")
    conv.convert(tmp_path / "bf16", tmp_path / "b.mlb")
    m = mlb.read(tmp_path / "b.mlb")
    want = expected_arrays(copy.deepcopy(model).to(torch.bfloat16).float(), m.header)
    np.testing.assert_array_equal(m.weights("layers.0.q_norm"), want["layers.0.q_norm"])
    assert_q8_close(m, "layers.1.wk", want["layers.1.wk"])


def test_streams_one_tensor_at_a_time(hf, tmp_path, monkeypatch):
    """The writer gets a lazy mapping: each tensor is read once, when its array is written."""
    loads: list[str] = []
    real = conv.Checkpoint.load
    monkeypatch.setattr(conv.Checkpoint, "load", lambda self, n: loads.append(n) or real(self, n))
    out = tmp_path / "m.mlb"
    h = conv.convert(hf["qwen3_5_text"][0], out)
    m = mlb.read(out)
    assert h == m.header
    names = list(mlb.expected_arrays(m.header, m.flags))
    assert len(loads) == len(names)  # q_proj twice (wq, wg), everything else once
    assert loads.count("model.layers.3.self_attn.q_proj.weight") == 2
    assert loads[0] == "model.embed_tokens.weight" and loads[-1] == "lm_head.weight"


def test_transformers_v4_config(hf, tmp_path, converted):
    """Old config.json layouts (rope_theta / rope_scaling / rope_local_base_freq /
    sliding_window_pattern, no layer_types) give the same file."""
    cases = {
        "llama_yarn": lambda c: {
            **c,
            "rope_theta": 10000.0,
            "rope_parameters": None,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "beta_fast": 32,
                "beta_slow": 1,
                "original_max_position_embeddings": 32,
            },
        },
        "gemma3_text": lambda c: {
            **c,
            "rope_parameters": None,
            "layer_types": None,
            "rope_theta": 1e6,
            "rope_local_base_freq": 10000.0,
            "sliding_window_pattern": 3,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        },
        "smollm3": lambda c: {**c, "layer_types": None, "no_rope_layers": None},
        "qwen3_5_text": lambda c: {**c, "layer_types": None, "rope_parameters": None, "rope_theta": 1e6},
    }
    for name, edit in cases.items():
        folder = copy_checkpoint(hf[name][0], tmp_path / name, config=edit)
        conv.convert(folder, tmp_path / f"{name}.mlb")
        assert (tmp_path / f"{name}.mlb").read_bytes() == converted[name].read_bytes(), name


def test_config_defaults_match_transformers():
    """The converter's table of class defaults (for keys a config.json omits) is transformers'."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for mt, arch in conv.ARCHS.items():
        cls = CONFIG_MAPPING[mt]
        theta = cls.default_theta
        for key, v in arch.defaults.items():
            if key == "rope_theta":
                assert v == (theta["global"] if isinstance(theta, dict) else theta), (mt, key)
            elif key == "rope_local_base_freq":
                assert v == theta["local"], (mt, key)
            elif hasattr(cls, key):
                assert getattr(cls, key) == v, (mt, key)


# ---------------------------------------------------------------- refusals
def copy_checkpoint(src: Path, dst: Path, config=None, tensors=None) -> Path:
    """A copy of a checkpoint with config.json edited (a function of the dict, None values
    removed) and/or its tensors edited (a function of the dict of numpy arrays)."""
    shutil.copytree(src, dst)
    if config is not None:
        c = config(json.loads((dst / "config.json").read_text(encoding="utf-8")))
        kept = {k: v for k, v in c.items() if v is not None}
        (dst / "config.json").write_text(json.dumps(kept), encoding="utf-8")
    if tensors is not None:
        f = dst / "model.safetensors"
        arrays = tensors(dict(safetensors_numpy.load_file(f)))
        safetensors_numpy.save_file(arrays, f)
    return dst


def _cfg(**kw):
    return lambda c: {**c, **kw}


def _drop(name):
    return lambda t: {k: v for k, v in t.items() if k != name}


def _set(name, value):
    return lambda t: {**t, name: value}


def _nan(name):
    def f(t):
        x = t[name].copy()
        x.flat[5] = np.nan
        return {**t, name: x}

    return f


REFUSALS = {
    "unknown_model_type": ("llama", _cfg(model_type="falcon"), None, "model_type 'falcon'"),
    "rope_dynamic": (
        "llama",
        _cfg(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
        None,
        "dynamic",
    ),
    "rope_longrope": ("llama", _cfg(rope_scaling={"type": "longrope", "factor": 2.0}), None, "longrope"),
    "yarn_no_truncate": (
        "llama_yarn",
        lambda c: {**c, "rope_parameters": {**c["rope_parameters"], "truncate": False}},
        None,
        "truncate",
    ),
    "act_gelu": ("llama", _cfg(hidden_act="gelu"), None, "hidden_act"),
    "act_qwen35": ("qwen3_5_text", _cfg(hidden_act="gelu_pytorch_tanh"), None, "hidden_act"),
    "attention_bias": ("llama", _cfg(attention_bias=True), None, "attention_bias"),
    "mlp_bias": ("smollm3", _cfg(mlp_bias=True), None, "mlp_bias"),
    "moe": ("qwen3", _cfg(num_experts=8), None, "num_experts"),
    "bidirectional": (
        "gemma3_text",
        _cfg(use_bidirectional_attention=True),
        None,
        "use_bidirectional_attention",
    ),
    "partial_rotary_llama": (
        "llama",
        lambda c: {**c, "rope_parameters": {**c["rope_parameters"], "partial_rotary_factor": 0.5}},
        None,
        "partial_rotary_factor",
    ),
    "local_rope_scaled": (
        "gemma3_text",
        lambda c: {
            **c,
            "rope_parameters": {
                **c["rope_parameters"],
                "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
            },
        },
        None,
        "sliding_attention",
    ),
    "bad_layer_type": (
        "gemma2",
        _cfg(layer_types=["sliding_attention", "chunked_attention", "full_attention", "full_attention"]),
        None,
        "layer_types",
    ),
    "dim_not_32": ("llama", _cfg(hidden_size=48), None, "dim"),
    "missing_key": ("llama", _cfg(num_hidden_layers=None), None, "num_hidden_layers"),
    "missing_tensor": (
        "llama",
        None,
        _drop("model.layers.1.mlp.up_proj.weight"),
        "model.layers.1.mlp.up_proj.weight",
    ),
    "missing_lm_head": ("llama", None, _drop("lm_head.weight"), "lm_head.weight"),
    "wrong_shape": (
        "qwen3",
        None,
        _set("model.layers.0.self_attn.k_proj.weight", np.zeros((32, 64), F32)),
        "model.layers.0.self_attn.k_proj.weight",
    ),
    "unexpected_tensor": (
        "llama",
        None,
        _set("model.layers.0.self_attn.o_proj.bias", np.zeros(64, F32)),
        "model.layers.0.self_attn.o_proj.bias",
    ),
    "tie_shape": ("qwen2", None, _set("lm_head.weight", np.zeros((256, 32), F32)), "lm_head.weight"),
    "non_finite": (
        "gemma2",
        None,
        _nan("model.layers.2.mlp.down_proj.weight"),
        "model.layers.2.mlp.down_proj.weight",
    ),
    "int_dtype": ("llama", None, _set("model.norm.weight", np.zeros(64, np.int32)), "model.norm.weight"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refused(case, hf, tmp_path, capsys):
    base, config, tensors, needle = REFUSALS[case]
    folder = copy_checkpoint(hf[base][0], tmp_path / "hf", config=config, tensors=tensors)
    out = tmp_path / "out" / "m.mlb"
    out.parent.mkdir()
    assert conv.main([str(folder), str(out)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("mlconf: error: ") and needle in err, err
    assert "Traceback" not in err
    assert list(out.parent.iterdir()) == []  # no .mlb, no temporary file


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--q8-mask", "wq"], "q4_0 only"),
        (["--wtype", "q4_0", "--q8-mask", "wx"], "unknown class 'wx'"),
        (["--q4-rule", "round"], "q4_0 only"),
    ],
)
def test_refused_options(argv, needle, hf, tmp_path, capsys):
    out = tmp_path / "m.mlb"
    assert conv.main([str(hf["llama"][0]), str(out), *argv]) == 4
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_cli_script(hf, tmp_path):
    """`python tools/convert.py` runs as a script; errors are one line on stderr, exit 1."""
    script = REPO / "tools" / "convert.py"
    out = tmp_path / "m.mlb"
    r = subprocess.run(
        [sys.executable, str(script), str(hf["qwen2"][0]), str(out)], capture_output=True, encoding="utf-8"
    )
    assert r.returncode == 0, r.stderr
    assert loader.load(out).ok
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "nowhere"), str(tmp_path / "x.mlb")],
        capture_output=True,
        encoding="utf-8",
    )
    assert r.returncode == 4 and r.stderr.startswith("mlconf: error: ") and "Traceback" not in r.stderr


def test_imports():
    """tools/ works without the harness, and hf_models imports torch only when used."""
    allowed = ("mlconf.tools", "mlconf.backends.reference", "mlconf.specs")
    for f in ("convert.py", "hf_models.py"):
        tree = ast.parse((REPO / "tools" / f).read_text(encoding="utf-8"))
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert all(m.startswith(allowed) or m == "mlconf" or not m.startswith("mlconf") for m in mods), f
    code = "import sys, mlconf.tools.hf_models; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
