"""The bitnet runtime's embeddings group (backends/bitnet/src/embed.c, gguf.c) against the NumPy
reference (backends/reference/bitnet.py), through cffi in ABI mode.

The library is built with backends/native/build.py into a temporary folder once per module. The
models are the tiny checkpoints of tools/bitnet_models.py (hidden_size 128, so every projection
is I2_S-packable) converted by tools/convert_bitnet.convert to f32, f16 and i2_s GGUFs.

(1) ml_embed vs reference.bitnet.embed: both flavors x three outtypes, 1 / 5 / 12 tokens (12 is
    beyond Gemma's sliding window 8), mean / cls / last pooling and the GGUF's own, normalize on
    and off. Tolerance: max |C - ref| <= REL_TOL x max |ref| and cosine >= COS_MIN (the float
    operations are the reference's except the order of the attention sums and libm's expf/tanhf
    against NumPy's; measured worst ~3e-7 relative). `pytest -s` prints the worst per file.
(2) threads 1, 2 and 0 (cores) give identical bits.
(3) refusals: arguments (ML_E_ARG), a missing file (ML_E_IO), truncations and malformed GGUF
    structure (ML_E_FORMAT), edits of a valid GGUF by patching its bytes (a tensor's type, a
    missing tensor or key, an unsupported architecture, a NaN in an f32 or f16 weight, code 3 or
    a non-finite scale in an I2_S payload -> ML_E_FORMAT; a wrong shape or hyper-parameter ->
    ML_E_SHAPE), each reason naming the file and the tensor or key.
(4) AddressSanitizer + UBSan build: a C driver loads every valid model and embeds with every
    pooling, then loads every malformed file and random byte mutations; leak detection on, no
    report allowed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

cffi = pytest.importorskip("cffi")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

from mlconf.backends import NumericError  # noqa: E402
from mlconf.backends.native import abi  # noqa: E402
from mlconf.backends.reference import bitnet  # noqa: E402
from mlconf.compare import distances, within  # noqa: E402
from mlconf.tools import bitnet_models  # noqa: E402
from mlconf.tools.convert_bitnet import convert, register_i2s  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "backends" / "native"
FLAVORS = ("qwen3", "gemma3_text")
OUTTYPES = ("f32", "f16", "i2_s")
TOKENS = [5, 17, 3, 42, 99, 7, 250, 11, 64, 128, 1, 33]  # 12 > Gemma's sliding window 8
SEQS = (TOKENS[:1], TOKENS[:5], TOKENS)
POOLS = {"mean": 1, "cls": 2, "last": 3}
ML_OK, ML_E_IO, ML_E_FORMAT, ML_E_SHAPE, ML_E_ARG = 0, 1, 2, 3, 4
ML_POOL_MODEL = -1
REL_TOL = 1e-4  # max abs diff relative to the reference vector's max abs (lead: final value)
COS_MIN = 0.99999


def _build_module():
    spec = importlib.util.spec_from_file_location("mlbitnet_build", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Lib:
    """The embeddings group with Python values in and out."""

    def __init__(self, path: Path):
        self.ffi = cffi.FFI()
        self.ffi.cdef(abi.CDEF)
        self.lib = self.ffi.dlopen(str(path))

    def load(self, path, threads: int = 1, reading: str | None = None):
        """(status, embedder or None, reason); a reading through ml_embed_load_reading."""
        out = self.ffi.new("ml_embedder **")
        reason = self.ffi.new("char[1024]")
        if reading is None:
            rc = self.lib.ml_embed_load(str(path).encode(), threads, out, reason, 1024)
        else:
            rc = self.lib.ml_embed_load_reading(
                str(path).encode(), threads, abi.READING_CODES[reading], out, reason, 1024
            )
        if rc != ML_OK:
            assert out[0] == self.ffi.NULL
            return rc, None, self.ffi.string(reason).decode()
        return rc, self.ffi.gc(out[0], self.lib.ml_embed_free), ""

    def embed(self, e, tokens, pooling: int, normalize: bool) -> tuple[int, np.ndarray]:
        out = np.full(self.lib.ml_embed_dim(e), np.nan, np.float32)
        toks = self.ffi.new("int32_t[]", list(tokens) or [0])
        rc = self.lib.ml_embed(
            e, toks, len(tokens), pooling, int(normalize), self.ffi.cast("float *", out.ctypes.data)
        )
        return rc, out


@pytest.fixture(scope="module")
def build_mod():
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the bitnet library")
    return _build_module()


@pytest.fixture(scope="module")
def lib(build_mod, tmp_path_factory) -> Lib:
    so = build_mod.build(tmp_path_factory.mktemp("mlbitnet") / "libmlbitnet.so", lib="mlbitnet")
    return Lib(so)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, bitnet.BitnetModel]]:
    """(flavor, outtype) -> (GGUF path, reference model)."""
    out = {}
    for flavor in FLAVORS:
        d = tmp_path_factory.mktemp(flavor)
        ck = bitnet_models.build(flavor, d / "ckpt", seed=3, pooling="lasttoken", hidden_size=128)
        for ot in OUTTYPES:
            p = d / f"m-{ot}.gguf"
            convert(ck, p, ot)
            out[flavor, ot] = (p, bitnet.load_gguf(p))
    return out


# ---------------------------------------------------------------- (1) against the reference
def _cmp(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    g, w = got.astype(np.float64), want.astype(np.float64)
    return rel, float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w)))


# (outtype, reading): each file in its own reading (None), and the float files in the ternary one
READS = [
    ("f32", None),
    ("f16", None),
    ("i2_s", None),
    ("f32", "ternary"),
    ("f16", "ternary"),
    ("i2_s", "float"),
]


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype, reading", READS)
def test_embed_matches_reference(lib, models, flavor, outtype, reading):
    """Ternary readings: within REL_TOL / COS_MIN. Float readings of F16 files round each input to
    f16, which turns an ulp of summation order into an f16 step now and then: those are held to
    specs/tolerances.yaml embeddings_float_vs_reference (the suite's bound)."""
    path, ref = models[flavor, outtype]
    rc, e, reason = lib.load(path, threads=2, reading=reading)
    assert rc == ML_OK, reason
    assert lib.lib.ml_embed_dim(e) == ref.hp["dim"]
    assert lib.lib.ml_embed_vocab(e) == ref.tensors["token_embd.weight"].shape[0]
    effective = reading or ref.reading
    worst_rel, worst_cos, worst_nmse, bad = 0.0, 1.0, 0.0, []
    for toks in SEQS:
        for pool, pid in POOLS.items():
            for normalize in (False, True):
                want = bitnet.embed(ref, toks, pooling=pool, normalize=normalize, reading=reading)
                rc, got = lib.embed(e, toks, pid, normalize)
                assert rc == ML_OK
                rel, cos = _cmp(got, want)
                d = distances(got, want)
                worst_rel, worst_cos = max(worst_rel, rel), min(worst_cos, cos)
                worst_nmse = max(worst_nmse, d["nmse"])
                if effective == "float" and outtype == "f16":
                    if not within("embeddings_float_vs_reference", d)[0]:
                        bad.append((len(toks), pool, normalize, d["nmse"]))
                elif rel > REL_TOL or cos < COS_MIN:
                    bad.append((len(toks), pool, normalize, rel, cos))
                if normalize:
                    assert abs(np.linalg.norm(got.astype(np.float64)) - 1) < 1e-6
    print(
        f"\n{flavor} {outtype} {effective}: worst max|diff|/max|ref| = {worst_rel:.3g}, worst cosine = "
        f"{worst_cos:.9f}, worst nmse {worst_nmse:.3g}"
    )
    assert not bad, bad


@pytest.mark.parametrize("flavor", FLAVORS)
def test_teacher_matches_reference_and_refuses_the_ternary_reading(lib, tmp_path, flavor):
    """A teacher GGUF (no per-projection norms, rows of 64: no I2_S) reads float, as the reference;
    the ternary reading is ML_E_ARG with the reason."""
    ck = bitnet_models.build(
        flavor,
        tmp_path / "t",
        seed=3,
        pooling="mean",
        teacher=True,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    for ot in ("f32", "f16"):
        p = tmp_path / f"t-{ot}.gguf"
        convert(ck, p, ot)
        ref = bitnet.load_gguf(p)
        rc, e, reason = lib.load(p, threads=2)
        assert rc == ML_OK, reason
        for toks in SEQS:
            rc, got = lib.embed(e, toks, POOLS["mean"], False)
            assert rc == ML_OK
            d = distances(got, bitnet.embed(ref, toks, pooling="mean"))
            assert within("embeddings_float_vs_reference", d)[0], (ot, len(toks), d)
        rc, _, reason = lib.load(p, reading="ternary")
        assert rc == ML_E_ARG and "reading ternary needs a BitNet student" in reason and str(p) in reason


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype", ("f32", "i2_s"))
def test_long_sequences_agree(lib, models, flavor, outtype):
    """150 to 200 tokens (softmax sums beyond NumPy's 128-element pairwise block, many sliding
    windows). Here a few int8 activations land within the float noise of a rounding boundary
    and flip by one step (the attention sums' order and expf differ from NumPy's), each moving
    the output by up to ~1/127 of its scale: over 40 random sequences of 20 to 200 tokens per
    model, ~15% exceed 1e-4 relative, worst ~1.4e-2, cosine >= 0.99993.
    The looser bound still catches a wrong mask, RoPE position or pooling."""
    path, ref = models[flavor, outtype]
    _, e, _ = lib.load(path, threads=2)
    rng = np.random.default_rng(7)
    worst_rel, worst_cos = 0.0, 1.0
    for n in (150, 200):
        toks = [int(t) for t in rng.integers(0, lib.lib.ml_embed_vocab(e), n)]
        for pool in ("mean", "last"):
            rc, got = lib.embed(e, toks, POOLS[pool], False)
            assert rc == ML_OK
            rel, cos = _cmp(got, bitnet.embed(ref, toks, pooling=pool))
            worst_rel, worst_cos = max(worst_rel, rel), min(worst_cos, cos)
    print(f"\n{flavor} {outtype} long: worst rel {worst_rel:.3g}, worst cosine {worst_cos:.9f}")
    assert worst_rel < 5e-2 and worst_cos > 0.9995


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_short_sliding_windows_match_reference(lib, tmp_path, window):
    """Gemma sliding windows shorter than the query tile (attn.h I2S_ATT_QTILE), so that a tile's
    queries see different keys: every query keeps exactly its own keys."""
    ck = bitnet_models.build("gemma3_text", tmp_path / "ckpt", seed=5, pooling="mean", sliding_window=window)
    path = tmp_path / "m.gguf"
    convert(ck, path, "f32")
    ref = bitnet.load_gguf(path)
    _, e, _ = lib.load(path, threads=2)
    for toks in (TOKENS[:4], TOKENS[:7], TOKENS):
        for pool in POOLS:
            rc, got = lib.embed(e, toks, POOLS[pool], False)
            assert rc == ML_OK
            rel, cos = _cmp(got, bitnet.embed(ref, toks, pooling=pool))
            assert rel < REL_TOL and cos > COS_MIN, (window, len(toks), pool, rel, cos)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_model_pooling_is_the_gguf_pooling_type(lib, models, flavor):
    path, ref = models[flavor, "i2_s"]
    assert ref.hp["pooling"] == "last"
    _, e, _ = lib.load(path)
    for normalize in (False, True):
        rc, a = lib.embed(e, TOKENS, ML_POOL_MODEL, normalize)
        rc2, b = lib.embed(e, TOKENS, POOLS["last"], normalize)
        assert rc == rc2 == ML_OK
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- (2) threads
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype", ("f32", "f16", "i2_s"))
def test_threads_give_identical_bits(lib, models, flavor, outtype):
    path, _ = models[flavor, outtype]
    outs = []
    for threads in (1, 2, 3, 0):
        rc, e, reason = lib.load(path, threads)
        assert rc == ML_OK, reason
        outs.append([lib.embed(e, toks, pid, True)[1] for toks in SEQS for pid in POOLS.values()])
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("outtype", ("i2_s", "f16", "f32"))
def test_every_isa_gives_identical_bits(lib, models, flavor, outtype):
    """The kernel table is chosen at load (ml_set_isa before ml_embed_load); the integer dots,
    int8 activations and the float dots (one fixed order) are identical on every ISA, so the
    embeddings are too, in the ternary reading (i2_s) and the float one (f16, f32)."""
    default = lib.ffi.string(lib.lib.ml_isa())
    got = {}
    try:
        for isa in (b"scalar", b"avx2", b"avxvnni", b"avx512", b"neon"):
            if lib.lib.ml_set_isa(isa) != ML_OK:
                continue
            _, e, _ = lib.load(models[flavor, outtype][0], threads=2)
            got[isa] = [lib.embed(e, toks, POOLS["mean"], False)[1].tobytes() for toks in SEQS]
    finally:
        assert lib.lib.ml_set_isa(default) == ML_OK
    assert b"scalar" in got
    print(f"\n{flavor}: ISAs compared: {sorted(got)}")
    for isa, v in got.items():
        assert v == got[b"scalar"], isa


# ---------------------------------------------------------------- (3) refusals: arguments
def test_argument_refusals(lib, models):
    _, e, _ = lib.load(models["qwen3", "f32"][0])
    vocab = lib.lib.ml_embed_vocab(e)
    for toks, pool in (
        ([], 1),
        ([-1], 1),
        ([vocab], 1),
        ([1, 2, vocab + 5], 1),
        ([1], 0),
        ([1], 4),
        ([1], -2),
    ):
        rc, out = lib.embed(e, toks, pool, False)
        assert rc == ML_E_ARG, (toks, pool)
        assert np.isnan(out).all()  # nothing written
    ffi = lib.ffi
    buf = np.zeros(lib.lib.ml_embed_dim(e), np.float32)
    toks = ffi.new("int32_t[]", [1, 2])
    assert lib.lib.ml_embed(ffi.NULL, toks, 2, 1, 0, ffi.cast("float *", buf.ctypes.data)) == ML_E_ARG
    assert lib.lib.ml_embed(e, ffi.NULL, 2, 1, 0, ffi.cast("float *", buf.ctypes.data)) == ML_E_ARG
    assert lib.lib.ml_embed(e, toks, 2, 1, 0, ffi.NULL) == ML_E_ARG
    out = ffi.new("ml_embedder **")
    assert lib.lib.ml_embed_load(ffi.NULL, 1, out, ffi.NULL, 0) == ML_E_ARG
    assert lib.lib.ml_embed_load(b"x.gguf", 1, ffi.NULL, ffi.NULL, 0) == ML_E_ARG
    rc, _, reason = lib.load(models["qwen3", "f32"][0], threads=-1)
    assert rc == ML_E_ARG and "threads -1" in reason
    assert lib.lib.ml_embed_dim(ffi.NULL) == 0 and lib.lib.ml_embed_vocab(ffi.NULL) == 0
    lib.lib.ml_embed_free(ffi.NULL)


# ---------------------------------------------------------------- (3) refusals: files
def test_missing_file_and_directory(lib, tmp_path):
    rc, _, reason = lib.load(tmp_path / "nope.gguf")
    assert rc == ML_E_IO and "nope.gguf" in reason
    rc, _, reason = lib.load(tmp_path)
    assert rc == ML_E_IO and str(tmp_path) in reason


def _after_string(buf: bytes, s: str) -> int:
    """Offset just past the GGUF string s (u64 length + bytes), which must occur once."""
    pat = struct.pack("<Q", len(s)) + s.encode()
    i = buf.find(pat)
    assert i >= 0 and buf.find(pat, i + 1) < 0, s
    return i + len(pat)


def _info(buf: bytes, name: str) -> dict:
    """Offsets of the fields of tensor info `name`."""
    p = _after_string(buf, name)
    nd = struct.unpack_from("<I", buf, p)[0]
    return dict(
        name=p - len(name),
        n_dims=p,
        dims=p + 4,
        type=p + 4 + 8 * nd,
        offset=p + 8 + 8 * nd,
        dims_val=struct.unpack_from(f"<{nd}Q", buf, p + 4),
    )


def _data_offset(path: Path, name: str) -> int:
    register_i2s()
    r = gguf.GGUFReader(str(path))
    return next(int(t.data_offset) for t in r.tensors if t.name == name)


def _patched(src: Path, dst: Path, edits: list[tuple[int, bytes]]) -> Path:
    b = bytearray(src.read_bytes())
    for off, data in edits:
        b[off : off + len(data)] = data
    dst.write_bytes(bytes(b))
    return dst


def _edit_cases(models) -> list[tuple[str, Path, list, int, list[str]]]:
    """(case id, source GGUF, byte edits, status, substrings of the reason)."""
    q32, q16, qi2 = (models["qwen3", ot][0] for ot in OUTTYPES)
    g32 = models["gemma3_text", "f32"][0]
    b32, bi2, bg = q32.read_bytes(), qi2.read_bytes(), g32.read_bytes()
    b16 = q16.read_bytes()
    arch = _after_string(b32, "general.architecture")  # then u32 type, u64 len, "qwen3"
    up = _info(b32, "blk.0.ffn_up.weight")
    vi2 = _info(bi2, "blk.1.attn_v.weight")
    norm = _info(b32, "blk.0.attn_norm.weight")
    ff = _after_string(b32, "qwen3.feed_forward_length")
    i2_off = _data_offset(qi2, "blk.1.attn_v.weight")
    rows, cols = vi2["dims_val"][1], vi2["dims_val"][0]
    pat = _after_string(bg, "gemma3.attention.sliding_window_pattern")
    return [
        (
            "unsupported_architecture",
            q32,
            [(arch + 12, b"llama")],
            ML_E_FORMAT,
            ["general.architecture", "llama"],
        ),
        (
            "tensor_type_q8_0",
            q32,
            [(up["type"], struct.pack("<I", 8))],  # Q8_0's size puts the next tensor off its place
            ML_E_FORMAT,
            ["blk.0.ffn_down.weight", "gguf.tensor.layout"],
        ),
        (
            "projection_type_i2s_for_norm",
            qi2,
            # I2_S's size puts the next tensor off its place
            [(_info(bi2, "blk.0.attn_norm.weight")["type"], struct.pack("<I", 36))],
            ML_E_FORMAT,
            ["blk.0.attn_q.weight", "gguf.tensor.layout"],
        ),
        (
            "missing_tensor",
            q32,
            [(up["name"] + len("blk.0.ffn_u"), b"q")],
            ML_E_FORMAT,
            ["missing tensor blk.0.ffn_up.weight"],
        ),
        (
            "missing_key",
            q32,
            [(_after_string(b32, "qwen3.block_count") - 5, b"C")],
            ML_E_FORMAT,
            ["missing key qwen3.block_count"],
        ),
        (
            "nan_in_f32_projection",
            q32,
            [(_data_offset(q32, "blk.1.attn_v.weight") + 4 * 37, struct.pack("<f", float("nan")))],
            ML_E_FORMAT,
            ["blk.1.attn_v.weight", "element 37", "not finite"],
        ),
        (
            "inf_in_f32_norm",
            q32,
            [(_data_offset(q32, "blk.1.ffn_down_norm_in.weight") + 4 * 3, struct.pack("<f", float("inf")))],
            ML_E_FORMAT,
            ["blk.1.ffn_down_norm_in.weight", "element 3"],
        ),
        (
            "nan_in_f16_token_embd",
            q16,
            [(_data_offset(q16, "token_embd.weight") + 2 * 1000, struct.pack("<H", 0x7E00))],
            ML_E_FORMAT,
            ["token_embd.weight", "element 1000"],
        ),
        # byte 33 = block 1, j = 1; bits 1..0 (element 128 + 1 + 96) = 3
        (
            "i2s_code_3",
            qi2,
            [(i2_off + 33, b"\x57")],
            ML_E_FORMAT,
            ["blk.1.attn_v.weight", "code 3", "element 225"],
        ),
        (
            "i2s_nan_scale",
            qi2,
            [(i2_off + rows * cols // 4, struct.pack("<f", float("nan")))],
            ML_E_FORMAT,
            ["blk.1.attn_v.weight", "scale"],
        ),
        (
            "norm_shape",
            q32,
            [(norm["dims"], struct.pack("<Q", 64))],  # a shorter norm: the next tensor is off its place
            ML_E_FORMAT,
            ["blk.0.attn_q.weight", "gguf.tensor.layout"],
        ),
        (
            "i2s_shape",
            qi2,
            [(vi2["dims"], struct.pack("<QQ", cols // 2, rows * 2))],
            ML_E_SHAPE,
            ["blk.1.attn_v.weight"],
        ),
        (
            "feed_forward_length",
            q32,
            [(ff + 4, struct.pack("<I", 256))],
            ML_E_SHAPE,
            ["blk.0.ffn_gate.weight", "256"],
        ),
        (
            "head_count_kv_not_divisor",
            q32,
            [(_after_string(b32, "qwen3.attention.head_count_kv") + 4, struct.pack("<I", 3))],
            ML_E_SHAPE,
            ["head_count_kv"],
        ),
        (
            "key_type_f32",
            q32,
            [(_after_string(b32, "qwen3.block_count"), struct.pack("<I", 6))],
            ML_E_FORMAT,
            ["qwen3.block_count", "f32"],
        ),  # u32 -> f32: an integer is required
        # [bool, bool] -> [u16]: the same bytes, one entry for two layers
        (
            "sliding_pattern_short",
            g32,
            [(pat + 4, struct.pack("<IQ", 2, 1))],
            ML_E_FORMAT,
            ["gemma3.attention.sliding_window_pattern", "1 entries"],
        ),
        (
            "duplicate_tensor",
            q32,
            [(_info(b32, "blk.0.attn_k.weight")["name"] + len("blk.0.attn_"), b"q")],
            ML_E_FORMAT,
            ["tensor blk.0.attn_q.weight occurs twice", "gguf.duplicate_tensor"],
        ),
        ("version_1", q32, [(4, struct.pack("<I", 1))], ML_E_FORMAT, ["version 1"]),
        ("bad_magic", q32, [(0, b"GGUX")], ML_E_FORMAT, ["magic"]),
        ("huge_kv_count", q32, [(16, struct.pack("<Q", 2**62))], ML_E_FORMAT, ["kv pairs", "gguf.counts"]),
        ("huge_tensor_count", q32, [(8, struct.pack("<Q", 2**63))], ML_E_FORMAT, ["gguf.counts"]),
        (
            "huge_string_length",
            q32,
            [(arch + 4, struct.pack("<Q", 2**63 + 5))],
            ML_E_FORMAT,
            ["general.architecture", "truncated"],
        ),
        ("n_dims_5", q32, [(norm["n_dims"], struct.pack("<I", 5))], ML_E_FORMAT, ["dimensions"]),
        (
            "huge_dims",
            q32,
            [(norm["dims"], struct.pack("<Q", 2**62))],
            ML_E_FORMAT,
            ["blk.0.attn_norm.weight", "gguf.tensor.size"],
        ),
        ("unaligned_offset", q32, [(norm["offset"], struct.pack("<Q", 4))], ML_E_FORMAT, ["alignment"]),
        (
            "tensor_past_end",
            q16,
            [(_info(b16, "output_norm.weight")["offset"], struct.pack("<Q", (len(b16) // 32 + 1) * 32))],
            ML_E_FORMAT,
            ["output_norm.weight", "gguf.tensor.layout"],
        ),
        (
            "unknown_value_type",
            q32,
            [(_after_string(b32, "qwen3.block_count"), struct.pack("<I", 13))],
            ML_E_FORMAT,
            ["qwen3.block_count", "value type 13"],
        ),
    ]


def test_patched_files_are_refused(lib, models, tmp_path):
    wrong = []
    for case, src, edits, status, words in _edit_cases(models):
        p = _patched(src, tmp_path / f"{case}.gguf", edits)
        rc, _, reason = lib.load(p)
        if rc != status or not reason.startswith(str(p)) or not all(w in reason for w in words):
            wrong.append((case, rc, status, reason))
        print(f"{case}: {rc} {reason[len(str(p)) + 2 :]}")
    assert not wrong, "\n".join(map(str, wrong))


def test_overflowing_model_is_refused_at_embed(lib, models, tmp_path):
    """Finite but huge norm weights (3e38) overflow the activations to inf, then NaN in the next
    norm: the reference refuses them with NumericError and ml_embed with ML_E_FORMAT (decision
    forward.nonfinite), leaving out untouched."""
    src, _ = models["qwen3", "f32"]
    off = _data_offset(src, "blk.0.attn_norm.weight")
    p = _patched(src, tmp_path / "huge_norm.gguf", [(off, struct.pack("<128f", *[3e38] * 128))])
    rc, e, reason = lib.load(p)
    assert rc == ML_OK, reason
    rc, out = lib.embed(e, TOKENS[:3], POOLS["mean"], True)
    assert rc == ML_E_FORMAT and np.isnan(out).all()
    with (
        pytest.raises(NumericError, match="non-finite activation"),
        np.errstate(over="ignore", invalid="ignore"),
    ):
        bitnet.embed(bitnet.load_gguf(p), TOKENS[:3], pooling="mean")


def test_truncated_files_are_refused(lib, models, tmp_path):
    for flavor, ot in (("qwen3", "f32"), ("gemma3_text", "i2_s")):
        data = models[flavor, ot][0].read_bytes()
        n_tensor_infos = _info(data, "token_embd.weight")["name"]
        for cut in (0, 3, 7, 15, 23, 200, len(data) // 8, n_tensor_infos + 10, len(data) // 2, len(data) - 1):
            p = tmp_path / f"{flavor}-{ot}-{cut}.gguf"
            p.write_bytes(data[:cut])
            rc, _, reason = lib.load(p)
            assert rc == ML_E_FORMAT, (cut, rc, reason)
            assert reason.startswith(str(p)), reason


def test_i2s_rows_need_whole_blocks(lib, tmp_path):
    """hidden_size 64 (the default tiny shape): the f32 projections' rows of 64 values read float
    (the file's own reading) but cannot be ternarized into I2_S blocks: the ternary reading is
    ML_E_SHAPE naming the tensor."""
    ck = bitnet_models.build("qwen3", tmp_path / "ck", seed=1, pooling=None)
    convert(ck, tmp_path / "m.gguf", "f32")
    rc, _, reason = lib.load(tmp_path / "m.gguf")
    assert rc == ML_OK, reason
    rc, _, reason = lib.load(tmp_path / "m.gguf", reading="ternary")
    assert rc == ML_E_SHAPE and "blk.0.attn_q.weight" in reason and "128" in reason, reason


# ---------------------------------------------------------------- (4) sanitizers
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mlrt.h"

int main(void) {
    char path[4096], reason[512];
    const int32_t toks[12] = {5, 17, 3, 42, 99, 7, 250, 11, 64, 128, 1, 33};
    const int32_t pools[4] = {ML_POOL_MODEL, ML_POOL_MEAN, ML_POOL_CLS, ML_POOL_LAST};
    while (fgets(path, sizeof path, stdin)) {
        path[strcspn(path, "\n")] = 0;
        ml_embedder *e = NULL;
        reason[0] = 0;
        int rc = ml_embed_load(path, 2, &e, reason, sizeof reason);
        int erc = 0;
        double sum = 0;
        if (rc == ML_OK) {
            int32_t dim = ml_embed_dim(e);
            float *out = malloc((size_t)dim * sizeof *out);
            for (int n = 1; n <= 12; n += 11)
                for (int p = 0; p < 4; p++) {
                    erc |= ml_embed(e, toks, n, pools[p], p & 1, out);
                    for (int32_t i = 0; i < dim; i++) sum += out[i];
                }
            free(out);
            ml_embed_free(e);
        }
        for (char *c = reason; *c; c++)
            if ((unsigned char)*c < 32 || (unsigned char)*c > 126) *c = '?'; /* one line, ASCII */
        printf("%d\t%d\t%g\t%s\n", rc, erc, sum, reason);
    }
    return 0;
}
"""


def _asan_runtime() -> Path | None:
    r = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, encoding="utf-8")
    p = Path(r.stdout.strip())
    return p.resolve() if r.returncode == 0 and p.is_absolute() and p.exists() else None


def _mutations(src: Path, folder: Path, n: int, seed: int) -> list[Path]:
    """n copies of src with 1..4 random bytes overwritten: mostly before the data section (header,
    kv pairs, tensor infos), some in the tensor data; every fifth copy truncated at random."""
    rng = np.random.default_rng(seed)
    data = src.read_bytes()
    start = _data_offset(src, "token_embd.weight")  # the first tensor: the data section
    out = []
    for i in range(n):
        b = bytearray(data)
        if i % 5 == 4:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for _ in range(int(rng.integers(1, 5))):
                hi = start if rng.random() < 0.8 else len(b)
                b[int(rng.integers(0, hi))] = int(rng.integers(0, 256))
        p = folder / f"{src.stem}-mut{i}.gguf"
        p.write_bytes(bytes(b))
        out.append(p)
    return out


@pytest.mark.slow
def test_sanitizer_build(build_mod, models, tmp_path):
    asan = _asan_runtime()
    if asan is None:
        pytest.skip("the ASan runtime (gcc -print-file-name=libasan.so) is not installed")
    so = build_mod.build(tmp_path / "libmlbitnet.so", lib="mlbitnet", sanitize=True)
    src = tmp_path / "driver.c"
    src.write_text(DRIVER, encoding="utf-8")
    exe = tmp_path / "driver"
    cmd = [
        "gcc",
        "-std=c11",
        "-g",
        "-fsanitize=address,undefined",
        "-I",
        str(NATIVE / "include"),
        str(src),
        str(so),
        f"-Wl,-rpath,{so.parent}",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, encoding="utf-8")
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    valid = [models[k][0] for k in sorted(models)]
    bad = [_patched(s, tmp_path / f"{c}.gguf", ed) for c, s, ed, _, _ in _edit_cases(models)]
    muts = _mutations(models["qwen3", "i2_s"][0], tmp_path, 60, 1) + _mutations(
        models["gemma3_text", "f16"][0], tmp_path, 60, 2
    )
    paths = valid + bad + muts
    env = dict(
        os.environ,
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    env.pop("LD_PRELOAD", None)
    r = subprocess.run(
        [str(exe)],
        input="".join(f"{p}\n" for p in paths),
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        env=env,
        timeout=600,
    )
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        assert marker not in r.stderr, r.stderr[-4000:]
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(paths)
    for p, line in zip(paths, lines, strict=True):
        rc, erc, _, reason = line.split("\t", 3)
        if p in valid:
            assert (rc, erc) == ("0", "0"), (p, line)
        elif p in bad:
            assert rc != "0" and reason.startswith(str(p)), (p, line)
        else:
            assert rc in ("0", "1", "2", "3"), (p, line)
