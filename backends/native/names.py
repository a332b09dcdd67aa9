"""The backend names ``native`` and ``native:ISA``, and opening a library of this source tree: built or
not, older than its sources or not, started once to learn whether it loads (the spare kept for the
next use)."""

from __future__ import annotations

import atexit
import platform
import warnings
from pathlib import Path

from ..base import NATIVE_ISAS, BackendError
from .library import LibraryBackend

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "libmlrt.so"  # pip install builds it here (editable installs: in the source tree)
ISAS = NATIVE_ISAS
_SPARE: dict[str, LibraryBackend] = {}  # the backend library_available() started, for the next get


@atexit.register
def _close_spares() -> None:
    """Stop the workers of spares nobody asked for (their pipes and stderr files close with them)."""
    while _SPARE:
        _SPARE.popitem()[1].close()


def _native_sources() -> list[Path]:
    return [*HERE.glob("src/*.[ch]"), *HERE.glob("include/*.h")]


def stale_sources(library: Path, sources: list[Path]) -> list[str]:
    """Names of ``sources`` newer than ``library`` (a developer edited C and did not rebuild).
    Source trees only: an installed package's file times say nothing about the build."""
    if not library.exists() or not (HERE.parents[1] / "pyproject.toml").exists():
        return []
    built = library.stat().st_mtime
    return [p.name for p in sources if p.exists() and p.stat().st_mtime > built]


def _stale_sources() -> list[str]:
    return stale_sources(LIBRARY, _native_sources())


def open_library(
    name: str, library: Path, isa: str | None, sources: list[Path], what: str, build_hint: str
) -> LibraryBackend:
    """A LibraryBackend on a library of this source tree: BackendError if it is not built, a
    warning if a source is newer than it. ``what`` names it in messages ("the native library")."""
    spare = _SPARE.pop(name, None)
    if spare is not None:
        return spare
    if not library.exists():
        raise BackendError(f"{name}: {what} {library} is not built; {build_hint}")
    stale = stale_sources(library, sources)
    if stale:
        warnings.warn(
            f"{library} is older than {', '.join(sorted(stale))}: rebuild it with "
            "`python backends/native/build.py --all` (or reinstall)",
            stacklevel=3,
        )
    return LibraryBackend(name, library, isa=isa)


def library_available(name: str, library: Path, factory) -> bool:
    """Whether backend ``name`` (``factory(name)``) is built and loads; the backend started to find
    out is kept for the next ``factory(name)`` (open_library hands it out)."""
    if name in _SPARE:
        return True
    if not library.exists():
        return False
    try:
        _SPARE[name] = factory(name)
    except BackendError as e:
        warnings.warn(f"the {name} backend is left out: {e}", stacklevel=3)
        return False
    return True


def native_backend(name: str) -> LibraryBackend:
    """The backend ``native`` or ``native:ISA``."""
    isa = name.split(":", 1)[1] if ":" in name else None
    if isa is not None and isa not in ISAS:
        raise BackendError(f"unknown ISA {isa!r} in {name!r}; known: {', '.join(ISAS)}")
    if name in _SPARE:
        return _SPARE.pop(name)
    if isa in ("neon", "neon-dotprod") and platform.machine() not in ("aarch64", "arm64"):
        from . import qemu

        return LibraryBackend(name, " ".join(qemu.command()), isa=isa, worker_class=qemu.QemuWorker)
    return open_library(
        name,
        LIBRARY,
        isa,
        _native_sources(),
        "the native library",
        "`pip install .` builds it, and in a source tree `python backends/native/build.py` rebuilds it",
    )


def native_available() -> bool:
    """Whether ``native`` is built and loads (``mlconf run`` then uses it by default)."""
    return library_available("native", LIBRARY, native_backend)
