"""Krafla versions (specs/mlb_header.yaml `since`): parsing, printing, and which header fields and
layer flag bits each version introduced (issue 12's --target-version)."""

from __future__ import annotations

from functools import cache

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    """A Krafla version "MAJOR.MINOR.PATCH" (or "MAJOR.MINOR") -> (major, minor, patch); ValueError
    for anything else."""
    parts = str(text).strip().split(".") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise ValueError(f"version {text!r}: expected MAJOR.MINOR.PATCH, e.g. 0.8.0")
    major, minor, patch = (int(p) for p in (parts + ["0"])[:3])
    return major, minor, patch


def format_version(v: Version) -> str:
    return ".".join(str(p) for p in v)


@cache
def feature_versions() -> dict[str, dict]:
    """The `since` versions of specs/mlb_header.yaml: {"fields": {name: (offset, version)},
    "layer_flag_bits": {bit value: version}}, only the features that name one."""
    from . import load  # the package face defines it, after importing this module

    doc = load("mlb_header")
    return {
        "fields": {
            f["name"]: (f["offset"], parse_version(f["since"])) for f in doc["fields"] if f.get("since")
        },
        "layer_flag_bits": {
            b["value"]: parse_version(b["since"]) for b in doc["layer_flag_bits"] if b.get("since")
        },
    }
