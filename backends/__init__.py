"""Backends and their registry (``mlconf.backends``).

Names (DESIGN.md): ``reference``, ``native`` (the C runtime, best ISA), ``native:scalar``,
``native:avx2``, ``native:avxvnni``, ``native:avx512``, ``native:neon``, ``native:neon-dotprod`` (one
ISA forced; the NEON ones under qemu-user on hosts that are not aarch64), ``bitnet`` (the I2_S path
in C, libmlbitnet.so: I2_S math and BitNet GGUF embeddings, best ISA), ``bitnet:scalar``,
``bitnet:avx2``, ``bitnet:avxvnni``, ``bitnet:avx512`` (one ISA forced),
``lib:PATH`` (any shared library exporting backends/native/include/mlrt.h). A name is resolved by
``get``; ``builtin_names`` lists the ones ``mlconf run`` uses when no backend is named: reference,
and native and bitnet when their libraries are built and load.

``llama.cpp`` (llama.cpp through llama-cpp-python, the `bench` extra) and ``llama.cpp:DIR`` (a build's
library folder) gate llama.cpp itself; neither is built in.

``cmd:PROGRAM [ARGS...]`` drives any executable speaking the line-based JSON protocol of
mlconf.backends.cmd (a runtime in any language, no C bindings).

Plug-ins: a third-party package registers backends through the entry-point group
``mlconf.backends``: the entry's name is the backend name (or a prefix ending in ':', whose factory
gets the whole name), its value a factory ``callable(name) -> Backend``::

    [project.entry-points."mlconf.backends"]
    example-q8 = "mlconf_example_q8:factory"

Entry points are read, and their modules imported, on the first ``get`` / ``builtin_names`` /
``plugins`` call. A broken plug-in (its module does not import, the value is not callable, the factory
raises or returns no backend) never breaks mlconf: ``plugins()`` lists it with the error and
``get(name)`` raises BackendError naming the plug-in, its entry point and the cause. A built-in name
or prefix wins over a plug-in of the same name (a warning says so; a plug-in name under a built-in
prefix, like ``lib:x``, is shadowed too); of two plug-ins with one name the first found wins.
Plug-ins are not built in: ``mlconf run`` uses them only when named with -b (a CI gate should not
change because some package happens to be installed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from .base import (
    BITNET_ISAS,
    CAPABILITIES,
    NATIVE_ISAS,
    POOLINGS,
    READINGS,
    STATUSES,
    Backend,
    BackendError,
    EmbedderSession,
    InputError,
    LoadResult,
    ModelSession,
    NumericError,
    Unsupported,
    WorkerCrash,
    WorkerTimeout,
)

__all__ = ["CAPABILITIES", "POOLINGS", "READINGS", "STATUSES", "Backend", "BackendError", "EmbedderSession",
           "InputError",
           "LoadResult", "ModelSession", "NumericError",
           "Unsupported", "WorkerCrash", "WorkerTimeout",
           "PLUGIN_GROUP", "PluginInfo", "builtin_names", "get", "plugins", "register"]

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
_BUILTIN_NAMES = frozenset(_FACTORIES)      # what plug-ins cannot take over


# ---------------------------------------------------------------- plug-ins (entry points)
PLUGIN_GROUP = "mlconf.backends"


@dataclass
class PluginInfo:
    """One entry point of the group: ``name`` = ``value`` of distribution ``dist``; ``error`` says why
    it cannot be used ("" when it loaded), ``shadowed`` whether a built-in name or prefix took it."""
    name: str
    value: str
    dist: str = ""
    error: str = ""
    shadowed: bool = False

    @property
    def where(self) -> str:
        return (f"plug-in {self.name!r} (entry point {self.name} = {self.value} in group {PLUGIN_GROUP}"
                + (f", distribution {self.dist}" if self.dist else "") + ")")


_PLUGINS: dict[str, PluginInfo] = {}
_plugins_loaded = False


def _builtin_owner(name: str) -> str | None:
    """The built-in name or prefix that a plug-in of this name would collide with."""
    if name in _BUILTIN_NAMES:
        return name
    if ":" in name:
        prefix = name.split(":", 1)[0] + ":"
        if prefix in _BUILTIN_NAMES:
            return prefix
    return None


def _plugin_factory(info: PluginInfo, fn: Callable | None) -> Callable[[str], Backend]:
    def factory(name: str) -> Backend:
        if fn is None:
            raise BackendError(f"backend {name!r}: {info.where} is broken: {info.error}")
        try:
            b = fn(name)
        except Exception as e:
            raise BackendError(f"backend {name!r}: the factory of {info.where} raised "
                               f"{type(e).__name__}: {e}") from e
        caps = getattr(b, "capabilities", None)
        if not isinstance(getattr(b, "name", None), str) or caps is None or isinstance(caps, str):
            raise BackendError(f"backend {name!r}: the factory of {info.where} returned {type(b).__name__}, "
                               "not a backend (a str `name` and a set of `capabilities` are needed)")
        unknown = set(caps) - set(CAPABILITIES)
        if unknown:
            raise BackendError(f"backend {name!r}: {info.where} declares unknown capabilities "
                               f"{sorted(unknown)}; known: {', '.join(CAPABILITIES)}")
        return b
    return factory


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points
    try:
        eps = list(entry_points(group=PLUGIN_GROUP))
    except Exception as e:  # a broken installed distribution's metadata
        warnings.warn(f"mlconf: cannot read the entry points of group {PLUGIN_GROUP}: {e}", stacklevel=3)
        return
    for ep in eps:
        dist = getattr(ep, "dist", None)
        info = PluginInfo(ep.name, ep.value, f"{dist.name} {dist.version}" if dist is not None else "")
        owner = _builtin_owner(ep.name)
        if owner is not None:
            what = (f"the built-in backend {owner!r} has that name" if owner == ep.name else
                    f"the built-in prefix {owner!r} covers that name")
            info.shadowed = True
            info.error = f"ignored: {what}"
            warnings.warn(f"mlconf: {info.where} ignored: {what}", stacklevel=3)
            _PLUGINS.setdefault(ep.name, info)
            continue
        if ep.name in _PLUGINS:
            warnings.warn(f"mlconf: {info.where} ignored: {_PLUGINS[ep.name].where} has that name",
                          stacklevel=3)
            continue
        fn = None
        try:
            fn = ep.load()
        except (Exception, SystemExit) as e:
            info.error = f"cannot load {ep.value}: {type(e).__name__}: {e}"
        else:
            if not callable(fn):
                info.error = f"{ep.value} is a {type(fn).__name__}, not a callable factory(name) -> Backend"
                fn = None
        _PLUGINS[ep.name] = info
        register(ep.name, _plugin_factory(info, fn), builtin=False)


def plugins() -> list[PluginInfo]:
    """Every entry point of the group, in the order found, with why it cannot be used if so."""
    _load_plugins()
    return list(_PLUGINS.values())


def _reset_plugins() -> None:
    """Forget the plug-ins (tests: read the entry points again on the next call)."""
    global _plugins_loaded
    for n, info in _PLUGINS.items():
        if not info.shadowed:
            _FACTORIES.pop(n, None)
            _BUILTIN.pop(n, None)
    _PLUGINS.clear()
    _plugins_loaded = False


def builtin_names() -> list[str]:
    _load_plugins()
    out = []
    for n in _FACTORIES:
        b = _BUILTIN.get(n, True)
        if not n.endswith(":") and (b() if callable(b) else b):
            out.append(n)
    return out


def _factory(name: str) -> Callable[[str], Backend]:
    """The factory of a backend name (a registered name, or a registered prefix such as lib:)."""
    _load_plugins()
    if name in _FACTORIES:
        return _FACTORIES[name]
    prefix = name.split(":", 1)[0] + ":"
    if ":" in name and prefix in _FACTORIES:
        return _FACTORIES[prefix]
    known = ", ".join(sorted(_FACTORIES))
    raise BackendError(f"unknown backend {name!r}; known: {known}")


def check_name(name: str) -> None:
    """BackendError unless ``name`` names a backend (nothing is started)."""
    _factory(name)


def get(name: str) -> Backend:
    return _factory(name)(name)
