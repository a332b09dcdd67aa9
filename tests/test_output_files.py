"""tools/files.py's outputs: every writer of mlconf (models, tokenizers, goldens, the MANIFEST, the
C header, the built libraries, the cached fixture set, the export) goes through ``replacing``, so a
failure leaves the target as it was and no temporary file beside it."""

from __future__ import annotations

import errno
import os

import pytest

from mlconf.tools.files import atomic_write, replacing


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_written_whole_with_an_ordinary_mode(tmp_path):
    target = tmp_path / "m.bin"
    atomic_write(target, [b"ab", b"cd"])
    assert target.read_bytes() == b"abcd"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    assert _listing(tmp_path) == ["m.bin"]


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "m.bin"
    target.write_bytes(b"old")

    def chunks():
        yield b"new, half"
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        atomic_write(target, chunks())
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["m.bin"]


def test_an_os_error_names_the_target(tmp_path):
    target = tmp_path / "no" / "such" / "m.bin"
    with pytest.raises(FileNotFoundError) as e:
        atomic_write(target, [b"x"])
    assert e.value.filename == str(target) and e.value.errno == errno.ENOENT


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "set"
    with pytest.raises(RuntimeError):
        with replacing(final, folder=True) as tmp:
            (tmp / "a").write_bytes(b"1")
            raise RuntimeError
    assert _listing(tmp_path) == []
    with replacing(final, folder=True) as tmp:
        (tmp / "a").write_bytes(b"1")
    assert _listing(final) == ["a"]
    with pytest.raises(OSError):  # another run's set got there first: the rename refuses
        with replacing(final, folder=True) as tmp:
            (tmp / "b").write_bytes(b"2")
    assert _listing(final) == ["a"] and _listing(tmp_path) == ["set"]


def test_a_built_program_keeps_its_x_bits(tmp_path):
    target = tmp_path / "prog"
    with replacing(target, mode=0o777) as tmp:
        tmp.write_bytes(b"#!/bin/sh\n")
    assert os.access(target, os.X_OK)
