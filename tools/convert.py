"""Convert a Hugging Face checkpoint (config.json + *.safetensors) to an MLB v1 model file.

    python tools/convert.py HF_DIR OUT.mlb [--wtype q8_0|q4_0] [--f16-scales] [--q8-mask wq,w2]
                            [--q4-rule search|round] [--imatrix FILE]

Library: ``convert(hf_dir, out_path, ...) -> header`` (mlconf.tools.convert).

Architectures (config.json model_type): llama, mistral, qwen2, qwen3, gemma2, gemma3_text,
smollm3, qwen3_5_text, and the multimodal wrappers gemma3 / qwen3_5 (their text model only).
What each maps to, from the transformers modeling files:
  - every architecture: HF rotates the halves (j, j + rot/2) of the first rot_dim dimensions of a
    head, the format rotates pairs (2i, 2i+1); the rows of wq and wk (and bq, bk, q_norm, k_norm,
    which follow the same outputs) are permuted per head so that pair i is (j=i, j=i+rot/2).
  - gemma2, gemma3_text, qwen3_5_text: RMSNorm scales by (1 + w); the stored weight is 1 + w
    (float32, as transformers computes it). Qwen3.5's gated norm of linear attention scales by w.
  - qwen3_5_text: q_proj holds query and gate interleaved per head ([q_h; g_h] of head_dim rows
    each); they are split into wq and wg.
The header comes from the config alone; the tensors are streamed one at a time (memory stays
near the largest tensor) and checked against the shapes the config implies before anything is
written. Whatever the format cannot express is refused with a message naming the config key or
tensor, and no output file is left behind (the writer writes a temporary file and renames it).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlconf import specs
from mlconf.backends.reference import layout, loader
from mlconf.tools import exits, mlb
from mlconf.tools.files import open_regular, read_regular


class ConvertError(ValueError):
    """A checkpoint the converter refuses; the message names the config key or the tensor."""


# ---------------------------------------------------------------- safetensors (read directly)
# The format is an 8-byte little-endian header size, a JSON header and raw little-endian data.
# Reading it with NumPy memory maps keeps bf16 support without torch and loads one tensor at a time.
_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file


class Checkpoint:
    """The tensors of a checkpoint folder (one file, or shards listed by an index file)."""

    def __init__(self, folder: Path):
        self.folder = folder
        index = sorted(folder.glob("*.safetensors.index.json"))
        if index:
            try:
                weight_map = json.loads(read_regular(index[0]))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ConvertError(f"{index[0]}: not a safetensors index ({e})") from None
            files = sorted({folder / f for f in weight_map.values()})
        else:
            files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{folder}: no *.safetensors files")
        self.infos: dict[str, TensorInfo] = {}
        for f in files:
            for name, info in self._read_header(f).items():
                if name in self.infos:
                    raise ConvertError(f"{f}: tensor {name} is also in {self.infos[name].file.name}")
                self.infos[name] = info

    @staticmethod
    def _read_header(path: Path) -> dict[str, TensorInfo]:
        try:
            size = path.stat().st_size
            with open_regular(path) as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > size - 8:
                    raise ConvertError(f"{path}: safetensors header of {n} bytes exceeds the file")
                head = json.loads(fh.read(n))
        except (OSError, struct.error, ValueError) as e:
            if isinstance(e, ConvertError):
                raise
            raise ConvertError(f"{path}: not a safetensors file ({e})") from None
        out = {}
        for name, v in head.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = (int(x) for x in v["data_offsets"])
                info = TensorInfo(path, str(v["dtype"]), tuple(int(s) for s in v["shape"]), 8 + n + begin)
            except (KeyError, TypeError, ValueError):
                raise ConvertError(f"{path}: malformed safetensors entry for {name}") from None
            item = np.dtype(_ST_DTYPES.get(info.dtype, "u1")).itemsize
            if info.dtype in _ST_DTYPES and end - begin != math.prod(info.shape) * item:
                raise ConvertError(f"{path}: tensor {name} has {end - begin} bytes for shape {info.shape}")
            if 8 + n + end > size:
                raise ConvertError(f"{path}: tensor {name} runs past the end of the file")
            out[name] = info
        return out

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32 (bf16 and f16 exactly, f64 rounded); non-finite values refused."""
        info = self.infos[name]
        self.check_dtype(name)
        raw = np.memmap(
            info.file, dtype=_ST_DTYPES[info.dtype], mode="r", offset=info.offset, shape=info.shape
        )
        if info.dtype == "BF16":  # bf16 is the top half of an f32
            x = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            with np.errstate(over="ignore"):
                x = raw.astype(np.float32)
        del raw
        if not np.isfinite(x).all():
            raise ConvertError(
                f"{info.file}: tensor {name} holds a non-finite value (or one too large for float32)"
            )
        return x

    def check_dtype(self, name: str) -> None:
        info = self.infos[name]
        if info.dtype not in _ST_DTYPES:
            raise ConvertError(
                f"{info.file}: tensor {name} has dtype {info.dtype}; the converter "
                f"reads {', '.join(_ST_DTYPES)}"
            )


# ---------------------------------------------------------------- architectures
@dataclass(frozen=True)
class Arch:
    """What the converter needs to know of one model_type (from its modeling_*.py)."""

    act_key: str = "hidden_act"
    one_centered_norms: bool = False  # RMSNorm scales by (1 + w): stored weight 1 + w
    qkv_bias: bool = False  # q/k/v always have biases, o_proj none (Qwen2)
    qk_norm: bool = False
    post_norms: bool = False  # Gemma's post-attention / post-FFN norms
    attn_gate: bool = False  # Qwen3.5: q_proj = [query; gate] per head
    gemma: bool = False  # embed_scale, query_pre_attn_scalar, softcaps
    local_rope: bool = False  # Gemma 3: sliding layers use their own RoPE base
    no_rope_layers: bool = False  # SmolLM3
    window: str = "none"  # none | all (Mistral) | types (per layer_types)
    window_gate: str | None = None  # config key that must be true for a window
    layer_kinds: tuple[str, ...] = ("full_attention", "sliding_attention")
    partial_rotary: bool = False
    bias_keys: tuple[str, ...] = ("attention_bias",)  # true means biases on q, k, v and o
    defaults: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, tuple[str, str]] = field(default_factory=dict)  # overrides of LAYER_TENSORS


# Format array -> (HF tensor name after "layers.{i}.", transform). Which entries a layer needs
# comes from the header (mlb.expected_arrays), so one table serves every architecture.
LAYER_TENSORS: dict[str, tuple[str, str]] = {
    "attn_norm": ("input_layernorm.weight", "norm"),
    "wq": ("self_attn.q_proj.weight", "rope"),
    "wk": ("self_attn.k_proj.weight", "rope"),
    "wv": ("self_attn.v_proj.weight", "copy"),
    "wo": ("self_attn.o_proj.weight", "copy"),
    "bq": ("self_attn.q_proj.bias", "rope"),
    "bk": ("self_attn.k_proj.bias", "rope"),
    "bv": ("self_attn.v_proj.bias", "copy"),
    "q_norm": ("self_attn.q_norm.weight", "norm_rope"),
    "k_norm": ("self_attn.k_norm.weight", "norm_rope"),
    "ffn_norm": ("post_attention_layernorm.weight", "norm"),  # Llama's name for the pre-FFN norm
    "w1": ("mlp.gate_proj.weight", "copy"),
    "w2": ("mlp.down_proj.weight", "copy"),
    "w3": ("mlp.up_proj.weight", "copy"),
    # Qwen3.5 linear attention (gated delta rule)
    "lqkv": ("linear_attn.in_proj_qkv.weight", "copy"),
    "lz": ("linear_attn.in_proj_z.weight", "copy"),
    "lb": ("linear_attn.in_proj_b.weight", "copy"),
    "la": ("linear_attn.in_proj_a.weight", "copy"),
    "lconv": ("linear_attn.conv1d.weight", "conv"),
    "dt_bias": ("linear_attn.dt_bias", "copy"),
    "A_log": ("linear_attn.A_log", "copy"),
    "lnorm": ("linear_attn.norm.weight", "copy"),  # Qwen3_5RMSNormGated: plain w
    "lout": ("linear_attn.out_proj.weight", "copy"),
}
GEMMA_TENSORS = {
    "ffn_norm": ("pre_feedforward_layernorm.weight", "norm"),
    "post_attn_norm": ("post_attention_layernorm.weight", "norm"),
    "post_ffn_norm": ("post_feedforward_layernorm.weight", "norm"),
}
GLOBAL_TENSORS = {"tok_emb": ("embed_tokens.weight", "copy"), "final_norm": ("norm.weight", "norm")}

# Class defaults of the transformers config classes (used when config.json omits a key).
_COMMON = dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, head_dim=None, hidden_act="silu"
)
ARCHS: dict[str, Arch] = {
    "llama": Arch(
        bias_keys=("attention_bias", "mlp_bias"), defaults={**_COMMON, "max_position_embeddings": 2048}
    ),
    "mistral": Arch(
        window="all",
        bias_keys=(),
        defaults={
            **_COMMON,
            "max_position_embeddings": 131072,
            "sliding_window": 4096,
            "num_key_value_heads": 8,
        },
    ),
    "qwen2": Arch(
        qkv_bias=True,
        window="types",
        window_gate="use_sliding_window",
        bias_keys=(),
        defaults={
            **_COMMON,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "num_key_value_heads": 32,
            "max_window_layers": 28,
        },
    ),
    "qwen3": Arch(
        qk_norm=True,
        window="types",
        window_gate="use_sliding_window",
        defaults={
            **_COMMON,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "num_key_value_heads": 32,
            "max_window_layers": 28,
            "head_dim": 128,
        },
    ),
    "gemma2": Arch(
        act_key="hidden_activation",
        one_centered_norms=True,
        post_norms=True,
        gemma=True,
        window="types",
        tensors=GEMMA_TENSORS,
        defaults={
            **_COMMON,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "max_position_embeddings": 8192,
            "head_dim": 256,
            "num_key_value_heads": 4,
            "sliding_window": 4096,
            "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    "gemma3_text": Arch(
        act_key="hidden_activation",
        one_centered_norms=True,
        qk_norm=True,
        post_norms=True,
        gemma=True,
        local_rope=True,
        window="types",
        tensors=GEMMA_TENSORS,
        defaults={
            **_COMMON,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "max_position_embeddings": 131072,
            "head_dim": 256,
            "num_key_value_heads": 4,
            "sliding_window": 4096,
            "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": None,
            "rope_theta": 1e6,
            "rope_local_base_freq": 10000.0,
            "sliding_window_pattern": 6,
        },
    ),
    "smollm3": Arch(
        no_rope_layers=True,
        window="types",
        window_gate="use_sliding_window",
        bias_keys=("attention_bias", "mlp_bias"),
        defaults={
            **_COMMON,
            "rope_theta": 2e6,
            "tie_word_embeddings": True,
            "max_position_embeddings": 32768,
            "num_key_value_heads": 4,
            "sliding_window": None,
            "no_rope_layer_interval": 4,
        },
    ),
    "qwen3_5_text": Arch(
        one_centered_norms=True,
        qk_norm=True,
        attn_gate=True,
        partial_rotary=True,
        layer_kinds=("full_attention", "linear_attention"),
        tensors={"wq": ("self_attn.q_proj.weight", "q_half"), "wg": ("self_attn.q_proj.weight", "g_half")},
        defaults={
            **_COMMON,
            "max_position_embeddings": 32768,
            "head_dim": 256,
            "num_key_value_heads": 4,
            "partial_rotary_factor": 0.25,
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
        },
    ),
}
# Multimodal wrappers: the text model's config is text_config; tying is a top-level key.
WRAPPERS = {"gemma3": ("gemma3_text", True), "qwen3_5": ("qwen3_5_text", False)}
# Prefixes of the text model's tensors, tried in order (wrappers, then plain causal LMs).
PREFIXES = ("model.language_model.", "language_model.model.", "model.")
LM_HEADS = ("lm_head.weight", "language_model.lm_head.weight")

# FFN activation names of transformers' ACT2FN -> header act (the exact same function only).
ACTS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_python_tanh": 1, "gelu_tanh": 1, "gelu_new": 1}
LINEAR_KEYS = {
    "lin_k_heads": "linear_num_key_heads",
    "lin_v_heads": "linear_num_value_heads",
    "lin_k_dim": "linear_key_head_dim",
    "lin_v_dim": "linear_value_head_dim",
    "lin_conv": "linear_conv_kernel_dim",
}
ROPE_TYPES = {"default": 0, "llama3": 1, "linear": 2, "yarn": 3}


class Config:
    """config.json of the text model with the class defaults of its model_type."""

    def __init__(self, raw: dict, arch: Arch, model_type: str, where: str):
        self.raw, self.arch, self.model_type, self.where = raw, arch, model_type, where

    def __contains__(self, key: str) -> bool:
        return key in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.raw:
            return self.raw[key]
        return self.arch.defaults.get(key, default)

    def integer(self, key: str, value: Any = None, minimum: int = 1) -> int:
        """``value`` (or the config's ``key`` when None) checked to be an integer >= minimum."""
        v = self.get(key) if value is None else value
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < minimum:
            what = "missing" if v is None else f"{v!r}"
            raise ConvertError(f"{self.where}: {key} is {what}, expected an integer >= {minimum}")
        return int(v)

    def num(self, key: str, value: Any, positive: bool = True) -> float:
        if (
            not isinstance(value, numbers.Real)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or (positive and value <= 0)
        ):
            raise ConvertError(
                f"{self.where}: {key} = {value!r}, expected a finite number" + (" > 0" if positive else "")
            )
        return float(value)

    def refuse(self, key: str, why: str) -> ConvertError:
        return ConvertError(f"{self.where}: {key} = {self.get(key)!r}: {why}")


def read_config(folder: Path) -> tuple[Config, bool]:
    """(text-model config, tie_word_embeddings)."""
    path = folder / "config.json"
    try:
        raw = json.loads(read_regular(path))
    except OSError as e:
        raise ConvertError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise ConvertError(f"{path}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConvertError(f"{path}: not a JSON object")
    where = str(path)
    model_type = raw.get("model_type")
    tie = None
    if model_type in WRAPPERS:
        text_type, tie_default = WRAPPERS[model_type]
        tie = raw.get("tie_word_embeddings", tie_default)
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConvertError(f"{path}: model_type {model_type!r} needs a text_config object")
        raw = {**text, "model_type": text.get("model_type", text_type)}
        where += " text_config"
        model_type = raw["model_type"]
    if model_type not in ARCHS:
        raise ConvertError(
            f"{where}: model_type {model_type!r} is not supported (supported: "
            f"{', '.join([*ARCHS, *WRAPPERS])})"
        )
    cfg = Config(raw, ARCHS[model_type], model_type, where)
    if tie is None:
        tie = cfg.get("tie_word_embeddings")
    return cfg, bool(tie)


# ---------------------------------------------------------------- header from the config
@dataclass
class Plan:
    """Everything decided from the config: header, layer flags, and the per-head geometry."""

    header: dict
    flags: list[int] | None
    cfg: Config
    tie: bool
    head_dim: int
    rot_dim: int


def _rope(cfg: Config, params: dict, label: str, head_dim: int) -> tuple[dict, int]:
    """Header RoPE fields of one rope_parameters dict (as transformers standardizes it) and rot_dim."""
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype not in ROPE_TYPES:
        raise ConvertError(
            f"{cfg.where}: {label}.rope_type = {rtype!r}: the format has RoPE {', '.join(ROPE_TYPES)} only"
        )
    theta = cfg.num(f"{label}.rope_theta", params.get("rope_theta"))
    partial = params.get("partial_rotary_factor", 1.0)
    if partial is None:
        partial = 1.0
    partial = cfg.num(f"{label}.partial_rotary_factor", partial)
    if partial != 1.0 and not cfg.arch.partial_rotary:
        raise ConvertError(
            f"{cfg.where}: {label}.partial_rotary_factor = {partial}: {cfg.model_type} "
            "rotates whole heads in transformers"
        )
    rot = int(head_dim * partial)  # as transformers: int(head_dim * partial_rotary_factor)
    if rot <= 0 or rot % 2 or rot > head_dim:
        raise ConvertError(
            f"{cfg.where}: {label}.partial_rotary_factor = {partial} gives "
            f"{rot} rotated dimensions of {head_dim}; the format needs an even number > 0"
        )
    h: dict[str, Any] = {"rope_theta": theta, "rope_type": ROPE_TYPES[rtype]}

    def need(key: str) -> float:
        if params.get(key) is None:
            raise ConvertError(f"{cfg.where}: {label} of type {rtype} has no {key}")
        return cfg.num(f"{label}.{key}", params[key])

    def orig() -> int:
        # transformers: a top-level original_max_position_embeddings wins (Phi-3 style configs),
        # else the rope dict's, else max_position_embeddings.
        v = cfg.get("original_max_position_embeddings", params.get("original_max_position_embeddings"))
        if v is None:
            v = cfg.get("max_position_embeddings")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, numbers.Integral) or v <= 0:
            raise ConvertError(f"{cfg.where}: {label}.original_max_position_embeddings = {v!r}")
        return int(v)

    if rtype == "linear":
        h["rope_factor"] = need("factor")
    elif rtype == "llama3":
        h.update(
            rope_factor=need("factor"),
            rope_low_freq_factor=need("low_freq_factor"),
            rope_high_freq_factor=need("high_freq_factor"),
            rope_orig_max_seq=orig(),
        )
    elif rtype == "yarn":
        o = orig()
        factor = params.get("factor")
        if factor is None:  # transformers: max_position_embeddings / original (DeepSeek style)
            factor = cfg.integer("max_position_embeddings") / o
        factor = cfg.num(f"{label}.factor", factor)
        if params.get("truncate", True) is False:
            raise ConvertError(
                f"{cfg.where}: {label}.truncate = false: the format's yarn floors and "
                "ceils the correction range"
            )

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = params.get("attention_factor")
        if att is None:
            ms, ms_all = params.get("mscale"), params.get("mscale_all_dim")
            att = mscale(factor, ms) / mscale(factor, ms_all) if ms and ms_all else mscale(factor)
        h.update(
            rope_factor=factor,
            rope_orig_max_seq=o,
            rope_low_freq_factor=cfg.num(f"{label}.beta_fast", params.get("beta_fast") or 32.0),
            rope_high_freq_factor=cfg.num(f"{label}.beta_slow", params.get("beta_slow") or 1.0),
            rope_attn_factor=cfg.num(f"{label}.attention_factor", att),
        )
    return h, rot


def _rope_params(cfg: Config) -> tuple[dict, dict | None]:
    """(rope parameters of the global layers, of Gemma 3's sliding layers or None), with
    rope_theta and partial_rotary_factor filled in as transformers' standardize_rope_params does."""
    if cfg.arch.local_rope:
        rp = cfg.get("rope_parameters") or {}
        if rp and not {"full_attention", "sliding_attention"} & set(rp):
            raise ConvertError(
                f"{cfg.where}: rope_parameters must be nested by layer type "
                "(full_attention, sliding_attention) for gemma3_text"
            )
        full = dict(rp.get("full_attention") or {"rope_type": "default"})
        local = dict(rp.get("sliding_attention") or {"rope_type": "default"})
        if cfg.get("rope_scaling"):
            full.update(cfg.get("rope_scaling"))
        full.setdefault("rope_theta", cfg.get("rope_theta"))
        local.setdefault("rope_theta", cfg.get("rope_local_base_freq"))
        return full, local
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    params.setdefault("rope_theta", cfg.get("rope_theta"))
    if cfg.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    return params, None


def _refuse_unsupported(cfg: Config) -> None:
    for key in cfg.arch.bias_keys:
        if cfg.get(key):
            raise cfg.refuse(key, "biases on o_proj / the FFN have no place in the format")
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(key):
            raise cfg.refuse(key, "mixture-of-experts models are not supported")
    if cfg.get("use_bidirectional_attention"):
        raise cfg.refuse("use_bidirectional_attention", "the format's attention is causal")


def _act(cfg: Config) -> int:
    key = cfg.arch.act_key
    name = cfg.get(key)
    if name not in ACTS:
        raise cfg.refuse(key, f"the format's FFN activations are {', '.join(ACTS)}")
    if cfg.arch.attn_gate and ACTS[name] != 0:
        # Qwen3.5's linear-attention convolution uses hidden_act too; the format's is SiLU.
        raise cfg.refuse(key, "Qwen3.5's convolution activation must be SiLU in the format")
    return ACTS[name]


def _layer_types(cfg: Config, n_layers: int) -> list[str]:
    """layer_types from the config, or the default pattern of the model's config class."""
    kinds = cfg.get("layer_types")
    if kinds is None:
        mt = cfg.model_type
        if mt == "gemma2":
            kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
        elif mt == "gemma3_text":
            pattern = cfg.integer(
                "sliding_window_pattern",
                cfg.raw.get("sliding_window_pattern", cfg.raw.get("_sliding_window_pattern", 6)),
            )
            kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
        elif mt == "qwen3_5_text":
            every = cfg.integer("full_attention_interval")
            kinds = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
        elif mt in ("qwen2", "qwen3"):
            windowed = cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None
            first = cfg.integer("max_window_layers", minimum=0)
            kinds = [
                "sliding_attention" if windowed and i >= first else "full_attention" for i in range(n_layers)
            ]
        elif mt == "smollm3":
            windowed = cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None
            kinds = [
                "sliding_attention" if windowed and not r else "full_attention"
                for r in _rope_layers(cfg, n_layers)
            ]
        else:
            kinds = ["full_attention"] * n_layers
    if not isinstance(kinds, list) or len(kinds) != n_layers:
        raise cfg.refuse("layer_types", f"expected a list of {n_layers} layer types")
    bad = [k for k in kinds if k not in cfg.arch.layer_kinds]
    if bad:
        raise cfg.refuse("layer_types", f"{bad[0]!r} is not one of {', '.join(cfg.arch.layer_kinds)}")
    return kinds


def _rope_layers(cfg: Config, n_layers: int) -> list[int]:
    """SmolLM3's no_rope_layers: 1 where the layer uses RoPE, 0 where it does not."""
    v = cfg.get("no_rope_layers")
    if v is None:
        every = cfg.integer("no_rope_layer_interval")
        v = [int((i + 1) % every != 0) for i in range(n_layers)]
    if not isinstance(v, list) or len(v) != n_layers or any(x not in (0, 1) for x in v):
        raise cfg.refuse("no_rope_layers", f"expected {n_layers} values of 0 or 1")
    return v


def plan_header(cfg: Config, tie: bool) -> Plan:
    """The MLB header (fields that are not zero) and layer flags the config implies."""
    arch = cfg.arch
    _refuse_unsupported(cfg)
    dim = cfg.integer("hidden_size")
    n_layers = cfg.integer("num_hidden_layers")
    n_heads = cfg.integer("num_attention_heads")
    n_kv = cfg.integer("num_key_value_heads", cfg.get("num_key_value_heads") or n_heads)
    head_dim = cfg.integer("head_dim", cfg.get("head_dim") or dim // n_heads)  # None: dim / n_heads
    max_seq = cfg.integer("max_position_embeddings")
    h: dict[str, Any] = {
        "dim": dim,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "hidden_dim": cfg.integer("intermediate_size"),
        "vocab": cfg.integer("vocab_size"),
        "max_seq": max_seq,
        "norm_eps": cfg.num("rms_norm_eps", cfg.get("rms_norm_eps"), positive=False),
        "shared_classifier": int(tie),
        "qkv_bias": int(arch.qkv_bias),
        "qk_norm": int(arch.qk_norm),
        "post_norms": int(arch.post_norms),
        "attn_gate": int(arch.attn_gate),
        "act": _act(cfg),
        # head_dim only when it is not dim / n_heads (zero keeps the older meaning)
        "head_dim": 0 if dim % n_heads == 0 and head_dim == dim // n_heads else head_dim,
    }
    global_rope, local_rope = _rope_params(cfg)
    rope, rot = _rope(
        cfg,
        global_rope,
        "rope_parameters" if not arch.local_rope else "rope_parameters.full_attention",
        head_dim,
    )
    h.update(rope)
    h["rot_dim"] = 0 if rot == head_dim else rot
    if arch.gemma:
        h["embed_scale"] = dim**0.5  # transformers: hidden_size**0.5
        qpas = cfg.num("query_pre_attn_scalar", cfg.get("query_pre_attn_scalar"))
        h["attn_scale"] = 0.0 if qpas == head_dim else qpas**-0.5  # zero means 1/sqrt(head_dim)
        for key, hk in (
            ("attn_logit_softcapping", "attn_softcap"),
            ("final_logit_softcapping", "final_softcap"),
        ):
            v = cfg.get(key)
            h[hk] = 0.0 if v is None else cfg.num(key, v)

    kinds = _layer_types(cfg, n_layers)
    flags = [0] * n_layers
    # Sliding window: which layers transformers windows, and with which size.
    window = cfg.get("sliding_window")
    if arch.window == "none" or (arch.window_gate and not cfg.get(arch.window_gate)):
        window = None
    windowed = [arch.window == "all" or k == "sliding_attention" for k in kinds]
    if window is not None and any(windowed):
        window = cfg.integer("sliding_window")
        if window >= max_seq:
            window = None  # every position the model allows is inside the window (decision)
    if window is not None and any(windowed):
        h["sliding_window"] = window
        flags = [f | (1 if w else 0) for f, w in zip(flags, windowed, strict=True)]
    if arch.local_rope and "sliding_attention" in kinds:
        local, local_rot = _rope(cfg, local_rope, "rope_parameters.sliding_attention", head_dim)
        if local["rope_type"] != 0:
            raise ConvertError(
                f"{cfg.where}: rope_parameters.sliding_attention has RoPE scaling; the "
                "format's local RoPE base is used unscaled"
            )
        if local_rot != rot:
            raise ConvertError(
                f"{cfg.where}: the sliding layers rotate {local_rot} dimensions, the "
                f"global ones {rot}; the format has one rot_dim"
            )
        h["rope_local_theta"] = local["rope_theta"]
        flags = [f | (2 if k == "sliding_attention" else 0) for f, k in zip(flags, kinds, strict=True)]
    if arch.no_rope_layers:
        flags = [f | (0 if r else 4) for f, r in zip(flags, _rope_layers(cfg, n_layers), strict=True)]
    if "linear_attention" in kinds:
        flags = [f | (8 if k == "linear_attention" else 0) for f, k in zip(flags, kinds, strict=True)]
        h.update({f: cfg.integer(k) for f, k in LINEAR_KEYS.items()})
    # Without layer flags the window applies to every layer: flags are needed only when the
    # layers differ, or when any layer has a bit other than the window.
    if any(f != flags[0] for f in flags) or flags[0] & ~1:
        h["layer_flags"] = 1
        out_flags: list[int] | None = flags
    else:
        out_flags = None
    return Plan(h, out_flags, cfg, tie, head_dim, rot)


# ---------------------------------------------------------------- tensors
def pair_permutation(head_dim: int, rot_dim: int) -> np.ndarray:
    """Index array p with new[k] = old[p[k]]: rotate-half pairs (j, j + rot/2) become (2j, 2j+1)."""
    half = rot_dim // 2
    p = np.arange(head_dim)
    p[:rot_dim] = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    return p


@dataclass(frozen=True)
class Source:
    """One format array: the HF tensor it comes from, how it becomes the array, and back."""

    tensor: str
    transform: Callable[[np.ndarray], np.ndarray]
    inverse: Callable[[np.ndarray, np.ndarray], None]  # (format array, HF tensor to write into)


def _transforms(plan: Plan) -> dict[str, tuple[Callable, Callable, Callable]]:
    """kind -> (transform, inverse, HF shape from the format shape). The inverse writes a format
    array back into (its part of) the HF tensor; the golden generator uses it to put dequantized
    weights into the transformers model."""
    p = pair_permutation(plan.head_dim, plan.rot_dim)
    pinv = np.argsort(p)
    hd = plan.head_dim
    one = np.float32(1.0)
    fold = plan.cfg.arch.one_centered_norms

    def norm(x: np.ndarray) -> np.ndarray:  # (1 + w) in float32, as transformers computes it
        return one + x if fold else x

    def unnorm(x: np.ndarray) -> np.ndarray:
        return x - one if fold else x

    def rope_rows(x: np.ndarray, perm: np.ndarray = p) -> np.ndarray:
        return x.reshape(-1, hd, *x.shape[1:])[:, perm].reshape(x.shape)

    def half(part: int) -> Callable[[np.ndarray], np.ndarray]:
        def f(x: np.ndarray) -> np.ndarray:  # q_proj rows: per head hd query rows, hd gate rows
            y = x.reshape(-1, 2, hd, x.shape[1])[:, part].reshape(-1, x.shape[1])
            return rope_rows(y) if part == 0 else y

        return f

    def unhalf(part: int) -> Callable[[np.ndarray, np.ndarray], None]:
        def f(x: np.ndarray, into: np.ndarray) -> None:
            y = rope_rows(x, pinv) if part == 0 else x
            into.reshape(-1, 2, hd, into.shape[1])[:, part] = y.reshape(-1, hd, into.shape[1])

        return f

    def put(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray, np.ndarray], None]:
        def f(x: np.ndarray, into: np.ndarray) -> None:
            into[...] = fn(x).reshape(into.shape)

        return f

    same = lambda s: s
    return {
        "copy": (lambda x: x, put(lambda x: x), same),
        "norm": (norm, put(unnorm), same),
        "rope": (rope_rows, put(lambda x: rope_rows(x, pinv)), same),
        "norm_rope": (lambda x: norm(x)[p], put(lambda x: unnorm(x[pinv])), same),
        "q_half": (half(0), unhalf(0), lambda s: (2 * s[0], s[1])),
        "g_half": (half(1), unhalf(1), lambda s: (2 * s[0], s[1])),
        "conv": (lambda x: x.reshape(x.shape[0], x.shape[-1]), put(lambda x: x), lambda s: (s[0], 1, s[1])),
    }


def plan_tensors(plan: Plan, ckpt: Checkpoint) -> dict[str, Source]:
    """Format array name -> Source, checked against the checkpoint's names and shapes; tensors
    of the text model the format has no place for are refused."""
    names = ckpt.infos
    prefix = next((p for p in PREFIXES if f"{p}embed_tokens.weight" in names), None)
    if prefix is None:
        raise ConvertError(f"{ckpt.folder}: missing tensor model.embed_tokens.weight")
    h = mlb.full_header(plan.header)
    want = mlb.expected_arrays(h, plan.flags)
    table = {**LAYER_TENSORS, **plan.cfg.arch.tensors}
    kinds = _transforms(plan)
    out: dict[str, Source] = {}
    for name, (_, shape) in want.items():
        if name == "wcls":
            tensor, kind = next((t for t in LM_HEADS if t in names), LM_HEADS[0]), "copy"
        elif name.startswith("layers."):
            _, i, base = name.split(".")
            suffix, kind = table[base]
            tensor = f"{prefix}layers.{i}.{suffix}"
        else:
            suffix, kind = GLOBAL_TENSORS[name]
            tensor = prefix + suffix
        transform, inverse, hf_shape_of = kinds[kind]
        hf_shape = tuple(hf_shape_of(shape))
        if tensor not in names:
            raise ConvertError(f"{ckpt.folder}: missing tensor {tensor} (for {name})")
        if names[tensor].shape != hf_shape:
            raise ConvertError(
                f"{ckpt.folder}: tensor {tensor} has shape {list(names[tensor].shape)}, "
                f"config.json implies {list(hf_shape)}"
            )
        ckpt.check_dtype(tensor)  # before writing starts; values are checked while streaming
        out[name] = Source(tensor, transform, inverse)
    used = {s.tensor for s in out.values()}
    if plan.tie:  # transformers ties lm_head to embed_tokens and ignores a stored lm_head
        for t in LM_HEADS:
            if t in names:
                if names[t].shape != names[prefix + "embed_tokens.weight"].shape:
                    raise ConvertError(
                        f"{ckpt.folder}: tie_word_embeddings is true but {t} has shape "
                        f"{list(names[t].shape)}, embed_tokens "
                        f"{list(names[prefix + 'embed_tokens.weight'].shape)}"
                    )
                used.add(t)
    wrapped = prefix != "model."
    for t in sorted(names):
        if t in used or t.endswith("rotary_emb.inv_freq"):
            continue
        if t.startswith(prefix) or not wrapped and not t.startswith("mtp."):
            raise ConvertError(
                f"{ckpt.folder}: unexpected tensor {t}: the format has no place for it "
                "(a config feature the converter does not support?)"
            )
    return out


class LazyArrays(Mapping):
    """The writer's arrays, each loaded and transformed only when the writer asks for it."""

    def __init__(self, sources: dict[str, Source], ckpt: Checkpoint):
        self.sources, self.ckpt = sources, ckpt

    def __getitem__(self, name: str) -> np.ndarray:
        src = self.sources[name]
        return np.ascontiguousarray(src.transform(self.ckpt.load(src.tensor)))

    def __contains__(self, name: object) -> bool:  # Mapping's default would load the tensor
        return name in self.sources

    def __iter__(self) -> Iterator[str]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)


def unconvert(hf_dir: str | os.PathLike, model: mlb.Model) -> dict[str, np.ndarray]:
    """HF tensor name -> float32 array holding the .mlb's (dequantized) weights in the layout of
    the checkpoint in ``hf_dir``: the inverse of every transform of :func:`convert`. Tensors the
    format does not store (a tied lm_head) are absent."""
    folder = Path(hf_dir)
    cfg, tie = read_config(folder)
    plan = plan_header(cfg, tie)
    plan.header.update(
        wtype=model.header["wtype"], q8_mask=model.header["q8_mask"], scale_f16=model.header["scale_f16"]
    )
    ckpt = Checkpoint(folder)
    out: dict[str, np.ndarray] = {}
    for name, src in plan_tensors(plan, ckpt).items():
        if src.tensor not in out:
            out[src.tensor] = np.zeros(ckpt.infos[src.tensor].shape, np.float32)
        src.inverse(model.weights(name), out[src.tensor])
    return out


# ---------------------------------------------------------------- options
CLASS_BITS: dict[str, int] = specs.load("mlb_body")["class_bits"]


def q8_mask_bits(classes: Iterable[str] | int) -> tuple[int, list[str]]:
    """(q8_mask, notes): the bits of the named matrix classes, and a note for every named class
    that shares its bit with classes not named (they become Q8_0 too)."""
    if isinstance(classes, numbers.Integral):
        return int(classes), []
    names = [c.strip() for c in classes if c.strip()]
    bad = [c for c in names if c not in CLASS_BITS]
    if bad:
        raise ConvertError(f"--q8-mask: unknown class {bad[0]!r} (classes: {', '.join(CLASS_BITS)})")
    bits, notes = 0, []
    for c in names:
        bits |= CLASS_BITS[c]
        others = [o for o, b in CLASS_BITS.items() if b == CLASS_BITS[c] and o != c and o not in names]
        if others:
            notes.append(
                f"--q8-mask {c}: {', '.join(others)} share its bit ({CLASS_BITS[c]}) and are "
                "stored as Q8_0 too"
            )
    return bits, notes


def convert(
    hf_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    wtype: str = "q8_0",
    f16_scales: bool = False,
    q8_mask: Iterable[str] | int = (),
    q4_rule: str | None = None,
    imatrix: str | os.PathLike | mlb.Imatrix | None = None,
) -> dict:
    """Convert the checkpoint in ``hf_dir`` to ``out_path``; returns the header written (every
    field). Raises ConvertError (or mlb.MLBError from the writer); leaves no partial file."""
    folder = Path(hf_dir)
    if wtype not in ("q8_0", "q4_0"):
        raise ConvertError(f"wtype {wtype!r} is not q8_0 or q4_0")
    mask, _ = q8_mask_bits(q8_mask)
    if wtype == "q8_0" and (mask or q4_rule is not None or imatrix is not None):
        raise ConvertError("--q8-mask, --q4-rule and --imatrix apply to --wtype q4_0 only")
    cfg, tie = read_config(folder)
    plan = plan_header(cfg, tie)
    if q4_rule is None:  # the seed: round is the default for Gemma 3 (QAT checkpoints expect it)
        q4_rule = "round" if cfg.model_type == "gemma3_text" else "search"
    if q4_rule not in ("search", "round"):
        raise ConvertError(f"--q4-rule {q4_rule!r} is not search or round")
    if imatrix is not None and q4_rule == "round":
        raise ConvertError(
            "--imatrix needs --q4-rule search (the round rule ignores importance; "
            f"it is the default for {cfg.model_type})"
        )
    plan.header.update(wtype=layout.WTYPE_IDS[wtype.upper()], q8_mask=mask, scale_f16=int(f16_scales))
    try:
        h = mlb.full_header(plan.header)
    except mlb.MLBError as e:
        raise ConvertError(f"{cfg.where}: {e}") from None
    bad = loader.header_problem(h, bytes(plan.flags) if plan.flags is not None else None)
    if bad:
        raise ConvertError(f"{cfg.where}: the model does not fit the MLB v1 format: {bad[1]} [{bad[0]}]")
    im = mlb.read_imatrix(imatrix) if isinstance(imatrix, (str, os.PathLike)) else imatrix
    ckpt = Checkpoint(folder)
    sources = plan_tensors(plan, ckpt)
    mlb.write(out_path, plan.header, LazyArrays(sources, ckpt), flags=plan.flags, q4_rule=q4_rule, imatrix=im)
    return h


def main(argv: list[str] | None = None, prog: str = "convert.py") -> int:
    ap = exits.ArgumentParser(
        prog=prog,
        description="Convert a Hugging Face checkpoint (config.json + safetensors) to an MLB v1 model file.",
    )
    ap.add_argument("hf_dir", help="checkpoint folder")
    ap.add_argument("out", help="output .mlb file")
    ap.add_argument("--wtype", choices=("q8_0", "q4_0"), default="q8_0")
    ap.add_argument("--f16-scales", action="store_true", help="store block scales as f16")
    ap.add_argument(
        "--q8-mask",
        default="",
        metavar="CLASS[,CLASS]",
        help=f"Q4_0 models: classes stored as Q8_0 ({', '.join(CLASS_BITS)})",
    )
    ap.add_argument(
        "--q4-rule",
        choices=("search", "round"),
        default=None,
        help="Q4_0 rule (default: round for gemma3_text, search otherwise)",
    )
    ap.add_argument("--imatrix", metavar="FILE", help="MLI1 importance matrix (search rule)")
    args = ap.parse_args(argv)
    try:
        classes = args.q8_mask.split(",") if args.q8_mask else []
        _, notes = q8_mask_bits(classes)
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
        h = convert(
            args.hf_dir,
            args.out,
            wtype=args.wtype,
            f16_scales=args.f16_scales,
            q8_mask=classes,
            q4_rule=args.q4_rule,
            imatrix=args.imatrix,
        )
    except (ConvertError, mlb.MLBError) as e:
        print(f"mlconf: error: {e}", file=sys.stderr)
        return exits.USAGE
    except OSError as e:
        print(f"mlconf: error: {args.out}: {e.strerror or e}", file=sys.stderr)
        return exits.USAGE
    print(
        f"wrote {args.out}: {h['n_layers']} layers, dim {h['dim']}, vocab {h['vocab']}, "
        f"{args.wtype}, {os.path.getsize(args.out)} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
