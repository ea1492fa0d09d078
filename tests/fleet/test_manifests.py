"""deploy/: the k8s DaemonSet validates against a current Kubernetes schema (kubernetes-validate),
the podman unit passes ``systemd-analyze verify`` and, under a real systemd (systemd-nspawn),
starts the image from the layout and becomes active on the runtime's READY."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest
import yaml
from support.bundles import REPO, runc_or_skip
from fleet_support import PODMAN_GLOBAL, PODMAN_LIMITS, quadlet_or_skip, tool_or_skip

K8S = REPO / "deploy" / "k8s"
UNIT = REPO / "deploy" / "podman" / "edge-podman.service"
QUADLET = REPO / "deploy" / "podman" / "edge.container"


def test_k8s_manifests_validate_against_the_current_schema():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")
    from kubernetes_validate import utils

    versions = sorted(utils.all_versions(), key=lambda v: tuple(int(x) for x in v.split(".")))
    latest = versions[-1]
    files = sorted(K8S.glob("*.yaml"))
    assert files
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            kv.validate(doc, latest, strict=True)  # raises on any schema error
    ds = next(d for d in yaml.safe_load_all((K8S / "daemonset.yaml").read_text()) if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    edge = next(c for c in pod["containers"] if c["name"] == "edge")
    sc = edge["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["runAsUser"] == 61000 and sc["allowPrivilegeEscalation"] is False
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert edge[probe]["exec"]["command"][:4] == ["python", "-m", "edge.cli", "health"]
    from edge.runtime.serve_args import serve_parser
    drain = serve_parser(env={}).parse_args([]).drain_timeout
    assert pod["terminationGracePeriodSeconds"] > drain
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths == {"/run/edge", "/var/lib/edge/runtime"}
    assert edge["resources"]["limits"]["memory"]
    # invalid on purpose: the validator does reject what the schema forbids
    with pytest.raises(Exception):  # noqa: B017 - kubernetes_validate raises its own types, a few kinds
        kv.validate({**ds, "spec": {**ds["spec"], "replicas": 2}}, latest, strict=True)


def test_podman_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = tool_or_skip("systemd-analyze")
    tool_or_skip("podman")  # verify checks that ExecStart's binary exists
    unit = tmp_path / "edge-podman.service"
    shutil.copyfile(UNIT, unit)
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "edge-podman.service" not in r.stderr, r.stderr
    bad = tmp_path / "bad.service"
    bad.write_text(UNIT.read_text().replace("Type=notify", "Type=nonsense"))
    r = subprocess.run([analyze, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "nonsense" in r.stderr  # the check does read the unit


_PROBE = r'''
import json, subprocess, sys
unit = sys.argv[1]
out = {"start": subprocess.run(["systemctl", "start", unit], capture_output=True, text=True).returncode}
show = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "Type", unit],
                      capture_output=True, text=True).stdout
out["show"] = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
h = subprocess.run(["podman", "--runtime", "runc", "exec", unit, "python", "-m", "edge.cli", "health", "--connect",
                    "ipc:///run/edge/edge.sock"], capture_output=True, text=True)
out["health"] = h.stdout.strip() or h.stderr.strip()
out["journal"] = subprocess.run(["journalctl", "-u", unit, "--no-pager", "-n", "30"], capture_output=True,
                                text=True).stdout[-3000:]
out["stop"] = subprocess.run(["systemctl", "stop", unit], capture_output=True, text=True).returncode
json.dump(out, open("/out/result.json", "w"))
'''


def _boot_unit(unit: str, text: str, layout, tmp_path) -> dict:
    """Boot systemd 252 as PID 1 (systemd-nspawn with the host's /usr, a volatile root) with ``text`` as ``unit``.service and the
    layout at /nsp/layout; the probe starts the unit, asks ``edge health`` in its container, stops it."""
    nspawn = tool_or_skip("systemd-nspawn")
    tool_or_skip("podman")
    runc_or_skip()
    nsp, out = tmp_path / "nsp", tmp_path / "out"
    nsp.mkdir()
    out.mkdir()
    (nsp / f"{unit}.service").write_text(text)
    (nsp / "probe.py").write_text(_PROBE)
    (nsp / "probe.service").write_text(
        f"[Service]\nType=oneshot\nExecStart=/usr/bin/python3 /nsp/probe.py {unit}\n"
        f"ExecStartPost=/bin/systemctl poweroff\n")
    units = "/etc/systemd/system"
    cmd = [nspawn, "--quiet", "--volatile=yes", "-D", "/", "--register=no", "--keep-unit", "--capability=all",
           "--system-call-filter=add_key keyctl request_key @mount @privileged @raw-io",
           "--bind=/sys/fs/cgroup:/sys/fs/cgroup", f"--bind={nsp}:/nsp", f"--bind-ro={layout}:/nsp/layout",
           f"--bind={out}:/out",
           "--bind-ro=/etc/containers/policy.json:/etc/containers/policy.json",  # a volatile /etc lacks it
           f"--bind-ro={nsp / f'{unit}.service'}:{units}/{unit}.service",
           f"--bind-ro={nsp / 'probe.service'}:{units}/probe.service",
           "-b", "systemd.firstboot=off", "systemd.wants=probe.service"]
    boot = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert (out / "result.json").exists(), boot.stdout[-3000:] + boot.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def _assert_ready_and_stopped(r: dict) -> None:
    assert r["start"] == 0 and r["show"]["ActiveState"] == "active" and r["show"]["Type"] == "notify", r
    assert json.loads(r["health"])["ready"] is True, r
    assert r["stop"] == 0, r


def test_podman_unit_reaches_ready_under_systemd(ort_image, tmp_path):
    layout, _summary = ort_image
    unit = f"edge-podman-{uuid.uuid4().hex[:8]}"
    text = UNIT.read_text().replace("Environment=EDGE_IMAGE=oci:/opt/edge/image:latest",
                                    "Environment=EDGE_IMAGE=oci:/nsp/layout:latest")
    text = text.replace("Environment=EDGE_PODMAN_GLOBAL=",
                        f"Environment=\"EDGE_PODMAN_GLOBAL={' '.join(PODMAN_GLOBAL)}\"")
    text = text.replace('"EDGE_PODMAN_ARGS=--ulimit nofile=65536:65536"',
                        f'"EDGE_PODMAN_ARGS={" ".join(PODMAN_LIMITS)}"')  # this host: docs/fleet.md
    assert "/nsp/layout" in text and "nproc=4096" in text
    _assert_ready_and_stopped(_boot_unit(unit, text, layout, tmp_path))


def _quadlet(container_text: str, name: str, tmp_path) -> str:
    """The service Quadlet's generator writes for ``name``.container (``quadlet -dryrun``)."""
    units = tmp_path / "quadlet"
    units.mkdir()
    (units / f"{name}.container").write_text(container_text)
    r = subprocess.run([str(quadlet_or_skip()), "-dryrun"], env={**os.environ, "QUADLET_UNIT_DIRS": str(units)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"---{name}.service---" in r.stdout, r.stderr
    return r.stdout.split(f"---{name}.service---", 1)[1].split("\n---", 1)[0].lstrip("\n")


def test_the_quadlet_file_generates_the_units_podman_run(tmp_path):
    service = _quadlet(QUADLET.read_text(), "edge", tmp_path)
    start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    for flag in ("--sdnotify=container", "--read-only", "--cap-drop all", "--user 61000:61000", "--network none",
                 "--security-opt=no-new-privileges", "-v /run/edge:/run/edge", "--pull=newer", "--memory 1834m",
                 "-v /var/lib/edge/runtime:/var/lib/edge/runtime", "--pids-limit 256", "oci:/opt/edge/image:latest",
                 "--cgroups=no-conmon"):
        assert flag in start, (flag, start)
    assert start.index("--cgroups=no-conmon") > start.index("--cgroups=split")  # the later one wins
    assert "Type=notify" in service and "ExecStartPre=/usr/bin/install -d -o 61000" in service
    dependencies = [line for line in service.splitlines() if line.startswith(("Wants=", "After=", "Requires="))]
    assert not any("network-online" in line for line in dependencies), dependencies  # Network=none: no wait
    unit = tmp_path / "edge.service"
    unit.write_text(service)
    r = subprocess.run([tool_or_skip("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "edge.service" not in r.stderr, r.stderr


def test_the_quadlet_unit_reaches_ready_under_systemd(ort_image, tmp_path):
    """Quadlet from podman 5 (Debian trixie's generator) writes the unit; bookworm's podman 4.3 runs it."""
    layout, _summary = ort_image
    unit = f"edge-quadlet-{uuid.uuid4().hex[:8]}"
    text = QUADLET.read_text().replace("Image=oci:/opt/edge/image:latest", "Image=oci:/nsp/layout:latest")
    text = text.replace("ContainerName=edge", f"ContainerName={unit}")
    text = text.replace("--ulimit nofile=65536:65536", " ".join(PODMAN_LIMITS))  # this host: docs/fleet.md
    text = text.replace("[Container]", f"[Container]\nGlobalArgs={' '.join(PODMAN_GLOBAL)}")
    assert "/nsp/layout" in text and "nproc=4096" in text
    _assert_ready_and_stopped(_boot_unit(unit, _quadlet(text, unit, tmp_path), layout, tmp_path))
