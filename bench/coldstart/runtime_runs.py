"""Runs of the runtime: ``python -m edge.boot`` as a process, and the bundle under runc.

Each is timed from its exec to the first correct reply (``launch``), and reports the
runtime's own boot timeline on the same clock.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import zmq

from bench.coldstart.args import UsageError
from bench.coldstart.client import Client, embed_and_check
from bench.coldstart.launch import STOP_TIMEOUT_S, RunFailed, RunResult, clean_env, now_ns, start_timed
from edge.system import socket_dir
from edge.runtime.launch import boot_argv
from edge.system.readiness import stop_process

__all__ = ["bundle_contract", "check_address_free", "prepare_socket_dir", "run_bundle", "run_runtime"]


def _mapped_files(pid: int) -> list[str]:
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    out.add(parts[5].strip())
    except OSError:
        pass
    return sorted(p for p in out if not p.endswith(" (deleted)"))


def run_runtime(package: Path, engine: str, workdir: Path, text: str, reference, *, timeout_s: float = 120.0,
                extra_args: list[str] = ()) -> RunResult:
    """``python -m edge.boot`` as a process; exec to first correct reply, plus its timeline."""
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"ipc://{workdir}/edge.sock"
    log = workdir / "runtime.log"
    args = ["--package", str(package), "--engine", engine, "--bind", address,
            "--timeline", str(workdir / "timeline.json"), *extra_args]
    cmd = [*boot_argv(), *args]  # as the bundle starts it: python -S, explicit PYTHONPATH
    proc, t0 = start_timed(cmd, workdir, log)
    client = Client(address)
    try:
        end, body, cos = embed_and_check(client, proc, text, reference, t0 + int(timeout_s * 1e9), log)
        # Untimed from here on.
        mapped = _mapped_files(proc.pid)
        timeline = client.request("stats", {}).get("timeline")
    finally:
        client.close()
        stop_process(proc, STOP_TIMEOUT_S)
    return _runtime_result("runtime", end - t0, timeline, body, cos, proc.pid, mapped)


def _runtime_result(kind, total_ns, timeline, body, cos, pid, mapped, offset_ms: float = 0.0) -> RunResult:
    total_ms = total_ns / 1e6
    phases = {}
    if isinstance(timeline, dict):
        for s in timeline.get("stages") or []:
            phases[s["stage"]] = [round(s["start_ms"] + offset_ms, 3), round(s["end_ms"] + offset_ms, 3)]
        if "interpreter" in phases and len(phases) > 1 and "boot_imports" not in phases:
            # edge.boot's own module-level imports, between the interpreter and its first stage
            # (a runtime older than the timeline's own boot_imports stage).
            first = min(v[0] for k, v in phases.items() if k != "interpreter")
            phases["boot_imports"] = [phases["interpreter"][1], first]
        if timeline.get("exec_to_ready_ms") is not None:
            ready = timeline["exec_to_ready_ms"] + offset_ms
            phases["ready_to_reply"] = [round(ready, 3), round(total_ms, 3)]
    reply = {k: body.get(k) for k in ("engine", "device", "model_sha256", "tokenizer_sha256", "package_sha256",
                                      "buckets", "token_counts", "queue_ms", "compute_ms", "not_ready_retries")}
    return RunResult(kind, total_ms, phases, timeline, reply, cos, pid, mapped)


# ----------------------------------------------------------------- bundle (runc)


def bundle_contract(bundle: Path) -> dict:
    """``edge-bundle.json``: ``address`` (ipc address host apps use), ``socket_dir`` (host dir mounted in)."""
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    for key in ("address", "socket_dir"):
        if key not in meta:
            raise RunFailed(f"{bundle}/edge-bundle.json has no {key!r}")
    return meta


def prepare_socket_dir(bundle: Path, meta: dict, *, snapshot_files: bool = False) -> dict:
    """The host socket directory made the runtime's as edge-supervise makes it on the device
    (edge/system/socket_dir.py: created when missing, the uid:gid of config.json's ``process.user``, 0750,
    stale leftovers of other users removed, so a root ``edge serve``'s do not fail the start).
    A directory it refuses (a symlink, not a directory, writable by others) is a UsageError:
    exit 2 with the message, which names it; no run could pass."""
    user = meta.get("user") or {}
    try:
        user = json.loads((bundle / "config.json").read_text())["process"].get("user") or user
    except (OSError, ValueError, KeyError):
        pass
    try:
        uid, gid = int(user.get("uid", 0)), int(user.get("gid", 0))
        done = socket_dir.prepare_socket_dir(meta["socket_dir"], uid, gid, snapshot_files=snapshot_files,
                                             socket_name=socket_dir.ipc_socket_name(meta["address"]))
        socket_dir.prepare_host_dirs(uid, gid, meta.get("metrics_dir"), meta.get("state_dir"))
        return done
    except socket_dir.SocketDirError as exc:
        raise UsageError(f"--bundle {bundle}: {exc}") from None


def check_address_free(address: str) -> None:
    """Refuse to measure while another runtime (e.g. the installed service) answers on ``address``."""
    client = Client(address)
    try:
        client.send("health", {})
        if client.sock.poll(200, zmq.POLLIN):
            raise RunFailed(f"a runtime already answers on {address}; stop the edge service first "
                            "(systemctl stop edge) so the benchmark measures fresh starts")
    finally:
        client.close()


def _starttime_boot_s(pid: int) -> float | None:
    """A process's start on the CLOCK_BOOTTIME scale (the origin the runtime uses without our hint)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _runc_kill(runc: str, cid: str, sig: str):
    """A stop hook: ``runc kill ID SIG`` (the child we started is ``runc run``, not the container)."""
    return lambda _proc: subprocess.run([runc, "kill", cid, sig], capture_output=True)


def stop_container(proc: subprocess.Popen, runc_bin: str, cid: str) -> None:
    """Stop ``runc run``'s container (TERM, then KILL, through runc) and delete its state."""
    try:
        stop_process(proc, STOP_TIMEOUT_S, terminate=_runc_kill(runc_bin, cid, "TERM"),
                     kill=_runc_kill(runc_bin, cid, "KILL"))
    finally:
        subprocess.run([runc_bin, "delete", "-f", cid], capture_output=True)


def run_bundle(bundle: Path, workdir: Path, text: str, reference, *, timeout_s: float = 120.0,
               runc: str = "runc") -> RunResult:
    """``runc run --bundle DIR ID`` (as root), exec of runc to first correct reply at ``address``.

    The container's environment comes from config.json, so the runtime cannot get our exec
    time: its timeline counts from its own process start (/proc/self/stat, 10 ms steps). We
    shift it by that start, read from the host's /proc through ``runc state``; the gap is the
    ``container_start`` phase (runc create, namespaces, mounts).
    """
    meta = bundle_contract(bundle)
    address = meta["address"]
    prepare_socket_dir(bundle, meta)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "runc.log"
    cid = f"edge-coldstart-{os.getpid()}-{workdir.name}"
    runc_bin = shutil.which(runc) or runc
    with open(log, "wb") as out:
        t0 = now_ns()
        proc = subprocess.Popen([runc_bin, "run", "--bundle", str(bundle), cid], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env({}))
    client = Client(address)
    try:
        end, body, cos = embed_and_check(client, proc, text, reference, t0 + int(timeout_s * 1e9), log)
        timeline = client.request("stats", {}).get("timeline")
        offset_ms, mapped = 0.0, []
        state = subprocess.run([runc_bin, "state", cid], capture_output=True, text=True)
        if state.returncode == 0:
            host_pid = json.loads(state.stdout).get("pid")
            start_s = _starttime_boot_s(host_pid) if host_pid else None
            if start_s is not None:
                offset_ms = max(0.0, start_s * 1000.0 - t0 / 1e6)
            # The kernel names them as the container sees them: under the bundle's root on the host.
            root = bundle / (json.loads((bundle / "config.json").read_text()).get("root", {}).get("path") or "rootfs")
            mapped = [str(root / p.lstrip("/")) for p in _mapped_files(host_pid)] if host_pid else []
    finally:
        client.close()
        stop_container(proc, runc_bin, cid)
    result = _runtime_result("bundle", end - t0, timeline, body, cos, proc.pid, mapped, offset_ms)
    result.phases["container_start"] = [0.0, round(offset_ms, 3)]
    # The runtime's "interpreter" stage starts at its own origin; ours is runc's exec.
    return result
