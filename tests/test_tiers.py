"""The two tiers of the root conftest.py: `pytest` alone deselects the slow tier (the oracle tests
belong to it), `-m slow` runs it alone, `--full` runs both, `-m EXPR` selects as pytest does, and
a test named on the command line runs whatever its tier."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.oracle
def test_oracle():
    pass
"""


@pytest.fixture
def project(pytester):
    pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    oracle: oracle\n")
    pytester.makepyfile(test_tiers_demo=TESTS)
    return pytester


@pytest.mark.parametrize(
    ("args", "ran", "deselected"),
    [
        ([], ["test_fast"], 2),
        (["-m", "slow"], ["test_oracle", "test_slow"], 1),
        (["--full"], ["test_fast", "test_oracle", "test_slow"], 0),
        (["-m", "oracle"], ["test_oracle"], 2),
        (["-m", "not oracle"], ["test_fast", "test_slow"], 1),
        (["test_tiers_demo.py::test_slow"], ["test_slow"], 0),
    ],
    ids=["fast", "slow", "full", "oracle", "not-oracle", "named"],
)
def test_the_tiers_select(project, args, ran, deselected):
    result = project.inline_run("-p", "no:cacheprovider", *args)
    passed, skipped, failed = result.listoutcomes()
    assert sorted(r.nodeid.split("::")[-1] for r in passed) == ran and not skipped and not failed
    assert sum(len(c.items) for c in result.getcalls("pytest_deselected")) == deselected
