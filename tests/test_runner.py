"""The runner's outcomes and the detail of a failure, with deliberately wrong backends."""

import dataclasses

import numpy as np

from mlconf import cases, runner
from mlconf.backends import LoadResult, Unsupported
from mlconf.backends.reference import ReferenceBackend
from mlconf.compare import byte_distance


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


def test_decode_mismatch_names_the_byte():
    """A decoder that keeps the space of the U+2581 prefix (planted bug decode_leading_space_kept)
    fails the decode case at byte 0; the reference passes it."""

    class Spaced(ReferenceBackend):
        name = "spaced"

        def open_tokenizer(self, path):
            enc = super().open_tokenizer(path)
            real = enc.decode
            enc.decode = lambda ids: b" " + real(ids)
            return enc

    (case,) = [c for c in one("tokenizer", "decode/llama2/") if c.id.endswith("/trailing_space")]
    assert case.expected == b"hello world " and case.params["ids"][0] != 1  # the BOS left out
    work = runner.Workdir()
    try:
        bad, good = (runner.run_case(case, b, work) for b in (Spaced(), ReferenceBackend()))
    finally:
        work.close()
    assert (good.outcome, good.output, good.output_kind) == ("pass", b"hello world ", "decoded bytes")
    assert bad.outcome == "fail" and bad.metrics["first_diff"] == 0
    assert "first at byte 0 of 12 (got 13 bytes)" in bad.detail


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


def test_bitnet_embed_failures_say_what_differs():
    """A backend whose embeddings are off fails the toleranced cases with the metrics and the worst
    element; one that accepts damaged GGUFs and bad calls fails the refused cases."""

    class Lax(ReferenceBackend):
        name = "lax"

        def open_embedder(self, path):
            try:
                e = super().open_embedder(path)
            except Exception:
                e = super().open_embedder(str(cases.BITNET_DIR / f"{cases.bitnet_goldens()[0]}.gguf"))
            real = e.embed

            def embed(tokens, pooling=None, normalize=False):
                t = np.asarray(tokens)
                bad_pooling = pooling not in (None, "mean", "cls", "last")
                if t.size == 0 or bad_pooling or t.min() < 0 or t.max() >= e.vocab:
                    return np.zeros(e.dim, np.float32)
                v = real(tokens, pooling, normalize).copy()
                v[3] += np.float32(0.5)
                return v

            e.embed = embed
            return e

    name = cases.bitnet_goldens()[0]
    sel = cases.collect(["bitnet"], f"embed/{name}/0/mean or embed/refused/{name}")
    by = {r.case: r for r in runner.run(sel, [Lax()])}
    r = by[f"bitnet/embed/{name}/0/mean"]
    assert r.outcome == "fail" and "nmse" in r.detail and "largest error at element 3" in r.detail, r.detail
    assert r.metrics["worst"] == 3 and r.metrics["first_differ"] <= 3
    refused = [r for c, r in by.items() if "/refused/" in c]
    assert len(refused) >= 6 and all(r.outcome == "fail" and r.got == "accepted" for r in refused), refused


def test_missing_tolerance_is_an_error_naming_it():
    name = cases.bitnet_goldens()[0]
    case = cases.collect(["bitnet"], f"embed/{name}/0/cls_norm")[0]
    bogus = dataclasses.replace(case, params={**case.params, "tolerance": "no_such_tolerance"})
    work = runner.Workdir()
    try:
        r = runner.run_case(bogus, ReferenceBackend(), work)
    finally:
        work.close()
    assert r.outcome == "error" and "'no_such_tolerance' is not defined in specs/tolerances.yaml" in r.detail


def test_outputs_and_byte_distances_for_the_matrix():
    """run_case keeps the raw output of each kind (the matrix compares them) and the byte distance
    to the expectation."""
    sel = (
        one("quant", "q8_0/")
        + one("header", "flags_zero")
        + one("tokenizer", "encode/llama3/contractions")
        + one("bitnet", "i2s_act/random_3x256")
    )
    by = {(r.case, r.backend): r for r in runner.run(sel, [ReferenceBackend(), Wrong()])}
    q8 = next(
        r for (c, b), r in by.items() if b == "wrong" and c.startswith("quant/q8_0/") and r.outcome == "fail"
    )
    assert isinstance(q8.output, tuple) and q8.output_kind == "quantizer bytes"
    assert (q8.metrics["differ"], q8.metrics["first_diff"]) == (1, 5)
    ref = by[(q8.case, "reference")]
    assert ref.output[1] == q8.output[1] and ref.output[0] != q8.output[0] and ref.metrics["differ"] == 0
    assert by[("header/flags_zero", "reference")].output == "ML_OK"
    ids = by[(sel[-2].id, "wrong")]
    assert ids.output_kind == "ids" and ids.output[2] == by[(sel[-2].id, "reference")].output[2] + 1
    act = by[(sel[-1].id, "wrong")]  # vs_reference: not run on the reference itself
    assert (sel[-1].id, "reference") not in by and act.output_kind == "i2s bytes"
    assert len(act.output) == 3 and act.metrics["first_diff"] is None
    assert byte_distance(b"abcd", b"abXdZ") == {"differ": 2, "first_diff": 2}
    assert byte_distance(b"ab", b"ab") == {"differ": 0, "first_diff": None}


def test_distances_compare_non_finite_values_in_place():
    """A NaN or infinity must stand where the expectation has the same one; the rest is compared
    as usual (compare.distances, the two-token runs of files with any weights)."""
    from mlconf.compare import distances, within

    want = np.array([[1.0, np.nan, np.inf], [2.0, 3.0, -np.inf]], np.float32)
    same = distances(want.copy(), want)
    assert same["nonfinite_mismatch"] == 0 and same["differ"] == 0 and same["max_abs"] == 0
    assert within("logits_runtime_vs_reference", same)[0]
    moved = want.copy()
    moved[0, 1], moved[0, 0] = 1.0, np.nan
    d = distances(moved, want)
    assert d["nonfinite_mismatch"] == 2 and not within("logits_runtime_vs_reference", d)[0]
    flipped = want.copy()
    flipped[1, 2] = np.inf
    assert distances(flipped, want)["nonfinite_mismatch"] == 1
    assert "nonfinite_mismatch" not in distances(np.ones(3, np.float32), np.ones(3, np.float32))
