#!/usr/bin/env python3
"""A tiny runtime for mlconf's ``cmd:`` backend: the Q8_0 quantizer, in plain Python + NumPy.

It imports nothing from mlconf: it is an independent implementation written from the spec
(specs/quant.yaml, q8_0 rule and f16_scales; decisions q8_0.f16_limit, q8_0.f16_zero_scale,
quant.nonfinite) and speaks the line-based JSON protocol of the README ("Plug-in backends"): one
request per line on stdin, one reply per line on stdout.

    mlconf run -b "cmd:python examples/cmd_runtime/q8_runtime.py" --area quant
    mlconf run -b "cmd:python examples/cmd_runtime/q8_runtime.py --wrong" --area quant

--wrong: a plausible bug, rounding with round-half-to-even (np.rint, what a vectorised port often
writes) instead of the spec's trunc(x * id + copysign(0.5, x)); the suite catches it on the ties.
"""

from __future__ import annotations

import base64
import json
import sys

import numpy as np

BLOCK = 32
F16_MAX = np.float32(65504.0)


class InputRefused(Exception):
    """An input the spec refuses: error kind "input"."""


def quantize_q8_0(x: np.ndarray, f16: bool, wrong: bool) -> tuple[np.ndarray, np.ndarray]:
    """specs/quant.yaml q8_0, in float32 one operation at a time (NumPy does not fuse)."""
    if x.size % BLOCK:
        raise InputRefused(f"{x.size} values is not a multiple of {BLOCK}")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise InputRefused(f"non-finite value {x[bad[0]]} at index {int(bad[0])}")
    b = x.reshape(-1, BLOCK)
    amax = np.abs(b).max(axis=1)  # exact
    live = amax >= np.float32(1e-30)  # amax < 1e-30: d = 0, q = 0
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = np.where(live, amax / np.float32(127), np.float32(0)).astype(np.float32)
        if f16:
            over = np.flatnonzero(d > F16_MAX)
            if over.size:
                i = int(over[0])
                raise InputRefused(f"block {i}: scale {float(d[i])!r} is above 65504 (not an f16)")
            d16 = d.astype(np.float16)  # nearest, ties to even
            live &= d16 != 0  # decision q8_0.f16_zero_scale
            d16 = np.where(live, d16, np.float16(0))
            inv = np.float32(1) / d16.astype(np.float32)
        else:
            inv = np.float32(127) / amax
        inv = np.where(live, inv, np.float32(0)).astype(np.float32)
        v = b * inv[:, None]  # first rounding
        if wrong:
            q = np.rint(v)  # the bug: ties to even
        else:
            v = v + np.copysign(np.float32(0.5), b)  # second rounding
            q = np.trunc(v)
    q = np.clip(q, -127, 127)
    q = np.where(live[:, None], q, 0).astype(np.int8)
    if f16:
        return q.reshape(-1), d16.astype("<f2").view("<u2")
    return q.reshape(-1), np.where(live, d, np.float32(0)).astype("<f4")  # +0.0, never -0.0


def handle(req: dict, wrong: bool) -> dict:
    op = req.get("op")
    if op == "hello":
        return {
            "name": "q8_runtime (mlconf example)" + (" --wrong" if wrong else ""),
            "version": "1.0",
            "capabilities": ["quantize_q8_0"],
        }
    if op == "quantize_q8_0":
        x = np.frombuffer(base64.b64decode(req["x"]), dtype="<f4").astype(np.float32)
        shape = req["shape"]
        if int(np.prod(shape)) != x.size:
            raise InputRefused(f"shape {shape} does not hold {x.size} values")
        q, d = quantize_q8_0(x, bool(req["f16"]), wrong)
        return {"q": base64.b64encode(q.tobytes()).decode(), "d": base64.b64encode(d.tobytes()).decode()}
    raise NotImplementedError(f"op {op!r} is not implemented by this runtime")


def main() -> int:
    wrong = "--wrong" in sys.argv[1:]
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = {"id": req["id"], "ok": True, **handle(req, wrong)}
        except InputRefused as e:
            reply = {"id": req["id"], "ok": False, "error": {"kind": "input", "message": str(e)}}
        except NotImplementedError as e:
            reply = {"id": req["id"], "ok": False, "error": {"kind": "unsupported", "message": str(e)}}
        except Exception as e:  # a bug here: tell the harness, keep serving
            reply = {
                "id": req["id"],
                "ok": False,
                "error": {"kind": "internal", "message": f"{type(e).__name__}: {e}"},
            }
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
