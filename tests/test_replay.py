"""examples/replay: the C program that replays `mlconf fixtures` through a library's C ABI, with the
jq pre-pass of examples/replay/manifest.jq. Given only the exported folder and the library it must
give `mlconf run`'s outcome counts in every area (libmlrt.so as `-b native`, libmlbitnet.so as
`-b bitnet`), case by case for the failing and the unsupported ones, and a deliberately broken copy
of libmlrt (tests/data/broken_mlrt.c: four planted mistakes and a variant it does not do) must fail,
and find unsupported, the very cases `mlconf run -b lib:` does with it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mlconf import cli, export
from mlconf.backends.bitnet import LIBRARY as BITNET_LIBRARY
from mlconf.backends.native import LIBRARY as NATIVE_LIBRARY

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "examples" / "replay"
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(
    shutil.which("jq") is None or CC is None,
    reason="the replay example needs jq and a C compiler (.ci/run installs jq)",
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("replay")
    export.export(out / "fx")
    subprocess.run(
        [
            CC,
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(out / "replay"),
            str(REPLAY / "replay.c"),
            "-ldl",
            "-lm",
        ],
        check=True,
    )
    return out


def _replay(folder: Path, library: Path) -> tuple[dict[str, list[int]], set[str], set[str]]:
    """(area -> [pass, fail, unsupported, error], the ids of the failing cases) of one replay."""
    lines = subprocess.run(
        ["jq", "-r", "-f", str(REPLAY / "manifest.jq"), str(folder / "fx" / "manifest.json")],
        capture_output=True,
        check=True,
    ).stdout
    r = subprocess.run(
        [str(folder / "replay"), str(folder / "fx"), str(library)],
        input=lines,
        capture_output=True,
        timeout=900,
    )
    out = r.stdout.decode()
    assert r.returncode in (0, 1), r.stderr.decode()
    table = out[out.index("area pass fail unsupported error\n") :].splitlines()[1:-1]
    counts = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in table}
    failing = {
        line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith(("fail ", "error "))
    }
    assert (r.returncode == 1) == bool(failing)
    unsupported = {
        line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("unsupported ")
    }
    return counts, failing, unsupported


def _run(tmp_path: Path, backend: str) -> tuple[dict[str, list[int]], set[str], set[str]]:
    cli.main(["run", "-b", backend, "--report", str(tmp_path)])
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    counts = {
        s["area"]: [s["pass"], s["fail"], s["unsupported"], s["error"] + s["crash"] + s["timeout"]]
        for s in doc["summary"]
    }
    return (
        counts,
        {r["case"] for r in doc["records"] if r["outcome"] in ("fail", "error", "crash", "timeout")},
        {r["case"] for r in doc["records"] if r["outcome"] == "unsupported"},
    )


@pytest.mark.parametrize("backend, library", [("native", NATIVE_LIBRARY), ("bitnet", BITNET_LIBRARY)])
def test_replay_gives_the_counts_of_mlconf_run(folder, tmp_path, backend, library):
    got, failing, unsupported = _replay(folder, library)
    want, want_failing, want_unsupported = _run(tmp_path, backend)
    assert got == want
    assert failing == want_failing and unsupported == want_unsupported  # case by case


def test_a_broken_library_fails_the_same_cases(folder, tmp_path):
    broken = tmp_path / "libbroken.so"
    native = Path(NATIVE_LIBRARY)
    subprocess.run(
        [
            CC,
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            f"-I{ROOT / 'backends' / 'native' / 'include'}",
            str(ROOT / "tests" / "data" / "broken_mlrt.c"),
            "-o",
            str(broken),
            f"-L{native.parent}",
            f"-l:{native.name}",
            f"-Wl,-rpath,{native.parent}",
            "-ldl",
        ],
        check=True,
    )
    got, failing, unsupported = _replay(folder, broken)
    want, want_failing, want_unsupported = _run(tmp_path / "run", f"lib:{broken}")
    assert failing == want_failing and unsupported == want_unsupported and got == want
    # ML_E_UNSUPPORTED on a case whose input must be refused is unsupported in both (one rule)
    refused_f16 = {c for c in unsupported if c.startswith("quant/q4_0_search_f16/refused/")}
    assert {
        "quant/q4_0_search_f16/refused/minus_inf",
        "quant/q4_0_search_f16/refused/f16_scale_above_65504",
    } <= refused_f16
    for area in ("loader", "quant", "tokenizer", "forward"):  # each planted mistake shows
        assert got[area][1] > 0, (area, got)
