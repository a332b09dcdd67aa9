"""The native loader (backends/native/src/loader.c) against the reference loader, and the native
Q8_0 quantizer (src/api.c) against the reference quantizer.

The library is built with backends/native/build.py into a temporary folder once per session and
loaded with cffi (ABI mode).
(1) every generated .mlb fixture: ml_check and ml_load give the manifest's status and a reason
    "PATH: ... [rule]" naming the rule the reference loader reports; loader.c names the rules of
    specs/mlb_errors.yaml in the spec's order;
(2) hypothesis: byte overwrites, truncations, appended bytes, u32 / f32 header values and layer
    flag bytes of the valid fixtures get the reference's status and rule;
(3) the body plan: the loaded model's pointers (backends/native/tests/loader_plan.c, compiled
    with loader.c and f16.c) sit at the offsets of layout.plan(), f16 scales converted exactly;
    f16 <-> f32 against NumPy;
(4) -m32: the 32-bit library through a 32-bit driver (backends/native/tests/loader_main.c) on
    every fixture, including the size-overflow cases, and on headers implying sizes beyond 2^32
    and 2^64;
(5) AddressSanitizer + UBSan: every fixture and hypothesis mutations through ml_check and
    ml_load/ml_free, leak detection on, no report allowed;
(6) ml_quantize_q8_0: bit-identical to quant.q8_0 (f32 and f16 scales) on the edge cases of
    specs/quant.yaml and random blocks; refusals are ML_E_ARG and write nothing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlconf import cases, specs
from mlconf.backends.native import abi
from mlconf.backends.reference import layout, loader, quant

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "backends" / "native"
ERRORS = specs.load("mlb_errors")
STATUS = {v: k for k, v in ERRORS["statuses"].items()}
STATUS |= {4: "ML_E_ARG", 5: "ML_E_NOMEM", 6: "ML_E_UNSUPPORTED"}
ML_OK, ML_E_IO, ML_E_ARG, ML_E_UNSUPPORTED = 0, 1, 4, 6
RULE = re.compile(r"\[([a-z0-9_.]+)\]$")
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
CDEF = abi.CDEF  # the ABI declarations, themselves checked against mlrt.h (test_native_backend)
U32_FIELDS = [(f["name"], f["offset"]) for f in specs.load("mlb_header")["fields"] if f["type"] == "u32"]
F32_FIELDS = [(f["name"], f["offset"]) for f in specs.load("mlb_header")["fields"] if f["type"] == "f32"]
HSET = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _build_module():
    spec = importlib.util.spec_from_file_location("mlrt_native_build", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Native:
    """The library's loader and quantizer with Python values in and out."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib
        self.buf = ffi.new("char[1024]")

    def _outcome(self, rc: int, path) -> tuple[str, str]:
        reason = self.ffi.string(self.buf).decode()
        assert reason.startswith(f"{path}: "), reason
        m = RULE.search(reason)
        return STATUS[rc], m.group(1) if m else ""

    def check(self, path) -> tuple[str, str]:
        return self._outcome(self.lib.ml_check(os.fsencode(path), self.buf, 1024), path)

    def load(self, path, ctx: int = 1, threads: int = 1) -> tuple[str, str]:
        out = self.ffi.new("ml_model **")
        rc = self.lib.ml_load(os.fsencode(path), ctx, threads, out, self.buf, 1024)
        assert (out[0] != self.ffi.NULL) == (rc == ML_OK)
        if rc == ML_OK:
            assert self.lib.ml_ctx(out[0]) == ctx
            self.lib.ml_free(out[0])
        return self._outcome(rc, path)

    def quantize(self, x: np.ndarray, f16: bool, fill: int = 0x5A) -> tuple[int, np.ndarray, np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        q = np.full(x.size, fill, dtype=np.uint8).view(np.int8)
        d = np.full(x.size // 32 * (2 if f16 else 4), fill, dtype=np.uint8)
        rc = self.lib.ml_quantize_q8_0(
            self.ffi.from_buffer("float[]", x),
            x.size,
            int(f16),
            self.ffi.from_buffer("int8_t[]", q),
            self.ffi.from_buffer(d),
        )
        return rc, q, d.view(np.float16 if f16 else np.float32)


def reference(path) -> tuple[str, str]:
    res = loader.load(path)
    return res.status, res.rule or ""


@pytest.fixture(scope="session")
def build_mod():
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the native backend needs a C compiler")
    return _build_module()


@pytest.fixture(scope="session")
def native(build_mod, tmp_path_factory) -> Native:
    cffi = pytest.importorskip("cffi")
    so = build_mod.build(tmp_path_factory.mktemp("mlrt") / "libmlrt.so")  # BuildError fails the tests
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return Native(ffi, ffi.dlopen(str(so)))


@pytest.fixture(scope="session")
def mlb_fixtures(generated) -> list[tuple[object, Path]]:
    out, fx = generated
    return [(f, out / f.file) for f in fx if f.file.endswith(".mlb")]


@pytest.fixture(scope="session")
def valid_files(mlb_fixtures) -> list[tuple[str, bytes]]:
    return [(f.file, p.read_bytes()) for f, p in mlb_fixtures if f.kind in ("valid", "accepted")]


# ---------------------------------------------------------------- (1) the generated fixtures
def test_every_fixture_gets_the_reference_status_and_rule(native, mlb_fixtures):
    wrong = []
    for f, path in mlb_fixtures:
        ref_status, ref_rule = reference(path)
        assert ref_status == f.expected, (f.file, ref_status)  # the reference itself: test_mutations.py
        expect = (f.expected, ref_rule)
        got_check, got_load = native.check(path), native.load(path)
        if got_check != expect or got_load != expect:
            wrong.append((f.file, expect, got_check, got_load))
    assert not wrong, "\n".join(map(str, wrong))
    assert {f.rule for f, _ in mlb_fixtures if f.kind == "malformed"} == {r["id"] for r in ERRORS["rules"]}


def test_loader_names_the_rules_in_spec_order():
    """Every rule of specs/mlb_errors.yaml appears in loader.c, first in the order the spec lists
    them (the C checks run top to bottom, so this is the precedence). io.open is util.h's
    ml_open_regular, which loader.c calls before any other check."""
    ids = [r["id"] for r in ERRORS["rules"]]
    text = "".join((NATIVE / "src" / f).read_text(encoding="utf-8") for f in ("util.h", "loader.c"))
    seen: list[str] = []
    for m in re.finditer(r'"((?:io|format|shape)\.[a-z0-9_.]+)"', text):
        if m.group(1) in ids and m.group(1) not in seen:
            seen.append(m.group(1))
    assert seen == ids


def test_load_arguments(native, mlb_fixtures, tmp_path):
    path = next(p for f, p in mlb_fixtures if f.file == "valid/q8_min.mlb")
    h = layout.parse_header(path.read_bytes())
    lib, ffi = native.lib, native.ffi
    out = ffi.new("ml_model **")
    for ctx, threads in ((h["max_seq"] + 1, 1), (-1, 1), (1, -1)):
        out[0] = ffi.cast("ml_model *", 1)
        assert lib.ml_load(os.fsencode(path), ctx, threads, out, ffi.NULL, 0) == ML_E_ARG
        assert out[0] == ffi.NULL
    assert lib.ml_load(ffi.NULL, 1, 1, out, ffi.NULL, 0) == ML_E_ARG
    assert lib.ml_load(os.fsencode(path), 1, 1, ffi.NULL, ffi.NULL, 0) == ML_E_ARG
    assert lib.ml_check(ffi.NULL, ffi.NULL, 0) == ML_E_ARG
    assert lib.ml_load(os.fsencode(path), 0, 0, out, ffi.NULL, 0) == ML_OK  # 0: max_seq, all cores
    assert (lib.ml_ctx(out[0]), lib.ml_vocab(out[0])) == (h["max_seq"], h["vocab"])
    lib.ml_reset(out[0])
    lib.ml_free(out[0])
    lib.ml_free(ffi.NULL)
    small = ffi.new("char[8]")  # a short reason buffer is truncated, still NUL-terminated
    assert lib.ml_check(os.fsencode(tmp_path / "missing.mlb"), small, 8) == ERRORS["statuses"]["ML_E_IO"]
    assert ffi.string(small) == os.fsencode(tmp_path)[:7]
    assert ffi.string(lib.ml_version()).startswith(b"mlrt ")


def test_missing_tokenizer_is_io_and_leaves_no_object(native, tmp_path):
    out = native.ffi.new("ml_tokenizer **")
    rc = native.lib.ml_tok_load(os.fsencode(tmp_path / "t.mlt"), 100, out, native.buf, 1024)
    assert rc == ML_E_IO
    assert out[0] == native.ffi.NULL
    assert str(tmp_path / "t.mlt") in native.ffi.string(native.buf).decode()


# ---------------------------------------------------------------- (2) damaged files
def _with_flags(files):
    return [(n, b) for n, b in files if layout.parse_header(b)["layer_flags"] == 1]


@st.composite
def damaged(draw, files: list[tuple[str, bytes]], kind: str) -> bytes:
    """A valid fixture with one kind of damage (the kinds of tests/test_mutations.py, plus flags)."""
    if kind == "flags":
        files = _with_flags(files)
    _, raw = draw(st.sampled_from(files), label="file")
    b = bytearray(raw)
    if kind == "bytes":
        header_only = draw(st.booleans(), label="header_only")
        for _ in range(draw(st.integers(1, 8), label="count")):
            i = draw(st.integers(0, min(len(b), 320) - 1 if header_only else len(b) - 1))
            b[i] = draw(st.sampled_from([0x00, 0x80, 0xFF]) | st.integers(0, 255))
    elif kind == "truncate":
        del b[draw(st.integers(0, len(b) - 1), label="length") :]
    elif kind == "append":
        b += draw(st.binary(min_size=1, max_size=300), label="tail")
    elif kind == "u32":
        for name, off in draw(st.lists(st.sampled_from(U32_FIELDS), min_size=1, max_size=6, unique=True)):
            v = draw(
                st.sampled_from([0, 1, 2, 3, 8, 2**31, 2**32 - 1, 65536, 65537, 2**24, 2**24 + 1])
                | st.integers(0, 2**32 - 1),
                label=name,
            )
            struct.pack_into("<I", b, off, v)
    elif kind == "f32":
        for name, off in draw(st.lists(st.sampled_from(F32_FIELDS), min_size=1, max_size=4, unique=True)):
            v = draw(
                st.sampled_from([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F800000])
                | st.integers(0, 2**32 - 1),
                label=name,
            )
            struct.pack_into("<I", b, off, v)
    elif kind == "flags":
        n = layout.parse_header(bytes(b))["n_layers"]
        for i in range(n):
            if draw(st.booleans()):
                b[256 + i] = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 8, 9, 0x10]) | st.integers(0, 255))
        if draw(st.booleans()):  # linear-attention fields that may now matter
            name, off = draw(st.sampled_from([f for f in U32_FIELDS if f[0].startswith("lin_")]))
            struct.pack_into("<I", b, off, draw(st.integers(0, 2**32 - 1)))
    else:
        raise ValueError(kind)
    return bytes(b)


KINDS = ["bytes", "truncate", "append", "u32", "f32", "flags"]


@pytest.mark.parametrize("kind", KINDS)
@HSET
@given(data=st.data())
def test_damaged_files_match_the_reference(native, valid_files, scratch, kind, data):
    p = scratch / f"native_{kind}.mlb"
    p.write_bytes(data.draw(damaged(valid_files, kind)))
    expect = reference(p)
    assert native.check(p) == expect
    assert native.load(p) == expect


# ---------------------------------------------------------------- (3) the body plan
@pytest.fixture(scope="session")
def hooks(build_mod, tmp_path_factory):
    cffi = pytest.importorskip("cffi")
    out = tmp_path_factory.mktemp("plan") / "libplan.so"
    src = NATIVE / "src"
    cmd = [
        "gcc",
        *CFLAGS,
        "-fPIC",
        "-shared",
        "-I",
        str(NATIVE / "include"),
        "-I",
        str(src),
        "-o",
        str(out),
        str(NATIVE / "tests" / "loader_plan.c"),
        str(src / "loader.c"),
        str(src / "f16.c"),
        "-lm",
    ]
    r = subprocess.run(cmd, capture_output=True, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    ffi = cffi.FFI()
    ffi.cdef("""int plan_dump(const char *path, char *buf, size_t cap, float *scales, size_t scales_cap,
                              size_t *n_scales);
                void plan_f16_to_f32(const uint16_t *h, float *out, size_t n);
                void plan_f32_to_f16(const float *f, uint16_t *out, size_t n);""")
    return ffi, ffi.dlopen(str(out))


def test_model_points_at_the_reference_layout(hooks, mlb_fixtures):
    ffi, lib = hooks
    checked = 0
    for f, path in mlb_fixtures:
        if f.kind not in ("valid", "accepted"):
            continue
        data = path.read_bytes()
        h = layout.parse_header(data)
        flags = data[256 : 256 + h["n_layers"]] if h["layer_flags"] else None
        plan = list(layout.plan(h, flags))
        buf, scales, n = ffi.new("char[]", 1 << 20), np.zeros(1 << 20, np.float32), ffi.new("size_t *")
        pscales = ffi.from_buffer("float[]", scales)
        rc = lib.plan_dump(os.fsencode(path), buf, 1 << 20, pscales, scales.size, n)
        assert rc == 0, f.file
        lines = ffi.string(buf).decode().splitlines()
        derived = layout.derive(h)
        linear = flags is not None and any(b & 8 for b in flags)
        want = [derived[k] for k in ("head_dim", "q_dim", "kv_dim", "rot_dim")]
        want += [derived["lin_qkv"], derived["lin_v_width"]] if linear else [0, 0]
        assert lines[0].split()[1:] == [str(v) for v in want], f.file
        got = [ln.split() for ln in lines[1:]]
        layer_flags = {ln[0]: int(ln[1]) for ln in got if ln[0].endswith(".flags")}
        assert layer_flags == {f"layers.{i}.flags": (flags[i] if flags else 0) for i in range(h["n_layers"])}
        arrays = [ln for ln in got if not ln[0].endswith(".flags") and ln[0] != "wcls"]
        if h["shared_classifier"]:
            assert ["wcls", "shared", "1"] in got, f.file
        expect = [a for a in plan if a.name != "layer_flags"]
        assert [ln[0] for ln in arrays] == [a.name for a in expect], f.file
        next_scale = 0
        for ln, a in zip(arrays, expect, strict=True):
            assert ln[1] == a.fmt, (f.file, a.name)
            if a.part == "d":  # the matrix's rows and columns: its d array holds rows x cols/32
                assert (int(ln[2]), int(ln[3]) // 32) == a.shape, (f.file, a.name)
            if a.part == "d" and h["scale_f16"]:
                assert ln[4] == f"S{next_scale}", (f.file, a.name)  # converted in file order, no gaps
                want16 = np.frombuffer(data, "<f2", a.nbytes // 2, a.offset).astype(np.float32)
                conv = scales[next_scale : next_scale + want16.size]
                assert np.array_equal(conv.view(np.uint32), want16.view(np.uint32)), (f.file, a.name)
                next_scale += want16.size
            else:
                assert int(ln[4]) == a.offset, (f.file, a.name)
        assert n[0] == next_scale
        checked += 1
    assert checked >= 20


def test_f16_conversions_match_numpy(hooks):
    ffi, lib = hooks
    h = np.arange(65536, dtype=np.uint16)
    f = np.empty(h.size, np.float32)
    lib.plan_f16_to_f32(ffi.from_buffer("uint16_t[]", h), ffi.from_buffer("float[]", f), h.size)
    assert np.array_equal(f.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))
    # f32 -> f16: every f16 value, the midpoints between neighbours and one f32 ulp either side
    # (ties to even, the subnormal and overflow boundaries), the NaN payloads, and random bits.
    fin = h.view(np.float16).astype(np.float32)
    fin = fin[np.isfinite(fin)].astype(np.float64)
    fin = np.unique(fin)
    mids = ((fin[:-1] + fin[1:]) / 2).astype(np.float32)
    bits = np.concatenate([fin.astype(np.float32).view(np.uint32), mids.view(np.uint32)])
    edges = np.array(
        [0x477FEFFF, 0x477FF000, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7F802000, 0x33000000, 0x33000001],
        np.uint32,
    )
    rand = np.random.default_rng(7).integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([bits, bits - 1, bits + 1, edges])
    bits = np.concatenate([bits, bits ^ np.uint32(0x80000000), rand])
    x = bits.view(np.float32)
    out = np.empty(x.size, np.uint16)
    lib.plan_f32_to_f16(ffi.from_buffer("float[]", x), ffi.from_buffer("uint16_t[]", out), x.size)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, [(hex(bits[i]), hex(want[i]), hex(out[i])) for i in bad[:5]]


# ---------------------------------------------------------------- (4) and (5): driver programs
def _driver(tmp: Path, so: Path, flags: list[str]) -> Path:
    exe = tmp / "loader_main"
    cmd = [
        "gcc",
        *CFLAGS,
        *flags,
        "-I",
        str(NATIVE / "include"),
        str(NATIVE / "tests" / "loader_main.c"),
        str(so),
        f"-Wl,-rpath,{so.parent}",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, encoding="utf-8")
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return exe


def _run_driver(exe: Path, paths: list[Path], env: dict | None = None) -> tuple[list[tuple], str]:
    """[(check status, load status, rule)] per path, and stderr."""
    r = subprocess.run(
        [str(exe)],
        input="".join(f"{p}\n" for p in paths),
        capture_output=True,
        encoding="utf-8",
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, f"driver exit {r.returncode}\n{r.stderr[-4000:]}"
    out = []
    for line in r.stdout.splitlines():
        check, load, reason = line.split("\t", 2)
        m = RULE.search(reason)
        out.append((STATUS.get(int(check), check), STATUS.get(int(load), load), m.group(1) if m else ""))
    assert len(out) == len(paths)
    return out, r.stderr


def _compare(paths: list[Path], got: list[tuple[str, str, str]]) -> list:
    wrong = []
    for p, (check, load, rule) in zip(paths, got, strict=True):
        status, ref_rule = reference(p)
        if (check, load, rule) != (status, status, ref_rule):
            wrong.append((str(p), (status, ref_rule), (check, load, rule)))
    return wrong


def _huge_headers(valid_files, folder: Path) -> list[Path]:
    """Headers implying sizes beyond 2^32 (a 32-bit size_t) and 2^64, and a real body."""
    base = dict(valid_files)
    cases_ = {
        "q8_vocab_dim": ("valid/q8_min.mlb", {"vocab": 2**24, "dim": 65536}),
        "q8_everything": (
            "valid/q8_min.mlb",
            {
                "vocab": 2**24,
                "dim": 65536,
                "hidden_dim": 65536,
                "n_layers": 65536,
                "n_heads": 2048,
                "n_kv_heads": 2048,
            },
        ),
        "q8_4gib_exactly": ("valid/q8_min.mlb", {"vocab": 2**16, "dim": 65536}),
        "linear_all_ones": (
            "valid/qwen35.mlb",
            {
                "lin_k_heads": 0xFFFFFFFC,
                "lin_v_heads": 0xFFFFFFFC,
                "lin_k_dim": 0xFFFFFFFF,
                "lin_v_dim": 0xFFFFFFF8,
                "lin_conv": 0xFFFFFFFF,
            },
        ),
        "linear_conv_2_32": ("valid/qwen35.mlb", {"lin_conv": 0xFFFFFFFF}),
    }
    out = []
    offsets = dict(U32_FIELDS)
    for name, (src, fields) in cases_.items():
        b = bytearray(base[src])
        for k, v in fields.items():
            struct.pack_into("<I", b, offsets[k], v)
        p = folder / f"{name}.mlb"
        p.write_bytes(bytes(b))
        out.append(p)
    return out


@pytest.fixture(scope="session")
def m32_driver(build_mod, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("m32")
    probe = tmp / "probe.c"
    probe.write_text("#include <stdio.h>\nint main(void) { return 0; }\n", encoding="utf-8")
    r = subprocess.run(
        ["gcc", "-m32", str(probe), "-o", str(tmp / "probe")], capture_output=True, encoding="utf-8"
    )
    if r.returncode:
        pytest.skip(f"gcc -m32 cannot build a program (install gcc-12-multilib): {r.stderr.strip()[:200]}")
    try:
        so = build_mod.build(tmp / "libmlrt.so", m32=True)
    except build_mod.BuildError as e:
        # Debian's gcc-multilib ships only the /usr/include/asm -> x86_64-linux-gnu/asm link (the
        # x86 asm headers serve both word sizes), and conflicts with gcc-aarch64-linux-gnu, which
        # the NEON tests need; without it <errno.h> and <sys/stat.h> fail under -m32. The same
        # link, for this build only.
        asm = Path("/usr/include/x86_64-linux-gnu/asm")
        if "asm/" not in str(e) or not asm.is_dir():
            raise
        shim = tmp / "asm-shim"
        shim.mkdir()
        (shim / "asm").symlink_to(asm)
        so = build_mod.build(tmp / "libmlrt.so", m32=True, extra=["-idirafter", str(shim)])
    return _driver(tmp, so, ["-m32"])


@pytest.mark.slow
def test_m32_build_on_every_fixture(m32_driver, mlb_fixtures, valid_files, tmp_path):
    """32-bit size_t: the size-overflow fixtures and headers implying > 2^32 or > 2^64 bytes are
    truncated bodies, never wrapped sizes; every other fixture as on 64-bit."""
    paths = [p for _, p in mlb_fixtures] + _huge_headers(valid_files, tmp_path)
    got, _ = _run_driver(m32_driver, paths)
    wrong = _compare(paths, got)
    assert not wrong, "\n".join(map(str, wrong))
    by_name = {p.name: g for p, g in zip(paths, got, strict=True)}
    for name in (
        "size_overflows_32bit.mlb",
        "size_overflows_64bit.mlb",
        "q8_everything.mlb",
        "linear_all_ones.mlb",
    ):
        assert by_name[name] == ("ML_E_FORMAT", "ML_E_FORMAT", "format.truncated_body"), name


def _asan_runtime() -> Path | None:
    r = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, encoding="utf-8")
    p = Path(r.stdout.strip())
    return p.resolve() if r.returncode == 0 and p.is_absolute() and p.exists() else None


def _mutation_corpus(files, folder: Path, n: int) -> list[Path]:
    """n hypothesis-drawn damaged files (every kind), written to folder."""
    paths: list[Path] = []

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(kind=st.sampled_from(KINDS), data=st.data())
    def collect(kind, data):
        p = folder / f"mut_{len(paths)}.mlb"
        p.write_bytes(data.draw(damaged(files, kind)))
        paths.append(p)

    collect()
    return paths


@pytest.mark.slow
def test_sanitizer_build_on_fixtures_and_mutations(asan_libmlrt, mlb_fixtures, valid_files, tmp_path):
    asan = _asan_runtime()
    if asan is None:
        pytest.skip("the ASan runtime (gcc -print-file-name=libasan.so) is not installed")
    so = asan_libmlrt
    exe = _driver(tmp_path, so, [])
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    paths = [p for _, p in mlb_fixtures] + _huge_headers(valid_files, corpus)
    paths += _mutation_corpus(valid_files, corpus, 300)
    env = dict(
        os.environ,
        LD_PRELOAD=str(asan),
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    got, err = _run_driver(exe, paths, env)
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        assert marker not in err, err[-4000:]
    wrong = _compare(paths, got)
    assert not wrong, "\n".join(map(str, wrong))


# ---------------------------------------------------------------- (6) the Q8_0 quantizer
QUANT_CASES = [c for c in cases.collect(["quant"]) if c.capability == "quantize_q8_0"]


@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: c.id)
def test_quantize_edge_cases(native, case):
    x, f16 = case.params["x"], case.params["f16"]
    rc, q, d = native.quantize(x, f16)
    if case.compare == "refused":
        assert rc == ML_E_ARG
        assert (q.view(np.uint8) == 0x5A).all() and (d.view(np.uint8) == 0x5A).all()  # nothing written
    else:
        assert rc == ML_OK
        assert (q.tobytes(), d.tobytes()) == case.expected


def _reference_q8(x: np.ndarray, f16: bool):
    try:
        q, d = quant.q8_0(x, f16=f16)
    except quant.QuantError:
        return None
    return q.tobytes(), d.tobytes()


@pytest.mark.parametrize("f16", [False, True], ids=["f32_scales", "f16_scales"])
def test_quantize_random_blocks(native, f16):
    """Blocks of every magnitude (exponents across float32 or, with f16 scales, up to the storable
    65504 * 127), with exact ties, zeros and subnormals mixed in."""
    rng = np.random.default_rng(11 + f16)
    nb = 4096
    top = 22 if f16 else 120
    scale = np.exp2(rng.integers(-149, top, nb)).astype(np.float32)
    x = (rng.standard_normal((nb, 32)).astype(np.float32) * scale[:, None]).astype(np.float32)
    ties = rng.random((nb, 32)) < 0.1
    x[ties] = (rng.integers(-254, 255, ties.sum()) / 2).astype(np.float32)
    x[rng.random((nb, 32)) < 0.05] = 0.0
    x = x.ravel()
    want = _reference_q8(x, f16)
    assert want is not None
    rc, q, d = native.quantize(x, f16)
    assert rc == ML_OK and (q.tobytes(), d.tobytes()) == want


@settings(max_examples=150, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.sampled_from([32, 64, 96]),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True)
        | st.sampled_from([0.0, -0.0, 0.5, -0.5, 127.0, 8319008.0, 8319071.5, 1e-30]),
    ),
    f16=st.booleans(),
)
def test_quantize_hypothesis_blocks(native, x, f16):
    want = _reference_q8(x, f16)
    rc, q, d = native.quantize(x, f16)
    if want is None:
        assert rc == ML_E_ARG
    else:
        assert rc == ML_OK and (q.tobytes(), d.tobytes()) == want


def test_quantize_arguments(native):
    lib, ffi = native.lib, native.ffi
    x = np.ones(64, np.float32)
    q, d = np.zeros(64, np.int8), np.zeros(2, np.float32)
    px, pq, pd = ffi.from_buffer("float[]", x), ffi.from_buffer("int8_t[]", q), ffi.from_buffer(d)
    assert lib.ml_quantize_q8_0(px, 33, 0, pq, pd) == ML_E_ARG  # not a multiple of 32
    assert lib.ml_quantize_q8_0(ffi.NULL, 32, 0, pq, pd) == ML_E_ARG
    assert lib.ml_quantize_q8_0(px, 32, 1, ffi.NULL, pd) == ML_E_ARG
    assert lib.ml_quantize_q8_0(px, 32, 0, pq, ffi.NULL) == ML_E_ARG
    assert lib.ml_quantize_q8_0(px, 0, 0, pq, pd) == ML_OK
    assert lib.ml_quantize_q8_0(px, 64, 0, pq, pd) == ML_OK
    assert (q == 127).all() and (d == np.float32(1 / 127)).all()
