"""Backends from other packages: a third-party package registers backends through the entry-point
group ``mlconf.backends``: the entry's name is the backend name (or a prefix ending in ':', whose factory
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

from . import registry
from .base import CAPABILITIES, Backend, BackendError

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
        return (
            f"plug-in {self.name!r} (entry point {self.name} = {self.value} in group {PLUGIN_GROUP}"
            + (f", distribution {self.dist}" if self.dist else "")
            + ")"
        )


_PLUGINS: dict[str, PluginInfo] = {}
_plugins_loaded = False


def _builtin_owner(name: str) -> str | None:
    """The built-in name or prefix that a plug-in of this name would collide with."""
    if name in registry.BUILTIN_NAMES:
        return name
    if ":" in name:
        prefix = name.split(":", 1)[0] + ":"
        if prefix in registry.BUILTIN_NAMES:
            return prefix
    return None


def _plugin_factory(info: PluginInfo, fn: Callable | None) -> Callable[[str], Backend]:
    def factory(name: str) -> Backend:
        if fn is None:
            raise BackendError(f"backend {name!r}: {info.where} is broken: {info.error}")
        try:
            b = fn(name)
        except Exception as e:
            raise BackendError(
                f"backend {name!r}: the factory of {info.where} raised {type(e).__name__}: {e}"
            ) from e
        caps = getattr(b, "capabilities", None)
        if not isinstance(getattr(b, "name", None), str) or caps is None or isinstance(caps, str):
            raise BackendError(
                f"backend {name!r}: the factory of {info.where} returned {type(b).__name__}, "
                "not a backend (a str `name` and a set of `capabilities` are needed)"
            )
        unknown = set(caps) - set(CAPABILITIES)
        if unknown:
            raise BackendError(
                f"backend {name!r}: {info.where} declares unknown capabilities "
                f"{sorted(unknown)}; known: {', '.join(CAPABILITIES)}"
            )
        return b

    return factory


def load() -> None:
    """Read the entry points once and register every usable plug-in's name."""
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
            what = (
                f"the built-in backend {owner!r} has that name"
                if owner == ep.name
                else f"the built-in prefix {owner!r} covers that name"
            )
            info.shadowed = True
            info.error = f"ignored: {what}"
            warnings.warn(f"mlconf: {info.where} ignored: {what}", stacklevel=3)
            _PLUGINS.setdefault(ep.name, info)
            continue
        if ep.name in _PLUGINS:
            warnings.warn(
                f"mlconf: {info.where} ignored: {_PLUGINS[ep.name].where} has that name", stacklevel=3
            )
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
        registry.register(ep.name, _plugin_factory(info, fn), builtin=False)


def plugins() -> list[PluginInfo]:
    """Every entry point of the group, in the order found, with why it cannot be used if so."""
    load()
    return list(_PLUGINS.values())


def reset() -> None:
    """Forget the plug-ins (tests: read the entry points again on the next call)."""
    global _plugins_loaded
    for n, info in _PLUGINS.items():
        if not info.shadowed:
            registry.unregister(n)
    _PLUGINS.clear()
    _plugins_loaded = False
