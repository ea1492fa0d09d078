"""What every command line of the project shares: the exit-status epilog, the usage error and the
one-line failure message.

Each CLI keeps its own table of exit statuses (users' scripts test them); this module turns the
table into the ``--help`` epilog and says a failure the same way everywhere: ``PROG: what is
wrong, and what to do instead`` on stderr, then the status. The CLIs: ``edge``, ``edge-bundle``
(and its archive and install commands), ``edge-package``, ``edge-tokenizer``, ``edge-coldstart``.

The bottom layer: standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

__all__ = ["UsageError", "exit_epilog", "fail"]


class UsageError(Exception):
    """A mistake in the command line or its input, found before any work: exit 2 with the message."""

    exit_code = 2


def exit_epilog(codes: Mapping[int, str], *, one_per_line: bool = False) -> str:
    """``--help``'s epilog from a CLI's exit statuses: ``exit status: 0 ...; 1 ...`` (or a line each,
    for a parser with ``RawDescriptionHelpFormatter``)."""
    if one_per_line:
        import textwrap

        return "exit status:\n" + "\n".join(
            textwrap.fill(what, 78, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7, break_on_hyphens=False)
            for code, what in codes.items())
    return "exit status: " + "; ".join(f"{code} {what}" for code, what in codes.items())


def fail(prog: str, message: str, code: int) -> int:
    """Say ``prog: message`` on stderr; return ``code``, the exit status."""
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()
    return code
