"""Mutations of a file's bytes shared by the .mlb and .mlt fixture generators (specs/mlb_errors.yaml
and specs/mlt.yaml name them in their cases)."""

from __future__ import annotations


def apply(b: bytearray, kind: str, arg) -> bool:
    """Apply one byte-level mutation in place; False if ``kind`` is not one of them."""
    if kind == "raw":
        raw = bytes.fromhex(arg["hex"])
        b[arg["offset"] : arg["offset"] + len(raw)] = raw
    elif kind == "truncate_to":
        del b[arg:]
    elif kind == "truncate_by":
        del b[len(b) - arg :]
    elif kind == "append":
        b += bytes([0xA5]) * arg
    else:
        return False
    return True
