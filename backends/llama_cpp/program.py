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
Everything else is answered "unsupported".
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

BLOCK = 32
GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 = 2, 8
BLOCK_BYTES = {GGML_TYPE_Q4_0: 2 + 16, GGML_TYPE_Q8_0: 2 + 32}
THREADS = 1  # one thread: llama.cpp's results then cannot depend on the host's core count


class Refused(Exception):
    """error kind "input": the request's input is refused"""


class NotHere(Exception):
    """error kind "unsupported": llama.cpp cannot express the request"""


def _array(req: dict, field: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(req[field]), dtype=dtype).astype(np.dtype(dtype).newbyteorder("="))


def _b64(a: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


class Ggml:
    """ggml's row quantizers, from libggml-base of the llama.cpp build in use."""

    def __init__(self, lib_dir: Path):
        self.lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        f = self.lib.ggml_quantize_chunk
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_void_p]

    def quantize(self, gtype: int, x: np.ndarray, importance: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(payload bytes per block without the scale, f16 scale bits) of x (rows, cols)."""
        rows, cols = x.shape
        x = np.ascontiguousarray(x, dtype=np.float32)
        nb = rows * cols // BLOCK
        out = np.zeros(nb * BLOCK_BYTES[gtype], np.uint8)
        imp = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
        n = self.lib.ggml_quantize_chunk(gtype, x.ctypes.data, out.ctypes.data, 0, rows, cols,
                                         None if imp is None else imp.ctypes.data)
        if n != out.size:
            raise RuntimeError(f"ggml_quantize_chunk wrote {n} bytes, expected {out.size}")
        blocks = out.reshape(nb, BLOCK_BYTES[gtype])
        return blocks[:, 2:].copy(), blocks[:, :2].copy().view("<u2").reshape(-1)


class Program:
    def __init__(self, lib_dir: Path):
        import llama_cpp  # after LLAMA_CPP_LIB_PATH is set (main)

        self.llama_cpp = llama_cpp
        self.ggml = Ggml(lib_dir)
        self.tmp = tempfile.TemporaryDirectory(prefix="mlconf-llama-cpp-")
        self.handles: dict[int, dict] = {}
        self.next_handle = 1

    # -- ops
    def hello(self, req: dict) -> dict:
        return {"name": "llama.cpp (llama-cpp-python)", "version": self.llama_cpp.__version__,
                "capabilities": ["forward", "quantize_q8_0", "quantize_q4_0"]}

    def quantize_q8_0(self, req: dict) -> dict:
        x = self._quant_rows(req)
        if not req["f16"]:
            raise NotHere("ggml's Q8_0 stores f16 scales; f32 scales cannot be asked of it")
        q, d = self.ggml.quantize(GGML_TYPE_Q8_0, x, None)
        return {"q": _b64(q.view(np.int8), "i1"), "d": _b64(d, "<u2")}

    def quantize_q4_0(self, req: dict) -> dict:
        x = self._quant_rows(req)
        if not req["f16"]:
            raise NotHere("ggml's Q4_0 stores f16 scales; f32 scales cannot be asked of it")
        imp = None if req.get("importance") is None else _array(req, "importance", "<f4")
        if req["rule"] == "round" and imp is not None:
            raise NotHere("ggml's Q4_0 with an importance matrix runs its weighted search, not the round rule")
        if req["rule"] == "search" and imp is None:
            raise NotHere("ggml's Q4_0 searches only with an importance matrix (without one it rounds)")
        if req["rule"] not in ("round", "search"):
            raise NotHere(f"rule {req['rule']!r}")
        q, d = self.ggml.quantize(GGML_TYPE_Q4_0, x, imp)
        return {"q": _b64(q, "u1"), "d": _b64(d, "<u2")}

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
        llm = self.llama_cpp.Llama(model_path=str(gguf_path), n_ctx=ctx, n_batch=ctx, n_ubatch=ctx,
                                   n_threads=THREADS, n_threads_batch=THREADS, logits_all=True,
                                   verbose=False)
        h = self.next_handle
        self.next_handle += 1
        self.handles[h] = {"llm": llm, "ctx": ctx, "gguf": gguf_path}
        return {"handle": h, "vocab": llm.n_vocab(), "ctx": ctx}

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
        logits = np.asarray(llm.scores[pos:pos + len(toks)], dtype=np.float32)
        return {"logits": _b64(logits, "<f4"), "shape": [len(toks), vocab]}

    def reset(self, req: dict) -> dict:
        self._model(req)["llm"].reset()
        return {}

    def close(self, req: dict) -> dict:
        s = self.handles.pop(req["handle"], None)
        if s is not None:
            s["llm"].close()
            s["gguf"].unlink(missing_ok=True)
        return {}

    # -- helpers
    def _model(self, req: dict) -> dict:
        s = self.handles.get(req["handle"])
        if s is None:
            raise Refused(f"no open model with handle {req['handle']!r}")
        return s

    @staticmethod
    def _quant_rows(req: dict) -> np.ndarray:
        x = _array(req, "x", "<f4")
        shape = [int(n) for n in req["shape"]]
        if not shape or shape[-1] % BLOCK or int(np.prod(shape)) != x.size:
            raise Refused(f"shape {shape}: {x.size} values, rows of a multiple of {BLOCK} expected")
        return x.reshape(-1, shape[-1])


def serve(program: Program, lines, out) -> None:
    for line in lines:
        req = json.loads(line)
        rid = req.get("id")
        try:
            op = getattr(program, str(req.get("op")), None)
            if op is None or str(req.get("op")).startswith("_"):
                raise NotHere(f"op {req.get('op')!r} is not served by the llama.cpp backend")
            reply = {"id": rid, "ok": True, **op(req)}
        except Refused as e:
            reply = {"id": rid, "ok": False, "error": {"kind": "input", "message": str(e)}}
        except NotHere as e:
            reply = {"id": rid, "ok": False, "error": {"kind": "unsupported", "message": str(e)}}
        except Exception as e:  # llama.cpp or this program failed: the case is an error, the program goes on
            reply = {"id": rid, "ok": False, "error": {"kind": "internal", "message": f"{type(e).__name__}: {e}"}}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlconf.backends.llama_cpp.program", description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="folder of libllama.so and libggml-base.so (default: llama-cpp-python's)")
    args = ap.parse_args(argv)
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
