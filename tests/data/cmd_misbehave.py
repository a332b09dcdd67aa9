"""A runtime for the cmd: backend tests (tests/test_plugins.py) that misbehaves on request.

It declares quantize_q8_0 and forward. quantize_q8_0 answers zeros (q 0, d 0), except when the first
input value is
  1: writes "about to die" to stderr and exits with status 3
  2: kills itself with SIGSEGV
  3: sleeps for a minute (a hang)
  4: replies with a line that is not JSON
  5: replies with the wrong id
  6: closes stdout and lingers
Every other op (open_model, ...) is unknown to it: it answers with error kind "unsupported".
"""

import base64
import json
import os
import signal
import sys
import time


def main() -> int:
    for line in sys.stdin:
        req = json.loads(line)
        rid, op = req["id"], req["op"]
        if op == "hello":
            reply = {
                "id": rid,
                "ok": True,
                "name": "misbehave",
                "version": "0",
                "capabilities": ["quantize_q8_0", "forward", "no_such_capability"],
            }
        elif op == "quantize_q8_0":
            raw = base64.b64decode(req["x"])
            n = len(raw) // 4
            first = int.from_bytes(raw[:4], "little")
            mode = {
                0x3F800000: 1,
                0x40000000: 2,
                0x40400000: 3,
                0x40800000: 4,
                0x40A00000: 5,
                0x40C00000: 6,
            }.get(first, 0)
            if mode == 1:
                sys.stderr.write("about to die\n")
                sys.stderr.flush()
                sys.exit(3)
            if mode == 2:
                os.kill(os.getpid(), signal.SIGSEGV)
            if mode == 3:
                time.sleep(60)
            if mode == 4:
                sys.stdout.write("this is not json {\n")
                sys.stdout.flush()
                continue
            if mode == 5:
                rid += 7
            if mode == 6:
                os.close(1)
                time.sleep(60)
            reply = {
                "id": rid,
                "ok": True,
                "q": base64.b64encode(bytes(n)).decode(),
                "d": base64.b64encode(bytes(n // 32 * (2 if req["f16"] else 4))).decode(),
            }
        else:
            reply = {"id": rid, "ok": False, "error": {"kind": "unsupported", "message": f"unknown op {op}"}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
