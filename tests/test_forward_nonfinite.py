"""Decision forward.nonfinite: a NaN or infinite matrix input fails the forward call (the
reference raises NumericError, ml_forward returns ML_E_FORMAT), none of the call's positions is fed
(a model with linear layers starts over), and the harness fails a runtime that returns logits
instead, or that refuses a forward the reference runs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mlconf import cases, fixtures, fuzz, runner
from mlconf.areas import forward as forward_area
from mlconf.backends import InputError, NumericError, get
from mlconf.backends.native import native_available
from mlconf.backends.reference import ReferenceBackend

NATIVE = ["native", "native:scalar"] if native_available() else []
needs_native = pytest.mark.skipif(not NATIVE, reason="libmlrt is not built")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """nan_embedding_token_2 (token 2's embedding row is NaN) and the same damage in qwen35, a
    model with a linear-attention layer."""
    d = tmp_path_factory.mktemp("nonfinite")
    fixtures.generate(d, only={"accepted/nan_embedding_token_2.mlb"})
    base = d / "qwen35.mlb"
    fixtures.write_base("qwen35", base)
    blocks = fixtures.base_specs()["qwen35"]["header"].get("dim", 64) // 32
    linear = d / "qwen35_nan_token_2.mlb"
    poke = {"array": "tok_emb.d", "index": 2 * blocks, "value": np.nan}  # token 2's first block
    linear.write_bytes(fixtures.mutate(base.read_bytes(), [{"poke": poke}]))
    return {"attention": d / "accepted/nan_embedding_token_2.mlb", "linear": linear}


def backend(name):
    return ReferenceBackend() if name == "reference" else get(name)


def test_the_reference_names_the_matrix_and_the_position(files):
    s = ReferenceBackend().open_model(str(files["attention"]))
    with pytest.raises(
        NumericError,
        match=r"non-finite activation nan at position 1, element 0 of the "
        r"input of layers\.0\.wq \(decision forward\.nonfinite\)",
    ):
        s.forward(np.array([1, 2]), 0)


@pytest.mark.parametrize("name", ["reference", *NATIVE])
def test_a_refused_call_feeds_none_of_its_positions(files, name):
    b = backend(name)
    try:
        fresh = b.open_model(str(files["attention"])).forward(np.array([1, 1]), 0)
        s = b.open_model(str(files["attention"]))
        first = s.forward(np.array([1]), 0)
        with pytest.raises(NumericError):
            s.forward(np.array([2]), 1)
        with pytest.raises(InputError):  # position 1 was not fed
            s.forward(np.array([1]), 2)
        again = s.forward(np.array([1]), 1)  # the call can be made again from its pos
        assert first.tobytes() == fresh[:1].tobytes() and again.tobytes() == fresh[1:].tobytes()
        with pytest.raises(NumericError):  # a prefill that meets it fails whole
            s.forward(np.array([1, 2, 1]), 0)
        assert s.forward(np.array([1]), 0).tobytes() == first.tobytes()
    finally:
        if hasattr(b, "close"):
            b.close()


@pytest.mark.parametrize("name", ["reference", *NATIVE])
def test_a_model_with_linear_layers_starts_over(files, name):
    b = backend(name)
    try:
        s = b.open_model(str(files["linear"]))
        first = s.forward(np.array([1]), 0)
        with pytest.raises(NumericError):
            s.forward(np.array([2]), 1)
        with pytest.raises(InputError):  # its recurrent state is gone: only 0 is allowed
            s.forward(np.array([1]), 1)
        assert s.forward(np.array([1]), 0).tobytes() == first.tobytes()
    finally:
        if hasattr(b, "close"):
            b.close()


class IgnoresNonFinite(ReferenceBackend):
    """A runtime whose activation quantizer drops NaN and inf (an amax taken with max_ps, NaN
    quants set to 0): logits where the decision wants a refusal."""

    name = "ignores-nonfinite"

    def open_model(self, path, ctx=None):
        session = super().open_model(path, ctx)
        matmul = session.matmul
        session.matmul = lambda name, x: matmul(name, np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
        return session


class RefusesEverything(ReferenceBackend):
    name = "refuses-everything"

    def open_model(self, path, ctx=None):
        session = super().open_model(path, ctx)

        def forward(tokens, pos):
            raise NumericError("refused")

        session.forward = forward
        return session


def fixture_cases(*names):
    return [
        c
        for c in cases.collect(["forward"])
        if c.id.startswith("forward/fixture/") and c.id.split("/")[3] in names
    ]


def test_a_runtime_that_returns_logits_for_nan_fails():
    todo = fixture_cases("nan_scale", "nan_norm_weight", "nan_embedding_token_2", "huge_ffn_scale")
    assert len(todo) == 8
    results = runner.run(todo, [IgnoresNonFinite()])
    assert {r.outcome for r in results} == {"fail"}, [(r.case, r.detail) for r in results]
    for r in results:
        assert "expected NumericError after" in r.detail and r.got == "logits", r.detail
    token_2 = next(r for r in results if r.case.endswith("nan_embedding_token_2/decode"))
    assert token_2.detail.startswith("expected NumericError after 1 logits rows"), token_2.detail


def test_a_runtime_that_refuses_a_finite_model_fails():
    todo = fixture_cases("q8_min", "inf_classifier_scale")
    results = runner.run(todo, [RefusesEverything()])
    assert len(results) == 4 and {r.outcome for r in results} == {"fail"}
    assert all(r.detail.startswith("expected 2 logits rows; got NumericError") for r in results), results


def test_nonfinite_logits_stand_where_the_reference_has_them():
    """inf_classifier_scale: finite activations, an infinite classifier scale: logits are returned
    and their infinities and NaNs must match the reference's in place."""
    (case,) = [c for c in fixture_cases("inf_classifier_scale") if c.id.endswith("prefill")]
    work = runner.Workdir()
    try:
        want = work.expected_logits(
            replace(case, params={**case.params, "model": work.path(case.params["fixture"])})
        )
        assert isinstance(want, np.ndarray) and not np.isfinite(want).all()
        flipped = want.copy()
        flipped[~np.isfinite(flipped)] = 0.0
        r = runner.Result(case.id, "forward", case.spec, "x", "error", "toleranced")
        forward_area.judge(r, "logits_runtime_vs_reference", flipped, want)
        assert r.outcome == "fail" and "non-finite values where the expectation differs" in r.detail
    finally:
        work.close()


def test_the_loader_fuzzer_runs_accepted_mutants(tmp_path):
    """Every mutant both loaders accept is also run for two tokens: the runtime that ignores NaN
    is caught on mutants with a NaN or infinite value, and each failure shrinks to one mutation."""
    c = fuzz.run(IgnoresNonFinite(), "loader", seed=5, count=300, corpus=tmp_path)
    assert c.failures, "no accepted mutant with a non-finite value in 300: pick another seed"
    assert all("/forward/" in r.case and r.got == "logits" for r in c.failures), c.failures[:2]
    assert all(len(e["mutate"]) == 1 and e["expected"] == "ML_OK" for e in c.reproducers)
    for e in c.reproducers:  # each reproducer is a file the reference accepts and refuses to run
        assert ReferenceBackend().load(str(tmp_path / e["file"])).ok
    assert fuzz.run(ReferenceBackend(), "loader", seed=5, count=300).agreed == 300
