"""Tokenizing text with a GGUF's own vocabulary, as llama.cpp does (llama-vocab.cpp), for
`mlconf embed --text`: the two vocabularies of BitNet's GGUFs (tools/convert_bitnet.py).

* gpt2 (Qwen3: byte-level BPE with merges): the reference encoder (reference/tokenizer.py) with
  the pre-tokenizer tokenizer.ggml.pre names (gpt2, llama-bpe, qwen2; others are refused).
* llama (Gemma 3: SentencePiece, scores and no merges): llama.cpp's SPM tokenizer. Spaces become
  U+2581 (and one is prepended when add_space_prefix is true); the text is split into UTF-8
  characters; the adjacent pair whose concatenation is a vocabulary piece with the highest score
  is merged first (on equal scores the leftmost), until no pair is a piece; a final symbol not in
  the vocabulary is re-split along its merges, and a character that is not a piece becomes its
  UTF-8 bytes' <0xXX> tokens.

Both: CONTROL and USER_DEFINED tokens are matched in the text first (longest first, leftmost), as
llama.cpp's embedding tool tokenizes (parse_special); BOS is prepended and EOS appended when
add_bos_token / add_eos_token say so.

    vocab = read("model.gguf")
    ids = encode(vocab, "some text")
    ids = text_ids("model.gguf", "some text")   # the same, VocabError without gguf-py or tokens
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from mlconf.backends.reference.tokenizer import Encoder

SPIECE = "\u2581"
# tokenizer.ggml.pre -> the flags of the reference byte-level encoder (specs/mlt.yaml)
PRE_FLAGS = {"gpt2": 32, "gpt-2": 32, "llama-bpe": 0, "llama3": 0, "qwen2": 16 | 8}
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6


class VocabError(ValueError):
    """A GGUF whose vocabulary cannot tokenize text here (the message names the file and key)."""


@dataclass
class Vocab:
    path: str
    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] = field(default_factory=list)
    merges: list[str] = field(default_factory=list)
    bos: int | None = None
    eos: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = True
    cache: dict = field(default_factory=dict, repr=False)  # the encoder built on first use


def read(path: str) -> Vocab:
    """The tokenizer keys of a GGUF (gguf-py); VocabError for a file that is not a readable GGUF
    or a vocabulary this module cannot encode with."""
    import gguf

    from mlconf.tools.convert_bitnet import register_i2s
    from mlconf.tools.files import check_regular

    why = check_regular(path)  # gguf-py maps the path: a FIFO would block (loader.special_files)
    if why:
        raise VocabError(f"{path}: cannot open: {why}")
    register_i2s()  # gguf-py learns the I2_S tensor type (36), else it refuses the file
    try:
        r = gguf.GGUFReader(path)
    except OSError:
        raise
    except Exception as e:  # gguf-py raises ValueError, struct.error, ... on a damaged file
        raise VocabError(f"{path}: not a readable GGUF ({type(e).__name__}: {e})") from None

    def get(key, default=None):
        f = r.fields.get(f"tokenizer.ggml.{key}")
        return default if f is None else f.contents()

    model = get("model")
    if model not in ("gpt2", "llama"):
        raise VocabError(
            f"{path}: tokenizer.ggml.model {model!r}: --text supports gpt2 (byte-level BPE) and "
            "llama (SentencePiece) vocabularies; give --tokens"
        )
    v = Vocab(
        str(path),
        model,
        get("pre", "default"),
        list(get("tokens", [])),
        [int(t) for t in get("token_type", [])],
        [float(s) for s in get("scores", [])],
        list(get("merges", [])),
        get("bos_token_id"),
        get("eos_token_id"),
        bool(get("add_bos_token", False)),
        bool(get("add_eos_token", False)),
        bool(get("add_space_prefix", model == "llama")),
    )
    if len(v.types) != len(v.tokens):
        raise VocabError(
            f"{path}: tokenizer.ggml.token_type has {len(v.types)} entries for {len(v.tokens)} tokens"
        )
    if model == "gpt2" and v.pre not in PRE_FLAGS:
        raise VocabError(
            f"{path}: tokenizer.ggml.pre {v.pre!r} has no pre-tokenizer here (known: "
            f"{', '.join(PRE_FLAGS)}); give --tokens (e.g. from `mlconf encode`)"
        )
    if model == "llama" and len(v.scores) != len(v.tokens):
        raise VocabError(
            f"{path}: tokenizer.ggml.scores has {len(v.scores)} entries for {len(v.tokens)} tokens"
        )
    for key in ("bos", "eos"):
        if getattr(v, f"add_{key}") and getattr(v, key) is None:
            raise VocabError(f"{path}: tokenizer.ggml.add_{key}_token is true but {key}_token_id is absent")
    return v


def encode(vocab: Vocab, text: str) -> list[int]:
    """The ids of ``text`` (see the module docstring), BOS / EOS as the GGUF says."""
    ids = (_encode_bpe if vocab.model == "gpt2" else _encode_spm)(vocab, text)
    if vocab.add_bos:
        ids = [int(vocab.bos)] + ids
    if vocab.add_eos:
        ids = ids + [int(vocab.eos)]
    return ids


def text_ids(path: str, text: str) -> list[int]:
    """The ids of ``text`` in the vocabulary of the GGUF at ``path`` (`mlconf embed --text`);
    VocabError naming what is missing (gguf-py, a usable vocabulary, any token)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise VocabError(
            "--text reads the GGUF's tokenizer with gguf-py: pip install gguf, or give --tokens"
        ) from None
    out = encode(read(path), text)
    if not out:
        raise VocabError("--text: the text gives no tokens")
    return out


# ---------------------------------------------------------------- gpt2: byte-level BPE
def _encode_bpe(v: Vocab, text: str) -> list[int]:
    if "bpe" not in v.cache:
        v.cache["bpe"] = _bpe_encoder(v)
    return v.cache["bpe"].encode(text)


def _bpe_encoder(v: Vocab) -> Encoder:
    from mlconf.tools import mlt
    from mlconf.tools.convert_tokenizer import CHAR_TO_BYTE

    tokens = []
    for piece, typ in zip(v.tokens, v.types, strict=True):
        if typ in (TYPE_CONTROL, TYPE_USER_DEFINED):
            tokens.append((mlt.ATTR_ADDED, piece.encode("utf-8")))
        else:  # byte-level spelling -> bytes (an unused [PADn] keeps its characters' bytes)
            tokens.append((mlt.ATTR_PLAIN, bytes(CHAR_TO_BYTE.get(c, 0) for c in piece)))
    ids = {p: i for i, p in reversed(list(enumerate(v.tokens)))}
    merges = []
    for rank, m in enumerate(v.merges):
        left, _, right = m.partition(" ")
        if left not in ids or right not in ids or left + right not in ids:
            raise VocabError(
                f"{v.path}: tokenizer.ggml.merges[{rank}] {m!r} names a piece not in the vocabulary"
            )
        merges.append((ids[left], ids[right], ids[left + right]))
    tok = mlt.Tokenizer(kind=mlt.KIND_BYTE_LEVEL, flags=PRE_FLAGS[v.pre], tokens=tokens, merges=merges)
    return Encoder(tok)


# ---------------------------------------------------------------- llama: SentencePiece by scores
def _specials(v: Vocab) -> list[tuple[str, int]]:
    """(text, id) of the tokens matched literally in the text: CONTROL and USER_DEFINED, longest
    first (then lower id)."""
    out = [
        (t, i)
        for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True))
        if ty in (TYPE_CONTROL, TYPE_USER_DEFINED) and t
    ]
    return sorted(out, key=lambda p: (-len(p[0]), p[1]))


def _partition(text: str, specials: list[tuple[str, int]]) -> list[str | int]:
    """The text as fragments: plain strings, and ids of special tokens found in it (each special
    token, longest first, splits every plain fragment at its leftmost occurrences)."""
    parts: list[str | int] = [text]
    for s, tid in specials:
        nxt: list[str | int] = []
        for p in parts:
            if not isinstance(p, str) or s not in p:
                nxt.append(p)
                continue
            pieces = p.split(s)
            for k, piece in enumerate(pieces):
                if piece:
                    nxt.append(piece)
                if k < len(pieces) - 1:
                    nxt.append(tid)
        parts = nxt
    return parts


def _encode_spm(v: Vocab, text: str) -> list[int]:
    if "spm" not in v.cache:
        ids = {t: i for i, t in enumerate(v.tokens)}  # as llama.cpp's token_to_id: a repeat -> its last id
        byte_ids = {}
        for b in range(256):
            t = ids.get(f"<0x{b:02X}>")
            if t is None:
                raise VocabError(f"{v.path}: no byte token <0x{b:02X}> for SentencePiece byte fallback")
            byte_ids[b] = t
        v.cache["spm"] = (ids, byte_ids, _specials(v))
    ids, byte_ids, specials = v.cache["spm"]
    out: list[int] = []
    first = True
    for frag in _partition(text, specials):
        if isinstance(frag, int):
            out.append(frag)
            first = False
            continue
        s = frag.replace(" ", SPIECE)
        if v.add_space_prefix and first:
            s = SPIECE + s
        first = False
        out += _spm_fragment(s, ids, v.scores, byte_ids)
    return out


def _spm_fragment(s: str, ids: dict[str, int], scores: list[float], byte_ids: dict[int, int]) -> list[int]:
    """llama.cpp's llm_tokenizer_spm on one fragment (spaces already U+2581)."""
    if not s:
        return []
    sym: list[str | None] = list(s)  # one symbol per character; None once merged away
    prev = list(range(-1, len(sym) - 1))
    nxt = list(range(1, len(sym) + 1))
    nxt[-1] = -1
    heap: list[tuple[float, int, int, str]] = []  # (-score, left index, right index, text)
    rev: dict[str, tuple[str, str]] = {}

    def bigram(a: int, b: int) -> None:
        if a < 0 or b < 0:
            return
        t = sym[a] + sym[b]
        tid = ids.get(t)
        if tid is None:
            return
        heapq.heappush(heap, (-scores[tid], a, b, t))
        rev[t] = (sym[a], sym[b])

    for i in range(1, len(sym)):
        bigram(i - 1, i)
    while heap:
        _, a, b, t = heapq.heappop(heap)
        if sym[a] is None or sym[b] is None or sym[a] + sym[b] != t or nxt[a] != b:
            continue  # outdated: one side was merged since
        sym[a], sym[b] = t, None
        nxt[a] = nxt[b]
        if nxt[b] >= 0:
            prev[nxt[b]] = a
        bigram(prev[a], a)
        bigram(a, nxt[a])

    out: list[int] = []

    def resegment(t: str) -> None:
        tid = ids.get(t)
        if tid is not None:
            out.append(tid)
        elif t in rev:
            left, right = rev[t]
            resegment(left)
            resegment(right)
        else:
            out.extend(byte_ids[b] for b in t.encode("utf-8"))

    i = 0 if sym else -1
    while i >= 0:
        resegment(sym[i])
        i = nxt[i]
    return out
