"""The pytest plugin of mlconf (registered through the pytest11 entry point).

It adds a repeatable ``--backend NAME`` option (default: reference) and parametrizes every test
that asks for the ``mlconf_case`` fixture with the cases of the module's ``AREA`` crossed with the
chosen backends; the suite modules in mlconf.suite are such tests. A capability a backend lacks
shows as "unsupported" (letter U), apart from passes and skips; ``--strict-unsupported`` makes it
a failure (the CI-gate mode).

    pytest --pyargs mlconf.suite --backend reference --backend lib:./libmyruntime.so
"""

from __future__ import annotations

import pytest

from mlconf import cases as cases_mod
from mlconf import runner
from mlconf.backends import get


class UnsupportedOutcome(Exception):
    """Raised by a suite test whose backend lacks the case's capability."""


def pytest_addoption(parser):
    g = parser.getgroup("mlconf")
    g.addoption("--backend", action="append", default=None, metavar="NAME",
                help="mlconf backend to test (repeatable; default: reference)")
    g.addoption("--strict-unsupported", action="store_true",
                help="report cases a backend does not support as failures")


def pytest_configure(config):
    config.addinivalue_line("markers", "mlconf: a conformance case of the mlconf suite")


def _backends(config) -> list[str]:
    return config.getoption("backend") or ["reference"]


def pytest_generate_tests(metafunc):
    if "mlconf_case" not in metafunc.fixturenames:
        return
    area = getattr(metafunc.module, "AREA", None)
    selected = cases_mod.collect([area] if area else None)
    if not selected:
        raise pytest.UsageError(f"{metafunc.module.__name__}: no mlconf case in area {area!r}")
    metafunc.parametrize("mlconf_backend_name", _backends(metafunc.config), scope="session")
    metafunc.parametrize("mlconf_case", selected, ids=[c.id for c in selected])


_BACKENDS: dict = {}


@pytest.fixture(scope="session")
def mlconf_backend(mlconf_backend_name):
    if mlconf_backend_name not in _BACKENDS:
        _BACKENDS[mlconf_backend_name] = get(mlconf_backend_name)
    return _BACKENDS[mlconf_backend_name]


@pytest.fixture(scope="session")
def mlconf_workdir(tmp_path_factory):
    return runner.Workdir(tmp_path_factory.mktemp("mlconf-fixtures"))


def check(case, backend, work) -> runner.Result:
    """Run one case and turn its outcome into pytest's: fail/error raise, unsupported is U."""
    if case.params.get("expected_from") == backend.name:
        pytest.skip(f"a cross-backend case: {backend.name} is its own expectation")
    res = runner.run_case(case, backend, work)
    if res.outcome == "unsupported":
        raise UnsupportedOutcome(res.detail)
    if res.outcome != "pass":
        pytest.fail(f"{res.outcome}: {case.id} on {backend.name} ({case.spec}): {res.detail}", pytrace=False)
    return res


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(UnsupportedOutcome):
        rep.mlconf_unsupported = True
        if item.config.getoption("strict_unsupported"):
            rep.outcome = "failed"
        else:
            rep.outcome = "skipped"
            rep.longrepr = (str(item.path), item.location[1] or 0, f"unsupported: {call.excinfo.value}")


def pytest_report_teststatus(report, config):
    if getattr(report, "mlconf_unsupported", False) and report.when == "call":
        if report.outcome == "failed":
            return "failed", "F", "FAILED (unsupported)"
        return "unsupported", "U", "UNSUPPORTED"
    return None
