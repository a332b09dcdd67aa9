"""The reference .mlt encoder and decoder: the readable truth a C port matches token for token.

    enc = Encoder(tok)            # tok: mlconf.tools.mlt.Tokenizer (validated by the loader)
    enc.encode(text) -> list[int]
    enc.decode(ids) -> bytes      # enc.decode_text(ids) -> str, as HF's decoders would print it

Encoding, for every kind (specs/mlt.yaml; HF `tokenizers` is the behaviour matched):
1. Added tokens (attr 1) are found in the raw text first: scanning left to right, the longest added
   token starting at the first position where any starts (aho-corasick leftmost-longest, as HF's
   AddedVocabulary). Each emits its id; the text between them is a segment for the model.
2. Kind 1 (SentencePiece-style, Llama 2 / Mistral): a non-empty segment has its spaces replaced by
   U+2581 and U+2581 prepended (HF Prepend + Replace normalizers). With flag 4 the prefix goes only
   to the segment at offset 0 of the text, and not when it already starts with U+2581 (HF Metaspace
   prepend_scheme "first"). The segment is one BPE word; its symbols are its characters, a
   character without a plain token becomes the byte tokens of its UTF-8 bytes when they all exist,
   else it is dropped (HF BPE byte_fallback; the format has no unk).
3. Kind 2 (byte-level): NFC (flag 8, Unicode 9.0 as HF: nfc.py); every numeric character split off
   (flag 64: Digits, Unicode 17.0); the Llama 3 regex (classes of Unicode 16.0) (flag 16:
   single digits) or the GPT-2 regex (flag 32) (pretokenize.py); each piece's UTF-8 bytes are a
   BPE word whose symbols are the single-byte plain tokens (a byte without one is dropped).
4. A word that is a whole plain token is that token with flag 2 (ignore_merges); else BPE: the
   applicable merge of lowest rank, the leftmost among equal ranks, until none applies.
5. Flag 1 prepends bos. EOS is never added.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from mlconf.tools.mlt import (
    ATTR_ADDED,
    ATTR_BYTE,
    ATTR_PLAIN,
    FLAG_ADD_BOS,
    FLAG_GPT2_REGEX,
    FLAG_IGNORE_MERGES,
    FLAG_INDIVIDUAL_DIGITS,
    FLAG_NFC,
    FLAG_PREFIX_FIRST_ONLY,
    FLAG_SINGLE_DIGITS,
    KIND_BYTE_LEVEL,
    KIND_SP,
    Tokenizer,
)

from . import pretokenize
from .nfc import nfc

SPIECE = "\u2581"  # SentencePiece's space
SPIECE_BYTES = SPIECE.encode()
Merges = dict[tuple[int, int], tuple[int, int]]  # (left, right) -> (rank, merged)
CACHE_MAX = 1 << 16  # word cache entries before it is emptied (bounds memory only)


def bpe(symbols: list[int], merges: Merges) -> list[int]:
    """Merge symbols (token ids) by rank: the lowest-ranked adjacent pair first, the leftmost
    among equal ranks, until no adjacent pair has a merge.

    Same procedure as HF's Word::merge_all: a heap of (rank, position) over adjacent pairs and a
    doubly linked list of the live symbols. Positions are those of the left symbol in the
    original list, so they keep the left-to-right order. An entry whose pair no longer stands at
    its position (a side was merged away or grew) is stale and skipped when popped. As the loader
    makes every merged token the concatenation of its sides, the pair now at a position cannot
    make the merged token of a stale entry there (it would span other bytes), so the order is
    exactly 'lowest rank, then leftmost' over the pairs standing at each step.
    """
    n = len(symbols)
    if n < 2:
        return list(symbols)
    ids = list(symbols)  # ids[i] = -1 once symbol i is merged into its left neighbour
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        m = merges.get((ids[i], ids[i + 1]))
        if m is not None:
            heap.append((m[0], i, m[1]))
    heapq.heapify(heap)
    while heap:
        rank, i, merged = heapq.heappop(heap)
        j = nxt[i]
        if ids[i] < 0 or j < 0 or (m := merges.get((ids[i], ids[j]))) is None or m[1] != merged:
            continue  # stale (HF's test: the pair now there does not make `merged`)
        ids[i], ids[j] = merged, -1
        k = nxt[j]
        nxt[i] = k
        if k >= 0:
            prv[k] = i
        p = prv[i]
        if p >= 0 and (m := merges.get((ids[p], merged))) is not None:
            heapq.heappush(heap, (m[0], p, m[1]))
        if k >= 0 and (m := merges.get((merged, ids[k]))) is not None:
            heapq.heappush(heap, (m[0], i, m[1]))
    return [t for t in ids if t >= 0]


class Encoder:
    """Encoder and decoder of one tokenizer (see the module docstring for the rules)."""

    def __init__(self, tok: Tokenizer):
        if tok.kind not in (KIND_SP, KIND_BYTE_LEVEL):
            raise ValueError(f"tokenizer kind {tok.kind} is not 1 or 2")
        self.tok, self.kind, self.flags = tok, tok.kind, tok.flags
        # Plain pieces by bytes; a piece listed twice keeps its lowest id (HF's vocabulary is a
        # map, so a converted file never has duplicates).
        self.plain: dict[bytes, int] = {}
        # Initial symbols of single bytes: byte tokens (kind 1 fallback) or the single-byte plain
        # tokens (kind 2).
        self.byte_ids: list[int | None] = [None] * 256
        self.added: dict[str, list[tuple[str, int]]] = {}  # first character -> (text, id)
        for i, (attr, piece) in enumerate(tok.tokens):
            if attr == ATTR_PLAIN:
                self.plain.setdefault(piece, i)
                if tok.kind == KIND_BYTE_LEVEL and len(piece) == 1 and self.byte_ids[piece[0]] is None:
                    self.byte_ids[piece[0]] = i
            elif attr == ATTR_BYTE and len(piece) == 1 and self.byte_ids[piece[0]] is None:
                self.byte_ids[piece[0]] = i
            elif attr == ATTR_ADDED and piece:
                try:
                    text = piece.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # text is Unicode: an added token that is not UTF-8 never matches
                self.added.setdefault(text[0], []).append((text, i))
        for cands in self.added.values():
            cands.sort(key=lambda c: (-len(c[0]), c[1]))  # longest first; equal text: lowest id
        # A pair listed twice takes its last rank, as HF (it builds a map in rank order).
        self.merges: Merges = {(a, b): (r, m) for r, (a, b, m) in enumerate(tok.merges)}
        self._pattern = (
            "gpt2"
            if self.flags & FLAG_GPT2_REGEX
            else "llama3_single_digits"
            if self.flags & FLAG_SINGLE_DIGITS
            else "llama3"
        )
        self._cache: dict[bytes, list[int]] = {}
        self._char_cache: dict[str, list[int]] = {}

    # -- encoding --------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        ids = [self.tok.bos] if self.flags & FLAG_ADD_BOS else []
        for start, segment, added_id in self.split_added(text):
            if added_id is not None:
                ids.append(added_id)
            elif self.kind == KIND_SP:
                ids.extend(self._encode_sp(segment, at_start=start == 0))
            else:
                ids.extend(self._encode_byte_level(segment))
        return ids

    def split_added(self, text: str) -> Iterator[tuple[int, str, int | None]]:
        """(offset, text, id) of the added tokens (id set) and the non-empty segments between
        them (id None), in order."""
        i = start = 0
        while i < len(text):
            for cand, tid in self.added.get(text[i], ()):
                if text.startswith(cand, i):
                    if start < i:
                        yield start, text[start:i], None
                    yield i, cand, tid
                    i = start = i + len(cand)
                    break
            else:
                i += 1
        if start < len(text):
            yield start, text[start:], None

    def _encode_sp(self, segment: str, at_start: bool) -> list[int]:
        s = segment.replace(" ", SPIECE)
        if not self.flags & FLAG_PREFIX_FIRST_ONLY or (at_start and not s.startswith(SPIECE)):
            s = SPIECE + s
        if self.flags & FLAG_IGNORE_MERGES and (whole := self.plain.get(s.encode())) is not None:
            return [whole]
        symbols: list[int] = []
        for c in s:
            symbols.extend(self._char_symbols(c))
        return bpe(symbols, self.merges)

    def _char_symbols(self, c: str) -> list[int]:
        """Kind 1 initial symbols of one character: its plain token, else its byte tokens (all of
        them or none: HF's byte fallback), else nothing."""
        got = self._char_cache.get(c)
        if got is None:
            b = c.encode()
            tid = self.plain.get(b)
            if tid is not None:
                got = [tid]
            else:
                got = [t for t in map(self.byte_ids.__getitem__, b) if t is not None]
                if len(got) < len(b):
                    got = []  # all of its bytes or nothing
            self._char_cache[c] = got
        return got

    def _encode_byte_level(self, segment: str) -> list[int]:
        if self.flags & FLAG_NFC:
            segment = nfc(segment)
        parts = pretokenize.split_numbers(segment) if self.flags & FLAG_INDIVIDUAL_DIGITS else [segment]
        ids: list[int] = []
        for part in parts:
            for piece in pretokenize.split(part, self._pattern):
                ids.extend(self._word(piece.encode()))
        return ids

    def _word(self, word: bytes) -> list[int]:
        """Token ids of one byte-level pre-token (memoized: pre-tokens repeat a lot)."""
        got = self._cache.get(word)
        if got is None:
            whole = self.plain.get(word) if self.flags & FLAG_IGNORE_MERGES else None
            if whole is not None:
                got = [whole]
            else:
                got = bpe([t for t in map(self.byte_ids.__getitem__, word) if t is not None], self.merges)
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[word] = got
        return got

    # -- decoding --------------------------------------------------------------------------
    def _token(self, i: int) -> tuple[int, bytes]:
        if not 0 <= i < len(self.tok.tokens):
            raise ValueError(f"token id {i} is outside 0 .. n_vocab - 1 = {len(self.tok.tokens) - 1}")
        return self.tok.tokens[i]

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes the ids stand for. Kind 1: U+2581 in plain pieces is a space, a byte token is
        its byte, and one leading space is stripped (HF's Llama decoder: Replace, ByteFallback,
        Fuse, Strip(start=1)). Added tokens are their stored bytes."""
        parts = []
        for i in ids:
            attr, piece = self._token(int(i))
            if self.kind == KIND_SP and attr == ATTR_PLAIN:
                piece = piece.replace(SPIECE_BYTES, b" ")
            parts.append(piece)
        out = b"".join(parts)
        return out[1:] if self.kind == KIND_SP and out.startswith(b" ") else out

    def decode_text(self, ids: Iterable[int]) -> str:
        """decode() as text the way HF's decoders replace invalid UTF-8. Kind 2: the whole byte
        string decoded with U+FFFD for each maximal invalid subsequence (Rust's from_utf8_lossy,
        the same as Python's errors="replace"). Kind 1: each run of consecutive byte tokens is
        decoded on its own; a run that is not valid UTF-8 becomes one U+FFFD per byte token (HF
        ByteFallback); then one leading space is stripped."""
        if self.kind == KIND_BYTE_LEVEL:
            return self.decode(ids).decode("utf-8", errors="replace")
        out: list[str] = []
        run = bytearray()

        def flush() -> None:
            if run:
                try:
                    out.append(run.decode("utf-8"))
                except UnicodeDecodeError:
                    out.append("\ufffd" * len(run))
                run.clear()

        for i in ids:
            attr, piece = self._token(int(i))
            if attr == ATTR_BYTE:
                run += piece
                continue
            flush()
            if attr == ATTR_PLAIN:
                piece = piece.replace(SPIECE_BYTES, b" ")
            out.append(piece.decode("utf-8", errors="replace"))
        flush()
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text
