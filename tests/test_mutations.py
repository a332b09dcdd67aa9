"""The reference loader on every generated fixture and on random damage to valid files.

Every generated fixture must get its manifest status (and a malformed one the rule it was made
to break). Random byte overwrites, truncations, appended bytes and random u32 header values must
give one of the loader's statuses, never an exception, and quickly (a hang on a huge n_layers
or a size overflow would show as a slow load).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf import fixtures as mlfixtures
from mlconf import specs
from mlconf.backends.reference import layout, loader

STATUSES = {"ML_OK", "ML_E_FORMAT", "ML_E_SHAPE"}
U32_FIELDS = [(f["name"], f["offset"]) for f in specs.load("mlb_header")["fields"] if f["type"] == "u32"]
HSET = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _valid_files(generated) -> list[tuple[str, bytes]]:
    out, fx = generated
    return [
        (f.file, (out / f.file).read_bytes())
        for f in fx
        if f.kind in ("valid", "accepted") and f.file.endswith(".mlb")
    ]


@pytest.fixture(scope="session")
def valid_files(generated):
    return _valid_files(generated)


_counter = [0]


def _load_bytes(scratch: Path, data: bytes):
    _counter[0] += 1
    p = scratch / f"mut_{_counter[0]}.mlb"
    p.write_bytes(data)
    try:
        res = loader.load(p)
    finally:
        p.unlink()
    assert res.status in STATUSES, res
    if res.status != "ML_OK":
        assert res.rule and res.rule in loader.RULES, res
    return res


# ---------------------------------------------------------------- the generated set
def test_generated_fixture_statuses_and_rules(generated):
    out, fx = generated
    assert len(fx) == len(mlfixtures.catalog())
    fx = [f for f in fx if f.file.endswith(".mlb")]  # .mlt fixtures: tests/test_mlt.py
    kinds = {f.kind for f in fx}
    assert kinds == {"valid", "malformed", "accepted"}
    wrong = []
    for f in fx:
        res = loader.load(out / f.file)
        if res.status != f.expected:
            wrong.append((f.file, f.expected, res.status, res.reason))
        elif f.kind == "malformed" and res.rule != f.rule:
            wrong.append((f.file, f.rule, res.rule, res.reason))
        elif f.kind != "malformed" and res.rule:
            wrong.append((f.file, "no rule", res.rule, res.reason))
    assert not wrong, "\n".join(map(str, wrong))


def test_every_rule_has_a_generated_fixture(generated):
    _, fx = generated
    hit = {f.rule for f in fx if f.kind == "malformed" and f.file.endswith(".mlb")}
    assert hit == {r["id"] for r in specs.load("mlb_errors")["rules"]}


def test_malformed_fixtures_differ_from_their_base(generated):
    """A malformed case whose mutation changed nothing would pass for the wrong reason."""
    out, fx = generated
    for f in fx:
        if f.kind != "malformed" or f.rule in ("io.open", "gguf.io.open") or f.model_vocab is not None:
            continue  # (a model_vocab case is the base file loaded against a smaller model)
        kind = f.file.split("/", 1)[0]
        base_file = {"tokenizer": f"tokenizer/valid/{f.base}.mlt", "gguf": f"gguf/valid/{f.base}.gguf"}.get(
            kind, f"valid/{f.base}.mlb"
        )
        base = (out / base_file).read_bytes()
        assert (out / f.file).read_bytes() != base, f.file


def test_base_fixtures_are_not_malformed_after_rewrite(tmp_path, generated):
    """Regenerating gives the same bytes (fixtures are deterministic)."""
    out, fx = generated
    again = mlfixtures.generate(tmp_path)
    assert [f.file for f in again] == [f.file for f in fx]
    for f in fx:
        a, b = out / f.file, tmp_path / f.file
        if a.is_file():
            assert a.read_bytes() == b.read_bytes(), f.file


# ---------------------------------------------------------------- random damage
@HSET
@given(data=st.data())
def test_random_byte_overwrites(valid_files, scratch, data):
    name, raw = data.draw(st.sampled_from(valid_files), label="file")
    b = bytearray(raw)
    n = data.draw(st.integers(1, 8), label="count")
    header_only = data.draw(st.booleans(), label="header_only")
    for _ in range(n):
        hi = min(len(b), 256 + 64) if header_only else len(b)
        i = data.draw(st.integers(0, hi - 1))
        b[i] = data.draw(st.integers(0, 255))
    _load_bytes(scratch, bytes(b))


@HSET
@given(data=st.data())
def test_random_truncation(valid_files, scratch, data):
    name, raw = data.draw(st.sampled_from(valid_files), label="file")
    cut = data.draw(st.integers(0, len(raw) - 1), label="length")
    res = _load_bytes(scratch, raw[:cut])
    if cut < 256:
        assert res.status == "ML_E_FORMAT", res


@HSET
@given(data=st.data())
def test_random_appended_bytes(valid_files, scratch, data):
    name, raw = data.draw(st.sampled_from(valid_files), label="file")
    tail = data.draw(st.binary(min_size=1, max_size=300), label="tail")
    res = _load_bytes(scratch, raw + tail)
    assert res.status == "ML_OK", res  # decision loader.trailing_bytes: extra bytes are ignored


@HSET
@given(data=st.data())
def test_random_u32_header_values(valid_files, scratch, data):
    name, raw = data.draw(st.sampled_from(valid_files), label="file")
    fields = data.draw(st.lists(st.sampled_from(U32_FIELDS), min_size=1, max_size=6, unique=True))
    b = bytearray(raw)
    for fname, off in fields:
        v = data.draw(
            st.sampled_from([0, 1, 2**31, 2**32 - 1, 65536, 65537, 2**24, 2**24 + 1])
            | st.integers(0, 2**32 - 1),
            label=fname,
        )
        struct.pack_into("<I", b, off, v)
    _load_bytes(scratch, bytes(b))


@HSET
@given(data=st.data())
def test_random_f32_header_values(valid_files, scratch, data):
    name, raw = data.draw(st.sampled_from(valid_files), label="file")
    f32 = [(f["name"], f["offset"]) for f in specs.load("mlb_header")["fields"] if f["type"] == "f32"]
    fields = data.draw(st.lists(st.sampled_from(f32), min_size=1, max_size=4, unique=True))
    b = bytearray(raw)
    for fname, off in fields:
        struct.pack_into("<I", b, off, data.draw(st.integers(0, 2**32 - 1), label=fname))
    _load_bytes(scratch, bytes(b))


@pytest.mark.parametrize("n_layers", [65536, 65535, 4096])
@pytest.mark.parametrize("base", ["valid/q8_min.mlb", "valid/gemma3.mlb", "valid/qwen35.mlb"])
def test_many_layers_is_quick(generated, scratch, base, n_layers):
    out, _ = generated
    b = bytearray((out / base).read_bytes())
    struct.pack_into("<I", b, 12, n_layers)
    res = _load_bytes(scratch, bytes(b))
    if base == "valid/q8_min.mlb":
        assert res.status == "ML_E_FORMAT" and res.rule == "format.truncated_body", res
    else:  # the flag bytes now run into the body; some flag or size rule refuses the file
        assert res.status != "ML_OK", res


def test_many_linear_layers_with_flags_is_quick(generated, scratch, monkeypatch):
    """65536 flag bytes of linear layers follow the header: the size check refuses it without
    walking the layers (layout.plan, which enumerates every array, is never called)."""
    from mlconf.backends.reference import layout

    monkeypatch.setattr(layout, "plan", lambda *a: pytest.fail("plan() walked the layers"))
    out, _ = generated
    b = bytearray((out / "valid/qwen35.mlb").read_bytes()[:256])
    struct.pack_into("<I", b, 12, 65536)
    res = _load_bytes(scratch, bytes(b) + bytes([8]) * 65536 + bytes(4096))
    assert res.rule == "format.truncated_body", res


# ---------------------------------------------------------------- one seed violation at a time
NAN, INF = float("nan"), float("inf")
BOOLS = ["qkv_bias", "qk_norm", "layer_flags", "post_norms", "scale_f16"]
NONNEG = ["embed_scale", "attn_scale", "attn_softcap", "final_softcap"]
big_u32 = st.integers(2, 2**32 - 1)
bad_pos = st.sampled_from([0.0, -0.0, -1.0, NAN, INF, -INF])  # not > 0 and finite
bad_nonneg = st.sampled_from([-1e-6, -1.0, NAN, INF, -INF])  # not >= 0 and finite


@st.composite
def violation(draw, h: dict, flags):
    """(description, header changes, flag changes, the seed's status) of one broken rule."""
    kind = draw(
        st.sampled_from(
            [
                "magic",
                "version",
                "wtype",
                "rope_type",
                "llama3",
                "linear",
                "yarn",
                "attn_factor",
                "bool",
                "act",
                "nonneg",
                "local_theta_negative",
                "window",
                "flag_bits",
                "local_norope",
                "local_no_theta",
                "zero_dim",
                "over_limit",
                "dim32",
                "hidden32",
                "heads_divide",
                "kv_divide",
                "odd_head_dim",
                "q_dim32",
                "q_dim_limit",
                "vocab",
            ]
        )
    )
    F, S = "ML_E_FORMAT", "ML_E_SHAPE"
    nflags = None if flags is None else list(flags)
    if kind == "magic":
        m = draw(st.binary(min_size=4, max_size=4).filter(lambda b: b != b"MLB1"))
        return kind, {"magic": m}, None, F
    if kind == "version":
        return kind, {"version": draw(st.sampled_from([0]) | big_u32)}, None, F
    if kind == "wtype":
        return kind, {"wtype": draw(st.sampled_from([0]) | st.integers(3, 2**32 - 1))}, None, F
    if kind == "rope_type":
        return kind, {"rope_type": draw(st.integers(4, 2**32 - 1))}, None, F
    if kind == "llama3":
        ch = {
            "rope_type": 1,
            "rope_factor": 2.0,
            "rope_low_freq_factor": 1.0,
            "rope_high_freq_factor": 4.0,
            "rope_orig_max_seq": 64,
            "rope_attn_factor": 0.0,
        }
        which = draw(st.sampled_from(["factor", "lo", "hi", "orig"]))
        if which == "factor":
            ch["rope_factor"] = draw(bad_pos)
        elif which == "lo":
            ch["rope_low_freq_factor"] = draw(bad_pos)
        elif which == "hi":
            ch["rope_high_freq_factor"] = draw(st.sampled_from([1.0, 0.5, -4.0, NAN, INF]))
        else:
            ch["rope_orig_max_seq"] = 0
        return f"llama3.{which}", ch, None, F
    if kind == "linear":
        return kind, {"rope_type": 2, "rope_factor": draw(bad_pos), "rope_attn_factor": 0.0}, None, F
    if kind == "yarn":
        ch = {
            "rope_type": 3,
            "rope_factor": 4.0,
            "rope_low_freq_factor": 32.0,
            "rope_high_freq_factor": 1.0,
            "rope_orig_max_seq": 64,
            "rope_attn_factor": 1.1,
        }
        which = draw(st.sampled_from(["factor", "slow", "order", "orig", "attn"]))
        if which == "factor":
            ch["rope_factor"] = draw(bad_pos)
        elif which == "slow":
            ch["rope_high_freq_factor"] = draw(bad_pos)
        elif which == "order":
            ch["rope_low_freq_factor"] = draw(st.sampled_from([1.0, 0.5, NAN, INF]))
        elif which == "orig":
            ch["rope_orig_max_seq"] = 0
        else:
            ch["rope_attn_factor"] = draw(bad_pos)
        return f"yarn.{which}", ch, None, F
    if kind == "attn_factor":
        rope = draw(st.sampled_from([0, 2]))
        return (
            kind,
            {
                "rope_type": rope,
                "rope_factor": 2.0,
                "rope_attn_factor": draw(st.sampled_from([1.0, -1.0, NAN, 1e-30])),
            },
            None,
            F,
        )
    if kind == "bool":
        name = draw(st.sampled_from(BOOLS))
        return f"bool.{name}", {name: draw(big_u32)}, None, F
    if kind == "act":
        return kind, {"act": draw(big_u32)}, None, F
    if kind == "nonneg":
        name = draw(st.sampled_from(NONNEG))
        return f"nonneg.{name}", {name: draw(bad_nonneg)}, None, F
    if kind == "local_theta_negative":
        return kind, {"rope_local_theta": draw(bad_nonneg)}, None, F
    if kind == "window":
        return kind, {"sliding_window": draw(st.integers(2**24 + 1, 2**32 - 1))}, None, F
    if kind in ("flag_bits", "local_norope", "local_no_theta"):
        if flags is None:
            return "window", {"sliding_window": 2**32 - 1}, None, F
        i = draw(st.integers(0, len(flags) - 1))
        if kind == "flag_bits":
            nflags[i] = draw(st.integers(16, 255))
            return kind, {}, nflags, F
        if kind == "local_norope":
            nflags[i] = draw(st.sampled_from([6, 7]))
            return kind, {}, nflags, F
        nflags[i] = draw(st.sampled_from([2, 3]))
        return kind, {"rope_local_theta": draw(st.sampled_from([0.0, -0.0]))}, nflags, F
    if kind == "zero_dim":
        name = draw(st.sampled_from(["dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"]))
        return f"zero.{name}", {name: 0}, None, S
    if kind == "over_limit":
        name = draw(
            st.sampled_from(["dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "vocab", "max_seq"])
        )
        lim = 2**24 if name in ("vocab", "max_seq") else 65536
        v = draw(st.integers(lim + 1, 2**32 - 1))
        if name in ("dim", "hidden_dim"):
            v = v // 32 * 32 if v // 32 * 32 > lim else lim + 32
        return f"limit.{name}", {name: v}, None, S
    if kind == "dim32":
        return kind, {"dim": h["dim"] + draw(st.integers(1, 31))}, None, S
    if kind == "hidden32":
        return kind, {"hidden_dim": h["hidden_dim"] + draw(st.integers(1, 31))}, None, S
    if kind == "heads_divide":
        # dim 32 * k with n_heads not dividing it, head_dim not given
        return kind, {"dim": 96, "n_heads": 5, "n_kv_heads": 1, "head_dim": 0}, None, S
    if kind == "kv_divide":
        return kind, {"n_kv_heads": h["n_heads"] + draw(st.integers(1, 8))}, None, S
    if kind == "odd_head_dim":
        if draw(st.booleans()):
            return kind, {"head_dim": 2 * draw(st.integers(0, 100)) + 1, "rot_dim": 0}, None, S
        return kind, {"dim": 96, "n_heads": 32, "n_kv_heads": 1, "head_dim": 0, "rot_dim": 0}, None, S
    if kind == "q_dim32":
        return kind, {"head_dim": 18, "n_heads": 1, "n_kv_heads": 1, "rot_dim": 0}, None, S
    if kind == "q_dim_limit":
        return kind, {"head_dim": 65536 // h["n_heads"] + 2 * draw(st.integers(1, 8)), "rot_dim": 0}, None, S
    return kind, {"vocab": draw(st.integers(0, 2))}, None, S


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_one_seed_violation_gives_the_seed_status(valid_model_strategy, scratch, data):
    h, flags = data.draw(valid_model_strategy, label="model")
    fl = bytes(flags) if flags is not None else None
    body = bytes(layout.required_size(h, fl) - 256)  # zero quants and scales are valid
    ok = _load_bytes(scratch, layout.pack_header(h) + _with_flags(fl, body))
    assert ok.status == "ML_OK", ok
    what, changes, new_flags, status = data.draw(violation(h, flags), label="violation")
    bad = {**h, **changes}
    nfl = bytes(new_flags) if new_flags is not None else fl
    res = _load_bytes(scratch, layout.pack_header(bad) + _with_flags(nfl, body))
    assert res.status == status, (what, res.reason)


def _with_flags(fl: bytes | None, body: bytes) -> bytes:
    if fl is None:
        return body
    return fl + body[len(fl) :]
