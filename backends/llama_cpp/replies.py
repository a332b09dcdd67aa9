"""The replies of the llama.cpp program: its error kinds (mlconf.backends.cmd's protocol) and the
loop that answers one request per line."""

from __future__ import annotations

import json


class Refused(Exception):
    """error kind "input": the request's input is refused"""


class NotHere(Exception):
    """error kind "unsupported": llama.cpp cannot express the request"""


class NonFinite(Exception):
    """error kind "nonfinite": a NaN or an infinity came out"""


def serve(program, lines, out) -> None:
    """Answer each request line with one reply line: the op's results, or its error kind."""
    for line in lines:
        req = json.loads(line)
        rid = req.get("id")
        try:
            op = getattr(program, str(req.get("op")), None)
            if op is None or str(req.get("op")).startswith("_"):
                raise NotHere(f"op {req.get('op')!r} is not served by the llama.cpp backend")
            reply = {"id": rid, "ok": True, **op(req)}
        except Refused as e:
            reply = {"id": rid, "ok": False, "error": {"kind": "input", "message": str(e)}}
        except NotHere as e:
            reply = {"id": rid, "ok": False, "error": {"kind": "unsupported", "message": str(e)}}
        except NonFinite as e:
            reply = {"id": rid, "ok": False, "error": {"kind": "nonfinite", "message": str(e)}}
        except Exception as e:  # llama.cpp or this program failed: the case is an error, the program goes on
            reply = {
                "id": rid,
                "ok": False,
                "error": {"kind": "internal", "message": f"{type(e).__name__}: {e}"},
            }
        out.write(json.dumps(reply) + "\n")
        out.flush()
