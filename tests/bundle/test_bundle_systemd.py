"""systemd/edge.service under a real systemd (PID 1 of a systemd-nspawn container):
the unit starts the bundle to READY, the bundle's drop-in (a symlink, as docs/bundle.md installs
it) sets the unit's MemoryMax/TasksMax, and the kernel enforces them on the unit's cgroup and the
container's below it. The bundle is the one built, its config.json unchanged (RLIMIT_NOFILE
65536): where this host's root cannot grant that (no CAP_SYS_RESOURCE, a lower hard limit),
LimitNOFILE= gets the closest systemd can, edge-supervise starts the container with that and
warns in the journal, and the unit is active, not restarting on runc's "error setting rlimit".

Needs root, runc and systemd-nspawn (Debian package systemd-container); skipped otherwise.
The unit gets a name of its own: nspawn shares the host's cgroup tree, so two runs must not
both create system.slice/edge.service.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

from support.bundles import REPO, bundle_meta, host_nofile, runc_or_skip, supervisor_events
from support.nspawn import UNITS, nspawn_command, nspawn_or_skip
from support.supervisor import supervisor_file

# Runs in the nspawn container as probe.service; host python3, stdlib only. argv: unit name.
_PROBE = r'''
import json, os, subprocess, sys, time
unit = sys.argv[1]
out = {"start": subprocess.run(["systemctl", "start", unit], capture_output=True, text=True).returncode}
time.sleep(3)  # a unit that crash-loops would be restarting (RestartSec=2) by now
show = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "MemoryMax", "-p", "TasksMax", "-p",
                       "DropInPaths", "-p", "NRestarts", "-p", "LimitNOFILE", "-p", "MainPID", unit],
                      capture_output=True, text=True).stdout
out["show"] = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
def nofile(pid):
    for line in (read(f"/proc/{pid}/limits") or "").splitlines():
        if line.startswith("Max open files"):
            return [int(x) for x in line.split()[3:5]]
    return None
state = subprocess.run(["runc", "state", unit], capture_output=True, text=True)
out["nofile"] = {"supervisor": nofile(out["show"].get("MainPID")),
                 "container": nofile(json.loads(state.stdout)["pid"]) if state.returncode == 0 else state.stderr}
for _ in range(50):  # journald reads the unit's stdout on its own time
    out["journal"] = subprocess.run(["journalctl", "-u", unit, "-o", "cat", "--no-pager"],
                                    capture_output=True, text=True).stdout
    if "supervise.ready" in out["journal"]:
        break
    time.sleep(0.1)
cgroups = {}
for top, dirs, _files in os.walk("/sys/fs/cgroup"):
    if os.path.basename(top) == unit + ".service":
        dirs[:] = []  # the unit's and, below it, the container's (named after its container id)
        for d in [top] + [os.path.join(top, c) for c in os.listdir(top) if os.path.isdir(os.path.join(top, c))]:
            key = "unit" if d == top else "container"
            got = cgroups.setdefault(key, {})
            for name, file in (("memory", "memory.max"), ("memory", "memory.limit_in_bytes"),
                               ("swap", "memory.swap.max"), ("memsw", "memory.memsw.limit_in_bytes"),
                               ("pids", "pids.max")):
                value = read(os.path.join(d, file))
                if value is not None:
                    got[name] = value
out["cgroups"] = cgroups
bundle = os.environ["EDGE_BUNDLE"]
address = json.load(open(os.path.join(bundle, "edge-bundle.json")))["address"]
out["health"] = subprocess.run([sys.executable, "/nsp/edge-supervise", "--probe", address],
                               capture_output=True, text=True).stdout.strip()
out["stop"] = subprocess.run(["systemctl", "stop", unit], capture_output=True, text=True).returncode
json.dump(out, open("/out/result.json", "w"))
'''


def test_unit_and_container_limits_are_in_effect_under_systemd(ort_bundle, tmp_path):
    from image.build_bundle import UNIT_DROPIN

    runc_or_skip()
    nspawn = nspawn_or_skip()
    unit = f"edge-t{uuid.uuid4().hex[:8]}"
    nsp, out = tmp_path / "nsp", tmp_path / "out"
    nsp.mkdir()
    out.mkdir()
    inside = str(ort_bundle.resolve())  # the bundle as built: edge-supervise caps what this host cannot grant
    config_before = (ort_bundle / "config.json").read_bytes()
    (wanted,) = [r["hard"] for r in json.loads(config_before)["process"]["rlimits"] if r["type"] == "RLIMIT_NOFILE"]
    # systemd gives LimitNOFILE=65536 where it can, else the closest: nspawn's hard limit, this process's.
    granted = host_nofile(wanted)
    shutil.copyfile(supervisor_file(), nsp / "edge-supervise")
    text = (REPO / "systemd" / "edge.service").read_text()
    text = text.replace("/usr/local/lib/edge/edge-supervise", "/nsp/edge-supervise")
    text = text.replace("EDGE_BUNDLE=/opt/edge/bundle/current", f"EDGE_BUNDLE={inside}")
    text = text.replace("EDGE_CONTAINER_ID=edge ", f"EDGE_CONTAINER_ID={unit} ")
    # No snapshot beside the cached bundle, read-only for tests (test_bundle_snapshot_supervise.py has its own).
    text = text.replace("EDGE_SNAPSHOT=auto", "EDGE_SNAPSHOT=off")
    (nsp / f"{unit}.service").write_text(text)
    (nsp / "dropins").mkdir()
    (nsp / "dropins" / "limits.conf").symlink_to(ort_bundle.resolve() / UNIT_DROPIN)  # as docs/bundle.md installs it
    (nsp / "probe.py").write_text(_PROBE)
    (nsp / "probe.service").write_text(
        f"[Service]\nType=oneshot\nEnvironment=EDGE_BUNDLE={inside}\n"
        f"ExecStart=/usr/bin/python3 /nsp/probe.py {unit}\nExecStartPost=/bin/systemctl poweroff\n")
    key_dir = ort_bundle.resolve().parent  # the bundle, and its socket directory (edge-bundle.json socket_dir)
    cmd = nspawn_command(nspawn, nsp, out, [f"--bind={key_dir}:{key_dir}",
                                            f"--bind-ro={nsp / f'{unit}.service'}:{UNITS}/{unit}.service",
                                            f"--bind-ro={nsp / 'dropins'}:{UNITS}/{unit}.service.d",
                                            f"--bind-ro={nsp / 'probe.service'}:{UNITS}/probe.service"])
    try:
        boot = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    finally:
        subprocess.run(["runc", "delete", "--force", unit], capture_output=True)  # (its state was on nspawn's /run)
    assert (out / "result.json").exists(), boot.stdout[-3000:] + boot.stderr[-3000:]
    r = json.loads((out / "result.json").read_text())
    limits = bundle_meta(ort_bundle)["limits"]
    assert r["start"] == 0 and r["show"]["ActiveState"] == "active" and r["show"]["NRestarts"] == "0", r
    # Open files: the unit's LimitNOFILE=, what the supervisor got and what it gave the container.
    assert r["show"]["LimitNOFILE"] == "65536", r["show"]
    assert r["nofile"] == {"supervisor": [granted, granted], "container": [granted, granted]}, r["nofile"]
    capped = supervisor_events(r["journal"], "supervise.nofile_capped")
    if granted < wanted:
        (event,) = capped
        assert (event["wanted"], event["granted"]) == (wanted, granted), event
        assert "LimitNOFILE= in edge.service" in event["warning"], event
    else:
        assert capped == [], r["journal"]
    assert (ort_bundle / "config.json").read_bytes() == config_before  # the bundle as signed
    assert json.loads(r["health"])["ready"] is True, r
    # systemd read the bundle's drop-in through the symlink, and it overrides the static lines.
    assert r["show"]["DropInPaths"].endswith(f"{unit}.service.d/limits.conf"), r["show"]
    assert r["show"]["MemoryMax"] == str(limits["unit_memory_max"]) and r["show"]["TasksMax"] == "320", r["show"]
    # The kernel has them: the unit's cgroup, and the container's below it (config.json's).
    assert r["cgroups"]["unit"]["memory"] == str(limits["unit_memory_max"]), r["cgroups"]
    assert r["cgroups"]["unit"]["pids"] == "320", r["cgroups"]
    container = r["cgroups"]["container"]
    assert container["memory"] == str(limits["memory_bytes"]) and container["pids"] == "256", r["cgroups"]
    assert container.get("swap", "0") == "0" and container.get("memsw", container["memory"]) == container["memory"]
    assert r["stop"] == 0, r
