"""The normative YAML of mlconf, installed as package data (``mlconf.specs``).

This folder is data; the only code is this accessor, so that the harness, the backends and
tools/ find the same files in a checkout and in an installed package.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

SPEC_DIR = Path(__file__).resolve().parent


@cache
def load(name: str) -> Any:
    """The parsed YAML of ``specs/<name>.yaml`` (cached; treat it as read-only)."""
    with open(SPEC_DIR / f"{name}.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)
