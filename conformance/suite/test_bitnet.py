"""The mlconf conformance cases of area 'bitnet' (see mlconf.cases), one test per case and backend."""

from mlconf.plugin import check

AREA = "bitnet"


def test_case(mlconf_case, mlconf_backend, mlconf_workdir):
    check(mlconf_case, mlconf_backend, mlconf_workdir)
