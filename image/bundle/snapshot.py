"""Snapshots of a bundle at its snapshot point: take one with ``runc checkpoint``, check that it
still fits the bundle, restore it with ``runc restore`` (docs/snapshot.md).

A snapshot lives in :func:`snapshot_dir`: for a slot's bundle installed by ``edge-bundle install``
(``ROOT/opt/edge/slots/<a|b>/bundle``), outside the slot, in ``ROOT/var/cache/edge/<bundle_sha256>/snapshot/``
(edge/update/install/layout.py), so that filling the slot again with the same bundle finds it, and a slot
holds only what its manifest lists; for any other bundle, beside it, in ``<bundle>.snapshot/``::

    config.json       the bundle's, plus ``--snapshot-point`` and a user namespace; root.path
                      points at the bundle's rootfs. ``runc restore --bundle`` reads it.
    images/           CRIU's image files: the runtime's memory, so root's and the user namespace's
                      root's (group 100000, 0640) only
    snapshot.json     what the snapshot depends on (:func:`dependencies`), its files' sizes

The user namespace: CRIU must read the limits of the container's process, which needs
CAP_SYS_RESOURCE; root on some hosts (this build machine) lacks it, but it has every
capability in a namespace it owns. The runtime's uid and gid map to themselves, so the
socket file is owned as in a fresh start; the rest of the range maps above 100000.

``take_snapshot`` runs the bundle once with ``--snapshot-point`` (``runc run -d``, stdout a
pipe: CRIU cannot dump a file outside the container), waits for ``snapshot-point.json`` in
the socket directory, and checkpoints the container, which ends it. ``restore`` starts a
container from the images, writes ``snapshot-resume.json`` (when the restore began, on the
wall clock) and sends SIGUSR2: the runtime's restore hook runs and it binds (edge/runtime/snapshot.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from edge.system import snapshot_rules as rules
from edge.system.snapshot_rules import (CRIU_CONF, CRIU_CONF_OK, MARKER, RESUME, SNAPSHOT_FORMAT, USERNS_BASE,
                                        site_criu_conf, tool_version)

__all__ = ["SnapshotError", "snapshot_dir", "snapshot_config", "dependencies", "take_snapshot", "check_snapshot",
           "restore", "restore_phases", "SNAPSHOT_FORMAT"]


class SnapshotError(RuntimeError):
    """Taking or restoring a snapshot failed; the message says where and what to do."""


def snapshot_dir(bundle: Path) -> Path:
    """Where the snapshot of ``bundle`` lives (edge/system/snapshot_rules.py ``snapshot_dir``, the rule
    edge-supervise and edge doctor apply): ``ROOT/var/cache/edge/<bundle_sha256>/snapshot`` when the
    bundle's real directory is an installed slot's (``ROOT/opt/edge/slots/<a|b>/bundle`` beside the
    slot's edge-archive.json; the digest from its edge-bundle.json), else ``<realpath(bundle)>.snapshot``."""
    return Path(rules.snapshot_dir(bundle))


def snapshot_config(bundle: Path, nofile: int | None = None) -> dict:
    """The config.json a snapshot is taken and restored with (see the module docstring)."""
    config = json.loads((bundle / "config.json").read_text())
    config["root"]["path"] = str((bundle / config["root"]["path"]).resolve())
    for m in config["mounts"]:  # restored from another directory: the bundle's own paths made absolute
        if m.get("type") == "bind" and not os.path.isabs(m["source"]):
            m["source"] = str((bundle / m["source"]).resolve())
    if nofile is not None:  # a host whose root cannot raise RLIMIT_NOFILE (tests on this machine)
        for r in config["process"].get("rlimits", []):
            if r["type"] == "RLIMIT_NOFILE":
                r["soft"] = r["hard"] = min(r["hard"], nofile)
    return rules.as_snapshot_config(config)


def dependencies(bundle: Path, runc: str = "runc", criu: str = "criu") -> dict:
    """What a snapshot is valid for (edge/system/snapshot_rules.py ``dependencies``): a restore is
    tried only when all of these are equal."""
    return rules.dependencies(bundle, json.loads((bundle / "edge-bundle.json").read_text()), runc, criu)


def _socket_dir(config: dict) -> Path:
    for m in config["mounts"]:
        if m["destination"] == "/run/edge":
            return Path(m["source"])
    raise SnapshotError("the bundle mounts no socket directory at /run/edge: a snapshot needs one (an ipc bundle)")


def _check_searchable(paths: list[Path]) -> None:
    """CRIU mounts the rootfs and the socket directory from inside the user namespace, as an
    unprivileged host uid: every directory above them must let others search it."""
    for path in paths:
        for d in path.parents:  # the last component is mounted, not searched: 0750 is fine there
            if d.exists() and not os.stat(d).st_mode & 0o001:
                raise SnapshotError(f"{d} is not searchable by others (mode {os.stat(d).st_mode & 0o777:o}), "
                                    f"so a restore, which runs in the container's user namespace, cannot reach "
                                    f"{path}: chmod o+x {d}, or keep the bundle and the socket directory elsewhere")


def _prepare_socket_dir(path: Path, uid: int, gid: int, config: dict) -> None:
    """The socket directory made the runtime's as every starter makes it (edge/system/socket_dir.py), and
    MARKER and RESUME removed whoever wrote them: an earlier run's would be read as this one's.
    A directory it refuses (a symlink, not a directory, writable by others) is a SnapshotError."""
    from edge.system.socket_dir import SocketDirError, prepare_host_dirs, prepare_socket_dir  # SNAPSHOT_FILES: MARKER, RESUME
    from image.bundle.oci_config import host_dirs

    try:
        prepare_socket_dir(path, uid, gid, snapshot_files=True)
        prepare_host_dirs(uid, gid, **host_dirs(config))  # runc binds them: they must exist
    except SocketDirError as exc:
        raise SnapshotError(str(exc)) from None


def _restrict(images: Path) -> None:
    """The images hold the runtime's memory: root's, and readable by the group of the user
    namespace's root (host gid USERNS_BASE), as which CRIU opens some of them on restore."""
    os.chown(images, 0, USERNS_BASE)
    os.chmod(images, 0o750)
    for p in images.iterdir():
        os.chown(p, 0, USERNS_BASE)
        os.chmod(p, 0o640)


def _write_resume(sockets: Path, record: dict) -> None:
    """The resume file, in a directory the runtime's user owns: a new file (O_EXCL, so never
    through a link planted there), readable by the runtime whatever our umask, renamed in place."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{RESUME}.", dir=sockets)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.chmod(tmp, 0o644)
    os.replace(tmp, sockets / RESUME)


def _drain(stream) -> list[bytes]:
    """Read a container's output on a thread (a full pipe would stop it); the lines, kept."""
    lines: list[bytes] = []
    threading.Thread(target=lambda: lines.extend(stream), daemon=True).start()
    return lines


def _runc(runc: str, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([runc, *args], capture_output=True, text=True, timeout=timeout_s)


def take_snapshot(bundle: Path, *, runc: str = "runc", nofile: int | None = None, timeout_s: float = 120.0,
                  say=lambda *a: None) -> dict:
    """Checkpoint ``bundle`` at its snapshot point into :func:`snapshot_dir`; its snapshot.json."""
    bundle = bundle.resolve()
    out = snapshot_dir(bundle)
    staging = out.with_name(f".{out.name}.new-{os.getpid()}")
    make_parents(out)  # root's, 0755, as /var/cache
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "images").mkdir(parents=True)
    _restrict(staging / "images")
    config = snapshot_config(bundle, nofile)
    if CRIU_CONF_OK in tool_version(["criu", "--version"]):
        (staging / "criu.conf").write_text(site_criu_conf() + CRIU_CONF)
        checkpoint_config = {**config, "annotations": {**config.get("annotations", {}),
                                                       "org.criu.config": str(staging / "criu.conf")}}
    else:
        checkpoint_config = config
    (staging / "config.json").write_text(json.dumps(checkpoint_config, indent=1))
    user = config["process"]["user"]
    sockets = _socket_dir(config)
    from image.bundle.oci_config import host_dirs

    _check_searchable([Path(config["root"]["path"]), sockets, *map(Path, host_dirs(config).values())])
    _prepare_socket_dir(sockets, user["uid"], user["gid"], config)
    cid = f"edge-snapshot-{os.getpid()}"
    t0 = time.monotonic()
    say(f"starting {bundle.name} to its snapshot point")
    proc = subprocess.Popen([runc, "run", "-d", "--bundle", str(staging), cid], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = _drain(proc.stdout)
    try:
        if proc.wait(timeout_s) != 0:
            raise SnapshotError(f"runc run failed: {b''.join(output).decode(errors='replace')[-2000:]}")
        marker = _wait_for_marker(sockets / MARKER, runc, cid, t0 + timeout_s, output)
        point_s = time.monotonic() - t0
        say(f"at the snapshot point after {point_s:.2f} s; checkpointing")
        t1 = time.monotonic()
        r = _runc(runc, "checkpoint", "--image-path", str(staging / "images"), "--file-locks", cid)
        if r.returncode != 0:
            log = (staging / "images" / "dump.log")
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise SnapshotError(f"runc checkpoint failed: {r.stderr.strip()[-500:]}\n{tail}")
        checkpoint_s = time.monotonic() - t1
    finally:
        _runc(runc, "delete", "--force", cid)
    (staging / "config.json").write_text(json.dumps(config, indent=1))  # restores take the lock method from the images
    (staging / "criu.conf").unlink(missing_ok=True)
    _restrict(staging / "images")
    images = {p.name: p.stat().st_size for p in sorted((staging / "images").iterdir()) if p.is_file()}
    record = {"format": SNAPSHOT_FORMAT, "taken": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "dependencies": dependencies(bundle, runc), "images": images,
              "image_bytes": sum(images.values()), "snapshot_point_s": round(point_s, 3),
              "checkpoint_s": round(checkpoint_s, 3), "runtime": {"pid": marker.get("pid"),
                                                                 "files": marker.get("files", []),
                                                                 "memory": marker.get("memory", {})}}
    (staging / "snapshot.json").write_text(json.dumps(record, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    say(f"snapshot of {record['image_bytes'] / 2**20:.1f} MiB in {out}")
    return record


def _wait_for_marker(path: Path, runc: str, cid: str, deadline: float, output: list[bytes]) -> dict:
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass  # being written
        state = _runc(runc, "state", cid)
        if state.returncode != 0 or '"stopped"' in state.stdout:
            raise SnapshotError(f"the container ended before its snapshot point: "
                                f"{b''.join(output).decode(errors='replace')[-2000:]}")
        time.sleep(0.02)
    raise SnapshotError(f"no {MARKER} in {path.parent} in time; the runtime's output: "
                        f"{b''.join(output).decode(errors='replace')[-2000:]}")


def check_snapshot(bundle: Path, runc: str = "runc") -> str | None:
    """Why the snapshot of ``bundle`` (:func:`snapshot_dir`) cannot be restored (None: it can)."""
    snap = snapshot_dir(bundle.resolve())
    try:
        record = json.loads((snap / "snapshot.json").read_text())
    except FileNotFoundError:
        return f"no snapshot in {snap}"
    except (OSError, ValueError) as exc:
        return f"{snap / 'snapshot.json'} is unreadable ({exc})"
    if record.get("format") != SNAPSHOT_FORMAT:
        return f"snapshot format {record.get('format')}, this tool reads {SNAPSHOT_FORMAT}"
    now = dependencies(bundle, runc)
    changed = [f"{k}: {record['dependencies'].get(k)!r} -> {v!r}" for k, v in now.items()
               if record.get("dependencies", {}).get(k) != v]
    if changed:
        return "taken for another " + "; ".join(changed)
    for name, size in record.get("images", {}).items():
        path = snap / "images" / name
        if not path.is_file() or path.stat().st_size != size:
            return f"image file {name} is missing or not {size} bytes (truncated or partial snapshot)"
    return None


def restore(bundle: Path, cid: str, *, runc: str = "runc", timeout_s: float = 60.0) -> subprocess.Popen:
    """Start container ``cid`` from the bundle's snapshot and resume it; the ``runc restore -d``
    process, whose stdout (the container's output) the caller reads. Raises SnapshotError."""
    bundle = bundle.resolve()
    snap = snapshot_dir(bundle)
    config = json.loads((snap / "config.json").read_text())
    user = config["process"]["user"]
    sockets = _socket_dir(config)
    _prepare_socket_dir(sockets, user["uid"], user["gid"], config)
    pid_file = snap / f".{cid}.pid"
    pid_file.unlink(missing_ok=True)
    started = time.clock_gettime_ns(time.CLOCK_REALTIME)
    proc = subprocess.Popen([runc, "restore", "-d", "--image-path", str(snap / "images"), "--bundle", str(snap),
                             "--file-locks", "--pid-file", str(pid_file), cid], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.wait(timeout_s) != 0:
        log = snap / "images" / "restore.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        raise SnapshotError(f"runc restore failed: {proc.stdout.read().decode(errors='replace')[-500:]}\n{tail}")
    _write_resume(sockets, {"restored": True, "restore_started_realtime_ns": started})
    try:  # the container's init, directly: `runc kill` would cost another exec (~20 ms)
        pid = int(pid_file.read_text())
        pid_file.unlink()
        os.kill(pid, signal.SIGUSR2)
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"cannot resume the restored container {cid}: {exc}") from None
    return proc


def restore_phases(bundle: Path) -> dict:
    """Where the last restore of ``bundle``'s snapshot spent its time inside CRIU, from its
    ``images/restore.log`` (ms since CRIU started): ``criu_setup_ms`` (kernel probes, namespaces,
    mounts, until it forks the task), ``criu_memory_ms`` (the restorer's read of the memory
    images), ``criu_finish_ms`` (the rest, until "Restore finished"), ``criu_total_ms`` (its
    last line), ``pages_restored_bytes``. Empty when the log is missing or says none of these."""
    import re

    try:
        log = (snapshot_dir(bundle.resolve()) / "images" / "restore.log").read_text(errors="replace")
    except OSError:
        return {}
    stamps = [(float(t) * 1e3, text) for t, text in re.findall(r"^\((\d+\.\d+)\) ?(.*)$", log, re.M)]
    if not stamps:
        return {}

    def first(pattern: str) -> float | None:
        return next((t for t, text in stamps if pattern in text), None)

    forked, finished = first("Forking task"), first("Restore finished")
    read = [(t, int(n)) for t, text in stamps for n in re.findall(r"`- returned (\d+)", text)]
    out: dict = {"criu_total_ms": round(stamps[-1][0], 3)}
    if forked is not None:
        out["criu_setup_ms"] = round(forked, 3)
    if forked is not None and read:
        out["criu_memory_ms"] = round(read[-1][0] - forked, 3)
        out["pages_restored_bytes"] = sum(n for _, n in read)
    if finished is not None:
        out["criu_finish_ms"] = round(finished - (read[-1][0] if read else forked or 0.0), 3)
    return out


# ------------------------------------------------------------------ edge-bundle snapshot


def add_parser(sub, epilog: str) -> None:
    s = sub.add_parser("snapshot", epilog=epilog,
                       help="checkpoint the bundle at its snapshot point into DIR.snapshot (runc, CRIU >= 4.1)")
    s.add_argument("--bundle", required=True, type=Path, help="the bundle directory (edge-bundle build --out)")
    s.add_argument("--check", action="store_true",
                   help="take nothing: say whether the snapshot beside the bundle can be restored (exit 0) or why not (1)")
    s.add_argument("--runc", default="runc", help="runc binary (default: runc on PATH; it finds criu on PATH)")
    s.add_argument("--nofile", type=int, default=None, metavar="N",
                   help="lower the container's open-files limit to N (a host whose root cannot raise it)")
    s.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="to reach the snapshot point")
    s.add_argument("--quiet", action="store_true")


def command(args) -> int:
    import sys

    bundle = args.bundle
    if not (bundle / "config.json").is_file() or not (bundle / "edge-bundle.json").is_file():
        print(f"edge-bundle snapshot: {bundle} is not a bundle (no config.json and edge-bundle.json); "
              f"make one with `edge-bundle build --out DIR`", file=sys.stderr)
        return 2
    if args.check:
        why = check_snapshot(bundle, args.runc)
        print(f"{snapshot_dir(bundle.resolve())}: " + (why or "can be restored"))
        return 0 if why is None else 1
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"edge-bundle snapshot: {msg}", file=sys.stderr))
    record = take_snapshot(bundle, runc=args.runc, nofile=args.nofile, timeout_s=args.timeout, say=say)
    print(json.dumps({k: record[k] for k in ("image_bytes", "snapshot_point_s", "checkpoint_s", "dependencies")},
                     indent=2))
    return 0


def make_parents(path) -> None:
    """edge/system/socket_dir.py ``make_parents`` (imported when called: see MARKER)."""
    from edge.system.socket_dir import make_parents as make

    make(path)
