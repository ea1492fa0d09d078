"""Run the edge bundle under runc for systemd: readiness, liveness, clean stop, snapshot boot.

    edge-supervise --bundle DIR [--id edge] [--runc PATH] [--interval S] [--probe-timeout S] [--snapshot auto|off]
    edge-supervise --cleanup --id edge           (ExecStopPost: runc delete --force)
    edge-supervise --probe ipc:///run/edge/edge.sock    (one health probe; exit 0 when ready)
    edge-supervise --reload PID                  (ExecReload=: the bundle restored beside the old runtime)
    edge-supervise --stage-snapshot --bundle DIR --id ID [--nofile-limit N]
                                                 (edge-bundle install: the snapshot before the switch)

Why a supervisor (docs/bundle.md, "Liveness"): runc relays only the first ``READY=`` datagram
of the container to ``$NOTIFY_SOCKET``, never ``WATCHDOG=1`` or ``STATUS=``, so the
runtime cannot feed systemd's watchdog from inside. This process is the unit's main
process (``Type=notify``, ``NotifyAccess=main``). It gives runc a private notify socket,
passes READY on to systemd once the container sent it, then probes the runtime's
``health`` over the ipc socket from the host every ``--interval`` seconds and sends
``WATCHDOG=1`` only after a probe that answered ``ready``. A hung runtime (socket up,
no answer) stops the pings; systemd's ``WatchdogSec`` then kills the unit and
``Restart=on-failure`` starts it again. If the container exits, so does this process,
with its status. SIGTERM is forwarded with ``runc kill``; the container is deleted.

Snapshot boot (``--snapshot auto``, the default; docs/bundle.md, "Snapshot boot under systemd"):
when the bundle's snapshot directory (``snapshot_dir``: ``/var/cache/edge/<bundle_sha256>/snapshot/``
for a slot's bundle, ``current`` -> ``/opt/edge/slots/<a|b>/bundle``; ``<bundle>.snapshot/`` for
any other) holds a snapshot taken for this bundle at this path, kernel, CRIU, runc and CPU
(``dependencies`` of edge/system/snapshot_rules.py, the rule edge-bundle snapshot applies) with every image
file at its recorded size, the container is restored from it (``runc restore -d``) and resumed
(``snapshot-resume.json``, SIGUSR2). The restored runtime had no ``NOTIFY_SOCKET`` when it was
checkpointed, so its READY is the first health probe that answers ``ready``. Anything else (no
snapshot, a stale or partial one, a failed restore, a restored runtime that exits or is not ready
in time) logs why, removes the snapshot and starts fresh: a snapshot never fails the unit. After
a fresh READY, with no usable snapshot, a second container (``<id>-snapshot``) is run to its
snapshot point and checkpointed in the background, for the next start.

Open files: runc sets the bundle's RLIMIT_NOFILE (``process.rlimits``, 65536) in the container,
and a hard limit above the one runc inherits from us needs CAP_SYS_RESOURCE. Where this process
cannot grant it (tried with setrlimit), the container is started from a runtime copy of config.json
(in the work directory; the bundle stays as signed) with the limit capped at our hard limit, and
``supervise.nofile_capped`` warns, naming ``LimitNOFILE=`` in edge.service: a lower limit, not a
unit that restarts forever on runc's "error setting rlimit type 7".

Host requirements: python3 (stdlib only; no ZeroMQ: the probe speaks ZMTP 3.0 itself,
with JSON frames, which the server answers in JSON) and runc; CRIU >= 4.1 for snapshots.
Installed as one file, ``/usr/local/lib/edge/edge-supervise``: a zipapp of edge/supervise/ and
the few modules of edge/system/ it imports (socket directories, sd_notify, the snapshot rule),
built by ``edge-bundle supervisor --out FILE`` (image/supervisor_zipapp.py); it imports
nothing else of ``edge``, nor ``image`` (pyproject.toml's import contract).
"""

import argparse
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from edge.supervise.bundle_start import nofile_cap, nofile_differs, prepare_host, runtime_bundle
from edge.supervise.logs import log
from edge.supervise.probe import probe
from edge.supervise.handover import Handover, Refused, other_id
from edge.supervise.runc import Detached, container_stopped, run_runc, snapshot_id, stop_container
from edge.supervise.snapshot import NotRestored, SnapshotTaker, discard, restore
from edge.supervise.start_record import StartRecord
from edge.system.notify import notify as sd_notify
from edge.system.snapshot_rules import METADATA, check_snapshot, dependencies, snapshot_dir

READY_TIMEOUT_S = 110.0  # below the unit's TimeoutStartSec (120 s)


def container_ids(base):
    """Every container id the unit may hold: the served one's two (a handover alternates them) and
    the background snapshot's."""
    return (base, other_id(base, base), snapshot_id(base))


def _start_restored(bundle, run_bundle, meta, args, env, stopping, record):
    """The container restored from the bundle's snapshot and ready, as (Detached, Output,
    seconds); None, having logged why and removed a snapshot that was there, to start fresh."""
    snap = snapshot_dir(bundle)
    criu = shutil.which("criu") or "criu"  # the one runc runs: runc looks it up in the PATH we give it
    try:
        why = check_snapshot(snap, dependencies(bundle, meta, args.runc, criu)) or nofile_differs(snap, run_bundle)
    except Exception as exc:  # a snapshot never fails the unit
        why = f"snapshot unreadable: {type(exc).__name__}: {exc}"
    if why is None:
        record.stamp("runc")
        try:
            return restore(snap, meta, args, env, stopping)
        except NotRestored as exc:
            why = f"restore failed: {exc}"
        except Exception as exc:
            why = f"restore failed: {type(exc).__name__}: {exc}"
        run_runc(["delete", "--force", args.id], args.runc)
        sd_notify(f"EXTEND_TIMEOUT_USEC={int((READY_TIMEOUT_S + 5) * 1e6)}")  # the fresh start's own time
    removed = os.path.lexists(snap) and discard(snap)
    log("supervise.start_fresh", reason=why[-2000:], snapshot_removed=removed)
    record.stamp(not_restored=why[-500:])
    return None


def _hand_over(args, meta, cid, proc, output, env, stopping, record, seq):
    """SIGHUP (``systemctl reload``): the bundle ``--bundle`` names now, restored beside the runtime
    that serves, at the address once ready; then the old container stopped (edge/supervise/handover.py).
    Returns (container, output, container id, meta) now served, or None: refused, the old one serves on."""
    record.stamp("handover_requested", handover={"seq": seq, "state": "running"})
    sd_notify("STATUS=reload: restoring the bundle beside the runtime that serves")
    h = Handover(args, meta, cid, env, stopping, record)
    try:
        container, new_output, bundle, new_meta = h.run()
    except Refused as exc:
        log("supervise.handover_refused", reason=str(exc)[-2000:])
        record.stamp(handover={"seq": seq, "state": "failed", "error": str(exc)[-500:]})
        sd_notify(f"STATUS=serving on {meta['address']} (reload refused: {exc})"[:200])
        return None
    finally:
        h.cleanup()
    ended = stop_container(proc, cid, args.runc)  # it drains: every message its connections delivered is answered
    if output is not None:
        output.join(2.0)
    if isinstance(proc, Detached):
        proc.close()
    log("supervise.handover_done", container=h.new_id, stopped=cid, stopped_on_term=ended,
        bundle=os.path.realpath(bundle))
    record.stamp("handover_done", container_id=h.new_id, start="restored",
                 handover={"seq": seq, "state": "done", "container_id": h.new_id, "stopped": cid,
                           "stopped_on_term": ended, "bundle": os.path.realpath(bundle)})
    sd_notify(f"STATUS=serving on {new_meta['address']} (restored beside the old runtime)")
    return container, new_output, h.new_id, new_meta


def _wait(socks, wake_r, timeout):
    """Those of ``socks`` readable within ``timeout`` s; returns early, with none, on a signal."""
    readable = select.select([*socks, wake_r], [], [], timeout)[0]
    if wake_r in readable:
        try:
            os.read(wake_r, 512)
        except BlockingIOError:
            pass
    return readable


def supervise(args):
    bundle = os.path.abspath(args.bundle)
    with open(os.path.join(bundle, METADATA)) as f:
        meta = json.load(f)
    address = meta["address"]
    record = StartRecord(os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0], container_id=args.id,
                         bundle=bundle, address=address)
    record.stamp("supervisor")
    prepare_host(meta)
    for leftover in container_ids(args.id):  # containers left by a crash or power loss
        run_runc(["delete", "--force", leftover], args.runc)
    cid = args.id  # the container served; a handover alternates it with other_id()
    work = tempfile.mkdtemp(prefix="edge-supervise-", dir=os.environ.get("RUNTIME_DIRECTORY"))
    relay = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    relay.bind(os.path.join(work, "notify.sock"))
    run_bundle = runtime_bundle(bundle, meta, work, nofile_cap(bundle))  # a copy where it must differ
    # No NOTIFY_SOCKET for -d: runc would wait for a READY that a restored runtime never sends, and
    # hang, deaf to SIGTERM, should the container die first.
    detached_env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(time.monotonic()))
    handovers = []  # SIGHUP: ExecReload's edge-supervise --reload (edge/supervise/handover.py)
    signal.signal(signal.SIGHUP, lambda *_: handovers.append(time.monotonic()))
    handover_seq = 0
    # A signal also writes a byte here, which ends the waits below at once: a stop (a restart) begins
    # within milliseconds, not after the rest of a 0.2-0.5 s sleep (edge-coldstart --unit's "stop" phase).
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    watchdog_usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
    interval = args.interval or (watchdog_usec / 2e6 if watchdog_usec else 10.0)
    proc = output = taker = None
    restored, ended_on_term, died_before_ready = False, False, False
    t0, ready_at, next_probe, failures = time.monotonic(), None, 0.0, 0
    try:
        if args.snapshot == "auto":
            started = _start_restored(bundle, run_bundle, meta, args, detached_env, stopping, record)
            if started is not None:
                proc, output, seconds = started
                restored = True
                if seconds is not None:
                    ready_at = time.monotonic()
                    record.stamp("ready", start="restored", snapshot="none")
                    log("supervise.ready", seconds=round(seconds, 3), address=address, start="restored")
                    sd_notify("READY=1", f"STATUS=serving on {address} (restored from snapshot)")
        if proc is None and not stopping:
            t0 = time.monotonic()
            record.stamp("runc", start="fresh")
            proc = subprocess.Popen([args.runc, "run", "--bundle", run_bundle, args.id],
                                    env={**detached_env, "NOTIFY_SOCKET": os.path.join(work, "notify.sock")},
                                    stdin=subprocess.DEVNULL)
        while proc is not None and proc.poll() is None and not stopping:
            if ready_at is None:
                if relay not in _wait([relay], wake_r, 0.5):
                    if stopping:
                        continue
                    if time.monotonic() - t0 > READY_TIMEOUT_S:
                        log("supervise.ready_timeout", seconds=READY_TIMEOUT_S)
                        break
                    if container_stopped(cid, args.runc):
                        died_before_ready = True
                        log("supervise.died_before_ready", seconds=round(time.monotonic() - t0, 3))
                        break
                    continue
                fields = relay.recv(4096).split(b"\n")
                if b"READY=1" in fields:
                    ready_at = time.monotonic()
                    log("supervise.ready", seconds=round(ready_at - t0, 3), address=address, start="fresh")
                    sd_notify("READY=1", f"STATUS=serving on {address}")
                    record.stamp("ready", snapshot="taking" if args.snapshot == "auto" else "off")
                    if args.snapshot == "auto":  # none usable, or we would have restored it
                        taker = SnapshotTaker(bundle, run_bundle, meta, args, detached_env, record)
                        taker.start()
                continue
            _wait([], wake_r, 0.2)
            if handovers and not stopping:
                handovers.clear()
                handover_seq += 1
                if taker is not None and taker.is_alive():  # the old bundle's snapshot: of no use now
                    taker.abort()
                    taker.join(30.0)
                served = _hand_over(args, meta, cid, proc, output, detached_env, stopping, record, handover_seq)
                if served is not None:
                    proc, output, cid, meta = served
                    address, restored, ended_on_term = meta["address"], True, False
                    next_probe = 0.0
                continue
            if stopping or time.monotonic() < next_probe:
                continue
            next_probe = time.monotonic() + interval
            ok, detail = probe(address, args.probe_timeout)
            if ok:
                failures = 0
                sd_notify("WATCHDOG=1", f"STATUS=healthy on {address}" + (" (restored)" if restored else ""))
            else:
                failures += 1  # no WATCHDOG=1: systemd restarts the unit after WatchdogSec
                log("supervise.probe_failed", failures=failures, detail=detail)
                sd_notify(f"STATUS=health probe failed {failures}x: {detail}"[:200])
    finally:
        if taker is not None and taker.is_alive():
            taker.abort()
        if died_before_ready and proc.poll() is None:
            proc.kill()  # runc run, still waiting for a READY that will not come (see _container_stopped)
            proc.wait()
        if proc is not None and proc.poll() is None:
            sd_notify("STOPPING=1", "STATUS=stopping")
            ended_on_term = stop_container(proc, cid, args.runc)
        else:
            run_runc(["delete", "--force", cid], args.runc)
        if output is not None:
            output.join(2.0)  # the runtime's last lines (shutdown.done)
        if restored:
            proc.close()
        if taker is not None:
            taker.join(30.0)
        relay.close()
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)
        shutil.rmtree(work, ignore_errors=True)
    if proc is None:  # stopped while a restore was tried
        log("supervise.exit", container_status=None, stopped=bool(stopping))
        return 0
    if died_before_ready:
        log("supervise.exit", container_status=None, stopped=False, start="fresh", died_before_ready=True)
        return 1
    # A restored container is not our child: its status is 0 when it ended after our TERM.
    code = (0 if ended_on_term else 1) if restored else proc.returncode
    log("supervise.exit", container_status=code, stopped=bool(stopping), start="restored" if restored else "fresh")
    if ready_at is None and not stopping:
        return code or 1
    if restored and not stopping:
        return 1  # it ended by itself: a failure (Restart=on-failure)
    return 0 if stopping and code in (0, -signal.SIGTERM, 143) else (code or 0)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="edge-supervise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", help="bundle directory (config.json, rootfs/, edge-bundle.json)")
    ap.add_argument("--id", default="edge", help="container id")
    ap.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    ap.add_argument("--interval", type=float, default=None, help="seconds between probes (default WatchdogSec/2)")
    ap.add_argument("--probe-timeout", type=float, default=3.0)
    ap.add_argument("--snapshot", choices=("auto", "off"), default="auto",
                    help="auto: start from the bundle's snapshot (/var/cache/edge/<bundle_sha256>/snapshot for a "
                         "slot's bundle, else <bundle>.snapshot) when it matches, and take one after a fresh READY "
                         "(needs CRIU >= 4.1); off: always start fresh, take none (default auto)")
    ap.add_argument("--cleanup", action="store_true", help="only runc delete --force the container")
    ap.add_argument("--probe", metavar="ADDRESS", help="probe once and exit 0 when ready")
    ap.add_argument("--reload", type=int, metavar="PID",
                    help="ExecReload=: have the supervisor PID restore --bundle's current target beside the runtime "
                         "that serves and switch the socket to it (SIGHUP); exit 0 once the new runtime serves, 1 "
                         "when it did not happen (the old one serves on; the reason is in the journal)")
    ap.add_argument("--stage-snapshot", action="store_true",
                    help="boot --bundle to its snapshot point in a staging container (--id; its own socket "
                         "directory, the least CPU weight) and checkpoint it into the bundle's snapshot directory, "
                         "for its first start (edge-bundle install, before the switch); exit 0 when it has one")
    ap.add_argument("--nofile-limit", type=int, default=None, metavar="N",
                    help="--stage-snapshot: the hard RLIMIT_NOFILE of the unit that will start the bundle "
                         "(its LimitNOFILE=), when it is not this process's")
    args = ap.parse_args(argv)
    if args.probe:
        ok, detail = probe(args.probe, args.probe_timeout)
        print(json.dumps({"ready": ok, "detail": detail}))
        return 0 if ok else 1
    if args.cleanup:
        for cid in container_ids(args.id):
            run_runc(["delete", "--force", cid], args.runc)
        return 0
    if args.reload:
        from edge.supervise.handover import reload

        return reload(args.reload, os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0])
    if not args.bundle:
        ap.error("--bundle is required")
    if args.stage_snapshot:
        from edge.supervise.staging import stage

        return stage(args)
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
