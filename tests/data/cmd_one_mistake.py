"""A `cmd:` runtime for tests/test_fuzz.py: the reference backend with exactly one mistake, so that
`mlconf fuzz` must find that mistake and nothing else, through the line protocol.

    python cmd_one_mistake.py rule RULE   its loader accepts every file whose first failing rule
                                          (specs/mlb_errors.yaml) is RULE
    python cmd_one_mistake.py yarn        its forward ignores yarn's rope_attn_factor
    python cmd_one_mistake.py by_name     a runtime that games the suite: it knows the fixtures'
                                          file names and accepts every file it does not know
    python cmd_one_mistake.py misrule RULE OTHER
                                          its loader reports the rule behind each status (the
                                          reply's `rule`), but names OTHER where RULE refused

It speaks protocol version 1 (backends/cmd/protocol.py): hello, load, open_model, forward, reset,
close. A NumericError of the reference is answered with kind "nonfinite", a refused file with
"input".
"""

from __future__ import annotations

import json
import sys

import numpy as np

from mlconf.backends import InputError, NumericError
from mlconf.backends.cmd import pack
from mlconf.backends.reference import ReferenceBackend
from mlconf.backends.reference.forward import Forward
from mlconf.tools import mlb

MISTAKE = sys.argv[1:]
REF = ReferenceBackend()
SESSIONS: dict[int, Forward] = {}


def _known_names() -> set[str]:
    from mlconf import fixtures

    return {f.file.rsplit("/", 1)[-1] for f in fixtures.catalog()}


KNOWN = _known_names() if MISTAKE[:1] == ["by_name"] else set()


def load(req: dict) -> dict:
    if MISTAKE[0] == "by_name" and req["path"].rsplit("/", 1)[-1] not in KNOWN:
        return {"status": "ML_OK", "reason": "a file it has not seen"}
    res = REF.load(req["path"])
    if MISTAKE[0] == "rule" and res.rule == MISTAKE[1]:
        return {"status": "ML_OK", "reason": f"rule {res.rule} is not checked here"}
    if MISTAKE[0] == "misrule":
        return {
            "status": res.status,
            "reason": res.reason,
            "rule": MISTAKE[2] if res.rule == MISTAKE[1] else res.rule,
        }
    return {"status": res.status, "reason": res.reason}


def open_model(req: dict) -> dict:
    m = mlb.read(req["path"])  # MLBError: a refused file
    if MISTAKE[0] == "yarn" and m.header["rope_type"] == 3:
        m.header["rope_attn_factor"] = 1.0
    s = Forward(m, ctx=req.get("ctx"))
    handle = len(SESSIONS) + 1
    SESSIONS[handle] = s
    return {"handle": handle, "vocab": m.header["vocab"], "ctx": s.ctx}


def forward(req: dict) -> dict:
    logits = SESSIONS[req["handle"]].forward(np.array(req["tokens"], dtype=np.int64), req["pos"])
    return {"logits": pack(logits, "<f4"), "shape": list(logits.shape)}


OPS = {
    "hello": lambda req: {
        "name": "one-mistake",
        "version": " ".join(MISTAKE),
        "capabilities": ["load", "forward"],
    },
    "load": load,
    "open_model": open_model,
    "forward": forward,
    "reset": lambda req: SESSIONS[req["handle"]].reset() or {},
    "close": lambda req: SESSIONS.pop(req["handle"], None) and {} or {},
}


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        try:
            op = OPS.get(req["op"])
            out = (
                {"ok": True, **op(req)}
                if op
                else {"ok": False, "error": {"kind": "unsupported", "message": req["op"]}}
            )
        except NumericError as e:
            out = {"ok": False, "error": {"kind": "nonfinite", "message": str(e)}}
        except (InputError, mlb.MLBError, ValueError) as e:
            out = {"ok": False, "error": {"kind": "input", "message": str(e)}}
        print(json.dumps({"id": req["id"], **out}), flush=True)


if __name__ == "__main__":
    main()
