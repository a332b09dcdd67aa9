"""What `mlconf bench` measured, and how it is shown: timings over repeats, the host, Markdown, JSON.

A figure of a bench row is the median of its runs (REPEAT by default: what a second run of the
bench most likely gives, where the best run flatters a noisy machine); the row's `spread` gives,
per figure, the minimum, median and maximum over the runs (as llama-bench reports mean +- stddev),
so a reader sees how noisy the run was. A bench document is
{"schema", "mlconf_version", "title", "host", "sections": [{"title", "rows", "note"}]}: printed as
tables, written as Markdown (bench.md) or printed as JSON (`--json`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tabulate import tabulate

T = TypeVar("T")

SCHEMA = "mlconf-bench/1"
REPEAT = 5  # runs of every timed figure (issue 18: the median and min-max of at least 5)
# the cpuinfo flags that decide which kernels run (the ISA tables and llama.cpp's build)
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "asimddp",
)


@dataclass(frozen=True)
class Timing:
    """Seconds of each run of one measurement."""

    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        """The figure's seconds: the median run."""
        return statistics.median(self.runs)

    def spread(self, amount: float = 1.0) -> dict:
        """``amount`` / seconds over the runs (a rate: the fastest run is the max)."""
        rates = sorted(amount / t if t > 0 else math.inf for t in self.runs)
        return {"min": rates[0], "median": statistics.median(rates), "max": rates[-1], "runs": len(rates)}


def timed(fn: Callable[[], object], repeat: int) -> Timing:
    return interleaved({"": fn}, repeat)[""]


def take_turns(fns: dict[str, Callable[[], T]], repeat: int) -> dict[str, list[T]]:
    """Each function's results of ``repeat`` calls, one call of each in turn per round: in these
    VMs the speed of the whole machine drifts by a third within minutes, and runs taken side by
    side see the same drift, where one engine's runs followed by the next's would not."""
    got: dict[str, list[T]] = {name: [] for name in fns}
    for _ in range(max(1, repeat)):
        for name, fn in fns.items():
            got[name].append(fn())
    return got


def _seconds(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return run


def interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, Timing]:
    """Each function timed ``repeat`` times, taking turns (take_turns)."""
    got = take_turns({name: _seconds(fn) for name, fn in fns.items()}, repeat)
    return {name: Timing(tuple(r)) for name, r in got.items()}


def _cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        k, _, v = line.partition(":")
        out.setdefault(k.strip(), v.strip())
    return out


def _l3() -> str | None:
    """The size of the last cache level Linux lists for cpu0 (e.g. "32768K"), or None."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for idx in sorted(base.glob("index*")):
        try:
            sizes.append((int((idx / "level").read_text()), (idx / "size").read_text().strip()))
        except (OSError, ValueError):
            continue
    return max(sizes)[1] if sizes else None


def last_cache_bytes() -> int | None:
    """The last-level cache of cpu0 in bytes (sysfs gives "32768K" or "260M"), or None."""
    size = _l3()
    if not size:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    except ValueError:
        return None


def host() -> dict:
    """The machine a figure belongs to: CPU model, the ISA flags that matter, cores, last cache."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {
        "machine": platform.machine(),
        "cpu": info.get("model name") or info.get("CPU part") or "",
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "last_level_cache": _l3(),
    }


def document(title: str, sections: list[dict], **extra) -> dict:
    import mlconf

    return {
        "schema": SCHEMA,
        "mlconf_version": mlconf.__version__,
        "title": title,
        "host": host(),
        **extra,
        "sections": sections,
    }


def section(title: str, rows: list[dict], note: str = "") -> dict:
    return {"title": title, "rows": rows, "note": note}


def _identity(row: dict) -> tuple:
    """What a row measures: its fields that are not figures (strings, ints, bools), spread aside."""
    return tuple((k, v) for k, v in row.items() if k != "spread" and not isinstance(v, float))


def compare(doc: dict, before: dict, name: str) -> list[dict]:
    """Sections that set each figure of ``doc`` beside the same figure of ``before`` (a bench
    JSON of an earlier run, `--compare`): rows matched by section title and identity, each figure
    as FIG, FIG_before and FIG_ratio (this run over that one)."""
    old = {s["title"]: {_identity(r): r for r in s["rows"]} for s in before.get("sections", [])}
    out = []
    for s in doc["sections"]:
        rows = []
        for r in s["rows"]:
            prev = old.get(s["title"], {}).get(_identity(r))
            if prev is None:
                continue
            row = dict(_identity(r))
            for k, v in r.items():
                p = prev.get(k)
                if isinstance(v, float) and isinstance(p, int | float):
                    row.update({k: v, f"{k}_before": p, f"{k}_ratio": v / p if p else math.nan})
            rows.append(row)
        if rows:
            h = before.get("host", {})
            out.append(
                section(
                    f"{s['title']}: this run against {name}",
                    rows,
                    f"{name}: {h.get('cpu') or h.get('machine') or 'an unknown host'}, "
                    f"mlconf {before.get('mlconf_version', '?')}. A ratio above 1 is more of the "
                    "figure in this run: better for a rate (tok_s, GB_s, MB/s), worse for a "
                    "time (seconds, ns_per_...).",
                )
            )
    return out


def host_line(doc: dict) -> str:
    h = doc["host"]
    b = doc.get("bandwidth")
    return (
        f"Machine: {h['cpu'] or h['machine']} ({h['machine']}), {h['cores']} cores, last-level cache "
        f"{h['last_level_cache'] or 'unknown'}, ISA flags {' '.join(h['isa_flags']) or 'none'}."
        + (
            f" Read bandwidth (C kernel, {b['threads']} threads): memory {b['memory_GB_s']:.1f} GB/s "
            f"({b['memory_buffer_MiB']} MiB, beyond the last-level cache), cache {b['cache_GB_s']:.1f} "
            f"GB/s ({b['cache_buffer_MiB']} MiB)."
            if b
            else ""
        )
        + _peaks_line(doc.get("peaks"))
    )


def _peaks_line(peaks: list[dict] | None) -> str:
    """The machine's multiply-add peaks of a document (`bench bitnet`: the best ISA per kind and
    thread count), or nothing."""
    if not peaks:
        return ""
    kinds = {"int8": "int8", "f32": "f32 FMA"}
    parts = []
    for kind, name in kinds.items():
        got = sorted((p["threads"], p["GMAC_s"]) for p in peaks if p["peak"] == kind)
        if got:
            each = (f"{v:.1f} GMAC/s on {th} thread{'s' if th > 1 else ''}" for th, v in got)
            parts.append(f"{name} " + ", ".join(each))
    return " Multiply-add peaks (C loops, the best ISA): " + "; ".join(parts) + "."


def _cell(v):
    """A spread as "min-max (runs)" of its first figure; everything else as it is."""
    if isinstance(v, dict):
        if not v:
            return ""
        name, s = next(iter(v.items()))
        return f"{name} {s['min']:.4g}-{s['max']:.4g} ({s['runs']} runs)"
    return v


def table(rows: list[dict], fmt: str = "simple") -> str:
    """Every field of any row a column, in the order they first appear, `spread` last; a row
    without a field has an empty cell."""
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "spread"))
    keys += ["spread"] if any("spread" in r for r in rows) else []
    return tabulate(
        [[_cell(r[k]) if k in r else None for k in keys] for r in rows],
        headers=keys,
        tablefmt=fmt,
        floatfmt=".4g",
    )


def markdown(doc: dict) -> str:
    out = [f"# {doc['title']}", "", host_line(doc), ""]
    for s in doc["sections"]:
        out += [f"## {s['title']}", "", table(s["rows"], "github"), ""]
        if s["note"]:
            out += [s["note"], ""]
    out += ["Each figure is the median of its runs; `spread` is the range of the first figure over them.", ""]
    return "\n".join(out)


def text(doc: dict) -> str:
    """For the terminal: the host, then each section's title and table."""
    out = [host_line(doc)]
    for s in doc["sections"]:
        out += ["", s["title"], table(s["rows"])]
    return "\n".join(out)


def _plain(v):
    """JSON has no NaN or infinity: null (and tuples become lists)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item"):  # a NumPy scalar
        return _plain(v.item())
    return v


def dumps(doc: dict) -> str:
    return json.dumps(_plain(doc), indent=1, allow_nan=False) + "\n"
