"""The normative YAML against the seed (000_ff09b1667d2ad826.txt) and against itself.

The seed's header table and validation table are restated here in the test's own words, so a
field or rule dropped from the YAML (or moved, retyped, or given another status) fails.
"""

from __future__ import annotations

import pytest

from mlconf import specs
from mlconf.backends.reference import loader

# The seed's header table: (name, offset, type), offset 0 to the padding at 160.
SEED_HEADER = [
    ("magic", 0, "char4"),
    ("version", 4, "u32"),
    ("dim", 8, "u32"),
    ("n_layers", 12, "u32"),
    ("n_heads", 16, "u32"),
    ("n_kv_heads", 20, "u32"),
    ("hidden_dim", 24, "u32"),
    ("vocab", 28, "u32"),
    ("max_seq", 32, "u32"),
    ("rope_theta", 36, "f32"),
    ("norm_eps", 40, "f32"),
    ("wtype", 44, "u32"),
    ("shared_classifier", 48, "u32"),
    ("rope_type", 52, "u32"),
    ("rope_factor", 56, "f32"),
    ("rope_low_freq_factor", 60, "f32"),
    ("rope_high_freq_factor", 64, "f32"),
    ("rope_orig_max_seq", 68, "u32"),
    ("q8_mask", 72, "u32"),
    ("qkv_bias", 76, "u32"),
    ("head_dim", 80, "u32"),
    ("qk_norm", 84, "u32"),
    ("rope_attn_factor", 88, "f32"),
    ("sliding_window", 92, "u32"),
    ("layer_flags", 96, "u32"),
    ("rope_local_theta", 100, "f32"),
    ("act", 104, "u32"),
    ("post_norms", 108, "u32"),
    ("embed_scale", 112, "f32"),
    ("attn_scale", 116, "f32"),
    ("scale_f16", 120, "u32"),
    ("attn_softcap", 124, "f32"),
    ("final_softcap", 128, "f32"),
    ("rot_dim", 132, "u32"),
    ("attn_gate", 136, "u32"),
    ("lin_k_heads", 140, "u32"),
    ("lin_v_heads", 144, "u32"),
    ("lin_k_dim", 148, "u32"),
    ("lin_v_dim", 152, "u32"),
    ("lin_conv", 156, "u32"),
]

FORMAT, SHAPE, IO = "ML_E_FORMAT", "ML_E_SHAPE", "ML_E_IO"

# The seed's validation table, phrase by phrase: (status the seed gives it, rule ids that check it).
SEED_VALIDATION = {
    "file cannot be opened": (IO, ["io.open"]),
    "empty file": (FORMAT, ["format.empty"]),
    "file shorter than the header": (FORMAT, ["format.short_header"]),
    "bad magic": (FORMAT, ["format.magic"]),
    "bad version": (FORMAT, ["format.version"]),
    "unknown wtype": (FORMAT, ["format.wtype"]),
    "unknown rope_type": (FORMAT, ["format.rope_type"]),
    "invalid llama3 parameters": (
        FORMAT,
        [
            "format.llama3.factor",
            "format.llama3.low_freq_factor",
            "format.llama3.high_freq_factor",
            "format.llama3.orig_max_seq",
        ],
    ),
    "invalid linear parameters": (FORMAT, ["format.linear.factor"]),
    "invalid yarn parameters": (
        FORMAT,
        [
            "format.yarn.factor",
            "format.yarn.beta_slow",
            "format.yarn.beta_order",
            "format.yarn.orig_max_seq",
            "format.yarn.attn_factor",
        ],
    ),
    "a rope_attn_factor without yarn": (FORMAT, ["format.rope_attn_factor_without_yarn"]),
    "qkv_bias other than 0 or 1": (FORMAT, ["format.bool.qkv_bias"]),
    "qk_norm other than 0 or 1": (FORMAT, ["format.bool.qk_norm"]),
    "layer_flags other than 0 or 1": (FORMAT, ["format.bool.layer_flags"]),
    "post_norms other than 0 or 1": (FORMAT, ["format.bool.post_norms"]),
    "scale_f16 other than 0 or 1": (FORMAT, ["format.bool.scale_f16"]),
    "an unknown act": (FORMAT, ["format.act"]),
    "a negative or non-finite embed_scale": (FORMAT, ["format.embed_scale"]),
    "a negative or non-finite attn_scale": (FORMAT, ["format.attn_scale"]),
    "a negative or non-finite attn_softcap": (FORMAT, ["format.attn_softcap"]),
    "a negative or non-finite final_softcap": (FORMAT, ["format.final_softcap"]),
    "unknown layer flag bits": (FORMAT, ["format.layer.unknown_bits"]),
    "a layer with both the local RoPE base and no RoPE": (FORMAT, ["format.layer.local_and_norope"]),
    "a negative rope_local_theta": (FORMAT, ["format.rope_local_theta"]),
    "a local-RoPE layer without one": (FORMAT, ["format.layer.local_without_theta"]),
    "sliding_window above 2^24": (FORMAT, ["format.sliding_window"]),
    "file shorter than the arrays the header implies": (FORMAT, ["format.truncated_body"]),
    "a Q8 quant equal to -128": (FORMAT, ["format.q8_minus128"]),
    "zero dimension": (
        SHAPE,
        [
            "shape.zero.dim",
            "shape.zero.n_layers",
            "shape.zero.n_heads",
            "shape.zero.n_kv_heads",
            "shape.zero.hidden_dim",
        ],
    ),
    "over-limit dimension": (
        SHAPE,
        [
            "shape.limit.dim",
            "shape.limit.n_layers",
            "shape.limit.n_heads",
            "shape.limit.n_kv_heads",
            "shape.limit.hidden_dim",
            "shape.limit.vocab",
            "shape.limit.max_seq",
        ],
    ),
    "dim not a multiple of 32": (SHAPE, ["shape.dim_multiple_32"]),
    "hidden_dim not a multiple of 32": (SHAPE, ["shape.hidden_multiple_32"]),
    "dim % n_heads != 0 without head_dim": (SHAPE, ["shape.heads_divide_dim"]),
    "n_heads % n_kv_heads != 0": (SHAPE, ["shape.kv_divide_heads"]),
    "odd head_dim": (SHAPE, ["shape.odd_head_dim"]),
    "q_dim not a multiple of 32": (SHAPE, ["shape.q_dim_multiple_32"]),
    "q_dim above 65536": (SHAPE, ["shape.q_dim_limit"]),
    "vocab < 3": (SHAPE, ["shape.vocab_min"]),
}


def _header() -> dict:
    return specs.load("mlb_header")


def _errors() -> dict:
    return specs.load("mlb_errors")


def _rule_ids() -> list[str]:
    return [r["id"] for r in _errors()["rules"]]


# ---------------------------------------------------------------- header
def test_header_fields_match_seed_table():
    got = [(f["name"], f["offset"], f["type"]) for f in _header()["fields"] if f["name"] != "padding"]
    assert got == SEED_HEADER


def test_header_fields_contiguous_and_padded_to_256():
    spec = _header()
    assert spec["size"] == 256
    fields = spec["fields"]
    pos = 0
    for f in fields[:-1]:
        assert f["offset"] == pos, f["name"]
        assert f["type"] in ("u32", "f32", "char4"), f["name"]
        pos += 4
    pad = fields[-1]
    assert (pad["name"], pad["offset"], pad["size"]) == ("padding", 160, 96)
    assert pad["offset"] == pos and pad["offset"] + pad["size"] == 256


def test_header_limits_match_seed():
    lim = _header()["limits"]
    assert lim["vocab"] == 2**24 and lim["max_seq"] == 2**24 and lim["sliding_window"] == 2**24
    assert lim["q_dim"] == 65536


def test_header_rules_exist():
    ids = set(_rule_ids())
    for f in _header()["fields"]:
        for r in f["rules"]:
            assert r in ids, f"{f['name']}: rule {r} is not in mlb_errors.yaml"


def test_every_checked_field_names_a_rule():
    """Every field with a constraint other than 'any value' names at least one rule."""
    for f in _header()["fields"]:
        if f["name"] == "shared_classifier":
            continue  # the seed: any non-zero value means shared
        assert f["rules"], f"{f['name']} has no rule"


# ---------------------------------------------------------------- errors
def test_rules_are_unique():
    ids = _rule_ids()
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("rule", _errors()["rules"], ids=lambda r: r["id"])
def test_rule_well_formed(rule):
    statuses = _errors()["statuses"]
    assert rule["status"] in statuses
    assert rule["status"] != "ML_OK"
    assert rule.get("cases"), "every rule needs at least one case"
    assert ("seed" in rule) or ("decision" in rule), "a rule is either the seed's or a decision"
    names = [c["name"] for c in rule["cases"]]
    assert len(names) == len(set(names)), "case names must be unique within a rule"
    prefix = rule["id"].split(".")[0]
    assert {"io": IO, "format": FORMAT, "shape": SHAPE}[prefix] == rule["status"]


def test_statuses_are_the_c_abi_values():
    assert _errors()["statuses"] == {"ML_OK": 0, "ML_E_IO": 1, "ML_E_FORMAT": 2, "ML_E_SHAPE": 3}


def test_loader_implements_exactly_the_rules():
    assert set(loader.RULES) == set(_rule_ids())


def test_case_bases_exist():
    bases = {f["name"] for f in specs.load("mlb_fixtures")["fixtures"]}
    err = _errors()
    cases = [c for r in err["rules"] for c in r["cases"]] + list(err["accepted"])
    for c in cases:
        assert c["base"] in bases, f"case {c['name']}: base {c['base']} is not a fixture"


def test_accepted_names_unique():
    names = [c["name"] for c in _errors()["accepted"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("phrase", sorted(SEED_VALIDATION))
def test_seed_validation_phrase_has_rules(phrase):
    status, ids = SEED_VALIDATION[phrase]
    rules = {r["id"]: r for r in _errors()["rules"]}
    assert ids
    for i in ids:
        assert i in rules, f"seed phrase {phrase!r}: rule {i} missing"
        assert rules[i]["status"] == status, f"{i}: the seed gives {phrase!r} status {status}"
        assert "seed" in rules[i], f"{i} implements the seed's {phrase!r} but has no seed: key"


def test_seed_rules_are_all_mapped():
    """Conversely, every rule marked seed: is one of the seed's phrases above."""
    mapped = {i for _, ids in SEED_VALIDATION.values() for i in ids}
    extra = {r["id"] for r in _errors()["rules"] if "seed" in r and r["id"] not in mapped}
    # Seed text outside the validation table: zero max_seq is its "zero dimension" applied to
    # max_seq; "bit 3 ... alone" is in the layer-flags paragraph.
    assert extra <= {"shape.zero.max_seq", "format.layer.linear_not_alone"}, extra


def test_decisions_exist_if_written():
    path = specs.SPEC_DIR / "decisions.yaml"
    if not path.exists():
        pytest.skip("specs/decisions.yaml not written yet")
    text = path.read_text(encoding="utf-8")
    for r in [*_errors()["rules"], *specs.load("gguf")["rules"]]:
        if "decision" in r:
            assert r["decision"] in text, f"{r['id']}: decision {r['decision']} not in decisions.yaml"


# ---------------------------------------------------------------- fixtures and body
def test_fixture_names_unique_and_headers_known():
    spec = specs.load("mlb_fixtures")
    names = [f["name"] for f in spec["fixtures"]]
    assert len(names) == len(set(names))
    fields = {name for name, _, _ in SEED_HEADER}
    for f in spec["fixtures"]:
        assert set(f.get("header", {})) <= fields, f["name"]
        if f.get("header", {}).get("layer_flags"):
            n = f["header"].get("n_layers", spec["defaults"]["header"]["n_layers"])
            assert len(f["flags"]) == n, f["name"]


def test_body_class_bits_match_seed():
    body = specs.load("mlb_body")
    seed = {
        "tok_emb": 1,
        "wcls": 2,
        "wq": 4,
        "wk": 4,
        "wg": 4,
        "lqkv": 4,
        "wv": 8,
        "lz": 8,
        "wo": 16,
        "lout": 16,
        "w1": 32,
        "w3": 32,
        "w2": 64,
    }
    assert body["class_bits"] == seed
    assert body["shared_tok_emb_bits"] == 1 | 2
    assert body["alignment"] == 64 and body["start"] == 256
