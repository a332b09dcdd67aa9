"""Tiny random BitNet embedding checkpoints (Qwen3 / Gemma 3 bases), seeded, built locally.

A BitNet embedding model is a Qwen3Model or Gemma3TextModel whose every linear projection has a
per-projection RMSNorm weight (``<proj>.norm.weight``) applied to its input (BitLinear). The
folder holds what tools/convert_bitnet.py reads: config.json (transformers' config class),
model.safetensors (the standard tensors plus the seven norms per layer, no lm_head),
modules.json + 1_Pooling/config.json (sentence-transformers) and a byte-level BPE tokenizer
trained with HF tokenizers' BpeTrainer.

    from mlconf.tools import bitnet_models
    path = bitnet_models.build("qwen3", "out/qwen3", seed=0, pooling="lasttoken")

torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

# Small shapes: dim 64, 4 heads of 32 (head_dim != dim / n_heads, as in both real models).
_BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=256,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# name -> (config class, model class, config keyword arguments, special tokens in id order)
MODELS: dict[str, tuple[str, str, dict[str, Any], list[str]]] = {
    "qwen3": (
        "Qwen3Config",
        "Qwen3Model",
        dict(**_BASE, rope_theta=1e6, hidden_act="silu", bos_token_id=None, eos_token_id=0, pad_token_id=0),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3TextModel",
        # vocab 512: the 256 byte-fallback pieces, the specials and ~250 merges
        dict(
            **{**_BASE, "vocab_size": 512},
            query_pre_attn_scalar=32,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": dict(rope_type="default", rope_theta=1e6),
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
            },
            hidden_activation="gelu_pytorch_tanh",
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        ),
        ["<pad>", "<eos>", "<bos>", "<unk>"],
    ),
}
# The seven BitLinear input norms of a layer: HF name -> which width it normalizes.
PROJ_NORMS: dict[str, str] = {
    "self_attn.q_proj.norm.weight": "dim",
    "self_attn.k_proj.norm.weight": "dim",
    "self_attn.v_proj.norm.weight": "dim",
    "self_attn.o_proj.norm.weight": "q_dim",
    "mlp.gate_proj.norm.weight": "dim",
    "mlp.up_proj.norm.weight": "dim",
    "mlp.down_proj.norm.weight": "ff",
}
POOLING_KEYS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "lasttoken": "pooling_mode_lasttoken",
}
_WORDS = (
    "the quick brown fox jumps over lazy dog embedding ternary weights norm layer token "
    "model bit net query key value gate up down hello world"
).split()


def names() -> list[str]:
    return list(MODELS)


def config(name: str, **overrides: Any):
    import transformers

    cls_name, model_cls, kw, _ = MODELS[name]
    cfg = getattr(transformers, cls_name)(**{**kw, **overrides})
    cfg.architectures = [model_cls]
    return cfg


def state_dict(name: str, seed: int = 0, teacher: bool = False, **overrides: Any) -> dict[str, Any]:
    """The base model's tensors plus (unless ``teacher``: the plain float model a BitNet student is
    distilled from) the seven per-projection norms per layer (1 + noise), float32 torch tensors,
    every one set by hf_models.exact_parameters (seeded integers on a power-of-two grid, the same
    bits on every host; no norm is neutral)."""
    import torch
    import transformers

    from mlconf.tools import hf_models

    cfg = config(name, **overrides)
    model = getattr(transformers, MODELS[name][1])(cfg)
    sd = {
        k: v.detach().float().clone()
        for k, v in sorted(model.state_dict().items())
        if not k.endswith("rotary_emb.inv_freq")
    }
    widths = {
        "dim": cfg.hidden_size,
        "q_dim": cfg.num_attention_heads * cfg.head_dim,
        "ff": cfg.intermediate_size,
    }
    for i in range(0 if teacher else cfg.num_hidden_layers):
        for suffix, w in PROJ_NORMS.items():
            sd[f"layers.{i}.{suffix}"] = torch.ones(widths[w])
    hf_models.exact_parameters(sd.items(), seed)
    return sd


def tokenizer(name: str, seed: int = 0, vocab_size: int | None = None):
    """The family's tokenizer, trained with HF tokenizers' BpeTrainer on a seeded word corpus, its
    special tokens first (ids 0..), at most the model's vocab_size pieces:
    - qwen3: byte-level BPE (NFC normalizer, ByteLevel pre-tokenizer and decoder), as Qwen3's;
    - gemma3_text: SentencePiece-style BPE as Gemma 3's tokenizer.json: spaces replaced by U+2581,
      Split on " " (merged with previous), byte fallback with the 256 <0xXX> pieces after the
      specials, <unk>, <bos> prepended by the post-processor."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from mlconf.tools.golden_tokenizers import SPIECE, with_byte_pieces

    specials = MODELS[name][3]
    size = vocab_size or MODELS[name][2]["vocab_size"]
    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(400)]
    if name == "qwen3":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            corpus, trainers.BpeTrainer(vocab_size=size, special_tokens=specials, show_progress=False)
        )
        return tok
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SPIECE)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)  # training words
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=max(size - 256, len(specials) + 1), special_tokens=specials, show_progress=False
        ),
    )
    tok = Tokenizer.from_str(with_byte_pieces(tok.to_str(), len(specials)))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", specials.index("<bos>"))]
    )
    return tok


def _tokenizer_config(name: str) -> dict[str, Any]:
    specials = MODELS[name][3]
    if name == "qwen3":  # as Qwen3's: no BOS, EOS <|im_end|> (the converter overrides it)
        return dict(
            tokenizer_class="Qwen2Tokenizer",
            bos_token=None,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            add_bos_token=False,
            add_eos_token=False,
        )
    return dict(
        tokenizer_class="GemmaTokenizerFast",
        pad_token=specials[0],
        eos_token=specials[1],
        bos_token=specials[2],
        unk_token=specials[3],
        add_bos_token=True,
        add_eos_token=False,
    )


def build(
    name: str,
    folder: str | Path,
    seed: int = 0,
    *,
    pooling: str | None = "mean",
    drop: tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
    teacher: bool = False,
    **overrides: Any,
) -> Path:
    """Write the checkpoint folder of model ``name``; returns it. ``pooling`` None writes no
    sentence-transformers files; ``drop`` removes tensors and ``extra`` adds some (for tests of
    the converter's refusals); ``teacher``: the plain model, no per-projection norms."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config(name, **overrides)
    cfg.to_json_file(folder / "config.json")
    sd = {k: v.contiguous() for k, v in state_dict(name, seed, teacher, **overrides).items() if k not in drop}
    sd.update(extra or {})
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer(name, seed, overrides.get("vocab_size")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(_tokenizer_config(name), indent=2), encoding="utf-8"
    )
    if pooling is not None:
        modules = [
            dict(idx=0, name="0", path="", type="sentence_transformers.models.Transformer"),
            dict(idx=1, name="1", path="1_Pooling", type="sentence_transformers.models.Pooling"),
            dict(idx=2, name="2", path="2_Normalize", type="sentence_transformers.models.Normalize"),
        ]
        (folder / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
        (folder / "1_Pooling").mkdir(exist_ok=True)
        pcfg = {
            "word_embedding_dimension": cfg.hidden_size,
            **{k: k == POOLING_KEYS[pooling] for k in POOLING_KEYS.values()},
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "include_prompt": True,
        }
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pcfg, indent=2), encoding="utf-8")
    return folder
