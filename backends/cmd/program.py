"""One running ``cmd:`` program: started, greeted (hello), asked one request at a time with a
deadline, and stopped; restarted by ``call`` after it died, hung or went out of step
(backends/cmd/protocol.py says what each case raises)."""

from __future__ import annotations

import json
import shlex
import time

from .. import child
from ..base import BackendError, WorkerCrash, WorkerTimeout
from ..child import (
    EOF,
    STARTUP_TIMEOUT,
    Child,
    Timeout,
    read_some,
    signal_name,
    wait_exit,
    write_all,
)
from .protocol import PROTOCOL, short


class Program(Child):
    """One running instance of the program, restarted by ``call`` after it died or was killed."""

    def __init__(self, name: str, argv: list[str], timeout: float):
        super().__init__(timeout)
        self.name, self.argv = name, argv
        self._buf = bytearray()
        self._next_id = 0

    def start(self) -> dict:
        """Start the program and say hello; the reply (name, version, capabilities)."""
        try:
            self._spawn(self.argv)
        except OSError as e:
            raise BackendError(f"{self.name}: cannot start {shlex.join(self.argv)}: {e}") from None
        self._buf = bytearray()
        self._next_id = 0
        reply = self._exchange("hello", {"protocol": PROTOCOL}, "hello", max(self.timeout, STARTUP_TIMEOUT))
        if not reply.get("ok"):
            msg = self._error_text(reply, "hello")
            self.stop()
            raise BackendError(f"{self.name}: the program refused hello: {msg}")
        self.info = reply
        return reply

    def call(self, desc: str, op: str, args: dict) -> dict:
        """One request; the reply object (ok true or false). Raises WorkerCrash / WorkerTimeout /
        BackendError as the module doc says."""
        if not self.alive():
            self.start()
        self._new_call()
        return self._exchange(op, args, desc, self.timeout)

    # -- internals
    def _exchange(self, op: str, args: dict, desc: str, timeout: float) -> dict:
        rid = self._next_id
        self._next_id += 1
        line = json.dumps({"id": rid, "op": op, **args}, ensure_ascii=True, allow_nan=False) + "\n"
        try:
            write_all(self.proc.stdin.fileno(), line.encode("ascii"))
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(desc) from None
        deadline = time.monotonic() + timeout
        try:
            raw = self._readline(deadline)
        except Timeout:
            self.stop_hard()
            raise WorkerTimeout(
                f"{self.name}: no reply within {timeout:g} s during {desc}; the program was killed"
            ) from None
        except EOF:
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
            why = 'no boolean "ok" field'
        if why:
            self.stop_hard()  # the stream is out of step: start afresh on the next call
            raise BackendError(f"{self.name}: malformed reply during {desc}: {why}: {short(text)!r}")
        return reply

    def _readline(self, deadline: float) -> bytes:
        while (i := self._buf.find(b"\n")) < 0:
            self._buf += read_some(self.proc.stdout.fileno(), deadline)
        line = bytes(self._buf[: i + 1])
        del self._buf[: i + 1]
        return line

    def _died(self, desc: str) -> WorkerCrash:
        rc = wait_exit(self.proc)
        if rc is None:
            msg = (
                f"{self.name}: the program closed its stdout during {desc} and had not exited "
                f"{child.EXIT_WAIT:g} s later; killed"
            )
        elif rc < 0:
            msg = f"{self.name}: the program was killed by {signal_name(rc)} during {desc}"
        else:
            msg = f"{self.name}: the program exited with status {rc} during {desc}"
        tail = self._stderr_tail()
        self.stop()
        return WorkerCrash(msg + (f"; its stderr: {tail}" if tail else "; its stderr was empty"))

    @staticmethod
    def _error_text(reply: dict, desc: str) -> str:
        err = reply.get("error")
        if isinstance(err, dict):
            return f"{err.get('kind', '?')}: {err.get('message', '')}"
        return f"no error object in {short(json.dumps(reply))}"
