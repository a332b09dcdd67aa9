"""The GGUF fixtures of specs/gguf.yaml: each rule's cases and the accepted edges, as mutations of
a valid base (golden BitNet GGUFs) in the spec's mutation vocabulary (its header comment).

A base is built as a Doc (header fields, key-value pairs with their values' bytes, tensor infos,
the data section: build); the mutations edit the Doc, which is then written field by field as
given, so a fixture can hold any value a hostile writer could (a length of 2^64 - 1, n_dims 9);
`cut`, `raw`, `truncate_*` and `append` then act on the written bytes. Deterministic: the bytes
depend only on the spec.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from mlconf import byte_ops, specs
from mlconf.backends.reference import gguf_file
from mlconf.backends.reference.gguf_file import ARRAY, SCALAR, STRING, VALUE_TYPES, align, tensor_bytes

PAD_LIMIT = 1 << 16  # a larger alignment pads by 32: such a file breaks a rule before its data is read


@dataclass
class Pair:
    key: bytes
    type: int
    raw: bytes
    key_length: int | None = None  # the key length field as written, when not len(key)


@dataclass
class Info:
    name: bytes
    dims: list[int]
    type: int
    offset: int
    n_dims: int | None = None  # the field as written, when not len(dims)
    name_length: int | None = None


@dataclass
class Doc:
    version: int
    kvs: list[Pair]
    tensors: list[Info]
    data: bytearray  # the data section
    magic: bytes = b"GGUF"
    n_tensors: int | None = None  # the counts as written, when not the lists' lengths
    n_kv: int | None = None
    post: list[dict] = field(default_factory=list)  # byte-level mutations of the written file

    def pair(self, key: str) -> Pair:
        k = key.encode()
        for p in self.kvs:
            if p.key == k:
                return p
        raise KeyError(f"the base has no key {key!r}")

    def info(self, name: str) -> Info:
        n = name.encode()
        for t in self.tensors:
            if t.name == n:
                return t
        raise KeyError(f"the base has no tensor {name!r}")

    def alignment(self) -> int:
        p = next((p for p in self.kvs if p.key == b"general.alignment"), None)
        if p is None or p.type != 4:
            return 32
        a = struct.unpack("<I", p.raw)[0]
        return a if a and not a & (a - 1) and a <= PAD_LIMIT else 32


def bases() -> dict[str, dict]:
    return specs.load("gguf")["bases"]


def parse(data: bytes) -> Doc:
    """The Doc of a valid GGUF (the fuzzer's bases are written Docs parsed back)."""
    g = gguf_file.parse(data)
    infos = [Info(t.name, list(t.dims), t.type, t.offset) for t in g.tensors]
    kvs = [Pair(kv.key, kv.type, kv.raw) for kv in g.kvs]
    return Doc(g.version, kvs, infos, bytearray(data[g.data_offset :]))


PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def build(name: str) -> Doc:
    """A base (specs/gguf.yaml `bases`): a tiny BitNet embedding model in convert_bitnet's layout
    (its keys, its tensor order, a gpt2 vocabulary of placeholder tokens), values drawn from a
    generator seeded by the base's name: finite F16 weights, I2_S codes 0..2 with scale 0.05."""
    b = bases()[name]
    arch, d, nl, nh, nkv, hd, ff, vocab = (
        b[k] for k in ("arch", "dim", "layers", "heads", "kv_heads", "head_dim", "ff", "vocab")
    )
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    kvs = [("general.architecture", "string", arch), ("general.name", "string", name)]
    kvs += [
        (f"{arch}.{k}", "u32", v)
        for k, v in (
            ("context_length", 128),
            ("embedding_length", d),
            ("block_count", nl),
            ("feed_forward_length", ff),
            ("attention.head_count", nh),
            ("attention.head_count_kv", nkv),
            ("attention.key_length", hd),
            ("attention.value_length", hd),
        )
    ]
    kvs += [(f"{arch}.attention.layer_norm_rms_epsilon", "f32", 1e-6), (f"{arch}.rope.freq_base", "f32", 1e6)]
    if arch == "gemma3":
        kvs += [
            (f"{arch}.rope.freq_base_swa", "f32", 1e4),
            (f"{arch}.attention.sliding_window", "u32", 8),
            (f"{arch}.attention.query_pre_attn_scalar", "f32", float(hd)),
        ]
    kvs += [(f"{arch}.pooling_type", "u32", 1)]
    doc = Doc(3, [Pair(k.encode(), *encode(t, v)) for k, t, v in kvs], [], bytearray())
    if arch == "gemma3":
        doc.kvs.append(
            Pair(
                f"{arch}.attention.sliding_window_pattern".encode(),
                *encode("array", [i % 2 == 0 for i in range(nl)], "bool"),
            )
        )
    for k, v in (("model", "gpt2"), ("pre", "qwen2")):
        doc.kvs.append(Pair(f"tokenizer.ggml.{k}".encode(), *encode("string", v)))
    doc.kvs.append(
        Pair(b"tokenizer.ggml.tokens", *encode("array", [f"<t{i}>" for i in range(vocab)], "string"))
    )
    doc.kvs.append(Pair(b"tokenizer.ggml.token_type", *encode("array", [1] * vocab, "i32")))
    doc.kvs.append(Pair(b"tokenizer.ggml.merges", *encode("array", [], "string")))
    i2s = b["weights"] == "i2s"
    qd, kvd = nh * hd, nkv * hd
    shape = dict(zip(PROJ, ((d, qd), (d, kvd), (d, kvd), (qd, d), (d, ff), (d, ff), (ff, d)), strict=True))
    blobs = []

    def add(tname: str, dims: list[int], kind: str) -> None:
        n = math.prod(dims)
        if kind == "i2s":
            codes = rng.integers(0, 3, n).astype(np.uint8).reshape(-1, 4, 32)  # element 32g + j -> field g
            packed = (codes[:, 0] << 6 | codes[:, 1] << 4 | codes[:, 2] << 2 | codes[:, 3]).tobytes()
            blob, t = packed + struct.pack("<f", 0.05) + bytes(28), gguf_file.I2S
        else:
            x = 1 + rng.normal(0, 0.1, n) if kind == "norm" else rng.normal(0, 0.1, n)
            blob, t = x.astype("<f2").tobytes(), 1
        doc.tensors.append(Info(tname.encode(), dims, t, 0))
        blobs.append(blob)

    add("token_embd.weight", [d, vocab], "weight")
    for i in range(nl):
        add(f"blk.{i}.attn_norm.weight", [d], "norm")
        for p in PROJ:
            if p == "ffn_gate":
                add(f"blk.{i}.attn_q_norm.weight", [hd], "norm")
                add(f"blk.{i}.attn_k_norm.weight", [hd], "norm")
                if arch == "gemma3":
                    add(f"blk.{i}.post_attention_norm.weight", [d], "norm")
            add(f"blk.{i}.{p}.weight", list(shape[p]), "i2s" if i2s else "weight")
            if i2s:
                add(f"blk.{i}.{p}_norm_in.weight", [shape[p][0]], "norm")
        add(f"blk.{i}.ffn_norm.weight", [d], "norm")
        if arch == "gemma3":
            add(f"blk.{i}.post_ffw_norm.weight", [d], "norm")
    add("output_norm.weight", [d], "norm")
    place(doc, blobs)
    return doc


def base_bytes(name: str) -> bytes:
    return write(build(name))


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _text(v) -> bytes:
    if isinstance(v, dict):
        return str(v["repeat"]).encode() * int(v["times"])
    return str(v).encode()


def encode(type_name, value, of: str | None = None) -> tuple[int, bytes]:
    """A value's type id and bytes: a scalar, a string, or an array of `of`."""
    t = VALUE_TYPES.index(type_name) if isinstance(type_name, str) else int(type_name)
    if t == STRING:
        b = _text(value)
        return t, _u64(len(b)) + b
    if t == ARRAY:
        et = VALUE_TYPES.index(of)
        items = b"".join(encode(et, v)[1] for v in value)
        return t, struct.pack("<IQ", et, len(value)) + items
    return t, struct.pack(SCALAR[t], float(value) if t in (6, 12) else int(value))


def _nested(depth: int) -> bytes:
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", 0, 1) + b"\x01"


def _tensor_data(doc: Doc, t: Info) -> int:
    if t.offset + tensor_bytes(t.type, t.dims) > len(doc.data):
        raise ValueError(f"tensor {t.name.decode()}: its data is not in the base")
    return t.offset


def place(doc: Doc, blobs: list[bytes]) -> None:
    """The data section of these tensor bytes, each tensor at the next multiple of the alignment."""
    a, out = doc.alignment(), bytearray()
    for t, blob in zip(doc.tensors, blobs, strict=True):
        t.offset = len(out)
        out += blob + bytes(align(len(blob), a) - len(blob))
    doc.data = out


def relayout(doc: Doc) -> None:
    """Offsets recomputed in order, each tensor's data kept (cut or zero-extended to its size)."""
    blobs = []
    for t in doc.tensors:
        n = tensor_bytes(t.type, t.dims)
        old = bytes(doc.data[t.offset : t.offset + n]) if t.offset >= 0 else b""
        blobs.append(old + bytes(n - len(old)))
    place(doc, blobs)


def mutate(doc: Doc, ops: list[dict]) -> Doc:
    for op in ops:
        ((kind, arg),) = op.items()
        if kind == "header":
            for k, v in arg.items():
                setattr(doc, k, bytes.fromhex(v) if k == "magic" else int(v))
        elif kind == "kv":
            t, raw = (
                (int(arg["type"]), bytes.fromhex(arg["raw"]))
                if "raw" in arg
                else encode(arg["type"], arg["value"], arg.get("of"))
            )
            try:
                p = doc.pair(arg["key"])
                p.type, p.raw = t, raw
            except KeyError:
                doc.kvs.append(Pair(_text(arg["key"]), t, raw))
        elif kind == "kv_key":
            p = doc.pair(arg["key"])
            if "length" in arg:
                p.key_length = int(arg["length"])
            else:
                p.key = _text(arg["text"])
        elif kind == "drop_kv":
            doc.kvs.remove(doc.pair(arg))
        elif kind == "dup_kv":
            p = doc.pair(arg)
            doc.kvs.append(Pair(p.key, p.type, p.raw))
        elif kind == "nest":
            p = doc.pair(arg["key"])
            p.type, p.raw = ARRAY, _nested(int(arg["depth"]))
        elif kind == "tensor":
            t = doc.info(arg["name"])
            if "dims" in arg:
                t.dims = [int(d) for d in arg["dims"]]
            for k in ("n_dims", "type", "offset", "name_length"):
                if k in arg:
                    setattr(t, k, int(arg[k]))
            t.offset += int(arg.get("offset_add", 0))
            if "rename" in arg:
                t.name = _text(arg["rename"])
        elif kind == "drop_tensor":
            doc.tensors.remove(doc.info(arg))
        elif kind == "dup_tensor":
            t = doc.info(arg)
            doc.tensors.append(Info(t.name, list(t.dims), t.type, t.offset))
        elif kind == "add_tensor":
            doc.tensors.append(Info(_text(arg["name"]), [int(d) for d in arg["dims"]], int(arg["type"]), -1))
        elif kind == "relayout":
            relayout(doc)
        elif kind == "poke":
            t = doc.info(arg["tensor"])
            fmt = "<f" if t.type == 0 else "<e"
            at = _tensor_data(doc, t) + int(arg["index"]) * struct.calcsize(fmt)
            doc.data[at : at + struct.calcsize(fmt)] = struct.pack(fmt, float(arg["value"]))
        elif kind == "i2s_scale":
            t = doc.info(arg["tensor"])
            at = _tensor_data(doc, t) + t.dims[0] * t.dims[1] // 4
            doc.data[at : at + 4] = struct.pack("<f", float(arg["value"]))
        elif kind == "i2s_code3":
            t = doc.info(arg["tensor"])
            doc.data[_tensor_data(doc, t) + int(arg["byte"])] |= 0xC0
        elif kind in ("cut", "raw", "truncate_to", "truncate_by", "append"):
            doc.post.append(op)
        elif kind != "path":
            raise ValueError(f"unknown GGUF mutation {kind!r}")
    return doc


def write(doc: Doc) -> bytes:
    """The file of a Doc, every field as given; then its byte-level mutations."""
    out = bytearray(doc.magic + struct.pack("<I", doc.version))
    out += _u64(len(doc.tensors) if doc.n_tensors is None else doc.n_tensors)
    out += _u64(len(doc.kvs) if doc.n_kv is None else doc.n_kv)
    at: dict[str, int] = {}
    for p in doc.kvs:
        at.setdefault(f"kv {p.key.decode('utf-8', 'replace')}", len(out))
        out += _u64(len(p.key) if p.key_length is None else p.key_length) + p.key
        out += struct.pack("<I", p.type) + p.raw
    for t in doc.tensors:
        at.setdefault(f"tensor_info {t.name.decode('utf-8', 'replace')}", len(out))
        out += _u64(len(t.name) if t.name_length is None else t.name_length) + t.name
        out += struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims)
        out += b"".join(_u64(d) for d in t.dims) + struct.pack("<IQ", t.type, t.offset & (2**64 - 1))
    out += bytes(align(len(out), doc.alignment()) - len(out))
    for t in doc.tensors:
        at.setdefault(f"tensor {t.name.decode('utf-8', 'replace')}", len(out) + t.offset)
    out += doc.data
    for op in doc.post:
        ((kind, arg),) = op.items()
        if kind == "cut":
            del out[at[arg["at"]] + int(arg["plus"]) :]
        else:
            byte_ops.apply(out, kind, arg)
    return bytes(out)


def content(f) -> bytes:
    """The bytes of a GGUF fixture (mlconf.fixtures.Fixture)."""
    return base_bytes(f.base) if f.kind == "valid" else write(mutate(build(f.base), f.mutate))


def catalog():
    """Fixture records (mlconf.fixtures.Fixture) of every GGUF fixture, without writing anything."""
    from mlconf.fixtures import Fixture

    spec = specs.load("gguf")
    out = [Fixture(f"gguf/valid/{n}.gguf", "valid", "ML_OK", [b["why"]], base=n) for n, b in bases().items()]
    for r in spec["rules"]:
        for c in r["cases"]:
            covers = [r["meaning"]] + ([f"class: {c['class']}"] if c.get("class") else [])
            out.append(
                Fixture(
                    f"gguf/malformed/{r['id']}/{c['name']}.gguf",
                    "malformed",
                    r["status"],
                    covers,
                    r["id"],
                    c["base"],
                    c["mutate"],
                )
            )
    for c in spec["accepted"]:
        file = f"gguf/accepted/{c['name']}.gguf"
        out.append(Fixture(file, "accepted", "ML_OK", [c["why"]], "", c["base"], c["mutate"]))
    return out
