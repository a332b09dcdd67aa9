"""Backends and their registry (``mlconf.backends``).

Names (DESIGN.md): ``reference``; later ``native``, ``native:scalar``, ``native:avx2``,
``native:neon``, ``bitnet`` and ``lib:PATH``. A name is resolved by ``get``; ``builtin_names``
lists the ones ``mlconf run`` uses when no backend is named.
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
)

__all__ = ["CAPABILITIES", "STATUSES", "Backend", "BackendError", "InputError", "LoadResult", "ModelSession",
           "Unsupported",
           "get", "builtin_names", "register"]

_FACTORIES: dict[str, Callable[[str], Backend]] = {}


def register(name: str, factory: Callable[[str], Backend]) -> None:
    """Register a backend name, or a prefix ending in ':' whose factory takes the whole name."""
    _FACTORIES[name] = factory


def _reference(_: str) -> Backend:
    from .reference import ReferenceBackend
    return ReferenceBackend()


register("reference", _reference)


def builtin_names() -> list[str]:
    return [n for n in _FACTORIES if not n.endswith(":")]


def get(name: str) -> Backend:
    if name in _FACTORIES:
        return _FACTORIES[name](name)
    prefix = name.split(":", 1)[0] + ":"
    if ":" in name and prefix in _FACTORIES:
        return _FACTORIES[prefix](name)
    known = ", ".join(sorted(_FACTORIES))
    raise BackendError(f"unknown backend {name!r}; known: {known}")
