"""``edge-supervise --stage-snapshot``: the snapshot of a bundle that is not live yet, taken before
an update's switch, so that the first start after it restores (docs/update.md, "Snapshot before
the switch"). ``edge-bundle install`` runs it while the live runtime serves.

The bundle boots to its snapshot point in a staging container of its own (``--id``), which has
no socket directory of the live runtime: a directory of its own, the runtime's user's, is bound
where the live one would be (:func:`staging_socket_dir`: beside the live one, on the same file
system, because CRIU remounts the restored bind with the flags the checkpoint saw, and in the
user namespace it may not change a mount's locked atime flags: "Can't bind remount ...
Operation not permitted" under nspawn with the staging directory on another file system), and
the runtime binds no socket before its snapshot point anyway. The container runs with the least
CPU weight (:data:`STAGING_SHARES`): against its siblings in the cgroup tree (on this host the
live runtime's container, both below the root of the cpu hierarchy) it gets the CPU last. The
rest, this process, runc and CRIU's dump, runs at nice 19 (:data:`STAGING_NICE`); the container
does not (CRIU would record its nice level, and a restored runtime keep it).

Then ``runc checkpoint`` writes the images into the bundle's snapshot directory (``snapshot_dir``:
``/var/cache/edge/<bundle_sha256>/snapshot`` for a slot's bundle), with the config.json a start
restores: the bundle's own socket directory, its own CPU weight. The unit's next start
(edge-supervise, ``_start_restored``) checks it against the same dependencies and restores it.

One JSON line on stdout, event ``supervise.staged``: ``taken`` (true or false), ``reused`` (a
valid snapshot was there already), ``error`` (why not), the seconds of the boot to the snapshot
point and of the checkpoint, the images' bytes. Exit 0 when there is a snapshot, 1 when not.
"""

import json
import os
import shutil
import tempfile
import threading
import time

from edge.supervise.bundle_start import nofile_cap, nofile_differs, runtime_bundle
from edge.supervise.logs import log
from edge.supervise.runc import run_runc
from edge.supervise.snapshot import criu_problem, discard, take_snapshot
from edge.system.snapshot_rules import METADATA, check_snapshot, dependencies, snapshot_dir
from edge.system.socket_dir import prepare_socket_dir

STAGING_SHARES = 2  # cgroup v1 cpu.shares of the staging container, the least (v2: cpu.weight 1); default 1024
# The nice level of this process and what it runs but the container (runc, CRIU's dump, the cleanup):
# they are not in the container's cgroup, and the live runtime's replies go first.
STAGING_NICE = 19


def staging_socket_dir(meta, cid):
    """The staging container's socket directory: ``.<name>.<cid>`` beside the live one (``/run/edge`` ->
    ``/run/.edge.edge-staging``), a directory of its own on the same file system."""
    live = os.path.normpath(meta["socket_dir"])
    return os.path.join(os.path.dirname(live), f".{os.path.basename(live)}.{cid}")


def _result(**fields):
    log("supervise.staged", **fields)
    return 0 if fields.get("taken") else 1


def stage(args):
    """Take the snapshot of ``args.bundle`` in container ``args.id``; 0 when the bundle has one."""
    t0 = time.monotonic()
    os.setpriority(os.PRIO_PROCESS, 0, STAGING_NICE)
    bundle = os.path.abspath(args.bundle)
    with open(os.path.join(bundle, METADATA)) as f:
        meta = json.load(f)
    snap = snapshot_dir(bundle)
    criu = shutil.which("criu")
    why = criu_problem(criu)
    if why is not None:
        return _result(taken=False, error=why, path=snap)
    work = tempfile.mkdtemp(prefix="edge-stage-")
    run_dir = staging_socket_dir(meta, args.id)
    try:
        run_bundle = runtime_bundle(bundle, meta, work, nofile_cap(bundle, args.nofile_limit))
        try:
            stale = (check_snapshot(snap, dependencies(bundle, meta, args.runc, criu))
                     or nofile_differs(snap, run_bundle))
        except OSError as exc:
            stale = f"{exc}"
        if stale is None:
            return _result(taken=True, reused=True, path=snap, seconds=round(time.monotonic() - t0, 3))
        if os.path.lexists(snap):
            discard(snap)
        shutil.rmtree(run_dir, ignore_errors=True)
        prepare_socket_dir(run_dir, meta["user"]["uid"], meta["user"]["gid"])
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        try:
            record = take_snapshot(bundle, run_bundle, meta, args.runc, env, args.id, threading.Event(),
                                   socket_dir=run_dir, cpu_shares=STAGING_SHARES,
                                   taken_by="edge-supervise --stage-snapshot")
        except Exception as exc:  # the install goes on without it: say why
            return _result(taken=False, error=f"{exc}"[-2000:], path=snap, seconds=round(time.monotonic() - t0, 3))
        return _result(taken=True, reused=False, path=snap, seconds=round(time.monotonic() - t0, 3),
                       image_bytes=record["image_bytes"], snapshot_point_s=record["snapshot_point_s"],
                       checkpoint_s=record["checkpoint_s"], cpu_shares=STAGING_SHARES)
    finally:
        run_runc(["delete", "--force", args.id], args.runc)
        shutil.rmtree(snap + ".new", ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
