"""The native backend: the C runtime of src/ (libmlrt.so, built by `pip install`), and through the
same class any shared library exporting include/mlrt.h (``lib:PATH``, mlconf.backends.external).

Every call goes to a worker process that owns the dlopen'ed library (worker.py), so a crash is a
WorkerCrash naming the signal and a hang a WorkerTimeout, and the harness goes on. Capabilities
come from the symbols the library exports (abi.CAPABILITY_SYMBOLS). Names:
  native          libmlrt.so with the best ISA of this machine (ml_isa() says which)
  native:ISA      ISA forced with ml_set_isa (scalar, avx2, neon, neon-dotprod); an ISA this machine
                  cannot run leaves the backend with no capability, so every case is unsupported, with why
                  (neon and neon-dotprod on a host that is not aarch64: the aarch64 build under
                  qemu-user, qemu.py)
  lib:PATH        any library (mlconf.backends.external)
The bitnet backend (mlconf.backends.bitnet) is this class on libmlbitnet.so, which exports the
I2_S and embeddings groups only (capabilities "i2s" and "embed").
Nothing here imports the reference backend: the cross-check stays independent.
"""

from __future__ import annotations

import atexit
import os
import platform
import threading
import warnings
from pathlib import Path

import numpy as np

from ..base import CAPABILITIES, NATIVE_ISAS, BackendError, InputError, LoadResult, NumericError, Unsupported
from . import abi

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "libmlrt.so"      # pip install builds it here (editable installs: in the source tree)
ISAS = NATIVE_ISAS
DEFAULT_TIMEOUT = 60.0             # seconds per call; MLCONF_WORKER_TIMEOUT overrides it
MAX_TIMEOUT = 1e6                  # ~11 days: beyond what the clocks and select() take
TIMEOUT_ENV = "MLCONF_WORKER_TIMEOUT"
INT32 = (-2**31, 2**31 - 1)


def default_timeout() -> float:
    v = os.environ.get(TIMEOUT_ENV)
    if not v:
        return DEFAULT_TIMEOUT
    try:
        t = float(v)
    except ValueError:
        raise BackendError(f"{TIMEOUT_ENV}={v!r} is not a number of seconds") from None
    if not 0 < t <= MAX_TIMEOUT:
        raise BackendError(f"{TIMEOUT_ENV}={v!r} must be a number of seconds above 0 and at most "
                           f"{MAX_TIMEOUT:g}")
    return t


def _int32(v: int, what: str) -> int:
    v = int(v)
    if not INT32[0] <= v <= INT32[1]:
        raise InputError(f"{what} {v} does not fit the ABI's int32_t")
    return v


def _tokens32(tokens) -> np.ndarray:
    """Token ids as the ABI's int32_t array (InputError for what does not fit); unchanged values."""
    t = np.asarray(tokens)
    if t.ndim != 1 or not (np.issubdtype(t.dtype, np.integer) or t.size == 0):
        raise InputError(f"tokens must be a 1-D integer array, got {t.dtype}{list(t.shape)}")
    if t.size and (t.min() < INT32[0] or t.max() > INT32[1]):
        raise InputError("a token id does not fit the ABI's int32_t")
    if t.size > INT32[1]:
        raise InputError(f"{t.size} tokens do not fit the ABI's int32_t count")
    return t


class LibraryBackend:
    """A library with the mlrt.h ABI, run in a worker process. ``timeout`` (seconds per call) may
    be changed at any time; ``threads`` is given to ml_load (0: the number of cores). ``worker_class``:
    the transport (default worker.Worker; qemu.QemuWorker for the aarch64 build under qemu-user)."""

    def __init__(self, name: str, lib_path: str | Path, isa: str | None = None,
                 timeout: float | None = None, threads: int = 0, worker_class: type | None = None):
        from .worker import Worker
        self.name = name
        self.lib_path = str(lib_path)
        self.threads = threads
        self._lock = threading.Lock()
        self.target_version = None     # set_target_version's; None: the library's newest
        self._worker = (worker_class or Worker)(self.lib_path, isa, timeout or default_timeout())
        info = self._worker.start()          # BackendError if it cannot be loaded
        self.symbols = frozenset(info["symbols"])
        self.version, self.isa = info["version"], info["isa"]
        self.tables = tuple(info.get("tables", ()))   # the kernel tables it runs on this machine
        if info["isa_error"]:
            why = (f"{name}: ISA {isa} is not available in this library on this machine "
                   f"({platform.machine()}): {info['isa_error']}")
            self.capabilities: frozenset[str] = frozenset()
            self.unsupported = {c: why for c in CAPABILITIES}
            self.description = why
            self._worker.stop()
            return
        self.capabilities = frozenset(c for c, syms in abi.CAPABILITY_SYMBOLS.items()
                                      if all(s in self.symbols for s in syms))
        self.unsupported = {
            c: f"{self.lib_path} does not export {', '.join(s for s in syms if s not in self.symbols)}"
            for c, syms in abi.CAPABILITY_SYMBOLS.items() if c not in self.capabilities}
        runs = f"runs {' '.join(self.tables)}" if self.tables else ""
        self.description = ", ".join(s for s in (self.version, f"ISA {self.isa}" if self.isa else "", runs,
                                                  self.lib_path) if s)

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
        st, reason = self._path_call(f"load({str(path)!r})", "check", path)
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_check returned ML_E_UNSUPPORTED")
        return LoadResult(abi.status_name(st), reason)

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q8_0")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"input must be float32 (the ABI takes float), got {x.dtype}")
        if x.ndim == 0 or (x.ndim > 1 and x.shape[-1] % 32):
            raise ValueError(f"shape {x.shape}: the last dimension must be a multiple of 32")
        st, q, d = self._call(f"quantize_q8_0(float32{list(x.shape)}, f16={bool(f16)})", "quantize_q8_0",
                              x, bool(f16))
        d = _quantizer_status("ml_quantize_q8_0", st, lambda: _q8_problem(x, f16), d, f16)
        return q.reshape(x.shape), d.reshape(*x.shape[:-1], x.shape[-1] // 32 if x.ndim > 1 else -1)

    def quantize_q4_0(self, x: np.ndarray, rule: str, f16: bool,
                      importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        if rows == 0:      # nothing to quantize (the ABI would see NULL buffers): empty, as the reference
            return (np.zeros((*x.shape[:-1], cols // 2), np.uint8),
                    np.zeros((*x.shape[:-1], cols // 32), np.float16 if f16 else np.float32))
        st, qs, d = self._call(f"quantize_q4_0(float32{list(x.shape)}, {rule}, f16={bool(f16)}, "
                               f"importance={imp is not None})", "quantize_q4_0",
                               x, rows, cols, abi.Q4_0_RULES[rule], bool(f16), imp)
        d = _quantizer_status("ml_quantize_q4_0", st, lambda: _q4_problem(x, rule, f16, imp), d, f16)
        return qs.reshape(*x.shape[:-1], cols // 2), d.reshape(*x.shape[:-1], cols // 32)

    def open_model(self, path: str, ctx: int | None = None) -> ModelSession:
        self._need("forward")
        ctx32 = _int32(ctx or 0, "ctx")
        st, h, reason, vocab, ctx_out = self._path_call(f"open_model({str(path)!r}, ctx={ctx})", "load", path,
                                                   ctx32, _int32(self.threads, "threads"))
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_load returned ML_E_UNSUPPORTED")
        if st != abi.ML_OK:
            raise InputError(f"{path}: ml_load returned {abi.status_name(st)}: {reason}")
        if h is None:
            raise BackendError(f"{path}: ml_load returned ML_OK and no model")
        return ModelSession(self, h, vocab, ctx_out, str(path))

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult:
        self._need("load_tokenizer")
        mv = _int32(model_vocab or 0, "model_vocab")   # 0: no model vocabulary to check against
        st, reason = self._path_call(f"load_tokenizer({str(path)!r}, model_vocab={model_vocab})",
                                     "tok_check", path, mv)
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_tok_load returned ML_E_UNSUPPORTED")
        return LoadResult(abi.status_name(st), reason)

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
        if st in (abi.ML_E_ARG, ML_E_FORMAT):
            raise ValueError(f"{fn} refused the input ({abi.status_name(st)}): {problem()}")
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(f"{fn} returned ML_E_UNSUPPORTED")
        raise BackendError(f"{fn} returned {abi.status_name(st)}")

    def i2s_quantize(self, w: np.ndarray) -> bytes:
        self._need("i2s")
        w = np.asarray(w)
        if w.dtype not in (np.float32, np.float16):
            raise ValueError(f"weights must be float32 or float16, got {w.dtype}")
        w2 = _rows(w, "weights")
        rows, cols = w2.shape
        st, payload = self._call(f"i2s_quantize({w.dtype}{list(w.shape)})", "i2s_quantize",
                                 w2.astype(np.float32), rows, cols)
        self._i2s_status("ml_i2s_quantize", st, lambda: _i2s_problem(w2))
        return payload

    def i2s_quantize_act(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._need("i2s")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32 (the ABI takes float), got {x.dtype}")
        x2 = _rows(x, "activations")
        rows, cols = x2.shape
        st, q, scale, total = self._call(f"i2s_quantize_act(float32{list(x.shape)})", "i2s_quantize_act",
                                         x2, rows, cols)
        self._i2s_status("ml_i2s_quantize_act", st, lambda: _i2s_problem(x2))
        return q.reshape(x.shape), scale.reshape(x.shape[:-1]), total.reshape(x.shape[:-1])

    def i2s_matmul(self, payload: bytes, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
        self._need("i2s")
        rows, cols = (int(v) for v in shape)
        data = np.frombuffer(bytes(payload), dtype=np.uint8)
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32 (the ABI takes float), got {x.dtype}")
        x2 = _rows(x, "activations")
        if rows < 0 or cols < 0:
            raise ValueError(f"shape {(rows, cols)}: negative dimension")
        if x2.shape[1] != cols:
            raise ValueError(f"activation width {x2.shape[1]} != weight cols {cols}")
        if cols % I2S_BLOCK == 0 and data.size != rows * cols // 4 + I2S_TAIL:
            # the ABI has no payload length: the harness checks it (specs/i2s.yaml layout.reading)
            raise ValueError(f"payload is {data.size} bytes, shape {(rows, cols)} needs "
                             f"{rows * cols // 4 + I2S_TAIL}")
        st, y = self._call(f"i2s_matmul(payload[{data.size}], {(rows, cols)}, float32{list(x.shape)})",
                           "i2s_matmul", data, rows, cols, x2, x2.shape[0])
        self._i2s_status("ml_i2s_matmul", st, lambda: _i2s_problem(x2, data, rows, cols))
        return y.reshape(*x.shape[:-1], rows)

    # -- BitNet GGUF embeddings
    def open_embedder(self, path: str, reading: str | None = None) -> EmbedderSession:
        """The library's embedder of a GGUF in ``reading`` (None: the file's own, ml_embed_load;
        "float" / "ternary": ml_embed_load_reading, Unsupported when the library lacks it)."""
        self._need("embed")
        if reading not in abi.READING_CODES:
            raise InputError(f"reading {reading!r} is not one of {tuple(abi.READING_CODES)}")
        if reading is not None and "ml_embed_load_reading" not in self.symbols:
            raise Unsupported(f"{self.name}: the library exports no ml_embed_load_reading, so the {reading} "
                              "reading cannot be chosen")
        desc = f"open_embedder({str(path)!r}" + (f", {reading!r})" if reading else ")")
        st, h, reason, dim, vocab = self._path_call(desc, "embed_load", path, _int32(self.threads, "threads"),
                                               abi.READING_CODES[reading])
        if st == abi.ML_E_UNSUPPORTED:
            raise Unsupported(reason or "ml_embed_load returned ML_E_UNSUPPORTED")
        if st != abi.ML_OK:   # the reason names the file (mlrt.h); name it here if it does not
            where = "" if str(path) in reason else f"{path}: "
            raise InputError(f"{where}ml_embed_load returned {abi.status_name(st)}: {reason}")
        if h is None:
            raise BackendError(f"{path}: ml_embed_load returned ML_OK and no embedder")
        return EmbedderSession(self, h, dim, vocab, str(path))


I2S_BLOCK, I2S_TAIL = 128, 32                 # specs/i2s.yaml block, tail_bytes
ML_E_FORMAT = 2
POOLING_CODES = {None: -1, "mean": 1, "cls": 2, "last": 3}   # ML_POOL_MODEL, ML_POOL_MEAN, ...


def _rows(a: np.ndarray, what: str) -> np.ndarray:
    """A 1-D or 2-D array as C-contiguous (rows, cols); the ABI's size rules are the library's."""
    if a.ndim not in (1, 2):
        raise ValueError(f"{what} must be 1-D or 2-D, got shape {a.shape}")
    return np.ascontiguousarray(a.reshape(1, -1) if a.ndim == 1 else a)


def _i2s_problem(x: np.ndarray, payload: np.ndarray | None = None, rows: int = 0, cols: int = 0) -> str:
    """What an I2_S function of the ABI must refuse in this input (the ABI returns only a status)."""
    r, c = x.shape
    if r == 0 or (payload is not None and rows == 0):
        return f"no rows ({(rows, cols) if payload is not None else x.shape})"
    if c == 0 or c % I2S_BLOCK:
        return f"row length {c} is not a positive multiple of {I2S_BLOCK}"
    flat = x.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        i = int(bad[0])
        return f"non-finite value {flat[i]} at row {i // c}, column {i % c}"
    if payload is not None:
        b = payload[: rows * cols // 4].reshape(-1, 32)
        codes = np.stack([(b >> s) & 3 for s in (6, 4, 2, 0)], axis=1).reshape(-1)   # element order
        three = np.flatnonzero(codes == 3)
        if three.size:
            k = int(three[0])
            return (f"code 3 at element {k} (row {k // cols}, column {k % cols}; packed byte "
                    f"{(k // 128) * 32 + k % 32})")
    return "no rule of specs/i2s.yaml refuses this input"


def _quantizer_status(fn: str, st: int, problem, d: np.ndarray, f16: bool) -> np.ndarray:
    """The scales of a quantizer call that returned st, or the error it stands for (problem():
    why the input is refused, since the ABI returns a status and no reason)."""
    if st == abi.ML_E_ARG:
        raise ValueError(f"{fn} refused the input (ML_E_ARG): {problem()}")
    if st == abi.ML_E_UNSUPPORTED:
        raise Unsupported(f"{fn} returned ML_E_UNSUPPORTED")
    if st != abi.ML_OK:
        raise BackendError(f"{fn} returned {abi.status_name(st)}")
    return d.view(np.float16) if f16 else d


def _q8_problem(x: np.ndarray, f16: bool) -> str:
    """What in the input the quantizer must refuse (the ABI returns a status, not a reason)."""
    flat = x.reshape(-1)
    if flat.size % 32:
        return f"{flat.size} values is not a multiple of 32"
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        return f"non-finite value {flat[bad[0]]} at flat index {int(bad[0])}"
    if f16:
        d = np.abs(flat.reshape(-1, 32)).max(axis=1) / np.float32(127)
        big = np.flatnonzero(d > np.float32(65504))
        if big.size:
            i = int(big[0])
            return f"block {i}: scale {float(d[i])!r} is above 65504 and cannot be stored as f16"
    return "no rule of specs/quant.yaml refuses this input"


def _q4_problem(x: np.ndarray, rule: str, f16: bool, imp: np.ndarray | None) -> str:
    """Why the reference refuses the input too (the ABI returns a status, not a reason)."""
    from mlconf.backends.reference import quant
    try:
        if rule == "round":
            quant.q4_0_round(x, f16=f16)
        else:
            quant.q4_0_search(x, f16=f16, importance=imp)
    except quant.QuantError as e:
        return str(e)
    return "no rule of specs/quant.yaml refuses this input"


class _Handle:
    """An object living in the worker; valid while the worker that made it lives."""

    def __init__(self, backend: LibraryBackend, handle: int, path: str):
        self.backend, self.handle, self.path = backend, handle, path
        self.epoch = backend.epoch
        self.closed = False

    def _live(self) -> None:
        if self.closed:
            raise BackendError(f"{self.path}: used after close()")
        if self.epoch != self.backend.epoch or not self.backend._worker.alive():
            raise BackendError(f"{self.path}: the worker that held it has ended (after a crash or a "
                               "timeout); open it again")

    def _free(self, op: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.epoch == self.backend.epoch and self.backend._worker.alive():
            self.backend._call(f"close({self.path!r})", op, self.handle)


class ModelSession(_Handle):
    def __init__(self, backend: LibraryBackend, handle: int, vocab: int, ctx: int, path: str):
        super().__init__(backend, handle, path)
        self.vocab, self.ctx = vocab, ctx

    def forward(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        self._live()
        t = _tokens32(tokens)
        pos = _int32(pos, "pos")
        st, logits = self.backend._call(f"forward({self.path!r}, tokens[{t.size}], pos={pos})", "forward",
                                        self.handle, t.astype(np.int32), pos)
        if st == abi.ML_E_ARG:
            raise InputError(f"ml_forward refused {t.size} token(s) at pos {pos} (ML_E_ARG): a token "
                             f"outside [0, {self.vocab}), or pos beyond the positions fed, or pos + n above "
                             f"ctx {self.ctx}")
        if st == abi.ML_E_FORMAT:
            raise NumericError(f"{self.path}: ml_forward of {t.size} token(s) at pos {pos} returned "
                               f"ML_E_FORMAT: a non-finite activation (decision forward.nonfinite)")
        if st != abi.ML_OK:
            raise BackendError(f"ml_forward returned {abi.status_name(st)}")
        return logits

    def reset(self) -> None:
        self._live()
        self.backend._call(f"reset({self.path!r})", "reset", self.handle)

    def close(self) -> None:
        self._free("free")


class TokenizerSession(_Handle):
    def encode(self, text: str) -> list[int]:
        self._live()
        data = text.encode("utf-8", "surrogatepass")
        st, ids = self.backend._call(f"encode({self.path!r}, {len(data)} bytes)", "tok_encode", self.handle,
                                     data)
        if st != abi.ML_OK:
            raise BackendError(f"ml_tok_encode returned {abi.status_name(st)}")
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> bytes:
        self._live()
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if a.size and (a.min() < INT32[0] or a.max() > INT32[1]):
            raise InputError("an id does not fit the ABI's int32_t")
        st, out = self.backend._call(f"decode({self.path!r}, ids[{a.size}])", "tok_decode", self.handle,
                                     a.astype(np.int32))
        if st == abi.ML_E_ARG:
            raise InputError("ml_tok_decode refused the ids (ML_E_ARG): an id outside the vocabulary")
        if st != abi.ML_OK:
            raise BackendError(f"ml_tok_decode returned {abi.status_name(st)}")
        return out

    def close(self) -> None:
        self._free("tok_free")


class EmbedderSession(_Handle):
    def __init__(self, backend: LibraryBackend, handle: int, dim: int, vocab: int, path: str):
        super().__init__(backend, handle, path)
        self.dim, self.vocab = dim, vocab

    def embed(self, tokens: np.ndarray, pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        self._live()
        t = _tokens32(tokens)
        if pooling not in POOLING_CODES:
            raise InputError(f"pooling {pooling!r} is not one of {tuple(POOLING_CODES)}")
        st, out = self.backend._call(f"embed({self.path!r}, tokens[{t.size}], {pooling}, normalize="
                                     f"{bool(normalize)})", "embed", self.handle, t.astype(np.int32),
                                     POOLING_CODES[pooling], int(bool(normalize)))
        if st == abi.ML_E_ARG:
            bad = np.flatnonzero((t < 0) | (t >= self.vocab))
            if t.size == 0:
                why = "no tokens"
            elif bad.size:
                why = f"token {int(t[bad[0]])} at index {int(bad[0])} is outside [0, {self.vocab})"
            else:
                why = f"no rule refuses {t.size} tokens in [0, {self.vocab}) with pooling {pooling!r}"
            raise InputError(f"ml_embed refused the call (ML_E_ARG): {why}")
        if st == abi.ML_E_FORMAT:
            raise NumericError(f"{self.path}: ml_embed returned ML_E_FORMAT: the model's values overflow to "
                               f"a non-finite activation (decision forward.nonfinite)")
        if st != abi.ML_OK:
            raise BackendError(f"ml_embed returned {abi.status_name(st)}")
        return out

    def close(self) -> None:
        self._free("embed_free")


# ---------------------------------------------------------------- the names native, native:ISA
_SPARE: dict[str, LibraryBackend] = {}   # the backend library_available() started, for the next get


@atexit.register
def _close_spares() -> None:
    """Stop the workers of spares nobody asked for (their pipes and stderr files close with them)."""
    while _SPARE:
        _SPARE.popitem()[1].close()


def _native_sources() -> list[Path]:
    return [*HERE.glob("src/*.[ch]"), *HERE.glob("include/*.h")]


def stale_sources(library: Path, sources: list[Path]) -> list[str]:
    """Names of ``sources`` newer than ``library`` (a developer edited C and did not rebuild).
    Source trees only: an installed package's file times say nothing about the build."""
    if not library.exists() or not (HERE.parents[1] / "pyproject.toml").exists():
        return []
    built = library.stat().st_mtime
    return [p.name for p in sources if p.exists() and p.stat().st_mtime > built]


def _stale_sources() -> list[str]:
    return stale_sources(LIBRARY, _native_sources())


def open_library(name: str, library: Path, isa: str | None, sources: list[Path], what: str,
                 build_hint: str) -> LibraryBackend:
    """A LibraryBackend on a library of this source tree: BackendError if it is not built, a
    warning if a source is newer than it. ``what`` names it in messages ("the native library")."""
    spare = _SPARE.pop(name, None)
    if spare is not None:
        return spare
    if not library.exists():
        raise BackendError(f"{name}: {what} {library} is not built; {build_hint}")
    stale = stale_sources(library, sources)
    if stale:
        warnings.warn(f"{library} is older than {', '.join(sorted(stale))}: rebuild it with "
                      "`python backends/native/build.py --all` (or reinstall)", stacklevel=3)
    return LibraryBackend(name, library, isa=isa)


def library_available(name: str, library: Path, factory) -> bool:
    """Whether backend ``name`` (``factory(name)``) is built and loads; the backend started to find
    out is kept for the next ``factory(name)`` (open_library hands it out)."""
    if name in _SPARE:
        return True
    if not library.exists():
        return False
    try:
        _SPARE[name] = factory(name)
    except BackendError as e:
        warnings.warn(f"the {name} backend is left out: {e}", stacklevel=3)
        return False
    return True


def native_backend(name: str) -> LibraryBackend:
    """The backend ``native`` or ``native:ISA``."""
    isa = name.split(":", 1)[1] if ":" in name else None
    if isa is not None and isa not in ISAS:
        raise BackendError(f"unknown ISA {isa!r} in {name!r}; known: {', '.join(ISAS)}")
    if name in _SPARE:
        return _SPARE.pop(name)
    if isa in ("neon", "neon-dotprod") and platform.machine() not in ("aarch64", "arm64"):
        from . import qemu
        return LibraryBackend(name, " ".join(qemu.command()), isa=isa, worker_class=qemu.QemuWorker)
    return open_library(name, LIBRARY, isa, _native_sources(), "the native library",
                        "`pip install .` builds it, and in a source tree `python backends/native/build.py` "
                        "rebuilds it")


def native_available() -> bool:
    """Whether ``native`` is built and loads (``mlconf run`` then uses it by default)."""
    return library_available("native", LIBRARY, native_backend)


__all__ = ["LIBRARY", "ISAS", "LibraryBackend", "ModelSession", "TokenizerSession", "EmbedderSession",
           "native_backend", "native_available", "default_timeout", "stale_sources", "open_library",
           "library_available"]
