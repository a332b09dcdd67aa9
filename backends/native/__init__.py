"""The native backend: the C runtime of src/ (libmlrt.so, built by `pip install`), and through the
same class any shared library exporting include/mlrt.h (``lib:PATH``, mlconf.backends.external).

Every call goes to a worker process that owns the dlopen'ed library (worker.py), so a crash is a
WorkerCrash naming the signal and a hang a WorkerTimeout, and the harness goes on. Capabilities
come from the symbols the library exports (abi.CAPABILITY_SYMBOLS). Names:
  native          libmlrt.so with the best ISA of this machine (ml_isa() says which)
  native:ISA      ISA forced with ml_set_isa (scalar, avx2, neon, neon-dotprod); an ISA this machine
                  cannot run leaves the backend with no capability, so every case is unsupported, with why
                  (neon and neon-dotprod on a host that is not aarch64: the aarch64 build under
                  qemu-user, qemu.py)
  lib:PATH        any library (mlconf.backends.external)
The bitnet backend (mlconf.backends.bitnet) is this class on libmlbitnet.so, which exports the
I2_S and embeddings groups only (capabilities "i2s" and "embed").
library.py: the backend; sessions.py: what it opens; inputs.py: its input checks; names.py: the
names native and native:ISA and opening a built library; worker.py / qemu.py: the worker process;
abi.py: the C declarations; build.py: the build.
"""

from __future__ import annotations

from ..child import default_timeout
from . import abi
from .library import LibraryBackend
from .names import (
    HERE,
    ISAS,
    LIBRARY,
    library_available,
    native_available,
    native_backend,
    open_library,
    stale_sources,
)
from .sessions import EmbedderSession, ModelSession, TokenizerSession

__all__ = [
    "LIBRARY",
    "HERE",
    "ISAS",
    "abi",
    "LibraryBackend",
    "ModelSession",
    "TokenizerSession",
    "EmbedderSession",
    "native_backend",
    "native_available",
    "default_timeout",
    "stale_sources",
    "open_library",
    "library_available",
]
