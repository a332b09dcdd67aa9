"""atheris target: the reference .mlt loader and tokenizer on any bytes
(backends/reference/mlt.py, backends/reference/tokenizer.py).

A finding is any exception, or an answer that breaks these invariants:
- mlt.check gives a status of backends.base.STATUSES;
- an accepted file parses (tools/mlt.parse), encodes a mixed text to ids inside the vocabulary,
  and decodes ids 0..7 (those below n_vocab) to bytes.

    pip install atheris
    python backends/reference/fuzz/fuzz_mlt_load.py -dict=backends/native/fuzz/mlt.dict corpus/mlt
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["mlconf"]):
    from mlconf.backends.base import STATUSES
    from mlconf.backends.reference import mlt as loader
    from mlconf.backends.reference.tokenizer import Encoder
    from mlconf.tools import mlt

TEXT = "Hello, wörld! 12345 <s> \u2581x\n\t  日本語 🙂 a\u0301"


def test_one_input(data: bytes) -> None:
    res = loader.check(data)
    assert res.status in STATUSES, res
    if not res.ok:
        return
    tok = mlt.parse(data)
    enc = Encoder(tok)
    ids = enc.encode(TEXT)
    assert all(0 <= i < len(tok.tokens) for i in ids), ids
    assert isinstance(enc.decode([i for i in range(8) if i < len(tok.tokens)]), bytes)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
