"""BitNet goldens from independent oracles: a PyTorch BitLinear model and bitnet.cpp's packing loop.

    python tools/golden_bitnet.py            every case of CASES
    python tools/golden_bitnet.py NAME ...   some of them

Embedding cases (CASES): build a tiny seeded BitNet embedding checkpoint (tools/bitnet_models.py;
students with hidden_size 128 so every projection is I2_S-packable) or its float teacher (no
per-projection norms), convert it with tools/convert_bitnet.py, and run the oracles on the
weights as the GGUF stores them (``as_stored``): for a student, transformers' Qwen3Model /
Gemma3TextModel with every attention and MLP nn.Linear replaced by a BitLinear written here
from seed 004 (RMSNorm(x, <proj>.norm.weight) -> per-row int8 activations, half away from zero
-> per-tensor ternary weights -> matmul -> rescale; without quantization for the float
reading); for a teacher, transformers' plain model. Writes golden/bitnet/NAME.gguf and
golden/bitnet/NAME.npz:

  reading                        str             the file's own reading: ternary (i2_s) or float
  tokens_0, tokens_1, tokens_2   int32 (1,), (5,), (12,)   (12 > Gemma's sliding window 8)
  {pooling}_{i}                  float32 (dim,)  pooled last hidden state in the own reading,
                                                 pooling mean/cls/last
  {pooling}_norm_{i}             float32 (dim,)  the same, torch.nn.functional.normalize'd
  ternary_{pooling}[_norm]_{i}   float32 (dim,)  f32/f16 students: the ternary reading too
  pins_call, pins_index          int32 (P,)      students: the ternary oracle's int8 activations
  pins_value                     int16 (P,)      within PIN_MARGIN of a rounding boundary: BitLinear
                                                 call number (in run order), flat index, rounding

Packing case (i2s_edge): golden/bitnet/i2s_edge.npz holds, per tensor NAME, ``w_NAME`` (float32
(rows, cols)) and ``payload_NAME`` (uint8, rows * cols / 4 + 32): the I2_S bytes of an
independent transcription of BitNet's embedding converter (quantize_to_i2_s, plain Python, its
loop order), for the ternarize edge cases of specs/i2s.yaml and three seeded random tensors.
``names`` lists the tensor names.

Nothing here imports backends/ or the harness; torch, transformers and gguf are imported inside
the functions (the ``oracle`` extra). Re-derived and compared by tests/test_golden_bitnet.py
(pytest -m oracle).
"""

from __future__ import annotations

import struct
import sys
import tempfile
import zlib
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path

import numpy as np

from mlconf.golden import GOLDEN_DIR
from mlconf.tools import bitnet_models, golden
from mlconf.tools.files import atomic_write

SEED = 7
LENGTHS = (1, 5, 12)  # 12 exceeds Gemma 3's sliding window (8)
POOLINGS = ("mean", "cls", "last")
OUT = GOLDEN_DIR / "bitnet"


@dataclass(frozen=True)
class EmbedCase:
    """One embedding golden: a bitnet_models checkpoint, its GGUF outtype and the oracles' readings.
    Students (per-projection norms) in i2_s are read ternary (the BitLinear oracle); in f32/f16
    as bitnet.cpp reads them, float (the BitLinear oracle without quantization), and ternary as
    the explicit option (``ternary_*`` arrays). Teachers (plain models) are read float by
    transformers' own Qwen3Model / Gemma3TextModel."""

    flavor: str
    outtype: str
    pooling: str  # sentence-transformers' pooling of the checkpoint
    teacher: bool = False
    overrides: dict = field(default_factory=dict)  # config keyword arguments

    @property
    def readings(self) -> dict[str, str]:
        """npz key prefix -> reading: "" is the file's own reading."""
        if self.outtype == "i2_s":
            return {"": "ternary"}
        return {"": "float"} if self.teacher else {"": "float", "ternary_": "ternary"}


# An f16 layer of hidden 128 is at least ~180 KB (every projection has 128 or more columns), so
# qwen3_f16 has one layer, one KV head (GQA 4:1) and a smaller vocabulary (~220 KB in all); the
# I2_S cases keep two layers (Gemma 3: one sliding, one full) and stay under 150 KB. The teachers
# need no 128-wide rows (no I2_S): hidden 64, two heads of 32, one KV head, FFN 64 (~130-160 KB).
_SMALL_TEACHER = {
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
}
CASES: dict[str, EmbedCase] = {
    "qwen3_i2s": EmbedCase("qwen3", "i2_s", "lasttoken", overrides={"hidden_size": 128}),
    "gemma3_i2s": EmbedCase("gemma3_text", "i2_s", "mean", overrides={"hidden_size": 128}),
    "qwen3_f16": EmbedCase(
        "qwen3",
        "f16",
        "lasttoken",
        overrides={"hidden_size": 128, "num_hidden_layers": 1, "num_key_value_heads": 1, "vocab_size": 128},
    ),
    "qwen3_teacher_f16": EmbedCase("qwen3", "f16", "lasttoken", teacher=True, overrides=_SMALL_TEACHER),
    "gemma3_teacher_f16": EmbedCase("gemma3_text", "f16", "mean", teacher=True, overrides=_SMALL_TEACHER),
}
EDGE = "i2s_edge"
NAMES = [*CASES, EDGE]
# seeded random tensors of the packing golden: name -> (rows, cols, seed)
RANDOM_TENSORS = {"random_2x128": (2, 128, 1), "random_3x256": (3, 256, 2), "random_4x384": (4, 384, 3)}


# ---------------------------------------------------------------- the BitLinear oracle
# An int8 activation whose unrounded value |t| lies within PIN_MARGIN (int8 units) of a rounding
# boundary (k + 0.5) is "pinned": its rounding is recorded in the golden (pins_*). The float sums
# before the quantizer change order from host to host (AVX-512 / AVX2 kernels, threads) and move
# t by up to 5.3e-5 (tools/golden_drift.py); near a boundary that is a whole int8 step, which
# moves the embedding far more than the rest of the drift. A re-derivation given the committed
# pins takes their roundings where its own t is within the margin too, so what remains between
# hosts is the continuous drift that specs/tolerances.yaml bounds. The margin is 19x that drift.
PIN_MARGIN = 1e-3


class Pins:
    """The pinned roundings of one oracle run: ``committed`` (arrays pins_call, pins_index,
    pins_value of a golden .npz, or None) are applied; every pin of this run is recorded, and
    ``overridden`` counts the committed roundings that this host would have rounded otherwise."""

    def __init__(self, committed: dict[str, np.ndarray] | None = None):
        self.call = 0
        self.overridden = 0
        self.calls: list[np.ndarray] = []
        self.index: list[np.ndarray] = []
        self.value: list[np.ndarray] = []
        self.committed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if committed is not None:
            calls = np.asarray(committed["pins_call"])
            for c in np.unique(calls):
                sel = calls == c
                self.committed[int(c)] = (
                    np.asarray(committed["pins_index"])[sel],
                    np.asarray(committed["pins_value"])[sel],
                )

    def round(self, t):
        """C round() (half away from zero) of the float64 tensor t, with the pins applied."""
        import torch

        r = torch.sign(t) * torch.floor(t.abs() + 0.5)
        flat_t, flat_r = t.reshape(-1), r.reshape(-1)
        near = torch.nonzero(((flat_t.abs() % 1) - 0.5).abs() < PIN_MARGIN).reshape(-1).numpy()
        if self.call in self.committed:
            idx, val = self.committed[self.call]
            take = np.isin(idx, near)
            idx, val = torch.from_numpy(idx[take]).long(), torch.from_numpy(val[take]).double()
            self.overridden += int((flat_r[idx] != val).sum())
            flat_r[idx] = val
        self.calls.append(np.full(len(near), self.call, dtype=np.int32))
        self.index.append(near.astype(np.int32))
        self.value.append(flat_r[torch.from_numpy(near).long()].numpy().astype(np.int16))
        self.call += 1
        return r

    def arrays(self) -> dict[str, np.ndarray]:
        cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
        return {
            "pins_call": cat(self.calls, np.int32),
            "pins_index": cat(self.index, np.int32),
            "pins_value": cat(self.value, np.int16),
        }


@cache
def _bitlinear_class():
    import torch

    class BitLinear(torch.nn.Module):
        """Seed 004's BitLinear: RMSNorm with the projection's own weight, then (quant) per-row int8
        activations (127 / max|x|, C round: half away from zero) and the per-tensor ternary
        weight (1 / mean|w|, torch.round, clamp to [-1, 1]); the integer product is rescaled.
        ``pins`` (a Pins shared by the model's layers) rounds the activations."""

        def __init__(self, d_in: int, d_out: int, eps: float, quant: bool, pins: Pins):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(d_out, d_in))
            self.norm = torch.nn.Module()
            self.norm.weight = torch.nn.Parameter(torch.ones(d_in))
            self.eps, self.quant, self.pins = eps, quant, pins

        def forward(self, x):
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.weight
            w = self.weight
            if not self.quant:
                return x @ w.T
            a = 127.0 / x.abs().amax(-1, keepdim=True).clamp(min=1e-5)
            t = (x * a).double()  # |t| + 0.5 exact in float64: C round() without a float32 double rounding
            xq = self.pins.round(t).clamp(-128, 127).float()
            # the goldens' weights are on the grid 2^-11 (hf_models.exact_parameters) and sum to
            # fewer than 2^24 grid steps: their float32 sum is exact in any order, so sw is the
            # same bits on every host
            sw = 1.0 / w.abs().mean().clamp(min=1e-5)
            wq = torch.round(w * sw).clamp(-1, 1)
            return (xq @ wq.T) / a / sw

    return BitLinear


def as_stored(sd: dict, gemma: bool, outtype: str) -> dict:
    """The checkpoint as the GGUF stores it: f16 rounding of every tensor (f16) or of all but
    the linear weights (i2_s; those are ternarized from the f32 latent weights). Gemma's
    one-centred norms are stored as f16(1 + w): w' = that - 1 (exact in f32) so HF's 1 + w'
    reproduces it."""
    if outtype == "f32":
        return sd
    out = {}
    for k, v in sd.items():
        if v.ndim == 2 and k.startswith("layers.") and outtype == "i2_s":
            out[k] = v
        elif gemma and v.ndim == 1 and not k.endswith("_proj.norm.weight"):
            out[k] = (1.0 + v).half().float() - 1.0
        else:
            out[k] = v.half().float()
    return out


def oracle_model(folder: str | Path, outtype: str = "f32", quant: bool = True, pins: Pins | None = None):
    """transformers' model of the checkpoint folder with BitLinear projections, float32, eval;
    its activations rounded through ``pins`` (default: a fresh Pins, nothing committed)."""
    import transformers
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg._attn_implementation = "eager"
    cls = transformers.Qwen3Model if cfg.model_type == "qwen3" else transformers.Gemma3TextModel
    model = cls(cfg).float().eval()
    bitlinear = _bitlinear_class()
    pins = pins if pins is not None else Pins()
    for layer in model.layers:
        for parent, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
            (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
        ):
            for nm in names:
                old = getattr(parent, nm)
                setattr(
                    parent, nm, bitlinear(old.in_features, old.out_features, cfg.rms_norm_eps, quant, pins)
                )
    sd = as_stored(load_file(str(folder / "model.safetensors")), cfg.model_type != "qwen3", outtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or not all("inv_freq" in k for k in missing):
        raise RuntimeError(f"{folder}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


def teacher_model(folder: str | Path, outtype: str = "f32"):
    """transformers' plain Qwen3Model / Gemma3TextModel (float32, eval, eager attention) of a
    teacher checkpoint (no per-projection norms) on the weights as the GGUF stores them."""
    import transformers
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg._attn_implementation = "eager"
    cls = transformers.Qwen3Model if cfg.model_type == "qwen3" else transformers.Gemma3TextModel
    model = cls(cfg).float().eval()
    # as_stored(i2_s) would keep 2-D weights f32: a teacher is f32 or f16 only
    sd = as_stored(load_file(str(folder / "model.safetensors")), cfg.model_type != "qwen3", outtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or not all("inv_freq" in k for k in missing):
        raise RuntimeError(f"{folder}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


def teacher_hidden(folder: str | Path, outtype: str, tokens, model=None) -> np.ndarray:
    """The teacher's last hidden state (n, dim) float32 (pass ``model`` to reuse one)."""
    model = model if model is not None else teacher_model(folder, outtype)
    return oracle_hidden(folder, outtype, tokens, model=model)


def oracle_hidden(folder: str | Path, outtype: str, tokens, quant: bool = True, model=None) -> np.ndarray:
    """The oracle's last hidden state (n, dim) float32 of the token ids (pass ``model`` to reuse one)."""
    import torch

    model = model if model is not None else oracle_model(folder, outtype, quant)
    ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64).reshape(1, -1))
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state[0].float().numpy().copy()


def pool(h: np.ndarray, pooling: str, normalize: bool = False) -> np.ndarray:
    """mean over tokens, cls = token 0, last = the final token; normalize: L2 (F.normalize)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
    v = {"mean": lambda: t.mean(0), "cls": lambda: t[0], "last": lambda: t[-1]}[pooling]()
    if normalize:
        v = torch.nn.functional.normalize(v, dim=0)
    return v.numpy().astype(np.float32).copy()


def tokens_for(name: str, vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(SEED + zlib.crc32(name.encode()))  # a case's own stream
    return [rng.integers(3, vocab, n).astype(np.int32) for n in LENGTHS]


def derive_embeddings(
    name: str, out_dir: Path, pins_from: Path | None = None, stats: dict | None = None
) -> tuple[Path, Path]:
    """Write NAME.gguf and NAME.npz into out_dir; returns their paths. ``pins_from``: a folder
    whose NAME.npz holds the pins to apply (a re-derivation of committed goldens); ``stats``
    gets stats[name] = the number of committed pins this host would have rounded otherwise."""
    from mlconf.tools.convert_bitnet import convert

    case = CASES[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path, npz = out_dir / f"{name}.gguf", out_dir / f"{name}.npz"
    with tempfile.TemporaryDirectory(prefix="mlconf-golden-") as tmp:
        ck = bitnet_models.build(
            case.flavor,
            Path(tmp) / "ckpt",
            seed=SEED,
            pooling=case.pooling,
            teacher=case.teacher,
            **case.overrides,
        )
        vocab = bitnet_models.config(case.flavor, **case.overrides).vocab_size
        tmp_gguf = Path(tmp) / "model.gguf"
        convert(ck, tmp_gguf, case.outtype)
        committed = None
        if pins_from is not None and not case.teacher:
            with np.load(Path(pins_from) / f"{name}.npz") as g:
                committed = {k: g[k] for k in ("pins_call", "pins_index", "pins_value")}
        pins = Pins(committed)
        models = {
            "float": teacher_model(ck, case.outtype)
            if case.teacher
            else oracle_model(ck, case.outtype, quant=False),
            "ternary": None if case.teacher else oracle_model(ck, case.outtype, pins=pins),
        }
        arrays: dict[str, np.ndarray] = {"reading": np.array(case.readings[""])}
        seqs = tokens_for(name, vocab)
        for i, toks in enumerate(seqs):
            arrays[f"tokens_{i}"] = toks
        for prefix, reading in case.readings.items():
            for i, toks in enumerate(seqs):
                h = oracle_hidden(ck, case.outtype, toks, model=models[reading])
                for p in POOLINGS:
                    arrays[f"{prefix}{p}_{i}"] = pool(h, p)
                    arrays[f"{prefix}{p}_norm_{i}"] = pool(h, p, normalize=True)
        if not case.teacher:  # pins: the ternary oracle's int8 roundings near a boundary
            arrays.update(pins.arrays())
        if stats is not None:
            stats[name] = pins.overridden
        atomic_write(gguf_path, [tmp_gguf.read_bytes()])
    golden.write_npz(npz, arrays)
    return gguf_path, npz


# ---------------------------------------------------------------- the packing oracle
NUMPY126_BUFFER = 8192  # NumPy 1.26 (bitnet.cpp's pin) reduces a float32 array buffer by buffer


def numpy126_abs_mean(flat: np.ndarray) -> np.float32:
    """np.mean(np.abs(flat)) of a float32 array as NumPy 1.26 computes it, under any NumPy: its
    reduction adds, from 0, np.add.reduce of each 8192-value buffer (a pairwise sum NumPy 1 and 2
    compute alike), then divides in float64 and rounds to float32 (checked against NumPy 1.26.4
    itself: golden/i2s_mean_numpy126.npz, tests/test_golden_bitnet.py)."""
    a = np.abs(flat)
    total = np.float32(0)
    for i in range(0, a.size, NUMPY126_BUFFER):
        total = np.float32(total + np.add.reduce(a[i : i + NUMPY126_BUFFER]))
    return np.float32(np.float64(total) / a.size)


def converter_quantize_to_i2_s(w: np.ndarray) -> bytes:
    """BitNet's embedding converter (utils/convert-bitnet-embedding-to-gguf.py, quantize_to_i2_s),
    step by step in plain Python under its pinned NumPy 1.26: abs_mean = np.mean(np.abs(w)) of the
    float32 tensor, floored at 1e-5; q = np.round(w * (1 / abs_mean)) clipped to [-1, 1] (half to
    even); code -1 -> 0, 0 -> 1, +1 -> 2; byte j of each 128-value block = c[j] << 6 |
    c[j+32] << 4 | c[j+64] << 2 | c[j+96]; then np.float32(abs_mean) and 28 zero bytes."""
    flat = np.asarray(w, dtype=np.float32).reshape(-1)
    if flat.size % 128:
        raise ValueError(f"{flat.size} values: the transcription takes whole blocks of 128")
    abs_mean = numpy126_abs_mean(flat)
    abs_mean = max(abs_mean, 1e-5)
    inv_scale = 1.0 / abs_mean
    q_float = np.round(flat * np.float32(inv_scale)).clip(-1, 1)
    codes = [2 if v > 0.5 else 0 if v < -0.5 else 1 for v in q_float.tolist()]
    out = bytearray()
    for b in range(flat.size // 128):
        c = codes[b * 128 : (b + 1) * 128]
        for j in range(32):
            out.append((c[j] << 6) | (c[j + 32] << 4) | (c[j + 64] << 2) | c[j + 96])
    return bytes(out) + struct.pack("<f", np.float32(abs_mean)) + bytes(28)


def edge_tensors() -> dict[str, np.ndarray]:
    """The ternarize edge cases of specs/i2s.yaml (one 128-value row each) and seeded random ones:
    on a grid of 2^-12 (sums of four seeded uniform integers, std ~0.05), and one of random
    float32 bit patterns (2^-11 .. 1) whose mean is not exact, 8192 values (the most the
    transcription takes). Integers only: the same bits on every host."""
    from mlconf import specs

    num = lambda v: float.fromhex(v) if isinstance(v, str) else float(v)  # noqa: E731
    out: dict[str, np.ndarray] = {}
    for case in specs.load("i2s")["edge_cases"]:
        if case["op"] != "ternarize":
            continue
        spec = case["w"]
        w = np.full((1, 128), num(spec["fill"]), dtype=np.float32)
        for k, v in spec.get("at", {}).items():
            w[0, int(k)] = num(v)
        out[case["name"]] = w
    for name, (rows, cols, seed) in RANDOM_TENSORS.items():
        k = np.random.default_rng(SEED + seed).integers(-180, 181, (4, rows, cols)).sum(axis=0)
        out[name] = np.ldexp(k, -12).astype(np.float32)
    rng = np.random.default_rng(SEED + 4)
    bits = rng.integers(0x3A000000, 0x3F800000, (8, 1024), dtype=np.uint32) | (
        rng.integers(0, 2, (8, 1024), dtype=np.uint32) << 31
    )
    out["random_bits_8x1024"] = bits.view(np.float32)
    return out


def derive_edge(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = edge_tensors()
    arrays: dict[str, np.ndarray] = {"names": np.array(list(tensors))}
    for name, w in tensors.items():
        arrays[f"w_{name}"] = w
        arrays[f"payload_{name}"] = np.frombuffer(converter_quantize_to_i2_s(w), dtype=np.uint8)
    path = out_dir / f"{EDGE}.npz"
    golden.write_npz(path, arrays)
    return path


# ---------------------------------------------------------------- command line
def oracle_version(name: str) -> tuple[str, str]:
    """(oracle distribution, version[+package-version...]) of a case's MANIFEST rows."""
    v = lambda p: metadata.version(p).split("+")[0]  # noqa: E731
    if name == EDGE:  # the converter's transcription: NumPy only (its sums agree in NumPy 1 and 2)
        return "numpy", v("numpy")
    return "transformers", (
        f"{v('transformers')}+torch-{v('torch')}+tokenizers-{v('tokenizers')}+gguf-{v('gguf')}"
    )


def generate(
    names: list[str], out_dir: Path = OUT, pins_from: Path | None = None, stats: dict | None = None
) -> list[Path]:
    """Derive the named goldens into out_dir (see derive_embeddings for pins_from and stats)."""

    def derive(name: str, out: Path) -> list[Path]:
        return [derive_edge(out)] if name == EDGE else list(derive_embeddings(name, out, pins_from, stats))

    written = []
    for name in names:
        oracle, version = oracle_version(name)
        written += golden.generate_cases(
            [name], Path(out_dir), OUT, derive, oracle, version, "tools/golden_bitnet.py"
        )
    return written


def main(argv: list[str] | None = None) -> int:
    return golden.cases_main(
        argv, __doc__, dict.fromkeys(NAMES), OUT, generate, "golden_bitnet.py", "pip install 'mlconf[oracle]'"
    )


if __name__ == "__main__":
    sys.exit(main())
