""".ci/run runs the README's two commands as written: each step of "Run the tests" and of "Install
and run" is a line of .ci/run, in the README's order (so the tiers .ci/run runs are the README's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_steps(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(section)}\n.*?```sh\n(.*?)\n```", text, re.S | re.M)
    assert m, f"README.md has no sh block under '## {section}'"
    return [step.strip() for step in m.group(1).split(" && ")]


def test_ci_run_runs_the_readme_commands_in_order():
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()]
    run = [s for s in readme_steps("Install and run") if s != "pip install ."]  # .ci/run installs above
    steps = readme_steps("Run the tests") + run
    at = 0
    for step in steps:
        assert step in lines[at:], f".ci/run lacks the README's step {step!r} (after line {at})"
        at = lines.index(step, at) + 1
    assert "pytest --full -n 2" in steps, "the README's test command runs both tiers"
