"""The runner's outcomes and the detail of a failure, with deliberately wrong backends."""

import numpy as np

from mlconf import cases, runner
from mlconf.backends import LoadResult, Unsupported
from mlconf.backends.reference import ReferenceBackend


class Wrong(ReferenceBackend):
    """The reference, but every answer off by a little."""

    name = "wrong"

    def open_tokenizer(self, path):
        enc = super().open_tokenizer(path)

        class Off:
            def encode(self, text):
                ids = enc.encode(text)
                return ids[:2] + [ids[2] + 1] + ids[3:] if len(ids) > 2 else ids + [0]

        return Off()

    def load_tokenizer(self, path, model_vocab=None):
        return LoadResult("ML_OK", "accepts everything")

    def quantize_q8_0(self, x, f16):
        q, d = super().quantize_q8_0(x, f16)
        q = q.copy()
        q.reshape(-1)[5] ^= 1
        return q, d

    def quantize_q4_0(self, x, rule, f16, importance=None):
        raise Unsupported("no Q4_0 here")


def one(area, keyword):
    sel = cases.collect([area], keyword)
    assert sel, keyword
    return sel


def test_ids_mismatch_names_position_and_text():
    work = runner.Workdir()
    try:
        sel = one("tokenizer", "encode/llama3/contractions")
        r = runner.run_case(sel[0], Wrong(), work)
    finally:
        work.close()
    assert r.outcome == "fail" and r.metrics["first_diff"] == 2
    assert "first at position 2" in r.detail and "text there" in r.detail


def test_status_bits_and_unsupported_outcomes():
    sel = one("tokenizer", "format.magic") + one("quant", "q8_0/") + one("quant", "q4_0_round/")
    results = runner.run(sel, [Wrong()])
    by = {r.case: r for r in results}
    magic = [r for c, r in by.items() if "format.magic" in c]
    assert magic and all(r.outcome == "fail" and "expected ML_E_FORMAT, got ML_OK" in r.detail for r in magic)
    q8 = [r for c, r in by.items() if c.startswith("quant/q8_0/") and "refused" not in c]
    assert any(r.outcome == "fail" and "quants: 1 of 32 elements differ, first at 5" in r.detail for r in q8)
    q4 = [r for c, r in by.items() if c.startswith("quant/q4_0_round/")]
    assert q4 and all(r.outcome == "unsupported" for r in q4)


def test_forward_tolerance_failure_reports_distances():
    class Noisy(ReferenceBackend):
        name = "noisy"

        def open_model(self, path, ctx=None):
            s = super().open_model(path, ctx)
            real = s.forward
            s.forward = lambda t, p: real(t, p) + np.float32(0.5)
            return s

    r = runner.run(one("forward", "llama/prefill"), [Noisy()])[0]
    assert r.outcome == "fail" and "nmse" in r.detail and r.metrics["max_abs"] >= 0.49
