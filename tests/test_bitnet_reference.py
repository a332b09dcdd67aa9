"""backends/reference/bitnet.py against an independent PyTorch oracle.

The oracle (tools/golden_bitnet.py, the one BitLinear oracle of the repo, which also derives
golden/bitnet) is transformers' Qwen3Model / Gemma3TextModel loaded from the tiny checkpoint
(tools/bitnet_models.py, hidden_size 128 so every projection is I2_S-packable) with every
nn.Linear of attention and MLP replaced by a BitLinear module from seed 004:
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
from mlconf.tools import bitnet_models, golden_bitnet  # noqa: E402
from mlconf.tools.convert_bitnet import convert  # noqa: E402

FLAVORS = ("qwen3", "gemma3_text")
OUTTYPES = ("f32", "f16", "i2_s")
TOKENS = [5, 17, 3, 42, 99, 7, 250, 11, 64, 128, 1, 33]  # 12 > Gemma's sliding window 8
COS_MIN = 0.999


def _pool(h: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    return golden_bitnet.pool(h, pooling, normalize)


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
                h[ot] = golden_bitnet.oracle_hidden(ck, ot, TOKENS, quant=quant)
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
        got = bitnet.embed(models[outtype], TOKENS, pooling=pooling, normalize=normalize, reading="ternary")
        want = _pool(hq[outtype], pooling, normalize)
        cos, mad = _cmp(got, want)
        print(f"{flavor} {outtype} {pooling} normalize={normalize}: cos={cos:.7f} max_abs={mad:.3g}")
        assert got.shape == (models[outtype].hp["dim"],) and got.dtype == np.float32
        assert cos > COS_MIN, (cos, mad)
        if normalize:
            assert abs(np.linalg.norm(got) - 1) < 1e-5


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype", ("f32", "f16"))
def test_float_files_read_as_float_match_the_float_oracle(built, flavor, outtype):
    """A float file's own reading (bitnet.cpp's) is the float BitLinear: norm, then a plain matmul."""
    _, hf, models = built[flavor]
    assert models[outtype].reading == "float"
    got = bitnet.embed(models[outtype], TOKENS, pooling="mean")
    np.testing.assert_array_equal(got, bitnet.embed(models[outtype], TOKENS, pooling="mean", reading="float"))
    cos, mad = _cmp(got, _pool(hf[outtype], "mean", False))
    print(f"{flavor} {outtype} float: cos={cos:.7f} max_abs={mad:.3g}")
    assert cos > COS_MIN, (cos, mad)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_teacher_reads_as_the_plain_model(tmp_path, flavor):
    """A teacher GGUF (no per-projection norms) is the plain Qwen3 / Gemma 3: transformers' own
    model on the stored weights; the ternary reading is refused for it."""
    ck = bitnet_models.build(flavor, tmp_path / "t", seed=3, pooling="mean", teacher=True, hidden_size=128)
    for ot in ("f32", "f16"):
        convert(ck, tmp_path / f"t-{ot}.gguf", ot)
        m = bitnet.load_gguf(tmp_path / f"t-{ot}.gguf")
        assert not m.norm_in and m.reading == "float"
        got = bitnet.embed(m, TOKENS, pooling="mean")
        cos, mad = _cmp(got, _pool(golden_bitnet.teacher_hidden(ck, ot, TOKENS), "mean", False))
        print(f"{flavor} teacher {ot}: cos={cos:.9f} max_abs={mad:.3g}")
        assert cos > COS_MIN, (cos, mad)
        with pytest.raises(bitnet.BitnetError, match="reading ternary needs a BitNet student"):
            bitnet.embed(m, TOKENS, reading="ternary")


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
    a = bitnet.embed(models["f32"], TOKENS, pooling="mean", reading="ternary")
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
    with pytest.raises(bitnet.BitnetError, match="reading"):
        bitnet.embed(m, [1, 2], reading="int8")
