"""The mlconf conformance cases of area 'tokenizer' (see mlconf.cases), one test per case and backend."""

from mlconf.plugin import check

AREA = "tokenizer"


def test_case(mlconf_case, mlconf_backend, mlconf_workdir):
    check(mlconf_case, mlconf_backend, mlconf_workdir)
