"""backends/reference/bitnet.py against an independent PyTorch oracle.

The oracle is transformers' Qwen3Model / Gemma3TextModel loaded from the tiny checkpoint
(tools/bitnet_models.py, hidden_size 128 so every projection is I2_S-packable) with every
nn.Linear of attention and MLP replaced by a BitLinear module written here from seed 004:
RMSNorm(x, <proj>.norm.weight) -> per-row int8 activation quant (specs/i2s.yaml `activations`)
-> per-tensor ternary weight quant -> matmul -> rescale. Its last hidden state is pooled and
optionally L2-normalized, then compared with ``embed`` on GGUFs written by
tools/convert_bitnet.convert (f32, f16, i2_s): cosine > 0.999; max abs diff reported.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

from mlconf.backends.reference import bitnet  # noqa: E402
from mlconf.tools import bitnet_models  # noqa: E402
from mlconf.tools.convert_bitnet import convert  # noqa: E402

FLAVORS = ("qwen3", "gemma3_text")
OUTTYPES = ("f32", "f16", "i2_s")
TOKENS = [5, 17, 3, 42, 99, 7, 250, 11, 64, 128, 1, 33]   # 12 > Gemma's sliding window 8
COS_MIN = 0.999


class BitLinear(torch.nn.Module):
    def __init__(self, d_in: int, d_out: int, eps: float, quant: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(d_out, d_in))
        self.norm = torch.nn.Module()
        self.norm.weight = torch.nn.Parameter(torch.ones(d_in))
        self.eps, self.quant = eps, quant

    def forward(self, x):
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.weight
        w = self.weight
        if not self.quant:
            return x @ w.T
        a = 127.0 / x.abs().amax(-1, keepdim=True).clamp(min=1e-5)
        t = x * a
        xq = (torch.sign(t) * torch.floor(t.abs() + 0.5)).clamp(-128, 127)   # half away from zero
        sw = 1.0 / w.abs().mean().clamp(min=1e-5)
        wq = torch.round(w * sw).clamp(-1, 1)
        return (xq @ wq.T) / a / sw


def _as_stored(sd: dict, gemma: bool, outtype: str) -> dict:
    """The checkpoint as the GGUF stores it: f16 rounding of every tensor (f16) or of all but
    the linear weights (i2_s). Gemma's one-centred norms are stored as f16(1 + w): w' = that - 1
    (exact in f32) so HF's 1 + w' reproduces it."""
    if outtype == "f32":
        return sd
    out = {}
    for k, v in sd.items():
        if v.ndim == 2 and k.startswith("layers.") and outtype == "i2_s":
            out[k] = v
        elif gemma and v.ndim == 1 and not k.endswith("_proj.norm.weight"):
            out[k] = (1.0 + v).half().float() - 1.0
        else:
            out[k] = v.half().float()
    return out


def _oracle(folder, quant: bool, outtype: str = "f32"):
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg._attn_implementation = "eager"
    cls = transformers.Qwen3Model if cfg.model_type == "qwen3" else transformers.Gemma3TextModel
    model = cls(cfg).float().eval()
    for layer in model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for nm in names:
                old = getattr(parent, nm)
                setattr(parent, nm, BitLinear(old.in_features, old.out_features, cfg.rms_norm_eps, quant))
    from safetensors.torch import load_file

    sd = _as_stored(load_file(str(folder / "model.safetensors")), cfg.model_type != "qwen3", outtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("inv_freq" in k for k in missing), (missing, unexpected)
    return model


def _pool(h: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    v = h.mean(0) if pooling == "mean" else h[0] if pooling == "cls" else h[-1]
    return v / np.linalg.norm(v) if normalize else v


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """flavor -> ({outtype: quantized oracle states}, {outtype: float oracle states}, {outtype: model})."""
    out = {}
    for flavor in FLAVORS:
        d = tmp_path_factory.mktemp(flavor)
        ck = bitnet_models.build(flavor, d / "ckpt", seed=3, pooling="lasttoken", hidden_size=128)
        hs = ({}, {})
        for ot in OUTTYPES:
            for quant, h in ((True, hs[0]), (False, hs[1])):
                with torch.no_grad():
                    m = _oracle(ck, quant, ot)
                    h[ot] = m(input_ids=torch.tensor([TOKENS])).last_hidden_state[0].numpy()
        models = {}
        for ot in OUTTYPES:
            convert(ck, d / f"m-{ot}.gguf", ot)
            models[ot] = bitnet.load_gguf(d / f"m-{ot}.gguf")
        out[flavor] = (hs[0], hs[1], models)
    return out


def _cmp(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return cos, float(np.abs(a - b).max())


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("pooling", ("mean", "cls", "last"))
def test_embed_matches_bitlinear_oracle(built, flavor, outtype, pooling):
    hq, _, models = built[flavor]
    for normalize in (False, True):
        got = bitnet.embed(models[outtype], TOKENS, pooling=pooling, normalize=normalize)
        want = _pool(hq[outtype], pooling, normalize)
        cos, mad = _cmp(got, want)
        print(f"{flavor} {outtype} {pooling} normalize={normalize}: cos={cos:.7f} max_abs={mad:.3g}")
        assert got.shape == (models[outtype].hp["dim"],) and got.dtype == np.float32
        assert cos > COS_MIN, (cos, mad)
        if normalize:
            assert abs(np.linalg.norm(got) - 1) < 1e-5


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype", ("f32", "f16"))
def test_float_mode_matches_float_oracle(built, flavor, outtype):
    _, hf, models = built[flavor]
    got = bitnet.embed(models[outtype], TOKENS, pooling="mean", float_mode=True)
    cos, mad = _cmp(got, _pool(hf[outtype], "mean", False))
    print(f"{flavor} {outtype} float_mode: cos={cos:.7f} max_abs={mad:.3g}")
    assert cos > COS_MIN, (cos, mad)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_gguf_pooling_type_is_default(built, flavor):
    models = built[flavor][2]
    m = models["i2_s"]
    assert m.hp["pooling"] == "last"
    np.testing.assert_array_equal(bitnet.embed(m, TOKENS), bitnet.embed(m, TOKENS, pooling="last"))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_f32_runtime_equals_i2s(built, flavor):
    """f32 weights ternarized at run time agree with the I2_S file (same packing rule; the I2_S
    file's embeddings and norms are f16, hence not bit-equal)."""
    models = built[flavor][2]
    a = bitnet.embed(models["f32"], TOKENS, pooling="mean")
    b = bitnet.embed(models["i2_s"], TOKENS, pooling="mean")
    cos, mad = _cmp(a, b)
    print(f"{flavor} f32-runtime vs i2_s: cos={cos:.9f} max_abs={mad:.3g}")
    assert cos > COS_MIN


def test_refusals(built):
    m = built["qwen3"][2]["f32"]
    with pytest.raises(bitnet.BitnetError):
        bitnet.embed(m, [])
    with pytest.raises(bitnet.BitnetError):
        bitnet.embed(m, [10**6])
    with pytest.raises(bitnet.BitnetError):
        bitnet.embed(m, [1, 2], pooling="max")
