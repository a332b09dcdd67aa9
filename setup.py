"""Build hooks only; the metadata is in pyproject.toml.

The native runtime (backends/native/src/*.c) and the bitnet runtime (backends/bitnet/src/*.c) are
compiled into libmlrt.so and libmlbitnet.so by backends/native/build.py as part of build_py, so
`pip install .` and `pip install -e .` both build them, and a compiler error fails the installation
loudly (the libraries are part of the product):
- a regular build writes them into the build tree (mlconf/backends/native/libmlrt.so and
  mlconf/backends/bitnet/libmlbitnet.so of the wheel);
- an editable build writes them into the source tree (git-ignored), where the editable install
  imports the packages from. After editing C, rebuild with `python backends/native/build.py --all`
  (same output paths) or reinstall.
The wheel holds a binary, so it is tagged for this platform (py3-none-<platform>): the library is
loaded with cffi in ABI mode and does not depend on the Python version.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "backends" / "native"
# library -> (its package under backends/, the file)
LIBRARIES = {"mlrt": ("native", "libmlrt.so"), "mlbitnet": ("bitnet", "libmlbitnet.so")}


def _native_build():
    """backends/native/build.py, loaded by path (it is not importable before installation)."""
    spec = importlib.util.spec_from_file_location("_mlconf_native_build", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class build_py_native(build_py):
    """build_py, then compile the C runtimes next to their packages' Python files."""

    def _library(self, lib: str) -> Path:
        package, name = LIBRARIES[lib]
        if self.editable_mode:
            return ROOT / "backends" / package / name
        return Path(self.build_lib) / "mlconf" / "backends" / package / name

    def run(self) -> None:
        build = _native_build()
        build.unicode_tables()  # generated before the package files are copied, so the wheel has it
        super().run()
        for lib in LIBRARIES:
            out = self._library(lib)
            self.announce(f"building the C runtime {lib}: {out}", level=2)
            try:
                build.build(out, lib=lib)
            except build.BuildError as e:
                raise SystemExit(f"error: the C runtime {lib} failed to build:\n{e}") from None

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outs = super().get_outputs(include_bytecode)
        return outs if self.editable_mode else [*outs, *(str(self._library(lib)) for lib in LIBRARIES)]


class BinaryDistribution(Distribution):
    """Holds a compiled library: installed as platform-specific (platlib, a platform wheel tag)."""

    def has_ext_modules(self) -> bool:
        return True


class bdist_wheel_platform(bdist_wheel):
    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    distclass=BinaryDistribution, cmdclass={"build_py": build_py_native, "bdist_wheel": bdist_wheel_platform}
)
