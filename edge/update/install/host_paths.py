"""The host paths, user and unit limits a bundle names, checked against an allow-list before the
installer writes anything (docs/archive.md, "Host paths").

A bundle tells whoever starts it, as root, which host directories to create, chown and clean
(``edge-bundle.json``: ``socket_dir``, ``state_dir``, ``metrics_dir``, and the socket's name in
``address``), for whom (``user``), and what the unit runs with (``edge.service.d/limits.conf``,
linked into /etc/systemd/system/edge.service.d/). A good signature says who built the bundle,
not that these are safe to do as root: a socket directory ``/etc`` with the address
``ipc:///x/shadow`` chowned /etc and removed /etc/shadow as a "stale socket", and a drop-in may
say ``ExecStartPre=``. So the installer takes them from this allow-list, and refuses anything
else with ``Refused("host")`` naming the field:

    socket_dir   /run/edge or /run/edge-NAME (a second unit's, as the trial tests' /run/edge-test);
                 the builder's default: /run/edge
    state_dir    /var/lib/edge/NAME, NAME not install* (the installer's state); the builder's
                 default: /var/lib/edge/runtime
    metrics_dir  null (the builder's default), /var/lib/node_exporter/textfile (docs/metrics.md)
                 or /var/cache/edge/metrics
    address      null, tcp://..., or ipc://SOCKET_DIR/NAME.sock: the socket and NAME.sock.lock are
                 the names, besides the snapshot files, a starter may remove there (socket_dir.py)
    user         uid and gid in USER_IDS, 60000-61183 (the builder's default: 61000)
    drop-in      edge.service.d/ holds limits.conf only, a regular file: comments, blank lines,
                 one [Service] section, MemoryMax= and TasksMax= (the keys image/bundle/limits.py
                 writes) within DROPIN_LIMITS; nothing else

A path is absolute and made of plain names (no ``.``, ``..``, empty or hidden component), and it
is one name in a fixed directory of root's (/run, /var/lib/edge, ...), never below a directory
the runtime owns, where the runtime could plant a link. Then it is resolved under ROOT one
component at a time, as the kernel would follow it (:func:`resolve_in_root`), and what the
installer acts on is the resolved path, never a link. A symlink that leads out of ROOT, a path
that resolves outside the allow-list, a directory that is itself a symlink, or one the start
would refuse (``check_socket_dir``) is NotReady: the archive is fine, this device's directories
are not.

Nothing here writes; :func:`read_bundle_files` reads the two members from the archive a second
time, before the unpack, so that a refusal leaves the root byte-identical.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError, field_validator, model_validator

from edge.update.install import archive as fmt
from edge.update.install.errors import NotReady, Refused
from edge.update.install.layout import SLOT_BUNDLE, DeviceLayout
from edge.system.socket_dir import SocketDirError, check_socket_dir

__all__ = ["META", "DROPIN_DIR", "DROPIN", "USER_IDS", "DROPIN_LIMITS", "METRICS_DIRS", "RULES", "HostDirs",
           "BundleHost", "check_entries", "read_bundle_files", "check_meta", "check_dropin", "resolve_in_root",
           "host_dirs", "check_host", "MAX_META_BYTES", "MAX_DROPIN_BYTES"]

META = "edge-bundle.json"  # image/build_bundle.py METADATA_NAME
DROPIN_DIR = "edge.service.d"
DROPIN = f"{DROPIN_DIR}/limits.conf"  # image/bundle/limits.py UNIT_DROPIN
MAX_META_BYTES = 1 << 20  # the default bundle's is 4 KiB
MAX_DROPIN_BYTES = 4096  # the builder's is 379 bytes
# The top of Debian's 60000-64999 block (Debian Policy 9.2.2), below systemd's DynamicUser range
# (61184-65519, systemd docs/UIDS-GIDS.md): never root, a system user (< 1000), a login user
# (1000-59999), a dynamic service user or nobody (65534).
USER_IDS = range(60000, 61184)
# key -> (min, max): MemoryMax in bytes (base 1024 suffixes K M G T; the builder writes M: the
# container's limit + 128 MiB, 1962M for the default bundle; 128 GiB is a Jetson AGX Thor's RAM),
# TasksMax in tasks (the builder writes the container's 256 + 64).
DROPIN_LIMITS = {"MemoryMax": (128 << 20, 128 << 30), "TasksMax": (16, 4096)}
MAX_LINKS = 40  # symlinks followed in one path, as the kernel's ELOOP limit

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")  # a plain path component
_SIZE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DOC = 'docs/archive.md, "Host paths"'


# ------------------------------------------------------------------ the allow-list


def _parts(path: str) -> list[str]:
    """The components of an absolute path of plain names; ValueError otherwise."""
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 1024:
        raise ValueError(f"{path!r} is not an absolute path")
    parts = path[1:].split("/")
    bad = [p for p in parts if not _NAME.fullmatch(p)]
    if bad:
        raise ValueError(f"{path!r}: component {bad[0]!r} is not a plain name (no '.', '..', empty or hidden "
                         f"component)")
    return parts


def _socket_allowed(parts: list[str]) -> bool:
    return len(parts) == 2 and parts[0] == "run" and (parts[1] == "edge" or (
        parts[1].startswith("edge-") and len(parts[1]) > len("edge-")))


def _state_allowed(parts: list[str]) -> bool:
    return len(parts) == 4 and parts[:3] == ["var", "lib", "edge"] and not parts[3].startswith(("install", "."))


METRICS_DIRS = ("/var/lib/node_exporter/textfile", "/var/cache/edge/metrics")


def _metrics_allowed(parts: list[str]) -> bool:
    return "/" + "/".join(parts) in METRICS_DIRS


# field -> (the rule on a device path's components, the rule in words)
RULES = {
    "socket_dir": (_socket_allowed, "/run/edge or /run/edge-NAME"),
    "state_dir": (_state_allowed, "/var/lib/edge/NAME, NAME not install*"),
    "metrics_dir": (_metrics_allowed, " or ".join(METRICS_DIRS)),
}


def _allowed(field: str, path: str) -> str:
    rule, words = RULES[field]
    try:
        ok = rule(_parts(path))
    except ValueError as exc:
        raise ValueError(f"{exc}; it must be {words} ({_DOC})") from None
    if not ok:
        raise ValueError(f"{path!r} is not a directory the installer may give the runtime: it must be {words} "
                         f"({_DOC})")
    return path


class _User(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uid: StrictInt
    gid: StrictInt

    @field_validator("uid", "gid")
    @classmethod
    def _in_range(cls, v: int) -> int:
        if v not in USER_IDS:
            raise ValueError(f"{v} is not in {USER_IDS.start}-{USER_IDS.stop - 1}, the runtime's users (never root, "
                             f"a system, login or dynamic user; {_DOC})")
        return v


class BundleHost(BaseModel):
    """The fields of edge-bundle.json that act on the host; the others are not the installer's."""

    model_config = ConfigDict(extra="ignore")
    socket_dir: str | None = None
    address: str | None = None
    state_dir: str | None = None
    metrics_dir: str | None = None
    user: _User | None = None

    @field_validator("socket_dir", "state_dir", "metrics_dir")
    @classmethod
    def _dir(cls, v: str | None, info) -> str | None:
        return None if v is None else _allowed(info.field_name, v)

    @field_validator("address")
    @classmethod
    def _address(cls, a: str | None) -> str | None:
        if a is None or a.startswith("tcp://"):
            return a
        where, _, name = a[len("ipc://"):].rpartition("/")
        try:
            ok = a.startswith("ipc://") and bool(where) and bool(_parts(where)) and _NAME.fullmatch(name) and name.endswith(".sock")
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{a!r}: only tcp://HOST:PORT, or ipc://SOCKET_DIR/NAME.sock, a socket in socket_dir "
                             f"({_DOC})")
        return a

    @model_validator(mode="after")
    def _socket_in_its_dir_and_a_user(self) -> "BundleHost":
        a = self.address
        if a is not None and a.startswith("ipc://") and a[len("ipc://"):].rpartition("/")[0] != self.socket_dir:
            raise ValueError(f"address {a!r}: an ipc address must name a socket in socket_dir "
                             f"(ipc://{self.socket_dir or 'SOCKET_DIR'}/NAME.sock; {_DOC})")
        if self.user is None and (self.socket_dir or self.state_dir or self.metrics_dir):
            raise ValueError("user: required with a socket_dir, state_dir or metrics_dir (whose they are made)")
        return self

    @property
    def socket_name(self) -> str | None:
        a = self.address
        return a.rpartition("/")[2] if a and a.startswith("ipc://") else None


def _message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def check_meta(data: bytes) -> BundleHost:
    """edge-bundle.json's host fields, checked; Refused("host") naming the field."""
    try:
        meta = json.loads(data)
    except ValueError as exc:
        raise Refused("host", f"bundle/{META} is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise Refused("host", f"bundle/{META} is not a JSON object")
    try:
        return BundleHost.model_validate(meta)
    except ValidationError as exc:
        raise Refused("host", f"bundle/{META}: {_message(exc)}") from None


def check_dropin(data: bytes) -> dict[str, int]:
    """The unit's drop-in, checked line by line: key -> value (bytes or tasks); Refused("host")."""
    where = f"bundle/{DROPIN}"
    if len(data) > MAX_DROPIN_BYTES:
        raise Refused("host", f"{where}: {len(data)} bytes, more than {MAX_DROPIN_BYTES}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise Refused("host", f"{where}: not ASCII text") from None
    values: dict[str, int] = {}
    section = False
    for n, line in enumerate(text.split("\n"), 1):
        def refuse(why: str, n: int = n) -> Refused:  # called in this iteration; n bound for the linter's sake
            return Refused("host", f"{where} line {n}: {why} (only comments, [Service], "
                                   f"{', '.join(k + '=' for k in DROPIN_LIMITS)}; {_DOC})")
        if any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in line):
            raise refuse("a control character")
        if line.endswith("\\"):
            raise refuse("a continued line")
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            if s != "[Service]" or section:
                raise refuse(f"section {s[:40]!r}: only one [Service] section")
            section = True
            continue
        key, eq, value = s.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in DROPIN_LIMITS:
            raise refuse(f"{key[:40]!r} is not a limit the installer allows")
        if not section:
            raise refuse(f"{key}= before [Service]")
        if key in values:
            raise refuse(f"{key}= twice")
        lo, hi = DROPIN_LIMITS[key]
        m = re.fullmatch(r"([0-9]{1,16})([KMGT]?)" if key == "MemoryMax" else r"([0-9]{1,16})()", value)
        amount = int(m.group(1)) * _SIZE[m.group(2)] if m else None
        if amount is None or not lo <= amount <= hi:
            raise refuse(f"{key}={value[:40]}: a number from {lo} to {hi}"
                         f"{' bytes (suffix K, M, G or T)' if key == 'MemoryMax' else ''}")
        values[key] = amount
    return values


def check_entries(manifest) -> dict[str, int]:
    """From the manifest alone: edge-bundle.json and the drop-in are regular files, and
    edge.service.d/ holds nothing else. Their paths in the archive -> their sizes."""
    prefix = f"{SLOT_BUNDLE}/"
    wanted = {f"{prefix}{META}": MAX_META_BYTES, f"{prefix}{DROPIN}": MAX_DROPIN_BYTES}
    found = {}
    for e in manifest.files:
        if e.path in wanted:
            if not isinstance(e, fmt.FileEntry):
                raise Refused("host", f"{e.path} is a {e.type} in the manifest; a regular file is expected")
            if e.size > wanted[e.path]:
                raise Refused("host", f"{e.path}: {e.size} bytes, more than {wanted[e.path]}")
            found[e.path] = e.size
        elif e.path == f"{prefix}{DROPIN_DIR}":
            if not isinstance(e, fmt.DirEntry):
                raise Refused("host", f"{e.path} is a {e.type} in the manifest; a directory is expected")
        elif e.path.startswith(f"{prefix}{DROPIN_DIR}/"):
            raise Refused("host", f"{e.path}: {DROPIN_DIR}/ may hold {DROPIN.rpartition('/')[2]} only (systemd "
                                  f"would read another drop-in as the unit's; {_DOC})")
    return found


def read_bundle_files(archive: Path, manifest, manifest_bytes: bytes, signature: bytes) -> dict[str, bytes]:
    """edge-bundle.json and the drop-in (those of them the manifest lists), read in a pass of their
    own before anything is written, each checked against its sha256: bundle-relative name -> bytes.
    The builder's archives list them before the rootfs, so the pass stops early."""
    sizes = check_entries(manifest)
    found: dict[str, bytes] = {}
    if not sizes:
        return found
    with fmt.open_archive(archive) as again, fmt.refusals():
        if again.head() != (manifest_bytes, signature):
            raise Refused("archive", f"{archive} changed while it was read")
        for entry, _member, data in again.members(manifest):
            if entry.path in sizes:
                assert data is not None  # sizes names files (check_entries), which come with a reader
                content = b""
                while chunk := data.read(1 << 16):  # the read that completes it checks the sha256
                    content += chunk
                found[entry.path[len(SLOT_BUNDLE) + 1:]] = content
                if len(found) == len(sizes):
                    break
    return found


# ------------------------------------------------------------------ on the device


def resolve_in_root(root: str, path: str, field: str) -> str:
    """``path`` (a device path) as the kernel would follow it under ``root`` (a real path), one
    component at a time, but for the last, which is never followed (the start refuses a link
    there); the device path it leads to. NotReady when a symlink, or a ``..`` in one, leads out of
    ``root``, a parent is not a directory, or there are more than MAX_LINKS links."""
    todo = path.strip("/").split("/")[::-1]  # a stack: the next component last
    done: list[str] = []  # resolved components below root
    links = 0
    shown = lambda *p: os.path.join(root, *p)  # noqa: E731

    def out(why: str) -> NotReady:
        return NotReady(f"{field} {path}: {why}; nothing was switched and nothing written; the live slot is unchanged")

    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if not done:
                if root == "/":
                    continue  # the kernel's /.. is /
                raise out(f"a symlink leads above the root {root}")
            done.pop()
            continue
        here = shown(*done, name)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            done.append(name)  # created by the start, as a directory
            continue
        except NotADirectoryError:
            raise out(f"{shown(*done)} is not a directory") from None
        if stat.S_ISLNK(st.st_mode):
            if not todo:  # the directory itself: never followed; check_socket_dir refuses it, as the start does
                done.append(name)
                continue
            target = os.readlink(here)
            links += 1
            if links > MAX_LINKS:
                raise out(f"more than {MAX_LINKS} symlinks")
            if target.startswith("/"):
                if root != "/" and target != root and not target.startswith(root + "/"):
                    raise out(f"{here} is a symlink to {target}, outside the root {root}")
                done = []
                target = target[len(root):] if root != "/" else target
            todo.extend(target.split("/")[::-1])
            continue
        done.append(name)
    return "/" + "/".join(done)


class HostDirs(NamedTuple):
    """The host directories to prepare, as paths on this machine (ROOT joined, resolved), and whose."""

    socket_dir: str | None
    socket_name: str | None
    state_dir: str | None
    metrics_dir: str | None
    uid: int | None
    gid: int | None


def host_dirs(layout: DeviceLayout, meta: BundleHost) -> HostDirs:
    """``meta``'s directories resolved under the root, each checked again on its resolved path and as
    the start checks it (a symlink, not a directory, writable by others: SocketDirError); NotReady."""
    root = os.path.realpath(layout.root)
    gid = meta.user.gid if meta.user else None
    found: dict[str, str | None] = {}
    for field in ("socket_dir", "state_dir", "metrics_dir"):
        declared = getattr(meta, field)
        if declared is None:
            found[field] = None
            continue
        resolved = resolve_in_root(root, declared, field)
        if resolved != declared:
            try:
                _allowed(field, resolved)
            except ValueError as exc:
                raise NotReady(f"{field} {declared} resolves to {resolved} on this root: {exc}; nothing was "
                               f"switched and nothing written; the live slot is unchanged") from None
        host = resolved if root == "/" else root + resolved
        try:
            check_socket_dir(host, gid)
        except SocketDirError as exc:
            raise NotReady(f"{field}: {exc}; nothing was switched and nothing written; the live slot is "
                           f"unchanged") from None
        found[field] = host
    return HostDirs(found["socket_dir"], meta.socket_name, found["state_dir"], found["metrics_dir"],
                    meta.user.uid if meta.user else None, gid)


def check_host(layout: DeviceLayout, archive: Path, manifest, manifest_bytes: bytes, signature: bytes) -> HostDirs:
    """Everything the bundle would have the host do, checked before anything is written:
    Refused("host") for the archive's values, NotReady for this root's directories."""
    files = read_bundle_files(archive, manifest, manifest_bytes, signature)
    if DROPIN in files:
        check_dropin(files[DROPIN])
    meta = check_meta(files[META]) if META in files else BundleHost()
    return host_dirs(layout, meta)
