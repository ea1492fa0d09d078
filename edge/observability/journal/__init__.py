"""The request journal: a bounded, on-disk record of every reply, found again by its trace id
(docs/trace.md).

    options.py   the flags of ``edge serve`` (and ``edge trace``) that place and bound it
    format.py    one entry per line (JSON), segment headers, lineage records: encode, decode
    writer.py    :class:`Journal`: the bounded queue the I/O thread appends to, the writer thread
    segments.py  segment files on disk: rotate, delete the oldest, never above the cap
    budget.py    the one byte cap the segments and the rejected samples share
    rejected.py  rejected requests' payloads kept for inspection (``--keep-rejected N``)
    reader.py    lookup by trace id (newest segment first, bounded reads), the journal's extent
    checks.py    what ``edge trace`` trusts: regular files only, bounded lines and nesting, typed fields

Nothing here is imported by the per-request path except :class:`Journal`'s ``note`` (a tuple
appended to a deque); the writer thread starts after READY. Standard library only.
"""

from __future__ import annotations

__all__: list[str] = []
