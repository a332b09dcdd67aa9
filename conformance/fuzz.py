"""`mlconf fuzz`: differential fuzzing of a runtime against the reference.

Areas: loader, tokenizer and gguf (mutated files, below; a GGUF judged by status and rule);
forward (random valid models, random_model, logits within logits_runtime_vs_reference, shrunk by
turning features off); i2s (random and adversarial I2_S inputs, bit-exact).

Seeded, structure-aware mutants of the valid fixtures (header fields set to boundary values, bit
flips, layer-flag bytes, Q8 quants set to -128, truncations, appended bytes; one to three at a
time; for a GGUF also its counts, lengths, types and offsets set to boundary values or near their
own, keys and tensor names copied over one another, NaNs and I2_S code 3 in the data) are loaded
by the backend under test and by the reference. A mutant passes when both give the same status
(a GGUF: and rule) and, for an .mlb both accept, the same two-token forward (_run_accepted).
Crashes and hangs are caught by the backend's worker, as in `mlconf run`.

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

from mlconf import byte_ops, fixtures, gguf_fixtures, mlt_fixtures, specs
from mlconf.areas.forward import forward_calls
from mlconf.backends.reference import layout
from mlconf.cases import FORWARD_MODES, Case
from mlconf.runner import Result, Workdir, run_case

AREAS = {
    "loader": ("load", ".mlb"),
    "tokenizer": ("load_tokenizer", ".mlt"),
    "gguf": ("load_gguf", ".gguf"),
    "forward": ("forward", ".mlb"),
    "i2s": ("i2s", ""),
}
U32_VALUES = (
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    31,
    32,
    33,
    64,
    255,
    256,
    65535,
    65536,
    2**24,
    2**24 + 1,
    2**31 - 1,
    2**31,
    2**32 - 32,
    2**32 - 1,
)
U64_VALUES = (*U32_VALUES, 2**32, 2**40, 2**61, 2**62, 2**63 - 1, 2**63, 2**64 - 32, 2**64 - 1)
F32_VALUES = (float("nan"), float("inf"), float("-inf"), -0.0, -1.0, 1e-45, 3.4e38, 0.5, 1e4)
FLAG_VALUES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 0x10, 0x80, 0xFF)


@dataclass
class Base:
    name: str
    data: bytes
    fields: list[tuple[int, str]]  # (offset, u32 | u64 | f32) of the fields to set
    flags: range = range(0)  # offsets of the layer-flag bytes
    body: int = 256  # where the data (weights) starts: flips aim before it, value pokes after
    names: list[list[tuple[int, int]]] = field(default_factory=list)  # GGUF: (offset, length) of
    # each key, then of each tensor name: one copied over another of its length makes a duplicate


def gguf_base(name: str, data: bytes) -> Base:
    """A valid GGUF as a Base: every count, length, type and offset field, where its data starts,
    and its keys' and tensor names' bytes."""
    from mlconf.backends.reference import gguf_file

    g = gguf_file.parse(data)
    names = [[(kv.at + 8, len(kv.key)) for kv in g.kvs], [(t.at + 8, len(t.name)) for t in g.tensors]]
    out = [(4, "u32"), (8, "u64"), (16, "u64")]
    for kv in g.kvs:
        out += [(kv.at, "u64"), (kv.at + 8 + len(kv.key), "u32")]
        v = kv.at + 12 + len(kv.key)
        if kv.type == gguf_file.STRING:
            out.append((v, "u64"))
        elif kv.type == gguf_file.ARRAY:
            out += [(v, "u32"), (v + 4, "u64")]
        elif kv.type in (4, 5):
            out.append((v, "u32"))  # an integer key (embedding_length, alignment ...)
    for t in g.tensors:
        n = t.at + 8 + len(t.name)
        out += [(t.at, "u64"), (n, "u32")] + [(n + 4 + 8 * i, "u64") for i in range(len(t.dims))]
        out += [(n + 4 + 8 * len(t.dims), "u32"), (n + 8 + 8 * len(t.dims), "u64")]
    return Base(name, data, out, body=g.data_offset, names=names)


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
    if area == "gguf":  # the bases and the accepted edges (alignment, nesting, long keys and names)
        out = [gguf_base(n, gguf_fixtures.base_bytes(n)) for n in gguf_fixtures.bases()]
        for f in gguf_fixtures.catalog():
            if f.kind == "accepted":
                out.append(gguf_base(f.file.removeprefix("gguf/"), gguf_fixtures.content(f)))
        return out
    if area == "tokenizer":
        fs = [f for f in mlt_fixtures.catalog() if f.kind == "valid"]
        size = specs.load("mlt")["header_size"]
        return [Base(f.base, mlt_fixtures.content(f), [(o, "u32") for o in range(4, size, 4)]) for f in fs]
    fields = [
        (f["offset"], f["type"]) for f in specs.load("mlb_header")["fields"] if f["type"] in ("u32", "f32")
    ]
    out = []
    with tempfile.TemporaryDirectory(prefix="mlconf-fuzz-") as tmp:
        for name, spec in fixtures.base_specs().items():
            p = Path(tmp) / f"{name}.mlb"
            fixtures.write_base(name, p)
            n = spec["header"]["n_layers"] if spec["header"].get("layer_flags") else 0
            out.append(Base(name, p.read_bytes(), fields, range(256, 256 + n)))
    return out


def mutation(rng: np.random.Generator, base: Base, size: int) -> dict:
    """One mutation in the fixtures' vocabulary (raw / truncate_to / append)."""
    kind = rng.choice(["field", "field", "field", "flip", "flip", "flag", "q8", "truncate", "append"])
    if kind == "flag" and base.names:  # GGUF: a key or tensor name copied over one of its length
        group = base.names[int(rng.integers(0, len(base.names)))] or [(0, 0)]
        a = group[int(rng.integers(0, len(group)))]
        same = [n for n in group if n[1] == a[1] and n != a]
        if same:
            b = same[int(rng.integers(0, len(same)))]
            return {"raw": {"offset": b[0], "hex": base.data[a[0] : a[0] + a[1]].hex()}}
    if kind == "flag" and base.flags:
        value = int(rng.choice(FLAG_VALUES))
        return {"raw": {"offset": int(rng.choice(base.flags)), "hex": bytes([value]).hex()}}
    if kind == "q8" and size > base.body:  # .mlb: a Q8 quant -128; .gguf: a NaN or I2_S code 3
        at = int(rng.integers(base.body, size))
        return {
            "raw": {"offset": at, "hex": "80" if base.body == 256 else str(rng.choice(["7e", "ff", "c0"]))}
        }
    if kind == "truncate":
        return {"truncate_to": int(rng.integers(0, max(1, size)))}
    if kind == "append":
        return {"append": int(rng.integers(1, 65))}
    if kind == "flip":
        in_header = rng.random() < 0.6
        at = int(rng.integers(0, max(1, min(size, base.body) if in_header else size)))
        byte = base.data[at] if at < len(base.data) else 0
        return {"raw": {"offset": at, "hex": bytes([byte ^ (1 << int(rng.integers(0, 8)))]).hex()}}
    off, typ = base.fields[int(rng.integers(0, len(base.fields)))]
    if typ == "f32":
        raw = struct.pack("<f", float(rng.choice(F32_VALUES)))
    elif typ == "u64":
        (was,) = struct.unpack_from("<Q", base.data, off)
        pick = rng.random()
        v = (
            U64_VALUES[int(rng.integers(0, len(U64_VALUES)))]
            if pick < 0.5
            else (was + int(rng.integers(-64, 65))) % 2**64  # near the true value: off by a few
            if pick < 0.8
            else int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
        )
        raw = struct.pack("<Q", v)
    else:
        v = int(rng.choice(U32_VALUES)) if rng.random() < 0.8 else int(rng.integers(0, 2**32))
        raw = struct.pack("<I", v)
    return {"raw": {"offset": off, "hex": raw.hex()}}


def apply(data: bytes, ops: list[dict]) -> bytes:
    b = bytearray(data)
    for op in ops:
        ((kind, arg),) = op.items()
        if kind == "raw" and arg["offset"] >= len(b):
            continue  # the file was cut before it: nothing to overwrite
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


def _indices(count: int | None, seconds: float | None, start: float):
    """0, 1, 2, ... up to ``count``, or while ``seconds`` have not passed since ``start``."""
    index = 0
    while (count is None or index < count) and (seconds is None or time.perf_counter() - start < seconds):
        yield index
        index += 1


RESULT_AREA = {"gguf": "bitnet", "i2s": "bitnet"}  # the suite's area of a campaign's records


def _case(area: str, path: Path, expected: str, cid: str, spec: str, rule: str | None = None) -> Case:
    cap, _ = AREAS[area]
    params = {"path": path} if rule is None else {"path": path, "rule": rule}
    return Case(cid, RESULT_AREA.get(area, area), cap, spec, "status", params, expected)


def _judge(area, reference, backend, work: Workdir, path: Path, cid: str, spec: str) -> tuple[str, Result]:
    """The reference's status of the file, and the backend's result against it (a GGUF's by status
    and rule: specs/gguf.yaml's precedence is the reading order, which both readers follow); an
    .mlb both accept is also run (_run_accepted) when the backend has a forward."""
    rule = None
    if area == "gguf":
        ref = reference.load_gguf(str(path))
        rule = ref.rule
    else:
        ref = reference.load(str(path)) if area == "loader" else reference.load_tokenizer(str(path))
    res = run_case(_case(area, path, ref.status, cid, spec, rule), backend, work)
    runs = area == "loader" and "forward" in backend.capabilities
    if runs and ref.status == "ML_OK" and res.outcome == "pass":
        res = _run_accepted(reference, backend, work, path, cid, spec) or res
    return ref.status, res


def _run_accepted(reference, backend, work: Workdir, path: Path, cid: str, spec: str) -> Result | None:
    """An accepted mutant run as the forward/fixture cases run the accepted fixtures: two tokens
    (one when max_seq is 1) at ctx 2 (_forward_fails)."""
    n = min(2, layout.parse_header(path.read_bytes()[: layout.HEADER_SIZE])["max_seq"])
    return _forward_fails(reference, backend, work, path, f"{cid}/forward", spec, np.arange(1, n + 1), n)


def _forward_fails(
    reference,
    backend,
    work: Workdir,
    path: Path,
    cid: str,
    spec: str,
    tokens: np.ndarray,
    ctx: int | None = None,
) -> Result | None:
    """``tokens`` from position 0 on ``backend``, prefilled and one by one (FORWARD_MODES), against
    the reference's logits or its NumericError (decision forward.nonfinite): the first mode that
    does not pass, else None. The reference runs the file once for both modes."""
    want = {}
    try:
        session = reference.open_model(str(path), ctx)
        try:
            for mode in FORWARD_MODES:
                session.reset()
                want[mode] = forward_calls(session, tokens, mode)
        finally:
            session.close()
    except Exception as e:  # a file the reference accepts but cannot run: its own bug
        return Result(
            cid,
            "forward",
            spec,
            backend.name,
            "error",
            "toleranced",
            detail=f"the reference failed on a file it accepts: {type(e).__name__}: {e}",
        )
    for mode in FORWARD_MODES:
        case = Case(
            f"{cid}/{mode}",
            "forward",
            "forward",
            spec,
            "toleranced",
            {
                "model": path,
                "tokens": tokens,
                "mode": mode,
                "ctx": ctx,
                "expected_from": "reference",
                "tolerance": "logits_runtime_vs_reference",
            },
            want[mode],
        )
        res = run_case(case, backend, work)
        if res.outcome != "pass":
            return res
    return None


def shrink(area, reference, backend, work: Workdir, base: Base, ops: list[dict], path: Path) -> list[dict]:
    """The fewest of ``ops`` that still fail (one removed at a time while the failure stays)."""
    i = 0
    while len(ops) > 1 and i < len(ops):
        trial = ops[:i] + ops[i + 1 :]
        path.write_bytes(apply(base.data, trial))
        if _judge(area, reference, backend, work, path, "shrink", "shrink")[1].outcome != "pass":
            ops = trial
        else:
            i += 1
    return ops


def run(
    backend,
    area: str = "loader",
    seed: int = 0,
    count: int | None = 1000,
    seconds: float | None = None,
    corpus: Path | None = None,
    part: tuple[int, int] = (0, 1),
) -> Campaign:
    """One campaign: ``count`` mutants (or as many as fit in ``seconds``) of ``area`` on ``backend``.
    ``part`` (k, n): only the mutants whose index is k modulo n (run_parallel's share): every part
    draws the whole sequence, so mutant i is the same whatever n is."""
    if count is None and seconds is None:
        raise ValueError("fuzz.run: a count or a number of seconds is needed")
    if area == "forward":
        return forward_campaign(backend, seed, count, seconds, corpus, part)
    if area == "i2s":
        return i2s_campaign(backend, seed, count, seconds, part)
    from mlconf.backends.reference import ReferenceBackend

    reference = ReferenceBackend()
    _, suffix = AREAS[area]
    k, n = part
    c = Campaign(area, seed)
    draw = mutants(area, seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlconf-fuzz-") as tmp:
        work = Workdir(tmp)
        path = Path(tmp) / f"mutant{suffix}"
        for index in _indices(count, seconds, start):
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
            entry = {
                "file": f"{area}/seed{seed}-{index}{suffix}",
                "index": index,
                "base": base.name,
                "mutate": ops,
                "expected": status,
                "got": res.got,
                "outcome": res.outcome,
                "backend": backend.name,
                "detail": res.detail,
            }
            c.reproducers.append(entry)
            if corpus is not None:
                from mlconf.tools.files import atomic_write

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


def run_parallel(
    backend, area: str, seed: int, count: int | None, seconds: float | None, corpus: Path | None, jobs: int
) -> Campaign:
    """run() over ``jobs`` forked processes, each on every jobs-th mutant: the mutants, failures
    and reproducers of a serial run (in index order); with ``seconds``, each part runs that long."""
    if jobs <= 1:
        return run(backend, area, seed, count, seconds, corpus)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    start = time.perf_counter()
    timeout = getattr(backend, "timeout", None)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(
            pool.map(
                _part,
                [backend.name] * jobs,
                [timeout] * jobs,
                [(area, seed, count, seconds, corpus, (k, jobs)) for k in range(jobs)],
            )
        )
    c = Campaign(area, seed, sum(p.mutants for p in parts), sum(p.agreed for p in parts))
    order = sorted(
        ((r, e) for p in parts for r, e in zip(p.failures, p.reproducers, strict=True)),
        key=lambda t: t[1]["index"],
    )
    c.failures, c.reproducers = [r for r, _ in order], [e for _, e in order]
    c.seconds = time.perf_counter() - start
    return c


# ---------------------------------------------------------------- forward: random valid models
FLAG_CHOICES = (0, 1, 2, 3, 4, 5, 8)  # the layer-flag bytes the seed allows
SIMPLER = {  # feature -> the header values that turn it off
    "rope scaling": {
        "rope_type": 0,
        "rope_factor": 0.0,
        "rope_low_freq_factor": 0.0,
        "rope_high_freq_factor": 0.0,
        "rope_orig_max_seq": 0,
        "rope_attn_factor": 0.0,
    },
    "biases": {"qkv_bias": 0},
    "q/k norms": {"qk_norm": 0},
    "post norms": {"post_norms": 0},
    "gelu": {"act": 0},
    "softcaps": {"attn_softcap": 0.0, "final_softcap": 0.0},
    "scales": {"embed_scale": 0.0, "attn_scale": 0.0},
    "window": {"sliding_window": 0},
    "partial rope": {"rot_dim": 0},
    "attention gate": {"attn_gate": 0},
    "f16 scales": {"scale_f16": 0},
    "q8 mask": {"q8_mask": 0},
    "shared classifier": {"shared_classifier": 0},
}


def random_model(rng: np.random.Generator) -> tuple[dict, list[int] | None]:
    """A tiny valid model over the whole header feature space, with values a real model has (the
    loader cases cover the extremes): every RoPE type, biases, q/k norms, head_dim, Gemma features,
    windows, layer flags, linear attention, Q8_0/Q4_0, f16 scales, q8_mask."""
    import math

    pick = lambda *v: v[int(rng.integers(0, len(v)))]  # noqa: E731
    n_kv = int(rng.integers(1, 3))
    n_heads = n_kv * int(rng.integers(1, 3))
    need = 32 // math.gcd(n_heads, 32)
    step = need * 2 // math.gcd(need, 2)
    head_dim = step * int(rng.integers(1, max(2, 64 // (step * n_heads) + 1)))
    own_head = bool(rng.integers(0, 2))
    dim = 32 * int(rng.integers(1, 3)) if own_head else head_dim * n_heads
    wtype = pick(1, 2)
    n_layers = int(rng.integers(1, 4))
    h = {
        "dim": dim,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "hidden_dim": 32 * int(rng.integers(1, 3)),
        "vocab": int(rng.integers(8, 40)),
        "max_seq": 32,
        "rope_theta": pick(10000.0, 500000.0, 1e6),
        "norm_eps": pick(1e-5, 1e-6),
        "wtype": wtype,
        "head_dim": head_dim if own_head else 0,
        "shared_classifier": pick(0, 1),
        "q8_mask": int(rng.integers(0, 128)) if wtype == 2 and rng.random() < 0.5 else 0,
        "qkv_bias": pick(0, 1),
        "qk_norm": pick(0, 1),
        "act": pick(0, 1),
        "post_norms": pick(0, 1),
        "scale_f16": pick(0, 1),
        "embed_scale": pick(0.0, 0.0, 2.0),
        "attn_scale": pick(0.0, 0.0, 0.125),
        "attn_softcap": pick(0.0, 0.0, 20.0),
        "final_softcap": pick(0.0, 0.0, 15.0),
        "sliding_window": pick(0, 0, 2, 3),
        "rot_dim": pick(0, 0, 2 * int(rng.integers(1, head_dim // 2 + 1))),
        "attn_gate": pick(0, 0, 1),
    }
    rope = int(rng.integers(0, 4))
    h["rope_type"] = rope
    if rope:
        h["rope_factor"] = pick(2.0, 4.0, 8.0)
    if rope == 1:
        h.update(rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_orig_max_seq=16)
    elif rope == 3:
        h.update(
            rope_low_freq_factor=32.0,
            rope_high_freq_factor=1.0,
            rope_orig_max_seq=16,
            rope_attn_factor=pick(1.0, 1.1),
        )
    flags = None
    if rng.random() < 0.6:
        h["layer_flags"] = 1
        flags = [int(pick(*FLAG_CHOICES)) for _ in range(n_layers)]
    if flags and any(f & 2 for f in flags):
        h["rope_local_theta"] = 10000.0
    if flags and any(f & 8 for f in flags):
        k = int(rng.integers(1, 3))
        v = 4 * k // math.gcd(4, k)
        dv_step = 32 // math.gcd(v, 32)
        h.update(
            lin_k_heads=k,
            lin_v_heads=v,
            lin_k_dim=int(rng.integers(2, 9)),
            lin_v_dim=dv_step * int(rng.integers(1, max(2, 32 // (dv_step * v) + 1))),
            lin_conv=int(rng.integers(1, 5)),
        )
    return h, flags


def _write_model(path: Path, h: dict, flags: list[int] | None, seed: int) -> None:
    from mlconf.tools import mlb

    full = mlb.full_header(h)
    mlb.write(
        path,
        full,
        fixtures.random_weights(full, flags, np.random.default_rng(seed)),
        flags=flags,
        q4_rule="round" if seed % 2 else "search",
    )


MODEL_TOKENS = np.array([1, 2, 3, 4])  # what a random model is run on


def forward_campaign(
    backend,
    seed: int,
    count: int | None,
    seconds: float | None,
    corpus: Path | None,
    part: tuple[int, int] = (0, 1),
) -> Campaign:
    """Random valid models (random_model) prefilled and decoded on ``backend`` against the
    reference within logits_runtime_vs_reference. A failing model is shrunk: each feature of
    SIMPLER turned off, and layers dropped, while it still fails."""
    from mlconf.backends.reference import ReferenceBackend

    reference = ReferenceBackend()
    k, n = part
    rng = np.random.default_rng(seed)
    c = Campaign("forward", seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlconf-fuzz-") as tmp:
        path = Path(tmp) / "model.mlb"
        work = Workdir(tmp)
        for index in _indices(count, seconds, start):
            h, flags = random_model(rng)
            if index % n != k:
                continue
            c.mutants += 1
            cid = f"fuzz/forward/seed{seed}/{index}"
            _write_model(path, h, flags, seed + index)
            spec = f"fuzz seed {seed} model {index}: {h} flags {flags}"
            res = _forward_fails(reference, backend, work, path, cid, spec, MODEL_TOKENS)
            if res is None:
                c.agreed += 1
                continue
            h, flags, res = _shrink_model(reference, backend, work, h, flags, seed + index, cid, res)
            c.failures.append(res)
            entry = {
                "file": f"forward/seed{seed}-{index}.mlb",
                "index": index,
                "header": h,
                "flags": flags,
                "outcome": res.outcome,
                "backend": backend.name,
                "detail": res.detail,
            }
            c.reproducers.append(entry)
            if corpus is not None:
                (corpus / "forward").mkdir(parents=True, exist_ok=True)
                _write_model(corpus / entry["file"], h, flags, seed + index)
    c.seconds = time.perf_counter() - start
    return c


def _shrink_model(reference, backend, work: Workdir, h: dict, flags, weight_seed: int, cid: str, res: Result):
    """Turn features off, and drop layers, while the model still fails."""
    path = Path(work.root) / "shrink.mlb"

    def fails(hh, ff, tag):
        from mlconf.backends.reference import loader

        try:
            _write_model(path, hh, ff, weight_seed)
        except Exception:  # not a valid model once simplified: keep the feature
            return None
        if not loader.load(path).ok:
            return None
        spec = f"fuzz model (shrunk): {hh} flags {ff}"
        return _forward_fails(reference, backend, work, path, f"{cid}/{tag}", spec, MODEL_TOKENS)

    n_try = 0
    for name, off in SIMPLER.items():
        trial = {**h, **off}
        if trial == h:
            continue
        n_try += 1
        r = fails(trial, flags, f"t{n_try}")
        if r is not None:
            h, res = trial, r
            res.detail += f" (still failing without {name})"
    while h["n_layers"] > 1:
        trial_flags = flags[:-1] if flags else None
        n_try += 1
        r = fails({**h, "n_layers": h["n_layers"] - 1}, trial_flags, f"t{n_try}")
        if r is None:
            break
        h, flags, res = {**h, "n_layers": h["n_layers"] - 1}, trial_flags, r
    res.case = cid
    return h, flags, res


# ---------------------------------------------------------------- i2s: random and adversarial inputs
def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of one of the kinds that break quantizers: plain, exact .5 ties, subnormal,
    huge, constant, sparse."""
    kind = int(rng.integers(0, 6))
    if kind == 1:
        x = rng.integers(-8, 9, shape) * 0.5 * float(rng.choice([1.0, 1 / 127, 3.0]))
    elif kind == 2:
        x = rng.standard_normal(shape) * 1e-39
    elif kind == 3:
        x = rng.standard_normal(shape) * 1e30
    elif kind == 4:
        x = np.full(shape, float(rng.choice([0.0, -0.0, 1.0, -2.5, 1e-20])))
    elif kind == 5:
        x = np.zeros(shape)
        x.reshape(-1)[rng.integers(0, x.size, 3)] = rng.standard_normal(3) * 100
    else:
        x = rng.standard_normal(shape) * 10 ** rng.uniform(-3, 3)
    return x.astype(np.float32)


def random_i2s(rng: np.random.Generator, cid: str, spec: str) -> Case:
    """One I2_S call (pack, act or matmul) on random or adversarial inputs, the reference backend's
    answer as its expectation (bit-exact)."""
    from mlconf.cases import i2s_payload_bytes, pack_codes

    op = str(rng.choice(["pack", "act", "matmul"]))
    rows, cols, n = int(rng.integers(1, 9)), 128 * int(rng.integers(1, 5)), int(rng.integers(1, 5))
    common = {"op": op, "expected_from": "reference"}
    if op == "pack":
        return Case(cid, "bitnet", "i2s", spec, "bit-exact", {**common, "w": _values(rng, (rows, cols))})
    if op == "act":
        return Case(cid, "bitnet", "i2s", spec, "bit-exact", {**common, "x": _values(rng, (n, cols))})
    codes = rng.integers(0, 3, rows * cols).astype(np.uint8)
    payload = i2s_payload_bytes(pack_codes(codes), float(np.float32(rng.uniform(1e-3, 2))))
    return Case(
        cid,
        "bitnet",
        "i2s",
        spec,
        "bit-exact",
        {**common, "payload": payload, "shape": (rows, cols), "x": _values(rng, (n, cols))},
    )


def i2s_campaign(
    backend, seed: int, count: int | None, seconds: float | None, part: tuple[int, int] = (0, 1)
) -> Campaign:
    """Random and adversarial I2_S packs, activations and matmuls, bit-exact against the reference."""
    k, n = part
    rng = np.random.default_rng(seed)
    c = Campaign("i2s", seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlconf-fuzz-") as tmp:
        for index in _indices(count, seconds, start):
            cid = f"fuzz/i2s/seed{seed}/{index}"
            case = random_i2s(rng, cid, f"fuzz seed {seed} i2s input {index}")
            if index % n != k:
                continue
            c.mutants += 1
            res = run_case(case, backend, Workdir(tmp))
            if res.outcome == "pass":
                c.agreed += 1
                continue
            c.failures.append(res)
            c.reproducers.append(
                {
                    "index": index,
                    "op": case.params["op"],
                    "outcome": res.outcome,
                    "backend": backend.name,
                    "detail": res.detail,
                }
            )
    c.seconds = time.perf_counter() - start
    return c


def summary_result(c: Campaign, backend_name: str) -> Result:
    """One record per campaign: how many mutants gave the reference's status."""
    want, got = f"{c.mutants} agree", f"{c.agreed} agree"
    text = f"{c.agreed} of {c.mutants} mutants gave the reference's status"
    return Result(
        f"fuzz/{c.area}/seed{c.seed}/agreed",
        RESULT_AREA.get(c.area, c.area),
        f"fuzz seed {c.seed}, {c.mutants} mutants",
        backend_name,
        "pass" if c.agreed == c.mutants else "fail",
        "status",
        want,
        got,
        text,
        {"expected": want, "got": got, "reason": text},
        output_kind="statuses",
        capability=AREAS[c.area][0],
    )


def write_manifest(corpus: Path, campaigns: list[Campaign]) -> Path:
    from mlconf.tools.files import atomic_write

    doc = {
        "format": "mlconf fuzz corpus v1",
        "statuses": specs.load("mlb_errors")["statuses"],
        "campaigns": [
            {"area": c.area, "seed": c.seed, "mutants": c.mutants, "agreed": c.agreed} for c in campaigns
        ],
        "reproducers": [r for c in campaigns for r in c.reproducers],
    }
    corpus.mkdir(parents=True, exist_ok=True)
    atomic_write(corpus / "manifest.json", [json.dumps(doc, indent=1).encode()])
    return corpus / "manifest.json"
