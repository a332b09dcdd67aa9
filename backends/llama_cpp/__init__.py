"""The ``llama.cpp`` backend (issue 19): llama.cpp gated by the suite, as a runtime nobody here wrote.

Names:
  llama.cpp       llama.cpp as llama-cpp-python (the `bench` extra) built it
  llama.cpp:DIR   a user's own build: DIR holds libllama.so and libggml-base.so
It is not built in (``mlconf run`` uses it only when named with -b). The backend is the cmd
protocol's (mlconf.backends.cmd.CmdBackend) around the program of .program, so it runs in its own
process with the same isolation, timeouts and error mapping as ``cmd:`` programs; what llama.cpp
can be asked, and how, is written there. gguf_inputs.py writes the GGUF files it is handed (a
tokenizer's vocabulary, a BitNet GGUF stock llama.cpp loads); replies.py holds the error kinds and
the reply loop.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ..base import BackendError
from ..cmd import CmdBackend

PROGRAM = "mlconf.backends.llama_cpp.program"


def llama_cpp_backend(name: str) -> CmdBackend:
    """The backend ``llama.cpp`` or ``llama.cpp:DIR``."""
    argv = [sys.executable, "-m", PROGRAM]
    if ":" in name:
        lib = Path(name.split(":", 1)[1]).expanduser()
        lib = lib if lib.is_absolute() else Path.cwd() / lib
        missing = [f for f in ("libllama.so", "libggml-base.so") if not (lib / f).is_file()]
        if missing:
            raise BackendError(
                f"{name}: {lib} has no {' and no '.join(missing)} (a llama.cpp build's "
                "library folder is expected)"
            )
        argv += ["--lib", str(lib)]
    elif importlib.util.find_spec("llama_cpp") is None:
        raise BackendError(
            f'{name}: llama-cpp-python is not installed (pip install ".[bench]" builds '
            "it with llama.cpp; or name a build's library folder: llama.cpp:DIR)"
        )
    return CmdBackend(name, argv)


__all__ = ["PROGRAM", "llama_cpp_backend"]
