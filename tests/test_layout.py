"""backends/reference/layout.py against the seed's header table and body table.

The expected plans come from hand-written lists (two tiny models, offsets worked out by hand) and
from ``seed_plan`` below, a second implementation of the seed's "Body" section written straight
from its text (it reads nothing of specs/mlb_body.yaml or layout.py).
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf.backends.reference import layout
from mlconf.tools import mlb

SEED_OFFSETS = {
    "magic": 0,
    "version": 4,
    "dim": 8,
    "n_layers": 12,
    "n_heads": 16,
    "n_kv_heads": 20,
    "hidden_dim": 24,
    "vocab": 28,
    "max_seq": 32,
    "rope_theta": 36,
    "norm_eps": 40,
    "wtype": 44,
    "shared_classifier": 48,
    "rope_type": 52,
    "rope_factor": 56,
    "rope_low_freq_factor": 60,
    "rope_high_freq_factor": 64,
    "rope_orig_max_seq": 68,
    "q8_mask": 72,
    "qkv_bias": 76,
    "head_dim": 80,
    "qk_norm": 84,
    "rope_attn_factor": 88,
    "sliding_window": 92,
    "layer_flags": 96,
    "rope_local_theta": 100,
    "act": 104,
    "post_norms": 108,
    "embed_scale": 112,
    "attn_scale": 116,
    "scale_f16": 120,
    "attn_softcap": 124,
    "final_softcap": 128,
    "rot_dim": 132,
    "attn_gate": 136,
    "lin_k_heads": 140,
    "lin_v_heads": 144,
    "lin_k_dim": 148,
    "lin_v_dim": 152,
    "lin_conv": 156,
}
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
U32_FIELDS = set(SEED_OFFSETS) - F32_FIELDS - {"magic"}


# ---------------------------------------------------------------- the seed's body, restated
def _pad64(n: int) -> int:
    return (n + 63) // 64 * 64


def place(sizes: list[tuple[str, int]], start: int = 256) -> list[tuple[str, int, int]]:
    """(name, offset, nbytes): arrays one after the other from ``start``, each at a multiple of 64."""
    out, off = [], start
    for name, n in sizes:
        out.append((name, off, n))
        off = _pad64(off + n)
    return out


# q8_mask bit of each matrix class (seed: "q8_mask bits").
SEED_BITS = {
    "tok_emb": 1,
    "wcls": 2,
    "wq": 4,
    "wk": 4,
    "wg": 4,
    "lqkv": 4,
    "wv": 8,
    "lz": 8,
    "wo": 16,
    "lout": 16,
    "w1": 32,
    "w3": 32,
    "w2": 64,
}


def seed_plan(h: dict, flags) -> list[tuple[str, int, int, str]]:
    """(name, offset, nbytes, fmt) of every array of the body, from the seed's text."""
    hd = h["head_dim"] if h["head_dim"] else h["dim"] // h["n_heads"]
    q_dim, kv_dim = hd * h["n_heads"], hd * h["n_kv_heads"]
    dim, hid, vocab = h["dim"], h["hidden_dim"], h["vocab"]
    K, V, dk, dv = h["lin_k_heads"], h["lin_v_heads"], h["lin_k_dim"], h["lin_v_dim"]
    scale_bytes = 2 if h["scale_f16"] == 1 else 4
    sizes: list[tuple[str, int]] = []
    fmts: list[str] = []

    def cls_fmt(cls: str) -> str:
        if h["wtype"] == 1:
            return "Q8_0"
        mask = h["q8_mask"]
        if cls == "tok_emb" and h["shared_classifier"] != 0:
            return "Q8_0" if mask & (1 | 2) else "Q4_0"
        return "Q8_0" if mask & SEED_BITS[cls] else "Q4_0"

    def matrix(name: str, rows: int, cols: int, fmt: str) -> None:
        sizes.append((name + ".q", rows * cols if fmt == "Q8_0" else rows * cols // 2))
        sizes.append((name + ".d", rows * (cols // 32) * scale_bytes))
        fmts.extend([fmt, fmt])

    def f32(name: str, n: int) -> None:
        sizes.append((name, 4 * n))
        fmts.append("F32")

    if h["layer_flags"] == 1:
        sizes.append(("layer_flags", h["n_layers"]))
        fmts.append("U8")
    matrix("tok_emb", vocab, dim, cls_fmt("tok_emb"))
    for i in range(h["n_layers"]):
        p = f"layers.{i}."
        f32(p + "attn_norm", dim)
        if flags is not None and flags[i] & 8:
            qkv = 2 * K * dk + V * dv
            matrix(p + "lqkv", qkv, dim, cls_fmt("lqkv"))
            matrix(p + "lz", V * dv, dim, cls_fmt("lz"))
            matrix(p + "lb", V, dim, "Q8_0")
            matrix(p + "la", V, dim, "Q8_0")
            f32(p + "lconv", qkv * h["lin_conv"])
            f32(p + "dt_bias", V)
            f32(p + "A_log", V)
            f32(p + "lnorm", dv)
            matrix(p + "lout", dim, V * dv, cls_fmt("lout"))
        else:
            matrix(p + "wq", q_dim, dim, cls_fmt("wq"))
            matrix(p + "wk", kv_dim, dim, cls_fmt("wk"))
            matrix(p + "wv", kv_dim, dim, cls_fmt("wv"))
            matrix(p + "wo", dim, q_dim, cls_fmt("wo"))
            if h["attn_gate"]:
                matrix(p + "wg", q_dim, dim, cls_fmt("wg"))
            if h["qkv_bias"]:
                f32(p + "bq", q_dim)
                f32(p + "bk", kv_dim)
                f32(p + "bv", kv_dim)
            if h["qk_norm"]:
                f32(p + "q_norm", hd)
                f32(p + "k_norm", hd)
        f32(p + "ffn_norm", dim)
        matrix(p + "w1", hid, dim, cls_fmt("w1"))
        matrix(p + "w2", dim, hid, cls_fmt("w2"))
        matrix(p + "w3", hid, dim, cls_fmt("w3"))
        if h["post_norms"]:
            f32(p + "post_attn_norm", dim)
            f32(p + "post_ffn_norm", dim)
    f32("final_norm", dim)
    if h["shared_classifier"] == 0:
        matrix("wcls", vocab, dim, cls_fmt("wcls"))
    return [(n, o, b, f) for (n, o, b), f in zip(place(sizes), fmts, strict=True)]


def got_plan(h: dict, flags) -> list[tuple[str, int, int, str]]:
    fl = bytes(flags) if flags is not None else None
    return [(a.name, a.offset, a.nbytes, a.fmt) for a in layout.plan(h, fl)]


def header(**kw) -> dict:
    h = layout.default_header()
    h.update(kw)
    return h


# ---------------------------------------------------------------- header
def test_header_dtype_matches_seed():
    dt = layout.header_dtype()
    assert dt.itemsize == 256
    for name, off in SEED_OFFSETS.items():
        assert dt.fields[name][1] == off, name
        want = "S4" if name == "magic" else ("<f4" if name in F32_FIELDS else "<u4")
        assert dt.fields[name][0] == np.dtype(want), name
    pad = dt.fields["padding"]
    assert pad[1] == 160 and pad[0].itemsize == 96
    assert set(dt.names) == set(SEED_OFFSETS) | {"padding"}


u32s = st.integers(0, 2**32 - 1)
f32s = st.floats(width=32, allow_nan=False)


@given(st.fixed_dictionaries({**{k: u32s for k in U32_FIELDS}, **{k: f32s for k in F32_FIELDS}}))
def test_pack_parse_round_trip(fields):
    raw = layout.pack_header(fields)
    assert len(raw) == 256
    assert raw[:4] == b"MLB1" and raw[160:] == bytes(96)
    # independent decoding with struct
    for k, off in SEED_OFFSETS.items():
        if k in U32_FIELDS:
            assert struct.unpack_from("<I", raw, off)[0] == fields[k], k
        elif k in F32_FIELDS:
            assert struct.unpack_from("<f", raw, off)[0] == fields[k], k
    back = layout.parse_header(raw)
    for k, v in fields.items():
        assert back[k] == v, k
    assert back["magic"] == b"MLB1" and back["padding"] == bytes(96)
    assert layout.pack_header(back) == raw


@given(st.binary(min_size=256, max_size=256))
def test_parse_arbitrary_bytes(raw):
    h = layout.parse_header(raw)
    assert h["magic"] == raw[:4]
    assert h["padding"] == raw[160:]
    for k, off in SEED_OFFSETS.items():
        if k in U32_FIELDS:
            assert h[k] == struct.unpack_from("<I", raw, off)[0], k
        elif k in F32_FIELDS:
            want = struct.unpack_from("<f", raw, off)[0]
            assert h[k] == want or (math.isnan(want) and math.isnan(h[k])), k


# ---------------------------------------------------------------- hand-written plans
# Model A: Q8_0, f32 scales, dim 32, 1 layer, 2 heads / 1 kv head (head_dim 16, q_dim 32,
# kv_dim 16), hidden 64, vocab 3, separate wcls. Offsets worked out by hand.
MODEL_A = dict(
    dim=32,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    hidden_dim=64,
    vocab=3,
    max_seq=8,
    rope_theta=10000.0,
    wtype=1,
)
PLAN_A = [
    ("tok_emb.q", 256, 96),
    ("tok_emb.d", 384, 12),
    ("layers.0.attn_norm", 448, 128),
    ("layers.0.wq.q", 576, 1024),
    ("layers.0.wq.d", 1600, 128),
    ("layers.0.wk.q", 1728, 512),
    ("layers.0.wk.d", 2240, 64),
    ("layers.0.wv.q", 2304, 512),
    ("layers.0.wv.d", 2816, 64),
    ("layers.0.wo.q", 2880, 1024),
    ("layers.0.wo.d", 3904, 128),
    ("layers.0.ffn_norm", 4032, 128),
    ("layers.0.w1.q", 4160, 2048),
    ("layers.0.w1.d", 6208, 256),
    ("layers.0.w2.q", 6464, 2048),
    ("layers.0.w2.d", 8512, 256),
    ("layers.0.w3.q", 8768, 2048),
    ("layers.0.w3.d", 10816, 256),
    ("final_norm", 11072, 128),
    ("wcls.q", 11200, 96),
    ("wcls.d", 11328, 12),
]
END_A = 11340

# Model B: Q4_0, f16 scales, shared classifier with q8_mask 2|8 (tok_emb and wv/lz Q8_0), qkv_bias,
# qk_norm, attn_gate, post_norms, layer flags [8, 1]: layer 0 linear attention (K=1, V=4, dk=8,
# dv=8, conv 3: lin_qkv = 48, V*dv = 32), layer 1 windowed attention. dim 64, 4 heads, 2 kv heads
# (head_dim 16, q_dim 64, kv_dim 32), hidden 32, vocab 5.
MODEL_B = dict(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    hidden_dim=32,
    vocab=5,
    max_seq=16,
    rope_theta=10000.0,
    wtype=2,
    scale_f16=1,
    q8_mask=10,
    shared_classifier=1,
    qkv_bias=1,
    qk_norm=1,
    attn_gate=1,
    post_norms=1,
    layer_flags=1,
    sliding_window=4,
    lin_k_heads=1,
    lin_v_heads=4,
    lin_k_dim=8,
    lin_v_dim=8,
    lin_conv=3,
)
FLAGS_B = [8, 1]
_FFN_B = [
    ("ffn_norm", 256, "F32"),
    ("w1.q", 1024, "Q4_0"),
    ("w1.d", 128, "Q4_0"),
    ("w2.q", 1024, "Q4_0"),
    ("w2.d", 128, "Q4_0"),
    ("w3.q", 1024, "Q4_0"),
    ("w3.d", 128, "Q4_0"),
    ("post_attn_norm", 256, "F32"),
    ("post_ffn_norm", 256, "F32"),
]
SIZES_B = (
    [("layer_flags", 2, "U8"), ("tok_emb.q", 320, "Q8_0"), ("tok_emb.d", 20, "Q8_0")]
    + [
        ("layers.0." + n, b, f)
        for n, b, f in [
            ("attn_norm", 256, "F32"),
            ("lqkv.q", 1536, "Q4_0"),
            ("lqkv.d", 192, "Q4_0"),
            ("lz.q", 2048, "Q8_0"),
            ("lz.d", 128, "Q8_0"),
            ("lb.q", 256, "Q8_0"),
            ("lb.d", 16, "Q8_0"),
            ("la.q", 256, "Q8_0"),
            ("la.d", 16, "Q8_0"),
            ("lconv", 576, "F32"),
            ("dt_bias", 16, "F32"),
            ("A_log", 16, "F32"),
            ("lnorm", 32, "F32"),
            ("lout.q", 1024, "Q4_0"),
            ("lout.d", 128, "Q4_0"),
            *_FFN_B,
        ]
    ]
    + [
        ("layers.1." + n, b, f)
        for n, b, f in [
            ("attn_norm", 256, "F32"),
            ("wq.q", 2048, "Q4_0"),
            ("wq.d", 256, "Q4_0"),
            ("wk.q", 1024, "Q4_0"),
            ("wk.d", 128, "Q4_0"),
            ("wv.q", 2048, "Q8_0"),
            ("wv.d", 128, "Q8_0"),
            ("wo.q", 2048, "Q4_0"),
            ("wo.d", 256, "Q4_0"),
            ("wg.q", 2048, "Q4_0"),
            ("wg.d", 256, "Q4_0"),
            ("bq", 256, "F32"),
            ("bk", 128, "F32"),
            ("bv", 128, "F32"),
            ("q_norm", 64, "F32"),
            ("k_norm", 64, "F32"),
            *_FFN_B,
        ]
    ]
    + [("final_norm", 256, "F32")]
)


def test_place_helper_reproduces_hand_offsets():
    assert place([(n, b) for n, _, b in PLAN_A]) == PLAN_A


def test_plan_model_a():
    h = header(**MODEL_A)
    assert [(n, o, b) for n, o, b, _ in got_plan(h, None)] == PLAN_A
    assert all(f in ("Q8_0", "F32") for *_, f in got_plan(h, None))
    assert layout.required_size(h, None) == END_A
    assert seed_plan(h, None) == got_plan(h, None)


def test_plan_model_b():
    h = header(**MODEL_B)
    want = [
        (n, o, b, f)
        for (n, o, b), (_, _, f) in zip(place([(n, b) for n, b, _ in SIZES_B]), SIZES_B, strict=True)
    ]
    assert got_plan(h, FLAGS_B) == want
    assert seed_plan(h, FLAGS_B) == want
    last = want[-1]
    assert layout.required_size(h, bytes(FLAGS_B)) == last[1] + last[2]


def test_plan_dtypes_and_shapes():
    h = header(**MODEL_B)
    arrs = {a.name: a for a in layout.plan(h, bytes(FLAGS_B))}
    assert (arrs["layer_flags"].dtype, arrs["layer_flags"].shape) == ("u1", (2,))
    assert (np.dtype(arrs["tok_emb.q"].dtype), arrs["tok_emb.q"].shape) == (np.int8, (5, 64))
    assert (np.dtype(arrs["tok_emb.d"].dtype), arrs["tok_emb.d"].shape) == (np.dtype("<f2"), (5, 2))
    assert (np.dtype(arrs["layers.1.wq.q"].dtype), arrs["layers.1.wq.q"].shape) == (np.uint8, (64, 32))
    assert arrs["layers.0.lconv"].shape == (48, 3)
    assert np.dtype(arrs["final_norm"].dtype) == np.dtype("<f4")


# q8_mask classes: which matrices are Q8_0 in a Q4_0 model (seed: "q8_mask bits").
MASK_MODEL = dict(
    dim=32,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    hidden_dim=32,
    vocab=4,
    max_seq=8,
    rope_theta=10000.0,
    wtype=2,
    attn_gate=1,
    layer_flags=1,
    lin_k_heads=1,
    lin_v_heads=4,
    lin_k_dim=8,
    lin_v_dim=8,
    lin_conv=2,
)
MASK_FLAGS = [0, 8]
MASK_CLASSES = {  # bit -> matrices (by leaf name) stored as Q8_0, with a separate wcls
    0: set(),
    1: {"tok_emb"},
    2: {"wcls"},
    4: {"wq", "wk", "wg", "lqkv"},
    8: {"wv", "lz"},
    16: {"wo", "lout"},
    32: {"w1", "w3"},
    64: {"w2"},
}
ALWAYS_Q8 = {"lb", "la"}


def _q8_leaves(h: dict, flags) -> set[str]:
    return {
        a.matrix.rsplit(".", 1)[-1] for a in layout.plan(h, bytes(flags)) if a.part == "q" and a.fmt == "Q8_0"
    }


@pytest.mark.parametrize("bit", sorted(MASK_CLASSES))
def test_q8_mask_classes(bit):
    h = header(**MASK_MODEL, q8_mask=bit)
    assert _q8_leaves(h, MASK_FLAGS) == MASK_CLASSES[bit] | ALWAYS_Q8


def test_q8_mask_all_bits():
    h = header(**MASK_MODEL, q8_mask=127)
    assert _q8_leaves(h, MASK_FLAGS) == set().union(*MASK_CLASSES.values()) | ALWAYS_Q8


@pytest.mark.parametrize(
    "mask,tok_q8", [(0, False), (1, True), (2, True), (3, True), (4, False), (124, False), (125, True)]
)
def test_shared_classifier_tok_emb(mask, tok_q8):
    """With a shared classifier, tok_emb is Q8_0 if bit 1 or 2 is set."""
    h = header(**MASK_MODEL, q8_mask=mask, shared_classifier=1)
    plan = got_plan(h, MASK_FLAGS)
    assert not any(n.startswith("wcls") for n, *_ in plan)
    fmt = next(f for n, _, _, f in plan if n == "tok_emb.q")
    assert fmt == ("Q8_0" if tok_q8 else "Q4_0")


def test_q8_model_everything_q8():
    h = header(**{**MASK_MODEL, "wtype": 1})
    assert {f for *_, f in got_plan(h, MASK_FLAGS)} == {"U8", "F32", "Q8_0"}


# ---------------------------------------------------------------- random valid headers
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_plan_matches_seed_for_random_headers(valid_model_strategy, data):
    h, flags = data.draw(valid_model_strategy)
    want = seed_plan(h, flags)
    assert got_plan(h, flags) == want
    fl = bytes(flags) if flags is not None else None
    assert layout.required_size(h, fl) == want[-1][1] + want[-1][2]
    for name, off, _, _ in want:
        assert off % 64 == 0, name
    # the writer's array list: every F32 array and every matrix (logical rows x cols)
    exp = mlb.expected_arrays(h, flags)
    plan_names = {n for n, *_ in want if n != "layer_flags"}
    names = {k + ".q" if f != "F32" else k for k, (f, _) in exp.items()}
    assert names == {n for n in plan_names if not n.endswith(".d")}
    for k, (fmt, shape) in exp.items():
        if fmt == "F32":
            nb = next(b for n, _, b, _ in want if n == k)
            assert math.prod(shape) * 4 == nb, k
        else:
            nq = next(b for n, _, b, _ in want if n == k + ".q")
            assert math.prod(shape) == (nq if fmt == "Q8_0" else nq * 2), k


@pytest.mark.parametrize("layers", [1000, 65536])
def test_required_size_many_layers_is_fast_and_linear(layers, monkeypatch):
    h1 = header(**MODEL_A)
    h2 = header(**{**MODEL_A, "n_layers": 2})
    one, two = seed_plan(h1, None), seed_plan(h2, None)
    end1, end2 = one[-1][1] + one[-1][2], two[-1][1] + two[-1][2]
    stride = end2 - end1
    h = header(**{**MODEL_A, "n_layers": layers})
    calls = []
    real = layout._section_size
    monkeypatch.setattr(layout, "_section_size", lambda *a: calls.append(1) or real(*a))
    got = layout.required_size(h, None)
    assert got == end1 + (layers - 1) * stride
    assert len(calls) <= 4, "required_size must not walk the layers one by one"


def test_required_size_with_linear_flags_many_layers():
    h = header(**{**MODEL_B, "n_layers": 4000})
    flags = bytes([8, 1, 0, 5] * 1000)
    want = seed_plan(h, flags)
    assert layout.required_size(h, flags) == want[-1][1] + want[-1][2]


def test_derive():
    h = header(**MODEL_B)
    d = layout.derive(h)
    assert (d["head_dim"], d["q_dim"], d["kv_dim"], d["rot_dim"]) == (16, 64, 32, 16)
    assert (d["lin_qkv"], d["lin_v_width"]) == (48, 32)
    h = header(**{**MODEL_B, "head_dim": 32, "rot_dim": 8})
    d = layout.derive(h)
    assert (d["head_dim"], d["q_dim"], d["kv_dim"], d["rot_dim"]) == (32, 128, 64, 8)


@pytest.mark.parametrize("model,flags", [(MODEL_A, None), (MODEL_B, FLAGS_B)], ids=["A", "B"])
def test_writer_pads_the_last_array(tmp_path, model, flags):
    """Decision writer.tail_padding: the writer pads the last array to 64 like every other, so
    the file is the hand-computed end of the last array rounded up to 64."""
    h = mlb.full_header(model)
    rng = np.random.default_rng(0)
    arrays = {
        k: rng.normal(0, 0.1, shape).astype(np.float32)
        for k, (_, shape) in mlb.expected_arrays(h, flags).items()
    }
    mlb.write(tmp_path / "m.mlb", model, arrays, flags=flags)
    size = (tmp_path / "m.mlb").stat().st_size
    end = END_A if flags is None else (lambda p: p[-1][1] + p[-1][2])(place([(n, b) for n, b, _ in SIZES_B]))
    assert size == _pad64(end)
