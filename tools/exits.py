"""The exit statuses of every mlconf command (README "Exit statuses"), one meaning each:

0   OK          every selected case passes (or the command did what it was asked)
1   FAILED      a case failed (diff: a regression)
2   REJECTED    `mlconf load`: the backend rejected the file (a verdict, not an error)
4   USAGE       a usage or input error: a bad flag, a missing or unreadable file, an input
                the command cannot use (an unconvertible checkpoint, a bad results.json)
5   NOTHING     nothing selected (-k / --area / --shard matched no case), as pytest's 5
130 INTERRUPTED Ctrl-C
141 BROKEN_PIPE the reader of stdout left (`mlconf diff | head`): nothing printed, as a shell's
                128 + SIGPIPE
"""

from __future__ import annotations

import argparse
import sys

OK, FAILED, REJECTED, USAGE, NOTHING, INTERRUPTED, BROKEN_PIPE = 0, 1, 2, 4, 5, 130, 141


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors exit USAGE (argparse's own is 2, REJECTED here)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        print(f"mlconf: error: {self.prog.removeprefix('mlconf ')}: {message}", file=sys.stderr)
        raise SystemExit(USAGE)
