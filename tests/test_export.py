"""conformance/export.py (`mlconf fixtures OUT`): every case of `mlconf run` as files and a manifest
entry, valid against specs/fixtures_manifest.schema.json, every written file listed, the expected
outputs those the runner compares with, and the same bytes whichever native table is in use."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from mlconf import cases, export, fixtures
from mlconf.specs import SPEC_DIR

DT = {"i8": "<i1", "u8": "<u1", "i32": "<i4", "u16": "<u2", "f32": "<f4"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("export")
    return out, export.export(out)


def _array(out: Path, a: dict) -> np.ndarray:
    return np.fromfile(out / a["file"], DT[a["dtype"]]).reshape(a["shape"])


def test_manifest_follows_its_schema(exported):
    _, m = exported
    schema = json.loads((SPEC_DIR / "fixtures_manifest.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(m, schema)
    bad = dict(m, cases=[{**m["cases"][0], "op": "ml_frobnicate"}])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_every_case_of_the_run_once(exported):
    _, m = exported
    assert [c["id"] for c in m["cases"]] == [c.id for c in cases.collect()]
    by = {c.id: c for c in cases.collect()}
    for e in m["cases"]:
        assert e["area"] == by[e["id"]].area and e["spec"] == by[e["id"]].spec


def test_every_written_file_is_listed_and_every_listed_one_written(exported):
    out, m = exported
    listed = {"manifest.json"}
    listed |= {
        p
        for f in m["fixtures"]
        for p in (f["file"], f["imatrix"])
        if p and {"path": "missing"} not in f["mutate"]
    }
    for c in m["cases"]:
        for f in [*c["inputs"].values(), *c["expect"].get("outputs", {}).values()]:
            if f.get("special") != "missing":
                listed.add(f["file"])
    written = set()
    for folder, dirs, names in os.walk(out):
        for n in dirs + names:
            p = Path(folder) / n
            if p.is_dir() and not p.is_symlink() and p.relative_to(out).as_posix() not in listed:
                continue  # a folder of files (a listed one is a `directory` special case)
            written.add(p.relative_to(out).as_posix())
    assert written == listed
    for c in m["cases"]:
        for f in [*c["inputs"].values(), *c["expect"].get("outputs", {}).values()]:
            if "dtype" in f:
                assert (out / f["file"]).stat().st_size == np.dtype(DT[f["dtype"]]).itemsize * int(
                    np.prod(f["shape"])
                )


def test_expectations_are_the_cases(exported):
    """The outputs a case must give are the catalogue's expectations, byte for byte, and the inputs
    its parameters: checked on one case of each kind."""
    out, m = exported
    by = {c.id: c for c in cases.collect()}
    seen = set()
    for e in m["cases"]:
        c = by[e["id"]]
        kind = (e["op"], e["expect"]["compare"], e["expect"].get("from"))
        if kind in seen:
            continue
        seen.add(kind)
        x = e["expect"]
        if x["compare"] == "status":
            assert x["status"] == c.expected
        elif x["compare"] == "ids":
            assert _array(out, x["outputs"]["ids"]).tolist() == list(c.expected)
            assert (out / e["inputs"]["text"]["file"]).read_bytes() == c.params["text"].encode(
                "utf-8", "surrogatepass"
            )
        elif e["op"] == "ml_tok_decode":
            assert _array(out, x["outputs"]["bytes"]).tobytes() == c.expected
            assert _array(out, e["inputs"]["ids"]).tolist() == list(c.params["ids"])
        elif e["op"].startswith("ml_quantize") and x["compare"] == "bit-exact":
            q, d = (_array(out, a).tobytes() for a in x["outputs"].values())
            assert (q, d) == c.expected
            assert np.array_equal(
                _array(out, e["inputs"]["x"]).reshape(-1), np.asarray(c.params["x"]).reshape(-1)
            )
        elif x.get("from") == "oracle":
            (got,) = (_array(out, a) for a in x["outputs"].values())
            want = getattr(c.expected, "logits", c.expected)
            assert got.tobytes() == np.asarray(want, np.float32).tobytes()
            assert np.array_equal(_array(out, e["inputs"]["tokens"]), np.asarray(c.params["tokens"]))
        elif x["compare"] == "toleranced":
            assert x["tolerance"]["name"] == c.params["tolerance"]
    assert len(seen) >= 15, seen


def test_tokenizer_cases_read_their_own_files(exported):
    """Every encode case has a decode case of the same ids but the BOS, and the duplicate-merge
    cases read a .mlt listing each merge of the golden's twice."""
    from mlconf.tools import mlt

    out, m = exported
    tok = {e["id"]: e for e in m["cases"] if e["op"] in ("ml_tok_encode", "ml_tok_decode")}
    for cid, e in tok.items():
        if not cid.startswith("tokenizer/decode/"):
            continue
        enc = tok[cid.replace("/decode/", "/encode/")]
        assert e["inputs"]["tokenizer"] == enc["inputs"]["tokenizer"]
        ids = _array(out, enc["expect"]["outputs"]["ids"]).tolist()
        assert _array(out, e["inputs"]["ids"]).tolist() in (ids, ids[1:])
    dup = [e for cid, e in tok.items() if "_duplicate_merges/" in cid]
    assert {e["id"].split("/")[2] for e in dup} == {f"{n}_duplicate_merges" for n in cases.DUPLICATE_MERGES}
    for e in dup:
        plain = tok[e["id"].replace("_duplicate_merges/", "/")]
        twice, once = (mlt.read(out / x["inputs"]["tokenizer"]["file"]) for x in (e, plain))
        assert twice.merges == [*reversed(once.merges), *once.merges] and twice.tokens == once.tokens
        assert e["expect"]["outputs"]["ids"] != plain["expect"]["outputs"]["ids"]  # its own file
        assert (
            _array(out, e["expect"]["outputs"]["ids"]).tolist()
            == _array(out, plain["expect"]["outputs"]["ids"]).tolist()
        )


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for folder, dirs, names in sorted(os.walk(root)):
        for n in sorted(dirs + names):
            p = Path(folder) / n
            h.update(p.relative_to(root).as_posix().encode() + fixtures._state(p).__repr__().encode())
    return h.hexdigest()


def test_a_second_export_is_the_same_bytes(exported, tmp_path):
    """Deterministic: the same files with the same bytes (special files the same kind). The export
    runs no native code (its expectations are the catalogue's or the reference backend's), so the
    native table this machine picks cannot enter it (`native:scalar` or `native`)."""
    out, _ = exported
    again = tmp_path / "again"
    again.mkdir()
    export.export(again)
    assert _digest(again) == _digest(out)


@pytest.mark.slow
def test_same_bytes_whichever_loops_numpy_and_openblas_take(exported, tmp_path, dispatch_variants):
    """The reference's outputs (the vs_reference expectations) are the same bits when NumPy and
    OpenBLAS take another host's loops and sgemm kernels (backends/reference/portable.py); with
    NumPy's own exp and OpenBLAS's sgemm, 34 of them moved under OpenBLAS SkylakeX on AMD EPYC."""
    out, _ = exported
    picked = [v for v in dispatch_variants if v[0] in ("OpenBLAS SkylakeX", "OpenBLAS Prescott")]
    picked += [v for v in dispatch_variants if v[0].startswith("NumPy at its baseline")]
    print("variants:", [name for name, _ in picked])
    for i, (name, env) in enumerate(picked):
        again = tmp_path / f"v{i}"
        argv = [sys.executable, "-m", "mlconf.cli", "fixtures", str(again)]
        r = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert _digest(again) == _digest(out), name


def test_size_stays_small(exported):
    out, _ = exported
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"export: {total / 1e6:.1f} MB")
    assert total < 30e6
