"""Must-pass lists (issue 37): per Krafla version, the case ids a runtime of that version must pass
in each capability it claims, with a fingerprint of what each case means.

specs/mustpass/<version>.txt (0.8.0, 0.9.0: released; current: the newest version, no
--target-version) holds one line per case, ``capability case_id fingerprint``, under a header of
``#`` lines; the file's SHA-256 is what a certification package records. A released list is frozen:
tests/test_mustpass.py fails when one of its cases leaves the suite or changes its fingerprint, and
a case added to the suite does not join it (it is run, but not required). The current list is a
generated table: the same test regenerates it and compares (``mlconf mustpass --write`` rewrites
it after a reviewed change).

A fingerprint is the first 16 hex digits of the SHA-256 of the case's canonical JSON: its id, area,
capability, comparison, expectation and parameters, files by the SHA-256 of their bytes, arrays by
dtype, shape and bytes, floats by their hex form, a generated fixture by its definition (base,
mutations, expected status, rule). The `spec` text, which only cites the row, is left out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from mlconf import specs

MUSTPASS_DIR = Path(specs.__file__).resolve().parent / "mustpass"
RELEASED = ("0.8.0", "0.9.0")  # frozen lists
CURRENT = "current"  # the newest version: regenerated with the suite
HEADER = "# mlconf must-pass list"


class MustPassError(ValueError):
    """A must-pass list that cannot be read or used; the message names the file and line."""


@cache
def _file_sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _canon(v: Any) -> Any:
    if isinstance(v, Path):
        return {"file_sha256": _file_sha(str(v.resolve()))} if v.is_file() else {"path": v.as_posix()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _canon(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, list | tuple):
        if v and all(isinstance(p, bytes | bytearray) for p in v):
            return {"bytes_sha256": hashlib.sha256(b"".join(v)).hexdigest(), "parts": [len(p) for p in v]}
        return [_canon(x) for x in v]
    if isinstance(v, bytes | bytearray):
        return {"bytes_sha256": hashlib.sha256(bytes(v)).hexdigest()}
    if isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        return {
            "dtype": a.dtype.str.lstrip("<>|="),
            "shape": list(a.shape),
            "sha256": hashlib.sha256(b).hexdigest(),
        }
    if isinstance(v, np.generic):
        return _canon(v.item())
    if isinstance(v, float):
        return {"float": v.hex()}
    if v is None or isinstance(v, bool | int | str):
        return v
    return {"repr": repr(v)}


def fingerprint(case) -> str:
    """What a case means, as 16 hex digits (see the module doc)."""
    doc = {
        "id": case.id,
        "area": case.area,
        "capability": case.capability,
        "compare": case.compare,
        "expected": _canon(case.expected),
        "params": _canon(case.params),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _target(version: str):
    return None if version == CURRENT else specs.parse_version(version)


def generate(version: str) -> list[tuple[str, str, str]]:
    """(capability, case id, fingerprint) of every case of the suite for a runtime of ``version``
    ("current": the newest), by capability then id."""
    from mlconf import cases

    rows = [(c.capability, c.id, fingerprint(c)) for c in cases.collect(target_version=_target(version))]
    return sorted(rows)


def text(version: str, rows: list[tuple[str, str, str]]) -> str:
    state = (
        "released: frozen" if version in RELEASED else "generated with the suite (mlconf mustpass --write)"
    )
    head = [
        f"{HEADER}: Krafla {version if version != CURRENT else 'newest (no --target-version)'} ({state})",
        "# capability case-id fingerprint (mlconf/mustpass.py); a runtime claiming a capability must pass",
        "# every case of it here, or carry a recorded expectation (mlconf run --expect)",
    ]
    return "\n".join(head + [" ".join(r) for r in rows]) + "\n"


def path(version: str) -> Path:
    return MUSTPASS_DIR / f"{version}.txt"


def versions() -> list[str]:
    return sorted(p.stem for p in MUSTPASS_DIR.glob("*.txt"))


def parse(data: str, where: str) -> list[tuple[str, str, str]]:
    """The rows of a must-pass list's text; MustPassError naming ``where`` and the line."""
    rows, seen = [], set()
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3 or len(parts[2]) != 16 or any(c not in "0123456789abcdef" for c in parts[2]):
            raise MustPassError(f"{where}:{n}: expected 'capability case-id fingerprint' (16 hex digits)")
        if parts[1] in seen:
            raise MustPassError(f"{where}:{n}: case {parts[1]} listed twice")
        seen.add(parts[1])
        rows.append((parts[0], parts[1], parts[2]))
    if not rows:
        raise MustPassError(f"{where}: no case listed")
    return rows


def load(version: str) -> tuple[list[tuple[str, str, str]], str]:
    """(rows, sha256 of the file) of the list of ``version``; MustPassError if there is none."""
    p = path(version)
    if not p.is_file():
        raise MustPassError(
            f"--version {version}: no must-pass list (specs/mustpass has {', '.join(versions())})"
        )
    data = p.read_bytes()
    return parse(data.decode("utf-8"), str(p)), hashlib.sha256(data).hexdigest()


def drift(version: str) -> list[str]:
    """How the suite departs from the list of ``version``: cases of the list gone or changed
    (released and current), and for the current list also cases not in it. Empty: in step."""
    listed, _ = load(version)
    now = {cid: (cap, fp) for cap, cid, fp in generate(version)}
    out = []
    for cap, cid, fp in listed:
        if cid not in now:
            out.append(f"{cid}: in the {version} list, no longer in the suite")
        elif now[cid] != (cap, fp):
            out.append(f"{cid}: changed meaning (listed {cap} {fp}, the suite has {' '.join(now[cid])})")
    if version not in RELEASED:
        ids = {cid for _, cid, _ in listed}
        out += [f"{cid}: in the suite, not in the {version} list" for cid in sorted(set(now) - ids)]
    return out
