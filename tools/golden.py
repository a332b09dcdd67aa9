"""Goldens derived from independent oracles, never from the code they check (DESIGN.md).

    python tools/golden.py q4_0_round     golden/q4_0_round_gguf.npz from gguf-py's Q4_0
    python tools/golden.py i2s_mean       golden/i2s_mean_numpy126.npz from NumPy 1.26's np.mean
                                          (run it in an environment with numpy==1.26.4)

Each run rewrites the golden file and its line in golden/MANIFEST (sha256, path, oracle, oracle
version, command). Importable as mlconf.tools.golden; it imports neither the harness nor the
backends (only mlconf.golden for the folder), and the oracle only when deriving.

q4_0_round_gguf.npz holds, per block of 32 (N blocks):
  x     float32 (N, 32)   the input
  d     uint16  (N,)      the f16 scale's bits, as gguf-py stores it (little-endian)
  qs    uint8   (N, 16)   the nibbles: byte j = element j (low) | element j + 16 (high)
  kind  uint8   (N,)      index into `kinds`, the family each block was drawn from
  kinds str     (K,)

i2s_mean_numpy126.npz holds, per test tensor i (its values are i2s_mean_inputs(), rebuilt from
the seed: random float32 bit patterns, exact on every host):
  sizes      int64   (T,)   element counts (multiples of 128, as every I2_S tensor)
  mean_bits  uint32  (T,)   the bits of np.float32(np.mean(np.abs(w))) under NumPy 1.26.4: the
                            stored I2_S scale of BitNet's embedding converter, whose requirements
                            pin numpy~=1.26.4 (NumPy 2 sums differently above 8192 values)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

from mlconf.golden import GOLDEN_DIR
from mlconf.tools.files import atomic_write, replacing

BLOCK = 32
SEED = 20240611
F16_MAX_M = 65504.0 * 8  # |largest element| at most this, so d = m / -8 fits in f16
# Below |m| = 2^-124 the scale d = m/-8 is so small that 1/d overflows (from 2^-125 on): gguf-py
# then casts inf and NaN to uint8, which NumPy leaves undefined. Random blocks stay above it.
TINY_M = 2.0**-124
MANIFEST_HEADER = (
    "# sha256 path oracle oracle_version command...  (the command re-derives the file; "
    "oracle_version may add +package-version of what the oracle ran on)"
)


# ---------------------------------------------------------------- inputs
def _limit(x: np.ndarray) -> np.ndarray:
    """Scale down any block whose largest magnitude exceeds F16_MAX_M (keeps its shape)."""
    amax = np.abs(x).max(axis=1, keepdims=True)
    return np.where(amax > F16_MAX_M, x * (F16_MAX_M / np.maximum(amax, 1)), x)


def _edge_blocks() -> list[np.ndarray]:
    z = np.zeros(BLOCK)
    out = [z.copy(), np.full(BLOCK, -0.0), np.where(np.arange(BLOCK) % 2, 0.0, -0.0)]
    for pos in (0, 15, 16, 31):  # the largest element at the ends of both halves
        for sign in (1.0, -1.0):
            b = np.linspace(-1, 1, BLOCK) * 3.0
            b[pos] = sign * 5.0
            out.append(b)
    for first, second in ((0, 31), (16, 15), (3, 4)):  # equal magnitudes, opposite signs
        for sign in (1.0, -1.0):
            b = np.full(BLOCK, 0.25)
            b[first], b[second] = sign * 6.0, -sign * 6.0
            out.append(b)
    for sign in (1.0, -1.0):  # x * id = k + 0.5 exactly (d = -+1): ties, and the clamp at 15
        out.append(np.concatenate([[8.0 * sign], np.arange(-7.5, 8.0, 0.5)[:31] * -sign]))
    half_ulp = float.fromhex("0x1.fffffep-2")  # x * id + 8.5 rounds in float32 (seed rule: 2 roundings)
    out.append(np.array([8.0, half_ulp, -half_ulp, 0.5, -0.5] + [0.0] * 27))
    out.append(np.array([-8.0, half_ulp, -half_ulp, 0.5, -0.5] + [0.0] * 27))
    one = np.zeros(BLOCK)
    one[7] = -3.0  # a single non-zero element
    out.append(one)
    for m in (F16_MAX_M, -F16_MAX_M, 524000.0, -65504.0 * 7.999):  # d at or near the f16 limit
        b = np.linspace(-1, 1, BLOCK) * abs(m) * 0.9
        b[5] = m
        out.append(b)
    for m in (-8 * (1 + 2.0**-11), 8 * (1 + 2.0**-12), -8 * (1 + 3 * 2.0**-11)):  # f16 ties / rounding of d
        b = np.linspace(-7.9, 7.9, BLOCK)
        b[9] = m
        out.append(b)
    for e in (-20, -24, -26, -30, -100, -124):  # f16 subnormal d, f16 underflow, float32 subnormal d
        b = np.linspace(-1, 1, BLOCK) * 2.0**e * 0.75
        b[12] = -(2.0**e)
        out.append(b)
    return out


def _bell(rng: np.random.Generator, shape) -> np.ndarray:
    """A bell-shaped sample on the grid 2^-10: the sum of four uniform integers in [-2^10, 2^10]
    (|v| <= 4, std ~1.15). Integers and powers of two only, so the same bits on every host."""
    k = rng.integers(-1024, 1025, (4, *shape)).sum(axis=0)
    return np.ldexp(k.astype(np.float64), -10)


def q4_0_round_inputs(seed: int = SEED) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(x float32 (N, 32), kind (N,), kinds): seeded blocks of several distributions + edge blocks.

    Every value is built from seeded integers and exact scalings by powers of two (np.ldexp),
    never from a transcendental function (pow, log, exp: NumPy's AVX-512 and AVX2 code paths can
    differ in the last bit), so the golden's inputs are the same bits on every host."""
    rng = np.random.default_rng(seed)

    def scaled(rows: int, lo: int, hi: int) -> np.ndarray:  # a bell block times 2^e, e per row
        return np.ldexp(_bell(rng, (rows, BLOCK)), rng.integers(lo, hi, (rows, 1)))

    fams: dict[str, np.ndarray] = {
        "normal": _bell(rng, (64, BLOCK)),
        "scaled": scaled(64, -20, 14),
        # log-uniform magnitudes per element (2^-4 .. 2^8) under a per-row scale: a few elements
        # far above the rest, as a heavy-tailed distribution gives
        "heavy_tail": np.ldexp(scaled(64, -7, 10), rng.integers(-4, 9, (64, BLOCK))),
        "tiny": scaled(48, -120, -10),
        "uniform": np.ldexp(
            rng.integers(-65536, 65537, (32, BLOCK)).astype(np.float64), rng.integers(-26, 1, (32, 1))
        ),
    }
    # ties: d = +-2^e exactly, elements (k + 0.5) d, so x * id lands on k + 0.5
    e = rng.integers(-20, 16, (48, 1))
    ties = np.ldexp(rng.integers(-8, 8, (48, BLOCK)) + 0.5, e)
    pos = rng.integers(0, BLOCK, 48)
    ties[np.arange(48), pos] = np.ldexp(rng.choice([-8.0, 8.0], 48), e[:, 0])
    fams["ties"] = ties
    fams["edge"] = np.array(_edge_blocks())
    kinds = list(fams)
    x = np.concatenate([_limit(v) for v in fams.values()]).astype(np.float32)
    kind = np.concatenate([np.full(len(v), i, dtype=np.uint8) for i, v in enumerate(fams.values())])
    amax = np.abs(x).max(axis=1)
    if not (np.isfinite(x).all() and (amax <= F16_MAX_M).all() and ((amax == 0) | (amax >= TINY_M)).all()):
        raise AssertionError("q4_0_round inputs outside the range where gguf-py is defined")
    return x, kind, kinds


# ---------------------------------------------------------------- the oracle
def gguf_q4_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gguf-py's Q4_0 of float32 blocks: (d as f16 bits uint16 (N,), nibbles uint8 (N, 16))."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    raw = np.asarray(quantize(np.asarray(x, dtype=np.float32), GGMLQuantizationType.Q4_0))
    raw = raw.reshape(-1, 18)
    d = np.ascontiguousarray(raw[:, :2]).view("<u2").reshape(-1)
    return d.astype("<u2"), np.ascontiguousarray(raw[:, 2:])


def derive_q4_0_round() -> dict[str, np.ndarray]:
    x, kind, kinds = q4_0_round_inputs()
    d, qs = gguf_q4_0(x)
    return {"x": x, "d": d, "qs": qs, "kind": kind, "kinds": np.array(kinds)}


# ---------------------------------------------------------------- the I2_S mean (NumPy 1.26)
I2S_MEAN_SEED = 20261201
# element counts: around the chunk (8192) and pairwise-leaf (128) boundaries, and real shapes
I2S_MEAN_SIZES = [
    128,
    256,
    384,
    1024,
    8064,
    8192,
    8320,
    16384,
    16512,
    24576,
    40960,
    49152,
    128 * 1024,
    640 * 640,
    1024 * 1024,
]


def i2s_mean_inputs(seed: int = I2S_MEAN_SEED) -> list[np.ndarray]:
    """float32 tensors from random bit patterns (exact on every host, and sums that are not):
    the fixed sizes, then 40 random multiples of 128 up to 102400. Even tensors spread over
    2^-31 .. 32, odd ones over 2^-11 .. 1 like weights; random signs."""
    rng = np.random.default_rng(seed)
    sizes = I2S_MEAN_SIZES + [int(k) * 128 for k in rng.integers(1, 801, 40)]
    out = []
    for i, n in enumerate(sizes):
        lo, hi = (0x30000000, 0x42000000) if i % 2 == 0 else (0x3A000000, 0x3F800000)
        bits = rng.integers(lo, hi, n, dtype=np.uint32) | (rng.integers(0, 2, n, dtype=np.uint32) << 31)
        out.append(bits.view(np.float32))
    return out


def derive_i2s_mean() -> dict[str, np.ndarray]:
    if not np.__version__.startswith("1.26."):
        raise RuntimeError(
            f"i2s_mean is NumPy 1.26's np.mean (bitnet.cpp's pin); this is NumPy "
            f"{np.__version__}: run it under pip install numpy==1.26.4"
        )
    ws = i2s_mean_inputs()
    means = np.array([np.float32(np.mean(np.abs(w))) for w in ws], dtype=np.float32)
    return {"sizes": np.array([w.size for w in ws], dtype=np.int64), "mean_bits": means.view(np.uint32)}


# ---------------------------------------------------------------- files
def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """A deterministic .npz (fixed zip timestamps, so the same arrays give the same sha256),
    written to a temporary file and renamed."""
    with replacing(path) as tmp, open(tmp, "wb") as f, zipfile.ZipFile(f, "w") as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(path: Path) -> list[list[str]]:
    """MANIFEST rows: [sha256, path, oracle, oracle_version, command...]; '#' lines are comments."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            rows.append(line.split())
    return rows


def update_manifest(manifest: Path, row: list[str]) -> None:
    """Replace (or add) the row of row[1] (the golden's path), keeping the other rows in order."""
    rows = read_manifest(manifest) if manifest.exists() else []
    rows = [r for r in rows if r[1] != row[1]] + [row]
    rows.sort(key=lambda r: r[1])
    text = "\n".join([MANIFEST_HEADER] + [" ".join(r) for r in rows]) + "\n"
    atomic_write(manifest, [text.encode("utf-8")])


def generate_cases(
    names: list[str], out_dir: Path, default_dir: Path, derive, oracle: str, version: str, script: str
) -> list[Path]:
    """Derive the files of every named case into out_dir and record them in a MANIFEST: golden/'s
    (paths relative to golden/) when out_dir is the default folder, else out_dir's own."""
    written = []
    for name in names:
        for path in derive(name, out_dir):
            default = Path(out_dir) == default_dir
            rel = path.relative_to(GOLDEN_DIR).as_posix() if default else path.name
            manifest = GOLDEN_DIR / "MANIFEST" if default else Path(out_dir) / "MANIFEST"
            update_manifest(manifest, [sha256(path), rel, oracle, version, "python", script, name])
            written.append(path)
    return written


def cases_main(
    argv: list[str] | None, doc: str, cases, default_dir: Path, generate, script: str, install_hint: str
) -> int:
    """The command line of a case-based golden generator (golden_logits.py, golden_tokenizers.py)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"cases (default all): {', '.join(cases)}")
    ap.add_argument("--out", type=Path, default=default_dir, help="folder (default: %(default)s)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in cases]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(cases)}")
    try:
        paths = generate(args.names or list(cases), args.out)
    except ImportError as e:
        print(f"{script}: the oracle is not installed ({e}); {install_hint}", file=sys.stderr)
        return 2
    for p in paths:
        print(f"{p}: {p.stat().st_size} bytes")
    return 0


# Oracles run in an upstream system's pinned environment, which the `oracle` extra does not
# install (distribution -> the version the golden needs): such goldens re-derive only there.
PINNED_ORACLES = {"numpy": "1.26.4"}  # bitnet.cpp's converter: llama.cpp's numpy~=1.26.4

GOLDENS: dict[str, tuple[str, str, Callable[[], dict[str, np.ndarray]]]] = {
    # name: (file in golden/, oracle distribution, derive)
    "q4_0_round": ("q4_0_round_gguf.npz", "gguf", derive_q4_0_round),
    "i2s_mean": ("i2s_mean_numpy126.npz", "numpy", derive_i2s_mean),
}


def generate(name: str, out_dir: Path = GOLDEN_DIR) -> Path:
    fname, oracle, derive = GOLDENS[name]
    path = Path(out_dir) / fname
    write_npz(path, derive())
    version = metadata.version(oracle)
    update_manifest(
        Path(out_dir) / "MANIFEST", [sha256(path), fname, oracle, version, "python", "tools/golden.py", name]
    )
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=sorted(GOLDENS))
    ap.add_argument("--out", type=Path, default=GOLDEN_DIR, help="golden folder (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        path = generate(args.name, args.out)
    except ImportError as e:
        print(f"golden.py: the oracle is not installed ({e}); pip install 'mlconf[oracle]'", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"golden.py: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {path.stat().st_size} bytes, sha256 {sha256(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
