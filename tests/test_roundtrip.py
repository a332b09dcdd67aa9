"""Random valid models: write -> reference loader accepts -> read back exactly what was written.

Headers come from the conftest strategy (every rule of the seed satisfied, every optional feature
drawn); bodies are seeded random weights at several magnitudes, with all-zero and tiny blocks.
"""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf.backends.reference import loader, quant
from mlconf.tools import mlb

F32_FIELDS = {
    "rope_theta",
    "norm_eps",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_attn_factor",
    "rope_local_theta",
    "embed_scale",
    "attn_scale",
    "attn_softcap",
    "final_softcap",
}


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def random_body(h: dict, flags, seed: int, scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for k, (fmt, shape) in mlb.expected_arrays(h, flags).items():
        x = rng.normal(0, scale, shape).astype(np.float32)
        if fmt != "F32" and x.size >= 64:
            flat = x.reshape(-1, 32)
            flat[0] = 0.0  # an all-zero block
            flat[-1] = rng.normal(0, 1e-7, 32).astype(np.float32)  # a tiny block (Q4 rescaling path)
            x = flat.reshape(shape)
        out[k] = x
    return out


def random_imatrix(h: dict, seed: int) -> mlb.Imatrix:
    hd = h["head_dim"] or h["dim"] // h["n_heads"]
    q_dim = hd * h["n_heads"]
    rng = np.random.default_rng(seed)
    tokens = [int(rng.integers(0, 2)) * 10 for _ in range(2)]  # zero tokens: slot unused
    im = mlb.Imatrix(
        h["n_layers"],
        h["dim"],
        h["hidden_dim"],
        0 if q_dim == h["dim"] else q_dim,
        tokens[0],
        tokens[1],
        np.empty(0),
    )
    stride = 2 * im.dim + (im.q_dim or im.dim) + im.hidden_dim
    im.sums = rng.gamma(0.5, 4.0, im.n_layers * stride + im.dim)
    return im


# Input of each matrix in the MLI1 file (seed: "Importance matrix file"; decision imatrix.slots).
SLOTS = {
    "wq": "attn",
    "wk": "attn",
    "wv": "attn",
    "wg": "attn",
    "lqkv": "attn",
    "lz": "attn",
    "wo": "wo",
    "w1": "ffn",
    "w3": "ffn",
    "w2": "w2",
    "wcls": "cls",
}


def expected_importance(im: mlb.Imatrix | None, h: dict, name: str):
    if im is None:
        return None
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "tok_emb" and h["shared_classifier"]:
        leaf = "wcls"
    if leaf not in SLOTS:
        return None
    slot = SLOTS[leaf]
    if (im.tokens_cls if slot == "cls" else im.tokens) == 0:
        return None
    stride = 2 * im.dim + (im.q_dim or im.dim) + im.hidden_dim
    if slot == "cls":
        sums = im.sums[im.n_layers * stride :][: im.dim]
    else:
        layer = int(name.split(".")[1])
        start = {
            "attn": 0,
            "wo": im.dim,
            "ffn": im.dim + (im.q_dim or im.dim),
            "w2": 2 * im.dim + (im.q_dim or im.dim),
        }[slot]
        width = {"attn": im.dim, "wo": im.q_dim or im.dim, "ffn": im.dim, "w2": im.hidden_dim}[slot]
        sums = im.sums[layer * stride + start :][:width]
    return quant.importance(sums)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1e-6, 0.05, 1.0, 300.0]),
    q4_rule=st.sampled_from(["search", "round"]),
    use_imatrix=st.booleans(),
)
def test_write_load_read_round_trip(valid_model_strategy, scratch, data, seed, scale, q4_rule, use_imatrix):
    h, flags = data.draw(valid_model_strategy)
    arrays = random_body(h, flags, seed, scale)
    im = random_imatrix(h, seed) if use_imatrix and q4_rule == "search" else None
    path = scratch / f"rt_{seed}.mlb"
    mlb.write(path, h, arrays, flags=flags, q4_rule=q4_rule, imatrix=im)
    try:
        res = loader.load(path)
        assert res.status == "ML_OK", res.reason
        m = mlb.read(path)
        # header: every field as written (f32 fields as their float32 value)
        for k, v in h.items():
            got = m.header[k]
            if k in F32_FIELDS:
                assert got == _f32(v), k
            else:
                assert got == v, k
        assert m.header["padding"] == bytes(96)
        assert (list(m.flags) if m.flags is not None else None) == flags
        f16 = h["scale_f16"] == 1
        for k, x in arrays.items():
            if k in m.arrays:  # F32 array: the input bytes
                got = np.asarray(m.arrays[k])
                assert got.dtype == np.dtype("<f4"), k
                assert got.tobytes() == x.astype("<f4").tobytes(), k
                continue
            fmt, q, d = m.matrix(k)
            if fmt == "Q8_0":
                wq, wd = quant.q8_0(x, f16=f16)
            elif q4_rule == "round":
                wq, wd = quant.q4_0_round(x, f16=f16)
            else:
                wq, wd = quant.q4_0_search(x, f16=f16, importance=expected_importance(im, h, k))
            assert np.asarray(q).tobytes() == wq.tobytes(), k
            assert np.asarray(d).dtype == np.dtype("<f2" if f16 else "<f4"), k
            assert np.asarray(d).tobytes() == wd.astype(d.dtype).tobytes(), k
            if fmt == "Q8_0":
                assert int(np.asarray(q).min(initial=0)) >= -127, k
            # dequantized weights near the input: per block, error within a fraction of amax
            w = m.weights(k)
            assert w.shape == x.shape, k
            err = np.abs(w - x).reshape(-1, 32).max(axis=1)
            amax = np.abs(x).reshape(-1, 32).max(axis=1)
            frac = 0.01 if fmt == "Q8_0" else (0.2 if im is None else 0.6)
            assert (err <= frac * amax + 1e-5).all(), (k, fmt, float((err - frac * amax).max()))
    finally:
        path.unlink()


def test_round_trip_exact_values(tmp_path):
    """A hand-made Q8_0 block whose quants are known without the quantizer: x = q * amax / 127."""
    h = dict(
        dim=32,
        n_layers=1,
        n_heads=1,
        n_kv_heads=1,
        hidden_dim=32,
        vocab=3,
        max_seq=4,
        rope_theta=10000.0,
        wtype=1,
        shared_classifier=1,
    )
    arrays = {
        k: np.zeros(shape, np.float32)
        for k, (_, shape) in mlb.expected_arrays(mlb.full_header(h), None).items()
    }
    levels = np.arange(-15, 17, dtype=np.int8)  # 32 distinct levels, amax 16
    arrays["tok_emb"][1] = levels.astype(np.float32)
    mlb.write(tmp_path / "m.mlb", h, arrays)
    m = mlb.read(tmp_path / "m.mlb")
    fmt, q, d = m.matrix("tok_emb")
    assert fmt == "Q8_0"
    d1 = np.float32(16) / np.float32(127)
    assert float(d[1, 0]) == float(d1)
    want = [
        math.trunc(float(np.float32(v) * (np.float32(127) / np.float32(16))) + math.copysign(0.5, v))
        for v in levels.tolist()
    ]
    assert np.asarray(q[1]).tolist() == want
    assert np.asarray(q[0]).tolist() == [0] * 32 and float(d[0, 0]) == 0.0
