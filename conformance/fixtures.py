"""The fixture generator: valid base models (specs/mlb_fixtures.yaml) and every malformed or
edge case of specs/mlb_errors.yaml as a mutation of one, written with tools/mlb.py.

Deterministic: the same mlconf version writes the same bytes (weights from seeded generators).
``generate(outdir)`` writes everything plus manifest.json for runtimes that cannot run Python.
``cached()`` is the set `mlconf run` reads: generated once into a per-user cache folder named by
the hash of everything the bytes depend on, and checked file by file before each reuse.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import struct
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mlconf import byte_ops, gguf_fixtures, mlt_fixtures, specs, versions
from mlconf.backends.reference import layout
from mlconf.tools import mlb
from mlconf.tools.files import atomic_write, replacing


@dataclass
class Fixture:
    """One file of the generated set and the outcome a loader must give."""

    file: str  # relative to the output folder
    kind: str  # valid | malformed | accepted
    expected: str  # ML_OK | ML_E_IO | ML_E_FORMAT | ML_E_SHAPE
    covers: list[str] = field(default_factory=list)
    rule: str = ""  # malformed: the rule id of specs/mlb_errors.yaml it breaks
    base: str = ""
    mutate: list = field(default_factory=list)
    model_vocab: int | None = None  # tokenizer fixtures: the model vocab a loader is given
    imatrix: str | None = None  # valid imatrix bases: the MLI1 file written beside it, which
    # its Q4_0 matrices were quantized with
    # .mlb files, set by generate(): the oldest Krafla version that reads the file as `expected`
    # says (None: every version), and the status every older version must give instead
    min_version: str | None = None
    expected_older: str | None = None


# ---------------------------------------------------------------- valid bases
def base_specs() -> dict[str, dict]:
    spec = specs.load("mlb_fixtures")
    out = {}
    for f in spec["fixtures"]:
        header = {**spec["defaults"]["header"], **f.get("header", {})}
        out[f["name"]] = {**f, "header": header, "q4_rule": f.get("q4_rule", spec["defaults"]["q4_rule"])}
    return out


def _seed(name: str, spec: dict) -> int:
    return spec.get("seed", zlib.crc32(name.encode()))


def random_weights(h: dict, flags: list[int] | None, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every array of header ``h`` drawn as specs/mlb_fixtures.yaml says (the fixtures', the fuzzer's
    and the tests' random models)."""
    out = {}
    for name, (fmt, shape) in mlb.expected_arrays(h, flags).items():
        leaf = name.rsplit(".", 1)[-1]
        if fmt != "F32":
            x = rng.normal(0, 0.05, shape)
        elif leaf.endswith("norm"):
            x = 1 + rng.normal(0, 0.1, shape)
        elif leaf == "lconv":
            x = rng.normal(0, 0.3, shape)
        elif leaf == "dt_bias":
            x = rng.normal(0, 0.5, shape)
        elif leaf == "A_log":
            x = rng.uniform(-1, 1, shape)
        else:
            x = rng.normal(0, 0.02, shape)
        out[name] = x.astype(np.float32)
    return out


def _imatrix(h: dict, rng: np.random.Generator) -> mlb.Imatrix:
    d = layout.derive(h)
    q_dim = 0 if d["q_dim"] == h["dim"] else d["q_dim"]
    im = mlb.Imatrix(h["n_layers"], h["dim"], h["hidden_dim"], q_dim, 64, 64, np.empty(0))
    im.sums = rng.gamma(0.5, 4.0, im.expected_len()) * 64
    return im


def write_base(name: str, path: Path) -> None:
    spec = base_specs()[name]
    rng = np.random.default_rng(_seed(name, spec))
    h = mlb.full_header(spec["header"])
    flags = spec.get("flags")
    arrays = random_weights(h, flags, rng)
    im = None
    if spec.get("imatrix"):
        im = _imatrix(h, rng)
        mlb.write_imatrix(path.with_suffix(".mli"), im)
    mlb.write(path, h, arrays, flags=flags, q4_rule=spec["q4_rule"], imatrix=im)


# ---------------------------------------------------------------- mutations
def _table(data: bytes) -> list[layout.Array]:
    h = layout.parse_header(data)
    flags = data[256 : 256 + h["n_layers"]] if h["layer_flags"] else None
    return list(layout.plan(h, flags))


def _array(table: list[layout.Array], name: str) -> layout.Array:
    for a in table:
        if a.name == name:
            return a
    raise KeyError(f"fixture has no array {name!r}")


def _pack_field(name: str, value) -> tuple[int, bytes]:
    f = next(f for f in specs.load("mlb_header")["fields"] if f["name"] == name)
    if f["type"] == "f32":
        return f["offset"], struct.pack("<f", float(value))
    return f["offset"], struct.pack("<I", int(value))


def mutate(data: bytes, ops: list[dict]) -> bytes:
    """Apply the mutations of a case (specs/mlb_errors.yaml header comment) to a file's bytes."""
    b = bytearray(data)
    table = _table(data)  # the base's layout: pokes address the arrays the base file has
    for op in ops:
        ((kind, arg),) = op.items()
        if kind == "set":
            for k, v in arg.items():
                off, raw = _pack_field(k, v)
                b[off : off + 4] = raw
        elif kind == "flags":
            for layer, v in arg.items():
                b[256 + int(layer)] = v
        elif kind == "poke":
            a = _array(table, arg["array"])
            n = math.prod(a.shape)
            i = arg["index"] % n
            size = np.dtype(a.dtype).itemsize
            raw = np.array([arg["value"]]).astype(a.dtype).tobytes()
            b[a.offset + i * size : a.offset + (i + 1) * size] = raw
        elif kind == "pad":
            a = _array(table, arg["after"])
            end = a.offset + a.nbytes
            raw = bytes.fromhex(arg["hex"])
            if layout.align(end) - end < len(raw):
                raise ValueError(f"array {a.name} has no padding to overwrite")
            b[end : end + len(raw)] = raw
        elif byte_ops.apply(b, kind, arg):
            continue
        elif kind == "strip_tail_padding":
            last = table[-1]
            del b[last.offset + last.nbytes :]
        elif kind == "path":
            continue  # handled by the writer of the case
        else:
            raise ValueError(f"unknown mutation {kind!r}")
    return bytes(b)


def head_bytes(f: Fixture) -> bytes:
    """The header and layer-flag bytes of a .mlb fixture, from its spec alone (nothing written):
    what versions.features reads, for deciding at collection time what a version can load."""
    spec = base_specs()[f.base]
    head = layout.pack_header(mlb.full_header(spec["header"])) + bytes(spec.get("flags") or [])
    return mutate(head, f.mutate)[: len(head)]


def _path_kind(ops: list[dict]) -> str | None:
    return next((op["path"] for op in ops if "path" in op), None)


# `path:` mutations: what stands at the case's path instead of a file (decision loader.special_files).
# Symlink targets are relative or fixed, so a set stays valid when its folder moves (the cache).
SPECIAL_PATHS = {
    "missing": "nothing",
    "directory": "an empty directory",
    "fifo": "a FIFO with no writer (os.mkfifo)",
    "char_device": "a symlink to /dev/null, a character device",
    "symlink_to_directory": "a symlink to its own folder (.)",
    "dangling_symlink": "a symlink to a name that does not exist",
}


def make_special(target: Path, kind: str) -> None:
    """Put ``kind`` (SPECIAL_PATHS) at ``target``, replacing whatever is there."""
    if kind not in SPECIAL_PATHS:
        raise ValueError(f"unknown path kind {kind!r}; known: {', '.join(SPECIAL_PATHS)}")
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if kind == "directory":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind != "missing":
        os.symlink(
            {
                "char_device": "/dev/null",
                "symlink_to_directory": os.curdir,
                "dangling_symlink": "no-such-file",
            }[kind],
            target,
        )


# ---------------------------------------------------------------- the whole set
def catalog() -> list[Fixture]:
    """Every fixture with its expected outcome, without writing anything."""
    out = [
        Fixture(
            f"valid/{n}.mlb",
            "valid",
            "ML_OK",
            list(s.get("covers", [])),
            base=n,
            imatrix=f"valid/{n}.mli" if s.get("imatrix") else None,
        )
        for n, s in base_specs().items()
    ]
    errors = specs.load("mlb_errors")
    for r in errors["rules"]:
        for c in r["cases"]:
            out.append(
                Fixture(
                    f"malformed/{r['id']}/{c['name']}.mlb",
                    "malformed",
                    r["status"],
                    [r.get("seed") or f"decision {r.get('decision')}"],
                    r["id"],
                    c["base"],
                    c["mutate"],
                )
            )
    for c in errors["accepted"]:
        out.append(
            Fixture(f"accepted/{c['name']}.mlb", "accepted", "ML_OK", [c["why"]], "", c["base"], c["mutate"])
        )
    return out + mlt_fixtures.catalog() + gguf_fixtures.catalog()


def generate(outdir: str | os.PathLike, only: set[str] | None = None) -> list[Fixture]:
    """Write the fixtures (all, or the files named in ``only``) and manifest.json."""
    out = Path(outdir)
    fixtures = [f for f in catalog() if only is None or f.file in only]
    bases: dict[str, bytes] = {}
    valid_dir = out / "valid"
    valid_dir.mkdir(parents=True, exist_ok=True)

    def base_bytes(name: str) -> bytes:
        if name not in bases:
            p = valid_dir / f"{name}.mlb"
            write_base(name, p)
            bases[name] = p.read_bytes()
        return bases[name]

    for f in fixtures:
        target = out / f.file
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.kind == "valid" and f.file.startswith("valid/"):
            base_bytes(f.base)
            continue
        pk = _path_kind(f.mutate)
        if pk is None and f.file.startswith(("tokenizer/", "gguf/")):
            own = mlt_fixtures if f.file.startswith("tokenizer/") else gguf_fixtures
            atomic_write(target, [own.content(f)])
            continue
        if pk is not None:
            make_special(target, pk)
            continue
        atomic_write(target, [mutate(base_bytes(f.base), f.mutate)])
    for f in fixtures:
        if f.file.endswith(".mlb"):
            _set_versions(f, versions.read_head(out / f.file))
    manifest = {
        "format": "mlconf fixtures v1",
        "spec": "MLB v1",
        "statuses": specs.load("mlb_errors")["statuses"],
        "fixtures": [asdict(f) for f in fixtures],
    }
    atomic_write(out / "manifest.json", [json.dumps(manifest, indent=1).encode()])
    return fixtures


def _set_versions(f: Fixture, head: bytes) -> None:
    """min_version and expected_older of a written .mlb (conformance/versions.py). One status
    for every version older than min_version is what the spec's rule order gives; checked here."""
    need = versions.file_version(head)
    if need is None:
        return
    older = {
        versions.expected(f.expected, f.rule, head, versions.older(v))[0]
        for v in versions.boundaries()
        if v <= need
    }
    if len(older) != 1:
        raise ValueError(f"{f.file}: the versions before {need} give different statuses {sorted(older)}")
    f.min_version, f.expected_older = specs.format_version(need), older.pop()


# ---------------------------------------------------------------- the cache of `mlconf run`
CACHE_ENV = "MLCONF_CACHE_DIR"  # the cache folder; "off": no cache (each run generates its own)
_HASHES = "hashes.json"  # in a cached set: file -> sha256, or what stands there (_state)


def source_key() -> str:
    """sha256 of what the generated bytes depend on: the versions of mlconf and NumPy and every
    Python source and spec file of the installed package (any code change makes a new set)."""
    import importlib

    import mlconf

    h = hashlib.sha256(f"mlconf {mlconf.__version__} numpy {np.__version__}".encode())
    for pkg in ("mlconf", "mlconf.backends", "mlconf.tools", "mlconf.specs"):
        root = Path(importlib.import_module(pkg).__file__).parent
        for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file()):
            h.update(f"{pkg}/{f.relative_to(root).as_posix()}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def cache_root() -> Path | None:
    v = os.environ.get(CACHE_ENV)
    if v == "off":
        return None
    if v:
        return Path(v)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlconf" / "fixtures"


def _state(path: Path) -> str:
    """A regular file's sha256; else what stands there, read without opening it (a FIFO must
    not block): "missing", "directory", "fifo", "symlink:TARGET"."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return f"symlink:{os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISFIFO(st.st_mode):
        return "fifo"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(folder: Path) -> bool:
    """Whether every file of a cached set is still as it was generated (a runtime under test
    could have written to one; a stale or damaged set must never judge a run)."""
    try:
        want = json.loads((folder / _HASHES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(want, dict) and all(_state(folder / f) == h for f, h in want.items())


def cached() -> Path | None:
    """The folder of the whole generated set in the cache (generated now if absent or damaged),
    or None when there is no usable cache folder (then the caller generates its own)."""
    root = cache_root()
    if root is None:
        return None
    final = root / source_key()[:32]
    if _intact(final):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        if final.exists() and not _intact(final):
            shutil.rmtree(final, ignore_errors=True)
        # one rename: a concurrent run sees all of the set or nothing
        with replacing(final, folder=True) as tmp:
            made = generate(tmp)
            hashes = {p: _state(tmp / p) for f in made for p in (f.file, f.imatrix) if p}
            (tmp / _HASHES).write_text(json.dumps(hashes, indent=0, sort_keys=True), encoding="utf-8")
    except OSError:
        # another run's complete set got there first (the rename finds a full folder), or no
        # usable cache folder: then the caller generates its own
        return final if _intact(final) else None
    return final
