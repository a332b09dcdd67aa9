"""Export an MLB v1 model to GGUF (llama.cpp's llama, qwen2, qwen3, gemma2 or gemma3) with the same weights.

    python tools/gguf_export.py MODEL.mlb OUT.gguf

Library: ``export(mlb_path, gguf_path) -> Path`` (mlconf.tools.gguf_export); needs gguf-py
(extra `oracle`). Used by `mlconf bench native` to time llama.cpp on the weights ours runs, and by
the llama.cpp backend (backends/llama_cpp) to run the suite's models.

What maps to what:
  - architecture: llama; qwen2 for q/k/v biases (qkv_bias); qwen3 for q/k norms (qk_norm, with
    its head_dim as key_length / value_length); a GELU model with post norms (act = 1, post_norms)
    is gemma2, or gemma3 with q/k norms. What llama.cpp fixes in those (models/gemma2.cpp,
    gemma3.cpp of the build) the .mlb must match, else the export is refused naming the field:
    the embedding scale sqrtf(dim); the attention scale 1/sqrtf(head_dim) (1/sqrtf(dim / n_heads)
    at the 27B's layer count: 46 for gemma2, 62 for gemma3); gemma2 always caps the attention
    scores and the logits and shares the classifier with the embedding, gemma3 caps no attention
    score. The sliding layers go as the per-layer pattern array, and llama.cpp gives exactly those
    layers the second RoPE base (rope.freq_base_swa; gemma3 unscaled, gemma2 with the global
    scaling): each layer's base and scaling must be the .mlb's (flag bit 1: rope_local_theta,
    unscaled), so a local base on a full-attention layer, or sliding layers with two bases, is
    refused.
  - matrices: the .mlb's quants and scales are copied, not requantized, into GGML blocks (Q8_0:
    f16 d then 32 int8; Q4_0: f16 d then 16 bytes, element j in the low nibble and j + 16 in the
    high one, the .mlb's own packing). GGML scales are f16, so the .mlb must store f16 scales
    (scale_f16 = 1) or f32 scales that f16 holds exactly; any other is refused, never rounded.
  - RoPE: the .mlb rotates interleaved pairs (2i, 2i+1) of the dims of a head, which is llama.cpp's
    NORM rope of the llama architecture (convert_hf_to_gguf.py permutes HF's rotate-half rows to
    that order, as tools/convert.py does), so llama's q and k rows are not permuted. qwen2 and qwen3
    rotate halves (NEOX): their q and k rows, biases and norms are reordered per head so that the
    same dims turn together (a permutation of whole rows: the blocks are still copied).
    llama3 scaling becomes rope_freqs (per-pair divisors of the frequency, as llama.cpp's
    converter writes it; llama only), linear scaling rope.scaling.type/factor; yarn is refused.
  - tokenizer: a placeholder SentencePiece ("llama") vocabulary of `vocab` tokens (0 <unk>,
    1 <s>, 2 </s> as the format's BOS/EOS, 3 <0x0A> which llama.cpp looks up at load); enough
    to load the model and feed it token ids, not to tokenize text.
Header features none of them has (gates, linear attention, NoPE layers, a rot_dim below head_dim;
for the llama family also windows, layer flags, embedding or attention scales, softcaps) are
refused with a message naming the field.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from mlconf.tools import mlb
from mlconf.tools.files import replacing

# The llama.cpp architectures written: the header fields each adds to llama's, and whether llama.cpp
# rotates the halves (i, i + head_dim / 2) of a head (NEOX) rather than its pairs (2i, 2i + 1).
ARCHS = {
    "llama": ((), False),
    "qwen2": (("qkv_bias",), True),
    "qwen3": (("qk_norm",), True),
    "gemma2": (("act", "post_norms"), True),
    "gemma3": (("act", "post_norms", "qk_norm"), True),
}
# Header fields that must be zero: no architecture written has a counterpart ...
UNSUPPORTED = ("attn_gate", "lin_k_heads", "lin_v_heads", "lin_k_dim", "lin_v_dim", "lin_conv")
# ... and those only the Gemma ones have.
GEMMA_ONLY = (
    "sliding_window",
    "act",
    "post_norms",
    "attn_scale",
    "attn_softcap",
    "final_softcap",
    "rope_local_theta",
)
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp's attention scale differs at this size
FLAG_WINDOW, FLAG_LOCAL_ROPE, FLAG_NO_ROPE, FLAG_LINEAR = 1, 2, 4, 8
# .mlb array or matrix -> llama.cpp tensor of a layer.
LAYER_NAMES = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "wo": "attn_output.weight",
    "ffn_norm": "ffn_norm.weight",
    "w1": "ffn_gate.weight",
    "w2": "ffn_down.weight",
    "w3": "ffn_up.weight",
    "bq": "attn_q.bias",
    "bk": "attn_k.bias",
    "bv": "attn_v.bias",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "post_ffn_norm": "post_ffw_norm.weight",
}
# Arrays whose rows (or values) follow a head's dimensions: reordered for a NEOX architecture.
ROTATED = ("wq", "wk", "bq", "bk", "q_norm", "k_norm")
BLOCK = 32


class ExportError(ValueError):
    """A model this exporter cannot write as a llama GGUF with the same weights."""


def gguf_name(name: str) -> str:
    """llama.cpp's tensor name of an .mlb array or matrix name (without .q/.d)."""
    if name == "tok_emb":
        return "token_embd.weight"
    if name == "final_norm":
        return "output_norm.weight"
    if name == "wcls":
        return "output.weight"
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "layers" and parts[2] in LAYER_NAMES:
        return f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise ExportError(f"array {name!r} has no llama.cpp counterpart")


def f16_scales(d: np.ndarray, where: str) -> np.ndarray:
    """The scales as f16, refusing f32 scales that f16 does not hold exactly."""
    d = np.asarray(d)
    if d.dtype.itemsize == 2:
        return d.astype("<f2")
    with np.errstate(over="ignore"):
        d16 = d.astype("<f2")
    bad = d16.astype(np.float32) != d
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ExportError(
            f"{where}: scale {float(d.ravel()[i])!r} (block {i}) is not exact in f16 and "
            f"GGML stores f16 scales; write the .mlb with scale_f16 = 1"
        )
    return d16


def ggml_blocks(fmt: str, q: np.ndarray, d: np.ndarray, where: str) -> np.ndarray:
    """(rows, bytes per row) uint8 of GGML Q8_0 / Q4_0 blocks from an .mlb matrix's q and d."""
    rows, nb = d.shape
    per = BLOCK if fmt == "Q8_0" else BLOCK // 2
    qb = np.ascontiguousarray(q).view(np.uint8).reshape(rows, nb, per)
    db = np.ascontiguousarray(f16_scales(d, where)).view(np.uint8).reshape(rows, nb, 2)
    return np.concatenate([db, qb], axis=2).reshape(rows, nb * (2 + per))


def architecture(m: mlb.Model) -> str:
    """The llama.cpp architecture that expresses the model; ExportError naming the field if none."""
    h = m.header
    for k in UNSUPPORTED:
        if h[k]:
            raise ExportError(
                f"{m.path}: header {k} = {h[k]!r}: none of llama.cpp's {', '.join(ARCHS)} "
                f"architectures (the ones exported) has a counterpart"
            )
    if h["rope_type"] == 3:
        raise ExportError(f"{m.path}: header rope_type = 3 (yarn) is not exported")
    if m.derived["rot_dim"] != m.derived["head_dim"]:  # llama.cpp: "invalid n_rot" otherwise
        raise ExportError(
            f"{m.path}: header rot_dim = {h['rot_dim']}: the architectures exported rotate "
            f"whole heads ({m.derived['head_dim']} dims)"
        )
    flags = list(m.flags) if m.flags is not None else []
    for bit, what in ((FLAG_NO_ROPE, "unrotated (NoPE)"), (FLAG_LINEAR, "linear-attention")):
        layers = [i for i, f in enumerate(flags) if f & bit]
        if layers:
            raise ExportError(
                f"{m.path}: layer flags: layers {layers} are {what}; the architectures "
                f"exported have no such layer"
            )
    if h["act"] == 1 or h["post_norms"]:
        return _gemma(m, flags)
    for k in GEMMA_ONLY:
        if h[k]:
            raise ExportError(
                f"{m.path}: header {k} = {h[k]!r}: of llama.cpp's architectures exported only "
                f"gemma2 / gemma3 have it, and they need act = 1 (GELU) and post_norms"
            )
    if h["embed_scale"] not in (0.0, 1.0):
        raise ExportError(
            f"{m.path}: header embed_scale = {h['embed_scale']!r}: the architectures exported "
            f"scale the embedding only in gemma2 / gemma3 (GELU, post norms)"
        )
    if any(flags):
        raise ExportError(f"{m.path}: layer flags {flags}: the llama-family architectures have none")
    has = tuple(k for k in ("qkv_bias", "qk_norm") if h[k])
    arch = next((a for a, (fields, _) in ARCHS.items() if fields == has), None)
    if arch is None:
        raise ExportError(
            f"{m.path}: header qkv_bias and qk_norm both set: no llama.cpp architecture has both"
        )
    if h["rope_type"] == 1 and arch != "llama":  # only llama's loader reads rope_freqs
        raise ExportError(
            f"{m.path}: header rope_type = 1 (llama3) with {', '.join(has)}: llama.cpp reads "
            f"rope_freqs for its llama architecture only"
        )
    return arch


def _gemma(m: mlb.Model, flags: list[int]) -> str:
    """gemma2 or gemma3, when the .mlb matches what llama.cpp fixes in them (module docstring)."""
    h, hd = m.header, m.derived["head_dim"]
    if not (h["act"] == 1 and h["post_norms"]):
        raise ExportError(
            f"{m.path}: header act = {h['act']}, post_norms = {h['post_norms']}: llama.cpp's "
            f"GELU architectures (gemma2, gemma3) have both GELU (act = 1) and post norms"
        )
    if h["qkv_bias"]:
        raise ExportError(f"{m.path}: header qkv_bias = 1: llama.cpp's gemma2 / gemma3 have no q/k/v biases")
    arch = "gemma3" if h["qk_norm"] else "gemma2"
    embed = np.sqrt(np.float32(h["dim"]))  # llama.cpp: ggml_scale(inpL, sqrtf(n_embd))
    if np.float32(h["embed_scale"] or 1.0) != embed:
        raise ExportError(
            f"{m.path}: header embed_scale = {h['embed_scale']!r}: llama.cpp's {arch} scales "
            f"the embedding by sqrtf(dim) = {float(embed)!r}"
        )
    full = h["n_layers"] == GEMMA_27B_LAYERS[arch]
    theirs = 1 / np.sqrt(np.float32(h["dim"] // h["n_heads"] if full else hd))
    ours = h["attn_scale"] or 1 / np.sqrt(hd)
    if abs(ours - theirs) > 1e-6 * theirs:
        raise ExportError(
            f"{m.path}: header attn_scale = {h['attn_scale']!r}: llama.cpp's {arch} of "
            f"{h['n_layers']} layers scales the scores by {float(theirs):.9g} (1/sqrtf("
            f"{'dim / n_heads' if full else 'head_dim'}))"
        )
    if arch == "gemma2":
        for k in ("attn_softcap", "final_softcap"):
            if not h[k]:
                raise ExportError(
                    f"{m.path}: header {k} = 0: llama.cpp's gemma2 always caps (the attention "
                    f"scores and the logits)"
                )
        if not h["shared_classifier"]:
            raise ExportError(
                f"{m.path}: header shared_classifier = 0: llama.cpp's gemma2 multiplies by the "
                f"embedding (it has no output matrix)"
            )
    elif h["attn_softcap"]:
        raise ExportError(
            f"{m.path}: header attn_softcap = {h['attn_softcap']!r}: llama.cpp's gemma3 caps "
            f"no attention score"
        )
    if h["rope_type"] == 1:
        raise ExportError(
            f"{m.path}: header rope_type = 1 (llama3): llama.cpp reads rope_freqs for its "
            f"llama architecture only"
        )
    rope_layers(m, arch, flags)
    return arch


def sliding_layers(m: mlb.Model, flags: list[int]) -> list[bool]:
    """Per layer, whether it attends through the window (no flags: every layer, when there is one)."""
    n, w = m.header["n_layers"], m.header["sliding_window"]
    return [bool(w) and (not flags or bool(flags[i] & FLAG_WINDOW)) for i in range(n)]


def llama_swa(m: mlb.Model, arch: str, flags: list[int]) -> tuple[list[bool], int]:
    """llama.cpp's sliding-window pattern and window for a Gemma export: the .mlb's sliding layers.
    gemma2 must have one (llama.cpp asserts it): a model without makes every layer slide through a
    window of max_seq, which no context reaches (the KV cache holds at most max_seq positions)."""
    swa = sliding_layers(m, flags)
    if arch == "gemma2" and not any(swa):
        return [True] * m.header["n_layers"], m.header["max_seq"]
    return swa, m.header["sliding_window"]


def rope_layers(m: mlb.Model, arch: str, flags: list[int]) -> float:
    """rope.freq_base_swa for a Gemma export: llama.cpp gives the sliding layers that base (gemma3
    unscaled, gemma2 with the global scaling) and the others rope_theta with the scaling. Each
    layer's (base, scaled) must be the .mlb's; ExportError naming the first layer that differs."""
    h = m.header
    scaled = h["rope_type"] == 2 and h["rope_factor"] != 1.0
    local = [bool(flags) and bool(f & FLAG_LOCAL_ROPE) for f in flags] or [False] * h["n_layers"]
    ours = [(h["rope_local_theta"], False) if loc else (h["rope_theta"], scaled) for loc in local]
    swa, _ = llama_swa(m, arch, flags)
    base_swa = next((b for (b, _), s in zip(ours, swa, strict=True) if s), h["rope_theta"])
    theirs = [(base_swa, scaled and arch == "gemma2") if s else (h["rope_theta"], scaled) for s in swa]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:

            def say(r):
                return f"base {r[0]:g}{' scaled' if r[1] else ''}"

            kind = "sliding" if swa[i] else "full-attention"
            raise ExportError(
                f"{m.path}: layer {i} turns by RoPE {say(a)}; llama.cpp's {arch} gives a "
                f"{kind} layer {say(b)} (it ties the second base, rope.freq_base_swa, to the "
                f"sliding layers)"
            )
    return base_swa


def neox_order(a: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows (or values) of a q/k array in each head reordered from pairs (2i, 2i + 1) to halves
    (i, i + head_dim / 2): llama.cpp's NEOX RoPE then turns the pairs the .mlb turns."""
    perm = np.r_[0:head_dim:2, 1:head_dim:2]
    return a.reshape(-1, head_dim, *a.shape[1:])[:, perm].reshape(a.shape)


def rope_freq_factors(h: dict, rot_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs: per pair, plain inverse frequency over the scaled one (llama3)."""
    from mlconf.backends.reference.forward import rope_inv_freq

    plain = rope_inv_freq({**h, "rope_type": 0}, rot_dim, False)
    return (plain / rope_inv_freq(h, rot_dim, False)).astype(np.float32)


def placeholder_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """Texts, scores and token types of a SentencePiece vocabulary llama.cpp loads."""
    from gguf import TokenType

    texts = ["<unk>", "<s>", "</s>", "<0x0A>"] + [f"<t{i}>" for i in range(4, n)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.BYTE] + [TokenType.NORMAL] * (
        n - 4
    )
    texts, types = texts[:n], [int(t) for t in types[:n]]
    if n == 3:  # no room for <0x0A>: llama.cpp falls back to looking up "\n"
        texts[0] = "\n"
    return texts, [0.0] * n, types


def export(mlb_path: str | os.PathLike, gguf_path: str | os.PathLike) -> Path:
    """Write ``gguf_path`` (architecture llama) with the weights of the .mlb at ``mlb_path``."""
    import gguf

    m = mlb.read(mlb_path)
    arch = architecture(m)
    neox = ARCHS[arch][1]
    flags = list(m.flags) if m.flags is not None else []
    h, dv = m.header, m.derived
    qtypes = {"Q8_0": gguf.GGMLQuantizationType.Q8_0, "Q4_0": gguf.GGMLQuantizationType.Q4_0}
    out = Path(gguf_path)
    w = gguf.GGUFWriter(None, arch)
    w.add_name(Path(m.path).stem)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if h["wtype"] == 1 else gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(h["max_seq"])
    w.add_embedding_length(h["dim"])
    w.add_block_count(h["n_layers"])
    w.add_feed_forward_length(h["hidden_dim"])
    w.add_head_count(h["n_heads"])
    w.add_head_count_kv(h["n_kv_heads"])
    if dv["head_dim"] * h["n_heads"] != h["dim"]:  # head_dim override
        w.add_key_length(dv["head_dim"])
        w.add_value_length(dv["head_dim"])
    w.add_rope_dimension_count(dv["rot_dim"])
    w.add_rope_freq_base(h["rope_theta"])
    w.add_layer_norm_rms_eps(h["norm_eps"])
    w.add_vocab_size(h["vocab"])
    if h["rope_type"] == 2:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(h["rope_factor"])
    if arch.startswith("gemma"):
        swa, window = llama_swa(m, arch, flags)
        if any(swa):
            w.add_sliding_window(window)
            w.add_sliding_window_pattern(swa)
            w.add_rope_freq_base_swa(rope_layers(m, arch, flags))
        if h["attn_softcap"]:
            w.add_attn_logit_softcapping(h["attn_softcap"])
        if h["final_softcap"]:
            w.add_final_logit_softcapping(h["final_softcap"])
    texts, scores, types = placeholder_vocab(h["vocab"])
    w.add_tokenizer_model("llama")
    w.add_token_list(texts)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    if h["rope_type"] == 1:
        w.add_tensor("rope_freqs.weight", rope_freq_factors(h, dv["rot_dim"]))
    for a in m.table:
        if a.part == "d" or a.name == "layer_flags":  # flags: all zero (_check), nothing to say
            continue
        rotated = neox and a.matrix.rsplit(".", 1)[-1] in ROTATED
        if a.fmt == "F32":
            v = np.asarray(m.arrays[a.name], dtype=np.float32)
            w.add_tensor(gguf_name(a.name), neox_order(v, dv["head_dim"]) if rotated else v)
            continue
        fmt, q, d = m.matrix(a.matrix)
        q, d = np.asarray(q), np.asarray(d)
        if rotated:
            q, d = neox_order(q, dv["head_dim"]), neox_order(d, dv["head_dim"])
        blocks = ggml_blocks(fmt, q, d, f"{m.path}: {a.matrix}")
        w.add_tensor(gguf_name(a.matrix), blocks, raw_dtype=qtypes[fmt])

    with replacing(out) as tmp:  # no partial file is left behind
        try:
            w.write_header_to_file(tmp)
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()  # idempotent: the file is closed before the rename or the removal
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gguf_export.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", metavar="MODEL.mlb")
    ap.add_argument("output", metavar="OUT.gguf")
    args = ap.parse_args(argv)
    try:
        export(args.model, args.output)
    except (ExportError, mlb.MLBError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"error: {e} (gguf-py is in the 'oracle' extra)", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
