"""`mlconf fuzz`: differential fuzzing of a runtime's loaders against the reference.

Seeded, structure-aware mutants of the valid fixtures (header fields set to boundary values, bit
flips, layer-flag bytes, Q8 quants set to -128, truncations, appended bytes; one to three at a
time) are loaded by the backend under test and by the reference. A mutant passes when both give
the same status. Crashes and hangs are caught by the backend's worker, as in `mlconf run`.

Every mutation is one of the fixtures' own (`raw`, `truncate_to`, `append`: the `mutate` lists of
specs/mlb_errors.yaml), so a failure is a fixture: it is shrunk to the fewest mutations that
still fail, written to the corpus folder with a manifest entry, and reported as a record of the
usual results.json / summary / junit / HTML reports (`mlconf diff` works on fuzz runs). The
seed and the count reproduce a campaign exactly.
"""

from __future__ import annotations

import json
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlconf import byte_ops, fixtures, mlt_fixtures, specs
from mlconf.cases import Case
from mlconf.runner import Result, Workdir, run_case

AREAS = {"loader": ("load", ".mlb"), "tokenizer": ("load_tokenizer", ".mlt")}
U32_VALUES = (0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 255, 256, 65535, 65536, 2**24, 2**24 + 1,
              2**31 - 1, 2**31, 2**32 - 32, 2**32 - 1)
F32_VALUES = (float("nan"), float("inf"), float("-inf"), -0.0, -1.0, 1e-45, 3.4e38, 0.5, 1e4)
FLAG_VALUES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 0x10, 0x80, 0xFF)


@dataclass
class Base:
    name: str
    data: bytes
    fields: list[tuple[int, str]]       # (offset, u32 | f32) of the header fields to set
    flags: range = range(0)             # offsets of the layer-flag bytes


@dataclass
class Campaign:
    area: str
    seed: int
    mutants: int = 0
    agreed: int = 0
    seconds: float = 0.0
    failures: list[Result] = field(default_factory=list)
    reproducers: list[dict] = field(default_factory=list)


def bases(area: str) -> list[Base]:
    """The valid fixtures of ``area`` as bytes, each with the places its mutations aim at."""
    if area == "tokenizer":
        fs = [f for f in mlt_fixtures.catalog() if f.kind == "valid"]
        size = specs.load("mlt")["header_size"]
        return [Base(f.base, mlt_fixtures.content(f), [(o, "u32") for o in range(4, size, 4)]) for f in fs]
    fields = [(f["offset"], f["type"]) for f in specs.load("mlb_header")["fields"]
              if f["type"] in ("u32", "f32")]
    out = []
    with tempfile.TemporaryDirectory(prefix="mlconf-fuzz-") as tmp:
        for name, spec in fixtures.base_specs().items():
            p = Path(tmp) / f"{name}.mlb"
            fixtures.write_base(name, p)
            n = spec["header"]["n_layers"] if spec["header"].get("layer_flags") else 0
            out.append(Base(name, p.read_bytes(), fields, range(256, 256 + n)))
    return out


def _hex(b: bytes) -> str:
    return b.hex()


def mutation(rng: np.random.Generator, base: Base, size: int) -> dict:
    """One mutation in the fixtures' vocabulary (raw / truncate_to / append)."""
    kind = rng.choice(["field", "field", "field", "flip", "flip", "flag", "q8", "truncate", "append"])
    if kind == "flag" and base.flags:
        value = int(rng.choice(FLAG_VALUES))
        return {"raw": {"offset": int(rng.choice(base.flags)), "hex": _hex(bytes([value]))}}
    if kind == "q8" and size > 256:
        return {"raw": {"offset": int(rng.integers(256, size)), "hex": "80"}}
    if kind == "truncate":
        return {"truncate_to": int(rng.integers(0, max(1, size)))}
    if kind == "append":
        return {"append": int(rng.integers(1, 65))}
    if kind == "flip":
        in_header = rng.random() < 0.6
        at = int(rng.integers(0, max(1, min(size, 256) if in_header else size)))
        byte = base.data[at] if at < len(base.data) else 0
        return {"raw": {"offset": at, "hex": _hex(bytes([byte ^ (1 << int(rng.integers(0, 8)))]))}}
    off, typ = base.fields[int(rng.integers(0, len(base.fields)))]
    if typ == "f32":
        raw = struct.pack("<f", float(rng.choice(F32_VALUES)))
    else:
        v = int(rng.choice(U32_VALUES)) if rng.random() < 0.8 else int(rng.integers(0, 2**32))
        raw = struct.pack("<I", v)
    return {"raw": {"offset": off, "hex": _hex(raw)}}


def apply(data: bytes, ops: list[dict]) -> bytes:
    b = bytearray(data)
    for op in ops:
        (kind, arg), = op.items()
        if kind == "raw" and arg["offset"] >= len(b):
            continue                     # the file was cut before it: nothing to overwrite
        byte_ops.apply(b, kind, arg)
    return bytes(b)


def mutants(area: str, seed: int) -> Callable[[], tuple[Base, list[dict]]]:
    """A generator of (base, mutations) from ``seed``: the same sequence on every machine."""
    rng = np.random.default_rng(seed)
    all_bases = bases(area)

    def draw() -> tuple[Base, list[dict]]:
        base = all_bases[int(rng.integers(0, len(all_bases)))]
        ops, size = [], len(base.data)
        for _ in range(int(rng.choice([1, 1, 2, 3]))):
            op = mutation(rng, base, size)
            ops.append(op)
            size = len(apply(base.data, ops))
        return base, ops
    return draw


def _case(area: str, path: Path, expected: str, cid: str, spec: str) -> Case:
    cap, _ = AREAS[area]
    return Case(cid, area, cap, spec, "status", {"path": path}, expected)


def _judge(area, reference, backend, work: Workdir, path: Path, cid: str, spec: str) -> tuple[str, Result]:
    """The reference's status of the file, and the backend's result against it."""
    ref = reference.load(str(path)) if area == "loader" else reference.load_tokenizer(str(path))
    return ref.status, run_case(_case(area, path, ref.status, cid, spec), backend, work)


def shrink(area, reference, backend, work: Workdir, base: Base, ops: list[dict], path: Path) -> list[dict]:
    """The fewest of ``ops`` that still fail (one removed at a time while the failure stays)."""
    i = 0
    while len(ops) > 1 and i < len(ops):
        trial = ops[:i] + ops[i + 1:]
        path.write_bytes(apply(base.data, trial))
        if _judge(area, reference, backend, work, path, "shrink", "shrink")[1].outcome != "pass":
            ops = trial
        else:
            i += 1
    return ops


def run(backend, area: str = "loader", seed: int = 0, count: int | None = 1000, seconds: float | None = None,
        corpus: Path | None = None, part: tuple[int, int] = (0, 1)) -> Campaign:
    """One campaign: ``count`` mutants (or as many as fit in ``seconds``) of ``area`` on ``backend``.
    ``part`` (k, n): only the mutants whose index is k modulo n (run_parallel's share): every part
    draws the whole sequence, so mutant i is the same whatever n is."""
    if count is None and seconds is None:
        raise ValueError("fuzz.run: a count or a number of seconds is needed")
    from mlconf.backends.reference import ReferenceBackend
    reference = ReferenceBackend()
    cap, suffix = AREAS[area]
    k, n = part
    c = Campaign(area, seed)
    draw = mutants(area, seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlconf-fuzz-") as tmp:
        work = Workdir(tmp)
        path = Path(tmp) / f"mutant{suffix}"
        index = -1
        while True:
            index += 1
            if (count is not None and index >= count) or (seconds is not None and
                                                          time.perf_counter() - start >= seconds):
                break
            base, ops = draw()
            if index % n != k:
                continue
            c.mutants += 1
            path.write_bytes(apply(base.data, ops))
            cid = f"fuzz/{area}/seed{seed}/{index}"
            spec = f"fuzz seed {seed} mutant {index} of {base.name}: {json.dumps(ops)}"
            status, res = _judge(area, reference, backend, work, path, cid, spec)
            if res.outcome == "pass":
                c.agreed += 1
                continue
            ops = shrink(area, reference, backend, work, base, ops, path)
            path.write_bytes(apply(base.data, ops))
            spec = f"fuzz seed {seed} mutant {index} of {base.name}, shrunk: {json.dumps(ops)}"
            status, res = _judge(area, reference, backend, work, path, cid, spec)
            c.failures.append(res)
            entry = {"file": f"{area}/seed{seed}-{index}{suffix}", "index": index, "base": base.name,
                     "mutate": ops, "expected": status, "got": res.got, "outcome": res.outcome,
                     "backend": backend.name, "detail": res.detail}
            c.reproducers.append(entry)
            if corpus is not None:
                from mlconf.tools.mlb import atomic_write
                (corpus / area).mkdir(parents=True, exist_ok=True)
                atomic_write(corpus / entry["file"], [path.read_bytes()])
        work.close()
    c.seconds = time.perf_counter() - start
    return c


def _part(name: str, timeout: float | None, args: tuple) -> Campaign:
    """A forked worker of run_parallel: a fresh backend of that name (its own worker process)."""
    from mlconf.backends import get
    b = get(name)
    if timeout is not None and hasattr(b, "timeout"):
        b.timeout = timeout
    try:
        return run(b, *args)
    finally:
        getattr(b, "close", lambda: None)()


def run_parallel(backend, area: str, seed: int, count: int | None, seconds: float | None,
                 corpus: Path | None, jobs: int) -> Campaign:
    """run() over ``jobs`` forked processes, each on every jobs-th mutant: the mutants, failures
    and reproducers of a serial run (in index order); with ``seconds``, each part runs that long."""
    if jobs <= 1:
        return run(backend, area, seed, count, seconds, corpus)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    start = time.perf_counter()
    timeout = getattr(backend, "timeout", None)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(_part, [backend.name] * jobs, [timeout] * jobs,
                              [(area, seed, count, seconds, corpus, (k, jobs)) for k in range(jobs)]))
    c = Campaign(area, seed, sum(p.mutants for p in parts), sum(p.agreed for p in parts))
    order = sorted(((r, e) for p in parts for r, e in zip(p.failures, p.reproducers, strict=True)),
                   key=lambda t: t[1]["index"])
    c.failures, c.reproducers = [r for r, _ in order], [e for _, e in order]
    c.seconds = time.perf_counter() - start
    return c


def summary_result(c: Campaign, backend_name: str) -> Result:
    """One record per campaign: how many mutants gave the reference's status."""
    want, got = f"{c.mutants} agree", f"{c.agreed} agree"
    text = f"{c.agreed} of {c.mutants} mutants gave the reference's status"
    return Result(f"fuzz/{c.area}/seed{c.seed}/agreed", c.area, f"fuzz seed {c.seed}, {c.mutants} mutants",
                  backend_name, "pass" if c.agreed == c.mutants else "fail", "status", want, got, text,
                  {"expected": want, "got": got, "reason": text}, output_kind="statuses",
                  capability=AREAS[c.area][0])


def write_manifest(corpus: Path, campaigns: list[Campaign]) -> Path:
    from mlconf.tools.mlb import atomic_write
    doc = {"format": "mlconf fuzz corpus v1", "statuses": specs.load("mlb_errors")["statuses"],
           "campaigns": [{"area": c.area, "seed": c.seed, "mutants": c.mutants, "agreed": c.agreed}
                         for c in campaigns],
           "reproducers": [r for c in campaigns for r in c.reproducers]}
    corpus.mkdir(parents=True, exist_ok=True)
    atomic_write(corpus / "manifest.json", [json.dumps(doc, indent=1).encode()])
    return corpus / "manifest.json"
