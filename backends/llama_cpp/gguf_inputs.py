"""The GGUF files the llama.cpp program hands llama.cpp: a vocabulary-only GGUF of an .mlt
tokenizer (vocab_gguf), and a copy of a BitNet GGUF that stock llama.cpp loads (stock_gguf). The
.mlb models go through tools/gguf_export.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .replies import NotHere, Refused

# .mlt byte-level flags (specs/mlt.yaml; ignore_merges included) -> llama.cpp's pre-tokenizer
# (tokenizer.ggml.pre) with the same regex: gpt2_regex the GPT-2 one; none the Llama 3 one;
# single_digits (with or without nfc) Qwen2's, which splits numbers into digits. llama.cpp fixes
# ignore_merges per pre-tokenizer (llama-vocab.cpp: on for llama-bpe, off for gpt-2 and qwen2), so
# the other combinations are unsupported. qwen2 does not NFC-normalize: where that departs from the
# .mlt's nfc flag, the cases show it.
PRE = {32: "gpt-2", 2: "llama-bpe", 16: "qwen2", 16 | 8: "qwen2"}
FLAG_ADD_BOS, FLAG_IGNORE_MERGES, FLAG_PREFIX_FIRST_ONLY = 1, 2, 4
ATTR_ADDED, ATTR_BYTE = 1, 2


def vocab_gguf(tok, path: Path) -> Path:
    """A vocabulary-only GGUF (architecture llama, no tensors) of an .mlt tokenizer, in llama.cpp's
    terms: byte-level BPE as tokenizer.ggml.model gpt2 (pieces in GPT-2's byte-to-unicode text,
    merges as "left right"); SentencePiece-style BPE as llama (SPM), each piece scored by the rank of
    the merge that makes it (SPM merges the pair of highest score, BPE the pair of lowest rank: the
    same order), byte tokens as <0xXX>. Added tokens are USER_DEFINED (matched in the text first).
    NotHere for what llama.cpp has no pre-tokenizer for."""
    import gguf

    from mlconf.tools.convert_tokenizer import BYTE_TO_CHAR

    w = gguf.GGUFWriter(path, "llama")
    for key, v in (
        ("context_length", 16),
        ("embedding_length", 32),
        ("block_count", 1),
        ("feed_forward_length", 32),
        ("attention.head_count", 1),
    ):
        w.add_uint32(f"llama.{key}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    types = [
        gguf.TokenType.USER_DEFINED
        if a == ATTR_ADDED
        else gguf.TokenType.BYTE
        if a == ATTR_BYTE
        else gguf.TokenType.NORMAL
        for a, _ in tok.tokens
    ]
    if tok.kind == 2:
        rest = tok.flags & ~FLAG_ADD_BOS
        if rest not in PRE:
            raise NotHere(
                f"flags {tok.flags:#x}: llama.cpp has no pre-tokenizer with this regex, digit rule "
                f"and ignore_merges"
            )
        texts = [
            p.decode("utf-8", "replace") if a == ATTR_ADDED else "".join(BYTE_TO_CHAR[b] for b in p)
            for a, p in tok.tokens
        ]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(PRE[rest])
        w.add_token_merges([f"{texts[left]} {texts[right]}" for left, right, _ in tok.merges])
    else:
        if tok.flags & FLAG_PREFIX_FIRST_ONLY:
            raise NotHere(
                f"flags {tok.flags:#x}: prefix_first_only: llama.cpp's SentencePiece tokenizer puts "
                f"the U+2581 prefix before the text after every special token, and has no other mode"
            )
        texts = [f"<0x{p[0]:02X}>" if a == ATTR_BYTE else p.decode("utf-8", "replace") for a, p in tok.tokens]
        scores = [-1e9] * tok.n_vocab
        for rank, (_, _, merged) in enumerate(tok.merges):
            scores[merged] = max(scores[merged], -float(rank))
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_scores(scores)
        w.add_add_space_prefix(True)
    w.add_token_list(texts)
    w.add_token_types([int(t) for t in types])
    if tok.bos >= 0:
        w.add_bos_token_id(tok.bos)
    if tok.eos >= 0:
        w.add_eos_token_id(tok.eos)
    w.add_add_bos_token(bool(tok.flags & FLAG_ADD_BOS))
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bitnet_norms(path: Path) -> list[str]:
    """The names of a BitNet student's per-projection norms (*_norm_in), which stock llama.cpp's
    qwen3 / gemma3 layers have no place for."""
    import gguf

    return [t.name for t in gguf.GGUFReader(path).tensors if t.name.endswith("_norm_in.weight")]


def stock_gguf(src: str, dst: Path) -> Path:
    """A copy of GGUF ``src`` that stock llama.cpp loads: the same keys and tensors, the 1-D F16
    ones (norms) as F32, exactly. Refused (input) when it breaks a container rule of
    specs/gguf.yaml (it is not handed to gguf-py) or gguf-py cannot read it; NotHere for a tensor
    type stock ggml lacks (bitnet.cpp's I2_S, type 36)."""
    import gguf

    from mlconf.backends.reference import gguf_file
    from mlconf.tools.files import check_regular, read_regular

    why = check_regular(src)  # gguf-py would block on a FIFO
    if why:
        raise Refused(f"{src}: {why}")
    try:  # the container rules of specs/gguf.yaml first: gguf-py recurses on nested arrays
        gguf_file.parse(read_regular(src))
    except gguf_file.GgufError as e:
        raise Refused(f"{src}: {e.reason} [{e.rule}]") from None
    try:
        r = gguf.GGUFReader(src)
    except ValueError as e:
        if "GGMLQuantizationType" in str(e):
            raise NotHere(
                f"{src}: a tensor type stock llama.cpp does not read ({e}; bitnet.cpp's I2_S is type 36)"
            ) from None
        raise Refused(f"{src}: not a GGUF gguf-py reads: {e}") from None
    except OSError as e:
        raise Refused(f"{src}: {e}") from None
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vtype = f.types[0]
        w.add_key_value(
            key, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        )
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.F16:
            a = np.asarray(t.data, dtype=np.float16).reshape(shape)
            w.add_tensor(t.name, a.astype(np.float32) if len(shape) == 1 else a)
        elif t.tensor_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.asarray(t.data, dtype=np.float32).reshape(shape))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
