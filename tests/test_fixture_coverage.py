"""The valid fixtures cover every header feature: each optional field non-zero somewhere, every
enumerated value, every layer-flag bit and every q8_mask bit."""

from mlconf import fixtures, specs


def _bases():
    return fixtures.base_specs()


def test_every_optional_field_is_nonzero_in_some_fixture():
    fields = specs.load("mlb_header")["fields"]
    optional = [f["name"] for f in fields if f["zero_means"] is not None and f["type"] != "pad"]
    for name in optional:
        assert any(b["header"].get(name) for b in _bases().values()), name


def test_every_enumerated_value_appears():
    seen = {
        k: {b["header"].get(k, 0) for b in _bases().values()}
        for k in ("wtype", "rope_type", "act", "scale_f16")
    }
    assert seen == {"wtype": {1, 2}, "rope_type": {0, 1, 2, 3}, "act": {0, 1}, "scale_f16": {0, 1}}
    assert {b["q4_rule"] for b in _bases().values() if b["header"]["wtype"] == 2} == {"search", "round"}
    assert any(b.get("imatrix") for b in _bases().values())


def test_every_flag_bit_and_mask_bit_appears():
    flag_bits = {
        bit for b in _bases().values() for f in b.get("flags") or [] for bit in range(8) if f >> bit & 1
    }
    assert flag_bits == {0, 1, 2, 3}
    mask_bits = {
        bit for b in _bases().values() for bit in range(7) if b["header"].get("q8_mask", 0) >> bit & 1
    }
    assert mask_bits == set(range(7))
    # the shared-classifier rule of q8_mask (tok_emb is Q8_0 if bit 1 or 2 is set) is exercised
    assert any(
        b["header"].get("shared_classifier") and b["header"].get("q8_mask", 0) & 3 for b in _bases().values()
    )
