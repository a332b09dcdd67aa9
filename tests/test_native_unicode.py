"""The native runtime's Unicode (backends/native/src/unicode.c) against the reference's, and both
against HF tokenizers over every code point.

The library is built with backends/native/build.py (which renders src/unicode_tables.h from
specs/unicode.json with tools/gen_unicode_tables.py) and loaded with cffi in ABI mode; the
test-only entry point mlrt_test_unicode (src/testhooks.c) runs one function of unicode.h:
- class: every code point U+0000..U+10FFFF (and beyond) against unicode_classes.code (the regex
  class plus the numeric bit of Digits);
- version: the versions specs/unicode.json names;
- decode / offsets: bytes.decode("utf-8", "replace") on adversarial byte strings (truncated,
  overlong, surrogate, above U+10FFFF, stray continuation bytes) and hypothesis bytes
  (specs/decisions.yaml tok.invalid_utf8);
- nfc: the reference's NFC (backends/reference/nfc.py, Unicode 9.0) on every code point alone, on
  (base, mark) pairs, on built sequences (Hangul jamo, marks out of order, exclusions, singletons,
  blocked compositions, marks and compositions newer than 9.0) and on hypothesis text.
The HF probe (pytest -m oracle, tools/unicode_probe.py) runs HF's regex classes, its Digits
pre-tokenizer and its NFC normalizer over every code point and every sequence NFC can change, and
compares both backends with them: a change of HF's Unicode data fails naming the code points.
The class, NFC and decode checks also run through a small C driver on the -m32 build, the
AddressSanitizer/UBSan build and the aarch64 build under qemu-user (each skipped, with the reason,
when this machine cannot build or run it).
"""

from __future__ import annotations

import importlib.util
import platform
import subprocess
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf.backends.reference import unicode_classes
from mlconf.backends.reference.nfc import nfc

NATIVE = Path(__file__).resolve().parents[1] / "backends" / "native"
ML_OK, ML_E_ARG = 0, 4
CDEF = """
int mlrt_test_unicode(const char *op, const void *in, size_t n, void *out, size_t cap, size_t *n_out);
"""
ALL = np.arange(0x110000, dtype=np.uint32)
NON_SURROGATES = ALL[(ALL < 0xD800) | (ALL > 0xDFFF)]


def _load_build_module():
    spec = importlib.util.spec_from_file_location("mlrt_native_build", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Unicode:
    """mlrt_test_unicode with NumPy arrays and Python strings."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    def _call(self, op, inp, n, out, cap):
        n_out = self.ffi.new("size_t *")
        src = self.ffi.from_buffer(inp) if n else self.ffi.NULL
        rc = self.lib.mlrt_test_unicode(op.encode(), src, n, self.ffi.from_buffer(out), cap, n_out)
        assert rc == ML_OK, f"mlrt_test_unicode({op!r}) returned {rc}"
        return n_out[0]

    def classes(self, cps) -> np.ndarray:
        cps = np.ascontiguousarray(cps, dtype=np.uint32)
        out = np.zeros(max(cps.size, 1), dtype=np.int32)
        self._call("class", cps, cps.size, out, out.size)
        return out[: cps.size]

    def version(self) -> str:
        out = bytearray(64)
        n = self._call("version", b"", 0, out, len(out))
        return out[:n].decode()

    def decode(self, data: bytes) -> str:
        out = np.zeros(max(len(data), 1), dtype=np.uint32)
        n = self._call("decode", data, len(data), out, out.size)
        return "".join(map(chr, out[:n].tolist()))

    def offsets(self, data: bytes) -> list[int]:
        out = np.zeros(max(len(data), 1), dtype=np.uint32)
        n = self._call("offsets", data, len(data), out, out.size)
        return out[:n].tolist()

    def nfc_cps(self, cps, cap=None) -> tuple[list[int], int]:
        cps = np.ascontiguousarray(cps, dtype=np.uint32)
        cap = 3 * cps.size if cap is None else cap
        out = np.full(max(cap, 1), 0xFFFFFFFF, dtype=np.uint32)
        n = self._call("nfc", cps, cps.size, out, cap)
        return out[: min(n, cap)].tolist(), n

    def nfc(self, s: str) -> str:
        cps, n = self.nfc_cps([ord(c) for c in s])
        assert n == len(cps)
        return "".join(map(chr, cps))


def _load(so) -> Unicode:
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return Unicode(ffi, ffi.dlopen(str(so)))


@pytest.fixture(scope="module")
def uc(tmp_path_factory) -> Unicode:
    build = _load_build_module()
    return _load(build.build(tmp_path_factory.mktemp("mlrt") / "libmlrt.so"))  # BuildError fails


# ---------------------------------------------------------------- classes and version
def expected_classes() -> np.ndarray:
    want = np.zeros(0x110000, dtype=np.int32)
    for first, last, k in unicode_classes.class_ranges():
        want[first : last + 1] = k
    return want


def test_class_of_every_code_point(uc):
    got = uc.classes(ALL)
    want = expected_classes()
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(c), int(got[c]), int(want[c])) for c in bad[:10]]
    # class_ranges() is the definition; char_class is what the reference tokenizer calls.
    sample = np.random.default_rng(0).choice(NON_SURROGATES, 20000, replace=False)
    assert [unicode_classes.code(chr(c)) for c in sample] == want[sample].tolist()
    assert uc.classes([0x110000, 0xFFFFFFFF]).tolist() == [unicode_classes.OTHER] * 2


def test_version(uc):
    v = unicode_classes.VERSIONS
    assert uc.version() == f"classes {v['classes']}, numeric {v['numeric']}, nfc {v['nfc']}"


# ---------------------------------------------------------------- UTF-8
ADVERSARIAL = [
    b"",
    b"a",
    b"\x00",
    b"\x7f",
    b"\xc2\x80",
    b"\xdf\xbf",
    b"\xe0\xa0\x80",
    b"\xef\xbf\xbf",
    b"\xf0\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf",
    "h\u00e9llo \u4e16\u754c \U0001f600".encode(),
    # truncated at the end and in the middle
    b"\xe2\x82",
    b"\xe2",
    b"\xf0\x9f\x98",
    b"\xf0\x9f",
    b"\xf0",
    b"\xc3",
    b"a\xe2\x82b",
    b"\xf0\x9f\x98a",
    b"\xe2\x82\xe2\x82\xac",
    # surrogates, overlongs, above U+10FFFF, bytes that never start a sequence
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xed\x9f\xbf",
    b"\xc0\xaf",
    b"\xc1\xbf",
    b"\xe0\x80\xaf",
    b"\xe0\x9f\xbf",
    b"\xf0\x80\x80\xaf",
    b"\xf0\x8f\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xfc\x84\x80\x80\x80\x80",
    b"\xfe",
    b"\xff",
    b"\xfe\xfe\xff\xff",
    # stray continuation bytes, lead bytes followed by leads or ASCII
    b"\x80",
    b"\xbf",
    b"\x80\x80\x80",
    b"\xc3\xc3\xa9",
    b"\xe2\x28\xa1",
    b"\xe2\x82\x28",
    b"\xf0\x28\x8c\xbc",
    b"\xf0\x90\x28\xbc",
    b"\xf0\x90\x8c\x28",
    b"\xc2\x41",
    b"\xe1\x80\xe1\x80\x80",
    # the Markus Kuhn stress test's impossible and overlong forms, mixed with valid text
    b"\xef\xbf\xbe\xef\xbf\xbf",
    b"a\xc0\x80b\xe0\x80\x80c",
    b"\xf4\x8f\xbf\xbf\xf4\x90",
    b"\xed\xaf\xbf\xed\xbf\xbf",
]


@pytest.mark.parametrize("data", ADVERSARIAL, ids=[d.hex() or "empty" for d in ADVERSARIAL])
def test_decode_adversarial(uc, data):
    assert uc.decode(data) == data.decode("utf-8", "replace")
    assert len(uc.offsets(data)) == len(data.decode("utf-8", "replace"))


def test_decode_maximal_subparts(uc):
    """The cases the brief names, spelled out."""
    fffd = "\ufffd"
    assert uc.decode(b"\xe2\x82") == fffd
    assert uc.decode(b"\xed\xa0\x80") == fffd * 3
    assert uc.decode(b"\xc0\xaf") == fffd * 2
    assert uc.decode(b"\xf4\x90\x80\x80") == fffd * 4
    assert uc.decode(b"a\xe2\x82\xacb\xe2\x82") == "a\u20acb" + fffd
    assert uc.offsets(b"a\xe2\x82\xacb\xe2\x82") == [0, 1, 4, 5]
    assert uc.offsets(b"\xc0\xaf\xf0\x9f\x98\x80") == [0, 1, 2]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.lists(
            st.sampled_from(
                [
                    b"\x80",
                    b"\xbf",
                    b"\xc2",
                    b"\xdf",
                    b"\xe0",
                    b"\xe1",
                    b"\xed",
                    b"\xef",
                    b"\xf0",
                    b"\xf1",
                    b"\xf4",
                    b"\xf5",
                    b"\xa0",
                    b"\x9f",
                    b"\x90",
                    b"\x8f",
                    b"a",
                    b"\xc3\xa9",
                    b"\xe2\x82\xac",
                    b"\xf0\x9f\x98\x80",
                ]
            ),
            max_size=24,
        ).map(b"".join),
    )
)
def test_decode_hypothesis(uc, data):
    want = data.decode("utf-8", "replace")
    assert uc.decode(data) == want
    offs = uc.offsets(data)
    # each character decodes from the bytes between its offset and the next one
    bounds = [*offs, len(data)]
    pieces = [data[a:b].decode("utf-8", "replace") for a, b in zip(bounds, bounds[1:], strict=False)]
    assert pieces == list(want)


# ---------------------------------------------------------------- NFC
def test_nfc_of_every_code_point(uc):
    """Each code point alone (one call per block of 4096, each element separated by a starter
    that composes with nothing, so they do not interact)."""
    sep = 0x21  # "!"
    for start in range(0, 0x110000, 4096):
        cps = [c for c in range(start, start + 4096) if not 0xD800 <= c <= 0xDFFF]
        inp = np.empty(2 * len(cps), dtype=np.uint32)
        inp[0::2], inp[1::2] = cps, sep
        got, _ = uc.nfc_cps(inp)
        want = nfc("".join(chr(c) + "!" for c in cps))
        if got != [ord(c) for c in want]:
            for c in cps:
                assert uc.nfc(chr(c)) == nfc(chr(c)), hex(c)


def _marks() -> list[int]:
    return [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and unicodedata.combining(chr(c))]


@pytest.mark.slow
def test_nfc_base_mark_pairs(uc):
    """Every base that starts a primary composite (and a sample of others) with every mark."""
    marks = _marks()
    bases = sorted(
        {
            ord(unicodedata.normalize("NFD", chr(c))[0])
            for c in range(0x110000)
            if not 0xD800 <= c <= 0xDFFF
            and unicodedata.decomposition(chr(c))
            and not unicodedata.decomposition(chr(c)).startswith("<")
        }
    )
    bases += [0x41, 0x3B1, 0x1100, 0xAC00, 0xAC01, 0x0915, 0x4E00, 0x1F600]
    composed = [nfc(chr(c)) for c in range(0xC0, 0x2000)]
    bases += sorted({ord(s[0]) for s in composed if len(s) == 1})
    text = "".join(chr(b) + chr(m) + "!" for b in bases for m in marks[::3] + marks[1::17])
    assert uc.nfc(text) == nfc(text)


SEQUENCES = [
    "\u1100\u1161",
    "\u1100\u1161\u11a8",
    "\u1100\u1161\u11a7",
    "\uac00\u11a8",
    "\uac01\u11a8",
    "\u1100\u1100\u1161\u11a8\u11a8",
    "\u1112\u1175\u11c2",
    "\u1100\u0300\u1161",
    "\u1113\u1161",
    "\uac00\u1161",
    "\ud7a3\u11a8",
    "\u1100\u1176",
    "\u1100\u1160",
    "a\u0323\u0302",
    "a\u0302\u0323",
    "a\u0301\u0300\u0323\u031b",
    "e\u0327\u0306",
    "e\u0306\u0327",
    "\u1e0b\u0323",
    "\u1e0d\u0307",
    "q\u0307\u0323",
    "\u0041\u030a\u0301",
    "\u212b\u0301",
    "\u0958",
    "\u0915\u093c",
    "\u2126",
    "\u212a",
    "\u0344",
    "\u0308\u0301",
    "\u0f73",
    "\u0f71\u0f72",
    "\u2adc",
    "\u0340\u0341\u0343",
    "\u0374",
    "\u037e",
    "\u0387",
    "\u1f71",
    "\u1fbb",
    "a\u0305\u0301",
    "a\u0301\u0305",
    "a\u0300\u0300",
    "a\u0316\u0300\u0301",
    "\u00e0\u0316",
    "\u0b47\u0b3e",
    "\u0b47\u0b56",
    "\u0b47\u0b3c\u0b3e",
    "\u0dd9\u0dcf\u0dca",
    "\u0dd9\u0dca\u0dcf",
    "\u1025\u102e",
    "\u0cc6\u0cc2\u0cd5",
    "\u09c7\u09be",
    "\u1b05\u1b35",
    "\u0300a",
    "\u0301\u0300",
    "\u0315\u0300\u05ae\u0300b",
    "a\u05ae\u0300\u0301\u0315",
    "\u03b1\u0313\u0300\u0345",
    "\u03b1\u0345\u0300\u0313",
    "\u1f82",
    "\u1fb7\u0301",
    "\u0fb2\u0f80\u0f81",
    "\u0fb3\u0f71\u0f80",
    "\U0001d15e\U0001d165",
    "\U0001d15f\U0001d16e",
    "\U00011099\U000110ba",
    "\U0001133b\U00011347\U0001133e",
    "\U00011347\U0001133e",
    "e\u0301" * 50,
    "\u0301" * 300 + "a",
    "a" + "\u0323\u0301" * 150,
    "\u00c7\u0301",
    "C\u0327\u0301",
    "\u1e09",
    "\u01d5",
    "u\u0308\u0304",
    "u\u0304\u0308",
    "\u0069\u0307\u0301",
    # newer than Unicode 9.0, so starters that neither decompose nor compose in HF's NFC: a mark of
    # 10.0 (U+1DF6, class 232) that 14.0 would move after U+0301 and let é compose, one of 14.0,
    # and compositions of 13.0 (Dives Akuru) and 16.0 (Tulu-Tigalari, Gurung Khema, Kirat Rai)
    "e\u1df6\u0301",
    "a\u0898\u0300",
    "\U00011935\U00011930",
    "\U000113c2\U000113c2",
    "\U0001611e\U0001611e",
    "\U00016d63\U00016d67",
    "\u1100\u1161\U0001611e",
]


@pytest.mark.parametrize("s", SEQUENCES, ids=[s[:8].encode("unicode_escape").decode() for s in SEQUENCES])
def test_nfc_sequences(uc, s):
    assert uc.nfc(s) == nfc(s)
    d = unicodedata.normalize("NFD", s)  # Python's 14.0 NFD: another input, not the expected output
    assert uc.nfc(d) == nfc(d)


def test_nfc_short_output_buffer(uc):
    """cap below the needed count: the first cap code points, the needed count returned."""
    s = "\u1f82a\u0301\u1100\u1161\u11a8xyz" + "\u0301" * 5
    want = [ord(c) for c in nfc(s)]
    for cap in range(len(want) + 2):
        got, n = uc.nfc_cps([ord(c) for c in s], cap)
        assert n == len(want) and got == want[:cap]
    assert uc.nfc("") == ""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    s=st.one_of(
        st.text(max_size=40),
        st.text(st.characters(codec="utf-8"), max_size=40),
        st.lists(
            st.sampled_from(
                [
                    "a",
                    "e",
                    "\u0300",
                    "\u0301",
                    "\u0323",
                    "\u0327",
                    "\u0345",
                    "\u03b1",
                    "\u0313",
                    "\u1100",
                    "\u1161",
                    "\u11a8",
                    "\uac00",
                    "\u0b47",
                    "\u0b3e",
                    "\u0b56",
                    "\u0958",
                    "\u093c",
                    "\u2126",
                    "\u0344",
                    "\u05ae",
                    "\u0315",
                    "\u1f00",
                    "\u00c7",
                    "\u0f71",
                    "\u0f72",
                    "\u0f80",
                ]
            ),
            max_size=30,
        ).map("".join),
    )
)
def test_nfc_hypothesis(uc, s):
    assert uc.nfc(s) == nfc(s)


# ---------------------------------------------------------------- both backends against HF (oracle)
def _first_differences(got: np.ndarray, want: np.ndarray, what: str) -> str:
    bad = np.flatnonzero(got != want)
    return f"{bad.size} code points differ from HF's {what}: " + ", ".join(
        f"U+{int(c):04X} (HF {int(want[c])}, here {int(got[c])})" for c in bad[:12]
    )


@pytest.mark.oracle
def test_regex_classes_are_hf_s(uc):
    """\\p{L}, \\p{N} and \\s as HF's regex engine matches every code point, against both backends."""
    pytest.importorskip("tokenizers")
    from mlconf.tools import unicode_probe

    hf = unicode_probe.hf_classes().astype(np.int32)
    ref = expected_classes() & 3
    assert np.array_equal(ref, hf), _first_differences(ref, hf, "regex classes")
    native = uc.classes(ALL) & 3
    assert np.array_equal(native, hf), _first_differences(native, hf, "regex classes")


@pytest.mark.oracle
def test_digits_numeric_is_hf_s(uc):
    """What Digits(individual_digits=True) splits off, every code point, against both backends."""
    pytest.importorskip("tokenizers")
    from mlconf.tools import unicode_probe

    hf = unicode_probe.hf_numeric().astype(np.int32)
    ref = (expected_classes() >> 2) & 1
    assert np.array_equal(ref, hf), _first_differences(ref, hf, "Digits")
    native = (uc.classes(ALL) >> 2) & 1
    assert np.array_equal(native, hf), _first_differences(native, hf, "Digits")


@pytest.mark.oracle
def test_nfc_is_hf_s(uc):
    """HF's NFC normalizer on every code point alone, every composition's first character with
    every mark and composing character, and every pair of marks, against both backends."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("unicodedataplus")
    from mlconf.tools import unicode_probe

    texts = unicode_probe.nfc_probe_texts()
    hf = unicode_probe.hf_nfc(texts)
    ref = [nfc(t) for t in texts]
    bad = [i for i, (a, b) in enumerate(zip(ref, hf, strict=True)) if a != b]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ from HF's NFC (reference): " + ", ".join(
        f"{_hex(texts[i])} -> HF {_hex(hf[i])}, here {_hex(ref[i])}" for i in bad[:8]
    )
    native = uc.nfc(unicode_probe.SEP.join(texts)).split(unicode_probe.SEP)
    bad = [i for i, (a, b) in enumerate(zip(native, hf, strict=True)) if a != b]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ from HF's NFC (native): " + ", ".join(
        f"{_hex(texts[i])} -> HF {_hex(hf[i])}, here {_hex(native[i])}" for i in bad[:8]
    )


def _hex(s: str) -> str:
    return " ".join(f"U+{ord(c):04X}" for c in s)


# ---------------------------------------------------------------- other builds: -m32, ASan, aarch64
DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int mlrt_test_unicode(const char *op, const void *in, size_t n, void *out, size_t cap, size_t *n_out);
/* argv[1] = op; stdin = uint32 code points (bytes for decode); stdout = the uint32/int32 results. */
int main(int argc, char **argv) {
    size_t cap = 1 << 20, n = 0, r;
    unsigned char *buf = malloc(cap);
    if (argc != 2 || buf == NULL) return 2;
    while ((r = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap && (buf = realloc(buf, cap *= 2)) == NULL) return 2;
    }
    size_t elems = strcmp(argv[1], "decode") == 0 ? n : n / 4, ocap = 3 * elems + 1, n_out = 0;
    uint32_t *out = malloc(ocap * 4);
    int rc = out == NULL || mlrt_test_unicode(argv[1], buf, elems, out, ocap, &n_out);
    if (rc == 0) fwrite(out, 4, n_out, stdout);
    free(buf);
    free(out);
    return rc;
}
"""


def _driver(tmp: Path, cc: list[str], so: Path) -> Path:
    (tmp / "driver.c").write_text(DRIVER, encoding="utf-8")
    r = subprocess.run(
        [*cc, str(tmp / "driver.c"), str(so), f"-Wl,-rpath,{so.parent}", "-o", str(tmp / "driver")],
        capture_output=True,
        encoding="utf-8",
    )
    if r.returncode:
        pytest.skip(f"{' '.join(cc)} cannot link a driver: {r.stderr.strip()[:200]}")
    return tmp / "driver"


@pytest.fixture(scope="module")
def m32_driver(tmp_path_factory) -> list[str]:
    build = _load_build_module()
    tmp = tmp_path_factory.mktemp("m32")
    try:
        so = build.build(tmp / "libmlrt.so", m32=True)
    except build.BuildError as e:
        pytest.skip(f"no -m32 build here: {str(e).strip().splitlines()[-1][:200]}")
    return [str(_driver(tmp, ["gcc", "-m32", "-O2", *build._m32_asm_include(tmp)], so))]


@pytest.fixture(scope="module")
def asan_driver(tmp_path_factory, asan_libmlrt) -> list[str]:
    tmp = tmp_path_factory.mktemp("asan")
    return [str(_driver(tmp, ["gcc", "-g", "-fsanitize=address,undefined"], asan_libmlrt))]


@pytest.fixture(scope="module")
def aarch64_driver(tmp_path_factory) -> list[str]:
    """The driver linked statically with the aarch64 build of every source, under qemu-user."""
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("on aarch64 the library itself is the aarch64 build")
    from mlconf.backends.native import qemu

    why = qemu.missing_tools()
    if why:
        pytest.skip(why)
    build = _load_build_module()
    tmp = tmp_path_factory.mktemp("aarch64")
    (tmp / "driver.c").write_text(DRIVER, encoding="utf-8")
    flags = [f for f in build.CFLAGS if f != "-fPIC"]
    srcs = [*build.sources("aarch64"), (tmp / "driver.c", [])]
    exe = build.compile_link("aarch64-linux-gnu-gcc", flags, srcs, ["-static"], tmp / "driver")
    return ["qemu-aarch64", str(exe)]


def _run(driver: list[str], op: str, data) -> np.ndarray:
    data = data if isinstance(data, bytes) else np.asarray(data, dtype=np.uint32).tobytes()
    r = subprocess.run([*driver, op], input=data, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    return np.frombuffer(r.stdout, dtype=np.int32 if op == "class" else np.uint32)


def _check_build(driver: list[str]) -> None:
    """Classes of every code point, NFC of every code point and of SEQUENCES, decoding of
    ADVERSARIAL, through one build."""
    got = _run(driver, "class", ALL)
    assert np.array_equal(got, expected_classes())
    text = "".join(chr(c) + "!" for c in NON_SURROGATES.tolist()) + "".join(SEQUENCES)
    got = _run(driver, "nfc", [ord(c) for c in text])
    assert "".join(map(chr, got.tolist())) == nfc(text)
    for data in ADVERSARIAL:
        got = _run(driver, "decode", data)
        assert "".join(map(chr, got.tolist())) == data.decode("utf-8", "replace"), data


@pytest.mark.slow
def test_m32_build(m32_driver):
    _check_build(m32_driver)


@pytest.mark.slow
def test_sanitizer_build(asan_driver):
    """AddressSanitizer + UBSan: the same checks, plus random bytes and code points."""
    _check_build(asan_driver)
    rng = np.random.default_rng(1)
    for _ in range(50):
        data = rng.choice([0x41, 0x80, 0xBF, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xFF, 0x9F], 64).astype(np.uint8)
        assert _run(asan_driver, "decode", data.tobytes()).size <= 64
        cps = rng.choice(
            [0x41, 0x300, 0x301, 0x323, 0x345, 0x3B1, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x1F82], 64
        )
        got = _run(asan_driver, "nfc", cps)
        assert "".join(map(chr, got.tolist())) == nfc("".join(map(chr, cps)))


@pytest.mark.slow
def test_aarch64_build_under_qemu(aarch64_driver):
    _check_build(aarch64_driver)
