"""Backends (``mlconf.backends``): the Backend protocol and its errors (base.py), the registry of
names (registry.py: ``get``, ``builtin_names``, ``register``) and plug-ins (entry_points.py).

Built-in: reference/ (NumPy), native/ (the C runtime, libmlrt.so, and ``lib:PATH`` through
external/), bitnet/ (libmlbitnet.so, the I2_S path), cmd/ (``cmd:PROGRAM``, a program speaking the
line protocol) and llama_cpp/ (llama.cpp itself, the `bench` extra); child.py holds what the worker
and program processes share.
"""

from __future__ import annotations

from .base import (
    BITNET_ISAS,
    CAPABILITIES,
    NATIVE_ISAS,
    POOLINGS,
    READINGS,
    STATUSES,
    SUB_CAPABILITIES,
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
from .entry_points import PLUGIN_GROUP, PluginInfo, plugins
from .registry import builtin_names, check_name, get, register, unregister

__all__ = [
    "CAPABILITIES",
    "POOLINGS",
    "READINGS",
    "STATUSES",
    "SUB_CAPABILITIES",
    "Backend",
    "BackendError",
    "EmbedderSession",
    "InputError",
    "LoadResult",
    "ModelSession",
    "NumericError",
    "Unsupported",
    "WorkerCrash",
    "WorkerTimeout",
    "BITNET_ISAS",
    "NATIVE_ISAS",
    "PLUGIN_GROUP",
    "PluginInfo",
    "builtin_names",
    "check_name",
    "get",
    "plugins",
    "register",
    "unregister",
]
