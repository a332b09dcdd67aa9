"""Case collection: ids, areas, -k expressions, and the expected bytes of quant edge cases."""

import numpy as np
import pytest

from mlconf import cases, fixtures, specs


def test_case_ids_are_unique_and_areas_filled():
    all_cases = cases.collect()
    ids = [c.id for c in all_cases]
    assert len(ids) == len(set(ids))
    for area in ("header", "loader"):
        assert any(c.area == area for c in all_cases), area


def test_every_rule_and_fixture_is_a_case():
    ids = {c.id for c in cases.collect(["header", "loader", "tokenizer"]) if c.capability != "encode"}
    for r in specs.load("mlb_errors")["rules"]:
        assert any(i.startswith(f"loader/{r['id']}/") for i in ids), r["id"]
    assert len(ids) == len(fixtures.catalog())


@pytest.mark.parametrize("expr, yes, no", [
    ("magic", ["loader/format.magic/gguf"], ["loader/format.version/two"]),
    ("MAGIC", ["loader/format.magic/gguf"], []),
    ("magic and not gguf", ["loader/format.magic/mlb2"], ["loader/format.magic/gguf"]),
    ("version or wtype", ["loader/format.version/two", "loader/format.wtype/zero"], ["header/q8_min"]),
    ("not (header or quant)", ["loader/format.magic/gguf"], ["header/q8_min", "quant/q8_0/x"]),
    ("header and (q4 or f16)", ["header/q4_search", "header/q8_f16"], ["header/q8_min"]),
])
def test_keyword_expressions(expr, yes, no):
    m = cases.keyword_matcher(expr)
    assert all(m(s) for s in yes) and not any(m(s) for s in no)


@pytest.mark.parametrize("expr", ["(magic", "magic and", "or magic", "magic )", "not"])
def test_malformed_keyword_expressions(expr):
    with pytest.raises(ValueError):
        cases.keyword_matcher(expr)


def test_block_values_forms():
    assert cases.block_values({"fill": 1.5, "at": {0: "0x1.8p1", 31: -2}}) == [3.0] + [1.5] * 30 + [-2.0]
    with pytest.raises(ValueError):
        cases.block_values([1.0] * 31)


def test_encode_expected_layouts():
    # Q8_0: 32 int8 then the scale; Q4_0: byte j = level j + 8 (low) | level j+16 + 8 (high)
    q, d = cases.encode_expected("q8_0", [-1] * 32, 0.5)
    assert q == b"\xff" * 32 and d == np.float32(0.5).tobytes()
    q, d = cases.encode_expected("q4_0_round_f16", [-8] * 16 + [7] * 16, 2.0)
    assert q == bytes([0xF0]) * 16 and d == b"\x00\x40"


def test_unknown_area():
    with pytest.raises(ValueError):
        cases.collect(["tokenizer-x"])
