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
    ids = {c.id for c in cases.collect(["header", "loader", "tokenizer", "bitnet"]) if c.compare == "status"}
    for r in specs.load("mlb_errors")["rules"]:
        assert any(i.startswith(f"loader/{r['id']}/") for i in ids), r["id"]
    for r in specs.load("gguf")["rules"]:
        assert any(i.startswith(f"bitnet/gguf/{r['id']}/") for i in ids), r["id"]
    assert len(ids) == len(fixtures.catalog())


@pytest.mark.parametrize(
    "expr, yes, no",
    [
        ("magic", ["loader/format.magic/gguf"], ["loader/format.version/two"]),
        ("MAGIC", ["loader/format.magic/gguf"], []),
        ("magic and not gguf", ["loader/format.magic/mlb2"], ["loader/format.magic/gguf"]),
        ("version or wtype", ["loader/format.version/two", "loader/format.wtype/zero"], ["header/q8_min"]),
        ("not (header or quant)", ["loader/format.magic/gguf"], ["header/q8_min", "quant/q8_0/x"]),
        ("header and (q4 or f16)", ["header/q4_search", "header/q8_f16"], ["header/q8_min"]),
    ],
)
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


# ---------------------------------------------------------------- the bitnet area
def _bitnet_kind(kind: str) -> list:
    return [c for c in cases.collect(["bitnet"]) if c.id.split("/")[1] == kind]


def test_bitnet_i2s_case_counts():
    edge = specs.load("i2s")["edge_cases"]
    n_op = {op: sum(e["op"] == op for e in edge) for op in ("ternarize", "activations", "bitlinear", "dot")}
    pack, act, matmul = _bitnet_kind("i2s_pack"), _bitnet_kind("i2s_act"), _bitnet_kind("i2s_matmul")
    n_random = len(cases.I2S_RANDOM)
    assert (cases.BITNET_DIR / "i2s_edge.npz").exists()
    with np.load(cases.BITNET_DIR / "i2s_edge.npz") as g:
        n_golden = sum(k.startswith("w_") for k in g.files)
    assert n_golden and len([c for c in pack if "/golden/" in c.id]) == n_golden
    assert len(pack) == n_op["ternarize"] + n_golden + len(cases.I2S_REFUSED) + n_random
    assert len(act) == n_op["activations"] + 1 + n_random
    assert n_op["dot"] >= 1 and len(matmul) == n_op["bitlinear"] + n_op["dot"] + 2 + n_random
    refused = {c.id.rsplit("/", 1)[1] for c in pack if c.compare == "refused"}
    assert refused == {"cols_64", "cols_130", "nan_weight"}
    assert {c.id for c in matmul if c.compare == "refused"} >= {"bitnet/i2s_matmul/refused/code3"}
    for c in pack + act + matmul:
        assert c.capability == "i2s" and c.compare in ("bit-exact", "refused")
        assert (c.params.get("expected_from") == "reference") == c.id.endswith("/vs_reference")
        assert (c.expected is None) == (c.compare == "refused" or c.id.endswith("/vs_reference"))


def test_bitnet_embed_case_counts():
    names = cases.bitnet_goldens()
    assert names, "golden/bitnet has no NAME.gguf + NAME.npz"
    embed = _bitnet_kind("embed")
    ids = [c.id for c in embed]
    assert len(ids) == len(set(ids))
    per = 3 * len(cases.EMBED_POOLINGS) * 2  # sequences x poolings x normalize
    tolerances = {
        "ternary": ("embeddings_vs_oracle", "embeddings_runtime_vs_reference"),
        "float": ("embeddings_float_vs_oracle", "embeddings_float_vs_reference"),
    }
    for name in names:
        own = str(np.load(cases.BITNET_DIR / f"{name}.npz")["reading"])
        mine = [c for c in embed if c.id.startswith(f"bitnet/embed/{name}/")]
        long = [c for c in mine if f"/long_{cases.EMBED_LONG}/" in c.id]  # the reference's, own reading
        assert len(long) == len(cases.EMBED_POOLINGS)
        assert all(
            c.params["expected_from"] == "reference"
            and c.params["tolerance"] == tolerances[own][1]
            and c.params["reading"] is None
            and c.params["tokens"].size == cases.EMBED_LONG
            for c in long
        )
        mine = [c for c in mine if c not in long]
        for reading in (None, "ternary"):  # the file's own reading, and the ternary option
            sel = [c for c in mine if c.params["reading"] == reading]
            if reading == "ternary" and (own == "ternary" or name.endswith("teacher_f16")):
                assert not sel  # i2_s: own reading already; a teacher has no ternary reading
                continue
            vs_oracle, vs_ref = tolerances[reading or own]
            own_pooling = [
                c for c in sel if c.id.endswith("/model_pooling")
            ]  # ML_POOL_MODEL, one per sequence
            assert len(own_pooling) == 3 and all(c.params["pooling"] is None for c in own_pooling)
            sel = [c for c in sel if c not in own_pooling]
            oracle = [c for c in sel if not c.id.endswith("/vs_reference")]
            assert len(oracle) == per and all(c.params["tolerance"] == vs_oracle for c in oracle)
            assert all(("/ternary/" in c.id) == (reading == "ternary") for c in sel)
            vs = [c for c in sel if c.id.endswith("/vs_reference")]
            assert len(vs) == per and all(
                c.params["tolerance"] == vs_ref and c.params["expected_from"] == "reference" for c in vs
            )
        oracle = [c for c in mine if not c.id.endswith("/vs_reference")]
        refused = {
            c.id.rsplit("/", 1)[1]
            for c in embed
            if c.id.startswith(f"bitnet/embed/refused/{name}/") and c.params["op"] == "open"
        }
        tensors = cases.gguf_tensors(cases.BITNET_DIR / f"{name}.gguf")
        has_i2s = any(t["type"] == cases.GGUF_I2_S for t in tensors)
        assert refused == set(cases.GGUF_DAMAGE) - (set() if has_i2s else {"code3"})
        for c in oracle:
            assert c.expected.dtype == np.float32 and c.expected.ndim == 1
    bad_calls = [c for c in embed if c.params.get("op") == "embed_call"]
    assert len(bad_calls) == len(cases.EMBED_BAD_CALLS)
    students_f = sum(
        1
        for n in names
        if str(np.load(cases.BITNET_DIR / f"{n}.npz")["reading"]) == "float" and not n.endswith("teacher_f16")
    )  # float students are read ternary too
    assert len(embed) == (len(names) + students_f) * (2 * per + 3) + len(names) * len(
        cases.EMBED_POOLINGS
    ) + sum(1 for c in embed if c.params.get("op") == "open") + len(bad_calls)


def test_bitnet_spec_payloads_are_consistent():
    """The spec's packed bytes and tail agree with its d and with the layout rule (pack_codes)."""
    for c in _bitnet_kind("i2s_pack"):
        if c.compare != "bit-exact" or "d" not in c.params:
            continue
        tail = c.expected[-32:]
        assert tail[:4] == np.float32(c.params["d"]).tobytes() and tail[4:] == bytes(28), c.id
    # element_positions: zeros (code 1) but element 33 (+1, code 2) and 96 (-1, code 0)
    codes = np.ones(128, dtype=np.uint8)
    codes[33], codes[96] = 2, 0
    assert cases.pack_codes(codes)[:2].tobytes() == bytes([0x54, 0x65])
    assert len(cases.i2s_payload_bytes(cases.pack_codes(codes), 2.0)) == 64


def test_gguf_tensors_reads_the_goldens():
    for name in cases.bitnet_goldens():
        path = cases.BITNET_DIR / f"{name}.gguf"
        infos = cases.gguf_tensors(path)
        size = path.stat().st_size
        assert any(t["name"] == "token_embd.weight" for t in infos)
        for t in infos:
            assert t["nbytes"] is not None and t["offset"] + t["nbytes"] <= size, t
