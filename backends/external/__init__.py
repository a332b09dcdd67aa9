"""``lib:PATH``: any shared library exporting the C ABI of backends/native/include/mlrt.h.

A runtime in C, C++, Rust or Zig is gated by implementing those functions; the functions it omits
show as unsupported capabilities. It runs exactly like the native backend (one implementation,
mlconf.backends.native.LibraryBackend, in a worker process): only the way the library is found
differs. PATH is relative to the current directory.

    mlconf run -b lib:./build/libmyruntime.so
"""

from __future__ import annotations

from pathlib import Path

from ..base import BackendError
from ..native import LibraryBackend


def external_backend(name: str) -> LibraryBackend:
    path = name.split(":", 1)[1] if ":" in name else ""
    if not path:
        raise BackendError(f"{name!r}: give the library's path, e.g. lib:./build/libmyruntime.so")
    p = Path(path).expanduser()
    p = p if p.is_absolute() else Path.cwd() / p
    if not p.is_file():
        raise BackendError(f"{name}: {p} is not a file (a shared library exporting mlrt.h is expected)")
    return LibraryBackend(name, p)


__all__ = ["external_backend"]
