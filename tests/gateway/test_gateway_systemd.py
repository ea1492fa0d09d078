"""systemd/edge-gateway.service under a real systemd (PID 1 of systemd-nspawn, tests/support/nspawn.py),
installed as the unit's own comment says, in front of systemd/edge.service running the MiniLM
bundle (onnxruntime) as built:

- ``systemctl start edge-gateway`` starts the runtime first (Wants=, After=): the gateway's
  process starts once edge.service is active (READY), and the gateway is active once it listens;
- /health is 200 while the runtime is ready; 503 while it is stopped and while systemd waits to
  restart it after a SIGKILL (a health request in flight at the kill included: 503, not 504); while
  it boots again, 503 until it is ready, and the first request once its unit is active is 200. The
  gateway stays up throughout: one process, no restart;
- the unit's limits are in effect on its process and cgroup, and it stops cleanly.

Both unit files are bound in unchanged, with the settings files the units read
(/etc/default/edge: this bundle, a container id of the test's, no snapshot; /etc/default/edge-gateway:
the bundle's socket) and the commands at the paths they name: /usr/local/bin/edge (this checkout)
and /usr/local/lib/edge/edge-supervise (built from it). Two things of this host are not a device's:

- nspawn shares the host's cgroup tree, so two runs must not both create system.slice/edge.service:
  the files are bound in under names of the test's, and edge.service and edge-gateway.service are
  aliases of them (symlinks, as `systemctl enable` makes for Alias=); the gateway's After=/Wants=
  edge.service resolve through the alias, and systemd names the cgroups after the files;
- the unit's ProtectHome=yes hides /root, where this venv's interpreter (pyenv) lives:
  /usr/local/bin/edge runs the system python of the same version on this venv's site-packages, as a
  device runs its system python.

What this host cannot grant the runtime's unit (LimitNOFILE=65536 without CAP_SYS_RESOURCE),
edge-supervise caps and logs (supervise.nofile_capped), and the gateway does not notice. The
machine has a network namespace of its own, so the gateway listens on its default, 127.0.0.1:8080.

Needs root, runc and systemd-nspawn; skipped otherwise. About 8 s here (the bundle built once, cached).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

from support.bundles import REPO, bundle_meta, host_nofile, supervisor_events
from support.nspawn import UNITS, boot_to_poweroff, nspawn_command, nspawn_or_skip
from support.supervisor import supervisor_file

HIDDEN = ("/root/", "/home/", "/run/user/")  # what ProtectHome=yes makes inaccessible

# Runs in the machine as probe.service, with the host's python3 (stdlib only).
# argv: the runtime unit's file name, the gateway unit's, the container id, the bundle directory.
_PROBE = r'''
import json, os, signal, subprocess, sys, time, urllib.error, urllib.request

rt, gw, cid, bundle = sys.argv[1:5]
UNITS = "/etc/systemd/system"
URL = "http://127.0.0.1:8080"  # the gateway's default listener
R = {}


def sh(*cmd, timeout=180):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return {"rc": r.returncode, "out": r.stdout[-3000:], "err": r.stderr[-3000:]}


def show(unit, *props):
    out = subprocess.run(["systemctl", "show", unit, *[f"-p{p}" for p in props]], capture_output=True,
                         text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def state():
    """The runtime unit's ActiveState/SubState, e.g. activating/start, activating/auto-restart."""
    got = show("edge.service", "ActiveState", "SubState")
    return f"{got['ActiveState']}/{got['SubState']}"


def http(path, body=None):
    req = urllib.request.Request(URL + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return [r.status, r.read().decode(), r.headers.get("X-Trace-Id")]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(), e.headers.get("X-Trace-Id")]
    except OSError as e:
        return [None, repr(e), None]


def health():
    return http("/health")


def until_200(timeout_s=30):
    """/health until 200: how many requests it took, and how long."""
    t0, tries = time.monotonic(), 0
    while time.monotonic() - t0 < timeout_s:
        tries += 1
        if health()[0] == 200:
            return {"tries": tries, "s": round(time.monotonic() - t0, 3)}
        time.sleep(0.02)
    return {"tries": tries, "s": None}


def samples_until(done, timeout_s=120):
    """(runtime unit state, /health status, state again) until done(); each sample takes a few ms."""
    out, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        before = state()
        code = health()[0]
        after = state()
        out.append([before, code, after])
        if done(after):
            break
    return out


try:
    # As installed: the two names, and the bundle's drop-in linked in (docs/bundle.md).
    os.symlink(f"{UNITS}/{rt}", f"{UNITS}/edge.service")
    os.symlink(f"{UNITS}/{gw}", f"{UNITS}/edge-gateway.service")
    os.mkdir(f"{UNITS}/edge.service.d")
    os.symlink(f"{bundle}/edge.service.d/limits.conf", f"{UNITS}/edge.service.d/limits.conf")
    R["reload"] = sh("systemctl", "daemon-reload")
    R["at_boot"] = {u: show(u, "ActiveState", "UnitFileState")["ActiveState"] for u in (rt, gw)}
    R["names"] = {"edge": show("edge.service", "Id", "Names", "DropInPaths"),
                  "gateway": show("edge-gateway.service", "Id", "Names", "After", "Wants")}
    t0 = time.monotonic()
    R["start"] = sh("systemctl", "start", "edge-gateway.service")
    R["start"]["seconds"] = round(time.monotonic() - t0, 3)
    R["edge"] = show("edge.service", "ActiveState", "ActiveEnterTimestampMonotonic", "NRestarts")
    R["gateway"] = show("edge-gateway.service", "ActiveState", "SubState", "MainPID", "NRestarts",
                        "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    R["ready"] = health()
    R["embed"] = http("/v1/embeddings", {"model": "m", "input": ["hello world", "a second text"]})
    R["metrics"] = http("/metrics")[0]
    pid = R["gateway"]["MainPID"]
    with open(f"/proc/{pid}/limits") as f:
        R["nofile"] = [line.split()[3:5] for line in f if line.startswith("Max open files")][0]
    cg = {}
    for top, dirs, files in os.walk("/sys/fs/cgroup"):
        if os.path.basename(top) == gw:
            dirs[:] = []
            for name in ("memory.max", "memory.limit_in_bytes", "pids.max"):
                if name in files:
                    cg[name] = open(os.path.join(top, name)).read().strip()
    R["cgroup"] = cg
    R["show_limits"] = show("edge-gateway.service", "MemoryMax", "TasksMax", "LimitNOFILE", "ProtectSystem",
                            "ProtectHome", "PrivateTmp", "NoNewPrivileges")

    # The runtime stopped: the gateway stays up and says 503.
    R["stop_edge"] = sh("systemctl", "stop", "edge.service")
    R["stopped"] = {"edge": state(), "health": health(),
                    "gateway": show("edge-gateway.service", "ActiveState", "MainPID")}

    # The runtime booting again: 503 while edge.service is activating, 200 once it is active.
    sh("systemctl", "start", "--no-block", "edge.service")
    R["booting"] = samples_until(lambda s: s.split("/")[0] not in ("inactive", "activating"))
    R["booted"] = {"edge": state(), "to_200": until_200()}

    # The runtime killed: systemd restarts edge.service (Restart=on-failure); 503 meanwhile.
    restarts = int(show("edge.service", "NRestarts")["NRestarts"])
    st = sh("runc", "state", cid)
    os.kill(json.loads(st["out"])["pid"], signal.SIGKILL)
    R["crash"] = samples_until(
        lambda s: s.startswith("active/") and int(show("edge.service", "NRestarts")["NRestarts"]) > restarts)
    R["recovered"] = {"edge": show("edge.service", "ActiveState", "NRestarts"), "restarts_before": restarts,
                      "to_200": until_200()}
    R["gateway_end"] = show("edge-gateway.service", "ActiveState", "MainPID", "NRestarts")

    R["stop_gateway"] = sh("systemctl", "stop", "edge-gateway.service")
    R["gateway_stopped"] = show("edge-gateway.service", "ActiveState", "Result", "ExecMainStatus")
finally:
    R["journal_gateway"] = sh("journalctl", "-u", gw, "-o", "cat", "--no-pager")["out"]
    R["journal_edge"] = subprocess.run(["journalctl", "-u", rt, "-o", "cat", "--no-pager"], capture_output=True,
                                       text=True).stdout
    with open("/out/result.json", "w") as f:
        json.dump(R, f, indent=1)
'''


def _interpreter() -> str:
    """A python of this venv's version that ProtectHome=yes leaves visible: this one, or the system's."""
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(HIDDEN):
        return exe
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(system):
        pytest.skip(f"this venv's interpreter is under /root or /home (hidden by ProtectHome=yes) and {system} "
                    "is not installed")
    return system


def _edge_command(path: Path) -> None:
    """/usr/local/bin/edge: `edge` of this checkout (its venv's site-packages) on ``_interpreter()``."""
    site = sysconfig.get_path("purelib")
    if site.startswith(HIDDEN):
        pytest.skip(f"this venv ({site}) is under /root or /home: ProtectHome=yes hides it from the unit")
    path.write_text(f"#!{_interpreter()} -IS\nimport site, sys\nsite.addsitedir({site!r})\n"
                    "from edge.cli import main\nsys.exit(main())\n")
    path.chmod(0o755)


def test_gateway_unit_under_systemd_follows_the_runtime(ort_bundle, tmp_path):
    nspawn = nspawn_or_skip()
    tag = uuid.uuid4().hex[:8]
    rt, gw, cid = f"edge-t{tag}.service", f"edge-gw-t{tag}.service", f"edge-t{tag}"
    nsp, out = tmp_path / "nsp", tmp_path / "out"
    (nsp / "bin").mkdir(parents=True)
    (nsp / "lib" / "edge").mkdir(parents=True)
    out.mkdir()
    _edge_command(nsp / "bin" / "edge")
    shutil.copyfile(supervisor_file(), nsp / "lib" / "edge" / "edge-supervise")
    bundle = ort_bundle.resolve()
    meta = bundle_meta(ort_bundle)
    (nsp / "default-edge").write_text(f"EDGE_BUNDLE={bundle}\nEDGE_CONTAINER_ID={cid}\nEDGE_SNAPSHOT=off\n")
    (nsp / "default-edge-gateway").write_text(f"EDGE_ADDRESS={meta['address']}\n")
    (nsp / "probe.py").write_text(_PROBE)
    # A first boot (the volatile root has no machine-id) enables every unit with an [Install] section
    # that no preset names: these two would start at boot, before the probe made their aliases.
    (nsp / "test.preset").write_text(f"disable {rt}\ndisable {gw}\n")
    (nsp / "probe.service").write_text(
        "[Unit]\nAfter=local-fs.target\n[Service]\nType=oneshot\nTimeoutStartSec=300\n"
        "StandardOutput=append:/out/probe.log\nStandardError=append:/out/probe.log\n"
        f"ExecStart=/usr/bin/python3 /nsp/probe.py {rt} {gw} {cid} {bundle}\n"
        "ExecStopPost=/bin/sh -c 'journalctl --no-pager -o short-monotonic > /out/journal.txt; systemctl poweroff'\n")
    binds = [f"--bind-ro={REPO}:{REPO}", f"--bind={bundle.parent}:{bundle.parent}",  # its socket directory is there
             f"--bind-ro={REPO / 'systemd' / 'edge.service'}:{UNITS}/{rt}",
             f"--bind-ro={REPO / 'systemd' / 'edge-gateway.service'}:{UNITS}/{gw}",
             f"--bind-ro={nsp / 'default-edge'}:/etc/default/edge",
             f"--bind-ro={nsp / 'default-edge-gateway'}:/etc/default/edge-gateway",
             f"--bind-ro={nsp / 'bin'}:/usr/local/bin", f"--bind-ro={nsp / 'lib'}:/usr/local/lib",
             f"--bind-ro={nsp / 'test.preset'}:/etc/systemd/system-preset/00-edge-test.preset",
             f"--bind-ro={nsp / 'probe.service'}:{UNITS}/probe.service"]
    for name in os.listdir("/usr/local/lib"):  # what the bind above hides of the host's (its python's site): kept
        if name != "edge" and os.path.isdir(f"/usr/local/lib/{name}"):
            (nsp / "lib" / name).mkdir()
            binds.append(f"--bind-ro=/usr/local/lib/{name}:/usr/local/lib/{name}")
    for prefix in {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}:  # the venv, its python
        if not prefix.startswith((str(REPO), "/usr/")):
            binds.append(f"--bind-ro={prefix}:{prefix}")

    def tail() -> str:
        parts = [(tmp_path / "boot.log").read_text(errors="replace")[-3000:]]
        for name in ("probe.log", "journal.txt"):
            if (out / name).exists():
                parts.append(f"--- {name}\n" + (out / name).read_text(errors="replace")[-6000:])
        return "\n".join(parts)

    t0 = time.monotonic()
    try:
        boot_to_poweroff(nspawn_command(nspawn, nsp, out, binds, private_network=True), tmp_path / "boot.log", 240,
                         describe=tail)
    finally:
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    took = time.monotonic() - t0
    assert (out / "result.json").exists(), tail()
    r = json.loads((out / "result.json").read_text())
    assert r["at_boot"] == {rt: "inactive", gw: "inactive"}, r["at_boot"]  # the start below is the probe's
    assert r["start"]["rc"] == 0, (r["start"], tail())
    # The installed names resolve to the files: the cgroups are named after the test's.
    assert r["names"]["edge"]["Id"] == rt and "edge.service" in r["names"]["edge"]["Names"].split(), r["names"]
    assert r["names"]["gateway"]["Id"] == gw and "edge-gateway.service" in r["names"]["gateway"]["Names"].split()
    assert r["names"]["edge"]["DropInPaths"].endswith("edge.service.d/limits.conf"), r["names"]
    # After=edge.service: the gateway's process started once the runtime's unit was active (its READY),
    # and the gateway was active once it listened (its own READY).
    g = r["gateway"]
    assert r["edge"]["ActiveState"] == "active" and (g["ActiveState"], g["SubState"]) == ("active", "running"), r
    assert (int(r["edge"]["ActiveEnterTimestampMonotonic"]) <= int(g["ExecMainStartTimestampMonotonic"])
            < int(g["ActiveEnterTimestampMonotonic"])), (r["edge"], g)
    code, body, trace = r["ready"]
    assert code == 200 and json.loads(body) == {"status": "ok", "runtime": "ready"} and trace, r["ready"]
    code, body, trace = r["embed"]
    assert code == 200 and [len(d["embedding"]) for d in json.loads(body)["data"]] == [384, 384] and trace
    assert r["metrics"] == 200
    # The unit's limits, all granted here, on its process and its cgroup.
    assert r["nofile"] == ["4096", "4096"], r["nofile"]
    assert r["cgroup"].get("memory.max", r["cgroup"].get("memory.limit_in_bytes")) == str(512 << 20), r["cgroup"]
    assert r["cgroup"]["pids.max"] == "64", r["cgroup"]
    # What this host cannot grant the runtime's unit, edge-supervise caps at each of its three starts.
    config = json.loads((bundle / "config.json").read_text())
    (wanted,) = [x["hard"] for x in config["process"]["rlimits"] if x["type"] == "RLIMIT_NOFILE"]
    capped = supervisor_events(r["journal_edge"], "supervise.nofile_capped")
    if host_nofile(wanted) < wanted:
        assert [(e["wanted"], e["granted"]) for e in capped] == [(wanted, host_nofile(wanted))] * 3, capped
    else:
        assert capped == [], capped
    # The runtime stopped: the gateway stays up, /health is 503 (TEI's shape: /health is both APIs').
    stopped = r["stopped"]
    assert r["stop_edge"]["rc"] == 0 and stopped["edge"] == "inactive/dead", (r["stop_edge"], stopped)
    assert stopped["gateway"] == {"ActiveState": "active", "MainPID": g["MainPID"]}, stopped
    code, body, trace = stopped["health"]
    assert code == 503 and json.loads(body)["error_type"] == "Unhealthy" and json.loads(body)["trace_id"] == trace
    # Booting again, and restarted after a SIGKILL: 503 until the runtime is ready, then 200. The
    # boot may be over before a 503 comes back (a 503 waits CONNECT_GRACE_S, 0.5 s, for a connection;
    # the runtime's exec to READY takes 0.25 to 1.3 s here), the restart is not: systemd waits
    # RestartSec=2 before it starts the runtime again.
    assert_503_until_ready(r["booting"])
    assert_503_until_ready(r["crash"])
    assert any(before == "activating/auto-restart" and code == 503 for before, code, _ in r["crash"]), r["crash"]
    # Once the unit is active, the first request is 200: the gateway waits for the connection ZeroMQ
    # is still making (CONNECT_GRACE_S) instead of answering 503 meanwhile.
    assert r["booted"]["edge"] == "active/running" and r["booted"]["to_200"]["tries"] == 1, r["booted"]
    recovered = r["recovered"]
    assert recovered["edge"] == {"ActiveState": "active", "NRestarts": str(recovered["restarts_before"] + 1)}
    assert recovered["to_200"]["tries"] == 1, recovered
    # One gateway process throughout, and a clean stop.
    assert r["gateway_end"] == {"ActiveState": "active", "MainPID": g["MainPID"], "NRestarts": "0"}, r["gateway_end"]
    assert r["stop_gateway"]["rc"] == 0, r["stop_gateway"]
    assert r["gateway_stopped"] == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
    assert '"gateway.stopped"' in r["journal_gateway"], r["journal_gateway"]
    print(f"\n[gateway unit] machine {took:.1f} s; start edge-gateway (runtime, then gateway) "
          f"{r['start']['seconds']:.2f} s; 503 answers while the runtime booted {_count(r['booting'], 503)}, "
          f"while it restarted after a SIGKILL {_count(r['crash'], 503)}; the first request once the unit was "
          f"active: 200 in {r['booted']['to_200']['s']:.3f} s, after the restart in {recovered['to_200']['s']:.3f} s")


def _count(samples: list, code: int) -> int:
    return sum(c == code for _, c, _ in samples)


def assert_503_until_ready(samples: list) -> None:
    """(unit state, /health status, unit state) samples: 503 until the first 200, 200 from then on
    (the runtime is ready a moment before systemd hears its READY, so a 200 may come while the unit
    is still activating), and nothing else: no 504, no refused connection."""
    codes = [c for _, c, _ in samples]
    first = codes.index(200) if 200 in codes else len(codes)
    assert samples and set(codes[:first]) <= {503} and set(codes[first:]) <= {200}, samples
