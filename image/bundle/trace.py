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
from dataclasses import dataclass, field
from pathlib import Path

from edge.system.readiness import NotifiedProcess, NotReady

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


def _wait_for_late_starts(boot_args: list[str], deadline_s: float = 60.0) -> None:
    """Wait until what starts after READY has run once: the metrics publisher's first textfile
    (it imports prometheus_client, ssl, http.server...). Stopping before it would leave its files
    out of the trace in one build and not in another: the rootfs would depend on a race."""
    import time

    if "--metrics-textfile" not in boot_args:
        return
    d = Path(boot_args[boot_args.index("--metrics-textfile") + 1])
    end = time.monotonic() + deadline_s
    while not any(d.glob("*.prom")) and time.monotonic() < end:
        time.sleep(0.05)


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

    ``-S`` as the bundle starts it (edge/runtime/launch.py): ``env`` carries the ``PYTHONPATH``.

    ``boot_args`` must not carry ``--bind``; the trace binds a socket in ``workdir``.
    ``env`` is the container's environment (HOME and NOTIFY_SOCKET are replaced).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    out = workdir / "trace.json"
    out.unlink(missing_ok=True)  # an earlier trace's record must not pass for this one's
    address = f"ipc://{workdir}/run/edge.sock"
    strace = shutil.which("strace") if use_strace in ("auto", "on") else None
    if use_strace == "on" and strace is None:
        raise TraceError("--strace on, but strace is not installed on the build host")
    run_env = {**env, "HOME": str(workdir / "home"),
               "EDGE_TRACE_OUT": str(out), "EDGE_TIMELINE": str(workdir / "timeline.json"),
               # its request journal in the work directory: the build host's /var/lib is not the
               # bundle's (the container binds its own state directory there), and nothing is copied
               "EDGE_STATE_DIR": str(workdir / "state")}
    if "QEMU_CPU" in os.environ:  # an emulated build (image/bundle/emulated.py): qemu-user reads it from
        run_env["QEMU_CPU"] = os.environ["QEMU_CPU"]  # each process it starts; never in the bundle
    cmd = [python, "-S", "-c", HOOK_SOURCE, *boot_args, "--bind", address]
    strace_out = workdir / "strace.txt"
    if strace:
        cmd = [strace, "-f", "-qq", "-o", str(strace_out), *cmd]
    log_path = workdir / "boot.log"
    # The stop's SIGTERM (the drain path) goes to the runtime's own pid, the MAINPID= of its
    # READY (boot.pid): under strace the child is strace. Past STOP_DEADLINE_S the child is killed.
    boot = NotifiedProcess(cmd, notify_path=workdir / "notify.sock", log_path=log_path, env=run_env, cwd=str(workdir),
                           terminate=lambda _proc: os.kill(boot.pid, signal.SIGTERM))
    spin = None if progress is None else (lambda s: progress.spin(f"tracing boot to READY ({s:.1f} s)"))
    try:
        try:
            ready_s = boot.wait_ready(READY_DEADLINE_S, on_tick=spin)
        except NotReady as exc:
            raise TraceError(f"the traced boot {exc}") from None
        _exercise(address)
        _wait_for_late_starts(boot_args)
    finally:
        boot.stop(STOP_DEADLINE_S)
    proc = boot.proc
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
