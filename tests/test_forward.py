"""The reference forward pass: incremental decoding, bad inputs, its pieces against independent
formulations (complex rotation, integer block dots), and the imatrix sums."""

import math

import numpy as np
import pytest

from mlconf.backends import InputError
from mlconf.backends.reference import ReferenceBackend, quant
from mlconf.backends.reference.forward import Forward, apply_rope, rope_inv_freq
from mlconf.tools import mlb


@pytest.fixture(scope="module")
def valid(generated):
    root, fx = generated
    return {f.base: root / f.file for f in fx if f.kind == "valid" and f.file.endswith(".mlb")}


def tokens_for(m, n=24):
    n = min(n, m.header["max_seq"])
    return (np.arange(n) * 7 + 1) % m.header["vocab"]


@pytest.mark.parametrize("float_mode", [False, True])
def test_one_at_a_time_equals_batched(valid, float_mode):
    for name, path in valid.items():
        m = mlb.read(path)
        toks = tokens_for(m)
        fw = Forward(m, float_mode=float_mode)
        batched = fw.forward(toks, 0)
        fw.reset()
        single = np.concatenate([fw.forward(toks[i : i + 1], i) for i in range(len(toks))])
        fw.reset()
        half = max(1, len(toks) // 2)
        split = np.concatenate(
            [fw.forward(toks[:half], 0)] + ([fw.forward(toks[half:], half)] if len(toks) > half else [])
        )
        assert np.isfinite(batched).all(), name
        if float_mode:  # BLAS may block a matrix product differently for 1 and n rows
            np.testing.assert_allclose(single, batched, rtol=0, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(split, batched, rtol=0, atol=1e-5, err_msg=name)
        else:  # runtime semantics fix the order of every sum: bit-identical
            assert single.tobytes() == batched.tobytes(), name
            assert split.tobytes() == batched.tobytes(), name


def test_runtime_close_to_float(valid):
    for name, path in valid.items():
        m = mlb.read(path)
        toks = tokens_for(m)
        rt = Forward(m).forward(toks, 0)
        fl = Forward(m, float_mode=True).forward(toks, 0)
        nmse = float(np.mean((rt - fl) ** 2) / np.mean(fl**2))
        assert nmse < 1e-2, (name, nmse)


def test_rewind_recomputes_attention_models(valid):
    m = mlb.read(valid["gemma3"])
    toks = tokens_for(m)
    fw = Forward(m)
    first = fw.forward(toks, 0)
    other = toks.copy()
    other[5:] = (other[5:] + 3) % m.header["vocab"]
    fw.forward(other[5:], 5)  # diverge, then rewind to 5 with the original tokens
    again = fw.forward(toks[5:], 5)
    assert again.tobytes() == first[5:].tobytes()


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda m: Forward(m, ctx=m.header["max_seq"] + 1), "ctx"),
        (lambda m: Forward(m, ctx=0), "ctx"),
        (lambda m: Forward(m).forward([m.header["vocab"]], 0), "outside"),
        (lambda m: Forward(m).forward([-1], 0), "outside"),
        (lambda m: Forward(m).forward([1], -1), "negative"),
        (lambda m: Forward(m, ctx=4).forward([1, 2, 3, 4, 5], 0), "exceeds ctx"),
        (lambda m: Forward(m, ctx=8).forward([1], 3), "already fed"),
        (lambda m: Forward(m).forward([], 0), "non-empty"),
    ],
)
def test_bad_inputs_raise_input_error(valid, call, needle):
    m = mlb.read(valid["q8_min"])
    with pytest.raises(InputError, match=needle):
        call(m)


def test_linear_models_cannot_rewind(valid):
    m = mlb.read(valid["qwen35"])
    fw = Forward(m)
    fw.forward([1, 2, 3], 0)
    with pytest.raises(InputError, match="equal to"):
        fw.forward([4], 1)


def test_open_model_refuses_malformed(generated):
    root, fx = generated
    bad = next(f for f in fx if f.rule == "format.magic")
    with pytest.raises(InputError, match="magic"):
        ReferenceBackend().open_model(str(root / bad.file))


def test_rope_matches_complex_rotation():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 3, 16)).astype(np.float32)
    pos = np.arange(10, 15)
    inv = 10000.0 ** (-np.arange(6) * 2 / 12)  # rot_dim 12 of head_dim 16
    got = apply_rope(x, pos, inv, 1.0)
    z = x[..., 0:12:2].astype(np.complex128) + 1j * x[..., 1:12:2]
    z = z * np.exp(1j * pos[:, None, None] * inv[None, None, :])
    np.testing.assert_allclose(got[..., 0:12:2], z.real, atol=1e-5)
    np.testing.assert_allclose(got[..., 1:12:2], z.imag, atol=1e-5)
    assert got[..., 12:].tobytes() == x[..., 12:].tobytes()


def test_rope_scalings_against_transformers():
    rf = pytest.importorskip("transformers.modeling_rope_utils")
    tr = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    base = dict(rope_theta=500000.0, rope_local_theta=0.0)
    cases = [
        (
            {
                "rope_type": 1,
                "rope_factor": 8.0,
                "rope_low_freq_factor": 1.0,
                "rope_high_freq_factor": 4.0,
                "rope_orig_max_seq": 64,
            },
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        (
            {
                "rope_type": 2,
                "rope_factor": 4.0,
                "rope_low_freq_factor": 0.0,
                "rope_high_freq_factor": 0.0,
                "rope_orig_max_seq": 0,
            },
            {"rope_type": "linear", "factor": 4.0},
        ),
        (
            {
                "rope_type": 3,
                "rope_factor": 4.0,
                "rope_low_freq_factor": 32.0,
                "rope_high_freq_factor": 1.0,
                "rope_orig_max_seq": 64,
            },
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ]
    for ours, theirs in cases:
        cfg = tr.LlamaConfig(
            hidden_size=256,
            num_attention_heads=4,
            max_position_embeddings=256,
            rope_parameters={"rope_theta": 500000.0, **theirs},
        )
        fn = rf.ROPE_INIT_FUNCTIONS[theirs["rope_type"]]
        inv_t, factor = fn(cfg, torch.device("cpu"))
        inv = rope_inv_freq({**base, **ours}, 64, local=False)
        np.testing.assert_allclose(inv, inv_t.double().numpy(), rtol=2e-6, err_msg=theirs["rope_type"])
    assert math.isclose(factor, 0.1 * math.log(4.0) + 1, rel_tol=1e-6)


def test_runtime_matmul_is_integer_block_dot(valid):
    m = mlb.read(valid["q4_mask_a"])
    fw = Forward(m)
    rng = np.random.default_rng(5)
    for name in ("layers.0.wq", "layers.0.w1", "layers.1.w2"):
        fmt, q, d = m.matrix(name)
        x = rng.normal(size=(3, q.shape[1] * (2 if fmt == "Q4_0" else 1))).astype(np.float32)
        got = fw.matmul(name, x)
        xq, xd = quant.q8_0(x)
        levels = (
            np.asarray(q, np.int64)
            if fmt == "Q8_0"
            else quant.unpack_nibbles(np.asarray(q)).astype(np.int64).reshape(q.shape[0], -1)
        )
        nb = xd.shape[1]
        isum = np.einsum("tbj,rbj->trb", xq.astype(np.int64).reshape(3, nb, 32), levels.reshape(-1, nb, 32))
        want = np.sum(isum * xd.astype(np.float64)[:, None, :] * np.asarray(d, np.float64)[None], axis=2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_imatrix_sums_add_over_chunks(valid):
    m = mlb.read(valid["qwen3"])
    toks = tokens_for(m, 20)
    whole = Forward(m)
    a = whole.start_imatrix()
    whole.forward(toks[:10], 0)
    whole.reset()
    whole.forward(toks[10:], 0)
    parts = []
    for chunk in (toks[:10], toks[10:]):
        fw = Forward(m)
        parts.append(fw.start_imatrix())
        fw.forward(chunk, 0)
    assert a.tokens == a.tokens_cls == 20
    np.testing.assert_allclose(a.sums, parts[0].sums + parts[1].sums, rtol=1e-12)
    assert (a.sums > 0).all()
    # the classifier slot holds the squares of the final normalized state: its mean square is ~1
    cls = a.channels(None, "cls") / a.tokens_cls
    w = np.asarray(m.arrays["final_norm"], np.float64)
    assert abs(np.mean(cls / (w * w)) - 1) < 0.05


def test_forward_bench_rows():
    from mlconf import bench
    from mlconf.golden import GOLDEN_DIR

    rows = bench.forward_bench(str(GOLDEN_DIR / "logits" / "llama.mlb"), n_tokens=4, repeat=1)
    assert [r["mode"] for r in rows] == ["runtime", "float"]
    assert all(r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["of_bw"] > 0 for r in rows)
