"""native:neon on hosts that are not aarch64: the runtime's NEON build as a static aarch64 worker
executable (worker_main.c, build.py build_worker) run under ``qemu-aarch64 -cpu max``.

QemuWorker has the interface of worker.Worker (start, call, stop, alive, timeout, epoch), so
LibraryBackend drives it like the Python worker: the same operation names, arguments and results.
Only the transport differs: the binary protocol documented at the top of worker_main.c instead of
pickles. A guest crash ends qemu with the same signal (qemu-user reports "qemu: uncaught target
signal 11 (Segmentation fault)" on stderr and kills itself with it), so it is a WorkerCrash naming
the signal like any other; a hang is a WorkerTimeout.

The executable is built on first use into build-aarch64/ beside this file (git-ignored; or, if that
folder is not writable, a per-user cache folder), and again whenever a source (src/, include/,
worker_main.c, build.py) is newer. Without the cross compiler or qemu-aarch64 the backend starts
with no capability, and every case is unsupported with the reason.

-cpu max has the dot-product extension, so the automatic choice is neon-dotprod: native:neon forces
the plain NEON table with ml_set_isa("neon"), native:neon-dotprod the other.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import struct
import time
from pathlib import Path

import numpy as np

from ..base import BackendError, InputError, WorkerTimeout
from ..child import EOF, STARTUP_TIMEOUT, Timeout, write_all
from .abi import status_name
from .worker import Worker

HERE = Path(__file__).resolve().parent
CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
QEMU_CPU = "max"
EXE_NAME = "mlrt-worker"

HEAD = struct.Struct("<II")  # request: op, payload length; reply: status, payload length
WK_OK, WK_ERROR = 0, 1
OPS = {
    "info": 1,
    "check": 2,
    "quantize_q8_0": 3,
    "load": 4,
    "forward": 5,
    "reset": 6,
    "free": 7,
    "imatrix_start": 8,
    "imatrix_get": 9,
    "tok_load": 10,
    "tok_encode": 11,
    "tok_decode": 12,
    "tok_free": 13,
    "quantize_q4_0": 14,
    "target_version": 15,
    "tok_check": 16,
}
U32 = 2**32 - 1


# ---------------------------------------------------------------- the executable
def build_dir() -> Path:
    """build-aarch64/ beside this file, or a cache folder of the user when this folder is not
    writable (an installed package). Not created here: worker_executable does that."""
    if os.access(HERE, os.W_OK):
        return HERE / "build-aarch64"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mlconf" / f"native-aarch64-{hashlib.sha256(os.fsencode(HERE)).hexdigest()[:12]}"


def _sources() -> list[Path]:
    return [*HERE.glob("src/*.[ch]"), *HERE.glob("include/*.h"), HERE / "worker_main.c", HERE / "build.py"]


def missing_tools() -> str:
    """Why the worker cannot run here ("" when it can)."""
    missing = [t for t in (CC, QEMU) if shutil.which(t) is None]
    if not missing:
        return ""
    return (
        f"running the aarch64 build under qemu-user needs {' and '.join(missing)}, not found "
        "(apt-get install gcc-aarch64-linux-gnu qemu-user)"
    )


def executable() -> Path:
    """Where the worker executable is (or will be, once built)."""
    return build_dir() / EXE_NAME


def command(exe: str | Path | None = None) -> list[str]:
    """The command that runs the worker."""
    return [QEMU, "-cpu", QEMU_CPU, str(exe or executable())]


def worker_executable() -> Path:
    """The worker executable, built (or rebuilt, when a source is newer) first; BackendError with
    the compiler's output if the build fails."""
    from . import build

    exe = executable()
    exe.parent.mkdir(parents=True, exist_ok=True)
    # one build at a time, across processes
    with open(exe.parent / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            built = exe.stat().st_mtime
        except FileNotFoundError:
            built = None
        if built is None or any(p.stat().st_mtime > built for p in _sources() if p.exists()):
            try:
                build.build_worker(exe, machine="aarch64", cc=CC)
            except build.BuildError as e:
                raise BackendError(f"cannot build the aarch64 worker {exe}: {e}") from None
    return exe


# ---------------------------------------------------------------- the protocol
class _Buf:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise BackendError(f"malformed reply from the aarch64 worker ({len(self.data)} bytes)")
        b = self.data[self.at : self.at + n]
        self.at += n
        return b

    def i32(self) -> int:
        return struct.unpack("<i", self.take(4))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def str(self) -> str:
        return self.take(self.u32()).decode("utf-8", "replace")

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.at)


def _s(text: str) -> bytes:
    b = os.fsencode(text)
    return struct.pack("<I", len(b)) + b


def _handle(h) -> int:
    h = int(h)
    if not 0 <= h <= U32:
        raise InputError(f"handle {h} is not a worker handle")
    return h


def _encode(op: str, args: tuple) -> bytes:
    """The request payload of ``op(*args)`` (the argument lists of worker.py's _Server)."""
    if op == "info":
        (isa,) = args
        return _s(isa or "")
    if op == "check":
        return _s(args[0])
    if op == "tok_check":
        path, model_vocab = args
        return _s(path) + struct.pack("<i", model_vocab)
    if op == "target_version":
        return struct.pack("<III", *args)
    if op == "quantize_q8_0":
        x, f16 = args
        return struct.pack("<I", int(bool(f16))) + np.ascontiguousarray(x, dtype="<f4").tobytes()
    if op == "quantize_q4_0":
        x, rows, cols, rule, f16, imp = args
        head = struct.pack("<IIIII", rows, cols, rule, int(bool(f16)), int(imp is not None))
        imp_bytes = b"" if imp is None else np.ascontiguousarray(imp, dtype="<f4").tobytes()
        return head + imp_bytes + np.ascontiguousarray(x, dtype="<f4").tobytes()
    if op == "load":
        path, ctx, threads = args
        return _s(path) + struct.pack("<ii", ctx, threads)
    if op == "forward":
        h, tokens, pos = args
        return struct.pack("<Ii", _handle(h), pos) + np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    if op in ("reset", "free", "imatrix_start", "tok_free"):
        return struct.pack("<I", _handle(args[0]))
    if op == "imatrix_get":
        h, n = args
        return struct.pack("<IQ", _handle(h), n)
    if op == "tok_load":
        path, model_vocab = args
        return _s(path) + struct.pack("<i", model_vocab)
    if op == "tok_encode":
        h, text = args
        return struct.pack("<I", _handle(h)) + bytes(text)
    if op == "tok_decode":
        h, ids = args
        return struct.pack("<I", _handle(h)) + np.ascontiguousarray(ids, dtype="<i4").tobytes()
    raise BackendError(f"unknown operation {op!r}")


def _decode(op: str, args: tuple, r: _Buf, vocab: dict[int, int]):
    """The result of ``op`` as worker.py's _Server returns it."""
    if op == "info":
        st, version, isa = r.i32(), r.str(), r.str()
        return st, version, isa, [r.str() for _ in range(r.u32())]
    if op in ("check", "tok_check"):
        return r.i32(), r.str(), r.str()
    if op == "quantize_q8_0":
        x, f16 = args
        n = int(np.asarray(x).size)
        st = r.i32()
        q = np.frombuffer(r.take(n), dtype=np.int8).copy()
        d = np.frombuffer(r.rest(), dtype="<u2" if f16 else "<f4").astype(np.uint16 if f16 else np.float32)
        return st, q, d
    if op == "quantize_q4_0":
        x, rows, cols, rule, f16, imp = args
        st = r.i32()
        qs = np.frombuffer(r.take(rows * cols // 2), dtype=np.uint8).copy()
        d = np.frombuffer(r.rest(), dtype="<u2" if f16 else "<f4").astype(np.uint16 if f16 else np.float32)
        return st, qs, d
    if op == "load":
        st, h, reason, nv, ctx = r.i32(), r.u32(), r.str(), r.i32(), r.i32()
        if not h:
            return st, None, reason, 0, 0
        vocab[h] = nv
        return st, h, reason, nv, ctx
    if op == "forward":
        h, tokens, _ = args
        st = r.i32()
        logits = np.frombuffer(r.rest(), dtype="<f4").astype(np.float32)
        return st, logits.reshape(len(tokens), vocab.get(int(h), 0))
    if op in ("reset", "free", "tok_free"):
        return None
    if op in ("imatrix_start", "target_version"):
        return r.i32()
    if op == "imatrix_get":
        st, tokens, tokens_cls = r.i32(), r.u64(), r.u64()
        return st, np.frombuffer(r.rest(), dtype="<f8").astype(np.float64), tokens, tokens_cls
    if op == "tok_load":
        st, h, reason = r.i32(), r.u32(), r.str()
        return st, (h or None), reason
    if op == "tok_encode":
        st = r.i32()
        return st, np.frombuffer(r.rest(), dtype="<i4").astype(np.int32)
    if op == "tok_decode":
        st = r.i32()
        return st, r.rest()
    raise BackendError(f"unknown operation {op!r}")


# ---------------------------------------------------------------- the harness side
class QemuWorker(Worker):
    """worker.Worker's interface over ``qemu-aarch64 -cpu max mlrt-worker``. ``lib_path`` is
    ignored (the executable is found, and built, by worker_executable); ``isa`` is neon or
    neon-dotprod. The crash, timeout and stderr handling are worker.Worker's."""

    def __init__(self, lib_path: str | None = None, isa: str | None = "neon", timeout: float = 60.0):
        super().__init__(lib_path or "", isa, timeout)
        self._vocab: dict[int, int] = {}  # model handle -> vocab, to shape the logits

    def start(self) -> dict:
        """Start a fresh worker and return its info (worker.Worker.start's keys); with the cross
        compiler or qemu missing, no worker, and isa_error says why."""
        self.stop()
        why = missing_tools()
        if why:
            self.info = {"symbols": [], "version": "", "isa": "", "isa_error": why}
            return self.info
        cmd = command(worker_executable())
        self._spawn(cmd)
        self._vocab = {}
        try:
            st, version, isa, symbols = self._request(
                "start", "info", (self.isa or "",), max(self.timeout, STARTUP_TIMEOUT)
            )
        except BackendError as e:  # a crash or a timeout at start: the backend cannot be used
            self.stop()
            raise BackendError(f"the aarch64 worker did not start ({' '.join(cmd)}): {e}") from None
        isa_error = ""
        if st != 0:
            isa_error = f"ml_set_isa({self.isa!r}) returned {status_name(st)} under {QEMU} -cpu {QEMU_CPU}"
        self.info = {"symbols": symbols, "version": version, "isa": isa, "isa_error": isa_error}
        return self.info

    def call(self, desc: str, op: str, *args):
        """Run ``op(*args)`` in the worker (worker.py's operation names)."""
        if op not in OPS:
            raise BackendError(f"worker error during {desc}: unknown operation {op!r}")
        if not self.alive():
            self.start()
            if not self.alive():
                raise BackendError(f"worker cannot start during {desc}: {self.info.get('isa_error')}")
            self.replay(desc)
        return self._request(desc, op, args, self.timeout)

    def _request(self, desc: str, op: str, args: tuple, timeout: float):
        payload = _encode(op, args)
        if len(payload) > U32:
            raise InputError(f"{desc}: a request of {len(payload)} bytes is above the protocol's 4 GiB")
        self._new_call()
        try:
            write_all(self.proc.stdin.fileno(), HEAD.pack(OPS[op], len(payload)) + payload)
        except BrokenPipeError:
            raise self._died(desc) from None
        status, body = self._receive(desc, timeout)
        if status == WK_ERROR:
            raise BackendError(f"worker error during {desc}: {body.decode('utf-8', 'replace')}")
        if status != WK_OK:
            raise BackendError(f"worker error during {desc}: reply status {status}")
        r = _Buf(body)
        result = _decode(op, args, r, self._vocab)
        if r.at != len(body):
            raise BackendError(
                f"malformed reply from the aarch64 worker during {desc}: {len(body) - r.at} trailing bytes"
            )
        return result

    def _receive(self, desc: str, timeout: float):
        deadline = time.monotonic() + timeout
        try:
            status, n = HEAD.unpack(self._read(HEAD.size, deadline))
            return status, self._read(n, deadline)
        except Timeout:
            self.stop_hard()
            raise WorkerTimeout(f"worker timed out after {timeout:g} s during {desc}; killed") from None
        except EOF:
            raise self._died(desc) from None


__all__ = ["QemuWorker", "build_dir", "command", "executable", "missing_tools", "worker_executable"]
