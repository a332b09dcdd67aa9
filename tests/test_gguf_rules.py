"""specs/gguf.yaml against its oracles and its two readers: the type table is gguf-py's, the C
reader's table is the spec's, every rule id the readers raise is a spec rule (and each rule is
raised), the bases read the same through gguf-py, and memory stays within the spec's bound
(decision gguf.memory) on every fixture. The fixtures themselves are the bitnet/gguf cases of
the suite (conformance/suite/test_bitnet.py), judged by status and rule on every backend."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import cffi
import numpy as np
import pytest

from mlconf import specs
from mlconf.backends.bitnet import LIBRARY
from mlconf.backends.native import abi
from mlconf.backends.reference import gguf_file, gguf_model

SPEC = specs.load("gguf")
RULES = [r["id"] for r in SPEC["rules"]]
SRC = Path(__file__).resolve().parents[1] / "backends"


def test_the_type_table_is_gguf_pys():
    from gguf.constants import GGML_QUANT_SIZES

    want = {int(t): [t.name, *GGML_QUANT_SIZES[t]] for t in GGML_QUANT_SIZES}
    want[36] = ["I2_S", 4, 1]  # bitnet.cpp's (specs/i2s.yaml): not in stock gguf-py
    want.setdefault(42, ["Q2_0", 64, 18])  # ggml's newest (llama-cpp-python 0.3.36), after gguf-py 0.19.0
    assert {int(k): v for k, v in SPEC["types"].items()} == want


@pytest.fixture(scope="module")
def clib():
    if not LIBRARY.exists():
        pytest.skip("libmlbitnet is not built")
    ffi = cffi.FFI()
    ffi.cdef(abi.CDEF + "int mlbitnet_test_type_block(uint32_t type, uint32_t *block, uint32_t *bytes);")
    return ffi, ffi.dlopen(str(LIBRARY))


def test_the_c_readers_type_table_is_the_specs(clib):
    ffi, lib = clib
    block, size = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    got = {}
    for t in [*range(64), 0xFFFF, 0xFFFFFFFF]:
        if lib.mlbitnet_test_type_block(t, block, size):
            got[t] = (block[0], size[0])
    assert got == {int(k): (v[1], v[2]) for k, v in SPEC["types"].items()}


def _quoted_rules(*files: Path) -> set[str]:
    text = "".join(f.read_text() for f in files)
    return {r for r in re.findall(r'"((?:gguf|bitnet)\.[a-z_.0-9]+)"', text) if not r.endswith((".h", ".c"))}


def test_the_readers_raise_exactly_the_specs_rules():
    """A typo in a rule id, or a rule one reader never raises, is caught here (the cases catch a
    rule raised in the wrong place)."""
    c = _quoted_rules(SRC / "bitnet/src/gguf.c", SRC / "bitnet/src/embed.c")
    py = _quoted_rules(SRC / "reference/gguf_file.py", SRC / "reference/gguf_model.py")
    assert c == set(RULES), c ^ set(RULES)
    assert py == set(RULES), py ^ set(RULES)
    assert len(RULES) == len(set(RULES))
    for r in SPEC["rules"]:
        assert r["cases"], r["id"]


def test_the_named_classes_have_fixtures():
    classes = " ".join(c.get("class", "") for r in SPEC["rules"] for c in r["cases"])
    for named in (
        "test-gguf.cpp",
        "ggml PR 709",
        "GHSA-vgg9-87g3-85w8",
        "bypass",
        "exabytes",
        "n_dims > 8",
        "alignment 0",
        "RecursionError",
        "overlapping tensors",
        "integer wrap",
    ):
        assert named in classes, named


def test_the_bases_read_the_same_through_gguf_py(generated):
    """gguf-py (an independent reader) sees the fixture writer's bases as gguf_file does."""
    import gguf

    from mlconf.tools.convert_bitnet import register_i2s

    register_i2s()
    out, _ = generated
    for name in SPEC["bases"]:
        path = out / f"gguf/valid/{name}.gguf"
        g = gguf_file.parse(path.read_bytes())
        r = gguf.GGUFReader(path)
        assert [
            (t.name, int(t.tensor_type), [int(d) for d in t.shape], int(t.data_offset)) for t in r.tensors
        ] == [(t.text, t.type, t.dims, g.data_offset + t.offset) for t in g.tensors]
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert keys == [kv.name for kv in g.kvs]
        assert (
            r.fields["general.architecture"].contents()
            == gguf_file.scalar(g.kv("general.architecture")).decode()
        )


def test_the_bases_embed_on_the_reference(generated):
    from mlconf.backends.reference import ReferenceBackend

    out, _ = generated
    for name in SPEC["bases"]:
        s = ReferenceBackend().open_embedder(str(out / f"gguf/valid/{name}.gguf"))
        v = s.embed(np.array([1, 2, 3]), "mean", True)
        assert v.shape == (s.dim,) and np.isfinite(v).all()


BOUND_PER_BYTE, BOUND_EXTRA = 16, 1 << 20  # decision gguf.memory


def _driver(tmp: Path, flags: list[str]) -> Path:
    """backends/bitnet/tests/gguf_main.c with the library's sources (tests/test_bitnet_kernels.py's
    driver sources, the SIMD files with their ISA flags)."""
    from tests.test_bitnet_kernels import X86, X86_TABLES, _compile, driver_sources

    srcs = [
        (SRC / "bitnet/tests/gguf_main.c" if p.name == "i2s_main.c" else p, f)
        for p, f in driver_sources(X86_TABLES if X86 else [], flags)
    ]
    return _compile("gcc", tmp / "gguf_main", srcs, flags)


def _run_driver(exe: Path, out: Path, fx: list, limit: list[str]) -> list[tuple[str, str]]:
    """(fixture, what went wrong) for every GGUF fixture whose check or loads miss the spec."""
    files = [f for f in fx if f.file.startswith("gguf/")]
    r = subprocess.run(
        [str(exe), *limit, *(str(out / f.file) for f in files)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(files), r.stdout[-2000:]
    wrong = []
    for f, line in zip(files, lines, strict=True):
        want = f"{SPEC['statuses'][f.expected]} {f.rule or '-'}"
        loads = line.split()[2:]
        if not line.startswith(want + " ") or "5" in loads or line.startswith("died"):
            wrong.append((f.file, line))
    return wrong


def test_memory_stays_within_the_bound_on_every_fixture(generated, tmp_path):
    """Each GGUF fixture checked and loaded in each reading in a fresh process whose data limit
    leaves 16 bytes per byte of the file plus 1 MiB: a reader that sized a table by a count, or
    copied more than the bound, gets ML_E_NOMEM (or dies) instead of the spec's status and rule.
    The control: with no room the float reading of the student (its I2_S dequantized, 16 bytes
    per packed byte) does not fit, so the limit is felt."""
    out, fx = generated
    exe = _driver(tmp_path, [])
    assert not _run_driver(exe, out, fx, ["--limit", str(BOUND_PER_BYTE), str(BOUND_EXTRA)])
    r = subprocess.run(
        [str(exe), "--limit", "0", "0", str(out / "gguf/valid/student.gguf")], capture_output=True, text=True
    )
    assert r.stdout.split()[3] == "5", r.stdout


@pytest.mark.slow
def test_no_fixture_trips_the_sanitizers(generated, tmp_path):
    """The same driver under AddressSanitizer + UBSan (-fno-sanitize-recover): every fixture gives
    the spec's status and rule, with no report."""
    from tests.test_bitnet_kernels import SANITIZER_FLAGS

    out, fx = generated
    assert not _run_driver(_driver(tmp_path, SANITIZER_FLAGS), out, fx, [])


def test_the_reference_reader_has_no_recursion_on_deep_nesting(generated):
    """gguf-py recurses once per array level (RecursionError at depth 10000); the reference
    measures the nesting with a stack and stops at the spec's depth."""
    out, _ = generated
    r = gguf_model.load(out / "gguf/malformed/gguf.nesting/depth_10000.gguf")
    assert (r.status, r.rule) == ("ML_E_FORMAT", "gguf.nesting")
