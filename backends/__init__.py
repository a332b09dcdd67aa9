"""Backends and their registry (``mlconf.backends``).

Names (DESIGN.md): ``reference``, ``native`` (the C runtime, best ISA), ``native:scalar``,
``native:avx2``, ``native:neon``, ``native:neon-dotprod`` (one ISA forced; the NEON ones under
qemu-user on hosts that are not aarch64), ``lib:PATH`` (any shared library exporting
backends/native/include/mlrt.h); later ``bitnet``. A name is resolved by ``get``;
``builtin_names`` lists the ones ``mlconf run`` uses when no backend is named.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import (
    CAPABILITIES,
    STATUSES,
    Backend,
    BackendError,
    InputError,
    LoadResult,
    ModelSession,
    Unsupported,
    WorkerCrash,
    WorkerTimeout,
)

__all__ = ["CAPABILITIES", "STATUSES", "Backend", "BackendError", "InputError", "LoadResult", "ModelSession",
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


def _external(name: str) -> Backend:
    from .external import external_backend
    return external_backend(name)


register("reference", _reference)
register("native", _native, builtin=_native_available)
for _isa in ("scalar", "avx2", "neon", "neon-dotprod"):
    register(f"native:{_isa}", _native, builtin=False)
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
