"""The bitnet backend (issue 6): the I2_S path in C, libmlbitnet.so of backends/bitnet/src.

The library exports ml_version / ml_isa / ml_set_isa and the "I2_S" and "embeddings" groups of
backends/native/include/mlrt.h (not the MLB groups), so the native backend's LibraryBackend, run
in its worker process, gives it the capabilities "i2s" and "embed" from its symbols. Names:
  bitnet          libmlbitnet.so with the best ISA of this machine (ml_isa() says which)
  bitnet:ISA      ISA forced with ml_set_isa (scalar, avx2); an ISA this machine cannot run leaves
                  the backend with no capability, so every case is unsupported, with why
Nothing here imports the reference backend (nor native's math): the cross-check stays independent.
"""

from __future__ import annotations

from pathlib import Path

from ..base import BITNET_ISAS, BackendError
from ..native import HERE as NATIVE
from ..native import LibraryBackend, library_available, open_library

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "libmlbitnet.so"  # `pip install` and `python backends/native/build.py --all` build it
ISAS = BITNET_ISAS


def _sources() -> list[Path]:
    """The C files the library is built from (backends/native/build.py LIBRARIES["mlbitnet"])."""
    return [
        *HERE.glob("src/*.[ch]"),
        NATIVE / "src" / "pool.c",
        NATIVE / "src" / "f16.c",
        *NATIVE.glob("src/*.h"),
        *NATIVE.glob("include/*.h"),
    ]


def bitnet_backend(name: str) -> LibraryBackend:
    """The backend ``bitnet`` or ``bitnet:ISA``."""
    isa = name.split(":", 1)[1] if ":" in name else None
    if isa is not None and isa not in ISAS:
        raise BackendError(f"unknown ISA {isa!r} in {name!r}; known: {', '.join(ISAS)}")
    return open_library(
        name,
        LIBRARY,
        isa,
        _sources(),
        "the bitnet library",
        "`pip install .` builds it, and in a source tree `python backends/native/build.py --all` rebuilds it",
    )


def bitnet_available() -> bool:
    """Whether ``bitnet`` is built and loads (``mlconf run`` then uses it by default)."""
    return library_available("bitnet", LIBRARY, bitnet_backend)


__all__ = ["LIBRARY", "ISAS", "bitnet_backend", "bitnet_available"]
