"""deploy/'s commands, run: every command the DaemonSet (deploy/k8s/daemonset.yaml) runs in the image
-- its init container and its startup, readiness and liveness probes -- read from the manifest as
deployed and run in the built image (podman, from the ort_image layout) with what the manifest gives
each container: its user and group, a read-only root, its capabilities, its memory limit and its
volumes (a hostPath becomes a directory of the test at the same mountPath, made as the kubelet's
DirectoryOrCreate makes it: root's, 0755). Then the pod template itself under a real engine,
``podman kube play``. The podman units' in-container commands are checked here too; their boot is
tests/fleet/test_manifests.py's (docs/fleet.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from support.bundles import REPO, runc_or_skip
from fleet_support import PODMAN_GLOBAL, PODMAN_LIMITS, embed, tool_or_skip

DAEMONSET = REPO / "deploy" / "k8s" / "daemonset.yaml"
UNIT = REPO / "deploy" / "podman" / "edge-podman.service"
QUADLET = REPO / "deploy" / "podman" / "edge.container"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
NOT_THE_COMMAND = {125, 126, 127}  # podman's own failure, a command that cannot be run, one that is not found


def _template() -> dict:
    ds = next(d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d and d["kind"] == "DaemonSet")
    return ds["spec"]["template"]


def _main(spec: dict) -> dict:
    """The runtime's container: the one whose probes call ``edge.cli health``."""
    (main,) = (c for c in spec["containers"] if any(p in c for p in PROBES))
    return main


def _bytes(quantity: str | int) -> int:
    """A Kubernetes quantity of memory (``64Mi``, ``2Gi``, ``1000000``) in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|M|G)?", str(quantity))
    assert m, f"unsupported quantity {quantity!r}"
    scale = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 10**3, "M": 10**6, "G": 10**9}
    return int(m.group(1)) * scale[m.group(2)]


def _identity(spec: dict, container: dict) -> tuple[int, int]:
    """(uid, gid) the container runs as: its securityContext, else the pod's."""
    pod_sc, sc = spec.get("securityContext", {}), container.get("securityContext", {})
    uid, gid = sc.get("runAsUser", pod_sc.get("runAsUser")), sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    assert uid is not None and gid is not None, f"{container['name']}: no runAsUser/runAsGroup"
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        assert uid != 0, f"{container['name']}: runAsNonRoot with uid 0 (the kubelet would refuse to start it)"
    return uid, gid


def _podman_flags(spec: dict, container: dict) -> list[str]:
    """What the manifest gives ``container``, as podman run flags."""
    sc = container.get("securityContext", {})
    uid, gid = _identity(spec, container)
    flags = ["--user", f"{uid}:{gid}", "--network", "none"]
    if sc.get("readOnlyRootFilesystem"):
        # podman's --read-only adds tmpfs on /run, /tmp and /var/tmp; a kubelet adds none
        flags += ["--read-only", "--read-only-tmpfs=false"]
    assert not sc.get("privileged"), f"{container['name']}: privileged"
    caps = sc.get("capabilities", {})
    flags += [f"--cap-drop={c}" for c in caps.get("drop", [])] + [f"--cap-add={c}" for c in caps.get("add", [])]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    seccomp = sc.get("seccompProfile", spec.get("securityContext", {}).get("seccompProfile", {})).get("type")
    assert seccomp in (None, "RuntimeDefault"), seccomp  # RuntimeDefault: podman's default profile
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    if limit:
        flags += ["--memory", str(_bytes(limit))]
    return flags


def _host_dirs(spec: dict, root: Path) -> dict[str, Path]:
    """A directory per hostPath volume, as the kubelet's DirectoryOrCreate makes it (root's, 0755)."""
    dirs = {}
    for v in spec["volumes"]:
        if "hostPath" in v:
            d = root / v["name"]
            d.mkdir(parents=True)
            os.chmod(d, 0o755)
            dirs[v["name"]] = d
    return dirs


def _volume_flags(spec: dict, container: dict, host_dirs: dict[str, Path]) -> list[str]:
    volumes = {v["name"]: v for v in spec["volumes"]}
    flags = []
    for m in container.get("volumeMounts", []):
        v, ro = volumes[m["name"]], ",ro" if m.get("readOnly") else ""
        if "hostPath" in v:
            flags += ["-v", f"{host_dirs[m['name']]}:{m['mountPath']}" + (":ro" if ro else "")]
        elif "emptyDir" in v and (v["emptyDir"] or {}).get("medium") == "Memory":
            size = (v["emptyDir"] or {}).get("sizeLimit")
            opts = "rw,nosuid,nodev,mode=0777" + (f",size={_bytes(size)}" if size else "") + ro  # the kubelet's 0777
            flags += ["--tmpfs", f"{m['mountPath']}:{opts}"]
        else:
            raise AssertionError(f"volume {v}: not one this test knows how to give a container")
    return flags


def _host_path(container: dict, host_dirs: dict[str, Path], path: str) -> Path:
    """Where ``path`` of ``container`` lies on the host (under one of its hostPath mounts)."""
    for m in container.get("volumeMounts", []):
        if m["name"] in host_dirs and (path + "/").startswith(m["mountPath"].rstrip("/") + "/"):
            return host_dirs[m["name"]] / os.path.relpath(path, m["mountPath"])
    raise AssertionError(f"{path}: on no hostPath mount of {container['name']}")


def _command(container: dict) -> tuple[list[str], list[str]]:
    """(flags before the image, arguments after it): a container's command replaces the image's
    Entrypoint and, with no args, its Cmd too (Kubernetes' rules)."""
    command, args = container.get("command"), container.get("args")
    if command:
        return ["--entrypoint", command[0]], [*command[1:], *(args or [])]
    return [], list(args or [])


def _podman(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *PODMAN_GLOBAL, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _run(spec: dict, container: dict, host_dirs: dict[str, Path], image: str, name: str, *,
         detach: bool = False, command: list[str] | None = None) -> subprocess.CompletedProcess:
    """``podman run`` of ``image`` as the manifest gives ``container`` (``command``: another command
    in the same container settings, a probe's)."""
    pre, post = (["--entrypoint", command[0]], command[1:]) if command else _command(container)
    return _podman("run", *(["-d"] if detach else ["--rm"]), "--name", name, *PODMAN_LIMITS,
                   *_podman_flags(spec, container), *_volume_flags(spec, container, host_dirs), *pre, image, *post,
                   timeout=300)


def _exec_probe(spec: dict, container: dict, probe: str, name: str) -> tuple[subprocess.CompletedProcess, float]:
    """A probe's exec command in the running container ``name``, as the container's user (the kubelet's
    exec probe: the argv itself, no shell); its result and seconds."""
    uid, gid = _identity(spec, container)
    t0 = time.monotonic()
    r = _podman("exec", "--user", f"{uid}:{gid}", name, *container[probe]["exec"]["command"], timeout=120)
    return r, time.monotonic() - t0


def _running(name: str) -> bool:
    r = _podman("inspect", "--format", "{{.State.Running}}", name, timeout=60)
    return r.returncode == 0 and r.stdout.strip() == "true"


def _wait_started(spec: dict, container: dict, name: str) -> int:
    """The startup probe as the kubelet runs it: every periodSeconds until it succeeds, at most
    failureThreshold times; the attempts it took. Fails at once when the container is gone."""
    probe = container["startupProbe"]
    period, tries = probe.get("periodSeconds", 10), probe.get("failureThreshold", 3)
    time.sleep(probe.get("initialDelaySeconds", 0))
    r = None
    for attempt in range(1, tries + 1):
        r, _ = _exec_probe(spec, container, "startupProbe", name)
        if r.returncode == 0:
            return attempt
        if not _running(name):
            logs = _podman("logs", name, timeout=60)
            raise AssertionError(f"{name} exited before its startup probe passed: {r.stderr}\n"
                                 f"{(logs.stdout + logs.stderr)[-3000:]}")
        time.sleep(period)
    logs = _podman("logs", name, timeout=60)
    raise AssertionError(f"startup probe failed {tries} times, {period} s apart: {r.stdout}{r.stderr}\n"
                         f"{(logs.stdout + logs.stderr)[-3000:]}")


def _assert_ready(r: subprocess.CompletedProcess, seconds: float, probe: str, container: dict) -> None:
    assert r.returncode == 0, f"{probe} {container[probe]['exec']['command']}: exit {r.returncode}: {r.stderr}"
    assert json.loads(r.stdout)["ready"] is True, r.stdout
    timeout = container[probe].get("timeoutSeconds", 1)
    assert seconds < timeout, f"{probe} took {seconds:.1f} s, over its timeoutSeconds {timeout}"


@pytest.fixture(scope="module")
def image(ort_image):
    """The image of the layout in podman's storage, under a name of this module's (the store is the
    machine's, shared by every checkout); only that name is removed after."""
    tool_or_skip("podman")
    skopeo = tool_or_skip("skopeo")
    runc_or_skip()
    ref = f"localhost/edge-deploy-{uuid.uuid4().hex[:8]}:test"
    r = subprocess.run([skopeo, "copy", "-q", f"oci:{ort_image[0]}:latest", f"containers-storage:{ref}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    try:
        yield ref
    finally:
        _podman("rmi", "--ignore", ref, timeout=120)


def test_the_init_container_makes_the_host_dirs_the_runtimes(image, tmp_path):
    """The init container's command, as root with its CHOWN/FOWNER only, over root's 0755 hostPath
    directories: they become the runtime's (the main container's user), with the socket directory's
    mode edge-supervise gives it, and writable by that user only."""
    from edge.system.socket_dir import SOCKET_DIR_MODE

    spec = _template()["spec"]
    (init,) = spec["initContainers"]
    uid, gid = _identity(spec, _main(spec))
    host_dirs = _host_dirs(spec, tmp_path / "host")
    mounted = {m["name"] for m in init["volumeMounts"]}
    assert mounted == set(host_dirs), (mounted, set(host_dirs))  # it prepares every hostPath directory
    name = f"edge-deploy-init-{uuid.uuid4().hex[:8]}"
    try:
        r = _run(spec, init, host_dirs, image, name)
    finally:
        _podman("rm", "--force", "--ignore", name, timeout=60)
    assert r.returncode == 0, f"init container {init['command'][:3]}: exit {r.returncode}: {r.stderr[-2000:]}"
    sockets = _host_path(_main(spec), host_dirs, os.path.dirname(_connect_path(_main(spec))))
    for d in host_dirs.values():
        st = d.stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), (d, st.st_uid, st.st_gid)
        assert st.st_mode & 0o700 == 0o700 and st.st_mode & 0o022 == 0, (d, oct(st.st_mode))
    assert sockets.stat().st_mode & 0o7777 == SOCKET_DIR_MODE, oct(sockets.stat().st_mode)


def _connect_path(container: dict) -> str:
    """The socket path the probes connect to (``--connect ipc://PATH``): one for all three."""
    addresses = set()
    for p in PROBES:
        cmd = container[p]["exec"]["command"]
        addresses.add(cmd[cmd.index("--connect") + 1])
    (address,) = addresses
    assert address.startswith("ipc://"), address
    return address[len("ipc://"):]


def test_the_probes_pass_against_the_running_runtime_and_fail_once_it_stopped(image, tmp_path):
    """Init container, then the runtime's container as the manifest gives it (its user, read-only root,
    no capabilities, the memory limit, both hostPath directories and the tmpfs /tmp); the startup probe
    polled as the kubelet does, readiness and liveness once READY, each exec'd in the container as the
    manifest's user within its timeoutSeconds; the host's client is served through the socket directory.
    After a stop (SIGTERM, within terminationGracePeriodSeconds, exit 0), each probe's command in the
    same container settings exits non-zero: the probes can fail."""
    spec = _template()["spec"]
    (init,), main = spec["initContainers"], _main(spec)
    host_dirs = _host_dirs(spec, tmp_path / "host")
    tag = uuid.uuid4().hex[:8]
    names = [f"edge-deploy-init-{tag}", f"edge-deploy-main-{tag}"]
    try:
        r = _run(spec, init, host_dirs, image, names[0])
        assert r.returncode == 0, f"init container: exit {r.returncode}: {r.stderr[-2000:]}"
        r = _run(spec, main, host_dirs, image, names[1], detach=True)
        assert r.returncode == 0, f"podman run of {main['name']}: {r.stderr[-2000:]}"
        attempts = _wait_started(spec, main, names[1])
        for probe in ("readinessProbe", "livenessProbe"):
            _assert_ready(*_exec_probe(spec, main, probe, names[1]), probe, main)
        address = f"ipc://{_host_path(main, host_dirs, _connect_path(main))}"
        assert embed(address, ["the probes passed"]).shape[0] == 1  # it serves, not only answers health
        grace = spec.get("terminationGracePeriodSeconds", 30)
        r = _podman("stop", "-t", str(grace), names[1], timeout=grace + 60)
        assert r.returncode == 0, r.stderr
        code = _podman("inspect", "--format", "{{.State.ExitCode}}", names[1], timeout=60).stdout.strip()
        assert code == "0", f"{main['name']} exited {code} on SIGTERM"
        for i, probe in enumerate(PROBES):
            names.append(f"edge-deploy-probe-{tag}-{i}")
            r = _run(spec, main, host_dirs, image, names[-1], command=main[probe]["exec"]["command"])
            assert r.returncode != 0 and r.returncode not in NOT_THE_COMMAND, \
                f"{probe} against a stopped runtime: exit {r.returncode}: {r.stdout}{r.stderr[-1000:]}"
        print(f"\nstartup probe passed at attempt {attempts}", flush=True)
    finally:
        for name in names:
            _podman("rm", "--force", "--ignore", name, timeout=60)


def _podman_version() -> tuple[int, ...]:
    out = _podman("version", "--format", "{{.Client.Version}}", timeout=60).stdout.strip()
    return tuple(int(x) for x in re.findall(r"\d+", out)[:2])


def test_podman_kube_play_runs_the_daemonsets_pod_template(image, tmp_path):
    """The DaemonSet's pod template as a Pod under ``podman kube play`` (this host's ulimits in a
    containers.conf, docs/fleet.md): the init container makes the host directories the runtime's, the
    runtime's container gets the manifest's user, read-only root and no capabilities, its startup probe
    passes, then readiness and liveness, exec'd in it by podman as a kubelet does. Changed from the
    template, each for a reason given where it is done: the image, the hostPath paths, the volumes'
    names, and with podman < 4.4 the restart policy."""
    tool_or_skip("podman")
    template = _template()
    name = f"edge-kube-{uuid.uuid4().hex[:8]}"
    spec = json.loads(json.dumps(template["spec"]))
    for c in spec.get("initContainers", []) + spec["containers"]:
        c["image"] = image
    host_dirs = _host_dirs(spec, tmp_path / "host")
    for v in spec["volumes"]:
        if "hostPath" in v:
            v["hostPath"]["path"] = str(host_dirs[v["name"]])
    # podman makes a volume of each emptyDir, named after it in the machine's store: a name of this run's
    renamed = {v["name"]: f"{name}-{v['name']}" for v in spec["volumes"]}
    for v in spec["volumes"]:
        v["name"] = renamed[v["name"]]
    for c in spec.get("initContainers", []) + spec["containers"]:
        for m in c.get("volumeMounts", []):
            m["name"] = renamed[m["name"]]
    host_dirs = {renamed[k]: d for k, d in host_dirs.items()}
    if _podman_version() < (4, 4):
        # podman 4.3 restarts a pod's init containers under its restart policy (a DaemonSet's: Always),
        # so the init container reruns forever and kube play fails removing it (podman issues 16343,
        # 18477); fixed in 4.4. OnFailure: the init container runs once, as under a kubelet.
        spec["restartPolicy"] = "OnFailure"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {**template.get("metadata", {}), "name": name}, "spec": spec}
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    ulimits = ", ".join(json.dumps(v) for flag, v in zip(PODMAN_LIMITS[::2], PODMAN_LIMITS[1::2], strict=True)
                        if flag == "--ulimit")
    conf = tmp_path / "containers.conf"
    conf.write_text(f"[containers]\ndefault_ulimits = [{ulimits}]\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    main = _main(spec)
    ctr = f"{name}-{main['name']}"
    try:
        r = _podman("kube", "play", str(tmp_path / "pod.yaml"), timeout=300, env=env)
        if r.returncode != 0 and re.search(r"rlimit|operation not permitted|cgroup", r.stderr, re.I):
            pytest.skip(f"podman kube play cannot run a pod on this host: {r.stderr.strip()[-500:]}")
        assert r.returncode == 0, f"podman kube play: exit {r.returncode}: {r.stderr[-3000:]}"
        uid, gid = _identity(spec, main)
        for d in host_dirs.values():  # the init container ran
            assert (d.stat().st_uid, d.stat().st_gid) == (uid, gid), d
        got = json.loads(_podman("inspect", ctr, timeout=60).stdout)[0]
        assert got["Config"]["User"] == f"{uid}:{gid}", got["Config"]["User"]
        assert got["HostConfig"]["ReadonlyRootfs"] is True and not got["EffectiveCaps"], got["EffectiveCaps"]
        _wait_started(spec, main, ctr)
        for probe in ("readinessProbe", "livenessProbe"):
            _assert_ready(*_exec_probe(spec, main, probe, ctr), probe, main)
        address = f"ipc://{_host_path(main, host_dirs, _connect_path(main))}"
        assert embed(address, ["kube play"]).shape[0] == 1
        # podman turns the liveness probe into a healthcheck it runs with /bin/sh -c "ARGV || exit 1" (or
        # "|| kill 1"): an image without a shell is never healthy to podman, whatever the runtime says
        hc = _podman("healthcheck", "run", ctr, timeout=120)
        if hc.returncode != 0:
            test = got["Config"]["Healthcheck"]["Test"]
            shell = _podman("exec", ctr, "/bin/sh", "-c", "true", timeout=60)
            assert test[0] == "CMD-SHELL" and shell.returncode == 127, (hc.stdout, hc.stderr, test, shell.stderr)
            print(f"\npodman healthcheck run: {hc.stdout.strip()}: {test[0]} and the image has no /bin/sh "
                  f"({shell.stderr.strip()[-200:]})", flush=True)
    finally:
        _podman("kube", "down", str(tmp_path / "pod.yaml"), timeout=120, env=env)
        _podman("pod", "rm", "--force", "--ignore", name, timeout=60)
        for volume in renamed.values():
            _podman("volume", "rm", "--force", volume, timeout=60)


def _unit_commands(text: str) -> dict[str, list[list[str]]]:
    """Exec*= lines of a unit (continuations joined), split as systemd does (close enough: shlex)."""
    text = text.replace("\\\n", " ")
    out: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        m = re.match(r"(Exec\w+)=(.*)", line)
        if m:
            out.setdefault(m.group(1), []).append(shlex.split(m.group(2).lstrip("-@:+!")))
    return out


def test_the_podman_units_run_no_command_of_their_own_in_the_image():
    """edge-podman.service and edge.container give the container no command, entrypoint or health
    command: inside the image runs only its own Entrypoint/Cmd, which test_manifests.py boots to READY
    under systemd from both units. Their ExecStartPre (``install -d``) runs on the host, there too.
    Should either unit gain one (a HealthCmd, an Exec), this fails until a test runs it in the image."""
    commands = _unit_commands(UNIT.read_text())
    (start,) = commands["ExecStart"]
    run = start.index("run")
    assert start[0].endswith("/podman") and start[-1] == "${EDGE_IMAGE}", start  # nothing after the image
    assert not [a for a in start[run:] if a.startswith(("--entrypoint", "--health", "--init"))], start
    for key, lines in commands.items():
        for argv in lines:
            if argv[0].endswith("/podman") and argv is not start:
                sub = [a for a in argv[1:] if not a.startswith(("-", "$"))][0]
                assert sub in ("stop", "rm"), (key, argv)  # no exec, no second run
            elif not argv[0].endswith("/podman"):
                assert key == "ExecStartPre" and argv[0] == "/usr/bin/install", (key, argv)  # on the host
    container = QUADLET.read_text().split("[Container]", 1)[1].split("\n[", 1)[0]
    keys = {line.split("=", 1)[0].strip() for line in container.splitlines() if "=" in line and line[:1] != "#"}
    assert not keys & {"Exec", "Entrypoint", "HealthCmd", "HealthStartupCmd", "HealthOnFailure"}, keys
    assert "--entrypoint" not in container and "--health" not in container
    service = QUADLET.read_text().split("[Service]", 1)[1].split("\n[", 1)[0]
    for key, lines in _unit_commands(service).items():
        assert key == "ExecStartPre" and all(argv[0] == "/usr/bin/install" for argv in lines), (key, lines)
