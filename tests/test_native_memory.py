"""Decision runtime.memory_bound: the native runtime's state (ml_forward_init's allocations) stays
within what the file's arrays and ctx imply, for every fixture, golden and random valid model,
however large the header's unused fields are (issue 17: lin_v_heads 0xFFFFFFE0 in a model without
linear layers once reserved 16 GiB)."""

from __future__ import annotations

import cffi
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf import fixtures
from mlconf.backends.native import LIBRARY, abi
from mlconf.backends.reference import layout
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import mlb

CTX = 128


@pytest.fixture(scope="module")
def lib():
    if not LIBRARY.exists():
        pytest.skip("the native library is not built")
    ffi = cffi.FFI()
    ffi.cdef(abi.CDEF + "size_t mlrt_test_state_bytes(const ml_model *m);")
    return ffi, ffi.dlopen(str(LIBRARY))


def bound(path) -> int:
    """The decision's bound for ``path`` at ctx = min(max_seq, CTX)."""
    data = open(path, "rb").read(1 << 20)
    h = layout.parse_header(data)
    flags = data[256 : 256 + h["n_layers"]] if h["layer_flags"] else bytes(h["n_layers"])
    linear = sum(1 for b in flags if b & 8)
    d = layout.derive(h)
    ctx = min(h["max_seq"], CTX)
    lin = 4 * h["lin_v_heads"] * h["lin_k_dim"] * h["lin_v_dim"] * linear if linear else 0
    return (
        8 * ctx * d["kv_dim"] * (h["n_layers"] - linear)
        + lin
        + 4 * h["n_heads"] * ctx
        + 256 * len(open(path, "rb").read())
        + 65536
    )


def state_bytes(lib, path) -> int:
    ffi, L = lib
    h = layout.parse_header(open(path, "rb").read(256))
    out = ffi.new("ml_model **")
    reason = ffi.new("char[]", abi.REASON_LEN)
    st = L.ml_load(str(path).encode(), min(h["max_seq"], CTX), 1, out, reason, abi.REASON_LEN)
    assert st == abi.ML_OK, ffi.string(reason).decode()
    try:
        return L.mlrt_test_state_bytes(out[0])
    finally:
        L.ml_free(out[0])


def test_fixtures_and_goldens_stay_in_the_bound(lib, generated):
    out, made = generated
    paths = [out / f.file for f in made if f.kind in ("valid", "accepted") and f.file.endswith(".mlb")]
    paths += sorted((GOLDEN_DIR / "logits").glob("*.mlb"))
    assert len(paths) > 50
    for p in paths:
        got, most = state_bytes(lib, p), bound(p)
        assert 0 < got <= most, (p.name, got, most)


def test_unused_linear_fields_size_nothing(lib, tmp_path, generated):
    """The two accepted reproducers need no more state than q8_min itself."""
    out, _ = generated
    base = state_bytes(lib, out / "valid" / "q8_min.mlb")
    for name in (
        "lin_v_heads_huge_without_linear_layer",
        "lin_dims_overflow_without_linear_layer",
        "lin_fields_without_linear_layer",
    ):
        assert state_bytes(lib, out / "accepted" / f"{name}.mlb") == base, name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_valid_models_stay_in_the_bound(lib, valid_model_strategy, scratch, data):
    h, flags = data.draw(valid_model_strategy)
    path = scratch / "memory_bound.mlb"
    full = mlb.full_header(h)
    weights = fixtures.random_weights(full, flags, np.random.default_rng(0))
    mlb.write(path, full, weights, flags=flags, q4_rule="round")
    assert 0 < state_bytes(lib, path) <= bound(path)
