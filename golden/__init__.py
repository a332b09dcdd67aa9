"""Committed goldens (``mlconf.golden``), each listed in MANIFEST with its oracle and command."""

from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent
