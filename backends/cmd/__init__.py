"""``cmd:PROGRAM [ARGS...]``: any executable that speaks mlconf's line-based JSON protocol.

A runtime in any language (Rust, C++, Go, Java, a Python script) is gated without C bindings: mlconf
starts the program once per backend and talks to it on its stdin and stdout.

    mlconf run -b "cmd:python examples/cmd_runtime/q8_runtime.py" --area quant
    mlconf run -b "cmd:./target/release/myruntime --mlconf"

protocol.py: the protocol (its document, and arrays as base64); program.py: the running program
(start, hello, one request with a deadline, crash and timeout handling); backend.py: the Backend
and its sessions.
"""

from .backend import CmdBackend, cmd_backend, split_name
from .protocol import PROTOCOL, pack, unpack

__all__ = ["PROTOCOL", "CmdBackend", "cmd_backend", "pack", "split_name", "unpack"]
