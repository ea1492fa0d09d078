"""Checks the build-host commands make of their arguments before any long work starts.

Shared by ``edge-package``, ``edge-bundle`` and ``edge-tokenizer`` so a mistake reads the same
in each: what is wrong, then what to give instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

__all__ = ["positive_int", "writable_dir_problem"]


def positive_int(what: str):
    """An argparse type: a whole number of ``what`` (e.g. "tokens"), 1 or more."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text}: give a number of {what} above 0")
        return value

    return convert


def writable_dir_problem(out: Path) -> str | None:
    """Why no directory can be made beside ``out`` (None: one can): what a build does at its end,
    a staging directory beside ``out`` renamed into place."""
    above = out.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"--out {out}: {above} is a file, not a directory; give an --out under a directory"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent))
    except OSError as exc:
        return (f"--out {out}: cannot create a directory in {out.parent} ({exc.strerror or exc}); "
                f"give an --out on a writable filesystem")
    return None
