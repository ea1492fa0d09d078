"""Snapshot boot under systemd: restore the container from the bundle's snapshot, or, after a fresh
READY, take one in the background for the next start (docs/snapshot.md). Where the snapshot lives
and when it is valid: edge/system/snapshot_rules.py, the rule edge-bundle snapshot and edge doctor
apply too."""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time

from edge.supervise.bundle_start import absolute_paths
from edge.supervise.logs import Output, log, log_tail
from edge.supervise.runc import Detached, run_runc, snapshot_id
from edge.supervise.probe import probe
from edge.supervise.start_record import StartRecord
from edge.system.socket_dir import make_parents
from edge.system.snapshot_rules import (CRIU_CONF, CRIU_CONF_OK, MARKER, RESUME, SNAPSHOT_FORMAT, as_snapshot_config,
                                        dependencies, site_criu_conf, snapshot_dir, tool_version, unreachable_in_userns)

# Restored on this machine in 0.2-0.3 s to a ready probe (ORT); a CUDA device's stages run after
# the restore, so leave them time. A fresh start then still gets its whole READY_TIMEOUT_S.
RESTORE_READY_TIMEOUT_S = 30.0
SNAPSHOT_POINT_TIMEOUT_S = 120.0  # the snapshot container's boot to its snapshot point
RESTORE_PROBE_EVERY_S = 0.02  # a refused connect costs microseconds; ready is seen within 20 ms
MIN_CRIU = (4, 1)  # Debian bookworm's 3.17 fails on this kernel ("Unexpected rt vDSO area bounds", CRIU 2532)


def criu_problem(criu):
    """Why ``criu`` cannot take the snapshot (None: it can): absent, or older than 4.1."""
    if criu is None:
        return "no criu on PATH (a snapshot needs CRIU >= 4.1)"
    version = tool_version([criu, "--version"])
    found = re.search(r"Version:\s*(\d+)\.(\d+)", version)
    if found is None:
        return f"{criu} --version says {version!r}, not a CRIU version"
    if tuple(int(x) for x in found.groups()) < MIN_CRIU:
        return f"{criu} is CRIU {found.group(1)}.{found.group(2)}; a snapshot needs CRIU >= 4.1"
    return None


def snapshot_config(bundle, config):
    """The config.json a snapshot is taken and restored with: ``config`` (the bundle's, or its
    runtime copy) with ``--snapshot-point``, a user namespace (CRIU must read the runtime's
    limits, which takes CAP_SYS_RESOURCE; root has every capability in a namespace it owns) and
    absolute paths. image/bundle/snapshot.py ``snapshot_config`` builds the same."""
    return as_snapshot_config(absolute_paths(json.loads(json.dumps(config)), bundle))


def discard(snap):
    """A snapshot that was refused or failed goes, so the next fresh READY can take a new one."""
    try:
        if os.path.isdir(snap) and not os.path.islink(snap):
            shutil.rmtree(snap)
        elif os.path.lexists(snap):
            os.unlink(snap)
        return True
    except OSError as exc:
        log("supervise.snapshot_not_removed", path=snap, error=str(exc))
        return False


def _write_resume(socket_dir, meta, started_ns, beside=None):
    """``snapshot-resume.json``, atomically, readable by the runtime; never through a link the
    runtime's user (the directory's owner) may have planted: a new file, renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{RESUME}.", dir=socket_dir)
    try:
        os.fchown(fd, meta["user"]["uid"], meta["user"]["gid"])
        os.fchmod(fd, 0o640)
        with os.fdopen(fd, "w") as f:
            json.dump({"restored": True, "restore_started_realtime_ns": started_ns,
                       **({"beside": beside} if beside else {})}, f)
        os.replace(tmp, os.path.join(socket_dir, RESUME))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class NotRestored(Exception):
    """Why the snapshot was not restored: the start goes on fresh."""


def restore(snap, meta, args, env, stopping, *, cid=None, beside=None, switched=None):
    """Container ``cid`` (default ``args.id``) from the snapshot, resumed: (Detached, Output,
    seconds to ready, or None when a stop signal came first). Returns as soon as its health probe
    answers ready; raises NotRestored when it cannot.

    ``beside``: the runtime serves at the address already (a handover, edge/supervise/handover.py):
    the restored one binds this file name in the socket directory first and takes the address
    over once ready; ``switched()`` says when it has (the address's file is no longer the old one's)."""
    cid = cid or args.id
    t0 = time.monotonic()
    started_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)  # the runtime's restore stage starts here
    runc = subprocess.Popen([args.runc, "restore", "-d", "--image-path", os.path.join(snap, "images"),
                             "--bundle", snap, "--file-locks", cid], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = Output(runc.stdout, forward=True)  # the restored runtime's log, to the journal
    try:
        status = runc.wait(RESTORE_READY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        runc.kill()
        runc.wait()
        raise NotRestored(f"runc restore did not finish in {RESTORE_READY_TIMEOUT_S:g} s") from None
    if status != 0:
        raise NotRestored(f"runc restore exited {status}: {output.tail(500)} "
                          f"{log_tail(os.path.join(snap, 'images', 'restore.log'), 800)}")
    container = Detached(args.runc, cid)
    try:
        if container.poll() is not None:
            raise NotRestored(f"the restored container is not running: {output.tail()}")
        _write_resume(meta["socket_dir"], meta, started_ns, beside)
        try:  # the container's init, directly: `runc kill` would cost another exec (~20 ms)
            container.signal(signal.SIGUSR2)
        except OSError as exc:
            raise NotRestored(f"cannot resume the restored container {cid}: {exc}") from None
        detail = "no probe yet"
        while not stopping:
            if switched is not None and not switched():
                ok, detail = False, "not at the address yet"
            else:
                ok, detail = probe(meta["address"], 1.0)
            if ok:
                return container, output, time.monotonic() - t0
            if container.poll() is not None:
                time.sleep(0.2)  # its last lines
                raise NotRestored(f"the restored runtime exited before it was ready: {output.tail()}")
            if time.monotonic() - t0 > RESTORE_READY_TIMEOUT_S:
                raise NotRestored(f"the restored runtime was not ready within {RESTORE_READY_TIMEOUT_S:g} s "
                                  f"({detail})")
            time.sleep(RESTORE_PROBE_EVERY_S)
    except BaseException:
        container.close()
        raise
    return container, output, None


def _read_marker(path, since_ns):
    """The snapshot point's marker, when the container we started wrote it (newer than
    ``since_ns``; a regular file: no link or fifo of the runtime's user stalls us); else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mtime_ns < since_ns:
            return None
        try:
            record = json.loads(f.read(1 << 20))
        except ValueError:
            return None
    return record if isinstance(record, dict) else None


class SnapshotTaker(threading.Thread):
    """After a fresh READY, off its path: run the bundle again as container ``<id>-snapshot`` to its
    snapshot point, ``runc checkpoint`` it into ``<snapshot dir>.new`` and rename that into place.

    The second container binds the same socket directory as the serving one, as a restore must,
    and disturbs nothing there: it stops before it binds, and writes only ``snapshot-point.json``
    (removed first, so the marker seen is its own) and removes ``snapshot-resume.json``, which
    the serving runtime read at its own start. Failures only log."""

    def __init__(self, bundle, run_bundle, meta, args, env, record=None):
        super().__init__(name="snapshot", daemon=True)
        self.record = record or StartRecord(None)
        self.bundle, self.run_bundle, self.meta, self.runc, self.env = bundle, run_bundle, meta, args.runc, env
        self.cid = snapshot_id(args.id)
        self.snap = snapshot_dir(bundle)
        self.staging = self.snap + ".new"
        self.aborted = threading.Event()

    def abort(self):
        """The unit stops: end the snapshot container now; run() cleans up."""
        self.aborted.set()
        run_runc(["kill", self.cid, "KILL"], self.runc)

    def run(self):
        t0 = time.monotonic()
        try:
            record = take_snapshot(self.bundle, self.run_bundle, self.meta, self.runc, self.env, self.cid,
                                   self.aborted)
            log("supervise.snapshot_taken", path=self.snap, seconds=round(time.monotonic() - t0, 3),
                 **{k: record[k] for k in ("image_bytes", "snapshot_point_s", "checkpoint_s")})
            outcome = {"snapshot": "taken"}
        except Exception as exc:  # never the unit's failure
            log("supervise.snapshot_failed", seconds=round(time.monotonic() - t0, 3),
                 error="stopped: the unit is stopping" if self.aborted.is_set() else f"{exc}"[-2000:])
            outcome = {"snapshot": "failed", "snapshot_error": f"{exc}"[-500:]}
        finally:
            run_runc(["delete", "--force", self.cid], self.runc)
            shutil.rmtree(self.staging, ignore_errors=True)
        self.record.stamp("snapshot_done", **outcome)  # after the cleanup: the machine is quiet again


def _nice_0():
    os.setpriority(os.PRIO_PROCESS, 0, 0)  # root: CAP_SYS_NICE may lower the nice value again


def take_snapshot(bundle, run_bundle, meta, runc, env, cid, aborted, *, socket_dir=None, cpu_shares=None,
                  taken_by="edge-supervise"):
    """Run the bundle (its runtime config ``run_bundle``) as container ``cid`` to its snapshot point,
    ``runc checkpoint`` it into ``<snapshot dir>.new`` and rename that into the bundle's snapshot
    directory (``snapshot_dir``); its snapshot.json record. ``aborted`` (an Event) set: stop.
    Raises RuntimeError saying why it could not; the caller deletes the container and the
    staging directory.

    ``socket_dir``: a host directory of the runtime's user bound at the container's socket
    directory instead of the bundle's, for the checkpoint only (the marker is written there; the
    runtime binds nothing before its snapshot point): the snapshot's own config.json names the
    bundle's, and runc's restore maps an external bind mount by its destination to the source
    its config names. ``cpu_shares``: the checkpointed container's cgroup weight (cgroup v1
    cpu.shares; runc writes v2's cpu.weight from it); a restore gets the bundle's own."""
    snap = snapshot_dir(bundle)
    staging = snap + ".new"
    why = criu_problem(shutil.which("criu"))  # the one runc runs: the first on PATH
    if why is not None:
        raise RuntimeError(why)
    make_parents(snap)
    shutil.rmtree(staging, ignore_errors=True)
    images = os.path.join(staging, "images")
    os.makedirs(images)
    os.chmod(staging, 0o700)  # the runtime's memory: root's only (CRIU reads it as root)
    os.chmod(images, 0o711)  # as edge-bundle snapshot makes it
    with open(os.path.join(run_bundle, "config.json")) as f:
        config = snapshot_config(bundle, json.load(f))
    blocked = unreachable_in_userns(config)
    if blocked:
        raise RuntimeError(f"it could not be restored: {blocked}")
    checkpoint_config = json.loads(json.dumps(config))
    if socket_dir is not None:
        inside = meta.get("container_socket_dir", "/run/edge")
        mounts = [m for m in checkpoint_config["mounts"] if m.get("type") == "bind" and m["destination"] == inside]
        if not mounts:
            raise RuntimeError(f"the bundle binds no socket directory at {inside}")
        for m in mounts:
            m["source"] = socket_dir
        blocked = unreachable_in_userns(checkpoint_config)
        if blocked:
            raise RuntimeError(f"it could not be checkpointed: {blocked}")
    if cpu_shares is not None:
        checkpoint_config["linux"].setdefault("resources", {})["cpu"] = {"shares": int(cpu_shares)}
    if CRIU_CONF_OK in tool_version([shutil.which("criu") or "criu", "--version"]):  # as edge-bundle snapshot
        conf = os.path.join(staging, "criu.conf")
        with open(conf, "w") as f:
            f.write(site_criu_conf() + CRIU_CONF)
        checkpoint_config["annotations"] = {**checkpoint_config.get("annotations", {}), "org.criu.config": conf}
    with open(os.path.join(staging, "config.json"), "w") as f:
        json.dump(checkpoint_config, f, indent=1)
    marker = os.path.join(socket_dir or meta["socket_dir"], MARKER)
    try:
        os.unlink(marker)
    except FileNotFoundError:
        pass
    since_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - 10**9  # mtime is a coarse clock
    t0 = time.monotonic()
    run_runc(["delete", "--force", cid], runc)
    # The container's nice level is its own, whatever ours (a staging run's is 19): CRIU records it,
    # and a restored runtime would keep it. Its share of the CPU is its cgroup's (cpu_shares).
    proc = subprocess.Popen([runc, "run", "-d", "--bundle", staging, cid], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_nice_0 if os.getpriority(os.PRIO_PROCESS, 0) != 0 else None)
    output = Output(proc.stdout, forward=False)  # a second boot's log would only confuse the journal
    try:
        status = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError("runc run -d did not return in 60 s") from None
    if status != 0:
        raise RuntimeError(f"runc run -d exited {status}: {output.tail()}")
    container = Detached(runc, cid)
    try:
        while (point := _read_marker(marker, since_ns)) is None:
            if aborted.is_set():
                raise RuntimeError("stopped")
            if container.poll() is not None:
                raise RuntimeError(f"the container ended before its snapshot point: {output.tail()}")
            if time.monotonic() - t0 > SNAPSHOT_POINT_TIMEOUT_S:
                raise RuntimeError(f"no {MARKER} within {SNAPSHOT_POINT_TIMEOUT_S:g} s: {output.tail()}")
            time.sleep(0.05)
    finally:
        container.close()
    point_s = time.monotonic() - t0
    t1 = time.monotonic()
    r = run_runc(["checkpoint", "--image-path", images, "--file-locks", cid], runc, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"runc checkpoint exited {r.returncode}: {r.stderr.strip()[-500:]} "
                           f"{log_tail(os.path.join(images, 'dump.log'), 1000)}")
    checkpoint_s = time.monotonic() - t1
    run_runc(["delete", "--force", cid], runc)
    with open(os.path.join(staging, "config.json"), "w") as f:  # restores take the lock method from the images
        json.dump(config, f, indent=1)
    try:
        os.unlink(os.path.join(staging, "criu.conf"))
    except FileNotFoundError:
        pass
    sizes = {name: os.path.getsize(os.path.join(images, name)) for name in sorted(os.listdir(images))
             if os.path.isfile(os.path.join(images, name))}
    record = {"format": SNAPSHOT_FORMAT, "taken": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "dependencies": dependencies(bundle, meta, runc, shutil.which("criu") or "criu"),
              "images": sizes, "image_bytes": sum(sizes.values()), "snapshot_point_s": round(point_s, 3),
              "checkpoint_s": round(checkpoint_s, 3), "taken_by": taken_by,
              "runtime": {"pid": point.get("pid"), "files": point.get("files", [])}}
    with open(os.path.join(staging, "snapshot.json"), "w") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    if os.path.lexists(snap) and not discard(snap):
        raise RuntimeError(f"{snap} could not be replaced")
    os.replace(staging, snap)
    return record
