"""mlconf: the conformance harness for MLB v1 / MLT runtimes and the I2_S ternary path.

This package is the harness (conformance/ in the repository). Its sub-packages ``mlconf.backends``,
``mlconf.tools``, ``mlconf.specs`` and ``mlconf.golden`` are the folders of the same names; see
DESIGN.md. Importing mlconf imports nothing heavy, so tools/ and the backends use it freely.
"""

__version__ = "0.1.0"
