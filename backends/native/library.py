"""The library backend: a library with the mlrt.h ABI (libmlrt.so, libmlbitnet.so or ``lib:PATH``)
run in a worker process (worker.py; qemu.py for the aarch64 build), its capabilities read from the
symbols it exports. The objects it opens are in sessions.py, the checks of its inputs in inputs.py."""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path

import numpy as np

from ..base import CAPABILITIES, BackendError, InputError, LoadResult, Unsupported, as_rows
from ..child import default_timeout
from . import abi
from .inputs import I2S_BLOCK, I2S_TAIL, i2s_problem, int32, q4_problem, q8_problem, quantizer_status
from .sessions import EmbedderSession, ModelSession, TokenizerSession


class LibraryBackend:
    """A library with the mlrt.h ABI, run in a worker process. ``timeout`` (seconds per call) may
    be changed at any time; ``threads`` is given to ml_load (0: the number of cores). ``worker_class``:
    the transport (default worker.Worker; qemu.QemuWorker for the aarch64 build under qemu-user)."""

    def __init__(
        self,
        name: str,
        lib_path: str | Path,
        isa: str | None = None,
        timeout: float | None = None,
        threads: int = 0,
        worker_class: type | None = None,
    ):
        from .worker import Worker

        self.name = name
        self.lib_path = str(lib_path)
        self.threads = threads
        self._lock = threading.Lock()
        self.target_version = None  # set_target_version's; None: the library's newest
        self._worker = (worker_class or Worker)(self.lib_path, isa, timeout or default_timeout())
        info = self._worker.start()  # BackendError if it cannot be loaded
        self.symbols = frozenset(info["symbols"])
        self.version, self.isa = info["version"], info["isa"]
        self.tables = tuple(info.get("tables", ()))  # the kernel tables it runs on this machine
        if info["isa_error"]:
            why = (
                f"{name}: ISA {isa} is not available in this library on this machine "
                f"({platform.machine()}): {info['isa_error']}"
            )
            self.capabilities: frozenset[str] = frozenset()
            self.unsupported = {c: why for c in CAPABILITIES}
            self.description = why
            self._worker.stop()
            return
        self.capabilities = frozenset(
            c for c, syms in abi.CAPABILITY_SYMBOLS.items() if all(s in self.symbols for s in syms)
        )
        self.unsupported = {
            c: f"{self.lib_path} does not export {', '.join(s for s in syms if s not in self.symbols)}"
            for c, syms in abi.CAPABILITY_SYMBOLS.items()
            if c not in self.capabilities
        }
        runs = f"runs {' '.join(self.tables)}" if self.tables else ""
        self.description = ", ".join(
            s for s in (self.version, f"ISA {self.isa}" if self.isa else "", runs, self.lib_path) if s
        )

    # -- plumbing
    @property
    def timeout(self) -> float:
        return self._worker.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._worker.timeout = float(seconds)

    @property
    def epoch(self) -> int:
        return self._worker.epoch

    def child_alive(self) -> bool:
        return self._worker.alive()

    def _need(self, capability: str) -> None:
        if capability not in self.capabilities:
            raise Unsupported(self.unsupported.get(capability, f"no {capability} capability"))

    def _call(self, desc: str, op: str, *args):
        with self._lock:
            return self._worker.call(desc, op, *args)

    def _path_call(self, desc: str, op: str, path, *args):
        """A call whose first argument is a file path. The worker resolves a relative path against
        the directory it started in, which need not be ours now (a spare worker, a chdir): it gets
        the absolute path, and the reasons it returns name the path as the caller gave it."""
        given = str(path)
        full = os.path.abspath(given) if given else given
        out = self._call(desc, op, full, *args)
        if full == given:
            return out
        return type(out)(v.replace(full, given) if isinstance(v, str) else v for v in out)

    def set_target_version(self, version: tuple[int, int, int] | None) -> bool:
        """Have the library read .mlb files as Krafla ``version`` (None: the newest) with
        ml_set_target_version, now and in every later worker; False if it does not export it."""
        if "ml_set_target_version" not in self.symbols:
            return False
        v = tuple(version) if version is not None else (0xFFFF,) * 3
        self._worker.setup = [("target_version", v)]
        st = self._call(f"ml_set_target_version{v}", "target_version", *v)
        if st != abi.ML_OK:
            raise BackendError(f"{self.name}: ml_set_target_version{v} returned {abi.status_name(st)}")
        self.target_version = version
        return True

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        self._worker.stop()

    def __repr__(self) -> str:
        return f"<LibraryBackend {self.name} {self.lib_path}>"

    # -- the Backend protocol
    def load(self, path: str) -> LoadResult:
        self._need("load")
        st, reason, rule = self._path_call(f"load({str(path)!r})", "check", path)
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_check returned ML_E_UNSUPPORTED")
        return LoadResult(abi.status_name(st), reason, rule)

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q8_0")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"input must be float32 (the ABI takes float), got {x.dtype}")
        if x.ndim == 0 or (x.ndim > 1 and x.shape[-1] % 32):
            raise ValueError(f"shape {x.shape}: the last dimension must be a multiple of 32")
        st, q, d = self._call(
            f"quantize_q8_0(float32{list(x.shape)}, f16={bool(f16)})", "quantize_q8_0", x, bool(f16)
        )
        d = quantizer_status("ml_quantize_q8_0", st, lambda: q8_problem(x, f16), d, f16)
        return q.reshape(x.shape), d.reshape(*x.shape[:-1], x.shape[-1] // 32 if x.ndim > 1 else -1)

    def quantize_q4_0(
        self, x: np.ndarray, rule: str, f16: bool, importance: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q4_0")
        if rule not in abi.Q4_0_RULES:
            raise Unsupported(f"Q4_0 rule {rule!r}")
        if rule == "round" and importance is not None:
            raise Unsupported("the round rule takes no importance weights")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"input must be float32 (the ABI takes float), got {x.dtype}")
        if x.ndim == 0 or x.shape[-1] % 32:
            raise ValueError(f"shape {x.shape}: the last dimension must be a multiple of 32")
        cols = x.shape[-1]
        rows = x.size // cols
        imp = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
        if imp is not None and imp.shape != (cols,):
            raise ValueError(f"importance has shape {imp.shape}, expected ({cols},)")
        if rows == 0:  # nothing to quantize (the ABI would see NULL buffers): empty, as the reference
            return (
                np.zeros((*x.shape[:-1], cols // 2), np.uint8),
                np.zeros((*x.shape[:-1], cols // 32), np.float16 if f16 else np.float32),
            )
        st, qs, d = self._call(
            f"quantize_q4_0(float32{list(x.shape)}, {rule}, f16={bool(f16)}, importance={imp is not None})",
            "quantize_q4_0",
            x,
            rows,
            cols,
            abi.Q4_0_RULES[rule],
            bool(f16),
            imp,
        )
        d = quantizer_status("ml_quantize_q4_0", st, lambda: q4_problem(x, rule, f16, imp), d, f16)
        return qs.reshape(*x.shape[:-1], cols // 2), d.reshape(*x.shape[:-1], cols // 32)

    def open_model(self, path: str, ctx: int | None = None) -> ModelSession:
        self._need("forward")
        ctx32 = int32(ctx or 0, "ctx")
        st, h, reason, vocab, ctx_out = self._path_call(
            f"open_model({str(path)!r}, ctx={ctx})", "load", path, ctx32, int32(self.threads, "threads")
        )
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_load returned ML_E_UNSUPPORTED")
        if st != abi.ML_OK:
            raise InputError(f"{path}: ml_load returned {abi.status_name(st)}: {reason}")
        if h is None:
            raise BackendError(f"{path}: ml_load returned ML_OK and no model")
        return ModelSession(self, h, vocab, ctx_out, str(path))

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult:
        self._need("load_tokenizer")
        mv = int32(model_vocab or 0, "model_vocab")  # 0: no model vocabulary to check against
        st, reason, rule = self._path_call(
            f"load_tokenizer({str(path)!r}, model_vocab={model_vocab})", "tok_check", path, mv
        )
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_tok_load returned ML_E_UNSUPPORTED")
        return LoadResult(abi.status_name(st), reason, rule)

    def open_tokenizer(self, path: str) -> TokenizerSession:
        self._need("encode")
        st, h, reason = self._path_call(f"open_tokenizer({str(path)!r})", "tok_load", path, 0)
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_tok_load returned ML_E_UNSUPPORTED")
        if st != abi.ML_OK:
            raise InputError(f"{path}: ml_tok_load returned {abi.status_name(st)}: {reason}")
        if h is None:
            raise BackendError(f"{path}: ml_tok_load returned ML_OK and no tokenizer")
        return TokenizerSession(self, h, str(path))

    # -- I2_S (specs/i2s.yaml): ML_E_ARG / ML_E_FORMAT become ValueError naming the problem
    def _i2s_status(self, fn: str, st: int, problem) -> None:
        if st == abi.ML_OK:
            return
        if st in (abi.ML_E_ARG, abi.ML_E_FORMAT):
            raise ValueError(f"{fn} refused the input ({abi.status_name(st)}): {problem()}")
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(f"{fn} returned ML_E_UNSUPPORTED")
        raise BackendError(f"{fn} returned {abi.status_name(st)}")

    def i2s_quantize(self, w: np.ndarray) -> bytes:
        self._need("i2s")
        w = np.asarray(w)
        if w.dtype not in (np.float32, np.float16):
            raise ValueError(f"weights must be float32 or float16, got {w.dtype}")
        w2 = as_rows(w, "weights")
        rows, cols = w2.shape
        st, payload = self._call(
            f"i2s_quantize({w.dtype}{list(w.shape)})", "i2s_quantize", w2.astype(np.float32), rows, cols
        )
        self._i2s_status("ml_i2s_quantize", st, lambda: i2s_problem(w2))
        return payload

    def i2s_quantize_act(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._need("i2s")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32 (the ABI takes float), got {x.dtype}")
        x2 = as_rows(x, "activations")
        rows, cols = x2.shape
        st, q, scale, total = self._call(
            f"i2s_quantize_act(float32{list(x.shape)})", "i2s_quantize_act", x2, rows, cols
        )
        self._i2s_status("ml_i2s_quantize_act", st, lambda: i2s_problem(x2))
        return q.reshape(x.shape), scale.reshape(x.shape[:-1]), total.reshape(x.shape[:-1])

    def i2s_matmul(self, payload: bytes, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
        self._need("i2s")
        rows, cols = (int(v) for v in shape)
        data = np.frombuffer(bytes(payload), dtype=np.uint8)
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32 (the ABI takes float), got {x.dtype}")
        x2 = as_rows(x, "activations")
        if rows < 0 or cols < 0:
            raise ValueError(f"shape {(rows, cols)}: negative dimension")
        if x2.shape[1] != cols:
            raise ValueError(f"activation width {x2.shape[1]} != weight cols {cols}")
        if cols % I2S_BLOCK == 0 and data.size != rows * cols // 4 + I2S_TAIL:
            # the ABI has no payload length: the harness checks it (specs/i2s.yaml layout.reading)
            raise ValueError(
                f"payload is {data.size} bytes, shape {(rows, cols)} needs {rows * cols // 4 + I2S_TAIL}"
            )
        st, y = self._call(
            f"i2s_matmul(payload[{data.size}], {(rows, cols)}, float32{list(x.shape)})",
            "i2s_matmul",
            data,
            rows,
            cols,
            x2,
            x2.shape[0],
        )
        self._i2s_status("ml_i2s_matmul", st, lambda: i2s_problem(x2, data, rows, cols))
        return y.reshape(*x.shape[:-1], rows)

    # -- BitNet GGUF embeddings
    def load_gguf(self, path: str) -> LoadResult:
        self._need("load_gguf")
        st, reason, rule = self._path_call(f"load_gguf({str(path)!r})", "embed_check", path)
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_embed_load returned ML_E_UNSUPPORTED")
        return LoadResult(abi.status_name(st), reason, rule)

    def open_embedder(self, path: str, reading: str | None = None) -> EmbedderSession:
        """The library's embedder of a GGUF in ``reading`` (None: the file's own, ml_embed_load;
        "float" / "ternary": ml_embed_load_reading, Unsupported when the library lacks it)."""
        self._need("embed")
        if reading not in abi.READING_CODES:
            raise InputError(f"reading {reading!r} is not one of {tuple(abi.READING_CODES)}")
        if reading is not None and "ml_embed_load_reading" not in self.symbols:
            raise Unsupported(
                f"{self.name}: the library exports no ml_embed_load_reading, so the {reading} "
                "reading cannot be chosen"
            )
        desc = f"open_embedder({str(path)!r}" + (f", {reading!r})" if reading else ")")
        st, h, reason, dim, vocab = self._path_call(
            desc, "embed_load", path, int32(self.threads, "threads"), abi.READING_CODES[reading]
        )
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_embed_load returned ML_E_UNSUPPORTED")
        if st != abi.ML_OK:  # the reason names the file (mlrt.h); name it here if it does not
            where = "" if str(path) in reason else f"{path}: "
            raise InputError(f"{where}ml_embed_load returned {abi.status_name(st)}: {reason}")
        if h is None:
            raise BackendError(f"{path}: ml_embed_load returned ML_OK and no embedder")
        return EmbedderSession(self, h, dim, vocab, str(path))
