"""A device under a real systemd for the trial's tests (docs/update.md).

``systemd-nspawn`` boots systemd 252 as PID 1 with the host's /usr and a throwaway root (the
command and its traps: tests/support/nspawn.py). The device's persistent
directories, /etc/edge, /opt/edge, /var/lib/edge and /var/cache/edge, are host directories bound
in, so they outlive a boot. A ``kill_when`` of :meth:`Machine.boot` cuts the power
(``support.nspawn.power_cut``: the machine's PID 1 and nspawn killed): every process
dies at once, mid-write (the page cache survives it, since the host kernel keeps running, so a
cut here loses no written data, unlike a real one; fsync's order is what docs/archive.md argues).

The units are the project's own (systemd/edge.service, edge-trial.service,
edge-trial-failed.service), renamed after the test (nspawn shares the host's cgroup tree, so
two runs must not both create system.slice/edge.service) and pointed at this checkout's
edge-supervise and edge-trial. A boot runs one scenario: a Python script executed by
probe.service with this venv's python, which writes /out/result.json and powers off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from image.bundle.digest import ENV_NAME, bundle_digest
from image.bundle.oci_config import STATE_DIR
from support.bundles import REPO, host_nofile
from support.nspawn import UNITS, boot_to_poweroff, nspawn_command, nspawn_or_skip
from support.supervisor import supervisor_file

__all__ = ["Machine", "variant_bundle", "nspawn_or_skip", "slow_boot", "fresh_budget_s", "CRASH"]

# What the scenarios import (``from trial_probe import *``): the probe unit's PYTHONPATH is its directory
# alone, so nothing else of tests/ is importable in the machine (tests/image, tests/bench there would
# shadow the image and bench packages that edge-bundle and edge-coldstart import).
PROBE = REPO / "tests" / "install" / "trial_probe.py"


def variant_bundle(src: Path, out: Path, *, socket_dir: str, tag: str, wrap: list[str] | None = None,
                   criu_in_nspawn: bool = False) -> Path:
    """A bundle of its own made from ``src`` (its rootfs hard-linked, nothing copied): config.json
    with the open-files limit this host can grant, the socket directory ``socket_dir`` (a path in
    the machine's /run), ``EDGE_TEST_VARIANT=tag`` in the environment (two variants, two digests),
    and the runtime's argv behind ``wrap`` (a command that ends by exec'ing ``sys.argv[1:]``, or
    fails); the digest recomputed, so the packer accepts it. ``criu_in_nspawn``: no cgroup
    namespace and no /sys/fs/cgroup mount, which CRIU cannot follow in this sandbox's nested
    cgroups (tests/bundle/test_bundle_snapshot_supervise.py, the nspawn test, says how it was found)."""
    out.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(src / "rootfs"), str(out / "rootfs")], check=True)
    for name in os.listdir(src):
        if name not in ("rootfs", "config.json", "edge-bundle.json"):
            (shutil.copytree if (src / name).is_dir() else shutil.copyfile)(src / name, out / name)
    config = json.loads((src / "config.json").read_text())
    proc = config["process"]
    for r in proc["rlimits"]:
        if r["type"] == "RLIMIT_NOFILE":
            r["hard"] = r["soft"] = host_nofile(r["hard"])
    for m in config["mounts"]:
        if m["destination"] == "/run/edge":
            m["source"] = socket_dir
        elif m["destination"] == STATE_DIR:  # the machine's own (its /var/lib/edge is bound in)
            m["source"] = STATE_DIR
    if wrap:
        proc["args"] = [proc["args"][0], *wrap, *proc["args"]]
    if criu_in_nspawn:
        config["linux"]["namespaces"] = [ns for ns in config["linux"]["namespaces"] if ns["type"] != "cgroup"]
        config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/sys/fs/cgroup"]
    proc["env"] = [f"EDGE_BUNDLE_SOCKET_DIR={socket_dir}" if e.startswith("EDGE_BUNDLE_SOCKET_DIR=") else e
                   for e in proc["env"] if not e.startswith(f"{ENV_NAME}=")] + [f"EDGE_TEST_VARIANT={tag}"]
    digest = bundle_digest(out / "rootfs", config)
    proc["env"].append(f"{ENV_NAME}={digest}")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    meta = json.loads((src / "edge-bundle.json").read_text())
    meta.update(bundle_sha256=digest, socket_dir=socket_dir, address=f"ipc://{socket_dir}/edge.sock", state_dir=STATE_DIR)
    (out / "edge-bundle.json").write_text(json.dumps(meta, indent=2))
    return out


# A runtime that boots late (the boot budget check fails) and one that never boots.
def slow_boot(seconds: float) -> list[str]:
    """A wrap that sleeps ``seconds`` before the runtime's exec: its exec_to_ready counts them (one process)."""
    return ["-c", f"import os, sys, time; time.sleep({seconds:.3f}); os.execv(sys.argv[1], sys.argv[1:])"]


def fresh_budget_s(bundle: Path) -> float:
    """The fresh start's budget (s) of ``bundle``'s engine, from its package's manifest (image/fresh_boot.py):
    a start where no snapshot can be taken, as in these machines (EDGE_SNAPSHOT=off), is held to it."""
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    manifest = json.loads((bundle / "rootfs/opt/edge/package/manifest.json").read_text())
    return manifest["selftest"]["fresh_boot_budget_ms"][meta["engine"]] / 1000.0


CRASH = ["-c", "import sys; print('edge test: this runtime fails at once', file=sys.stderr); sys.exit(3)"]


class Machine:
    """One device: its root on the host (``root``: etc/edge, opt/edge, var/lib/edge, var/cache/edge),
    the renamed units, and boots of it."""

    def __init__(self, workdir: Path, public_key: Path, *, archives: Path, sustain_s: float = 3.0,
                 interval_s: float = 0.5, start_limit_burst: int | None = None, snapshots: bool = False,
                 criu: bool = True) -> None:
        self.nspawn = nspawn_or_skip()
        self.unit = f"edge-t{uuid.uuid4().hex[:8]}"
        self.work = workdir
        self.root = workdir / "root"
        self.nsp = workdir / "nsp"
        self.out = workdir / "out"
        for d in ("etc/edge/keys", "opt/edge", "var/lib/edge", "var/cache/edge", "etc/default"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "etc/edge/keys/edge-signing.pub").write_bytes(public_key.read_bytes())
        self.nsp.mkdir()
        self.out.mkdir()
        self.archives = archives  # /archives in the machine, read-only
        self.boots = 0
        # Snapshots: the unit's EDGE_SNAPSHOT=auto, and CRIU able to work in the machine (see command()).
        self.snapshots = snapshots
        self.criu = criu  # False: the CRIU 4.1 of image/criu/build.sh hidden, leaving Debian's 3.17 (a device without one)
        self._write_units(sustain_s, interval_s, start_limit_burst)

    def _write_units(self, sustain_s: float, interval_s: float, burst: int | None) -> None:
        trial = str(Path(sys.executable).with_name("edge-trial"))
        shutil.copyfile(supervisor_file(), self.nsp / "edge-supervise")
        renames = {"edge-trial-failed.service": f"{self.unit}-trial-failed.service",
                   "edge-trial.service": f"{self.unit}-trial.service"}
        units = {}
        for name in ("edge.service", "edge-trial.service", "edge-trial-failed.service"):
            text = (REPO / "systemd" / name).read_text()
            for old, new in renames.items():
                text = text.replace(old, new)
            text = text.replace("/usr/local/lib/edge/edge-supervise", "/nsp/edge-supervise")
            text = text.replace("/usr/local/bin/edge-trial", trial)
            text = text.replace("EDGE_CONTAINER_ID=edge ", f"EDGE_CONTAINER_ID={self.unit} ")
            if not self.snapshots:
                text = text.replace("EDGE_SNAPSHOT=auto", "EDGE_SNAPSHOT=off")  # no CRIU work in these tests
            text = re.sub(r"--unit edge\b", f"--unit {self.unit}", text)
            text = text.replace("edge.service", f"{self.unit}.service")
            units[name.replace("edge", self.unit, 1)] = text
        for name, text in units.items():
            (self.nsp / name).write_text(text)
        dropins = self.nsp / "dropins"
        dropins.mkdir()
        (dropins / "limits.conf").symlink_to("/opt/edge/bundle/current/edge.service.d/limits.conf")
        if burst is not None:
            (dropins / "test.conf").write_text(f"[Unit]\nStartLimitBurst={burst}\n")
        (self.root / "etc/default/edge").write_text(
            f"EDGE_TRIAL_SUSTAIN={sustain_s}\nEDGE_TRIAL_INTERVAL={interval_s}\n")
        self.unit_names = list(units)

    def command(self, scenario: Path) -> list[str]:
        binds = [f"--bind={self.root / d}:/{d}" for d in ("etc/edge", "opt/edge", "var/lib/edge", "var/cache/edge")]
        binds += [f"--bind-ro={self.root / 'etc/default/edge'}:/etc/default/edge", f"--bind-ro={REPO}:{REPO}",
                  f"--bind-ro={self.archives}:/archives"]
        for prefix in {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}:  # the venv, its python
            if not prefix.startswith((str(REPO), "/usr/")):
                binds.append(f"--bind-ro={prefix}:{prefix}")
        binds += [f"--bind-ro={self.nsp / n}:{UNITS}/{n}" for n in self.unit_names]
        binds.append(f"--bind-ro={self.nsp / 'dropins'}:{UNITS}/{self.unit}.service.d")
        if self.snapshots:  # CRIU in the machine: runc leaves cgroups to itself (see criu_in_nspawn), iptables
            (self.nsp / "runc.conf").write_text("manage-cgroups=ignore\n")
            binds += [f"--bind-ro={self.nsp / 'runc.conf'}:/etc/criu/runc.conf", "--bind-ro=/etc/alternatives"]
        if not self.criu:
            binds += [f"--bind-ro=/dev/null:{path}" for path in ("/usr/local/sbin/criu", "/usr/local/bin/criu")
                      if os.path.exists(path)]
        probe = self.nsp / "probe.service"
        # Powers off however the scenario ends; the journal and its output are kept in /out.
        probe.write_text(f"[Unit]\nAfter=local-fs.target\n[Service]\nType=oneshot\nTimeoutStartSec=600\n"
                         f"Environment=EDGE_UNIT={self.unit} PYTHONPATH={PROBE.parent}\n"
                         f"StandardOutput=append:/out/probe.log\nStandardError=append:/out/probe.log\n"
                         f"ExecStart={sys.executable} /nsp/scenario.py\n"
                         f"ExecStopPost=/bin/sh -c 'journalctl --no-pager -o short-monotonic > /out/journal.txt; "
                         f"systemctl poweroff'\n")
        shutil.copyfile(scenario, self.nsp / "scenario.py")
        binds.append(f"--bind-ro={probe}:{UNITS}/probe.service")
        return nspawn_command(self.nspawn, self.nsp, self.out, binds)

    def boot(self, scenario_text: str, *, timeout_s: float = 300, kill_when=None) -> dict:
        """Boot with ``scenario_text`` as the probe; its result.json. ``kill_when``: a callable
        polled every 10 ms while the machine runs; when it returns true, nspawn is SIGKILLed
        (a power cut) and the result is {"killed": seconds into the boot}."""
        self.boots += 1
        scenario = self.work / f"scenario-{self.boots}.py"
        scenario.write_text(scenario_text)
        result = self.out / "result.json"
        for name in ("result.json", "probe.log", "journal.txt"):
            (self.out / name).unlink(missing_ok=True)
        # With snapshots, two limits of nspawn that a device's systemd does not put on edge.service, each
        # found by a failing CRIU (tests/bundle/test_bundle_snapshot_supervise.py): its seccomp filter (a
        # tracer under seccomp may not suspend its tracee's) and a read-only /proc/sys (the restore of the
        # container's UTS namespace).
        env = {**os.environ, "SYSTEMD_SECCOMP": "0", "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "1"} if self.snapshots else None
        try:
            killed = boot_to_poweroff(self.command(scenario), self.work / f"boot-{self.boots}.log", timeout_s,
                                      kill_when=kill_when, describe=self.log_tail, env=env)
        finally:
            for cid in (self.unit, f"{self.unit}-b", f"{self.unit}-snapshot", f"{self.unit}-staging"):  # their state was on nspawn's /run
                subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
        if killed is not None:
            return {"killed": killed}
        assert result.exists(), f"boot {self.boots} left no result: {self.log_tail()}"
        return json.loads(result.read_text())

    def log_tail(self, n: int = 4000) -> str:
        parts = [(self.work / f"boot-{self.boots}.log").read_text(errors="replace")[-n:]]
        for name in ("probe.log", "journal.txt"):
            if (self.out / name).exists():
                parts.append(f"--- {name}\n" + (self.out / name).read_text(errors="replace")[-n:])
        return "\n".join(parts)
