"""atheris target: the reference GGUF reader on any bytes (backends/reference/gguf_file.py and
gguf_model.py, every rule of specs/gguf.yaml).

A finding is any exception, or an answer that breaks these invariants:
- gguf_model.check_bytes returns the file's structure or raises GgufError, whose rule is one of
  the spec's with that rule's status (never a RecursionError, MemoryError, struct.error ...);
- an accepted file's tensors lie inside it, in order, and it embeds two tokens through the
  reference (gguf-py then reads it), finite or refused as non-finite (decision forward.nonfinite).

    pip install atheris
    python backends/reference/fuzz/fuzz_gguf_load.py -dict=backends/native/fuzz/gguf.dict corpus/gguf
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["mlconf"]):
    import numpy as np

    from mlconf import specs
    from mlconf.backends.base import NumericError
    from mlconf.backends.reference import bitnet, gguf_model
    from mlconf.backends.reference.gguf_file import GgufError

STATUS = {r["id"]: r["status"] for r in specs.load("gguf")["rules"]}
PATH = os.path.join(tempfile.mkdtemp(prefix="mlconf-fuzz-gguf-"), "input.gguf")


def test_one_input(data: bytes) -> None:
    try:
        g = gguf_model.check_bytes(data)
    except GgufError as e:
        assert STATUS.get(e.rule) == e.status, (e.rule, e.status)
        return
    end = 0
    for t in g.tensors:
        assert t.offset >= end and g.data_offset + t.offset + t.nbytes <= len(data), t
        end = t.offset + t.nbytes
    with open(PATH, "wb") as f:
        f.write(data)
    model = bitnet.load_gguf(PATH)
    try:
        v = bitnet.embed(model, [0, len(model.tensors["token_embd.weight"]) - 1], "mean", True)
    except NumericError:
        return
    assert np.isfinite(v).all()


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
