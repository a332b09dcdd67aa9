"""Backends and their registry (``mlconf.backends``).

Names (DESIGN.md): ``reference``, ``native`` (the C runtime, best ISA), ``native:scalar``,
``native:avx2``, ``native:neon``, ``native:neon-dotprod`` (one ISA forced; the NEON ones under
qemu-user on hosts that are not aarch64), ``bitnet`` (the I2_S path in C, libmlbitnet.so: I2_S
math and BitNet GGUF embeddings, best ISA), ``bitnet:scalar``, ``bitnet:avx2`` (one ISA forced),
``lib:PATH`` (any shared library exporting backends/native/include/mlrt.h). A name is resolved by
``get``; ``builtin_names`` lists the ones ``mlconf run`` uses when no backend is named: reference,
and native and bitnet when their libraries are built and load.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import (
    CAPABILITIES,
    POOLINGS,
    STATUSES,
    Backend,
    BackendError,
    EmbedderSession,
    InputError,
    LoadResult,
    ModelSession,
    Unsupported,
    WorkerCrash,
    WorkerTimeout,
)

__all__ = ["CAPABILITIES", "POOLINGS", "STATUSES", "Backend", "BackendError", "EmbedderSession", "InputError",
           "LoadResult", "ModelSession",
           "Unsupported", "WorkerCrash", "WorkerTimeout",
           "get", "builtin_names", "register"]

_FACTORIES: dict[str, Callable[[str], Backend]] = {}
_BUILTIN: dict[str, bool | Callable[[], bool]] = {}


def register(name: str, factory: Callable[[str], Backend],
             builtin: bool | Callable[[], bool] = True) -> None:
    """Register a backend name, or a prefix ending in ':' whose factory takes the whole name.

    ``builtin``: whether ``mlconf run`` uses it when no backend is named; a callable is asked
    each time (``native`` is built in only when its library is built and loads)."""
    _FACTORIES[name] = factory
    _BUILTIN[name] = builtin


def _reference(_: str) -> Backend:
    from .reference import ReferenceBackend
    return ReferenceBackend()


def _native(name: str) -> Backend:
    from .native import native_backend
    return native_backend(name)


def _native_available() -> bool:
    from .native import native_available
    return native_available()


def _bitnet(name: str) -> Backend:
    from .bitnet import bitnet_backend
    return bitnet_backend(name)


def _bitnet_available() -> bool:
    from .bitnet import bitnet_available
    return bitnet_available()


def _external(name: str) -> Backend:
    from .external import external_backend
    return external_backend(name)


register("reference", _reference)
register("native", _native, builtin=_native_available)
for _isa in ("scalar", "avx2", "neon", "neon-dotprod"):
    register(f"native:{_isa}", _native, builtin=False)
register("bitnet", _bitnet, builtin=_bitnet_available)
for _isa in ("scalar", "avx2"):
    register(f"bitnet:{_isa}", _bitnet, builtin=False)
register("lib:", _external)


def builtin_names() -> list[str]:
    out = []
    for n in _FACTORIES:
        b = _BUILTIN.get(n, True)
        if not n.endswith(":") and (b() if callable(b) else b):
            out.append(n)
    return out


def get(name: str) -> Backend:
    if name in _FACTORIES:
        return _FACTORIES[name](name)
    prefix = name.split(":", 1)[0] + ":"
    if ":" in name and prefix in _FACTORIES:
        return _FACTORIES[prefix](name)
    known = ", ".join(sorted(_FACTORIES))
    raise BackendError(f"unknown backend {name!r}; known: {known}")
