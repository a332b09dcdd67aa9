"""The llama.cpp backend's program: mlconf's line protocol (mlconf.backends.cmd) served by llama.cpp.

    python -m mlconf.backends.llama_cpp.program [--lib DIR]

It runs in its own process, started by the ``llama.cpp`` backend (mlconf.backends.llama_cpp), so a
crash or a hang inside llama.cpp is a failed case, as for every worker-backed backend. llama.cpp is
reached through llama-cpp-python (the `bench` extra); ``--lib DIR`` makes it load DIR/libllama.so
and DIR/libggml-base.so (a user's own build) instead of the ones the package built.

What it answers, and how llama.cpp is asked:
  forward        the .mlb exported to GGUF (tools/gguf_export.py: the same quants and scales,
                 no requantization), loaded by llama.cpp with every position's logits kept; a
                 model the export cannot express is "unsupported", with the export's reason
  quantize_q8_0  ggml_quantize_chunk(GGML_TYPE_Q8_0): ggml's own quantizer (f16 scales only)
  quantize_q4_0  ggml_quantize_chunk(GGML_TYPE_Q4_0): the round rule without an importance
                 matrix (quantize_row_q4_0_ref); with one, ggml's importance-weighted search
                 (make_qx_quants), which is asked for the search rule
  encode         the .mlt written as a vocabulary-only GGUF (gguf_inputs.vocab_gguf) and loaded by llama.cpp
                 (vocab_only), then llama_tokenize with special tokens parsed
  embed          the BitNet GGUF as it is, but for F16 norms written as F32 (gguf_inputs.stock_gguf: stock
                 llama.cpp aborts on an f32 x f16 multiply), through llama.cpp's embedding path
                 (embeddings on, the pooling asked for); an I2_S file is unsupported (stock ggml
                 has no such type), and so is a reading other than the file's own
  load_gguf      the GGUF as it is, to ggml's gguf_init_from_file and then llama_model_load_from_file
                 (gguf_check.py): status only, llama.cpp's logged text as the reason
Everything else is answered "unsupported" (replies.py: the error kinds and the reply loop).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..cmd import pack, unpack
from .gguf_check import GgufCheck
from .gguf_inputs import bitnet_norms, stock_gguf, vocab_gguf
from .replies import NonFinite, NotHere, Refused, serve

BLOCK = 32
GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 = 2, 8
BLOCK_BYTES = {GGML_TYPE_Q4_0: 2 + 16, GGML_TYPE_Q8_0: 2 + 32}
THREADS = 1  # one thread: llama.cpp's results then cannot depend on the host's core count


class Ggml:
    """ggml's row quantizers, from libggml-base of the llama.cpp build in use."""

    def __init__(self, lib_dir: Path):
        self.lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        f = self.lib.ggml_quantize_chunk
        f.restype = ctypes.c_size_t
        f.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        ]

    def quantize(
        self, gtype: int, x: np.ndarray, importance: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(payload bytes per block without the scale, f16 scale bits) of x (rows, cols)."""
        rows, cols = x.shape
        x = np.ascontiguousarray(x, dtype=np.float32)
        nb = rows * cols // BLOCK
        out = np.zeros(nb * BLOCK_BYTES[gtype], np.uint8)
        imp = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
        n = self.lib.ggml_quantize_chunk(
            gtype, x.ctypes.data, out.ctypes.data, 0, rows, cols, None if imp is None else imp.ctypes.data
        )
        if n != out.size:
            raise RuntimeError(f"ggml_quantize_chunk wrote {n} bytes, expected {out.size}")
        blocks = out.reshape(nb, BLOCK_BYTES[gtype])
        return blocks[:, 2:].copy(), blocks[:, :2].copy().view("<u2").reshape(-1)


# EmbedderSession poolings -> llama_pooling_type (None: the model's own, LLAMA_POOLING_TYPE_UNSPECIFIED)
POOLING = {None: -1, "mean": 1, "cls": 2, "last": 3}


class Program:
    def __init__(self, lib_dir: Path):
        import llama_cpp  # after LLAMA_CPP_LIB_PATH is set (main)

        self.llama_cpp = llama_cpp
        self.ggml = Ggml(lib_dir)
        self.gguf = GgufCheck(lib_dir, llama_cpp)
        self.tmp = tempfile.TemporaryDirectory(prefix="mlconf-llama-cpp-")
        self.handles: dict[int, dict] = {}
        self.next_handle = 1

    # -- ops
    def hello(self, req: dict) -> dict:
        return {
            "name": "llama.cpp (llama-cpp-python)",
            "version": self.llama_cpp.__version__,
            "capabilities": ["forward", "quantize_q8_0", "quantize_q4_0", "encode", "embed", "load_gguf"],
        }

    def load_gguf(self, req: dict) -> dict:
        return self.gguf.load_gguf(req["path"])

    def quantize_q8_0(self, req: dict) -> dict:
        x = self._quant_rows(req)
        if not req["f16"]:
            raise NotHere("ggml's Q8_0 stores f16 scales; f32 scales cannot be asked of it")
        q, d = self.ggml.quantize(GGML_TYPE_Q8_0, x, None)
        return {"q": pack(q.view(np.int8), "i1"), "d": pack(d, "<u2")}

    def quantize_q4_0(self, req: dict) -> dict:
        x = self._quant_rows(req)
        if not req["f16"]:
            raise NotHere("ggml's Q4_0 stores f16 scales; f32 scales cannot be asked of it")
        imp = None if req.get("importance") is None else unpack(req, "importance", "<f4")
        if req["rule"] == "round" and imp is not None:
            raise NotHere(
                "ggml's Q4_0 with an importance matrix runs its weighted search, not the round rule"
            )
        if req["rule"] == "search" and imp is None:
            raise NotHere("ggml's Q4_0 searches only with an importance matrix (without one it rounds)")
        if req["rule"] not in ("round", "search"):
            raise NotHere(f"rule {req['rule']!r}")
        q, d = self.ggml.quantize(GGML_TYPE_Q4_0, x, imp)
        return {"q": pack(q, "u1"), "d": pack(d, "<u2")}

    def open_model(self, req: dict) -> dict:
        from mlconf.tools import gguf_export, mlb

        path = req["path"]
        try:
            header = mlb.read(path).header
        except (OSError, ValueError) as e:
            raise Refused(f"{path}: {e}") from None
        gguf_path = Path(self.tmp.name) / f"{self.next_handle}.gguf"
        try:
            gguf_export.export(path, gguf_path)
        except gguf_export.ExportError as e:
            raise NotHere(f"not expressible as a llama.cpp GGUF: {e}") from None
        ctx = int(req["ctx"]) if req.get("ctx") is not None else int(header["max_seq"])
        llm = self.llama_cpp.Llama(
            model_path=str(gguf_path),
            n_ctx=ctx,
            n_batch=ctx,
            n_ubatch=ctx,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            logits_all=True,
            verbose=False,
        )
        return {
            "handle": self._add({"llm": llm, "ctx": ctx, "gguf": gguf_path}),
            "vocab": llm.n_vocab(),
            "ctx": ctx,
        }

    def forward(self, req: dict) -> dict:
        s = self._model(req)
        llm, toks, pos = s["llm"], [int(t) for t in req["tokens"]], int(req["pos"])
        vocab = llm.n_vocab()
        if not toks:
            raise Refused("no tokens")
        bad = [t for t in toks if not 0 <= t < vocab]
        if bad:
            raise Refused(f"token {bad[0]} is outside [0, {vocab})")
        if pos != llm.n_tokens and pos != 0:
            raise Refused(f"pos {pos}: the next position is {llm.n_tokens} (or 0 to start over)")
        if pos + len(toks) > s["ctx"]:
            raise Refused(f"positions up to {pos + len(toks)} exceed ctx {s['ctx']}")
        llm.n_tokens = pos  # eval drops the cached positions from n_tokens on
        llm.eval(toks)
        logits = np.asarray(llm.scores[pos : pos + len(toks)], dtype=np.float32)
        return {"logits": pack(logits, "<f4"), "shape": [len(toks), vocab]}

    def open_tokenizer(self, req: dict) -> dict:
        from mlconf.tools import mlt

        try:
            tok = mlt.read(req["path"])
        except (OSError, ValueError) as e:
            raise Refused(f"{req['path']}: {e}") from None
        gguf_path = Path(self.tmp.name) / f"{self.next_handle}.vocab.gguf"
        vocab_gguf(tok, gguf_path)
        llm = self.llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
        return {"handle": self._add({"llm": llm, "gguf": gguf_path, "n_vocab": tok.n_vocab})}

    def encode(self, req: dict) -> dict:
        s = self._model(req)
        text = base64.b64decode(req["utf8"]) if req.get("utf8") is not None else req["text"].encode("utf-8")
        # add_bos: the GGUF's add_bos_token (the .mlt's flag) decides; special: added tokens match
        ids = s["llm"].tokenize(text, add_bos=True, special=True)
        return {"ids": [int(i) for i in ids]}

    def decode(self, req: dict) -> dict:
        s = self._model(req)
        return {
            "bytes": base64.b64encode(
                s["llm"].detokenize([int(i) for i in req["ids"]], special=True)
            ).decode()
        }

    def open_embedder(self, req: dict) -> dict:
        path = req["path"]
        if req.get("reading") not in (None, "float"):
            raise NotHere(f"reading {req['reading']!r}: llama.cpp reads a GGUF one way, its own")
        gguf_path = Path(self.tmp.name) / f"{self.next_handle}.embed.gguf"
        stock_gguf(path, gguf_path)
        first = self._embedding_context(gguf_path, None)
        return {
            "handle": self._add({"llm": first, "gguf": gguf_path, "pooled": {None: first}}),
            "dim": first.n_embd(),
            "vocab": first.n_vocab(),
        }

    def embed(self, req: dict) -> dict:
        s = self._model(req)
        pooling = req.get("pooling")
        if pooling not in POOLING:
            raise Refused(f"pooling {pooling!r}: one of {', '.join(map(str, POOLING))} expected")
        if pooling not in s["pooled"]:
            s["pooled"][pooling] = self._embedding_context(s["gguf"], pooling)
        llm = s["pooled"][pooling]
        toks = [int(t) for t in req["tokens"]]
        if not toks:
            raise Refused("no tokens")
        bad = [t for t in toks if not 0 <= t < llm.n_vocab()]
        if bad:
            raise Refused(f"token {bad[0]} is outside [0, {llm.n_vocab()})")
        if len(toks) > llm.n_ctx():
            raise Refused(f"{len(toks)} tokens exceed the context of {llm.n_ctx()}")
        llm._batch.reset()
        llm._ctx.kv_cache_clear()
        llm._batch.add_sequence(toks, 0, True)  # every token an output: the pooling reads them all
        llm._ctx.decode(llm._batch)
        ptr = self.llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
        v = np.array(ptr[: llm.n_embd()], dtype=np.float32)
        if not np.isfinite(v).all():
            raise NonFinite("the pooled embedding is not finite")
        if req.get("normalize"):  # as llama.cpp's embedding example (common_embd_normalize, L2)
            n = np.float32(np.sqrt(np.sum(v.astype(np.float64) ** 2)))
            v = v / n if n > 0 else v
        return {"vector": pack(v, "<f4")}

    def _embedding_context(self, gguf_path: Path, pooling: str | None):
        n_ctx = 512
        try:
            return self.llama_cpp.Llama(
                model_path=str(gguf_path),
                embedding=True,
                pooling_type=POOLING[pooling],
                n_ctx=n_ctx,
                n_batch=n_ctx,
                n_ubatch=n_ctx,
                # GGML_TYPE_F32 keys and values: llama.cpp's default f16 cache rounds every K and V
                # (at 150 tokens up to nmse 1.3e-6 against the f32 reference, over the float
                # reading's 1e-6); the verdict is on the model's math, not the cache's storage
                type_k=0,
                type_v=0,
                n_threads=THREADS,
                n_threads_batch=THREADS,
                verbose=False,
            )
        except ValueError as e:  # llama_model_load failed
            extra = bitnet_norms(gguf_path)
            if extra:  # a model its architecture does not describe
                raise NotHere(
                    f"llama.cpp does not load it ({e}): its architecture has no place for a BitNet "
                    f"student's per-projection norms, e.g. {', '.join(extra[:3])}"
                ) from None
            raise Refused(f"llama.cpp refused the file: {e}") from None

    def reset(self, req: dict) -> dict:
        self._model(req)["llm"].reset()
        return {}

    def close(self, req: dict) -> dict:
        s = self.handles.pop(req["handle"], None)
        if s is not None:  # a model, a tokenizer or an embedder (one context per pooling)
            for llm in {id(x): x for x in (s["llm"], *s.get("pooled", {}).values())}.values():
                llm.close()
            s["gguf"].unlink(missing_ok=True)
        return {}

    # -- helpers
    def _add(self, session: dict) -> int:
        h = self.next_handle
        self.next_handle += 1
        self.handles[h] = session
        return h

    def _model(self, req: dict) -> dict:
        s = self.handles.get(req["handle"])
        if s is None:
            raise Refused(f"no open model or tokenizer with handle {req['handle']!r}")
        return s

    @staticmethod
    def _quant_rows(req: dict) -> np.ndarray:
        x = unpack(req, "x", "<f4")
        shape = [int(n) for n in req["shape"]]
        if not shape or shape[-1] % BLOCK or int(np.prod(shape)) != x.size:
            raise Refused(f"shape {shape}: {x.size} values, rows of a multiple of {BLOCK} expected")
        return x.reshape(-1, shape[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mlconf.backends.llama_cpp.program", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--lib", help="folder of libllama.so and libggml-base.so (default: llama-cpp-python's)")
    args = ap.parse_args(argv)
    # an abort (GGML_ASSERT) prints its message, not a gdb backtrace of this process: the crash's
    # detail is then the assertion, the same on every host
    os.environ["GGML_NO_BACKTRACE"] = "1"
    if args.lib:
        os.environ["LLAMA_CPP_LIB_PATH"] = args.lib
        lib_dir = Path(args.lib)
    else:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        lib_dir = Path(spec.origin).parent / "lib"
    # the protocol gets its own copy of fd 1, and fd 1 becomes stderr: nothing llama.cpp or the
    # binding prints can reach the protocol stream
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(Program(lib_dir), sys.stdin, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
