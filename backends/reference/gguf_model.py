"""The reference check of a BitNet embedding GGUF: the container (gguf_file.py), then every
bitnet.* rule of specs/gguf.yaml in its reading order (the keys, then the tensors as the forward
reads them: token_embd, the per-projection norms, each layer, output_norm).

``load(path)`` is the reference's ``load_gguf``: a LoadResult with the status, the rule and a
reason naming the file, the field and the value. bitnet.load_gguf runs ``check`` first, so the
reference's embedder reads only files this accepts.
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np

from mlconf.tools import files

from ..base import LoadResult
from .gguf_file import ARRAY, I2S, SCALAR, STRING, VALUE_TYPES, GgufError, GgufFile, array, parse, scalar

LIMIT_DIM, LIMIT_HEADS, LIMIT_LAYERS, LIMIT_VOCAB = 65536, 4096, 4096, 1 << 24
PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
INTS = (0, 1, 2, 3, 4, 5, 10, 11)  # integer value types (not bool)
F32, F16 = 0, 1


class _Model:
    def __init__(self, g: GgufFile, data: bytes):
        self.g, self.data = g, data

    def key_int(self, arch: str, suffix: str, default: int | None, lo: int, hi: int) -> int:
        key = f"{arch}.{suffix}"
        kv = self.g.kv(key)
        if kv is None:
            if default is None:
                raise GgufError("bitnet.key", f"missing key {key}")
            v = default
        else:
            v = scalar(kv) if kv.type in INTS else None
            if v is None or (kv.type == 10 and v >= 1 << 63):
                raise GgufError(
                    "bitnet.key",
                    f"key {key} has type {VALUE_TYPES[kv.type]}, an integer is required",
                )
        if not lo <= v <= hi:
            raise GgufError("bitnet.key_range", f"key {key} = {v} is outside [{lo}, {hi}]")
        return v

    def key_float(self, arch: str, suffix: str, required: bool) -> float | None:
        key = f"{arch}.{suffix}"
        kv = self.g.kv(key)
        if kv is None:
            if required:
                raise GgufError("bitnet.key", f"missing key {key}")
            return None
        ok = kv.type in (6, 12) or (kv.type in INTS and not (kv.type == 10 and scalar(kv) >= 1 << 63))
        if not ok:
            raise GgufError("bitnet.key", f"key {key} has type {VALUE_TYPES[kv.type]}, a number is required")
        v = float(scalar(kv))
        if not math.isfinite(v) or v < 0:
            raise GgufError("bitnet.key_value", f"key {key} = {v} is not a finite non-negative number")
        return v

    def tensor(self, name: str, proj: bool, dims: tuple[int, ...]):
        t = self.g.tensor(name)
        if t is None:
            raise GgufError("bitnet.tensor_missing", f"missing tensor {name}")
        if t.type not in ((F32, F16, I2S) if proj else (F32, F16)):
            raise GgufError(
                "bitnet.tensor_type",
                f"tensor {name} has type {t.type}, expected {'F32, F16 or I2_S' if proj else 'F32 or F16'}",
            )
        if tuple(t.dims) != dims:
            raise GgufError(
                "bitnet.tensor_shape",
                f"tensor {name} has shape {t.dims}, the hyper-parameters imply {list(dims)} (ggml order)",
            )
        return t

    def values(self, t) -> np.ndarray:
        start = self.g.data_offset + t.offset
        return np.frombuffer(self.data, "<f4" if t.type == F32 else "<f2", math.prod(t.dims), start)

    def finite(self, name: str, t) -> None:
        bad = np.flatnonzero(~np.isfinite(self.values(t)))
        if bad.size:
            raise GgufError("bitnet.finite", f"tensor {name}: element {int(bad[0])} is not finite")

    def norm(self, name: str, n: int) -> None:
        self.finite(name, self.tensor(name, False, (n,)))

    def projection(self, name: str, rows: int, cols: int, ternary: bool) -> None:
        """A projection in the file's own reading: ternary (I2_S, or any I2_S in the file: its f32
        / f16 projections are ternarized) needs whole I2_S blocks."""
        t = self.tensor(name, True, (cols, rows))
        if ternary and cols % 128:
            raise GgufError(
                "bitnet.i2s_cols",
                f"tensor {name}: rows of {cols} values, I2_S needs a multiple of 128",
            )
        if t.type != I2S:
            self.finite(name, t)
            return
        start, n = self.g.data_offset + t.offset, rows * cols // 4
        (d,) = struct.unpack_from("<f", self.data, start + n)
        if not math.isfinite(d):
            raise GgufError("bitnet.i2s_scale", f"tensor {name}: the I2_S scale {d} is not finite")
        packed = np.frombuffer(self.data, np.uint8, n, start)
        three = np.flatnonzero(packed & (packed >> 1) & 0x55)
        if three.size:
            i = int(three[0])
            v = int(packed[i] & (packed[i] >> 1) & 0x55)
            f = 0 if v & 0x40 else 1 if v & 0x10 else 2 if v & 0x04 else 3  # field 0: bits 7..6
            el = i // 32 * 128 + i % 32 + 32 * f
            raise GgufError(
                "bitnet.i2s_code",
                f"tensor {name}: code 3 at element {el} (I2_S codes are 0, 1, 2)",
            )


def _hparams(m: _Model) -> dict:
    kv = m.g.kv("general.architecture")
    if kv is None:
        raise GgufError("bitnet.arch", "missing key general.architecture")
    if kv.type != STRING:
        raise GgufError(
            "bitnet.arch",
            f"key general.architecture has type {VALUE_TYPES[kv.type]}, a string is required",
        )
    arch = scalar(kv).decode("utf-8", "replace")
    if scalar(kv) not in (b"qwen3", b"gemma3"):
        raise GgufError(
            "bitnet.arch",
            f'general.architecture "{arch[:64]}" is not supported (qwen3 or gemma3)',
        )
    dim = m.key_int(arch, "embedding_length", None, 1, LIMIT_DIM)
    nl = m.key_int(arch, "block_count", None, 1, LIMIT_LAYERS)
    ff = m.key_int(arch, "feed_forward_length", None, 1, LIMIT_DIM)
    nh = m.key_int(arch, "attention.head_count", None, 1, LIMIT_HEADS)
    nkv = m.key_int(arch, "attention.head_count_kv", nh, 1, nh)
    hd = m.key_int(arch, "attention.key_length", dim // nh, 2, LIMIT_DIM)
    m.key_int(arch, "attention.value_length", hd, hd, hd)
    m.key_int(arch, "pooling_type", 0, -(1 << 31), (1 << 31) - 1)
    if nh % nkv:
        raise GgufError(
            "bitnet.hparams",
            f"{arch}.attention.head_count {nh} is not a multiple of head_count_kv {nkv}",
        )
    if hd % 2:
        raise GgufError("bitnet.hparams", f"{arch}.attention.key_length {hd} is odd (rotate-half RoPE)")
    if nh * hd > LIMIT_DIM:
        raise GgufError("bitnet.hparams", f"head_count x key_length = {nh * hd} exceeds {LIMIT_DIM}")
    m.key_float(arch, "attention.layer_norm_rms_epsilon", True)
    base = m.key_float(arch, "rope.freq_base", False)
    if base is not None and not base > 0:
        raise GgufError(
            "bitnet.key_value",
            f"key {arch}.rope.freq_base = {base}: a RoPE base must be positive",
        )
    if arch == "gemma3":
        m.key_float(arch, "rope.freq_base_swa", False)
        m.key_float(arch, "attention.query_pre_attn_scalar", False)
        m.key_int(arch, "attention.sliding_window", 0, 0, (1 << 31) - 1)
        key = f"{arch}.attention.sliding_window_pattern"
        pat = m.g.kv(key)
        if pat is not None:
            et, n = struct.unpack_from("<IQ", pat.raw) if pat.type == ARRAY else (None, 0)
            first = array(pat)[1][0] if pat.type == ARRAY and n > 0 and et in SCALAR else None
            not_int = et not in SCALAR or et in (6, 12) or (et == 10 and first >= 1 << 63)
            if pat.type != ARRAY or (n > 0 and not_int):
                raise GgufError("bitnet.key", f"key {key} must be an array of bool")
            if n < nl:
                raise GgufError("bitnet.key", f"key {key} has {n} entries, block_count is {nl}")
    return {"arch": arch, "dim": dim, "nl": nl, "ff": ff, "nh": nh, "nkv": nkv, "hd": hd}


def _tensors(m: _Model, hp: dict) -> None:
    for t in m.g.tensors:
        if t.type not in (F32, F16, I2S):
            raise GgufError(
                "bitnet.tensor_type",
                f"tensor {t.text} has unsupported type {t.type} (F32, F16 or I2_S)",
            )
    dim, nl = hp["dim"], hp["nl"]
    tok = m.g.tensor("token_embd.weight")
    if tok is not None and len(tok.dims) != 2:
        raise GgufError(
            "bitnet.tensor_shape",
            f"tensor token_embd.weight has {len(tok.dims)} dimensions, expected 2 [{dim}, vocab]",
        )
    vocab = tok.dims[1] if tok is not None else 0
    if tok is not None and not 1 <= vocab <= LIMIT_VOCAB:
        raise GgufError(
            "bitnet.tensor_shape",
            f"tensor token_embd.weight: vocab {vocab} outside [1, {LIMIT_VOCAB}]",
        )
    m.finite("token_embd.weight", m.tensor("token_embd.weight", False, (dim, vocab)))
    qd, kvd = hp["nh"] * hp["hd"], hp["nkv"] * hp["hd"]
    rows = (qd, kvd, kvd, dim, hp["ff"], hp["ff"], dim)
    cols = (dim, dim, dim, qd, dim, dim, hp["ff"])
    projections = [m.g.tensor(f"blk.{b}.{p}.weight") for b in range(nl) for p in PROJ]
    ternary = any(t is not None and t.type == I2S for t in projections)  # the file's own reading
    norm_in = [f"blk.{b}.{p}_norm_in.weight" for b in range(nl) for p in PROJ]
    have = [n for n in norm_in if m.g.tensor(n) is not None]
    if have and len(have) < len(norm_in):
        missing = next(n for n in norm_in if m.g.tensor(n) is None)
        raise GgufError(
            "bitnet.norm_in",
            f"missing tensor {missing}: a BitNet GGUF has a per-projection norm for every projection or none",
        )
    if ternary and not have:  # I2_S projections are a student's
        raise GgufError(
            "bitnet.norm_in",
            f"missing tensor {norm_in[0]}: I2_S projections are a BitNet student's, which has a "
            "per-projection norm for every projection",
        )
    for b in range(nl):
        m.norm(f"blk.{b}.attn_norm.weight", dim)
        for i, p in enumerate(PROJ):
            if have:
                m.norm(f"blk.{b}.{p}_norm_in.weight", cols[i])
            m.projection(f"blk.{b}.{p}.weight", rows[i], cols[i], ternary)
        m.norm(f"blk.{b}.attn_q_norm.weight", hp["hd"])
        m.norm(f"blk.{b}.attn_k_norm.weight", hp["hd"])
        m.norm(f"blk.{b}.ffn_norm.weight", dim)
        if hp["arch"] == "gemma3":
            m.norm(f"blk.{b}.post_attention_norm.weight", dim)
            m.norm(f"blk.{b}.post_ffw_norm.weight", dim)
    m.norm("output_norm.weight", dim)


def check_bytes(data: bytes) -> GgufFile:
    """The file's structure when every rule holds; GgufError at the first that does not."""
    g = parse(data)
    m = _Model(g, data)
    _tensors(m, _hparams(m))
    return g


def load(path: str | os.PathLike) -> LoadResult:
    """The reference's load_gguf: the first rule of specs/gguf.yaml the file breaks, or ML_OK."""
    name = os.fspath(path)
    try:
        data = files.read_regular(path)
    except OSError as e:
        return LoadResult("ML_E_IO", f"{name}: cannot open: {files.reason(e)} [gguf.io.open]", "gguf.io.open")
    try:
        check_bytes(data)
    except GgufError as e:
        return LoadResult(e.status, f"{name}: {e.reason} [{e.rule}]", e.rule)
    return LoadResult("ML_OK", f"{name}: accepted", "")


__all__ = ["array", "check_bytes", "load"]
