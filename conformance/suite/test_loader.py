"""The mlconf conformance cases of area 'loader' (see mlconf.cases), one test per case and backend."""

from mlconf.plugin import check

AREA = "loader"


def test_case(mlconf_case, mlconf_backend, mlconf_workdir):
    check(mlconf_case, mlconf_backend, mlconf_workdir)
