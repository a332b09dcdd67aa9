"""The reference GGUF container reader: every gguf.* rule of specs/gguf.yaml, in its reading order.

``parse(data)`` reads the header, the key-value pairs, the alignment and the tensor infos, and
places each tensor's data, stopping at the first field that breaks a rule (GgufError: the rule id,
its status and a reason naming the field, its offset and its value). It never allocates more than
O(len(data)) (gguf.counts bounds the tables; every length is checked against the bytes left before
it is used) and does not recurse: nested arrays are measured with an explicit stack, at most
limits.array_depth deep. The values stay bytes (``Kv.raw``) read by the accessors below; the
fixture writer (conformance/gguf_fixtures.py) rebuilds files from the same structure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mlconf import specs

SPEC = specs.load("gguf")
LIMITS = SPEC["limits"]
TYPES = {int(k): tuple(v) for k, v in SPEC["types"].items()}  # id -> (name, block, bytes per block)
I2S, I2S_TAIL = 36, 32
VALUE_TYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64")
STRING, ARRAY = 8, 9
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B"}
SCALAR.update({10: "<Q", 11: "<q", 12: "<d"})
SIZE = {t: struct.calcsize(f) for t, f in SCALAR.items()}
BIG = 1 << 63  # ggml's int64 ne and the sizes derived from them


class GgufError(ValueError):
    def __init__(self, rule: str, reason: str):
        super().__init__(reason)
        self.rule, self.reason = rule, reason
        self.status = next(r["status"] for r in SPEC["rules"] if r["id"] == rule)


@dataclass
class Kv:
    key: bytes
    type: int
    raw: bytes  # the value's bytes as stored (arrays: element type, count, elements)
    at: int  # offset of the pair in the file

    @property
    def name(self) -> str:
        return self.key.decode("utf-8", "replace")


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]  # ggml order: dims[0] is the row length
    type: int
    offset: int  # from the start of the data section
    at: int = 0  # offset of the info in the file
    nbytes: int = 0

    @property
    def text(self) -> str:
        return self.name.decode("utf-8", "replace")


@dataclass
class GgufFile:
    version: int
    kvs: list[Kv] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    alignment: int = 32
    data_offset: int = 0
    size: int = 0

    def kv(self, key: str) -> Kv | None:
        k = key.encode()
        return next((kv for kv in self.kvs if kv.key == k), None)

    def tensor(self, name: str) -> TensorInfo | None:
        n = name.encode()
        return next((t for t in self.tensors if t.name == n), None)


def tensor_bytes(type_id: int, dims: list[int]) -> int:
    """The data size of a tensor of a known type (I2_S: elements / 4 + its 32-byte tail)."""
    n = 1
    for d in dims:
        n *= d
    _, block, size = TYPES[type_id]
    return n // 4 + I2S_TAIL if type_id == I2S else n // block * size


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = memoryview(data), 0

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise GgufError(
                "gguf.truncated",
                f"{what} at byte {self.pos}: {n} bytes needed, {len(self.data) - self.pos} left",
            )
        b = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return b

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]


def _skip_value(c: _Cursor, t: int, key: str) -> None:
    """Step over one value of type t: strings by length, arrays with a stack of (type, elements
    left), never recursing (gguf.nesting bounds the stack)."""
    if t >= len(VALUE_TYPES):
        raise GgufError("gguf.value_type", f"key {key}: value type {t} is not one of GGUF's 0..12")
    stack: list[list[int]] = []  # [element type, elements left] of each open array
    while True:
        if t == STRING:
            c.take(c.u64(f"key {key}: string length"), f"key {key}: string")
        elif t == ARRAY:
            if len(stack) >= LIMITS["array_depth"]:
                raise GgufError(
                    "gguf.nesting", f"key {key}: arrays nested more than {LIMITS['array_depth']} deep"
                )
            et = c.u32(f"key {key}: array type")
            n = c.u64(f"key {key}: array count")
            if et >= len(VALUE_TYPES):
                raise GgufError("gguf.array_type", f"key {key}: array element type {et} is not one of 0..12")
            if et in SIZE:
                c.take(n * SIZE[et], f"key {key}: {n} {VALUE_TYPES[et]} elements")
            else:
                stack.append([et, n])
        else:
            c.take(SIZE[t], f"key {key}: {VALUE_TYPES[t]} value")
        while stack and stack[-1][1] == 0:
            stack.pop()
        if not stack:
            return
        stack[-1][1] -= 1
        t = stack[-1][0]


def _name(c: _Cursor, limit: int, rule: str, what: str) -> bytes:
    n = c.u64(f"{what} length")
    if not 1 <= n <= limit:
        raise GgufError(rule, f"{what} at byte {c.pos - 8} is {n} bytes long (1 to {limit})")
    b = c.take(n, what)
    if b"\0" in b:  # a C reader would read it as the part before the NUL
        raise GgufError(rule, f"{what} at byte {c.pos - n} has a NUL byte at {b.index(0)}")
    return b


def parse(data: bytes) -> GgufFile:
    """The file's structure, or GgufError at the first field that breaks a gguf.* rule."""
    c = _Cursor(data)
    if len(data) < 4 or bytes(data[:4]) != b"GGUF":
        raise GgufError(
            "gguf.magic",
            f"not a GGUF file: magic {bytes(data[:4]).hex() or '(none)'}, not 47475546",
        )
    c.pos = 4
    g = GgufFile(c.u32("version"), size=len(data))
    if g.version not in (2, 3):
        raise GgufError("gguf.version", f"GGUF version {g.version} is not supported (2 or 3)")
    n_tensors, n_kv = c.u64("tensor count"), c.u64("kv count")
    least = 24 + LIMITS["kv_min_bytes"] * n_kv + LIMITS["tensor_info_min_bytes"] * n_tensors
    if least > len(data):
        raise GgufError(
            "gguf.counts",
            f"{n_kv} kv pairs and {n_tensors} tensors need at least {least} bytes; the file has {len(data)}",
        )
    for i in range(n_kv):
        at = c.pos
        key = _name(c, LIMITS["key_bytes"], "gguf.key", f"key of kv pair {i}")
        text = key.decode("utf-8", "replace")
        t = c.u32(f"key {text}: value type")
        start = c.pos
        _skip_value(c, t, text)
        g.kvs.append(Kv(key, t, bytes(c.data[start : c.pos]), at))
    seen: set[bytes] = set()
    for kv in g.kvs:
        if kv.key in seen:
            raise GgufError("gguf.duplicate_key", f"key {kv.name} occurs twice (again at byte {kv.at})")
        seen.add(kv.key)
    al = g.kv("general.alignment")
    if al is not None:
        v = struct.unpack("<I", al.raw)[0] if al.type == 4 else None
        if v is None or v == 0 or v & (v - 1):
            shown = VALUE_TYPES[al.type] if v is None else v
            raise GgufError("gguf.alignment", f"general.alignment is {shown}: a u32 power of two is required")
        g.alignment = v
    for i in range(n_tensors):
        at = c.pos
        name = _name(c, LIMITS["tensor_name_bytes"], "gguf.tensor.name", f"name of tensor info {i}")
        text = name.decode("utf-8", "replace")
        nd = c.u32(f"tensor {text}: n_dims")
        if not 1 <= nd <= LIMITS["n_dims"]:
            raise GgufError(
                "gguf.tensor.n_dims",
                f"tensor {text} has {nd} dimensions (1 to {LIMITS['n_dims']})",
            )
        dims = [c.u64(f"tensor {text}: dims") for _ in range(nd)]
        tt, off = c.u32(f"tensor {text}: type"), c.u64(f"tensor {text}: offset")
        g.tensors.append(TensorInfo(name, dims, tt, off, at))
        _check_info(g.tensors[-1], g.alignment)
    seen = set()
    for t in g.tensors:
        if t.name in seen:
            raise GgufError("gguf.duplicate_tensor", f"tensor {t.text} occurs twice (again at byte {t.at})")
        seen.add(t.name)
    g.data_offset = align(c.pos, g.alignment)
    want = 0
    for t in g.tensors:
        if t.offset != want:
            raise GgufError(
                "gguf.tensor.layout",
                f"tensor {t.text} is at data offset {t.offset}; the tensors before it end at {want} "
                f"(each at the next multiple of {g.alignment}, in order)",
            )
        end = g.data_offset + t.offset + t.nbytes
        if end > len(data):
            raise GgufError(
                "gguf.tensor.bounds",
                f"tensor {t.text}: {t.nbytes} bytes at byte {g.data_offset + t.offset} end at {end}, past "
                f"the end of the file ({len(data)} bytes)",
            )
        want = align(t.offset + t.nbytes, g.alignment)
    return g


def _check_info(t: TensorInfo, alignment: int) -> None:
    """The checks of one tensor info, after it is read: type, block, size, offset."""
    if t.type not in TYPES:
        raise GgufError("gguf.tensor.type", f"tensor {t.text} has type {t.type}, not a ggml type")
    tname, block, _ = TYPES[t.type]
    if t.dims[0] % block:
        raise GgufError(
            "gguf.tensor.block",
            f"tensor {t.text}: dims[0] {t.dims[0]} is not a multiple of {tname}'s block {block}",
        )
    n = 1
    for d in t.dims:
        n *= d
        if d >= BIG or n >= BIG:
            raise GgufError(
                "gguf.tensor.size",
                f"tensor {t.text}: dims {t.dims}: the element count overflows 63 bits",
            )
    t.nbytes = tensor_bytes(t.type, t.dims)
    if t.nbytes >= BIG:
        raise GgufError("gguf.tensor.size", f"tensor {t.text}: dims {t.dims}: {tname} bytes overflow 63 bits")
    if t.offset % alignment:
        raise GgufError(
            "gguf.tensor.offset_aligned",
            f"tensor {t.text}: offset {t.offset} is not a multiple of {alignment}",
        )


# ---------------------------------------------------------------- values
def scalar(kv: Kv):
    """A scalar's value (bool as int), a string's bytes, or None for an array."""
    if kv.type == STRING:
        return kv.raw[8:]
    if kv.type == ARRAY:
        return None
    return struct.unpack(SCALAR[kv.type], kv.raw)[0]


def array(kv: Kv) -> tuple[int, list] | None:
    """An array of scalars or strings as (element type, values); None for another value or an
    array of arrays."""
    if kv.type != ARRAY:
        return None
    et, n = struct.unpack_from("<IQ", kv.raw)
    if et in SCALAR:
        return et, list(struct.unpack_from(f"<{n}{SCALAR[et][1]}", kv.raw, 12))
    if et != STRING:
        return None
    out, pos = [], 12
    for _ in range(n):
        (ln,) = struct.unpack_from("<Q", kv.raw, pos)
        out.append(kv.raw[pos + 8 : pos + 8 + ln])
        pos += 8 + ln
    return et, out
