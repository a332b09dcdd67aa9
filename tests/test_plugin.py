"""The pytest plugin: parametrization from the specs, --mlconf-backend (and its deprecated alias),
the unsupported outcome, one usage error for an unknown backend, pytest-xdist, and a start-up that
imports nothing of the harness."""

import pytest

SUITE = '''
from mlconf.backends import register
from mlconf.plugin import check

AREA = "loader"


class Partial:
    """A backend that can load but cannot quantize, and a broken one."""
    def __init__(self, name, caps, status=None):
        self.name, self.capabilities, self.status = name, frozenset(caps), status

    def load(self, path):
        from mlconf.backends import LoadResult
        return LoadResult(self.status, "fake")


register("fake-none", lambda n: Partial(n, []), builtin=False)
register("fake-ok", lambda n: Partial(n, ["load"], "ML_OK"), builtin=False)


def test_case(mlconf_case, mlconf_backend, mlconf_workdir):
    check(mlconf_case, mlconf_backend, mlconf_workdir)
'''


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_fake=SUITE)
    return pytester


def test_unsupported_is_its_own_outcome(suite):
    r = suite.runpytest("--mlconf-backend", "fake-none", "-k", "format.magic", "-p", "no:cacheprovider")
    outcomes = r.parseoutcomes()
    assert outcomes.get("unsupported") == 3, r.stdout.str()
    assert "passed" not in outcomes and "skipped" not in outcomes
    assert r.ret == 0


def test_strict_unsupported_fails(suite):
    r = suite.runpytest("--mlconf-backend", "fake-none", "--mlconf-strict-unsupported", "-k", "format.magic")
    assert r.parseoutcomes().get("failed") == 3
    assert r.ret == 1


def test_wrong_status_fails_and_names_the_rule(suite):
    r = suite.runpytest("--mlconf-backend", "fake-ok", "-k", "format.version")
    assert r.parseoutcomes().get("failed") == 3
    assert "expected ML_E_FORMAT, got ML_OK" in r.stdout.str()
    assert "mlb_errors.yaml#format.version" in r.stdout.str()


def test_backend_option_repeats(suite):
    r = suite.runpytest(
        "--mlconf-backend", "reference", "--mlconf-backend", "fake-none", "-k", "format.wtype"
    )
    o = r.parseoutcomes()
    assert o.get("passed") == 3 and o.get("unsupported") == 3


def test_target_version(suite):
    """--mlconf-target-version: the reference switches and gives a Krafla 0.8.0 runtime's statuses
    (the 0.9.0 features' cases expect ML_E_FORMAT); a runtime that cannot switch fails them."""
    args = ("-k", "rot_dim or linear", "--mlconf-target-version", "0.8.0")
    r = suite.runpytest("--mlconf-backend", "reference", *args)
    assert r.ret == 0 and r.parseoutcomes().get("passed", 0) >= 10, r.stdout.str()
    r = suite.runpytest("--mlconf-backend", "fake-ok", *args)
    assert r.parseoutcomes().get("failed", 0) >= 10 and "expected ML_E_FORMAT, got ML_OK" in r.stdout.str()
    bad = suite.runpytest("--mlconf-backend", "reference", "--mlconf-target-version", "nine")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR


def test_unknown_backend_is_one_usage_error(suite):
    r = suite.runpytest("--mlconf-backend", "nope", "-k", "format.wtype")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    text = r.stdout.str() + r.stderr.str()
    assert text.count("unknown backend 'nope'") == 1, text


def test_deprecated_aliases_still_work_and_warn(suite):
    r = suite.runpytest("--backend", "fake-none", "--strict-unsupported", "-k", "format.magic")
    assert r.parseoutcomes().get("failed") == 3
    assert "--backend is deprecated, use --mlconf-backend" in r.stdout.str()


def test_a_project_s_own_backend_option_wins(pytester):
    """A project whose conftest defines --backend keeps it; the plugin's new names still work."""
    pytester.makeconftest(
        "def pytest_addoption(parser):\n    parser.addoption('--backend', default='theirs')\n"
    )
    pytester.makepyfile(
        test_own="def test_own(request):\n    assert request.config.getoption('backend') == 'mine'\n"
    )
    r = pytester.runpytest("--backend", "mine")
    assert r.ret == 0 and r.parseoutcomes().get("passed") == 1, r.stdout.str()


def test_under_xdist_the_outcomes_are_the_serial_ones(suite):
    pytest.importorskip("xdist")
    args = ("--mlconf-backend", "reference", "--mlconf-backend", "fake-none", "-k", "format")
    serial = suite.runpytest(*args).parseoutcomes()
    parallel = suite.runpytest(*args, "-n", "2").parseoutcomes()
    assert serial.get("passed") and serial.get("unsupported")
    assert {k: parallel.get(k) for k in ("passed", "unsupported", "failed")} == {
        k: serial.get(k) for k in ("passed", "unsupported", "failed")
    }


def test_loading_the_plugin_imports_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys, mlconf.plugin\n"
        "heavy = ('mlconf.cases', 'mlconf.runner', 'mlconf.backends', 'numpy')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8")
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_the_installed_suite_under_xdist(tmp_path):
    """`pytest --pyargs mlconf.suite -n 2`, the README's command, gives the serial run's counts."""
    pytest.importorskip("xdist")
    import re
    import subprocess
    import sys

    def counts(*extra):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "--pyargs",
                "mlconf.suite",
                "-p",
                "no:cacheprovider",
                *extra,
            ],
            cwd=tmp_path,
            capture_output=True,
            encoding="utf-8",
            timeout=1800,
        )
        assert r.returncode == 0, r.stdout[-3000:]
        return dict(
            (k, int(n))
            for n, k in re.findall(r"(\d+) (passed|skipped|failed|unsupported)", r.stdout.splitlines()[-1])
        )

    serial, parallel = counts(), counts("-n", "2")
    assert serial.get("passed", 0) > 500 and parallel == serial
