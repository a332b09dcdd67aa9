# Root conftest: pytester drives the plugin's own tests (tests/test_plugin.py).
pytest_plugins = ["pytester"]
