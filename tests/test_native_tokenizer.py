"""The native tokenizer (backends/native/src/tok_load.c, tok_encode.c) against the reference
(backends/reference/mlt.py, tokenizer.py) and HF tokenizers' goldens.

The library is built with backends/native/build.py into a temporary folder once per module and
loaded in-process with cffi (ABI mode), so that raw bytes reach ml_tok_encode; the `native` and
`native:scalar` backends (worker processes) run the goldens as `mlconf run` does.
(1) every .mlt fixture of the catalog: ml_tok_load gives the reference's status and rule, a reason
    naming the file; a tokenizer is returned exactly on ML_OK; hypothesis mutations of the valid
    fixtures (overwritten, truncated, appended bytes, header values) get the reference's status
    and rule;
(2) every golden of golden/tokenizers on every text of specs/tokenizer_texts.yaml: HF's ids on
    native and native:scalar, and decode(ids) equal to the reference's decode;
(3) every flag combination of both kinds, set on the golden tokenizers' vocabularies: ids and
    decoded bytes identical to the reference on the stress texts; more distinct words than the
    word cache holds, and words too long for it;
(4) the ABI's buffer protocol: *n_out / *len_out the size needed with ML_E_ARG above cap, ids
    outside the vocabulary refused;
(5) hypothesis: arbitrary Unicode text and arbitrary bytes (the reference decodes them with
    errors="replace", specs/decisions.yaml) give the reference's ids on four goldens;
(6) the AddressSanitizer + UBSan build (lib:PATH backend): the suite's tokenizer area and random
    text with lone surrogates (invalid UTF-8 once encoded with surrogatepass), no report allowed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import re
import shutil
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf import cases, runner, specs
from mlconf.backends import get
from mlconf.backends.native import abi
from mlconf.backends.reference import mlt as refmlt
from mlconf.backends.reference.tokenizer import Encoder
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import convert_tokenizer, mlt

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "backends" / "native"
STATUS = {
    0: "ML_OK",
    1: "ML_E_IO",
    2: "ML_E_FORMAT",
    3: "ML_E_SHAPE",
    4: "ML_E_ARG",
    5: "ML_E_NOMEM",
    6: "ML_E_UNSUPPORTED",
}
ML_OK, ML_E_ARG = 0, 4
RULE = re.compile(r"\[([a-z0-9_.]+)\]$")
GOLDENS = sorted(p.name.removesuffix(".ids.json") for p in (GOLDEN_DIR / "tokenizers").glob("*.ids.json"))
TEXTS: dict[str, str] = specs.load("tokenizer_texts")["texts"]
EXTRA = [
    "",
    " ",
    "a",
    "1 12 123 1234 12345",
    "don't DON'T Don'T 'ſ we'Ve",
    "e\u0301 é a\u0308 ä \u0301",
    "\u00a0nbsp\u2003em\u3000",
    "\x1c\x1d\x1e\x1f x",
    "\r\n\r\n  \r\n\tend  ",
    "  x  \n\t y",
    "٣٤٥ ½ Ⅻ 12⁴",
    "中文日本語 東京",
    "<s>hi</s> <|endoftext|><|im_start|>assistant x",
]
HSET = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Native:
    """ml_tok_* with Python values in and out."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib
        self.buf = ffi.new("char[1024]")

    def load(self, path, model_vocab: int = 0) -> tuple[int, object, str]:
        out = self.ffi.new("ml_tokenizer **")
        rc = self.lib.ml_tok_load(os.fsencode(path), model_vocab, out, self.buf, 1024)
        assert (out[0] != self.ffi.NULL) == (rc == ML_OK)
        return rc, out[0], self.ffi.string(self.buf).decode()

    def open(self, path):
        rc, t, reason = self.load(path)
        assert rc == ML_OK, reason
        return self.ffi.gc(t, self.lib.ml_tok_free)

    def encode(self, t, data: bytes, cap: int | None = None) -> tuple[int, list[int], int]:
        cap = len(data) + 8 if cap is None else cap
        ids = self.ffi.new("int32_t[]", max(cap, 1))
        n = self.ffi.new("size_t *")
        rc = self.lib.ml_tok_encode(t, data, len(data), ids, cap, n)
        if rc == ML_E_ARG and cap < n[0] and cap == len(data) + 8:
            return self.encode(t, data, n[0])
        return rc, list(ids[0 : min(n[0], cap)]), n[0]

    def ids(self, t, data: bytes) -> list[int]:
        rc, ids, _ = self.encode(t, data)
        assert rc == ML_OK, STATUS[rc]
        return ids

    def decode(self, t, ids: list[int], cap: int | None = None) -> tuple[int, bytes, int]:
        cap = 16 * len(ids) + 16 if cap is None else cap
        out = self.ffi.new("char[]", max(cap, 1))
        n = self.ffi.new("size_t *")
        rc = self.lib.ml_tok_decode(t, self.ffi.new("int32_t[]", ids), len(ids), out, cap, n)
        return rc, self.ffi.buffer(out, min(n[0], cap))[:], n[0]


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Native:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the native backend needs a C compiler")
    cffi = pytest.importorskip("cffi")
    spec = importlib.util.spec_from_file_location("mlrt_native_build_tok", NATIVE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lib_path = mod.build(tmp_path_factory.mktemp("tok_lib") / "libmlrt.so")
    ffi = cffi.FFI()
    ffi.cdef(abi.CDEF)
    return Native(ffi, ffi.dlopen(str(lib_path)))


@cache
def golden_mlt(name: str) -> Path:
    """golden/tokenizers/NAME.json converted to .mlt (tools/convert_tokenizer), once per process."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="mlconf-tok-")) / f"{name}.mlt"
    convert_tokenizer.convert(GOLDEN_DIR / "tokenizers" / f"{name}.json", out)
    return out


def golden_ids(name: str) -> dict[str, list[int]]:
    doc = json.loads((GOLDEN_DIR / "tokenizers" / f"{name}.ids.json").read_text(encoding="utf-8"))
    return {k: v["ids"] for k, v in doc["ids"].items()}


# -- (1) the loader ---------------------------------------------------------------------------


def test_every_mlt_fixture_gets_the_reference_status(native, generated):
    root, fixtures = generated
    tok = [f for f in fixtures if f.file.startswith("tokenizer/")]
    assert len(tok) >= 45
    for f in tok:
        path = root / f.file
        mv = f.model_vocab
        ref = refmlt.load(path, mv)
        rc, _, reason = native.load(path, mv or 0)
        if rc == ML_OK:
            native.lib.ml_tok_free(native.load(path, mv or 0)[1])
        assert STATUS[rc] == ref.status == f.expected, (f.file, reason, ref.reason)
        assert reason.startswith(f"{path}: "), reason
        if ref.rule:
            m = RULE.search(reason)
            assert m and m.group(1) == ref.rule, (f.file, reason, ref.reason)


@pytest.fixture(scope="module")
def valid_mlt(tmp_path_factory) -> list[bytes]:
    from mlconf import mlt_fixtures
    from mlconf.fixtures import catalog

    return [mlt_fixtures.content(f) for f in catalog() if f.file.startswith("tokenizer/valid/")]


@HSET
@given(data=st.data())
def test_mutated_files_get_the_reference_status_and_rule(native, valid_mlt, scratch, data):
    """Byte overwrites, truncations, appended bytes and u32 header values of the valid fixtures."""
    b = bytearray(data.draw(st.sampled_from(valid_mlt)))
    op = data.draw(st.sampled_from(["overwrite", "truncate", "append", "field"]))
    if op == "overwrite":
        for _ in range(data.draw(st.integers(1, 4))):
            b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.integers(0, 255))
    elif op == "truncate":
        b = b[: data.draw(st.integers(0, len(b) - 1))]
    elif op == "append":
        b += data.draw(st.binary(min_size=1, max_size=16))
    else:
        off = data.draw(st.sampled_from([4, 8, 12, 16, 20, 24, 28]))
        b[off : off + 4] = data.draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little")
    mv = data.draw(st.sampled_from([0, 100, 1000]))
    path = scratch / "mutated.mlt"
    path.write_bytes(bytes(b))
    ref = refmlt.load(path, mv or None)
    rc, t, reason = native.load(path, mv)
    if rc == ML_OK:
        native.lib.ml_tok_free(t)
    assert STATUS[rc] == ref.status, (reason, ref.reason)
    m = RULE.search(reason)
    assert (m.group(1) if m else "") == (ref.rule or ""), (reason, ref.reason)


def test_mlt_rules_in_spec_order():
    src = (NATIVE / "src" / "tok_load.c").read_text(encoding="utf-8")
    ids = [r["id"] for r in specs.load("mlt")["rules"]]
    pos = [src.find(f'"{i}"') for i in ids]
    assert all(p >= 0 for p in pos), [i for i, p in zip(ids, pos, strict=True) if p < 0]
    assert pos[1:] == sorted(pos[1:]), "tok_load.c checks the rules out of specs/mlt.yaml order"


def test_load_null_path_and_model_vocab(native, tmp_path):
    out = native.ffi.new("ml_tokenizer **")
    assert native.lib.ml_tok_load(native.ffi.NULL, 0, out, native.buf, 1024) == ML_E_ARG
    path = golden_mlt("llama3")
    n = mlt.read(path).n_vocab
    assert STATUS[native.load(path, n - 1)[0]] == "ML_E_SHAPE"
    for mv in (n, 0, -5):
        rc, t, reason = native.load(path, mv)
        assert rc == ML_OK, reason
        native.lib.ml_tok_free(t)


# -- (2) the goldens ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_ids_in_process(native, name):
    t = native.open(golden_mlt(name))
    enc = Encoder(mlt.read(golden_mlt(name)))
    for text_name, want in golden_ids(name).items():
        text = TEXTS[text_name]
        got = native.ids(t, text.encode())
        assert got == want, (name, text_name)
        rc, out, _ = native.decode(t, got)
        assert rc == ML_OK and out == enc.decode(got), (name, text_name)


@pytest.mark.parametrize("backend", ["native", "native:scalar"])
def test_golden_ids_on_the_backends(backend):
    b = get(backend)
    if "encode" not in b.capabilities:
        pytest.skip(f"{backend}: {b.unsupported.get('encode')}")
    for name in GOLDENS:
        s = b.open_tokenizer(str(golden_mlt(name)))
        try:
            for text_name, want in golden_ids(name).items():
                got = s.encode(TEXTS[text_name])
                assert got == want, (backend, name, text_name)
                if text_name in ("mixed_whitespace", "leading_space", "crlf"):
                    assert s.decode(got) == Encoder(mlt.read(golden_mlt(name))).decode(got)
        finally:
            s.close()


# -- (3) every flag on both kinds ----------------------------------------------------------------


def _flag_sets(kind: int) -> list[int]:
    if kind == 1:
        return [f for f in range(8)]
    out = []
    for f in range(128):
        if f & 4 or (f & 16 and f & 32):
            continue
        out.append(f)
    return out


@pytest.mark.parametrize("base", ["llama2", "llama3", "mistral", "qwen2"])
def test_every_flag_combination_matches_the_reference(native, base, tmp_path):
    tok = mlt.read(golden_mlt(base))
    texts = [*TEXTS.values(), *EXTRA]
    bos = tok.bos if tok.bos >= 0 else 0
    for flags in _flag_sets(tok.kind):
        var = dataclasses.replace(tok, flags=flags, bos=bos)
        path = tmp_path / f"{base}_{flags}.mlt"
        mlt.write(path, var)
        enc, t = Encoder(var), native.open(path)
        for text in texts:
            want = enc.encode(text)
            assert native.ids(t, text.encode()) == want, (base, flags, text)
            assert native.decode(t, want)[1] == enc.decode(want), (base, flags, text)


def test_word_cache_overflow_and_long_words(native):
    """More distinct words than the word cache holds (it is emptied and refilled), long words past
    its size limit, the same text twice: the reference's ids every time."""
    r = random.Random(1)
    alpha = "abcdefghijklmnopqrstuvwxyzé中😀"
    words = ["".join(r.choice(alpha) for _ in range(r.randint(1, 12))) for _ in range(90_000)]
    words += ["x" * 300, "ab" * 400, "中" * 200]
    text = " ".join(words)
    for name in ("llama3", "gpt2"):
        enc, t = Encoder(mlt.read(golden_mlt(name))), native.open(golden_mlt(name))
        want = enc.encode(text)
        assert native.ids(t, text.encode()) == want
        assert native.ids(t, text.encode()) == want


# -- (4) the buffer protocol ----------------------------------------------------------------------


def test_encode_and_decode_buffers(native):
    t = native.open(golden_mlt("llama3"))
    text = b"hello world, hello again"
    ids = native.ids(t, text)
    rc, part, n = native.encode(t, text, cap=2)
    assert rc == ML_E_ARG and n == len(ids) and part == ids[:2]
    rc, part, n = native.encode(t, b"", cap=0)  # add_bos: the BOS alone does not fit
    assert rc == ML_E_ARG and n == 1 and part == []
    rc, part, n = native.encode(native.open(golden_mlt("gpt2")), b"", cap=0)
    assert rc == ML_OK and n == 0 and part == []
    rc, out, n = native.decode(t, ids[1:])  # without the BOS
    assert rc == ML_OK and out == text and n == len(text)
    rc, part, n2 = native.decode(t, ids[1:], cap=3)
    assert rc == ML_E_ARG and n2 == n and part == text[:3]
    vocab = mlt.read(golden_mlt("llama3")).n_vocab
    for bad in ([vocab], [-1], [0, vocab + 5]):
        assert native.decode(t, bad)[0] == ML_E_ARG


def test_sentencepiece_decode_strips_one_leading_space(native):
    path = golden_mlt("llama2")
    enc, t = Encoder(mlt.read(path)), native.open(path)
    for text in ("  two", " one", "none", ""):
        ids = native.ids(t, text.encode())
        assert native.decode(t, ids)[1] == enc.decode(ids)


# -- (5) hypothesis ------------------------------------------------------------------------------

FUZZ = ["llama3", "qwen2", "mistral", "smollm"]


@pytest.fixture(scope="module")
def fuzz(native):
    return {n: (native.open(golden_mlt(n)), Encoder(mlt.read(golden_mlt(n)))) for n in FUZZ}


@HSET
@given(text=st.text(max_size=80), which=st.sampled_from(FUZZ))
def test_fuzz_unicode_text(native, fuzz, text, which):
    t, enc = fuzz[which]
    want = enc.encode(text)
    assert native.ids(t, text.encode()) == want
    assert native.decode(t, want)[1] == enc.decode(want)


@HSET
@given(data=st.binary(max_size=80), which=st.sampled_from(FUZZ))
def test_fuzz_bytes_decoded_with_replacement(native, fuzz, data, which):
    t, enc = fuzz[which]
    assert native.ids(t, data) == enc.encode(data.decode("utf-8", "replace"))


# -- (6) sanitizers ------------------------------------------------------------------------------


def _random_texts(n: int, seed: int = 0) -> list[str]:
    """Texts from a mix of the code points the scanners care about, lone surrogates included."""
    pools = [
        "abcXYZ",
        " \t\r\n\u00a0\u3000\u2028",
        "0123456789٣½Ⅻ",
        "'sStTrReEvVmMlLdD\u017f",
        '.,!?-()"#',
        "中文東京ภาษาनमस्ते",
        "e\u0301a\u0308\u0301\u1100\u1161\u11a8",
        "😀👍🏽\U0010ffff",
        "\ud800\udfff\udc00",
        "\x00\x1c\x7f\ufffd",
    ]
    r = random.Random(seed)
    return ["".join(r.choice(r.choice(pools)) for _ in range(r.randint(0, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def asan_backend(asan_libmlrt):
    """lib: on an ASan/UBSan build of the runtime, in a worker with the sanitizer runtime preloaded
    (halting on the first report: a report is a crash outcome naming it)."""
    lib = asan_libmlrt
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        mp.setenv("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        backend = get(f"lib:{lib}")
        sessions = {n: backend.open_tokenizer(str(golden_mlt(n))) for n in FUZZ}
        yield backend, sessions
        for s in sessions.values():
            s.close()
        backend.close()


@pytest.mark.slow
def test_tokenizer_under_sanitizers(asan_backend, tmp_path):
    backend, sessions = asan_backend
    sel = cases.collect(["tokenizer"])
    work = runner.Workdir(tmp_path / "work")
    try:
        results = runner.run(sel, [backend], work)
    finally:
        work.close()
    bad = [(r.case, r.outcome, r.detail[:300]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) == len(sel)
    texts = _random_texts(300)
    for name in FUZZ:
        enc, s = Encoder(mlt.read(golden_mlt(name))), sessions[name]
        for text in texts:
            want = enc.encode(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
            assert s.encode(text) == want, (name, text)
            assert s.decode(want) == enc.decode(want)


# Any code point, lone surrogates included: they reach the C decoder as invalid UTF-8 (surrogatepass).
ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=80)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(text=ANY_TEXT, which=st.sampled_from(FUZZ))
def test_fuzz_under_sanitizers(asan_backend, text, which):
    """The hypothesis fuzz of the normal build, on the ASan/UBSan build (issue 8: the sanitizer
    build runs the fuzzing too)."""
    _, sessions = asan_backend
    enc = Encoder(mlt.read(golden_mlt(which)))
    want = enc.encode(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    assert sessions[which].encode(text) == want
    assert sessions[which].decode(want) == enc.decode(want)
