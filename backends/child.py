"""A child process the harness talks to over pipes: the native worker (native/worker.py, and under
qemu-user native/qemu.py) and a ``cmd:`` program (cmd/program.py) share these pieces.

Its stderr goes to a temporary file (quoted when it dies); reads carry a deadline (Timeout when it
passes, EOF when the child closed its stdout); reap() ends it: end of input first, then SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import tempfile
import time
import weakref

from .base import BackendError

STDERR_TAIL = 1500  # characters of a child's stderr quoted in a crash message
STARTUP_TIMEOUT = 30.0  # seconds for a child to start and answer (at least; the call timeout if longer)
EXIT_WAIT = 5.0  # seconds a child that closed its stdout has to exit before it is killed
DEFAULT_TIMEOUT = 60.0  # seconds per call; MLCONF_WORKER_TIMEOUT overrides it
MAX_TIMEOUT = 1e6  # ~11 days: beyond what the clocks and select() take
TIMEOUT_ENV = "MLCONF_WORKER_TIMEOUT"


def default_timeout() -> float:
    """Seconds a call may take before its child is killed: MLCONF_WORKER_TIMEOUT, or 60."""
    v = os.environ.get(TIMEOUT_ENV)
    if not v:
        return DEFAULT_TIMEOUT
    try:
        t = float(v)
    except ValueError:
        raise BackendError(f"{TIMEOUT_ENV}={v!r} is not a number of seconds") from None
    if not 0 < t <= MAX_TIMEOUT:
        raise BackendError(
            f"{TIMEOUT_ENV}={v!r} must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}"
        )
    return t


class Timeout(Exception):
    """No bytes before the deadline."""


class EOF(Exception):
    """The child closed its stdout."""


def stderr_file():
    """A temporary file for a child's stderr, opened O_APPEND: truncating it between calls (to
    quote only what the last call wrote) keeps the child's writes at offset 0."""
    f = tempfile.TemporaryFile()
    fcntl.fcntl(f.fileno(), fcntl.F_SETFL, fcntl.fcntl(f.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    return f


def stderr_tail(f) -> str:
    """The last STDERR_TAIL characters a child wrote to its stderr file ``f`` ("" for None)."""
    if f is None:
        return ""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - 4 * STDERR_TAIL))
    text = f.read().decode("utf-8", "replace").strip()
    return ("..." + text[-STDERR_TAIL:]) if len(text) > STDERR_TAIL else text


def signal_name(returncode: int) -> str:
    """The signal of a negative Popen return code, e.g. SIGSEGV."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def read_some(fd: int, deadline: float, limit: int = 1 << 20) -> bytes:
    """Up to ``limit`` bytes from ``fd`` once it is readable; Timeout at ``deadline``
    (time.monotonic()), EOF when the writer closed its end."""
    poll = select.poll()
    poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    left = deadline - time.monotonic()
    if left <= 0 or not poll.poll(left * 1000):
        raise Timeout
    b = os.read(fd, limit)
    if not b:
        raise EOF
    return b


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def kill(proc: subprocess.Popen | None) -> None:
    """SIGKILL a child that is still running, and wait for it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def wait_exit(proc: subprocess.Popen) -> int | None:
    """The exit status of a child that closed its stdout, or None when it had not exited EXIT_WAIT
    seconds later (then it is killed)."""
    try:
        return proc.wait(timeout=EXIT_WAIT)
    except subprocess.TimeoutExpired:
        kill(proc)
        return None


def reap(proc: subprocess.Popen, *files) -> None:
    """Stop a child: end of its input first (it should exit), then SIGKILL; close our ends of its
    pipes and ``files`` (its stderr file)."""
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            kill(proc)
    for f in (proc.stdin, proc.stdout, *files):
        try:
            if f is not None:
                f.close()
        except OSError:  # BrokenPipeError from a flush: the child is gone anyway
            pass


class Handle:
    """An object living in a child (a model, a tokenizer, an embedder it opened): valid while the
    child that made it lives. The backend gives ``epoch`` (children started so far) and
    ``child_alive()``; ``ENDED`` says what may have ended it."""

    ENDED = "the worker that held it has ended (after a crash or a timeout)"

    def __init__(self, backend, handle, path: str):
        self.backend, self.handle, self.path = backend, handle, path
        self.epoch = backend.epoch
        self.closed = False

    def _current(self) -> bool:
        return self.epoch == self.backend.epoch and self.backend.child_alive()

    def _live(self) -> None:
        if self.closed:
            raise BackendError(f"{self.path}: used after close()")
        if not self._current():
            raise BackendError(f"{self.path}: {self.ENDED}; open it again")

    def _release(self, free) -> None:
        """Close once: ``free()`` asks the child to free it, unless the child has ended."""
        if self.closed:
            return
        self.closed = True
        if self._current():
            free()


class Child:
    """A child process the harness starts on demand and again after it died (the native worker,
    a ``cmd:`` program): its process, its stderr file and how it is stopped. ``epoch`` counts the
    processes started; an object a child opened is valid for one epoch (Handle)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.epoch = 0
        self.info: dict = {}
        self._err = None
        self._finalizer = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start a fresh process (the old one stopped): pipes for stdin and stdout, stderr to its
        file; OSError when it cannot be started."""
        self.stop()
        self._err = stderr_file()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._err,
                bufsize=0,
                close_fds=True,
                env=env,
            )
        except OSError:
            self.stop()
            raise
        self.epoch += 1
        self._finalizer = weakref.finalize(self, reap, self.proc, self._err)

    def stop(self) -> None:
        """End the process (reap), close its pipes and stderr file."""
        if self._finalizer is not None:
            self._finalizer()  # reap, once
            self._finalizer = None
        elif self._err is not None:  # _spawn failed before the process ran
            self._err.close()
        self.proc = None
        self._err = None

    def stop_hard(self) -> None:
        kill(self.proc)
        self.stop()

    def _new_call(self) -> None:
        """Forget the stderr of earlier calls: a crash quotes what this call wrote."""
        os.ftruncate(self._err.fileno(), 0)

    def _stderr_tail(self) -> str:
        return stderr_tail(self._err)
