"""Root conftest: pytester drives the plugin's own tests (tests/test_plugin.py), and the two tiers.

`pytest` alone runs the fast tier: every area and backend, in minutes. The slow tier (tests marked
``slow``; the oracle re-derivations are slow too) holds the sanitizer, libFuzzer, -m32, clang and
qemu builds, the llama.cpp backend, the long fuzz campaigns and the real tokenizers: `pytest -m
slow` runs it alone, `pytest --full` runs both, and `-m EXPR` selects as pytest always does. A test
named on the command line (``file::test``) runs whatever its tier.
"""

import pytest

pytest_plugins = ["pytester"]


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="run the slow tier too (every test)")


@pytest.hookimpl(tryfirst=True)  # before -m selects: an oracle test is in the slow tier
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("oracle") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    if config.getoption("--full") or config.option.markexpr or any("::" in a for a in config.args):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
