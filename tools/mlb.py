"""Reference writer and reader of MLB v1 model files (and of MLI1 importance-matrix files).

Library:  write(path, header, arrays, flags=..., q4_rule=..., imatrix=...)  and  read(path).
Script:   python tools/mlb.py info FILE

The layout comes from specs/mlb_body.yaml (through backends/reference/layout.py) and the
quantizers from backends/reference/quant.py, so the writer, the reader and the reference loader
share one statement of the format. The writer refuses what a loader would refuse (header rules of
specs/mlb_errors.yaml), non-finite weights, wrong shapes and f16 scales above 65504, and never
leaves a partial file: it writes a temporary file beside the target and renames it.
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlconf.backends.reference import layout, loader, quant
from mlconf.tools.files import atomic_write


class MLBError(ValueError):
    """A file or input that the writer or reader refuses; the message names file, field and rule."""


# ---------------------------------------------------------------- MLI1 importance matrix
MLI_HEADER = struct.Struct("<4sIIIIIQQ")


@dataclass
class Imatrix:
    """An MLI1 file: sums of squares of the inputs of every matrix class, per channel."""

    n_layers: int
    dim: int
    hidden_dim: int
    q_dim: int  # 0 when equal to dim (as stored)
    tokens: int  # tokens summed into the layers
    tokens_cls: int  # tokens summed into the classifier
    sums: np.ndarray  # float64, layout of the seed's "Importance matrix file"

    @property
    def q_width(self) -> int:
        return self.q_dim or self.dim

    def _layer_stride(self) -> int:
        return 2 * self.dim + self.q_width + self.hidden_dim

    def channels(self, layer: int | None, slot: str) -> np.ndarray:
        """Sums for one input: slot attn (wq/wk/wv), wo, ffn (w1/w3), w2, or cls (layer None)."""
        if slot == "cls":
            base = self.n_layers * self._layer_stride()
            return self.sums[base : base + self.dim]
        sizes = {"attn": self.dim, "wo": self.q_width, "ffn": self.dim, "w2": self.hidden_dim}
        off = layer * self._layer_stride()
        for s, n in sizes.items():
            if s == slot:
                return self.sums[off : off + n]
            off += n
        raise KeyError(slot)

    def expected_len(self) -> int:
        return self.n_layers * self._layer_stride() + self.dim


def read_imatrix(path: str | os.PathLike) -> Imatrix:
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise MLBError(f"{name}: cannot read imatrix: {e.strerror or e}") from None
    if len(data) < MLI_HEADER.size:
        raise MLBError(f"{name}: {len(data)} bytes, shorter than the 40-byte MLI1 header")
    magic, version, n_layers, dim, hidden, q_dim, tok, tok_cls = MLI_HEADER.unpack_from(data)
    if magic != b"MLI1":
        raise MLBError(f"{name}: magic {magic!r}, expected b'MLI1'")
    if version != 1:
        raise MLBError(f"{name}: version {version}, expected 1")
    im = Imatrix(n_layers, dim, hidden, q_dim, tok, tok_cls, np.empty(0))
    body = len(data) - MLI_HEADER.size
    if body != 8 * im.expected_len():
        raise MLBError(f"{name}: {body} bytes of sums, the header implies {8 * im.expected_len()}")
    im.sums = np.frombuffer(data, dtype="<f8", offset=MLI_HEADER.size)
    if not np.isfinite(im.sums).all() or (im.sums < 0).any():
        raise MLBError(f"{name}: sums of squares must be finite and >= 0")
    return im


def write_imatrix(path: str | os.PathLike, im: Imatrix) -> None:
    sums = np.asarray(im.sums, dtype="<f8")
    if sums.size != im.expected_len():
        raise MLBError(f"{os.fspath(path)}: {sums.size} sums, the header implies {im.expected_len()}")
    head = MLI_HEADER.pack(b"MLI1", 1, im.n_layers, im.dim, im.hidden_dim, im.q_dim, im.tokens, im.tokens_cls)
    atomic_write(path, [head, sums.tobytes()])


# Input slot of each matrix name for imatrix weighting (decision imatrix.slots).
IMATRIX_SLOT = {
    "wq": "attn",
    "wk": "attn",
    "wv": "attn",
    "wg": "attn",
    "lqkv": "attn",
    "lz": "attn",
    "wo": "wo",
    "w1": "ffn",
    "w3": "ffn",
    "w2": "w2",
    "wcls": "cls",
}


def _imatrix_for(im: Imatrix | None, h: dict, matrix: str) -> np.ndarray | None:
    if im is None:
        return None
    parts = matrix.split(".")
    base = parts[-1]
    layer = int(parts[1]) if parts[0] == "layers" else None
    if base == "tok_emb":
        if not h["shared_classifier"]:
            return None
        base = "wcls"
    slot = IMATRIX_SLOT.get(base)
    if slot is None:
        return None
    tokens = im.tokens_cls if slot == "cls" else im.tokens
    if tokens == 0:
        return None
    return quant.importance(im.channels(layer, slot))


def _check_imatrix(im: Imatrix, h: dict, name: str) -> None:
    d = layout.derive(h)
    want = {
        "n_layers": h["n_layers"],
        "dim": h["dim"],
        "hidden_dim": h["hidden_dim"],
        "q_dim": 0 if d["q_dim"] == h["dim"] else d["q_dim"],
    }
    for k, v in want.items():
        if getattr(im, k) != v:
            raise MLBError(f"{name}: imatrix {k} = {getattr(im, k)} does not match the model's {v}")


# ---------------------------------------------------------------- writer


U32_MAX = 2**32 - 1


def full_header(header: Mapping) -> dict:
    """Every header field (missing ones zero), with each value checked against the field's type:
    u32 fields an integer in 0..2^32-1, f32 fields a real number that float32 holds (rounded to
    it), magic 4 bytes, padding at most 96 bytes. Anything else is an MLBError naming the field."""
    h = layout.default_header()
    unknown = set(header) - set(h)
    if unknown:
        raise MLBError(f"unknown header field(s): {', '.join(sorted(unknown))}")
    h.update(header)
    for name, kind in layout.field_types().items():
        v = h[name]
        if kind == "u32":
            if not isinstance(v, numbers.Integral) or not 0 <= int(v) <= U32_MAX:
                raise MLBError(f"header field {name} = {v!r} is not an integer in 0..2^32-1 (u32)")
            h[name] = int(v)
        elif kind == "f32":
            if not isinstance(v, numbers.Real):
                raise MLBError(f"header field {name} = {v!r} is not a number (f32)")
            try:
                with np.errstate(over="ignore"):
                    f = np.float32(v)
                too_big = bool(np.isinf(f)) and math.isfinite(float(v))
            except OverflowError:  # an int beyond any float
                too_big = True
            if too_big:
                raise MLBError(f"header field {name} = {v!r} is too large for f32")
            h[name] = float(f)
        elif kind == "char4":
            if not isinstance(v, (bytes, bytearray)) or len(v) != 4:
                raise MLBError(f"header field {name} = {v!r} is not 4 bytes")
            h[name] = bytes(v)
        elif kind == "pad":
            if not isinstance(v, (bytes, bytearray)) or len(v) > 96:
                raise MLBError(f"header field {name} is not at most 96 bytes")
            h[name] = bytes(v).ljust(96, b"\0")
    return h


def expected_arrays(h: dict, flags: Sequence[int] | None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The float arrays ``write`` takes: name -> (format, logical shape). Matrices by their name."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    fl = bytes(flags) if flags is not None else None
    for a in layout.plan(h, fl):
        if a.name == "layer_flags":
            continue
        if a.part == "q":
            rows, c = a.shape
            out[a.matrix] = (a.fmt, (rows, c * 2 if a.fmt == "Q4_0" else c))
        elif not a.part:
            out[a.name] = (a.fmt, a.shape)
    return out


def _encode(fmt: str, x: np.ndarray, h: dict, q4_rule: str, imp: np.ndarray | None) -> tuple[bytes, bytes]:
    f16 = bool(h["scale_f16"])
    if fmt == "Q8_0":
        q, d = quant.q8_0(x, f16=f16)
    elif q4_rule == "round":
        q, d = quant.q4_0_round(x, f16=f16)
    else:
        q, d = quant.q4_0_search(x, f16=f16, importance=imp)
    return q.tobytes(), d.astype("<f2" if f16 else "<f4").tobytes()


def _padded(b: bytes) -> bytes:
    return b + bytes(layout.align(len(b)) - len(b))


def write(
    path: str | os.PathLike,
    header: Mapping,
    arrays: Mapping[str, np.ndarray],
    *,
    flags: Sequence[int] | None = None,
    q4_rule: str = "search",
    imatrix: Imatrix | None = None,
) -> None:
    """Write an .mlb file from float32 weights (quantized here per the header and q8_mask).

    ``arrays`` maps every name of :func:`expected_arrays` to a float array of that shape.
    ``flags`` are the layer-flag bytes (required iff header layer_flags is 1).
    """
    name = os.fspath(path)
    try:
        h = full_header(header)
    except MLBError as e:
        raise MLBError(f"{name}: {e}") from None
    if q4_rule not in ("search", "round"):
        raise MLBError(f"{name}: q4_rule {q4_rule!r} is not 'search' or 'round'")
    if q4_rule == "round" and imatrix is not None:
        raise MLBError(f"{name}: the round rule takes no imatrix (decision imatrix.round_rule)")
    if flags is not None:
        bad_flag = [b for b in flags if not isinstance(b, numbers.Integral) or not 0 <= int(b) <= 255]
        if bad_flag:
            raise MLBError(f"{name}: layer flag value {bad_flag[0]!r} is not a byte (0..255)")
    fl = None if flags is None else bytes(int(b) for b in flags)
    if h["layer_flags"] == 1 and (fl is None or len(fl) != h["n_layers"]):
        raise MLBError(
            f"{name}: header layer_flags = 1 needs {h['n_layers']} flag bytes, got "
            f"{None if fl is None else len(fl)}"
        )
    if h["layer_flags"] != 1 and fl is not None:
        raise MLBError(f"{name}: flag bytes given but header layer_flags = {h['layer_flags']}")
    bad = loader.header_problem(h, fl)
    if bad:
        raise MLBError(f"{name}: {bad[1]} [{bad[0]}]")
    if imatrix is not None:
        _check_imatrix(imatrix, h, name)
    want = expected_arrays(h, fl)
    missing = [k for k in want if k not in arrays]
    extra = [k for k in arrays if k not in want]
    if missing or extra:
        raise MLBError(
            f"{name}: arrays do not match the header: missing {missing[:5]}, unexpected {extra[:5]}"
        )

    def chunks():
        yield layout.pack_header(h)
        if fl is not None:
            yield _padded(fl)
        for k, (fmt, shape) in want.items():
            x = np.asarray(arrays[k])
            if x.shape != shape:
                raise MLBError(f"{name}: array {k} has shape {x.shape}, the header implies {shape}")
            if x.dtype.kind not in "biuf":
                raise MLBError(f"{name}: array {k} has dtype {x.dtype}, not a real number type")
            if not np.isfinite(x).all():
                raise MLBError(f"{name}: array {k} holds a non-finite value; weights must be finite")
            with np.errstate(over="ignore"):
                x = x.astype(np.float32)
            if not np.isfinite(x).all():
                raise MLBError(f"{name}: array {k} holds a value too large for float32")
            if fmt == "F32":
                yield _padded(x.astype("<f4").tobytes())
                continue
            try:
                q, d = _encode(fmt, x, h, q4_rule, _imatrix_for(imatrix, h, k))
            except quant.QuantError as e:
                raise MLBError(f"{name}: array {k}: {e}") from None
            yield _padded(q)
            yield _padded(d)

    atomic_write(path, chunks())


# ---------------------------------------------------------------- reader
@dataclass
class Model:
    """A validated .mlb file: header, derived sizes, flag bytes and zero-copy array views."""

    path: str
    header: dict
    derived: dict
    flags: bytes | None
    table: list[layout.Array]
    arrays: dict[str, np.ndarray]

    def matrix(self, name: str) -> tuple[str, np.ndarray, np.ndarray]:
        """(format, quants, scales) of a quantized matrix; scales as stored (f32 or f16)."""
        q = self.arrays[f"{name}.q"]
        fmt = next(a.fmt for a in self.table if a.name == f"{name}.q")
        return fmt, q, self.arrays[f"{name}.d"]

    def rows(self, name: str, index: np.ndarray) -> np.ndarray:
        """float32 values of the selected rows of a matrix (an embedding lookup)."""
        fmt, q, d = self.matrix(name)
        return quant.dequantize(fmt, np.asarray(q[index]), np.asarray(d[index]))

    def weights(self, name: str) -> np.ndarray:
        """float32 values of any array (matrices dequantized)."""
        if name in self.arrays:
            return np.asarray(self.arrays[name], dtype=np.float32)
        return quant.dequantize(*self.matrix(name))


def read(path: str | os.PathLike, version: tuple[int, int, int] | None = None) -> Model:
    """Validate with the reference loader (as Krafla ``version`` reads it; None: the newest), then
    map every array without copying."""
    res = loader.load(path, version)
    if not res.ok:
        raise MLBError(f"{res.reason} ({res.status})")
    p = os.fspath(path)
    with open(p, "rb") as f:
        h = layout.parse_header(f.read(layout.HEADER_SIZE))
        flags = None
        if h["layer_flags"]:
            f.seek(layout.HEADER_SIZE)
            flags = f.read(h["n_layers"])
    table = list(layout.plan(h, flags))
    arrays = {a.name: np.memmap(p, dtype=a.dtype, mode="r", offset=a.offset, shape=a.shape) for a in table}
    return Model(p, h, layout.derive(h), flags, table, arrays)


# ---------------------------------------------------------------- info
def info(model: Model) -> str:
    from textwrap import indent

    lines = [f"{model.path}: MLB v{model.header['version']}, {os.path.getsize(model.path)} bytes"]
    lines.append("header:")
    for k, v in model.header.items():
        if k != "padding":
            lines.append(f"  {k:22} {v!r}")
    lines.append("derived: " + ", ".join(f"{k}={v}" for k, v in model.derived.items()))
    if model.flags is not None:
        lines.append("layer flags: " + " ".join(f"{b:#04x}" for b in model.flags))
    lines.append("arrays:")
    rows = [
        f"{a.offset:>12}  {a.nbytes:>12}  {a.fmt:5} {a.dtype:4} {str(a.shape):16} {a.name}"
        for a in model.table
    ]
    title = f"{'offset':>12}  {'bytes':>12}  fmt   type shape            name"
    lines.append(indent("\n".join([title] + rows), "  "))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mlb.py", description="Reference MLB v1 reader.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_info = sub.add_parser("info", help="print header, derived sizes and the array table")
    p_info.add_argument("file")
    args = ap.parse_args(argv)
    try:
        print(info(read(args.file)))
    except MLBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
