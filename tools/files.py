"""How every input is opened and every output written.

Inputs may be anything a user passes: a FIFO, a device, a directory. Every loader and command reads
them through ``open_regular`` (decision loader.special_files): a path that is not a regular file
once symlinks are followed is refused before a byte is read, and the open itself cannot block
(O_NONBLOCK: a FIFO with no writer would hang a plain open()).

Outputs are written through ``replacing`` (or ``atomic_write``, its face for bytes): into a
temporary name beside the target, renamed over it in one step, so a failure or an interrupt
leaves nothing half-written and a reader never sees a partial file.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
    (stat.S_ISSOCK, "is a socket"),
)


class NotRegular(OSError):
    """The path exists but is not a regular file; str() is the reason ("is a FIFO")."""


def kind(mode: int) -> str:
    """What a file of this st_mode is, as the end of a sentence ("is a FIFO"), "" for a regular file."""
    if stat.S_ISREG(mode):
        return ""
    return next((text for test, text in _KINDS if test(mode)), "is not a regular file")


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """The file opened for binary reading; OSError (NotRegular when it exists but is no regular
    file) otherwise. Never blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        what = kind(os.fstat(fd).st_mode)
        if what:
            raise NotRegular(errno.EINVAL, what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most ``limit``); OSError as open_regular."""
    with open_regular(path) as f:
        return f.read() if limit is None else f.read(limit)


def check_regular(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a regular file ("No such file or directory", "is a FIFO"),
    or None. For readers that take a path (np.memmap, gguf-py): call it first."""
    try:
        what = kind(os.stat(path).st_mode)
    except OSError as e:
        return e.strerror or str(e)
    return what or None


def reason(e: OSError) -> str:
    """The text of an OSError from open_regular, without the errno noise."""
    if isinstance(e, NotRegular):
        return e.strerror
    return e.strerror or str(e)


# ---------------------------------------------------------------- outputs
@contextmanager
def replacing(path: str | os.PathLike, *, folder: bool = False, mode: int | None = 0o666) -> Iterator[Path]:
    """A temporary path beside ``path`` (an empty file, or an empty folder when ``folder``) for the
    block to write; renamed to ``path`` when the block ends without an error, removed otherwise.
    A file gets ``mode`` less the umask (mkstemp makes 0600; a written model is an ordinary file;
    None keeps what the writer gave it). An OSError of the temporary names ``path``."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if folder:
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=parent))
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as e:
        raise type(e)(e.errno, e.strerror, str(path)) from None
    try:
        yield tmp
        if mode is not None and not folder:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, mode & ~umask)
        os.replace(tmp, path)
    except BaseException as e:
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename in (None, str(tmp)):
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise


def atomic_write(path: str | os.PathLike, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` through ``replacing``."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
