"""The .mlt format: the spec's rules and cases, the reference loader on every fixture, the writer
and reader, and random damage that must always give a status."""

import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlconf import mlt_fixtures, specs
from mlconf.backends.reference import mlt as loader
from mlconf.tools import mlt

RULES = specs.load("mlt")["rules"]


def test_every_rule_implemented_and_has_a_case():
    assert [r["id"] for r in RULES] == list(loader.RULES)
    for r in RULES:
        assert r["cases"], r["id"]
        assert r["status"] in specs.load("mlt")["statuses"]


def test_header_layout_matches_the_seed():
    # seed: magic char[4], version, kind, n_vocab, n_merges u32, bos, eos i32, flags u32
    want = [
        ("magic", 0),
        ("version", 4),
        ("kind", 8),
        ("n_vocab", 12),
        ("n_merges", 16),
        ("bos", 20),
        ("eos", 24),
        ("flags", 28),
    ]
    assert [(f["name"], f["offset"]) for f in specs.load("mlt")["fields"]] == want
    assert mlt.HEADER.size == 32
    assert sorted(f["bit"] for f in specs.load("mlt")["flags"]) == [1, 2, 4, 8, 16, 32, 64]


def test_every_fixture_gets_its_status_and_rule(generated):
    root, fx = generated
    seen = set()
    for f in fx:
        if not f.file.startswith("tokenizer/"):
            continue
        r = loader.load(root / f.file, f.model_vocab)
        assert r.status == f.expected, (f.file, r.reason)
        if f.rule:
            assert r.rule == f.rule, (f.file, r.reason)
            seen.add(f.rule)
    assert seen == {r["id"] for r in RULES}


def test_round_trip_and_determinism(tmp_path):
    for name, (tok, _) in mlt_fixtures.BASES.items():
        p = tmp_path / f"{name}.mlt"
        mlt.write(p, tok)
        assert mlt.read(p) == tok
        assert p.read_bytes() == mlt.to_bytes(tok)


def test_record_layout_by_hand():
    tok = mlt.Tokenizer(2, 0, -1, 1, [(0, b"a"), (1, b"<x>"), (0, b"aa")], [(0, 0, 2)])
    want = (
        b"MLT1"
        + struct.pack("<IIIIiiI", 1, 2, 3, 1, -1, 1, 0)
        + b"\x00\x01\x00\x00\x00a"
        + b"\x01\x03\x00\x00\x00<x>"
        + b"\x00\x02\x00\x00\x00aa"
        + struct.pack("<III", 0, 0, 2)
    )
    assert mlt.to_bytes(tok) == want


@pytest.mark.parametrize(
    "tok, needle",
    [
        (mlt.Tokenizer(2, 0, 5, -1, [(0, b"a")], []), "bos"),
        (mlt.Tokenizer(3, 0, -1, -1, [(0, b"a")], []), "kind"),
        (mlt.Tokenizer(1, 8, -1, -1, [(0, b"a")], []), "do not apply"),
        (mlt.Tokenizer(2, 0, -1, -1, [(0, b"a"), (0, b"b")], [(0, 0, 1)]), "concatenation"),
        (mlt.Tokenizer(2, 0, -1, -1, [(0, b"")], []), "length 0"),
    ],
)
def test_writer_refuses_and_leaves_nothing(tmp_path, tok, needle):
    with pytest.raises(mlt.MLTError, match=needle if needle != "concatenation" else "is not token"):
        mlt.write(tmp_path / "t.mlt", tok)
    assert list(tmp_path.iterdir()) == []


def test_read_refuses_with_status(tmp_path):
    p = tmp_path / "t.mlt"
    p.write_bytes(b"MLT1")
    with pytest.raises(mlt.MLTError, match="ML_E_FORMAT"):
        mlt.read(p)
    with pytest.raises(mlt.MLTError, match="ML_E_IO"):
        mlt.read(tmp_path / "absent.mlt")


def test_info_script(tmp_path):
    p = tmp_path / "t.mlt"
    mlt.write(p, mlt_fixtures.BASES["bl_qwen2"][0])
    r = subprocess.run(
        [sys.executable, "-m", "mlconf.tools.mlt", "info", str(p)],
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    assert r.returncode == 0 and "nfc" in r.stdout and "single_digits" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "mlconf.tools.mlt", "info", str(tmp_path / "x.mlt")],
        capture_output=True,
        encoding="utf-8",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr


VALID = [mlt.to_bytes(t) for t, _ in mlt_fixtures.BASES.values()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data())
def test_random_damage_gives_a_status(data, draw):
    b = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 6))):
        kind = draw.draw(st.sampled_from(["poke", "truncate", "append"]))
        if kind == "poke" and b:
            i = draw.draw(st.integers(0, len(b) - 1))
            b[i] = draw.draw(st.integers(0, 255))
        elif kind == "truncate":
            del b[draw.draw(st.integers(0, len(b))) :]
        else:
            b += bytes(draw.draw(st.lists(st.integers(0, 255), max_size=16)))
    r = loader.check(bytes(b), model_vocab=draw.draw(st.none() | st.integers(0, 400)))
    assert r.status in ("ML_OK", "ML_E_FORMAT", "ML_E_SHAPE")


@given(st.integers(0, 2**32 - 1), st.sampled_from([12, 16, 28]))
def test_huge_counts_are_refused_quickly(value, offset):
    b = bytearray(VALID[0])
    b[offset : offset + 4] = struct.pack("<I", value)
    assert loader.check(bytes(b)).status in ("ML_OK", "ML_E_FORMAT", "ML_E_SHAPE")
