"""The pytest plugin: parametrization from the specs, --backend, and the unsupported outcome."""

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
    r = suite.runpytest("--backend", "fake-none", "-k", "format.magic", "-p", "no:cacheprovider")
    outcomes = r.parseoutcomes()
    assert outcomes.get("unsupported") == 3, r.stdout.str()
    assert "passed" not in outcomes and "skipped" not in outcomes
    assert r.ret == 0


def test_strict_unsupported_fails(suite):
    r = suite.runpytest("--backend", "fake-none", "--strict-unsupported", "-k", "format.magic")
    assert r.parseoutcomes().get("failed") == 3
    assert r.ret == 1


def test_wrong_status_fails_and_names_the_rule(suite):
    r = suite.runpytest("--backend", "fake-ok", "-k", "format.version")
    assert r.parseoutcomes().get("failed") == 3
    assert "expected ML_E_FORMAT, got ML_OK" in r.stdout.str()
    assert "mlb_errors.yaml#format.version" in r.stdout.str()


def test_backend_option_repeats(suite):
    r = suite.runpytest("--backend", "reference", "--backend", "fake-none", "-k", "format.wtype")
    o = r.parseoutcomes()
    assert o.get("passed") == 3 and o.get("unsupported") == 3


def test_unknown_backend_is_an_error(suite):
    r = suite.runpytest("--backend", "nope", "-k", "format.wtype")
    assert r.ret != 0
    assert "unknown backend 'nope'" in r.stdout.str()
