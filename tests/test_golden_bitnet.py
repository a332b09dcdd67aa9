"""The BitNet goldens (golden/bitnet): the reference embedding against the PyTorch BitLinear
oracle's, the reference I2_S payload against the bitnet.cpp packing transcription's, and the
oracle re-derivation of every file (pytest -m oracle)."""

import dataclasses

import numpy as np
import pytest

from mlconf import specs
from mlconf.backends.reference import bitnet, i2s
from mlconf.compare import distances, within
from mlconf.golden import GOLDEN_DIR
from mlconf.tools.golden_bitnet import CASES, EDGE, LENGTHS, NAMES, POOLINGS

pytest.importorskip("gguf")  # load_gguf reads with gguf-py

DIR = GOLDEN_DIR / "bitnet"
MODELS = sorted(CASES)


def load(name):
    return bitnet.load_gguf(DIR / f"{name}.gguf"), np.load(DIR / f"{name}.npz")


def test_every_case_has_a_committed_golden():
    assert sorted(p.name for p in DIR.iterdir()) == sorted(
        [f"{n}.gguf" for n in CASES] + [f"{n}.npz" for n in NAMES]
    )


@pytest.mark.parametrize("name", MODELS)
def test_golden_npz_contract(name):
    m, g = load(name)
    case = CASES[name]
    dim, vocab = m.hp["dim"], m.tensors["token_embd.weight"].shape[0]
    keys = {"reading"} | {f"tokens_{i}" for i in range(3)}
    keys |= {
        f"{pre}{p}{s}_{i}" for pre in case.readings for p in POOLINGS for s in ("", "_norm") for i in range(3)
    }
    if not case.teacher:
        keys |= {"pins_call", "pins_index", "pins_value"}
    assert set(g.files) == keys
    assert str(g["reading"]) == m.reading == case.readings[""]
    assert m.norm_in != case.teacher
    for i, n in enumerate(LENGTHS):
        t = g[f"tokens_{i}"]
        assert t.dtype == np.int32 and t.shape == (n,) and 0 <= t.min() and t.max() < vocab
        for pre in case.readings:
            for p in POOLINGS:
                assert g[f"{pre}{p}_{i}"].dtype == np.float32 and g[f"{pre}{p}_{i}"].shape == (dim,)
                assert abs(np.linalg.norm(g[f"{pre}{p}_norm_{i}"]) - 1) < 1e-6
    if m.arch == "gemma3":
        assert max(LENGTHS) > m.hp["window"]  # the sliding window is exercised


def test_goldens_cover_both_archs_readings_and_teachers():
    cases = CASES.values()
    want = {(f, t) for f in ("qwen3", "gemma3_text") for t in (False, True)}
    assert {(c.flavor, c.teacher) for c in cases} >= want
    assert {r for c in cases for r in c.readings.values()} == {"float", "ternary"}
    assert any(c.outtype != "i2_s" and "ternary_" in c.readings for c in cases)


TOLERANCE = {"ternary": "embeddings_vs_oracle", "float": "embeddings_float_vs_oracle"}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("normalize", (False, True), ids=("raw", "norm"))
def test_reference_embedding_matches_oracle(name, pooling, normalize):
    m, g = load(name)
    for prefix, reading in CASES[name].readings.items():
        for i in range(len(LENGTHS)):
            got = bitnet.embed(
                m,
                g[f"tokens_{i}"],
                pooling=pooling,
                normalize=normalize,
                reading=None if prefix == "" else reading,
            )
            want = g[f"{prefix}{pooling}_norm_{i}" if normalize else f"{prefix}{pooling}_{i}"]
            assert got.dtype == np.float32 and got.shape == want.shape
            ok, over = within(TOLERANCE[reading], distances(got, want))
            assert ok, f"{name} {reading} tokens_{i} {pooling} normalize={normalize}: {over}"


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.outtype == "f16"])
def test_float_reading_rounds_activations_to_f16(name):
    """The float reading of an F16 file rounds each projection's input to f16 (llama.cpp's F16
    matmul): without that rounding the result is another, measurably (nmse > 1e-9)."""
    m, g = load(name)
    plain = {k: dataclasses.replace(lin, f16=False) for k, lin in m.linears.items()}
    unrounded = dataclasses.replace(m, linears=plain)
    t = g["tokens_2"]
    d = distances(bitnet.embed(unrounded, t, reading="float"), bitnet.embed(m, t, reading="float"))
    assert d["nmse"] > 1e-9, d


def test_edge_payloads_equal_reference_byte_for_byte():
    g = np.load(DIR / f"{EDGE}.npz")
    names = list(g["names"])
    assert len(names) >= 7
    for n in names:
        w, want = g[f"w_{n}"], g[f"payload_{n}"]
        assert want.dtype == np.uint8 and want.size == w.size // 4 + 32, n
        assert i2s.payload(w) == want.tobytes(), n


def test_edge_golden_holds_the_spec_cases():
    """The transcription's bytes of the spec's ternarize cases are the spec's expected bytes."""
    g = np.load(DIR / f"{EDGE}.npz")
    cases = [c for c in specs.load("i2s")["edge_cases"] if c["op"] == "ternarize"]
    assert cases
    for c in cases:
        payload = g[f"payload_{c['name']}"].tobytes()
        assert payload[:32].hex() == c["expect"]["packed"], c["name"]
        assert payload[32:].hex() == c["expect"]["payload_tail"], c["name"]


@pytest.mark.oracle
def test_oracle_rederives_every_golden(tmp_path):
    """Inputs (the GGUFs, tokens, packing tensors and payloads) byte for byte; the embeddings,
    re-derived with the committed pins, within the measured cross-host bound
    (specs/tolerances.yaml oracle_rederive_embeddings)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mlconf.tools import golden_bitnet, golden_drift

    golden_bitnet.generate(NAMES, tmp_path / "bitnet", pins_from=DIR)
    result = golden_drift.compare(tmp_path, families=["bitnet"])
    assert result["inputs_differ"] == [], f"inputs differ from the goldens: {result['inputs_differ']}"
    ok, over = golden_drift.within(result, "embeddings")
    assert ok, over


@pytest.mark.oracle
def test_pins_take_the_committed_rounding_near_a_boundary():
    """A committed pin decides an activation within PIN_MARGIN of k + 0.5, and only there."""
    torch = pytest.importorskip("torch")
    from mlconf.tools.golden_bitnet import PIN_MARGIN, Pins

    t = torch.tensor([[2.5 + PIN_MARGIN / 2, -7.5, 3.2, 1.5 + 2 * PIN_MARGIN]], dtype=torch.float64)
    fresh = Pins()
    assert fresh.round(t.clone()).tolist() == [[3.0, -8.0, 3.0, 2.0]]
    rec = fresh.arrays()
    assert rec["pins_call"].tolist() == [0, 0] and rec["pins_index"].tolist() == [0, 1]
    assert rec["pins_value"].tolist() == [3, -8]
    # another host's committed roundings: index 0 went down, index 1 the same, index 2 is far
    # from a boundary (a pin there is ignored)
    committed = {
        "pins_call": np.array([0, 0, 0]),
        "pins_index": np.array([0, 1, 2]),
        "pins_value": np.array([2, -8, 4]),
    }
    replay = Pins(committed)
    assert replay.round(t.clone()).tolist() == [[2.0, -8.0, 3.0, 2.0]]
    assert replay.overridden == 1
    assert replay.round(t.clone()).tolist() == [[3.0, -8.0, 3.0, 2.0]]  # call 1: nothing committed


def test_packing_transcription_agrees_on_fresh_tensors():
    """The converter's transcription on fresh tensors (grid values, and random bit patterns whose
    mean is inexact, up to its 8192 values), against the reference: both must agree."""
    from mlconf.tools import golden_bitnet

    rng = np.random.default_rng(11)
    tensors = [(rng.integers(-64, 65, (2, 256)) / 64).astype(np.float32)]
    for shape in ((1, 128), (5, 384), (8, 1024)):
        bits = rng.integers(0x30000000, 0x42000000, shape, dtype=np.uint32) | (
            rng.integers(0, 2, shape, dtype=np.uint32) << 31
        )
        tensors.append(bits.view(np.float32))
    for w in tensors:
        assert golden_bitnet.converter_quantize_to_i2_s(w) == i2s.payload(w), w.shape
    with pytest.raises(ValueError, match="whole blocks"):
        golden_bitnet.converter_quantize_to_i2_s(np.ones((1, 200), np.float32))


def test_transcription_mean_is_numpy_1_26_s():
    """The transcription's np.mean is NumPy 1.26.4's own, on the 55 tensors of the NumPy 1.26
    golden (up to 1M values: many buffers)."""
    from mlconf.tools import golden, golden_bitnet

    g = np.load(GOLDEN_DIR / "i2s_mean_numpy126.npz")
    got = [golden_bitnet.numpy126_abs_mean(w).view(np.uint32) for w in golden.i2s_mean_inputs()]
    assert got == g["mean_bits"].tolist()
