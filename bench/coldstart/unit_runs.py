"""``edge-coldstart --unit NAME``: the installed service, timed as the device really starts it.

The path a device's users feel is not a bare process: systemd runs the unit's ``ExecStartPre``
(``edge-trial pre-start``), then its main process ``edge-supervise``, which prepares the socket
directory and runs ``runc run`` (or ``runc restore`` from a snapshot), and runc execs the runtime.
A run here is ``systemctl restart --no-block UNIT``: the clock starts just before that request
and stops at the first correct reply on the service's socket (the same client and check as
every other mode, ``client.embed_and_check``). The client connects only once the unit's old main
process is gone, so the old runtime can never be the one that answers.

Untimed, after the reply, the run is split into phases from four independent sources, all put
on our CLOCK_BOOTTIME origin:

    stop                    request -> the old instance is stopped    systemd (InactiveEnterTimestamp)
    systemd_to_supervisor   activation -> edge-supervise's fork       systemd (InactiveExit, ExecMainStart)
                            (ExecStartPre, i.e. the trial's hook, is in here)
    supervisor_to_runc      -> just before runc run / runc restore    edge-supervise's start.json
    runc_to_exec            -> the runtime's origin                   the container's /proc start time
                                                                      (restored: snapshot-resume.json)
    runtime_boot            -> READY                                  the runtime's own timeline
    ready_to_reply          -> our first correct reply                our clock

They are measured, not derived from each other, so their sum need not equal the total: the
record gives the sum and what it leaves unaccounted (systemd's own gap between stopping and
starting, clock steps), and the summary the largest share of any run.

systemd's timestamps are CLOCK_MONOTONIC; the offset to CLOCK_BOOTTIME is read once per run
(they differ only by time spent suspended).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.coldstart.client import Client, embed_and_check
from bench.coldstart.launch import RunFailed, RunResult, log_tail, now_ns
from bench.coldstart.runtime_runs import _mapped_files, _runtime_result, _starttime_boot_s, bundle_contract

__all__ = ["UNIT_PHASES", "UnitRefused", "UnitTarget", "bundle_mount_sources", "bundle_package_manifest", "check_unit",
           "ensure_started", "refuse_on_trial", "run_unit", "stop_unit", "unit_summary", "wait_snapshot"]

UNIT_PHASES = ("stop", "systemd_to_supervisor", "supervisor_to_runc", "runc_to_exec", "runtime_boot",
               "ready_to_reply")
START_RECORD = "start.json"  # edge-supervise's StartRecord (edge/supervise/start_record.py), in the unit's RuntimeDirectory
RESUME = "snapshot-resume.json"  # edge-supervise writes it in the socket directory before it resumes a restore
PACKAGE_MANIFEST = "opt/edge/package/manifest.json"  # image/build_bundle.py PACKAGE_PATH, under the rootfs
_SHOW = ("LoadState", "ActiveState", "SubState", "MainPID", "FragmentPath", "RuntimeDirectory", "StatusText",
         "InactiveEnterTimestampMonotonic", "InactiveExitTimestampMonotonic", "ExecMainStartTimestampMonotonic",
         "ActiveEnterTimestampMonotonic", "NRestarts", "InvocationID")
WATCH_EVERY_S = 0.5  # how often the wait for the reply asks systemd whether the unit failed
SNAPSHOT_WAIT_S = 240.0  # a background snapshot (boot to the snapshot point + checkpoint) ends within this


def bundle_mount_sources(bundle: Path) -> list[Path]:
    try:
        cfg = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError):
        return []
    out = []
    for m in cfg.get("mounts") or []:
        src = m.get("source") or ""
        if "bind" in (m.get("options") or []) or m.get("type") == "bind":
            p = Path(src) if os.path.isabs(src) else bundle / src
            if p.exists() and not str(p).startswith(("/proc", "/sys", "/dev", "/run", "/tmp")):
                out.append(p)
    return out


def bundle_package_manifest(bundle: Path) -> Path:
    """The manifest of the package a bundle carries (under its rootfs)."""
    try:
        root = json.loads((bundle / "config.json").read_text()).get("root", {}).get("path") or "rootfs"
    except (OSError, ValueError):
        root = "rootfs"
    return bundle / root / PACKAGE_MANIFEST


class UnitRefused(Exception):
    """--unit cannot run here; the message says why and which mode to use instead."""


def unit_name(name: str) -> str:
    return name if "." in name else f"{name}.service"


def systemctl_show(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", ",".join(_SHOW)], capture_output=True, text=True,
                         timeout=30)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def _pid1() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip()
    except OSError:
        return "?"


def check_unit(name: str) -> str:
    """The unit's full name when it can be timed here; else :class:`UnitRefused`, saying which
    mode measures what there is instead."""
    unit = unit_name(name)
    instead = ("time the bundle under runc with --bundle DIR (e.g. --bundle /opt/edge/bundle/current), "
               "or the runtime as a plain process with --package DIR")
    if os.geteuid() != 0:
        raise UnitRefused(f"--unit restarts {unit} with systemctl, which needs root: run as root (sudo)")
    if _pid1() != "systemd" or not Path("/run/systemd/system").is_dir() or shutil.which("systemctl") is None:
        raise UnitRefused(f"systemd is not PID 1 here (PID 1 is {_pid1()!r}), so there is no service to restart; "
                          f"{instead}")
    show = systemctl_show(unit)
    if show.get("LoadState") != "loaded":
        raise UnitRefused(f"{unit} is not installed (LoadState={show.get('LoadState') or '?'}): install the unit "
                          f"(docs/bundle.md, \"Install\"; docs/field.md), or {instead}")
    return unit


def refuse_on_trial(root: Path = Path("/")) -> None:
    """An update on trial (docs/update.md) counts each start of the unit as one of its tries, and
    the start that finds none left rolls it back: a benchmark of restarts must not be that."""
    from edge.update.install.layout import DeviceLayout
    from edge.update.install.status import status

    try:
        report = status(DeviceLayout(root))
    except Exception:  # noqa: BLE001 - no installer state (a unit set up by hand): nothing on trial
        return
    trial = report.get("trial") or {}
    if trial.get("status") == "on_trial" and trial.get("slot") == report.get("live"):
        raise UnitRefused(f"the live bundle (slot {report['live']}) is on trial with {trial.get('tries_left')} "
                          f"start(s) left, and each restart takes one (the last rolls it back): wait until "
                          f"`edge-bundle status` says committed (exit 0), then run this again")


@dataclass
class UnitTarget:
    """What the unit runs, read from its main process's command line: edge-supervise's
    ``--bundle`` and ``--id``, and the bundle's contract (address, socket directory)."""

    unit: str
    supervisor: Path  # the edge-supervise script
    bundle: Path  # as the unit names it (``/opt/edge/bundle/current``)
    container_id: str
    meta: dict

    @classmethod
    def of_running(cls, unit: str) -> "UnitTarget":
        pid = int(systemctl_show(unit).get("MainPID") or 0)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0") if pid else []
        except OSError:
            argv = []
        opts = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        if "--bundle" not in opts:
            raise RunFailed(f"{unit}'s main process (pid {pid}) is not edge-supervise --bundle DIR: {' '.join(argv)}")
        script = next((a for a in argv if a.endswith("edge-supervise")), argv[0])
        bundle = Path(opts["--bundle"])
        return cls(unit, Path(script), bundle, opts.get("--id", "edge"), bundle_contract(bundle))

    def evict_trees(self) -> dict[str, Path]:
        """What a cold start reads: the bundle (its real directory), the snapshot's images, the supervisor."""
        from image.bundle.snapshot import snapshot_dir

        out = {"bundle": self.bundle.resolve(), "supervisor": self.supervisor}
        snap = Path(snapshot_dir(self.bundle))
        if snap.is_dir():
            out["snapshot"] = snap
        return out


def ensure_started(unit: str, say) -> None:
    """Start the unit (untimed) when it is not running, so its main process says what it runs."""
    show = systemctl_show(unit)
    if int(show.get("MainPID") or 0):
        return
    say(f"{unit} is {show.get('ActiveState')}: starting it (untimed)...")
    r = subprocess.run(["systemctl", "start", unit], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        tail = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-n", "30", "-u", unit], capture_output=True,
                              text=True).stdout
        raise RunFailed(f"systemctl start {unit} failed: {r.stderr.strip()}\n{tail}")


def stop_unit(unit: str) -> None:
    """``systemctl stop``, untimed: a cold-cache run starts a stopped unit (pages a live runtime
    maps cannot be evicted)."""
    r = subprocess.run(["systemctl", "stop", unit], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RunFailed(f"systemctl stop {unit} failed: {r.stderr.strip()}")


def _boottime_minus_monotonic_ns() -> int:
    """CLOCK_BOOTTIME - CLOCK_MONOTONIC (the time spent suspended), read tightly."""
    best = None
    for _ in range(3):
        a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        b = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        c = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or c - a < best[0]:
            best = (c - a, b - (a + c) // 2)
    return best[1]


class _UnitWatch:
    """``poll()`` as a Popen's, for ``embed_and_check``: non-None once the unit has failed (its
    start limit hit, or it gave up), so a run does not wait out its timeout for a dead service."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.returncode = None
        self._next = time.monotonic() + WATCH_EVERY_S

    def poll(self):
        if self.returncode is None and time.monotonic() >= self._next:
            self._next = time.monotonic() + WATCH_EVERY_S
            state = subprocess.run(["systemctl", "is-failed", self.unit], capture_output=True, text=True).stdout
            if state.strip() == "failed":
                self.returncode = 1
        return self.returncode


def _journal_tail(unit: str, since_ns_wall: int) -> Path:
    """The unit's journal since the run began, for a failed run's message."""
    out = Path(f"/tmp/edge-coldstart-unit-{os.getpid()}.log")
    text = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit,
                           f"--since=@{since_ns_wall / 1e9:.6f}"], capture_output=True, text=True).stdout
    out.write_text(text[-6000:])
    return out


def _start_record(show: dict, wait_s: float = 10.0) -> dict:
    """edge-supervise's start.json of the current main process, once it says READY was passed on."""
    path = Path("/run") / (show.get("RuntimeDirectory") or "edge-supervise").split()[0] / START_RECORD
    deadline = time.monotonic() + wait_s
    record: dict = {}
    while time.monotonic() < deadline:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("pid") == int(show.get("MainPID") or -1) and "ready" in record.get("boottime_ns", {}):
            return record
        time.sleep(0.02)
    raise RunFailed(f"no start record of pid {show.get('MainPID')} at {path} within {wait_s:g} s (is the unit's "
                    f"edge-supervise older than this benchmark? install it again: edge-bundle supervisor --out /usr/local/lib/edge/edge-supervise): {record}")


def wait_snapshot(target: UnitTarget, timeout_s: float = SNAPSHOT_WAIT_S) -> dict:
    """Untimed: let a snapshot that edge-supervise takes after a fresh READY end before the next
    restart (which would abort it and load the machine while it is timed)."""
    show = systemctl_show(target.unit)
    t0 = time.monotonic()
    record = _start_record(show)
    while record.get("snapshot") == "taking" and time.monotonic() - t0 < timeout_s:
        time.sleep(0.2)
        record = _start_record(show)
    return {"snapshot": record.get("snapshot"), "waited_s": round(time.monotonic() - t0, 3),
            **({"snapshot_error": record["snapshot_error"]} if record.get("snapshot_error") else {})}


def run_unit(target: UnitTarget, workdir: Path, text: str, reference, *, timeout_s: float = 120.0) -> RunResult:
    """One ``systemctl restart`` of the unit, request to first correct reply, split into phases."""
    unit = target.unit
    workdir.mkdir(parents=True, exist_ok=True)
    old_pid = int(systemctl_show(unit).get("MainPID") or 0)
    # A benchmark's restarts are deliberate: flush the unit's start-rate counter, or the sixth
    # restart within StartLimitIntervalSec would hit StartLimitBurst and fail the unit.
    subprocess.run(["systemctl", "reset-failed", unit], capture_output=True)
    mono_to_boot = _boottime_minus_monotonic_ns()
    t0_wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
    t0 = now_ns()
    r = subprocess.run(["systemctl", "restart", "--no-block", unit], capture_output=True, text=True)
    queued = now_ns()  # the restart job is queued: systemctl itself costs a few ms of the total
    if r.returncode != 0:
        raise RunFailed(f"systemctl restart {unit} failed: {r.stderr.strip()}")
    deadline = t0 + int(timeout_s * 1e9)
    while old_pid and os.path.exists(f"/proc/{old_pid}"):  # the old runtime must not answer for the new one
        if now_ns() > deadline:
            raise RunFailed(f"{unit}'s old main process {old_pid} did not stop within {timeout_s:g} s")
        time.sleep(0.001)
    client = Client(target.meta["address"])
    log = workdir / "unit.log"
    log.touch()
    try:
        try:
            end, body, cos = embed_and_check(client, _UnitWatch(unit), text, reference, deadline, log)
        except RunFailed as exc:
            raise RunFailed(f"{exc}\n{log_tail(_journal_tail(unit, t0_wall))}") from None
        # Untimed from here on.
        timeline = client.request("stats", {}).get("timeline") or {}
    finally:
        client.close()
    show = systemctl_show(unit)
    record = _start_record(show)
    state = subprocess.run(["runc", "state", target.container_id], capture_output=True, text=True)
    host_pid = json.loads(state.stdout).get("pid") if state.returncode == 0 else None
    start = timeline.get("start") or record.get("start") or "fresh"
    origin_ms = _origin_ms(start, host_pid, target, t0, t0_wall)
    mapped = []
    if host_pid:
        root = target.bundle / (json.loads((target.bundle / "config.json").read_text()).get("root", {}).get("path")
                                or "rootfs")
        mapped = [str(root / p.lstrip("/")) for p in _mapped_files(host_pid)]
    result = _runtime_result("unit", end - t0, timeline, body, cos, host_pid, mapped, origin_ms)
    on_ours = lambda ns: round((ns - t0) / 1e6, 3)  # noqa: E731 - a boottime instant on our clock (ms)
    mono = lambda key: on_ours(int(show[key]) * 1000 + mono_to_boot) if int(show.get(key) or 0) else None  # noqa: E731
    stopped, activating, supervisor = mono("InactiveEnterTimestampMonotonic"), \
        mono("InactiveExitTimestampMonotonic"), mono("ExecMainStartTimestampMonotonic")
    runc_at = on_ours(record["boottime_ns"]["runc"])
    ready = origin_ms + (timeline.get("exec_to_ready_ms") or 0.0)
    phases = {
        "stop": [0.0, stopped] if old_pid and stopped is not None and stopped > 0 else None,
        "systemd_to_supervisor": [max(activating or 0.0, 0.0), supervisor],
        "supervisor_to_runc": [supervisor, runc_at],
        "runc_to_exec": [runc_at, round(origin_ms, 3)],
        "runtime_boot": [round(origin_ms, 3), round(ready, 3)],
    }
    result.phases.update({k: v for k, v in phases.items() if v})
    top = [result.phases[k] for k in UNIT_PHASES if result.phases.get(k)]
    phase_sum = sum(b - a for a, b in top)
    result.reply.update(start=start, main_pid=int(show.get("MainPID") or 0), old_main_pid=old_pid or None,
                        status_text=show.get("StatusText"), phase_sum_ms=round(phase_sum, 3),
                        unaccounted_ms=round(result.total_ms - phase_sum, 3),
                        restart_call_ms=round((queued - t0) / 1e6, 3), not_restored=record.get("not_restored"))
    result.reply["snapshot_after"] = wait_snapshot(target)  # untimed: the next run starts on a quiet machine
    return result


def _origin_ms(start: str, host_pid: int | None, target: UnitTarget, t0: int, t0_wall: int) -> float:
    """The runtime's timeline origin on our clock: its container's process start (what the runtime
    itself reads from /proc/self/stat, in 10 ms ticks), or after a restore the restore's start
    (snapshot-resume.json, wall clock: CRIU's time namespace carries the checkpoint's clock)."""
    if start == "restored":
        try:
            resume = json.loads((Path(target.meta["socket_dir"]) / RESUME).read_text())
            return (int(resume["restore_started_realtime_ns"]) - t0_wall) / 1e6
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunFailed(f"restored, but {RESUME} in {target.meta['socket_dir']} is unreadable: {exc}") from None
    start_s = _starttime_boot_s(host_pid) if host_pid else None
    if start_s is None:
        raise RunFailed(f"the container {target.container_id} has no process to read its start from")
    return start_s * 1000.0 - t0 / 1e6


def unit_summary(pairs: list[dict]) -> dict:
    """--unit's own figures: which start path ran, the phases' medians, how well they add up."""
    from bench.coldstart.report import phase_durations, stats

    runs = [p["runtime"] for p in pairs if p.get("runtime")]
    starts: dict[str, int] = {}
    for r in runs:
        starts[r["reply"].get("start", "?")] = starts.get(r["reply"].get("start", "?"), 0) + 1
    shares = [abs(r["reply"]["unaccounted_ms"]) / r["total_ms"] for r in runs if r["total_ms"]]
    durations = [phase_durations(r) for r in runs]
    return {"start_paths": starts,
            "phase_medians_ms": {k: stats([d.get(k) for d in durations if k in d])["median"] for k in UNIT_PHASES},
            "phase_sum_median_ms": stats([r["reply"]["phase_sum_ms"] for r in runs])["median"],
            "unaccounted_max_share": round(max(shares), 4) if shares else None}
