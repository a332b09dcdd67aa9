"""`mlconf diff | head`: when the reader of stdout leaves, mlconf stops quietly with 141 (128 +
SIGPIPE, as a shell reports cat or grep), not "mlconf: error: : Broken pipe" (issue 34)."""

import io
import os
import sys

from mlconf.cli import main
from mlconf.tools import exits


def test_a_closed_stdout_ends_quietly(monkeypatch, capfd):
    r, w = os.pipe()
    os.close(r)  # the reader has gone before the first line
    saved = os.dup(1)
    try:
        os.dup2(w, 1)
        out = io.TextIOWrapper(os.fdopen(w, "wb"), line_buffering=True)
        monkeypatch.setattr(sys, "stdout", out)
        assert main(["backends"]) == exits.BROKEN_PIPE == 141
        out.close()  # its fd now points at /dev/null: the flush of what EPIPE left behind succeeds
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert "Broken pipe" not in capfd.readouterr().err
