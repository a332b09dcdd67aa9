"""Logits goldens from Hugging Face transformers (PyTorch, CPU): the forward pass oracle.

    python tools/golden_logits.py            every case of CASES
    python tools/golden_logits.py NAME ...   some of them

For each case: build a tiny random transformers model (tools/hf_models.py, seeded), save it as
safetensors, convert it with tools/convert.py, put the .mlb's dequantized weights back into the
torch model (convert.unconvert), and record transformers' float32 logits for a fixed token
sequence longer than any sliding window of the case. Writes golden/logits/NAME.mlb and
golden/logits/NAME.npz (tokens int64 (T,), logits float32 (T, vocab)) and their MANIFEST rows.
The harness never computes these numbers: the reference forward is compared with them.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from mlconf.golden import GOLDEN_DIR
from mlconf.tools import convert, golden, hf_models, mlb

SEED = 0
N_TOKENS = 20  # longer than every sliding window of the cases (8)
SMALL = dict(intermediate_size=64, vocab_size=128)  # keeps each .mlb well under 150 KB

# name -> (hf_models model, convert options). Every architecture of the converter and every
# feature combination the format adds, with each weight format among them.
CASES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "llama3_rope": ("llama_llama3", {}),
    "linear_rope_f16": ("llama_linear", {"f16_scales": True}),
    "yarn_rope": ("llama_yarn", {}),
    "mistral_q4_search": ("mistral", {"wtype": "q4_0"}),
    "qwen2_bias": ("qwen2", {}),
    "qwen3_qk_norm_f16": ("qwen3", {"f16_scales": True}),
    "qwen3_q4_imatrix": ("qwen3", {"wtype": "q4_0", "imatrix": True}),
    "gemma2_softcap": ("gemma2", {}),
    "gemma3_q4_round": ("gemma3_text", {"wtype": "q4_0", "f16_scales": True}),  # round: Gemma 3 default
    "smollm3_nope": ("smollm3", {}),
    "qwen35_linear": ("qwen3_5_text", {}),
    "qwen35_q4_mask": ("qwen3_5_text", {"wtype": "q4_0", "q8_mask": ["wv", "wo"]}),
}
OUT = GOLDEN_DIR / "logits"


def tokens_for(vocab: int) -> np.ndarray:
    return np.random.default_rng(SEED + 1).integers(3, vocab, N_TOKENS).astype(np.int64)


def oracle_version() -> str:
    return f"{metadata.version('transformers')}+torch-{metadata.version('torch').split('+')[0]}"


def _imatrix(hf_dir: Path, work: Path) -> mlb.Imatrix:
    """A seeded imatrix for the case's shape (an input of the converter, like `mlconf imatrix`;
    the golden is still the transformers logits). Its sums are squares of seeded integers times
    2^-6, spread over three orders of magnitude as a real one's: exact on every host, where a
    forward pass (exp, rsqrt) is not."""
    q8 = work / "imatrix_base.mlb"
    convert.convert(hf_dir, q8)
    h = mlb.read(q8).header
    q_dim = h["n_heads"] * h["head_dim"] if h["head_dim"] else h["dim"]
    im = mlb.Imatrix(
        h["n_layers"], h["dim"], h["hidden_dim"], 0 if q_dim == h["dim"] else q_dim, 64, 64, np.empty(0)
    )
    k = np.random.default_rng(SEED + 2).integers(1, 64, im.expected_len())
    im.sums = (k * k).astype(np.float64) * 2.0**-6
    return im


def derive(name: str, out_dir: Path) -> tuple[Path, Path]:
    """Write NAME.mlb and NAME.npz into out_dir; returns their paths."""
    import torch

    arch, opts = CASES[name]
    opts = dict(opts)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlconf-golden-") as tmp:
        work = Path(tmp)
        model = hf_models.make(arch, seed=SEED, **SMALL)
        hf_dir = hf_models.save(model, work / "hf")
        if opts.pop("imatrix", False):
            opts["imatrix"] = _imatrix(hf_dir, work)
        mlb_path = out_dir / f"{name}.mlb"
        convert.convert(hf_dir, mlb_path, **opts)
        state = convert.unconvert(hf_dir, mlb.read(mlb_path))
        missing, unexpected = model.load_state_dict(
            {k: torch.from_numpy(v) for k, v in state.items()}, strict=False
        )
        if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
            raise RuntimeError(f"{name}: state dict mismatch: missing {missing}, unexpected {unexpected}")
        tokens = tokens_for(model.config.vocab_size)
        with torch.no_grad():
            logits = model(torch.from_numpy(tokens)[None]).logits[0].float().numpy()
    npz = out_dir / f"{name}.npz"
    golden.write_npz(npz, {"tokens": tokens, "logits": logits.astype(np.float32)})
    return mlb_path, npz


def generate(names: list[str], out_dir: Path = OUT) -> list[Path]:
    return golden.generate_cases(
        names, out_dir, OUT, derive, "transformers", oracle_version(), "tools/golden_logits.py"
    )


def main(argv: list[str] | None = None) -> int:
    return golden.cases_main(
        argv, __doc__, CASES, OUT, generate, "golden_logits.py", "pip install 'mlconf[oracle]'"
    )


if __name__ == "__main__":
    sys.exit(main())
