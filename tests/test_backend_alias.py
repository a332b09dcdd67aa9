"""`-b NAME=SPEC` (issue 34, item 7): a backend under a name of the user's, in every report, so that
`mlconf diff` compares two builds of one library by name rather than by path."""

from __future__ import annotations

import json
import shutil

import pytest

from mlconf import cli
from mlconf.backends import BackendError, get
from mlconf.backends.native import LIBRARY


def test_an_alias_names_the_backend_and_keeps_its_spec():
    b = get(f"mine=lib:{LIBRARY}")
    try:
        assert b.name == "mine" and b.spec == f"mine=lib:{LIBRARY}" and "load" in b.capabilities
    finally:
        b.close()
    with pytest.raises(BackendError, match="alias 'native' .* is the name of a backend"):
        get(f"native=lib:{LIBRARY}")


def test_two_copies_under_one_name_diff_as_the_same_runtime(tmp_path, capsys):
    copy = tmp_path / "libcopy.so"
    shutil.copyfile(LIBRARY, copy)
    a, b = tmp_path / "a", tmp_path / "b"
    assert (
        cli.main(["run", "-b", f"mine=lib:{LIBRARY}", "--area", "loader", "--report", str(a), "-j", "2"]) == 0
    )
    assert cli.main(["run", "-b", f"mine=lib:{copy}", "--area", "loader", "--report", str(b)]) == 0
    doc = json.loads((a / "results.json").read_text(encoding="utf-8"))
    assert {r["backend"] for r in doc["records"]} == {"mine"} and doc["run"]["backends"][0]["name"] == "mine"
    capsys.readouterr()
    assert cli.main(["diff", str(a / "results.json"), str(b / "results.json")]) == 0
    assert "Regressed: 0" in capsys.readouterr().out


def test_one_name_twice_is_a_usage_error(capsys):
    assert cli.main(["run", "-b", f"x=lib:{LIBRARY}", "-b", "x=reference", "--area", "loader"]) == 4
    assert "-b x: named twice" in capsys.readouterr().err
