"""Helpers of the bundle tests: runc containers, the plain runtime, the socket directory.

A uniquely named module (not conftest): tests/*/conftest.py would shadow each other on import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
UID = GID = 61000  # the builder's default runtime user
READY_DEADLINE_S = 120.0
_CODE = ["image/build_bundle.py", "image/bundle/*.py", "edge/**/*.py"]


def runc_or_skip() -> str:
    runc = shutil.which("runc")
    if runc is None:
        pytest.skip("runc is not installed (.ci/run installs it)")
    if os.geteuid() != 0:
        pytest.skip("runc run needs root here (no rootless setup)")
    return runc


def bundle_key(package: Path) -> str:
    h = hashlib.sha256(f"{package.resolve()};{sys.executable};{sys.version}".encode())
    for pattern in _CODE:
        for p in sorted(REPO.glob(pattern)):
            h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    h.update((package / "manifest.json").read_bytes())
    return h.hexdigest()[:24]


def bundle_meta(bundle: Path) -> dict:
    return json.loads((bundle / "edge-bundle.json").read_text())


def prepare_socket_dir(meta: dict) -> Path:
    """What edge-supervise does on the device: the socket directory, owned by the runtime's user."""
    d = Path(meta["socket_dir"])
    d.mkdir(parents=True, exist_ok=True)
    os.chown(d, meta["user"]["uid"], meta["user"]["gid"])
    os.chmod(d, 0o750)
    return d


@dataclass
class Container:
    id: str
    runc: str
    proc: subprocess.Popen
    notify: socket.socket
    log_path: Path
    notices: list[bytes] = field(default_factory=list)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            if self.proc.poll() is not None:
                raise AssertionError(f"runc run exited {self.proc.returncode} before READY:\n{self.output()}")
            try:
                self.notices.append(self.notify.recv(4096))
            except socket.timeout:
                continue
            if any(b"READY=1" in n.split(b"\n") for n in self.notices):
                return time.monotonic() - t0
        raise AssertionError(f"no READY=1 within {deadline_s} s:\n{self.output()}")

    def exec(self, *cmd: str, user: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        args = [self.runc, "exec", *(["--user", user] if user else []), self.id, *cmd]
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> int | None:
        """SIGTERM (the drain path), then whatever it takes; the container is always deleted."""
        try:
            if self.proc.poll() is None:
                subprocess.run([self.runc, "kill", self.id, "TERM"], capture_output=True, timeout=10)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    subprocess.run([self.runc, "kill", self.id, "KILL"], capture_output=True, timeout=10)
                    self.proc.kill()  # runc run itself, should it wait for a dead init
                    self.proc.wait(10)
        finally:
            subprocess.run([self.runc, "delete", "--force", self.id], capture_output=True, timeout=30)
            self.notify.close()
        return self.proc.returncode


def start_container(bundle: Path, workdir: Path, prefix: str = "edge-test") -> Container:
    """``runc run --bundle`` with a NOTIFY_SOCKET the test listens on; does not wait."""
    runc = runc_or_skip()
    workdir.mkdir(parents=True, exist_ok=True)
    notify_path = workdir / "notify.sock"
    notify_path.unlink(missing_ok=True)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    cid = f"{prefix}-{uuid.uuid4().hex[:10]}"
    log_path = workdir / f"{cid}.log"
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([runc, "run", "--bundle", str(bundle), cid], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Container(cid, runc, proc, notify, log_path)


def plain_runtime(package: Path, workdir: Path, env: dict[str, str]):
    """The same runtime as a plain process (no bundle), for parity and timing."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    address = f"ipc://{workdir}/run/edge.sock"
    log = open(workdir / "plain.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge.boot", "--package", str(package), "--engine", "onnxruntime", "--bind", address],
        env={**os.environ, **env, "HOME": str(workdir / "home")}, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, address


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
