"""The input of an atheris target as a file: the reference loaders take a path (they memory-map
the arrays), so each input goes to a memfd opened through /proc/self/fd/N, as the libFuzzer
targets' fuzz_file.h does. Nothing touches the disk and nothing is left behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def as_file(data: bytes) -> Iterator[str]:
    fd = os.memfd_create("mlconf-fuzz")
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
