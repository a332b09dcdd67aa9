"""Tokenizer goldens from Hugging Face `tokenizers`: the token-id oracle.

    python tools/golden_tokenizers.py            every case of CASES
    python tools/golden_tokenizers.py NAME ...   some of them

For each case: train a small BPE tokenizer with the library's own BpeTrainer on a corpus generated
from a fixed seed (fixed trainer settings), set the normalizer / pre-tokenizer / post-processor /
added tokens of the model family it imitates, and record HF's ids of every text of
specs/tokenizer_texts.yaml (``encode(text, add_special_tokens=True)``) and the text HF decodes
those ids back to (``decode(ids[n:], skip_special_tokens=False)``, n = 1 when the post-processor
prepends a BOS: the text's own ids, which a runtime decodes when it prints generated text). Writes
golden/tokenizers/NAME.json (HF's own tokenizer.json) and golden/tokenizers/NAME.ids.json, and
their MANIFEST rows. The harness never computes these ids: tests/test_golden_tokenizers.py
converts NAME.json with tools/convert_tokenizer.py and compares the reference encoder with them.

Reproducibility: every case is trained twice in the same process and refused unless both
tokenizer.json strings are identical. `pytest -m oracle` re-trains and compares bytes; what it
does when the installed `tokenizers` differs from the MANIFEST's version is in
tests/test_golden_tokenizers.py (the ids of a committed tokenizer.json are re-checked strictly
under any version; the training output only under the MANIFEST's version).

Two edits of the trainer's output, both made before HF loads the file (HF then encodes it as is):
- SentencePiece-style cases get the 256 <0xXX> byte-fallback pieces after the first special tokens
  (ids 3..258, as in Llama 2's vocab); BpeTrainer has no option for them.
- ignore_merges cases keep only the first 60% of the trained merges, the vocab whole. In a vocab
  trained by BPE every piece is reached by its own merges, so ignore_merges would change no id;
  Llama 3's vocab (tiktoken ranks turned into merges) has pieces no merge path reaches, and this
  gives the golden such pieces (the oracle test checks that the flag changes some ids).
And one choice: cases whose pre-tokenizer splits digits (Qwen2's \\p{N}, SmolLM's Digits) are
trained with the Llama 3 regex (digit groups of up to 3, punctuation with its newlines) and used
with their own. Trained with their own, their vocab has no multi-digit piece and flags 16, 64 and
32 would change no id; real ones can have them (Qwen2's vocab comes from cl100k_base's, \\p{N}{1,3}).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mlconf import specs
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import golden
from mlconf.tools.files import atomic_write

SEED = 20240611
N_LINES = 2500
OUT = GOLDEN_DIR / "tokenizers"
ORACLE = "tokenizers"
SPIECE = "\u2581"

# The regexes of specs/mlt.yaml, as the Split pre-tokenizer of real tokenizer.json files spells them.
REGEX = specs.load("mlt")["regexes"]


@dataclass(frozen=True)
class Case:
    """One golden tokenizer: the family it imitates and the flags its .mlt must get."""

    family: str  # "sp" (SentencePiece-style) or "bl" (byte-level)
    vocab_size: int  # the trainer's vocab_size (SP cases get 256 byte pieces on top)
    flags: int  # the .mlt flags convert_tokenizer.py must give (tests check)
    prefix: str = ""  # sp: "prepend" (Prepend/Replace normalizer) or "first" (Metaspace)
    split: str = ""  # bl: "byte_level" (ByteLevel use_regex) or a key of REGEX
    nfc: bool = False
    digits: bool = False  # bl: Digits(individual_digits=True) first
    ignore_merges: bool = False
    first: tuple[str, ...] = ()  # special tokens at the first ids (trainer special_tokens)
    last: tuple[str, ...] = ()  # special tokens appended after the vocab
    normalized: tuple[str, ...] = ()  # non-special added tokens (normalized=true, HF's default)
    bos: str | None = None  # post-processor TemplateProcessing "BOS $A"
    keep_merges: float = 1.0  # keep this leading fraction of the trained merges (see below)
    train_split: str = ""  # bl: train with Split(REGEX[this]) + ByteLevel, no Digits (see below)
    notes: str = ""


CASES: dict[str, Case] = {
    "llama2": Case(
        "sp",
        600,
        1,
        prefix="prepend",
        first=("<unk>", "<s>", "</s>"),
        bos="<s>",
        notes="Llama 2: Prepend/Replace normalizer, byte fallback, <s> via TemplateProcessing",
    ),
    "mistral": Case(
        "sp",
        450,
        1 | 4,
        prefix="first",
        first=("<unk>", "<s>", "</s>"),
        last=("[INST]", "[/INST]"),
        bos="<s>",
        notes="Mistral (legacy=false): Metaspace prepend_scheme first, split false",
    ),
    "llama3": Case(
        "bl",
        700,
        1 | 2,
        split="llama3",
        ignore_merges=True,
        keep_merges=0.6,
        last=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ),
        bos="<|begin_of_text|>",
        notes="Llama 3: Split(llama3 regex) + ByteLevel, ignore_merges, BOS via post-processor",
    ),
    "qwen2": Case(
        "bl",
        650,
        8 | 16,
        split="llama3_single_digits",
        nfc=True,
        train_split="llama3",
        last=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        notes="Qwen2: NFC, the Llama 3 regex with single digits, ChatML tokens",
    ),
    "gpt2": Case(
        "bl",
        550,
        32,
        split="byte_level",
        last=("<|endoftext|>",),
        normalized=("<|user|>",),
        notes="GPT-2: ByteLevel(use_regex), a normalized non-special added token",
    ),
    "smollm": Case(
        "bl",
        600,
        64 | 32,
        split="byte_level",
        digits=True,
        train_split="llama3",
        first=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_start|>assistant"),
        notes="SmolLM: Digits(individual) + ByteLevel(use_regex), specials at the first ids, "
        "one added token a prefix of another (longest match)",
    ),
    "ignore_merges": Case(
        "bl",
        500,
        2 | 32,
        split="byte_level",
        ignore_merges=True,
        keep_merges=0.6,
        last=("<|endoftext|>",),
        notes="GPT-2 regex with ignore_merges",
    ),
}


# ---------------------------------------------------------------- the corpus
_WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which "
    "one you were all her she there would their we him been has when who will no more if out so said what "
    "up its about than into them can only other new some could time these two may then do first any my "
    "now such like our over man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three hello quick "
    "brown fox jumps lazy dog words tokenizer model merge piece text number token language learning"
).split()
_SPECIAL = (
    "café",
    "naïve",
    "résumé",
    "über",
    "straße",
    "Ångström",
    "jalapeño",
    "中文",
    "日本語",
    "测试",
    "Привет",
    "мир",
    "λόγος",
    "København",
)
_CONTRACTIONS = (
    "don't",
    "it's",
    "we're",
    "I'm",
    "you'll",
    "they've",
    "she'd",
    "can't",
    "DON'T",
    "IT'S",
    "I'M",
)
_PUNCT = (
    ",",
    ".",
    "!",
    "?",
    ":",
    ";",
    "...",
    "!!",
    "?!",
    "-",
    "--",
    "(",
    ")",
    '"',
    "'",
    "/",
    "%",
    "$",
    "#",
    "@",
    "&",
    "*",
    "+",
    "=",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "|",
    "_",
)


def corpus(seed: int = SEED, n_lines: int = N_LINES) -> list[str]:
    """Deterministic training text: words, cased words, contractions, numbers, punctuation, a few
    accented / CJK / Cyrillic / Greek words, irregular white space. Thai, Devanagari and emoji stay
    out of it (the stress texts have them: characters absent from training)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            if r < 0.62:
                w = rng.choice(_WORDS)
                w = w.capitalize() if rng.random() < 0.15 else w.upper() if rng.random() < 0.03 else w
            elif r < 0.70:
                w = rng.choice(_CONTRACTIONS)
            elif r < 0.80:
                w = str(rng.randint(0, 10 ** rng.randint(1, 6)))
                if rng.random() < 0.2:
                    w += "." + str(rng.randint(0, 99))
            elif r < 0.93:
                w = rng.choice(_PUNCT)
            else:
                w = rng.choice(_SPECIAL)
            parts.append(w)
        sep = [rng.choice((" ", " ", " ", " ", "  ", "\t", "\n")) for _ in parts[1:]]
        lines.append("".join(p + s for p, s in zip(parts, [*sep, ""], strict=True)))
    return lines


# ---------------------------------------------------------------- training
def _added(tok, case: Case) -> None:
    from tokenizers import AddedToken

    if case.last:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in case.last])
    if case.normalized:
        tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in case.normalized])


def _post(tok, case: Case) -> None:
    from tokenizers import processors

    steps = [processors.ByteLevel(trim_offsets=False)] if case.family == "bl" else []
    if case.bos:
        steps.append(
            processors.TemplateProcessing(
                single=f"{case.bos} $A",
                pair=f"{case.bos} $A {case.bos} $B",
                special_tokens=[(case.bos, tok.token_to_id(case.bos))],
            )
        )
    if steps:
        tok.post_processor = steps[0] if len(steps) == 1 else processors.Sequence(steps)


def _keep_merges(tok_json: str, fraction: float) -> str:
    d = json.loads(tok_json)
    merges = d["model"]["merges"]
    d["model"]["merges"] = merges[: int(len(merges) * fraction)]
    return json.dumps(d, ensure_ascii=False)


def with_byte_pieces(tok_json: str, n_first: int) -> str:
    """Insert <0x00>..<0xFF> at ids n_first.. (after the first special tokens), shifting the rest."""
    d = json.loads(tok_json)
    vocab = d["model"]["vocab"]
    shifted = {p: (i if i < n_first else i + 256) for p, i in vocab.items()}
    shifted.update({f"<0x{b:02X}>": n_first + b for b in range(256)})
    d["model"]["vocab"] = dict(sorted(shifted.items(), key=lambda kv: kv[1]))
    for t in d["added_tokens"]:
        t["id"] = shifted[t["content"]]
    return json.dumps(d, ensure_ascii=False)


def train(name: str) -> str:
    """HF's tokenizer.json string of the case (pretty-printed, as Tokenizer.save writes it)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    case = CASES[name]
    lines = corpus()
    if case.family == "sp":
        tok = Tokenizer(
            models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True, ignore_merges=case.ignore_merges)
        )
        # Training words: Metaspace pieces per word (as SentencePiece learns them); inference has
        # no split, so it is replaced below.
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)
        trainer = trainers.BpeTrainer(
            vocab_size=case.vocab_size, special_tokens=list(case.first), show_progress=False
        )
        tok.train_from_iterator(lines, trainer=trainer)
        tok = Tokenizer.from_str(with_byte_pieces(tok.to_str(), len(case.first)))
        if case.prefix == "prepend":
            tok.pre_tokenizer = None
        else:
            tok.normalizer = None
            tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=case.prefix, split=False)
        # The decoder of Llama 2's and Mistral's tokenizer.json: the ids' text (decision tok.decode)
        tok.decoder = decoders.Sequence(
            [
                decoders.Replace(SPIECE, " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    else:

        def byte_level(split: str, digits: bool):
            steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
            if split == "byte_level":
                steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
            else:
                steps += [
                    pre_tokenizers.Split(Regex(REGEX[split]), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)

        tok = Tokenizer(models.BPE(ignore_merges=case.ignore_merges))
        if case.nfc:
            tok.normalizer = normalizers.NFC()
        if case.train_split:
            tok.pre_tokenizer = byte_level(case.train_split, digits=False)
        else:
            tok.pre_tokenizer = byte_level(case.split, case.digits)
        trainer = trainers.BpeTrainer(
            vocab_size=case.vocab_size,
            special_tokens=list(case.first),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(lines, trainer=trainer)
        tok.pre_tokenizer = byte_level(case.split, case.digits)
        tok.decoder = decoders.ByteLevel()
    if case.keep_merges < 1.0:
        tok = Tokenizer.from_str(_keep_merges(tok.to_str(), case.keep_merges))
    _added(tok, case)
    _post(tok, case)
    return tok.to_str(pretty=True)


def train_reproducibly(name: str) -> str:
    """Train twice; refuse unless both runs give the same tokenizer.json."""
    a, b = train(name), train(name)
    if a != b:
        raise RuntimeError(f"{name}: two trainings gave different tokenizer.json; not writing a golden")
    return a


# ---------------------------------------------------------------- ids
def texts() -> dict[str, str]:
    return dict(specs.load("tokenizer_texts")["texts"])


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def hf_ids(tokenizer_json: str) -> dict[str, list[int]]:
    """HF's ids of every stress text (encode(text, add_special_tokens=True))."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    return {name: tok.encode(text, add_special_tokens=True).ids for name, text in texts().items()}


def decode_from(name: str) -> int:
    """How many leading ids the decoded text leaves out: the BOS the post-processor prepends."""
    return 1 if CASES[name].bos else 0


def hf_decoded(tokenizer_json: str, ids: dict[str, list[int]], skip: int) -> dict[str, str]:
    """HF's text of every text's ids but the first ``skip`` (decode(.., skip_special_tokens=False)).
    Whole texts' ids decode to valid UTF-8, so the text's UTF-8 is decode's bytes exactly; refused
    if HF put a U+FFFD the text has not (bytes HF's text would not give back)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    out = {k: tok.decode(v[skip:], skip_special_tokens=False) for k, v in ids.items()}
    lossy = [k for k, d in out.items() if d.count("\ufffd") > texts()[k].count("\ufffd")]
    if lossy:
        raise RuntimeError(f"HF decoded invalid UTF-8 for {lossy}; not writing a golden")
    return out


def ids_json(name: str, ids: dict[str, list[int]], decoded: dict[str, str]) -> str:
    """NAME.ids.json: one text per line, {"sha256": first 16 hex of its UTF-8, "ids": [...],
    "decoded": HF's text of ids[decode_from:]}."""
    head = {
        "tokenizer": f"{name}.json",
        "oracle": f"{ORACLE} {metadata.version(ORACLE)}",
        "encode": "Tokenizer.from_file(tokenizer).encode(text, add_special_tokens=True).ids",
        "decode": "Tokenizer.from_file(tokenizer).decode(ids[decode_from:], skip_special_tokens=False)",
        "decode_from": decode_from(name),
        "texts": "specs/tokenizer_texts.yaml",
    }
    t = texts()
    rows = [
        f"  {json.dumps(k)}: " + json.dumps({"sha256": text_digest(t[k]), "ids": v, "decoded": decoded[k]})
        for k, v in ids.items()
    ]
    body = ",\n".join(
        [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
        + ['  "ids": {\n' + ",\n".join("  " + r for r in rows) + "\n  }"]
    )
    return "{\n" + body + "\n}\n"


def derive(name: str, out_dir: Path) -> list[Path]:
    tok_json = train_reproducibly(name)
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.ids.json"]
    ids = hf_ids(tok_json)
    decoded = hf_decoded(tok_json, ids, decode_from(name))
    data = [tok_json.encode("utf-8") + b"\n", ids_json(name, ids, decoded).encode("utf-8")]
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, blob in zip(paths, data, strict=True):
        atomic_write(path, [blob])
    return paths


def generate(names: list[str], out_dir: Path = OUT) -> list[Path]:
    return golden.generate_cases(
        names, out_dir, OUT, derive, ORACLE, metadata.version(ORACLE), "tools/golden_tokenizers.py"
    )


def main(argv: list[str] | None = None) -> int:
    return golden.cases_main(
        argv, __doc__, CASES, OUT, generate, "golden_tokenizers.py", "pip install tokenizers"
    )


if __name__ == "__main__":
    sys.exit(main())
