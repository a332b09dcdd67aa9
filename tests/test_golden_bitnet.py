"""The BitNet goldens (golden/bitnet): the reference embedding against the PyTorch BitLinear
oracle's, the reference I2_S payload against the bitnet.cpp packing transcription's, and the
oracle re-derivation of every file (pytest -m oracle)."""

import numpy as np
import pytest

from mlconf import specs
from mlconf.backends.reference import bitnet, i2s
from mlconf.compare import distances, within
from mlconf.golden import GOLDEN_DIR
from mlconf.tools.golden_bitnet import CASES, EDGE, LENGTHS, NAMES, POOLINGS

pytest.importorskip("gguf")   # load_gguf reads with gguf-py

DIR = GOLDEN_DIR / "bitnet"
MODELS = sorted(CASES)


def load(name):
    return bitnet.load_gguf(DIR / f"{name}.gguf"), np.load(DIR / f"{name}.npz")


def test_every_case_has_a_committed_golden():
    assert sorted(p.name for p in DIR.iterdir()) == sorted(
        [f"{n}.gguf" for n in CASES] + [f"{n}.npz" for n in NAMES])


@pytest.mark.parametrize("name", MODELS)
def test_golden_npz_contract(name):
    m, g = load(name)
    dim, vocab = m.hp["dim"], m.tensors["token_embd.weight"].shape[0]
    keys = {f"tokens_{i}" for i in range(3)} | {f"{p}{s}_{i}" for p in POOLINGS for s in ("", "_norm")
                                                 for i in range(3)}
    assert set(g.files) == keys
    for i, n in enumerate(LENGTHS):
        t = g[f"tokens_{i}"]
        assert t.dtype == np.int32 and t.shape == (n,) and 0 <= t.min() and t.max() < vocab
        for p in POOLINGS:
            assert g[f"{p}_{i}"].dtype == np.float32 and g[f"{p}_{i}"].shape == (dim,)
            assert abs(np.linalg.norm(g[f"{p}_norm_{i}"]) - 1) < 1e-6
    if m.arch == "gemma3":
        assert max(LENGTHS) > m.hp["window"]   # the sliding window is exercised


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("normalize", (False, True), ids=("raw", "norm"))
def test_reference_embedding_matches_oracle(name, pooling, normalize):
    m, g = load(name)
    for i in range(len(LENGTHS)):
        got = bitnet.embed(m, g[f"tokens_{i}"], pooling=pooling, normalize=normalize)
        want = g[f"{pooling}_norm_{i}" if normalize else f"{pooling}_{i}"]
        assert got.dtype == np.float32 and got.shape == want.shape
        ok, over = within("embeddings_vs_oracle", distances(got, want))
        assert ok, f"{name} tokens_{i} {pooling} normalize={normalize}: {over}"


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
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mlconf.tools import golden_bitnet

    golden_bitnet.generate(NAMES, tmp_path)
    for name in NAMES:
        if name in CASES:
            assert (tmp_path / f"{name}.gguf").read_bytes() == (DIR / f"{name}.gguf").read_bytes(), name
        fresh, want = np.load(tmp_path / f"{name}.npz"), np.load(DIR / f"{name}.npz")
        assert sorted(fresh.files) == sorted(want.files), name
        for k in want.files:
            if want[k].dtype.kind == "f":
                np.testing.assert_allclose(fresh[k], want[k], rtol=0, atol=1e-6, err_msg=f"{name} {k}")
            else:   # token ids, packed bytes, names: exact
                np.testing.assert_array_equal(fresh[k], want[k], err_msg=f"{name} {k}")


@pytest.mark.oracle
def test_packing_transcription_agrees_on_a_fresh_tensor():
    """The transcription itself on a fresh tensor, against the reference (both must agree)."""
    pytest.importorskip("torch")
    from mlconf.tools import golden_bitnet

    w = (np.random.default_rng(11).integers(-64, 65, (2, 256)) / 64).astype(np.float32)
    got = golden_bitnet.quantize_i2_s(golden_bitnet.converter_weight_quant(w))
    assert got == i2s.payload(w)
