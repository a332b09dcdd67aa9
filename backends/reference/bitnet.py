"""Reference forward pass of BitNet embedding models (Qwen3 / Gemma 3 bases) from GGUF.

Seed 004 (BitNet docs, bitnet-embeddings-gguf-conversion.md): every linear projection of
attention and MLP is a BitLinear: RMSNorm(x, <proj>_norm_in) -> int8 activation quant ->
matmul with ternary weights. GGUFs come from tools/convert_bitnet.py (f32, f16 or i2_s).

    model = load_gguf(path)
    vec = embed(model, [5, 17, 3], pooling=None, normalize=True)

Decisions (documented here, tested in tests/test_bitnet_reference.py):

* Linear layers, in one of two readings (decision bitnet.reading). Each projection is preceded
  by RMSNorm with its ``<proj>_norm_in`` weight when the GGUF has those tensors (a BitNet
  student), and by nothing when it has none (its float teacher, a plain Qwen3 / Gemma 3).
  - "ternary" (BitLinear): per-row int8 activation quantization, integer ternary dot and the
    float epilogue of backends/reference/i2s.py (specs/i2s.yaml). I2_S weights are read as they
    are; f32/f16 (latent) weights are ternarized at load with the I2_S writer's rule.
  - "float": plain matmul with the stored weights in float32; when a weight is F16, the
    activations are rounded to f16 first, as llama.cpp's F16 matmul converts them (its
    vec_dot_type); the products are summed in float32 in k order (portable.matmul: the same bits
    on every host). I2_S weights are dequantized (q * d).
  A file's own reading (``reading=None``) is bitnet.cpp's: ternary for I2_S, float for f32 and
  f16. The ternary reading of a float file needs the per-projection norms (a student).
* Attention is causal for both architectures (llama.cpp's qwen3 / gemma3 graphs keep
  causal_attn = true in llama-embedding; HF Qwen3Model / Gemma3TextModel are causal too), with
  Gemma 3's sliding window on the layers the GGUF marks as sliding (key j visible from query i
  when 0 <= i - j < window, transformers' convention).
* RoPE: rotate-half (NEOX) style: convert_bitnet writes HF q/k weights unpermuted. Qwen3 uses
  rope.freq_base; Gemma 3's sliding layers use rope.freq_base_swa.
* Gemma 3: embeddings x float32(sqrt(dim)); attention scale query_pre_attn_scalar ** -0.5; the
  one-centred norms are stored as 1 + w by the converter, so every norm is x_hat * w here.
* Pooling: argument, else the GGUF's pooling_type, else mean. Mean over all tokens, cls = token
  0, last = the last token. ``normalize`` divides by the L2 norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mlconf.backends.base import NumericError
from mlconf.backends.reference import gguf_model, i2s, portable
from mlconf.backends.reference.forward import gelu_tanh, rmsnorm, silu
from mlconf.backends.reference.gguf_file import GgufError

F32 = np.float32
POOLINGS = (None, "mean", "cls", "last")
_POOL_IDS = {0: None, 1: "mean", 2: "cls", 3: "last"}
PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


class BitnetError(ValueError):
    """A GGUF or an argument the reference refuses."""


READINGS = ("float", "ternary")


@dataclass
class Linear:
    """One projection: float weight (rows, cols) and/or the I2_S payload."""

    shape: tuple[int, int]
    weight: np.ndarray | None = None  # f32 weight as stored (dequantized for I2_S)
    payload: bytes | None = None  # I2_S bytes (codes + 32-byte tail) used by the BitLinear path
    f16: bool = False  # stored as F16: the float reading rounds activations to f16
    i2s: bool = False  # stored as I2_S

    def runtime_payload(self) -> bytes:
        if self.payload is None:
            self.payload = i2s.payload(self.weight)
        return self.payload

    def __call__(self, x: np.ndarray, reading: str) -> np.ndarray:
        if not np.isfinite(x).all():  # as ml_embed (decision forward.nonfinite)
            raise NumericError("non-finite activation (the model's values overflow float32)")
        if reading == "float":
            if self.f16:
                x = x.astype(np.float16).astype(F32)
            return portable.matmul(x.astype(F32), self.weight)
        return i2s.bitlinear(np.ascontiguousarray(x, dtype=F32), self.runtime_payload(), self.shape)


@dataclass
class BitnetModel:
    arch: str
    hp: dict
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # 1-D/2-D float tensors
    linears: dict[str, Linear] = field(default_factory=dict)
    norm_in: bool = True  # the per-projection norms are there (a BitNet student)

    @property
    def reading(self) -> str:
        """The file's own reading: ternary for I2_S projections, float for f32/f16 ones."""
        return "ternary" if any(lin.i2s for lin in self.linears.values()) else "float"


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def load_gguf(path) -> BitnetModel:
    """Read a convert_bitnet GGUF: float tensors as float32, I2_S tensors as payload + dequantized."""
    import gguf

    from mlconf.tools.convert_bitnet import register_i2s
    from mlconf.tools.files import check_regular, read_regular

    why = check_regular(path)  # gguf-py maps the path: a FIFO would block (loader.special_files)
    if why:
        raise BitnetError(f"{path}: cannot open: {why}")
    try:  # every rule of specs/gguf.yaml first: gguf-py then reads a file known good
        gguf_model.check_bytes(read_regular(path))
    except GgufError as e:
        raise BitnetError(f"{path}: {e.reason} [{e.rule}]") from None
    except OSError as e:
        raise BitnetError(f"{path}: cannot open: {e}") from None
    i2s_type = register_i2s()
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    k = lambda s, d=None: _field(r, f"{arch}.{s}", d)  # noqa: E731
    dim = int(k("embedding_length"))
    n_heads = int(k("attention.head_count"))
    hp = dict(
        dim=dim,
        n_layers=int(k("block_count")),
        n_heads=n_heads,
        n_kv=int(k("attention.head_count_kv", n_heads)),
        head_dim=int(k("attention.key_length", dim // n_heads)),
        eps=float(k("attention.layer_norm_rms_epsilon")),
        rope_base=float(k("rope.freq_base", 10000.0)),
        rope_base_swa=k("rope.freq_base_swa"),
        window=k("attention.sliding_window"),
        pattern=k("attention.sliding_window_pattern"),
        qpas=k("attention.query_pre_attn_scalar"),
        pooling=_POOL_IDS.get(k("pooling_type", 0)),
    )
    m = BitnetModel(arch, hp)
    for t in r.tensors:
        name = t.name
        if t.tensor_type == i2s_type:
            cols, rows = int(t.shape[0]), int(t.shape[1])
            n = rows * cols // 4 + i2s.TAIL
            data = bytes(r.data[t.data_offset : t.data_offset + n])
            w = i2s.dequantize(data, (rows, cols))
            m.linears[name.removesuffix(".weight")] = Linear((rows, cols), w, data, i2s=True)
        else:  # F32 or F16 (gguf_model checked the types, shapes and values)
            a = np.array(t.data, dtype=F32)
            base = name.removesuffix(".weight")
            if a.ndim == 2 and base.split(".")[-1] in PROJ:
                m.linears[base] = Linear(
                    (a.shape[0], a.shape[1]), a, f16=t.tensor_type == gguf.GGMLQuantizationType.F16
                )
            else:
                m.tensors[name] = a
    have = [b for b in m.linears if f"{b}_norm_in.weight" in m.tensors]  # all or none (bitnet.norm_in)
    m.norm_in = bool(have)
    return m


def _rope(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    """Rotate-half RoPE over the whole head. x: (T, heads, hd) float32."""
    hd = x.shape[-1]
    inv = portable.pow64(base, -np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos, sin = portable.cos_sin64(ang)
    c, s = cos.astype(F32)[:, None, :], sin.astype(F32)[:, None, :]
    h = hd // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(F32)


def embed(
    model: BitnetModel,
    tokens,
    pooling: str | None = None,
    normalize: bool = False,
    reading: str | None = None,
) -> np.ndarray:
    """Pooled embedding (dim,) float32 of the token ids, in ``reading`` (None: the file's own;
    see the module docstring)."""
    m, hp, T = model, model.hp, model.tensors
    reading = reading or m.reading
    if reading not in READINGS:
        raise BitnetError(f"reading {reading!r} is not one of {', '.join(READINGS)}")
    if reading == "ternary" and not m.norm_in:
        raise BitnetError(
            "reading ternary needs a BitNet student (per-projection norms); this GGUF is a "
            "plain model (a float teacher): read it as float"
        )
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if tokens.size == 0:
        raise BitnetError("no tokens")
    if pooling not in POOLINGS:
        raise BitnetError(f"pooling {pooling!r} is not one of {POOLINGS}")
    emb = T["token_embd.weight"]
    if tokens.min() < 0 or tokens.max() >= emb.shape[0]:
        raise BitnetError("token id out of range")
    gemma = m.arch == "gemma3"
    eps, hd, nh, nkv = hp["eps"], hp["head_dim"], hp["n_heads"], hp["n_kv"]
    n = tokens.size
    pos = np.arange(n)
    x = emb[tokens].astype(F32)
    if gemma:
        x = x * F32(math.sqrt(hp["dim"]))
    scale = F32(1 / math.sqrt(hp["qpas"] if gemma and hp["qpas"] else hd))
    causal = pos[None, :] <= pos[:, None]

    def lin(b: str, name: str, v: np.ndarray) -> np.ndarray:
        if m.norm_in:
            v = rmsnorm(v, T[f"{b}.{name}_norm_in.weight"], eps)
        return m.linears[f"{b}.{name}"](v, reading)

    for i in range(hp["n_layers"]):
        b = f"blk.{i}"
        sliding = gemma and hp["pattern"] is not None and bool(hp["pattern"][i])
        h = rmsnorm(x, T[f"{b}.attn_norm.weight"], eps)
        q = lin(b, "attn_q", h).reshape(n, nh, hd)
        kk = lin(b, "attn_k", h).reshape(n, nkv, hd)
        v = lin(b, "attn_v", h).reshape(n, nkv, hd)
        q = rmsnorm(q, T[f"{b}.attn_q_norm.weight"], eps)
        kk = rmsnorm(kk, T[f"{b}.attn_k_norm.weight"], eps)
        base = hp["rope_base_swa"] if sliding and hp["rope_base_swa"] else hp["rope_base"]
        q, kk = _rope(q, pos, base), _rope(kk, pos, base)
        mask = causal
        if sliding and hp["window"]:
            mask = causal & (pos[:, None] - pos[None, :] < int(hp["window"]))
        rep = nh // nkv
        kk, v = np.repeat(kk, rep, axis=1), np.repeat(v, rep, axis=1)
        s = portable.matmul(q.transpose(1, 0, 2), kk.transpose(1, 0, 2)) * scale  # (nh, n, n)
        s = np.where(mask[None], s, -np.inf)
        s = portable.exp(s - s.max(axis=-1, keepdims=True))
        p = (s / portable.sum_last(s)).astype(F32)
        a = portable.matmul(p, v.transpose(1, 2, 0)).transpose(1, 0, 2).reshape(n, nh * hd)
        a = lin(b, "attn_output", a)
        if gemma:
            a = rmsnorm(a, T[f"{b}.post_attention_norm.weight"], eps)
        x = x + a
        h = rmsnorm(x, T[f"{b}.ffn_norm.weight"], eps)
        g = lin(b, "ffn_gate", h)
        u = lin(b, "ffn_up", h)
        f = (gelu_tanh(g) if gemma else silu(g)) * u
        f = lin(b, "ffn_down", f.astype(F32))
        if gemma:
            f = rmsnorm(f, T[f"{b}.post_ffw_norm.weight"], eps)
        x = x + f
    x = rmsnorm(x, T["output_norm.weight"], eps)
    pool = pooling or hp["pooling"] or "mean"
    out = x.mean(axis=0) if pool == "mean" else x[0] if pool == "cls" else x[-1]
    out = out.astype(F32)
    if normalize:
        out = out / F32(max(portable.norm(out), 1e-12))
    if not np.isfinite(out).all():
        raise NumericError("the pooled embedding is not finite (the model's values overflow float32)")
    return out.astype(F32)
