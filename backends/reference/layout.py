"""The MLB v1 layout, read from specs/mlb_header.yaml and specs/mlb_body.yaml.

Pure format knowledge shared by the reference loader and tools/mlb.py (writer and reader): the
header as a NumPy structured dtype, the derived sizes, and the plan of the body (every array with
its offset, dtype and shape). Validation lives in loader.py; this module assumes a header that
passed it. All sizes are Python ints, so nothing here can overflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import numpy as np

from mlconf import specs

HEADER_SIZE = 256
MAGIC = b"MLB1"
WTYPES = {1: "Q8_0", 2: "Q4_0"}
WTYPE_IDS = {v: k for k, v in WTYPES.items()}
BLOCK = 32
LINEAR_BIT = 8  # layer flag bit 3

_NP_TYPES = {"u32": "<u4", "f32": "<f4", "char4": "S4"}


@cache
def header_dtype() -> np.dtype:
    """The 256-byte header as a structured dtype (field offsets from specs/mlb_header.yaml)."""
    spec = specs.load("mlb_header")
    names, formats, offsets = [], [], []
    for f in spec["fields"]:
        names.append(f["name"])
        formats.append(_NP_TYPES.get(f["type"], ("u1", (f.get("size", 0),))))
        offsets.append(f["offset"])
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": spec["size"]})


@cache
def field_types() -> dict[str, str]:
    return {f["name"]: f["type"] for f in specs.load("mlb_header")["fields"]}


def parse_header(buf: bytes) -> dict:
    """Header fields as Python values (f32 fields as the float32 value, padding as bytes)."""
    rec = np.frombuffer(buf[:HEADER_SIZE], dtype=header_dtype(), count=1)[0]
    out: dict = {}
    for name, kind in field_types().items():
        v = rec[name]
        if kind == "char4":
            out[name] = bytes(v).ljust(4, b"\0")
        elif kind == "pad":
            out[name] = bytes(v)
        elif kind == "f32":
            out[name] = float(v)
        else:
            out[name] = int(v)
    return out


def pack_header(h: dict) -> bytes:
    """256 bytes for the header fields in ``h`` (missing fields are zero, magic defaults MLB1)."""
    rec = np.zeros(1, dtype=header_dtype())
    for name, kind in field_types().items():
        if name not in h:
            continue
        v = h[name]
        if kind == "pad":
            rec[name] = np.frombuffer(bytes(v).ljust(96, b"\0")[:96], dtype=np.uint8)
        else:
            rec[name] = v
    if "magic" not in h:
        rec["magic"] = MAGIC
    return rec.tobytes()


def default_header() -> dict:
    """Every field present, zero, with the magic and version set."""
    h = {name: (0.0 if kind == "f32" else 0) for name, kind in field_types().items()}
    h.update(magic=MAGIC, version=1, padding=bytes(96))
    return h


def derive(h: dict) -> dict:
    """The derived sizes of specs/mlb_header.yaml `derived` (header assumed valid)."""
    head_dim = h["head_dim"] or (h["dim"] // h["n_heads"] if h["n_heads"] else 0)
    k, v, dk, dv = h["lin_k_heads"], h["lin_v_heads"], h["lin_k_dim"], h["lin_v_dim"]
    return {
        "head_dim": head_dim,
        "q_dim": head_dim * h["n_heads"],
        "kv_dim": head_dim * h["n_kv_heads"],
        "rot_dim": h["rot_dim"] or head_dim,
        "lin_qkv": 2 * k * dk + v * dv,
        "lin_v_width": v * dv,
    }


@dataclass(frozen=True)
class Array:
    """One array of the body. A quantized matrix is two of these: ``<name>.q`` then ``<name>.d``."""

    name: str  # e.g. "layers.0.wq.q", "tok_emb.d", "final_norm"
    fmt: str  # U8 | F32 | Q8_0 | Q4_0 (the format of the matrix the part belongs to)
    part: str  # "" for plain arrays, "q" or "d" for the parts of a matrix
    dtype: str  # NumPy dtype string of the stored elements
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def matrix(self) -> str:
        """The matrix name without the part suffix."""
        return self.name[:-2] if self.part else self.name


def align(n: int) -> int:
    a = specs.load("mlb_body")["alignment"]
    return -(-n // a) * a


def matrix_format(h: dict, cls: str) -> str:
    """Q8_0 or Q4_0 for a matrix of this q8_mask class."""
    body = specs.load("mlb_body")
    if h["wtype"] == WTYPE_IDS["Q8_0"]:
        return "Q8_0"
    bits = body["class_bits"][cls]
    if cls == "tok_emb" and h["shared_classifier"]:
        bits = body["shared_tok_emb_bits"]
    return "Q8_0" if h["q8_mask"] & bits else "Q4_0"


def _parts(h: dict, entry: dict, dims: dict) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """(fmt, part, dtype, shape) of the stored arrays of one spec entry."""
    shape = tuple(dims[s] for s in entry["shape"])
    enc = entry["enc"]
    if enc == "u8":
        return [("U8", "", "u1", shape)]
    if enc == "f32":
        return [("F32", "", "<f4", shape)]
    fmt = "Q8_0" if enc == "q8_0" else matrix_format(h, entry["class"])
    rows, cols = shape
    q = ("Q8_0", "q", "i1", (rows, cols)) if fmt == "Q8_0" else ("Q4_0", "q", "u1", (rows, cols // 2))
    d = (fmt, "d", "<f2" if h["scale_f16"] else "<f4", (rows, cols // BLOCK))
    return [q, d]


def _present(h: dict, entry: dict) -> bool:
    if "when" in entry and not h[entry["when"]]:
        return False
    return not ("unless" in entry and h[entry["unless"]])


def _section(h: dict, dims: dict, entries: list[dict], prefix: str, offset: int) -> Iterator[Array]:
    for e in entries:
        if not _present(h, e):
            continue
        for fmt, part, dtype, shape in _parts(h, e, dims):
            name = prefix + e["name"] + (f".{part}" if part else "")
            arr = Array(name, fmt, part, dtype, shape, offset)
            yield arr
            offset = align(offset + arr.nbytes)


def _section_size(h: dict, dims: dict, entries: list[dict]) -> int:
    end = 0
    for a in _section(h, dims, entries, "", 0):
        end = align(a.offset + a.nbytes)
    return end


def layer_entries(h: dict, linear: bool) -> list[dict]:
    body = specs.load("mlb_body")
    return (body["linear_layer"] if linear else body["attention_layer"]) + body["ffn"]


def is_linear(flags: bytes | None, i: int) -> bool:
    return bool(flags is not None and flags[i] & LINEAR_BIT)


def plan(h: dict, flags: bytes | None) -> Iterator[Array]:
    """Every array of the body in file order. ``flags`` are the layer-flag bytes (or None)."""
    body = specs.load("mlb_body")
    dims = {**h, **derive(h)}
    offset = body["start"]
    sections = [("", body["header_arrays"])]
    sections += [(f"layers.{i}.", layer_entries(h, is_linear(flags, i))) for i in range(h["n_layers"])]
    sections += [("", body["trailer_arrays"])]
    for prefix, entries in sections:
        for a in _section(h, dims, entries, prefix, offset):
            yield a
            offset = align(a.offset + a.nbytes)


def required_size(h: dict, flags: bytes | None) -> int:
    """Bytes the file must hold: the end of the last array (its trailing padding is optional).

    Computed per layer kind rather than per layer, so a header claiming 65536 layers costs
    nothing before the size check refuses it.
    """
    body = specs.load("mlb_body")
    dims = {**h, **derive(h)}
    n_linear = sum(1 for b in flags if b & LINEAR_BIT) if flags is not None else 0
    n_attn = h["n_layers"] - n_linear
    size = body["start"]
    size += _section_size(h, dims, body["header_arrays"])
    size += n_attn * _section_size(h, dims, layer_entries(h, False))
    size += n_linear * _section_size(h, dims, layer_entries(h, True))
    last = None
    for a in _section(h, dims, body["trailer_arrays"], "", size):
        last = a
    assert last is not None  # final_norm is always present
    return last.offset + last.nbytes
