"""The reference forward against transformers' logits (golden/logits), in both modes, and the
oracle re-derivation of those goldens (pytest -m oracle)."""

import numpy as np
import pytest

from mlconf.backends.reference.forward import Forward
from mlconf.compare import distances, ulp_distance, within
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import mlb
from mlconf.tools.golden_logits import CASES

NAMES = sorted(CASES)


def golden(name):
    g = np.load(GOLDEN_DIR / "logits" / f"{name}.npz")
    return mlb.read(GOLDEN_DIR / "logits" / f"{name}.mlb"), g["tokens"], g["logits"]


def test_every_case_has_a_committed_golden():
    assert sorted(p.stem for p in (GOLDEN_DIR / "logits").glob("*.npz")) == NAMES
    assert sorted(p.stem for p in (GOLDEN_DIR / "logits").glob("*.mlb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_float_semantics_match_transformers(name):
    m, toks, want = golden(name)
    ok, over = within("logits_float_vs_oracle", distances(Forward(m, float_mode=True).forward(toks, 0), want))
    assert ok, f"{name}: {over}"


@pytest.mark.parametrize("name", NAMES)
def test_runtime_semantics_within_runtime_tolerance(name):
    m, toks, want = golden(name)
    got = Forward(m).forward(toks, 0)
    ok, over = within("logits_runtime_vs_oracle", distances(got, want))
    assert ok, f"{name}: {over}"
    # and the float tolerance would NOT hold: the runtime check is not vacuous
    assert not within("logits_float_vs_oracle", distances(got, want))[0]


def test_goldens_cover_the_features():
    headers = {n: golden(n)[0].header for n in NAMES}
    flags = {n: golden(n)[0].flags or b"" for n in NAMES}
    assert {h["rope_type"] for h in headers.values()} == {0, 1, 2, 3}
    assert {h["wtype"] for h in headers.values()} == {1, 2}
    assert any(h["scale_f16"] for h in headers.values()) and any(h["q8_mask"] for h in headers.values())
    for field in (
        "qkv_bias",
        "qk_norm",
        "head_dim",
        "attn_softcap",
        "final_softcap",
        "post_norms",
        "rope_local_theta",
        "rot_dim",
        "attn_gate",
        "lin_k_heads",
        "sliding_window",
        "act",
        "embed_scale",
        "attn_scale",
        "shared_classifier",
    ):
        assert any(h[field] for h in headers.values()), field
    for bit in (1, 2, 4, 8):
        assert any(b & bit for f in flags.values() for b in f), bit


def test_distances():
    a = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    b = a.copy()
    b[1, 0] = np.nextafter(np.float32(3.0), np.float32(4.0))
    d = distances(b, a)
    assert d["max_ulp"] == 1 and d["differ"] == 1 and d["argmax"] == 1.0
    assert ulp_distance(np.array([-0.0], np.float32), np.array([0.0], np.float32)) == 0
    assert ulp_distance(np.array([-1e-45], np.float32), np.array([1e-45], np.float32)) == 2
    c = a.copy()
    c[0] = [2.0, 1.0]
    assert distances(c, a)["argmax"] == 0.5
    assert not within("logits_runtime_vs_oracle", distances(c, a))[0]
    assert not within("logits_float_vs_oracle", distances(a * np.nan, a))[0]


@pytest.mark.oracle
def test_oracle_rederives_every_golden(tmp_path):
    """Inputs (the .mlb, the tokens) byte for byte; transformers' logits within the measured
    cross-host bound (specs/tolerances.yaml oracle_rederive_logits)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mlconf.tools import golden_drift, golden_logits

    golden_logits.generate(NAMES, tmp_path / "logits")
    result = golden_drift.compare(tmp_path, families=["logits"])
    assert result["inputs_differ"] == [], f"inputs differ from the goldens: {result['inputs_differ']}"
    ok, over = golden_drift.within(result, "logits")
    assert ok, over
