"""The Q4_0 round rule against its independent oracle, gguf-py (DESIGN: the round rule equals
llama.cpp's Q4_0; gguf-py's gguf.quants is the oracle).

Without gguf: the reference reproduces the committed golden (derived by gguf-py) byte for byte.
With gguf (pytest -m oracle): gguf-py re-derives the golden now, and agrees with the reference on
fresh random blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlconf.backends.reference import quant
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import golden

GOLDEN = GOLDEN_DIR / "q4_0_round_gguf.npz"


@pytest.fixture(scope="module")
def committed() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as g:
        return {k: g[k] for k in g.files}


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference round rule with f16 scales, as (d bits uint16 (N,), nibbles (N, 16))."""
    qs, d = quant.q4_0_round(np.asarray(x, dtype=np.float32).reshape(-1, 32), f16=True)
    return d.reshape(-1).view("<u2"), qs.reshape(-1, 16)


def test_golden_shape(committed):
    x, d, qs = committed["x"], committed["d"], committed["qs"]
    assert GOLDEN.stat().st_size < 64 * 1024
    assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == 32 and len(x) >= 300
    assert d.dtype == np.dtype("<u2") and d.shape == (len(x),)
    assert qs.dtype == np.uint8 and qs.shape == (len(x), 16)
    assert np.isfinite(x).all()
    assert {"normal", "heavy_tail", "tiny", "ties", "edge"} <= set(committed["kinds"].tolist())


def test_reference_equals_golden(committed):
    d, qs = reference(committed["x"])
    bad = np.flatnonzero((d != committed["d"]) | (qs != committed["qs"]).any(axis=1))
    kinds = committed["kinds"][committed["kind"][bad]].tolist()
    assert bad.size == 0, f"blocks {bad.tolist()[:10]} ({kinds[:10]}) differ from gguf-py"


def test_reference_f32_d_rounds_to_golden(committed):
    # The stored f16 d is the f32 d rounded: the f32 rule and the golden agree on d too.
    qs32, d32 = quant.q4_0_round(committed["x"])
    assert (d32.reshape(-1).astype(np.float16).view("<u2") == committed["d"]).all()
    assert (qs32 == committed["qs"]).all()  # levels use the unrounded d either way


# ---------------------------------------------------------------- with the oracle installed
@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf")


@pytest.mark.oracle
def test_gguf_rederives_golden(gguf, committed):
    d, qs = golden.gguf_q4_0(committed["x"])
    assert (d == committed["d"]).all()
    assert (qs == committed["qs"]).all()


@pytest.mark.oracle
def test_golden_command_reproduces_file(gguf, tmp_path):
    # MANIFEST's command must rebuild the committed bytes (deterministic zip, seeded inputs).
    path = golden.generate("q4_0_round", tmp_path)
    assert golden.sha256(path) == golden.sha256(GOLDEN), "re-run: python tools/golden.py q4_0_round"


@pytest.mark.oracle
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gguf_equals_reference_fresh_seeded(gguf, seed):
    x, _, _ = golden.q4_0_round_inputs(seed)
    assert [a.tolist() for a in golden.gguf_q4_0(x)] == [a.tolist() for a in reference(x)]


FINITE = st.floats(min_value=-golden.F16_MAX_M, max_value=golden.F16_MAX_M, width=32)


@st.composite
def blocks(draw) -> list[float]:
    scale = draw(st.sampled_from([1.0, 2.0**-20, 2.0**-60, 2.0**-110]))
    vals = draw(
        st.lists(st.one_of(FINITE, st.integers(-16, 16).map(lambda k: k / 2)), min_size=32, max_size=32)
    )
    return [v * scale for v in vals]


@pytest.mark.oracle
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(block=blocks())
def test_gguf_equals_reference_hypothesis(gguf, block):
    x = np.array([block], dtype=np.float32)
    amax = float(np.abs(x).max())
    assume(amax == 0 or amax >= golden.TINY_M)  # gguf-py is undefined where 1/d overflows
    assert [a.tolist() for a in golden.gguf_q4_0(x)] == [a.tolist() for a in reference(x)]
