"""``edge-coldstart --snapshot``: restores of a bundle's snapshot, timed like fresh starts.

A restore run: the clock starts just before :func:`image.bundle.snapshot.restore` (``runc
restore -d`` from the images beside the bundle, ``snapshot-resume.json``, SIGUSR2) and stops
at the first correct reply on the bundle's socket (``client.embed_and_check``: the same check
against the reference embedding as every other run). Untimed, the restored runtime's timeline
(``"start": "restored"``: stages ``restore``, ``restore_hook``, ``bind``, ``start``; the
snapshot's own boot under ``snapshot``) is read, and the container is stopped and deleted.

The restored runtime's clock starts when the restore did, on the wall clock (CRIU puts it in a
time namespace that carries the checkpoint's boot-time clock on): ``snapshot-resume.json``
says when that was, so its stages are shifted onto our clock exactly.

This host's root may lack CAP_SYS_RESOURCE: runc then cannot give a container an
RLIMIT_NOFILE above the caller's hard limit ("error setting rlimit type 7"). The bundle is
then run through a copy of its config.json with that limit lowered (:func:`runnable_bundle`),
and the snapshot is taken with the same limit (``take_snapshot(nofile=)``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import threading
import time
from pathlib import Path

from bench.coldstart.client import Client, embed_and_check
from bench.coldstart.launch import STOP_TIMEOUT_S, RunFailed, RunResult, now_ns
from bench.coldstart.runtime_runs import _mapped_files, _runtime_result, bundle_contract, prepare_socket_dir

__all__ = ["container_nofile", "runnable_bundle", "ensure_snapshot", "run_restore"]

RUNC_ROOT = Path("/run/runc")  # runc's default --root for root: <root>/<id>/state.json
RESUME = "snapshot-resume.json"  # image.bundle.snapshot.RESUME: when the restore began (wall clock)


# ----------------------------------------------------------------- the open-files limit


def _has_cap_sys_resource() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE = 24
    except (OSError, ValueError):
        pass
    return False


def _config_nofile(config: dict) -> int | None:
    for r in (config.get("process") or {}).get("rlimits") or []:
        if r.get("type") == "RLIMIT_NOFILE":
            return int(r["hard"])
    return None


def container_nofile(bundle: Path, requested: int | None) -> tuple[int | None, str | None]:
    """(the RLIMIT_NOFILE to run the bundle with, or None for its own; why it differs).

    ``requested`` (``--nofile``) lowers it; without it, it is lowered only where runc could not
    grant it: above this process's hard limit, and root without CAP_SYS_RESOURCE."""
    wanted = _config_nofile(json.loads((bundle / "config.json").read_text()))
    if wanted is None:
        return None, None
    if requested is not None:
        return (min(wanted, requested), f"--nofile {requested}") if requested < wanted else (None, None)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or wanted <= hard or _has_cap_sys_resource():
        return None, None
    return hard, (f"the bundle's RLIMIT_NOFILE {wanted} lowered to {hard}: root lacks CAP_SYS_RESOURCE here "
                  f"and cannot raise its own hard limit (runc would fail to set it)")


def runnable_bundle(bundle: Path, workdir: Path, nofile: int | None) -> Path:
    """``bundle``, or with ``nofile`` a directory in ``workdir`` with a copy of its config.json
    (that limit lowered, the bundle's relative paths made absolute) and of its edge-bundle.json;
    the bundle itself is never touched."""
    if nofile is None:
        return bundle
    src = bundle.resolve()
    config = json.loads((src / "config.json").read_text())
    for r in config["process"].get("rlimits") or []:
        if r["type"] == "RLIMIT_NOFILE":
            r["soft"] = r["hard"] = min(r["hard"], nofile)
    config["root"]["path"] = str(src / config["root"]["path"])
    for m in config.get("mounts") or []:
        if m.get("type") == "bind" and not os.path.isabs(m["source"]):
            m["source"] = str(src / m["source"])
    out = workdir / "host-bundle"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    shutil.copyfile(src / "edge-bundle.json", out / "edge-bundle.json")
    return out


# ----------------------------------------------------------------- the snapshot, once


def _snapshot_facts(snap: Path, record: dict) -> dict:
    try:
        nofile = _config_nofile(json.loads((snap / "config.json").read_text()))
    except (OSError, ValueError):
        nofile = None
    return {"dir": str(snap), "image_bytes": record.get("image_bytes"),
            "image_mib": round(record["image_bytes"] / 2**20, 1) if record.get("image_bytes") else None,
            "snapshot_point_s": record.get("snapshot_point_s"), "checkpoint_s": record.get("checkpoint_s"),
            "taken_at": record.get("taken"), "nofile": nofile, "dependencies": record.get("dependencies")}


def ensure_snapshot(bundle: Path, nofile: int | None, *, runc: str = "runc", timeout_s: float = 120.0,
                    say=lambda msg: None) -> dict:
    """A snapshot beside ``bundle`` that can be restored here: the one there when
    ``check_snapshot`` accepts it (and its open-files limit can be granted), else a new one.
    Returns its facts, with ``taken`` (now or not), ``reason`` and ``take_s``."""
    from image.bundle import snapshot as S

    snap = S.snapshot_dir(bundle.resolve())
    why = S.check_snapshot(bundle, runc)
    if why is None:
        try:
            theirs = _config_nofile(json.loads((snap / "config.json").read_text()))
        except (OSError, ValueError) as exc:
            theirs, why = None, f"its config.json is unreadable ({exc})"
        if theirs is not None and nofile is not None and theirs > nofile:
            why = f"it was taken with RLIMIT_NOFILE {theirs}, above the {nofile} the containers get here"
    if why is None:
        facts = _snapshot_facts(snap, json.loads((snap / "snapshot.json").read_text()))
        say(f"snapshot: {snap} can be restored ({facts['image_mib']} MiB, taken {facts['taken_at']}); using it")
        return {**facts, "taken": False, "reason": None, "take_s": None}
    say(f"snapshot: {why}; taking one (runc checkpoint at the snapshot point)...")
    t = time.monotonic()
    try:
        record = S.take_snapshot(bundle, runc=runc, nofile=nofile, timeout_s=timeout_s,
                                 say=lambda msg: say(f"snapshot: {msg}"))
    except S.SnapshotError as exc:
        raise RunFailed(f"taking the snapshot failed: {exc}") from exc
    took = time.monotonic() - t
    say(f"snapshot: taken in {took:.1f} s (snapshot point {record.get('snapshot_point_s')} s, "
        f"checkpoint {record.get('checkpoint_s')} s)")
    return {**_snapshot_facts(snap, record), "taken": True, "reason": why, "take_s": round(took, 3)}


# ----------------------------------------------------------------- one restore run


class _Container:
    """What ``embed_and_check`` watches instead of a child process: a restored container's
    init process (``runc restore -d`` has exited by then). Found through runc's state file, a
    read of a few bytes, not a ``runc state`` exec on the timed path."""

    def __init__(self, cid: str) -> None:
        self.cid = cid
        self.pid: int | None = None
        self.returncode = None

    def poll(self):
        if self.pid is None:
            try:
                self.pid = int(json.loads((RUNC_ROOT / self.cid / "state.json").read_text())["init_process_pid"])
            except (OSError, ValueError, KeyError, TypeError):
                return None  # unknown: the run's deadline still ends the wait
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                stat = f.read()
            if stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X"):
                return None
        except (OSError, ValueError):
            pass
        self.returncode = "the restored container's process ended"
        return self.returncode


def _drain_to(stream, log: Path) -> threading.Thread:
    """Copy the container's output to ``log`` on a thread (a full pipe would stop the runtime)."""
    def copy() -> None:
        with open(log, "ab") as out:
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                out.write(chunk)
                out.flush()

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    return t


def _runc(runc: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([runc, *args], capture_output=True, text=True, timeout=60)


def stop_container(runc: str, cid: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """``runc kill ID TERM``, wait until it has stopped (then KILL), ``runc delete --force``."""
    _runc(runc, "kill", cid, "TERM")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _runc(runc, "state", cid)
        if state.returncode != 0 or '"stopped"' in state.stdout:
            break
        time.sleep(0.05)
    else:
        _runc(runc, "kill", cid, "KILL")
    _runc(runc, "delete", "--force", cid)


def _timeline_file(sockets: Path, deadline_s: float = 2.0) -> dict | None:
    """timeline.json in the socket directory (written just after READY), for a runtime whose
    ``stats`` did not carry one."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            t = json.loads((sockets / "timeline.json").read_text())
            if t.get("start") == "restored":
                return t
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    return None


def run_restore(bundle: Path, workdir: Path, text: str, reference, *, timeout_s: float = 120.0,
                runc: str = "runc") -> RunResult:
    """Restore the bundle's snapshot as container ``edge-coldstart-<pid>-<run>``; restore to
    first correct reply, the restored runtime's timeline on our clock, then stop and delete it."""
    from image.bundle import snapshot as S

    meta = bundle_contract(bundle)
    sockets = Path(meta["socket_dir"])
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "restore.log"
    log.touch()
    cid = f"edge-coldstart-{os.getpid()}-{workdir.name}"
    runc_bin = shutil.which(runc) or runc
    # Untimed: leftovers, and the resume record of another run (never read as this one's start).
    prepare_socket_dir(bundle, meta, snapshot_files=True)
    t0_wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
    t0 = now_ns()
    client = Client(meta["address"])  # connects (and retries every 5 ms) while the restore runs
    try:
        try:
            proc = S.restore(bundle, cid, runc=runc_bin, timeout_s=timeout_s)
        except S.SnapshotError as exc:
            raise RunFailed(f"restore failed: {exc}") from exc
        restored = now_ns()
        _drain_to(proc.stdout, log)
        end, body, cos = embed_and_check(client, _Container(cid), text, reference, t0 + int(timeout_s * 1e9), log)
        # Untimed from here on.
        timeline = client.request("stats", {}).get("timeline") or _timeline_file(sockets)
        offset_ms = 0.0
        try:
            started = json.loads((sockets / RESUME).read_text())["restore_started_realtime_ns"]
            offset_ms = (started - t0_wall) / 1e6  # the restored runtime's origin, on our clock
        except (OSError, ValueError, KeyError, TypeError):
            pass
        state = _runc(runc_bin, "state", cid)
        host_pid = json.loads(state.stdout).get("pid") if state.returncode == 0 else None
        config = json.loads((S.snapshot_dir(bundle.resolve()) / "config.json").read_text())
        root = Path(config["root"]["path"])
        mapped = [str(root / p.lstrip("/")) for p in _mapped_files(host_pid)] if host_pid else []
    finally:
        client.close()
        stop_container(runc_bin, cid)
    result = _runtime_result("restore", end - t0, timeline, body, cos, host_pid, mapped, offset_ms)
    if (timeline or {}).get("start") != "restored":
        raise RunFailed(f"the runtime on {meta['address']} says start {(timeline or {}).get('start')!r}, "
                        f"not 'restored': another runtime answered, or the restore booted fresh")
    result.reply["restore_call_ms"] = round((restored - t0) / 1e6, 3)  # restore(): runc restore -d, resume, USR2
    criu = S.restore_phases(bundle)  # this restore's log: CRIU's own phases
    if criu.get("criu_total_ms") is not None:  # the rest of restore(): runc, its criu version check, the exec
        criu["outside_criu_ms"] = round(result.reply["restore_call_ms"] - criu["criu_total_ms"], 3)
    result.reply["criu"] = criu
    return result
