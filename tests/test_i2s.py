"""I2_S reference (backends/reference/i2s.py) against specs/i2s.yaml and an independent PyTorch
BitLinear written here in its own words."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlconf import specs
from mlconf.backends.reference import i2s
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import golden

SPEC = specs.load("i2s")
CASES = {c["name"]: c for c in SPEC["edge_cases"]}


def _num(v: object) -> float:
    return float.fromhex(v) if isinstance(v, str) else float(v)


def _vec(spec: dict, dtype: type, n: int = 128) -> np.ndarray:
    out = np.full(n, _num(spec["fill"]), dtype=dtype)
    for i, v in spec.get("at", {}).items():
        out[int(i)] = _num(v)
    return out


# ---------------------------------------------------------------- hand-derived spec cases


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["op"] == "ternarize"])
def test_spec_ternarize(name: str) -> None:
    case = CASES[name]
    w = _vec(case["w"], np.float32)
    data = i2s.payload(w)
    assert len(data) == 32 + 32
    assert data[:32].hex() == case["expect"]["packed"]
    assert data[32:].hex() == case["expect"]["payload_tail"]
    packed, d = i2s.quantize_tensor(w)
    assert d == _num(case["expect"]["d"])
    assert packed.dtype == np.uint8 and packed.shape == (32,)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["op"] == "activations"])
def test_spec_activations(name: str) -> None:
    case = CASES[name]
    xq, s = i2s.quantize_activations(_vec(case["x"], np.float32))
    assert s.dtype == np.float32 and s[0] == case["expect"]["scale"]
    np.testing.assert_array_equal(xq[0], _vec(case["expect"]["xq"], np.int64))
    assert int(xq.astype(np.int32).sum()) == case["expect"]["act_sum"]


def test_spec_bitlinear() -> None:
    case = CASES["bitlinear_one_row"]
    w, x = _vec(case["w"], np.float32), _vec(case["x"], np.float32)
    packed, d = i2s.quantize_tensor(w)
    xq, s = i2s.quantize_activations(x)
    sumi, act_sum = i2s.int_dot(packed, 1, 128, xq)
    assert sumi[0, 0] == case["expect"]["sumi"] and act_sum[0] == case["expect"]["act_sum"]
    y = i2s.bitlinear(x.reshape(1, -1), i2s.payload(w), (1, 128))
    assert y.dtype == np.float32 and y[0, 0] == case["expect"]["y"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["op"] == "dot"])
def test_spec_dot_sums_exactly(name: str) -> None:
    """A row where bitnet.cpp's AVX2 int16 lanes wrap: the reference's sums are the exact ones."""
    case, exp = CASES[name], CASES[name]["expect"]
    cols = int(case["cols"])
    codes = _vec(case["codes"], np.int64, cols)
    q = (codes - 1).astype(np.int8)
    x = _vec(case["x"], np.float32, cols)
    xq, s = i2s.quantize_activations(x)
    np.testing.assert_array_equal(xq[0], _vec(exp["xq"], np.int64, cols))
    sumi, act_sum = i2s.int_dot(i2s.pack(q), 1, cols, xq)
    assert sumi[0, 0] == exp["sumi"] == int((codes * xq[0]).sum()) and act_sum[0] == exp["act_sum"]
    assert exp["bitnet_cpp_sumi"] != exp["sumi"]
    # the wrap the case documents: 16 int16 lanes, each the sum of 256 products 2 * 127, wrapped
    lane = 256 * 2 * 127
    assert 16 * ((lane + 2**15) % 2**16 - 2**15) == exp["bitnet_cpp_sumi"]
    payload = i2s.pack(q).tobytes() + np.array([_num(case["d"])], "<f4").tobytes() + bytes(28)
    y = i2s.bitlinear(x.reshape(1, -1), payload, (1, cols))
    assert y[0, 0] == exp["y"]


def test_spec_decisions_have_fields() -> None:
    from mlconf import specs

    decisions = [d for d in specs.load("decisions") if d["id"].startswith("i2s.")]
    assert len(decisions) >= 10
    ids = [d["id"] for d in specs.load("decisions")]
    assert len(ids) == len(set(ids))
    for d in decisions:
        assert {"id", "question", "decision", "reason"} <= d.keys()


# ---------------------------------------------------------------- layout


def test_layout_each_position() -> None:
    # a single -1 (code 0) at each element of a block of otherwise zeros (code 1, 0x55)
    for k in range(128):
        q = np.zeros(128, np.int8)
        q[k] = -1
        b = i2s.pack(q)
        j, g = k % 32, k // 32
        want = np.full(32, 0x55, np.uint8)
        want[j] &= ~np.uint8(3 << (6 - 2 * g))
        np.testing.assert_array_equal(b, want)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.randoms(use_true_random=False))
def test_pack_unpack_roundtrip(rows: int, blocks: int, rnd) -> None:
    rng = np.random.default_rng(rnd.getrandbits(32))
    q = rng.integers(-1, 2, size=(rows, 128 * blocks)).astype(np.int8)
    packed = i2s.pack(q)
    assert packed.shape == (q.size // 4,)
    np.testing.assert_array_equal(i2s.unpack(packed, q.size).reshape(q.shape), q)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.randoms(use_true_random=False))
def test_dequantize_roundtrip(rows: int, blocks: int, rnd) -> None:
    rng = np.random.default_rng(rnd.getrandbits(32))
    w = rng.standard_normal((rows, 128 * blocks)).astype(np.float32)
    q, d = i2s.ternarize(w)
    data = i2s.payload(w)
    assert len(data) == w.size // 4 + 32
    np.testing.assert_array_equal(i2s.dequantize(data, w.shape), q.astype(np.float32) * np.float32(d))
    # requantizing the dequantized tensor keeps every code (|q * d / mean| >= 1 where q != 0)
    if q.any():
        np.testing.assert_array_equal(i2s.quantize_tensor(i2s.dequantize(data, w.shape))[0], i2s.pack(q))


def test_code3() -> None:
    packed = np.full(32, 0x55, np.uint8)
    packed[5] = 0x57  # element 101 (5 + 96) has code 3
    with pytest.raises(i2s.I2SError, match="code 3 at element 101"):
        i2s.unpack(packed, 128)
    # the integer dot on raw codes behaves like the kernel: code 3 acts as q = +2
    xq = np.zeros((1, 128), np.int8)
    xq[0, 101] = 7
    sumi, act_sum = i2s.int_dot(packed, 1, 128, xq)
    assert sumi[0, 0] - act_sum[0] == 14


# ---------------------------------------------------------------- integer identity


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.randoms(use_true_random=False))
def test_integer_identity(blocks: int, rows: int, tokens: int, rnd) -> None:
    rng = np.random.default_rng(rnd.getrandbits(32))
    cols = 128 * blocks
    q = rng.integers(-1, 2, size=(rows, cols)).astype(np.int8)
    y = rng.integers(-128, 128, size=(tokens, cols)).astype(np.int8)
    sumi, ysum = i2s.int_dot(i2s.pack(q), rows, cols, y)
    direct = y.astype(np.int64) @ q.astype(np.int64).T
    np.testing.assert_array_equal(sumi.astype(np.int64) - ysum[:, None], direct)


# ---------------------------------------------------------------- independent PyTorch BitLinear


def _torch_bitlinear(x_np: np.ndarray, w_np: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-tensor ternary weights, per-row absmax int8 activations, integer matmul, rescale.
    Returns (integer product sum_k q*xq as int64, float32 output)."""
    torch = pytest.importorskip("torch")
    w = torch.from_numpy(w_np)
    x = torch.from_numpy(x_np)
    # weights as BitNet's converter: beta = np.mean(np.abs(W)) in float32 (NumPy 1 and 2 sum alike
    # up to 8192 values), floored at 1e-5; W_t = round(W / beta) in {-1, 0, 1}; stored scale beta
    assert w_np.size <= 8192
    beta = torch.tensor(max(float(np.mean(np.abs(w_np))), 1e-5), dtype=torch.float32)
    inv = torch.tensor(1.0, dtype=torch.float32) / beta
    wt = torch.clamp(torch.round(w * inv), -1, 1)  # torch.round: half to even
    scale_w = beta
    # activations: gamma = max|x| per row (float64, floor 1e-5); Q = 127 / gamma; round half away
    gamma = torch.clamp(x.double().abs().amax(dim=1), min=1e-5)
    qscale = (127.0 / gamma).float()
    t = x * qscale[:, None]
    xi = torch.clamp(torch.sign(t) * torch.floor(t.abs().double() + 0.5), -128, 127)
    prod = xi.to(torch.int64) @ wt.to(torch.int64).T
    out = (prod.float() / qscale[:, None]) * scale_w.float()
    return prod.numpy(), out.numpy()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 4), st.randoms(use_true_random=False))
def test_bitlinear_matches_torch(blocks: int, rows: int, tokens: int, rnd) -> None:
    rng = np.random.default_rng(rnd.getrandbits(32))
    cols = 128 * blocks
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2)).astype(np.float32)
    x = (rng.standard_normal((tokens, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
    prod, ref = _torch_bitlinear(x, w)
    packed, d = i2s.quantize_tensor(w)
    xq, s = i2s.quantize_activations(x)
    sumi, act_sum = i2s.int_dot(packed, rows, cols, xq)
    np.testing.assert_array_equal(sumi.astype(np.int64) - act_sum[:, None], prod)  # exact
    y = i2s.bitlinear(x, i2s.payload(w), (rows, cols))
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6 * float(np.abs(ref).max() + 1))


# ---------------------------------------------------------------- edge cases


@pytest.mark.parametrize("cols", [64, 130, 0])
def test_partial_block_refused(cols: int) -> None:
    with pytest.raises(i2s.I2SError):
        i2s.quantize_tensor(np.ones((2, cols), np.float32))


def test_refusals() -> None:
    with pytest.raises(i2s.I2SError):
        i2s.quantize_tensor(np.ones((2, 128), np.float64))
    w = np.ones((2, 128), np.float32)
    w[1, 3] = np.nan
    with pytest.raises(i2s.I2SError):
        i2s.quantize_tensor(w)
    data = i2s.payload(np.ones((2, 128), np.float32))
    with pytest.raises(i2s.I2SError):
        i2s.dequantize(data[:-1], (2, 128))
    with pytest.raises(i2s.I2SError):
        i2s.quantize_activations(np.array([[np.inf] * 128], np.float32))


def test_tiny_tensor_under_floor() -> None:
    # mean|w| = 2e-6 < 1e-5: d = float32(1e-5), s = 1e5, |w * s| = 0.2 -> every q is 0, output 0
    w = np.full((1, 128), 2e-6, np.float32)
    packed, d = i2s.quantize_tensor(w)
    assert d == float(np.float32(1e-5)) and (packed == 0x55).all()
    y = i2s.bitlinear(np.ones((1, 128), np.float32), i2s.payload(w), (1, 128))
    assert (y == 0).all()


# ---------------------------------------------------------------- the stored scale: NumPy 1.26's mean
MEAN_GOLDEN = GOLDEN_DIR / "i2s_mean_numpy126.npz"


def _numpy2_abs_mean(w: np.ndarray) -> np.float32:
    """NumPy 2's np.mean(np.abs(w)) of a float32 array, written out: one pairwise pass from 0 over
    the whole array (no 8192 chunks), then / n."""
    return np.float32(np.float64(np.float32(0) + i2s.pairwise_sum(np.abs(w.reshape(-1)))) / w.size)


def test_abs_mean_is_numpy_1_26_s():
    """The reference's mean (the stored scale) against NumPy 1.26.4's own np.mean on 55 seeded
    tensors of 128 .. 1M values (golden/i2s_mean_numpy126.npz): every bit."""
    g = np.load(MEAN_GOLDEN)
    ws = golden.i2s_mean_inputs()
    assert [w.size for w in ws] == g["sizes"].tolist()
    got = np.array([i2s.abs_mean(w) for w in ws], dtype=np.float32).view(np.uint32)
    bad = np.flatnonzero(got != g["mean_bits"])
    assert bad.size == 0, f"tensors {bad.tolist()} (sizes {g['sizes'][bad].tolist()}) differ from NumPy 1.26"
    # and the scale the reference stores is that mean
    assert i2s.ternarize(ws[3].reshape(8, 128))[1] == float(g["mean_bits"][3:4].view(np.float32)[0])


def test_installed_numpy_sums_as_this_file_says():
    """Why the pinned NumPy matters: NumPy 1.26 reduces in chunks of 8192 (the reference's rule),
    NumPy 2 in one pairwise pass; they agree up to 8192 values and not always above."""
    ws = golden.i2s_mean_inputs()
    ours = np.array([i2s.abs_mean(w) for w in ws])
    theirs = np.array([np.mean(np.abs(w)) for w in ws])
    small = np.array([w.size <= i2s.NUMPY_BUFSIZE for w in ws])
    assert (ours[small] == theirs[small]).all()
    if np.__version__.startswith("1."):
        assert (ours == theirs).all()
    else:
        assert all(_numpy2_abs_mean(w) == t for w, t in zip(ws, theirs, strict=True))
        assert (ours[~small] != theirs[~small]).any(), "NumPy 2 now sums large tensors like NumPy 1.26"


@pytest.mark.oracle
def test_mean_golden_rederives_under_numpy_1_26(tmp_path):
    if not np.__version__.startswith("1.26."):
        pytest.skip(f"the golden is NumPy 1.26.4's (bitnet.cpp's pin); installed NumPy {np.__version__}")
    path = golden.generate("i2s_mean", tmp_path)
    assert golden.sha256(path) == golden.sha256(MEAN_GOLDEN)


def test_float16_input_widened_exactly() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((2, 256)).astype(np.float16)
    assert i2s.payload(w) == i2s.payload(w.astype(np.float32))


def test_zero_activation_row() -> None:
    w = np.random.default_rng(2).standard_normal((3, 128)).astype(np.float32)
    x = np.zeros((2, 128), np.float32)
    x[1, 0] = 1.0
    y = i2s.bitlinear(x, i2s.payload(w), (3, 128))
    assert (y[0] == 0).all()


def test_epilogue_float32_steps() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 256)).astype(np.float32)
    x = (rng.standard_normal((3, 256)) * 4).astype(np.float32)
    packed, d = i2s.quantize_tensor(w)
    xq, s = i2s.quantize_activations(x)
    sumi, act_sum = i2s.int_dot(packed, 5, 256, xq)
    y = i2s.dot(packed, (5, 256), xq, s, d)
    f = np.float32
    for t in range(3):
        for r in range(5):
            want = ((f(int(sumi[t, r])) - f(int(act_sum[t]))) / s[t]) * f(d)
            assert y[t, r] == want
