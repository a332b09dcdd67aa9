"""atheris target: the reference .mlb loader on any bytes (backends/reference/loader.py).

A finding is any exception, or an answer that breaks these invariants:
- loader.load gives a status of backends.base.STATUSES, and a refusal names the rule of
  specs/mlb_errors.yaml whose status it is;
- an accepted file reads (tools/mlb.read) and runs one token at ctx 1: float32 logits of shape
  (1, vocab), or NumericError (NaN or inf weights, decision forward.nonfinite).

    pip install atheris
    python backends/reference/fuzz/fuzz_mlb_load.py -dict=backends/native/fuzz/mlb.dict corpus/mlb
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["mlconf"]):
    import numpy as np

    from mlconf.backends.base import STATUSES, NumericError
    from mlconf.backends.reference import loader
    from mlconf.backends.reference.forward import Forward
    from mlconf.tools import mlb

from fuzz_file import as_file

STATUS_OF = {r["id"]: r["status"] for r in loader.rule_table()}


def test_one_input(data: bytes) -> None:
    with as_file(data) as path:
        res = loader.load(path)
        assert res.status in STATUSES, res
        if not res.ok:
            assert STATUS_OF.get(res.rule) == res.status, res
            return
        model = mlb.read(path)
        try:
            logits = Forward(model, ctx=1).forward(np.array([1]), 0)
        except NumericError:
            return
        assert logits.dtype == np.float32 and logits.shape == (1, model.header["vocab"]), logits.shape


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
