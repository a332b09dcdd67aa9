"""The pytest plugin of mlconf (registered through the pytest11 entry point).

It adds a repeatable ``--mlconf-backend NAME`` option (default: reference) and parametrizes every
test that asks for the ``mlconf_case`` fixture with the cases of the module's ``AREA`` crossed with
the chosen backends; the suite modules in mlconf.suite are such tests. A capability a backend lacks
shows as "unsupported" (letter U), apart from passes and skips; ``--mlconf-strict-unsupported``
makes it a failure (the CI-gate mode). ``--backend`` and ``--strict-unsupported`` are deprecated
aliases for one release (left out when the project under test has options of those names).

Installed, the plugin is loaded by every pytest run in the environment, so it imports nothing of
the harness until a test asks for a case: `pytest --help` pays only for this module. It works
under pytest-xdist (`-n N`): collection is deterministic, and each worker starts its own backends.

    pytest --pyargs mlconf.suite --mlconf-backend reference --mlconf-backend lib:./libmyruntime.so
"""

from __future__ import annotations

import pytest

_DEPRECATED = {"--backend": "--mlconf-backend", "--strict-unsupported": "--mlconf-strict-unsupported"}


class UnsupportedOutcome(Exception):
    """Raised by a suite test whose backend lacks the case's capability."""


def pytest_addoption(parser):
    g = parser.getgroup("mlconf")
    g.addoption(
        "--mlconf-backend",
        action="append",
        default=None,
        metavar="NAME",
        dest="mlconf_backend",
        help="mlconf backend to test (repeatable; default: reference)",
    )
    g.addoption(
        "--mlconf-strict-unsupported",
        action="store_true",
        dest="mlconf_strict_unsupported",
        help="report cases a backend does not support as failures",
    )
    g.addoption(
        "--mlconf-target-version",
        default=None,
        metavar="X.Y.Z",
        dest="mlconf_target_version",
        help="gate a runtime of this Krafla version (as mlconf run --target-version)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """The deprecated aliases, added once the project's conftests have added their options, and
    only where no option of that name exists (a project's own --backend keeps its meaning)."""
    result = yield
    groups = [getattr(parser, "_anonymous", None), *getattr(parser, "_groups", [])]
    taken = {name for g in groups if g is not None for opt in g.options for name in opt.names()}
    g = parser.getgroup("mlconf")
    if "--backend" not in taken:
        g.addoption(
            "--backend",
            action="append",
            default=None,
            metavar="NAME",
            dest="mlconf_backend_old",
            help="deprecated: --mlconf-backend",
        )
    if "--strict-unsupported" not in taken:
        g.addoption(
            "--strict-unsupported",
            action="store_true",
            dest="mlconf_strict_unsupported_old",
            help="deprecated: --mlconf-strict-unsupported",
        )
    return result


def pytest_configure(config):
    config.addinivalue_line("markers", "mlconf: a conformance case of the mlconf suite")
    _target(config)  # a malformed --mlconf-target-version is a usage error before collection
    for old, dest in (
        ("--backend", "mlconf_backend_old"),
        ("--strict-unsupported", "mlconf_strict_unsupported_old"),
    ):
        if getattr(config.option, dest, None):
            config.issue_config_time_warning(
                pytest.PytestDeprecationWarning(f"mlconf: {old} is deprecated, use {_DEPRECATED[old]}"),
                stacklevel=2,
            )


def pytest_collection_modifyitems(session, config, items):
    """One usage error for a backend name nothing registers (checked once the test modules,
    which may register backends, are imported; nothing is started)."""
    if not any("mlconf_case" in getattr(item, "fixturenames", ()) for item in items):
        return
    from mlconf.backends import BackendError, check_name

    for name in _backends(config):
        try:
            check_name(name)
        except BackendError as e:
            raise pytest.UsageError(f"--mlconf-backend: {e}") from None


def _backends(config) -> list[str]:
    return (
        config.getoption("mlconf_backend")
        or getattr(config.option, "mlconf_backend_old", None)
        or ["reference"]
    )


def _strict(config) -> bool:
    return bool(
        config.getoption("mlconf_strict_unsupported")
        or getattr(config.option, "mlconf_strict_unsupported_old", False)
    )


def _target(config):
    text = config.getoption("mlconf_target_version")
    if text is None:
        return None
    from mlconf import specs

    try:
        return specs.parse_version(text)
    except ValueError as e:
        raise pytest.UsageError(f"--mlconf-target-version: {e}") from None


def pytest_generate_tests(metafunc):
    if "mlconf_case" not in metafunc.fixturenames:
        return
    from mlconf import cases as cases_mod

    area = getattr(metafunc.module, "AREA", None)
    selected = cases_mod.collect([area] if area else None, target_version=_target(metafunc.config))
    if not selected:
        raise pytest.UsageError(f"{metafunc.module.__name__}: no mlconf case in area {area!r}")
    metafunc.parametrize("mlconf_backend_name", _backends(metafunc.config), scope="session")
    metafunc.parametrize("mlconf_case", selected, ids=[c.id for c in selected])


_BACKENDS: dict = {}  # (name, target version) -> backend, once per process


@pytest.fixture(scope="session")
def mlconf_backend(mlconf_backend_name, pytestconfig):
    target = _target(pytestconfig)
    key = (mlconf_backend_name, target)
    if key not in _BACKENDS:
        from mlconf.backends import get

        b = get(mlconf_backend_name)
        if target is not None and hasattr(b, "set_target_version"):
            b.set_target_version(target)
        _BACKENDS[key] = b
    return _BACKENDS[key]


@pytest.fixture(scope="session")
def mlconf_workdir(tmp_path_factory):
    from mlconf import runner

    return runner.Workdir(tmp_path_factory.mktemp("mlconf-fixtures"))


def check(case, backend, work):
    """Run one case (runner.Result) and turn its outcome into pytest's: fail/error raise,
    unsupported is U."""
    from mlconf import runner

    if case.params.get("expected_from") == backend.name:
        pytest.skip(f"a cross-backend case: {backend.name} is its own expectation")
    res = runner.run_case(case, backend, work)
    if res.outcome == "unsupported":
        raise UnsupportedOutcome(res.detail)
    if res.outcome != "pass":
        pytest.fail(f"{res.outcome}: {case.id} on {backend.name} ({case.spec}): {res.detail}", pytrace=False)
    return res


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if call.excinfo is not None and call.excinfo.errisinstance(UnsupportedOutcome):
        rep.mlconf_unsupported = True
        if _strict(item.config):
            rep.outcome = "failed"
        else:
            rep.outcome = "skipped"
            rep.longrepr = (str(item.path), item.location[1] or 0, f"unsupported: {call.excinfo.value}")
    return rep


def pytest_report_teststatus(report, config):
    if getattr(report, "mlconf_unsupported", False) and report.when == "call":
        if report.outcome == "failed":
            return "failed", "F", "FAILED (unsupported)"
        return "unsupported", "U", "UNSUPPORTED"
    return None
