"""What the checks read, gathered once: the device root's files, the bundle, the running system's
commands (:class:`Host`), the server's answers and the unit's state (:class:`Context`).

Nothing here may hang: a file is read only when it is a regular file (a FIFO would block), up
to a size; every command runs with a timeout, in its own session, and is killed with all its
children when the timeout ends; every client call has a timeout.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import cast
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

__all__ = ["UNIT_PATH", "Ran", "Host", "BundleFacts", "ServerFacts", "Context", "read_text", "read_json", "as_dict",
           "load_bundle", "version_line"]

# systemd's default PATH for a service: where edge.service's runc, and runc's criu, are found
# (/usr/local/sbin first: image/criu/build.sh installs CRIU there, docs/bundle.md "CRIU").
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMMAND_TIMEOUT_S = 5.0  # runc/criu --version, systemctl show: milliseconds when the machine is well
ENGINE_TIMEOUT_S = 30.0  # `import torch` takes seconds on a Jetson, more with a cold page cache
MAX_READ_BYTES = 64 << 20  # a record or state file larger than this is not one of ours
# The probe of the installed engines, in a subprocess: an import that hangs (a driver waiting on
# a device) or crashes (a bad wheel) costs the check, never doctor.
ENGINE_PROBE = r"""
import json, os, sys
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # edge/engines/ort_capi.py, TELEMETRY_ENV
name, out = sys.argv[1], {}
try:
    if name == "onnxruntime":
        import onnxruntime as m
        out = {"version": m.__version__, "providers": list(m.get_available_providers())}
    else:
        import torch as m
        out = {"version": m.__version__, "cuda": bool(m.cuda.is_available()), "cuda_version": m.version.cuda}
except ImportError as exc:
    out = {"missing": str(exc)}
sys.stdout.write("\n" + json.dumps(out) + "\n")
"""
ENGINES = ("onnxruntime", "torch")  # the bundle's engine "torchscript" runs on torch


def read_text(path: Path, limit: int = MAX_READ_BYTES) -> str | None:
    """The text of a regular file, or None (missing, not a regular file, unreadable, too large)."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        return path.read_bytes()[:limit].decode(errors="replace")
    except OSError:
        return None


def read_json(path: Path) -> tuple[object | None, str | None]:
    """(data, None), or (None, why): why is None when the file is simply not there."""
    if not os.path.lexists(path):
        return None, None
    text = read_text(path)
    if text is None:
        return None, f"{path} is not a readable regular file"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"{path} is not JSON ({exc})"


def as_dict(v: object) -> dict:
    """``v`` when it is a JSON object, else an empty one: a record's optional block."""
    return v if isinstance(v, dict) else {}


def version_line(text: str) -> str:
    """A command's output as edge-supervise records it (snapshot_rules.tool_version) in a snapshot's dependencies."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or "absent"


@dataclass
class Ran:
    argv: list[str]
    rc: int | None  # None: not started, or killed at its timeout
    out: str = ""
    err: str = ""
    error: str | None = None  # why there is no exit status: "not found", "timed out after 5 s"

    @property
    def ok(self) -> bool:
        return self.rc == 0


class Host:
    """The running machine's commands. Tests replace it with one that answers from a table."""

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=UNIT_PATH + os.pathsep + os.environ.get("PATH", ""))

    def init_system(self) -> str:
        """"systemd" when systemd runs this machine (sd_booted(3)), else the name of PID 1."""
        if os.path.isdir("/run/systemd/system"):
            return "systemd"
        return (read_text(Path("/proc/1/comm"), 256) or "?").strip()

    def _env(self) -> dict:
        return {**os.environ, "LC_ALL": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}

    def start(self, argv: list[str]) -> subprocess.Popen | Ran:
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, errors="replace", env=self._env(), start_new_session=True)
        except OSError as exc:
            return Ran(argv, None, error=exc.strerror or str(exc))

    def finish(self, proc: subprocess.Popen | Ran, timeout_s: float, given_s: float | None = None) -> Ran:
        """``proc``'s result within ``timeout_s``; ``given_s``: the timeout it was given, for the message."""
        if isinstance(proc, Ran):
            return proc
        try:
            # at least a moment: one that ended while another was awaited still has its output to read
            out, err = proc.communicate(timeout=max(0.1, timeout_s))
            return Ran(list(cast("list[str]", proc.args)), proc.returncode, out, err)  # start(): a list of str
        except subprocess.TimeoutExpired:
            try:  # the whole session: a child that forked keeps the pipes open otherwise
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            return Ran(list(cast("list[str]", proc.args)), None, error=f"timed out after {given_s or timeout_s:g} s")

    def run(self, argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> Ran:
        return self.finish(self.start(argv), timeout_s)

    def run_all(self, commands: list[list[str]], timeout_s: float) -> list[Ran]:
        """The commands at once, each given ``timeout_s`` from now."""
        started = [self.start(argv) for argv in commands]
        deadline = time.monotonic() + timeout_s
        return [self.finish(p, deadline - time.monotonic(), timeout_s) for p in started]


@dataclass
class BundleFacts:
    path: Path  # as given (``current``: the symlink)
    real: Path  # its real directory
    meta: dict = field(default_factory=dict)  # edge-bundle.json
    config: dict = field(default_factory=dict)  # config.json (OCI)
    archive: dict | None = None  # the slot's edge-archive.json beside an installed bundle
    manifest: dict | None = None  # the package's manifest.json, inside the rootfs
    error: str | None = None  # why the bundle cannot be read (then meta/config may be empty)


def load_bundle(path: Path) -> BundleFacts | None:
    """The bundle at ``path``; None when nothing is there."""
    if not os.path.lexists(path):
        return None
    real = Path(os.path.realpath(path))
    facts = BundleFacts(path, real)
    if not os.path.isdir(real):
        facts.error = f"{path} is not a directory" + (f" ({path} -> {real} is missing)" if path != real else "")
        return facts
    meta, why = read_json(real / "edge-bundle.json")
    config, why2 = read_json(real / "config.json")
    if not isinstance(meta, dict) or not isinstance(config, dict):
        facts.error = why or why2 or f"{real} has no edge-bundle.json and config.json: not a bundle"
        return facts
    facts.meta, facts.config = meta, config
    archive, _ = read_json(real.parent / "edge-archive.json")
    facts.archive = archive if isinstance(archive, dict) else None
    package = as_dict(meta.get("package"))
    inside = str(package.get("path") or "/opt/edge/package").lstrip("/")
    manifest, _ = read_json(real / "rootfs" / inside / "manifest.json")
    facts.manifest = manifest if isinstance(manifest, dict) else None
    return facts


def _refused(address: str, timeout_s: float) -> tuple[str | None, bool]:
    """Why a client cannot reach the ipc:// socket file, seen at once: (why, False) when nothing
    listens on it (a stopped server left it), (why, True) when this user may not connect to it;
    (None, False) otherwise (tcp://, or something listens: the request tells the rest)."""
    import socket

    if not address.startswith("ipc://") or address.startswith("ipc://@"):
        return None, False
    path = address[len("ipc://"):]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(min(timeout_s, 2.0))
        try:
            s.connect(path)
        except ConnectionRefusedError:
            return f"{path} is there, and nothing listens on it (left by a stopped server)", False
        except PermissionError:
            return f"{path}: permission denied to this user", True
        except OSError:  # a timeout, a full backlog: the request says more
            pass
    return None, False


@dataclass
class ServerFacts:
    address: str
    answered: bool = False
    health: dict | None = None
    stats: dict | None = None
    error: str | None = None  # why it did not answer, or why stats failed
    denied: bool = False  # this user may not connect to the socket: the service may well be up

    @property
    def ready(self) -> bool:
        return bool(self.answered and self.health and self.health.get("ready"))


class Context:
    """Everything the checks share; each fact is gathered once, when a check first asks."""

    def __init__(self, root: Path, bundle: BundleFacts | None, bundle_path: Path, address: str | None,
                 address_source: str, *, host: Host | None = None, unit: str = "edge", timeout_s: float = 5.0,
                 curve=None, package: Path | None = None, budget_ms: float | None = None,
                 coldstart: Path | None = None) -> None:
        self.root = root
        self.system_root = os.path.realpath(root) == "/"
        self.bundle = bundle
        self.bundle_path = bundle_path
        self.address = address
        self.address_source = address_source
        self.host = host or Host()
        self.unit = unit
        self.timeout_s = timeout_s
        self.curve = curve
        self.package = package
        self.budget_ms = budget_ms
        self.coldstart = coldstart
        self._engines: dict | None = None
        self._engines_lock = threading.Lock()

    def path(self, device_path: str) -> Path:
        """A device's absolute path under the root."""
        return self.root / str(device_path).lstrip("/")

    @property
    def not_here(self) -> str:
        return f"not the running system (--root {self.root}): its commands are not run"

    @property
    def usable_bundle(self) -> BundleFacts | None:
        return self.bundle if self.bundle is not None and self.bundle.error is None else None

    @cached_property
    def jetson(self) -> bool:
        if os.path.isfile(self.path("/etc/nv_tegra_release")):
            return True
        compatible = read_text(self.path("/proc/device-tree/compatible"), 4096) or ""
        return any("tegra" in c or c.startswith("nvidia,") for c in compatible.split("\0"))

    @cached_property
    def machine(self) -> tuple[str | None, str]:
        """(arch, where it was read) of the root: uname on this system, etc/edge/device.json elsewhere."""
        if self.system_root:
            return platform.machine(), "uname -m"
        data, _ = read_json(self.path("/etc/edge/device.json"))
        arch = data.get("arch") if isinstance(data, dict) else None
        return arch, f"{self.path('/etc/edge/device.json')} arch"

    # ---------------------------------------------------------- the running system

    @cached_property
    def runc(self) -> tuple[str | None, Ran | None]:
        """(path, `runc --version`): the runc edge-supervise runs (the unit's PATH, else /usr/sbin/runc)."""
        path = self.host.which("runc")  # UNIT_PATH holds /usr/sbin, edge-supervise's fallback
        return path, (self.host.run([path, "--version"]) if path else None)

    @cached_property
    def criu(self) -> tuple[str | None, Ran | None]:
        path = self.host.which("criu")
        return path, (self.host.run([path, "--version"]) if path else None)

    @property
    def engines(self) -> dict[str, dict]:
        """engine -> what its probe printed: version, providers / cuda, or missing, or error. Thread-safe:
        run_checks starts the probe on a thread and the cuda check waits for it here."""
        with self._engines_lock:
            if self._engines is None:
                self._engines = self._probe_engines()
            return self._engines

    def _probe_engines(self) -> dict[str, dict]:
        ran = self.host.run_all([[sys.executable, "-c", ENGINE_PROBE, name] for name in ENGINES], ENGINE_TIMEOUT_S)
        out = {}
        for name, r in zip(ENGINES, ran):
            last = (r.out.strip().splitlines() or [""])[-1]
            try:
                out[name] = json.loads(last) if r.ok else {"error": r.error or f"exit {r.rc}: {r.err.strip()[-300:]}"}
            except ValueError:
                out[name] = {"error": f"unreadable probe output {last[-200:]!r}"}
        return out

    @cached_property
    def unit_state(self) -> tuple[dict | None, str | None]:
        """(the unit's properties, None) or (None, why they cannot be read here)."""
        init = self.host.init_system()
        if init != "systemd":
            return None, f"systemd is not the init system here (PID 1 is {init})"
        systemctl = self.host.which("systemctl")
        if systemctl is None:
            return None, "systemctl is not installed"
        r = self.host.run([systemctl, "show", self.unit, "--no-pager", "-p",
                           "LoadState,ActiveState,SubState,Result,NRestarts,ExecMainStatus,UnitFileState"])
        if not r.ok:
            return None, f"systemctl show {self.unit}: {r.error or r.err.strip() or f'exit {r.rc}'}"
        props = dict(line.split("=", 1) for line in r.out.splitlines() if "=" in line)
        return props, None

    @cached_property
    def server(self) -> ServerFacts | None:
        """The server's health and stats at :attr:`address` (None: no address to ask)."""
        if self.address is None:
            return None
        facts = ServerFacts(self.address)
        try:
            from edge.errors import EdgeError
            from edge.ipc.client import EdgeClient
            from edge.ipc.endpoint import check_ipc_server
        except Exception as exc:  # noqa: BLE001 - a broken install: the check says so
            facts.error = f"the client cannot be loaded ({type(exc).__name__}: {exc})"
            return facts
        try:
            check_ipc_server(self.address)  # no socket file: nothing to wait for
        except FileNotFoundError as exc:  # no socket file (the common case of a stopped service), or not a socket
            facts.error = f"no socket file {exc.filename}" if exc.errno == errno.ENOENT else exc.strerror
            return facts
        facts.error, facts.denied = _refused(self.address, self.timeout_s)
        if facts.error:  # ZeroMQ would retry the connect until the request's timeout
            return facts
        client = None
        try:
            client = EdgeClient(self.address, timeout_s=self.timeout_s, curve=self.curve)
            facts.health = client.health(timeout_s=self.timeout_s)
            facts.answered = True
            facts.stats = client.stats(timeout_s=self.timeout_s)
        except (TimeoutError, EdgeError) as exc:
            facts.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - zmq, a malformed reply: never a traceback
            facts.error = f"{type(exc).__name__}: {exc}"
        finally:
            if client is not None:
                client.close()
        return facts
