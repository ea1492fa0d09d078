"""Trace a real boot to READY: which files, libraries and syscalls the runtime needs.

The target environment's interpreter boots the runtime (``python -c <_trace_hook.py>``,
the same ``edge.boot`` arguments the container will use) and reports READY on a
notify socket we listen on. We then exercise the server as a client would
(``health``, ``infer``, ``stats``, a malformed request), so modules imported lazily on
the request path are seen too, and stop it with SIGTERM (the drain path). The hook
writes what Python saw; when ``strace`` is on the build host the boot also runs under
it, which adds the files native code opens (``/etc/localtime``, ``/etc/os-release``,
the interpreter's startup probes) and the syscalls used, checked against the seccomp
profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Trace", "trace_boot", "TraceError", "HOOK_SOURCE"]

HOOK_SOURCE = (Path(__file__).with_name("_trace_hook.py")).read_text()
READY_DEADLINE_S = 300.0  # a torchscript boot under strace on 2 cores takes a while
STOP_DEADLINE_S = 60.0

# strace -f lines: "PID name(args) = ret" (also "<... name resumed> ...) = ret").
_SYSCALL = re.compile(r"^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)(?:\(| resumed>)")
_FILE_OK = re.compile(r'^\d+\s+(?:open|openat|openat2|execve|stat|newfstatat|access|readlink|statx)\((?:AT_FDCWD, )?"([^"]+)".*\) = (\d+|0x[0-9a-f]+)')


class TraceError(RuntimeError):
    """The traced boot did not reach READY (or its record is missing); carries its output."""


@dataclass
class Trace:
    executable: str  # sys.executable of the traced process (the venv's python)
    prefix: str
    base_prefix: str
    sys_path: list[str]
    version: tuple[int, int, int]
    module_files: dict[str, list[str]]  # module name -> [__file__, __cached__]
    mapped: set[str]  # file-backed mappings at READY and at exit (/proc/self/maps)
    opened: set[str]  # files Python opened (audit hook) and, under strace, any successful path syscall
    dlopened: set[str]  # names given to ctypes.CDLL
    executed: list[str]  # programs started (subprocess / exec)
    syscalls: set[str] = field(default_factory=set)  # empty when strace was not used
    used_strace: bool = False
    ready_s: float = 0.0  # exec to READY under the tracer (s)
    log: str = ""

    def all_paths(self) -> set[str]:
        paths = set(self.mapped) | set(self.opened)
        for files in self.module_files.values():
            paths.update(files)
        return paths

    def summary(self) -> dict:
        return {
            "modules": len(self.module_files),
            "mapped_files": len(self.mapped),
            "opened_files": len(self.opened),
            "dlopened": sorted(self.dlopened),
            "executed": sorted(set(self.executed)),
            "syscalls": len(self.syscalls),
            "strace": self.used_strace,
            "ready_s": round(self.ready_s, 3),
        }


def _exercise(address: str) -> None:
    """Send what clients send, so request-path imports are traced too."""
    from edge.ipc import protocol as P
    from edge.ipc.client import EdgeClient

    with EdgeClient(address, timeout_s=60) as client:
        client.health()
        client.embed(["The device warms every bucket before it reports ready.", "short"])
        client.stats()
        client.send_frames([b"\xc1not msgpack"])  # a malformed request: the error path
        client.recv()
        client.send_frames(P.encode_request("health", {}, P.JSON))
        client.recv()


def _parse_strace(path: Path) -> tuple[set[str], set[str]]:
    syscalls: set[str] = set()
    files: set[str] = set()
    with open(path, errors="replace") as f:
        for line in f:
            m = _SYSCALL.match(line)
            if m:
                syscalls.add(m.group(1))
            m = _FILE_OK.match(line)
            if m and m.group(1).startswith("/"):
                files.add(os.path.normpath(m.group(1)))
    syscalls.discard("exit")  # "+++ exited" lines are not matched; "exit" is the thread exit syscall
    syscalls.add("exit")
    return syscalls, files


def trace_boot(python: str, boot_args: list[str], workdir: Path, env: dict[str, str], *,
               use_strace: str = "auto", progress=None) -> Trace:
    """Boot ``python -S -m edge.boot BOOT_ARGS`` under the recorder, exercise it, stop it.

    ``-S`` as the bundle starts it (edge/launch.py): ``env`` carries the ``PYTHONPATH``.

    ``boot_args`` must not carry ``--bind``; the trace binds a socket in ``workdir``.
    ``env`` is the container's environment (HOME and NOTIFY_SOCKET are replaced).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    out = workdir / "trace.json"
    notify_path = workdir / "notify.sock"
    notify_path.unlink(missing_ok=True)
    address = f"ipc://{workdir}/run/edge.sock"
    strace = shutil.which("strace") if use_strace in ("auto", "on") else None
    if use_strace == "on" and strace is None:
        raise TraceError("--strace on, but strace is not installed on the build host")
    run_env = {**env, "HOME": str(workdir / "home"), "NOTIFY_SOCKET": str(notify_path),
               "EDGE_TRACE_OUT": str(out), "EDGE_TIMELINE": str(workdir / "timeline.json")}
    cmd = [python, "-S", "-c", HOOK_SOURCE, *boot_args, "--bind", address]
    strace_out = workdir / "strace.txt"
    if strace:
        cmd = [strace, "-f", "-qq", "-o", str(strace_out), *cmd]
    log_path = workdir / "boot.log"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify, open(log_path, "wb") as log:
        notify.bind(str(notify_path))
        notify.settimeout(0.2)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, cwd=str(workdir))
        try:
            ready_s, pid = _wait_ready(proc, notify, t0, log_path, progress)
            _exercise(address)
            # The runtime's own pid (MAINPID= of its READY): under strace, proc is strace.
            os.kill(pid, signal.SIGTERM)
            proc.wait(STOP_DEADLINE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log_path.read_text(errors="replace")
    if not out.exists():
        raise TraceError(f"the traced boot wrote no record (exit {proc.returncode}):\n{text[-4000:]}")
    rec = json.loads(out.read_text())
    if not rec["ready"]:
        raise TraceError(f"the traced boot exited before READY:\n{text[-4000:]}")
    modules: dict[str, list[str]] = {}
    mapped: set[str] = set()
    for snap in rec["snapshots"].values():
        mapped.update(snap["maps"])
        for name, files in snap["modules"].items():
            modules.setdefault(name, [])
            modules[name].extend(f for f in files if f not in modules[name])
    syscalls, strace_files = _parse_strace(strace_out) if strace else (set(), set())
    return Trace(
        executable=rec["executable"], prefix=rec["prefix"], base_prefix=rec["base_prefix"],
        sys_path=rec["sys_path"], version=tuple(rec["version"]), module_files=modules, mapped=mapped,
        opened=set(rec["opened"]) | strace_files, dlopened=set(rec["dlopened"]), executed=rec["executed"],
        syscalls=syscalls, used_strace=bool(strace), ready_s=ready_s, log=text,
    )


def _wait_ready(proc: subprocess.Popen, notify: socket.socket, t0: float, log_path: Path, progress) -> tuple[float, int]:
    while time.monotonic() - t0 < READY_DEADLINE_S:
        if proc.poll() is not None:
            raise TraceError(f"the traced boot exited {proc.returncode} before READY:\n"
                             f"{log_path.read_text(errors='replace')[-4000:]}")
        if progress:
            progress.spin(f"tracing boot to READY ({time.monotonic() - t0:.1f} s)")
        try:
            data = notify.recv(4096)
        except socket.timeout:
            continue
        fields = data.split(b"\n")
        if b"READY=1" in fields:
            pids = [int(f[len(b"MAINPID="):]) for f in fields if f.startswith(b"MAINPID=")]
            return time.monotonic() - t0, (pids[0] if pids else proc.pid)
    raise TraceError(f"no READY=1 within {READY_DEADLINE_S} s:\n{log_path.read_text(errors='replace')[-4000:]}")
