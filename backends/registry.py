"""The registry of backend names (DESIGN.md): ``reference``, ``native`` (the C runtime, best ISA),
``native:scalar``, ``native:avx2``, ``native:avxvnni``, ``native:avx512``, ``native:neon``,
``native:neon-dotprod`` (one ISA forced; the NEON ones under qemu-user on hosts that are not
aarch64), ``bitnet`` (the I2_S path in C, libmlbitnet.so: I2_S math and BitNet GGUF embeddings,
best ISA), ``bitnet:scalar``, ``bitnet:avx2``, ``bitnet:avxvnni``, ``bitnet:avx512`` (one ISA forced),
``lib:PATH`` (any shared library exporting backends/native/include/mlrt.h). A name is resolved by
``get``; ``builtin_names`` lists the ones ``mlconf run`` uses when no backend is named: reference,
and native and bitnet when their libraries are built and load.

``llama.cpp`` (llama.cpp through llama-cpp-python, the `bench` extra) and ``llama.cpp:DIR`` (a build's
library folder) gate llama.cpp itself; neither is built in.

``cmd:PROGRAM [ARGS...]`` drives any executable speaking the line-based JSON protocol of
mlconf.backends.cmd (a runtime in any language, no C bindings).

Plug-ins (backends/entry_points.py) add their names here on the first ``get`` / ``builtin_names``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from . import entry_points
from .base import BITNET_ISAS, NATIVE_ISAS, Backend, BackendError

_FACTORIES: dict[str, Callable[[str], Backend]] = {}
_BUILTIN: dict[str, bool | Callable[[], bool]] = {}


def register(name: str, factory: Callable[[str], Backend], builtin: bool | Callable[[], bool] = True) -> None:
    """Register a backend name, or a prefix ending in ':' whose factory takes the whole name.

    ``builtin``: whether ``mlconf run`` uses it when no backend is named; a callable is asked
    each time (``native`` is built in only when its library is built and loads)."""
    _FACTORIES[name] = factory
    _BUILTIN[name] = builtin


def unregister(name: str) -> None:
    """Forget a name ``register`` added (a test's or a plug-in's backend)."""
    _FACTORIES.pop(name, None)
    _BUILTIN.pop(name, None)


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


def _llama_cpp(name: str) -> Backend:
    from .llama_cpp import llama_cpp_backend

    return llama_cpp_backend(name)


def _cmd(name: str) -> Backend:
    from .cmd import cmd_backend

    return cmd_backend(name)


register("reference", _reference)
register("native", _native, builtin=_native_available)
for _isa in NATIVE_ISAS:
    register(f"native:{_isa}", _native, builtin=False)
register("bitnet", _bitnet, builtin=_bitnet_available)
for _isa in BITNET_ISAS:
    register(f"bitnet:{_isa}", _bitnet, builtin=False)
register("lib:", _external)
register("cmd:", _cmd, builtin=False)
register("llama.cpp", _llama_cpp, builtin=False)
register("llama.cpp:", _llama_cpp, builtin=False)
BUILTIN_NAMES = frozenset(_FACTORIES)  # what plug-ins cannot take over


def builtin_names() -> list[str]:
    entry_points.load()
    out = []
    for n in _FACTORIES:
        b = _BUILTIN.get(n, True)
        if not n.endswith(":") and (b() if callable(b) else b):
            out.append(n)
    return out


def _factory(name: str) -> Callable[[str], Backend]:
    """The factory of a backend name (a registered name, or a registered prefix such as lib:)."""
    entry_points.load()
    if name in _FACTORIES:
        return _FACTORIES[name]
    prefix = name.split(":", 1)[0] + ":"
    if ":" in name and prefix in _FACTORIES:
        return _FACTORIES[prefix]
    known = ", ".join(sorted(_FACTORIES))
    raise BackendError(f"unknown backend {name!r}; known: {known}")


# NAME=SPEC: the backend of SPEC, called NAME in every report (`-b mine=lib:build/libmy.so`), so
# that two builds of one runtime compare by name in `mlconf diff`
ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_.+-]*")


def _alias(name: str) -> tuple[str | None, str]:
    alias, sep, spec = name.partition("=")
    if not sep or not ALIAS.fullmatch(alias):
        return None, name
    if alias in _FACTORIES or alias + ":" in _FACTORIES:
        raise BackendError(f"backend alias {alias!r} in {name!r} is the name of a backend; choose another")
    return alias, spec


def check_name(name: str) -> None:
    """BackendError unless ``name`` names a backend (nothing is started)."""
    _factory(_alias(name)[1])


def get(name: str) -> Backend:
    alias, spec = _alias(name)
    b = _factory(spec)(spec)
    if alias is not None:
        b.name, b.spec = alias, name  # spec: how forked children make their own (forked._fresh)
    return b
