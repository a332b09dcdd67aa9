"""Both ends of the worker protocol: the process that owns a dlopen'ed mlrt.h library, and the
harness-side handle that talks to it.

Why a process: a library under test may crash (SIGSEGV, SIGABRT) or hang. In a worker process a
crash becomes WorkerCrash naming the signal, a hang becomes WorkerTimeout after the worker is
killed, and the harness goes on; the next call starts a fresh worker.

Protocol (over two pipes, the worker's stdin and stdout; the worker moves its own stdout to stderr
first, so whatever the library prints cannot corrupt it): each message is an 8-byte little-endian
length and a pickle.
- worker -> harness, once at start: ("ready", info) with info = {"symbols": [exported ABI
  functions], "version": ml_version(), "isa": ml_isa(), "isa_error": "" or why ml_set_isa
  refused, "tables": the kernel tables ml_set_isa accepts on this machine}, or ("fatal",
  message) if the library cannot be loaded (then the worker exits 1).
- harness -> worker: (op, args), op one of the _Server methods below; the answer is
  ("ok", result) or ("exc", exception class name, message) for a bug of the worker itself.
- End of input: the worker frees nothing and exits 0.
Model and tokenizer objects stay in the worker; the harness holds integer handles, valid for the
worker that made them (Worker.epoch counts the workers started).

    python -c "from mlconf.backends.native.worker import main; main()" LIBRARY.so [--isa NAME]

(-c rather than -m, so that nothing imports this module twice.) A library linked with AddressSanitizer
(build.py --sanitize) gets the ASan runtime preloaded in its worker, and a crash message then
quotes the sanitizer's SUMMARY line.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import struct
import subprocess
import sys
import time
from typing import Any

from ..base import BackendError, WorkerCrash, WorkerTimeout
from ..child import (
    EOF,
    EXIT_WAIT,
    STARTUP_TIMEOUT,
    Child,
    Timeout,
    read_some,
    signal_name,
    wait_exit,
    write_all,
)

HEADER = struct.Struct("<Q")
ENTRY = "import sys; from mlconf.backends.native.worker import main; sys.exit(main())"


# ---------------------------------------------------------------- framing
def _write_msg(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    write_all(fd, HEADER.pack(len(data)) + data)


def _read_blocking(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        b = os.read(fd, n - len(buf))
        if not b:
            return None
        buf += b
    return bytes(buf)


# ---------------------------------------------------------------- the worker process
class _Server:
    """The calls a worker answers; each returns plain data (ints, str, bytes, numpy arrays)."""

    def __init__(self, lib_path: str, isa: str | None):
        import numpy as np
        from cffi import FFI

        from . import abi

        self.np, self.abi = np, abi
        self.ffi = FFI()
        self.ffi.cdef(abi.CDEF)
        self.lib = self.ffi.dlopen(lib_path)  # OSError: reported as ("fatal", ...)
        self.symbols = [f for f in abi.FUNCTIONS if self._has(f)]
        self.objects: dict[int, Any] = {}
        self.next_handle = 1
        isa_error = ""
        tables = self._tables()
        if isa:
            if "ml_set_isa" not in self.symbols:
                isa_error = f"{lib_path} exports no ml_set_isa, so ISA {isa!r} cannot be chosen"
            else:
                st = self.lib.ml_set_isa(isa.encode())
                if st != abi.ML_OK:
                    isa_error = f"ml_set_isa({isa!r}) returned {abi.status_name(st)}"
        self.info = {
            "symbols": self.symbols,
            "version": self._str("ml_version"),
            "isa": self._str("ml_isa"),
            "isa_error": isa_error,
            "tables": tables,
        }

    def _tables(self) -> list[str]:
        """The kernel tables this library runs on this machine (ml_set_isa accepts them), the
        automatic choice restored after the probe; [] without ml_set_isa and ml_isa."""
        from ..base import NATIVE_ISAS

        if not {"ml_set_isa", "ml_isa"} <= set(self.symbols):
            return []
        auto = self.ffi.string(self.lib.ml_isa())
        found = [n for n in NATIVE_ISAS if self.lib.ml_set_isa(n.encode()) == self.abi.ML_OK]
        self.lib.ml_set_isa(auto)
        return found

    def _has(self, name: str) -> bool:
        try:
            getattr(self.lib, name)
        except AttributeError:
            return False
        return True

    def _str(self, fn: str) -> str:
        if fn not in self.symbols:
            return ""
        p = getattr(self.lib, fn)()
        return "" if p == self.ffi.NULL else self.ffi.string(p).decode("utf-8", "replace")

    def _reason(self):
        return self.ffi.new("char[]", self.abi.REASON_LEN)

    def _text(self, buf) -> str:
        return self.ffi.string(buf).decode("utf-8", "replace")

    def _keep(self, obj) -> int:
        h = self.next_handle
        self.next_handle += 1
        self.objects[h] = obj
        return h

    def target_version(self, major: int, minor: int, patch: int) -> int:
        return self.lib.ml_set_target_version(major, minor, patch)

    # -- models
    def check(self, path: str) -> tuple[int, str, str | None]:
        """(status, reason, rule id); the rule is None when the library lacks ml_check_rule."""
        reason = self._reason()
        if "ml_check_rule" in self.symbols:
            rule = self.ffi.new("char[]", self.abi.RULE_LEN)
            st = self.lib.ml_check_rule(
                os.fsencode(path), rule, self.abi.RULE_LEN, reason, self.abi.REASON_LEN
            )
            return st, self._text(reason), self._text(rule)
        st = self.lib.ml_check(os.fsencode(path), reason, self.abi.REASON_LEN)
        return st, self._text(reason), None

    def load(self, path: str, ctx: int, threads: int) -> tuple[int, int | None, str, int, int]:
        out = self.ffi.new("ml_model **")
        reason = self._reason()
        st = self.lib.ml_load(os.fsencode(path), ctx, threads, out, reason, self.abi.REASON_LEN)
        if st != self.abi.ML_OK or out[0] == self.ffi.NULL:
            return st, None, self._text(reason), 0, 0
        m = out[0]
        ctx_out = self.lib.ml_ctx(m) if "ml_ctx" in self.symbols else ctx
        return st, self._keep(m), self._text(reason), self.lib.ml_vocab(m), ctx_out

    def forward(self, h: int, tokens, pos: int) -> tuple[int, Any]:
        np, m = self.np, self.objects[h]
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        vocab = self.lib.ml_vocab(m)
        logits = np.zeros((len(tokens), vocab), dtype=np.float32)
        st = self.lib.ml_forward(
            m,
            self.ffi.from_buffer("int32_t[]", tokens),
            len(tokens),
            pos,
            self.ffi.from_buffer("float[]", logits, require_writable=True),
        )
        return st, logits

    def reset(self, h: int) -> None:
        self.lib.ml_reset(self.objects[h])

    def free(self, h: int) -> None:
        m = self.objects.pop(h, None)
        if m is not None:
            self.lib.ml_free(m)

    # -- quantizer
    def quantize_q8_0(self, x, f16: bool) -> tuple[int, Any, Any]:
        np = self.np
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        q = np.zeros(x.size, dtype=np.int8)
        d = np.zeros(-(-x.size // 32), dtype=np.uint16 if f16 else np.float32)
        ffi = self.ffi
        st = self.lib.ml_quantize_q8_0(
            ffi.from_buffer("float[]", x),
            x.size,
            int(f16),
            ffi.from_buffer("int8_t[]", q, require_writable=True),
            ffi.from_buffer(d, require_writable=True),
        )
        return st, q, d

    def quantize_q4_0(
        self, x, rows: int, cols: int, rule: int, f16: bool, importance
    ) -> tuple[int, Any, Any]:
        np, ffi = self.np, self.ffi
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        qs = np.zeros(x.size // 2, dtype=np.uint8)
        d = np.zeros(max(x.size // 32, 1), dtype=np.uint16 if f16 else np.float32)
        imp = (
            ffi.NULL
            if importance is None
            else ffi.from_buffer("float[]", np.ascontiguousarray(importance, dtype=np.float32))
        )
        st = self.lib.ml_quantize_q4_0(
            ffi.from_buffer("float[]", x),
            rows,
            cols,
            rule,
            int(f16),
            imp,
            ffi.from_buffer("uint8_t[]", qs, require_writable=True),
            ffi.from_buffer(d, require_writable=True),
        )
        return st, qs, d[: x.size // 32]

    # -- I2_S (arrays arrive C-contiguous (rows, cols) from the harness side)
    def i2s_quantize(self, w, rows: int, cols: int) -> tuple[int, bytes]:
        np, ffi = self.np, self.ffi
        w = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
        n = rows * cols // 4 + 32
        out = np.zeros(n + 64, dtype=np.uint8)  # slack: a library that writes past a refused size
        st = self.lib.ml_i2s_quantize(
            ffi.from_buffer("float[]", w),
            rows,
            cols,
            ffi.from_buffer("uint8_t[]", out, require_writable=True),
        )
        return st, out[:n].tobytes()

    def i2s_quantize_act(self, x, rows: int, cols: int) -> tuple[int, Any, Any, Any]:
        np, ffi = self.np, self.ffi
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        q = np.zeros(rows * cols, dtype=np.int8)
        scale = np.zeros(rows, dtype=np.float32)
        total = np.zeros(rows, dtype=np.int32)
        st = self.lib.ml_i2s_quantize_act(
            ffi.from_buffer("float[]", x),
            rows,
            cols,
            ffi.from_buffer("int8_t[]", q, require_writable=True),
            ffi.from_buffer("float[]", scale, require_writable=True),
            ffi.from_buffer("int32_t[]", total, require_writable=True),
        )
        return st, q, scale, total

    def i2s_matmul(self, payload, rows: int, cols: int, x, n: int) -> tuple[int, Any]:
        np, ffi = self.np, self.ffi
        payload = np.ascontiguousarray(payload, dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        y = np.zeros(n * rows, dtype=np.float32)
        st = self.lib.ml_i2s_matmul(
            ffi.from_buffer("uint8_t[]", payload),
            rows,
            cols,
            ffi.from_buffer("float[]", x),
            n,
            ffi.from_buffer("float[]", y, require_writable=True),
        )
        return st, y.reshape(n, rows)

    # -- BitNet GGUF embeddings
    def embed_load(self, path: str, threads: int, reading: int = 0) -> tuple[int, int | None, str, int, int]:
        """ml_embed_load, or ml_embed_load_reading for a reading other than the file's own (0)."""
        out = self.ffi.new("ml_embedder **")
        reason = self._reason()
        if reading:
            st = self.lib.ml_embed_load_reading(
                os.fsencode(path), threads, reading, out, reason, self.abi.REASON_LEN
            )
        else:
            st = self.lib.ml_embed_load(os.fsencode(path), threads, out, reason, self.abi.REASON_LEN)
        if st != self.abi.ML_OK or out[0] == self.ffi.NULL:
            return st, None, self._text(reason), 0, 0
        e = out[0]
        return st, self._keep(e), self._text(reason), self.lib.ml_embed_dim(e), self.lib.ml_embed_vocab(e)

    def embed_check(self, path: str) -> tuple[int, str, str | None]:
        """As check, for BitNet GGUFs (ml_embed_check_rule, else ml_embed_load then free)."""
        if "ml_embed_check_rule" in self.symbols:
            reason, rule = self._reason(), self.ffi.new("char[]", self.abi.RULE_LEN)
            st = self.lib.ml_embed_check_rule(
                os.fsencode(path), rule, self.abi.RULE_LEN, reason, self.abi.REASON_LEN
            )
            return st, self._text(reason), self._text(rule)
        st, h, reason, _, _ = self.embed_load(path, 1)
        if h is not None:
            self.embed_free(h)
        return st, reason, None

    def embed(self, h: int, tokens, pooling: int, normalize: int) -> tuple[int, Any]:
        np, ffi, e = self.np, self.ffi, self.objects[h]
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        out = np.zeros(self.lib.ml_embed_dim(e), dtype=np.float32)
        st = self.lib.ml_embed(
            e,
            ffi.from_buffer("int32_t[]", tokens),
            len(tokens),
            pooling,
            normalize,
            ffi.from_buffer("float[]", out, require_writable=True),
        )
        return st, out

    def embed_free(self, h: int) -> None:
        e = self.objects.pop(h, None)
        if e is not None:
            self.lib.ml_embed_free(e)

    # -- tokenizers
    def tok_load(self, path: str, model_vocab: int) -> tuple[int, int | None, str]:
        out = self.ffi.new("ml_tokenizer **")
        reason = self._reason()
        st = self.lib.ml_tok_load(os.fsencode(path), model_vocab, out, reason, self.abi.REASON_LEN)
        if st != self.abi.ML_OK or out[0] == self.ffi.NULL:
            return st, None, self._text(reason)
        return st, self._keep(out[0]), self._text(reason)

    def tok_check(self, path: str, model_vocab: int) -> tuple[int, str, str | None]:
        """As check, for .mlt files (ml_tok_check_rule, else ml_tok_load)."""
        if "ml_tok_check_rule" in self.symbols:
            reason, rule = self._reason(), self.ffi.new("char[]", self.abi.RULE_LEN)
            st = self.lib.ml_tok_check_rule(
                os.fsencode(path), model_vocab, rule, self.abi.RULE_LEN, reason, self.abi.REASON_LEN
            )
            return st, self._text(reason), self._text(rule)
        st, h, reason = self.tok_load(path, model_vocab)
        if h is not None:
            self.tok_free(h)
        return st, reason, None

    def tok_free(self, h: int) -> None:
        t = self.objects.pop(h, None)
        if t is not None:
            self.lib.ml_tok_free(t)

    def tok_encode(self, h: int, text: bytes) -> tuple[int, Any]:
        np, ffi, t = self.np, self.ffi, self.objects[h]
        n_out = ffi.new("size_t *")
        cap = len(text) + 16
        for _ in range(2):  # a second time with the size the library asked for
            ids = np.zeros(cap, dtype=np.int32)
            buf = ffi.from_buffer("int32_t[]", ids, require_writable=True)
            st = self.lib.ml_tok_encode(t, text, len(text), buf, cap, n_out)
            if st == self.abi.ML_E_ARG and n_out[0] > cap:
                cap = n_out[0]
                continue
            break
        return st, ids[: min(n_out[0], cap)].copy()

    def tok_decode(self, h: int, ids) -> tuple[int, bytes]:
        np, ffi, t = self.np, self.ffi, self.objects[h]
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        len_out = ffi.new("size_t *")
        cap = 16 * len(ids) + 16
        for _ in range(2):
            out = ffi.new("char[]", cap)
            st = self.lib.ml_tok_decode(t, ffi.from_buffer("int32_t[]", ids), len(ids), out, cap, len_out)
            if st == self.abi.ML_E_ARG and len_out[0] > cap:
                cap = len_out[0]
                continue
            break
        return st, ffi.buffer(out, min(len_out[0], cap))[:]


def main(argv: list[str] | None = None) -> int:
    # The protocol owns the pipes on fds 0 and 1; the library's prints go to stderr.
    rfd, wfd = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    args = list(sys.argv[1:] if argv is None else argv)
    isa = None
    if "--isa" in args:
        i = args.index("--isa")
        isa = args[i + 1]
        del args[i : i + 2]
    if len(args) != 1:
        _write_msg(wfd, ("fatal", "usage: worker LIBRARY [--isa NAME]"))
        return 1
    try:
        server = _Server(args[0], isa)
    except OSError as e:
        _write_msg(wfd, ("fatal", f"cannot load the library {args[0]}: {e}"))
        return 1
    _write_msg(wfd, ("ready", server.info))
    while True:
        head = _read_blocking(rfd, HEADER.size)
        if head is None:
            return 0
        body = _read_blocking(rfd, HEADER.unpack(head)[0])
        if body is None:
            return 0
        op, args_ = pickle.loads(body)
        try:
            if op.startswith("_") or not hasattr(server, op):
                raise ValueError(f"unknown operation {op!r}")
            reply = ("ok", getattr(server, op)(*args_))
        except Exception as e:  # a bug of the worker or of the call: the harness gets a BackendError
            reply = ("exc", type(e).__name__, str(e))
        _write_msg(wfd, reply)


# ---------------------------------------------------------------- the harness side
@functools.lru_cache(maxsize=32)
def _sanitizer_preload(lib_path: str, mtime: float) -> str:
    """The ASan runtime a library was linked with (build.py --sanitize), or "". It must come first
    in the process, so the worker preloads it: sanitized builds run under lib:PATH like any other."""
    try:
        r = subprocess.run(
            ["ldd", lib_path], capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"^\s*libasan\.so[.\d]* => (\S+)", r.stdout, flags=re.M)
    return m.group(1) if m else ""


def _worker_env(lib_path: str) -> dict[str, str] | None:
    try:
        asan = _sanitizer_preload(lib_path, os.stat(lib_path).st_mtime)
    except OSError:
        return None
    if not asan:
        return None
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(p for p in (asan, env.get("LD_PRELOAD", "")) if p)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")  # the Python interpreter's own allocations
    return env


class Worker(Child):
    """A worker process for one library (and one forced ISA), started on first use and again after
    it died. ``call`` raises WorkerCrash / WorkerTimeout / BackendError as the module doc says."""

    def __init__(self, lib_path: str, isa: str | None = None, timeout: float = 60.0):
        super().__init__(timeout)
        self.lib_path, self.isa = lib_path, isa
        self.setup: list[tuple[str, tuple]] = []  # calls made again on every fresh worker

    def start(self) -> dict:
        """Start a fresh worker and return its info; BackendError if the library cannot load."""
        cmd = [sys.executable, "-P", "-c", ENTRY, self.lib_path]
        if self.isa:
            cmd += ["--isa", self.isa]
        self._spawn(cmd, env=_worker_env(self.lib_path))
        kind, payload = self._receive(f"dlopen({self.lib_path!r})", max(self.timeout, STARTUP_TIMEOUT))
        if kind != "ready":
            self.stop()
            raise BackendError(str(payload))
        self.info = payload
        return payload

    def call(self, desc: str, op: str, *args):
        """Run ``op(*args)`` in the worker; ``desc`` names the call in crash and timeout messages."""
        if not self.alive():
            self.start()
            self.replay(desc)
        self._new_call()
        try:
            _write_msg(self.proc.stdin.fileno(), (op, args))
        except BrokenPipeError:
            raise self._died(desc) from None
        reply = self._receive(desc, self.timeout)
        if reply[0] == "ok":
            return reply[1]
        raise BackendError(f"worker error during {desc}: {reply[1]}: {reply[2]}")

    def replay(self, desc: str) -> None:
        """Make the ``setup`` calls on a worker just started (the state a call relies on, such
        as the target version, lives in the worker process)."""
        for op, args in self.setup:
            self.call(f"{desc} (setup: {op}{args})", op, *args)

    # -- internals
    def _receive(self, desc: str, timeout: float):
        deadline = time.monotonic() + timeout
        try:
            n = HEADER.unpack(self._read(HEADER.size, deadline))[0]
            return pickle.loads(self._read(n, deadline))
        except Timeout:
            self.stop_hard()
            raise WorkerTimeout(f"worker timed out after {timeout:g} s during {desc}; killed") from None
        except EOF:
            raise self._died(desc) from None

    def _read(self, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            buf += read_some(self.proc.stdout.fileno(), deadline, min(n - len(buf), 1 << 20))
        return bytes(buf)

    def _died(self, desc: str) -> WorkerCrash:
        rc = wait_exit(self.proc)
        if rc is None:  # closed its output but lived on: killed
            msg = f"worker closed its output during {desc}, still ran {EXIT_WAIT:g} s later; killed"
        elif rc < 0:
            msg = f"worker killed by {signal_name(rc)} during {desc}"
        else:
            msg = f"worker exited with status {rc} during {desc}"
        tail = self._stderr_tail()
        self.stop()
        summary = re.findall(r"^SUMMARY: .*$", tail, flags=re.M)  # a sanitizer's report
        if summary:
            return WorkerCrash(f"{msg}: {summary[-1]}")
        return WorkerCrash(msg + (f"; its stderr: {tail}" if tail else ""))


if __name__ == "__main__":
    sys.exit(main())
