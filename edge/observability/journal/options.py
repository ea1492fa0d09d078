"""Where the journal and the rejected samples live, and how much they may hold: the flags of
``edge serve`` that :func:`edge.runtime.serve_args.serve_parser` adds from here, and the directories
``edge trace`` reads (docs/trace.md).

    <state>/journal/      segment files (--journal-dir moves it; off turns the journal off)
    <state>/rejected/     rejected requests' payloads (--keep-rejected N; 0600 files, 0700 directory)

The state directory (``--state-dir``, ``EDGE_STATE_DIR``) defaults to ``/var/lib/edge/runtime``
for root (beside the installer's ``/var/lib/edge/install.json``) and to
``$XDG_STATE_HOME/edge`` (``~/.local/state/edge``) for anyone else, as the XDG base directory
spec places state that outlives a restart but is not worth a backup.

Imported at boot by the serve parser: standard library only, and nothing is created here (the
writer thread makes the directories after READY).
"""

from __future__ import annotations

import os

from edge.config.argtypes import number, parse_bytes
from edge.config.env import env_value

__all__ = ["DEFAULT_JOURNAL_MAX_BYTES", "MIN_JOURNAL_MAX_BYTES", "MAX_KEEP_REJECTED", "OFF",
           "default_state_dir", "state_dir", "journal_dir", "rejected_dir", "add_serve_arguments"]

# 256 MiB: about 1.2 million entries of ~210 bytes (one text each), a day at 14 requests/s;
# docs/trace.md sizes it for a device's own saturation rate. 1/16 of it per segment.
DEFAULT_JOURNAL_MAX_BYTES = 256 << 20
MIN_JOURNAL_MAX_BYTES = 64 << 10  # below this a segment could not hold a few entries (bytes)
# Samples. Each takes 8 KiB on 4 KiB blocks (a payload of 4 KiB at most and ~0.4 KiB of metadata,
# two files, each rounded up to a block; edge/observability/journal/rejected.py), counted in the journal's cap.
MAX_KEEP_REJECTED = 10_000
OFF = "off"  # --journal-dir off: no journal


def default_state_dir(env: dict | None = None) -> str:
    environ = os.environ if env is None else env
    if os.geteuid() == 0:
        return "/var/lib/edge/runtime"
    base = environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(base):  # the spec: a relative value is to be ignored
        base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "edge")


def state_dir(given: str | None = None, env: dict | None = None) -> str:
    return given or env_value("EDGE_STATE_DIR", env) or default_state_dir(env)


def journal_dir(given: str | None, state: str) -> str | None:
    """The journal's directory, or None when it is turned off (``off``)."""
    if given and given.strip().lower() == OFF:
        return None
    return given or os.path.join(state, "journal")


def rejected_dir(state: str) -> str:
    return os.path.join(state, "rejected")


_journal_bytes = number(parse_bytes, "a size (bytes, or a number with K, M or G)",
                        ok=lambda n: n == 0 or n >= MIN_JOURNAL_MAX_BYTES,
                        rule=f"0 (no journal) or at least {MIN_JOURNAL_MAX_BYTES >> 10}K", env_name="EDGE_JOURNAL_MAX_BYTES")
_keep = number(int, "a whole number of samples", ok=lambda n: 0 <= n <= MAX_KEEP_REJECTED,
               rule=f"a whole number of samples from 0 (none) to {MAX_KEEP_REJECTED}", env_name="EDGE_KEEP_REJECTED")


def add_serve_arguments(p, e) -> None:
    """The journal's flags on ``edge serve``'s parser ``p``; ``e(name, default)`` reads a variable.
    Defaults are strings, so argparse checks a variable's value as it checks the flag's."""
    p.add_argument("--state-dir", metavar="DIR", default=e("EDGE_STATE_DIR"),
                   help="the runtime's state directory: the request journal and the rejected samples live there "
                        "(default /var/lib/edge/runtime for root, else $XDG_STATE_HOME/edge, i.e. "
                        "~/.local/state/edge; docs/trace.md; env EDGE_STATE_DIR)")
    p.add_argument("--journal-dir", metavar="DIR|off", default=e("EDGE_JOURNAL_DIR"),
                   help="directory of the request journal, which `edge trace TRACE_ID` reads (default "
                        "STATE_DIR/journal; off: no journal; env EDGE_JOURNAL_DIR)")
    p.add_argument("--journal-max-bytes", type=_journal_bytes, metavar="BYTES",
                   default=e("EDGE_JOURNAL_MAX_BYTES", str(DEFAULT_JOURNAL_MAX_BYTES)),
                   help="cap on disk of the journal's segments and the rejected samples together, oldest deleted "
                        "first; K, M, G suffixes; 0: no journal (env EDGE_JOURNAL_MAX_BYTES)")
    p.add_argument("--keep-rejected", type=_keep, metavar="N", default=e("EDGE_KEEP_REJECTED", "0"),
                   help="keep the payloads of the last N requests refused as invalid (1xxx codes), 4 KiB each at "
                        "most (8 KiB on disk, within --journal-max-bytes), in STATE_DIR/rejected (0600), for "
                        "`edge trace`; 0: keep none (env EDGE_KEEP_REJECTED)")
