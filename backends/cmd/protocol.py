"""The ``cmd:`` backend's line-based JSON protocol, and its arrays as base64 (one place).

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
                                                              load_tokenizer, encode, i2s, embed, load_gguf)
  load           path                                         status ("ML_OK", "ML_E_IO", "ML_E_FORMAT",
                                                              "ML_E_SHAPE"), reason (string), and
                                                              optionally rule: the id of the rule of
                                                              specs/mlb_errors.yaml that refused the
                                                              file ("" when accepted); without it the
                                                              case is judged by its status only
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
  load_tokenizer path, model_vocab: int or null               status, reason, optionally rule
                                                              (specs/mlt.yaml), as load
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
  load_gguf      path                                         status, reason, optionally rule
                                                              (specs/gguf.yaml), as load

hello is the first request of every process; the capabilities it lists decide which cases run
(a case needing another capability is "unsupported" without a request). A status of "load" /
"load_tokenizer" / "load_gguf" that is not one of the four is reported as an error of the case.

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
from typing import Any

import numpy as np

from ..base import BackendError

PROTOCOL = 1
QUOTE = 300  # characters of a malformed reply line quoted


def pack(a: Any, dtype: str) -> str:
    """An array (or bytes) as base64 of its little-endian bytes in ``dtype`` (e.g. "<f4", "u1")."""
    if isinstance(a, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(a)).decode("ascii")
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype)).tobytes()).decode("ascii")


def unpack(
    reply: dict, field: str, dtype: str, shape: tuple[int, ...] | None = None, where: str = ""
) -> np.ndarray:
    """Field ``field`` of a reply: base64 of little-endian ``dtype`` -> an array of native byte
    order (``shape`` checked when given). BackendError naming the field for anything else."""
    dt = np.dtype(dtype)
    raw = b64(reply, field, where)
    if len(raw) % dt.itemsize:
        raise BackendError(
            f"{where}: reply field {field!r} has {len(raw)} bytes, not a multiple of "
            f"{dt.itemsize} ({dt.name})"
        )
    a = np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="))
    if shape is not None:
        n = int(np.prod(shape, dtype=np.int64))
        if a.size != n:
            raise BackendError(
                f"{where}: reply field {field!r} has {a.size} {dt.name} values "
                f"({len(raw)} bytes), expected {n} for shape {list(shape)}"
            )
        a = a.reshape(shape)
    return a


def b64(reply: dict, field: str, where: str) -> bytes:
    v = reply.get(field)
    if not isinstance(v, str):
        raise BackendError(
            f"{where}: reply field {field!r} must be a base64 string, got {short(json.dumps(v))}"
        )
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BackendError(f"{where}: reply field {field!r} is not base64 ({e}): {short(v)}") from None


def reply_field(reply: dict, field: str, kind: type | tuple[type, ...], where: str):
    v = reply.get(field)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BackendError(f"{where}: reply field {field!r} must be {names}, got {short(json.dumps(v))}")
    return v


def short(text: str, n: int = QUOTE) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"
