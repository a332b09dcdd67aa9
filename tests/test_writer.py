"""tools/mlb.py: what the writer refuses (and that it leaves nothing behind), determinism, the
`info` command, and the MLI1 importance-matrix file."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlconf.tools import mlb

REPO = Path(__file__).resolve().parents[1]

SMALL = dict(
    dim=32,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    hidden_dim=64,
    vocab=4,
    max_seq=8,
    rope_theta=10000.0,
    norm_eps=1e-5,
    wtype=1,
)


def model(seed: int = 0, flags=None, **kw) -> tuple[dict, dict]:
    """(header, arrays) of a tiny valid model."""
    header = {**SMALL, **kw}
    h = mlb.full_header(header)
    rng = np.random.default_rng(seed)
    arrays = {
        k: rng.normal(0, 0.05, shape).astype(np.float32)
        for k, (_, shape) in mlb.expected_arrays(h, flags).items()
    }
    return header, arrays


def imatrix_for(header: dict, seed: int = 1, **over) -> mlb.Imatrix:
    h = mlb.full_header(header)
    hd = h["head_dim"] or h["dim"] // h["n_heads"]
    q_dim = hd * h["n_heads"]
    im = mlb.Imatrix(
        h["n_layers"], h["dim"], h["hidden_dim"], 0 if q_dim == h["dim"] else q_dim, 100, 50, np.empty(0)
    )
    for k, v in over.items():
        setattr(im, k, v)
    stride = 2 * im.dim + (im.q_dim or im.dim) + im.hidden_dim
    im.sums = np.random.default_rng(seed).gamma(0.5, 4.0, im.n_layers * stride + im.dim)
    return im


def _listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


# ---------------------------------------------------------------- refusals
def _nan_in(name, value, dtype=np.float32):
    def edit(header, arrays):
        a = arrays[name].astype(dtype)
        a.flat[a.size // 2] = value
        arrays[name] = a

    return edit


def _set(**kw):
    def edit(header, arrays):
        header.update(kw)

    return edit


def _drop(name):
    def edit(header, arrays):
        del arrays[name]

    return edit


def _add(name, shape):
    def edit(header, arrays):
        arrays[name] = np.zeros(shape, np.float32)

    return edit


def _reshape(name):
    def edit(header, arrays):
        arrays[name] = arrays[name].T.copy()

    return edit


def _big_block(name):
    def edit(header, arrays):
        header["scale_f16"] = 1
        a = arrays[name].copy()
        a[0, 5] = 127 * 65504 * 1.01  # block amax / 127 above the largest f16
        arrays[name] = a

    return edit


# (case id, edit of (header, arrays), substring the error must contain, write() keywords)
REFUSALS = [
    ("nan_matrix", _nan_in("layers.0.wq", np.nan), "layers.0.wq", {}),
    ("inf_matrix", _nan_in("tok_emb", np.inf), "tok_emb", {}),
    ("minus_inf_f32", _nan_in("final_norm", -np.inf), "final_norm", {}),
    ("nan_f32", _nan_in("layers.0.attn_norm", np.nan), "layers.0.attn_norm", {}),
    ("float64_overflow", _nan_in("layers.0.w2", 1e300, np.float64), "layers.0.w2", {}),
    ("wrong_shape", _reshape("layers.0.w1"), "layers.0.w1", {}),
    ("wrong_shape_f32", lambda h, a: a.update({"final_norm": np.ones(33, np.float32)}), "final_norm", {}),
    ("missing", _drop("layers.0.w2"), "layers.0.w2", {}),
    ("unexpected", _add("layers.0.bq", (32,)), "layers.0.bq", {}),
    ("dim_48", _set(dim=48), "dim", {}),
    ("wtype_3", _set(wtype=3), "wtype", {}),
    (
        "llama3_factor_0",
        _set(
            rope_type=1,
            rope_factor=0.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_orig_max_seq=8,
        ),
        "rope_factor",
        {},
    ),
    ("layer_flags_without_flags", _set(layer_flags=1), "layer_flags", {}),
    ("flags_without_layer_flags", lambda h, a: None, "layer_flags", {"flags": [0]}),
    ("flags_bits_1_2", _set(layer_flags=1, rope_local_theta=10.0), "layer flag", {"flags": [6]}),
    ("flags_bit_4", _set(layer_flags=1), "layer flag", {"flags": [16]}),
    ("flag_not_a_byte", _set(layer_flags=1), "flag", {"flags": [256 + 1]}),
    ("flags_count", _set(layer_flags=1), "flag", {"flags": [0, 0]}),
    ("vocab_negative", _set(vocab=-1), "vocab", {}),
    ("n_layers_float", _set(n_layers=1.5), "n_layers", {}),
    ("u32_too_big", _set(sliding_window=2**32), "sliding_window", {}),
    ("f32_string", _set(rope_theta="1e4"), "rope_theta", {}),
    ("f32_overflow", _set(embed_scale=1e39), "embed_scale", {}),
    ("f32_huge_int", _set(attn_scale=10**400), "attn_scale", {}),
    ("magic_str", _set(magic="MLB1"), "magic", {}),
    ("array_dtype", lambda h, a: a.update({"final_norm": a["final_norm"].astype(complex)}), "final_norm", {}),
    ("unknown_field", _set(bogus=1), "bogus", {}),
    ("q8_mask_on_q8", _set(q8_mask=1), "q8_mask", {}),
    ("f16_scale_q8", _big_block("layers.0.wv"), "layers.0.wv", {}),
    ("f16_scale_q4", lambda h, a: (_set(wtype=2)(h, a), _big_block("tok_emb")(h, a)), "tok_emb", {}),
    ("bad_q4_rule", _set(wtype=2), "q4_rule", {"q4_rule": "nearest"}),
    (
        "round_rule_with_imatrix",
        _set(wtype=2),
        "imatrix",
        {"q4_rule": "round", "imatrix": imatrix_for(SMALL)},
    ),
    ("imatrix_dim", _set(wtype=2), "dim", {"imatrix": imatrix_for({**SMALL, "dim": 64, "n_heads": 4})}),
    ("imatrix_layers", _set(wtype=2), "n_layers", {"imatrix": imatrix_for({**SMALL, "n_layers": 2})}),
    ("imatrix_hidden", _set(wtype=2), "hidden_dim", {"imatrix": imatrix_for({**SMALL, "hidden_dim": 96})}),
    ("imatrix_q_dim", _set(wtype=2), "q_dim", {"imatrix": imatrix_for(SMALL, q_dim=64)}),
]


@pytest.mark.parametrize("preexisting", [False, True], ids=["new", "existing"])
@pytest.mark.parametrize("edit,needle,kw", [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_writer_refuses_and_leaves_nothing(tmp_path, edit, needle, kw, preexisting):
    header, arrays = model()
    edit(header, arrays)
    target = tmp_path / "model.mlb"
    old = b"an older file that must survive"
    if preexisting:
        target.write_bytes(old)
    before = _listing(tmp_path)
    with pytest.raises(mlb.MLBError) as e:
        mlb.write(target, header, arrays, **kw)
    msg = str(e.value)
    assert needle in msg, msg
    assert str(target) in msg, "the message names the file"
    assert _listing(tmp_path) == before, "no temporary or partial file left behind"
    if preexisting:
        assert target.read_bytes() == old


def test_writer_accepts_the_unedited_model(tmp_path):
    """The refusal cases above start from a model the writer accepts."""
    header, arrays = model()
    mlb.write(tmp_path / "ok.mlb", header, arrays)
    header, arrays = model(wtype=2)
    mlb.write(tmp_path / "ok4.mlb", header, arrays, imatrix=imatrix_for(SMALL))
    header, arrays = model(wtype=2)
    mlb.write(tmp_path / "ok4r.mlb", header, arrays, q4_rule="round")
    assert _listing(tmp_path) == ["ok.mlb", "ok4.mlb", "ok4r.mlb"]


def test_f16_scale_at_the_limit_is_written(tmp_path):
    """amax / 127 = 65504 (the largest f16) is storable; the refusal is only above it."""
    header, arrays = model(scale_f16=1)
    a = arrays["layers.0.wv"].copy()
    a[0, 0] = np.float32(65504) * np.float32(127)
    assert np.float32(np.abs(a[0, :32]).max()) / np.float32(127) == np.float32(65504)
    arrays["layers.0.wv"] = a
    mlb.write(tmp_path / "m.mlb", header, arrays)
    m = mlb.read(tmp_path / "m.mlb")
    assert float(m.matrix("layers.0.wv")[2][0, 0]) == 65504.0


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize(
    "kw,wkw",
    [
        ({}, {}),
        ({"wtype": 2, "scale_f16": 1, "q8_mask": 34}, {}),
        ({"wtype": 2}, {"q4_rule": "round"}),
        ({"wtype": 2, "shared_classifier": 1}, {"imatrix": imatrix_for(SMALL)}),
    ],
    ids=["q8", "q4_mask_f16", "q4_round", "q4_imatrix"],
)
def test_writer_is_deterministic(tmp_path, kw, wkw):
    header, arrays = model(seed=3, **kw)
    mlb.write(tmp_path / "a.mlb", header, arrays, **wkw)
    header2, arrays2 = model(seed=3, **kw)
    mlb.write(tmp_path / "b.mlb", header2, arrays2, **wkw)
    a, b = (tmp_path / "a.mlb").read_bytes(), (tmp_path / "b.mlb").read_bytes()
    assert a == b
    # writing over an existing file replaces it whole
    mlb.write(tmp_path / "a.mlb", *model(seed=4, **kw), **wkw)
    assert (tmp_path / "a.mlb").read_bytes() != b
    mlb.write(tmp_path / "a.mlb", header, arrays, **wkw)
    assert (tmp_path / "a.mlb").read_bytes() == b
    assert _listing(tmp_path) == ["a.mlb", "b.mlb"]


def test_written_file_is_an_ordinary_file(tmp_path):
    mlb.write(tmp_path / "m.mlb", *model())
    mode = (tmp_path / "m.mlb").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_written_header_bytes(tmp_path):
    """The header as the seed lays it out, decoded with struct (not with layout.py)."""
    header, arrays = model(rope_theta=500000.0, sliding_window=7)
    mlb.write(tmp_path / "m.mlb", header, arrays)
    raw = (tmp_path / "m.mlb").read_bytes()
    assert raw[:4] == b"MLB1"
    assert struct.unpack_from("<8I", raw, 4) == (1, 32, 1, 2, 1, 64, 4, 8)
    assert struct.unpack_from("<ff", raw, 36) == (500000.0, np.float32(1e-5))
    assert struct.unpack_from("<I", raw, 44) == (1,)
    assert struct.unpack_from("<I", raw, 92) == (7,)
    assert raw[160:256] == bytes(96)


# ---------------------------------------------------------------- info
def _info(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "tools/mlb.py", "info", *args],
        cwd=REPO,
        capture_output=True,
        encoding="utf-8",
        timeout=60,
    )


def test_info_prints_header_and_table(tmp_path):
    header, arrays = model(wtype=2, q8_mask=1, layer_flags=1, sliding_window=4, flags=[1])
    mlb.write(tmp_path / "m.mlb", header, arrays, flags=[1])
    r = _info(str(tmp_path / "m.mlb"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for field in ("dim", "n_layers", "vocab", "wtype", "q8_mask", "sliding_window", "lin_conv"):
        assert field in out, field
    for arr in ("layer_flags", "tok_emb.q", "tok_emb.d", "layers.0.wq.q", "final_norm", "wcls.d"):
        assert arr in out, arr
    assert "Q4_0" in out and "Q8_0" in out
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("make", ["missing", "truncated", "garbage", "empty", "directory"])
def test_info_malformed_exits_2(tmp_path, make):
    p = tmp_path / "bad.mlb"
    if make == "truncated":
        mlb.write(p, *model())
        p.write_bytes(p.read_bytes()[:-100])
    elif make == "garbage":
        p.write_bytes(b"GGUF" + bytes(300))
    elif make == "empty":
        p.write_bytes(b"")
    elif make == "directory":
        p.mkdir()
    r = _info(str(p))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert "error" in r.stderr and "bad.mlb" in r.stderr


# ---------------------------------------------------------------- MLI1
def test_imatrix_round_trip_and_layout(tmp_path):
    im = imatrix_for({**SMALL, "n_layers": 2, "head_dim": 32})  # q_dim 64 differs from dim 32
    assert im.q_dim == 64
    p = tmp_path / "a.mli"
    mlb.write_imatrix(p, im)
    raw = p.read_bytes()
    # the seed's 40-byte header, decoded by offset
    assert raw[:4] == b"MLI1"
    assert struct.unpack_from("<5I", raw, 4) == (1, 2, 32, 64, 64)
    assert struct.unpack_from("<2Q", raw, 24) == (100, 50)
    stride = 32 + 64 + 32 + 64
    assert len(raw) == 40 + 8 * (2 * stride + 32)
    assert np.array_equal(np.frombuffer(raw, "<f8", offset=40), im.sums)
    back = mlb.read_imatrix(p)
    assert (back.n_layers, back.dim, back.hidden_dim, back.q_dim, back.tokens, back.tokens_cls) == (
        2,
        32,
        64,
        64,
        100,
        50,
    )
    assert np.array_equal(back.sums, im.sums)


def test_imatrix_channels_follow_seed_order():
    im = mlb.Imatrix(2, 32, 64, 96, 1, 1, np.arange(2 * (32 + 96 + 32 + 64) + 32, dtype=np.float64))
    # per layer: wq/wk/wv input (dim), wo input (q_dim), w1/w3 input (dim), w2 input (hidden)
    s = 32 + 96 + 32 + 64
    assert np.array_equal(im.channels(1, "attn"), np.arange(s, s + 32))
    assert np.array_equal(im.channels(1, "wo"), np.arange(s + 32, s + 128))
    assert np.array_equal(im.channels(0, "ffn"), np.arange(128, 160))
    assert np.array_equal(im.channels(0, "w2"), np.arange(160, 224))
    assert np.array_equal(im.channels(None, "cls"), np.arange(2 * s, 2 * s + 32))


def _bad_mli(tmp_path, kind) -> Path:
    im = imatrix_for(SMALL)
    p = tmp_path / "a.mli"
    mlb.write_imatrix(p, im)
    raw = bytearray(p.read_bytes())
    if kind == "magic":
        raw[:4] = b"MLB1"
    elif kind == "version":
        raw[4:8] = struct.pack("<I", 2)
    elif kind == "short_body":
        del raw[-8:]
    elif kind == "long_body":
        raw += bytes(8)
    elif kind == "odd_length":
        del raw[-3:]
    elif kind == "short_header":
        del raw[39:]
    elif kind == "header_dims":
        raw[12:16] = struct.pack("<I", 64)
    elif kind == "nan_sum":
        raw[40:48] = struct.pack("<d", float("nan"))
    elif kind == "negative_sum":
        raw[48:56] = struct.pack("<d", -1.0)
    elif kind == "empty":
        raw = bytearray()
    p.write_bytes(bytes(raw))
    return p


@pytest.mark.parametrize(
    "kind",
    [
        "magic",
        "version",
        "short_body",
        "long_body",
        "odd_length",
        "short_header",
        "header_dims",
        "nan_sum",
        "negative_sum",
        "empty",
    ],
)
def test_read_imatrix_refuses(tmp_path, kind):
    p = _bad_mli(tmp_path, kind)
    with pytest.raises(mlb.MLBError) as e:
        mlb.read_imatrix(p)
    assert str(p) in str(e.value)


def test_read_imatrix_missing(tmp_path):
    with pytest.raises(mlb.MLBError):
        mlb.read_imatrix(tmp_path / "none.mli")


def test_write_imatrix_refuses_wrong_length(tmp_path):
    im = imatrix_for(SMALL)
    im.sums = im.sums[:-1]
    with pytest.raises(mlb.MLBError):
        mlb.write_imatrix(tmp_path / "a.mli", im)
    assert _listing(tmp_path) == []


def test_imatrix_is_used_and_zero_tokens_ignore_it(tmp_path):
    header, arrays = model(seed=5, wtype=2)
    mlb.write(tmp_path / "plain.mlb", header, arrays)
    mlb.write(tmp_path / "im.mlb", header, arrays, imatrix=imatrix_for(SMALL, seed=9))
    unused = imatrix_for(SMALL, seed=9, tokens=0, tokens_cls=0)
    mlb.write(tmp_path / "unused.mlb", header, arrays, imatrix=unused)
    plain, im, zero = (mlb.read(tmp_path / f) for f in ("plain.mlb", "im.mlb", "unused.mlb"))
    assert (tmp_path / "unused.mlb").read_bytes() == (tmp_path / "plain.mlb").read_bytes()
    differs = [
        k
        for k in ("layers.0.wq", "layers.0.wo", "layers.0.w1", "layers.0.w2", "wcls")
        if np.asarray(plain.matrix(k)[2]).tobytes() != np.asarray(im.matrix(k)[2]).tobytes()
    ]
    assert len(differs) >= 3, differs
    # tok_emb (unshared) and every F32 array never take the imatrix
    assert np.asarray(plain.arrays["tok_emb.q"]).tobytes() == np.asarray(im.arrays["tok_emb.q"]).tobytes()
    assert np.asarray(plain.arrays["tok_emb.d"]).tobytes() == np.asarray(im.arrays["tok_emb.d"]).tobytes()


def test_imatrix_has_no_effect_on_q8_models(tmp_path):
    header, arrays = model(seed=6)
    mlb.write(tmp_path / "a.mlb", header, arrays)
    mlb.write(tmp_path / "b.mlb", header, arrays, imatrix=imatrix_for(SMALL))
    assert (tmp_path / "a.mlb").read_bytes() == (tmp_path / "b.mlb").read_bytes()
