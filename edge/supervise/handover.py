"""An update without the stop on its path: restore the new bundle beside the runtime that serves,
let it take the socket over, then drain and stop the old one (docs/update.md, "Beside the old runtime").

``systemctl reload edge`` runs ``ExecReload=edge-supervise --reload $MAINPID``, which sends SIGHUP
to the supervisor and waits for the outcome in the start record (``handover``). The supervisor,
serving container ``edge`` (or ``edge-b``), then:

1. reads the bundle ``--bundle`` names now (``current``, just switched by ``edge-bundle install``);
   refuses, with the old runtime untouched, when it serves elsewhere (another socket directory,
   address or user), has no usable snapshot, or the memory left (the unit's cgroup, the machine's
   MemAvailable) is below what its restore needs (its images and mapped files, plus a margin);
2. restores it as the other container id (``edge-b``, or ``edge``) with ``beside`` in its resume
   record: the runtime binds ``.<socket>.<id>`` in the socket directory, and once ready renames it
   over the address (``rename(2)``: a client connecting finds the old runtime's file or the new
   one's, never none; edge/ipc/endpoint.py ``take_over_ipc_file``);
3. once the address's file is the new one's and answers ready, stops the old container as a stop
   would (TERM: it drains, answering every message its connections delivered, and leaves the new
   file; KILL after ``runc.STOP_TIMEOUT_S``) and deletes it (``runc.stop_container``).

Before the switch, any failure deletes the new container and leaves the old one serving; the
reload then fails, and ``edge-bundle install`` restarts the unit instead (stop, then restore).
After the switch the new runtime is the one served, whatever follows.
"""

import json
import os
import shutil
import signal
import tempfile
import time

from edge.supervise.bundle_start import nofile_cap, nofile_differs, runtime_bundle
from edge.supervise.logs import log
from edge.supervise.runc import Detached, run_runc
from edge.supervise.snapshot import NotRestored, restore
from edge.supervise.start_record import START_RECORD
from edge.system.snapshot_rules import METADATA, check_snapshot, dependencies, snapshot_dir
from edge.system.socket_dir import SocketDirError, prepare_host_dirs

MEMORY_MARGIN = 64 << 20  # bytes beyond a restore's images and mapped files
RELOAD_TIMEOUT_S = 110.0  # --reload's wait: below the unit's TimeoutStartSec (120 s), which bounds a reload


class Refused(Exception):
    """Why the handover did not happen: the old runtime serves on, untouched."""


def other_id(base, current):
    """The container id the next runtime gets beside ``current``: the unit's two alternate."""
    return f"{base}-b" if current == base else base


def beside_name(meta, cid):
    """The file the new runtime binds first, beside the address's: hidden, in the same directory."""
    return f".{os.path.basename(meta['address'][len('ipc://'):])}.{cid}"


def _cgroup_room():
    """Bytes the unit's cgroup may still charge (memory.max - memory.current); None: no limit read."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(base, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(base, "memory.current")) as f:
            current = int(f.read())
    except (OSError, StopIteration, ValueError):
        return None
    return None if limit == "max" else int(limit) - current


def _mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def restore_need(snap):
    """Bytes a restore of ``snap`` takes: its images (anonymous memory) and the files its runtime
    maps (page cache), plus MEMORY_MARGIN."""
    with open(os.path.join(snap, "snapshot.json")) as f:
        record = json.load(f)
    files = sum(int(f.get("size", 0)) for f in record.get("runtime", {}).get("files", []))
    return int(record.get("image_bytes", 0)) + files + MEMORY_MARGIN


def memory_problem(need):
    """Why the memory left cannot take a second runtime of ``need`` bytes (None: it can)."""
    for where, room in (("the unit's cgroup (MemoryMax=)", _cgroup_room()), ("the machine (MemAvailable)",
                                                                            _mem_available())):
        if room is not None and room < need:
            return f"{where} has {room >> 20} MiB left, a restore beside the old runtime needs {need >> 20} MiB"
    return None


def _same_place(old, new):
    for key in ("address", "socket_dir"):
        if old.get(key) != new.get(key):
            return f"the new bundle's {key} is {new.get(key)!r}, the old one's {old.get(key)!r}"
    if old.get("user") != new.get("user"):
        return "the new bundle runs as another user"
    if not str(new.get("address", "")).startswith("ipc://"):
        return "the bundle serves on tcp://, whose port two runtimes cannot share"
    return None


def _inode(path):
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class Handover:
    """One handover, by the supervisor's main loop: :meth:`run` returns the new container."""

    def __init__(self, args, old_meta, old_id, env, stopping, record):
        self.args, self.old_meta, self.old_id, self.env, self.stopping = args, old_meta, old_id, env, stopping
        self.record = record
        self.new_id = other_id(args.id, old_id)
        self.work = None

    def prepare(self):
        """The new bundle, checked: (bundle, meta, snapshot directory). Raises Refused."""
        bundle = os.path.abspath(self.args.bundle)
        try:
            with open(os.path.join(bundle, METADATA)) as f:
                meta = json.load(f)
        except (OSError, ValueError) as exc:
            raise Refused(f"{bundle}/{METADATA} unreadable: {exc}") from None
        why = _same_place(self.old_meta, meta)
        if why:
            raise Refused(why)
        try:
            prepare_host_dirs(meta["user"]["uid"], meta["user"]["gid"], meta.get("metrics_dir"), meta.get("state_dir"))
        except (SocketDirError, OSError) as exc:
            raise Refused(f"its host directories: {exc}") from None
        self.work = tempfile.mkdtemp(prefix="edge-handover-", dir=os.environ.get("RUNTIME_DIRECTORY"))
        run_bundle = runtime_bundle(bundle, meta, self.work, nofile_cap(bundle))
        snap = snapshot_dir(bundle)
        criu = shutil.which("criu") or "criu"
        try:
            why = check_snapshot(snap, dependencies(bundle, meta, self.args.runc, criu)) or nofile_differs(snap,
                                                                                                         run_bundle)
            why = why or memory_problem(restore_need(snap))
        except Exception as exc:  # a snapshot never fails the unit
            why = f"snapshot unreadable: {type(exc).__name__}: {exc}"
        if why:
            raise Refused(f"no restore beside the old runtime: {why}")
        return bundle, meta, snap

    def run(self):
        """(container, output, bundle, meta): the new runtime, at the address. Raises Refused
        (the old one serves on) before the switch."""
        bundle, meta, snap = self.prepare()
        live = meta["address"][len("ipc://"):]
        old_inode = _inode(live)
        if old_inode is None:
            raise Refused(f"no socket file at {live}: the old runtime is not at the address")
        run_runc(["delete", "--force", self.new_id], self.args.runc)
        self.record.stamp("handover_runc")

        def switched():
            now = _inode(live)
            return now is not None and now != old_inode

        try:
            container, output, seconds = restore(snap, meta, self.args, self.env, self.stopping, cid=self.new_id,
                                                 beside=beside_name(meta, self.new_id), switched=switched)
        except NotRestored as exc:
            if not switched():
                run_runc(["delete", "--force", self.new_id], self.args.runc)
                raise Refused(f"restore failed: {exc}") from None
            # At the address, but not ready: it is the one served now, and its probes judge it.
            log("supervise.handover_not_ready", container=self.new_id, error=str(exc)[-2000:])
            container, output = Detached(self.args.runc, self.new_id), None
        self.record.stamp("handover_switched")
        log("supervise.handover_switched", container=self.new_id, seconds=None if seconds is None else round(seconds, 3))
        return container, output, bundle, meta

    def cleanup(self):
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)


def read_record(directory):
    try:
        with open(os.path.join(directory, START_RECORD)) as f:
            record = json.load(f)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def reload(pid, directory, timeout_s=RELOAD_TIMEOUT_S):
    """``--reload PID`` (ExecReload=): SIGHUP to the supervisor, then its handover's outcome from the
    start record; 0 when the new runtime serves, 1 when it did not happen (the old one serves on)."""
    seq = (read_record(directory).get("handover") or {}).get("seq", 0)
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"edge-supervise --reload: cannot signal {pid}: {exc}", flush=True)
        return 1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = read_record(directory)
        h = record.get("handover") or {}
        if record.get("pid") == pid and h.get("seq", 0) > seq and h.get("state") in ("done", "failed"):
            print(json.dumps(h), flush=True)
            return 0 if h["state"] == "done" else 1
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("edge-supervise --reload: the supervisor ended", flush=True)
            return 1
        time.sleep(0.05)
    print(f"edge-supervise --reload: no outcome within {timeout_s:g} s", flush=True)
    return 1


__all__ = ["Handover", "Refused", "beside_name", "memory_problem", "other_id", "reload", "restore_need"]
