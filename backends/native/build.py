"""Compile the native runtime (src/*.c) into a shared library exporting include/mlrt.h, and the
bitnet runtime (backends/bitnet/src/*.c) into a second one exporting the I2_S and embeddings groups.

    python backends/native/build.py [OUT.so] [--lib mlrt|mlbitnet] [--sanitize] [--m32] [--cc CC]
    python backends/native/build.py --all          (both libraries at their default paths)
    python backends/native/build.py --worker [OUT] [--cc CC]     (build_worker: aarch64 by default)

Used by the package build (setup.py) and by the tests (sanitizer and -m32 builds). C11, no
third-party libraries, -Wall -Wextra -Werror. The SIMD kernel files get their ISA flags only
where they apply (kern_avx2.c on x86-64, kern_neon*.c on aarch64); the ISA is chosen at run
time from the CPU's features, so one library serves every x86-64 machine.

Before compiling, src/unicode_tables.h (git-ignored) is rendered from specs/unicode.json by
tools/gen_unicode_tables.py when it is missing or stale (unicode_tables()).

build_worker links the same sources statically with worker_main.c into an executable, by default
for aarch64 with the cross compiler: native:neon runs it under qemu-user on other hosts (qemu.py).

With $MLRT_BUILD_CACHE set to a folder, every build (compile_link) is kept there under the hash of
what makes it (compiler and its --version, flags, sources, the headers beside them) and a second
build of the same inputs is a copy: the test session sets it (tests/conftest.py), so each C
variant is compiled once per session, whichever xdist worker asks first.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
BITNET = HERE.parent / "bitnet"
WORKER_MAIN = HERE / "worker_main.c"
# src/unicode_tables.h is rendered from specs/unicode.json by tools/gen_unicode_tables.py
# (mlconf/specs, mlconf/tools once installed), before compiling, when missing or stale; it is
# git-ignored.
UNICODE_TABLES = SRC / "unicode_tables.h"
UNICODE_GENERATOR = HERE.parents[1] / "tools" / "gen_unicode_tables.py"
UNICODE_DATA = HERE.parents[1] / "specs" / "unicode.json"
FILES = HERE.parents[1] / "tools" / "files.py"  # replacing(): loaded by path, like the generator
CFLAGS = ["-std=c11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-fvisibility=hidden"]
SANITIZE = [
    "-O1",
    "-g",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]  # --sanitize and the fuzz targets
ISA_FLAGS = {  # file -> (machines it is compiled for, extra flags)
    "kern_avx2.c": (("x86_64", "AMD64"), ["-mavx2", "-mfma", "-mf16c"]),
    "kern_avxvnni.c": (("x86_64", "AMD64"), ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"]),
    "kern_avx512.c": (
        ("x86_64", "AMD64"),
        ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
    ),
    "kern_neon.c": (("aarch64", "arm64"), []),
    "kern_neon_dotprod.c": (("aarch64", "arm64"), ["-march=armv8.2-a+dotprod"]),
    "i2s_avx2.c": (("x86_64", "AMD64"), ["-mavx2", "-mfma", "-mf16c"]),
    "i2s_avxvnni.c": (("x86_64", "AMD64"), ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"]),
    "i2s_avx512.c": (
        ("x86_64", "AMD64"),
        ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vnni"],
    ),
    "i2s_neon.c": (("aarch64", "arm64"), []),
}
# library -> (its sources, the default output path). The bitnet runtime shares only the native
# runtime's infrastructure (thread pool, f16 conversion, CPU features), none of its math.
LIBRARIES = {
    "mlrt": (lambda: sorted(SRC.glob("*.c")), HERE / "libmlrt.so"),
    "mlbitnet": (
        lambda: [*sorted((BITNET / "src").glob("*.c")), *(SRC / f for f in ("pool.c", "f16.c", "cpu.c"))],
        BITNET / "libmlbitnet.so",
    ),
}


class BuildError(RuntimeError):
    pass


def default_cc() -> str:
    """The C compiler command: $CC when set (as make and setuptools honour it; it may carry
    arguments, e.g. "ccache clang"), else gcc."""
    return os.environ.get("CC", "").strip() or "gcc"


def _m32_asm_include(where: Path) -> list[str]:
    """Debian's gcc-multilib meta package, which conflicts with the aarch64 cross compiler, only
    adds the link /usr/include/asm -> x86_64-linux-gnu/asm; without it <errno.h> fails under
    -m32. Give the compiler that link in a folder of ours instead."""
    system = Path("/usr/include/asm")
    target = Path("/usr/include/x86_64-linux-gnu/asm")
    if system.exists() or not target.exists():
        return []
    inc = where / ".m32-include"
    inc.mkdir(exist_ok=True)
    link = inc / "asm"
    if not link.exists():
        link.symlink_to(target)
    return ["-idirafter", str(inc)]


def sources(machine: str | None = None, lib: str = "mlrt") -> list[tuple[Path, list[str]]]:
    """(source, extra flags) of the files of library ``lib`` that belong in a build for ``machine``."""
    machine = machine or platform.machine()
    out = []
    for p in LIBRARIES[lib][0]():
        where, flags = ISA_FLAGS.get(p.name, (None, []))
        if where is not None and machine not in where:
            continue
        out.append((p, flags))
    return out


def build(
    out: str | Path | None = None,
    *,
    lib: str = "mlrt",
    cc: str | None = None,
    sanitize: bool = False,
    m32: bool = False,
    machine: str | None = None,
    extra: list[str] | None = None,
) -> Path:
    """Compile library ``lib`` and link it into ``out`` (default: its place in the source tree);
    raises BuildError with the compiler's output."""
    out = out or LIBRARIES[lib][1]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = cc or default_cc()
    if not shlex.split(cc) or shutil.which(shlex.split(cc)[0]) is None:
        raise BuildError(f"C compiler {cc!r} not found (the native backend needs gcc or clang)")
    flags = list(CFLAGS) + (extra or [])
    if sanitize:
        flags = [f for f in flags if f != "-O2"] + SANITIZE
    if m32:
        flags.append("-m32")
        machine = "i686"
        flags += _m32_asm_include(out.parent)
    return compile_link(cc, flags, sources(machine, lib), ["-shared"], out)


def _by_path(name: str, path: Path):
    """A module of mlconf loaded from its file: this script runs before mlconf is importable (the
    package's build, setup.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def unicode_tables() -> Path:
    """Write src/unicode_tables.h with the generator (loaded by path, in this process) unless it
    is newer than the generator and specs/unicode.json."""
    out = UNICODE_TABLES
    inputs = (UNICODE_GENERATOR, UNICODE_DATA)
    if out.exists() and all(not p.exists() or p.stat().st_mtime <= out.stat().st_mtime for p in inputs):
        return out
    if not all(p.exists() for p in inputs):
        if out.exists():
            return out
        raise BuildError(f"{out} is missing and {' or '.join(str(p) for p in inputs)} is not there")
    mod = _by_path("_mlconf_gen_unicode_tables", UNICODE_GENERATOR)
    try:
        return mod.write(out)
    except OSError as e:
        if out.exists() and out.read_text(encoding="utf-8") == mod.render():
            return out  # e.g. an installed package in a read-only folder: same data
        raise BuildError(f"{UNICODE_GENERATOR}: cannot write {out}: {e}") from None


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
    if r.returncode:
        raise BuildError(f"{' '.join(cmd)}\n{r.stdout}{r.stderr}")


BUILD_CACHE = "MLRT_BUILD_CACHE"


def _build_key(cc: str, flags: list[str], srcs: list[tuple[Path, list[str]]], link_flags: list[str]) -> str:
    """sha256 of everything that makes the output: the compiler (its path and --version), every
    flag, each source's bytes, and the headers of include/, of each source's folder and of -I
    folders (the sources' #include set, over-approximated: a header edit misses the cache)."""
    argv = shlex.split(cc)
    version = subprocess.run([*argv, "--version"], capture_output=True).stdout
    dirs = {HERE / "include", *(src.parent for src, _ in srcs)}
    dirs |= {Path(f[2:]) for f in flags if f.startswith("-I") and len(f) > 2}
    dirs |= {Path(b) for a, b in zip(flags, flags[1:], strict=False) if a == "-I"}
    headers = sorted(h for d in dirs for h in d.glob("*.h"))
    h = hashlib.sha256()
    for part in (
        repr((argv, shutil.which(argv[0]), flags, link_flags, [(str(s), isa) for s, isa in srcs])).encode(),
        version,
        *(src.read_bytes() for src, _ in srcs),
        *(str(p).encode() + b"\0" + p.read_bytes() for p in headers),
    ):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def compile_link(
    cc: str, flags: list[str], srcs: list[tuple[Path, list[str]]], link_flags: list[str], out: Path
) -> Path:
    """Compile each (source, its own flags: ISA flags must not leak into the scalar twin) and link
    them into ``out`` with ``link_flags``; the result appears at once (rename), so a process that
    has the previous file loaded is not disturbed. Under $MLRT_BUILD_CACHE, the same inputs are
    compiled once (a lock per key: two processes asking together build once)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cache = os.environ.get(BUILD_CACHE, "").strip()
    if any(src.parent == SRC for src, _ in srcs):
        unicode_tables()  # before the key: the rendered header is one of its inputs
    if not cache:
        return _compile_link(cc, flags, srcs, link_flags, out)
    kept = Path(cache) / _build_key(cc, flags, srcs, link_flags)
    kept.parent.mkdir(parents=True, exist_ok=True)
    files = _by_path("_mlconf_files", FILES)
    with open(f"{kept}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not kept.exists():
            _compile_link(cc, flags, srcs, link_flags, out)
            with files.replacing(kept, mode=0o777) as tmp:
                shutil.copyfile(out, tmp)
            return out
    with files.replacing(out, mode=0o777) as tmp:
        shutil.copyfile(kept, tmp)
    return out


def _compile_link(
    cc: str, flags: list[str], srcs: list[tuple[Path, list[str]]], link_flags: list[str], out: Path
) -> Path:
    """compile_link without the cache: the objects go to a temporary folder beside ``out``."""
    build_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.obj", dir=out.parent))
    try:
        objs = []
        for src, isa in srcs:
            obj = build_dir / (src.stem + ".o")
            _run(
                [*shlex.split(cc), *flags, *isa, "-I", str(HERE / "include"), "-c", str(src), "-o", str(obj)]
            )
            objs.append(str(obj))
        # a library or an executable: rwx less the umask
        with _by_path("_mlconf_files", FILES).replacing(out, mode=0o777) as tmp:
            _run([*shlex.split(cc), *flags, *link_flags, "-o", str(tmp), *objs, "-lm", "-lpthread"])
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return out


def build_worker(out: str | Path, machine: str = "aarch64", cc: str = "aarch64-linux-gnu-gcc") -> Path:
    """Compile worker_main.c and every source of ``machine`` (ISA files included) and link them
    statically into the executable ``out`` (-static: qemu-user runs it without a sysroot). The
    file appears at once (rename), so a worker running the previous binary is not disturbed.
    Raises BuildError with the compiler's output."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not shlex.split(cc) or shutil.which(shlex.split(cc)[0]) is None:
        raise BuildError(f"C compiler {cc!r} not found")
    flags = [f for f in CFLAGS if f != "-fPIC"]
    return compile_link(cc, flags, [*sources(machine), (WORKER_MAIN, [])], ["-static"], out)


FUZZ = HERE / "fuzz"
# fuzz/NAME.c -> the library whose sources it is linked with (coverage on them all)
FUZZ_LIBRARY = {"mlb_check": "mlrt", "mlt_load": "mlrt", "gguf_load": "mlbitnet"}
FUZZ_TARGETS = tuple(FUZZ_LIBRARY)


def build_fuzzer(name: str, out: str | Path, cc: str = "clang") -> Path:
    """The libFuzzer target fuzz/NAME.c with every source of its library (FUZZ_LIBRARY) for this
    machine (coverage on them all),
    built with ASan and UBSan; under OSS-Fuzz, $CFLAGS (its sanitizer) and $LIB_FUZZING_ENGINE
    instead (fuzz/build.sh). Raises BuildError."""
    if name not in FUZZ_TARGETS:
        raise BuildError(f"unknown fuzz target {name!r}; targets: {', '.join(FUZZ_TARGETS)}")
    if not shlex.split(cc) or shutil.which(shlex.split(cc)[0]) is None:
        raise BuildError(f"C compiler {cc!r} not found (libFuzzer needs clang)")
    engine = os.environ.get("LIB_FUZZING_ENGINE", "-fsanitize=fuzzer")
    san = shlex.split(os.environ["CFLAGS"]) if os.environ.get("CFLAGS") else SANITIZE
    flags = [f for f in CFLAGS if f not in ("-O2", "-fPIC", "-fvisibility=hidden")] + san
    target = FUZZ / f"{name}.c"
    covered = [  # coverage, no main
        (src, [*isa, "-fsanitize=fuzzer-no-link"]) for src, isa in sources(lib=FUZZ_LIBRARY[name])
    ]
    return compile_link(cc, flags, [*covered, (target, [engine])], [engine], Path(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "out",
        nargs="?",
        help="default: libmlrt.so here, backends/bitnet/libmlbitnet.so for "
        "--lib mlbitnet (--worker: build-aarch64/mlrt-worker)",
    )
    ap.add_argument("--lib", choices=sorted(LIBRARIES), default="mlrt", help="which library (default mlrt)")
    ap.add_argument("--all", action="store_true", help="build every library at its default path")
    ap.add_argument("--sanitize", action="store_true", help="AddressSanitizer + UBSan build")
    ap.add_argument("--m32", action="store_true", help="32-bit build (gcc-multilib)")
    ap.add_argument("--cc", help="default: $CC, else gcc (--worker: aarch64-linux-gnu-gcc)")
    ap.add_argument(
        "--fuzz",
        choices=FUZZ_TARGETS,
        help="a libFuzzer target of fuzz/ (clang; default out: fuzz/build/NAME)",
    )
    ap.add_argument(
        "--worker",
        action="store_true",
        help="the static aarch64 worker executable of native:neon under qemu (build_worker)",
    )
    args = ap.parse_args(argv)
    try:
        if args.fuzz:
            print(build_fuzzer(args.fuzz, args.out or FUZZ / "build" / args.fuzz, args.cc or "clang"))
            return 0
        if args.worker:
            print(
                build_worker(
                    args.out or HERE / "build-aarch64" / "mlrt-worker", cc=args.cc or "aarch64-linux-gnu-gcc"
                )
            )
        elif args.all:
            for lib in LIBRARIES:
                print(build(lib=lib, cc=args.cc, sanitize=args.sanitize, m32=args.m32))
        else:
            print(build(args.out, lib=args.lib, cc=args.cc, sanitize=args.sanitize, m32=args.m32))
    except BuildError as e:
        print(f"build.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
