"""Convert a BitNet embedding checkpoint (Qwen3 / Gemma 3 base, safetensors) to GGUF.

    python tools/convert_bitnet.py CKPT_DIR OUT.gguf [--outtype f32|f16|i2_s]

Library: ``convert(ckpt, out, outtype) -> dict`` (mlconf.tools.convert_bitnet).

Follows BitNet's utils/convert-bitnet-embedding-to-gguf.py (seed 004): the fixed HF -> GGUF name
tables below (including the seven per-projection ``*_norm_in`` norms per layer), architecture
"qwen3" (model_type qwen3) or "gemma3" (gemma3_text), key_length / value_length = head_dim,
pooling type from sentence-transformers' modules.json / 1_Pooling/config.json, the tokenizer
from tokenizer.json (Qwen3: EOS overridden to <|endoftext|> with add_eos_token true), lm_head
skipped. Tensor types:

    outtype   2-D linear weights   token_embd   norms (1-D)
    f32       F32                  F32          F32
    f16       F16                  F16          F16
    i2_s      I2_S (type 36)       F16          F16

``stock_ternary`` (--stock-ternary, with f32 or f16) writes a student as stock llama.cpp reads it:
no per-projection norms, each projection its I2_S reading (ternary x scale) as a float.

Gemma 3: Gemma3RMSNorm scales by (1 + w); as llama.cpp's converter does, the stored weight of
those norms (attn/ffn/post norms, q/k head norms, output_norm) is 1 + w in float32 (then cast).
The BitLinear input norms (``*.proj.norm.weight``) are plain RMSNorm weights and stored as-is.

I2_S (gguf-py does not know type 36): :func:`register_i2s` extends gguf-py's
GGMLQuantizationType enum and GGML_QUANT_SIZES (block 4 values, 1 byte, as BitNet's gguf-py)
at run time, in memory only. GGUFWriter then takes the packed bytes with ``raw_dtype``; call
register_i2s() before reading such a file with GGUFReader too. A tensor's GGUF data is
rows*cols/4 bytes of 2-bit codes then a 32-byte tail: the f32 scale and 28 zero bytes
(BitNet's ggml: nbytes = n/4 + 32); GGUFReader's ``data`` shows the codes only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlconf.backends.reference import i2s
from mlconf.tools import exits
from mlconf.tools.convert import Checkpoint, ConvertError, _layer_types, read_config
from mlconf.tools.files import read_regular, replacing

I2_S_TYPE = 36
I2_S_BLOCK = 128  # values per packed block (32 bytes)
I2_S_TAIL = 32  # bytes after the codes: f32 scale + zero padding


@dataclass(frozen=True)
class BitnetArch:
    gguf_arch: str
    one_centered_norms: bool  # Gemma3RMSNorm: stored 1 + w
    layer: dict[str, str]  # HF name after "layers.{i}." -> GGUF name after "blk.{i}."
    eos_override: str | None  # token text forced as EOS, with add_eos_token true
    pre: str  # tokenizer.ggml.pre
    vocab: str  # tokenizer.ggml.model: gpt2 (byte-level BPE) or llama (SPM)


# Common per-layer tensors (seed section 2), then the per-architecture ones.
COMMON_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.q_proj.norm.weight": "attn_q_norm_in.weight",
    "self_attn.k_proj.norm.weight": "attn_k_norm_in.weight",
    "self_attn.v_proj.norm.weight": "attn_v_norm_in.weight",
    "self_attn.o_proj.norm.weight": "attn_output_norm_in.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate_proj.norm.weight": "ffn_gate_norm_in.weight",
    "mlp.up_proj.norm.weight": "ffn_up_norm_in.weight",
    "mlp.down_proj.norm.weight": "ffn_down_norm_in.weight",
}
GLOBAL = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
ARCHS: dict[str, BitnetArch] = {
    "qwen3": BitnetArch(
        "qwen3",
        False,
        {**COMMON_LAYER, "post_attention_layernorm.weight": "ffn_norm.weight"},
        "<|endoftext|>",
        "qwen2",
        "gpt2",
    ),
    "gemma3_text": BitnetArch(
        "gemma3",
        True,
        {
            **COMMON_LAYER,
            "post_attention_layernorm.weight": "post_attention_norm.weight",
            "pre_feedforward_layernorm.weight": "ffn_norm.weight",
            "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        },
        None,
        "default",
        "llama",
    ),
}
PREFIXES = ("", "model.")
SKIPPED = ("lm_head.weight",)  # embedding models: no output head
POOLING = {
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
    "pooling_mode_lasttoken": "LAST",
}
OUTTYPES = ("f32", "f16", "i2_s")
# general.file_type per outtype: GGML's ALL_F32 / MOSTLY_F16, and bitnet.cpp's LLAMA_FTYPE_MOSTLY_I2_S
FILE_TYPES = {"f32": 0, "f16": 1, "i2_s": 40}
DEFAULT_CTX = 32768  # upstream's context_length when config.json has no max_position_embeddings


# ---------------------------------------------------------------- gguf-py run-time extension
def register_i2s():
    """Add I2_S = 36 to gguf-py's GGMLQuantizationType and GGML_QUANT_SIZES (in memory, once);
    returns the member. Needed by GGUFWriter (raw_dtype) and GGUFReader alike."""
    import gguf

    t = gguf.GGMLQuantizationType
    if I2_S_TYPE not in t._value2member_map_:
        m = int.__new__(t, I2_S_TYPE)
        m._name_, m._value_ = "I2_S", I2_S_TYPE
        type.__setattr__(t, "I2_S", m)  # EnumType.__setattr__ refuses new members
        t._member_map_["I2_S"] = m
        t._value2member_map_[I2_S_TYPE] = m
        t._member_names_.append("I2_S")
    member = t(I2_S_TYPE)
    gguf.GGML_QUANT_SIZES.setdefault(member, (4, 1))  # the dict gguf_reader / quants import
    return member


def ternarize(w: np.ndarray) -> tuple[np.ndarray, float]:
    """The reference's ternary values and scale of a 2-D weight (i2s.ternarize), refused rows
    reported as a conversion error."""
    try:
        return i2s.ternarize(np.asarray(w, np.float32))
    except i2s.I2SError as e:
        raise ConvertError(f"I2_S: {e}") from None


def pack_i2s(w: np.ndarray) -> bytes:
    """I2_S bytes of a 2-D weight: the reference rule and layout (backends/reference/i2s.py,
    specs/i2s.yaml), refused rows reported as a conversion error."""
    try:
        return i2s.payload(np.asarray(w, np.float32))
    except i2s.I2SError as e:
        raise ConvertError(f"I2_S: {e}") from None


# ---------------------------------------------------------------- plan
@dataclass(frozen=True)
class Item:
    hf: str  # checkpoint tensor
    gguf: str
    shape: tuple[int, ...]  # expected HF shape
    kind: str  # linear | embed | norm | fold_norm
    norm_in: bool = False  # one of the seven per-projection BitLinear norms of a layer


def _expected(cfg, arch: BitnetArch) -> tuple[dict[str, Any], list[Item]]:
    """(hyperparameters, tensors in write order) from the config."""
    dim = cfg.integer("hidden_size")
    n_layers = cfg.integer("num_hidden_layers")
    n_heads = cfg.integer("num_attention_heads")
    n_kv = cfg.integer("num_key_value_heads", cfg.get("num_key_value_heads") or n_heads)
    head_dim = cfg.integer("head_dim", cfg.get("head_dim") or dim // n_heads)
    ff = cfg.integer("intermediate_size")
    vocab = cfg.integer("vocab_size")
    q, kv = n_heads * head_dim, n_kv * head_dim
    hp: dict[str, Any] = dict(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv=n_kv,
        head_dim=head_dim,
        ff=ff,
        vocab=vocab,
        ctx=cfg.integer("max_position_embeddings", cfg.get("max_position_embeddings") or DEFAULT_CTX),
        eps=cfg.num("rms_norm_eps", cfg.get("rms_norm_eps")),
    )
    shapes = {
        "input_layernorm.weight": (dim,),
        "post_attention_layernorm.weight": (dim,),
        "pre_feedforward_layernorm.weight": (dim,),
        "post_feedforward_layernorm.weight": (dim,),
        "self_attn.q_proj.weight": (q, dim),
        "self_attn.k_proj.weight": (kv, dim),
        "self_attn.v_proj.weight": (kv, dim),
        "self_attn.o_proj.weight": (dim, q),
        "self_attn.q_norm.weight": (head_dim,),
        "self_attn.k_norm.weight": (head_dim,),
        "self_attn.q_proj.norm.weight": (dim,),
        "self_attn.k_proj.norm.weight": (dim,),
        "self_attn.v_proj.norm.weight": (dim,),
        "self_attn.o_proj.norm.weight": (q,),
        "mlp.gate_proj.weight": (ff, dim),
        "mlp.up_proj.weight": (ff, dim),
        "mlp.down_proj.weight": (dim, ff),
        "mlp.gate_proj.norm.weight": (dim,),
        "mlp.up_proj.norm.weight": (dim,),
        "mlp.down_proj.norm.weight": (ff,),
    }

    def kind(hf: str, shape: tuple[int, ...]) -> str:
        if len(shape) == 2:
            return "linear"
        per_proj = hf.endswith("_proj.norm.weight")  # BitLinear input norm: plain w
        return "fold_norm" if arch.one_centered_norms and not per_proj else "norm"

    items = [Item("embed_tokens.weight", "token_embd.weight", (vocab, dim), "embed")]
    for i in range(n_layers):
        for hf, g in arch.layer.items():
            items.append(
                Item(
                    f"layers.{i}.{hf}",
                    f"blk.{i}.{g}",
                    shapes[hf],
                    kind(hf, shapes[hf]),
                    hf.endswith("_proj.norm.weight"),
                )
            )
    items.append(Item("norm.weight", "output_norm.weight", (dim,), kind("norm.weight", (dim,))))
    return hp, items


def _check_tensors(ckpt: Checkpoint, items: list[Item]) -> tuple[str, list[Item]]:
    """(the checkpoint's name prefix, the tensors to write); missing, misshapen and unexpected
    tensors refused. A checkpoint has every per-projection norm (a BitNet student) or none (its
    float teacher, a plain Qwen3 / Gemma 3 model; decision convert_bitnet.teacher)."""
    names = ckpt.infos
    prefix = next((p for p in PREFIXES if f"{p}embed_tokens.weight" in names), None)
    if prefix is None:
        raise ConvertError(f"{ckpt.folder}: missing tensor embed_tokens.weight")
    if not any(prefix + it.hf in names for it in items if it.norm_in):
        items = [it for it in items if not it.norm_in]
    missing = [prefix + it.hf for it in items if prefix + it.hf not in names]
    if missing:
        raise ConvertError(
            f"{ckpt.folder}: missing tensor{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        )
    for it in items:
        got = names[prefix + it.hf].shape
        if got != it.shape:
            raise ConvertError(
                f"{ckpt.folder}: tensor {prefix + it.hf} has shape {list(got)}, "
                f"config.json implies {list(it.shape)}"
            )
        ckpt.check_dtype(prefix + it.hf)
    used = {prefix + it.hf for it in items} | {prefix + s for s in SKIPPED} | set(SKIPPED)
    extra = sorted(t for t in names if t not in used and not t.endswith("rotary_emb.inv_freq"))
    if extra:
        raise ConvertError(f"{ckpt.folder}: unexpected tensor {extra[0]}: no GGUF name for it")
    return prefix, items


def _pooling(folder: Path) -> str | None:
    """gguf PoolingType name from sentence-transformers' files; None without modules.json."""
    mpath = folder / "modules.json"
    if not mpath.exists():
        return None
    try:
        modules = json.loads(read_regular(mpath))
        pool = next((m for m in modules if m.get("type", "").endswith("models.Pooling")), None)
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise ConvertError(f"{mpath}: not a sentence-transformers modules list ({e})") from None
    if pool is None:
        raise ConvertError(f"{mpath}: no sentence_transformers.models.Pooling module")
    ppath = folder / pool.get("path", "1_Pooling") / "config.json"
    try:
        pcfg = json.loads(read_regular(ppath))
    except (OSError, ValueError) as e:
        raise ConvertError(f"{ppath}: cannot read the pooling config ({e})") from None
    on = [k for k, v in pcfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(on) != 1 or on[0] not in POOLING:
        raise ConvertError(
            f"{ppath}: pooling modes {on or 'none'} set; supported: exactly one of {', '.join(POOLING)}"
        )
    return POOLING[on[0]]


def _rope(cfg, arch: BitnetArch) -> tuple[float, float | None]:
    """(global RoPE base, Gemma 3's sliding-layer base or None); RoPE scaling refused."""
    if arch.gguf_arch == "gemma3":
        rp = cfg.get("rope_parameters") or {}
        full = dict(rp.get("full_attention") or {})
        local = dict(rp.get("sliding_attention") or {})
        full.setdefault("rope_theta", cfg.get("rope_theta"))
        local.setdefault("rope_theta", cfg.get("rope_local_base_freq"))
        parts = (("rope_parameters.full_attention", full), ("rope_parameters.sliding_attention", local))
    else:
        p = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
        p.setdefault("rope_theta", cfg.get("rope_theta"))
        parts = (("rope_parameters", p),)
    for label, p in parts:
        if p.get("rope_type", p.get("type", "default")) != "default":
            raise ConvertError(
                f"{cfg.where}: {label}.rope_type = {p.get('rope_type', p.get('type'))!r}: "
                "only unscaled RoPE is converted"
            )
    bases = [cfg.num(f"{label}.rope_theta", p.get("rope_theta")) for label, p in parts]
    return bases[0], bases[1] if len(bases) > 1 else None


# ---------------------------------------------------------------- tokenizer
# Token types as BitNet's converter gives them: an added token is CONTROL when it is special or
# looks special (<...>, [...], <|...|>), else USER_DEFINED.
LOOKS_SPECIAL = (("<|", "<", "["), ("|>", ">", "]"))
SPIECE = "\u2581"


def _looks_special(token: str) -> bool:
    return bool(token) and token.startswith(LOOKS_SPECIAL[0]) and token.endswith(LOOKS_SPECIAL[1])


def _read_tokenizer(folder: Path) -> tuple[Path, dict]:
    path = folder / "tokenizer.json"
    try:
        tj = json.loads(read_regular(path))
        if not isinstance(tj["model"]["vocab"], dict):
            raise TypeError("model.vocab is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{path}: cannot read the tokenizer ({e})") from None
    if tj["model"].get("type") != "BPE":
        raise ConvertError(
            f"{path}: model.type {tj['model'].get('type')!r}: only BPE tokenizers are converted"
        )
    return path, tj


def _added(tj: dict) -> dict[int, tuple[str, bool]]:
    """id -> (content, special) of tokenizer.json's added tokens."""
    return {int(t["id"]): (t["content"], bool(t.get("special"))) for t in tj.get("added_tokens", [])}


def _vocab_bpe(w, path: Path, tj: dict, arch: BitnetArch, n_vocab: int) -> list[str]:
    """Qwen3: the byte-level BPE vocabulary (tokenizer.ggml.model gpt2) and its merges."""
    import gguf

    if "ByteLevel" not in json.dumps(tj.get("pre_tokenizer")):
        raise ConvertError(
            f"{path}: pre_tokenizer has no ByteLevel step: a {arch.gguf_arch} vocabulary is "
            "byte-level BPE (tokenizer.ggml.model gpt2)"
        )
    added = _added(tj)
    by_id = {i: t for t, i in tj["model"]["vocab"].items()} | {i: c for i, (c, _) in added.items()}
    if max(by_id) >= n_vocab:
        raise ConvertError(f"{path}: token id {max(by_id)} >= vocab_size {n_vocab} of config.json")
    tokens, types = [], []
    for i in range(n_vocab):  # ids the tokenizer lacks are padding, as llama.cpp's converter
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added and (added[i][1] or _looks_special(t)):
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL)
        elif i in added:
            tokens.append(t.replace(SPIECE, " "))
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(t)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(arch.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    return tokens


def _vocab_spm(w, path: Path, tj: dict, arch: BitnetArch, n_vocab: int) -> list[str]:
    """Gemma 3: its SentencePiece-style BPE as a llama (SPM) vocabulary, as BitNet's converter
    writes it: scores from merge ranks (a merge's result scores -rank, its first merge counting;
    other pieces 0), added tokens -1000, padding -10000; <0xHH> pieces BYTE, <unk> UNKNOWN;
    add_space_prefix false. No merges are written (decision convert_bitnet.tokenizer)."""
    import gguf

    model = tj["model"]
    if not model.get("byte_fallback") or SPIECE not in json.dumps(tj.get("normalizer"), ensure_ascii=False):
        raise ConvertError(
            f"{path}: a {arch.gguf_arch} vocabulary is SentencePiece-style BPE (byte_fallback "
            "and a normalizer writing \u2581 for spaces), as Gemma 3's; this one is not"
        )
    vocab: dict[str, int] = model["vocab"]
    if max(vocab.values()) >= n_vocab:
        raise ConvertError(f"{path}: token id {max(vocab.values())} >= vocab_size {n_vocab} of config.json")
    scores_of: dict[str, float] = {}
    for rank, m in enumerate(model.get("merges", [])):
        piece = "".join(m) if isinstance(m, list) else "".join(str(m).split(" ", 1))
        scores_of.setdefault(piece, -float(rank))
    added = _added(tj)
    by_id = {i: t for t, i in vocab.items()}
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            scores.append(-10000.0)
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(t)
        if i in added:
            scores.append(-1000.0)
            control = added[i][1] or _looks_special(t)
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            scores.append(0.0)
            types.append(gguf.TokenType.BYTE)
        elif t == "<unk>":
            scores.append(0.0)
            types.append(gguf.TokenType.UNKNOWN)
        else:
            scores.append(scores_of.get(t, 0.0))
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre(arch.pre)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(False)
    return tokens


def add_tokenizer(w, folder: Path, arch: BitnetArch, n_vocab: int) -> dict[str, Any]:
    """Write the tokenizer keys of checkpoint folder's tokenizer.json (and tokenizer_config.json)
    to GGUF writer w as BitNet's converter does, for a model of n_vocab ids; {"eos": id}."""
    import gguf

    path, tj = _read_tokenizer(folder)
    spm = arch.vocab == "llama"
    tokens = (_vocab_spm if spm else _vocab_bpe)(w, path, tj, arch, n_vocab)
    special = gguf.SpecialVocab(folder, load_merges=not spm, n_vocab=n_vocab)
    if arch.eos_override is not None:  # Qwen3: last-token pooling needs <|endoftext|> appended
        if arch.eos_override not in tokens:
            raise ConvertError(f"{path}: no {arch.eos_override} token for the EOS override")
        special.special_token_ids["eos"] = tokens.index(arch.eos_override)
        special.add_special_token["eos"] = True
    special.add_to_gguf(w, quiet=True)
    return {"eos": special.special_token_ids.get("eos")}


# ---------------------------------------------------------------- convert
@contextmanager
def _closing_writer(writer):
    """Close the file of GGUFWriter ``writer()`` when the block fails, before its temporary file is
    removed (the writer would hold it open)."""
    try:
        yield
    except BaseException:
        for fh in getattr(writer(), "fout", None) or []:
            fh.close()
        raise


def convert(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    outtype: str = "f16",
    f32_norms: bool = False,
    stock_ternary: bool = False,
) -> dict:
    """Write the GGUF of the checkpoint folder ``ckpt`` to ``out``; returns a summary (arch,
    outtype, hyperparameters, pooling, tensor count). Raises ConvertError; no partial file.
    ``f32_norms``: every 1-D tensor in F32 whatever the outtype, as llama.cpp's own converters
    write them (stock llama.cpp cannot multiply by F16 norms; bitnet.cpp's fork added that).
    ``stock_ternary`` (outtype f32 or f16): the student as stock llama.cpp reads it, the input of
    its own ternary quantizers (TQ1_0, TQ2_0): the teacher's tensor set (no per-projection norms:
    llama.cpp refuses a file with tensors it does not create), each projection its I2_S reading,
    ternary value x the tensor's scale d, every other tensor as the outtype writes it. In F32 the
    product is exact; in F16 it is ternary x f16(d) (d, a mean of |w|, is seldom an f16: within
    2^-11 of the student's), which TQ1_0/TQ2_0 then hold exactly (their block scale, the block's
    largest |value|, is that f16)."""
    import gguf

    folder, out = Path(ckpt), Path(out)
    if outtype not in OUTTYPES:
        raise ConvertError(f"--outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    if stock_ternary and outtype == "i2_s":
        raise ConvertError("--stock-ternary writes float projections: --outtype f32 or f16, not i2_s")
    try:
        top = json.loads(read_regular(folder / "config.json")).get("model_type")
    except (OSError, ValueError, AttributeError):
        top = None  # read_config names the problem
    if top is not None and top not in ARCHS:
        raise ConvertError(
            f"{folder / 'config.json'}: model_type {top!r} is not supported (supported: {', '.join(ARCHS)})"
        )
    cfg, _ = read_config(folder)
    arch = ARCHS[cfg.model_type]
    hp, items = _expected(cfg, arch)
    rope_base, local_base = _rope(cfg, arch)
    pooling = _pooling(folder)
    # Gemma 3: which layers are windowed, from layer_types (or its default pattern) as transformers
    windowed = (
        [k == "sliding_attention" for k in _layer_types(cfg, hp["n_layers"])]
        if arch.gguf_arch == "gemma3"
        else []
    )
    ck = Checkpoint(folder)
    prefix, items = _check_tensors(ck, items)
    if stock_ternary:
        items = [it for it in items if not it.norm_in]
    i2s_type = register_i2s() if outtype == "i2_s" else None
    if i2s_type is not None or stock_ternary:
        # bitnet.cpp's I2_S kernels (and the reference) take whole 128-value blocks per row
        bad = [it.hf for it in items if it.kind == "linear" and it.shape[1] % I2_S_BLOCK]
        if bad:
            t = prefix + bad[0]
            raise ConvertError(
                f"{folder}: tensor {t} has rows of {ck.infos[t].shape[1]} values; "
                f"{'--stock-ternary' if stock_ternary else '--outtype i2_s'} needs a multiple of {I2_S_BLOCK}"
            )

    # Cast per kind and outtype (the module docstring's table).
    f16 = outtype != "f32"
    f16_norms = f16 and not f32_norms
    one = np.float32(1.0)

    def linear(x: np.ndarray) -> np.ndarray:
        if stock_ternary:
            q, d = ternarize(x)
            x = q.astype(np.float32) * np.float32(d)  # i2s.dequantize's product
        return x.astype(np.float16) if f16 else x

    fns: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "embed": lambda x: x.astype(np.float16) if f16 else x,
        "linear": linear,
        "norm": lambda x: x.astype(np.float16) if f16_norms else x,
        "fold_norm": lambda x: (one + x).astype(np.float16) if f16_norms else one + x,
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    w = None
    with replacing(out) as tmp, _closing_writer(lambda: w):
        w = gguf.GGUFWriter(tmp, arch.gguf_arch)
        w.add_name(folder.name)
        w.add_file_type(FILE_TYPES[outtype])
        w.add_vocab_size(hp["vocab"])
        w.add_rope_dimension_count(hp["head_dim"])
        w.add_context_length(hp["ctx"])
        w.add_embedding_length(hp["dim"])
        w.add_block_count(hp["n_layers"])
        w.add_feed_forward_length(hp["ff"])
        w.add_head_count(hp["n_heads"])
        w.add_head_count_kv(hp["n_kv"])
        w.add_key_length(hp["head_dim"])  # head_dim != dim / n_heads in both models
        w.add_value_length(hp["head_dim"])
        w.add_layer_norm_rms_eps(hp["eps"])
        w.add_rope_freq_base(rope_base)
        if arch.gguf_arch == "gemma3":
            if local_base is not None:
                w.add_rope_freq_base_swa(local_base)
            if cfg.get("sliding_window") is not None:
                w.add_sliding_window(cfg.integer("sliding_window"))
                w.add_sliding_window_pattern(windowed)  # per layer, true = sliding
            w.add_float32(
                f"{arch.gguf_arch}.attention.query_pre_attn_scalar",
                cfg.num("query_pre_attn_scalar", cfg.get("query_pre_attn_scalar")),
            )
        w.add_pooling_type(gguf.PoolingType[pooling or "MEAN"])  # upstream's default: mean
        tok = add_tokenizer(w, folder, arch, hp["vocab"])
        # Tensor infos first (sizes follow from the shapes), then the data one tensor at a time:
        # memory stays near the largest tensor (GGUFWriter.add_tensor would hold them all).
        for it in items:
            if i2s_type is not None and it.kind == "linear":
                # byte shape (rows, cols/4) of uint8: gguf-py records the shape (rows, cols)
                w.add_tensor_info(
                    it.gguf,
                    (it.shape[0], it.shape[1] // 4),
                    np.dtype(np.uint8),
                    int(np.prod(it.shape)) // 4 + I2_S_TAIL,
                    raw_dtype=i2s_type,
                )
            else:
                half = f16_norms if it.kind in ("norm", "fold_norm") else f16
                dt = np.dtype(np.float16 if half else np.float32)
                w.add_tensor_info(it.gguf, it.shape, dt, int(np.prod(it.shape)) * dt.itemsize)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for it in items:
            x = ck.load(prefix + it.hf)
            if i2s_type is not None and it.kind == "linear":
                w.write_tensor_data(np.frombuffer(pack_i2s(x), np.uint8))
            else:
                w.write_tensor_data(np.ascontiguousarray(fns[it.kind](x)))
        w.close()
    return dict(
        arch=arch.gguf_arch,
        outtype=outtype,
        pooling=pooling,
        tensors=len(items),
        rope_base=rope_base,
        rope_base_swa=local_base,
        eos=tok["eos"],
        **hp,
    )


def main(argv: list[str] | None = None, prog: str = "convert_bitnet.py") -> int:
    ap = exits.ArgumentParser(
        prog=prog,
        description="Convert a BitNet embedding checkpoint (Qwen3 / Gemma 3 base, safetensors) to GGUF.",
    )
    ap.add_argument("ckpt", help="checkpoint folder")
    ap.add_argument("out", help="output .gguf file")
    ap.add_argument("--outtype", choices=OUTTYPES, default="f16")
    ap.add_argument(
        "--f32-norms",
        action="store_true",
        help="write the norms (1-D tensors) in F32, as llama.cpp's converters do: stock "
        "llama.cpp cannot multiply by F16 norms (BitNet's converter writes them F16 for its own "
        "runtime)",
    )
    ap.add_argument(
        "--stock-ternary",
        action="store_true",
        help="the student for stock llama.cpp's TQ1_0/TQ2_0 quantizers: no per-projection norms, "
        "each projection its ternary values x scale in the outtype (f32 or f16)",
    )
    args = ap.parse_args(argv)
    try:
        s = convert(
            args.ckpt, args.out, args.outtype, f32_norms=args.f32_norms, stock_ternary=args.stock_ternary
        )
    except ConvertError as e:
        print(f"mlconf: error: {e}", file=sys.stderr)
        return exits.USAGE
    except OSError as e:
        print(f"mlconf: error: {args.out}: {e.strerror or e}", file=sys.stderr)
        return exits.USAGE
    print(
        f"wrote {args.out}: {s['arch']}, {s['n_layers']} layers, dim {s['dim']}, {args.outtype}, "
        f"pooling {s['pooling'] or 'unset'}, {os.path.getsize(args.out)} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
