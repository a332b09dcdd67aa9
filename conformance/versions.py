"""Version-targeted conformance (`mlconf run --target-version V`): what a Krafla V runtime answers.

The seed: "Bit 2 needs Krafla 0.8.0 or later and bit 3, like offsets 132-159, 0.9.0 or later; older
versions refuse such files". specs/mlb_header.yaml gives each such feature its `since` and the
rule an older runtime refuses it by (`versions.refused_by`). A file's version is the newest
`since` among the features it uses; a runtime older than that refuses it with the status of the
first rule, in specs/mlb_errors.yaml's order, among the refusing rules and the rule the file
already breaks (decision version.older_runtime). This is derived from the spec tables alone: the
loaders' version switches (reference, native) are checked against it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import cache

from mlconf import specs
from mlconf.tools import files

Version = specs.Version
HEADER = 256


@dataclass(frozen=True)
class Feature:
    what: str  # "header field rot_dim", "layer flag bit 2"
    since: Version
    refused_by: str  # the rule id a runtime older than `since` refuses it by


@cache
def _fields() -> dict[str, int]:
    return {f["name"]: f["offset"] for f in specs.load("mlb_header")["fields"]}


def _u32(data: bytes, name: str) -> int:
    return struct.unpack_from("<I", data, _fields()[name])[0]


def features(data: bytes) -> list[Feature]:
    """The versioned features a file's leading bytes use: non-zero fields with a `since`, and the
    flag bits with one in the layer-flag bytes (read only when layer_flags is 1 and the file
    holds every flag byte, as the loader rules read them)."""
    if len(data) < HEADER:
        return []
    doc = specs.load("mlb_header")
    refused_by = doc["versions"]["refused_by"]
    fv = specs.feature_versions()
    out = [
        Feature(f"header field {name}", since, refused_by["field"])
        for name, (off, since) in fv["fields"].items()
        if any(data[off : off + 4])
    ]
    n = _u32(data, "n_layers")
    if _u32(data, "layer_flags") == 1 and len(data) >= HEADER + n:
        flags = data[HEADER : HEADER + n]
        for value, since in fv["layer_flag_bits"].items():
            if any(b & value for b in flags):
                out.append(
                    Feature(f"layer flag bit {value.bit_length() - 1}", since, refused_by["layer_flag_bit"])
                )
    return out


def read_head(path: str | os.PathLike) -> bytes:
    """The bytes ``features`` looks at (header and layer-flag bytes); b"" for what is no file."""
    try:
        with files.open_regular(path) as f:
            head = f.read(HEADER)
            if len(head) == HEADER:
                head += f.read(min(_u32(head, "n_layers"), 1 << 20))
            return head
    except OSError:
        return b""


def file_version(data: bytes) -> Version | None:
    """The oldest Krafla version that reads the file as the newest does (None: every version)."""
    return max((f.since for f in features(data)), default=None)


def expected(status: str, rule: str, data: bytes, target: Version | None) -> tuple[str, str]:
    """(the status a Krafla ``target`` runtime must give, why) for a file whose newest-version
    expectation is ``status`` (breaking ``rule``, "" for a valid file)."""
    st, _, why = expectation(status, rule, data, target)
    return st, why


def expectation(status: str, rule: str, data: bytes, target: Version | None) -> tuple[str, str, str]:
    """As expected(), with the rule that refuses the file at ``target`` in the middle ("": none)."""
    later = [f for f in features(data) if target is not None and f.since > target]
    if not later:
        return status, rule, ""
    rules = specs.load("mlb_errors")["rules"]
    order = {r["id"]: i for i, r in enumerate(rules)}
    first = min(later, key=lambda f: order[f.refused_by])
    why = (
        f"{first.what} needs Krafla {specs.format_version(first.since)}, the target is "
        f"{specs.format_version(target)}: refused by {first.refused_by}"
    )
    if rule and order[rule] < order[first.refused_by]:
        return status, rule, f"{why}, but {rule} comes first"
    return rules[order[first.refused_by]]["status"], first.refused_by, why


def boundaries() -> list[Version]:
    """Every version a feature came with, oldest first."""
    fv = specs.feature_versions()
    return sorted({s for _, s in fv["fields"].values()} | set(fv["layer_flag_bits"].values()))


def older(v: Version) -> Version:
    """A version just before ``v`` (the newest that lacks what ``v`` brought)."""
    major, minor, patch = v
    if patch:
        return major, minor, patch - 1
    if minor:
        return major, minor - 1, 0xFFFF
    return major - 1, 0xFFFF, 0xFFFF
