"""How far the oracles' outputs move between hosts: the measurement behind the oracle_rederive_*
tolerances of specs/tolerances.yaml.

    python tools/golden_drift.py [--profile NAME]... [--json]

Exit status 1 when an input differs or an output moved beyond its bound.

A golden's inputs (weights, tokens, texts) are exact on every host; its oracle outputs (the
transformers logits, the BitLinear embeddings) are not: PyTorch, MKL, oneDNN and NumPy pick their
kernels from the CPU (AVX-512, AVX2, baseline) and the thread count, and the float sums change
order with them. One machine can play several hosts: each profile below re-derives every logits
and BitNet golden in a subprocess whose environment forces those libraries onto another code path
and thread count (an AVX2-only AMD EPYC, a baseline x86-64, one thread). For each profile the tool
checks that every input file is byte-identical to the committed one and prints the distances of
the outputs from the committed goldens (conformance/compare.distances), and how many of the
committed pins of the BitNet oracle (golden_bitnet.Pins: int8 roundings near a boundary) that
host would have rounded the other way. Needs the `oracle` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from mlconf.golden import GOLDEN_DIR

# NumPy's AVX-512 dispatch targets: disabled, NumPy runs its AVX2 (or baseline) loops.
_NPY_AVX512 = "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"
# name -> environment. ATEN_CPU_CAPABILITY: PyTorch's own kernels; MKL_ENABLE_INSTRUCTIONS: MKL's
# BLAS (torch's matmul); ONEDNN_MAX_CPU_ISA: oneDNN; NPY_DISABLE_CPU_FEATURES: NumPy.
PROFILES: dict[str, dict[str, str]] = {
    "this-host-2t": {"OMP_NUM_THREADS": "2"},
    "this-host-1t": {"OMP_NUM_THREADS": "1"},
    "avx2-2t": {
        "OMP_NUM_THREADS": "2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NPY_DISABLE_CPU_FEATURES": _NPY_AVX512,
    },
    "avx2-1t": {
        "OMP_NUM_THREADS": "1",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NPY_DISABLE_CPU_FEATURES": _NPY_AVX512,
    },
    "baseline-1t": {
        "OMP_NUM_THREADS": "1",
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "NPY_DISABLE_CPU_FEATURES": _NPY_AVX512 + " AVX2 FMA3 F16C AVX",
    },
}
# The output arrays of each golden family (every other array and file is an input: exact).
FAMILIES = {"logits": "logits", "bitnet": "embeddings"}


def _derive(out: Path) -> None:
    """Re-derive every logits and BitNet golden into out/logits and out/bitnet (in this process),
    the BitNet ones with the committed pins; out/pins.json: how many pins this host overrode."""
    from mlconf.tools import golden_bitnet, golden_logits

    golden_logits.generate(sorted(golden_logits.CASES), out / "logits")
    stats: dict[str, int] = {}
    golden_bitnet.generate(list(golden_bitnet.NAMES), out / "bitnet", GOLDEN_DIR / "bitnet", stats)
    (out / "pins.json").write_text(json.dumps(stats), encoding="utf-8")


def kind_of(family: str, key: str) -> str:
    """ "output" (an oracle output), "pins" (roundings the oracle recorded, golden_bitnet.Pins) or
    "input" (exact on every host) for array ``key`` of a golden .npz of ``family``."""
    if family == "logits":
        return "output" if key == "logits" else "input"
    if key.startswith("pins_"):
        return "pins"
    return "input" if key.startswith(("tokens_", "w_", "payload_", "names", "reading")) else "output"


def compare(fresh_root: Path, golden_root: Path = GOLDEN_DIR, families=tuple(FAMILIES)) -> dict:
    """{"inputs_differ": [file or file:array ...], "logits": {worst distances}, "embeddings": {...}}
    of the re-derived goldens under fresh_root/<family> against the committed ones. The worst
    distances are each metric's largest over the files, "where" names the file of the largest
    max_abs; compare them with the oracle_rederive_<kind> tolerance (``within``)."""
    from mlconf.compare import distances

    out: dict = {"inputs_differ": []}
    for family in families:
        kind = FAMILIES[family]
        worst = {"nmse": 0.0, "max_abs": 0.0, "max_ulp": 0, "differ": 0, "where": ""}
        for committed in sorted((golden_root / family).iterdir()):
            fresh = fresh_root / family / committed.name
            rel = f"{family}/{committed.name}"
            if committed.suffix != ".npz":
                if not fresh.exists() or fresh.read_bytes() != committed.read_bytes():
                    out["inputs_differ"].append(rel)
                continue
            with np.load(committed) as want, np.load(fresh) as got:
                for key in want.files:
                    kind_ = kind_of(family, key)
                    if kind_ == "pins":
                        continue
                    if kind_ == "input":
                        if key not in got.files or not np.array_equal(got[key], want[key]):
                            out["inputs_differ"].append(f"{rel}:{key}")
                        continue
                    d = distances(got[key], want[key])
                    for m in ("nmse", "max_abs", "max_ulp"):
                        if d[m] > worst[m]:
                            worst[m] = d[m]
                            if m == "max_abs":
                                worst["where"] = f"{rel}:{key}"
                    worst["differ"] += d["differ"]
        out[kind] = worst
    return out


def within(result: dict, kind: str) -> tuple[bool, str]:
    """compare.within of the worst distances of ``kind`` against tolerance oracle_rederive_<kind>."""
    from mlconf.compare import within as within_tolerance

    ok, over = within_tolerance(f"oracle_rederive_{kind}", result[kind])
    return ok, f"{over} (worst max_abs at {result[kind]['where']})" if not ok else ""


def run_profile(name: str) -> dict:
    """Re-derive in a subprocess with profile ``name``'s environment; compare() of the result."""
    env = {**os.environ, **PROFILES[name]}
    with tempfile.TemporaryDirectory(prefix="mlconf-drift-") as tmp:
        code = (
            "import sys; from pathlib import Path; from mlconf.tools import golden_drift; "
            "golden_drift._derive(Path(sys.argv[1]))"
        )
        r = subprocess.run(
            [sys.executable, "-c", code, tmp],
            env=env,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        if r.returncode:
            raise RuntimeError(f"profile {name}: the re-derivation failed:\n{r.stderr[-2000:]}")
        result = compare(Path(tmp))
        result["pins_overridden"] = json.loads((Path(tmp) / "pins.json").read_text(encoding="utf-8"))
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--profile", action="append", choices=sorted(PROFILES), help="profiles to run (default: all)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(
            f"golden_drift.py: the oracle is not installed ({e}); pip install 'mlconf[oracle]'",
            file=sys.stderr,
        )
        return 2
    results = {}
    for name in args.profile or list(PROFILES):
        try:
            results[name] = run_profile(name)
        except RuntimeError as e:
            print(f"golden_drift.py: {e}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    from tabulate import tabulate

    rows, bad = [], False
    for name, r in results.items():
        for kind in ("logits", "embeddings"):
            w = r[kind]
            pins = sum(r["pins_overridden"].values()) if kind == "embeddings" else ""
            ok, over = within(r, kind)
            bad |= not ok or bool(r["inputs_differ"])
            rows.append(
                [
                    name,
                    kind,
                    f"{w['nmse']:.3g}",
                    f"{w['max_abs']:.3g}",
                    w["max_ulp"],
                    w["differ"],
                    w["where"],
                    pins,
                    "yes" if ok else over,
                    ", ".join(r["inputs_differ"]) or "none",
                ]
            )
    print(
        tabulate(
            rows,
            headers=[
                "profile",
                "output",
                "nmse",
                "max_abs",
                "max_ulp",
                "values differ",
                "worst max_abs at",
                "pins overridden",
                "within the bound",
                "inputs that differ",
            ],
        )
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
