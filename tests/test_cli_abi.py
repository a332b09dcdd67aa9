"""`mlconf abi` and `mlconf backends -b lib:PATH` (issue 34, item 6): the installed header, and what a
library exports and lacks per capability."""

from __future__ import annotations

from pathlib import Path

from mlconf import cli
from mlconf.backends.bitnet import LIBRARY as BITNET_LIBRARY
from mlconf.backends.native import HERE, abi


def test_abi_header_is_the_installed_mlrt_h(capsys):
    assert cli.main(["abi", "--header"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == HERE / "include" / "mlrt.h" and path.is_file()
    assert "int ml_check_rule(" in path.read_text(encoding="utf-8")


def test_abi_lists_every_capability_and_the_optional_functions(capsys):
    assert cli.main(["abi"]) == 0
    out = capsys.readouterr().out
    for cap, syms in abi.CAPABILITY_SYMBOLS.items():
        assert any(line.split()[:1] == [cap] and all(s in line for s in syms) for line in out.splitlines()), (
            cap
        )
    assert "ml_check_rule" in out and "ml_tok_check_rule" in out


def test_backends_of_a_library_names_what_it_lacks(capsys):
    assert cli.main(["backends", "-b", f"lib:{BITNET_LIBRARY}"]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in abi.CAPABILITY_SYMBOLS
    }
    assert "yes" in rows["embed"] and "yes" in rows["i2s"]
    assert "ml_check" in rows["load"] and "ml_tok_encode" in rows["encode"]
    assert "ml_check_rule -" in out and "ml_embed_load_reading yes" in out


def test_backends_b_needs_a_library(capsys):
    assert cli.main(["backends", "-b", "native"]) == 4
    assert "only a lib:PATH backend" in capsys.readouterr().err
