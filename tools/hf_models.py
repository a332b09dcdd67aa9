"""Tiny random Hugging Face models of every architecture tools/convert.py takes, seeded.

Used by tests/test_convert.py and by the golden generator (transformers is the logits oracle).
Nothing here downloads anything: every model is built from a transformers config class with
random weights, then saved with ``save_pretrained(safe_serialization=True)``.

    from mlconf.tools import hf_models
    path = hf_models.build("gemma3_text", "out/gemma3", seed=0)     # a checkpoint folder
    model = hf_models.make("qwen3_5_text", seed=0)                   # the torch model (eval, f32)
    hf_models.round_to_q8_0(model)     # weights a Q8_0 file holds exactly (for logits goldens)

torch and transformers (the 'oracle' extra) are imported inside the functions, so importing this
module costs nothing and works without them.

Every parameter is set by ``exact_parameters``: seeded NumPy integers times a power of two, so a
model's weights are the same bits on every host. The framework's initializers and elementwise
kernels (uniform sampling, log, exp) are not: PyTorch's AVX2 and AVX-512 code paths differ in the
last bit, and a golden's inputs must not (issue 12). Every 1-D parameter (norm weights, biases,
A_log, dt_bias) is its neutral value plus noise, so that a norm stored as ``w`` (neutral 1) and
one stored as the offset of ``1 + w`` (neutral 0) both differ from it and a converter that folds
the wrong convention fails the tests.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

# Small shapes shared by most models: dim 64, 4 heads of 16, 2 KV heads, FFN 128, vocab 256.
_BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _text(name: str) -> dict[str, Any]:
    kw = copy.deepcopy(MODELS[name])
    kw.pop("model_type")
    return kw


# name -> config keyword arguments (model_type first). Each name is one architecture or one
# variant of a configuration feature the converter maps (RoPE scaling, sliding window, tying).
MODELS: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_BASE, rope_theta=10000.0),
    "llama_llama3": dict(
        model_type="llama",
        **_BASE,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
    ),
    "llama_linear": dict(
        model_type="llama", **_BASE, rope_theta=10000.0, rope_scaling=dict(rope_type="linear", factor=2.0)
    ),
    "llama_yarn": dict(
        model_type="llama",
        **_BASE,
        rope_theta=10000.0,
        rope_scaling=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=32, beta_fast=32.0, beta_slow=1.0
        ),
    ),
    "llama_yarn_mscale": dict(
        model_type="llama",
        **_BASE,
        rope_theta=10000.0,
        rope_scaling=dict(
            rope_type="yarn",
            factor=4.0,
            original_max_position_embeddings=32,
            mscale=1.0,
            mscale_all_dim=0.5,
            beta_fast=16.0,
            beta_slow=2.0,
        ),
    ),
    "llama_yarn_factor": dict(
        model_type="llama",
        **_BASE,
        rope_theta=10000.0,
        rope_scaling=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=32, attention_factor=1.25
        ),
    ),
    "mistral": dict(
        model_type="mistral",
        **{**_BASE, "num_hidden_layers": 3},
        rope_theta=10000.0,
        sliding_window=8,
        head_dim=32,
    ),
    "mistral_wide_window": dict(model_type="mistral", **_BASE, rope_theta=10000.0, sliding_window=4096),
    "qwen2": dict(model_type="qwen2", **{**_BASE, "tie_word_embeddings": True}, rope_theta=1e6),
    "qwen3": dict(model_type="qwen3", **_BASE, rope_theta=1e6, head_dim=32),
    "gemma2": dict(
        model_type="gemma2",
        **{**_BASE, "num_hidden_layers": 4, "tie_word_embeddings": True},
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=8,
        rope_theta=10000.0,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
    ),
    "gemma3_text": dict(
        model_type="gemma3_text",
        **{**_BASE, "num_hidden_layers": 4, "tie_word_embeddings": True},
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
        },
        hidden_activation="gelu_pytorch_tanh",
    ),
    "smollm3": dict(
        model_type="smollm3",
        **{**_BASE, "num_hidden_layers": 4, "tie_word_embeddings": True},
        rope_theta=2e6,
        no_rope_layer_interval=4,
        use_sliding_window=True,
        sliding_window=8,
    ),
    "qwen3_5_text": dict(
        model_type="qwen3_5_text",
        **{**_BASE, "num_hidden_layers": 4},
        head_dim=32,
        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.25),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
    ),
}
# Multimodal wrappers (what the Gemma 3 >= 4B and Qwen3.5 checkpoints are): the text model above
# under model.language_model, with a minimal vision tower the converter must skip.
MODELS["gemma3"] = dict(
    model_type="gemma3",
    text_config=_text("gemma3_text"),
    mm_tokens_per_image=4,
    image_token_index=255,
    boi_token_index=253,
    eoi_token_index=254,
    vision_config=dict(
        model_type="siglip_vision_model",
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
    ),
)
MODELS["qwen3_5"] = dict(
    model_type="qwen3_5",
    text_config=_text("qwen3_5_text"),
    tie_word_embeddings=False,
    image_token_id=255,
    video_token_id=254,
    vision_start_token_id=253,
    vision_end_token_id=252,
    vision_config=dict(
        depth=1,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        out_hidden_size=64,
        patch_size=4,
        num_position_embeddings=16,
    ),
)


def names() -> list[str]:
    return list(MODELS)


def config(name: str, **overrides: Any):
    """The transformers config of model ``name`` (keyword overrides replace entries)."""
    from transformers import AutoConfig

    kw = copy.deepcopy(MODELS[name])
    kw.update(overrides)
    model_type = kw.pop("model_type")
    return AutoConfig.for_model(model_type, **kw)


# The grids of exact_parameters. Matrices (every tensor of 2 or more dimensions): k * 2^-11 with
# k uniform in [-64, 64], so |w| <= 1/32 and std ~0.018 (transformers' init: normal, std 0.02).
# 1-D noise: k * 2^-8 with k uniform in [-40, 40] (|n| <= 0.16, std ~0.09).
MATRIX_GRID = (64, 2.0**-11)
NOISE_GRID = (40, 2.0**-8)
# 1-D parameters that transformers draws at random rather than fills: name -> (k_lo, k_hi, step)
# of their own grid. Qwen3.5's A_log is log(uniform(0, 16)): here k * 2^-4 in [0, 2.75].
DRAWN_VECTORS: dict[str, tuple[int, int, float]] = {"A_log": (0, 44, 2.0**-4)}


def grid(rng, shape, k: int, step: float):
    """float32 integers uniform in [-k, k] times ``step`` (a power of two): exact everywhere."""
    import numpy as np

    return (rng.integers(-k, k + 1, shape) * step).astype(np.float32)


def exact_values(name: str, init, rng):
    """The value (float32 NumPy array) of parameter ``name`` whose framework-initialized tensor is
    ``init`` (read only for its shape and, in 1-D, for a constant fill: torch's ones_ and zeros_
    are exact on every host). Draws from ``rng`` in a fixed order."""
    import numpy as np

    shape = tuple(init.shape)
    if len(shape) >= 2:
        return grid(rng, shape, *MATRIX_GRID)
    leaf = name.rsplit(".", 1)[-1]
    if leaf in DRAWN_VECTORS:
        lo, hi, step = DRAWN_VECTORS[leaf]
        return (rng.integers(lo, hi + 1, shape) * step).astype(np.float32)
    flat = init.detach().reshape(-1)
    fill = float(flat[0]) if len(flat) and bool((flat == flat[0]).all()) else 0.0
    if fill not in (0.0, 1.0):  # a drawn init we do not know: its neutral value is 0
        fill = 0.0
    return (fill + grid(rng, shape, *NOISE_GRID)).astype(np.float32)


def exact_parameters(named, seed: int) -> None:
    """Overwrite every tensor of ``named`` ((name, torch tensor) pairs) in place with
    exact_values, drawn in name order from NumPy's PCG64 seeded with ``seed``."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(named, key=lambda kv: kv[0]):
            p.copy_(torch.from_numpy(exact_values(name, p, rng)))


def make(name: str, seed: int = 0, **overrides: Any):
    """A random model in eval mode, float32, eager attention (needed for Gemma 2 softcapping),
    its parameters set by exact_parameters (the same bits on every host)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = config(name, **overrides)
    auto = AutoModelForImageTextToText if "text_config" in MODELS[name] else AutoModelForCausalLM
    model = auto.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    exact_parameters(model.named_parameters(), seed)
    return model.eval()


def round_to_q8_0(model):
    """Round every matrix (2-D parameter) of ``model`` in place through Q8_0 (f32 scales), so that
    a Q8_0 .mlb converted from it holds the same weights and its logits can be compared with
    transformers' without quantization error. Returns the model."""
    import numpy as np
    import torch

    from mlconf.backends.reference import quant

    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 2:
                q, d = quant.q8_0(p.detach().float().numpy().astype(np.float32))
                p.copy_(torch.from_numpy(quant.dequantize("Q8_0", q, d)))
    return model


def save(model, folder: str | Path, dtype: str | None = None, max_shard_size: str | None = None) -> Path:
    """save_pretrained as safetensors; ``dtype`` "bfloat16"/"float16" casts first (a copy)."""
    import torch
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        model = copy.deepcopy(model).to(getattr(torch, dtype))
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, safe_serialization=True, **kw)
    return folder


def build(
    name: str,
    folder: str | Path,
    seed: int = 0,
    *,
    dtype: str | None = None,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """Make model ``name`` with ``seed`` and save it into ``folder``; returns the folder."""
    return save(make(name, seed, **overrides), folder, dtype=dtype, max_shard_size=max_shard_size)


def build_all(root: str | Path, seed: int = 0) -> dict[str, Path]:
    """Every model of MODELS under root/<name>."""
    return {n: build(n, Path(root) / n, seed) for n in MODELS}
