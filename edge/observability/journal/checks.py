"""What ``edge trace`` reads, checked: the journal and the rejected samples are files the
runtime's user can write, and ``edge trace`` runs as root (docs/trace.md).

- **Regular files only.** A name is ``lstat``-ed, then opened with ``O_NOFOLLOW | O_NONBLOCK |
  O_NOCTTY`` and ``fstat``-ed again: a symlink, FIFO, device, socket or directory is refused,
  never read (a FIFO would block a plain ``open``, ``/dev/zero`` would never end), and so is a
  file larger than a journal file can be.
- **Bounded lines.** A line longer than :data:`MAX_LINE` bytes is a bad entry, skipped.
- **Bounded depth.** Arrays and objects nested deeper than :data:`MAX_DEPTH` are refused
  before ``json.loads`` sees them (an entry nests 3 deep); ``RecursionError`` and
  ``MemoryError`` are caught as well. ``NaN`` and ``Infinity`` are refused.
- **Checked fields.** Every field of an entry, a lineage record and a sample's metadata has
  the type the writer gives it (:func:`edge.observability.journal.format.entry_line`): lists of numbers,
  timestamps finite and within years 1970 to 9999, strings, hex ids. Unknown fields are
  ignored, as a newer writer's may be.

What does not pass is skipped and counted in a :class:`Skipped`, which ``edge trace`` reports;
it never hides the good entries around it. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat

from edge.observability.journal.format import PHASES, is_trace_id

__all__ = ["MAX_LINE", "MAX_DEPTH", "MAX_TS", "Bad", "Refused", "Skipped", "check_mode", "open_regular", "read_regular",
           "loads", "entry", "lineage_record", "sample_meta"]

MAX_LINE = 256 << 10  # bytes of one line; an entry of 64 texts is ~3 KiB, a lineage record ~600 bytes
MAX_DEPTH = 32  # nesting of arrays and objects in one line; the writer's go 3 deep
MAX_TS = 253_402_300_799_999  # epoch ms of 9999-12-31T23:59:59.999Z, the last a timestamp can show
_BIG = 1 << 53  # bound of a count, a size, a code, a duration in ms
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SPECIAL = re.compile(rb'[][{}"\\]')
_HEXCHARS = frozenset("0123456789abcdef")
_SHOWN = 5  # refused files named in a summary (all of them in as_dict)


class Bad(ValueError):
    """A line or a record that is not what the writer writes; ``str()`` says why."""


class Refused(OSError):
    """A file that is not read: not a regular file, too large, or not readable; ``str()`` says why."""


class Skipped:
    """What a read left out: lines by reason, files by path, and whether the read stopped at its
    total bound (``unread``)."""

    __slots__ = ("lines", "files", "unread", "read_bytes")

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.files: dict[str, str] = {}
        self.unread = False
        self.read_bytes = 0

    def line(self, reason: str) -> None:
        self.lines[reason] = self.lines.get(reason, 0) + 1

    def file(self, path: str, reason: str) -> None:
        self.files[path] = reason

    @property
    def entries(self) -> int:
        return sum(self.lines.values())

    def __bool__(self) -> bool:
        return bool(self.lines or self.files or self.unread)

    def as_dict(self) -> dict:
        return {"entries": self.entries, "reasons": dict(self.lines),
                "files": [{"path": p, "reason": r} for p, r in self.files.items()], "stopped_early": self.unread}

    def summary(self) -> str:
        parts = []
        if self.lines:
            why = ", ".join(f"{n} {r}" for r, n in sorted(self.lines.items(), key=lambda x: -x[1]))
            parts.append(f"skipped {self.entries} bad journal line(s) ({why})")
        if self.files:
            shown = list(self.files.items())[:_SHOWN]
            more = f"; and {len(self.files) - len(shown)} more" if len(self.files) > len(shown) else ""
            parts.append(f"refused {len(self.files)} file(s): " + "; ".join(f"{p} ({r})" for p, r in shown) + more)
        if self.unread:
            parts.append("stopped reading at the bound on bytes read; older segments were not searched")
        return "; ".join(parts)


# ------------------------------------------------------------------ files


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"{name}, not a regular file"
    return "not a regular file"


def check_mode(name: str, dir_fd: int | None = None) -> os.stat_result:
    """The ``lstat`` of a name, :class:`Refused` unless it is a regular file."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(_kind(st.st_mode))
    return st


def open_regular(name: str, dir_fd: int | None = None, max_bytes: int | None = None) -> tuple[int, int]:
    """``(fd, size)`` of a regular file, opened without following a symlink or blocking;
    :class:`Refused` for anything else or larger than ``max_bytes``; FileNotFoundError if gone."""
    check_mode(name, dir_fd)
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: replaced by a symlink meanwhile; EACCES, ENXIO, ...
        raise Refused(exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(_kind(st.st_mode))
        if max_bytes is not None and st.st_size > max_bytes:
            raise Refused(f"{st.st_size} bytes, more than the {max_bytes} such a file can hold")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_regular(path: str, max_bytes: int) -> bytes:
    """A whole regular file of at most ``max_bytes`` (:func:`open_regular`)."""
    fd, _ = open_regular(path, max_bytes=max_bytes)
    try:
        chunks, n = [], 0
        while n <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - n)):
            chunks.append(chunk)
            n += len(chunk)
    finally:
        os.close(fd)
    if n > max_bytes:  # grew since the fstat
        raise Refused(f"more than the {max_bytes} bytes such a file can hold")
    return b"".join(chunks)


# ------------------------------------------------------------------ JSON


def _shallow(raw: bytes | bytearray) -> bool:
    """Whether arrays and objects nest at most :data:`MAX_DEPTH` deep, brackets inside strings
    not counted; linear, and free for a line with few brackets."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return True
    depth, in_string, skip_to = 0, False, -1
    for m in _SPECIAL.finditer(raw):
        i = m.start()
        if i < skip_to:
            continue  # the character after a backslash
        c = raw[i]
        if c == 0x5C:  # backslash
            skip_to = i + 2
        elif c == 0x22:  # quote
            in_string = not in_string
        elif in_string:
            continue
        elif c in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        else:
            depth -= 1
    return True


def _constant(name: str):
    raise Bad(f"{name} is not a number JSON allows")


def loads(raw: bytes | bytearray):
    """The JSON of one line, bounded in depth; :class:`Bad` when it is not JSON or too deep."""
    if not _shallow(raw):
        raise Bad(f"nested deeper than {MAX_DEPTH}")
    try:
        return json.loads(raw, parse_constant=_constant)
    except Bad:
        raise
    except RecursionError:
        raise Bad(f"nested deeper than {MAX_DEPTH}") from None
    except MemoryError:
        raise Bad("too large to parse") from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4,300 digits
        raise Bad("not JSON") from None


# ------------------------------------------------------------------ fields


def _int(v, lo: int = 0, hi: int = _BIG) -> bool:
    return type(v) is int and lo <= v <= hi


def _num(v) -> bool:
    return (type(v) is int and -_BIG <= v <= _BIG) or (type(v) is float and math.isfinite(v) and abs(v) <= _BIG)


def _str(v) -> bool:
    return type(v) is str


def _hex(v, most: int = 128, least: int = 0) -> bool:
    return type(v) is str and least <= len(v) <= most and set(v) <= _HEXCHARS


def _id(v) -> bool:
    """A lineage id: the writer's are 12 hex digits; any short printable ASCII is read."""
    return type(v) is str and 0 < len(v) <= 64 and v.isascii() and v.isprintable() and '"' not in v and "\\" not in v


def _ints(v) -> bool:
    return type(v) is list and all(_int(x) for x in v)


def _pair(v) -> bool:
    return type(v) is list and len(v) == 2 and _int(v[0]) and _int(v[1])


def _scalar(v) -> bool:
    return v is None or type(v) in (str, bool) or _num(v)


_ENTRY = {  # field: (check, what it must be)
    "t": (lambda v: type(v) is str and is_trace_id(v), "a trace id"),
    "ts": (lambda v: _int(v, 0, MAX_TS), "a time in epoch ms from 1970 to 9999"),
    "k": (_str, "a string"),
    "c": (_hex, "hex digits"),
    "conn": (_int, "a whole number"),
    "peer": (_str, "a string"),
    "rid": (lambda v: type(v) in (str, int), "a string or a whole number"),
    "n": (_int, "a whole number"),
    "tok": (_ints, "a list of whole numbers"),
    "b": (_ints, "a list of whole numbers"),
    "tr": (_ints, "a list of whole numbers"),
    "bat": (lambda v: type(v) is list and all(_pair(b) for b in v), "a list of [batch, texts] pairs"),
    "deg": (lambda v: type(v) is bool, "true or false"),
    "ms": (lambda v: type(v) is list and len(v) <= len(PHASES) and all(x is None or _num(x) for x in v),
           f"a list of at most {len(PHASES)} numbers"),
    "code": (_int, "a whole number"),
    "err": (_str, "a string"),
    "msg": (_str, "a string"),
    "drop": (_str, "a string"),
    "l": (_id, "a lineage id"),
}
_REQUIRED = ("t",)  # the others are checked when present


def _fields(obj, schema: dict, required: tuple, what: str) -> dict:
    if type(obj) is not dict:
        raise Bad(f"not a JSON object ({what})")
    for key in required:
        if key not in obj:
            raise Bad(f"no {key!r} ({what})")
    for key, value in obj.items():
        rule = schema.get(key)
        if rule is not None and not rule[0](value):
            raise Bad(f"{key!r} is not {rule[1]} ({what})")
    return obj


def entry(raw: bytes | bytearray) -> dict:
    """An entry line (without its newline), parsed and checked; :class:`Bad` says why not."""
    return _fields(loads(raw), _ENTRY, _REQUIRED, "entry")


def lineage_record(raw: bytes | bytearray) -> dict:
    """The ``lineage`` of a lineage record line: an object of scalars; :class:`Bad` if not."""
    obj = loads(raw)
    if type(obj) is not dict or not _id(obj.get("L")):
        raise Bad("'L' is not a lineage id (lineage record)")
    lin = obj.get("lineage")
    if type(lin) is not dict or not all(_scalar(v) for v in lin.values()):
        raise Bad("'lineage' is not an object of strings and numbers (lineage record)")
    return lin


_CLIENT = {"identity": (lambda v: v is None or _hex(v), "hex digits"),
           "connection": (lambda v: v is None or _int(v), "a whole number"),
           "peer": (lambda v: v is None or _str(v), "a string")}
_FRAME = {"size": (_int, "a size"), "kept": (_int, "a size"), "truncated": (lambda v: type(v) is bool, "true or false")}
_SAMPLE = {
    "trace_id": (lambda v: type(v) is str and is_trace_id(v), "a trace id"),
    "time_ms": (lambda v: v is None or _int(v, 0, MAX_TS), "a time in epoch ms from 1970 to 9999"),
    "type": (lambda v: v is None or _str(v), "a string"),
    "code": (lambda v: v is None or _int(v), "a whole number"),
    "name": (lambda v: v is None or _str(v), "a string"),
    "message": (lambda v: v is None or _str(v), "a string"),
    "request_id": (lambda v: v is None or type(v) in (str, int), "a string or a whole number"),
    "client": (lambda v: v is None or (type(v) is dict and all(r[0](v.get(k)) for k, r in _CLIENT.items())),
               "an object of identity, connection and peer"),
    "frames_total": (_int, "a whole number"),
    "truncated": (lambda v: type(v) is bool, "true or false"),
}


def sample_meta(raw: bytes, max_frames: int) -> dict:
    """A rejected sample's metadata (``<trace_id>.json``), parsed and checked."""
    meta = _fields(loads(raw), _SAMPLE, ("frames",), "rejected sample")
    frames = meta["frames"]
    if type(frames) is not list or len(frames) > max_frames:
        raise Bad(f"'frames' is not a list of at most {max_frames} frames (rejected sample)")
    for f in frames:
        _fields(f, _FRAME, tuple(_FRAME), "rejected sample's frame")
    return meta
