"""``cmd:PROGRAM [ARGS...]``: any executable that speaks mlconf's line-based JSON protocol.

A runtime in any language (Rust, C++, Go, Java, a Python script) is gated without C bindings: mlconf
starts the program once per backend (the rest of the name is split with shlex; a relative PROGRAM
path is relative to the current directory, a bare name is looked up on PATH) and talks to it on its
stdin and stdout. Its stderr is kept (the last bytes of each call) and quoted when it dies.

    mlconf run -b "cmd:python examples/cmd_runtime/q8_runtime.py" --area quant
    mlconf run -b "cmd:./target/release/myruntime --mlconf"

Protocol, version 1
-------------------
Framing: one JSON object per line, UTF-8, terminated by "\\n", in both directions. mlconf writes
ASCII-only JSON (non-ASCII characters as \\u escapes). The program writes exactly one reply line per
request, in order, and must flush stdout after each reply; anything else it wants to print goes to
stderr. When its stdin reaches end of file it should exit (mlconf kills it 2 s later otherwise).

Request: {"id": N, "op": "NAME", ...arguments}. N counts up from 0; the reply carries the same N.
Reply, success: {"id": N, "ok": true, ...results}
Reply, failure: {"id": N, "ok": false, "error": {"kind": KIND, "message": "TEXT"}}
  KIND "input":       the input is refused (non-finite quantizer input, an f16 scale above 65504, a
                      token out of range, ...). Quantizer and I2_S ops: the harness sees ValueError,
                      which the "refused" cases expect; other ops: InputError.
  KIND "nonfinite":   forward and embed: a matrix input (or the pooled embedding) was NaN or
                      infinite, from the file's weights or from float32 overflow (decision
                      forward.nonfinite); the harness sees NumericError. Feed none of the call's
                      positions (a model with linear-attention layers starts over at 0).
  KIND "unsupported": the op, or this variant of it (a Q4_0 rule, ...), is not implemented; the case
                      is reported "unsupported", never as a pass. Answer an op you do not know so.
  KIND "internal":    a bug or failure of the runtime: the case is an "error".

Arrays travel as base64 (standard alphabet, with padding) of their raw little-endian bytes, row-major;
the dtype is fixed by the field (below) and the shape given by a "shape" field or implied.
Handles are integers (or strings) the program chooses; they live as long as the process.

  op             arguments                                    results
  hello          protocol: 1                                  name, version (strings), capabilities:
                                                              a list of names of mlconf.backends.CAPABILITIES
                                                              (load, quantize_q8_0, quantize_q4_0, forward,
                                                              load_tokenizer, encode, i2s, embed)
  load           path                                         status ("ML_OK", "ML_E_IO", "ML_E_FORMAT",
                                                              "ML_E_SHAPE"), reason (string)
  quantize_q8_0  x: f32, shape: [..., k*32], f16: bool         q: int8 (one per input value),
                                                              d: f32, or f16 bits when f16 (one per block)
  quantize_q4_0  x, shape, f16 as above, rule: "round" |       q: uint8, 16 bytes per block (nibble j: x[j]
                 "search", importance: f32 of length          in the low nibble, x[j+16] in the high one,
                 shape[-1], or null                           level + 8), d as above
  open_model     path, ctx: int or null (the model's own)     handle, vocab, ctx (ints)
  forward        handle, tokens: [ints], pos: int             logits: f32, shape: [len(tokens), vocab]
  reset          handle                                       (nothing)
  close          handle (any handle: model, tokenizer,        (nothing)
                 embedder)
  load_tokenizer path, model_vocab: int or null               status, reason
  open_tokenizer path                                         handle
  encode         handle, text: string, utf8: base64 of the    ids: [ints]
                 text's UTF-8 bytes (the same text; use it
                 if your JSON parser rejects lone surrogates)
  decode         handle, ids: [ints]                          bytes: base64
  i2s_quantize   w: f32, shape: [rows, cols]                  payload: base64 (rows*cols/4 packed bytes,
                                                              f32 scale, 28 zero bytes)
  i2s_quantize_act x: f32, shape: [rows, cols]                q: int8 [rows, cols], scale: f32 [rows],
                                                              sum: int32 [rows]
  i2s_matmul     payload: base64, shape: [rows, cols],        y: f32 [n, rows]
                 x: f32, x_shape: [n, cols]
  open_embedder  path [, reading "float" | "ternary"]          handle, dim, vocab
  embed          handle, tokens: [ints], pooling: null |      vector: f32 [dim]
                 "mean" | "cls" | "last", normalize: bool

hello is the first request of every process; the capabilities it lists decide which cases run
(a case needing another capability is "unsupported" without a request). A status of "load" /
"load_tokenizer" that is not one of the four is reported as an error of the case.

Isolation (as for the native worker): if the program exits, or closes stdout, during a call the call
raises WorkerCrash naming the exit status or signal and quoting the tail of its stderr; if no reply
comes within ``timeout`` seconds (default 60, or MLCONF_WORKER_TIMEOUT) the program is killed and the
call raises WorkerTimeout. A reply line that is not JSON, not an object, or carries the wrong id or
malformed fields raises BackendError quoting the line, and the program is stopped (the stream can no
longer be trusted). In every case the next call starts the program again (with a new hello); handles
of the old process are then invalid.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import select
import shlex
import shutil
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..base import (
    CAPABILITIES,
    READINGS,
    BackendError,
    InputError,
    LoadResult,
    NumericError,
    Unsupported,
    WorkerCrash,
    WorkerTimeout,
)
from ..native import default_timeout
from ..native.worker import signal_name, stderr_file, stderr_tail

PROTOCOL = 1
STARTUP_TIMEOUT = 30.0      # seconds for hello (at least; the call timeout if longer)
EXIT_WAIT = 5.0             # seconds a program that closed its stdout has to exit before it is killed
QUOTE = 300                 # characters of a malformed reply line quoted
QUANT_OPS = ("quantize_q8_0", "quantize_q4_0", "i2s_quantize", "i2s_quantize_act", "i2s_matmul")
POOLINGS = (None, "mean", "cls", "last")


# ---------------------------------------------------------------- arrays <-> base64 (one place)
def pack(a: Any, dtype: str) -> str:
    """An array (or bytes) as base64 of its little-endian bytes in ``dtype`` (e.g. "<f4", "u1")."""
    if isinstance(a, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(a)).decode("ascii")
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype)).tobytes()).decode("ascii")


def unpack(reply: dict, field: str, dtype: str, shape: tuple[int, ...] | None = None,
           where: str = "") -> np.ndarray:
    """Field ``field`` of a reply: base64 of little-endian ``dtype`` -> an array of native byte
    order (``shape`` checked when given). BackendError naming the field for anything else."""
    dt = np.dtype(dtype)
    raw = _b64(reply, field, where)
    if len(raw) % dt.itemsize:
        raise BackendError(f"{where}: reply field {field!r} has {len(raw)} bytes, not a multiple of "
                           f"{dt.itemsize} ({dt.name})")
    a = np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="))
    if shape is not None:
        n = int(np.prod(shape, dtype=np.int64))
        if a.size != n:
            raise BackendError(f"{where}: reply field {field!r} has {a.size} {dt.name} values "
                               f"({len(raw)} bytes), expected {n} for shape {list(shape)}")
        a = a.reshape(shape)
    return a


def _b64(reply: dict, field: str, where: str) -> bytes:
    v = reply.get(field)
    if not isinstance(v, str):
        raise BackendError(f"{where}: reply field {field!r} must be a base64 string, got "
                           f"{_short(json.dumps(v))}")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BackendError(f"{where}: reply field {field!r} is not base64 ({e}): {_short(v)}") from None


def _field(reply: dict, field: str, kind: type | tuple[type, ...], where: str):
    v = reply.get(field)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BackendError(f"{where}: reply field {field!r} must be {names}, got {_short(json.dumps(v))}")
    return v


def _short(text: str, n: int = QUOTE) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


# ---------------------------------------------------------------- the process
class _Timeout(Exception):
    pass


class _EOF(Exception):
    pass


def _reap(proc: subprocess.Popen, err=None) -> None:
    """Stop the program: end of input first (it should exit), then SIGKILL; close our ends."""
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    for f in (proc.stdin, proc.stdout, err):
        try:
            if f is not None:
                f.close()
        except OSError:   # BrokenPipeError from a flush: the program is gone anyway
            pass


class Program:
    """One running instance of the program, restarted by ``call`` after it died or was killed."""

    def __init__(self, name: str, argv: list[str], timeout: float):
        self.name, self.argv, self.timeout = name, argv, timeout
        self.proc: subprocess.Popen | None = None
        self.epoch = 0           # processes started so far; a handle is valid for one epoch
        self.info: dict = {}
        self._err = None
        self._buf = bytearray()
        self._next_id = 0
        self._finalizer = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> dict:
        """Start the program and say hello; the reply (name, version, capabilities)."""
        self.stop()
        self._err = stderr_file()
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err, bufsize=0, close_fds=True)
        except OSError as e:
            self.stop()
            raise BackendError(f"{self.name}: cannot start {shlex.join(self.argv)}: {e}") from None
        self.epoch += 1
        self._buf = bytearray()
        self._next_id = 0
        self._finalizer = weakref.finalize(self, _reap, self.proc, self._err)
        reply = self._exchange("hello", {"protocol": PROTOCOL}, "hello", max(self.timeout, STARTUP_TIMEOUT))
        if not reply.get("ok"):
            msg = self._error_text(reply, "hello")
            self.stop()
            raise BackendError(f"{self.name}: the program refused hello: {msg}")
        self.info = reply
        return reply

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()   # _reap: the program, its pipes and our stderr file
            self._finalizer = None
        elif self._err is not None:   # start() failed before the program ran
            self._err.close()
        self.proc = None
        self._err = None

    def stop_hard(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stop()

    def call(self, desc: str, op: str, args: dict) -> dict:
        """One request; the reply object (ok true or false). Raises WorkerCrash / WorkerTimeout /
        BackendError as the module doc says."""
        if not self.alive():
            self.start()
        os.ftruncate(self._err.fileno(), 0)
        return self._exchange(op, args, desc, self.timeout)

    # -- internals
    def _exchange(self, op: str, args: dict, desc: str, timeout: float) -> dict:
        rid = self._next_id
        self._next_id += 1
        line = json.dumps({"id": rid, "op": op, **args}, ensure_ascii=True, allow_nan=False) + "\n"
        try:
            _write_all(self.proc.stdin.fileno(), line.encode("ascii"))
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(desc) from None
        deadline = time.monotonic() + timeout
        try:
            raw = self._readline(deadline)
        except _Timeout:
            self.stop_hard()
            raise WorkerTimeout(f"{self.name}: no reply within {timeout:g} s during {desc}; the program "
                                "was killed") from None
        except _EOF:
            raise self._died(desc) from None
        return self._parse(raw, rid, desc)

    def _parse(self, raw: bytes, rid: int, desc: str) -> dict:
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        why = ""
        try:
            reply = json.loads(text)
        except ValueError as e:
            reply, why = None, f"not JSON ({e})"
        if not why and not isinstance(reply, dict):
            why = "not a JSON object"
        elif not why and reply.get("id") != rid:
            why = f"id {reply.get('id')!r}, expected {rid}"
        elif not why and not isinstance(reply.get("ok"), bool):
            why = "no boolean \"ok\" field"
        if why:
            self.stop_hard()   # the stream is out of step: start afresh on the next call
            raise BackendError(f"{self.name}: malformed reply during {desc}: {why}: {_short(text)!r}")
        return reply

    def _readline(self, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i + 1])
                del self._buf[:i + 1]
                return line
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(left * 1000):
                raise _Timeout
            b = os.read(fd, 1 << 20)
            if not b:
                raise _EOF
            self._buf += b

    def _died(self, desc: str) -> WorkerCrash:
        try:
            rc = self.proc.wait(timeout=EXIT_WAIT)
        except subprocess.TimeoutExpired:   # closed its stdout but lives on: end it
            self.proc.kill()
            self.proc.wait()
            rc = None
        if rc is None:
            msg = (f"{self.name}: the program closed its stdout during {desc} and had not exited "
                   f"{EXIT_WAIT:g} s later; killed")
        elif rc < 0:
            msg = f"{self.name}: the program was killed by {signal_name(rc)} during {desc}"
        else:
            msg = f"{self.name}: the program exited with status {rc} during {desc}"
        tail = self._stderr_tail()
        self.stop()
        return WorkerCrash(msg + (f"; its stderr: {tail}" if tail else "; its stderr was empty"))

    def _stderr_tail(self) -> str:
        return stderr_tail(self._err)

    @staticmethod
    def _error_text(reply: dict, desc: str) -> str:
        err = reply.get("error")
        if isinstance(err, dict):
            return f"{err.get('kind', '?')}: {err.get('message', '')}"
        return f"no error object in {_short(json.dumps(reply))}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# ---------------------------------------------------------------- the backend
def split_name(name: str) -> list[str]:
    """``cmd:PROGRAM ARGS`` -> argv, PROGRAM resolved (a path relative to the current directory,
    or a bare name on PATH)."""
    rest = name.split(":", 1)[1] if ":" in name else ""
    try:
        argv = shlex.split(rest)
    except ValueError as e:
        raise BackendError(f"{name!r}: cannot split the command line: {e}") from None
    if not argv:
        raise BackendError(f"{name!r}: give the program, e.g. \"cmd:./myruntime --mlconf\"")
    prog = argv[0]
    if os.sep in prog or (os.altsep and os.altsep in prog):
        p = Path(prog).expanduser()
        p = p if p.is_absolute() else Path.cwd() / p
        if not p.is_file():
            raise BackendError(f"{name}: {p} is not a file")
        argv[0] = str(p)
    else:
        found = shutil.which(prog)
        if found is None:
            raise BackendError(f"{name}: program {prog!r} not found on PATH")
        argv[0] = found
    return argv


class CmdBackend:
    """A program speaking the protocol of the module doc. ``timeout`` (seconds per call) may be
    changed at any time."""

    def __init__(self, name: str, argv: list[str] | None = None, timeout: float | None = None):
        self.name = name
        self.argv = argv if argv is not None else split_name(name)
        self._lock = threading.Lock()
        self._program = Program(name, self.argv, timeout or default_timeout())
        self._set_info(self._program.start())

    def _set_info(self, info: dict) -> None:
        where = f"{self.name}: hello"
        caps = info.get("capabilities")
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            self._program.stop_hard()
            raise BackendError(f"{where}: \"capabilities\" must be a list of strings, got "
                               f"{_short(json.dumps(caps))}")
        self.unknown_capabilities = sorted(set(caps) - set(CAPABILITIES))
        self.capabilities: frozenset[str] = frozenset(c for c in caps if c in CAPABILITIES)
        self.program_name = str(info.get("name", ""))
        self.version = str(info.get("version", ""))
        declared = ", ".join(sorted(self.capabilities)) or "none"
        extra = (f"; unknown names ignored: {', '.join(self.unknown_capabilities)}"
                 if self.unknown_capabilities else "")
        self.unsupported = {c: f"{shlex.join(self.argv)} does not declare {c} in its hello reply "
                               f"(declared: {declared}{extra})"
                            for c in CAPABILITIES if c not in self.capabilities}
        self.description = ", ".join(s for s in (self.program_name, self.version,
                                                  f"protocol {PROTOCOL}", shlex.join(self.argv)) if s) + extra

    # -- plumbing
    @property
    def timeout(self) -> float:
        return self._program.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._program.timeout = float(seconds)

    @property
    def epoch(self) -> int:
        return self._program.epoch

    def close(self) -> None:
        """Stop the program (a later call starts it again)."""
        self._program.stop()

    def __repr__(self) -> str:
        return f"<CmdBackend {self.name}>"

    def _need(self, capability: str) -> None:
        if capability not in self.capabilities:
            raise Unsupported(self.unsupported.get(capability, f"no {capability} capability"))

    def request(self, desc: str, op: str, **args) -> dict:
        """Send one request; the results of an ok reply, or the mapped exception of an error reply."""
        with self._lock:
            epoch = self._program.epoch
            reply = self._program.call(desc, op, args)
            if self._program.epoch != epoch:      # restarted: its hello may declare other things
                self._set_info(self._program.info)
        if reply["ok"]:
            return reply
        err = reply.get("error")
        kind = err.get("kind") if isinstance(err, dict) else None
        msg = err.get("message", "") if isinstance(err, dict) else ""
        text = f"{self.name}: {desc}: {msg}" if msg else f"{self.name}: {desc}"
        if kind == "input":
            raise (ValueError if op in QUANT_OPS else InputError)(text)
        if kind == "nonfinite":
            raise NumericError(text)
        if kind == "unsupported":
            raise Unsupported(text)
        if kind == "internal":
            raise BackendError(f"{text} (internal error of the program)")
        raise BackendError(f"{self.name}: malformed error reply during {desc}: "
                           f"{_short(json.dumps(reply))!r}")

    # -- the Backend protocol
    def load(self, path: str) -> LoadResult:
        self._need("load")
        return self._status(self.request(f"load({str(path)!r})", "load", path=str(path)), "load")

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult:
        self._need("load_tokenizer")
        r = self.request(f"load_tokenizer({str(path)!r}, model_vocab={model_vocab})", "load_tokenizer",
                         path=str(path), model_vocab=None if model_vocab is None else int(model_vocab))
        return self._status(r, "load_tokenizer")

    def _status(self, r: dict, where: str) -> LoadResult:
        st = _field(r, "status", str, f"{self.name}: {where}")
        reason = r.get("reason") or ""
        return LoadResult(st, str(reason))   # a status outside STATUSES: the runner reports it

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q8_0")
        x = _quant_input(x)
        desc = f"quantize_q8_0(float32{list(x.shape)}, f16={bool(f16)})"
        r = self.request(desc, "quantize_q8_0", x=pack(x, "<f4"), shape=list(x.shape), f16=bool(f16))
        return self._quant_reply(r, x, f16, "i1", x.shape, desc)

    def quantize_q4_0(self, x: np.ndarray, rule: str, f16: bool,
                      importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q4_0")
        x = _quant_input(x)
        imp = None
        if importance is not None:
            imp = np.asarray(importance, dtype=np.float32).reshape(-1)
            if imp.size != x.shape[-1]:
                raise ValueError(f"importance has {imp.size} values, the rows have {x.shape[-1]}")
            imp = pack(imp, "<f4")
        desc = f"quantize_q4_0(float32{list(x.shape)}, rule={rule}, f16={bool(f16)})"
        r = self.request(desc, "quantize_q4_0", x=pack(x, "<f4"), shape=list(x.shape), f16=bool(f16),
                         rule=str(rule), importance=imp)
        return self._quant_reply(r, x, f16, "u1", (*x.shape[:-1], x.shape[-1] // 2), desc)

    def _quant_reply(self, r: dict, x: np.ndarray, f16: bool, qdt: str, qshape, desc: str):
        where = f"{self.name}: {desc}"
        q = unpack(r, "q", qdt, tuple(qshape), where)
        dshape = (*x.shape[:-1], x.shape[-1] // 32)
        d = unpack(r, "d", "<u2" if f16 else "<f4", dshape, where)
        return q, (d.view(np.float16) if f16 else d)

    def open_model(self, path: str, ctx: int | None = None) -> ModelSession:
        self._need("forward")
        desc = f"open_model({str(path)!r}, ctx={ctx})"
        r = self.request(desc, "open_model", path=str(path), ctx=None if ctx is None else int(ctx))
        where = f"{self.name}: {desc}"
        return ModelSession(self, _handle(r, where), _field(r, "vocab", int, where),
                            _field(r, "ctx", int, where), str(path))

    def open_tokenizer(self, path: str) -> TokenizerSession:
        self._need("encode")
        desc = f"open_tokenizer({str(path)!r})"
        r = self.request(desc, "open_tokenizer", path=str(path))
        return TokenizerSession(self, _handle(r, f"{self.name}: {desc}"), str(path))

    def i2s_quantize(self, w: np.ndarray) -> bytes:
        self._need("i2s")
        w = np.asarray(w)
        if w.dtype not in (np.float32, np.float16):
            raise ValueError(f"weights must be float32 or float16, got {w.dtype}")
        w2 = _rows(w, "weights").astype(np.float32)
        desc = f"i2s_quantize({w.dtype}{list(w.shape)})"
        r = self.request(desc, "i2s_quantize", w=pack(w2, "<f4"), shape=list(w2.shape))
        return _b64(r, "payload", f"{self.name}: {desc}")

    def i2s_quantize_act(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._need("i2s")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32, got {x.dtype}")
        x2 = _rows(x, "activations")
        desc = f"i2s_quantize_act(float32{list(x.shape)})"
        r = self.request(desc, "i2s_quantize_act", x=pack(x2, "<f4"), shape=list(x2.shape))
        where = f"{self.name}: {desc}"
        q = unpack(r, "q", "i1", x2.shape, where)
        scale = unpack(r, "scale", "<f4", (x2.shape[0],), where)
        total = unpack(r, "sum", "<i4", (x2.shape[0],), where)
        return q.reshape(x.shape), scale.reshape(x.shape[:-1]), total.reshape(x.shape[:-1])

    def i2s_matmul(self, payload: bytes, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
        self._need("i2s")
        rows, cols = (int(v) for v in shape)
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32, got {x.dtype}")
        x2 = _rows(x, "activations")
        desc = f"i2s_matmul(payload[{len(payload)}], {(rows, cols)}, float32{list(x.shape)})"
        r = self.request(desc, "i2s_matmul", payload=pack(bytes(payload), "u1"), shape=[rows, cols],
                         x=pack(x2, "<f4"), x_shape=list(x2.shape))
        y = unpack(r, "y", "<f4", (x2.shape[0], rows), f"{self.name}: {desc}")
        return y.reshape(*x.shape[:-1], rows)

    def open_embedder(self, path: str, reading: str | None = None) -> EmbedderSession:
        """The program's embedder; a reading other than the file's own is sent as "reading" (a
        program that cannot do it answers an error of kind "unsupported")."""
        self._need("embed")
        if reading not in READINGS:
            raise InputError(f"reading {reading!r} is not one of {READINGS}")
        desc = f"open_embedder({str(path)!r}" + (f", {reading!r})" if reading else ")")
        r = self.request(desc, "open_embedder", path=str(path), **({"reading": reading} if reading else {}))
        where = f"{self.name}: {desc}"
        return EmbedderSession(self, _handle(r, where), _field(r, "dim", int, where),
                               _field(r, "vocab", int, where), str(path))


def _quant_input(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"input must be float32 (the protocol sends float32), got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % 32:
        raise ValueError(f"shape {x.shape}: the last dimension must be a multiple of 32")
    return x


def _rows(a: np.ndarray, what: str) -> np.ndarray:
    if a.ndim not in (1, 2):
        raise ValueError(f"{what} must be 1-D or 2-D, got shape {a.shape}")
    return np.ascontiguousarray(a.reshape(1, -1) if a.ndim == 1 else a)


def _handle(r: dict, where: str) -> int | str:
    return _field(r, "handle", (int, str), where)


def _tokens(tokens) -> list[int]:
    t = np.asarray(tokens)
    if t.ndim != 1 or not (np.issubdtype(t.dtype, np.integer) or t.size == 0):
        raise InputError(f"tokens must be a 1-D integer array, got {t.dtype}{list(t.shape)}")
    return [int(v) for v in t]


class _Session:
    """An object living in the program; valid while the process that made it lives."""

    def __init__(self, backend: CmdBackend, handle: int | str, path: str):
        self.backend, self.handle, self.path = backend, handle, path
        self.epoch = backend.epoch
        self.closed = False

    def _live(self) -> None:
        if self.closed:
            raise BackendError(f"{self.path}: used after close()")
        if self.epoch != self.backend.epoch or not self.backend._program.alive():
            raise BackendError(f"{self.path}: the program that held it has ended (after a crash, a "
                               "timeout or a malformed reply); open it again")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.epoch == self.backend.epoch and self.backend._program.alive():
            self.backend.request(f"close({self.path!r})", "close", handle=self.handle)


class ModelSession(_Session):
    def __init__(self, backend: CmdBackend, handle, vocab: int, ctx: int, path: str):
        super().__init__(backend, handle, path)
        self.vocab, self.ctx = vocab, ctx

    def forward(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        self._live()
        t = _tokens(tokens)
        desc = f"forward({self.path!r}, tokens[{len(t)}], pos={int(pos)})"
        r = self.backend.request(desc, "forward", handle=self.handle, tokens=t, pos=int(pos))
        where = f"{self.backend.name}: {desc}"
        shape = r.get("shape")
        if shape != [len(t), self.vocab]:
            raise BackendError(f"{where}: reply shape {_short(json.dumps(shape))}, expected "
                               f"[{len(t)}, {self.vocab}]")
        return unpack(r, "logits", "<f4", (len(t), self.vocab), where)

    def reset(self) -> None:
        self._live()
        self.backend.request(f"reset({self.path!r})", "reset", handle=self.handle)


class TokenizerSession(_Session):
    def encode(self, text: str) -> list[int]:
        self._live()
        data = text.encode("utf-8", "surrogatepass")
        desc = f"encode({self.path!r}, {len(data)} bytes)"
        r = self.backend.request(desc, "encode", handle=self.handle, text=text, utf8=pack(data, "u1"))
        ids = r.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BackendError(f"{self.backend.name}: {desc}: reply field 'ids' must be a list of integers, "
                               f"got {_short(json.dumps(ids))}")
        return ids

    def decode(self, ids: list[int]) -> bytes:
        self._live()
        a = [int(i) for i in np.asarray(ids).reshape(-1)]
        desc = f"decode({self.path!r}, ids[{len(a)}])"
        r = self.backend.request(desc, "decode", handle=self.handle, ids=a)
        return _b64(r, "bytes", f"{self.backend.name}: {desc}")


class EmbedderSession(_Session):
    def __init__(self, backend: CmdBackend, handle, dim: int, vocab: int, path: str):
        super().__init__(backend, handle, path)
        self.dim, self.vocab = dim, vocab

    def embed(self, tokens: np.ndarray, pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        self._live()
        if pooling not in POOLINGS:
            raise InputError(f"pooling {pooling!r} is not one of {POOLINGS}")
        t = _tokens(tokens)
        desc = f"embed({self.path!r}, tokens[{len(t)}], {pooling}, normalize={bool(normalize)})"
        r = self.backend.request(desc, "embed", handle=self.handle, tokens=t, pooling=pooling,
                                 normalize=bool(normalize))
        return unpack(r, "vector", "<f4", (self.dim,), f"{self.backend.name}: {desc}")


def cmd_backend(name: str) -> CmdBackend:
    return CmdBackend(name)


__all__ = ["PROTOCOL", "CmdBackend", "cmd_backend", "pack", "split_name", "unpack"]

