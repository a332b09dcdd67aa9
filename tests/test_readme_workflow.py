"""The README's GitHub Actions gate, exactly as written, against the project's own libmlrt.so.

The command is read from README.md's workflow (the "Conformance gate" step), so the two cannot
drift: only `./libmyruntime.so` is provided, as a copy of libmlrt.so in the working folder. The
gate must pass (exit 0, every selected case passing under --strict) and report what it ran.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def readme_gate_command() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"- name: Conformance gate\n\s+run: >\n((?:\s{10}.*\n)+)", text)
    assert m, "README.md has no 'Conformance gate' step with a folded `run: >` command"
    return shlex.split(" ".join(line.strip() for line in m.group(1).splitlines()))


def test_the_command_is_the_documented_one():
    cmd = readme_gate_command()
    assert cmd[:2] == ["mlconf", "run"] and "lib:./libmyruntime.so" in cmd and "--strict" in cmd


def test_readme_gate_passes_on_libmlrt(tmp_path):
    from mlconf.backends.native import build

    lib = build.LIBRARIES["mlrt"][1]
    if not Path(lib).exists():
        build.build()
    shutil.copy(lib, tmp_path / "libmyruntime.so")
    cmd = readme_gate_command()
    r = subprocess.run(
        [sys.executable, "-m", "mlconf.cli", *cmd[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=1800,
    )
    assert r.returncode == 0, (
        f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    )
    results = json.loads((tmp_path / "reports" / "results.json").read_text(encoding="utf-8"))
    outcomes = {rec["outcome"] for rec in results["records"]}
    assert outcomes == {"pass"}, outcomes
    areas = {rec["area"] for rec in results["records"]}
    assert areas == {"header", "loader", "quant", "forward"}
