"""The suite's own mutation score: planted bugs of the kinds runtime authors make (specs/planted_bugs.yaml).

Each bug is a source patch of the native runtime (libmlrt) or the bitnet runtime (libmlbitnet): a
copy of the C sources with one `find` text replaced, compiled into its own library and run as a
``lib:`` backend, on the scalar kernel table (the same patch on every host), over the areas the bug
names. The bug is caught when a case matching one of its `caught_by` patterns fails: the verdict
has to name the right rule or case, not merely fail somewhere. The unpatched copy, built the same
way, must pass every area (the baseline), so a failure is the bug's.

Objects are compiled once per content (a source and the headers beside it), so a variant costs the
compilation of its one patched file and a link. `mlconf selftest` prints the score; tests/
test_selftest.py runs every bug.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlconf import cases, records, runner, specs
from mlconf.backends.native import build

# the lib key of a bug -> (library name of build.py, folders copied: (source, its place in the copy))
LIBS = {
    "mlrt": ("mlrt", ("native/src",)),
    "mlbitnet": ("mlbitnet", ("native/src", "bitnet/src")),
}
HERE = build.HERE.parent  # backends/ (native/, bitnet/)


class CatalogueError(ValueError):
    """A bug whose patch no longer applies (its `find` text is not in the source exactly once)."""


@dataclass(frozen=True)
class Bug:
    id: str
    kind: str
    lib: str
    file: str  # relative to backends/: native/src/loader.c
    find: str
    replace: str
    areas: tuple[str, ...]
    caught_by: tuple[str, ...]  # fnmatch patterns of case ids
    why: str = ""
    keyword: str | None = None  # -k of the run (None: the whole areas)


@dataclass
class Verdict:
    bug: Bug | None  # None: the baseline
    caught: bool
    failing: list[str] = field(default_factory=list)  # every failing case id
    naming: list[str] = field(default_factory=list)  # the failing ones caught_by names
    ran: int = 0


def catalogue() -> list[Bug]:
    doc = specs.load("planted_bugs")
    out = []
    for b in doc["bugs"]:
        out.append(
            Bug(
                id=b["id"],
                kind=b["kind"],
                lib=b.get("lib", "mlrt"),
                file=b["file"],
                find=b["find"],
                replace=b["replace"],
                areas=tuple(b["areas"]),
                caught_by=tuple(b["caught_by"]),
                why=b.get("why", ""),
                keyword=b.get("k"),
            )
        )
    ids = [b.id for b in out]
    if len(set(ids)) != len(ids):
        raise CatalogueError(
            f"specs/planted_bugs.yaml: duplicate bug ids {sorted({i for i in ids if ids.count(i) > 1})}"
        )
    return out


def kinds() -> dict[str, str]:
    """Kind -> what it covers (the catalogue's `kinds`, for the README's list)."""
    return dict(specs.load("planted_bugs")["kinds"])


# ---------------------------------------------------------------- building a variant
def _copy_sources(lib: str, root: Path) -> None:
    build.unicode_tables()  # the rendered header is part of native/src
    for rel in LIBS[lib][1]:
        shutil.copytree(
            HERE / rel, root / rel, ignore=shutil.ignore_patterns("*.o", "*.so"), dirs_exist_ok=True
        )
    shutil.copytree(HERE / "native" / "include", root / "native" / "include", dirs_exist_ok=True)


def apply(bug: Bug, root: Path) -> None:
    """Patch the copy under ``root``; CatalogueError when the find text is not there exactly once."""
    path = root / bug.file
    text = path.read_text(encoding="utf-8")
    n = text.count(bug.find)
    if n != 1:
        raise CatalogueError(
            f"specs/planted_bugs.yaml: bug {bug.id}: its find text occurs {n} times in {bug.file} "
            "(exactly once needed; the source changed: update the patch)"
        )
    path.write_text(text.replace(bug.find, bug.replace), encoding="utf-8")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little") + p)
    return h.hexdigest()


def _compile(cc: str, src: Path, flags: list[str], include: Path, objdir: Path) -> Path:
    """One object, kept under objdir by the sha256 of the compiler, the flags, the source and
    every header of its folder and of include/ (a patched header recompiles what is beside it)."""
    folders = {src.parent, include, src.parents[2] / "native" / "src"}  # bitnet/src includes native/src's
    headers = sorted(h for d in folders for h in d.glob("*.h"))
    key = _digest(
        repr((cc, flags)).encode(), src.read_bytes(), *(h.name.encode() + h.read_bytes() for h in headers)
    )
    obj = objdir / f"{src.stem}-{key[:20]}.o"
    if not obj.exists():
        tmp = obj.with_name(f"{obj.stem}.{os.getpid()}.tmp.o")  # one per process: xdist workers share objdir
        build._run([*shlex.split(cc), *flags, "-I", str(include), "-c", str(src), "-o", str(tmp)])
        tmp.replace(obj)
    return obj


def build_variant(bug: Bug | None, lib: str, out: Path, objdir: Path) -> Path:
    """The library of ``bug`` (None: the unpatched copy) at ``out``."""
    cc = build.default_cc()
    flags = [f for f in build.CFLAGS if f != "-Werror"]  # a planted bug may well warn
    with tempfile.TemporaryDirectory(prefix="mlconf-planted-") as tmp:
        root = Path(tmp)
        _copy_sources(lib, root)
        if bug is not None:
            apply(bug, root)
        objdir.mkdir(parents=True, exist_ok=True)
        objs = []
        for src, isa in build.sources(lib=LIBS[lib][0]):
            copy = root / src.relative_to(HERE)
            objs.append(_compile(cc, copy, flags + isa, root / "native" / "include", objdir))
        out.parent.mkdir(parents=True, exist_ok=True)
        build._run([*shlex.split(cc), *flags, "-shared", "-o", str(out), *map(str, objs), "-lm", "-lpthread"])
    return out


# ---------------------------------------------------------------- judging
class _StatusOnly:
    """A backend's loaders without their rule ids: how a runtime without ml_check_rule is judged."""

    def __init__(self, b):
        self._b = b

    def __getattr__(self, name):
        return getattr(self._b, name)

    def load(self, path):
        r = self._b.load(path)
        return type(r)(r.status, r.reason, None)

    def load_tokenizer(self, path, model_vocab=None):
        r = self._b.load_tokenizer(path, model_vocab)
        return type(r)(r.status, r.reason, None)


def judge(
    bug: Bug | None,
    lib_path: Path,
    work: runner.Workdir,
    areas: tuple[str, ...],
    keyword=None,
    status_only: bool = False,
) -> Verdict:
    """``status_only``: the loaders' rule ids withheld, so a loader bug must show in a status."""
    from mlconf.backends.native.library import LibraryBackend

    name = f"planted:{bug.id}" if bug else "planted:baseline"
    b = LibraryBackend(name, lib_path, isa="scalar")
    try:
        todo = cases.collect(areas, keyword)
        results = runner.run(todo, [_StatusOnly(b) if status_only else b], work)
    finally:
        b.close()
    failing = [r.case for r in results if r.outcome in records.FAILING]
    naming = [c for c in failing if bug and any(fnmatch.fnmatchcase(c, p) for p in bug.caught_by)]
    caught = bool(naming) if bug else not failing
    return Verdict(bug, caught, failing, naming, len(results))


def run_bug(
    bug: Bug, workdir: Path, work: runner.Workdir, objdir: Path | None = None, status_only: bool = False
) -> Verdict:
    lib = build_variant(bug, bug.lib, workdir / f"lib{bug.id}.so", objdir or workdir / "obj")
    return judge(bug, lib, work, bug.areas, bug.keyword, status_only)


def baseline(
    lib: str, areas: tuple[str, ...], workdir: Path, work: runner.Workdir, objdir: Path | None = None
) -> Verdict:
    path = build_variant(None, lib, workdir / f"lib{lib}-baseline.so", objdir or workdir / "obj")
    return judge(None, path, work, areas)


def describe(v: Verdict) -> str:
    if v.bug is None:
        return f"baseline: {v.ran} case runs, {len(v.failing)} failing" + (
            f" ({v.failing[:3]})" if v.failing else ""
        )
    if v.caught:
        return f"caught by {v.naming[0]}" + (f" and {len(v.failing) - 1} more" if len(v.failing) > 1 else "")
    if v.failing:
        some = ", ".join(v.failing[:3])
        return f"NOT NAMED: {len(v.failing)} failing ({some}), none matching {list(v.bug.caught_by)}"
    return f"MISSED: all {v.ran} case runs pass"


def compiler_ok() -> str:
    """Why variants cannot be built here ("" when they can)."""
    cc = shlex.split(build.default_cc())[0]
    if shutil.which(cc) is None:
        return f"no C compiler {cc!r}"
    try:
        subprocess.run([cc, "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"{cc} --version failed: {e}"
    return ""
