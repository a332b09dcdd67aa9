"""run(jobs=N): the cases in N forked children, each on fresh instances of the backends (a
worker-backed backend gets its own worker process), their results sent back through a pipe as
length-prefixed pickles; the results, and their order, are those of a serial run."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from mlconf import runner
from mlconf.backends import Backend
from mlconf.cases import Case


def _fresh(b: Backend) -> Backend:
    """In a forked child: a new instance of backend ``b`` (its own worker process, if it has one),
    made by name with the per-call timeout of ``b``; ``b`` itself (the forked copy) when its name
    is not registered, which is right for an in-process backend such as a test's wrapper class."""
    from mlconf.backends import get

    try:
        fresh = get(getattr(b, "spec", b.name))
    except Exception:
        return b
    if type(fresh) is not type(b):
        _close(fresh)
        return b
    if getattr(b, "timeout", None) is not None and hasattr(fresh, "timeout"):
        fresh.timeout = b.timeout
    if getattr(b, "target_version", None) is not None:
        fresh.set_target_version(b.target_version)
    return fresh


def _close(b: Backend) -> None:
    close = getattr(b, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            pass


_LEN = struct.Struct("<Q")


def _child(fd: int, shard: list[tuple[int, Case]], backends: list[Backend], work: runner.Workdir) -> None:
    """A forked child: run its shard of cases on fresh backends, send each (backend index, case
    index, Result) through ``fd`` as a length-prefixed pickle, then (None, None, None)."""
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(backends))) as pool:  # their workers start at once
        fresh = list(pool.map(_fresh, backends))
    own = [fb for fb, b in zip(fresh, backends, strict=True) if fb is not b]
    try:
        with os.fdopen(fd, "wb") as out:
            for bi, b in enumerate(backends):
                fb = fresh[bi]
                for ci, c in shard:
                    if c.params.get("expected_from") == b.name:
                        continue
                    res = runner.run_case(c, fb, work)
                    res.backend = b.name
                    blob = pickle.dumps((bi, ci, res), protocol=pickle.HIGHEST_PROTOCOL)
                    out.write(_LEN.pack(len(blob)) + blob)
                    out.flush()
            blob = pickle.dumps((None, None, None))
            out.write(_LEN.pack(len(blob)) + blob)
    finally:
        for fb in own:
            _close(fb)


def run_forked(
    cases: list[Case],
    backends: list[Backend],
    work: runner.Workdir,
    jobs: int,
    on_result: Callable[[int, int, runner.Result], bool],
) -> None:
    """run(jobs=N): N forked children, each with every backend (fresh instances, see _fresh) and
    every N-th case. ``on_result`` returns True to stop the run (the children are then ended)."""
    import pickle
    import selectors
    import signal

    runner.prepare(cases, work)  # fixtures and tokenizers once, before the fork
    sel = selectors.DefaultSelector()
    kids: dict[int, int] = {}  # read fd -> pid
    bufs: dict[int, bytearray] = {}
    finished: set[int] = set()
    for j in range(jobs):
        shard = list(enumerate(cases))[j::jobs]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                os.close(r)
                _child(w, shard, backends, work)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        kids[r] = pid
        bufs[r] = bytearray()
        sel.register(r, selectors.EVENT_READ)
    stopped = False
    try:
        while sel.get_map() and not stopped:
            for key, _ in sel.select():
                fd = key.fd
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                buf += chunk
                while len(buf) >= _LEN.size:
                    n = _LEN.unpack_from(buf)[0]
                    if len(buf) < _LEN.size + n:
                        break
                    bi, ci, res = pickle.loads(bytes(buf[_LEN.size : _LEN.size + n]))
                    del buf[: _LEN.size + n]
                    if bi is None:
                        finished.add(fd)
                    elif not stopped and on_result(bi, ci, res):
                        stopped = True
    finally:
        for fd, pid in kids.items():
            if stopped or fd not in finished:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)
            if sel.get_map() and fd in sel.get_map():
                sel.unregister(fd)
            os.close(fd)
        sel.close()
    if not stopped and len(finished) != len(kids):
        raise RuntimeError("a runner process ended before its cases were done (its traceback is above)")
