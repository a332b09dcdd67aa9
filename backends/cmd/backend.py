"""``cmd:PROGRAM [ARGS...]`` as a Backend: the Backend protocol's calls as requests of the line
protocol (backends/cmd/protocol.py) to one Program (backends/cmd/program.py), and the sessions
(models, tokenizers, embedders) that live in it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import threading
from pathlib import Path

import numpy as np

from ..base import (
    CAPABILITIES,
    READINGS,
    BackendError,
    InputError,
    LoadResult,
    NumericError,
    Unsupported,
    as_rows,
    token_array,
)
from ..child import Handle, default_timeout
from .program import Program
from .protocol import PROTOCOL, b64, pack, reply_field, short, unpack

QUANT_OPS = ("quantize_q8_0", "quantize_q4_0", "i2s_quantize", "i2s_quantize_act", "i2s_matmul")
POOLINGS = (None, "mean", "cls", "last")


def split_name(name: str) -> list[str]:
    """``cmd:PROGRAM ARGS`` -> argv, PROGRAM resolved (a path relative to the current directory,
    or a bare name on PATH)."""
    rest = name.split(":", 1)[1] if ":" in name else ""
    try:
        argv = shlex.split(rest)
    except ValueError as e:
        raise BackendError(f"{name!r}: cannot split the command line: {e}") from None
    if not argv:
        raise BackendError(f'{name!r}: give the program, e.g. "cmd:./myruntime --mlconf"')
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
            raise BackendError(
                f'{where}: "capabilities" must be a list of strings, got {short(json.dumps(caps))}'
            )
        self.unknown_capabilities = sorted(set(caps) - set(CAPABILITIES))
        self.capabilities: frozenset[str] = frozenset(c for c in caps if c in CAPABILITIES)
        self.program_name = str(info.get("name", ""))
        self.version = str(info.get("version", ""))
        declared = ", ".join(sorted(self.capabilities)) or "none"
        extra = (
            f"; unknown names ignored: {', '.join(self.unknown_capabilities)}"
            if self.unknown_capabilities
            else ""
        )
        self.unsupported = {
            c: f"{shlex.join(self.argv)} does not declare {c} in its hello reply "
            f"(declared: {declared}{extra})"
            for c in CAPABILITIES
            if c not in self.capabilities
        }
        self.description = (
            ", ".join(
                s
                for s in (self.program_name, self.version, f"protocol {PROTOCOL}", shlex.join(self.argv))
                if s
            )
            + extra
        )

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

    def child_alive(self) -> bool:
        return self._program.alive()

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
            if self._program.epoch != epoch:  # restarted: its hello may declare other things
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
        raise BackendError(f"{self.name}: malformed error reply during {desc}: {short(json.dumps(reply))!r}")

    # -- the Backend protocol
    def load(self, path: str) -> LoadResult:
        self._need("load")
        return self._status(self.request(f"load({str(path)!r})", "load", path=str(path)), "load")

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult:
        self._need("load_tokenizer")
        r = self.request(
            f"load_tokenizer({str(path)!r}, model_vocab={model_vocab})",
            "load_tokenizer",
            path=str(path),
            model_vocab=None if model_vocab is None else int(model_vocab),
        )
        return self._status(r, "load_tokenizer")

    def load_gguf(self, path: str) -> LoadResult:
        self._need("load_gguf")
        r = self.request(f"load_gguf({str(path)!r})", "load_gguf", path=str(path))
        return self._status(r, "load_gguf")

    def _status(self, r: dict, where: str) -> LoadResult:
        st = reply_field(r, "status", str, f"{self.name}: {where}")
        reason = r.get("reason") or ""
        rule = r.get("rule")  # optional: None means the program does not say
        # a status outside STATUSES: the runner reports it
        return LoadResult(st, str(reason), None if rule is None else str(rule))

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q8_0")
        x = _quant_input(x)
        desc = f"quantize_q8_0(float32{list(x.shape)}, f16={bool(f16)})"
        r = self.request(desc, "quantize_q8_0", x=pack(x, "<f4"), shape=list(x.shape), f16=bool(f16))
        return self._quant_reply(r, x, f16, "i1", x.shape, desc)

    def quantize_q4_0(
        self, x: np.ndarray, rule: str, f16: bool, importance: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        self._need("quantize_q4_0")
        x = _quant_input(x)
        imp = None
        if importance is not None:
            imp = np.asarray(importance, dtype=np.float32).reshape(-1)
            if imp.size != x.shape[-1]:
                raise ValueError(f"importance has {imp.size} values, the rows have {x.shape[-1]}")
            imp = pack(imp, "<f4")
        desc = f"quantize_q4_0(float32{list(x.shape)}, rule={rule}, f16={bool(f16)})"
        r = self.request(
            desc,
            "quantize_q4_0",
            x=pack(x, "<f4"),
            shape=list(x.shape),
            f16=bool(f16),
            rule=str(rule),
            importance=imp,
        )
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
        return ModelSession(
            self,
            _handle(r, where),
            reply_field(r, "vocab", int, where),
            reply_field(r, "ctx", int, where),
            str(path),
        )

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
        w2 = as_rows(w, "weights").astype(np.float32)
        desc = f"i2s_quantize({w.dtype}{list(w.shape)})"
        r = self.request(desc, "i2s_quantize", w=pack(w2, "<f4"), shape=list(w2.shape))
        return b64(r, "payload", f"{self.name}: {desc}")

    def i2s_quantize_act(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._need("i2s")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"activations must be float32, got {x.dtype}")
        x2 = as_rows(x, "activations")
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
        x2 = as_rows(x, "activations")
        desc = f"i2s_matmul(payload[{len(payload)}], {(rows, cols)}, float32{list(x.shape)})"
        r = self.request(
            desc,
            "i2s_matmul",
            payload=pack(bytes(payload), "u1"),
            shape=[rows, cols],
            x=pack(x2, "<f4"),
            x_shape=list(x2.shape),
        )
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
        return EmbedderSession(
            self,
            _handle(r, where),
            reply_field(r, "dim", int, where),
            reply_field(r, "vocab", int, where),
            str(path),
        )


def _quant_input(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"input must be float32 (the protocol sends float32), got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % 32:
        raise ValueError(f"shape {x.shape}: the last dimension must be a multiple of 32")
    return x


def _handle(r: dict, where: str) -> int | str:
    return reply_field(r, "handle", (int, str), where)


def _tokens(tokens) -> list[int]:
    return [int(v) for v in token_array(tokens)]


class _Session(Handle):
    ENDED = "the program that held it has ended (after a crash, a timeout or a malformed reply)"

    def close(self) -> None:
        self._release(lambda: self.backend.request(f"close({self.path!r})", "close", handle=self.handle))


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
            raise BackendError(
                f"{where}: reply shape {short(json.dumps(shape))}, expected [{len(t)}, {self.vocab}]"
            )
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
            raise BackendError(
                f"{self.backend.name}: {desc}: reply field 'ids' must be a list of integers, "
                f"got {short(json.dumps(ids))}"
            )
        return ids

    def decode(self, ids: list[int]) -> bytes:
        self._live()
        a = [int(i) for i in np.asarray(ids).reshape(-1)]
        desc = f"decode({self.path!r}, ids[{len(a)}])"
        r = self.backend.request(desc, "decode", handle=self.handle, ids=a)
        return b64(r, "bytes", f"{self.backend.name}: {desc}")


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
        r = self.backend.request(
            desc, "embed", handle=self.handle, tokens=t, pooling=pooling, normalize=bool(normalize)
        )
        return unpack(r, "vector", "<f4", (self.dim,), f"{self.backend.name}: {desc}")


def cmd_backend(name: str) -> CmdBackend:
    return CmdBackend(name)
